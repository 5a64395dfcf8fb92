"""The api-share and gpu-idle rules, against independent computations.

Real data: the torch fixtures (read with the json module here), the nsys
fixtures' cuda_api_sum and cuda_gpu_trace reports (read with the csv module
here), the shared samples. Synthetic tables with hand-computed answers cover
the edge cases: touching, nested and overlapping intervals, several devices,
no device, aggregated rows, API name suffixes.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import as_shown, read_torch, run_rule, us_to_ns

from traceparse import plugins
from traceparse.analysis import analyze
from traceparse.schema import conform
from traceparse.trace import Trace, TraceMeta

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_TRACES = sorted((FIXTURES / "torch").glob("*.json.gz"))
NSYS_API_SUMS = sorted((FIXTURES / "nsys").glob("*_cuda_api_sum.csv"))
NSYS_GPU_TRACES = sorted((FIXTURES / "nsys").glob("*_cuda_gpu_trace.csv"))

#: The class of every API name the torch traces and nsys reports here contain, written out by hand.
EXPECTED_CLASS = {
    "cudaLaunchKernel": "launch", "cudaLaunchKernelExC": "launch", "cudaLaunchKernelExC_v11060": "launch",
    "cuLaunchKernel": "launch", "cuLaunchKernelEx": "launch",
    "cudaGraphLaunch": "graph_launch",  # one call replays a whole graph: its own class, not a launch
    "cudaMemcpyAsync": "memcpy", "cudaMemsetAsync": "memset",
    "cudaStreamSynchronize": "synchronize", "cudaDeviceSynchronize": "synchronize",
    "cudaStreamWaitEvent": "synchronize",
    "cudaMalloc": "allocation",
}


# ---------------------------------------------------------------- helpers

def synthetic(rows: list[dict]) -> Trace:
    df = pl.DataFrame(rows, infer_schema_length=None)
    if "calls" in df.columns:
        df = df.with_columns(pl.col("calls").fill_null(1))
    return Trace(conform(df, trace_id="synthetic"), TraceMeta(id="synthetic"))








def json_events(path: Path, cats: tuple[str, ...]) -> list[dict]:
    with gzip.open(path, "rb") as f:
        doc = json.loads(f.read(), parse_float=Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def merged_gaps(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Gaps between merged [start, end) intervals, by a plain loop (touching intervals leave no gap)."""
    gaps, end = [], None
    for s, e in sorted(intervals):
        if end is not None and s > end:
            gaps.append((end, s))
        end = e if end is None else max(end, e)
    return gaps


def expected_idle(events: list[tuple[object, int, int, str]]) -> dict:
    """span, idle and gaps per device from (device, start, end, name) tuples, computed by hand."""
    out = {}
    for device in {d for d, *_ in events}:
        iv = [(s, e) for d, s, e, _ in events if d == device]
        gaps = merged_gaps(iv)
        out[device] = {"span": max(e for _, e in iv) - min(s for s, _ in iv),
                       "idle": sum(b - a for a, b in gaps), "gaps": gaps}
    return out


# ---------------------------------------------------------------- api-share

@pytest.mark.parametrize("path", FIXTURE_TRACES, ids=lambda p: p.name)
def test_api_share_matches_the_json(path):
    calls, time = {}, {}
    for e in json_events(path, ("cuda_runtime", "cuda_driver")):
        calls[e["name"]] = calls.get(e["name"], 0) + 1
        time[e["name"]] = time.get(e["name"], 0) + us_to_ns(e["dur"])
    total = sum(time.values())
    f = run_rule(read_torch(path), "api-share", "api-share.top=1000")
    assert f.metrics["api_time_ns"] == total
    assert f.metrics["api_calls"] == sum(calls.values())
    assert f.metrics["api_names"] == len(calls)
    assert {i["name"]: (i["calls"], i["time_ns"], i["class"]) for i in f.items} == \
        {n: (calls[n], time[n], EXPECTED_CLASS.get(n, "other")) for n in calls}
    for item in f.items:
        assert item["share_pct"] == round(100 * time[item["name"]] / total, 4)
    assert [i["time_ns"] for i in f.items] == sorted(time.values(), reverse=True)
    for cls in ("launch", "memcpy", "memset", "synchronize", "allocation", "other"):
        cls_time = sum(t for n, t in time.items() if EXPECTED_CLASS.get(n, "other") == cls)
        assert f.metrics["classes"][cls]["time_ns"] == cls_time
        assert f.metrics[f"{cls}_share_pct"] == round(100 * cls_time / total, 4)
    assert sum(f.metrics["classes"][c]["calls"] for c in f.metrics["classes"]) == sum(calls.values())


@pytest.mark.parametrize("path", NSYS_API_SUMS, ids=lambda p: p.name)
def test_api_share_of_summary_rows_reproduces_the_tools_time_pct(path):
    # Aggregated rows as an nsys/nvprof summary gives them; the share must be the report's own Time (%).
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    trace = synthetic([{"kind": "api", "name": r["Name"], "calls": int(r["Num Calls"]),
                        "duration_ns": int(r["Total Time (ns)"])} for r in rows])
    f = run_rule(trace, "api-share", "api-share.top=1000")
    assert f.metrics["api_time_ns"] == sum(int(r["Total Time (ns)"]) for r in rows)
    assert f.metrics["api_calls"] == sum(int(r["Num Calls"]) for r in rows)
    shares = {i["name"]: i["share_pct"] for i in f.items}
    for r in rows:
        assert abs(shares[r["Name"]] - float(r["Time (%)"])) <= 0.05 + 1e-9, r["Name"]
    assert {i["name"]: i["class"] for i in f.items} == {r["Name"]: EXPECTED_CLASS.get(r["Name"], "other")
                                                        for r in rows}


def test_api_classes_by_hand():
    names = {
        "cudaLaunchKernel": "launch", "cudaLaunchKernelExC_v11060": "launch", "cuLaunchKernelEx": "launch",
        "cudaLaunchCooperativeKernel": "launch", "cudaGraphLaunch_v10000": "graph_launch", "cudaLaunch": "launch",
        "cuGraphLaunch": "graph_launch", "hipGraphLaunch": "graph_launch",
        # HIP (ROCm builds of PyTorch), names as the public ROCm traces write them
        "hipLaunchKernel": "launch", "hipExtModuleLaunchKernel": "launch", "hipModuleLaunchKernel": "launch",
        "hipExtLaunchKernel": "launch", "hipMemcpyWithStream": "memcpy", "hipMemcpyAsync": "memcpy",
        "hipMemsetAsync": "memset", "hipDeviceSynchronize": "synchronize", "hipStreamSynchronize": "synchronize",
        "hipEventSynchronize": "synchronize", "hipStreamWaitEvent": "synchronize", "hipMalloc": "allocation",
        "hipFree": "allocation", "hipHostMalloc": "allocation", "hipGetDevicePropertiesR0600": "other",
        "hipStreamIsCapturing": "other", "hipPointerGetAttribute": "other",
        "cudaConfigureCall": "launch", "cudaSetupArgument": "launch",
        "cudaMemcpy": "memcpy", "cudaMemcpyAsync_ptsz": "memcpy", "cuMemcpyHtoDAsync_v2": "memcpy",
        "cudaMemcpy2DAsync": "memcpy", "cudaMemset": "memset", "cuMemsetD32_v2": "memset",
        "cudaDeviceSynchronize": "synchronize", "cudaStreamSynchronize_ptsz": "synchronize",
        "cudaEventSynchronize": "synchronize", "cuStreamSynchronize": "synchronize",
        "cuCtxSynchronize": "synchronize", "cudaThreadSynchronize": "synchronize",
        "cudaMalloc": "allocation", "cudaMallocHost": "allocation", "cudaFree": "allocation",
        "cudaFreeHost": "allocation", "cudaHostAlloc": "allocation", "cuMemAlloc_v2": "allocation",
        "cuMemFree_v2": "allocation", "cudaMallocAsync_ptsa": "allocation", "cudaHostRegister": "allocation",
        "cudaFuncGetAttributes": "other", "cudaEventDestroy": "other", "cudaGetDeviceProperties": "other",
        "cuDeviceGetAttribute": "other", "cuDeviceTotalMem_v2": "other", "cudaStreamIsCapturing": "other",
        "cudaMemGetInfo": "other", "cudaEventQuery": "other",
    }
    # each name gets a distinct time so every share can be checked: name i takes (i + 1) * 10 ns
    rows = [{"kind": "api", "name": n, "start_ns": 1000 * i, "duration_ns": (i + 1) * 10}
            for i, n in enumerate(names)]
    f = run_rule(synthetic(rows), "api-share", "api-share.top=1000")
    assert {i["name"]: i["class"] for i in f.items} == names
    total = sum((i + 1) * 10 for i in range(len(names)))
    for cls in ("graph_launch", "launch", "memcpy", "memset", "synchronize", "allocation", "other"):
        t = sum((i + 1) * 10 for i, n in enumerate(names) if names[n] == cls)
        assert f.metrics["classes"][cls] == {"calls": sum(1 for n in names if names[n] == cls), "time_ns": t,
                                             "share_pct": round(100 * t / total, 4)}


def test_api_share_severity_and_settings():
    # launch 8.5 ms of 10 (85%): warning by default (launch_warning_pct 80); allocation 1 ms (10%); other 0.5.
    rows = [{"kind": "api", "name": "cudaLaunchKernel", "calls": 100, "duration_ns": 8_500_000},
            {"kind": "api", "name": "cudaMalloc", "calls": 2, "duration_ns": 1_000_000},
            {"kind": "api", "name": "cudaGetDeviceProperties", "calls": 1, "duration_ns": 500_000}]
    trace = synthetic(rows)
    # the same shares in a thousandth of the time (launches 8.5 us in all): nothing at stake under 1 ms
    small = synthetic([{**r, "duration_ns": r["duration_ns"] // 1000} for r in rows])
    assert run_rule(small, "api-share").severity == "info"
    assert run_rule(small, "api-share", "api-share.min_class_time_us=8.5").severity == "warning"
    f = run_rule(trace, "api-share")
    assert (f.metrics["launch_share_pct"], f.metrics["allocation_share_pct"], f.metrics["other_share_pct"]) == \
        (85.0, 10.0, 5.0)
    assert f.severity == "warning"
    assert "launch" in f.title and "CUDA graphs" in f.suggestion
    f = run_rule(trace, "api-share", "api-share.launch_warning_pct=90")
    assert f.severity == "info" and f.suggestion == ""
    f = run_rule(trace, "api-share", "api-share.launch_warning_pct=90", "api-share.allocation_warning_pct=10")
    assert f.severity == "warning" and "allocation" in f.title and "CUDA graphs" not in f.suggestion
    f = run_rule(trace, "api-share", "api-share.top=1")
    assert [i["name"] for i in f.items] == ["cudaLaunchKernel"]


def test_api_share_ignores_summary_rows_beside_timed_calls():
    rows = [{"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 30},
            {"kind": "api", "name": "cudaLaunchKernel", "start_ns": 100, "duration_ns": 10},
            {"kind": "api", "name": "cudaLaunchKernel", "calls": 2, "duration_ns": 40}]
    f = run_rule(synthetic(rows), "api-share")
    assert (f.metrics["api_time_ns"], f.metrics["api_calls"]) == (40, 2)
    assert "1 aggregated API rows ignored" in f.message


def test_api_share_on_the_shared_samples(samples_dir):
    # every shared torch sample: the ResNet18 sweep, two GPUs, CUDA graphs, a transformer, memory
    for path in sorted((samples_dir / "torch").glob("*.json.gz")):
        time = {}
        for e in json_events(path, ("cuda_runtime", "cuda_driver")):
            time[e["name"]] = time.get(e["name"], 0) + us_to_ns(e["dur"])
        f = run_rule(read_torch(path), "api-share")
        assert f.metrics["api_time_ns"] == sum(time.values())
        launch = sum(t for n, t in time.items() if EXPECTED_CLASS.get(n) == "launch")
        assert f.metrics["launch_share_pct"] == round(100 * launch / sum(time.values()), 4)


# ---------------------------------------------------------------- gpu-idle

@pytest.mark.parametrize("path", FIXTURE_TRACES, ids=lambda p: p.name)
def test_gpu_idle_matches_the_json(path):
    events = []
    for e in json_events(path, ("kernel", "gpu_memcpy", "gpu_memset")):
        start = us_to_ns(e["ts"])
        events.append((e["args"]["device"], start, start + us_to_ns(e["dur"]), e["name"]))
    check_idle(run_rule(read_torch(path), "gpu-idle", "gpu-idle.top=5"), events, top=5)


@pytest.mark.parametrize("path", NSYS_GPU_TRACES, ids=lambda p: p.name)
def test_gpu_idle_on_an_nsys_gpu_trace(path):
    # The nsys cuda_gpu_trace report read with the csv module, as a table the rule sees.
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    events, table = [], []
    for r in rows:
        start, dur = int(r["Start (ns)"]), int(r["Duration (ns)"])
        device = int(r["Device"].rsplit("(", 1)[1].rstrip(")"))
        kind = "memcpy" if r["Name"].startswith("[CUDA memcpy") else \
            "memset" if r["Name"].startswith("[CUDA memset") else "kernel"
        events.append((device, start, start + dur, r["Name"]))
        table.append({"kind": kind, "name": r["Name"], "start_ns": start, "duration_ns": dur, "device_id": device})
    check_idle(run_rule(synthetic(table), "gpu-idle"), events, top=10)


def check_idle(f, events, top):
    per_device = expected_idle(events)
    span = sum(d["span"] for d in per_device.values())
    idle = sum(d["idle"] for d in per_device.values())
    assert f.metrics["span_ns"] == span
    assert f.metrics["idle_ns"] == idle
    assert f.metrics["idle_pct"] == round(100 * idle / span, 4)
    assert f.metrics["gaps"] == sum(len(d["gaps"]) for d in per_device.values())
    for device, d in per_device.items():
        assert f.metrics["devices"][str(device)]["idle_ns"] == d["idle"]
        assert f.metrics["devices"][str(device)]["span_ns"] == d["span"]
    origin = min(s for _, s, _, _ in events)
    # longest first as the screen shows a length (4 significant figures: 169,986 and 170,018 ns are both
    # 170.0 us), then by start
    all_gaps = sorted(((b - a, a, dev) for dev, d in per_device.items() for a, b in d["gaps"]),
                      key=lambda g: (-as_shown(g[0]), g[1]))[:top]
    assert [(i["length_ns"], i["start_offset_ns"] + origin, i["device_id"]) for i in f.items] == all_gaps
    for item in f.items:
        start = item["start_offset_ns"] + origin
        assert item["before"] in {n for d, _, e, n in events if d == item["device_id"] and e == start}
        end = start + item["length_ns"]
        assert item["after"] in {n for d, s, _, n in events if d == item["device_id"] and s == end}


def test_gpu_idle_by_hand_two_devices():
    rows = [
        # device 0: a and b touch (no gap), m nests in a, gap [20, 30), then c
        {"kind": "kernel", "name": "a", "device_id": 0, "start_ns": 0, "duration_ns": 10},
        {"kind": "kernel", "name": "b", "device_id": 0, "start_ns": 10, "duration_ns": 10},
        {"kind": "memset", "name": "m", "device_id": 0, "start_ns": 5, "duration_ns": 3},
        {"kind": "memcpy", "name": "c", "device_id": 0, "start_ns": 30, "duration_ns": 10},
        # not work: a marker over the gap, an API call, a kernel summary row without start
        {"kind": "marker", "name": "step", "device_id": 0, "start_ns": 20, "duration_ns": 10},
        {"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 1000},
        {"kind": "kernel", "name": "a", "device_id": 0, "calls": 5, "duration_ns": 1000},
        # device 1: y nests in x, gap [150, 200), then z; device 1 being busy does not fill device 0's gap
        {"kind": "kernel", "name": "x", "device_id": 1, "start_ns": 100, "duration_ns": 50},
        {"kind": "kernel", "name": "y", "device_id": 1, "start_ns": 120, "duration_ns": 10},
        {"kind": "kernel", "name": "z", "device_id": 1, "start_ns": 200, "duration_ns": 10},
        {"kind": "kernel", "name": "w", "device_id": 1, "start_ns": 15, "duration_ns": 20},
    ]
    # device 1 also runs w over [15, 35): its span is [15, 210) = 195, busy 20 + 50 + 10 = 80, gaps
    # [35, 100) = 65 and [150, 200) = 50. device 0: span 40, busy 30, gap 10.
    f = run_rule(synthetic(rows), "gpu-idle")
    assert {k: f.metrics[k] for k in ("span_ns", "idle_ns", "idle_pct", "busy_ns", "gaps", "untimed_rows")} == \
        {"span_ns": 235, "idle_ns": 125, "idle_pct": round(100 * 125 / 235, 4), "busy_ns": 110, "gaps": 3,
         "untimed_rows": 1}
    assert f.metrics["devices"] == {
        "0": {"span_ns": 40, "busy_ns": 30, "idle_ns": 10, "idle_pct": 25.0, "gaps": 1},
        "1": {"span_ns": 195, "busy_ns": 80, "idle_ns": 115, "idle_pct": round(100 * 115 / 195, 4), "gaps": 2},
    }
    assert f.items == [
        {"device_id": 1, "start_offset_ns": 35, "length_ns": 65, "before": "w", "after": "x"},
        {"device_id": 1, "start_offset_ns": 150, "length_ns": 50, "before": "x", "after": "z"},
        {"device_id": 0, "start_offset_ns": 20, "length_ns": 10, "before": "b", "after": "c"},
    ]
    assert f.severity == "critical"  # 53.2% idle
    assert run_rule(synthetic(rows), "gpu-idle", "gpu-idle.critical_idle_pct=60").severity == "warning"
    assert run_rule(synthetic(rows), "gpu-idle", "gpu-idle.critical_idle_pct=60",
               "gpu-idle.warning_idle_pct=53.3").severity == "info"
    assert len(run_rule(synthetic(rows), "gpu-idle", "gpu-idle.top=1").items) == 1


def test_gpu_idle_without_device_ids_and_without_gaps():
    rows = [{"kind": "kernel", "name": "p", "start_ns": 0, "duration_ns": 10},
            {"kind": "kernel", "name": "q", "start_ns": 30, "duration_ns": 10}]
    f = run_rule(synthetic(rows), "gpu-idle")
    assert (f.metrics["span_ns"], f.metrics["idle_ns"], f.metrics["idle_pct"]) == (40, 20, 50.0)
    assert f.items == [{"device_id": None, "start_offset_ns": 10, "length_ns": 20, "before": "p", "after": "q"}]
    # overlapping and touching work only: no idle time at all
    rows = [{"kind": "kernel", "name": "p", "device_id": 0, "start_ns": 0, "duration_ns": 10},
            {"kind": "memcpy", "name": "q", "device_id": 0, "start_ns": 5, "duration_ns": 10},
            {"kind": "memset", "name": "r", "device_id": 0, "start_ns": 15, "duration_ns": 5}]
    f = run_rule(synthetic(rows), "gpu-idle")
    assert (f.metrics["span_ns"], f.metrics["idle_ns"], f.metrics["idle_pct"], f.items) == (20, 0, 0.0, [])
    assert f.severity == "info"


def test_gpu_idle_needs_timestamps():
    rows = [{"kind": "kernel", "name": "k", "calls": 10, "duration_ns": 100},
            {"kind": "memcpy", "name": "[CUDA memcpy HtoD]", "calls": 2, "duration_ns": 50}]
    f = run_rule(synthetic(rows), "gpu-idle")
    assert f.severity == "info"
    assert f.metrics == {"span_ns": 0, "idle_ns": 0, "idle_pct": None, "untimed_rows": 2}
    assert "aggregated (no start times)" in f.message


def test_gpu_idle_on_the_shared_samples(samples_dir):
    # every shared torch sample: the ResNet18 sweep, two GPUs, CUDA graphs, a transformer, memory
    for path in sorted((samples_dir / "torch").glob("*.json.gz")):
        events = []
        for e in json_events(path, ("kernel", "gpu_memcpy", "gpu_memset")):
            start = us_to_ns(e["ts"])
            device = e["args"].get("device", e["args"].get("inDevice"))  # a P2P copy runs on its inDevice
            events.append((device, start, start + us_to_ns(e["dur"]), e["name"]))
        check_idle(run_rule(read_torch(path), "gpu-idle"), events, top=10)


# ---------------------------------------------------------------- applicability

def test_api_and_idle_rules_do_not_apply_without_their_kinds():
    only_ops = synthetic([{"kind": "op", "name": "aten::add", "start_ns": 0, "duration_ns": 10}])
    for rule in ("api-share", "gpu-idle"):
        assert not plugins.registry().rule(rule).applies_to(only_ops)
        (f,) = analyze(only_ops, rules=[rule])
        assert f.title == f"{rule}: not applicable"
    only_kernels = synthetic([{"kind": "kernel", "name": "k", "start_ns": 0, "duration_ns": 10}])
    assert not plugins.registry().rule("api-share").applies_to(only_kernels)
    assert plugins.registry().rule("gpu-idle").applies_to(only_kernels)


def test_a_runs_streams_and_gaps_that_read_alike_are_in_rank_order(tmp_path):
    """Three ranks of one real trace, rank r's clock stretched by r × 10⁻⁵: every gap and idle time is a few
    nanoseconds longer on a higher rank, so the exact order is 2, 1, 0, while the screen shows the three alike
    (4 significant figures). The streams' table and the longest gaps list them 0, 1, 2, as they read."""
    from helpers import run_cli

    from traceparse.figures import fmt_ns

    doc = json.load(gzip.open(FIXTURES / "torch" / "resnet18_bs16.json.gz"))
    run = tmp_path / "run"
    run.mkdir()
    for r in range(3):
        stretch = Decimal(1) + Decimal(r) / Decimal(10 ** 5)
        events = []
        for e in doc["traceEvents"]:
            e = dict(e)
            for key in ("ts", "dur"):
                if isinstance(e.get(key), (int, float)):
                    e[key] = float((Decimal(str(e[key])) * stretch).quantize(Decimal("0.001")))
            events.append(e)
        rank_doc = {**doc, "traceEvents": events, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 3}}
        (run / f"rank{r}.json").write_text(json.dumps(rank_doc))
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", str(run), "--rule", "gpu-idle", "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    streams = list(f["metrics"]["streams"].items())
    busiest = [(key, v["idle_ns"]) for key, v in streams[:3]]
    assert [key.split(":")[0] for key, _ in busiest] == ["rank 0", "rank 1", "rank 2"]
    assert busiest[0][1] < busiest[1][1] < busiest[2][1]  # exactly, the other way round
    assert len({fmt_ns(ns) for _, ns in busiest}) == 1  # as shown: alike
    top = f["items"][:3]
    assert [i["rank"] for i in top] == [0, 1, 2]
    assert top[0]["length_ns"] < top[1]["length_ns"] < top[2]["length_ns"]
    assert len({fmt_ns(i["length_ns"]) for i in top}) == 1
    shown = [as_shown(i["length_ns"]) for i in f["items"]]
    assert shown == sorted(shown, reverse=True)


def test_one_api_call_is_one_call_in_the_message():
    rows = [{"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 10, "pid": 1, "tid": 1}]
    f = run_rule(Trace(conform(pl.DataFrame(rows)), TraceMeta()), "api-share")
    assert f.message.startswith("1 API call (1 distinct) takes 10 ns; launch 100.0%.")


def test_a_share_reads_the_same_in_the_title_the_sentence_and_the_tables():
    """Sweep 18's amp_accum: launches are 4,578,302 of 5,193,940 ns of API time (88.147%), cudaLaunchKernel
    3,794,151 ns (73.050%), from the raw JSON. The classes and top-calls tables show their shares so that they add
    up to 100 (88.2%: the classes' nearest add up to 99.9; 73.1%: the launch calls' rounded within their class's
    88.2%: its 73.0496% among the largest remainders, up); the title and the sentence say the same figures
    (they said "launch (88.1%)" and "cudaLaunchKernel (73.0%)" over tables of 88.2% and 73.1%)."""
    with gzip.open(FIXTURES / "torch" / "sweep18" / "amp_accum.json.gz", "rt") as f:
        api = [e for e in json.load(f)["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    total = sum(us_to_ns(e["dur"]) for e in api)
    launch = sum(us_to_ns(e["dur"]) for e in api if EXPECTED_CLASS.get(e["name"]) == "launch")
    top = sum(us_to_ns(e["dur"]) for e in api if e["name"] == "cudaLaunchKernel")
    assert (launch, top, total) == (4_578_302, 3_794_151, 5_193_940)
    from traceparse.figures import shares_shown

    f = run_rule(read_torch(FIXTURES / "torch" / "sweep18" / "amp_accum.json.gz"), "api-share")
    classes = f.metrics["classes"]
    shown = dict(zip(classes, shares_shown([c["share_pct"] for c in classes.values()])))
    top_shown = f.items[0]["shown_pct"]
    assert (round(100 * launch / total, 3), shown["launch"], top_shown) == (88.147, 88.2, 73.1)
    assert f.title == "API time in launch (88.2%)"
    assert "launch 88.2%" in f.message and "The top call is cudaLaunchKernel (73.1%)." in f.message


def test_a_class_of_one_call_and_that_call_read_the_same(tmp_path):
    """resnet18_bs32's memset class is its 480 cudaMemsetAsync calls, yet the classes table read 1.6% and the top
    calls table 1.5%: each table was rounded to add up to 100 on its own. Each call's share is now rounded within
    its class's share as shown (largest remainders), so both tables add up to 100 and each class's calls add up to
    it. The expected figures are computed here from the raw JSON (helpers.hamilton for the classes)."""
    from helpers import hamilton, run_cli

    path = FIXTURES / "torch" / "resnet18_bs32.json.gz"
    with gzip.open(path, "rt") as f:
        api = [e for e in json.load(f)["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    time: dict[str, int] = {}
    for e in api:
        time[e["name"]] = time.get(e["name"], 0) + us_to_ns(e["dur"])
    total = sum(time.values())
    cls = {n: EXPECTED_CLASS.get(n, "other") for n in time}
    per_class = {c: sum(t for n, t in time.items() if cls[n] == c) for c in set(cls.values())}
    classes = sorted(per_class)
    class_shown = dict(zip(classes, hamilton([100 * per_class[c] / total for c in classes])))
    expected = {}
    for c in classes:  # within the class: each call rounded down, the largest remainders up to the class's figure
        names = sorted((n for n in time if cls[n] == c), key=lambda n: -time[n])
        tenths = {n: int(1000 * time[n] / total) for n in names}
        up = round(class_shown[c] * 10) - sum(tenths.values())
        for n in sorted(names, key=lambda n: -(1000 * time[n] / total - tenths[n]))[:up]:
            tenths[n] += 1
        expected.update({n: t / 10 for n, t in tenths.items()})
    assert class_shown["memset"] == expected["cudaMemsetAsync"] == 1.6  # 480 calls, 1.55% of the API time
    assert round(sum(expected.values()), 1) == 100.0
    code, screen, err = run_cli("--store", str(tmp_path / "s"), "--width", "200", "analyze", str(path),
                                "--rule", "api-share", "--set", "api-share.top=50")
    assert code == 0, err
    rows = dict(re.findall(r"│ +(\w+) +│ +\w+ +│ +[\d,]+ +│ +[\d.]+ +│ +(<?\d+\.\d)%", screen))
    assert rows == {n: "<0.1" if v == 0 else f"{v:.1f}" for n, v in expected.items()}
    classes_table = screen.split(" classes ")[1].split("top calls")[0]
    table = dict(re.findall(r"│ +(\w+) +│ +[\d,]+ +│ +[\d.]+ +│ +(\d+\.\d)%", classes_table))
    assert {c: float(table[c]) for c in classes} == class_shown


def test_idle_time_between_two_streams_is_other_not_lost(tmp_path):
    """A real nvprof trace of two activities on two streams (a memset, then 4.6 ms later a copy): the GPU idles
    between them, but no stream has a gap of its own, and the host, kernel and other waits added up to 0 against
    4.641 ms idle. All of it is other, and said to lie between streams (the raw CSV's times)."""
    from helpers import FIXTURES, run_cli

    path = FIXTURES / "nvprof" / "real" / "rlscope_gpu_trace.csv"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "gpu-idle", "--json")
    assert code == 0, err
    (f,) = json.loads(out)["findings"]
    m = f["metrics"]
    lines = path.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"Start"'))
    rows = list(csv.DictReader(lines[header:]))[1:]  # after the units row
    (a_start, a_dur), (b_start, _) = sorted((us_to_ns(Decimal(r["Start"])), us_to_ns(Decimal(r["Duration"])))
                                            for r in rows)
    assert m["idle_ns"] == b_start - (a_start + a_dur) > 0
    assert (m["host_wait_ns"], m["kernel_wait_ns"]) == (0, 0)
    assert m["other_wait_ns"] == m["idle_ns"] and m["other_wait_pct"] == 100.0
    assert ("The idle time lies between activities of different streams, in no stream's own gap: why the GPU "
            "waited cannot be told from a stream (counted as other).") in f["message"]


def test_launch_time_at_stake_is_no_more_than_the_gpu_idled(tmp_path):
    """A real ROCm JAX trace (TraceLens's public fixture), its GPU 93.6% busy: 3.087 ms of launch calls were "API
    time in launch, 3.087 ms lost", the run's bottleneck, beside 823.6 us of idle GPU."""
    import traceparse
    from traceparse.figures import fmt_ns

    path = FIXTURES / "jax" / "public" / "tracelens_te_fused_attn" / "934987a2fc2f.xplane.pb"
    trace = traceparse.load(path)
    found = {f.rule: f for f in traceparse.analyze(trace, rules=["api-share", "gpu-idle"])}
    api, idle = found["api-share"], found["gpu-idle"].metrics["idle_ns"]
    launch_ns = api.metrics["classes"]["launch"]["time_ns"]
    assert launch_ns > idle > 0  # the case: more launch time than the GPU was idle
    assert api.severity == "info" and api.impact_ns is None  # 823.6 us < min_class_time_us (1 ms)
    assert f"The GPU was idle only {fmt_ns(idle)}: launch calls cost it no more than that" in api.message


def test_launch_time_without_timed_gpu_work_is_not_capped():
    # an API summary alone (nsys cuda_api_sum): the GPU's idle time is unknown, not zero
    rows = [{"kind": "api", "name": "cudaLaunchKernel", "calls": 100, "duration_ns": 8_500_000},
            {"kind": "api", "name": "cudaGetDeviceProperties", "calls": 1, "duration_ns": 1_500_000}]
    f = run_rule(synthetic(rows), "api-share")
    assert f.severity == "warning" and f.impact_ns == 8_500_000 and "idle only" not in f.message
