"""Measures: partitioned-then-combined equals the whole table, and every figure equals a plain-Python computation.

The oracles below work on the event rows as Python dicts, with loops and
sorted lists, sharing no code with the measures (which are polars sweeps and
joins). They are checked on real fixtures and on hand-built tables whose
figures are worked out in the comments.
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal as _assert_frame_equal

from helpers import table
from traceparse import expr, measures
from traceparse.ingest import read_paths
from traceparse.measures import MEASURES, Measure, partitioned
from traceparse.schema import conform

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REAL = sorted(FIXTURES.glob("torch/*.json.gz")) + sorted(
    p for p in [*FIXTURES.glob("nsys/*.csv"), FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz",
                *FIXTURES.glob("nvprof/real/*"), *FIXTURES.glob("nvprof/handwritten/*")]
    if p.suffix != ".md")
GPU = ("kernel", "memcpy", "memset")

#: (measure, params) pairs run on every fixture; communication vs compute shows expression sides.
CASES = [
    ("device_busy", {}), ("device_busy", {"kinds": ("kernel",)}), ("gaps", {}),
    ("overlap", {}), ("overlap", {"group": ("copy_kind", "src_memory", "dst_memory")}),
    ("overlap", {"a": expr.kind_is("kernel") & (expr.kernel_category(pl.col("name")) == "communication"),
                 "b": expr.kind_is("kernel") & (expr.kernel_category(pl.col("name")) != "communication")}),
    ("concurrency", {}), ("concurrency", {"kinds": GPU, "at_least": 3}),
    ("time_by_name", {}), ("time_by_name", {"kinds": ("kernel", "api"), "prefer_timed": False}),
    ("time_by_category", {}), ("api_classes", {}),
    ("copy_stats", {}), ("copy_stats", {"prefer_timed": False, "buckets": [1024, 131072]}),
    ("steps", {}), ("self_time", {}), ("launches", {}), ("launches", {"kinds": ("kernel",)}),
    ("launch_summary", {}), ("launch_summary", {"kinds": ("kernel",), "top": 3}),
    ("stream_idle", {}), ("stream_idle", {"kernel_wait_ns": 5_000}), ("memory_samples", {}), ("memory_peaks", {}),
    ("comm_overlap", {}), ("collectives", {}), ("collective_waits", {}), ("collective_waits", {"align_clocks": True}),
    ("rank_time", {}), ("grid_fill", {}), ("grid_fill", {"sm_count": 132, "short_ns": 5_000}),
    ("dependency_graph", {}), ("dependency_graph", {"min_wait_ns": 1_000, "max_wake_ns": 100_000}),
    ("step_time_by_name", {}),
    ("gap_activity", {}), ("gap_activity", {"kernel_wait_ns": 5_000}),
]


@cache
def events_of(path: Path) -> pl.DataFrame:
    return read_paths([path])[0].events


def assert_frame_equal(got: pl.DataFrame, want: pl.DataFrame, *, check_dtypes: bool, obj: str) -> None:
    try:
        _assert_frame_equal(got, want, check_dtypes=check_dtypes)
    except AssertionError as exc:
        raise AssertionError(f"{obj}: {exc}") from None


def canonical(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in one order (list columns are sorted lists already) so that frames compare by content."""
    keys = [c for c, t in frame.schema.items() if not isinstance(t, pl.List)]
    return frame.sort(keys, nulls_last=True)


def test_every_measure_is_covered():
    assert {name for name, _ in CASES} == set(MEASURES)


@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_partitioned_equals_whole_on_real_traces(path):
    events = events_of(path)
    assert events.height > 0
    for name, params in CASES:
        m = MEASURES[name]
        whole = canonical(m(events, **params))
        for split in ({"by": "device_id"}, {"by": "trace_id"}, {"chunks": 3}, {"chunks": 50}):
            if split.get("by", "rows") not in m.partitions:  # a measure that needs whole traces refuses the others
                continue
            got = canonical(partitioned(m, events, **split, **params))
            assert_frame_equal(got, whole, check_dtypes=False, obj=f"{name} {params} {split}")


def test_partitioned_by_trace_on_several_traces_at_once():
    paths = [FIXTURES / "torch" / "resnet18_bs8.json.gz", FIXTURES / "nvprof" / "handwritten" / "gpu_trace.log",
             FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv"]
    events = pl.concat([events_of(p) for p in paths], how="vertical_relaxed")
    assert events["trace_id"].n_unique() == 3
    for name, params in CASES:
        m = MEASURES[name]
        whole = canonical(m(events, **params))
        for split in ({"by": "trace_id"}, {"by": "device_id"}, {"chunks": 7}):
            if split.get("by", "rows") not in m.partitions:
                continue
            assert_frame_equal(canonical(partitioned(m, events, **split, **params)), whole, check_dtypes=False,
                               obj=f"{name} {split}")
        # one trace's figures do not depend on the other traces in the table
        alone = canonical(m(events_of(paths[0]), **params))
        assert_frame_equal(whole.filter(pl.col("trace_id") == alone["trace_id"][0]) if alone.height else alone,
                           alone, check_dtypes=False, obj=name)


def test_a_partition_the_measure_does_not_declare_is_refused():
    class PerTrace(Measure):
        name = "per_trace"
        partitions = ("trace_id",)

        def part(self, events, **params):
            return events.group_by("trace_id").len()

        def combine(self, parts, **params):
            return pl.concat(parts)

    with pytest.raises(ValueError, match="cannot be partitioned by device_id"):
        partitioned(PerTrace(), conform(pl.DataFrame({"kind": ["kernel"]})), by="device_id")
    with pytest.raises(ValueError, match="exactly one"):
        partitioned(measures.gaps, conform(pl.DataFrame({"kind": ["kernel"]})))


# -- plain-Python oracles ------------------------------------------------------------------------------------------
def placed(rows, kinds):
    return [r for r in rows if str(r["kind"]) in kinds and r["start_ns"] is not None and r["duration_ns"] is not None]


def merged(intervals):
    """Merge [s, e) intervals that overlap or touch."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def py_device_busy(rows, kinds=GPU):
    per = defaultdict(list)
    for r in placed(rows, kinds):
        per[(r["trace_id"], r["device_id"])].append((r["start_ns"], r["start_ns"] + r["duration_ns"]))
    out = {}
    for key, ivs in per.items():
        u = merged(ivs)
        busy = sum(e - s for s, e in u)
        span = u[-1][1] - u[0][0]
        out[key] = {"first_ns": u[0][0], "last_ns": max(e for _, e in u), "span_ns": span, "busy_ns": busy,
                    "idle_ns": span - busy, "gaps": len(u) - 1}
    return out


def py_gaps(rows, kinds=GPU):
    per = defaultdict(list)
    for r in placed(rows, kinds):
        per[(r["trace_id"], r["device_id"])].append(r)
    out = []
    for key, rs in per.items():
        u = merged([(r["start_ns"], r["start_ns"] + r["duration_ns"]) for r in rs])
        for (_, gap_start), (gap_end, _) in zip(u, u[1:]):
            before = min((r for r in rs if r["start_ns"] + r["duration_ns"] == gap_start), key=lambda r: r["event_id"])
            after = min((r for r in rs if r["start_ns"] == gap_end), key=lambda r: r["event_id"])
            out.append((*key, gap_start, gap_end, gap_end - gap_start, before["name"], after["name"]))
    return sorted(out, key=str)


def py_overlap(rows, a=("memcpy",), b=("kernel",), group=()):
    cover = defaultdict(list)
    for r in placed(rows, b):
        cover[(r["trace_id"], r["device_id"])].append((r["start_ns"], r["start_ns"] + r["duration_ns"]))
    cover = {k: merged(v) for k, v in cover.items()}
    out = defaultdict(lambda: [0, 0, 0])
    for r in placed(rows, a):
        s, e = r["start_ns"], r["start_ns"] + r["duration_ns"]
        dev = (r["trace_id"], r["device_id"])
        key = (*dev, *(None if r[g] is None else str(r[g]) for g in group))
        o = sum(max(0, min(e, ce) - max(s, cs)) for cs, ce in cover.get(dev, []))
        out[key][0] += 1
        out[key][1] += e - s
        out[key][2] += o
    return {k: {"count": c, "time_ns": t, "overlapped_ns": o, "exposed_ns": t - o} for k, (c, t, o) in out.items()}


def py_concurrency(rows, kinds=("kernel",), at_least=2):
    per = defaultdict(list)
    for r in placed(rows, kinds):
        per[(r["trace_id"], r["device_id"])].append(r)
    out = {}
    for key, rs in per.items():
        edges = sorted([(r["start_ns"], 1) for r in rs] + [(r["start_ns"] + r["duration_ns"], -1) for r in rs],
                       key=lambda x: (x[0], x[1]))
        depth, busy, conc, top, total = 0, 0, 0, 0, 0
        for (t, d), (t2, _) in zip(edges, edges[1:]):
            depth += d
            if t2 > t:
                busy += (t2 - t) if depth >= 1 else 0
                conc += (t2 - t) if depth >= at_least else 0
                total += (t2 - t) * depth
                top = max(top, depth)
        streams = {r["stream_id"] for r in rs}
        out[key] = {"count": len(rs), "time_ns": total, "busy_ns": busy, "concurrent_ns": conc, "max_depth": top,
                    "streams": len(streams)}
    return out


def py_time_by_name(rows, kinds, prefer_timed=True):
    rows = [r for r in rows if str(r["kind"]) in kinds]
    timed_kinds = {(r["trace_id"], str(r["kind"])) for r in rows if r["start_ns"] is not None}
    out = {}
    ignored = defaultdict(int)
    for r in rows:
        key = (r["trace_id"], str(r["kind"]))
        if prefer_timed and r["start_ns"] is None and key in timed_kinds:
            ignored[key] += 1
            continue
        o = out.setdefault((*key, r["name"]), {"calls": 0, "time_ns": None, "rows": 0})
        o["calls"] += 1 if r["calls"] is None else r["calls"]
        o["rows"] += 1
        if r["duration_ns"] is not None:
            o["time_ns"] = (o["time_ns"] or 0) + r["duration_ns"]
    for key, o in out.items():
        o["ignored_rows"] = ignored[key[:2]]
    return out


def py_copy_stats(rows, prefer_timed=True):
    rows = [r for r in rows if str(r["kind"]) == "memcpy"]
    timed_traces = {r["trace_id"] for r in rows if r["start_ns"] is not None}
    out = {}
    for r in rows:
        if prefer_timed and r["start_ns"] is None and r["trace_id"] in timed_traces:
            continue
        calls = 1 if r["calls"] is None else r["calls"]
        mean = r["bytes"] / calls if r["bytes"] is not None and calls > 0 else None
        key = (r["trace_id"], *(None if r[c] is None else str(r[c]) for c in ("copy_kind", "src_memory", "dst_memory")),
               r["start_ns"] is None, r["duration_ns"] is not None, mean)
        o = out.setdefault(key, {"copies": 0, "bytes": None, "time_ns": 0, "rows": 0})
        o["copies"] += calls
        o["rows"] += 1
        o["time_ns"] += r["duration_ns"] or 0
        if r["bytes"] is not None:
            o["bytes"] = (o["bytes"] or 0) + r["bytes"]
    return out


def py_steps(rows):
    out = {}
    for r in rows:
        m = re.fullmatch(r"ProfilerStep#(\d+)", r["name"] or "")
        if not m or r["duration_ns"] is None:
            continue
        key = (r["trace_id"], r["pid"] is not None, int(m.group(1)))
        o = out.setdefault(key, {"start_ns": r["start_ns"], "end_ns": r["start_ns"] + r["duration_ns"],
                                 "duration_ns": 0, "annotations": 0})
        o["start_ns"] = min(o["start_ns"], r["start_ns"])
        o["end_ns"] = max(o["end_ns"], r["start_ns"] + r["duration_ns"])
        o["duration_ns"] = max(o["duration_ns"], r["duration_ns"])
        o["annotations"] += 1
    return out


def keyed_rows(frame: pl.DataFrame, keys: list[str], values: list[str]) -> dict:
    return {tuple(r[k] for k in keys): {v: r[v] for v in values} for r in frame.iter_rows(named=True)}


ORACLE_FIXTURES = [FIXTURES / "torch" / "resnet18_bs8.json.gz", FIXTURES / "nvprof" / "handwritten" / "gpu_trace_p2p.log",
                   FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"]


@pytest.mark.parametrize("path", ORACLE_FIXTURES, ids=lambda p: p.name)
def test_figures_equal_plain_python_on_real_traces(path):
    events = events_of(path)
    rows = events.to_dicts()
    check_against_oracles(events, rows)


def check_against_oracles(events: pl.DataFrame, rows: list[dict]) -> None:
    device = ["trace_id", "device_id"]
    busy = measures.device_busy(events)
    assert keyed_rows(busy, device, ["first_ns", "last_ns", "span_ns", "busy_ns", "idle_ns", "gaps"]) \
        == py_device_busy(rows)
    assert sorted(measures.gaps(events).rows(), key=str) == py_gaps(rows)
    group = ["copy_kind", "src_memory", "dst_memory"]
    got = measures.overlap(events, group=group)
    assert keyed_rows(got, device + group, ["count", "time_ns", "overlapped_ns", "exposed_ns"]) \
        == py_overlap(rows, group=group)
    assert keyed_rows(measures.overlap(events, a=GPU, b=("api",)), device,
                      ["count", "time_ns", "overlapped_ns", "exposed_ns"]) == py_overlap(rows, a=GPU, b=("api",))
    for kinds, at_least in ((("kernel",), 2), (GPU, 3)):
        got = measures.concurrency(events, kinds=kinds, at_least=at_least)
        assert keyed_rows(got, device, ["count", "time_ns", "busy_ns", "concurrent_ns", "max_depth", "streams"]) \
            == py_concurrency(rows, kinds, at_least)
    kinds = ("kernel", "memcpy", "memset", "api")
    for prefer in (True, False):
        got = measures.time_by_name(events, kinds=kinds, prefer_timed=prefer)
        assert keyed_rows(got, ["trace_id", "kind", "name"], ["calls", "time_ns", "rows", "ignored_rows"]) \
            == py_time_by_name(rows, kinds, prefer)
    by_name = py_time_by_name(rows, ("api",), True)
    classes = defaultdict(lambda: [0, 0])
    for (_, _, name), o in by_name.items():
        label = next((c for c, p in expr.API_CLASSES if re.search(p, name or "")), "other")
        classes[label][0] += o["calls"]
        classes[label][1] += o["time_ns"] or 0
    got = measures.api_classes(events)
    assert {r["category"]: [r["calls"], r["time_ns"] or 0] for r in got.iter_rows(named=True)} == classes
    for prefer in (True, False):
        got = measures.copy_stats(events, prefer_timed=prefer)
        keys = ["trace_id", "copy_kind", "src_memory", "dst_memory", "aggregated", "duration_known", "mean_bytes"]
        assert keyed_rows(got, keys, ["copies", "bytes", "time_ns", "rows"]) == py_copy_stats(rows, prefer)
    got = measures.steps(events)
    assert keyed_rows(got, ["trace_id", "on_host", "step"], ["start_ns", "end_ns", "duration_ns", "annotations"]) \
        == py_steps(rows)


# -- hand-built edge cases, worked out by hand -----------------------------------------------------------------------
def k(start, end, device=0, stream=7, name="k", **more):
    return {"kind": "kernel", "name": name, "start_ns": start, "duration_ns": end - start, "device_id": device,
            "stream_id": stream, **more}


def c(start, end, device=0, copy_kind="HtoD", nbytes=100, **more):
    return {"kind": "memcpy", "name": "copy", "start_ns": start, "duration_ns": end - start, "device_id": device,
            "copy_kind": copy_kind, "bytes": nbytes, **more}


EDGES = table(
    # device 0: [0,10) and [10,20) touch; [30,100) holds [40,50) nested, and [45,60) overlaps that one
    k(0, 10, name="a"), k(10, 20, name="b"), k(30, 100, name="c", stream=8), k(40, 50, name="d"), k(45, 60, name="e"),
    # no device: [0,5) and [8,9)
    k(0, 5, device=None, name="f"), k(8, 9, device=None, name="g"),
    # an aggregated kernel row beside the timed ones: no start, 3 calls
    {"kind": "kernel", "name": "a", "duration_ns": 1000, "calls": 3, "device_id": 0},
    # copies on device 0: [5,35) overlaps kernels for 5 + 5 + 5 = 15 ns; an aggregated copy row of 4 calls
    c(5, 35), c(200, 210, copy_kind="DtoH", nbytes=7),
    {"kind": "memcpy", "name": "copy", "duration_ns": 50, "calls": 4, "bytes": 10, "copy_kind": "HtoD"},
)


def test_edge_cases_with_exact_figures():
    busy = keyed_rows(measures.device_busy(EDGES, kinds=("kernel",)), ["device_id"],
                      ["span_ns", "busy_ns", "idle_ns", "gaps"])
    # device 0: union [0,20) + [30,100) = 90 busy of a 100 span, one gap [20,30); no device: 5 + 1 of 9, gap [5,8)
    assert busy == {(0,): {"span_ns": 100, "busy_ns": 90, "idle_ns": 10, "gaps": 1},
                    (None,): {"span_ns": 9, "busy_ns": 6, "idle_ns": 3, "gaps": 1}}
    gaps = measures.gaps(EDGES, kinds=("kernel",)).select("device_id", "start", "end", "length", "before", "after")
    assert sorted(gaps.rows(), key=str) == [(0, 20, 30, 10, "b", "c"), (None, 5, 8, 3, "f", "g")]
    with_copies = keyed_rows(measures.device_busy(EDGES), ["device_id"], ["span_ns", "busy_ns", "gaps"])
    # the copies fill [20,30) and add [200,210): busy 100 + 10 of a 210 span, one gap [100,200)
    assert with_copies[(0,)] == {"span_ns": 210, "busy_ns": 110, "gaps": 1}
    conc = keyed_rows(measures.concurrency(EDGES), ["device_id"],
                      ["count", "busy_ns", "concurrent_ns", "max_depth", "streams", "time_ns"])
    # device 0: depth 2 on [40,60) (c with d, then c with e), depth 3 on [45,50); touching a/b are not concurrent
    assert conc[(0,)] == {"count": 5, "busy_ns": 90, "concurrent_ns": 20, "max_depth": 3, "streams": 2,
                          "time_ns": 10 + 10 + 70 + 10 + 15}
    assert conc[(None,)] == {"count": 2, "busy_ns": 6, "concurrent_ns": 0, "max_depth": 1, "streams": 1, "time_ns": 6}
    over = keyed_rows(measures.overlap(EDGES, group=["copy_kind"]), ["device_id", "copy_kind"],
                      ["count", "time_ns", "overlapped_ns"])
    # [5,35) ∩ ([0,20) ∪ [30,100)) = [5,20) + [30,35) = 20; the DtoH copy at [200,210) overlaps nothing
    assert over == {(0, "HtoD"): {"count": 1, "time_ns": 30, "overlapped_ns": 20},
                    (0, "DtoH"): {"count": 1, "time_ns": 10, "overlapped_ns": 0}}
    names = keyed_rows(measures.time_by_name(EDGES, kinds=("kernel",)), ["name"], ["calls", "time_ns", "ignored_rows"])
    # the aggregated row of "a" is left out: the trace has timed kernels
    assert names[("a",)] == {"calls": 1, "time_ns": 10, "ignored_rows": 1}
    both = keyed_rows(measures.time_by_name(EDGES, kinds=("kernel",), prefer_timed=False), ["name"], ["calls", "time_ns"])
    assert both[("a",)] == {"calls": 4, "time_ns": 1010}
    copies = measures.copy_stats(EDGES, buckets=[64])
    assert copies.select("copy_kind", "size_bytes", "size_bucket", "copies", "bytes", "ignored_rows").rows() == [
        ("DtoH", 7, 64, 1, 7, 1), ("HtoD", 100, None, 1, 100, 1)]
    summary_only = measures.copy_stats(EDGES.filter(pl.col("start_ns").is_null()))
    # 10 bytes over 4 calls: a mean of 2.5 bytes, rounded half up to 3
    assert summary_only.select("aggregated", "mean_bytes", "size_bytes", "copies", "ignored_rows").rows() == [
        (True, 2.5, 3, 4, 0)]
    check_against_oracles(EDGES, EDGES.to_dicts())


def test_steps_on_host_and_device_annotations():
    ev = table({"kind": "marker", "name": "ProfilerStep#2", "start_ns": 100, "duration_ns": 50, "pid": 1},
               {"kind": "marker", "name": "ProfilerStep#2", "start_ns": 90, "duration_ns": 40, "pid": 2},
               {"kind": "marker", "name": "ProfilerStep#2", "start_ns": 105, "duration_ns": 30},
               {"kind": "marker", "name": "ProfilerStep#10", "start_ns": 200, "duration_ns": 5, "pid": 1},
               {"kind": "marker", "name": "ProfilerStep#x", "start_ns": 0, "duration_ns": 5, "pid": 1})
    got = measures.steps(ev).select("on_host", "step", "start_ns", "end_ns", "duration_ns", "annotations").rows()
    assert got == [(True, 2, 90, 150, 50, 2), (True, 10, 200, 205, 5, 1), (False, 2, 105, 135, 30, 1)]


def test_an_empty_table_gives_empty_frames():
    empty = conform(pl.DataFrame({"kind": []}, schema={"kind": pl.String}))
    for name, params in CASES:
        assert MEASURES[name](empty, **params).height == 0, name
