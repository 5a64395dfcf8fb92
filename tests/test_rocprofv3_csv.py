"""The ``rocprof`` reader on rocprofv3's CSV files: the example output in ROCprofiler-SDK's documentation (ROCm 6.2
and 7.0, fixtures/rocprof/v3_docs/SOURCE.md) and a hand-written set of two processes for what those lack (one
process's files together, agent_info, links; it says so). Every figure against an independent parse with ``csv``."""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, refused, run_cli
from traceparse.ingest import detect_reader, plan, read_paths
from traceparse.plugins import registry
from traceparse.sources import read_head

DOCS = FIXTURES / "rocprof" / "v3_docs"
TWO = FIXTURES / "rocprof" / "handwritten" / "v3_two_processes"
TRACE_FILES = sorted(p for p in DOCS.glob("*/*.csv")
                     if p.stem not in ("hip_api_stats", "counter_collection", "memory_allocation_trace",
                                       "scratch_memory_trace"))


def _rows(path: Path) -> list[dict]:
    """The file's rows, keys in lower case; blank lines skipped (one doc sample ends with one)."""
    with open(path, newline="") as f:
        return [{k.lower(): v for k, v in row.items()} for row in csv.DictReader(f) if any(row.values())]


def _expected(path: Path) -> dict:
    """What a file holds, by its header: rows per kind and their summed nanoseconds."""
    rows = _rows(path)
    kinds, ns = Counter(), Counter()
    for row in rows:
        if "kernel_name" in row:
            kind = "kernel"
        elif "direction" in row:
            kind = "memcpy"
        elif row["domain"] in ("MARKER_CORE_API", "MARKER_CORE_RANGE_API"):
            kind = "marker" if row["start_timestamp"] == row["end_timestamp"] else "region"
        else:
            kind = "api"
        kinds[kind] += 1
        ns[kind] += int(row["end_timestamp"]) - int(row["start_timestamp"])
    return {"kinds": dict(kinds), "ns": dict(ns)}


@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_documented_file_reads_as_written(path):
    assert detect_reader(path, registry()).name == "rocprof"
    events = read_paths([path])[0].events
    want = _expected(path)
    got = dict(events.group_by("kind").len().iter_rows())
    assert got == want["kinds"]
    assert dict(events.group_by("kind").agg(pl.col("duration_ns").sum()).iter_rows()) == want["ns"]
    names = [r.get("kernel_name") or r.get("function") for r in _rows(path)]
    if names[0] is not None:
        assert sorted(events["name"].to_list()) == sorted(names)


def test_rocm7_agents_and_streams_and_the_rocpd_export():
    """ROCm 7's kernel rows: "Agent 4" is agent 4 (no agent_info beside it, said in a warning), each on its HIP
    stream; grid 1024 × 1024 work-items in workgroups of 64 is 16 × 1024 workgroups; rocpd's export is named so."""
    path = DOCS / "rocm7.0" / "kernel_trace.csv"
    trace = read_paths([path])[0]
    k = trace.events.sort("start_ns")
    raw = sorted(_rows(path), key=lambda r: int(r["start_timestamp"]))
    assert set(k["device_id"].to_list()) == {4}
    assert k["stream_id"].to_list() == [int(r["stream_id"]) for r in raw] and len(set(k["stream_id"])) == 4
    assert set(zip(k["grid_x"].to_list(), k["grid_y"].to_list(), k["block_x"].to_list())) == {(16, 1024, 64)}
    assert any("no agent_info.csv beside the trace" in w for w in trace.meta.warnings)
    assert read_paths([DOCS / "rocm7.0" / "rocpd-to-csv.csv"])[0].meta.variant == "rocprofv3 CSV (rocpd convert)"


def test_copies_of_rocm_6_name_their_direction_and_gpu():
    """ROCm 6.2's copy file (integer agents, no Stream_Id; the sample ends without a line break after a whole
    row: kept, no warning): the GPU end of each copy is its device."""
    trace = read_paths([DOCS / "rocm6.2" / "memory_copy_trace.csv"])[0]
    rows = trace.events.sort("start_ns").select("copy_kind", "device_id", "name").rows()
    assert rows == [("HtoD", 1, "Memcpy HtoD"), ("DtoH", 1, "Memcpy DtoH")]
    assert not [w for w in trace.meta.warnings if "ends inside a row" in w]


@pytest.fixture(scope="module")
def two():
    return read_paths([TWO])[0]


def test_one_folder_of_two_processes_is_one_trace_with_links_per_process(two):
    """Each process counts its correlation ids from 1: the first process's kept, the second's moved past them,
    so a dispatch or copy links to its own process's call."""
    ev = two.events
    raw = {}
    for path in sorted(TWO.glob("*_*.csv")):
        pid = int(path.name.split("_")[0])
        for row in _rows(path):
            if int(row.get("correlation_id") or 0) > 0 and not row.get("domain", "").startswith("MARKER"):
                raw.setdefault(pid, set()).add(int(row["correlation_id"]))
    offset = {4242: 0, 4243: max(raw[4242])}
    calls = ev.filter(pl.col("kind") == "api").select("pid", "correlation_id").rows()
    ops = ev.filter(pl.col("kind").is_in(["kernel", "memcpy"])).select("pid", "correlation_id", "name").rows()
    for pid, link, _ in ops:
        assert (pid, link) in calls
    want = {(pid, int(r["correlation_id"]) + offset[pid]) for pid in (4242, 4243)
            for f in ("kernel_trace", "memory_copy_trace") for r in _rows(TWO / f"{pid}_{f}.csv")}
    assert {(pid, link) for pid, link, _ in ops} == want
    assert ev.filter(pl.col("kind").is_in(["region", "marker"]))["correlation_id"].null_count() == 3


def test_agent_info_names_the_gpu_and_gives_hip_s_index(two):
    """agent_info.csv: logical node 1 is the one GPU (index 0): an MI300X, 304 CUs, gfx942 (9.4); every GPU row
    is on device 0, a copy between GPUs from and to it."""
    (device,) = two.meta.devices
    assert (device.id, device.name, device.sm_count, device.compute_capability) == (0, "AMD Instinct MI300X", 304,
                                                                                  "9.4")
    assert device.extra["gfx"] == "gfx942" and device.extra["agent"] == 1
    gpu = two.events.filter(pl.col("kind").is_in(["kernel", "memcpy"]))
    assert set(gpu["device_id"].to_list()) == {0}
    dtod = gpu.filter(pl.col("copy_kind") == "DtoD")
    assert dtod.select("src_device", "dst_device").rows() == [(0, 0)]


def test_kernel_shapes_from_work_items(two):
    """Grid_Size counts work-items: 1000 in workgroups of 256 is 4 (the last in part), 65536 × 4 in 256 × 1 is
    256 × 4; ROCm 7's VGPR_Count and LDS_Block_Size are the registers and static shared memory."""
    k = two.events.filter(pl.col("kind") == "kernel").sort("start_ns")
    assert k.select("grid_x", "grid_y", "block_x").rows() == [(16, 1024, 64), (256, 4, 256), (4, 1, 256)]
    assert k["registers_per_thread"].to_list() == [None, 128, None]
    assert k["static_smem_bytes"].to_list() == [None, 1024, None]


def test_files_are_grouped_by_process():
    """Named as files, the two processes' files are two traces (one per pid prefix)."""
    groups = [sorted(p.name for p in group) for _, group in plan(sorted(TWO.glob("*.csv")))]
    assert groups == [sorted(p.name for p in TWO.glob("4242_*.csv")), sorted(p.name for p in TWO.glob("4243_*.csv"))]


def test_gpu_idle_sees_the_links(tmp_path):
    """The calls are linked to their work: gpu-idle tells host waits from queued work (not "links no call")."""
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(TWO), "--rule", "gpu-idle", "--all")
    assert code == 0, err
    assert "links no runtime call" not in " ".join(out.split()) and "host wait" in out


def test_a_row_ending_before_it_starts_is_refused(tmp_path):
    bad = tmp_path / "77_hip_api_trace.csv"
    bad.write_text('"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
                   '"HIP_RUNTIME_API","hipMalloc",77,77,1,1000,2000\n"HIP_RUNTIME_API","hipFree",77,77,2,3000,30\n')
    refused(["--store", str(tmp_path / "s"), "ingest", str(bad)],
            f"{bad}:3: Start_Timestamp and End_Timestamp, integer nanoseconds with the end no earlier than the "
            "start, got '3000' and '30'", tmp_path / "s")


def test_a_file_cut_inside_its_last_row_keeps_the_rest(tmp_path):
    """A profiler killed while writing: the last row, with no line break, cut inside its end time or before it."""
    for tail in ('"HIP_RUNTIME_API","hipFree",77,77,2,3000,30', '"HIP_RUNTIME_API","hipFree",77'):
        cut = tmp_path / "77_hip_api_trace.csv"
        cut.write_text('"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp",'
                       '"End_Timestamp"\n"HIP_RUNTIME_API","hipMalloc",77,77,1,1000,2000\n' + tail)
        trace = read_paths([cut])[0]
        assert trace.events.select("name", "duration_ns").rows() == [("hipMalloc", 1000)]
        assert f"{cut}:3: the file ends inside a row (the profiler stopped while writing it): that row is left " \
               "out" in trace.meta.warnings


def test_files_that_are_no_timeline(tmp_path):
    """A summary alone is refused, naming what was found; beside trace files, skipped with a warning."""
    stats = DOCS / "rocm6.2" / "hip_api_stats.csv"
    refused(["--store", str(tmp_path / "s"), "ingest", str(stats)],
            f"{stats}: no rocprofv3 trace file to read (found hip_api_stats.csv: summaries, counters or "
            "allocations; the timeline is in <pid>_kernel_trace.csv, <pid>_hip_api_trace.csv, "
            "<pid>_memory_copy_trace.csv)", tmp_path / "s")
    folder = tmp_path / "run"
    shutil.copytree(TWO, folder)
    shutil.copy(DOCS / "rocm7.0" / "memory_allocation_trace.csv", folder / "4242_memory_allocation_trace.csv")
    trace = read_paths([folder])[0]
    assert f"{folder}: skipped files that are not timeline rows: 4242_memory_allocation_trace.csv" \
        in trace.meta.warnings
    assert trace.events.height == read_paths([TWO])[0].events.height


def test_sniffing_claims_only_rocprofv3_headers():
    from traceparse_plugins.readers.rocprof.csv_trace import header_form

    assert header_form(read_head(TWO / "4242_agent_info.csv")) == "agents"
    assert header_form(b'"Name","Calls","TotalDurationNs","AverageNs","Percentage"\n') == "stats"
    assert header_form(b'Kind,Agent_Id,Queue_Id,Kernel_Name,Correlation_Id,Start_Timestamp,End_Timestamp\n') is None
    assert header_form(b'"ID","Process ID","Process Name","Host Name","Kernel Name"\n') is None  # ncu's CSV


def test_copies_of_unknown_memory_and_size_are_not_called_pinned_nor_empty(tmp_path):
    """rocprofv3's copy rows name no memory kind and no size. low-memcpy-overlap listed them with 0 bytes and said
    "The exposed copies are from and to pinned or device memory already"; the sizes are unknown ("-") now, and the
    advice is to pin them (the real ROCm 7.0 kernel and copy rows of the documentation, as one process's folder)."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("kernel_trace", "memory_copy_trace"):
        shutil.copy(DOCS / "rocm7.0" / f"{name}.csv", folder / f"9_{name}.csv")
    copies = _rows(DOCS / "rocm7.0" / "memory_copy_trace.csv")
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(folder), "--json")
    assert code == 0, err
    [overlap] = [f for f in json.loads(out)["findings"] if f["rule"] == "low-memcpy-overlap"]
    assert overlap["severity"] == "warning"
    assert sum(i["copies"] for i in overlap["items"]) == len(copies) == 4
    assert all(i["bytes"] is None and "(? -> ?)" in i["copy"] for i in overlap["items"])
    assert overlap["suggestion"].startswith("Use pinned host memory (pin_memory=True / cudaHostAlloc)")
