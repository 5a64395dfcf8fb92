"""Runs of many ranks: rank detection, refusals, the stored run, list/show/rm, load_run, analyze RUN, Dask.

Figures are checked against independent computations: the per-rank traces
read on their own (``read_paths``), and each rank analysed alone.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from traceparse.analysis import analyze
from traceparse.ingest import read_paths
from traceparse.plugins import registry
from traceparse.run import (choose_workers, device_label, ingest_run, rank_from_name, rank_from_trace, rank_labels,
                            run_id_for)
from traceparse.sources import sha256_of
from traceparse.store import Store, trace_id_for
from traceparse.trace import TraceMeta

MULTIRANK = Path(__file__).resolve().parents[2] / "shared" / "samples" / "multirank"
BALANCED = MULTIRANK / "gloo4_resnet18_bs16"
SLOW = MULTIRANK / "gloo4_resnet18_bs16_slow_rank2"
needs_samples = pytest.mark.skipif(not BALANCED.is_dir(), reason="shared multirank samples not present")


def kineto(rank: int | None, world_size: int | None = None, start_us: int = 1, name: str = "k") -> dict:
    """A small Kineto document: two kernels and one copy on device 0, with distributedInfo when ``rank`` is given."""
    doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start_us, "dur": 2,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": name + "2", "pid": 0, "tid": 7, "ts": start_us + 5, "dur": 3,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": start_us + 10, "dur": 1, "args": {"device": 0, "stream": 7, "bytes": 4096}}]}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    return doc


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def nothing_stored(store: Path) -> None:
    """No run and no trace in the store, and no partial entry left under tmp/."""
    s = Store(store)
    assert s.run_ids() == [] and s.ids() == []
    assert not (store / "tmp").exists() or not any((store / "tmp").iterdir())


def ingest_json(*args: str) -> dict:
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


# -- rank detection ---------------------------------------------------------
@pytest.mark.parametrize("name, rank", [
    ("rank3.json.gz", 3), ("rank_12.pt.trace.json", 12), ("worker-RANK-7.json", 7), ("trace_r5.json", 5),
    ("host.r0.json", 0), ("profile.4.0.0", 4), ("report.11.nsys-rep", 11), ("trace.json", None),
    ("resnet18_bs16.json.gz", None), ("run2.json", None),
    # tensorboard_trace_handler's HOST_PID.MILLISECONDS: a time, not a rank (PyTorch 1.9's resnet50 samples)
    ("worker0.1623143089861.pt.trace.json.gz", None), ("node7_123.1700000000000.pt.trace.json", None),
    ("host.4711.json", 4711)])
def test_rank_from_file_name(name, rank):
    assert rank_from_name(name) == rank


def test_rank_from_the_trace_itself():
    assert rank_from_trace(TraceMeta(distributed={"rank": 5, "world_size": 8}, tags={"rank": "2"})) == 5
    assert rank_from_trace(TraceMeta(tags={"rank": "2"})) == 2
    assert rank_from_trace(TraceMeta(format="nsys", tags={"pid": "4242"})) is None  # a process id is not a rank
    assert rank_from_trace(TraceMeta()) is None


def test_a_tau_profile_of_one_node_names_its_rank(tmp_path):
    """The TAU reader says the rank (its node) where the profile holds exactly one node; the core only reads it."""
    cpi = FIXTURES / "tau" / "real" / "cpi-mpi"  # four nodes: a whole job, not one rank
    assert read_paths([cpi])[0].meta.distributed == {}
    one = tmp_path / "node2"
    one.mkdir()
    shutil.copy(cpi / "profile.2.0.0", one / "profile.2.0.0")
    meta = read_paths([one])[0].meta
    assert meta.distributed == {"rank": 2} and rank_from_trace(meta) == 2


def test_distributed_info_gives_rank_and_world_size_and_beats_the_file_name(tmp_path):
    d = tmp_path / "job"
    write(d / "rank7.json", kineto(rank=1, world_size=2))   # the trace says 1: it wins, with a warning
    write(d / "x.json", kineto(rank=0, world_size=2, start_us=3))
    result = ingest_run([d], store=Store(tmp_path / "s"), jobs=1)
    run = result.run
    assert run["world_size"] == 2 and run["backend"] == "nccl" and run["name"] == "job"
    assert run["rank_from"] == {"0": "trace", "1": "trace"}
    assert run["source_paths"]["1"] == [str(d / "rank7.json")]
    assert result.warnings == ["rank7.json: the trace says rank 1, the file name 7; rank 1 is used"]


def test_file_name_gives_the_rank_when_the_trace_does_not(tmp_path):
    d = tmp_path / "job"
    write(d / "trace_r1.json", kineto(rank=None, start_us=4))
    write(d / "trace_r0.json", kineto(rank=None))
    run = ingest_run([d], store=Store(tmp_path / "s"), jobs=1).run
    assert run["rank_from"] == {"0": "file name", "1": "file name"}
    assert run["world_size"] == 2 and run["backend"] is None
    events = Store(tmp_path / "s").load_run(run["id"]).events
    assert events.group_by("rank").len().sort("rank").rows() == [(0, 3), (1, 3)]


def _nvprof_rank_logs(folder: Path) -> dict[int, str]:
    """``nvprof --log-file out.%p.txt`` under mpirun: one log per process, named by its PID. Made from the
    hand-written multiprocess log (processes 21002 and 21003 printed results): {pid: the process's lines}."""
    import re

    by_pid: dict[int, list[str]] = {}
    pid = None
    for line in (FIXTURES / "nvprof" / "handwritten" / "multiprocess_summary.log").read_text().splitlines():
        m = re.match(r"==(\d+)==", line)
        pid = int(m.group(1)) if m else pid
        if pid is not None and not line.startswith(("rank", "srun", "iteration")):
            by_pid.setdefault(pid, []).append(line)
    logs = {p: "\n".join(lines) + "\n" for p, lines in by_pid.items() if any("Profiling result" in x for x in lines)}
    folder.mkdir(parents=True)
    for p, text in logs.items():
        (folder / f"out.{p}.txt").write_text(text)
    return logs


def test_file_names_that_are_process_ids_are_not_taken_for_ranks(tmp_path):
    """nvprof logs of 2 MPI processes named by PID (out.21002.txt, out.21003.txt) made a run of "world size 21004"
    with "21,002 of 21,004 ranks missing". The number in each name is the process id the log's rows carry, so the
    ranks are numbered in order of process id, with a warning; each rank holds its own log's rows."""
    d = tmp_path / "nvrun"
    logs = _nvprof_rank_logs(d)
    assert sorted(logs) == [21002, 21003]
    result = ingest_run([d], store=Store(tmp_path / "s"), jobs=1)
    run = result.run
    assert run["world_size"] == 2 and "incomplete" not in run
    assert run["rank_from"] == {"0": "process id order", "1": "process id order"}
    assert run["source_paths"] == {"0": [str(d / "out.21002.txt")], "1": [str(d / "out.21003.txt")]}
    assert result.warnings == [
        "the file names give process ids, not ranks (out.21002.txt holds process 21002): the 2 ranks are numbered "
        "0–1 in order of process id, which need not be their MPI ranks; name each file by its rank (e.g. "
        "%q{OMPI_COMM_WORLD_RANK} in the profiler's output file name) to have them"]
    events = Store(tmp_path / "s").load_run(run["id"]).events
    for rank, pid in ((0, 21002), (1, 21003)):
        alone = read_paths([d / f"out.{pid}.txt"])[0].events
        mine = events.filter(pl.col("rank") == rank)
        assert mine.height == alone.height and set(mine["pid"].to_list()) == {pid}
        assert mine["duration_ns"].sum() == alone["duration_ns"].sum()


def test_file_names_of_ranks_0_to_n_stay_ranks_even_when_they_are_the_pids(tmp_path):
    d = tmp_path / "job"
    for rank in (0, 1):
        doc = kineto(rank=None, start_us=1 + rank)
        for event in doc["traceEvents"]:
            event["pid"] = rank
        write(d / f"trace_r{rank}.json", doc)
    run = ingest_run([d], store=Store(tmp_path / "s"), jobs=1).run
    assert run["rank_from"] == {"0": "file name", "1": "file name"}


def test_no_rank_anywhere_is_an_error_naming_the_file(tmp_path):
    d = tmp_path / "job"
    write(d / "a.json", kineto(rank=0, world_size=2))
    write(d / "b.json", kineto(rank=None, start_us=9))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"traceparse: error: {d / 'b.json'}: no rank:")
    nothing_stored(tmp_path / "s")


# -- refusals: nothing half-stored -------------------------------------------
def test_duplicate_ranks_are_refused(tmp_path):
    """Two traces of rank 0 at once (overlapping in time: no profiling windows, tests/test_profiling_windows.py)."""
    d = tmp_path / "job"
    write(d / "a.json", kineto(rank=0, world_size=2))
    write(d / "b.json", kineto(rank=0, world_size=2, start_us=5))
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2
    assert err == (f"traceparse: error: {d / 'b.json'}: rank 0 again (also {d / 'a.json'}), and the two overlap in "
                   "time: two traces of one rank at once are no profiling windows (two jobs, or one trace copied "
                   "and edited?); give each job's files as a run of its own (traceparse ingest --run NAME FILE "
                   "...)\n")
    nothing_stored(tmp_path / "s")


def test_the_same_file_twice_is_refused(tmp_path):
    a = write(tmp_path / "rank0.json", kineto(rank=None))
    b = tmp_path / "rank1.json"
    shutil.copy(a, b)
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(a), str(b), "--run", "twice")
    assert code == 2 and err == f"traceparse: error: {b}: the same content as {a}: one rank given twice\n"
    nothing_stored(tmp_path / "s")


def test_one_capture_in_two_forms_is_refused(tmp_path):
    """The real resnet18_bs4 trace given as rank0.json.gz and again, decompressed, as rank1.json: other bytes, the
    same events. It was stored as a run of two ranks whose every event coincided; it is now refused, naming both
    files, and nothing is stored."""
    d = tmp_path / "job"
    d.mkdir()
    source = FIXTURES / "torch" / "resnet18_bs4.json.gz"
    shutil.copy(source, d / "rank0.json.gz")
    (d / "rank1.json").write_bytes(gzip.decompress(source.read_bytes()))
    events = read_paths([source])[0].events.height
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2 and err == (f"traceparse: error: {d / 'rank1.json'}: the same capture as {d / 'rank0.json.gz'} "
                                 f"(rank 0): its {events:,} events start and end on the same nanoseconds; one rank "
                                 "given twice in two forms (give each rank's trace once)\n")
    nothing_stored(tmp_path / "s")


def test_ranks_with_the_same_span_and_counts_but_other_times_are_kept(tmp_path):
    """Hand-made edge case: two ranks whose first start, last end and counts per kind agree, with one kernel at
    another time, are two ranks (the events are compared, not only their summary)."""
    d = tmp_path / "job"
    a, b = kineto(rank=None), kineto(rank=None)  # ranks from the file names, as a copy's would be
    b["traceEvents"][1]["ts"] += 1
    write(d / "rank0.json", a)
    write(d / "rank1.json", b)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", "--json", str(d))
    assert code == 0, err
    assert sorted(json.loads(out)["runs"][0]["ranks"]) == ["0", "1"]
    b["traceEvents"][1]["ts"] -= 1  # now the same events in other bytes: refused, as the real copy above
    (d / "rank1.json").write_text(json.dumps(b, indent=1))
    code, _, err = run_cli("--store", str(tmp_path / "s2"), "ingest", str(d))
    assert code == 2 and "rank1.json: the same capture as " in err


def test_copies_that_each_say_their_own_rank_are_ranks(tmp_path):
    """Copies of one real trace that each say another rank in distributedInfo are made on purpose (the ingest
    benchmark's ranks): kept, not refused as one capture given twice."""
    d = tmp_path / "job"
    d.mkdir()
    data = gzip.decompress((FIXTURES / "torch" / "resnet18_bs4.json.gz").read_bytes())
    start = data.index(b"{") + 1
    for rank in (0, 1):
        info = json.dumps({"backend": "nccl", "rank": rank, "world_size": 2}).encode()
        (d / f"r{rank}.json").write_bytes(data[:start] + b'"distributedInfo": ' + info + b"," + data[start:])
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", "--json", str(d))
    assert code == 0, err
    assert sorted(json.loads(out)["runs"][0]["ranks"]) == ["0", "1"]


def test_a_rank_of_another_job_is_refused(tmp_path):
    """Three real ranks of the gloo DDP run with rank 3 of the NCCL FSDP run, taken days apart: it was moved onto
    the run's clock and graded "Ranks unevenly busy, critical, 3.436×". The ranks name different backends, which
    one job's ranks never do: refused in one line that says what differs and how far apart the traces are."""
    d = tmp_path / "job"
    d.mkdir()
    ddp, fsdp = FIXTURES / "torch" / "multirank" / "ddp4_balanced", FIXTURES / "torch" / "multirank" / "fsdp4_balanced"
    for rank in (0, 1, 2):
        shutil.copy(ddp / f"rank{rank}.json.gz", d)
    shutil.copy(fsdp / "rank3.json.gz", d)
    ends = [read_paths([ddp / f"rank{rank}.json.gz"])[0].events for rank in (0, 1, 2)]
    end = max(int((e["start_ns"] + e["duration_ns"].fill_null(0)).max()) for e in ends)
    start = int(read_paths([fsdp / "rank3.json.gz"])[0].events["start_ns"].min())
    gap_s = round((start - end) / 1e9)
    code, _, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(d))
    assert code == 2 and err == (f"traceparse: error: {d / 'rank3.json.gz'}: rank 3 is from another job: its trace "
                                 "names the backend 'nccl', where ranks 0, 1 and 2 name 'gloo' (the ranks of one job "
                                 f"share one backend); its events are also {gap_s:,} s from theirs; give the ranks of "
                                 "one run together\n")
    nothing_stored(tmp_path / "s")
    e = tmp_path / "even"  # two and two (hand-made): the lowest rank's backend is the run's, rank 2 is named
    for rank in range(4):
        doc = kineto(rank=rank, world_size=4, start_us=1 + rank)
        doc["distributedInfo"]["backend"] = "gloo" if rank in (0, 3) else "nccl"
        write(e / f"rank{rank}.json", doc)
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(e))
    assert code == 2 and err == (f"traceparse: error: {e / 'rank1.json'}: rank 1 is from another job: its trace names "
                                 "the backend 'nccl', where ranks 0 and 3 name 'gloo' (the ranks of one job share one "
                                 "backend); give the ranks of one run together\n")


def test_ranks_missing_from_the_world_size_are_a_warning(tmp_path):
    d = tmp_path / "job"
    write(d / "rank0.json", kineto(rank=0, world_size=4))
    write(d / "rank1.json", kineto(rank=1, world_size=4, start_us=2))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d), "--json")
    assert code == 0
    assert err == "traceparse: warning: 2 of 4 ranks missing from the run: 2, 3\n"
    run = json.loads(out)["runs"][0]
    assert run["world_size"] == 4 and sorted(run["ranks"]) == ["0", "1"] and run["already_stored"] is False


def test_a_rank_beyond_the_world_size_is_refused(tmp_path):
    d = tmp_path / "job"
    write(d / "rank0.json", kineto(rank=0, world_size=2))
    write(d / "rank5.json", kineto(rank=5, world_size=2, start_us=2))
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2 and err == f"traceparse: error: {d / 'rank5.json'}: rank 5 is outside the world size 2\n"
    nothing_stored(tmp_path / "s")


def test_mixed_formats_are_refused(tmp_path):
    d = tmp_path / "job"
    write(d / "rank0.json", kineto(rank=0, world_size=2))
    shutil.copy(FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz", d / "rank1.sqlite.gz")
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2
    assert err == f"traceparse: error: {d / 'rank1.sqlite.gz'}: mixed formats in one run: rank0.json is torch, " \
                  "rank1.sqlite.gz is nsys\n"
    nothing_stored(tmp_path / "s")


def test_a_folder_of_no_traces_is_refused_as_a_folder(tmp_path):
    """An HPCToolkit database folder (hpcgroup/pipit's test data) was refused as ".../FORMATS.md: not a format
    traceparse recognises": a file the user never named."""
    d = tmp_path / "database"
    write(d / "FORMATS.md", "# the database's formats\n")
    write(d / "meta.db", "HPCTOOLKIT")
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d))
    assert code == 2
    assert err == (f"traceparse: error: {d}: a folder no reader reads, and none of its 2 entries is a trace "
                   "traceparse recognises (tried: chrome, jax, ncu, nsys, nvprof, rocprof, tau, torch, torch_et); a run is "
                   "a folder of one trace per rank\n")
    nothing_stored(tmp_path / "s")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_one_unreadable_rank_stores_nothing(tmp_path, jobs):
    d = tmp_path / "job"
    write(d / "rank0.json", kineto(rank=0, world_size=2))
    bad = kineto(rank=1, world_size=2)
    bad["traceEvents"][1]["ts"] = "x1"
    write(d / "rank1.json", bad)
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(d), "--jobs", jobs)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"traceparse: error: {d / 'rank1.json'}: traceEvents[1].ts:")
    nothing_stored(tmp_path / "s")


# -- the stored run ---------------------------------------------------------
@pytest.fixture(scope="module")
def slow_store(tmp_path_factory):
    """The slow-rank2 sample run, ingested once (in this process)."""
    if not SLOW.is_dir():
        pytest.skip("shared multirank samples not present")
    root = tmp_path_factory.mktemp("runs")
    result = ingest_run([SLOW], store=Store(root), jobs=1)
    return Store(root), result.run


@needs_samples
def test_run_metadata_and_layout(slow_store):
    store, run = slow_store
    files = [SLOW / f"rank{r}.json.gz" for r in range(4)]
    assert run["id"] == run_id_for([sha256_of([f]) for f in files])
    assert run["ranks"] == {str(r): trace_id_for(sha256_of([f])) for r, f in enumerate(files)}
    assert (run["name"], run["format"], run["world_size"], run["backend"]) == \
        ("gloo4_resnet18_bs16_slow_rank2", "torch", 4, "gloo")
    for r in range(4):
        assert (store.runs_dir / run["id"] / f"rank={r}" / "events.parquet").is_file()
        assert store.rank_meta(run["id"], r).id == run["ranks"][str(r)]
    assert store.ids() == []  # ranks are partitions of the run, not loose traces


@needs_samples
def test_load_run_is_the_rank_traces_concatenated(slow_store):
    store, run = slow_store
    combined = store.load_run(run["id"])
    assert combined.meta.format == "run" and combined.id == run["id"]
    assert combined.meta.extra["run"]["ranks"] == run["ranks"]
    info = json.loads(gzip.open(SLOW / "rank0.json.gz").read())["distributedInfo"]  # the trace's own words
    groups = [{"name": g["pg_name"], "desc": g["pg_desc"], "size": g["pg_size"], "ranks": g["ranks"]}
              for g in info["pg_config"]]
    assert combined.meta.distributed == {"world_size": 4, "backend": "gloo", "process_groups": groups}
    expected = []
    for r in range(4):
        alone = read_paths([SLOW / f"rank{r}.json.gz"])[0].events
        expected.append(alone.with_columns(trace_id=pl.lit(run["ranks"][str(r)]),
                                           rank=pl.lit(r, dtype=pl.Int32)))
    assert combined.events.equals(pl.concat(expected))
    assert rank_labels(combined) == {tid: int(r) for r, tid in run["ranks"].items()}
    assert device_label(rank_labels(combined), run["ranks"]["2"], 0) == "rank 2:0"
    assert device_label({}, "x", None) == "?"


@needs_samples
def test_analyze_run_runs_every_rule_and_gives_run_level_and_per_rank_figures(slow_store):
    store, run = slow_store
    combined = store.load_run(run["id"])
    findings = analyze(combined)
    applicable = {r.name for r in registry().rules.values() if r.applies_to(combined)}
    assert {f.rule for f in findings} == applicable and len(applicable) >= 10
    by_rule = {f.rule: f for f in findings}
    ranks = [store.load_rank(run["id"], r) for r in range(4)]
    alone = [{f.rule: f for f in analyze(t)} for t in ranks]
    # the run-level figure is the sum over ranks; the device table has one row per rank, equal to that rank alone
    for rule, keys in (("gpu-idle", ("span_ns", "busy_ns", "idle_ns", "gaps")),
                       ("low-kernel-concurrency", ("kernel_busy_ns", "concurrent_ns")),
                       ("low-memcpy-overlap", ("memcpy_time_ns", "overlapped_ns"))):
        metrics = by_rule[rule].metrics
        for key in keys:
            assert metrics[key] == sum(a[rule].metrics[key] for a in alone), (rule, key)
        assert list(metrics["devices"]) == [f"rank {r}:0" for r in range(4)]
        for r in range(4):
            assert metrics["devices"][f"rank {r}:0"] == alone[r][rule].metrics["devices"]["0"]
    gaps = by_rule["gpu-idle"]
    assert gaps.columns[0].key == "rank" and {i["rank"] for i in gaps.items} <= {0, 1, 2, 3}
    assert gaps.items[0]["length_ns"] == max(a["gpu-idle"].items[0]["length_ns"] for a in alone)


@needs_samples
@pytest.mark.parametrize("sample", ["gloo4_resnet18_bs16", "gloo4_resnet18_bs16_slow_rank2"])
def test_cli_analyze_of_each_sample_run(tmp_path, sample):
    store = str(tmp_path / "s")
    doc = ingest_json("--store", store, "ingest", str(MULTIRANK / sample))
    run = doc["runs"][0]
    assert doc["traces"] == [] and run["name"] == sample and sorted(run["ranks"]) == ["0", "1", "2", "3"]
    result = ingest_json("--store", store, "analyze", run["id"][:6])
    assert result["traces"][0]["format"] == "run"
    assert result["traces"][0]["run"] == {"name": sample, "world_size": 4, "ranks": run["ranks"]}
    assert {f["trace"] for f in result["findings"]} == {run["id"]}
    assert len({f["rule"] for f in result["findings"]}) >= 10
    # the run's name, the directory again and no argument (the last ingested) name the same run
    assert ingest_json("--store", store, "analyze", sample) == result
    assert ingest_json("--store", store, "analyze", str(MULTIRANK / sample)) == result
    assert ingest_json("--store", store, "analyze") == result


# -- list / show / rm ---------------------------------------------------------
def test_panel_of_a_large_run_summarises(tmp_path):
    """A run of more than 20 ranks: its panel says how many ranks and the spread of their events and spans, and
    lists only the ranks that stand out (the longest spans, the most and the fewest events, warnings), not one
    line per rank; a run of 20 lists every rank."""
    from traceparse_plugins.commands.core.store import RANKS_LISTED

    assert RANKS_LISTED == 20
    store = str(tmp_path / "s")
    docs = [kineto(rank=r, world_size=25, start_us=1) for r in range(25)]
    docs[7]["traceEvents"][2]["dur"] = 500  # rank 7: the longest span (510 us; the others 11 us)
    docs[9]["traceEvents"].append(dict(docs[9]["traceEvents"][0], ts=3))  # rank 9: 4 events
    docs[11]["traceEvents"] = docs[11]["traceEvents"][:2]  # rank 11: 2 events, span 8 us
    for r, doc in enumerate(docs):
        write(tmp_path / "big" / f"rank{r}.json", doc)
    spans = {r: max(e["ts"] + e["dur"] for e in d["traceEvents"]) - min(e["ts"] for e in d["traceEvents"])
             for r, d in enumerate(docs)}
    counts = {r: len(d["traceEvents"]) for r, d in enumerate(docs)}
    assert spans[7] == 510 and spans[0] == 11 and spans[11] == 8 and counts[9] == 4 and counts[11] == 2
    code, out, err = run_cli("--store", store, "ingest", "--width", "200", str(tmp_path / "big"))
    assert code == 0, err
    assert "25 (0–24)" in out
    assert "per rank    events 2 to 4, median 3; span 8 us to 510 us, median 11 us" in out
    lines = {int(line.split()[1]): line for line in out.splitlines()
             if line.split()[1:2] and line.split()[1].isdigit() and ".json" in line}
    assert sorted(lines) == [7, 9, 11]  # only the ranks that stand out, not 25 lines
    assert "longest span" in lines[7] and "most events" in lines[9] and "fewest events" in lines[11]
    assert "lists all 25 ranks" in out

    few = str(tmp_path / "s2")
    for r in range(20):
        write(tmp_path / "twenty" / f"rank{r}.json", kineto(rank=r, world_size=20, start_us=1))
    code, out, err = run_cli("--store", few, "ingest", "--width", "200", str(tmp_path / "twenty"))
    assert code == 0, err
    assert [f"rank{r}.json" in out for r in range(20)] == [True] * 20 and "per rank" not in out


def test_list_show_rm_of_runs(tmp_path):
    store = str(tmp_path / "s")
    files = [write(tmp_path / f"w{r}" / f"trace_r{r}.json", kineto(rank=None, start_us=r + 1)) for r in range(3)]
    loose = write(tmp_path / "single.json", kineto(rank=None, start_us=40))
    ingested = ingest_json("--store", store, "ingest", *map(str, files), "--run", "three", "--tag", "exp=a")
    run = ingested["runs"][0]
    ingest_json("--store", store, "ingest", str(loose))
    listed = ingest_json("--store", store, "list")
    assert [t["path"] for t in listed["traces"]] == [str(loose)]
    assert listed["runs"] == [{
        "id": run["id"], "name": "three", "world_size": 3, "ranks": [0, 1, 2],
        "traces": [run["ranks"][str(r)] for r in range(3)], "format": "torch", "backend": None, "events": 9,
        "tags": {"exp": "a"}, "ingested_at": run["ingested_at"], "warnings": 0}]
    shown = ingest_json("--store", store, "show", "three")
    assert shown["run"]["id"] == run["id"]
    assert [(r["rank"], r["trace"], r["id"], r["event_count"], r["source_paths"]) for r in shown["ranks"]] == \
        [(r, run["ranks"][str(r)], run["ranks"][str(r)], 3, [str(files[r])]) for r in range(3)]
    code, out, _ = run_cli("--store", store, "show", run["id"])
    assert code == 0 and "world size  3 (3 ranks stored)" in out and "trace_r2.json" in out
    again = ingest_json("--store", store, "ingest", *map(str, files), "--run", "three")
    assert again["runs"][0]["already_stored"] is True and again["runs"][0]["id"] == run["id"]
    assert ingest_json("--store", store, "rm", run["id"][:5])["removed"] == [run["id"]]
    assert ingest_json("--store", store, "list")["runs"] == []
    code, _, err = run_cli("--store", store, "show", "three")
    assert code == 2 and "three: no such file, and no trace with this id" in err


# -- parallel, bounded ------------------------------------------------------
@needs_samples
def test_process_pool_gives_the_same_run_as_in_process(tmp_path, slow_store):
    store, run = slow_store
    pooled = Store(tmp_path / "s")
    result = ingest_run([SLOW], store=pooled, jobs=2)
    assert result.run["ranks"] == run["ranks"] and result.run["id"] == run["id"]
    assert pooled.load_run(run["id"]).events.equals(store.load_run(run["id"]).events)


def test_this_process_and_a_pool_read_the_run_as_one_process_does(tmp_path):
    """With two workers this process reads ranks beside a pool of one process (started before the hashing): the
    same run as read by this process alone; the pool is not started ahead for the same files again (their run is
    likely stored), and they are recognised as stored."""
    from traceparse.run import _maybe_stored, plan_run

    d = tmp_path / "job"
    for rank in range(4):
        write(d / f"rank{rank}.json", kineto(rank=rank, world_size=4, start_us=1 + rank))
    alone, pooled = Store(tmp_path / "alone"), Store(tmp_path / "pooled")
    assert not _maybe_stored(pooled, plan_run([d]))
    run = ingest_run([d], store=alone, jobs=1).run
    result = ingest_run([d], store=pooled, jobs=2)
    assert not result.already_stored and result.run["ranks"] == run["ranks"]
    assert pooled.load_run(run["id"]).events.equals(alone.load_run(run["id"]).events)
    assert _maybe_stored(pooled, plan_run([d]))
    assert ingest_run([d], store=pooled, jobs=2).already_stored


def test_workers_are_bounded_by_cores_and_memory(tmp_path, monkeypatch):
    import traceparse.run as run_module

    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (80 * 2**20))
    ranks = [[big]] * 64
    monkeypatch.setattr(run_module.os, "sched_getaffinity", lambda _: set(range(16)))
    monkeypatch.setattr(run_module, "available_memory", lambda: 100 * 2**30)
    assert choose_workers(ranks) == 16                      # cores bound
    need = run_module.rank_memory([big])
    assert need == 300 * 2**20 + 4 * 80 * 2**20
    monkeypatch.setattr(run_module, "available_memory", lambda: 3 * need)
    assert choose_workers(ranks) == 1                        # half of 3 ranks' memory: one at a time
    monkeypatch.setattr(run_module, "available_memory", lambda: 10 * need)
    assert choose_workers(ranks) == 5
    assert choose_workers(ranks, jobs=3) == 3 and choose_workers(ranks[:2], jobs=8) == 2
    small = write(tmp_path / "s.json", kineto(rank=0))
    assert choose_workers([[small]] * 63) == 1               # a small run is read in this process
    assert choose_workers([[small]] * 64) == 10              # many small ranks: workers share their fixed cost


def test_gzip_rank_memory_uses_the_uncompressed_size(tmp_path):
    from traceparse.run import input_bytes

    path = tmp_path / "rank0.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b" " * 1_000_000)
    assert input_bytes([path]) == 1_000_000


# -- Dask -------------------------------------------------------------------
@needs_samples
def test_dask_local_cluster_gives_the_same_json_as_in_process(tmp_path):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from traceparse import distributed as dist

    inproc, ondask = str(tmp_path / "a"), str(tmp_path / "b")
    plain = ingest_json("--store", inproc, "ingest", str(BALANCED))["runs"][0]
    expected = ingest_json("--store", inproc, "analyze", plain["id"])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        address = cluster.scheduler_address
        via = ingest_json("--store", ondask, "ingest", str(BALANCED), "--scheduler", address)["runs"][0]
        assert via["ranks"] == plain["ranks"] and via["id"] == plain["id"]
        assert Store(ondask).load_run(via["id"]).events.equals(Store(inproc).load_run(plain["id"]).events)
        got = ingest_json("--store", ondask, "analyze", via["id"], "--scheduler", address)
        # the measures really ran on the workers: each read ranks of the run
        cached = client.run(lambda: dist._partition.cache_info().currsize)
        assert len(cached) == 2 and sum(cached.values()) >= 2
    assert got == expected


def test_scheduler_without_a_reachable_cluster_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    for r in (0, 1):  # (a folder of one trace is that trace, not a run)
        write(tmp_path / "job" / f"rank{r}.json", kineto(rank=r, world_size=2))
    monkeypatch.setenv("TRACEPARSE_SCHEDULER", "local:x")
    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(tmp_path / "job"))
    assert code == 2 and err == "traceparse: error: --scheduler 'local:x': expected local or local:N " \
                                "(N worker processes)\n"
    nothing_stored(tmp_path / "s")


def test_a_run_is_flushed_to_disk_once_every_rank_is_written(tmp_path, monkeypatch):
    """The ranks write their files without an fsync each (a thousand small ranks paid 2 to 13 ms apiece); every
    file of the run (events and metadata of each rank) is flushed once, before run.json and the rename: by the
    background flusher as each rank is done (its directory still ``part-N``, N its place in the run: here its
    rank), or at the commit."""
    import os

    import traceparse.store as store_module

    d = tmp_path / "run"
    for r in range(3):
        write(d / f"rank{r}.json", kineto(rank=r, world_size=3))
    flushed: list[tuple[str, bool]] = []  # (file, run.json already written)
    real = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        flushed.append((path, any(Path(p).name == "run.json" for p, _ in flushed)))
        return real(fd)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    run = ingest_run([d], store=Store(tmp_path / "s"), jobs=1).run
    rank_files = [(Path(p).parent.name.replace("part-", "rank="), Path(p).name, late) for p, late in flushed
                  if Path(p).name in ("events.parquet", "meta.json")]
    # each rank's two files flushed once, all before run.json was written
    assert sorted(rank_files) == sorted((f"rank={r}", name, False) for r in range(3)
                                        for name in ("events.parquet", "meta.json"))
    assert [Path(p).name for p, _ in flushed].count("run.json") == 1
    assert sorted(run["ranks"]) == ["0", "1", "2"]


def test_early_flush_then_commit_flushes_only_the_rest(tmp_path, monkeypatch):
    """Without ``syncfs`` (not Linux): a rank's files flushed while the other ranks are read are not flushed again
    at the commit (renamed from part-N to rank=R); a rank moved onto the run's clock since (its files rewritten)
    is flushed again."""
    import os

    import traceparse.store as store_module

    monkeypatch.setattr(store_module, "_syncfs_call", lambda: None)

    d = tmp_path / "run"
    write(d / "rank0.json", kineto(rank=0, world_size=3, start_us=1))
    write(d / "rank1.json", kineto(rank=1, world_size=3, start_us=2))
    write(d / "rank2.json", kineto(rank=2, world_size=3, start_us=1 + 3600 * 10**6))  # an hour later: moved
    flushed: list[str] = []
    real = os.fsync

    def fsync(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    run = ingest_run([d], store=Store(tmp_path / "s"), jobs=1).run
    assert run["clock_shifts_ns"].keys() == {"2"}
    names = [(Path(p).parent.name, Path(p).name) for p in flushed if Path(p).name in ("events.parquet", "meta.json")]
    assert sorted(names) == sorted([(f"part-{r}", n) for r in range(3) for n in ("events.parquet", "meta.json")]
                                   + [("rank=2", "events.parquet"), ("rank=2", "meta.json")])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs is Linux's")
def test_a_run_of_many_files_is_flushed_with_one_syncfs(tmp_path, monkeypatch):
    """A run of more files than SYNCFS_FILES is flushed with one syncfs of its file system, after every rank's
    files are written and before run.json: no fsync of a rank's file, none while the ranks are read."""
    import os

    import traceparse.store as store_module

    d = tmp_path / "run"
    for r in range(3):
        write(d / f"rank{r}.json", kineto(rank=r, world_size=3))
    calls: list[tuple[str, list[str]]] = []  # (what, the rank files present then)
    real_fsync, real_syncfs = os.fsync, store_module._syncfs

    def present() -> list[str]:
        return sorted(p.name for p in (tmp_path / "s").rglob("*") if p.is_file())

    def fsync(fd):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), present()))
        return real_fsync(fd)

    def syncfs(path):
        calls.append(("syncfs", present()))
        return real_syncfs(path)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    monkeypatch.setattr(store_module, "_syncfs", syncfs)
    monkeypatch.setattr(store_module, "SYNCFS_FILES", 2)
    run = ingest_run([d], store=Store(tmp_path / "s"), jobs=1).run
    assert sorted(run["ranks"]) == ["0", "1", "2"]
    (synced,) = [files for what, files in calls if what == "syncfs"]
    assert synced == sorted(["events.parquet", "meta.json"] * 3)  # every rank's files, not run.json yet
    assert not [what for what, _ in calls if Path(what).name in ("events.parquet", "meta.json")]


def test_workers_share_the_cores_among_their_polars_threads(monkeypatch):
    """Worker processes started for a run get cores // workers polars threads (at least 1), through the
    environment they start with; the variable is gone afterwards, and a value the user set is kept."""
    import os

    from traceparse.run import _polars_threads

    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    with _polars_threads(0):
        assert os.environ["POLARS_MAX_THREADS"] == "1"
    with _polars_threads(4):
        assert os.environ["POLARS_MAX_THREADS"] == "4"
    assert "POLARS_MAX_THREADS" not in os.environ
    monkeypatch.setenv("POLARS_MAX_THREADS", "7")
    with _polars_threads(1):
        assert os.environ["POLARS_MAX_THREADS"] == "7"
    assert os.environ["POLARS_MAX_THREADS"] == "7"


PP2 = FIXTURES / "torch" / "multirank" / "pp2_balanced"


def test_files_that_are_no_trace_are_left_out_of_a_run_folder_and_named(tmp_path):
    """A run folder kept with what made it (a README, the script) would not ingest: the first file no reader
    recognised stopped the run. Files named like no reader's files and recognised by none are left out with one
    warning naming them, kept with the run (``show``); a trace named like none (``rank1_trace``) is still read."""
    folder = tmp_path / "pp2 with notes"
    folder.mkdir()
    shutil.copy(PP2 / "rank0.json.gz", folder / "rank0.json.gz")
    (folder / "rank1_trace").write_bytes(gzip.decompress((PP2 / "rank1.json.gz").read_bytes()))
    (folder / "README.md").write_text("# how these were made\n")
    (folder / "make.py").write_text("print('profile')\n")
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(folder), "--json")
    assert code == 0, err
    [run] = json.loads(out)["runs"]
    assert sorted(run["ranks"]) == ["0", "1"]
    assert run["source_paths"] == {"0": [str(folder / "rank0.json.gz")], "1": [str(folder / "rank1_trace")]}
    warning = f"{folder}: 2 files are no trace and were left out: README.md, make.py"
    assert err.strip().splitlines() == [f"traceparse: warning: {warning}"]
    assert run["warnings"] == [warning]
    # the same ranks without the extra files: the same run (its id is its ranks' contents)
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("rank0.json.gz", "rank1_trace"):
        shutil.copy(folder / name, plain / name)
    code, out, err = run_cli("--store", str(tmp_path / "s2"), "ingest", str(plain), "--json")
    assert code == 0, err
    assert json.loads(out)["runs"][0]["id"] == run["id"] and err == ""


def test_a_file_named_like_the_runs_traces_that_is_none_still_stops_the_run(tmp_path):
    """A file named as the run's traces are (``*.json`` beside torch ranks) that no reader recognises is not
    left out: a rank left out would change every figure of the run. It is refused in one line, naming it. One
    named like another format's files only (``stdout.txt``: nvprof's and ncu's text output) is left out."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("rank0.json.gz", "rank1.json.gz"):
        shutil.copy(PP2 / name, folder / name)
    (folder / "stdout.txt").write_text("epoch 1 loss 0.3\n")
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(folder), "--json")
    assert code == 0, err
    assert err.strip().splitlines() == [f"traceparse: warning: {folder}: 1 file is no trace and was left out: "
                                        "stdout.txt"]
    (folder / "losses.json").write_text('{"epoch": 1, "loss": 0.3}\n')
    code, out, err = run_cli("--store", str(tmp_path / "s2"), "ingest", str(folder))
    assert code == 2 and out == ""
    assert err.startswith(f"traceparse: error: {folder / 'losses.json'}: not a format traceparse recognises")
    assert err.rstrip().endswith("; in a run folder every file named like a trace must be one: move it out of run, "
                                 "or give the ranks' files themselves with --run NAME")
    assert len(err.strip().splitlines()) == 1


def test_a_job_scripts_files_beside_nsys_ranks_are_left_out(tmp_path):
    """The real two-rank nsys run as its script left it (fixtures/nsys/nccl_run/ranks: each rank's report, its
    SQLite export and the steps the script timed, ``steps_rank0.json``): the steps files are named like torch
    traces, not like nsys files, and stopped the run; they are left out, named, and the two ranks read."""
    folder = FIXTURES / "nsys" / "nccl_run" / "ranks"
    steps = sorted(p.name for p in folder.glob("steps_rank*.json"))
    assert steps == ["steps_rank0.json", "steps_rank1.json"]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(folder), "--json")
    assert code == 0, err
    [run] = json.loads(out)["runs"]
    assert sorted(run["ranks"]) == ["0", "1"] and run["format"] == "nsys"
    assert f"{folder}: 2 files are no trace and were left out: {', '.join(steps)}" in run["warnings"]


def test_a_truncated_rank_is_named_in_the_run_s_incomplete_line(tmp_path, monkeypatch):
    """A run whose rank 1 was killed mid-write (the real nccl2_slow_rank1 twin, rank 1's file cut at 60%): the
    summary said "incomplete: the file ends early ..." without saying which of the ranks' files did. Each rank's
    note now names its rank; the whole rank 0 says nothing."""
    source = FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1"
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank in (0, 1):
        data = gzip.decompress((source / f"rank{rank}.json.gz").read_bytes())
        (ranks / f"rank{rank}.json").write_bytes(data[: int(len(data) * 0.6)] if rank == 1 else data)
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", str(ranks))
    assert code == 0, err
    (note,) = json.loads(out)["summary"][0]["incomplete"]
    assert note.startswith(f"rank 1: {ranks / 'rank1.json'}: the file ends early (truncated JSON); kept the ")
    assert f"{ranks / 'rank1.json'}: the file ends early" in err  # and the warning as it was read
    monkeypatch.setenv("COLUMNS", "400")
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", str(ranks))
    assert code == 0, err
    assert re.search(rf"incomplete +{re.escape(note)}; every figure here covers only what was read", out)


def test_world_sizes_that_disagree_take_most_ranks_word(tmp_path):
    """Hand-made ranks (kineto() above): three say a world of 3, one says 8. The run's world size is what most
    ranks say, and the warning says who said what, not "5 of 8 ranks missing" taken from the one odd rank; never
    below the ranks present."""
    d = tmp_path / "job"
    for rank, size in ((0, 3), (1, 8), (2, 3)):
        write(d / f"rank{rank}.json", kineto(rank=rank, world_size=size, start_us=1 + rank))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", "--json", str(d))
    assert code == 0, err
    run = json.loads(out)["runs"][0]
    assert run["world_size"] == 3 and "missing" not in err
    assert err == ("traceparse: warning: the ranks disagree on the world size (ranks 0 and 2 say 3; rank 1 says 8); "
                   "3 is used (most ranks')\n")
    e = tmp_path / "job2"
    for rank, size in ((0, 2), (1, 2), (2, 2), (3, 4)):
        write(e / f"rank{rank}.json", kineto(rank=rank, world_size=size, start_us=1 + rank))
    code, out, err = run_cli("--store", str(tmp_path / "s2"), "ingest", "--json", str(e))
    assert code == 0 and json.loads(out)["runs"][0]["world_size"] == 4
    assert err == ("traceparse: warning: the ranks disagree on the world size (ranks 0, 1 and 2 say 2; rank 3 says "
                   "4); 4 is used (the ranks present)\n")


def test_a_ranks_trace_id_names_that_rank(tmp_path):
    """A run's ranks table lists each rank by its trace id; ``analyze``, ``show`` and ``diff`` said "no trace with
    this id" for it (only the Python API took it). Each now reads that rank alone (a real two-rank FSDP run)."""
    folder = FIXTURES / "torch" / "multirank" / "fsdp2_balanced"
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "ingest", str(folder), "--json")
    assert code == 0, err
    [run] = json.loads(out)["runs"]
    ranks = {int(r): t for r, t in run["ranks"].items()}
    assert sorted(ranks) == [0, 1]
    for rank, trace_id in ranks.items():
        raw = [e for e in json.load(gzip.open(next(folder.glob(f"rank{rank}.*"))))["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") == "kernel"]
        code, out, err = run_cli("--store", store, "analyze", trace_id[:8], "--rule", "kernel-share", "--json")
        assert code == 0, err
        [share] = json.loads(out)["findings"]
        assert share["metrics"]["calls"] == len(raw)  # this rank's kernels, not the run's
        code, out, err = run_cli("--store", store, "show", trace_id, "--json")
        assert code == 0 and json.loads(out)["id"] == trace_id, err
    code, out, err = run_cli("--store", store, "diff", ranks[0], ranks[1])
    assert code == 0 and f"A rank0.json.gz  {ranks[0]}" in out and f"B rank1.json.gz  {ranks[1]}" in out, err


def test_a_name_asked_for_a_run_stored_under_another_is_said(tmp_path):
    """``ingest --run dup FILES`` of a run stored already as ``fsdp2_balanced`` printed "already in the store" and
    exited 0, and ``analyze dup`` then said "no such file, and no trace with this id": the name was not given, and
    nothing said so. It is said now, naming the name the run keeps."""
    folder = FIXTURES / "torch" / "multirank" / "fsdp2_balanced"
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "ingest", str(folder), "--json")
    assert code == 0, err
    [run] = json.loads(out)["runs"]
    files = [str(p) for p in sorted(folder.glob("rank*.json.gz"))]
    code, out, err = run_cli("--store", store, "ingest", "--run", "dup", *files)
    assert code == 0 and "already in the store" in out
    assert (f"traceparse: warning: --run dup: these files are the run already stored as 'fsdp2_balanced' "
            f"({run['id']}); it keeps that name: refer to it as 'fsdp2_balanced' or by its id") in err
    code, out, err = run_cli("--store", store, "ingest", "--run", "fsdp2_balanced", *files)
    assert code == 0 and "--run" not in err  # the name it has: nothing to say
