"""A message raised to a Python caller (``traceparse.load``, ``add``, ``sql``, ``analyze``, ``Store(...)``) says what
to do in Python (``store=``, ``fmt=``, ``traces=``), not which flag to give: "give --store" does not help a caller
of ``traceparse.load``. The command line keeps its flags (``cli_spelling`` checks the same refusals there)."""

from __future__ import annotations

import sqlite3

import pytest

import traceparse
from helpers import FIXTURES, run_cli
from traceparse.errors import InputError, StoreError, TraceparseError, command_line, on_command_line, spelled

TORCH = FIXTURES / "torch" / "resnet18_bs16.json.gz"
NSYS = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"


def _said(call) -> str:
    """The message of the one-line error ``call()`` raises."""
    with pytest.raises(TraceparseError) as caught:
        call()
    return str(caught.value)


def test_spelled_follows_the_interface_in_use():
    assert not on_command_line() and spelled("--store", "store=") == "store="
    with command_line():
        assert on_command_line() and spelled("--store", "store=") == "--store"
        with command_line(False):
            assert spelled("--store", "store=") == "store="
        assert spelled("--store", "store=") == "--store"
    assert spelled("--store", "store=") == "store="


def test_a_missing_store_says_what_to_pass(tmp_path):
    from traceparse.store import Store

    missing = tmp_path / "nostore"
    said = (f"no store at {missing}: traceparse.add(PATH) stores a trace first, or pass store= the folder of an "
            "existing store")
    assert _said(lambda: traceparse.load("abc123", store=missing)) == f"abc123: no such file, and {said}"
    assert _said(lambda: traceparse.sql("SELECT 1", store=missing)) == said
    assert _said(lambda: Store(missing).load("abc")) == f"abc: {said}"
    assert _said(lambda: Store(missing).load_run("abc")) == f"abc: {said}"
    assert run_cli("--store", str(missing), "sql", "SELECT 1") == \
        (2, "", f"traceparse: error: no store at {missing}: ingest a trace first, or give --store\n")
    assert not missing.exists()


def test_an_unknown_format_names_fmt(tmp_path):
    known = "known formats: auto, chrome, jax, ncu, nsys, nvprof, rocprof, tau, torch, torch_et"
    assert _said(lambda: traceparse.load(TORCH, fmt="bogus")) == f"fmt='bogus': unknown format; {known}"
    assert _said(lambda: traceparse.add(TORCH, fmt="bogus", store=tmp_path / "s")) == \
        f"fmt='bogus': unknown format; {known}"
    assert run_cli("--store", str(tmp_path / "s"), "ingest", "--format", "bogus", str(TORCH)) == \
        (2, "", f"traceparse: error: unknown --format 'bogus'; {known}\n")


def test_a_reader_refusing_a_forced_format_names_fmt(tmp_path):
    assert _said(lambda: traceparse.load(NSYS, fmt="nvprof")) == (
        f"{NSYS}: an Nsight Systems SQLite export (it has a StringIds table), not nvprof output: "
        "read it with fmt='nsys'")
    nvvp = tmp_path / "prof.nvvp"
    con = sqlite3.connect(nvvp)
    con.executescript("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT);")
    con.close()
    assert _said(lambda: traceparse.load(nvvp, fmt="nsys")) == \
        f"{nvvp}: an nvprof SQLite profile (StringTable), not an Nsight Systems export: read it with fmt='nvprof'"


def test_sql_options_are_named_as_keywords(tmp_path):
    store = tmp_path / "s"
    trace_id = traceparse.add(TORCH, store=store)
    assert _said(lambda: traceparse.sql("SELECT 1", store=store, runs=[trace_id])) == \
        f"runs=[{trace_id!r}]: names a trace, not a run; pass traces=[{trace_id!r}]"
    assert _said(lambda: traceparse.sql("SELECT 1", store=store, engine="x")) == \
        "engine='x': expected one of 'duckdb', 'polars'"
    assert run_cli("--store", str(store), "sql", "--run", trace_id, "SELECT 1") == \
        (2, "", f"traceparse: error: --run {trace_id}: names a trace, not a run; use --trace {trace_id}\n")


def test_an_unknown_gpu_names_gpu():
    trace = traceparse.load(TORCH)
    with pytest.raises(InputError) as caught:
        traceparse.analyze(trace, rules=["arithmetic-intensity"], gpu="B9000")
    assert str(caught.value).startswith("gpu='B9000': not in the GPU catalog (known: A100 PCIe 40GB, ")
    code, out, err = run_cli("analyze", "--gpu", "B9000", str(TORCH))
    assert code == 2 and err.startswith("traceparse: error: --gpu 'B9000': not in the GPU catalog (known: ")


def test_no_message_a_python_caller_meets_names_a_flag(tmp_path):
    """Every refusal above, and the store's own, in one sweep: none names a ``--flag``."""
    from traceparse.store import Store

    store = tmp_path / "s"
    trace_id = traceparse.add(TORCH, store=store)
    calls = [lambda: traceparse.load("zz", store=tmp_path / "none"), lambda: traceparse.load(TORCH, fmt="x"),
             lambda: traceparse.add(TORCH, fmt="x", store=store), lambda: traceparse.load(NSYS, fmt="nvprof"),
             lambda: traceparse.sql("SELECT 1", store=tmp_path / "none"),
             lambda: traceparse.sql("SELECT 1", store=store, engine="x"),
             lambda: traceparse.sql("SELECT 1", store=store, runs=[trace_id]),
             lambda: traceparse.analyze(traceparse.load(TORCH), gpu="B9000"),
             lambda: traceparse.analyze(traceparse.load(TORCH), settings={"gpu-idle": {"nope": 1}}),
             lambda: Store(tmp_path / "none").load_run("x"), lambda: Store(store).load_run(trace_id)]
    for call in calls:
        assert " --" not in _said(call)
