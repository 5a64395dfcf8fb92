"""The nvprof reader against independent parses of its fixtures (str.split, csv, sqlite3 and Decimal).

Every expected figure here is computed from the fixture files by code that
shares nothing with the reader: whitespace tokens instead of column edges,
the csv module, sqlite3 queries, Decimal arithmetic with nvprof's binary units.
"""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from collections import Counter
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, exact_int as exact, refused, run_cli
from traceparse.ingest import detect_reader, read_paths
from traceparse.plugins import registry
from traceparse.sources import read_head

NVPROF = FIXTURES / "nvprof"
FILES = sorted(p for p in NVPROF.glob("*/*") if p.name != "README.md")
TIME = {"ns": 1, "us": 10 ** 3, "ms": 10 ** 6, "s": 10 ** 9}
SIZE = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def time_ns(cell: str) -> int:
    m = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
    return exact(m.group(1), TIME[m.group(2)])


def size_bytes(cell: str) -> int:
    m = re.fullmatch(r"([\d.]+)(B|KB|MB|GB)", cell)
    return exact(m.group(1), SIZE[m.group(2)])


def read(path: Path):
    return read_paths([path])[0]


# -- independent parses ----------------------------------------------------
def text_oracle(path: Path) -> dict:
    """Rows, summed durations, calls and bytes of a text log, from whitespace tokens."""
    out = Counter()
    mode = None
    counters: dict[tuple, int] = {}
    device = kernel = None
    for line in path.read_text().splitlines():
        tokens = line.split()
        if "==" in line or not tokens:
            mode = None if (not tokens or "result" in line or "API calls" in line) else mode
            continue
        if "Time(%)" in tokens and "Calls" in tokens:
            mode = "summary"
        elif tokens[:2] == ["Start", "Duration"]:
            mode = "trace"
        elif tokens[0] == "Invocations":
            mode = "counters"
        elif tokens[:1] == ["Count"] and "Total" in tokens:
            mode = "unified"
        elif line.startswith('Device "'):
            device = line
        elif tokens[0] == "Kernel:":
            kernel = line.split("Kernel: ", 1)[1].strip()
        elif mode == "summary" and any(t.endswith("%") for t in tokens):
            i = next(i for i, t in enumerate(tokens) if t.endswith("%"))
            out["rows"] += 1
            out["duration"] += time_ns(tokens[i + 1])
            out["calls"] += int(tokens[i + 2])
        elif mode == "trace" and re.fullmatch(r"[\d.]+(ns|us|ms|s)", tokens[0]):
            out["rows"] += 1
            out["calls"] += 1
            if tokens[1] != "-":
                out["duration"] += time_ns(tokens[1])
            if any(f"  {n}" in line for n in ("[CUDA memcpy", "[CUDA memset", "[Unified Memory Memcpy")):
                sizes = [t for t in tokens if re.fullmatch(r"[\d.]+(B|KB|MB|GB)", t)]
                assert len(sizes) == 1, line
                out["bytes"] += size_bytes(sizes[0])
        elif mode == "counters" and tokens[0].isdigit():
            out["rows"] += 1
            out["calls"] += int(tokens[0])
            counters[(device, kernel)] = max(counters.get((device, kernel), 0), int(tokens[0]))
        elif mode == "unified" and tokens[0].isdigit():
            out["rows"] += 1
            out["calls"] += int(tokens[0])
            out["duration"] += time_ns(tokens[5])
            if tokens[4] != "-":
                out["bytes"] += size_bytes(tokens[4])
        elif mode == "unified" and line.startswith("Total "):
            out["rows"] += 1
            out["calls"] += int(tokens[-1])
    out["rows"] += len(counters)  # one aggregated kernel row per (device, kernel) the counters name
    out["calls"] += sum(counters.values())
    return dict(out)


def csv_tables(path: Path) -> list[tuple[list[str], list[str] | None, list[list[str]]]]:
    """(header, units row or None, rows) of every CSV table in a log."""
    tables, current = [], None
    for line in path.read_text().splitlines():
        if not line.strip() or "==" in line:
            current = None
            continue
        fields = next(csv.reader([line]))
        if line.startswith('"') and current is None:
            current = (fields, None, [])
            tables.append(current)
        elif current is not None and not current[2] and current[1] is None and not line.startswith('"') \
                and not re.match(r"^\d", line):
            tables[-1] = current = (current[0], fields, [])
        elif current is not None and current[1] is None and re.match(r"^[\d.]+,", line) and "Start" in current[0]:
            tables[-1] = current = (current[0], fields, [])  # a units row such as us,us,,,
        elif current is not None:
            current[2].append(fields)
    return tables


def csv_oracle(path: Path) -> dict:
    out = Counter()
    kernels: dict[tuple, int] = {}
    for header, units, rows in csv_tables(path):
        col = {name: i for i, name in enumerate(header)}
        for row in rows:
            assert len(row) == len(header)
            out["rows"] += 1
            if "Metric Name" in col or "Event Name" in col:
                calls = int(row[col["Invocations"]])
                out["calls"] += calls
                key = (row[col["Device"]], row[col["Kernel"]])
                kernels[key] = max(kernels.get(key, 0), calls)
            elif "Calls" in col:
                out["calls"] += int(row[col["Calls"]])
                out["duration"] += exact(row[col["Time"]], TIME[units[col["Time"]]])
            else:
                out["calls"] += 1
                out["duration"] += exact(row[col["Duration"]], TIME[units[col["Duration"]]])
                if "Size" in col and row[col["Size"]]:
                    out["bytes"] += exact(row[col["Size"]], SIZE[units[col["Size"]]])
    out["rows"] += len(kernels)
    out["calls"] += sum(kernels.values())
    return dict(out)


ACTIVITY = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMCPY2", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME",
            "CUPTI_ACTIVITY_KIND_DRIVER"]


def sqlite_oracle(path: Path) -> dict:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = Counter()
    for table in ACTIVITY:
        n, dur = conn.execute(f'SELECT count(*), sum("end" - start) FROM {table}').fetchone()
        out["rows"] += n
        out["calls"] += n
        out["duration"] += dur
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY2", "CUPTI_ACTIVITY_KIND_MEMSET"):
        out["bytes"] += conn.execute(f"SELECT sum(bytes) FROM {table}").fetchone()[0]
    conn.close()
    return dict(out)


def oracle(path: Path) -> dict:
    if path.suffix == ".nvvp":
        return sqlite_oracle(path)
    if path.suffix == ".csv":
        return csv_oracle(path)
    return text_oracle(path)


# -- every fixture ---------------------------------------------------------
def test_fixture_inventory():
    names = {p.relative_to(NVPROF).as_posix() for p in FILES}
    assert len(names) == 31
    assert {"real/cudajl_summary.log", "real/rlscope_gpu_trace_warning.csv", "handwritten/small.nvvp",
            "real/pytorch_wavelets_summary.log", "handwritten/copy_dominated_summary.log",
            "handwritten/metrics_events.log", "handwritten/gpu_trace_p2p.csv", "handwritten/sgemm_gpu_trace.log",
            "handwritten/sgemm_metrics.log"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fixture_is_detected_as_nvprof(path):
    assert detect_reader(path, registry()).name == "nvprof"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fixture_matches_independent_parse(path):
    expected = oracle(path)
    events = read(path).events
    assert events.height == expected["rows"]
    assert int(events["duration_ns"].sum() or 0) == expected.get("duration", 0)
    assert int(events["calls"].sum()) == expected["calls"]
    assert int(events["bytes"].sum() or 0) == expected.get("bytes", 0)
    assert events["event_id"].to_list() == list(range(events.height))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_fixture_ingests_and_every_rule_runs(path, store):
    code, out, err = run_cli("ingest", str(path), "--json")
    assert code == 0, err
    meta = json.loads(out)["traces"][0]
    assert meta["format"] == "nvprof" and meta["tool"] == "nvprof"
    assert meta["event_count"] == oracle(path)["rows"]
    code, out, err = run_cli("analyze", meta["id"], "--json")
    assert code in (0, 1), err
    assert "Traceback" not in err and "internal error" not in err


def test_kernels_known_only_from_metrics_have_no_time(store):
    """Metrics-only logs give kernel rows without durations: kernel-share counts their calls, not a time."""
    code, out, err = run_cli("analyze", str(NVPROF / "handwritten/metrics_events.log"), "--rule", "kernel-share",
                             "--json")
    assert code == 0, err
    metrics = json.loads(out)["findings"][0]["metrics"]
    assert (metrics["kernels"], metrics["calls"], metrics["kernel_time_ns"]) == (2, 4 + 12 + 6, None)


def test_other_formats_are_not_nvprof(fixtures_dir):
    reader = registry().reader("nvprof")
    others = [p for d in ("nsys", "torch", "ncu") for p in sorted((fixtures_dir / d).glob("*")) if p.is_file()]
    assert len(others) > 10
    for path in others:
        assert reader.sniff(path, read_head(path)) == 0.0, path


# -- summaries -------------------------------------------------------------
def logged_percent(path: Path) -> dict[str, float]:
    """Time(%) of each GPU-activity name, as the log prints it (text or CSV)."""
    shares = {}
    if path.suffix == ".csv":
        for header, _, rows in csv_tables(path):
            if header[0] == "Type":
                shares.update({r[7]: float(r[1]) for r in rows if r[0] == "GPU activities"})
            elif not shares:  # old layout: the first table is the GPU activities
                shares.update({r[6]: float(r[0]) for r in rows})
        return shares
    section = None
    for line in path.read_text().splitlines():
        if "API calls" in line:
            section = "api"
        elif "GPU activities:" in line or "Profiling result:" in line:
            section = "gpu"
        m = re.match(r"^\s*(?:GPU activities:)?\s+([\d.]+)%\s+\S+\s+\d+\s+\S+\s+\S+\s+\S+\s+(.+?)\s*$", line)
        if m and section == "gpu" and "API calls:" not in line:
            shares[m.group(2)] = float(m.group(1))
    return shares


SUMMARIES = ["real/cudajl_summary.log", "handwritten/summary_cuda10.log", "handwritten/summary_cuda8_notype.log",
             "handwritten/timeout_summary.log", "handwritten/unified_memory_summary.log", "handwritten/summary.csv",
             "handwritten/summary_notype.csv"]


@pytest.mark.parametrize("name", SUMMARIES)
def test_kernel_share_reproduces_the_logged_time_percent(name, store):
    path = NVPROF / name
    logged = logged_percent(path)
    kernels = {k: v for k, v in logged.items() if not k.startswith("[")}
    assert kernels
    code, out, err = run_cli("analyze", str(path), "--rule", "kernel-share", "--json", "--set", "kernel-share.top=100")
    assert code == 0, err
    items = {i["name"]: i["gpu_share_pct"] for i in json.loads(out)["findings"][0]["items"]}
    assert set(items) == set(kernels)
    for kernel, percent in kernels.items():
        assert items[kernel] == pytest.approx(percent, abs=0.01), kernel


def test_summary_rows_keep_total_min_max_and_calls():
    events = read(NVPROF / "handwritten/summary_cuda10.log").events
    row = events.filter(pl.col("name") == "[CUDA memcpy HtoD]").row(0, named=True)
    assert (row["kind"], row["copy_kind"], row["start_ns"], row["calls"]) == ("memcpy", "HtoD", None, 1287)
    assert (row["duration_ns"], row["min_ns"], row["max_ns"]) == (141_210_000, 864, 8_117_400)  # 141.21ms 864ns 8.1174ms
    assert row["pid"] == 4187 and row["group"] == "GPU activities"
    kinds = Counter(events["kind"].cast(pl.String))
    assert kinds == {"kernel": 6, "memcpy": 3, "memset": 1, "api": 12}
    old = read(NVPROF / "handwritten/summary_cuda8_notype.log").events
    assert Counter(old["kind"].cast(pl.String)) == {"memcpy": 3, "kernel": 1, "api": 6}
    assert old.filter(pl.col("name") == "cudaMallocPitch")["duration_ns"].item() == 8_914_430_000  # 8.91443s


def test_old_api_only_summary(tmp_path):
    path = tmp_path / "api-summary.log"  # nvprof 8 --print-api-summary: no Type column, no 'API calls:' message
    path.write_text("==8660== Profiling result:\n"
                    "Time(%)      Time     Calls       Avg       Min       Max  Name\n"
                    " 99.97%  8.91443s         2  4.45721s  8.2010us  8.91442s  cudaMallocPitch\n"
                    "  0.02%  1.6839ms        90  18.710us     136ns  918.95us  cuDeviceGetAttribute\n")
    events = read(path).events
    assert events["kind"].cast(pl.String).to_list() == ["api", "api"]
    assert events["group"].to_list() == ["API calls", "API calls"]


def test_program_output_and_prefixes_inside_lines(store):
    trace = read(NVPROF / "handwritten/summary_cuda10.log")
    assert trace.meta.extra["processes"] == {"4187": "python main.py --arch alexnet -b 16 --epochs 1 --lr 0.01 "
                                                     "/data/imagenet_small"}
    assert trace.meta.extra["skipped_lines"] == 4  # the program's own lines
    assert trace.meta.warnings == [f"{NVPROF / 'handwritten/summary_cuda10.log'}: nvprof Warning: 1 API trace "
                                   f"records have same start and end timestamps. (process 4187)"]


def test_several_processes_keep_their_pid_and_a_killed_one_is_reported():
    path = NVPROF / "handwritten/multiprocess_summary.log"
    trace = read(path)
    events = trace.events
    assert Counter(events["pid"].to_list()) == {21003: 7, 21002: 5}
    assert trace.meta.warnings == [f"{path}: process 21004 (./halo_exchange) has no results in the log (killed, "
                                   f"or the log cut short?)"]
    for pid in (21002, 21003):  # each process's own GPU share is its own Time(%)
        gpu = events.filter((pl.col("pid") == pid) & (pl.col("kind").cast(pl.String) != "api"))
        share = 100 * gpu.filter(pl.col("kind") == "kernel")["duration_ns"].sum() / gpu["duration_ns"].sum()
        text = path.read_text().split(f"=={pid}== Profiling result:")[1]
        assert share == pytest.approx(float(re.search(r"GPU activities:\s+([\d.]+)%", text).group(1)), abs=0.01)


def test_another_process_speaking_inside_a_table(tmp_path):
    lines = (NVPROF / "handwritten/gpu_trace.log").read_text().splitlines()
    lines.insert(12, "==30999== NVPROF is profiling process 30999, command: ./other")
    lines.insert(14, "step 3 done")  # and the program's own output
    path = tmp_path / "interleaved.log"
    path.write_text("\n".join(lines) + "\n")
    trace = read(path)
    assert trace.events.height == 9 and set(trace.events["pid"]) == {30176}
    assert trace.meta.warnings == [f"{path}: process 30999 (./other) has no results in the log (killed, or the "
                                   f"log cut short?)"]


def test_timeout_is_noted():
    trace = read(NVPROF / "handwritten/timeout_summary.log")
    assert trace.meta.extra["timed_out_pids"] == [29852]
    assert trace.meta.warnings == []


# -- traces ----------------------------------------------------------------
def test_gpu_trace_columns():
    events = read(NVPROF / "handwritten/gpu_trace.log").events
    first = events.row(0, named=True)
    assert first["start_ns"] == 998_120_000 and first["duration_ns"] == 6_404_900
    assert first["bytes"] == exact("38.147", 1 << 20) == 40_000_029
    assert (first["copy_kind"], first["src_memory"], first["dst_memory"]) == ("HtoD", "pageable", "device")
    assert first["device_id"] is None  # 'Tesla P100-PCIE': the column cut the index off
    assert (first["context_id"], first["stream_id"], first["pid"]) == (1, 7, 30176)
    assert events["start_ns"][1] == 1_004_630_000  # 1.00463s
    memset = events.filter(pl.col("kind") == "memset").row(0, named=True)
    assert (memset["bytes"], memset["dst_memory"], memset["src_memory"]) == (1028, "device", None)
    kernel = events.filter(pl.col("name") == "void reduce_kernel<float, int=256>(float const *, float*, unsigned long)")
    k = kernel.row(0, named=True)
    assert (k["grid_x"], k["grid_y"], k["grid_z"], k["block_x"], k["block_y"], k["block_z"]) == (1, 1, 1, 256, 1, 1)
    assert (k["registers_per_thread"], k["static_smem_bytes"], k["dynamic_smem_bytes"]) == (10, 4096, 1024)
    assert (k["correlation_id"], k["stream_id"]) == (115, 13)
    pinned = events.filter(pl.col("src_memory") == "pinned")
    assert pinned["bytes"].to_list() == [262_144] and pinned["stream_id"].to_list() == [13]


def test_merged_gpu_and_api_trace():
    events = read(NVPROF / "handwritten/gpu_api_trace.log").events
    assert Counter(events["kind"].cast(pl.String)) == {"api": 7, "memcpy": 2, "kernel": 1}
    launch = events.filter(pl.col("name") == "cudaLaunchKernel").row(0, named=True)
    kernel = events.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert launch["correlation_id"] == kernel["correlation_id"] == 112
    assert launch["device_id"] is None and launch["stream_id"] is None


def test_peer_copies_and_devices():
    events = read(NVPROF / "handwritten/gpu_trace_p2p.csv").events
    peer = events.filter(pl.col("copy_kind") == "PtoP")
    assert peer["device_id"].to_list() == [0, 1] and peer["bytes"].to_list() == [64 << 20] * 2
    assert [(d.id, d.name) for d in read(NVPROF / "handwritten/gpu_trace_p2p.csv").meta.devices] == [
        (0, "Tesla V100-SXM2-16GB"), (1, "Tesla V100-SXM2-16GB")]
    trace = read(NVPROF / "handwritten/gpu_trace_p2p.log")
    assert trace.events.filter(pl.col("copy_kind") == "PtoP")["context_id"].to_list() == [1, 2, 1]


def test_csv_units_row_and_normalized_time_unit():
    events = read(NVPROF / "handwritten/gpu_trace_cuda8_ms.csv").events
    first = events.row(0, named=True)
    assert first["start_ns"] == 254_961_023 and first["duration_ns"] == 1_050_208  # ms with 6 decimals
    assert first["bytes"] == exact("6.291456", 1 << 20)  # the Size column is in MB
    tr = events.filter(pl.col("name") == "transpose_shared(float*, float const *, int, int)").row(0, named=True)
    assert (tr["static_smem_bytes"], tr["dynamic_smem_bytes"]) == (exact("8.25", 1024), 2048)  # KB and B columns
    assert tr["correlation_id"] == 1114 and tr["device_id"] == 0
    real = read(NVPROF / "real/rlscope_gpu_trace.csv").events
    assert real["bytes"].to_list() == [1028, 128]  # 1.003906 KB, 0.125000 KB
    assert real["correlation_id"].to_list() == [272, 316]
    assert real["start_ns"].to_list() == [0, 4_643_346]


def test_api_traces():
    text = read(NVPROF / "real/rlscope_api_trace.txt").events
    assert text["start_ns"].to_list()[:3] == [0, 38_829_000, 38_833_000]
    assert text["duration_ns"].to_list()[:3] == [2415, 2405, 180]
    old = read(NVPROF / "handwritten/api_trace_cuda8.csv").events
    launch = old.filter(pl.col("name") == "cudaLaunch").row(0, named=True)
    assert launch["correlation_id"] == 112 and launch["kind"] == "api"


def test_unified_memory():
    trace = read(NVPROF / "handwritten/unified_memory_trace.log").events
    faults = trace.filter(pl.col("name") == "[Unified Memory CPU page faults]")
    assert faults["duration_ns"].to_list() == [None, None] and set(faults["group"]) == {"Unified Memory"}
    assert set(trace.filter(pl.col("group") == "Unified Memory")["kind"].cast(pl.String)) == {"marker"}
    summary = read(NVPROF / "handwritten/unified_memory_summary.log").events.filter(pl.col("group") == "Unified Memory")
    assert summary.select("name", "calls", "bytes", "duration_ns").rows() == [
        ("Host To Device", 2, exact("512.0000", 1024), 50_112), ("Device To Host", 13, 1 << 20, 97_696),
        ("Gpu page fault groups", 1, None, 228_190), ("CPU Page faults", 9, None, None)]


def test_a_gpu_trace_cut_short_is_kept_with_a_warning(store):
    path = NVPROF / "handwritten/gpu_trace_cut_short.log"
    code, out, err = run_cli("ingest", str(path), "--json")
    assert code == 0
    assert err == (f"traceparse: warning: {path}: the GPU trace under line 4 runs into the end of the file without "
                   f"nvprof's closing legend (log cut short?); kept its 5 complete rows\n")
    assert json.loads(out)["traces"][0]["event_count"] == 5


def test_a_last_row_without_line_break(tmp_path, store):
    path = tmp_path / "no-eol.csv"
    path.write_text((NVPROF / "real/rlscope_api_trace.csv").read_text().rstrip("\n"))
    code, out, err = run_cli("ingest", str(path), "--json")
    assert code == 0
    assert err == f"traceparse: warning: {path}:5: the file does not end with a line break; the last row may be " \
                  f"incomplete\n"


# -- counters --------------------------------------------------------------
def test_metric_and_event_counters():
    events = read(NVPROF / "handwritten/metrics_events.log").events
    counters = events.filter(pl.col("kind") == "counter")
    kernels = events.filter(pl.col("kind") == "kernel")
    assert counters.height == 20 and kernels.height == 3
    assert kernels["duration_ns"].to_list() == [None] * 3 and kernels["calls"].to_list() == [4, 12, 6]
    assert kernels["device_id"].to_list() == [0, 0, 1]
    by_id = {r["event_id"]: r for r in events.iter_rows(named=True)}
    k1 = "void sgemm_kernel<float, int=128>(int, int, int, float const *, float const *, float*)"
    for row in counters.iter_rows(named=True):
        parent = by_id[row["parent_id"]]
        assert parent["kind"] == "kernel" and parent["device_id"] == row["device_id"]
        assert parent["calls"] == row["calls"]
    dram = counters.filter((pl.col("name") == "dram_read_throughput") & (pl.col("calls") == 4)).row(0, named=True)
    assert (dram["value"], dram["value_min"], dram["value_max"], dram["unit"]) == (
        float(Decimal("122.69") * (1 << 30)), float(Decimal("121.35") * (1 << 30)), float(Decimal("124.02") * (1 << 30)),
        "byte/s")
    assert by_id[dram["parent_id"]]["name"] == k1
    eff = counters.filter(pl.col("name") == "gld_efficiency").row(0, named=True)
    assert (eff["value"], eff["value_min"], eff["value_max"], eff["unit"], eff["group"]) == (83.36, 82.21, 84.5, "%",
                                                                                             "metric")
    level = counters.filter(pl.col("name") == "shared_utilization").row(0, named=True)
    assert (level["value"], level["value_max"], level["unit"]) == (1.0, 2.0, "level")
    flops = counters.filter(pl.col("name") == "flop_count_sp").row(0, named=True)
    assert (flops["value"], flops["unit"]) == (1.0737e9, None)
    warps = counters.filter((pl.col("name") == "warps_launched") & (pl.col("device_id") == 1)).row(0, named=True)
    assert (warps["value"], warps["calls"], warps["group"]) == (64.0, 6, "event")


def test_csv_metrics_with_quoted_levels():
    events = read(NVPROF / "handwritten/metrics.csv").events
    row = events.filter(pl.col("name") == "sysmem_utilization").row(0, named=True)
    assert (row["value"], row["unit"]) == (2.0, "level")
    row = events.filter(pl.col("name") == "sysmem_write_throughput").row(0, named=True)
    assert row["value"] == float(Decimal("51.498413") * (1 << 20)) and row["unit"] == "byte/s"


def test_counters_link_to_the_logged_kernel_row(tmp_path):
    path = tmp_path / "both.log"
    path.write_text(
        "==7== Profiling result:\n"
        "            Type  Time(%)      Time     Calls       Avg       Min       Max  Name\n"
        " GPU activities:  100.00%  24.264us        12  2.0220us  2.0100us  2.0340us  relu_forward(float*, int)\n"
        "\n==7== Metric result:\n"
        "Invocations                               Metric Name                        Metric Description         Min"
        "         Max         Avg\n"
        'Device "Tesla K80 (0)"\n'
        "    Kernel: relu_forward(float*, int)\n"
        "         12                            gld_efficiency             Global Memory Load Efficiency     100.00%"
        "     100.00%     100.00%\n")
    events = read(path).events
    assert events.height == 2
    assert events["parent_id"].to_list() == [None, 0]


# -- SQLite ----------------------------------------------------------------
def test_sqlite_profile_against_sqlite3():
    path = NVPROF / "handwritten/small.nvvp"
    trace = read(path)
    events = trace.events
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(conn.execute("SELECT _id_, value FROM StringTable"))
    kernels = conn.execute("SELECT start, \"end\" - start, name, gridX, registersPerThread, dynamicSharedMemory, "
                           "correlationId FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL UNION ALL SELECT start, "
                           "\"end\" - start, name, gridX, registersPerThread, dynamicSharedMemory, correlationId "
                           "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    got = events.filter(pl.col("kind") == "kernel").select("start_ns", "duration_ns", "name", "grid_x",
                                                            "registers_per_thread", "dynamic_smem_bytes",
                                                            "correlation_id").rows()
    assert got == [(s, d, strings[n], g, r, ds, c) for s, d, n, g, r, ds, c in kernels]
    # CUpti_ActivityMemcpyKind / CUpti_ActivityMemoryKind as cupti_activity.h numbers them
    copy = {1: "HtoD", 2: "DtoH", 3: None, 8: "DtoD", 10: "PtoP"}
    memory = {1: "pageable", 2: "pinned", 3: "device", 4: "array"}
    copies = conn.execute("SELECT start, copyKind, srcKind, dstKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
                          "SELECT start, copyKind, srcKind, dstKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY2 "
                          "ORDER BY start").fetchall()
    got = events.filter(pl.col("kind") == "memcpy").select("start_ns", "copy_kind", "src_memory", "dst_memory",
                                                            "bytes").rows()
    assert got == [(s, copy[k], memory[a], memory[b], n) for s, k, a, b, n in copies]
    assert events.filter(pl.col("name") == "[CUDA memcpy HtoA]").height == 1
    # cupti_runtime_cbid.h: 20 cudaMalloc, 31 cudaMemcpy, 41 cudaMemcpyAsync, 51 cudaMemsetAsync,
    # 165 cudaDeviceSynchronize, 211 cudaLaunchKernel; cupti_driver_cbid.h: 9 cuDeviceGetAttribute, 307 cuLaunchKernel
    names = {20: "cudaMalloc", 31: "cudaMemcpy", 41: "cudaMemcpyAsync", 51: "cudaMemsetAsync",
             165: "cudaDeviceSynchronize", 211: "cudaLaunchKernel"}
    runtime = conn.execute("SELECT start, cbid, processId, threadId FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    got = events.filter(pl.col("group") == "runtime").select("start_ns", "name", "pid", "tid").rows()
    assert sorted(got) == sorted((s, names[c], p, t) for s, c, p, t in runtime)
    driver = events.filter(pl.col("group") == "driver")["name"].to_list()
    assert driver == ["cuDeviceGetAttribute", "cuLaunchKernel", "CUPTI driver cbid 9999"]
    launched = events.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"])
                             & (pl.col("correlation_id") > 0))
    assert set(launched["pid"]) == {4242}  # from the API call with the same correlation id
    assert events.filter(pl.col("correlation_id") == 0)["pid"].to_list() == [None]
    devices = {d.id: d for d in trace.meta.devices}
    rows = conn.execute("SELECT id, name, numMultiprocessors, globalMemorySize, computeCapabilityMajor, "
                        "computeCapabilityMinor, coreClockRate FROM CUPTI_ACTIVITY_KIND_DEVICE").fetchall()
    for dev_id, name, sms, mem, major, minor, clock in rows:
        d = devices[dev_id]
        assert (d.name, d.sm_count, d.memory_bytes, d.compute_capability, d.core_clock_mhz) == (
            strings[name], sms, mem, f"{major}.{minor}", clock / 1000)
    conn.close()


def test_nvvp_fixture_script_reproduces_the_committed_profile(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_nvvp_fixture", NVPROF / "make_nvvp_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = module.build(tmp_path / "fresh.nvvp")

    def dump(p):
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    assert dump(fresh) == dump(NVPROF / "handwritten/small.nvvp")


def test_gzip_compressed_profile(tmp_path):
    import gzip

    path = tmp_path / "small.nvvp.gz"
    path.write_bytes(gzip.compress((NVPROF / "handwritten/small.nvvp").read_bytes()))
    assert detect_reader(path, registry()).name == "nvprof"
    assert read(path).events.height == sqlite_oracle(NVPROF / "handwritten/small.nvvp")["rows"]


# -- pieces ----------------------------------------------------------------
def test_device_cells_cut_by_the_column_width():
    from traceparse_plugins.readers.nvprof.devices import DeviceBook

    book = DeviceBook()
    book.note("Tesla P100-PCIE-16GB (0)")
    assert book.resolve("Tesla P100-PCIE") == 0
    assert book.resolve("Tesla V100-SXM2") is None
    assert book.resolve("Tesla K80 (3)") == 3
    book.note("Tesla P100-PCIE-16GB (1)")
    assert book.resolve("Tesla P100-PCIE") is None  # two devices start that way: unknown


def test_exact_unit_conversion():
    from traceparse_plugins.readers.nvprof.units import SIZE_UNITS, TIME_UNITS, split_number, to_ints

    cells = ["512ns", "4.5440us", "8.6348ms", "1.26312s", "0.0005us", "0.0015us", "38.147MB", "4.0000KB", "0B",
             "1.0737GB"]
    parts = pl.DataFrame({"cell": cells}).select(*split_number(pl.col("cell")))
    number, unit = parts[:, 0], parts[:, 1]
    got = to_ints(number, unit, TIME_UNITS).fill_null(to_ints(number, unit, SIZE_UNITS)).to_list()
    # 0.5 ns and 1.5 ns ties round half to even (traceparse.units' one rule)
    assert got == [512, 4544, 8_634_800, 1_263_120_000, 0, 2, 40_000_029, 4096, 0, exact("1.0737", 1 << 30)]


def test_formats_lists_nvprof(store):
    code, out, _ = run_cli("formats", "--json")
    entry = next(f for f in json.loads(out)["formats"] if f["name"] == "nvprof")
    assert any("SQLite" in v for v in entry["variants"]) and any("--csv" in v for v in entry["variants"])


# -- bad input -------------------------------------------------------------
def test_cut_mid_line_keeps_the_rows_before(tmp_path):
    """A `--print-gpu-trace` log cut inside a row (a profiler killed) was refused whole; the complete rows are
    read, with the cut line named (the CSV form: test_a_cut_csv_trace_keeps_its_complete_rows)."""
    source = NVPROF / "handwritten/gpu_trace.log"
    lines = source.read_text().splitlines()
    path = tmp_path / "cut.log"
    path.write_text("\n".join(lines[:11]) + "\n" + lines[11][:60])
    whole = tmp_path / "whole.log"
    whole.write_text("\n".join(lines[:11]) + "\n")
    trace = read(path)
    columns = ["kind", "name", "start_ns", "duration_ns", "device_id", "stream_id"]
    assert trace.meta.warnings[0] == (f"{path}:12: cut short (the row does not line up with the header); kept the "
                                      "3 complete rows before it")
    assert trace.events.select(columns).equals(read(whole).events.select(columns))


def test_header_without_rows(tmp_path, store):
    path = tmp_path / "header.log"
    path.write_text("==12== Profiling result:\n   Start  Duration  Name\n")
    refused(["ingest", str(path)], f"{path}:2: a result table header with no rows under it: expected at least one "
                                   f"result row", store)
    path = tmp_path / "header.csv"
    path.write_text('======== Profiling result:\n"Start","Duration","Name","Correlation_ID"\nus,us,,\n')
    refused(["ingest", str(path)], f"{path}:2: a result table header with no rows under it: expected at least one "
                                   f"result row", store)


def test_wrong_column_count(tmp_path, store):
    path = tmp_path / "fields.csv"
    path.write_text((NVPROF / "real/rlscope_gpu_trace.csv").read_text().replace('"[CUDA memset]",272', '272'))
    refused(["ingest", str(path)], f"{path}:4: expected 20 comma-separated fields as in the header on line 2, "
                                   f"found 19", store)
    lines = (NVPROF / "handwritten/gpu_trace.log").read_text().splitlines()
    lines[11] = lines[11].replace("     (39063 1 1)", "                ")
    path = tmp_path / "columns.log"
    path.write_text("\n".join(lines) + "\n")
    refused(["ingest", str(path)], f"{path}:12: expected 15 columns (Start, Duration, Grid Size, Block Size, Regs*, "
                                   f"SSMem*, DSMem*, Size, Throughput, SrcMemType, DstMemType, Device, Context, Stream, "
                                   f"Name), found 14 that do not line up with the header on line 8", store)
    path = tmp_path / "summary.log"
    path.write_text("==9== Profiling result:\nTime(%)      Time     Calls       Avg       Min       Max  Name\n"
                    " 62.21%  122.37us         1  122.37us  122.37us\n")
    refused(["ingest", str(path)], f"{path}:3: expected 7 columns (Time(%), Time, Calls, Avg, Min, Max, Name) in a "
                                   f"summary row, found 5 fields", store)


def test_not_a_number(tmp_path, store):
    path = tmp_path / "nan.log"
    path.write_text((NVPROF / "handwritten/gpu_trace.log").read_text().replace(" 3.4072ms ", " 3.4072xs "))
    refused(["ingest", str(path)], f"{path}:12: column 'Duration': expected a time such as 4.5440us, found "
                                   f"'3.4072xs'", store)
    path = tmp_path / "nan.csv"
    path.write_text((NVPROF / "handwritten/summary.csv").read_text().replace(",13672,93", ",13x72,93"))
    refused(["ingest", str(path)], f"{path}:6: column 'Calls': expected a whole number, found '13x72'", store)
    path = tmp_path / "nan-metric.log"
    path.write_text((NVPROF / "handwritten/metrics_events.log").read_text().replace("83.36%", "83.3.6%"))
    refused(["ingest", str(path)], f"{path}:26: column 'Avg': expected a number, a percentage, a rate such as "
                                   f"1.2GB/s or a level such as Low (1), found '83.3.6%'", store)


def test_sqlite_missing_tables_and_bad_records(tmp_path, store):
    path = tmp_path / "strings.nvvp"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT)")
    conn.commit()
    conn.close()
    refused(["ingest", "--format", "nvprof", str(path)],
            f"{path}: not an nvprof SQLite profile: it has none of the tables " + ", ".join(ACTIVITY), store)
    path = tmp_path / "kernels.nvvp"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (_id_ INTEGER PRIMARY KEY, start INTEGER, end INTEGER, "
                 "name INTEGER)")
    conn.commit()
    conn.close()
    refused(["ingest", "--format", "nvprof", str(path)],
            f"{path}: not an nvprof SQLite profile: it has no table StringTable", store)
    path = tmp_path / "text-start.nvvp"
    (tmp_path / "text-start.nvvp").write_bytes((NVPROF / "handwritten/small.nvvp").read_bytes())
    conn = sqlite3.connect(path)
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL SET start = 'soon' WHERE _id_ = 2")
    conn.commit()
    conn.close()
    refused(["ingest", str(path)], f"{path}: table CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL row _id_=2: start must be an "
                                   f"integer timestamp in ns, found 'soon'", store)


def test_other_formats_forced_as_nvprof(fixtures_dir, store):
    torch = fixtures_dir / "torch/alexnet_bs4.json.gz"
    refused(["ingest", "--format", "nvprof", str(torch)],
            f"{torch}: not an nvprof log: found no nvprof result table (expected a '==PID== Profiling result:' "
            f"section, an nvprof CSV header, or an nvprof SQLite profile)", store)
    nsys = fixtures_dir / "nsys/resnet18_bs8.sqlite.gz"
    refused(["ingest", "--format", "nvprof", str(nsys)],
            f"{nsys}: an Nsight Systems SQLite export (it has a StringIds table), not nvprof output: read it with "
            f"--format nsys", store)


def test_killed_before_results(tmp_path, store):
    path = tmp_path / "killed.log"
    path.write_text("==68863== NVPROF is profiling process 68863, command: python main.py --arch alexnet\n"
                    "=> creating model 'alexnet'\n")
    refused(["ingest", str(path)], f"{path}: an nvprof log without any result table: it ends before nvprof printed "
                                   f"its results (run killed or log cut short?)", store)


def test_text_in_the_device_table_is_unknown_with_a_warning_naming_file_field_and_value():
    """handwritten/bad_device_integers.nvvp, a hand-made edge case: text where nvprof writes integers in
    CUPTI_ACTIVITY_KIND_DEVICE. Each such figure is unknown, and each is said once, naming the file, the field
    and the value; the other figures are the database's."""
    path = NVPROF / "handwritten" / "bad_device_integers.nvvp"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    raw = {row[0]: row[1:] for row in conn.execute(
        "SELECT id, globalMemorySize, coreClockRate, numMultiprocessors FROM CUPTI_ACTIVITY_KIND_DEVICE")}
    conn.close()
    assert raw == {0: ("80GB", "1.4GHz", 56), 1: (16945512448, 1530000, "many")}
    trace = read(path)
    trace.events  # reading the events runs the validation step, which checks the devices too
    devices = {d.id: d for d in trace.meta.devices}
    assert (devices[0].memory_bytes, devices[0].core_clock_mhz, devices[0].sm_count) == (None, None, 56)
    assert (devices[1].memory_bytes, devices[1].core_clock_mhz, devices[1].sm_count) == (16945512448, 1530.0, None)
    assert trace.meta.warnings == [
        f"{path}: CUPTI_ACTIVITY_KIND_DEVICE.coreClockRate '1.4GHz' is not a number of kHz; the clock is left "
        "unknown",
        f"{path}: dropped 1 device value whose memory_bytes is not a whole number of bytes above 0 (first: "
        "device 0, memory_bytes='80GB')",
        f"{path}: dropped 1 device value whose sm_count is not a whole number of SMs above 0 (first: device 1, "
        "sm_count='many')"]


#: Hand-written after a real `nvprof -u ms --log-file` summary (XPlacer-ML-DataPlacement's bfs on a V100, CUDA
#: 10.2): a units row under the header, bare numbers in the cells, and a unified-memory value wider than its column.
SUMMARY_IN_MS = """==5324== Profiling result:
            Type  Time(%)      Time     Calls       Avg       Min       Max  Name
                        %        ms                  ms        ms        ms
 GPU activities:    84.55  0.341204        14  0.024371  1.47e-03  0.306258  [CUDA memcpy HtoD]
                     9.41  0.037986         8  4.75e-03  2.11e-03  6.24e-03  Kernel(Node*, int*, bool*, int)
      API calls:    92.34  270.1498         6  45.02497  5.62e-03  270.1088  cudaMalloc
                     0.04  0.126402        16  7.90e-03  5.96e-03  0.016592  cudaLaunchKernel

==5324== Unified Memory profiling result:
Device "Tesla V100-SXM2-16GB (0)"
   Count  Avg Size  Min Size  Max Size  Total Size  Total Time  Name
       1         -         -         -           -    0.298016ms  Gpu page fault groups
"""


def test_summary_with_a_normalized_time_unit(tmp_path):
    """nvprof -u ms: refused ("a result table header with no rows under it" at the units row, then a unified-
    memory value that runs past its column)."""
    path = tmp_path / "output_graph4096.log"
    path.write_text(SUMMARY_IN_MS)
    events = read(path).events
    rows = {r["name"]: r for r in events.iter_rows(named=True)}
    assert rows["[CUDA memcpy HtoD]"]["duration_ns"] == 341_204 and rows["[CUDA memcpy HtoD]"]["calls"] == 14
    assert (rows["[CUDA memcpy HtoD]"]["min_ns"], rows["[CUDA memcpy HtoD]"]["max_ns"]) == (1_470, 306_258)
    kernel = rows["Kernel(Node*, int*, bool*, int)"]
    assert (kernel["kind"], kernel["duration_ns"], kernel["calls"]) == ("kernel", 37_986, 8)
    assert rows["cudaMalloc"]["duration_ns"] == 270_149_800 and rows["cudaLaunchKernel"]["calls"] == 16


def test_a_cut_csv_trace_keeps_its_complete_rows(tmp_path):
    """An `nvprof --csv --print-gpu-trace` file cut short (the real rlscope trace, cut inside a row's numbers or
    inside its quoted name) was refused whole; its complete rows are read now, with the cut line named, and the
    figures say they cover what was read."""
    source = NVPROF / "real" / "rlscope_gpu_trace.csv"
    lines = source.read_text().split("\n")
    row = 4  # the second and last data row (lines[3] is the first)
    columns = ["kind", "name", "start_ns", "duration_ns", "device_id", "stream_id", "correlation_id"]
    whole = tmp_path / "whole.csv"
    whole.write_text("\n".join(lines[:row]) + "\n")
    kept = read(whole).events.select(columns)
    for cut_at, why in ((20, f"{lines[row][:20].count(',') + 1} of the header's 20 fields"),
                        (lines[row].rindex('"[') + 6, "a quoted field does not close")):
        path = tmp_path / f"cut{cut_at}.csv"
        path.write_text("\n".join(lines[:row]) + "\n" + lines[row][:cut_at])
        trace = read(path)
        assert trace.meta.warnings == [f"{path}:{row + 1}: cut short ({why}); kept the {row - 3} complete row "
                                       "before it"]
        assert trace.events.select(columns).equals(kept) and kept.height == row - 3


def test_a_csv_name_over_two_lines(tmp_path):
    """Hand-written edge case (RFC 4180): a quoted Name holding a line break was "expected 20 fields, found 19";
    it is one row, and the rows after it are read as before."""
    source = NVPROF / "real" / "rlscope_gpu_trace.csv"
    lines = source.read_text().split("\n")
    lines[3] = lines[3].replace('"[CUDA memset]"', '"[CUDA\nmemset]"')
    path = tmp_path / "nl.csv"
    path.write_text("\n".join(lines))
    events, whole = read(path).events, read(source).events
    assert events.height == whole.height
    assert events["name"].to_list() == [n.replace("[CUDA memset]", "[CUDA\nmemset]", 1) if i == 0 else n
                                        for i, n in enumerate(whole["name"].to_list())]


@pytest.mark.parametrize("keep", [4, 8])
def test_a_summary_cut_short_says_so(tmp_path, keep):
    """A summary log cut inside its last table (the real CUDA.jl summary, its first ``keep`` lines) was read with
    no word: its Time(%) column, which sums to 100% per section, says rows are missing. Kept whole (all 8 lines),
    nothing is said. (Rows of 0.00% cut off cannot be told from the sum, and are not.)"""
    source = NVPROF / "real" / "cudajl_summary.log"
    lines = source.read_text().splitlines()
    path = tmp_path / "cut.log"
    path.write_text("\n".join(lines[:keep]) + "\n")
    api = [float(re.search(r"([\d.]+)%", line).group(1)) for line in lines[3:keep]]
    trace = read(path)
    if keep == len(lines):
        assert not trace.meta.warnings
        return
    assert trace.meta.warnings == [f"{path}: the API calls table under line 2 runs into the end of the file with its "
                                   f"Time(%) summing to {sum(api):.2f}%, not 100% (log cut short?); kept its "
                                   f"{len(api)} complete rows"]


def test_a_whole_summary_says_nothing_of_a_cut(tmp_path):
    for source in sorted(NVPROF.glob("*/*summary*")):
        assert not [w for w in read(source).meta.warnings if "not 100%" in w], source


def test_a_metrics_log_lists_its_kernels_without_times_and_the_summary_says_so(store):
    """A metrics-only log (hand-written after nvprof's layout) names its kernels and never says when they ran:
    the summary said "the trace recorded no GPU activity" beside kernel-share's table of those kernels. It now
    says how many it lists (the log's ``Kernel:`` lines, counted here) and that no busy time can be given."""
    path = NVPROF / "handwritten" / "sgemm_metrics.log"
    kernels = path.read_text().count("Kernel:")
    assert run_cli("ingest", "-q", str(path))[0] == 0
    code, out, _ = run_cli("analyze", "--json")
    summary = json.loads(out)["summary"][0]
    assert (code, summary["gpu_busy_pct"], summary["gpu_untimed"]) == (0, None, {"kernel": kernels})
    code, out, _ = run_cli("--width", "200", "analyze")
    assert f"GPU busy    - (the trace lists {kernels} kernels but never when they ran (a metrics-only log): no busy " \
           "time to give)" in out
    assert "recorded no GPU activity" not in out
