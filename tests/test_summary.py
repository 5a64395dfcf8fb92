"""The summary ``analyze`` opens with (issue 11, item 1): its figures checked against the raw JSON of real traces."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from traceparse.figures import fmt_ns
from helpers import FIXTURES, REPO, run_cli, us_to_ns

SAMPLES = REPO.parent / "shared" / "samples" / "torch"
TORCH_SAMPLES = sorted(SAMPLES.glob("*.json.gz")) if SAMPLES.is_dir() else []
STEP = re.compile(r"^ProfilerStep#\d+$")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _raw(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


def raw_steps(events: list[dict]) -> list[int]:
    """Durations (ns) of the host-side ProfilerStep#N annotations: ph X, category user_annotation."""
    return [us_to_ns(e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and STEP.match(e.get("name", ""))]


def raw_busy(events: list[dict]) -> tuple[int, int] | None:
    """(Σ busy, Σ span) over devices from merging each device's kernel/memcpy/memset intervals; None when
    some GPU event names no device (peer copies), which this oracle does not place."""
    per_device: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            device = (e.get("args") or {}).get("device")
            if device is None:
                return None
            start = us_to_ns(e["ts"])
            per_device.setdefault(int(device), []).append((start, start + us_to_ns(e["dur"])))
    busy = span = 0
    for spans in per_device.values():
        spans.sort()
        end = None
        for s, e in spans:
            if end is None or s > end:
                busy += e - s
                end = e
            elif e > end:
                busy += e - end
                end = e
        span += max(e for _, e in spans) - spans[0][0]
    return busy, span


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """{sample name: analyze --json document} over every shared torch sample (one store)."""
    if not TORCH_SAMPLES:
        pytest.skip(f"shared samples not available at {SAMPLES}")
    store = tmp_path_factory.mktemp("store")
    out = {}
    for path in TORCH_SAMPLES:
        code, text, err = run_cli("--store", str(store), "analyze", str(path), "--json")
        assert code == 0, err
        out[path.name] = json.loads(text)
    return out


@pytest.mark.parametrize("path", TORCH_SAMPLES, ids=lambda p: p.name)
def test_steps_are_the_host_profiler_step_annotations(analysed, path):
    [summary] = analysed[path.name]["summary"]
    durations = raw_steps(_raw(path))
    assert durations, "every shared torch sample has ProfilerStep#N annotations"
    assert summary["steps"] == len(durations) == summary["step_windows"]
    assert summary["step_source"] == "ProfilerStep#N"
    assert summary["step_time_ns"] == round(statistics.fmean(durations))
    assert (summary["step_min_ns"], summary["step_max_ns"]) == (min(durations), max(durations))
    assert summary["step_stdev_ns"] == round(statistics.stdev(durations))


@pytest.mark.parametrize("path", TORCH_SAMPLES, ids=lambda p: p.name)
def test_gpu_busy_and_the_idle_bottleneck_from_merged_intervals(analysed, path):
    doc = analysed[path.name]
    [summary] = doc["summary"]
    figures = raw_busy(_raw(path))
    if figures is None:
        pytest.skip("peer copies without args.device: not placed by this oracle")
    busy, span = figures
    assert summary["gpu_busy_pct"] == pytest.approx(100.0 * busy / span, abs=1e-4)
    [idle] = [f for f in doc["findings"] if f["rule"] == "gpu-idle"]
    assert idle["impact_ns"] == span - busy == idle["metrics"]["idle_ns"]
    # the bottleneck: the finding with the most time at stake, whatever its severity
    timed = [f for f in doc["findings"] if f["impact_ns"]]
    best = max(timed, key=lambda f: f["impact_ns"]) if timed else None
    whole = best and (best["impact_whole"] or {"of": "the span", "ns": summary["span_ns"]})
    assert summary["bottleneck"] == (None if best is None else {
        "rule": best["rule"], "impact_ns": best["impact_ns"], "title": best["title"], "severity": best["severity"],
        "whole": whole["of"], "whole_ns": whole["ns"], "share_pct": round(100 * best["impact_ns"] / whole["ns"], 4),
        "range": best["impact_range"], "said": best["impact_said"]})
    assert idle["impact_whole"] == {"of": "the GPU's span", "ns": span}
    assert idle["impact_range"] is None  # one GPU: its idle time is no mean


def test_span_is_the_stored_span_and_categories_are_kernel_shares(analysed, tmp_path):
    for path in TORCH_SAMPLES[:2]:
        [summary] = analysed[path.name]["summary"]
        code, out, _ = run_cli("--store", str(tmp_path), "show", str(path), "--json")
        assert summary["span_ns"] == json.loads(out)["summary"]["span_ns"]
        [share] = [f for f in analysed[path.name]["findings"] if f["rule"] == "kernel-share"]
        cats = share["metrics"]["categories"]
        top = sorted(cats, key=lambda c: (-cats[c]["time_ns"], c))[:3]
        assert [c["category"] for c in summary["top_categories"]] == top
        assert [c["time_ns"] for c in summary["top_categories"]] == [cats[c]["time_ns"] for c in top]


def test_an_nvtx_step_range_stands_in_for_profiler_steps(tmp_path):
    """The nsys capture has no ProfilerStep#N but one NVTX range train_step (also Optimizer-like ranges)."""
    path = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--json")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    import polars as pl

    import traceparse

    markers = traceparse.load(str(path)).events.filter(pl.col("name") == "train_step")
    assert summary["step_source"] == "range train_step"
    assert summary["steps"] == markers.height == 1
    assert summary["step_time_ns"] == markers["duration_ns"][0]


def test_a_trace_without_steps_or_timed_gpu_work(tmp_path):
    path = FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_kern_sum.csv"  # a kernel summary: no start times
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--json")
    assert code == 0, err
    [summary] = json.loads(out)["summary"]
    assert (summary["steps"], summary["step_time_ns"], summary["gpu_busy_pct"], summary["span_ns"]) == (0, None, None, None)
    assert summary["bottleneck"] is None
    code, out, _ = run_cli("--store", str(tmp_path), "analyze", str(path))
    # no span (a summary has no timeline): "1% of the span" would name a whole the trace does not have
    assert "steps        none marked" in out and "bottleneck   none: no finding here has time at stake" in out
    # its kernel total is the one figure it has: on screen as in the JSON (it was left out where kernels are all)
    import csv as _csv

    total = sum(int(r["Total Time (ns)"]) for r in _csv.DictReader(path.open()))
    assert summary["gpu_time"]["total_ns"] == total
    assert f"GPU time     {fmt_ns(total)} summed over activities: kernels 100.0%" in out


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")


def test_launch_stats_impact_is_launch_time_beyond_the_kernel_from_the_raw_json(tmp_path):
    """Σ over kernels launched one by one of max(0, launch call − kernel), pairing them by correlation id."""
    path = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    events = _raw(path)
    calls = {e["args"]["correlation"]: us_to_ns(e["dur"]) for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in LAUNCHES}
    kernels = [(e["args"]["correlation"], us_to_ns(e["dur"])) for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == 744 and all(c in calls for c, _ in kernels)
    expected = sum(max(0, calls[c] - d) for c, d in kernels)
    code, out, _ = run_cli("--store", str(tmp_path), "analyze", str(path), "--json", "--rule", "launch-stats")
    [finding] = json.loads(out)["findings"]
    assert finding["impact_ns"] == expected > 0


@pytest.mark.parametrize("case, must", [("torch/multirank/gloo4_slow_rank2", "stragglers"),
                                        ("ncu/ncu_details_vgg11_bs16.csv", "ncu-speedups"),
                                        ("nvprof/handwritten/gpu_api_trace.log", "api-share"),
                                        ("torch/resnet18_bs16.json.gz", "low-memcpy-throughput")])
def test_each_rules_impact_is_its_stated_time_at_stake(case, must, tmp_path):
    """impact_ns against the figures each rule reports (docs/rules.md, "Time at stake")."""
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(FIXTURES / case), "--json")
    assert code == 0, err
    doc = json.loads(out)
    found = {f["rule"]: f for f in doc["findings"] if f["title"] != "Hotspots per thread"}
    ranks = doc["summary"][0]["ranks"]  # on a run, time at stake is per rank: a rule's total over the ranks
    checked = set()
    for rule, f in found.items():
        m, impact = f["metrics"], f["impact_ns"]
        if impact is not None and ranks > 1 and rule not in ("stragglers", "rank-balance", "gpu-idle"):
            impact *= ranks
        if rule == "stragglers" and "wait_caused_ns" in m:
            assert impact == round(m["wait_caused_ns"] / ranks) > 0
        elif rule == "gpu-idle" and m.get("devices"):
            assert impact == round(m["idle_ns"] / len(m["devices"]))  # the idle time of the mean device
        elif rule == "rank-balance" and m.get("imbalance") is not None:
            work = [r["work_ns"] for r in m["ranks"].values()]
            assert impact == int(max(work) - sum(work) / len(work))
        elif rule == "ncu-speedups":
            assert impact == m["global_saved_ns"]
        elif rule == "api-share":
            warned = [c for c in m["classes"] if f["severity"] != "info" and c in f["title"].split()]
            assert impact == (sum(m["classes"][c]["time_ns"] for c in warned) if warned else None)
        elif rule == "low-memcpy-throughput" and m["copy_time_ns"]:
            assert impact == pytest.approx(max(0, m["copy_time_ns"] - round(m["bytes"] / m["peak_gbps"])), abs=ranks)
        elif rule in ("kernel-share", "hotspots", "memory", "arithmetic-intensity", "tuning-candidates"):
            assert impact is None
        else:
            continue
        checked.add(rule)
    assert must in checked and len(checked) >= 2


def test_events_not_read_are_said_where_no_gpu_work_is(tmp_path):
    """Hand-written after HTA's MTIA inference trace: an accelerator's events of categories traceparse does not
    read (``mtia_ccp_events``) were skipped with a warning at ingest, and every analysis then said "GPU busy -",
    as of a trace with no device work. The summary now says what was not read. A category written as markup is
    shown literally."""
    import json as _json

    from helpers import run_cli

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 50},
              {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 2, "tid": 3, "ts": 10, "dur": 20},
              {"ph": "X", "cat": "mtia_ccp_events", "name": "event_record", "pid": 2, "tid": 3, "ts": 40, "dur": 5},
              {"ph": "X", "cat": "[bold]x[/]", "name": "odd", "pid": 2, "tid": 4, "ts": 40, "dur": 5}]
    path = tmp_path / "mtia.json"
    path.write_text(_json.dumps({"schemaVersion": 1, "traceEvents": events}))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json", str(path))
    assert code == 0, err
    (summary,) = _json.loads(out)["summary"]
    assert summary["gpu_busy_pct"] is None and summary["unread_events"] == {"mtia_ccp_events": 2, "[bold]x[/]": 1}
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", "200", "analyze", str(path))
    assert code == 0, err
    assert re.search(r"GPU busy +" + re.escape("- (no GPU work read; 3 events of 2 categories (mtia_ccp_events, "
                                               "[bold]x[/]) not read: their time is in no figure)"), out), out


def test_a_warning_with_under_1_pct_of_the_span_is_no_bottleneck():
    """A JAX trace of an AMD GPU (93.6% busy) headlined "API time in launch, 3.087 ms lost, 0.0% of the span": a
    warning's time at stake is no bottleneck under 1% of the span either (it stays among the findings)."""
    from traceparse.rule import Finding
    from traceparse.summary import bottleneck

    span = 9_732_000_000
    small = Finding("api-share", "warning", "API time in launch (83.5%)", "m", impact_ns=3_087_000)
    large = Finding("gpu-idle", "info", "GPU idle", "m", impact_ns=span // 50)  # 2% of the span
    assert bottleneck([small], span) is None
    assert bottleneck([small, large], span)["rule"] == "gpu-idle"
    assert bottleneck([small], None)["rule"] == "api-share"  # no span to weigh it by: it is all there is


def test_launches_on_a_busy_gpu_put_no_more_at_stake_than_its_idle_time(tmp_path):
    """HTA's ns-resolution trace (an A100 98.4% busy, the host 76 ms ahead) headlined "Kernel launches, 145.8 ms
    lost": its launch calls wait for room in a full launch queue. What launches cost is now at most the GPU's
    idle time. On the real eager VGG16 trace without syncs (fixtures/torch/async, the GPU behind the host), both
    figures computed here from the raw JSON: the launch calls' excess over their kernels, and the idle time."""
    from decimal import Decimal

    from helpers import raw_events, run_cli, union, us_to_ns

    path = FIXTURES / "torch" / "async" / "vgg16_bs32_nosync.json.gz"
    events = raw_events(path)
    launches = {e["args"]["correlation"]: us_to_ns(Decimal(str(e["dur"]))) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e["name"] in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")}
    excess = sum(max(0, launches[e["args"]["correlation"]] - us_to_ns(Decimal(str(e["dur"])))) for e in events
                 if e.get("cat") == "kernel" and e["args"].get("correlation") in launches)
    gpu = [(us_to_ns(Decimal(str(e["ts"]))), us_to_ns(Decimal(str(e["ts"]))) + us_to_ns(Decimal(str(e["dur"]))))
           for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    merged = union(gpu)
    idle = (merged[-1][1] - merged[0][0]) - sum(b - a for a, b in merged)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "launch-stats", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["metrics"]["gpu_idle_ns"] == idle
    assert found["impact_ns"] == min(excess, idle)


def test_launch_calls_waiting_for_a_full_queue_are_capped_by_the_idle_time(tmp_path):
    """Hand-written: four 10 us kernels back to back (1 us apart) whose launch calls last 50 us each, the host
    blocked on a full queue. The calls outlast their kernels by 4 x 40 us; the GPU was idle 3 us: 3 us at stake."""
    from helpers import run_cli

    events = []
    for i in range(4):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 50 * i, "dur": 50, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100 + 11 * i, "dur": 10,
                       "args": {"device": 0, "stream": 7, "correlation": i + 1}})
    path = tmp_path / "full_queue.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "launch-stats", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["metrics"]["gpu_idle_ns"] == 3_000 and found["impact_ns"] == 3_000
    assert "the GPU was idle only 3 us: the time at stake is no more than that" in found["message"]


def test_the_cuda_context_made_by_a_first_allocation_is_not_time_lost(tmp_path):
    """The first CUDA runtime call of a process creates the CUDA context; where it is a cudaMalloc that one call
    dwarfs every other. A real nvprof summary (pytorch_wavelets) read "API time in allocation (99.8%), 5.519 s
    lost" with loop advice, of 3 cudaMalloc calls, the longest 5.518 s (its Max column); an nsys capture
    (Game of Life, 2022.1) 239 ms for the first cudaMalloc after a driver query. That call is now left out of
    what is at stake, and said to be the context. Summary rows: the longest call, from the file; timed calls:
    hand-written, the first runtime call after a driver query."""
    import re as _re

    from helpers import run_cli

    path = FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log"
    line = next(l for l in path.read_text().splitlines() if l.rstrip().endswith("cudaMalloc"))
    cells = line.split()
    scale = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}
    def ns(cell):
        m = _re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
        return round(float(m[1]) * scale[m[2]])
    longest = ns(cells[-2])  # Max, before the name
    code, out, err = run_cli("--store", str(tmp_path / "a"), "analyze", str(path), "--rule", "api-share", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["metrics"]["context_creation_ns"] == longest and found["severity"] == "info"
    # a summary keeps no order of calls: the longest cudaMalloc most likely made the context, not "the first call"
    assert found.get("impact_ns") is None and "is the first CUDA call" not in found["message"]
    assert (f"The longest cudaMalloc ({fmt_ns(longest)}, the summary's Max) most likely made the CUDA context"
            in found["message"])

    def api(name, ts, dur):
        return {"ph": "X", "cat": "cuda_runtime" if name.startswith("cuda") else "cuda_driver", "name": name,
                "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {"correlation": ts}}
    events = [api("cuModuleGetLoadingMode", 0, 1), api("cudaMalloc", 10, 239_000), api("cudaMalloc", 240_000, 6),
              api("cudaLaunchKernel", 240_100, 5)]
    trace = tmp_path / "ctx.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    code, out, err = run_cli("--store", str(tmp_path / "b"), "analyze", str(trace), "--rule", "api-share", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["metrics"]["context_creation_ns"] == 239_000_000 and found["severity"] == "info"
    assert "cudaMalloc (239 ms) is the first CUDA call, which creates the CUDA context" in found["message"]


def test_a_busy_gpus_own_work_is_its_bottleneck(tmp_path):
    """A Qwen decode trace with the GPU 91.9% busy headlined "GPU idle time, 4.006 ms lost" (an info finding):
    on a GPU busy 90% of its span or more its own work sets the pace. The summary says so before the remainder.
    The real eager VGG16 trace without syncs (fixtures/torch/async) is such a trace: its busy share computed
    here from the raw JSON."""
    from decimal import Decimal

    from helpers import raw_events, union

    path = FIXTURES / "torch" / "async" / "vgg16_bs32_nosync.json.gz"
    gpu = [(us_to_ns(Decimal(str(e["ts"]))), us_to_ns(Decimal(str(e["ts"]))) + us_to_ns(Decimal(str(e["dur"]))))
           for e in raw_events(path) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    merged = union(gpu)
    busy = 100 * sum(b - a for a, b in merged) / (merged[-1][1] - merged[0][0])
    assert busy >= 90
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json", str(path))
    assert code == 0, err
    (summary,) = json.loads(out)["summary"]
    assert summary["gpu_bound"] is True and summary["bottleneck"]["severity"] == "info"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", "200", "analyze", str(path))
    assert f"bottleneck   the GPU's own work ({busy:.1f}% busy: top kernels below); the most at stake besides: " in out
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json",
                             str(FIXTURES / "torch" / "resnet18_bs16.json.gz"))
    assert json.loads(out)["summary"][0]["gpu_bound"] is False  # 28.8% busy


def test_a_cpu_profile_says_it_has_no_gpu_activity(tmp_path):
    """A CPU-only MPI profile's panel read "GPU busy -" with no word of why: it recorded no GPU activity (the
    profile files name no GPU routine, checked here)."""
    cpi = FIXTURES / "tau" / "real" / "cpi-mpi"
    text = "".join(p.read_text(errors="replace") for p in cpi.glob("profile.*"))
    assert not re.search(r"cuda|GPU|hip[A-Z]|OpenCL", text)
    code, out, err = run_cli("--store", str(tmp_path), "-q", "--width", "120", "analyze", str(cpi))
    assert code == 0, err
    assert re.search(r"GPU busy +- \(the trace recorded no GPU activity\) ", out), out


def test_a_category_share_reads_alike_in_the_summary_the_sentence_and_the_table(tmp_path):
    """The real two-rank nsys run: communication kernels take 87.9591% of kernel time, which rounds alone to 88.0%
    but reads 87.9% in kernel-share's table, where the six categories are rounded together to add up to 100
    (the largest remainders rounded up: gemm's .733, optimizer's .723 and layout/copy's .761 before its .591).
    The summary and the sentence said 88.0% beside the table's 87.9%; all three say the table's figure now, folded
    (``--rows 2``) or not."""
    import sqlite3
    import tempfile

    from traceparse import expr
    import polars as pl

    times: dict[str, int] = {}
    for report in sorted((FIXTURES / "nsys" / "nccl_run" / "ranks").glob("*.sqlite.gz")):
        with tempfile.NamedTemporaryFile(suffix=".sqlite") as db:
            db.write(gzip.decompress(report.read_bytes()))
            db.flush()
            rows = sqlite3.connect(db.name).execute(
                "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN StringIds s ON s.id = k.demangledName").fetchall()
        names = pl.DataFrame({"name": [r[0] for r in rows], "ns": [r[1] for r in rows]})
        cats = names.with_columns(category=expr.kernel_category(pl.col("name"))).group_by("category").agg(
            pl.col("ns").sum())
        for category, ns in cats.iter_rows():
            times[category] = times.get(category, 0) + ns
    total = sum(times.values())
    assert round(100 * times["communication"] / total, 4) == 87.9591
    store = tmp_path / "store"
    code, _, err = run_cli("--store", str(store), "ingest", str(FIXTURES / "nsys" / "nccl_run" / "ranks"))
    assert code == 0, err
    for rows in ("8", "2"):
        code, out, err = run_cli("--store", str(store), "analyze", "--rule", "kernel-share", "--width", "100",
                                 "--rows", rows)
        assert code == 0, err
        assert "top kernels  communication 87.9%, gemm 10.2%, optimizer 0.9% of kernel time" in out
        assert "communication kernels take 87.9%." in out
        assert re.search(r"│  communication +│ +66 │ +303\.01? │ +3 │ +87\.9% │ +2 ", out), out
        assert "88.0%" not in out
    code, out, err = run_cli("--store", str(store), "analyze", "--rule", "kernel-share", "--json")
    [summary] = json.loads(out)["summary"]
    assert [(c["category"], c["share_pct"], c["shown_pct"]) for c in summary["top_categories"]] == [
        ("communication", 87.9591, 87.9), ("gemm", 10.1733, 10.2), ("optimizer", 0.8723, 0.9)]
