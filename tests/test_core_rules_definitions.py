"""The three core rules compute exactly their written definitions, on synthetic multi-device tables.

Every expected figure below is worked out by hand in the comments from the
definitions in the rules' module docstrings (plugins/rules/low_memcpy_overlap.py,
low_kernel_concurrency.py, kernel_share.py). Intervals are half-open [start, end).
"""

from __future__ import annotations

import polars as pl

from traceparse.analysis import analyze, parse_settings
from traceparse.schema import conform
from traceparse.trace import Trace, TraceMeta


def synthetic(rows: list[dict]) -> Trace:
    df = pl.DataFrame(rows, infer_schema_length=None)
    if "calls" in df.columns:
        df = df.with_columns(pl.col("calls").fill_null(1))
    return Trace(conform(df, trace_id="synthetic"), TraceMeta(id="synthetic"))


def run(trace: Trace, rule: str, *settings: str):
    (finding,) = analyze(trace, rules=[rule], settings=parse_settings(list(settings)))
    return finding


def kernel(name, device, start, end, stream=7):
    return {"kind": "kernel", "name": name, "device_id": device, "stream_id": stream,
            "start_ns": start, "duration_ns": end - start}


def memcpy(device, start, end, kind="HtoD"):
    return {"kind": "memcpy", "name": f"Memcpy {kind}", "device_id": device, "copy_kind": kind,
            "start_ns": start, "duration_ns": end - start, "bytes": 1000}


def test_low_memcpy_overlap_definition():
    rows = [
        # device 0: kernels [0,100) and [50,150) overlap partially: their union is [0,150)
        kernel("k1", 0, 0, 100), kernel("k2", 0, 50, 150),
        memcpy(0, 120, 220),            # |[120,220) ∩ [0,150)| = 30
        memcpy(0, 140, 160),            # overlaps the other copy too; |[140,160) ∩ [0,150)| = 10
        # device 1: kernels [0,100) and [300,400); device 0's kernels must not count here
        kernel("k3", 1, 0, 100), kernel("k4", 1, 300, 400),
        memcpy(1, 50, 350, "DtoH"),     # 50 with k3 + 50 with k4 = 100
        memcpy(1, 1000, 1100, "DtoH"),  # no kernel: 0
        # an aggregated copy row has no start: not counted
        {"kind": "memcpy", "name": "[CUDA memcpy HtoD]", "copy_kind": "HtoD", "calls": 9, "duration_ns": 999},
    ]
    f = run(synthetic(rows), "low-memcpy-overlap")
    # memcpy time = 100 + 20 + 300 + 100 = 520; overlapped = 30 + 10 + 100 + 0 = 140
    assert f.metrics["memcpy_time_ns"] == 520
    assert f.metrics["overlapped_ns"] == 140
    assert f.metrics["overlap_pct"] == round(100 * 140 / 520, 4)
    assert f.metrics["devices"] == {
        "0": {"copies": 2, "memcpy_time_ns": 120, "overlapped_ns": 40, "overlap_pct": round(100 * 40 / 120, 4)},
        "1": {"copies": 2, "memcpy_time_ns": 400, "overlapped_ns": 100, "overlap_pct": 25.0},
    }
    # kernel busy time: device 0 150, device 1 200; copies take 520 / 350 of it
    assert f.metrics["memcpy_to_kernel_ratio"] == 520 / 350  # unrounded: the sentence gives it to 4 figures
    assert f.severity == "warning"  # 26.9% < 50%, > 10%
    assert run(synthetic(rows), "low-memcpy-overlap", "low-memcpy-overlap.warning_below_pct=20").severity == "info"


def test_low_memcpy_overlap_touching_is_not_overlap():
    rows = [kernel("k", 0, 0, 100), memcpy(0, 100, 200), memcpy(0, 300, 400), kernel("k", 0, 400, 500)]
    f = run(synthetic(rows), "low-memcpy-overlap")
    assert (f.metrics["memcpy_time_ns"], f.metrics["overlapped_ns"], f.metrics["overlap_pct"]) == (200, 0, 0.0)


def test_low_kernel_concurrency_definition():
    rows = [
        # device 0: three overlapping kernels, then one touching the last of them
        kernel("a", 0, 0, 100, stream=7), kernel("b", 0, 50, 150, stream=8), kernel("c", 0, 80, 120, stream=9),
        kernel("d", 0, 150, 200, stream=7),
        # depth: [0,50) 1, [50,80) 2, [80,100) 3, [100,120) 2, [120,150) 1, [150,200) 1
        # -> busy 200, concurrent (depth >= 2) 30 + 20 + 20 = 70, max 3
        # device 1: two touching kernels at the same times as device 0's: not concurrent with anything
        kernel("e", 1, 0, 100), kernel("f", 1, 100, 200),
        # an aggregated kernel row: no start, not counted
        {"kind": "kernel", "name": "g", "device_id": 0, "calls": 3, "duration_ns": 500},
    ]
    f = run(synthetic(rows), "low-kernel-concurrency")
    assert f.metrics["kernel_busy_ns"] == 400
    assert f.metrics["concurrent_ns"] == 70
    assert f.metrics["concurrency_pct"] == 17.5
    # no grid and no SM count: every kernel is judged by its length, all under 10 us, so all their time is unused
    assert f.metrics["devices"] == {
        "0": {"kernels": 4, "streams": 3, "kernel_busy_ns": 200, "concurrent_ns": 70, "concurrency_pct": 35.0,
              "max_concurrent": 3, "underused_pct": 100.0},
        "1": {"kernels": 2, "streams": 1, "kernel_busy_ns": 200, "concurrent_ns": 0, "concurrency_pct": 0.0,
              "max_concurrent": 1, "underused_pct": 100.0},
    }
    assert (f.metrics["underused_pct"], f.metrics["short_kernel_ns"], f.metrics["sm_count"]) == (100.0, 490, None)
    assert f.severity == "info"  # 17.5% >= 5%
    f = run(synthetic(rows), "low-kernel-concurrency", "low-kernel-concurrency.warning_below_pct=20")
    assert f.severity == "warning"


def test_low_kernel_concurrency_touching_kernels_are_not_concurrent():
    rows = [kernel("a", 0, 0, 10), kernel("b", 0, 10, 20, stream=8), kernel("c", 0, 20, 30, stream=9)]
    f = run(synthetic(rows), "low-kernel-concurrency")
    assert (f.metrics["kernel_busy_ns"], f.metrics["concurrent_ns"], f.metrics["concurrency_pct"]) == (30, 0, 0.0)
    assert f.metrics["devices"]["0"]["max_concurrent"] == 1


def test_kernel_share_definition():
    rows = [
        kernel("sgemm_128x64_nn", 0, 0, 30), kernel("sgemm_128x64_nn", 1, 0, 50),   # 2 calls, 80 ns
        kernel("relu_kernel", 0, 100, 120),                                           # 1 call, 20 ns
        kernel("ncclAllReduceRingLLKernel", 1, 100, 150),                             # 1 call, 50 ns
        # an aggregated row (nvprof summary) counts with its totals: 5 calls, 100 ns
        {"kind": "kernel", "name": "softmax_warp_forward", "calls": 5, "duration_ns": 100},
        # other GPU activity: memcpy 30 + memset 20
        memcpy(0, 200, 230),
        {"kind": "memset", "name": "Memset", "device_id": 0, "start_ns": 300, "duration_ns": 20},
        {"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 1000},  # not GPU time
    ]
    f = run(synthetic(rows), "kernel-share")
    # kernel time 250, GPU time 300
    assert (f.metrics["kernel_time_ns"], f.metrics["gpu_time_ns"], f.metrics["kernels"], f.metrics["calls"]) == \
        (250, 300, 4, 9)
    assert f.items == [
        {"name": "softmax_warp_forward", "category": "reduction/softmax", "calls": 5, "time_ns": 100,
         "share_pct": 40.0, "shown_pct": 40.0, "gpu_share_pct": round(100 * 100 / 300, 4)},
        {"name": "sgemm_128x64_nn", "category": "gemm", "calls": 2, "time_ns": 80,
         "share_pct": 32.0, "shown_pct": 32.0, "gpu_share_pct": round(100 * 80 / 300, 4)},
        {"name": "ncclAllReduceRingLLKernel", "category": "communication", "calls": 1, "time_ns": 50,
         "share_pct": 20.0, "shown_pct": 20.0, "gpu_share_pct": round(100 * 50 / 300, 4)},
        {"name": "relu_kernel", "category": "elementwise", "calls": 1, "time_ns": 20,
         "share_pct": 8.0, "shown_pct": 8.0, "gpu_share_pct": round(100 * 20 / 300, 4)},
    ]
    assert f.metrics["categories"] == {
        "reduction/softmax": {"calls": 5, "time_ns": 100, "kernels": 1, "share_pct": 40.0},
        "gemm": {"calls": 2, "time_ns": 80, "kernels": 1, "share_pct": 32.0},
        "communication": {"calls": 1, "time_ns": 50, "kernels": 1, "share_pct": 20.0},
        "elementwise": {"calls": 1, "time_ns": 20, "kernels": 1, "share_pct": 8.0},
    }
    assert f.severity == "info"
    assert run(synthetic(rows), "kernel-share", "kernel-share.dominant_kernel_pct=39").severity == "warning"
    assert len(run(synthetic(rows), "kernel-share", "kernel-share.top=2").items) == 2


def test_a_device_of_no_id_is_named_the_same_in_every_table():
    """Hand-written, as nvprof's GPU-trace text reads (no device column): the device tables of
    low-memcpy-overlap and low-kernel-concurrency name it ``?``, as gpu-idle's does (they wrote ``None``)."""
    trace = synthetic([kernel("k", None, 0, 100), kernel("k", None, 150, 300), memcpy(None, 90, 160)])
    for rule in ("low-memcpy-overlap", "low-kernel-concurrency", "gpu-idle"):
        assert list(run(trace, rule).metrics["devices"]) == ["?"], rule
