"""Issue 16, the store and the CLI: every OSError is one line with exit 2; what a multi-path ingest stored is
said; tmp/ leftovers are removed; a bad value is quoted as a short excerpt; the validation step's policy."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from traceparse.errors import InputError
from traceparse.store import Store
from traceparse.trace import Trace, TraceMeta

CSV = FIXTURES / "nsys" / "handwritten" / "r18w2021_cudaapisum.csv"


def one_line_error(code, err, *parts):
    assert code == 2, err
    assert err.startswith("traceparse: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err


def test_store_path_that_is_a_file(tmp_path):
    store = tmp_path / "store"
    store.write_text("not a directory")
    code, _, err = run_cli("--store", str(store), "ingest", str(CSV))
    one_line_error(code, err, "cannot write to the store", str(store))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_store_not_writable(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o555)
    try:
        code, _, err = run_cli("--store", str(store), "ingest", str(CSV))
    finally:
        store.chmod(0o755)
    one_line_error(code, err, "cannot write to the store")


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_export_out_is_checked_first(store, tmp_path, where):
    assert run_cli("ingest", str(CSV))[0] == 0
    out = tmp_path if where == "a directory" else tmp_path / "missing" / "out.json"
    code, _, err = run_cli("export", str(CSV), "--to", "chrome", "--out", str(out))
    one_line_error(code, err, f"--out {out}: ")


def test_multi_path_ingest_says_what_was_stored(store, tmp_path):
    bad = tmp_path / "bad_cuda_api_sum.csv"
    bad.write_text(CSV.read_text().replace("207710", "-207710").replace("66972,1,", "-5,1,"))
    bad.write_text("Time(%),Total Time (ns),Num Calls,Average,Minimum,Maximum,Name\n1,x,1,1,1,1,a\n")
    code, _, err = run_cli("ingest", str(CSV), str(bad))
    one_line_error(code, err, "[stored: ", f"{CSV} as ", f"not stored: {bad}")
    assert len(Store(store).ids()) == 1


def test_tmp_leftovers_of_a_killed_ingest_are_removed(store):
    dead = 2**22 + 12345  # past pid_max on most systems: no such process
    leftover = store / "tmp" / f"{dead}-0123456789abcdef"
    leftover.mkdir(parents=True)
    (leftover / "events.parquet").write_bytes(b"PAR1 cut")
    live = store / "tmp" / f"{os.getpid()}-feedfacefeedface"
    live.mkdir()
    assert run_cli("ingest", str(CSV))[0] == 0
    assert not leftover.exists() and live.exists()


def test_a_long_bad_value_is_quoted_as_an_excerpt(store, tmp_path):
    p = tmp_path / "long_cuda_api_sum.csv"
    p.write_text("Time(%),Total Time (ns),Num Calls,Average,Minimum,Maximum,Name\n"
                 f"1,{'9' * 10 + 'x' * 1_000_000},1,1,1,1,a\n")
    code, _, err = run_cli("ingest", str(p))
    one_line_error(code, err)
    assert len(err) < 600, len(err)


# -- the validation step ---------------------------------------------------------------------------------
def _trace(**columns):
    n = len(next(iter(columns.values())))
    return Trace(pl.DataFrame({"kind": ["kernel"] * n, "name": [f"k{i}" for i in range(n)], **columns}),
                 TraceMeta(source_paths=["x.csv"]))


def test_invalid_rows_are_dropped_with_one_counted_warning_per_field():
    trace = _trace(start_ns=[1, 2, 3, 4], duration_ns=[5, -1, -2, 2**63 - 1],
                   grid_x=pl.Series([1, 2**40, 1, 1], dtype=pl.Int64))
    assert trace.events["name"].to_list() == ["k0"]
    assert trace.meta.warnings == [
        "x.csv: dropped 2 events whose duration_ns is below 0 (first: event 1, duration_ns=-1)",
        "x.csv: dropped 1 event whose duration_ns makes start_ns + duration_ns pass Int64 "
        "(first: event 3, duration_ns=9223372036854775807)",
    ]


def test_values_past_the_column_type_and_non_finite_floats():
    trace = _trace(start_ns=pl.Series([1, 2**70, 3, 4], dtype=pl.Int128), value=[1.0, 2.0, float("inf"), 4.0],
                   block_x=pl.Series([1, 2, 3, 2**31], dtype=pl.Int64))
    assert trace.events["name"].to_list() == ["k0"]
    assert [w.split(" whose ")[1].split(" (")[0] for w in trace.meta.warnings] == [
        "start_ns does not fit Int64", "value is not a finite number", "block_x does not fit Int32"]


def test_sums_cannot_wrap():
    trace = _trace(duration_ns=[2**62, 2**62, 2**62, 5])
    events = trace.events
    assert events["duration_ns"].cast(pl.Int128).sum() <= 2**63 - 1
    assert events["name"].to_list() == ["k0"]
    assert "would carry the trace's total past Int64" in trace.meta.warnings[0]


def test_nothing_valid_left_is_refused():
    with pytest.raises(InputError, match=r"x.csv: no valid event: all 2 break the validation rules"):
        _trace(calls=[-1, -2]).events


def test_an_empty_trace_is_refused_at_ingest(store, tmp_path):
    p = tmp_path / "empty_cuda_api_sum.csv"
    p.write_text("Time(%),Total Time (ns),Num Calls,Average,Minimum,Maximum,Name\n")
    code, _, err = run_cli("ingest", "--format", "nsys", str(p))
    one_line_error(code, err, str(p))
    assert Store(store).ids() == []


def test_the_warnings_reach_the_stored_metadata(store, tmp_path):
    p = tmp_path / "neg_cuda_api_sum.csv"
    p.write_text(CSV.read_text().replace(",66972,1,", ",-66972,1,", 1))
    code, out, err = run_cli("ingest", str(p), "--json")
    assert code == 0, err
    meta = json.loads(out)["traces"][0]
    assert any("dropped 1 event whose duration_ns is below 0" in w for w in meta["warnings"]), meta["warnings"]
    assert "dropped 1 event whose duration_ns is below 0" in err


def _two_traces_one_cut(store_dir, how: str):
    """Two stored traces and a run; the first trace's meta.json damaged as ``how`` says."""
    for path in (FIXTURES / "torch" / "alexnet_bs4.json.gz", FIXTURES / "torch" / "alexnet_bs8.json.gz"):
        assert run_cli("ingest", str(path))[0] == 0
    ids = sorted(p.name for p in (store_dir / "traces").iterdir())
    meta = store_dir / "traces" / ids[0] / "meta.json"
    data = meta.read_bytes()
    meta.write_bytes({"half": data[: len(data) // 2], "list": b"[1, 2]", "latin1": b'{"id": "\xff"}',
                      "layout": b'{"devices": 7}'}[how])
    return ids, meta


@pytest.mark.parametrize("how", ["half", "list", "latin1", "layout"])
def test_one_damaged_entry_leaves_the_store_usable(store, how):
    """Issue 22.3: a meta.json cut in half made list and analyze exit 3 for the whole store."""
    ids, meta = _two_traces_one_cut(store, how)
    damaged, intact = ids
    code, out, err = run_cli("list", "--width", "240")
    assert code == 0, err
    assert intact in out
    line = next(line for line in out.splitlines() if line.startswith("damaged"))
    assert line.startswith(f"damaged trace {damaged}: {meta} cannot be read (")
    assert line.endswith(f"); `traceparse rm {damaged}` removes it")
    doc = json.loads(run_cli("list", "--json")[1])
    assert [t["id"] for t in doc["traces"]] == [intact]
    assert [(d["id"], d["kind"], d["path"]) for d in doc["damaged"]] == [(damaged, "trace", str(meta))]
    assert run_cli("analyze", intact)[0] == 0
    code, out, err = run_cli("show", damaged)
    one_line_error(code, err, f"trace {damaged}: damaged in the store: {meta} cannot be read (",
                   f"`traceparse rm {damaged}` removes it")
    assert run_cli("rm", damaged) == (0, f"removed {damaged}\n", "")
    assert json.loads(run_cli("list", "--json")[1])["damaged"] == []


def test_a_damaged_run_is_listed_and_removable(store):
    assert run_cli("ingest", str(FIXTURES / "torch" / "multirank" / "gloo4_balanced"))[0] == 0
    assert run_cli("ingest", str(FIXTURES / "torch" / "alexnet_bs4.json.gz"))[0] == 0
    (run_id,) = [p.name for p in (store / "runs").iterdir()]
    run_json = store / "runs" / run_id / "run.json"
    run_json.write_text('{"id": 3')
    doc = json.loads(run_cli("list", "--json")[1])
    assert doc["runs"] == [] and len(doc["traces"]) == 1
    assert [(d["id"], d["kind"]) for d in doc["damaged"]] == [(run_id, "run")]
    assert doc["damaged"][0]["error"] == "not JSON: Expecting ',' delimiter: line 1 column 9 (char 8)"
    code, _, err = run_cli("analyze", run_id)
    one_line_error(code, err, f"run {run_id}: damaged in the store: {run_json} cannot be read")
    assert run_cli("rm", run_id)[0] == 0
    assert json.loads(run_cli("list", "--json")[1])["damaged"] == []


def test_a_total_past_int64_in_a_later_batch_with_no_bad_row_is_caught():
    """The validator's one-query path (no row breaks a rule) still carries the running totals across batches:
    a second batch whose rows are each valid but whose sum passes Int64 loses the row that passes it."""
    from traceparse.validate import Validator

    v = Validator(where="x.json")
    assert v.check(pl.DataFrame({"kind": ["kernel"], "duration_ns": [2**62]})).height == 1
    kept = v.check(pl.DataFrame({"kind": ["kernel", "kernel"], "duration_ns": [2**62 - 1, 2]}))
    assert kept["duration_ns"].to_list() == [2**62 - 1]  # the total is now exactly 2^63 - 1
    assert v.warnings() == ["x.json: dropped 1 event whose duration_ns would carry the trace's total past Int64 "
                            "(its sums would wrap) (first: event 2, duration_ns=2)"]
