"""Integers past Int64 in fields the schema and the rules read (issue 22 item 3), each either dropped with one
counted warning naming the file, the record and the field, or refused in one line; never a polars error
(exit 3) and never a wrapped number. The inputs are hand-made mutants of real fixtures: the two-rank NCCL run
(fixtures/torch/multirank/nccl2_balanced, which has no ``Seq`` argument: it is added as PyTorch 2.4+ writes
it), nvprof's handwritten gpu_trace.log, TAU's real cpi-mpi profiles and the pprof fixture."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, refused, run_cli
from traceparse.store import Store

RANK0 = FIXTURES / "torch" / "multirank" / "nccl2_balanced" / "rank0.json.gz"
#: Chrome-trace categories the torch reader keeps (lower-cased), for the position of an event in its output.
KEPT = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_runtime", "runtime", "cuda_driver",
        "driver", "cuda_sync", "cpu_op", "operator", "user_annotation", "gpu_user_annotation", "python_function"}
BIG = 2**64


def _kept(events: list[dict]) -> list[dict]:
    """The events the torch reader turns into rows, in its output order (complete events of known categories)."""
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in KEPT]


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    return path


def _ingest(path: Path) -> tuple[str, pl.DataFrame]:
    code, out, err = run_cli("ingest", "-q", "--json", str(path))
    assert code == 0, err
    trace_id = json.loads(out)["traces"][0]["id"]
    return err, Store().load(trace_id).events


@pytest.fixture
def doc() -> dict:
    return json.load(gzip.open(RANK0))


def test_a_seq_of_2_64_is_dropped_with_a_warning(store, tmp_path, doc):
    comms = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    for i, e in enumerate(comms):
        e["args"]["Seq"] = BIG if i == 1 else i
    path = _write(tmp_path, doc)
    position = _kept(doc["traceEvents"]).index(comms[1])
    err, events = _ingest(path)
    assert err == (f"traceparse: warning: {path}: dropped 1 event whose seq does not fit Int64 "
                   f"(first: event {position}, seq='18446744073709551616')\n")
    stored = events.filter(pl.col("name") == "record_param_comms")
    assert stored.height == len(comms) - 1
    assert sorted(stored["seq"].to_list()) == [i for i in range(len(comms)) if i != 1]


def test_message_bytes_past_int64_are_dropped_with_a_warning(store, tmp_path, doc):
    """2^62 elements of Float (4 bytes): 2^64 bytes. Kineto copies the arguments onto the NCCL kernel, so both
    rows go; every other message keeps its bytes."""
    comms = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    target = comms[0]["args"]["In msg nelems"]
    carriers = [e for e in doc["traceEvents"] if (e.get("args") or {}).get("In msg nelems") == target]
    for e in carriers:
        e["args"]["In msg nelems"] = 2**62
        assert e["args"]["dtype"] == "Float"
    path = _write(tmp_path, doc)
    kept = _kept(doc["traceEvents"])
    first = min(kept.index(e) for e in carriers)
    err, events = _ingest(path)
    assert err == (f"traceparse: warning: {path}: dropped {len(carriers)} events whose bytes does not fit Int64 "
                   f"(first: event {first}, bytes='18446744073709551616')\n")
    assert events.height == len(kept) - len(carriers)
    size = {"Float": 4, "Long": 8, "Int": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Byte": 1, "Bool": 1}
    expected = sum(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * size[e["args"]["dtype"]]
                   for e in comms if e not in carriers)
    assert events.filter(pl.col("name") == "record_param_comms")["bytes"].sum() == expected


def test_a_profiler_step_of_20_digits_is_dropped_with_a_warning(store, tmp_path, doc):
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps[0]["name"] = "ProfilerStep#" + "9" * 20
    path = _write(tmp_path, doc)
    position = _kept(doc["traceEvents"]).index(steps[0])
    err, events = _ingest(path)
    assert err == (f"traceparse: warning: {path}: dropped 1 event whose name has a step number that does not fit "
                   f"Int64 (first: event {position}, name='ProfilerStep#99999999999999999999')\n")
    code, out, err = run_cli("analyze", "--json", str(path))
    assert code == 0, err
    numbers = {int(e["name"].split("#")[1]) for e in steps[1:] if e["cat"] == "user_annotation"}  # host-side
    assert steps[0]["cat"] == "user_annotation" and len(numbers) == 2
    assert json.loads(out)["summary"][0]["steps"] == len(numbers)


def test_an_nvprof_pid_of_2_64_is_read_without_a_pid(store, tmp_path):
    source = FIXTURES / "nvprof" / "handwritten" / "gpu_trace.log"
    text = source.read_text()
    prefixes = re.findall(r"^==\d+==", text, re.M)
    path = tmp_path / "gpu_trace.log"
    path.write_text(re.sub(r"^==\d+==", f"=={BIG}==", text, flags=re.M))
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("=="))
    code, out, err = run_cli("ingest", "-q", "--json", str(source))
    original = Store().load(json.loads(out)["traces"][0]["id"]).events
    err, events = _ingest(path)
    assert err == (f"traceparse: warning: {path}:{first}: {len(prefixes)} nvprof messages with a process id that "
                   f"does not fit Int64 (first: =={BIG}==); read without a pid\n")
    assert events.height == original.height and events["pid"].null_count() == events.height
    assert events.drop("pid", "trace_id").equals(original.drop("pid", "trace_id"))


def test_a_tau_node_of_20_digits_in_a_file_name(store, tmp_path):
    directory = tmp_path / "cpi"
    directory.mkdir()
    real = FIXTURES / "tau" / "real" / "cpi-mpi"
    shutil.copy(real / "profile.0.0.0", directory / ("profile." + "9" * 20 + ".0.0"))
    shutil.copy(real / "profile.1.0.0", directory / "profile.1.0.0")
    err, events = _ingest(directory)
    assert err == (f"traceparse: warning: {directory}: left out 1 profile file whose node, context or thread number "
                   f"does not fit Int64 (first: profile.{'9' * 20}.0.0)\n")
    assert events["pid"].unique().to_list() == [1]
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(real / "profile.2.0.0", alone / "profile.2.0.99999999999999999999")
    other = tmp_path / "other-store"
    refused(["ingest", "--store", str(other), str(alone)], f"{alone / 'profile.2.0.99999999999999999999'}: its "
            "node, context or thread number (profile.NODE.CONTEXT.THREAD) does not fit Int64", other)


def test_a_pprof_node_of_20_digits_is_refused(store, tmp_path):
    source = FIXTURES / "tau" / "handwritten" / "pprof-callpath-stddev.txt"
    lines = source.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("NODE 0;"))
    lines[at] = lines[at].replace("NODE 0;", "NODE 99999999999999999999;")
    path = tmp_path / "pprof.txt"
    path.write_text("".join(lines))
    refused(["ingest", str(path)], f"{path}:{at + 1}: 'NODE 99999999999999999999;CONTEXT 0;THREAD 0:': a node, "
            "context or thread number that does not fit Int64", Path(store))


@pytest.mark.parametrize("option, error", [
    (["--set", "gpu-idle.top=99999999999999999999"],
     "traceparse: error: --set 'gpu-idle.top=99999999999999999999': '99999999999999999999' does not fit a 64-bit "
     "integer (at most 9,223,372,036,854,775,807)\n"),
    (["--set", "gpu-idle.warning_idle_pct=1e400"],
     "traceparse: error: --set 'gpu-idle.warning_idle_pct=1e400': '1e400' is not a finite number\n"),
    (["--window", "9223372036855:"],
     "traceparse: error: --window '9223372036855:': '9223372036855' ms is past the largest time a trace holds "
     "(9,223,372,036,854 ms)\n"),
    (["--digits", "99999999999999999999"],
     "traceparse analyze: error: argument --digits: expected a whole number from 1 to 17, got "
     "'99999999999999999999'\n"),
    (["--width", "99999999999999999999"],
     "traceparse analyze: error: argument --width: expected a whole number of columns from 40 to 10,000, got "
     "'99999999999999999999'\n"),
    (["--critical-floor", "1e999"],
     "traceparse analyze: error: argument --critical-floor: expected a percentage from 0 to 100, got '1e999'\n"),
])
def test_cli_integers_past_int64_are_one_line(store, option, error):
    import contextlib
    import io

    from traceparse.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["analyze", *option, str(RANK0)])
        except SystemExit as exit:  # argparse's own error (a usage line, then the error)
            code = exit.code
    err = err.getvalue()
    assert code == 2 and "Traceback" not in err
    assert err.splitlines(keepends=True)[-1] == error


def test_a_window_starting_at_the_end_of_int64_selects_nothing(store):
    """9223372036854 ms fits Int64 ns; the trace's start plus it does not: the window is past the trace's end,
    never wrapped to before its start (which analysed the whole trace)."""
    events = [e for e in json.load(gzip.open(RANK0))["traceEvents"] if "ts" in e]
    span_ms = (max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events)) / 1000
    code, out, err = run_cli("analyze", "--window", "9223372036854:", str(RANK0))
    assert code == 2
    assert err == (f"traceparse: error: --window '9223372036854:': {RANK0} has no event in that window (it spans "
                   f"{span_ms:.4g} ms from its start)\n")
