"""The jax reader on real JAX 0.11.2 captures (H100): the JSON timelines, against the raw JSON parsed here.

fixtures/jax/jax_{mlp,gpt,dp_gpt}/plugins/profile/<run>/ hold ``perfetto_trace.json.gz`` (JAX's own Chrome
JSON) and ``vm.trace.json.gz`` (the trace viewer JSON of the same XPlane); fixtures/jax/jax*versions.json have
each profiled step's wall time measured by the script that made them (fixtures/make_jax_fixtures.py).
``jax_dp_gpt`` is the GPT data-parallel over two H100s: kernels, NCCL all-reduces and peer copies on both.
Every expected figure below is computed from the raw files in the test (json + Decimal), never copied from
the reader's output.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, us_to_ns
from traceparse import measures
from traceparse.ingest import detect_reader, read_paths
from traceparse.measures.steps import step_series
from traceparse.plugins import registry

JAX = FIXTURES / "jax"
RUNS = {name: next((JAX / name / "plugins" / "profile").iterdir()) for name in ("jax_mlp", "jax_gpt", "jax_dp_gpt")}
TIMELINES = [RUNS[w] / f for w in RUNS for f in ("perfetto_trace.json.gz", "vm.trace.json.gz")]
GPU = ("kernel", "memcpy", "memset")
#: Each workload's profiled steps' wall times, as the script measured them (one versions file per capture job).
WALL_MS = {name: w["step_ms"] for f in sorted(JAX.glob("jax*versions.json"))
           for name, w in json.loads(f.read_text())["workloads"].items()}
#: How far a step's StepTraceAnnotation may be from the wall time the script measured around the same step
#: (time.perf_counter() before the call and after block_until_ready(): it includes the Python around the
#: annotation). Measured: at most 40 us (1.2%) on these captures.
STEP_TOLERANCE = 0.02


def _id(path: Path) -> str:
    return f"{path.parent.parent.parent.parent.name}/{path.name}"


def raw_events(path: Path) -> tuple[list[dict], dict, dict]:
    """The complete events of a timeline (numbers as Decimal), and its process and thread names."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    events = doc["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    return [e for e in events if e.get("ph") == "X"], processes, threads


def raw_gpu_work(path: Path) -> list[dict]:
    """The events on a ``Stream #N`` thread of a ``/device:GPU:D`` process, with device, stream and kind."""
    events, processes, threads = raw_events(path)
    out = []
    for e in events:
        device = re.fullmatch(r"/device:GPU:(\d+)", processes.get(e["pid"], ""))
        stream = re.match(r"Stream #(\d+)", threads.get((e["pid"], e["tid"]), ""))
        if not (device and stream):
            continue
        args = e.get("args", {})
        kind = ("memcpy" if e["name"].startswith("Memcpy") or "memcpy_details" in args else
                "memset" if e["name"].startswith("Memset") or "Memset_details" in args else "kernel")
        out.append({**e, "device": int(device.group(1)), "stream": int(stream.group(1)), "kind": kind})
    return out


@pytest.fixture(scope="module")
def tables() -> dict[Path, pl.DataFrame]:
    return {path: read_paths([path])[0].events for path in TIMELINES}


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_detected_from_content(path):
    assert detect_reader(path, registry()).name == "jax"
    # the content decides, not the name: the same bytes under a plain name are still a JAX timeline
    assert detect_reader(path, registry()).sniff(Path("x.json"), gzip.decompress(path.read_bytes())[:65536]) == 0.8


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_gpu_work_per_stream_matches_the_raw_json(path, tables):
    expected = defaultdict(lambda: [0, 0])
    for e in raw_gpu_work(path):
        key = (e["kind"], e["device"], e["stream"])
        expected[key][0] += 1
        expected[key][1] += us_to_ns(e["dur"])
    got = (tables[path].filter(pl.col("kind").cast(pl.String).is_in(GPU))
           .group_by("kind", "device_id", "stream_id").agg(pl.len(), pl.col("duration_ns").sum()))
    got = {(str(k), d, s): [n, t] for k, d, s, n, t in got.iter_rows()}
    assert got == dict(expected)
    assert sum(n for (k, _, _), (n, _) in expected.items() if k == "kernel") > 100


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_kernels_keep_hlo_op_module_and_correlation(path, tables):
    raw = [e for e in raw_gpu_work(path) if e["kind"] == "kernel"]
    expected = Counter((e["name"], us_to_ns(e["ts"]), e["args"].get("hlo_op"), e["args"].get("hlo_module"),
                        int(e["args"]["correlation_id"])) for e in raw)
    got = Counter(tables[path].filter(pl.col("kind") == "kernel")
                  .select("name", "start_ns", "hlo_op", "hlo_module", "correlation_id").iter_rows())
    assert got == expected
    assert all(e["args"].get("hlo_op") for e in raw)


def _details(text: str) -> dict[str, int]:
    out = {}
    for key, value in (w.split(":", 1) for w in text.split()):
        if key in ("grid", "block"):
            for axis, v in zip("xyz", value.split(",")):
                out[f"{key}_{axis}"] = int(v)
        elif key in ("regs", "static_shared", "dynamic_shared"):
            out[key] = int(value)
    return out


@pytest.mark.parametrize("path", [p for p in TIMELINES if p.name.startswith("perfetto")], ids=_id)
def test_launch_configuration_from_kernel_details(path, tables):
    raw = [e for e in raw_gpu_work(path) if e["kind"] == "kernel" and "kernel_details" in e["args"]]
    assert raw
    expected = Counter()
    for e in raw:
        d = _details(e["args"]["kernel_details"])
        expected[(us_to_ns(e["ts"]), d["grid_x"], d["grid_y"], d["grid_z"], d["block_x"], d["block_y"],
                  d["block_z"], d["regs"], d["static_shared"], d["dynamic_shared"])] += 1
    got = Counter(tables[path].filter(pl.col("kind") == "kernel").select(
        "start_ns", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
        "static_smem_bytes", "dynamic_smem_bytes").iter_rows())
    assert got == expected


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_occupancy_counters_point_at_their_kernel(path, tables):
    raw = Counter((us_to_ns(e["ts"]), float(e["args"]["theoretical_occupancy_pct"]))
                  for e in raw_gpu_work(path) if float(e["args"].get("theoretical_occupancy_pct", 0)) > 0)
    t = tables[path]
    counters = t.filter(pl.col("name") == "theoretical_occupancy").join(
        t.select(parent_id="event_id", kernel_start="start_ns", parent_kind="kind"), on="parent_id")
    assert (counters["parent_kind"] == "kernel").all() and (counters["unit"] == "%").all()
    assert Counter(counters.select("kernel_start", "value").iter_rows()) == raw


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_copies_direction_bytes_and_memory(path, tables):
    """Each copy's direction, bytes and memory kinds; a peer copy (the data-parallel capture's MemcpyP2P) from the
    GPU it runs on to its ``dest``."""
    raw = [e for e in raw_gpu_work(path) if e["kind"] == "memcpy"]
    direction = {"H2D": "HtoD", "D2H": "DtoH", "D2D": "DtoD", "P2P": "PtoP"}
    expected = Counter()
    for e in raw:
        d = dict(w.split(":", 1) for w in e["args"]["memcpy_details"].split())
        kind = direction[e["name"][len("Memcpy"):]]
        peer = (e["device"], int(d["dest"])) if kind == "PtoP" else (None, None)
        expected[(us_to_ns(e["ts"]), kind, int(d["size"]), d["kind_src"], d["kind_dst"], *peer)] += 1
    got = Counter(tables[path].filter(pl.col("kind") == "memcpy").select(
        "start_ns", pl.col("copy_kind").cast(pl.String), "bytes", pl.col("src_memory").cast(pl.String),
        pl.col("dst_memory").cast(pl.String), "src_device", "dst_device").iter_rows())
    assert got == expected and got
    if path.parent.parent.parent.parent.name == "jax_dp_gpt":  # each step's batch: GPU 1's half goes 0 -> 1
        peer = [k for k in expected if k[1] == "PtoP"]
        assert {(k[5], k[6]) for k in peer} == {(0, 1)} and {k[2] for k in peer} == {8 * 257 * 4}  # 8 x 257 int32


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_graph_kernels_are_attributed_to_their_launch(path, tables):
    """XLA's command buffers replay their kernels by cuGraphLaunch: each such kernel (a cuda_graph_id) is linked
    to the host call ``cuGraphLaunch (CudaGraph:G)`` of its correlation id, and every other kernel to a launch."""
    raw = [e for e in raw_gpu_work(path) if e["kind"] == "kernel"]
    in_graph = Counter(int(e["args"]["correlation_id"]) for e in raw if "cuda_graph_id" in e["args"])
    assert in_graph
    links = measures.launches(tables[path])
    kernels = links.filter(pl.col("kind") == "kernel")
    assert kernels["launch_event_id"].null_count() == 0  # every kernel has its launch
    graph = kernels.filter(pl.col("launch_class") == "graph_launch")
    assert Counter(graph["correlation_id"].to_list()) == in_graph
    assert graph["launch_name"].str.starts_with("cuGraphLaunch (CudaGraph:").all()
    direct = kernels.filter(pl.col("launch_class") != "graph_launch")
    assert direct.height == len(raw) - sum(in_graph.values())
    assert (direct["launch_name"] == "cuLaunchKernel (" + direct["name"] + ")").all()
    assert (direct["launch_class"] == "launch").all()


@pytest.mark.parametrize("path", TIMELINES, ids=_id)
def test_steps_from_step_trace_annotations(path, tables):
    events, processes, _ = raw_events(path)
    host = [e for e in events if processes.get(e["pid"]) == "/host:CPU" and "step_num" in e.get("args", {})]
    workload = path.parent.parent.parent.parent.name
    wall_ms = WALL_MS[workload]
    s = step_series(tables[path])
    assert s["source"].unique().to_list() == ["marked step train N"]
    assert s["step"].to_list() == sorted(int(e["args"]["step_num"]) for e in host) == list(range(len(wall_ms)))
    assert s["duration_ns"].to_list() == [us_to_ns(e["dur"]) for e in sorted(host, key=lambda e: e["ts"])]
    for got, wall in zip(s["duration_ns"].to_list(), wall_ms):
        assert abs(got / 1e6 - wall) <= STEP_TOLERANCE * wall, (got, wall)


def test_trace_viewer_and_perfetto_json_agree(tables):
    """The two JSON files of one capture are converted from the same XPlane: the same GPU work."""
    cols = ["kind", "name", "start_ns", "duration_ns", "device_id", "stream_id", "correlation_id", "hlo_op"]
    for run in RUNS.values():
        a, b = (tables[run / f].filter(pl.col("kind").cast(pl.String).is_in(GPU)).select(cols).sort(cols)
                for f in ("perfetto_trace.json.gz", "vm.trace.json.gz"))
        assert a.equals(b)


def test_plain_chrome_traces_stay_with_the_chrome_reader(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}))
    assert detect_reader(plain, registry()).name == "chrome"
