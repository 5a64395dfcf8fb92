"""Hotspots says where its routines ran as a reader counts them (stop 44).

A kernel summary read "57 routines on 1 thread" of GPU kernels that ran on no thread; ``pprof -s`` (a total
table over 4 threads) read "10 routines on 1 thread, 11.9 s in all" against a 3 s run; four MPI ranks' TAU
profiles read "on 4 threads" with no word of their processes. Each expected figure is worked out here from the
file with plain Python.
"""

from __future__ import annotations

import csv
import json
import re

import polars as pl

from helpers import FIXTURES, raw_events, run_cli
from traceparse.analysis import analyze
from traceparse.figures import fmt_ns
from traceparse.schema import conform
from traceparse.trace import Trace, TraceMeta

KERN_SUM = FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_kern_sum.csv"
PPROF_S = FIXTURES / "tau" / "real" / "pprof" / "taustubs-matmult-pprof-s.txt"


def hotspots(tmp_path, path) -> list[dict]:
    code, out, err = run_cli("--store", str(tmp_path / "s"), "-q", "analyze", str(path), "--rule", "hotspots",
                             "--json")
    assert code == 0, err
    return json.loads(out)["findings"]


def test_a_kernel_summary_runs_on_no_thread(tmp_path):
    with open(KERN_SUM, newline="") as f:
        rows = list(csv.DictReader(f))
    total = sum(int(r["Total Time (ns)"]) for r in rows)
    names = {r["Name"] for r in rows}
    [main] = hotspots(tmp_path, KERN_SUM)  # no per-thread table: there is no thread
    assert main["message"].startswith(f"{len(names)} routines, {fmt_ns(total)} in all (totals: the source names no "
                                      "thread); ")
    assert main["metrics"]["threads"] == 0 and main["metrics"]["processes"] == 0
    assert "threads" not in main["figures"]
    assert not {"threads", "mean_ns", "min_ns", "max_ns", "imbalance"} & {c["key"] for c in main["columns"]}


def test_pprof_totals_say_over_how_many_threads(tmp_path):
    text = PPROF_S.read_text()
    total = re.search(r"FUNCTION SUMMARY \(total\):.*?\n([\s\S]*?)\n\n", text).group(1)
    mean = re.search(r"FUNCTION SUMMARY \(mean\):.*?\n([\s\S]*?)(?:\n\n|$)", text).group(1)

    def inclusive(table: str, name: str) -> float:
        [line] = [line for line in table.splitlines() if line.rstrip().endswith(" " + name)]
        return float(line.split()[2].replace(",", ""))

    threads = round(inclusive(total, ".TAU application") / inclusive(mean, ".TAU application"))
    assert threads == 4
    [main] = hotspots(tmp_path, PPROF_S)
    assert f"in all (summed over {threads} threads: the source gives their total only); " in main["message"]
    assert main["metrics"]["threads"] == 0


def test_threads_of_processes_and_gpu_lanes():
    """Hand-written: two processes' host threads (one with two threads) and kernels on two GPUs."""
    rows = pl.DataFrame({
        "kind": ["op", "op", "op", "kernel", "kernel"],
        "name": ["a", "b", "c", "k", "k"],
        "start_ns": [0, 0, 0, 10, 10], "duration_ns": [50, 40, 30, 5, 7],
        "pid": [1, 1, 2, None, None], "tid": [1, 2, 3, None, None], "device_id": [None, None, None, 0, 1],
    })
    trace = Trace(conform(rows, trace_id="t"), TraceMeta(id="t"))
    found = analyze(trace, rules=["hotspots"])
    main = next(f for f in found if f.title.startswith("Hotspots: routines"))
    assert main.message.startswith("4 routines on 3 threads of 2 processes and 2 GPUs, ")
    assert main.metrics["threads"] == 5 and main.metrics["processes"] == 2
    assert any(f.title == "Hotspots per thread" for f in found)


def test_a_gpu_stream_waiting_is_no_gpu_work(tmp_path):
    """A GPU's per-thread shares are of its kernels, copies and memsets, not of its streams' ``cuda_sync`` waits:
    HTA's AlexNet trace (A100) read "Memcpy HtoD 82.0%" of a GPU whose work is 83.8% copies."""
    from collections import defaultdict

    from helpers import raw_events, us_to_ns

    path = FIXTURES / "torch" / "hta" / "critical_path_alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
    events = raw_events(path)
    assert sum(e.get("cat") == "cuda_sync" for e in events) == 41
    work = defaultdict(int)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            work[e["name"]] += us_to_ns(e["dur"])
    total = sum(work.values())
    found = hotspots(tmp_path, path)
    gpu = {i["name"]: i for i in next(f for f in found if f["title"] == "Hotspots per thread")["items"]
           if i["thread"] == "GPU 0"}
    top = sorted(work, key=lambda n: (-work[n], n))[:5]
    assert list(gpu) == top
    for name in top:
        assert gpu[name]["share_pct"] == round(100 * work[name] / total, 4)
    assert "Stream Sync" not in {i["name"] for i in found[0]["items"]}
    routines = {(e["cat"], e["name"]) for e in events
                if e.get("cat") in ("cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset")}
    assert found[0]["message"].startswith(f"{len(routines)} routines on 1 thread and 1 GPU, ")


def test_a_trace_with_no_gpu_work_names_its_top_routines_in_the_summary(tmp_path):
    """A CPU-only profile's summary had nothing but dashes; it names the routines that hold the time now, as a
    GPU trace's names its top kernels, with the whole they are shares of, each share as the table shows it."""
    from traceparse.figures import fmt_pct, shares_shown

    cases = {FIXTURES / "tau" / "real" / "cpi-mpi": " summed over the threads",
             PPROF_S: " summed over 4 threads"}
    for path, over in cases.items():
        code, out, err = run_cli("--store", str(tmp_path / "s"), "-q", "analyze", str(path), "--json")
        assert code == 0, err
        doc = json.loads(out)
        main = next(f for f in doc["findings"] if f["title"] == "Hotspots: routines by exclusive time")
        shown = shares_shown([i["share_pct"] for i in main["items"]])  # as the table shows them (stop 53)
        line = (", ".join(f"{i['name']} {fmt_pct(v)}" for i, v in zip(main["items"][:3], shown))
                + f" of {fmt_ns(main['metrics']['time_ns'])}{over}")
        assert {"rule": "hotspots", "label": "top routines", "text": line} in doc["summary"][0]["highlights"]
    # a GPU trace names its kernels instead; a CPU trace whose routines hold 4 us of 1.3 s names none
    for path in (FIXTURES / "torch" / "resnet18_bs16.json.gz", FIXTURES / "torch" / "hta" / "cpu_only"):
        code, out, err = run_cli("--store", str(tmp_path / "s"), "-q", "analyze", str(path), "--json")
        assert code == 0, err
        assert not any(h["label"] == "top routines" for h in json.loads(out)["summary"][0]["highlights"])


def test_the_spread_shown_is_of_the_role_that_holds_the_routines_time():
    """Hand-written: routine r runs 100 ns on each of 4 worker threads and 1 ns on one of 2 io threads. The spread
    was that of the most uneven role (io: mean 0.5 ns, max 1, imbalance 2×) beside 401 ns of it; it is the
    workers' now, and the role is named."""
    names = {f"1/{t}": f"worker_{t}" for t in (11, 12, 13, 14)} | {"1/21": "io_0", "1/22": "io_1"}
    rows = pl.DataFrame({
        "kind": ["op"] * 7, "name": ["r", "r", "r", "r", "r", "s", "s"],
        "start_ns": [0] * 7, "duration_ns": [100, 100, 100, 100, 1, 5, 5],
        "pid": [1] * 7, "tid": [11, 12, 13, 14, 21, 21, 22],
    })
    trace = Trace(conform(rows, trace_id="t"), TraceMeta(id="t", extra={"thread_names": names}))
    main = next(f for f in analyze(trace, rules=["hotspots"]) if f.title.startswith("Hotspots: routines"))
    r = next(i for i in main.items if i["name"] == "r")
    assert (r["threads"], r["role"], r["peers"], r["mean_ns"], r["min_ns"], r["max_ns"], r["imbalance"]) == (
        5, "worker", 4, 100.0, 100, 100, 1.0)
    assert {c.key: c.label for c in main.columns}["mean_ns"] == "mean in role"


def test_a_summary_logs_rows_are_of_its_process_not_a_thread(tmp_path):
    """An nvprof summary gives totals per process, no thread: it read "20 routines on 1 thread". The rows of the
    log's "Profiling result" table are counted here (its 'GPU activities' and 'API calls' rows)."""
    path = FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log"
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("Profiling result:")) + 2
    rows = [line for line in lines[start:] if re.match(r"^\s+(GPU activities:|API calls:)?\s+[\d.]+%", line)]
    processes = {line.split("==")[1] for line in lines if line.startswith("==")}  # nvprof's "==PID==" prefix
    [main, *_] = hotspots(tmp_path, path)
    assert main["message"].startswith(f"{len(rows)} routines of {len(processes)} process (no thread given), ")
    # its rows are API calls and GPU activities both: one whole of host and device time that overlap, said so
    # (a cudaMemcpy "led with 47.0%" of such a whole, its time mostly the kernels' it waited for)
    assert any(r.strip().startswith("GPU activities:") for r in rows) and any("API calls:" in r for r in rows)
    assert (" in all (the host's calls and the GPU's work summed: they overlap in time); "
            in main["message"])


def test_a_tpus_lines_are_the_tpus_not_threads():
    """Hand-written: XLA's TPU op lines (no process, a device, a line id) are that TPU's lanes, not threads: a TPU
    trace read "349 routines on 120 threads", its busiest "thread" a TPU."""
    from traceparse.meta import Device

    rows = pl.DataFrame({
        "kind": ["op", "op", "op", "region", "region"], "name": ["fusion", "copy", "fusion", "host", "host"],
        "start_ns": [0, 10, 0, 0, 0], "duration_ns": [30, 5, 20, 7, 9],
        "pid": [None, None, None, 1, 1], "tid": [100, 101, 100, 11, 12], "device_id": [0, 0, 1, None, None],
    })
    meta = TraceMeta(id="t", devices=[Device(id=0, kind="TPU"), Device(id=1, kind="TPU")])
    main = next(f for f in analyze(Trace(conform(rows, trace_id="t"), meta), rules=["hotspots"])
                if f.title.startswith("Hotspots: routines"))
    # TPU 0: copy [10, 15) nests in fusion [0, 30), 30 ns; TPU 1: 20 ns; the threads 7 and 9 ns
    assert main.message.startswith("3 routines on 2 threads and 2 TPUs, 66 ns in all (summed over the threads and "
                                   "devices; the busiest thread 9 ns, the busiest TPU, TPU 0, 30 ns); ")
    assert main.summary is None  # the summary names a TPU's ops itself


def test_nvtx_step_ranges_are_one_annotation_row(tmp_path):
    """The docs say names that differ only by a trailing step number are one row; an nsys capture's NVTX ranges
    "step 2" ... "step 5" were four. Their count from the SQLite export's NVTX table."""
    import gzip
    import shutil
    import sqlite3

    db = tmp_path / "c.sqlite"
    with gzip.open(FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(db)
    names = [r[0] for r in con.execute("SELECT COALESCE(text, (SELECT value FROM StringIds WHERE id = textId)) "
                                        "FROM NVTX_EVENTS WHERE end IS NOT NULL")]
    steps = [n for n in names if n and re.fullmatch(r"step \d+", n)]
    assert len(steps) == 4
    found = hotspots(tmp_path, FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz")
    annotations = next(f for f in found if f["title"].startswith("Hotspots: annotations"))
    rows = [i for i in annotations["items"] if i["name"].startswith("step ")]
    assert [(r["name"], r["calls"]) for r in rows] == [("step N", len(steps))]


def test_a_runs_threads_keep_their_names_and_roles(tmp_path):
    """A run's combined trace had no thread names, so every thread but the main ones shared one role: the shared
    gloo run's AccumulateGrad read "imbalance 11.59×" over 12 "peers" (gloo and python threads that never run it)
    where its 4 autograd threads' is 3.86×. The names come from each rank's thread_name metadata, here read raw."""
    import gzip

    folder = FIXTURES / "torch" / "multirank" / "ddp4_slow_loader"
    raw = {}
    for path in sorted(folder.glob("rank*.json.gz")):
        with gzip.open(path, "rt") as f:
            for e in json.load(f)["traceEvents"]:
                if e.get("ph") == "M" and e.get("name") == "thread_name":
                    raw[(e["pid"], e["tid"])] = re.sub(r"^thread \d+ \((.*)\)$", r"\1", e["args"]["name"])
    autograd = {key for key, name in raw.items() if name.startswith("pt_autograd")}
    assert len(autograd) == 4
    found = hotspots(tmp_path, folder)
    main = next(f for f in found if f["title"] == "Hotspots: routines by exclusive time")
    assert {"pt_autograd", "pt_gloo_runloop"} <= set(main["metrics"]["thread_roles"])
    mm = next(i for i in main["items"] if i["name"] == "aten::mm")
    assert (mm["role"], mm["peers"]) == ("pt_autograd", len(autograd))
    per_thread = next(f for f in found if f["title"] == "Hotspots per thread")
    assert {i["thread_name"] for i in per_thread["items"]} - {None} <= set(raw.values())


def test_the_threads_figure_says_it_counts_the_device_lanes_too(tmp_path):
    """The message of a torch trace says "on 2 threads and 1 GPU" and the panel's figure, which counts the GPU's
    lane as a thread, read "threads 3" beside it: its label now says what it counts."""
    path = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    import gzip

    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    host = {(e["pid"], e["tid"]) for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")}
    gpus = {e["args"]["device"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    main = hotspots(tmp_path, path)[0]
    assert f" on {len(host)} threads and {len(gpus)} GPU, " in main["message"]
    assert main["metrics"]["threads"] == len(host) + len(gpus) == 3
    assert main["labels"]["threads"] == "threads and device lanes"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "-q", "--width", "120", "analyze", str(path), "--rule",
                             "hotspots")
    assert code == 0, err
    panel = out.split("Hotspots: routines by exclusive time")[1].split("╰")[0]
    assert re.search(r"│ threads and device lanes +3 ", panel) and not re.search(r"│ threads +3 ", panel)


def test_an_nvprof_summarys_api_calls_are_no_gpus(tmp_path):
    """An nvprof summary gives its API calls and its kernels on no thread, one key: the API rows read "role gpu"
    (cuLaunchKernel, cuEventSynchronize). A role is "gpu" only for a thread of GPU activity alone."""
    log = FIXTURES / "nvprof" / "real" / "cudajl_summary.log"
    api = set()
    section = None
    for line in log.read_text().splitlines():
        if "GPU activities:" in line or "API calls:" in line:
            section = "api" if "API calls:" in line else "gpu"
        if section == "api" and "%" in line:
            api.add(line.split()[-1])
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(log), "--rule", "hotspots", "--json")
    assert code == 0, err
    items = json.loads(out)["findings"][0]["items"]
    listed = [i for i in items if i["name"] in api]
    assert listed and all(i["role"] != "gpu" for i in listed)


def test_the_busiest_gpu_s_time_is_said_to_be_summed_over_its_streams(tmp_path):
    """Four FSDP2 ranks: rank 3's GPU ran 564.3 ms of activities on 4 streams at once in a 406 ms trace; "the
    busiest GPU, rank 3 GPU 3, 564.3 ms" read as a GPU busier than the trace is long. The sum is said to be one
    (the raw JSON: the durations of its kernels, copies and memsets, and their streams)."""
    folder = FIXTURES / "torch" / "multirank" / "fsdp4_slow_hook"
    per_rank = {}
    for rank in range(4):
        gpu_rows = [e for e in raw_events(folder / f"rank{rank}.json.gz")
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        per_rank[rank] = (sum(round(e["dur"] * 1000) for e in gpu_rows), len({e["tid"] for e in gpu_rows}))
    rank = max(per_rank, key=lambda r: per_rank[r][0])
    total, streams = per_rank[rank]
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", "--rule", "hotspots",
                             str(folder))
    assert code == 0, err
    f = next(f for f in json.loads(out)["findings"] if f["title"].startswith("Hotspots: routines"))
    assert (f"the busiest GPU, rank {rank} GPU {rank}, {fmt_ns(total)} summed over its {streams} streams)"
            in f["message"])

