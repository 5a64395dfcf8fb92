"""Every command's tables at 80 columns piped (issue 23, item 3): no line is longer than 80 characters, no cell
is cut with an ellipsis except a shortened name that carries a key number (its full text in the key below the
table), and the figures the tables show are the ones computed here from the raw files.

The analyze tables have their own tests (tests/test_report_width.py); this file holds predict (fit and run),
compare, roofline, diff, list and ingest to the same measure."""

from __future__ import annotations

import gzip
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli, us_to_ns

TORCH = FIXTURES / "torch"
SWEEP = [("alexnet", 4), ("alexnet", 8), ("alexnet", 16), ("resnet18", 4), ("resnet18", 8), ("resnet18", 16)]


def assert_fits_80(out: str) -> None:
    """No line over 80 characters; every cell of a table with ``…`` is a name with a key number whose entry
    ``[N] …`` is printed, or a name whose template arguments the name shortening left out (``kernel<…>``)."""
    lines = out.splitlines()
    assert lines, "nothing printed"
    long = [line for line in lines if len(line) > 80]
    assert not long, long
    keys = {int(m.group(1)) for line in lines for m in [re.match(r"^\[(\d+)\] +\S", line)] if m}
    for line in lines:
        if "│" not in line and "┃" not in line:
            continue
        for cell in (c.strip() for c in re.split(r"[│┃]", line)):
            if "…" not in cell:
                continue
            assert not re.fullmatch(r"[-\d.,\[\] %]+….*|.*…[-\d.,\[\] %]+", cell) or re.search(r"\[\d+\]$", cell), \
                f"a number cut: {cell!r}"
            number = re.search(r"\[(\d+)\]$", cell)
            if number:
                assert int(number.group(1)) in keys, f"key [{number.group(1)}] not printed: {line!r}"
            else:
                assert re.search(r"<…>", cell), f"cut without a key: {cell!r} in {line!r}"


def _host_step_ns(path: Path) -> float:
    """The mean ProfilerStep#N time of a torch trace, from its raw JSON."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    steps = [us_to_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")]
    return sum(steps) / len(steps)


def _shown(value_ms: float, peak_ms: float) -> str:
    """A figure as a table shows it: four significant figures of its column's largest value."""
    whole = int(math.floor(math.log10(abs(peak_ms)))) + 1
    return f"{value_ms:,.{max(0, 4 - whole)}f}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A store with a small batch sweep (two networks, batches 4, 8, 16), tagged; (store, {(net, batch): id})."""
    store = str(tmp_path_factory.mktemp("width") / "store")
    ids = {}
    for network, batch in SWEEP:
        code, out, err = run_cli("--store", store, "-q", "ingest", str(TORCH / f"{network}_bs{batch}.json.gz"),
                                 "--tag", f"batch={batch}", "--tag", f"model={network}", "--json")
        assert code == 0, err
        ids[(network, batch)] = json.loads(out)["traces"][0]["id"]
    return store, ids


@pytest.fixture(scope="module")
def fit(sweep, tmp_path_factory):
    """``predict fit`` of the sweep, piped: (its output, the model file)."""
    store, ids = sweep
    model = tmp_path_factory.mktemp("model") / "model.json"
    code, out, err = run_cli("--store", store, "predict", "fit", *ids.values(), "--model-out", str(model))
    assert code == 0, err
    return out, model


@pytest.fixture(autouse=True)
def _piped(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


def test_predict_fit_at_80_columns(fit):
    out, _ = fit
    assert_fits_80(out)
    assert "not shown at this width" not in out  # every column of every table fits at 80


def test_predict_fit_shows_each_held_out_trace_with_its_measured_step(fit):
    out, _ = fit
    part = out[out.index("leave-one-trace-out predictions: step time"):]
    part = part[:part.index("leave-one-trace-out predictions: device")]
    steps = {(n, b): _host_step_ns(TORCH / f"{n}_bs{b}.json.gz") / 1e6 for n, b in SWEEP}
    peak = max(steps.values())
    for (network, batch), ms in steps.items():
        row = re.search(rf"^ {network} {batch} +│ +([\d.,]+) │ +([\d.,]+) │ +\[([\d.,]+), ([\d.,]+)\] │",
                        part, re.M)
        assert row, (network, batch, part)
        assert row.group(1) == _shown(ms, peak)
        low, predicted, high = (float(row.group(i).replace(",", "")) for i in (3, 2, 4))
        assert low <= predicted <= high  # the interval holds its prediction
    assert "measured\n" not in out and re.search(r"^ batch +┃ step \(ms\) ┃ step \(ms\) ┃", part, re.M)


def test_predict_fit_wide_is_unchanged_in_content(sweep, tmp_path):
    """At 240 columns the same tables are drawn, none with a dropped column or a cut cell."""
    store, ids = sweep
    code, out, err = run_cli("--store", store, "--wide", "predict", "fit", *ids.values(),
                             "--model-out", str(tmp_path / "m.json"))
    assert code == 0, err
    assert max(map(len, out.splitlines())) <= 240 and "…" not in out


@pytest.mark.parametrize("extra", [[], ["--batch", "64"]])
def test_predict_run_at_80_columns(sweep, fit, extra):
    store, ids = sweep
    _, model = fit
    code, out, err = run_cli("--store", store, "predict", "run", ids[("resnet18", 8)], "--model", str(model), *extra)
    assert code == 0, err
    assert_fits_80(out)
    assert re.search(r"^ layer type +┃ calls ┃", out, re.M)
    if not extra:  # the measured column is there: a trace predicted at its own batch
        assert "measured (ms)" in out


@pytest.mark.parametrize("args", [[], ["--by", "batch", "--series", "model"], ["--kernel", "max_pool_backward"]])
def test_compare_at_80_columns(sweep, args):
    store, ids = sweep
    code, out, err = run_cli("--store", store, "compare", *ids.values(), *args)
    assert code == 0, err
    assert_fits_80(out)
    steps = {(n, b): _host_step_ns(TORCH / f"{n}_bs{b}.json.gz") / 1e6 for n, b in SWEEP}
    peak = max(steps.values())
    for (network, batch), ms in steps.items():
        assert re.search(rf"^ {network}_bs{batch}\.json\.gz .*│ +{re.escape(_shown(ms, peak))} │", out, re.M), \
            (network, batch)


@pytest.mark.parametrize("path", ["ncu/ncu_raw_vgg11_bs16.csv", "ncu/ncu_raw_vgg19_bs16.csv"])
def test_roofline_at_80_columns(tmp_path, path):
    code, out, err = run_cli("--store", str(tmp_path), "roofline", str(FIXTURES / path))
    assert code == 0, err
    assert_fits_80(out)


def test_diff_at_80_columns(sweep):
    store, ids = sweep
    code, out, err = run_cli("--store", store, "diff", ids[("resnet18", 4)], ids[("resnet18", 16)])
    assert code == 0, err
    assert_fits_80(out)


def test_list_and_ingest_at_80_columns(sweep, tmp_path):
    store, ids = sweep
    code, out, err = run_cli("--store", store, "list")
    assert code == 0, err
    assert_fits_80(out)
    assert all(re.search(rf"^ {i} │", out, re.M) for i in ids.values())  # ids are never cut
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(TORCH / "multirank" / "gloo4_slow_rank2"))
    assert code == 0, err
    assert_fits_80(out)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest",
                             str(FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"))
    assert code == 0, err
    assert_fits_80(out)
