"""GPU work recorded twice in one trace (a trace concatenated with itself, a merge that took one file twice).

Made here from real traces: fixtures/torch/resnet18_bs16.json.gz with its kernels, copies and memsets appended
a second time, and a real rank folder with one rank so edited: hand-made mutants of real files, said so. Counted
twice, that work read "concurrency 100%" (one stream concurrent with itself), "1,488 launched one by one by 744
calls", and GPU time twice the real one. The store keeps each activity once and warns: every finding then equals
the original trace's.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from test_rank_without_gpu import _edited

RESNET = FIXTURES / "torch" / "resnet18_bs16.json.gz"
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def _doubled(tmp_path, pick=lambda event: True):
    """resnet18_bs16 with the GPU events ``pick`` chooses written again at the end of the file; and how many of
    each kind that is."""
    doc = json.loads(gzip.decompress(RESNET.read_bytes()))
    again = [dict(e) for e in doc["traceEvents"] if e.get("cat") in GPU_CATS and pick(e)]
    doc["traceEvents"] += again
    path = tmp_path / "resnet18_doubled.json"
    path.write_text(json.dumps(doc))
    counts: dict[str, int] = {}
    for event in again:
        counts[GPU_CATS[event["cat"]]] = counts.get(GPU_CATS[event["cat"]], 0) + 1
    return path, counts


def _stored(tmp_path, path, name):
    store = str(tmp_path / name)
    code, out, err = run_cli("--store", store, "ingest", "--quiet", str(path))
    assert code == 0, err
    from traceparse.store import Store

    s = Store(store)
    return s.load(s.ids()[0]), err, store


def _findings(store, path):
    code, out, err = run_cli("--store", store, "analyze", "--json", str(path))
    assert code == 0, err
    return {f["rule"] + f["title"]: (f["severity"], f["message"], f["metrics"]) for f in json.loads(out)["findings"]}


def test_a_trace_written_twice_is_stored_once_with_one_warning(tmp_path):
    doubled, counts = _doubled(tmp_path)
    assert counts == {"kernel": 744, "memcpy": 6, "memset": 14}  # what the original holds, counted from its JSON
    original, _, original_store = _stored(tmp_path, RESNET, "original")
    kept, err, doubled_store = _stored(tmp_path, doubled, "doubled")
    assert kept.events.drop("trace_id").equals(original.events.drop("trace_id"))
    assert kept.meta.event_count == original.meta.event_count == original.events.height
    assert kept.meta.summary == original.meta.summary
    warning = (f"{doubled}: 764 GPU activities are recorded again (744 kernels, 6 copies, 14 memsets): the same "
               "kind, name, device, stream, start, duration and correlation as an earlier one, which a stream cannot "
               "run twice; each is counted once (the first: ")
    said = [w for w in kept.meta.warnings if "recorded again" in w]
    assert len(said) == 1 and said[0].startswith(warning)
    assert "recorded again" in err
    # the first repeat follows every original row, and the row it names is the same activity in the original
    kind, name, repeat, repeated = re.fullmatch(r"(\w+) '(.*)', event ([\d,]+) repeats event ([\d,]+)\)",
                                                said[0][len(warning):]).groups()
    assert int(repeat.replace(",", "")) == original.events.height
    row = original.events.filter(pl.col("event_id") == int(repeated.replace(",", ""))).row(0, named=True)
    assert (str(row["kind"]), row["name"]) == (kind, name)
    # every figure of every rule is the original trace's
    assert _findings(doubled_store, doubled) == _findings(original_store, RESNET)


def test_the_python_api_drops_the_same_rows(tmp_path):
    import traceparse

    doubled, _ = _doubled(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = traceparse.load(doubled)
    assert any("764 GPU activities are recorded again" in str(w.message) for w in caught)
    original = traceparse.load(RESNET)
    assert trace.events.drop("trace_id").equals(original.events.drop("trace_id"))
    assert trace.meta.event_count == original.events.height


def test_one_kernel_written_twice(tmp_path):
    doc = json.loads(gzip.decompress(RESNET.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    target = max(kernels, key=lambda e: (e["dur"], e["ts"]))  # the longest kernel
    doubled, counts = _doubled(tmp_path, lambda e: e.get("cat") == "kernel" and e.get("ts") == target["ts"]
                               and e.get("name") == target["name"])
    assert counts == {"kernel": 1}
    kept, _, _ = _stored(tmp_path, doubled, "one")
    said = [w for w in kept.meta.warnings if "recorded again" in w]
    assert len(said) == 1 and ": 1 GPU activity is recorded again (1 kernel): " in said[0]
    assert kept.events.filter(pl.col("kind") == "kernel").height == len(kernels)


@pytest.mark.parametrize("change", ["stream", "correlation", "dur", "ts"])
def test_work_that_differs_in_one_field_is_not_a_repeat(tmp_path, change):
    # the same kernel again, but on another stream, with another correlation id, duration or start: two
    # activities a trace may hold, all kept
    doc = json.loads(gzip.decompress(RESNET.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    again = []
    for e in kernels[:10]:
        e = json.loads(json.dumps(e))
        if change in ("stream", "correlation"):
            e["args"][change] += 1000
        else:
            e[change] += 1
        if change == "stream":
            e["tid"] = e["args"]["stream"]
        again.append(e)
    doc["traceEvents"] += again
    path = tmp_path / f"resnet18_{change}.json"
    path.write_text(json.dumps(doc))
    kept, _, _ = _stored(tmp_path, path, change)
    assert not [w for w in kept.meta.warnings if "recorded again" in w]
    assert kept.events.filter(pl.col("kind") == "kernel").height == len(kernels) + 10


def test_summary_rows_that_are_equal_are_kept():
    # aggregated rows have no start: two equal summary rows are two rows (two reports may well agree)
    from traceparse.repeats import find_repeats
    from traceparse.schema import conform

    rows = pl.DataFrame({"kind": ["kernel", "kernel"], "name": ["k", "k"], "duration_ns": [5, 5],
                         "calls": [3, 3], "event_id": [0, 1]})
    assert find_repeats(conform(rows)) is None
    timed = conform(rows.with_columns(start_ns=pl.lit(7, dtype=pl.Int64), stream_id=pl.lit(1, dtype=pl.Int64)))
    found = find_repeats(timed)
    assert found is not None and found.event_ids == [1] and found.first == ("kernel", "k", 1, 0)


def test_a_rank_written_twice_in_a_run(tmp_path):
    run = "ddp4_balanced"
    folder = _edited(tmp_path, run, 2, "doubled_rank",
                     lambda events: events + [dict(e) for e in events if e.get("cat") in GPU_CATS])
    clean = FIXTURES / "torch" / "multirank" / run
    store_a, store_b = str(tmp_path / "a"), str(tmp_path / "b")
    code, out, err = run_cli("--store", store_b, "analyze", "--json", str(folder))
    assert code == 0, err
    assert "rank2.json.gz: " in err and "GPU activities are recorded again" in err
    doubled = json.loads(out)["findings"]
    code, out, err = run_cli("--store", store_a, "analyze", "--json", str(clean))
    assert code == 0, err
    assert [(f["rule"], f["severity"], f["message"], f["metrics"]) for f in doubled] == \
        [(f["rule"], f["severity"], f["message"], f["metrics"]) for f in json.loads(out)["findings"]]
