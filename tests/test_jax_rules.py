"""A JAX user's ``traceparse analyze trace_dir/``, and hostile JAX files (issue 26, item 1).

The directory is the one ``jax.profiler.trace(trace_dir)`` wrote (fixtures/jax/jax_gpt: plugins/profile/<run>/
with the XPlane, JAX's Perfetto JSON and xprof's trace-viewer JSON); expected figures are computed from the raw
JSON in the test. Hostile cases: a truncated ``.xplane.pb``, a gzip stream cut short, a kernel whose thread
names no stream, bytes that are not an XSpace: a warning or one line, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import zlib
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, intersect, run_cli, run_rule, union, us_to_ns, wire_varint as _varint
from traceparse.ingest import read_paths

JAX = FIXTURES / "jax"
GPT = JAX / "jax_gpt"
RUN = next((GPT / "plugins" / "profile").iterdir())


def _raw_kernels(path: Path) -> list[dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    events = doc["traceEvents"]
    gpu = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
           and e["args"]["name"] == "/device:GPU:0"}
    streams = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
               and e["args"]["name"].startswith("Stream #") and e["pid"] in gpu}
    return [e for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) in streams
            and not e["name"].startswith(("Memcpy", "Memset"))]


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    import os

    old = os.environ.get("TRACEPARSE_STORE")
    os.environ["TRACEPARSE_STORE"] = str(store)
    try:
        code, out, err = run_cli("analyze", str(GPT) + "/", "--json")
    finally:
        if old is None:
            del os.environ["TRACEPARSE_STORE"]
        else:
            os.environ["TRACEPARSE_STORE"] = old
    return code, out, err


def test_analyze_the_profile_directory(analyzed):
    code, out, err = analyzed
    assert code == 0, err
    doc = json.loads(out)
    (trace,) = doc["traces"]
    assert trace["format"] == "jax" and trace["path"].endswith("vm.xplane.pb")  # the richest file of the run
    findings = {f["rule"]: f for f in doc["findings"]}
    kernels = _raw_kernels(RUN / "perfetto_trace.json.gz")
    kernel_ns = sum(us_to_ns(e["dur"]) for e in kernels)

    share = findings["kernel-share"]["metrics"]
    assert share["kernel_time_ns"] == kernel_ns and share["calls"] == len(kernels)
    categories = share["categories"]
    assert sum(c["time_ns"] for c in categories.values()) == kernel_ns
    assert abs(sum(c["share_pct"] for c in categories.values()) - 100) < 0.01
    gemm_ns = sum(us_to_ns(e["dur"]) for e in kernels if e["name"].startswith(("gemm_fusion", "nvjet_")))
    assert categories["gemm"]["time_ns"] == gemm_ns > 0
    # the kernels are on GPU 0: its thread in the per-thread hotspots
    per_thread = [f for f in doc["findings"] if f["rule"] == "hotspots" and f["items"] and "thread" in f["items"][0]]
    gpu_rows = [i for f in per_thread for i in f["items"] if i["thread"] == "GPU 0"]
    assert gpu_rows and {i["kind"] for i in gpu_rows} <= {"kernel", "memcpy", "memset"}

    idle = findings["gpu-idle"]["metrics"]
    for key in ("idle_pct", "host_wait_pct", "kernel_wait_pct", "other_wait_pct"):
        assert 0 <= idle[key] <= 100, key
    assert idle["idle_ns"] + idle["busy_ns"] == idle["span_ns"]
    assert list(idle["devices"]) == ["0"]

    launch = findings["launch-stats"]["metrics"]
    graph_kernels = sum(1 for e in kernels if "cuda_graph_id" in e["args"])
    assert launch["kernels"] == launch["linked_kernels"] == len(kernels)
    assert launch["graph_kernels"] == graph_kernels and launch["graph_launches"] == 4  # one per step
    assert launch["delay_ns_p50"] > 0

    grid = findings["low-kernel-concurrency"]["metrics"]
    assert grid["sm_count"] == 132  # from the XPlane's device plane: the H100's SMs
    small = sum(1 for e in kernels if "kernel_details" in e["args"]
                and _blocks(e["args"]["kernel_details"]) < 132)
    assert grid["small_grid_kernels"] == small > 0
    assert findings["arithmetic-intensity"]["metrics"]["gpu"] == "H100 SXM"

    summary = doc["summary"][0]
    assert summary["steps"] == 4 and summary["step_source"] == "marked step train N"


def _blocks(details: str) -> int:
    grid = dict(w.split(":", 1) for w in details.split())["grid"]
    x, y, z = (int(v) for v in grid.split(","))
    return x * y * z


# -- hostile ---------------------------------------------------------------------------------------------------
def _plane_starts(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each top-level field of an XSpace."""
    out, i = [], 0
    while i < len(data):
        start = i
        _, i = _varint(data, i)
        n, i = _varint(data, i)
        i += n
        out.append((start, i))
    return out


def test_truncated_xplane_keeps_its_complete_planes(tmp_path, store):
    data = (RUN / "vm.xplane.pb").read_bytes()
    fields = _plane_starts(data)
    gpu = next(k for k, (a, b) in enumerate(fields) if b"/device:GPU:0" in data[a:a + 64])
    cut_at = fields[gpu + 1][0] + 100  # inside the plane after the GPU's (the host's)
    path = tmp_path / "cut.xplane.pb"
    path.write_bytes(data[:cut_at])
    code, out, err = run_cli("ingest", str(path))
    assert code == 0, err
    assert (f"traceparse: warning: {path}: cut short at byte {cut_at}: the plane starting at byte "
            f"{fields[gpu + 1][0]} is incomplete and left out ({gpu + 1} complete planes read)\n") in err
    whole = read_paths([RUN / "vm.xplane.pb"])[0].events
    cut = read_paths([path])[0].events
    assert cut.filter(cut["kind"] == "kernel").height == whole.filter(whole["kind"] == "kernel").height
    assert cut.filter(cut["pid"].is_not_null()).height == 0  # the host plane was the one cut


def test_xplane_cut_in_its_first_plane_is_one_line(tmp_path, store):
    """It said "byte 0: not an XSpace protobuf" of an XSpace cut inside its first plane: the cut is at the end,
    and the file is an XSpace (its first field a plane, whose declared length runs past the end)."""
    from helpers import wire_fields

    data = (RUN / "vm.xplane.pb").read_bytes()
    number, first = next(wire_fields(data))
    assert number == 1  # the first field is a plane; its length is what the file declares for it
    length = len(first)
    path = tmp_path / "cut.xplane.pb"
    path.write_bytes(data[:50])
    code, out, err = run_cli("ingest", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}: byte 50: an XSpace protobuf (.xplane.pb) cut short: the file ends "
                   f"inside its first plane (from byte 0, {length:,} bytes long), so no plane is complete to read\n")


def test_bytes_that_are_not_an_xspace(tmp_path, store):
    path = tmp_path / "noise.xplane.pb"
    path.write_bytes(b"\x0a\x05hello" + b"\xff" * 20)  # a plane field holding bytes that do not decode
    code, out, err = run_cli("ingest", str(path))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"traceparse: error: {path}: ")


def test_gzip_cut_short_keeps_its_complete_events(tmp_path, store):
    packed = (RUN / "vm.trace.json.gz").read_bytes()
    cut = packed[: len(packed) * 2 // 3]
    path = tmp_path / "vm.trace.json.gz"
    path.write_bytes(cut)
    text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut).decode()
    code, out, err = run_cli("ingest", str(path))
    assert code == 0, err
    # every complete event before the cut is read: xprof writes one event a line, so they end at the last "},\n"
    complete = json.loads(text[: text.rfind("},\n") + 1] + "]}", parse_float=Decimal)
    assert err == (f"traceparse: warning: {path}: the file ends early (truncated gzip stream); kept the "
                   f"{len(complete['traceEvents'])} complete events\n")
    events = read_paths([path])[0].events
    kernels = _raw_kernels_in(complete)
    assert events.filter(events["kind"] == "kernel").height == kernels > 0


def _raw_kernels_in(doc: dict) -> int:
    events = doc["traceEvents"]
    gpu = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
           and e["args"]["name"].startswith("/device:GPU:")}
    streams = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
               and e["args"]["name"].startswith("Stream #") and e["pid"] in gpu}
    return sum(1 for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) in streams
               and not e["name"].startswith(("Memcpy", "Memset")))


def test_kernel_on_a_thread_that_names_no_stream(tmp_path, store):
    doc = {"traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 14, "name": "thread_name", "args": {"name": "Stream #14(Compute)"}},
        {"ph": "X", "pid": 1, "tid": 14, "ts": 10, "dur": 2, "name": "loop_add_fusion",
         "args": {"correlation_id": "3", "kernel_details": "regs:16 grid:4,1,1 block:128,1,1"}},
        {"ph": "X", "pid": 1, "tid": 99, "ts": 20, "dur": 3, "name": "gemm_fusion_dot",
         "args": {"correlation_id": "4", "kernel_details": "regs:90 grid:8,1,1 block:256,1,1", "hlo_op": "dot.1"}},
    ]}
    path = tmp_path / "lost_stream.trace.json"
    path.write_text(json.dumps(doc))
    code, out, err = run_cli("ingest", str(path))
    assert code == 0, err
    assert err.count(f"traceparse: warning: {path}: 1 kernels, copies or memsets (by their stats) on /device:GPU:0 "
                     "are on a thread that names no stream (the first on thread 99): read with no stream\n") == 1
    kernels = read_paths([path])[0].events.filter(pl.col("kind") == "kernel").sort("start_ns")
    assert kernels["stream_id"].to_list() == [14, None]
    assert kernels["duration_ns"].to_list() == [2000, 3000] and kernels["grid_x"].to_list() == [4, 8]


def test_without_protobuf_the_xplane_is_one_line_and_the_directory_falls_back(tmp_path, store, monkeypatch):
    from traceparse_plugins.readers.jax import profile_dir, xplane

    monkeypatch.setattr(xplane, "_protobuf", lambda: None)
    code, out, err = run_cli("ingest", str(RUN / "vm.xplane.pb"))
    assert code == 2
    assert err == (f"traceparse: error: {RUN / 'vm.xplane.pb'}: reading an XPlane needs the protobuf package "
                   "(pip install protobuf), or give the profile's JSON timeline (*.trace.json.gz, "
                   "perfetto_trace.json.gz)\n")
    assert profile_dir.profile_files(GPT, xplane=False) == [RUN / "vm.trace.json.gz"]
    assert profile_dir.profile_files(GPT, xplane=True) == [RUN / "vm.xplane.pb"]
    only_perfetto = tmp_path / "log" / "plugins" / "profile" / "2026_01_01_00_00_00"
    only_perfetto.mkdir(parents=True)
    (only_perfetto / "perfetto_trace.json.gz").write_bytes((RUN / "perfetto_trace.json.gz").read_bytes())
    (only_perfetto / "vm.xplane.pb").write_bytes(b"")
    assert profile_dir.profile_files(tmp_path / "log", xplane=False) == [only_perfetto / "perfetto_trace.json.gz"]


# -- data parallel over two GPUs (fixtures/jax/jax_dp_gpt: the GPT on two H100s, XLA all-reducing gradients) ------
DP_RUN = next((JAX / "jax_dp_gpt" / "plugins" / "profile").iterdir())


@pytest.mark.parametrize("name", ["perfetto_trace.json.gz", "vm.xplane.pb"])
def test_data_parallel_collectives_and_their_overlap_per_device(name):
    """Each GPU's NCCL all-reduce kernels (from the raw JSON: names and XLA's all-reduce instructions) are its
    collectives, and comm-compute-overlap gives each device's communication time and the part of it under its
    own compute kernels, as computed here from the raw events."""
    from test_jax_reader import raw_gpu_work

    raw = [e for e in raw_gpu_work(DP_RUN / "perfetto_trace.json.gz") if e["kind"] == "kernel"]
    comm = {d: [e for e in raw if e["device"] == d and e["name"].startswith("ncclDevKernel_AllReduce")]
            for d in (0, 1)}
    assert {d: len(v) for d, v in comm.items()} == {0: 12, 1: 12}
    assert all(e["args"]["hlo_op"].startswith("all-reduce") for v in comm.values() for e in v)
    trace = read_paths([DP_RUN / name])[0]
    got = trace.events.filter(pl.col("collective").is_not_null())
    assert sorted(got.group_by("device_id", "collective").len().rows()) == [(0, "all_reduce", 12), (1, "all_reduce", 12)]
    ranks = run_rule(trace, "comm-compute-overlap").metrics["ranks"]
    for d, kernels in comm.items():
        spans = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in kernels]
        compute = union((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in raw
                         if e["device"] == d and e not in kernels)
        overlapped = sum(intersect(s, e, compute) for s, e in spans)
        assert {k: ranks[str(d)][k] for k in ("kernels", "comm_time_ns", "overlapped_ns")} == \
            {"kernels": 12, "comm_time_ns": sum(e - s for s, e in spans), "overlapped_ns": overlapped}


def test_a_kernel_whose_name_says_no_collective_takes_its_xla_instructions():
    """RCCL's ncclDevKernel_Generic says no collective: XLA's instruction does (hand-written rows, an edge case)."""
    from traceparse_plugins.readers.jax.events import kernel_collective

    rows = pl.DataFrame({"name": ["ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"] * 3
                         + ["ncclDevKernel_AllGather_RING_LL(x)", "loop_add_fusion"],
                         "hlo_op": ["all-gather-start.2", "reduce.5", None, "all-reduce.1", "reduce.5"]})
    assert rows.select(kernel_collective().alias("c"))["c"].to_list() == \
        ["all_gather", "unknown", "unknown", "all_gather", None]


def test_jax_python_tracer_frames_are_no_steps(tmp_path):
    """TraceLens's JAX 0.8 elementwise profile (MI300X) has no step annotation; its host plane's ``python`` line
    holds JAX's Python-tracer frames, 30 of them calls of the builtin ``iter()`` named ``$builtins iter``: they
    were "30 steps (range $builtins iter), mean 255 ns" of a 10.3 ms trace, and the critical path's per-step
    figures with them. The name is in the file's bytes (an XEvent metadata name), counted here from the rows."""
    path = JAX / "public" / "tracelens_jax08_elementwise" / "tw003.xplane.pb"
    assert b"$builtins iter" in path.read_bytes()
    events = read_paths([path])[0].events
    assert events.filter(pl.col("name") == "$builtins iter").height == 30
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"][0]["steps"] == 0 and doc["summary"][0]["step_source"] is None
    path_finding = next(f for f in doc["findings"] if f["rule"] == "critical-path")
    assert "$builtins iter" not in json.dumps(path_finding)
