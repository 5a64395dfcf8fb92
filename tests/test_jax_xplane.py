"""The jax reader on XPlane protobufs (``*.xplane.pb``), against an independent decoder written here.

The oracle below walks the protobuf wire format by hand (no ``protobuf`` package, no schema of the reader's):
XSpace field 1 = planes; XPlane 2 name, 3 lines, 4 event_metadata (map: key 1, value 2), 5 stat_metadata,
6 stats; XLine 1 id, 2 name, 3 timestamp_ns, 4 events, 11 display_name; XEvent 1 metadata_id, 2 offset_ps,
3 duration_ps, 4 stats; XStat 1 metadata_id, 2 double, 3 uint64, 4 int64, 5 str, 6 bytes, 7 ref;
XEventMetadata 2 name, 4 display_name, 5 stats; XStatMetadata 2 name (tsl/profiler/protobuf/xplane.proto).

Files: the H100 captures (JAX 0.11.2) beside their xprof trace-viewer JSON, and three public MI300X/MI355X
XSpaces from AMD's TraceLens (fixtures/jax/public/, MIT): JAX 0.8 (the ROCm ``kernel_details`` form without
registers), JAX ~0.6 (the legacy ``regs:... static_shared:...`` form with uninitialised register counts), and a
TransformerEngine fused-attention step on a ``Stream #2`` line.
"""

from __future__ import annotations

import re
import struct
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, wire_fields as _fields
from traceparse.ingest import detect_reader, read_paths
from traceparse.measures.steps import step_series
from traceparse.plugins import registry

JAX = FIXTURES / "jax"
RUNS = {name: next((JAX / name / "plugins" / "profile").iterdir()) for name in ("jax_mlp", "jax_gpt", "jax_dp_gpt")}
PUBLIC = sorted((JAX / "public").glob("*/*.xplane.pb"))
GPU = ("kernel", "memcpy", "memset")


# -- the oracle: a hand-written wire decoder -----------------------------------------------------------------
def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _stat(b: bytes, names: dict) -> tuple[str, object]:
    mid, value = None, None
    for f, v in _fields(b):
        if f == 1:
            mid = v
        elif f == 2:
            value = struct.unpack("<d", v)[0]
        elif f in (3, 4):
            value = _signed(v) if f == 4 else v
        elif f == 5:
            value = v.decode()
        elif f == 7:
            value = names.get(v)
    return names.get(mid, ""), value


def decode(path: Path) -> list[dict]:
    """[{name, stats, events: [{line, name, start_ps, duration_ps, stats}]}] of every plane."""
    planes = []
    for f, plane in _fields(path.read_bytes()):
        if f != 1:
            continue
        name, lines, ev_meta, stat_names, stats_raw = "", [], {}, {}, []
        for g, v in _fields(plane):
            if g == 2:
                name = v.decode()
            elif g == 3:
                lines.append(v)
            elif g in (4, 5):
                key, value = None, None
                for h, w in _fields(v):
                    key, value = (w, value) if h == 1 else (key, w)
                if g == 5:
                    stat_names[key] = next((w.decode() for h, w in _fields(value) if h == 2), "")
                else:
                    ev_meta[key] = value
            elif g == 6:
                stats_raw.append(v)
        metas = {}
        for key, value in ev_meta.items():
            fields = list(_fields(value))
            md_name = next((w.decode() for h, w in fields if h == 2), "")
            display = next((w.decode() for h, w in fields if h == 4), "")
            metas[key] = (display or md_name, dict(_stat(w, stat_names) for h, w in fields if h == 5))
        events = []
        for line in lines:
            fields = list(_fields(line))
            ts = _signed(next((w for h, w in fields if h == 3), 0))
            line_name = next((w.decode() for h, w in fields if h == 11), "") or \
                next((w.decode() for h, w in fields if h == 2), "")
            for h, e in fields:
                if h != 4:
                    continue
                ef = list(_fields(e))
                mid = next((w for k, w in ef if k == 1), 0)
                ev_name, shared = metas.get(mid, ("", {}))
                events.append({"line": line_name, "name": ev_name,
                               "start_ps": ts * 1000 + next((w for k, w in ef if k == 2), 0),
                               "duration_ps": next((w for k, w in ef if k == 3), 0),
                               "stats": {**shared, **dict(_stat(w, stat_names) for k, w in ef if k == 4)}})
        planes.append({"name": name, "stats": dict(_stat(v, stat_names) for v in stats_raw), "events": events})
    return planes


def gpu_work(planes: list[dict]) -> list[dict]:
    out = []
    for p in planes:
        device = re.fullmatch(r"/device:GPU:(\d+)", p["name"])
        for e in p["events"]:
            stream = re.match(r"Stream #(\d+)", e["line"])
            if device and stream:
                kind = ("memcpy" if e["name"].startswith("Memcpy") or "memcpy_details" in e["stats"] else
                        "memset" if e["name"].startswith("Memset") or "Memset_details" in e["stats"] else "kernel")
                out.append({**e, "device": int(device.group(1)), "stream": int(stream.group(1)), "kind": kind})
    return out


def _ns(ps: int) -> int:
    return round(ps / 1000) if ps % 1000 != 500 else ps // 1000 + (ps // 1000) % 2  # half to even


# -- tests ---------------------------------------------------------------------------------------------------
XPLANES = [RUNS[w] / "vm.xplane.pb" for w in RUNS] + PUBLIC


def _id(path: Path) -> str:
    return path.parent.name if "public" in path.parts else path.parent.parent.parent.parent.name


@pytest.fixture(scope="module")
def traces():
    return {path: read_paths([path])[0] for path in XPLANES}


@pytest.mark.parametrize("path", XPLANES, ids=_id)
def test_detected_from_content(path):
    assert detect_reader(path, registry()).name == "jax"
    assert detect_reader(path, registry()).sniff(Path("profile.bin"), path.read_bytes()[:65536]) == 0.8


@pytest.mark.parametrize("path", XPLANES, ids=_id)
def test_gpu_work_per_stream_matches_the_oracle(path, traces):
    expected = defaultdict(lambda: [0, 0])
    for e in gpu_work(decode(path)):
        key = (e["kind"], e["device"], e["stream"])
        expected[key][0] += 1
        expected[key][1] += _ns(e["duration_ps"])
    got = (traces[path].events.filter(pl.col("kind").cast(pl.String).is_in(GPU))
           .group_by("kind", "device_id", "stream_id").agg(pl.len(), pl.col("duration_ns").sum()))
    assert {(str(k), d, s): [n, t] for k, d, s, n, t in got.iter_rows()} == dict(expected)


@pytest.mark.parametrize("path", XPLANES, ids=_id)
def test_kernels_names_hlo_ops_and_launch_configuration(path, traces):
    kernels = [e for e in gpu_work(decode(path)) if e["kind"] == "kernel"]
    expected = Counter()
    for e in kernels:
        text = e["stats"].get("kernel_details") or ""
        grid = re.search(r"grid:(\d+),(\d+),(\d+)", text)
        regs = re.search(r"regs:(\d+)", text)
        registers = int(regs.group(1)) if regs and int(regs.group(1)) <= 512 else None  # more: impossible, left out
        expected[(e["name"], _ns(e["start_ps"]), e["stats"].get("hlo_op"), e["stats"].get("hlo_module"),
                  *(tuple(int(g) for g in grid.groups()) if grid else (None,) * 3), registers)] += 1
    got = Counter(traces[path].events.filter(pl.col("kind") == "kernel").select(
        "name", "start_ns", "hlo_op", "hlo_module", "grid_x", "grid_y", "grid_z", "registers_per_thread").iter_rows())
    assert got == expected


@pytest.mark.parametrize("workload", RUNS)
def test_same_gpu_work_as_the_trace_viewer_json(workload, traces):
    """xprof 2.20.7 converted this XPlane to vm.trace.json.gz: the same kernels, copies and memsets, to the ns."""
    cols = ["kind", "name", "start_ns", "duration_ns", "device_id", "stream_id", "correlation_id", "hlo_op",
            "hlo_module", "bytes"]
    plane = traces[RUNS[workload] / "vm.xplane.pb"].events
    json = read_paths([RUNS[workload] / "vm.trace.json.gz"])[0].events
    # a kernel's bytes come from the compiled modules, which only the XPlane holds: compared for copies only
    copies_bytes = pl.when(pl.col("kind") != "kernel").then(pl.col("bytes")).alias("bytes")
    a, b = (t.filter(pl.col("kind").cast(pl.String).is_in(GPU)).with_columns(copies_bytes).select(cols).sort(cols)
            for t in (plane, json))
    assert a.height > 100 and a.equals(b)
    kernel_ns = a.filter(pl.col("kind") == "kernel")["duration_ns"].sum()
    assert kernel_ns == b.filter(pl.col("kind") == "kernel")["duration_ns"].sum()
    # launch configuration: the trace viewer's JSON has none (xprof 2.20.7 drops kernel_details); JAX's own JSON has
    config = ["start_ns", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
              "static_smem_bytes", "dynamic_smem_bytes"]
    perfetto = read_paths([RUNS[workload] / "perfetto_trace.json.gz"])[0].events
    a, b = (t.filter(pl.col("kind") == "kernel").select(config).sort(config) for t in (plane, perfetto))
    assert a.equals(b) and a["grid_x"].null_count() == 0


@pytest.mark.parametrize("path", XPLANES, ids=_id)
def test_devices_from_the_gpu_planes(path, traces):
    expected = {}
    for p in decode(path):
        m = re.fullmatch(r"/device:GPU:(\d+)", p["name"])
        s = p["stats"]
        if m and s.get("core_count"):
            expected[int(m.group(1))] = (s.get("gpu_device_name"), s["core_count"], s["memory_size"],
                                         f"{s['compute_cap_major']}.{s['compute_cap_minor']}", s["clock_rate"] / 1000,
                                         s["memory_bandwidth"], s.get("device_vendor"))
    got = {d.id: (d.name, d.sm_count, d.memory_bytes, d.compute_capability, d.core_clock_mhz,
                  d.extra.get("memory_bandwidth"), d.extra.get("device_vendor"))
           for d in traces[path].meta.devices if d.sm_count}
    assert got == expected and expected
    # an AMD GPU's vendor in the word the Kineto reader gives, so that `show` says CUs and gfx, not SMs and sm
    amd = {d.id for d in traces[path].meta.devices if d.extra.get("vendor") == "AMD" and d.id in expected}
    assert amd == {i for i, e in expected.items() if "amd" in str(e[-1]).lower()}


def test_h100_device_is_found_in_the_catalog(traces):
    from traceparse.catalog import find_gpu

    (device,) = traces[RUNS["jax_gpt"] / "vm.xplane.pb"].meta.devices
    assert device.name == "NVIDIA H100 80GB HBM3" and find_gpu(device.name)["name"] == "H100 SXM"
    assert traces[RUNS["jax_gpt"] / "vm.xplane.pb"].meta.tool_version == "0.11.2"


@pytest.mark.parametrize("workload", RUNS)
def test_steps_as_in_the_json(workload, traces):
    planes = decode(RUNS[workload] / "vm.xplane.pb")
    host = [e for p in planes if p["name"] == "/host:CPU" for e in p["events"] if "step_num" in e["stats"]]
    s = step_series(traces[RUNS[workload] / "vm.xplane.pb"].events)
    assert s["step"].to_list() == sorted(int(e["stats"]["step_num"]) for e in host) == [0, 1, 2, 3]
    assert s["duration_ns"].to_list() == [_ns(e["duration_ps"]) for e in sorted(host, key=lambda e: e["start_ps"])]
    json = step_series(read_paths([RUNS[workload] / "vm.trace.json.gz"])[0].events)
    assert s.drop("trace_id").equals(json.drop("trace_id"))


def test_legacy_register_counts_left_out_with_a_warning(traces):
    path = JAX / "public" / "tracelens_jax_conv_minimal_legacy" / "chi-mi300x-013.ord.vultr.cpe.ice.amd.com.xplane.pb"
    bad = sum(1 for e in gpu_work(decode(path))
              if e["kind"] == "kernel" and int(re.search(r"regs:(\d+)", e["stats"]["kernel_details"]).group(1)) > 512)
    assert bad == 25
    assert traces[path].meta.warnings == [
        f"{path}: kernel launch configurations no GPU can have, left empty: {bad}× registers > 512"]


def test_rocm_launches_keep_their_hip_names(traces):
    from traceparse import measures

    path = JAX / "public" / "tracelens_jax08_gemm" / "tw003.xplane.pb"
    links = measures.launches(traces[path].events)
    assert links["launch_name"].null_count() == 0
    assert set(links["launch_name"]) <= {"hipModuleLaunchKernel", "hipMemcpyDtoDAsync", "hipMemcpyHtoDAsync",
                                         "hipExtModuleLaunchKernel", "hipLaunchKernel"}
