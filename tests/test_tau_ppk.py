"""ParaProf's packed profile (``.ppk``) against two independent oracles.

1. :func:`plain_ppk`, a decoder written here from TAU's Java (``DataSourceExport.writePacked`` and
   ``PackedProfileDataSource.load``, UO-OACISS/tau2 tools/src/perfdmf/src) with ``gzip`` and ``struct`` only, one
   field at a time: it does not import the reader.
2. The same run in another form: ``paraprof-dump/``, the profile.N.C.T files TAU's own Java code
   (``PackedProfileDataSource`` + ``DataSourceExport.writeProfiles``, what ``paraprof --dump`` runs) wrote from each
   fixture (fixtures/tau/real/README.md), read by the text reader.

Synthetic files (hostile names, versions, cuts) are written by :func:`pack`, the writer's layout in Python.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, refused as assert_refused, run_cli, us_to_ns
from traceparse.ingest import read_paths

REAL = FIXTURES / "tau" / "real"
LOAD_IMBALANCE = REAL / "tau2-ppk-loadimbalance"
HW_COUNTERS = REAL / "tau2-ppk-hwcounters"
PPK_FIXTURES = [LOAD_IMBALANCE / "8.ppk", HW_COUNTERS / "xgc-nosamples.ppk"]


# --- the oracle: a plain decoder, one field at a time -----------------------------------------------------------

class _Fields:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def utf(self) -> str:
        n = self.unpack(">H")
        raw = self.data[self.at:self.at + n]
        self.at += n
        # Java's modified UTF-8: NUL as C0 80, a character outside the BMP as two 3-byte surrogates
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")


def plain_ppk(path: Path) -> dict:
    """Every field of a .ppk as PackedProfileDataSource.load reads it."""
    f = _Fields(gzip.decompress(path.read_bytes()))
    assert f.unpack(">3H") == (ord("P"), ord("P"), ord("K"))
    version, compatible = f.unpack(">ii")
    header_size = f.unpack(">i")
    trial, thread_meta = {}, {}
    if version >= 2:
        reserved = f.unpack(">i")  # a block for later versions: its size, then that many bytes
        f.at += reserved
        for _ in range(f.unpack(">i")):
            name = f.utf()
            trial[name] = f.utf()
        for _ in range(f.unpack(">i")):
            key = f.unpack(">iii")
            thread_meta[key] = {f.utf(): f.utf() for _ in range(f.unpack(">i"))}
    else:
        f.at += header_size
    metrics = [f.utf() for _ in range(f.unpack(">i"))]
    groups = [f.utf() for _ in range(f.unpack(">i"))]
    functions = []
    for _ in range(f.unpack(">i")):
        name = f.utf()
        functions.append((name, [groups[f.unpack(">i")] for _ in range(f.unpack(">i"))]))
    user_events = [f.utf() for _ in range(f.unpack(">i"))]
    threads = {}
    for _ in range(f.unpack(">i")):
        key = f.unpack(">iii")
        routines = []
        for _ in range(f.unpack(">i")):
            fid, calls, subrs = f.unpack(">idd")
            values = [f.unpack(">dd") for _ in metrics]  # (exclusive, inclusive) per metric
            routines.append((functions[fid][0], "|".join(functions[fid][1]), calls, subrs, values))
        events = []
        for _ in range(f.unpack(">i")):
            uid, n = f.unpack(">ii")
            events.append((user_events[uid], n, *f.unpack(">dddd")))  # min, max, mean, sumsqr
        threads[key] = (routines, events)
    assert f.at == len(f.data)
    return {"version": version, "compatible": compatible, "trial": trial, "thread_meta": thread_meta,
            "metrics": metrics, "threads": threads}


def test_the_oracle_reads_the_fixtures_to_their_last_byte():
    li = plain_ppk(LOAD_IMBALANCE / "8.ppk")
    assert (li["version"], li["compatible"], li["metrics"], len(li["threads"])) == (2, 1, ["TIME"], 8)
    assert sum(len(r) for r, _ in li["threads"].values()) == 3511
    hw = plain_ppk(HW_COUNTERS / "xgc-nosamples.ppk")
    assert hw["metrics"] == ["PAPI_FP_INS", "PAPI_TOT_CYC", "PAPI_L1_DCM", "PAPI_BR_MSP", "PAPI_TOT_INS"]
    assert len(hw["threads"]) == 16 and {k[0] for k in hw["threads"]} == set(range(16))


# --- real files: every routine of every thread ------------------------------------------------------------------

def test_load_imbalance_every_routine_of_every_thread_matches_the_oracle():
    """tau2's LoadImbalance/8.ppk (GROMACS, 8 MPI ranks, TIME, call paths, 5 user events)."""
    plain = plain_ppk(LOAD_IMBALANCE / "8.ppk")
    trace = read_paths([LOAD_IMBALANCE / "8.ppk"])[0]
    assert trace.meta.extra["metrics"] == ["TIME"] and trace.meta.extra["threads"] == 8
    first = {**plain["trial"], **plain["thread_meta"][(0, 0, 0)]}  # the export writes both, the thread's last
    assert trace.meta.tool_version == first["TAU Version"] == "2.18.2-cvs"
    assert trace.meta.extra["metadata"] == first
    got = trace.events.filter(pl.col("kind") != "counter")
    assert got.height == sum(len(r) for r, _ in plain["threads"].values())
    expected = []
    for (node, context, thread), (routines, _) in plain["threads"].items():
        for name, group, calls, subrs, ((excl, incl),) in routines:
            expected.append({"pid": node, "device_id": context, "tid": thread, "raw": name, "group": group or None,
                             "calls": int(calls), "subcalls": int(subrs), "exclusive_ns": us_to_ns(repr(excl)),
                             "duration_ns": us_to_ns(repr(incl))})
    want = pl.DataFrame(expected).with_columns(call_path=pl.col("raw").str.replace_all(r"\s+=>\s+", " => ")
                                               .str.strip_chars()).drop("raw")
    columns = ["pid", "device_id", "tid", "call_path", "group", "calls", "subcalls", "exclusive_ns", "duration_ns"]
    key = ["pid", "tid", "call_path"]
    assert got.select(columns).sort(key).to_dicts() == want.select(columns).sort(key).to_dicts()
    # the user events: calls = numevents, value = mean, min, max, sumsqr
    events = trace.events.filter(pl.col("kind") == "counter")
    assert events.height == sum(len(e) for _, e in plain["threads"].values()) == 33
    by_key = {(r["pid"], r["tid"], r["name"]): r for r in events.to_dicts()}
    for (node, _, thread), (_, user_events) in plain["threads"].items():
        for name, n, low, high, mean, sumsqr in user_events:
            row = by_key[(node, thread, name)]
            assert (row["calls"], row["value_min"], row["value_max"], row["value"], row["value_sumsq"]) == \
                (n, low, high, mean, sumsqr)


def test_hardware_counters_every_metric_of_every_routine_matches_the_oracle():
    """tau2's HardwareCounterBasicAnalysis/xgc-nosamples.ppk: 16 ranks, 5 PAPI counters and no time metric, so
    no routine has a time and each has two counter rows (exclusive, ``(inc)``) per metric."""
    plain = plain_ppk(HW_COUNTERS / "xgc-nosamples.ppk")
    trace = read_paths([HW_COUNTERS / "xgc-nosamples.ppk"])[0]
    assert sorted(trace.meta.extra["metrics"]) == sorted(plain["metrics"]) and trace.meta.extra["time_metric"] is None
    e = trace.events
    routines = e.filter(pl.col("kind") != "counter")
    assert routines.height == sum(len(r) for r, _ in plain["threads"].values())
    assert routines["exclusive_ns"].null_count() == routines.height
    ids = {r["event_id"]: (r["pid"], r["tid"], r["call_path"]) for r in routines.to_dicts()}
    counters = {(ids[r["parent_id"]], r["name"]): (r["value"], r["calls"])
                for r in e.filter(pl.col("kind") == "counter", pl.col("parent_id").is_not_null()).to_dicts()
                if r["parent_id"] in ids}
    checked = 0
    for (node, _, thread), (rows, _) in plain["threads"].items():
        for name, _group, calls, _subrs, values in rows:
            for metric, (excl, incl) in zip(plain["metrics"], values):
                where = (node, thread, " => ".join(p.strip() for p in name.split("=>")).strip())
                assert counters[(where, metric)] == (excl, int(calls))
                assert counters[(where, metric + " (inc)")] == (incl, int(calls))
                checked += 2
    assert checked == 2 * 5 * routines.height


@pytest.mark.parametrize("ppk", PPK_FIXTURES, ids=lambda p: p.name)
def test_the_same_rows_as_taus_own_dump_of_the_file_read_as_profile_files(ppk):
    """``paraprof-dump/`` holds what TAU's Java wrote from the .ppk (``paraprof --dump``): read as profile.N.C.T
    files (one directory, or MULTI__ directories), every row and column is the same."""
    packed = read_paths([ppk])[0]
    text = read_paths([ppk.parent / "paraprof-dump"])[0]
    columns = [c for c in packed.events.columns if c != "trace_id"]
    assert packed.events.height == text.events.height > 0
    assert packed.events.select(columns).to_dicts() == text.events.select(columns).to_dicts()
    assert packed.meta.extra["metrics"] == text.meta.extra["metrics"]
    assert packed.meta.warnings == text.meta.warnings == []


def test_the_formats_list_and_the_reader_say_ppk_is_read():
    code, out, _ = run_cli("formats")
    assert code == 0 and ".ppk" in out


def test_rules_run_unchanged_on_a_ppk(store):
    code, out, err = run_cli("ingest", str(LOAD_IMBALANCE / "8.ppk"))
    assert code == 0, err
    assert "tau / ParaProf packed profile (.ppk): 8 nodes, 8 threads" in out
    assert read_paths([LOAD_IMBALANCE / "8.ppk"])[0].meta.variant == \
        "ParaProf packed profile (.ppk): 8 nodes, 8 threads, metrics TIME"
    code, out, err = run_cli("analyze", "--rule", "hotspots")
    assert code == 0 and "Traceback" not in err
    assert "routines on 8 threads of 8 processes" in " ".join(out.split())


# --- synthetic files: a writer after DataSourceExport.writePacked -----------------------------------------------

def java_utf(text: str) -> bytes:
    """Java's ``writeUTF``: length, then modified UTF-8."""
    raw = text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    body = b"".join(b"\xc0\x80" if ch == "\x00" else
                    (ch.encode("utf-8") if ord(ch) < 0x10000 else
                     "".join(chr(0xD800 + ((ord(ch) - 0x10000) >> 10)) + chr(0xDC00 + ((ord(ch) - 0x10000) & 0x3FF)))
                     .encode("utf-8", "surrogatepass"))
                    for ch in raw)
    return struct.pack(">H", len(body)) + body


def pack(routines: list[tuple[str, list[int]]], threads: dict, metrics=("TIME",), groups=("TAU_USER",),
         user_events=(), version=2, compatible=1, trial=None) -> bytes:
    """The bytes of a .ppk before gzip: ``threads`` maps (node, context, thread) to ([(routine id, calls, subrs,
    [excl, incl] * metrics)], [(user event id, n, min, max, mean, sumsqr)])."""
    out = [struct.pack(">3H", *map(ord, "PPK")), struct.pack(">ii", version, compatible)]
    header = struct.pack(">i", 0)
    if version >= 2:
        trial = trial if trial is not None else {"TAU Version": "2.33"}
        header += struct.pack(">i", len(trial)) + b"".join(java_utf(k) + java_utf(v) for k, v in trial.items())
        header += struct.pack(">i", 0)
    out += [struct.pack(">i", len(header)), header, struct.pack(">i", len(metrics))]
    out += [java_utf(m) for m in metrics] + [struct.pack(">i", len(groups))] + [java_utf(g) for g in groups]
    out.append(struct.pack(">i", len(routines)))
    for name, group_ids in routines:
        out += [java_utf(name), struct.pack(">i", len(group_ids))] + [struct.pack(">i", g) for g in group_ids]
    out += [struct.pack(">i", len(user_events))] + [java_utf(u) for u in user_events]
    out.append(struct.pack(">i", len(threads)))
    for key, (rows, events) in threads.items():
        out += [struct.pack(">iii", *key), struct.pack(">i", len(rows))]
        out += [struct.pack(f">idd{len(values)}d", fid, calls, subrs, *values) for fid, calls, subrs, values in rows]
        out += [struct.pack(">i", len(events))] + [struct.pack(">iidddd", *e) for e in events]
    return b"".join(out)


HOSTILE = ['"; DROP TABLE events; --', "<script>alert(1)</script>", "a\nb\r\nc", "tab\there", "nul\x00byte",
           "emoji 🔥 outside the BMP", "bidi \u202eevil\u202c", "  padded  ", "%s %n {0}", "x" * 3000,
           "main => child", "back\\slash 'quote'"]


def test_hostile_routine_names_are_kept_literally(tmp_path):
    routines = [(name, [0]) for name in HOSTILE]
    rows = [(i, 1.0, 0.0, [float(i + 1), float(i + 1)]) for i in range(len(HOSTILE))]
    f = tmp_path / "hostile.ppk"
    f.write_bytes(gzip.compress(pack(routines, {(0, 0, 0): (rows, [])}), mtime=0))
    e = read_paths([f])[0].events.sort("exclusive_ns")
    assert e["exclusive_ns"].to_list() == [(i + 1) * 1000 for i in range(len(HOSTILE))]
    # as the text reader shows them: call-path spacing normalised and TAU's padding trimmed, nothing else
    assert e["call_path"].to_list() == [n.strip() for n in HOSTILE]
    assert e["name"].to_list()[-2] == "child"


def test_version_1_skips_its_header_and_a_newer_layout_is_refused(tmp_path, store):
    rows = [(0, 3.0, 1.0, [10.5, 20.25])]
    old = tmp_path / "v1.ppk"
    old.write_bytes(gzip.compress(pack([("main", [0])], {(0, 0, 0): (rows, [])}, version=1), mtime=0))
    e = read_paths([old])[0].events
    assert e.select("calls", "subcalls", "exclusive_ns", "duration_ns").row(0) == (3, 1, 10500, 20250)
    new = tmp_path / "v9.ppk"
    new.write_bytes(gzip.compress(pack([("main", [0])], {(0, 0, 0): (rows, [])}, version=9, compatible=3), mtime=0))
    assert_refused(["ingest", str(new)], f"{new}: a packed profile of version 9 that needs a reader of version 3; "
                                         "this one reads up to version 2", store)


def test_an_unzipped_ppk_is_read_as_paraprof_reads_it(tmp_path):
    """PackedProfileDataSource falls back to the raw stream ("ppk files downloaded on Macs are unzipped")."""
    f = tmp_path / "unzipped.ppk"
    f.write_bytes(pack([("main", [0])], {(0, 0, 0): ([(0, 1.0, 0.0, [5.0, 5.0])], [])}))
    assert read_paths([f])[0].events["duration_ns"].to_list() == [5000]


def test_fractional_calls_are_rounded_and_a_nan_time_is_unknown_with_warnings(tmp_path):
    f = tmp_path / "mean.ppk"
    rows = [(0, 2.5, 0.0, [5.0, 5.0]), (1, 1.0, 0.0, [float("nan"), 7.0])]
    f.write_bytes(gzip.compress(pack([("main", [0]), ("other", [0])], {(0, 0, 0): (rows, [])}), mtime=0))
    trace = read_paths([f])[0]
    assert trace.events.select("calls", "exclusive_ns", "duration_ns").rows() == [(2, 5000, 5000), (1, None, 7000)]
    assert f"{f}: 1 fractional calls values (e.g. 2.5) were rounded to whole numbers" in trace.meta.warnings
    assert f"{f}: 1 TIME values are not finite numbers (e.g. nan); left unknown" in trace.meta.warnings


# --- cut short, and not a ppk -----------------------------------------------------------------------------------

def test_a_ppk_cut_in_the_middle_keeps_its_complete_threads_with_a_warning(tmp_path, store):
    data = (LOAD_IMBALANCE / "8.ppk").read_bytes()
    cut = tmp_path / "cut.ppk"
    cut.write_bytes(data[: len(data) * 2 // 3])
    code, out, err = run_cli("ingest", str(cut))
    assert code == 0 and "Traceback" not in err
    trace = read_paths([cut])[0]
    plain = plain_ppk(LOAD_IMBALANCE / "8.ppk")
    kept = trace.events.filter(pl.col("kind") != "counter").select("pid").unique()["pid"].to_list()
    assert 0 < len(kept) < 8 and sorted(kept) == list(range(len(kept)))
    assert [w for w in trace.meta.warnings if "ends early" in w] == [
        f"{cut}: the file ends early (Compressed file ended before the end-of-stream marker was reached) while "
        f"reading the {len(plain['threads'][(len(kept), 0, 0)][0])} routine records of thread {len(kept)}.0.0; "
        f"{len(kept)} complete threads of 8 were kept"]
    # every analysis says it
    assert trace.meta.extra["incomplete"] == [w for w in trace.meta.warnings if "ends early" in w]
    whole = read_paths([LOAD_IMBALANCE / "8.ppk"])[0].events
    assert trace.events.filter(pl.col("kind") != "counter").drop("trace_id").to_dicts() == \
        whole.filter(pl.col("kind") != "counter", pl.col("pid").is_in(kept)).drop("trace_id").to_dicts()
    assert len(plain["threads"]) == 8


def test_a_ppk_cut_before_any_thread_is_one_line_naming_what_was_expected(tmp_path, store):
    raw = gzip.decompress((LOAD_IMBALANCE / "8.ppk").read_bytes())
    cut = tmp_path / "head.ppk"
    cut.write_bytes(gzip.compress(raw[:3000], mtime=0))
    code, _, err = run_cli("ingest", str(cut))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"traceparse: error: {cut}: the file ends early (byte ")
    assert "before any thread's data" in err
    assert_refused(["ingest", str(cut)], err.strip()[len("traceparse: error: "):], store)


def test_a_ppk_cut_inside_a_threads_records_says_which(tmp_path, store):
    one = pack([("main", [0])], {(0, 0, 0): ([(0, 1.0, 0.0, [5.0, 5.0])], []), (1, 0, 0): ([(0, 1.0, 0.0,
                                                                                            [6.0, 6.0])], [])})
    cut = tmp_path / "rec.ppk"
    cut.write_bytes(gzip.compress(one[:-10], mtime=0))
    trace = read_paths([cut])[0]
    assert trace.events["pid"].to_list() == [0]
    assert trace.meta.warnings == [f"{cut}: the file ends early while reading the 1 routine records of thread 1.0.0; "
                                   "1 complete thread of 2 was kept"]


@pytest.mark.parametrize("content", [b"hello, not a profile\n", gzip.compress(b"1 templated_functions_X\n", mtime=0),
                                     gzip.compress(b"\x00P\x00P\x00X" + bytes(20), mtime=0), b"\x1f\x8b\x08\x00junk"],
                         ids=["text", "gzip text", "gzip almost", "damaged gzip"])
def test_a_file_named_ppk_that_is_not_one_is_one_line(tmp_path, store, content):
    f = tmp_path / "fake.ppk"
    f.write_bytes(content)
    code, _, err = run_cli("ingest", str(f))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"traceparse: error: {f}")


def test_a_file_named_ppk_that_is_not_one_says_what_a_ppk_starts_with(tmp_path, store):
    f = tmp_path / "fake.ppk"
    f.write_bytes(b"hello, not a profile\n")
    assert_refused(["ingest", str(f)], f"{f}: not a ParaProf packed profile: expected gzip data starting with 'PPK' "
                                       "as Java writes characters (00 50 00 50 00 4B), found 68 65 6c 6c 6f 2c", store)


def test_a_damaged_count_or_index_is_one_line(tmp_path, store):
    """A negative count (bytes changed, not cut) and a record naming a routine the file does not have."""
    head = struct.pack(">3H", *map(ord, "PPK")) + struct.pack(">ii", 2, 1) + struct.pack(">iiii", 12, 0, 0, 0)
    f = tmp_path / "negative.ppk"
    f.write_bytes(gzip.compress(head + struct.pack(">i", -5), mtime=0))
    assert_refused(["ingest", str(f)], f"{f}: expected the count of metrics at byte 30 (decompressed), found -5: "
                                       "the file is damaged", store)
    g = tmp_path / "index.ppk"
    g.write_bytes(gzip.compress(pack([("main", [0])], {(0, 0, 0): ([(7, 1.0, 0.0, [5.0, 5.0])], [])}), mtime=0))
    assert_refused(["ingest", str(g)], f"{g}: thread 0.0.0 refers to routine id 7, but the file names 1 routines",
                   store)



def test_hotspots_of_counters_alone_says_what_was_measured(tmp_path):
    """XGC's profile measured 5 PAPI counters and no time: hotspots said only "No routine time in this trace.", as
    if nothing had been measured. It names the counters the routines carry (from the test's own decoder)."""
    metrics = sorted(plain_ppk(HW_COUNTERS / "xgc-nosamples.ppk")["metrics"])
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(HW_COUNTERS / "xgc-nosamples.ppk"),
                             "--rule", "hotspots", "--json")
    assert code == 0, err
    assert json.loads(out)["findings"][0]["message"] == (
        f"No routine time in this trace. Its routines carry counters ({', '.join(metrics)}) but no time: the "
        "profile measured no time metric, and routines are ranked here by their time.")
