"""launch-stats, the gpu-idle breakdown per stream, the memory rule, AMD devices and arithmetic-intensity's quick
answer, each against an independent computation: plain Python over the raw JSON of the shared real traces
(exact decimal microseconds), or hand-built tables whose figures are worked out in the comments.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import REPO, read_torch, run_rule, us_to_ns
from traceparse import measures
from traceparse.catalog import gpu_for_trace
from traceparse.schema import conform
from traceparse.trace import Device, Trace, TraceMeta

SHARED = REPO.parent / "shared" / "samples" / "torch"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared samples are not next to the repository")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH = ("cudaLaunch", "cuLaunch", "hipLaunch", "hipExtLaunch", "hipModuleLaunch", "hipExtModuleLaunch")
GRAPH = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")


def raw(name: str) -> list[dict]:
    with gzip.open(SHARED / name, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


def linked_from_json(events: list[dict], cats=GPU_CATS):
    """(GPU event dicts with exact start/dur, runtime call by correlation id: first to start)."""
    calls = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            s = us_to_ns(e["ts"])
            if c not in calls or s < calls[c]["start"]:
                calls[c] = {"start": s, "dur": us_to_ns(e["dur"]), "name": e["name"], "id": id(e)}
    gpu = [{"start": us_to_ns(e["ts"]), "dur": us_to_ns(e["dur"]), "stream": e["args"].get("stream"),
            "device": e["args"].get("device", e["args"].get("inDevice")),  # a P2P copy runs on its inDevice
            "launch": calls.get(e["args"].get("correlation")), "name": e["name"]}
           for e in events if e.get("ph") == "X" and e.get("cat") in cats]
    return gpu, calls


def nearest_rank(values, p):
    values = sorted(values)
    return values[max(1, math.ceil(p * len(values))) - 1] if values else None


@needs_shared
@pytest.mark.parametrize("name", ["resnet18_bs32_compiled_cudagraphs.json.gz", "gpt_1024d_8l_bs8_bf16.json.gz"])
def test_launch_stats_matches_the_json(name):
    kernels, _ = linked_from_json(raw(name), {"kernel"})
    linked = [k for k in kernels if k["launch"]]
    direct = [k for k in linked if k["launch"]["name"].startswith(LAUNCH)]
    graph = [k for k in linked if k["launch"]["name"].startswith(GRAPH)]
    direct_calls = {k["launch"]["id"]: k["launch"]["dur"] for k in direct}
    graph_calls = {k["launch"]["id"]: k["launch"]["dur"] for k in graph}
    delays = [k["start"] - k["launch"]["start"] for k in linked]
    f = run_rule(read_torch(SHARED / name), "launch-stats")
    m = f.metrics
    assert (m["kernels"], m["linked_kernels"], m["direct_kernels"], m["graph_kernels"]) == \
        (len(kernels), len(linked), len(direct), len(graph))
    assert (m["launches"], m["graph_launches"]) == (len(direct_calls), len(graph_calls))
    assert m["launch_time_ns"] == sum(direct_calls.values())
    assert m["graph_launch_time_ns"] == sum(graph_calls.values())
    assert m["launch_ns_p50"] == nearest_rank(direct_calls.values(), 0.5)
    assert (m["delay_ns_min"], m["delay_ns_p50"], m["delay_ns_p99"], m["delay_ns_max"]) == \
        (min(delays), nearest_rank(delays, 0.5), nearest_rank(delays, 0.99), max(delays))
    short = sum(1 for k in direct if k["dur"] < k["launch"]["dur"])
    assert m["short_kernel_pct"] == round(100 * short / len(direct), 4)
    assert m["delay_outliers"] == sum(1 for d in delays if d >= 100_000)
    if graph:
        assert m["kernels_per_graph_launch"] == round(len(graph) / len(graph_calls), 4)


@needs_shared
def test_graph_launches_replay_many_kernels():
    """torch.compile reduce-overhead: 6 cudaGraphLaunch calls replay 855 kernels (131 or 154 each)."""
    m = run_rule(read_torch(SHARED / "resnet18_bs32_compiled_cudagraphs.json.gz"), "launch-stats").metrics
    assert (m["graph_launches"], m["graph_kernels"], m["kernels_per_graph_launch"]) == (6, 855, 142.5)
    api = run_rule(read_torch(SHARED / "resnet18_bs32_compiled_cudagraphs.json.gz"), "api-share").metrics
    assert api["classes"]["graph_launch"]["calls"] == 6 and api["classes"]["launch"]["calls"] == 84


@needs_shared
@pytest.mark.parametrize("name", ["gpt_1024d_8l_bs8_bf16.json.gz", "resnet18_bs32_compiled_cudagraphs.json.gz",
                                  "dp2_alexnet_bs16.json.gz"])
def test_idle_breakdown_matches_the_json(name):
    gpu, _ = linked_from_json(raw(name))
    streams = defaultdict(list)
    for g in gpu:
        streams[(g["device"], g["stream"])].append(g)
    want = defaultdict(int)
    for rows in streams.values():
        rows.sort(key=lambda r: (r["start"], r["start"] + r["dur"]))
        latest = None
        for r in rows:
            if latest is not None and r["start"] > latest:
                gap = r["start"] - latest
                if r["launch"] and r["launch"]["start"] > latest:
                    want["host_wait_ns"] += gap
                elif gap < 30_000:
                    want["kernel_wait_ns"] += gap
                else:
                    want["other_wait_ns"] += gap
            end = r["start"] + r["dur"]
            latest = end if latest is None else max(latest, end)
    f = run_rule(read_torch(SHARED / name), "gpu-idle")
    keys = ("host_wait_ns", "kernel_wait_ns", "other_wait_ns")
    per_stream = {k: sum(row[k] for row in f.metrics["streams"].values()) for k in keys}
    assert per_stream == {k: want[k] for k in keys}
    # the streams' gaps may cover one idle moment twice: their shares split the devices' idle time
    total, idle = sum(want.values()), f.metrics["idle_ns"]
    for k in keys:
        assert f.metrics[k.replace("_ns", "_pct")] == round(100.0 * want[k] / total, 4)
        # each part idle × share, whole nanoseconds (floor, or one more), the three adding up to the idle time
        assert f.metrics[k] - idle * want[k] // total in (0, 1)
    assert sum(f.metrics[k] for k in keys) == idle
    assert abs(sum(f.metrics[k] for k in keys) - idle) <= 2


def test_idle_breakdown_by_hand():
    # one stream: K1 [0, 10) launched at -5; K2 [15, 20) launched at 2 (queued before K1 ended): gap 5 < 30 µs:
    # kernel wait; K3 [100, 110) launched at 50 (after K2 ended at 20): host wait 80; K4 [200_000, 200_010)
    # launched at 105 (queued): gap 199_890 ≥ 30 µs: other. A second stream's kernel K5 [0, 5) has no launch.
    rows = [{"kind": "api", "name": "cudaLaunchKernel", "start_ns": s, "duration_ns": 3, "correlation_id": c,
             "pid": 1, "tid": 1} for c, s in ((1, -5), (2, 2), (3, 50), (4, 105))]
    rows += [{"kind": "kernel", "name": f"K{c}", "start_ns": s, "duration_ns": d, "correlation_id": c,
              "device_id": 0, "stream_id": 7} for c, s, d in ((1, 0, 10), (2, 15, 5), (3, 100, 10),
                                                             (4, 200_000, 10))]
    rows.append({"kind": "kernel", "name": "K5", "start_ns": 0, "duration_ns": 5, "device_id": 0, "stream_id": 8})
    out = measures.stream_idle(conform(pl.DataFrame(rows), trace_id="t"))
    first = out.filter(pl.col("stream_id") == 7).row(0, named=True)
    assert (first["host_wait_ns"], first["kernel_wait_ns"], first["other_ns"], first["idle_ns"]) == \
        (80, 5, 199_890, 199_975)
    assert (first["host_wait_gaps"], first["kernel_wait_gaps"], first["other_gaps"]) == (1, 1, 1)
    smaller = measures.stream_idle(conform(pl.DataFrame(rows), trace_id="t"), kernel_wait_ns=5)
    assert smaller.filter(pl.col("stream_id") == 7)["other_ns"].item() == 199_895  # 5 is not under 5


def memory_trace() -> tuple[Trace, list[dict]]:
    """The shared profile_memory trace with its [memory] events as counter rows built here from the JSON."""
    path = SHARED / "resnet50_bs32_memory.json.gz"
    trace = read_torch(path)
    samples = []
    for e in raw(path.name):
        if e.get("name") != "[memory]":
            continue
        a = e["args"]
        device = a["Device Id"] if a["Device Type"] == 1 else None
        for name, key in (("allocated_bytes", "Total Allocated"), ("reserved_bytes", "Total Reserved")):
            samples.append({"kind": "counter", "name": name, "start_ns": us_to_ns(e["ts"]), "value": float(a[key]),
                            "unit": "byte", "device_id": device, "pid": e["pid"], "tid": e["tid"],
                            "_key": key})
    extra = conform(pl.DataFrame(samples).drop("_key"))
    both = pl.concat([trace.events.drop("event_id"), extra.drop("event_id")], how="vertical_relaxed")
    return Trace(both, trace.meta), samples


@needs_shared
def test_memory_peaks_match_the_json():
    trace, samples = memory_trace()
    f = run_rule(trace, "memory")
    gpu = [s for s in samples if s["device_id"] == 0]
    alloc = [s for s in gpu if s["name"] == "allocated_bytes"]
    peak = max(s["value"] for s in alloc)
    first = min(s["start_ns"] for s in alloc if s["value"] == peak)
    origin = min(s["start_ns"] for s in samples)
    device = next(i for i in f.items if i["device"] == "0")
    assert device["peak_allocated_bytes"] == int(peak) == 3_239_834_112
    assert device["peak_reserved_bytes"] == int(max(s["value"] for s in gpu if s["name"] == "reserved_bytes"))
    assert device["peak_ns"] == first - origin
    assert device["final_allocated_bytes"] == int(max(alloc, key=lambda s: s["start_ns"])["value"])
    # the step and the innermost operator running at the peak, from the JSON
    events = raw("resnet50_bs32_memory.json.gz")
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
             and e["name"].startswith("ProfilerStep#")
             and us_to_ns(e["ts"]) <= first < us_to_ns(e["ts"]) + us_to_ns(e["dur"])]
    assert device["step"] == int(steps[0]["name"].split("#")[1])
    peak_sample = next(s for s in alloc if s["start_ns"] == first)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["tid"] == peak_sample["tid"]
           and us_to_ns(e["ts"]) <= first < us_to_ns(e["ts"]) + us_to_ns(e["dur"])]
    assert device["op"] == max(ops, key=lambda e: (us_to_ns(e["ts"]), -us_to_ns(e["dur"])))["name"]
    assert len(device["timeline"]) == 40 and set(device["timeline"]) <= set("▁▂▃▄▅▆▇█")
    assert f.metrics["peak_allocated_bytes"] == 3_239_834_112 and f.severity == "info"

    assert run_rule(trace, "memory", "memory.reserved_warning_pct=5").severity == "warning"


def test_memory_rule_needs_memory_samples(tmp_path):
    trace = Trace(conform(pl.DataFrame([{"kind": "counter", "name": "sm__cycles", "value": 1.0, "start_ns": 0}])))
    from traceparse.plugins import registry
    assert not registry().rules["memory"].applies_to(trace)


def amd_trace(**device) -> Trace:
    return Trace(conform(pl.DataFrame([{"kind": "kernel", "name": "Cijk_Alik_Bljk_SB", "start_ns": 0,
                                        "duration_ns": 10, "device_id": 2}])),
                 TraceMeta(devices=[Device(id=2, name="AMD Radeon Graphics", **device)]))


@pytest.mark.parametrize(("sms", "memory", "cc", "expected"), [
    (104, 68_702_699_520, "9.0", "MI250 GCD"),      # the public HTA MI250 trace's deviceProperties
    (110, 68_702_699_520, "9.0", "MI250X GCD"),
    (304, 206_141_652_992, "9.4", "MI300X"),        # TraceLens' MI300X trace
    (304, 274_877_906_944, "9.4", "MI325X"),
    (60, 17_163_091_968, "10.3", None),             # a Radeon workstation card: not in the catalog
])
def test_amd_radeon_graphics_is_identified_by_its_properties(sms, memory, cc, expected):
    spec, how = gpu_for_trace(amd_trace(sm_count=sms, memory_bytes=memory, compute_capability=cc,
                                        extra={"warpSize": 64}))
    assert (spec["name"] if spec else None) == expected
    if expected:
        assert "identified" in how and f"{sms} compute units" in how


def test_a_warp_of_32_is_not_an_amd_instinct():
    spec, _ = gpu_for_trace(amd_trace(sm_count=104, memory_bytes=68_702_699_520, compute_capability="9.0",
                                      extra={"warpSize": 32}))
    assert spec is None


def test_arithmetic_intensity_answers_at_once_without_counts():
    """A million kernels and no counters: the rule says so in well under a second (it swept every kernel before)."""
    n = 1_000_000
    events = conform(pl.DataFrame({"kind": ["kernel"] * n, "name": ["k"] * n, "start_ns": range(0, 2 * n, 2),
                                   "duration_ns": [1] * n, "device_id": [0] * n}), trace_id="big")
    trace = Trace(events, TraceMeta(id="big"))
    t0 = time.perf_counter()
    f = run_rule(trace, "arithmetic-intensity")
    assert time.perf_counter() - t0 < 0.5
    assert f.title == "No FLOP or byte counts"


def test_launch_stats_on_a_kernel_table_alone_says_what_it_needs():
    """A kernel table without API calls (an nsys kernel summary) has no launches: the rule says it needs both."""
    from traceparse.analysis import analyze

    kernels = conform(pl.DataFrame({"kind": ["kernel", "kernel"], "name": ["k", "k"],
                                    "start_ns": [0, 100], "duration_ns": [10, 10]}))
    trace = Trace(kernels, TraceMeta(id="t"))
    [finding] = analyze(trace, rules=["launch-stats"])
    assert (finding.title, finding.message) == ("launch-stats: not applicable", "it needs kernel and api events")
    assert not [f for f in analyze(trace) if f.rule == "launch-stats"]  # by default it is skipped silently
