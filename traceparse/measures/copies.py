"""Copy statistics: copies, bytes and time by direction, memory kinds and size."""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.measures.base import Measure, keyed, rows_of, unkeyed

_KEYS = ["trace_id", "copy_kind", "src_memory", "dst_memory", "aggregated", "duration_known", "mean_bytes"]


class CopyStats(Measure):
    """Copies, bytes and time per direction, memory kinds and size of the memcpy rows.

    Groups, per ``trace_id``: ``copy_kind``, ``src_memory``, ``dst_memory``
    (text, null when unknown), ``aggregated`` (summary rows, no start),
    ``duration_known`` and ``mean_bytes`` = bytes / calls, the size of one
    copy: exact for a timed event, the mean for an aggregated row (null when
    the bytes are unknown or calls ≤ 0); ``size_bytes`` is it rounded to the
    nearest byte, halves up. Figures: ``copies`` = Σ calls (a missing count
    is 1), ``bytes`` = Σ bytes (null when no row says), ``time_ns`` = Σ
    duration_ns, ``rows``. With ``buckets`` (ascending byte limits),
    ``size_bucket`` is the first limit a copy's size is under (null: above
    all). With ``prefer_timed`` (the default), when a trace has timed copies
    its aggregated memcpy rows are left out, and ``ignored_rows`` counts them.

    Part: sums per group; combine: the sums and the choice of rows. Valid
    partitions: device, trace, row chunks.
    """

    name = "copy_stats"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=("memcpy",), prefer_timed: bool = True, buckets=None) -> pl.DataFrame:
        calls = expr.calls()
        rows = keyed(rows_of(events, kinds).select("trace_id", "start_ns", "duration_ns", "calls", "bytes",
                                                   "copy_kind", "src_memory", "dst_memory"))
        return (rows.group_by(
            "trace_id", pl.col("copy_kind").cast(pl.String), pl.col("src_memory").cast(pl.String),
            pl.col("dst_memory").cast(pl.String), aggregated=~expr.timed(),
            duration_known=pl.col("duration_ns").is_not_null(),
            mean_bytes=pl.when(calls > 0).then(pl.col("bytes") / calls))
            .agg(copies=calls.sum(), bytes=pl.col("bytes").sum(), sized=pl.col("bytes").count(),
                 time_ns=pl.col("duration_ns").sum(), rows=pl.len().cast(pl.Int64)))

    def combine(self, parts: list[pl.DataFrame], kinds=("memcpy",), prefer_timed: bool = True,
                buckets=None) -> pl.DataFrame:
        sums = pl.concat(parts).group_by(_KEYS).agg(pl.col("copies", "bytes", "sized", "time_ns", "rows").sum())
        if prefer_timed:
            drop = pl.col("aggregated") & (pl.col("rows").filter(~pl.col("aggregated")).sum().over("trace_id") > 0)
        else:
            drop = pl.lit(False)
        sums = sums.with_columns(drop=drop).with_columns(
            ignored_rows=pl.col("rows").filter(pl.col("drop")).sum().over("trace_id"))
        out = sums.filter(~pl.col("drop")).with_columns(
            bytes=pl.when(pl.col("sized") > 0).then(pl.col("bytes")),
            size_bytes=(pl.col("mean_bytes") + 0.5).floor().cast(pl.Int64))
        if buckets:
            bucket = pl.lit(None, pl.Int64)
            for limit in sorted(buckets, reverse=True):
                bucket = pl.when(pl.col("mean_bytes") < limit).then(pl.lit(limit, pl.Int64)).otherwise(bucket)
            out = out.with_columns(size_bucket=bucket)
        out = out.sort(_KEYS, nulls_last=False)
        return unkeyed(out).select(*_KEYS, "size_bytes", *(["size_bucket"] if buckets else []),
                                   "copies", "bytes", "time_ns", "rows", "ignored_rows")


copy_stats = CopyStats()


def gpu_time_parts(events: pl.DataFrame) -> pl.DataFrame:
    """GPU time by what the GPU did: one row per part (``part``, ``time_ns``, ``aggregated``), largest first.

    Parts: ``kernels``, ``memset`` and one per copy direction (``HtoD``,
    ``DtoH``, ``DtoD``, ...; ``memcpy`` for copies of unknown direction), each
    the Σ of its rows' durations as measures ``time_by_name`` and
    :data:`copy_stats` give them (timed events in preference to aggregated
    rows of the same kind), so it is GPU time as a summary report counts it
    (nvprof's "GPU activities", nsys's ``cuda_gpu_kern_sum`` and
    ``cuda_gpu_mem_time_sum``), overlaps counted twice. ``aggregated`` says
    whether the part's time comes from aggregated rows (no timeline). Parts
    with no time are left out. Built on the two measures, so it partitions
    as they do.
    """
    from traceparse.measures.time import time_by_name

    names = time_by_name(events, kinds=("kernel", "memset"), prefer_timed=True)
    raw = rows_of(events, ("kernel", "memset", "memcpy"))
    timed_kinds = set(raw.filter(expr.timed())["kind"].cast(pl.String).unique().to_list())
    rows = [{"part": "kernels" if k == "kernel" else k,
             "time_ns": int(names.filter(pl.col("kind") == k)["time_ns"].sum() or 0),
             "aggregated": k not in timed_kinds} for k in ("kernel", "memset")]
    copies = (copy_stats(events).with_columns(pl.col("copy_kind").fill_null("memcpy"))
              .group_by("copy_kind").agg(pl.col("time_ns").sum(), pl.col("aggregated").all()))
    rows += [{"part": r["copy_kind"], "time_ns": int(r["time_ns"] or 0), "aggregated": bool(r["aggregated"])}
             for r in copies.iter_rows(named=True)]
    out = pl.DataFrame(rows, schema={"part": pl.String, "time_ns": pl.Int64, "aggregated": pl.Boolean},
                       orient="row")
    return out.filter(pl.col("time_ns") > 0).sort(["time_ns", "part"], descending=[True, False])
