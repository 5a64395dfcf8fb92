"""The torch.profiler reader against an independent parse of the same files (json + Decimal)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import polars as pl

from helpers import FIXTURES, us_to_ns as ns
from traceparse.ingest import read_paths

KIND_OF = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_runtime": "api",
           "cuda_driver": "api", "cpu_op": "op", "user_annotation": "marker", "gpu_user_annotation": "marker",
           "python_function": "region", "cuda_sync": "sync",
           # PyTorch 1.8's pre-release names (fixtures/torch/kineto): Operator, Runtime, Memcpy, Memset
           "operator": "op", "runtime": "api", "memcpy": "memcpy", "memset": "memset"}


def independent(path: Path) -> list[dict]:
    """The X events traceparse keeps, parsed with the json module; times exact via Decimal."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc  # PyTorch 1.8's pre-release: a bare array
    return [e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() in KIND_OF]


def test_shared_samples_match_independent_parse(samples_dir):
    for path in sorted((samples_dir / "torch").glob("*.json.gz")):
        check_against_independent(path)


def test_fixture_traces_match_independent_parse(fixtures_dir):
    not_traces = ("manifest.json", "ddp4_step_times.json", "fsdp2_step_times.json",  # what made them, not traces
                  "fsdp4_step_times.json", "pp2_step_times.json", "pp2_1f1b_step_times.json",
                  "et_versions.json", "versions.json", "amp_accum_skipped.json", "fp8_scaled_mm_made.json",
                  "gemm_precisions_made.json", "moe_grouped_mm_made.json", "pp4_gloo_step_times.json",
                  "dp2pp2_gloo_step_times.json", "dp2pp4_gloo_step_times.json",
                  "tp2dp2_gloo_step_times.json", "fsdp4_gloo_step_times.json",
                  "tp2_nccl_step_times.json")
    paths = sorted(p for p in (fixtures_dir / "torch").glob("**/*.json*")
                   if p.name not in not_traces and not p.name.endswith("_et.json.gz")  # execution traces
                   and p.name != "megatron_et_0.json.gz"
                   and not p.name.endswith("_steps.json")  # sweep 18's measured step times
                   and "rocm" not in p.parts  # ROCm: tests/test_torch_modern.py
                   and p.name != "different_priority_streams.json.gz")  # no JSON: refused (test_hostile_json.py)
    # the 15-trace sweep, one tensorboard_trace_handler file, 13 communication fixtures, the 60-step MLP trace,
    # the 12 ranks of the DDP twins, the 3 Kineto traces beside their execution traces (2 made here, HTA's one),
    # the 5 acceptance captures (H100 and H200), the 6 ranks of the FSDP2 twins (two H100s), the 12 of the
    # four-GPU FSDP2 twins, 6 of HTA's test traces (fixtures/torch/hta), PyTorch 1.8's bare array, PyTorch 1.9's
    # memory events with Bytes alone (fixtures/torch/kineto), the 2 steps the host does not wait for
    # (fixtures/torch/async), the 6 of sweep 18 (fixtures/torch/sweep18) and PyTorch 2.13's CPU trace and 8 gloo
    # ranks under two host names (fixtures/torch/cpu, multirank/gloo4_*host*), the 6 ranks of sweep 20's
    # two-stage pipelines (multirank/pp2_*), the FP8 GEMMs of an H200 (fixtures/torch/fp8), its one GEMM in
    # six precisions (fixtures/torch/gemm_kernels), its mixture of experts (fixtures/torch/grouped_mm) and the 8
    # ranks of two four-stage gloo pipelines (multirank/pp4_gloo_*), the 8 of two DP2 x PP2 gloo jobs and the 8
    # of a DP2 x PP4 one (multirank/dp2pp*_gloo_*), the 12 of three TP2 x DP2 gloo jobs (multirank/tp2dp2_gloo_*)
    # and the 4 of an FSDP2 job over gloo's default group (multirank/fsdp4_gloo_slow_loader), the 2 of a
    # tensor-parallel job over NCCL on two H200s (multirank/tp2_nccl_slow_gpu), the 8 ranks of param's DLRM on
    # V100s (fixtures/torch/param), a GPU puzzle's A100 trace (fixtures/torch/gpupuzzlers) and TraceLens's merge of
    # a 4-rank RCCL run (fixtures/torch/tracefuse_ddp4), and the 8 ranks of ASTRA-sim's Megatron TP8 run on A100s
    # (fixtures/torch/megatron_tp8_a100), and the 4 files of two profiling windows of two gloo ranks on an H200
    # (multirank/windows2_gloo: tensorboard_trace_handler's names), and the TensorBoard plugin's GPU-metrics test
    # trace (fixtures/torch/kineto)
    assert len(paths) == 167
    for path in paths:
        check_against_independent(path)


#: Bytes per element of the dtypes Kineto names on communication events (the real NCCL fixtures: Float).
DTYPE_SIZE = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
              "Byte": 1, "Bool": 1}


def expected_bytes(args: dict):
    """A copy's ``bytes``; a communication event's message size: the larger element count × the dtype's size."""
    if "bytes" in args:
        return args["bytes"]
    elems = [args[k] for k in ("In msg nelems", "Out msg nelems", "In msg size", "Out msg size") if k in args]
    size = DTYPE_SIZE.get(args.get("dtype"))
    return max(elems) * size if elems and size else None


def check_against_independent(path: Path) -> None:
    expected = independent(path)
    trace = read_paths([path])[0]
    ev = trace.events.filter(pl.col("kind") != "counter")  # [memory] counters: tests/test_torch_modern.py
    assert ev.height == len(expected), path
    kinds = Counter(KIND_OF[e["cat"].lower()] for e in expected)
    got = dict(ev.group_by("kind").len().with_columns(pl.col("kind").cast(str)).iter_rows())
    assert got == dict(kinds), path
    # every start and duration exact, in file order
    assert ev["start_ns"].to_list() == [ns(e["ts"]) for e in expected]
    assert ev["duration_ns"].to_list() == [ns(e["dur"]) for e in expected]
    assert ev["name"].to_list() == [e["name"] for e in expected]
    # correlation ids, bytes and streams where the file gives them
    assert ev["correlation_id"].to_list() == [e.get("args", {}).get("correlation") for e in expected]
    assert ev["bytes"].to_list() == [expected_bytes(e.get("args", {})) for e in expected]
    dims = [e.get("args", {}).get("Input Dims") for e in expected]
    assert ev["input_dims"].to_list() == [None if d is None else json.dumps(d, separators=(",", ":")) for d in dims]
    for column, key in (("input_types", "Input type"), ("concrete_inputs", "Concrete Inputs")):  # JSON as written
        assert [None if v is None else json.loads(v) for v in ev[column]] == \
            [e.get("args", {}).get(key) for e in expected], (path, column)
    gpu = ev.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
    assert gpu["pid"].null_count() == gpu.height  # GPU rows have no host process
    assert gpu["stream_id"].null_count() == 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    if isinstance(doc, dict) and doc.get("deviceProperties"):  # (not a CPU-only trace, nor PyTorch 1.8's array)
        assert trace.meta.devices and trace.meta.devices[0].name
    else:
        assert not trace.meta.devices


def test_resnet18_bs16_details(samples_dir):
    trace = read_paths([samples_dir / "torch" / "torch_resnet18_bs16.json.gz"])[0]
    ev = trace.events
    copies = ev.filter(pl.col("kind") == "memcpy")
    htod = copies.filter(pl.col("copy_kind") == "HtoD")
    assert set(htod["src_memory"].cast(str)) == {"pageable"}
    assert set(htod["dst_memory"].cast(str)) == {"device"}
    kernel = ev.filter(pl.col("name").str.starts_with("void cudnn::engines_precompiled::nchwToNhwcKernel")).row(0, named=True)
    assert (kernel["grid_x"], kernel["grid_y"], kernel["grid_z"]) == (1568, 1, 16)
    assert (kernel["block_x"], kernel["block_y"], kernel["block_z"]) == (256, 1, 1)
    assert kernel["registers_per_thread"] == 32
    assert kernel["dynamic_smem_bytes"] == 4224
    assert kernel["start_ns"] == 4488884122451908  # "ts": 4488884122451.908: exact, beyond float precision
    device = trace.meta.devices[0]
    assert (device.name, device.sm_count, device.compute_capability) == ("NVIDIA H100 80GB HBM3", 132, "9.0")
    assert device.memory_bytes == 85017493504
    assert ev.filter((pl.col("kind") == "op") & pl.col("input_dims").is_not_null()).height > 1000
    assert trace.meta.extra["with_flops"] == 1


def test_chunked_reading_gives_the_same_table(samples_dir):
    """A chunk size far smaller than the file exercises the streaming path: the table must not change."""
    path = samples_dir / "torch" / "torch_resnet18_bs4.json.gz"
    whole = read_paths([path])[0].events
    chunked = read_paths([path], params={"chunk_bytes": 20_000})[0].events
    assert chunked.equals(whole)


def test_decimal_times_are_exact(tmp_path):
    # hand-written edge case: timestamps where float64 would be off by a nanosecond or more
    text = """{"schemaVersion": 1, "traceEvents": [
      {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 9007199254740.9931, "dur": 0.0005,
       "args": {"device": 0, "stream": 7, "correlation": 1}},
      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 12, "dur": 1.5e-3,
       "args": {"External id": 3}}
    ]}"""
    assert float("9007199254740.9931") * 1000 != 9007199254740993  # float would drift here
    path = tmp_path / "edge.json"
    path.write_text(text)
    ev = read_paths([path])[0].events
    assert ev["start_ns"].to_list() == [9007199254740993, 12000]
    assert ev["duration_ns"].to_list() == [0, 2]  # half to even (traceparse.units): 0.5 ns -> 0; 1.5e-3 us = 1.5 ns -> 2
    assert ev["external_id"].to_list() == [None, 3]
    assert ev["pid"].to_list() == [None, 1]


def test_legacy_pytorch_1_8_layout(tmp_path):
    # hand-written after PyTorch 1.8's layout: capitalised categories, "external id", tid "stream 7"
    doc = {"traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 10, "tid": 10, "ts": 100, "dur": 50,
         "args": {"external id": 5}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": 110, "dur": 5,
         "args": {"correlation": 77, "external id": 5}},
        {"ph": "X", "cat": "Kernel", "name": "implicit_convolve_sgemm", "pid": 0, "tid": "stream 7", "ts": 120,
         "dur": 30, "args": {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 77,
                             "external id": 5, "registers per thread": 64, "shared memory": 0,
                             "grid": [4, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": "stream 7",
         "ts": 200, "dur": 10, "args": {"device": 0, "stream": 7, "correlation": 78, "bytes": 1024}},
    ]}
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(doc))
    trace = read_paths([path])[0]
    ev = trace.events
    assert ev["kind"].cast(str).to_list() == ["op", "api", "kernel", "memcpy"]
    assert ev["external_id"].to_list() == [5, 5, 5, None]
    assert ev.filter(pl.col("kind") == "memcpy")["src_memory"].cast(str).to_list() == ["pinned"]
    assert trace.meta.variant == "Kineto (no schemaVersion: PyTorch 1.x, or a file rewritten without it)"


def test_distributed_rank_becomes_tags(tmp_path):
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
           "traceEvents": [{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7,
                            "ts": 1, "dur": 2, "args": {"device": 3, "stream": 7}}]}
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps(doc))
    meta = read_paths([path])[0].meta
    assert meta.tags == {"rank": "3", "world_size": "8", "backend": "nccl"}


def test_truncated_trace_keeps_complete_events(samples_dir, tmp_path):
    raw = gzip.open(samples_dir / "torch" / "torch_resnet18_bs4.json.gz").read()
    cut = raw[: len(raw) // 2]
    path = tmp_path / "cut.json"
    path.write_bytes(cut)
    complete = [e for e in independent_prefix(cut)]
    trace = read_paths([path])[0]
    assert trace.events.height == len(complete)
    assert any("ends early" in w for w in trace.meta.warnings)


def independent_prefix(data: bytes) -> list[dict]:
    """The kept events among the complete ones of a cut file (decoded one by one with the json module)."""
    text = data.decode()
    start = text.index("[", text.index('"traceEvents"')) + 1
    decoder = json.JSONDecoder(parse_float=Decimal)
    events, pos = [], start
    while True:
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            event, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        events.append(event)
    return [e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() in KIND_OF]


def test_layout_does_not_change_the_table(fixtures_dir, tmp_path):
    """The same trace minified, or with traceEvents before the other keys, read whole or in small chunks."""
    source = fixtures_dir / "torch" / "vgg16_bs8.json.gz"
    doc = json.load(gzip.open(source))
    minified = tmp_path / "minified.json"
    minified.write_text(json.dumps(doc, separators=(",", ":")))
    events = doc.pop("traceEvents")
    events_first = tmp_path / "events_first.json"
    events_first.write_text(json.dumps({"traceEvents": events, **doc}, indent=1))
    expected = read_paths([source])[0]
    assert expected.events["input_dims"].drop_nulls()[1] == "[[],[8,1000],[8],[],[],[],[]]"  # compact JSON
    for path in (minified, events_first):
        for params in (None, {"chunk_bytes": 30_000}):
            got = read_paths([path], params=params)[0]
            assert got.events.drop("trace_id").equals(expected.events.drop("trace_id")), (path.name, params)
            assert got.meta.devices == expected.meta.devices


def test_a_cut_trace_whose_keys_follow_its_events_is_not_called_pytorch_1(tmp_path):
    """A Kineto trace written with its keys after ``traceEvents`` (TraceLens' harness layout), cut short: the
    schemaVersion was cut off with the events' end, and the trace was labelled "PyTorch 1.x". Hand-made from a
    real trace (its keys moved after the events, then cut in the middle)."""
    import gzip as _gzip
    import json as _json

    from traceparse.ingest import read_paths

    doc = _json.load(_gzip.open(FIXTURES / "torch" / "alexnet_bs4.json.gz"))
    assert "schemaVersion" in doc
    moved = {"traceEvents": doc.pop("traceEvents"), **doc}
    text = _json.dumps(moved)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    trace = read_paths([path])[0]
    assert trace.meta.variant == "Kineto (no schemaVersion read: the file is cut short before it)"
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert read_paths([whole])[0].meta.variant == f"Kineto schema {doc['schemaVersion']}"
