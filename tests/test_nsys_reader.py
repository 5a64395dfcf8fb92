"""The Nsight Systems reader: nsys stats reports (CSV, TSV, console table), the SQLite export, .nsys-rep.

Every figure is checked against an independent computation made here with
the csv, sqlite3 and decimal modules on the same files: the real fixtures of
fixtures/nsys (one capture on an H100, nsys 2025.3: CSV reports, table,
SQLite export and .nsys-rep of the same run), the hand-made older layouts of
fixtures/nsys/handwritten, and the shared samples (skipped when absent).
"""

from __future__ import annotations

import csv
import re
import gzip
import json
import shutil
import sqlite3
import stat
import sys
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, exact_int, intersect, refused, run_cli, union
from traceparse.errors import InputError
from traceparse.analysis import analyze
from traceparse.ingest import detect_reader, read_group
from traceparse.plugins import registry
from traceparse.store import Store

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "nsys"
HAND = FIX / "handwritten"
PREFIX = FIX / "resnet18_bs8"
CSV_REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum",
               "cuda_gpu_mem_size_sum", "nvtx_sum")


# ------------------------------------------------------------------ helpers


#: The kernel table as nsys 2020-2025 exports write it (the columns the reader reads), for hand-made exports.
KERNEL_TABLE = """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
            contextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER,
            shortName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
            blockZ INTEGER, registersPerThread INTEGER, staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);"""

def reader():
    return registry().reader("nsys")


def read(*paths: Path, warnings: list | None = None):
    """Read paths as one group with the nsys reader (all events collected)."""
    trace = read_group(reader(), list(paths))
    trace.events  # consume a streamed trace: fills warnings
    if warnings is not None:
        warnings.extend(trace.meta.warnings)
    return trace


def of_kind(trace, kind: str) -> pl.DataFrame:
    return trace.events.filter(pl.col("kind") == kind)


def size(text: str, factor: int, row: dict | None = None) -> int | None:
    """A size column's bytes as the reader gives them: exact, but where nsys rounded it to zero ("0.000" MB: under
    500 bytes, not nothing) the row's Throughput (MB/s) × its duration, else None."""
    value = exact(text, factor)
    if value == 0 and factor > 1:
        rate = Decimal((row or {}).get("Throughput (MB/s)") or (row or {}).get("Throughput (MBps)") or "0")
        return round(rate * 10**6 * int(row["Duration (ns)"]) / 10**9) if rate > 0 else None
    return value


def exact(text: str, factor: int) -> int:
    """Decimal text (thousands separated by commas) times factor, rounded half to even (traceparse.units' one rule): the independent unit conversion."""
    return exact_int(text.replace(",", ""), factor)


def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def op_kind(name: str) -> str:
    return "memcpy" if name.startswith("[CUDA memcpy") else "memset" if name.startswith("[CUDA memset") else "kernel"


def gpu_trace_totals(path: Path, duration: str = "Duration (ns)", factor: int = 1) -> dict[str, tuple[int, int]]:
    """kind -> (count, total duration ns) of a gpu trace CSV."""
    out: dict[str, list[int]] = {"kernel": [], "memcpy": [], "memset": []}
    for r in csv_rows(path):
        out[op_kind(r["Name"])].append(exact(r[duration], factor))
    return {k: (len(v), sum(v)) for k, v in out.items()}


def sqlite_copy(gz: Path, tmp_path: Path) -> Path:
    plain = tmp_path / "export.sqlite"
    with gzip.open(gz) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return plain


def sqlite_totals(plain: Path) -> dict[str, tuple[int, int]]:
    db = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
    out = {}
    for kind, table in (("kernel", "KERNEL"), ("memcpy", "MEMCPY"), ("memset", "MEMSET"), ("api", "RUNTIME")):
        n, total = db.execute(f'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_{table}').fetchone()
        out[kind] = (n, total or 0)
    db.close()
    return out


def totals(trace, kind: str) -> tuple[int, int]:
    rows = of_kind(trace, kind)
    return rows.height, int(rows["duration_ns"].sum() or 0)


# ------------------------------------------------------- the real fixtures (always run)

def test_gpu_trace_csv_matches_independent_count(fixtures_dir):
    path = Path(f"{PREFIX}_cuda_gpu_trace.csv")
    trace = read(path)
    expected = gpu_trace_totals(path)
    for kind in ("kernel", "memcpy", "memset"):
        assert totals(trace, kind) == expected[kind]
    rows = csv_rows(path)
    copies = of_kind(trace, "memcpy").sort("start_ns")
    want = sorted((int(r["Start (ns)"]), size(r["Bytes (MB)"], 10**6, r), r["SrcMemKd"].lower(), r["DstMemKd"].lower())
                  for r in rows if op_kind(r["Name"]) == "memcpy")
    assert copies.select("start_ns", "bytes", "src_memory", "dst_memory").rows() == want
    assert sorted(copies["copy_kind"].cast(pl.String).to_list()) == ["DtoD", "DtoH", "HtoD", "HtoD", "HtoD", "HtoD"]
    assert copies.filter(pl.col("src_memory") == "pageable").height == 1
    assert set(of_kind(trace, "memset")["dst_memory"].cast(pl.String).to_list()) == {"device"}
    kernels = of_kind(trace, "kernel").sort("start_ns")
    first = next(r for r in rows if op_kind(r["Name"]) == "kernel")
    k0 = kernels.row(0, named=True)
    assert (k0["name"], k0["grid_x"], k0["grid_y"], k0["grid_z"], k0["block_x"], k0["registers_per_thread"],
            k0["static_smem_bytes"], k0["stream_id"], k0["correlation_id"], k0["device_id"]) == (
        first["Name"], int(first["GrdX"]), int(first["GrdY"]), int(first["GrdZ"]), int(first["BlkX"]),
        int(first["Reg/Trd"]), size(first["StcSMem (MB)"], 10**6), int(first["Strm"]), int(first["CorrId"]), 0)
    assert [(d.id, d.name) for d in trace.meta.devices] == [(0, "NVIDIA H100 80GB HBM3")]
    assert trace.events["calls"].to_list() == [1] * trace.events.height


def test_api_trace_csv_matches_independent_count():
    path = Path(f"{PREFIX}_cuda_api_trace.csv")
    rows = csv_rows(path)
    api = of_kind(read(path), "api")
    assert api.height == len(rows) == 700
    assert int(api["duration_ns"].sum()) == sum(int(r["Duration (ns)"]) for r in rows)
    assert sorted(set(api["pid"].to_list())) == sorted({int(r["Pid"]) for r in rows})
    assert api.filter(pl.col("name") == "cudaMemcpyAsync").height == sum(r["Name"] == "cudaMemcpyAsync" for r in rows)


@pytest.mark.parametrize("report,kind,count,total", [
    ("cuda_gpu_kern_sum", "kernel", "Instances", "Total Time (ns)"),
    ("cuda_api_sum", "api", "Num Calls", "Total Time (ns)"),
    ("cuda_gpu_mem_time_sum", None, "Count", "Total Time (ns)"),
    ("nvtx_sum", "marker", "Instances", "Total Time (ns)"),
])
def test_summary_csv_alone_gives_aggregated_rows(report, kind, count, total):
    path = Path(f"{PREFIX}_{report}.csv")
    rows = csv_rows(path)
    events = read(path).events
    assert events.height == len(rows)
    assert events["start_ns"].null_count() == events.height
    assert int(events["calls"].sum()) == sum(int(r[count]) for r in rows)
    assert int(events["duration_ns"].sum()) == sum(int(r[total]) for r in rows)
    assert int(events["min_ns"].min()) == min(int(r["Min (ns)"]) for r in rows)
    assert int(events["max_ns"].max()) == max(int(r["Max (ns)"]) for r in rows)
    if kind is not None:
        assert set(events["kind"].cast(pl.String).to_list()) == {kind}
    else:
        assert sorted(events["kind"].cast(pl.String).to_list()) == sorted(op_kind(r["Operation"]) for r in rows)


def test_nvtx_sum_domain_prefix_goes_to_group():
    events = read(Path(f"{PREFIX}_nvtx_sum.csv")).events
    rows = csv_rows(Path(f"{PREFIX}_nvtx_sum.csv"))
    assert all(r["Range"].startswith(":") for r in rows)  # default domain, written ':name' by nsys 2025.3
    assert sorted(events["name"].to_list()) == sorted(r["Range"][1:] for r in rows)
    assert events["group"].null_count() == events.height


def test_mem_size_sum_bytes_are_decimal_megabytes():
    path = Path(f"{PREFIX}_cuda_gpu_mem_size_sum.csv")
    rows = csv_rows(path)
    events = read(path).events
    assert events.sort("name")["bytes"].to_list() == [size(r["Total (MB)"], 10**6) for r in
                                                      sorted(rows, key=lambda r: r["Operation"])]


def test_nsys_megabyte_is_one_million_bytes(tmp_path):
    """The CSV's 'Bytes (MB)' against the exact bytes the SQLite export of the same capture has."""
    db = sqlite3.connect(f"file:{sqlite_copy(Path(f'{PREFIX}.sqlite.gz'), tmp_path)}?mode=ro", uri=True)
    exact_bytes = dict(db.execute("SELECT correlationId, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    checked = 0
    for r in csv_rows(Path(f"{PREFIX}_cuda_gpu_trace.csv")):
        if op_kind(r["Name"]) == "memcpy":
            b = exact_bytes[int(r["CorrId"])]
            assert r["Bytes (MB)"] == f"{Decimal(b) / 10**6:.3f}"            # 10^6, not 2^20
            assert r["Bytes (MB)"] != f"{Decimal(b) / 2**20:.3f}" or b < 1000
            checked += 1
    assert checked == 6


def test_fixture_group_is_one_trace_without_double_counting(tmp_path):
    paths = sorted(FIX.glob("resnet18_bs8_*"))  # 7 CSVs and the console table of the same capture
    assert len(paths) == 8
    groups = reader().group(paths)
    assert len(groups) == 1 and sorted(groups[0]) == paths
    warnings: list[str] = []
    trace = read(*groups[0], warnings=warnings)
    expected = gpu_trace_totals(Path(f"{PREFIX}_cuda_gpu_trace.csv"))
    for kind in ("kernel", "memcpy", "memset"):
        assert totals(trace, kind) == expected[kind]  # the summaries are not added on top
    assert of_kind(trace, "api").height == 700 and of_kind(trace, "api")["start_ns"].null_count() == 0
    assert of_kind(trace, "marker").height == 5  # nvtx_sum: no trace report covers markers
    reports = trace.meta.extra["reports"]
    assert reports["cuda_gpu_trace"]["kinds_used"] == ["kernel", "memcpy", "memset"]
    assert reports["cuda_gpu_kern_sum"]["kinds_used"] == []
    assert reports["cuda_api_sum"]["kinds_used"] == [] and reports["cuda_api_trace"]["kinds_used"] == ["api"]
    assert reports["nvtx_sum"]["kinds_used"] == ["marker"]
    assert trace.meta.extra["files_skipped"] == {
        "resnet18_bs8_cuda_gpu_kern_sum_table.txt": "same report as resnet18_bs8_cuda_gpu_kern_sum.csv"}
    assert not any("same capture" in w for w in warnings)


def test_sqlite_export_matches_independent_count(tmp_path):
    gz = Path(f"{PREFIX}.sqlite.gz")
    plain = sqlite_copy(gz, tmp_path)
    trace = read(gz)
    for kind, want in sqlite_totals(plain).items():
        assert totals(trace, kind) == want, kind
    db = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
    assert int(of_kind(trace, "memcpy")["bytes"].sum()) == db.execute(
        "SELECT sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    pinned = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEM_KIND k "
                        "ON k.id = m.srcKind WHERE k.name = 'CUDA_MEMOPR_MEMORY_KIND_PINNED'").fetchone()[0]
    assert of_kind(trace, "memcpy").filter(pl.col("src_memory") == "pinned").height == pinned == 3
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    demangled = sorted(names[i] for (i,) in db.execute("SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    assert sorted(of_kind(trace, "kernel")["name"].to_list()) == demangled
    pids = {g >> 24 & 0xFFFFFF for (g,) in db.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    process_pids = {p for (p,) in db.execute("SELECT pid FROM PROCESSES WHERE name LIKE 'python%'")}
    assert set(of_kind(trace, "kernel")["pid"].to_list()) == pids and pids <= process_pids
    ranges = sorted(db.execute('SELECT text, "end" - start FROM NVTX_EVENTS WHERE eventType = 59'))
    assert sorted(of_kind(trace, "marker").select("name", "duration_ns").rows()) == ranges
    gpu = db.execute("SELECT name, smCount, totalMemory, computeMajor, computeMinor, clockRate "
                     "FROM TARGET_INFO_GPU").fetchall()
    d = trace.meta.devices
    assert [(x.name, x.sm_count, x.memory_bytes, x.compute_capability, x.core_clock_mhz) for x in d] == [
        (n, sm, mem, f"{a}.{b}", clock / 1e6) for n, sm, mem, a, b, clock in gpu]
    version = db.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()[0]
    assert trace.meta.tool_version == version


def test_sqlite_and_csv_of_the_same_capture_agree(tmp_path):
    from_sqlite = read(Path(f"{PREFIX}.sqlite.gz"))
    from_csv = read(Path(f"{PREFIX}_cuda_gpu_trace.csv"))
    for kind in ("kernel", "memcpy", "memset"):
        assert totals(from_sqlite, kind) == totals(from_csv, kind)
    a = of_kind(from_sqlite, "kernel").sort("correlation_id").select("correlation_id", "name", "duration_ns")
    b = of_kind(from_csv, "kernel").sort("correlation_id").select("correlation_id", "name", "duration_ns")
    assert a.equals(b)
    # bytes: exact in the export, rounded to 1000 B in the CSV (MB with 3 decimals)
    x = of_kind(from_sqlite, "memcpy").sort("correlation_id")["bytes"].to_list()
    y = of_kind(from_csv, "memcpy").sort("correlation_id")["bytes"].to_list()
    assert all(abs(p - q) <= 500 if q is not None else p < 500 for p, q in zip(x, y)) and x != y


def _kernel_and_copy_intervals(plain: Path):
    db = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
    kernels = db.execute('SELECT deviceId, start, "end", demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    copies = db.execute('SELECT deviceId, start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY').fetchall()
    memsets = db.execute('SELECT "end" - start FROM CUPTI_ACTIVITY_KIND_MEMSET').fetchall()
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    return kernels, copies, memsets, names


def test_core_rules_on_the_sqlite_export(tmp_path):
    gz = Path(f"{PREFIX}.sqlite.gz")
    kernels, copies, memsets, names = _kernel_and_copy_intervals(sqlite_copy(gz, tmp_path))
    trace = read(gz)
    findings = {f.rule: f for f in analyze(trace, rules=["low-memcpy-overlap", "low-kernel-concurrency",
                                                         "kernel-share"])}
    # low-memcpy-overlap: |copy ∩ union(kernels on its device)|, summed
    merged = {d: union([(s, e) for dd, s, e, _ in kernels if dd == d]) for d in {k[0] for k in kernels}}
    overlapped = sum(intersect(s, e, merged.get(d, [])) for d, s, e in copies)
    m = findings["low-memcpy-overlap"].metrics
    assert m["memcpy_time_ns"] == sum(e - s for _, s, e in copies)
    assert m["overlapped_ns"] == overlapped
    # low-kernel-concurrency: time with >= 1 and >= 2 kernels running, half-open intervals
    points = sorted([(s, 1) for _, s, _, _ in kernels] + [(e, -1) for _, _, e, _ in kernels],
                    key=lambda p: (p[0], p[1]))
    busy = concurrent = depth = 0
    for (t, delta), (t_next, _) in zip(points, points[1:] + [(points[-1][0], 0)]):
        depth += delta
        busy += (t_next - t) if depth >= 1 else 0
        concurrent += (t_next - t) if depth >= 2 else 0
    c = findings["low-kernel-concurrency"].metrics
    assert (c["kernel_busy_ns"], c["concurrent_ns"]) == (busy, concurrent)
    assert busy == sum(e - s for s, e in merged[0])
    # kernel-share: totals per demangled name
    per_name: dict[str, list[int]] = {}
    for _, s, e, n in kernels:
        per_name.setdefault(names[n], []).append(e - s)
    top = min(per_name.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    k = findings["kernel-share"]
    assert k.metrics["kernel_time_ns"] == sum(sum(v) for v in per_name.values())
    assert k.metrics["calls"] == len(kernels) and k.metrics["kernels"] == len(per_name)
    assert k.metrics["gpu_time_ns"] == (k.metrics["kernel_time_ns"] + m["memcpy_time_ns"]
                                        + sum(d for (d,) in memsets))
    assert (k.items[0]["name"], k.items[0]["calls"], k.items[0]["time_ns"]) == (top[0], len(top[1]), sum(top[1]))


def test_console_table_alone(tmp_path):
    path = Path(f"{PREFIX}_cuda_gpu_kern_sum_table.txt")
    warnings: list[str] = []
    events = read(path, warnings=warnings).events
    rows = csv_rows(Path(f"{PREFIX}_cuda_gpu_kern_sum.csv"))  # the same report as CSV
    assert events.height == len(rows) == 57
    assert int(events["calls"].sum()) == sum(int(r["Instances"]) for r in rows)
    assert int(events["duration_ns"].sum()) == sum(int(r["Total Time (ns)"]) for r in rows)
    assert sorted(events["max_ns"].to_list()) == sorted(int(r["Max (ns)"]) for r in rows)
    cut = sum(len(r["Name"]) > 100 for r in rows)
    assert warnings == [f"{path}: nsys cut {cut} of the 57 names in this table (they end with '\u2026'); "
                        "the --format csv report has them in full"]


def test_console_output_with_several_csv_reports(tmp_path):
    """`nsys stats -r a,b --format csv > out.txt`: messages before each report, reports one after another."""
    out = tmp_path / "stats_stdout.txt"
    parts = []
    for report, title in (("cuda_gpu_trace", "CUDA GPU Trace"), ("cuda_api_sum", "CUDA API Summary")):
        parts.append(f"Processing [{PREFIX}.sqlite] with [/opt/nsys/reports/{report}.py]... \n\n"
                     f" ** {title} ({report}):\n\n" + Path(f"{PREFIX}_{report}.csv").read_text() + "\n")
    out.write_text("NOTICE: Existing SQLite export found: x.sqlite\n\n" + "".join(parts))
    trace = read(out)
    expected = gpu_trace_totals(Path(f"{PREFIX}_cuda_gpu_trace.csv"))
    assert totals(trace, "kernel") == expected["kernel"]
    api = of_kind(trace, "api")
    assert api.height == len(csv_rows(Path(f"{PREFIX}_cuda_api_sum.csv")))
    assert api["start_ns"].null_count() == api.height


# ------------------------------------------------------------ .nsys-rep

def test_nsys_rep_without_nsys_is_a_clear_error(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys there
    monkeypatch.delenv("TRACEPARSE_NSYS", raising=False)
    rep = Path(f"{PREFIX}.nsys-rep")
    refused(["ingest", str(rep)],
            f"{rep}: reading an Nsight Systems report needs nsys (not found on PATH; set TRACEPARSE_NSYS to it), "
            f"or export it first: nsys export --type sqlite {rep} and ingest the .sqlite it writes", store)


def test_nsys_rep_is_exported_with_nsys(tmp_path, monkeypatch):
    """A stand-in nsys that writes the capture's real export where it is asked to: the plumbing, not nsys."""
    log = tmp_path / "argv.txt"
    fake = tmp_path / "nsys"
    fake.write_text(f"#!{sys.executable}\n"
                    "import gzip, shutil, sys\n"
                    f"open({str(log)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
                    "out = sys.argv[sys.argv.index('--output') + 1]\n"
                    f"with gzip.open({str(PREFIX) + '.sqlite.gz'!r}) as s, open(out, 'wb') as d:\n"
                    "    shutil.copyfileobj(s, d)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRACEPARSE_NSYS", str(fake))
    rep = Path(f"{PREFIX}.nsys-rep")
    trace = read(rep)
    argv = log.read_text().split("\n")
    assert argv[:4] == ["export", "--type", "sqlite", "--output"] and argv[5] == str(rep)
    assert not Path(argv[4]).exists()  # the temporary export is removed once read
    assert totals(trace, "kernel") == totals(read(Path(f"{PREFIX}.sqlite.gz")), "kernel")
    assert trace.meta.extra["exported_with"] == str(fake)


def test_nsys_rep_export_failure(tmp_path, monkeypatch):
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\necho 'Error: unsupported report version' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRACEPARSE_NSYS", str(fake))
    rep = Path(f"{PREFIX}.nsys-rep")
    with pytest.raises(Exception) as exc:
        read(rep)
    assert str(exc.value) == f"{rep}: nsys export failed: Error: unsupported report version"


# ---------------------------------------------------------- older layouts (hand-made)

def test_2021_layout_group(tmp_path):
    paths = sorted(HAND.glob("r18w2021_*.csv"))
    assert len(reader().group(paths)) == 1
    warnings: list[str] = []
    trace = read(*paths, warnings=warnings)
    rows = csv_rows(HAND / "r18w2021_gputrace.csv")
    kernels = of_kind(trace, "kernel").sort("start_ns")
    assert totals(trace, "kernel") == gpu_trace_totals(HAND / "r18w2021_gputrace.csv", "Duration(nsec)")["kernel"]
    # Start(sec) with 6 decimals -> ns exactly; bytes columns without a unit are bytes
    assert kernels["start_ns"].to_list() == sorted(exact(r["Start(sec)"], 10**9) for r in rows
                                                   if op_kind(r["Name"]) == "kernel")
    assert kernels["static_smem_bytes"].to_list()[0] == int(rows[0]["StcSMem"]) == 4224
    memsets = of_kind(trace, "memset").sort("start_ns")
    assert memsets["bytes"].to_list() == [int(r["Bytes"]) for r in rows if op_kind(r["Name"]) == "memset"]
    copy = of_kind(trace, "memcpy").row(0, named=True)
    assert (copy["name"], copy["copy_kind"], copy["src_memory"], copy["dst_memory"]) == (
        "[CUDA memcpy DtoD]", "DtoD", "device", "device")
    api = of_kind(trace, "api")  # cudaapisum: no api trace in the group, so the summary is used
    api_rows = csv_rows(HAND / "r18w2021_cudaapisum.csv")
    assert int(api["calls"].sum()) == sum(int(r["Num Calls"]) for r in api_rows) == 14
    marker = of_kind(trace, "marker").row(0, named=True)
    assert (marker["name"], marker["duration_ns"]) == ("train_step", 20766660)
    assert trace.meta.extra["units_assumed"]["cuda_gpu_trace"] == {"ssmem": "B", "dsmem": "B", "bytes": "B"}
    assert warnings == [f"{HAND / 'r18w2021_gputrace.csv'}: nsys rounded 'Start(sec)' to 1000 ns (too few decimals "
                        "for the unit); the SQLite export (nsys export --type sqlite) has exact values"]


def test_2021_memory_size_summary_is_kibibytes():
    path = HAND / "r18w2021_gpumemsizesum.csv"
    events = read(path).events.sort("name")
    rows = sorted(csv_rows(path), key=lambda r: r["Operation"])
    assert events["bytes"].to_list() == [exact(r["Total"], 1024) for r in rows] == [37632, 15755264]
    assert events["calls"].to_list() == [int(r["Operations"]) for r in rows]


def test_2021_and_2022_layouts_of_the_same_rows_agree():
    old = read(*sorted(HAND.glob("r18w2021_*trace.csv")))
    new = read(*sorted(HAND.glob("r18w2022_*trace.csv")))
    for kind in ("kernel", "memcpy", "memset"):
        assert totals(old, kind) == totals(new, kind)
    a = of_kind(old, "kernel").sort("correlation_id")
    b = of_kind(new, "kernel").sort("correlation_id")
    assert a["name"].equals(b["name"]) and a["grid_x"].equals(b["grid_x"])
    assert all(abs(x - y) <= 500 for x, y in zip(a["start_ns"], b["start_ns"]))  # seconds with 6 decimals


def test_timeunit_usec_and_tsv():
    rows = csv_rows(HAND / "r18wusec_cuda_api_sum.csv")
    for path in (HAND / "r18wusec_cuda_api_sum.csv", HAND / "r18wtsv_cuda_api_sum.tsv"):
        events = read(path).events.sort("name")
        want = sorted(rows, key=lambda r: r["Name"])
        assert events["duration_ns"].to_list() == [exact(r["Total Time (us)"], 1000) for r in want]
        assert events["min_ns"].to_list() == [exact(r["Min (us)"], 1000) for r in want]
        assert events["calls"].to_list() == [int(r["Num Calls"]) for r in want]


def test_handwritten_console_table_matches_its_csv():
    table = read(HAND / "r18wcol_cuda_gpu_kern_sum_table.txt").events.sort("name")
    rows = sorted(csv_rows(HAND / "r18w2022_cuda_gpu_kern_sum.csv"), key=lambda r: r["Name"])
    assert table["name"].to_list() == [r["Name"] for r in rows]
    assert table["duration_ns"].to_list() == [int(r["Total Time (ns)"]) for r in rows]


# ---------------------------------------------------------- synthetic SQLite exports

def _old_export(path: Path, *, enums: bool = False) -> None:
    """An export in the shape of early nsys releases: TARGET_INFO_CUDA_GPU, no ENUM_* or META_DATA_EXPORT
    tables, no mangledName column; two GPUs, two processes, NVTX with a domain, a mark and an open range."""
    db = sqlite3.connect(path)
    g1, g2 = (1 << 56) | (4100 << 24), (1 << 56) | (4200 << 24)
    db.executescript(f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (1, 'gemm_kernel(float*)'), (2, 'gemm_kernel'), (3, 'cudaLaunchKernel_v7000'),
                                     (4, 'registered text');
        {KERNEL_TABLE}
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (100, 200, 0, 1, 7, 11, {g1}, 1, 2, 4, 1, 1, 128, 1, 1, 32, 0, 0),
            (150, 260, 1, 2, 9, 12, {g2}, 1, 2, 4, 1, 1, 128, 1, 1, 32, 0, 0);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER,
            streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER,
            srcKind INTEGER, dstKind INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (10, 90, 0, 1, 7, 10, {g1}, 4096, 1, 0, 2),
                                                     (20, 40, 1, 2, 9, 13, {g2}, 64, 2, 2, 1);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER,
            streamId INTEGER, correlationId INTEGER, globalPid INTEGER, value INTEGER, bytes INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (300, 310, 0, 1, 7, 14, {g1}, 0, 512);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER,
            correlationId INTEGER, nameId INTEGER, returnValue INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (90, 99, 0, {g1 + 4101}, 11, 3, 0),
                                                      (140, 149, 0, {g2 + 4200}, 12, 3, 0);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, text TEXT,
            globalTid INTEGER, textId INTEGER, domainId INTEGER);
        INSERT INTO NVTX_EVENTS VALUES (0, NULL, 75, NULL, 'MyDomain', {g1 + 4100}, NULL, 5),
            (50, 250, 59, NULL, 'step', {g1 + 4100}, NULL, 5),
            (60, NULL, 34, NULL, 'checkpoint', {g1 + 4100}, NULL, 0),
            (70, 80, 60, 1, NULL, {g2 + 4200}, 4, 0),
            (400, NULL, 59, NULL, 'never popped', {g2 + 4200}, NULL, 0);
        CREATE TABLE TARGET_INFO_CUDA_GPU (deviceId INTEGER, name TEXT, numMultiprocessors INTEGER,
            computeCapabilityMajor INTEGER, computeCapabilityMinor INTEGER, coreClockRate INTEGER);
        INSERT INTO TARGET_INFO_CUDA_GPU VALUES (0, 'Tesla V100-SXM2-16GB', 80, 7, 0, 1530000),
                                                (1, 'Tesla V100-SXM2-16GB', 80, 7, 0, 1530000);
    """)
    if enums:
        db.executescript("""
            CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
            INSERT INTO ENUM_CUDA_MEM_KIND VALUES (0, 'CUDA_MEMOPR_MEMORY_KIND_PINNED', 'Pinned'),
                (1, 'CUDA_MEMOPR_MEMORY_KIND_PAGEABLE', 'Pageable'), (2, 'CUDA_MEMOPR_MEMORY_KIND_DEVICE', 'Device');
        """)
    db.commit()
    db.close()


def test_old_export_without_enum_tables(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_export(path)
    warnings: list[str] = []
    trace = read(path, warnings=warnings)
    k = of_kind(trace, "kernel").sort("start_ns")
    assert k.select("device_id", "pid", "name", "duration_ns").rows() == [
        (0, 4100, "gemm_kernel(float*)", 100), (1, 4200, "gemm_kernel(float*)", 110)]
    c = of_kind(trace, "memcpy").sort("start_ns")
    # nsys's own numbering without ENUM tables: 0 Pageable, 1 Pinned, 2 Device (not CUPTI's)
    assert c.select("copy_kind", "src_memory", "dst_memory", "bytes").rows() == [
        ("HtoD", "pageable", "device", 4096), ("DtoH", "device", "pinned", 64)]
    assert c["name"].to_list() == ["[CUDA memcpy Host-to-Device]", "[CUDA memcpy Device-to-Host]"]
    assert of_kind(trace, "memset").select("bytes", "dst_memory").rows() == [(512, None)]
    api = of_kind(trace, "api").sort("start_ns")
    # the export names the versioned entry point (cudaLaunchKernel_v7000): the API's name is without it
    assert api.select("pid", "tid", "name", "group").rows() == [(4100, 4101, "cudaLaunchKernel", "CUDA runtime"),
                                                               (4200, 4200, "cudaLaunchKernel", "CUDA runtime")]
    m = of_kind(trace, "marker").sort("start_ns")
    assert m.select("name", "duration_ns", "group", "pid").rows() == [
        ("step", 200, "MyDomain", 4100), ("checkpoint", 0, None, 4100), ("registered text", 10, None, 4200),
        ("never popped", None, None, 4200)]
    # two processes, each on its own GPU (the kernels above): one report of a multi-process job, said once
    assert warnings == [f"{path}: 2 processes ran GPU work in this one report (pid 4100: GPU 0; pid 4200: GPU 1): "
                        "it is read as one trace, not a run of ranks; its figures are per GPU, and a step is every "
                        "process's range of that step taken together (consecutive steps can overlap by the "
                        "processes' skew). For per-rank figures profile each rank into its own report (nsys profile "
                        "-o rank%q{RANK} under torchrun) and ingest the reports together as a run",
                        f"{path}: 1 NVTX ranges have no end (still open when the capture stopped); "
                        "they are kept with a null duration"]
    assert [(d.id, d.name, d.sm_count, d.compute_capability, d.core_clock_mhz) for d in trace.meta.devices] == [
        (0, "Tesla V100-SXM2-16GB", 80, "7.0", None), (1, "Tesla V100-SXM2-16GB", 80, "7.0", None)]
    assert trace.meta.tool_version is None


def test_export_with_both_device_tables_merges_them(tmp_path):
    """Exports of about 2020.5-2021.1 (no META_DATA_EXPORT) have a TARGET_INFO_GPU of five columns and the SM count,
    memory and compute capability only in TARGET_INFO_CUDA_GPU. Hand-written after the real export
    leenaj-cn/cuda-concurrent-streams streams-report.sqlite (commit cc45209, no licence: only read), whose two rows
    are copied here column for column; before, the device was read from TARGET_INFO_GPU alone, without them."""
    path = tmp_path / "both.sqlite"
    db = sqlite3.connect(path)
    db.executescript(f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (343, 'decrypt_gpu(unsigned long*, unsigned long, unsigned int)'),
                                     (344, 'decrypt_gpu');
        {KERNEL_TABLE}
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
            (795393200, 805128809, 0, 1, 14, 122, 281491653263360, 343, 344, 2560, 1, 1, 64, 1, 1, 20, 0, 0);
        CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, deviceId INTEGER, name TEXT, busLocation TEXT,
            isDiscrete INTEGER);
        INSERT INTO TARGET_INFO_GPU VALUES (281474976710656, 0, 'Tesla V100-SXM2-16GB', '0000:00:1E.0', 1);
        CREATE TABLE TARGET_INFO_CUDA_GPU (vmId INTEGER, name TEXT, pciBusId TEXT, globalMemoryBandwidth INTEGER,
            globalMemorySize INTEGER, l2CacheSize INTEGER, coreClockRate INTEGER, numMultiprocessors INTEGER,
            computeCapabilityMajor INTEGER, computeCapabilityMinor INTEGER, deviceId INTEGER, pid INTEGER);
        INSERT INTO TARGET_INFO_CUDA_GPU VALUES (281474976710656, 'Tesla V100-SXM2-16GB', '<UNKNOWN_BUS_ID>',
            898048000, 16945512448, 6291456, 1530000, 80, 7, 0, 0, 994);
    """)
    db.commit()
    db.close()
    trace = read(path)
    assert of_kind(trace, "kernel").select("pid", "duration_ns").rows() == [(994, 9735609)]
    [device] = trace.meta.devices
    assert (device.id, device.name, device.sm_count, device.memory_bytes, device.compute_capability) == (
        0, "Tesla V100-SXM2-16GB", 80, 16945512448, "7.0")
    assert device.extra["busLocation"] == "0000:00:1E.0" and device.extra["l2CacheSize"] == 6291456


def test_event_class_without_its_enum_table(tmp_path):
    """Exports up to 2022.2 (schema 2.9.1) have no ENUM_NSYS_EVENT_CLASS, but number the API classes as later ones
    do: a real 2022.2.1.31 export (SMcMann/cudaHW report1.sqlite, commit 97ba1a2, no licence: only read) has its
    five cuda* calls in class 0 and cuModuleGetLoadingMode, a driver call, in class 1. Its group was null for all
    six; now 'CUDA runtime' five times and 'CUDA driver' once. The rows here copy that export's RUNTIME table."""
    path = tmp_path / "schema291.sqlite"
    tid = 313048893798240
    db = sqlite3.connect(path)
    db.executescript(f"""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (24, 'cuModuleGetLoadingMode'), (28, 'cudaMallocManaged_v6000'),
                                     (38, 'cudaLaunchKernel_v7000'), (39, 'cudaFree_v3020');
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER NOT NULL, callchainId INTEGER);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES
            (309945588, 309946549, 1, {tid}, 1, 24, 0, NULL), (331657272, 714879395, 0, {tid}, 411, 28, 0, NULL),
            (714880898, 714903442, 0, {tid}, 412, 28, 0, NULL), (719288401, 719329441, 0, {tid}, 413, 38, 0, NULL),
            (727883171, 829401207, 0, {tid}, 414, 39, 0, NULL), (829401828, 830110512, 0, {tid}, 415, 39, 0, NULL);
        CREATE TABLE EXPORT_META_DATA (name TEXT, value TEXT);
        INSERT INTO EXPORT_META_DATA VALUES ('EXPORT_PRODUCT_VERSION', '2022.2.1.31'),
                                            ('EXPORT_SCHEMA_VERSION', '2.9.1');
    """)
    db.commit()
    db.close()
    trace = read(path)
    api = of_kind(trace, "api").sort("start_ns")
    assert api.select("name", "group").rows() == [
        ("cuModuleGetLoadingMode", "CUDA driver"), ("cudaMallocManaged", "CUDA runtime"),
        ("cudaMallocManaged", "CUDA runtime"), ("cudaLaunchKernel", "CUDA runtime"), ("cudaFree", "CUDA runtime"),
        ("cudaFree", "CUDA runtime")]
    assert api["duration_ns"].sum() == 961 + 383222123 + 22544 + 41040 + 101518036 + 708684
    assert trace.meta.tool_version == "2022.2.1.31"


def test_enum_tables_win_over_the_fallback(tmp_path):
    path = tmp_path / "enums.sqlite"
    _old_export(path, enums=True)  # a (made-up) numbering different from the fallback one
    c = of_kind(read(path), "memcpy").sort("start_ns")
    assert c.select("src_memory", "dst_memory").rows() == [("pinned", "device"), ("device", "pageable")]


# ---------------------------------------------------------------- grouping

def test_grouping_by_prefix(tmp_path):
    for name in ("a_cuda_gpu_trace.csv", "a_cuda_api_sum.csv", "b_cuda_gpu_trace.csv", "b_nvtx_sum.csv",
                 "lonely.csv"):
        (tmp_path / name).write_text("x\n")
    gz = Path(f"{PREFIX}.sqlite.gz")
    paths = sorted(tmp_path.iterdir()) + [gz]
    groups = reader().group(paths)
    assert sorted(sorted(p.name for p in g) for g in groups) == [
        ["a_cuda_api_sum.csv", "a_cuda_gpu_trace.csv"], ["b_cuda_gpu_trace.csv", "b_nvtx_sum.csv"],
        ["lonely.csv"], ["resnet18_bs8.sqlite.gz"]]


def test_cli_ingests_a_glob_of_reports_as_one_trace(store):
    paths = [str(p) for p in sorted(FIX.glob("resnet18_bs8_*.csv"))]
    code, out, err = run_cli("ingest", "--json", *paths)
    assert code == 0, err
    import json

    traces = json.loads(out)["traces"]
    assert len(traces) == 1 and len(traces[0]["source_paths"]) == 7
    assert len(Store(store).ids()) == 1
    expected = gpu_trace_totals(Path(f"{PREFIX}_cuda_gpu_trace.csv"))
    assert traces[0]["event_count"] == sum(n for n, _ in expected.values()) + 700 + 5


def test_empty_report_is_a_warning_in_a_group(tmp_path):
    for report in ("cuda_gpu_trace", "cuda_api_sum"):
        shutil.copy(f"{PREFIX}_{report}.csv", tmp_path / f"cap_{report}.csv")
    (tmp_path / "cap_nvtx_sum.csv").write_bytes(b"")
    paths = sorted(tmp_path.iterdir())
    assert len(reader().group(paths)) == 1
    warnings: list[str] = []
    trace = read(*paths, warnings=warnings)
    assert totals(trace, "kernel") == gpu_trace_totals(Path(f"{PREFIX}_cuda_gpu_trace.csv"))["kernel"]
    empty = tmp_path / "cap_nvtx_sum.csv"
    assert (f"{empty}: the report file is empty (nsys writes an empty file when it had no data for it); "
            "the other reports are read") in warnings
    with pytest.raises(Exception) as exc:
        read(empty)
    assert str(exc.value) == f"{empty}: the report file is empty (nsys writes an empty file when it had no data for it)"


def test_cli_glob_with_an_empty_report(store, tmp_path):
    for report in ("cuda_gpu_trace", "cuda_api_sum"):
        shutil.copy(f"{PREFIX}_{report}.csv", tmp_path / f"cap_{report}.csv")
    (tmp_path / "cap_nvtx_sum.csv").write_bytes(b"")
    code, out, err = run_cli("ingest", "--json", *[str(p) for p in sorted(tmp_path.iterdir())])
    assert code == 0, err
    [trace] = json.loads(out)["traces"]
    assert len(trace["source_paths"]) == 3
    assert any("nvtx_sum.csv" in w and "empty" in w for w in trace["warnings"])


def test_summary_and_trace_of_different_captures_warn(tmp_path):
    shutil.copy(f"{PREFIX}_cuda_gpu_trace.csv", tmp_path / "mix_cuda_gpu_trace.csv")
    shutil.copy(HAND / "r18w2022_cuda_gpu_kern_sum.csv", tmp_path / "mix_cuda_gpu_kern_sum.csv")
    warnings: list[str] = []
    read(*sorted(tmp_path.iterdir()), warnings=warnings)
    rows = csv_rows(HAND / "r18w2022_cuda_gpu_kern_sum.csv")
    calls, total = sum(int(r["Instances"]) for r in rows), sum(int(r["Total Time (ns)"]) for r in rows)
    n, timed = gpu_trace_totals(Path(f"{PREFIX}_cuda_gpu_trace.csv"))["kernel"]
    assert (f"{tmp_path / 'mix_cuda_gpu_kern_sum.csv'}: counts {calls} kernel calls ({total} ns) but "
            f"{tmp_path / 'mix_cuda_gpu_trace.csv'} lists {n} ({timed} ns): the files may not come from the same "
            "capture; the cuda_gpu_trace events are kept") in warnings


# ---------------------------------------------------------------- detection

def _nsys_files() -> list[Path]:
    return sorted(p for p in [*FIX.iterdir(), *HAND.iterdir()]
                  if p.is_file() and p.suffix not in (".py", ".md") and p.name != "nsys_version.txt")


@pytest.mark.parametrize("path", _nsys_files(), ids=lambda p: p.name)
def test_auto_detection_on_every_nsys_fixture(path):
    assert detect_reader(path, registry()).name == "nsys"


def test_samples_are_detected(samples_dir):
    for path in sorted((samples_dir / "nsys").iterdir()):
        if path.stat().st_size:
            assert detect_reader(path, registry()).name == "nsys", path


def test_other_formats_are_not_claimed(fixtures_dir, tmp_path):
    nsys = reader()
    others = [p for d in ("torch", "ncu") for p in (fixtures_dir / d).rglob("*") if p.is_file()]
    assert others
    from traceparse.sources import read_head

    for p in others:
        assert nsys.sniff(p, read_head(p)) == 0.0, p
    nvprof_heads = {  # nvprof --csv layouts (gpu trace with its units row; summary with ==PID== lines)
        "gpu_trace.csv": '"Start","Duration","Grid X","Grid Y","Grid Z","Block X","Block Y","Block Z",'
                         '"Registers Per Thread","Static SMem","Dynamic SMem","Size","Throughput","SrcMemType",'
                         '"DstMemType","Device","Context","Stream","Name","Correlation_ID"\n'
                         's,us,,,,,,,,KB,B,MB,GB/s,,,,,,,\n',
        "summary.csv": '==1234== Profiling application: ./a.out\n==1234== Profiling result:\n'
                       '"Type","Time(%)","Time","Calls","Avg","Min","Max","Name"\n,%,ms,,ms,ms,ms,\n',
        "api_trace.csv": '"Start","Duration","Name","Correlation_ID"\nms,us,,\n',
    }
    for name, text in nvprof_heads.items():
        p = tmp_path / name
        p.write_text(text)
        assert nsys.sniff(p, text.encode()) == 0.0, name
    db = tmp_path / "nvprof.nvvp"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT);"
                      "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (_id_ INTEGER PRIMARY KEY, start INTEGER);")
    con.close()
    assert nsys.sniff(db, read_head(db)) == 0.0


# ---------------------------------------------------------------- bad input

@pytest.fixture
def trace_csv(tmp_path) -> tuple[Path, list[str]]:
    lines = Path(f"{PREFIX}_cuda_gpu_trace.csv").read_text().split("\n")
    return tmp_path / "bad_cuda_gpu_trace.csv", lines


@pytest.mark.parametrize("quoted", [False, True])
def test_cut_mid_line_keeps_the_complete_rows(tmp_path, trace_csv, quoted):
    """A report cut short (a profiler killed, a copy interrupted) was refused whole. Its complete rows are now
    read, with a warning naming the cut line (inside its first numbers, or inside its quoted kernel name), and
    every analysis says the figures cover what was read."""
    path, lines = trace_csv
    row = next(i for i in range(9, len(lines)) if ('"' in lines[i]) == quoted)
    cut_at = lines[row].index('"') + 5 if quoted else 25
    path.write_text("\n".join(lines[:row]) + "\n" + lines[row][:cut_at])
    why = ("a quoted field does not close" if quoted
           else f"{lines[row][:cut_at].count(',') + 1} of the header's {lines[0].count(',') + 1} fields")
    full = tmp_path / "whole" / path.name
    full.parent.mkdir()
    full.write_text("\n".join(lines[:row]) + "\n")  # the same rows, whole
    warnings: list = []
    columns = ["kind", "name", "start_ns", "duration_ns", "device_id", "stream_id", "correlation_id"]
    cut, kept = read(path, warnings=warnings).events.select(columns), read(full).events.select(columns)
    assert warnings[0] == f"{path}:{row + 1}: cut short ({why}); kept the {row - 1} complete rows before it"
    assert cut.equals(kept) and cut.height == row - 1
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["summary"][0]["incomplete"] == [warnings[0]]


def test_a_quoted_field_over_two_lines(tmp_path, trace_csv):
    """Hand-written edge case (RFC 4180, which nsys's CSV writer follows): a kernel name holding a line break
    is one quoted field over two lines. It was refused as "a quote that does not close"; it is now read, the
    rows after it in their place and the line numbers of later errors still the file's."""
    path, lines = trace_csv
    row = next(i for i in range(5, len(lines)) if '"' in lines[i])
    lines[row] = lines[row].replace('"void ', '"void\nkernel ', 1)
    path.write_text("\n".join(lines))
    events = read(path).events
    assert events.filter(pl.col("name").str.contains("void\nkernel ", literal=True)).height == 1
    assert events.height == len([line for line in lines[1:] if line])
    lines[row + 3] = lines[row + 3].replace(",,", ",", 1)  # a bad row after it: its line, counted in the file
    path.write_text("\n".join(lines))
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:{row + 5}: 20 fields where the header"):
        read(path)


def test_console_table_without_last_newline_is_read(tmp_path):
    """A console table saved from a terminal without its last newline (a name ends it) reads as with it."""
    source = Path(f"{PREFIX}_cuda_gpu_kern_sum_table.txt")
    text = source.read_text()
    assert text.endswith("\n") and not text.rstrip("\n")[-1].isdigit()
    path = tmp_path / source.name
    path.write_text(text.rstrip("\n"))
    whole, cut = read(source).events, read(path).events
    assert cut.height == whole.height > 0
    assert cut.select("name", "calls", "duration_ns").equals(whole.select("name", "calls", "duration_ns"))


def test_header_without_rows(store, trace_csv):
    path, lines = trace_csv
    path.write_text(lines[0] + "\n")
    refused(["ingest", str(path)], f"{path}:1: the cuda_gpu_trace report has a header but no rows", store)


def test_wrong_column_count(store, trace_csv):
    path, lines = trace_csv
    lines[4] = lines[4].replace(",,", ",", 1)
    path.write_text("\n".join(lines))
    refused(["ingest", str(path)], f"{path}:5: 20 fields where the header (line 1) has 21", store)


def test_not_a_number(store, trace_csv):
    path, lines = trace_csv
    cells = lines[2].split(",")
    cells[1] = "1.2.3"
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines))
    refused(["ingest", str(path)],
            f"{path}:3: column 'Duration (ns)': '1.2.3' is not a number (a time was expected)", store)


def test_not_a_whole_number(store, trace_csv):
    path, lines = trace_csv
    cells = lines[3].split(",")
    cells[2] = "n/a"
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines))
    refused(["ingest", str(path)],
            f"{path}:4: column 'CorrId': 'n/a' is not a number (a whole number was expected)", store)


def test_sqlite_missing_tables(store, tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT); CREATE TABLE foo (x);")
    con.close()
    refused(["ingest", str(path)],
            f"{path}: none of the tables traceparse reads is in this SQLite file (expected at least one of "
            "CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, "
            "CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER, NVTX_EVENTS: an Nsight Systems export of a "
            "capture with -t cuda or -t nvtx)", store)


def test_sqlite_missing_string_ids(store, tmp_path):
    path = tmp_path / "nostrings.sqlite"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);"
                      "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER);")
    con.close()
    refused(["ingest", str(path)], f"{path}: table StringIds is missing (the names of CUPTI_ACTIVITY_KIND_KERNEL "
                                   "are ids into it)", store)


def test_nvprof_sqlite_forced_as_nsys(store, tmp_path):
    path = tmp_path / "prof.nvvp"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT);")
    con.close()
    refused(["ingest", "--format", "nsys", str(path)],
            f"{path}: an nvprof SQLite profile (StringTable), not an Nsight Systems export: read it with "
            "--format nvprof", store)


def test_cut_sqlite_gz(store, tmp_path):
    path = tmp_path / "cut.sqlite.gz"
    path.write_bytes(Path(f"{PREFIX}.sqlite.gz").read_bytes()[:20000])
    refused(["ingest", str(path)], f"{path}: the gzip stream ends early (cut short?); the SQLite export cannot be "
                                   "read from a partial file", store)


def test_torch_trace_forced_as_nsys(store, fixtures_dir):
    path = sorted((fixtures_dir / "torch").glob("*.json.gz"))[0]
    refused(["ingest", "--format", "nsys", str(path)],
            f"{path}:1: no nsys stats report header found (expected e.g. 'Start (ns),Duration (ns),CorrId,...' or "
            "'Time (%),Total Time (ns),...'); write the report with `nsys stats --format csv`", store)


def test_unknown_report_alone(store, tmp_path):
    path = tmp_path / "run_osrt_sum.csv"
    path.write_text("Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                    "67.3,335987431,2,167993715.5,167993715.5,2971823,333015608,233376198.5,sem_wait\n")
    refused(["ingest", str(path)], f"{path}: the osrt_sum report is not one traceparse reads (it reads "
                                   "cuda_gpu_trace, cuda_api_trace, cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, "
                                   "cuda_gpu_mem_size_sum, cuda_api_sum, nvtx_sum, cuda_gpu_sum)", store)


# ---------------------------------------------------------------- shared samples

def test_every_sample_file(samples_dir, tmp_path, monkeypatch):
    d = samples_dir / "nsys"
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TRACEPARSE_NSYS", raising=False)
    for path in sorted(d.glob("*.csv")):
        if not path.stat().st_size:
            continue
        trace = read(path)
        rows = csv_rows(path)
        if path.name.endswith("_cuda_gpu_trace.csv"):
            expected = gpu_trace_totals(path)
            for kind in ("kernel", "memcpy", "memset"):
                assert totals(trace, kind) == expected[kind]
            assert int(of_kind(trace, "memcpy")["bytes"].sum()) == sum(
                size(r["Bytes (MB)"], 10**6, r) or 0 for r in rows if op_kind(r["Name"]) == "memcpy")
        elif path.name.endswith("_cuda_api_trace.csv"):
            assert totals(trace, "api") == (len(rows), sum(int(r["Duration (ns)"]) for r in rows))
        elif path.name.endswith("_cuda_gpu_mem_size_sum.csv"):
            assert int(trace.events["bytes"].sum()) == sum(exact(r["Total (MB)"], 10**6) for r in rows)
        else:
            count = next(c for c in ("Instances", "Num Calls", "Count") if c in rows[0])
            assert int(trace.events["calls"].sum()) == sum(int(r[count]) for r in rows)
            assert int(trace.events["duration_ns"].sum()) == sum(int(r["Total Time (ns)"]) for r in rows)
    gz = d / "resnet18_bs16.sqlite.gz"
    trace = read(gz)
    for kind, want in sqlite_totals(sqlite_copy(gz, tmp_path)).items():
        assert totals(trace, kind) == want
    with pytest.raises(Exception, match="reading an Nsight Systems report needs nsys"):
        read(d / "resnet18_bs16.nsys-rep")
    table = d / "resnet18_bs16_cuda_gpu_kern_sum_table.txt"  # it holds nsys's usage message, no table
    with pytest.raises(Exception) as exc:
        read(table)
    assert str(exc.value) == (f"{table}:1: no report table in this file, only nsys messages ('WARNING: Existing "
                              "SQLite export found: /tmp/nsysc/resnet18_bs16.sqlite'); write the report with "
                              "`nsys stats --report NAME --format csv`")


def test_sample_group(samples_dir):
    paths = sorted((samples_dir / "nsys").glob("resnet18_bs16_*"))
    groups = reader().group(paths)
    assert len(groups) == 1
    warnings: list[str] = []
    trace = read(*groups[0], warnings=warnings)
    expected = gpu_trace_totals(samples_dir / "nsys" / "resnet18_bs16_cuda_gpu_trace.csv")
    for kind in ("kernel", "memcpy", "memset"):
        assert totals(trace, kind) == expected[kind]
    assert of_kind(trace, "marker").height == 0
    assert trace.meta.extra["files_skipped"] == {
        "resnet18_bs16_cuda_gpu_kern_sum_table.txt": "same report as resnet18_bs16_cuda_gpu_kern_sum.csv",
        "resnet18_bs16_nvtx_sum.csv": "the report file is empty (nsys writes an empty file when it had no data "
                                      "for it)"}


def test_report_not_read_is_skipped_in_a_group(store, tmp_path):
    shutil.copy(f"{PREFIX}_cuda_gpu_trace.csv", tmp_path / "cap_cuda_gpu_trace.csv")
    other = tmp_path / "cap_cuda_kern_exec_trace.csv"
    other.write_text("API Start (ns),API Dur (ns),Queue Start (ns),Queue Dur (ns),Kernel Start (ns),Kernel Dur (ns),"
                     "Total Dur (ns),Result,CorrID,Pid,Tid,T-Pri,Thread Name,Kernel Name\n"
                     "100,20,,,150,30,80,0,5,42,42,20,python3,k\n")
    code, out, err = run_cli("ingest", str(tmp_path / "cap_cuda_gpu_trace.csv"), str(other))
    assert code == 0, err
    assert f"traceparse: warning: {other}: skipped the cuda_kern_exec_trace report (not read by traceparse)" in err
    assert len(Store(store).ids()) == 1
    second = tmp_path / "second_store"
    refused(["ingest", "--store", str(second), str(other)],
            f"{other}: the cuda_kern_exec_trace report is not one traceparse reads (it reads cuda_gpu_trace, "
            "cuda_api_trace, cuda_gpu_kern_sum, cuda_gpu_mem_time_sum, cuda_gpu_mem_size_sum, cuda_api_sum, "
            "nvtx_sum, cuda_gpu_sum)", second)


def test_cuda_gpu_sum_is_the_last_resort(tmp_path):
    """cuda_gpu_sum (kernels and memory operations in one summary, Category column) of the fixture's own rows."""
    kern = csv_rows(Path(f"{PREFIX}_cuda_gpu_kern_sum.csv"))
    mem = csv_rows(Path(f"{PREFIX}_cuda_gpu_mem_time_sum.csv"))
    path = tmp_path / "cap_cuda_gpu_sum.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                    "StdDev (ns)", "Category", "Operation"])
        for r, category, name, count in [*((r, "CUDA_KERNEL", r["Name"], r["Instances"]) for r in kern),
                                         *((r, "MEMORY_OPER", r["Operation"], r["Count"]) for r in mem)]:
            w.writerow([r["Time (%)"], r["Total Time (ns)"], count, r["Avg (ns)"], r["Med (ns)"], r["Min (ns)"],
                        r["Max (ns)"], r["StdDev (ns)"], category, name])
    alone = read(path)
    assert int(of_kind(alone, "kernel")["calls"].sum()) == sum(int(r["Instances"]) for r in kern)
    assert int(of_kind(alone, "memset")["duration_ns"].sum()) == sum(
        int(r["Total Time (ns)"]) for r in mem if r["Operation"] == "[CUDA memset]")
    shutil.copy(f"{PREFIX}_cuda_gpu_kern_sum.csv", tmp_path / "cap_cuda_gpu_kern_sum.csv")
    both = read(*sorted(tmp_path.glob("cap_*.csv")))
    assert of_kind(both, "kernel").height == len(kern)  # from cuda_gpu_kern_sum, not twice
    assert both.meta.extra["reports"]["cuda_gpu_sum"]["kinds_used"] == ["memcpy", "memset"]


@pytest.mark.parametrize("text,unit,factor", [
    ("9.634", "MB", 10**6), ("0.0005", "MB", 10**6), ("16.673290", "s", 10**9), ("1.2345", "MB", 10**6),
    ("-1.5", "ns", 1), ("2.5", "ns", 1), ("0.295", "MiB", 2**20), ("1234567.1234567891234", "sec", 10**9),
    (".5", "us", 1000), ("7", "KiB", 1024), ("123456789012", "nsec", 1), ("0.0000025", "s", 10**9),
])
def test_exact_unit_conversion(text, unit, factor):
    from traceparse_plugins.readers.nsys.units import decimals_to_int

    got = decimals_to_int(pl.Series([text, None]), unit).to_list()
    want = exact_int(text, factor)
    assert got == [want, None]


def test_value_out_of_range(store, tmp_path):
    path = tmp_path / "big_cuda_api_sum.csv"
    path.write_text("Time (%),Total Time (s),Num Calls,Avg (s),Med (s),Min (s),Max (s),StdDev (s),Name\n"
                    "100.0,12345678901.5,1,1.0,1.0,1.0,1.0,0.0,cudaMalloc\n")
    refused(["ingest", str(path)], f"{path}:2: column 'Total Time (s)': '12345678901.5' is out of range "
                                   "(over 2^63 ns or bytes)", store)


# -- acceptance: another GPU, another workload (fixtures/make_nsys_acceptance.sh) ---------------------------------
ACCEPT = FIX / "acceptance" / "llama_graphs_node"


def _stats(report: str) -> list[dict]:
    with open(f"{ACCEPT}_{report}.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("suffix", [".sqlite.gz", ".parquetdir"])
def test_acceptance_capture_matches_nsys_stats(suffix):
    # An H200 capture of a torch.compile(mode="reduce-overhead") model with --cuda-graph-trace=node: kernels replayed
    # by CUDA graphs, Triton and cuBLAS kernels, three NVTX steps. nsys stats' own reports of the same capture are
    # the oracle: every kernel name with its instances and total time, every API call name, the copies, the steps.
    trace = read(Path(f"{ACCEPT}{suffix}"))
    assert trace.meta.devices[0].name == "NVIDIA H200"
    kernels = of_kind(trace, "kernel").group_by("name").agg(n=pl.len(), ns=pl.col("duration_ns").sum())
    mine = {name: (n, ns) for name, n, ns in kernels.iter_rows()}
    theirs = {r["Name"]: (int(r["Instances"]), int(r["Total Time (ns)"])) for r in _stats("cuda_gpu_kern_sum")}
    assert len(theirs) == 42 and mine == theirs
    api = of_kind(trace, "api").group_by("name").agg(n=pl.len(), ns=pl.col("duration_ns").sum())
    # nsys stats strips a 4-digit entry-point version (cudaLaunchKernel_v7000) but prints cudaGraphLaunch_v10000 and
    # cuGetProcAddress_v2; traceparse strips any version, so one API has one name in every form
    assert any(re.search(r"_v\d{5}$", r["Name"]) for r in _stats("cuda_api_sum"))
    assert {name: (n, ns) for name, n, ns in api.iter_rows()} == {
        re.sub(r"_v\d+$", "", r["Name"]): (int(r["Num Calls"]), int(r["Total Time (ns)"])) for r in _stats("cuda_api_sum")}
    assert not of_kind(trace, "api").filter(pl.col("name").str.contains(r"_v\d+$")).height
    copies = {r["Operation"]: (int(r["Count"]), int(r["Total Time (ns)"])) for r in _stats("cuda_gpu_mem_time_sum")}
    htod = of_kind(trace, "memcpy").filter(pl.col("copy_kind") == "HtoD")
    assert copies["[CUDA memcpy Host-to-Device]"] == (htod.height, htod["duration_ns"].sum())
    memset = of_kind(trace, "memset")
    assert copies["[CUDA memset]"] == (memset.height, memset["duration_ns"].sum())
    steps = sorted(of_kind(trace, "marker").select("name", "duration_ns").rows())
    assert steps == sorted((r["Range"].lstrip(":"), int(r["Total Time (ns)"])) for r in _stats("nvtx_sum"))


OSRT_AND_API = """[4/8] Executing 'osrt_sum' stats report

 Time (%)  Total Time (ns)  Num Calls    Avg (ns)     Med (ns)    Min (ns)    Max (ns)    StdDev (ns)   Name
 --------  ---------------  ---------  -----------  -----------  ---------  -----------  -----------  --------
     67.3      335,987,431          2  167993715.5  167993715.5  2,971,823  333,015,608  233376198.5  sem_wait
     32.7       99,806,189         17    5870952.3    1427621.0      6,930   33,322,960   11011658.0  poll

[5/8] Executing 'cuda_api_sum' stats report

 Time (%)  Total Time (ns)  Num Calls    Avg (ns)     Med (ns)    Min (ns)    Max (ns)    StdDev (ns)   Name
 --------  ---------------  ---------  -----------  -----------  ---------  -----------  -----------  ----------------
     97.1      106,912,410          3   35637470.0       6584.0      4,697  106,901,129   61716139.1  cudaMalloc
      2.9        3,201,638      1,010       3169.9       2922.0          0      138,218       5124.5  cudaLaunchKernel

"""


@pytest.mark.parametrize("layout", ["column", "csv"])
def test_the_console_names_each_report_before_its_table(tmp_path, layout):
    """Hand-written, after a real `nsys --stats=true` console log (nsys 2024, an A100): osrt_sum and cuda_api_sum
    have the same columns, and only the line before each table says which is which. The OS runtime table was
    read as the CUDA API summary (sem_wait, poll as API calls) and the real one skipped as a second copy."""
    text = OSRT_AND_API
    if layout == "csv":  # `nsys stats --format csv` to the console: " ** Title (report):" before each table
        text = (" ** OS Runtime Summary (osrt_sum):\n\nTime (%),Total Time (ns),Num Calls,Name\n67.3,335987431,2,sem_wait\n"
                "32.7,99806189,17,poll\n\n ** CUDA API Summary (cuda_api_sum):\n\nTime (%),Total Time (ns),Num Calls,"
                "Name\n97.1,106912410,3,cudaMalloc\n2.9,3201638,1010,cudaLaunchKernel\n")
    path = tmp_path / "stats_console.txt"
    path.write_text(text)
    warnings: list[str] = []
    api = of_kind(read(path, warnings=warnings), "api").sort("name")
    assert api.select("name", "calls", "duration_ns").rows() == [("cudaLaunchKernel", 1010, 3_201_638),
                                                                 ("cudaMalloc", 3, 106_912_410)]
    assert warnings == [f"{path}: skipped the osrt_sum report (not read by traceparse)"]


#: Hand-written after a real nsys 2021 `--stats=true` console log (CS533 course project, a V100; no licence to copy
#: it): no report names, only titles; four processes' OS runtime tables, the first before the CUDA API table.
OLD_TITLES = """Collecting data...
Processing events...

Exporting 4017 events: [==================================================100%]

Operating System Runtime API Statistics:

 Time(%)  Total Time (ns)  Num Calls     Average      Minimum      Maximum     Name
 -------  ---------------  ---------  -------------  ---------  -------------  ----------
    47.9    5,512,335,098        461   11,957,343.0      1,206  100,134,880  epoll_wait
    52.1    5,992,015,433      5,000    1,198,403.1      1,003   10,106,993  poll



CUDA API Statistics:

 Time(%)  Total Time (ns)  Num Calls     Average       Minimum      Maximum             Name
 -------  ---------------  ---------  -------------  -----------  -----------  ---------------
    99.9      791,065,304          1  791,065,304.0  791,065,304  791,065,304  cudaMallocHost
     0.1          593,103         30       19,770.1       10,183       33,530  cudaLaunchKernel



CUDA Memory Operation Statistics (by size in KiB):

    Total     Operations   Average    Minimum    Maximum        Operation
 -----------  ----------  ---------  ---------  ----------  ------------------
 491,520.000          60  8,192.000  4,096.000  12,288.000  [CUDA memcpy HtoD]



OpenMP Event Statistics:

 Time(%)  Total Time (ns)  Num Calls     Average      Minimum      Maximum     Name
 -------  ---------------  ---------  -------------  ---------  -------------  ----------
   100.0            1,000          1        1,000.0      1,000          1,000  omp_parallel

"""


def test_nsys_2020_console_titles_name_the_tables(tmp_path):
    """The titles nsys 2020-2021.1 printed instead of report names say which table is which: the OS runtime
    table (first here) was read as the CUDA API summary and the real one skipped as a second copy."""
    path = tmp_path / "nsys_output.txt"
    path.write_text(OLD_TITLES)
    warnings: list[str] = []
    trace = read(path, warnings=warnings)
    api = of_kind(trace, "api").sort("name")
    assert api.select("name", "calls", "duration_ns").rows() == [("cudaLaunchKernel", 30, 593_103),
                                                                 ("cudaMallocHost", 1, 791_065_304)]
    copies = of_kind(trace, "memcpy")
    assert copies.select("calls", "bytes").rows() == [(60, 491_520 * 1024)]
    assert warnings == [f"{path}: skipped the osrt_sum report (not read by traceparse)",
                        f"{path}: skipped the openmp_event_statistics report (not read by traceparse)"]


def test_sizes_rounded_to_zero_are_unknown(tmp_path):
    """nsys prints sizes in MB to 3 decimals: a copy of 40 bytes reads "0.000" (a public A100 console log of a
    10-float vector add), which became 0 bytes and "0.00 GB/s, 0.0% of the host link". Under half a last digit is
    not nothing: unknown."""
    path = tmp_path / "x_cuda_gpu_mem_size_sum.csv"
    path.write_text("Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n"
                    "0.000,2,0.000,0.000,0.000,0.000,0.000,[CUDA memcpy Host-to-Device]\n"
                    "2.097,2,1.049,1.049,1.049,1.049,0.000,[CUDA memcpy Device-to-Host]\n")
    rows = of_kind(read(path), "memcpy").sort("copy_kind")
    assert sorted(rows.select(pl.col("copy_kind").cast(pl.String), "calls", "bytes").rows()) == [
        ("DtoH", 2, 2_097_000), ("HtoD", 2, None)]


def test_a_nul_in_a_name_is_named_where_it_is(tmp_path, store):
    """A NUL byte in one kernel name of a real nsys report (a hand-made mutant) made the whole file "not a format
    traceparse recognises"; the error now says what and where."""
    source = Path(f"{PREFIX}_cuda_gpu_kern_sum.csv")
    data = source.read_bytes()
    first_row = data.index(b"\n") + 1
    at = data.index(b'"', first_row) + 4  # inside the first row's quoted kernel name
    path = tmp_path / source.name
    path.write_bytes(data[:at] + b"\x00" + data[at:])
    refused(["ingest", str(path)], f"{path}: binary data (a NUL byte at byte {at:,}): not a text file (a sparse or "
                                   "damaged file?)", store)


def test_the_version_of_a_2022_export(tmp_path):
    """nsys 2022.x names its metadata table EXPORT_META_DATA (2023 on: META_DATA_EXPORT), so real 2022.1 and
    2022.4 exports showed no version. A hand-made mutant of the real 2025 export with the older table name."""
    path = tmp_path / "r2022.sqlite"
    with gzip.open(FIX / "resnet18_bs8.sqlite.gz") as src:
        path.write_bytes(src.read())
    with sqlite3.connect(path) as db:
        version = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())["EXPORT_PRODUCT_VERSION"]
        db.execute("ALTER TABLE META_DATA_EXPORT RENAME TO EXPORT_META_DATA")
    assert read(path).meta.tool_version == version


def test_a_copy_under_the_size_columns_last_digit_gets_its_bytes_from_its_throughput(tmp_path):
    """``cuda_gpu_trace`` writes sizes in MB to 3 decimals: a 64-byte copy reads "0.000" and was unknown while its
    time counted (a pageable throughput of the other copies only). Its Throughput column and duration give the
    bytes; checked against the same capture's SQLite export, which has them exactly."""
    from traceparse.ingest import read_paths

    path = FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv"
    with open(path, newline="") as f:
        zero = [r for r in csv.DictReader(f) if r["Bytes (MB)"] and Decimal(r["Bytes (MB)"]) == 0]
    assert len(zero) == 6
    db = tmp_path / "r.sqlite"
    with gzip.open(FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(db)
    exact = {c: b for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
             for c, b in con.execute(f"SELECT correlationId, bytes FROM {table}")}
    events = read_paths([path])[0].events
    for r in zero:
        row = events.filter(pl.col("correlation_id") == int(r["CorrId"]))
        assert row["bytes"].to_list() == [exact[int(r["CorrId"])]], r
