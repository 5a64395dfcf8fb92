"""Rules warn only when it matters: `analyze --fail-on warning` as a CI gate, low kernel concurrency judged by how
much of the GPU the kernels leave unused, hotspots imbalance among threads of one role.

Every expected figure is computed here from the raw trace JSON (Kineto's events, `deviceProperties` and
`thread_name` metadata), not taken from traceparse.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, run_cli, us_to_ns
from traceparse.analysis import analyze, parse_settings
from traceparse.ingest import read_paths
from traceparse.schema import conform
from traceparse.trace import Device, Trace, TraceMeta

SWEEP = FIXTURES / "torch_sweep2"
#: Healthy, compute-bound training steps (VGG16 at large batches on one H100: the GPU is busy most of the span,
#: the copies are a sliver of the kernel time): `--fail-on warning` must pass. Why each is healthy is checked
#: from the raw JSON in test_healthy_traces_are_healthy.
HEALTHY = [SWEEP / "vgg16_bs64.json.gz", SWEEP / "vgg16_bs128.json.gz", FIXTURES / "torch" / "vgg16_bs64.json.gz"]


def raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def slices(doc: dict, *cats: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() in cats]


def union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def gpu_figures(doc: dict) -> dict:
    """GPU busy and idle share of the span (kernels, copies, memsets of the one device), copy time / kernel busy."""
    gpu = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
           for e in slices(doc, "kernel", "gpu_memcpy", "gpu_memset")]
    span = max(e for _, e in gpu) - min(s for s, _ in gpu)
    kernels = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in slices(doc, "kernel")]
    copy_ns = sum(us_to_ns(e["dur"]) for e in slices(doc, "gpu_memcpy"))
    return {"idle_pct": 100 * (span - union_ns(gpu)) / span, "copy_share_pct": 100 * copy_ns / union_ns(kernels)}


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_healthy_traces_are_healthy(path):
    """Why these count as healthy: the GPU runs something during over 80% of the span, and copies (the input batch)
    take under 5% of the kernel busy time, so neither idle time nor exposed copies hold the step back."""
    figures = gpu_figures(raw(path))
    assert figures["idle_pct"] < 20 and figures["copy_share_pct"] < 5, figures


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fail_on_warning_passes_on_healthy_traces(path, store):
    code, out, err = run_cli("analyze", str(path), "--fail-on", "warning", "--json")
    assert code == 0, [(f["rule"], f["severity"], f["message"]) for f in json.loads(out)["findings"]
                       if f["severity"] != "info"]
    assert {f["severity"] for f in json.loads(out)["findings"]} == {"info"}


def test_fail_on_warning_fails_on_the_samples_real_problems(samples_dir, store):
    """The shared ResNet18 batch-16 samples: the GPU idles most of the span and the input copies (pageable) overlap
    no kernel; the gate fails, and it is those rules that fire."""
    torch_path = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    figures = gpu_figures(raw(torch_path))
    assert figures["idle_pct"] > 50 and figures["copy_share_pct"] > 5
    code, out, _ = run_cli("analyze", str(torch_path), "--fail-on", "warning", "--json")
    assert code == 1
    firing = {f["rule"]: f for f in json.loads(out)["findings"] if f["severity"] != "info"}
    assert firing["gpu-idle"]["severity"] == "critical"
    assert firing["gpu-idle"]["metrics"]["idle_pct"] == round(figures["idle_pct"], 4)
    assert firing["low-memcpy-overlap"]["severity"] == "critical"
    assert firing["low-memcpy-overlap"]["metrics"]["overlap_pct"] == 0.0
    # the calibrated rules stay quiet here: one stream of kernels that fill the GPU, backward on the autograd thread
    assert "low-kernel-concurrency" not in firing and "hotspots" not in firing
    # the nsys capture of the same work: same verdict
    code, out, _ = run_cli("analyze", str(samples_dir / "nsys" / "resnet18_bs16.sqlite.gz"), "--fail-on", "warning",
                           "--json")
    assert code == 1
    firing = {f["rule"]: f["severity"] for f in json.loads(out)["findings"] if f["severity"] != "info"}
    # the whole-process capture is 1.47 s: its 7.4 ms of exposed copies are under the 1% floor of a critical
    assert firing["gpu-idle"] == "critical" and firing["low-memcpy-overlap"] == "warning"
    assert "low-kernel-concurrency" not in firing and "hotspots" not in firing


# --- low-kernel-concurrency: how much of the SM time the kernels leave unused ---------------------------------


def underused_from_raw(doc: dict) -> tuple[int, int, int, int]:
    """(kernel time, idle SM time, kernels with fewer blocks than SMs, SMs) from the raw JSON, NCCL kernels left out."""
    sms = doc["deviceProperties"][0]["numSms"]
    total = idle = small = 0
    for e in slices(doc, "kernel"):
        if e["name"].lower().startswith("nccl"):
            continue
        d = us_to_ns(e["dur"])
        gx, gy, gz = e["args"]["grid"]
        blocks = gx * gy * gz
        total += d
        if blocks < sms:
            idle += d * (sms - blocks) // sms
            small += 1
    return total, idle, small, sms


@pytest.mark.parametrize("name", ["torch/torch_resnet18_bs16.json.gz", "torch/torch_resnet18_bs4.json.gz",
                                  "torch/dp2_alexnet_bs16.json.gz"])
def test_low_kernel_concurrency_underused_share_matches_the_raw_json(samples_dir, name):
    path = samples_dir / name
    total, idle, small, sms = underused_from_raw(raw(path))
    (f,) = analyze(read_paths([path])[0], rules=["low-kernel-concurrency"])
    assert (f.metrics["idle_sm_ns"], f.metrics["small_grid_kernels"], f.metrics["sm_count"]) == (idle, small, sms)
    assert f.metrics["short_kernel_ns"] == 0  # every kernel has its grid
    assert f.metrics["underused_pct"] == round(100 * idle / total, 4)
    # one stream (or two GPUs) of kernels that leave under 30% of the SM time unused: low concurrency is normal
    assert f.metrics["concurrency_pct"] < 5 and f.metrics["underused_pct"] < 30
    assert f.severity == "info" and "not a problem here" in f.message


def test_low_kernel_concurrency_quiet_on_every_sweep_trace():
    """Issue 11: it warned on all 32 traces of the batch-size sweep, where one stream is normal."""
    paths = sorted(SWEEP.glob("*.json.gz"))
    assert len(paths) == 32
    for path in paths:
        total, idle, _, _ = underused_from_raw(raw(path))
        (f,) = analyze(read_paths([path])[0], rules=["low-kernel-concurrency"])
        assert f.metrics["underused_pct"] == round(100 * idle / total, 4), path.name
        assert f.severity == "info", (path.name, f.message)


def kernel(name, start, end, grid=None, stream=7, device=0):
    row = {"kind": "kernel", "name": name, "device_id": device, "stream_id": stream, "start_ns": start,
           "duration_ns": end - start}
    if grid is not None:
        row.update(grid_x=grid, grid_y=1, grid_z=1)
    return row


def synthetic(rows: list[dict], sm_count: int | None = 100) -> Trace:
    meta = TraceMeta(id="s", devices=[Device(id=0, sm_count=sm_count)] if sm_count else [])
    return Trace(conform(pl.DataFrame(rows, infer_schema_length=None), trace_id="s"), meta)


def lkc(trace: Trace, *settings: str):
    (f,) = analyze(trace, rules=["low-kernel-concurrency"], settings=parse_settings(list(settings)))
    return f


def test_low_kernel_concurrency_warns_on_small_grids_one_at_a_time():
    # one stream; 100 SMs. Two 10-block kernels of 20 us leave 90% of the SMs idle: 2 × 18000 ns;
    # one 400-block kernel of 60 us fills them; a NCCL kernel of 2 blocks is left out (comm-compute-overlap's)
    rows = [kernel("small_a", 0, 20_000, grid=10), kernel("small_b", 20_000, 40_000, grid=10),
            kernel("big", 40_000, 100_000, grid=400), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100_000,
                                                             500_000, grid=2)]
    f = lkc(synthetic(rows))
    assert (f.metrics["idle_sm_ns"], f.metrics["small_grid_kernels"], f.metrics["sm_count"]) == (36_000, 2, 100)
    assert f.metrics["underused_pct"] == round(100 * 36_000 / 100_000, 4) == 36.0
    assert f.severity == "warning" and f.title == "Low kernel concurrency"
    assert "36.0% of the SM time unused (2 kernels have fewer blocks than the 100 SMs)" in f.message
    assert lkc(synthetic(rows), "low-kernel-concurrency.warning_underused_pct=40").severity == "info"
    # the SM count from the threshold wins over the trace's: with 20 SMs the 10-block kernels leave half of them
    f = lkc(synthetic(rows), "low-kernel-concurrency.sm_count=20")
    assert (f.metrics["sm_count"], f.metrics["idle_sm_ns"], f.metrics["underused_pct"]) == (20, 20_000, 20.0)
    assert f.severity == "info"


def test_low_kernel_concurrency_quiet_for_one_stream_of_large_kernels_and_one_kernel():
    rows = [kernel(f"conv{i}", i * 100_000, (i + 1) * 100_000, grid=264) for i in range(5)]
    f = lkc(synthetic(rows))
    assert (f.metrics["concurrency_pct"], f.metrics["underused_pct"], f.metrics["idle_sm_ns"]) == (0.0, 0.0, 0)
    assert f.severity == "info" and "not a problem here" in f.message
    # a single kernel, however small, has nothing to overlap with
    f = lkc(synthetic([kernel("only", 0, 3_000, grid=1)]))
    assert f.metrics["underused_pct"] == 99.0 and f.severity == "info"
    assert "One kernel cannot overlap another." in f.message


def test_low_kernel_concurrency_without_grids_counts_short_kernels():
    # no grid and no SM count (an nvprof-style log): kernels under short_kernel_us (10) count whole
    rows = [kernel("tiny", 0, 4_000), kernel("tiny", 4_000, 9_000), kernel("long", 9_000, 29_000)]
    f = lkc(synthetic(rows, sm_count=None))
    assert (f.metrics["short_kernel_ns"], f.metrics["idle_sm_ns"], f.metrics["sm_count"]) == (9_000, 0, None)
    assert f.metrics["underused_pct"] == round(100 * 9_000 / 29_000, 4) and f.severity == "warning"
    f = lkc(synthetic(rows, sm_count=None), "low-kernel-concurrency.short_kernel_us=4.5")
    assert (f.metrics["short_kernel_ns"], f.metrics["underused_pct"], f.severity) == (4_000, round(400 / 29, 4), "info")


# --- hotspots: imbalance among peers, threads as pid/tid (name) --------------------------------------------------


def thread_names_from_raw(doc: dict) -> dict[tuple[int, int], str]:
    names = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name" and not e["args"]["name"].startswith("stream"):
            label = e["args"]["name"]
            names[(e["pid"], e["tid"])] = label[label.index("(") + 1:label.rindex(")")]
    return names


def test_hotspots_compares_main_and_autograd_threads_only_with_their_peers(samples_dir):
    path = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    doc = raw(path)
    names = thread_names_from_raw(doc)
    assert sorted(names.values()) == ["pt_autograd_0", "python3"]
    per_thread = defaultdict(int)
    for e in slices(doc, "cuda_runtime"):
        if e["name"] == "cudaLaunchKernel":  # a leaf: its self time is its duration
            per_thread[(e["pid"], e["tid"])] += us_to_ns(e["dur"])
    assert len(per_thread) == 2  # main thread (forward) and autograd thread (backward)
    findings = analyze(read_paths([path])[0], rules=["hotspots"])
    agg = next(f for f in findings if f.title.startswith("Hotspots:"))
    launch = next(i for i in agg.items if i["name"] == "cudaLaunchKernel")
    # each thread is its role's only peer: max/mean 1 for both; the figures are those of the role with more time
    assert (launch["time_ns"], launch["threads"], launch["peers"], launch["imbalance"]) == (
        sum(per_thread.values()), 2, 1, 1.0)
    assert launch["max_ns"] == launch["min_ns"] == launch["mean_ns"] == max(per_thread.values())
    # aten::convolution_backward runs on the autograd thread only, by design: not an imbalance (it was 2.0)
    backward = next(i for i in agg.items if i["name"] == "aten::convolution_backward")
    assert (backward["threads"], backward["peers"], backward["imbalance"]) == (1, 1, 1.0)
    assert agg.severity == "info" and agg.metrics["thread_roles"] == ["gpu", "main", "pt_autograd"]
    # threads on screen as pid/tid (name), the raw fields kept in the JSON items
    per = next(f for f in findings if f.title == "Hotspots per thread")
    host = {(i["pid"], i["tid"]): (i["thread"], i["thread_name"]) for i in per.items if i["tid"] is not None}
    assert host == {key: (f"{key[0]}/{key[1]} ({name})", name) for key, name in names.items()}
    assert {i["thread"] for i in per.items if i["tid"] is None} == {"GPU 0"}


def test_hotspots_imbalance_among_autograd_peers():
    # one process (pid 50): its main thread 50 runs the forward, two autograd threads (one per GPU) the backward.
    # The backward is 900 on pt_autograd_0 and 300 on pt_autograd_1: among the 2 autograd peers mean 600,
    # max/mean 1.5; the forward (main thread only) has one peer: 1.0
    rows = pl.DataFrame({
        "kind": ["op"] * 4, "name": ["aten::conv", "aten::conv_backward", "aten::conv_backward", "aten::add"],
        "start_ns": [0, 1000, 1000, 5000], "duration_ns": [500, 900, 300, 10],
        "pid": [50, 50, 50, 50], "tid": [50, 61, 62, 50],
    })
    meta = TraceMeta(id="t", extra={"thread_names": {"50/50": "python3", "50/61": "pt_autograd_0",
                                                     "50/62": "pt_autograd_1"}})
    trace = Trace(conform(rows, trace_id="t"), meta)

    def run(*settings):
        findings = analyze(trace, rules=["hotspots"], settings=parse_settings(list(settings)))
        return next(f for f in findings if f.title.startswith("Hotspots:")), findings[1]

    agg, per = run()
    backward = agg.items[0]
    assert (backward["name"], backward["time_ns"], backward["threads"], backward["peers"]) == (
        "aten::conv_backward", 1200, 2, 2)
    assert (backward["mean_ns"], backward["min_ns"], backward["max_ns"], backward["imbalance"]) == (600.0, 300, 900, 1.5)
    forward = agg.items[1]
    assert (forward["name"], forward["peers"], forward["imbalance"]) == ("aten::conv", 1, 1.0)
    assert agg.severity == "info"  # 1.5 < 2.0
    assert run("hotspots.imbalance_warning=1.5")[0].severity == "warning"
    assert sorted({i["thread"] for i in per.items}) == ["50/50 (python3)", "50/61 (pt_autograd_0)",
                                                        "50/62 (pt_autograd_1)"]


def test_nsys_sqlite_thread_names_match_the_export(samples_dir, tmp_path):
    import shutil
    import sqlite3

    path = samples_dir / "nsys" / "resnet18_bs16.sqlite.gz"
    db_path = tmp_path / "r.sqlite"
    with gzip.open(path, "rb") as src, db_path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(db_path)
    callers = {g for (g,) in db.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    want = {f"{(g >> 24) & 0xFFFFFF}/{g & 0xFFFFFF}": name for g, name in db.execute(
        "SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId") if g in callers}
    db.close()
    assert sorted(want.values()) == ["pt_autograd_0", "python3"]
    trace = read_paths([path])[0]
    assert trace.meta.extra["thread_names"] == want
    keys = list(trace.meta.extra["thread_names"])  # in (pid, tid) order: the stored metadata the same each ingest
    assert keys == sorted(keys, key=lambda k: tuple(map(int, k.split("/"))))
    per = next(f for f in analyze(trace, rules=["hotspots"]) if f.title == "Hotspots per thread")
    labels = {i["thread"] for i in per.items if i["tid"] is not None}
    assert labels == {f"{key} ({name})" for key, name in want.items()}


def run_rule(rows: list[dict], rule: str, *settings: str):
    trace = Trace(conform(pl.DataFrame(rows, infer_schema_length=None), trace_id="s"), TraceMeta(id="s"))
    (f,) = analyze(trace, rules=[rule], settings=parse_settings(list(settings)))
    return f


def test_gpu_idle_warns_on_one_gap_of_half_a_second():
    # 100 kernels of 1 s back to back, then one gap of 600 ms, then one more: 0.59% idle, under the 25% warning,
    # but one gap at least nsys gpu_gaps' 500 ms
    rows = [kernel("k", i * 1_000_000_000, (i + 1) * 1_000_000_000) for i in range(100)]
    rows.append(kernel("k", 100_600_000_000, 101_600_000_000))
    f = run_rule(rows, "gpu-idle")
    assert (f.metrics["idle_ns"], f.metrics["gaps"]) == (600_000_000, 1)
    assert f.metrics["idle_pct"] == round(100 * 0.6 / 101.6, 4)
    assert f.severity == "warning"
    assert run_rule(rows, "gpu-idle", "gpu-idle.warning_gap_ms=600.1").severity == "info"


def test_inefficient_memcpy_size_needs_time_at_stake():
    # 15 HtoD copies of 4 KiB, 3 us each: all small, 100% of the copy time, but 45 us in all
    rows = [{"kind": "memcpy", "name": "Memcpy HtoD", "device_id": 0, "copy_kind": "HtoD", "bytes": 4096,
             "start_ns": i * 10_000, "duration_ns": 3_000} for i in range(15)]
    f = run_rule(rows, "inefficient-memcpy-size")
    assert (f.metrics["small_copies"], f.metrics["small_copy_time_ns"], f.metrics["small_copy_share_pct"]) == (
        15, 45_000, 100.0)
    assert f.severity == "info"
    assert run_rule(rows, "inefficient-memcpy-size", "inefficient-memcpy-size.min_small_time_us=45").severity == \
        "critical"


@pytest.mark.parametrize("export", ["resnet18_bs8_export.parquetdir", "resnet18_bs8_export.arrowdir"])
def test_nsys_export_thread_names_are_the_sqlite_ones_in_order(export):
    """The Parquet and Arrow exports name the same threads as the SQLite export of the same report, in (pid, tid)
    order whatever order polars' join gives the rows in."""
    want = read_paths([FIXTURES / "nsys" / "export" / "resnet18_bs8_export.sqlite.gz"])[0].meta.extra["thread_names"]
    got = read_paths([FIXTURES / "nsys" / "export" / export])[0].meta.extra["thread_names"]
    assert list(got.items()) == list(want.items()) and len(want) == 2
