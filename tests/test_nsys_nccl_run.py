"""Nsight Systems captures of a 2-GPU DDP-over-NCCL job (sweep 21), the two ways users profile torchrun jobs.

Real files, made by fixtures/make_nsys_nccl_run.sh on two H200s (fixtures/nsys/nccl_run/SOURCE.md): ``job/``
one report of the whole job (two processes, two GPUs), ``ranks/`` one report per rank. Rank 1 sleeps 30 ms in a
gradient hook each step: a known straggler. The oracles read the SQLite exports with sqlite3 and the
workload's own step timings (``steps_rank{R}.json``); they share no code with traceparse.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3

import pytest

from helpers import FIXTURES, run_cli
from traceparse.figures import fmt_pct

HERE = FIXTURES / "nsys" / "nccl_run"
RANKS = HERE / "ranks"
JOB = HERE / "job" / "job.sqlite.gz"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """{name: sqlite3 connection} of the three exports, decompressed."""
    out = {}
    folder = tmp_path_factory.mktemp("nccl_sqlite")
    for name, path in (("rank0", RANKS / "rank0.sqlite.gz"), ("rank1", RANKS / "rank1.sqlite.gz"), ("job", JOB)):
        plain = folder / f"{name}.sqlite"
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        out[name] = sqlite3.connect(plain)
    yield out
    for c in out.values():
        c.close()


def origin(c) -> int:
    return c.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]


def nccl_kernels(c, pid: int | None = None) -> list[tuple[int, int]]:
    where = "" if pid is None else f" AND ((k.globalPid >> 24) & 16777215) = {pid}"
    return c.execute("SELECT k.start, k.\"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                     f"s.id = k.demangledName WHERE s.value LIKE 'ncclDevKernel%'{where} ORDER BY k.start").fetchall()


def step_ranges(c, pid: int | None = None) -> list[tuple[str, int, int]]:
    where = "" if pid is None else f" AND ((globalTid >> 24) & 16777215) = {pid}"
    return c.execute("SELECT text, start, \"end\" FROM NVTX_EVENTS WHERE text LIKE 'step %'"
                     f"{where} ORDER BY start").fetchall()


def ingest_ranks(store) -> None:
    code, out, err = run_cli("ingest", str(RANKS / "rank0.sqlite.gz"), str(RANKS / "rank1.sqlite.gz"),
                             "--run", "nsys_ranks")
    assert code == 0, err


def stragglers(target: str) -> dict:
    code, out, err = run_cli("analyze", target, "--rule", "stragglers", "--json")
    assert code == 0, err
    [finding] = [f for f in json.loads(out)["findings"] if f["rule"] == "stragglers"]
    return finding


# -- one report per rank: a run ---------------------------------------------
def test_per_rank_reports_are_put_on_one_clock(store, db):
    """Each per-rank report counts time from its own session's start: stored as a run, rank 1's events are moved
    by the difference of the sessions' UTC starts (sqlite: utcEpochNs), so the ranks leave each collective
    together. Before, rank 1 stayed 6.2 ms off and the straggler finding blamed descheduled threads."""
    shift = origin(db["rank1"]) - origin(db["rank0"])
    k0, k1 = nccl_kernels(db["rank0"]), nccl_kernels(db["rank1"])
    assert len(k0) == len(k1) == 33 and shift == -6_194_961
    ends_apart = sorted(abs(a[1] - b[1]) for a, b in zip(k0, k1))
    ends_aligned = sorted(abs(a[1] - (b[1] + shift)) for a, b in zip(k0, k1))
    assert ends_apart[16] > 6_000_000 and ends_aligned[16] < 50_000  # the medians: the shift is the whole gap

    ingest_ranks(store)
    code, out, err = run_cli("sql", "--engine", "polars", "--json", "--run", "nsys_ranks",
                             "SELECT rank, name, start_ns FROM events WHERE name LIKE 'step %' ORDER BY rank, start_ns")
    assert code == 0, err
    got = [(r["rank"], r["name"], r["start_ns"]) for r in json.loads(out)["rows"]]
    want = ([(0, name, start) for name, start, _ in step_ranges(db["rank0"])]
            + [(1, name, start + shift) for name, start, _ in step_ranges(db["rank1"])])
    assert got == want
    code, out, err = run_cli("show", "nsys_ranks", "--json")
    assert code == 0, err
    assert "each rank's trace counts time from its own capture's start: rank 1 moved onto the clock of rank 0 " \
           "by the UTC times of their starts (rank 1 by -6.195 ms)" in out


def test_straggler_of_per_rank_reports(store, db):
    """rank 1 is the straggler; its last arrivals and every rank's step time are those of the exports."""
    shift = origin(db["rank1"]) - origin(db["rank0"])
    k0, k1 = nccl_kernels(db["rank0"]), nccl_kernels(db["rank1"])
    last1 = sum(1 for a, b in zip(k0, k1) if b[0] + shift > a[0])
    assert last1 == 31
    ingest_ranks(store)
    finding = stragglers("nsys_ranks")
    m = finding["metrics"]
    assert m["straggler_rank"] == 1 and m["collectives"] == 33 and m["members"] == "rank"
    assert m["ranks"]["1"]["last_count"] == last1 and m["ranks"]["0"]["last_count"] == 33 - last1
    for rank in (0, 1):
        assert m["ranks"][str(rank)]["step_ns"] == sum(e - s for _, s, e in step_ranges(db[f"rank{rank}"]))
    # each wait is one rank 0 spent in an NCCL kernel waiting for rank 1: at most rank 0's NCCL kernel time
    assert m["ranks"]["0"]["waited_ns"] <= sum(e - s for s, e in k0)
    # the sleep is 30 ms a step (steps_rank1.json): rank 0 loses about that a step, never more than its step
    sleep_ms = json.loads((RANKS / "steps_rank1.json").read_text())["sleep_ms"]
    assert 0.9 * sleep_ms * 1e6 < m["wait_caused_per_step_ns"] < 1.1 * sleep_ms * 1e6
    assert "end up to" not in finding["message"] and "descheduled" not in finding["message"]


def test_step_ranges_are_not_what_the_straggler_did(store, db):
    """The NVTX ranges ``step 1`` .. ``step 5`` are the run's steps (range step N): their time is the step's, so
    they are no host work that rank 1 does longer. Before, 'step 1 (host, 6.884 ms a step against 642.8 us)' and
    'step 2' were offered as what rank 1 did longer than rank 0."""
    steps = {name for name, _, _ in step_ranges(db["rank1"])}
    assert steps == {f"step {i}" for i in range(1, 6)}
    ingest_ranks(store)
    finding = stragglers("nsys_ranks")
    named = {r["name"] for key in ("slow_rank_host", "slow_rank_gpu") for r in finding["metrics"][key]}
    assert not named & steps
    assert not any(f"{s} (host" in finding["message"] for s in steps)


# -- one report of the whole job: one trace of two processes -------------------------------------------------
def gpu_processes_of(c) -> dict[str, list[int]]:
    out: dict[int, set] = {}
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        for pid, device in c.execute(f"SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM {table}"):
            out.setdefault(pid, set()).add(device)
    return {str(p): sorted(d) for p, d in sorted(out.items())}


def test_one_report_of_the_job_says_it_holds_two_processes(store, db, tmp_path):
    """One report of the torchrun job: two processes ran GPU work (pid 830 on GPU 0, pid 831 on GPU 1, the pids
    the workload wrote). It is one trace, not a run: ingest warns, and the summary (terminal, JSON, page) says
    so before its figures, which before were shown as if of one process."""
    procs = gpu_processes_of(db["job"])
    pids = {json.loads((HERE / "job" / f"steps_rank{r}.json").read_text())["pid"]: r for r in (0, 1)}
    assert procs == {"830": [0], "831": [1]} and pids == {830: 0, 831: 1}
    code, out, err = run_cli("ingest", str(JOB))
    assert code == 0, err
    assert ("2 processes ran GPU work in this one report (pid 830 (python3): GPU 0; pid 831 (python3): GPU 1): "
            "it is read as one trace, not a run of ranks") in " ".join(err.split())
    code, out, err = run_cli("analyze", "--json")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    assert summary["gpu_processes"] == procs
    code, out, err = run_cli("--width", "200", "analyze")
    assert code == 0, err
    assert "processes    2 ran GPU work in this one trace (pid 830: GPU 0; pid 831: GPU 1): not a run of ranks" \
        in out and "consecutive steps can overlap" in " ".join(out.replace("│", " ").split())
    page = tmp_path / "job.html"
    code, out, err = run_cli("report", "--html", str(page))
    assert code == 0, err
    assert '<div class="label">processes</div><div class="big">2</div>' in page.read_text()


def test_steps_of_the_one_report_are_both_processes_taken_together(store, db):
    """What the summary says a step is, exactly: step N from the first process's start of its range to the last
    one's end (sqlite); the processes are not in step to the microsecond, so step 3 (ended by pid 831) overlaps
    step 4 (begun by pid 830) by 38.1 us: what the summary's processes line warns of."""
    ranges = step_ranges(db["job"])
    windows = {}
    for name, start, end in ranges:
        s, e = windows.get(name, (start, end))
        windows[name] = (min(s, start), max(e, end))
    assert len(ranges) == 10 and len(windows) == 5
    ordered = sorted(windows.values())
    overlaps = [a[1] - b[0] for a, b in zip(ordered, ordered[1:]) if a[1] > b[0]]
    assert overlaps == [18204433530 - 18204395403] and windows["step 4"][0] == 18204395403
    code, out, err = run_cli("ingest", str(JOB))
    code, out, err = run_cli("analyze", "--json", "--rule", "stragglers")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    durations = [e - s for s, e in ordered]
    assert summary["steps"] == 5 and summary["step_time_ns"] == round(sum(durations) / 5)
    assert summary["step_min_ns"] == min(durations) and summary["step_max_ns"] == max(durations)
    assert summary["steps_span_ns"] == ordered[-1][1] - ordered[0][0]


def test_a_whole_process_capture_says_its_steps_are_a_sliver_of_it(store, db):
    """The report of the whole job (no capture range: CUDA and NCCL start-up included) spans 14.55 s, its five
    steps 174 ms: the steps line says what share of the span the steps cover, and that ``--step all`` analyses
    them alone (the straggler, 86% of the steps' time, was lowered under the 1% floor of the whole span)."""
    ranges = step_ranges(db["job"])
    covered = max(e for _, _, e in ranges) - min(s for _, s, _ in ranges)
    run_cli("ingest", str(JOB))
    code, out, err = run_cli("analyze", "--rule", "stragglers", "--width", "400")
    assert code == 0, err
    code, doc, err = run_cli("analyze", "--rule", "stragglers", "--json")
    [summary] = json.loads(doc)["summary"]
    assert summary["steps_span_ns"] == covered and covered < summary["span_ns"] / 2
    share = fmt_pct(100.0 * covered / summary["span_ns"])
    assert share == "1.2%"
    assert (f"; they cover {share} of the span (the rest is before or after them: start-up, warm-up, teardown): "
            "--step all analyses the steps alone") in out
    code, out, err = run_cli("analyze", "--rule", "stragglers", "--width", "400", "--step", "all")
    assert code == 0, err
    assert "steps        5" in out and "they cover" not in out


def test_straggler_of_the_one_report_is_rank_1s_gpu(store, db):
    """In the one report the members are the GPUs: GPU 1 (rank 1's, pid 831) is last at the collectives, and GPU 0's
    NCCL kernels are the ones that spin (sqlite: 276.0 ms of kernel time in pid 830's NCCL kernels, 8.3 in 831's)."""
    k0, k1 = nccl_kernels(db["job"], 830), nccl_kernels(db["job"], 831)
    assert len(k0) == len(k1) == 33
    last1 = sum(1 for a, b in zip(k0, k1) if b[0] > a[0])
    code, out, err = run_cli("ingest", str(JOB))
    finding = stragglers(json.loads(run_cli("list", "--json")[1])["traces"][0]["id"])
    m = finding["metrics"]
    assert m["members"] == "device" and m["collectives"] == 33
    assert m["ranks"]["1"]["last_count"] == last1 and m["ranks"]["0"]["last_count"] == 33 - last1
    assert m["ranks"]["0"]["waited_ns"] <= sum(e - s for s, e in k0)


def test_run_of_per_rank_reports_names_no_processes_line(store):
    ingest_ranks(store)
    code, out, err = run_cli("analyze", "nsys_ranks", "--json", "--rule", "stragglers")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    assert summary["gpu_processes"] == {}


def test_one_report_links_each_kernel_to_its_own_process_launch(store, db):
    """CUPTI's correlation ids count per process: in the job's report 13 kernel ids (and 4,852 runtime-call ids)
    occur in both ranks' processes, so joined by the id alone a kernel met 802 calls for 690 kernels. Joined
    within its process (sqlite), every kernel has exactly one launch. Before, launch-stats said '655 launched one
    by one by 642 calls', with a 69.83 ms 'launch delay' from a call of the other rank."""
    c = db["job"]
    by_id_alone = c.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                            "ON r.correlationId = k.correlationId").fetchone()[0]
    kernels, launches, delay_min, delay_max = c.execute(
        "WITH k AS (SELECT (globalPid >> 24) & 16777215 AS p, correlationId AS c, start AS ks "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL), r AS (SELECT (globalTid >> 24) & 16777215 AS p, correlationId AS c, "
        "start AS rs FROM CUPTI_ACTIVITY_KIND_RUNTIME) SELECT COUNT(*), COUNT(DISTINCT r.p * 4294967296 + r.c), "
        "MIN(ks - rs), MAX(ks - rs) FROM k JOIN r ON k.p = r.p AND k.c = r.c").fetchone()
    launch_time = c.execute(
        "WITH k AS (SELECT DISTINCT (globalPid >> 24) & 16777215 AS p, correlationId AS c "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL) SELECT SUM(r.\"end\" - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN k ON k.p = (r.globalTid >> 24) & 16777215 AND k.c = r.correlationId").fetchone()[0]
    assert by_id_alone == 802 and kernels == launches == 690
    code, out, err = run_cli("ingest", str(JOB))
    code, out, err = run_cli("analyze", "--json", "--rule", "launch-stats")
    assert code == 0, err
    [finding] = [f for f in json.loads(out)["findings"] if f["rule"] == "launch-stats"]
    m = finding["metrics"]
    assert (m["kernels"], m["linked_kernels"], m["direct_kernels"], m["launches"]) == (690, 690, 690, launches)
    assert m["launch_time_ns"] == launch_time
    assert (m["delay_ns_min"], m["delay_ns_max"]) == (delay_min, delay_max)


def test_one_process_report_keeps_nsys_correlation_ids(store, db):
    """A per-rank report holds one process: its correlation ids are the export's own."""
    from traceparse.reader import ReadOptions
    from traceparse_plugins.readers.nsys.sqlite_export import read_sqlite

    trace = read_sqlite(RANKS / "rank1.sqlite.gz", ReadOptions())
    kernels = trace.events.filter(trace.events["kind"] == "kernel")
    want = sorted(r[0] for r in db["rank1"].execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    assert sorted(kernels["correlation_id"].to_list()) == want
    assert "correlation_ids" not in trace.meta.extra


def test_run_steps_are_the_ranks_nvtx_steps(store, db):
    """The run's steps are each rank's NVTX ``step N`` ranges (sqlite), 10 windows; the workload's own timings
    (perf_counter around each step, ``steps_rank{R}.json``) agree with them to within 1%."""
    durations = [e - s for r in (0, 1) for _, s, e in step_ranges(db[f"rank{r}"])]
    measured = [ms * 1e6 for r in (0, 1)
                for ms in json.loads((RANKS / f"steps_rank{r}.json").read_text())["step_wall_ms"]]
    ingest_ranks(store)
    code, out, err = run_cli("analyze", "nsys_ranks", "--json", "--rule", "stragglers")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    assert (summary["steps"], summary["step_windows"]) == (5, 10)
    assert summary["step_time_ns"] == round(sum(durations) / 10)
    assert (summary["step_min_ns"], summary["step_max_ns"]) == (min(durations), max(durations))
    assert abs(summary["step_time_ns"] - sum(measured) / 10) < 0.01 * summary["step_time_ns"]


def test_a_folder_of_reports_and_their_exports_is_one_rank_each(store, db, tmp_path):
    """``nsys export`` writes rank0.sqlite beside rank0.nsys-rep: a folder of both is still a run of two ranks,
    each read once from its export (nsys is not needed). Before, each report was a rank of its own: refused
    without nsys ('reading an Nsight Systems report needs nsys'), with nsys two rank-0 files."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in (0, 1):
        for ext in (".nsys-rep", ".sqlite.gz"):
            shutil.copy(RANKS / f"rank{r}{ext}", folder / f"rank{r}{ext}")
    code, out, err = run_cli("ingest", str(folder), "--json")
    assert code == 0, err
    doc = json.loads(out)
    flat = " ".join(err.split())
    for r in (0, 1):
        assert f"{folder / f'rank{r}.nsys-rep'}: read from its SQLite export beside it, rank{r}.sqlite.gz" in flat
    code, out, err = run_cli("sql", "--engine", "polars", "--json", "--run", "ranks",
                             "SELECT rank, COUNT(*) AS n FROM events WHERE kind = 'kernel' GROUP BY rank ORDER BY rank")
    assert code == 0, err
    want = [db[f"rank{r}"].execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] for r in (0, 1)]
    assert [(row["rank"], row["n"]) for row in json.loads(out)["rows"]] == [(0, want[0]), (1, want[1])]
    assert doc


def test_clock_origin_only_for_times_as_recorded(db, tmp_path):
    """The session's UTC start is the clock origin of an export whose times are as recorded (sqlite:
    EXPORT_PARAM_TIME_NORMALIZE false, no time shift); an export made with --ts-normalize or a time shift has
    none (its times are not counted from the session's start)."""
    from traceparse.reader import ReadOptions
    from traceparse_plugins.readers.nsys.sqlite_export import read_sqlite

    c = db["rank0"]
    said = dict(c.execute("SELECT name, value FROM META_DATA_EXPORT WHERE name IN ('EXPORT_PARAM_TIME_NORMALIZE', "
                          "'EXPORT_PARAM_TIME_SHIFT')").fetchall())
    assert said == {"EXPORT_PARAM_TIME_NORMALIZE": "false", "EXPORT_PARAM_TIME_SHIFT": "0"}
    assert read_sqlite(RANKS / "rank0.sqlite.gz", ReadOptions()).meta.extra["clock_origin_utc_ns"] == origin(c)
    for name, value in (("EXPORT_PARAM_TIME_NORMALIZE", "true"), ("EXPORT_PARAM_TIME_SHIFT", "1000")):
        copy = tmp_path / f"{name}.sqlite"
        with gzip.open(RANKS / "rank0.sqlite.gz", "rb") as src, open(copy, "wb") as dst:
            shutil.copyfileobj(src, dst)
        with sqlite3.connect(copy) as w:
            w.execute("UPDATE META_DATA_EXPORT SET value = ? WHERE name = ?", (value, name))
        w.close()
        assert "clock_origin_utc_ns" not in read_sqlite(copy, ReadOptions()).meta.extra
