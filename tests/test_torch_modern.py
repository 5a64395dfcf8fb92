"""The torch reader on today's traces (issues 12 and 17), each figure against an independent parse of the raw JSON.

- several GPUs in one process (DataParallel): peer-to-peer copies keep their devices, no GPU row lands on a
  null device, gpu-idle reports per-device spans equal to ones computed here;
- ``profile_memory=True``: the ``[memory]`` events as counter rows, peaks per device;
- CUDA graphs: replayed kernels keep the correlation id of their ``cudaGraphLaunch``;
- ROCm builds: the public MI250/MI300X/MI210 traces in fixtures/torch/rocm ingest, counts match, and the one
  coercion warning names each field and its count.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from traceparse.figures import fmt_ns

from helpers import FIXTURES, run_rule, us_to_ns
from traceparse.ingest import read_paths

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
ROCM = sorted((FIXTURES / "torch" / "rocm").glob("*.json.gz"))


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


# -- several GPUs in one process ----------------------------------------------------------------------------
def independent_device_spans(events: list[dict]) -> dict[int, dict]:
    """Per device: span and busy (union of intervals) of its kernels, copies and memsets, from the raw JSON."""
    intervals: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATS:
            continue
        args = e["args"]
        device = args["device"] if "device" in args else args["inDevice"]
        assert device == e["pid"]  # Kineto's convention: a GPU event's pid is the device that runs it
        start = us_to_ns(e["ts"])
        intervals[device].append((start, start + us_to_ns(e["dur"])))
    out = {}
    for device, spans in intervals.items():
        spans.sort()
        busy, cur_start, cur_end = 0, *spans[0]
        for start, end in spans[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        busy += cur_end - cur_start
        span = max(e for _, e in spans) - min(s for s, _ in spans)
        out[device] = {"span_ns": span, "busy_ns": busy, "idle_ns": span - busy}
    return out


@pytest.mark.parametrize("name", ["dp2_resnet18_bs16", "dp2_alexnet_bs16"])
def test_two_gpus_in_one_process(samples_dir, name):
    path = samples_dir / "torch" / f"{name}.json.gz"
    events = raw_events(path)
    trace = read_paths([path])[0]
    ev = trace.events
    gpu = ev.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
    assert gpu["device_id"].null_count() == 0
    assert sorted(gpu["device_id"].unique().to_list()) == [0, 1]
    # peer-to-peer copies: run on inDevice, from fromDevice to toDevice, as written
    raw_p2p = [(us_to_ns(e["ts"]), e["args"]["inDevice"], e["args"]["fromDevice"], e["args"]["toDevice"])
               for e in events if e.get("cat") == "gpu_memcpy" and "inDevice" in e.get("args", {})]
    assert len(raw_p2p) == 6
    p2p = ev.filter(pl.col("src_device").is_not_null() | pl.col("dst_device").is_not_null())
    assert sorted(p2p.select("start_ns", "device_id", "src_device", "dst_device").rows()) == sorted(raw_p2p)
    assert set(p2p["copy_kind"].cast(str)) == {"PtoP"}
    # gpu-idle: exactly the two devices, each span and busy time as computed from the raw JSON
    expected = independent_device_spans(events)
    finding = run_rule(trace, "gpu-idle")
    devices = finding.metrics["devices"]
    assert set(devices) == {"0", "1"}
    for device, figures in expected.items():
        got = devices[str(device)]
        assert {k: got[k] for k in figures} == figures, device
    assert finding.metrics["span_ns"] == sum(f["span_ns"] for f in expected.values())
    spans = [f["span_ns"] for f in expected.values()]
    idle = finding.metrics["idle_ns"]
    assert finding.message.startswith(f"The 2 GPUs ran nothing for {finding.metrics['idle_pct']:.1f}% of their time")
    assert f"({fmt_ns(idle / 2)} of {fmt_ns(sum(spans) / 2)} a GPU on average)" in finding.message


def test_gpu_annotations_are_on_their_device(samples_dir):
    """gpu_user_annotation rows have no args.device: their pid, the device, is taken."""
    path = samples_dir / "torch" / "dp2_resnet18_bs16.json.gz"
    raw = Counter(e["pid"] for e in raw_events(path) if e.get("cat") == "gpu_user_annotation" and e.get("ph") == "X")
    ev = read_paths([path])[0].events
    got = ev.filter((pl.col("kind") == "marker") & pl.col("device_id").is_not_null())
    assert Counter(got["device_id"].to_list()) == raw


# -- memory ---------------------------------------------------------------------------------------------------
def test_memory_events_are_counters(samples_dir):
    path = samples_dir / "torch" / "resnet50_bs32_memory.json.gz"
    memory = [e for e in raw_events(path) if e.get("name") == "[memory]"]
    assert memory
    ev = read_paths([path])[0].events
    counters = ev.filter(pl.col("kind") == "counter")
    assert counters.height == 3 * len(memory)
    assert set(counters["unit"]) == {"byte"}
    assert counters["duration_ns"].null_count() == counters.height

    def device(e):
        return None if e["args"]["Device Type"] == 0 else e["args"]["Device Id"]

    for name, key in (("allocated_bytes", "Total Allocated"), ("reserved_bytes", "Total Reserved"),
                      ("allocation_bytes", "Bytes")):
        rows = counters.filter(pl.col("name") == name)
        assert rows["start_ns"].to_list() == [us_to_ns(e["ts"]) for e in memory]
        assert rows["value"].to_list() == [float(e["args"][key]) for e in memory]
        assert rows["device_id"].to_list() == [device(e) for e in memory]
        # peak per device (None: host memory)
        peaks: dict = {}
        for e in memory:
            peaks[device(e)] = max(peaks.get(device(e), -1), e["args"][key])
        got = dict(rows.group_by("device_id").agg(pl.col("value").max()).iter_rows())
        assert got == {d: float(v) for d, v in peaks.items()}, name
    peak_gpu = counters.filter((pl.col("name") == "allocated_bytes") & (pl.col("device_id") == 0))["value"].max()
    assert peak_gpu == max(e["args"]["Total Allocated"] for e in memory if device(e) == 0)
    assert peak_gpu > 1e9  # ResNet50 at batch 32 holds gigabytes of activations


# -- CUDA graphs ----------------------------------------------------------------------------------------------
def test_graph_kernels_keep_their_launch_correlation(samples_dir):
    path = samples_dir / "torch" / "resnet18_bs32_compiled_cudagraphs.json.gz"
    events = raw_events(path)
    launches = {e["args"]["correlation"] for e in events if e.get("name") == "cudaGraphLaunch"}
    raw = Counter(GPU_CATS[e["cat"]] for e in events
                  if e.get("cat") in GPU_CATS and e["args"].get("correlation") in launches)
    assert raw["kernel"] > 800
    ev = read_paths([path])[0].events
    graph_launch = ev.filter((pl.col("kind") == "api") & (pl.col("name") == "cudaGraphLaunch"))
    assert set(graph_launch["correlation_id"]) == launches
    replayed = ev.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"])).join(
        graph_launch.select("correlation_id"), on="correlation_id")
    assert dict(Counter(replayed["kind"].cast(str))) == dict(raw)


# -- ROCm -----------------------------------------------------------------------------------------------------
INT_ARGS = ("External id", "external id", "correlation", "device", "context", "stream", "bytes",
            "registers per thread", "shared memory", "inDevice", "fromDevice", "toDevice",
            "Bytes", "Total Allocated", "Total Reserved", "Device Id", "Device Type")
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_runtime": "api",
         "cuda_driver": "api", "cpu_op": "op", "user_annotation": "marker", "gpu_user_annotation": "marker",
         "python_function": "region"}


def test_rocm_fixtures_are_the_copied_files():
    assert [p.name for p in ROCM] == ["hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                      "tracelens_mi210_gpu_only.json.gz",
                                      "tracelens_mi300x_torch_compile_triton.json.gz",
                                      "tracelens_mi300x_vf_bert_small.json.gz"]
    assert sum(p.stat().st_size for p in ROCM) < 3_000_000
    assert "MIT License" in (FIXTURES / "torch" / "rocm" / "LICENSES.md").read_text()


@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_rocm_traces_read_like_cuda_ones(path):
    events = raw_events(path)
    kept = [e for e in events if e.get("ph") == "X" and e.get("cat") in KINDS]
    memory = [e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"]
    trace = read_paths([path])[0]
    ev = trace.events
    assert trace.meta.format == "torch"
    got = dict(ev.group_by("kind").len().with_columns(pl.col("kind").cast(str)).iter_rows())
    expected = Counter(KINDS[e["cat"]] for e in kept)
    if memory:
        expected["counter"] = 3 * len(memory)
    assert got == dict(expected)
    # kernels and runtime calls, one by one, in file order
    for cat, kind in (("kernel", "kernel"), ("cuda_runtime", "api")):
        rows = ev.filter(pl.col("kind") == kind)
        raw = [e for e in kept if e["cat"] == cat]
        assert rows["name"].to_list() == [e["name"] for e in raw]
        assert rows["start_ns"].to_list() == [us_to_ns(e["ts"]) for e in raw]
        assert rows["correlation_id"].to_list() == [e["args"].get("correlation") for e in raw]
    # devices as written: the kernels' args.device (device 2 on the MI250, 3 on the MI210)
    kernels = [e for e in kept if e["cat"] == "kernel"]
    assert ev.filter(pl.col("kind") == "kernel")["device_id"].to_list() == [e["args"]["device"] for e in kernels]
    # every kernel is linked to the HIP call that launched it
    launches = {e["args"]["correlation"]: e["name"] for e in kept if e["cat"] == "cuda_runtime"}
    assert all(launches[e["args"]["correlation"]].startswith("hip") for e in kernels)
    device = trace.meta.devices[0]
    assert device.extra["warpSize"] == 64 and device.sm_count in (104, 304)
    assert trace.meta.extra["backend"] == "rocm"
    # one warning, naming each coerced field and its count, counted here independently
    coerced = Counter()
    for e in events:
        for key, value in (e.get("args") or {}).items():
            if key in INT_ARGS and isinstance(value, str):
                coerced[key] += 1
    notes = [w for w in trace.meta.warnings if "not written as JSON integers" in w]
    if not coerced:
        assert notes == []
        return
    assert len(notes) == 1, trace.meta.warnings
    for key, n in coerced.items():
        assert f"args.{key} {n}× text read as an integer" in notes[0]
    assert notes[0].startswith(f"{path}: {sum(coerced.values())} argument value")


def test_rocm_stream_strings_are_read_as_integers():
    path = FIXTURES / "torch" / "rocm" / "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    raw = [e for e in raw_events(path) if e.get("cat") == "cuda_runtime"]
    assert Counter(type(e["args"].get("stream")).__name__ for e in raw) == {"str": 16, "NoneType": 5}
    ev = read_paths([path])[0].events.filter(pl.col("kind") == "api")
    assert ev["stream_id"].to_list() == [None if "stream" not in e["args"] else int(e["args"]["stream"], 16)
                                         for e in raw]
    device = read_paths([path])[0].meta.devices[0]
    assert (device.name, device.sm_count, device.compute_capability) == ("AMD Radeon Graphics", 104, "9.0")


def test_coercion_counts_odd_values(tmp_path):
    """Text, whole floats, hex, non-integers and out-of-range values: coerced or left empty, one warning."""
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": {"correlation": "7", "stream": "0x1f", "External id": 3.0}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 0, "ts": 2, "dur": 1,
         "args": {"correlation": 7, "device": 1.5, "stream": 0, "bytes": 2 ** 64 - 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 0, "ts": 3, "dur": 1,
         "args": {"correlation": "x7", "device": "٣", "stream": 0}},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}))
    trace = read_paths([path])[0]
    ev = trace.events
    assert ev["correlation_id"].to_list() == [7, 7, None]
    assert ev["stream_id"].to_list() == [31, 0, 0]
    assert ev["external_id"].to_list() == [3, None, None]
    assert ev["bytes"].to_list() == [None, None, None]
    assert ev["device_id"].to_list() == [None, 0, 0]  # not an integer: the pid, the device Kineto writes
    (note,) = [w for w in trace.meta.warnings if "JSON integers" in w]
    for part in ("args.correlation 1× text read as an integer", "args.correlation 1× not an integer, left empty",
                 "args.stream 1× text read as an integer", "args.External id 1× whole float read as an integer",
                 "args.device 2× not an integer, left empty", "args.bytes 1× out of the column's range, left empty"):
        assert part in note, note
