"""TAU reader: totals per routine and per thread against sums computed here from the files with plain Python."""

from __future__ import annotations

import json
import random
import gzip
import re
from decimal import ROUND_HALF_EVEN, Decimal
from functools import partial
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, exact_int, run_cli
from traceparse.ingest import read_paths

TAU = FIXTURES / "tau"
CPI = TAU / "real" / "cpi-mpi"
MULTI = TAU / "handwritten" / "multi-cupti"
PPROF = TAU / "real" / "pprof"


us_to_ns = partial(exact_int, factor=1000, rounding=ROUND_HALF_EVEN)  # the TAU reader rounds half to even


def plain_profile(path: Path) -> dict:
    """Parse a TAU text profile with str methods only: {full name: (calls, subrs, excl, incl, group)}, events."""
    lines = path.read_text().splitlines()
    n = int(lines[0].split()[0])
    routines = {}
    for line in lines[2:2 + n]:
        _, name, rest = line.split('"', 2)
        fields = rest.split()
        group = rest.split('GROUP="')[1].rstrip().rstrip('"') if "GROUP=" in rest else None
        routines[name] = (int(fields[0]), int(fields[1]), fields[2], fields[3], group)
    events = {}
    tail = lines[2 + n:]
    if len(tail) > 1 and tail[1].endswith("userevents"):
        for line in tail[3:]:
            _, name, rest = line.split('"', 2)
            events[name] = rest.split()
    return {"routines": routines, "events": events}


def rows(trace, kind=None) -> pl.DataFrame:
    e = trace.events
    return e if kind is None else e.filter(pl.col("kind") == kind)


# --- text profiles, real (LLNL Hatchet's tau-cpi-mpi) ---------------------------------------------------------

def test_cpi_mpi_every_routine_and_thread_matches_the_files():
    trace = read_paths([CPI])[0]
    routines = trace.events.filter(pl.col("kind") != "counter")
    expected_rows = 0
    for f in sorted(CPI.iterdir()):
        node = int(f.name.split(".")[1])
        plain = plain_profile(f)
        expected_rows += len(plain["routines"])
        mine = routines.filter(pl.col("pid") == node)
        assert mine.height == len(plain["routines"])
        for raw, (calls, subrs, excl, incl, group) in plain["routines"].items():
            path = " => ".join(p.strip() for p in raw.split("=>"))
            row = mine.filter(pl.col("call_path") == path).row(0, named=True)
            assert (row["calls"], row["subcalls"], row["group"]) == (calls, subrs, group)
            assert row["exclusive_ns"] == us_to_ns(excl) and row["duration_ns"] == us_to_ns(incl)
            assert row["name"] == path.split(" => ")[-1]
            assert (row["tid"], row["device_id"]) == (0, 0)
    assert routines.height == expected_rows == 92
    # per thread: the sum of exclusive times of the flat routines
    for f in sorted(CPI.iterdir()):
        node = int(f.name.split(".")[1])
        flat = [v for k, v in plain_profile(f)["routines"].items() if "=>" not in k]
        got = routines.filter((pl.col("pid") == node) & ~pl.col("call_path").str.contains(" => "))
        assert got["exclusive_ns"].sum() == sum(us_to_ns(v[2]) for v in flat)
        assert got["calls"].sum() == sum(v[0] for v in flat)


def test_cpi_mpi_call_paths_point_to_the_caller_row():
    e = read_paths([CPI])[0].events
    node0 = e.filter((pl.col("pid") == 0) & (pl.col("kind") == "region"))
    by_id = {r["event_id"]: r for r in node0.iter_rows(named=True)}
    nested = node0.filter(pl.col("call_path").str.contains(" => "))
    assert nested.height == 11
    for r in nested.iter_rows(named=True):
        parent = by_id[r["parent_id"]]
        assert parent["call_path"] == r["call_path"].rsplit(" => ", 1)[0]
    deep = node0.filter(pl.col("call_path") == ".TAU application => MPI_Finalize() => MPI_File_open()").row(0, named=True)
    assert deep["name"] == "MPI_File_open()" and deep["exclusive_ns"] == 27_490_000
    assert by_id[deep["parent_id"]]["call_path"] == ".TAU application => MPI_Finalize()"
    flat = node0.filter(~pl.col("call_path").str.contains(" => "))
    assert flat["parent_id"].null_count() == flat.height


def test_cpi_mpi_user_events_and_metadata():
    trace = read_paths([CPI])[0]
    ev = rows(trace, "counter").sort(["pid", "name"])
    assert ev.height == 8
    for f in sorted(CPI.iterdir()):
        node = int(f.name.split(".")[1])
        for name, (num, mx, mn, mean, sumsq) in plain_profile(f)["events"].items():
            r = ev.filter((pl.col("pid") == node) & (pl.col("name") == name)).row(0, named=True)
            assert (r["calls"], r["value_max"], r["value_min"], r["value"], r["value_sumsq"]) == (
                int(num), float(mx), float(mn), float(mean), float(sumsq))
    assert trace.meta.tool == "TAU" and trace.meta.tool_version == "2.29-git"
    assert trace.meta.extra["metadata"]["CPU Type"] == "Intel(R) Xeon(R) CPU E5-2698 v3 @ 2.30GHz"
    assert trace.meta.extra["metrics"] == ["TIME"] and trace.meta.extra["threads"] == 4
    assert trace.meta.warnings == []


def test_single_file_and_loose_files_group_into_one_trace():
    one = read_paths([CPI / "profile.2.0.0"])[0]
    assert set(one.events["pid"].unique().to_list()) == {2}
    both = read_paths([CPI / "profile.0.0.0", CPI / "profile.3.0.0"])
    assert len(both) == 1 and set(both[0].events["pid"].unique().to_list()) == {0, 3}


# --- MULTI__ directories with CUPTI counters (hand-written) ---------------------------------------------------

def test_multi_metric_directories_merge_time_and_counters():
    trace = read_paths([MULTI])[0]
    e = trace.events
    metric_dirs = sorted(p.name[len("MULTI__"):] for p in MULTI.iterdir())
    assert trace.meta.extra["metrics"][0] == "TIME" and sorted(trace.meta.extra["metrics"]) == metric_dirs
    routines = e.filter(pl.col("kind") != "counter")
    for thread in (0, 1):
        time_file = plain_profile(MULTI / "MULTI__TIME" / f"profile.0.0.{thread}")
        mine = routines.filter(pl.col("tid") == thread)
        assert mine.height == len(time_file["routines"])
        for raw, (calls, subrs, excl, incl, group) in time_file["routines"].items():
            row = mine.filter(pl.col("call_path") == raw.strip()).row(0, named=True)
            assert (row["calls"], row["exclusive_ns"], row["duration_ns"]) == (calls, us_to_ns(excl), us_to_ns(incl))
        for metric in [m for m in metric_dirs if m != "TIME"]:
            counter_file = plain_profile(MULTI / f"MULTI__{metric}" / f"profile.0.0.{thread}")
            for raw, (_, _, excl, incl, _) in counter_file["routines"].items():
                rid = mine.filter(pl.col("call_path") == raw.strip())["event_id"][0]
                c = e.filter((pl.col("kind") == "counter") & (pl.col("parent_id") == rid))
                assert c.filter(pl.col("name") == metric)["value"].to_list() == [float(excl)]
                assert c.filter(pl.col("name") == metric + " (inc)")["value"].to_list() == [float(incl)]
    # 9 + 5 routines, 6 counters x 2 (exclusive, inclusive) each, 2 user events
    assert e.height == 14 + 14 * 12 + 2


def test_multi_kinds_devices_and_exact_rounding():
    trace = read_paths([MULTI])[0]
    r = trace.events.filter(pl.col("kind") != "counter")
    kind = {(x["tid"], x["call_path"]): x["kind"] for x in r.iter_rows(named=True)}
    assert kind[(1, "void sgemm_kernel<float>(float*, float const*, int)")] == "kernel"   # group TAU_GPU_KERNEL
    assert kind[(1, "winograd_3x3_kernel")] == "kernel"      # group TAU_DEFAULT, on a GPU thread
    assert kind[(1, "Memory copy Host to Device")] == "memcpy"
    assert kind[(1, ".TAU application")] == "region"
    assert kind[(0, "cudaLaunchKernel")] == "api" and kind[(0, "train_step")] == "region"
    gpu = r.filter(pl.col("tid") == 1)
    assert set(gpu["stream_id"].to_list()) == {7} and set(gpu["context_id"].to_list()) == {1}
    assert r.filter(pl.col("kind") == "memcpy")["copy_kind"].to_list() == ["HtoD"]
    # 900.0005 us = 900000.5 ns and 250.0625 us = 250062.5 ns round half to even
    api = r.filter((pl.col("tid") == 0) & (pl.col("call_path") == "cudaMemcpy")).row(0, named=True)
    assert api["exclusive_ns"] == 900_000
    launch = r.filter(pl.col("call_path") == "cudaLaunchKernel").row(0, named=True)
    assert launch["exclusive_ns"] == 250_062
    (gpu_dev,) = trace.meta.devices
    assert (gpu_dev.name, gpu_dev.sm_count, gpu_dev.compute_capability, gpu_dev.core_clock_mhz) == (
        "Tesla P100-PCIE-16GB", 56, "6.0", 1328.5)
    ctx_event = trace.events.filter(pl.col("name").str.starts_with("Bytes copied from Host to Device : "))
    parent = r.filter(pl.col("event_id") == ctx_event["parent_id"][0]).row(0, named=True)
    assert parent["call_path"] == ".TAU application => train_step => cudaMemcpy"


# --- merged and snapshot XML (hand-written, TauSnapshot.cpp layout) -------------------------------------------

def test_merged_xml_two_ranks_two_metrics():
    path = TAU / "handwritten" / "xml" / "tauprofile.xml"
    trace = read_paths([path])[0]
    e = trace.events
    text = path.read_text()
    blocks = text.split("<profile_xml>")[1:]
    for node, block in enumerate(blocks):
        names = {int(i): n.strip().replace("=&gt;", "=>") for i, n in re.findall(r'<event id="(\d+)"><name>(.*?)</name>', block)}
        data = block.split('<interval_data metrics="0 1 ">')[1].split("</interval_data>")[0].split("\n")
        for line in filter(None, (x.strip() for x in data)):
            ident, calls, subrs, excl, incl, cyc_ex, cyc_in = line.split()
            path_name = " => ".join(p.strip() for p in names[int(ident)].split("=>"))
            row = e.filter((pl.col("pid") == node) & (pl.col("call_path") == path_name)
                           & (pl.col("kind") != "counter")).row(0, named=True)
            assert (row["calls"], row["subcalls"]) == (int(calls), int(subrs))
            assert (row["exclusive_ns"], row["duration_ns"]) == (us_to_ns(excl), us_to_ns(incl))
            c = e.filter((pl.col("parent_id") == row["event_id"]) & (pl.col("kind") == "counter"))
            assert dict(zip(c["name"], c["value"])) == {"PAPI_TOT_CYC": float(cyc_ex),
                                                          "PAPI_TOT_CYC (inc)": float(cyc_in)}
    assert trace.meta.extra["metrics"] == ["TIME", "PAPI_TOT_CYC"]
    ue = e.filter(pl.col("name") == "Message size for broadcast").row(0, named=True)
    assert (ue["calls"], ue["value_max"], ue["value_min"], ue["value"], ue["value_sumsq"]) == (2, 8.0, 4.0, 6.0, 80.0)


@pytest.mark.parametrize("gz", [False, True])
def test_merged_xml_with_tau_merge_nul_separators(tmp_path, gz):
    """TauProfileMerge.cpp writes each rank's block with its C string's closing NUL (real tau2 perfexplorer
    examples and a 12-rank run have them): the file was refused at the first NUL as not well-formed XML."""
    path = TAU / "handwritten" / "xml" / "tauprofile.xml"
    text = path.read_bytes()
    assert text.count(b"</profile_xml>") == 2 and b"\x00" not in text
    nul = text.replace(b"</profile_xml>", b"</profile_xml>\x00")
    merged = tmp_path / ("tauprofile.xml.gz" if gz else "tauprofile.xml")
    merged.write_bytes(gzip.compress(nul) if gz else nul)
    want = read_paths([path])[0].events
    got = read_paths([merged])[0].events
    assert got.height == want.height > 0
    assert got.drop("trace_id").equals(want.drop("trace_id"))


def test_snapshot_file_keeps_the_last_cumulative_snapshot():
    trace = read_paths([TAU / "handwritten" / "xml" / "snapshot.0.0.0"])[0]
    e = trace.events.sort("event_id")
    assert e["name"].to_list() == [".TAU application", "solve", "write_output"]
    assert e["exclusive_ns"].to_list() == [20_125, 2_000_250, 500_000]
    assert e["calls"].to_list() == [1, 2, 1]
    assert trace.meta.warnings == [f"{TAU / 'handwritten' / 'xml' / 'snapshot.0.0.0'}: 2 snapshots of 1 threads; "
                                   "read the last of each thread (snapshots are cumulative)"]


# --- pprof text (real outputs published in READMEs and a course repository) -----------------------------------

def pprof_ms(text: str) -> int:
    """pprof's ToTimeStr forms to ns, independently: h:mm:ss.mmm, m:ss.mmm, s,mmm or a plain msec number."""
    if re.fullmatch(r"\d+:\d\d:\d\d\.\d{3}", text):
        h, m, rest = text.split(":")
        return int((int(h) * 3600 + int(m) * 60) * 10**9 + Decimal(rest) * 10**9)
    if re.fullmatch(r"\d+:\d\d\.\d{3}", text):
        m, rest = text.split(":")
        return int(int(m) * 60 * 10**9 + Decimal(rest) * 10**9)
    if re.fullmatch(r"\d+,\d{3}", text):
        return int(Decimal(text.replace(",", ".")) * 10**9)
    return exact_int(text, 10**6, ROUND_HALF_EVEN)


def plain_pprof_table(path: Path, title: str) -> list[list[str]]:
    lines = path.read_text().splitlines()
    start = lines.index(title) + 5
    table = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("---"):
            break
        table.append(line.split(None, 6))
    return table


def test_pprof_total_summary_with_hour_and_minute_times():
    path = PPROF / "sc15-apex-hpx-pprof-s.txt"
    trace = read_paths([path])[0]
    e = trace.events
    table = plain_pprof_table(path, "FUNCTION SUMMARY (total):")
    assert e.height == len(table) == 17
    for pct, excl, incl, calls, subrs, per_call, name in table:
        row = e.filter(pl.col("name") == name).row(0, named=True)
        assert (row["exclusive_ns"], row["duration_ns"]) == (pprof_ms(excl), pprof_ms(incl))
        assert (row["calls"], row["subcalls"], row["pid"], row["tid"]) == (int(calls), int(subrs), None, None)
    top = e.filter(pl.col("name") == ".TAU application").row(0, named=True)
    assert top["exclusive_ns"] == ((1 * 60 + 27) * 60 + 15) * 10**9 + 217 * 10**6
    assert trace.meta.variant == "pprof text (total summary)"
    assert trace.meta.extra["pprof_tables"] == {"thread": 0, "total": 1, "mean": 1, "user": 0}


def test_pprof_per_thread_tables_and_user_events():
    path = PPROF / "opencl-course-matmult-pprof.txt"
    trace = read_paths([path])[0]
    e = trace.events
    for thread in (0, 1, 2):
        table = plain_pprof_table(path, f"NODE 0;CONTEXT 0;THREAD {thread}:")
        mine = e.filter((pl.col("tid") == thread) & (pl.col("kind") != "counter"))
        assert mine.height == len(table)
        assert mine["exclusive_ns"].sum() == sum(pprof_ms(r[1]) for r in table)
        assert mine["calls"].sum() == sum(int(r[3]) for r in table)
    # the per-thread sums equal pprof's own total table where pprof printed whole milliseconds
    total = {r[6]: r for r in plain_pprof_table(path, "FUNCTION SUMMARY (total):")}
    mat = e.filter(pl.col("name") == "mat_mult").row(0, named=True)
    assert pprof_ms(total["mat_mult"][1]) == mat["exclusive_ns"] == 280 * 10**6
    ue = e.filter(pl.col("kind") == "counter")
    assert ue.height == 6
    ctx = ue.filter(pl.col("name") == "Bytes copied from Host to Device : .TAU application").row(0, named=True)
    assert (ctx["calls"], ctx["value_max"], ctx["value_min"], ctx["value"]) == (2, 1.057e6, 5.325e5, 7.946e5)
    assert ctx["value_sumsq"] is None
    root = e.filter((pl.col("tid") == 0) & (pl.col("name") == ".TAU application")).row(0, named=True)
    assert ctx["parent_id"] == root["event_id"]


def test_pprof_counter_table_and_stddev_column():
    counts = read_paths([TAU / "handwritten" / "pprof-papi-counts.txt"])[0].events
    regions = counts.filter(pl.col("kind") == "region")
    assert regions["duration_ns"].null_count() == regions.height == 6
    sconv = regions.filter(pl.col("name") == "sconv_direct_fprop_64x128")["event_id"][0]
    c = counts.filter(pl.col("parent_id") == sconv)
    assert dict(zip(c["name"], c["value"])) == {"Count": 1.678e7, "Count (inc)": 1.678e7}
    std = read_paths([TAU / "handwritten" / "pprof-callpath-stddev.txt"])[0].events
    tiny = std.filter(pl.col("call_path") == "tiny").row(0, named=True)
    assert tiny["exclusive_ns"] == 12  # 1.25E-05 msec = 12.5 ns, half to even
    nested = std.filter(pl.col("call_path") == ".TAU application => compute").row(0, named=True)
    assert nested["parent_id"] == std.filter(pl.col("call_path") == ".TAU application")["event_id"][0]
    assert nested["exclusive_ns"] == 62_375_000_000


# --- text profile variants (written here, following TAU's writers) -------------------------------------------

def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_old_header_sumexclsqr_and_profile_calls(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write(d / "profile.0.0.0", [
        "2 templated_functions",
        "# Name Calls Subrs Excl Incl SumExclSqr ProfileCalls",
        '"main int (int, char **)" 1 1 10.5 30.5 110.25 0',
        '"foo void ()" 2 0 20 20 200 2',
        "8 8",
        "12 12",
        "0 aggregates",
    ])
    e = read_paths([d])[0].events.sort("event_id")
    assert e["name"].to_list() == ["main int (int, char **)", "foo void ()"]
    assert e["exclusive_ns"].to_list() == [10_500, 20_000] and e["group"].null_count() == 2


def test_paraprof_export_header_without_hash_and_java_doubles(tmp_path):
    d = tmp_path / "export"
    d.mkdir()
    write(d / "profile.0.0.0", [
        "1 templated_functions_MULTI_TIME",
        "# Name Calls Subrs Excl Incl ProfileCalls<metadata><attribute><name>Host</name><value>a&amp;b</value>"
        "</attribute></metadata>",
        '"compute" 3 0 1.2345E7 1.2345E7 0 GROUP="TAU_USER"',
        "0 aggregates",
    ])
    trace = read_paths([d])[0]
    assert trace.events["exclusive_ns"].to_list() == [12_345_000_000]
    assert trace.meta.extra["metadata"] == {"Host": "a&b"}


def test_truncated_profile_keeps_complete_rows_and_warns(tmp_path, store):
    d = tmp_path / "cut"
    d.mkdir()
    lines = (CPI / "profile.0.0.0").read_text().splitlines()
    (d / "profile.0.0.0").write_text("\n".join(lines[:7]) + "\n" + lines[7][:20])
    code, out, err = run_cli("ingest", str(d), "--json")
    assert code == 0, err
    assert err == (f"traceparse: warning: {d / 'profile.0.0.0'}: the last line (8) is cut short and was not read: "
                   "'\"MPI_Comm_rank()  \"'\n"
                   f"traceparse: warning: {d / 'profile.0.0.0'}: the file ends after 5 of the 23 routine rows line 1 "
                   "announces (the run was probably cut short); the complete rows were kept\n")
    assert json.loads(out)["traces"][0]["event_count"] == 5


def test_cli_ingest_and_show(store):
    code, out, err = run_cli("ingest", str(CPI), "--json")
    assert code == 0, err
    doc = json.loads(out)["traces"][0]
    assert doc["format"] == "tau" and doc["event_count"] == 100


# --- exact decimal conversion ---------------------------------------------------------------------------------

def test_scaled_int_matches_python_decimal():
    from traceparse_plugins.readers.tau.decimals import scaled_int

    rng = random.Random(5)
    values = ["%.16G" % (rng.random() * 10 ** rng.randint(-9, 12)) for _ in range(20000)]
    values += ["0.0005", "0.0015", "-2.5E-3", "449.0", "1.2345E7", "007", ".5", "1.", "1e-40", "abc", "", "9E+20"]
    got = scaled_int(pl.Series(values), 3).to_list()
    for text, value in zip(values, got):
        try:
            want = us_to_ns(text)
            want = want if abs(want) < 2**63 else None
        except Exception:
            want = None
        assert value == want, text


@pytest.mark.parametrize("name", ["profile.0.0.0", "tauprofile.xml"])
def test_sniff_claims_tau_files(name):
    from traceparse_plugins.readers.tau import TauReader

    path = CPI / "profile.0.0.0" if name.startswith("profile") else TAU / "handwritten" / "xml" / name
    # the scale of Reader.sniff: 1.0 a text profile's own first line, 0.8 TAU's XML or a directory of profiles
    assert TauReader().sniff(path, path.read_bytes()[:65536]) == (1.0 if name.startswith("profile") else 0.8)
    assert TauReader().sniff(CPI, b"") == 0.8
    assert TauReader().sniff(Path("notes.txt"), b"hello") == 0.0


# --- integers that are not (hand-written edge cases: handwritten/bad-integers, handwritten/xml/bad_integers.xml) --

def _metadata(path: Path) -> dict[str, str]:
    """The ``# <metadata>`` attributes of a TAU text profile's second line, with str methods only."""
    line = path.read_text().splitlines()[1]
    pairs = line.split("<attribute>")[1:]
    return {p.split("<name>")[1].split("</name>")[0]: p.split("<value>")[1].split("</value>")[0] for p in pairs}


def test_metadata_that_is_not_a_whole_number_is_unknown_with_one_warning_per_field():
    folder = TAU / "handwritten" / "bad-integers"
    profile = folder / "profile.0.0.0"
    raw = _metadata(profile)
    assert (raw["GPU globalMemorySize"], raw["CUDA Stream"]) == ("80GB", "seven")
    trace = read_paths([folder])[0]
    (device,) = trace.meta.devices
    assert device.memory_bytes is None  # unknown, as before, but said
    assert (device.sm_count, device.core_clock_mhz) == (int(raw["GPU numMultiprocessors"]),
                                                         int(raw["GPU coreClockRate"]) / 1000)
    gpu = trace.events.filter(pl.col("kind").is_in(["kernel", "memcpy"]))
    assert gpu.height == 2 and gpu["stream_id"].null_count() == 2  # the stream is unknown
    assert gpu["context_id"].to_list() == [int(raw["CUDA Context"])] * 2
    assert trace.meta.warnings == [
        f"{profile} (metadata): CUDA Stream 'seven' is not a whole number; left unknown",
        f"{profile} (metadata): GPU globalMemorySize '80GB' is not a whole number; left unknown"]


def test_xml_attributes_that_are_not_whole_numbers_are_said_once_each():
    path = TAU / "handwritten" / "xml" / "bad_integers.xml"
    text = path.read_text()
    assert 'context="zero"' in text and '<event id="one">' in text and "<value>many</value>" in text
    trace = read_paths([path])[0]
    names = set(trace.events["name"].str.strip_chars().to_list())
    assert names == {".TAU application", "solve"}  # the event with id "one" is referred to by nothing
    (device,) = trace.meta.devices
    assert (device.sm_count, device.memory_bytes) == (None, 85_000_000_000)
    assert trace.events["device_id"].unique().to_list() == [0]  # context: from the thread id 0.0.0
    assert trace.meta.warnings == [
        f"{path}: <thread> context 'zero' is not a whole number; left unknown",
        f"{path}: <event> id 'one' is not a whole number; left unknown",
        f"{path} (thread 0.0.0 metadata): GPU numMultiprocessors 'many' is not a whole number; left unknown"]


def test_pprof_reports_pasted_together_read_each_thread_once(tmp_path):
    """A user's notes file with three pprof reports of three runs pasted one after the other (each
    NODE 0;CONTEXT 0;THREAD 0): they were summed into one thread of three times the time."""
    path = TAU / "real" / "pprof" / "opencl-course-matmult-pprof.txt"
    text = path.read_text()
    assert text.count("NODE 0;CONTEXT 0;THREAD 0:") == 1
    pasted = tmp_path / "readout.txt"
    pasted.write_text(text + "\n" + text + "\n" + text)
    want = read_paths([path])[0].events
    trace = read_paths([pasted])[0]
    assert trace.events.drop("trace_id").equals(want.drop("trace_id"))
    assert (f"{pasted}: thread 0.0.0 appears 3 times (several pprof reports in one file?); the first of each was "
            "read, 2 more repeated") in trace.meta.warnings  # threads 0.0.1 and 0.0.2


def test_a_tau_directory_with_another_profilers_file_says_what_it_left_out(tmp_path):
    """A torch trace put beside a TAU profile was dropped in silence (the directory is TAU's: the 41 TAU rows were
    stored, the 1,353 torch events not). The TAU profiles are still read, and the other files are named."""
    import shutil

    folder = tmp_path / "mixed"
    folder.mkdir()
    for f in sorted(CPI.iterdir()):
        shutil.copy(f, folder / f.name)
    shutil.copy(FIXTURES / "torch" / "alexnet_bs4.json.gz", folder / "alexnet_bs4.json.gz")
    (folder / "job.sh").write_text("mpirun -np 4 ./cpi\n")
    (folder / ".hidden").write_text("x")
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", "--json", str(folder))
    assert code == 0, err
    assert err == (f"traceparse: warning: {folder}: read its TAU profiles only; left out 2 other files "
                   "(alexnet_bs4.json.gz, job.sh): give another profiler's files on their own\n")
    profiles = sorted(CPI.glob("profile.*"))
    got = json.loads(out)["traces"][0]
    assert got["format"] == "tau" and got["event_count"] == read_paths([CPI])[0].events.height
    assert got["variant"] == f"profile.N.C.T text: {len(profiles)} nodes, {len(profiles)} threads, metrics TIME"


def test_a_sampled_profile_is_not_counted_twice(tmp_path):
    """TAU's sampling (EBS): ``[SAMPLE]`` rows split the time of ``[CONTEXT] .TAU application``, the samples taken
    while the ``.TAU application`` timer ran, whose exclusive time holds that same time (a real TAU 2.26.2 profile
    of taucmdr's mm example, BSD-3). hotspots said "3.721 s in all" of a 1.861 s thread and halved every share.
    The timer now keeps only what no sample covers; the thread's total is its time, computed here from the file."""
    path = TAU / "real" / "taucmdr-sample" / "profile.0.0.0"
    rows = plain_profile(path)["routines"]
    timer = us_to_ns(Decimal(rows[".TAU application"][2]))
    context = us_to_ns(Decimal(rows["[CONTEXT] .TAU application"][3]))
    samples = {n: us_to_ns(Decimal(r[2])) for n, r in rows.items() if n.startswith("[SAMPLE]")}
    assert sum(samples.values()) == context  # the samples split the context's time, no more
    total = timer  # the thread's whole time: the one top-level timer's (Excl = Incl)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path.parent), "--rule", "hotspots",
                             "--json")
    assert code == 0, err
    found = json.loads(out)["findings"][0]
    items = {i["name"]: i for i in found["items"]}
    assert items[".TAU application"]["time_ns"] == timer - context
    assert {n: items[n]["time_ns"] for n in samples} == samples
    assert sum(i["time_ns"] for i in found["items"]) == total
    best = max(samples, key=samples.get)
    assert items[best]["share_pct"] == round(100 * samples[best] / total, 4)


def packed_xml_threads(path: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """A TAU packed XML profile read with the standard library: {thread: {event name: (excl ns, incl ns)}} of
    its time metric (metric 0), from ``<event id>`` names and each thread's ``<interval_data>`` lines."""
    import xml.etree.ElementTree as ET

    root_text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    names, threads = {}, {}
    for doc in re.findall(r"<profile_xml>.*?</profile_xml>", root_text, re.S):
        tree = ET.fromstring(doc)
        for event in tree.iter("event"):
            names[event.get("id")] = event.findtext("name")
        for profile in tree.iter("profile"):
            lines = profile.findtext("interval_data").split("\n")
            rows = threads.setdefault(profile.get("thread"), {})
            for line in filter(None, (x.split() for x in lines)):
                rows[names[line[0]]] = (us_to_ns(Decimal(line[3])), us_to_ns(Decimal(line[4])))
    return threads


def test_samples_beyond_their_timers_time_are_scaled_to_the_thread_s_time():
    """A real sampled OpenMP profile (tau2's ClassBreakdown example, 12 threads; fixtures/tau/real/README.md):
    the samples of 11 timers add up to 435.644 ms more than those timers' exclusive time. The timer keeps
    nothing, so summed as written the routines came to 322.684 s, more than the 322.249 s the threads ran. Now
    each thread's routines add up to its ``.TAU application`` time at most, and the scaling is warned of."""
    path = TAU / "real" / "tau2-sampled-openmp" / "tauprofile.xml.gz"
    threads = packed_xml_threads(path)
    assert len(threads) == 12
    excess = 0
    for rows in threads.values():
        for name, (_, incl) in rows.items():
            if name.startswith("[CONTEXT] ") and " => " not in name:
                excl = rows.get(name.removeprefix("[CONTEXT] "), (None,))[0]
                excess += max(0, incl - excl) if excl is not None else 0
    assert excess == 435_644_000
    trace = read_paths([path])[0]
    assert any("add up to 435.644 ms more than those timers' own time" in w for w in trace.meta.warnings)
    from traceparse.analysis import analyze

    whole = sum(rows[".TAU application"][1] for rows in threads.values())
    assert whole == 322_248_601_000
    (hot,) = [f for f in analyze(trace, rules=["hotspots"]) if f.title.startswith("Hotspots: routines")]
    summed = hot.metrics["time_ns"]  # the routines' exclusive time, summed over the threads
    assert summed <= whole and whole - summed < 12 * 1000  # a microsecond a thread: rounding


def test_a_wrapped_32_bit_time_metric_is_warned_of(tmp_path):
    """A real 12-thread OpenMP profile (stevenpl98/ParallelFinalProject, no licence, not committed) had
    MULTI__P_WALL_CLOCK_TIME at 4,295 s a thread of a 0.09 s run: 2^32 us plus the time, a 32-bit counter that
    wrapped, stored with no word. Hand-made here from the real cpi-mpi profiles: MULTI__TIME as they are,
    MULTI__P_WALL_CLOCK_TIME with 2^32 added to every Excl and Incl."""
    _metric_dirs(tmp_path / "prof", {"TIME": lambda v: f"{float(v):.0f}",
                                     "P_WALL_CLOCK_TIME": lambda v: f"{float(v) + 2 ** 32:.0f}"})
    per_thread = [max(float(v[3]) for v in plain_profile(f)["routines"].values()) for f in CPI.glob("profile.*")]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(tmp_path / "prof"))
    assert code == 0, err
    wrapped = [(2 ** 32 + us) / 1e6 for us in per_thread]
    assert (f"traceparse: warning: metric P_WALL_CLOCK_TIME: every thread ran {min(wrapped):,.0f}–{max(wrapped):,.0f}"
            f" s, about 2^32 us, where TIME gives at most {max(per_thread) / 1e6:.3g} s: a 32-bit counter that wrapped; "
            "its values are kept as written, and the figures use TIME") in err


def test_a_merged_xml_is_called_merged_whatever_its_file_name(tmp_path):
    """A real merged profile from a Fujitsu system (12 ranks in one file, no licence, not committed) was called a
    snapshot XML because it was not named tauprofile.xml. The form is told by what the file holds (every thread:
    merged; one thread's snapshots: snapshot). Hand-written fixtures of each, renamed."""
    import shutil

    merged = tmp_path / "k_run.xml"
    shutil.copy(TAU / "handwritten" / "xml" / "tauprofile.xml", merged)
    snapshot = tmp_path / "snap.xml"
    shutil.copy(TAU / "handwritten" / "xml" / "snapshot.0.0.0", snapshot)
    (merged_trace,), (snapshot_trace,) = read_paths([merged]), read_paths([snapshot])
    assert merged_trace.events.select("pid", "tid").unique().height > 1
    assert merged_trace.meta.variant == "merged XML" and snapshot_trace.meta.variant == "snapshot XML"


def test_hotspots_says_its_total_is_summed_over_threads(tmp_path):
    """A 16-thread OpenMP profile read "618.1 s in all" of a 38.6 s run, not saying the total is summed over the
    threads. It now says so, with the busiest thread's time: here the real 4-rank cpi-mpi profiles, each file's
    flat routines' exclusive times summed with plain Python."""
    from traceparse.figures import fmt_ns

    per_file = [sum(us_to_ns(Decimal(r[2])) for name, r in plain_profile(f)["routines"].items() if " => " not in name)
                for f in sorted(CPI.glob("profile.*"))]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(CPI), "--rule", "hotspots", "--json")
    assert code == 0, err
    message = json.loads(out)["findings"][0]["message"]
    nodes = {f.name.split(".")[1] for f in CPI.glob("profile.*")}  # profile.NODE.CONTEXT.THREAD: a process each
    assert len(nodes) == 4
    assert (f"routines on {len(per_file)} threads of {len(nodes)} processes, {fmt_ns(sum(per_file))} in all (summed "
            f"over the threads; the busiest thread {fmt_ns(max(per_file))}); ") in message


def _metric_dirs(root: Path, metrics: dict) -> None:
    """MULTI__<METRIC>/ directories made from the real cpi-mpi profiles: each metric's Excl and Incl are the
    time's times ``metrics[METRIC]``, or that function of the time's text."""
    for metric, factor in metrics.items():
        scaled = factor if callable(factor) else (lambda v, k=factor: str(int(v) * k))
        folder = root / f"MULTI__{metric}"
        folder.mkdir(parents=True)
        for f in sorted(CPI.glob("profile.*")):
            lines = f.read_text().splitlines(keepends=True)
            n = int(lines[0].split()[0])
            lines[0] = lines[0].replace("MULTI_TIME", f"MULTI_{metric}")
            for i in range(2, 2 + n):
                lines[i] = re.sub(r'^(".*" \d+ \d+ )(\S+) (\S+)',
                                  lambda m: f"{m[1]}{scaled(m[2])} {scaled(m[3])}", lines[i])
            (folder / f.name).write_text("".join(lines))


def test_a_thread_missing_from_one_metric_directory_is_warned_of(tmp_path):
    """An MPI run's MULTI__TIME/profile.2.0.0 lost (the other metrics' files of rank 2 there): rank 2 dropped out of
    the hotspots ("on 3 threads of 3 processes", 160 ms) with no word at ingest, which said "4 nodes". Now one
    warning per metric names the threads it lacks; the figures are those of the 3 ranks with a time (sums of the
    files' flat Excl computed here)."""
    prof = tmp_path / "prof"
    _metric_dirs(prof, {"TIME": 1, "PAPI_TOT_CYC": 2300, "PAPI_TOT_INS": 1000})
    (prof / "MULTI__TIME" / "profile.2.0.0").unlink()
    (prof / "MULTI__PAPI_TOT_INS" / "profile.3.0.0").unlink()
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(prof))
    assert code == 0, err
    assert ("traceparse: warning: 1 of 4 threads has no TIME profile (2.0.0) but profiles of other metrics: its "
            "routines have no time, and every figure of time leaves it out") in err
    assert ("traceparse: warning: 1 of 4 threads has no PAPI_TOT_INS profile (3.0.0) but profiles of other metrics: "
            "its routines have no PAPI_TOT_INS values, and what is derived from PAPI_TOT_INS leaves it out") in err
    assert "PAPI_TOT_CYC profile" not in err
    (trace,) = read_paths([prof])
    assert len(trace.meta.warnings) == 2
    flat = [sum(us_to_ns(Decimal(r[2])) for name, r in plain_profile(CPI / f"profile.{n}.0.0")["routines"].items()
                if " => " not in name) for n in (0, 1, 3)]
    timed = trace.events.filter((pl.col("kind") == "region") & pl.col("exclusive_ns").is_not_null()
                                & ~pl.col("call_path").str.contains(" => ", literal=True))
    assert sorted(timed["pid"].unique().to_list()) == [0, 1, 3]
    assert timed["exclusive_ns"].sum() == sum(flat) == 160_018_000


def test_one_metric_directory_with_every_thread_says_nothing(tmp_path):
    prof = tmp_path / "prof"
    _metric_dirs(prof, {"TIME": 1, "PAPI_TOT_CYC": 2300})
    (trace,) = read_paths([prof])
    assert not [w for w in trace.meta.warnings if "profile (" in w]


def test_a_rank_missing_from_the_directory_is_warned_of(tmp_path):
    """The real 4-rank cpi-mpi profiles without profile.2.0.0 (a rank killed before it wrote, or a file not
    copied): read as "3 processes", rank 2 gone with no word. Now a warning names it; the figures stand for the
    ranks there (their flat Excl summed here)."""
    import shutil

    prof = tmp_path / "run"
    prof.mkdir()
    for n in (0, 1, 3):
        shutil.copy(CPI / f"profile.{n}.0.0", prof)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(prof))
    assert code == 0, err
    assert (f"traceparse: warning: {prof}: no profile of node 2 among nodes 0–3: TAU writes profile.N.C.T files for "
            "every MPI rank N from 0, so that rank wrote none (killed before the end?) or its files were not copied; "
            "every figure over ranks leaves it out") in err
    (trace,) = read_paths([prof])
    flat = trace.events.filter((pl.col("kind") == "region") & ~pl.col("call_path").str.contains(" => ", literal=True))
    assert flat["exclusive_ns"].sum() == 160_018_000  # 51,781 + 55,329 + 52,908 us, ranks 0, 1, 3
    shutil.copy(CPI / "profile.2.0.0", prof)  # every rank: nothing to say
    assert not [w for w in read_paths([prof])[0].meta.warnings if "no profile of node" in w]
    for n in (0, 1):  # rank 3 alone: one node on its own says nothing either
        (prof / f"profile.{n}.0.0").unlink()
    (prof / "profile.2.0.0").unlink()
    assert not [w for w in read_paths([prof])[0].meta.warnings if "no profile of node" in w]


def test_ranks_missing_from_metric_directories_are_warned_of_once(tmp_path):
    prof = tmp_path / "prof"
    _metric_dirs(prof, {"TIME": 1, "PAPI_TOT_CYC": 2300})
    for metric in ("TIME", "PAPI_TOT_CYC"):
        for n in (0, 2):
            (prof / f"MULTI__{metric}" / f"profile.{n}.0.0").unlink()
    (trace,) = read_paths([prof])
    assert [w for w in trace.meta.warnings if "no profile of node" in w] == [
        f"{prof}: no profile of nodes 0, 2 among nodes 0–3: TAU writes profile.N.C.T files for every MPI rank N from "
        "0, so those ranks wrote none (killed before the end?) or their files were not copied; every figure over ranks "
        "leaves them out"]


def test_a_time_profile_in_another_metrics_directory_is_not_counted_twice(tmp_path):
    """MULTI__PAPI_TOT_CYC/profile.1.0.0 a copy of the TIME profile (its first line says MULTI_TIME): it was read as a
    second TIME profile of thread 1.0.0, every routine of rank 1 twice (MPI_File_open() 26.904 ms twice), with no
    word. The one in MULTI__TIME is kept, the other left out with a warning; the time is the four files' flat Excl
    summed here."""
    import shutil

    prof = tmp_path / "prof"
    _metric_dirs(prof, {"TIME": 1, "PAPI_TOT_CYC": 2300})
    misplaced = prof / "MULTI__PAPI_TOT_CYC" / "profile.1.0.0"
    shutil.copy(prof / "MULTI__TIME" / "profile.1.0.0", misplaced)
    (trace,) = read_paths([prof])
    assert trace.meta.warnings[:2] == [
        f"{misplaced}: its first line names metric TIME, not PAPI_TOT_CYC as its directory MULTI__PAPI_TOT_CYC does; "
        "read as TIME",
        f"{misplaced}: a second TIME profile of thread 1.0.0 (the first: {prof / 'MULTI__TIME' / 'profile.1.0.0'}); "
        "left out, so that the thread's routines are not counted twice"]
    flat = trace.events.filter((pl.col("kind") == "region") & ~pl.col("call_path").str.contains(" => ", literal=True))
    expected = sum(us_to_ns(Decimal(r[2])) for f in sorted(CPI.glob("profile.*"))
                   for name, r in plain_profile(f)["routines"].items() if " => " not in name)
    assert flat["exclusive_ns"].sum() == expected
    opens = flat.filter((pl.col("name") == "MPI_File_open()") & (pl.col("pid") == 1))
    assert opens["exclusive_ns"].to_list() == [us_to_ns(Decimal(plain_profile(CPI / "profile.1.0.0")["routines"]
                                                                  ["MPI_File_open()"][2]))] == [26_904_000]
