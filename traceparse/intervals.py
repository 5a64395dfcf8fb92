"""Interval arithmetic over event tables, in polars (sort and sweep), for measures to share.

Intervals are half-open ``[start_ns, start_ns + duration_ns)``. Every
function takes a DataFrame with ``start_ns`` and ``duration_ns`` (rows with a
null start or duration are ignored) and optional grouping columns ``by``
(typically ``["device_id"]``), and does the work per group; :func:`merge`,
:func:`combine_edges` and :func:`depth_segments` take the ``start``/``end``
and edge frames the others return, so partial results of two parts of a
table combine into the result of the whole.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceparse.expr import is_constant, sort_rows


def _timed(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    return df.filter(pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()).select(
        *by, pl.col("start_ns").alias("start"), (pl.col("start_ns") + pl.col("duration_ns")).alias("end")
    )


def union(df: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """Merge overlapping intervals: columns ``by`` + ``start``, ``end``, sorted by start."""
    by = by or []
    return merge(_timed(df, by), by)


def merge(iv: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """:func:`union` of a frame of ``by`` + ``start``, ``end`` (e.g. the unions of two parts of a table).

    Intervals that overlap or touch merge; union is associative, so the
    merge of the parts' unions is the union of the whole.
    """
    by = by or []
    iv = sort_rows(iv.select(*by, "start", "end"), [*by, "start"])
    if iv.height == 0:
        return iv
    # the groups of ``by`` columns that vary: one trace's rows share their trace_id (and often their device), and
    # a window over the text on every row cost more than the rest of the merge
    vary = [c for c in by if not is_constant(iv[c])]
    prev_end = pl.col("end").cum_max().shift(1)
    if vary:
        prev_end = prev_end.over(vary)
    new = (prev_end.is_null() | (pl.col("start") > prev_end)).cast(pl.Int64)
    if iv["start"].null_count() == 0 and iv["end"].null_count() == 0:
        # the rows are in order: each merged interval is a run of them, from a row that starts one; its start the
        # run's first, its end the run's largest (numpy, where a group-by on the keys and a run number took 3x)
        at = np.flatnonzero(iv.select(new).to_series().to_numpy())
        return iv[at].with_columns(end=pl.Series(np.maximum.reduceat(iv["end"].to_numpy(), at),
                                                 dtype=iv.schema["end"]))
    iv = iv.with_columns(new=new)
    seg = pl.col("new").cum_sum()
    iv = iv.with_columns(segment=seg.over(by) if by else seg)
    return iv.group_by([*by, "segment"], maintain_order=True).agg(
        pl.col("start").min(), pl.col("end").max()
    ).drop("segment")


def union_length(df: pl.DataFrame, by: list[str] | None = None) -> int:
    """Total time covered by at least one interval (summed over groups)."""
    u = union(df, by)
    return int(u.select((pl.col("end") - pl.col("start")).sum()).item() or 0)


def overlap_with(df: pl.DataFrame, cover: pl.DataFrame, by: list[str] | None = None, *,
                 merged: bool = False) -> pl.Series:
    """For each timed row of ``df``, the length of its intersection with the union of ``cover``.

    Uses the cumulative covered length F(t) = |union ∩ (-inf, t]|, so each
    row costs two as-of joins: |[s, e) ∩ U| = F(e) - F(s). Returns a series
    aligned with the timed rows of ``df`` in their original order. ``merged``: ``cover`` is a union already
    (:func:`merge`'s ``by`` + ``start``, ``end``: disjoint, not touching), taken as it is instead of merged again
    (10 ms on a trace's 42,000 kernel intervals).
    """
    by = by or []
    rows = _timed(df, by).with_row_index("_row")
    u = cover.select(*by, "start", "end") if merged else union(cover, by)
    if u.height == 0 or rows.height == 0:
        return pl.Series("overlap_ns", [0] * rows.height, dtype=pl.Int64)
    u = u.sort([*by, "start"]).with_columns(length=pl.col("end") - pl.col("start"))
    before = pl.col("length").cum_sum().shift(1, fill_value=0)
    u = u.with_columns(covered_before=before.over(by) if by else before)

    def covered_until(column: str) -> pl.DataFrame:
        t = rows.select("_row", *by, pl.col(column).alias("t")).sort("t")
        j = t.join_asof(
            u.sort("start"), left_on="t", right_on="start", by=by or None, strategy="backward",
            check_sortedness=False,
        )
        return j.select(
            "_row",
            (pl.col("covered_before").fill_null(0)
             + (pl.min_horizontal(pl.col("t"), pl.col("end")) - pl.col("start")).clip(lower_bound=0).fill_null(0)
             ).alias(column),
        )

    both = covered_until("end").join(covered_until("start"), on="_row").sort("_row")
    return (both["end"] - both["start"]).alias("overlap_ns")


def depth_profile(df: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """Sweep of how many intervals are open: rows ``by`` + ``t``, ``depth``, ``length``.

    ``depth`` intervals are open during ``[t, t + length)``. Ends sort before
    starts at the same instant, so touching intervals do not count as
    concurrent.
    """
    by = by or []
    iv = _timed(df, by)
    edges = pl.concat([
        iv.select(*by, pl.col("start").alias("t"), pl.lit(1, dtype=pl.Int64).alias("delta")),
        iv.select(*by, pl.col("end").alias("t"), pl.lit(-1, dtype=pl.Int64).alias("delta")),
    ]).sort([*by, "t", "delta"])
    depth = pl.col("delta").cum_sum()
    nxt = pl.col("t").shift(-1)
    return edges.with_columns(
        depth=depth.over(by) if by else depth,
        length=(nxt.over(by) if by else nxt) - pl.col("t"),
    ).filter(pl.col("length").is_not_null())


def time_at_depth(df: pl.DataFrame, minimum: int, by: list[str] | None = None) -> int:
    """Total time with at least ``minimum`` intervals open (summed over groups)."""
    prof = depth_profile(df, by)
    return int(prof.filter(pl.col("depth") >= minimum)["length"].sum() or 0)


def gaps(df: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """Idle gaps between the merged intervals: ``by`` + ``start``, ``end``, ``length``."""
    by = by or []
    u = union(df, by)
    prev = pl.col("end").shift(1)
    return u.with_columns(gap_start=prev.over(by) if by else prev).filter(
        pl.col("gap_start").is_not_null()
    ).select(*by, pl.col("gap_start").alias("start"), pl.col("start").alias("end"),
             (pl.col("start") - pl.col("gap_start")).alias("length"))


def edges(df: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """The interval edges per instant: ``by`` + ``t``, ``opens`` (intervals starting at t), ``closes`` (ending at t).

    A compact summary from which depth, union, concurrency and total length
    follow (:func:`depth_segments`); the edges of two parts of a table add up
    (:func:`combine_edges`) to the edges of the whole.
    """
    by = by or []
    iv = _timed(df, by)
    both = pl.concat([
        iv.select(*by, pl.col("start").alias("t"), pl.lit(1, pl.Int64).alias("opens"), pl.lit(0, pl.Int64).alias("closes")),
        iv.select(*by, pl.col("end").alias("t"), pl.lit(0, pl.Int64).alias("opens"), pl.lit(1, pl.Int64).alias("closes")),
    ])
    return combine_edges([both], by)


def combine_edges(parts: list[pl.DataFrame], by: list[str] | None = None) -> pl.DataFrame:
    """The edges of several parts (frames of :func:`edges`) summed per group and instant."""
    by = by or []
    every = pl.concat(parts)
    # one trace's edges share their trace_id (and often their device): grouping and sorting by the columns that
    # vary is the same, and several times cheaper than hashing and comparing the text on every row
    same = [c for c in by if is_constant(every[c])]
    keys = [c for c in by if c not in same] + ["t"]
    if keys == ["t"] and every.height and not any(every[c].null_count() for c in ("t", "opens", "closes")):
        return _summed_by_instant(every, by)
    summed = every.group_by(keys).agg(*[pl.col(c).first() for c in same], pl.col("opens").sum(),
                                      pl.col("closes").sum())
    return sort_rows(summed.select(*by, "t", "opens", "closes"), [*by, "t"])


def _summed_by_instant(every: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """:func:`combine_edges` of edges whose ``by`` columns hold one value each: summed per instant in numpy, a
    stable sort and a sum over each run of one instant (4 ms for a trace's 87,000 kernel edges where polars'
    group-by and sort took 14 ms), the ``by`` values repeated."""
    t = every["t"].to_numpy()
    order = np.argsort(t, kind="stable")
    t = t[order]
    new = np.empty(len(t), dtype=bool)
    new[0] = True
    np.not_equal(t[1:], t[:-1], out=new[1:])
    at = np.flatnonzero(new)
    summed = pl.DataFrame({"t": pl.Series(t[at], dtype=every.schema["t"]),
                           **{c: pl.Series(np.add.reduceat(every[c].to_numpy()[order], at), dtype=every.schema[c])
                              for c in ("opens", "closes")}})
    return summed.select(*[pl.lit(every[c][0], dtype=every.schema[c]).alias(c) for c in by], "t", "opens", "closes")


def depth_segments(edge_frame: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """From edges, the segments of constant depth: ``by`` + ``start``, ``end``, ``depth`` (intervals open in it).

    Segments are consecutive, of positive length, from a group's first edge
    to its last; an interval ending where another starts does not overlap it.
    """
    by = by or []
    e = sort_rows(edge_frame, [*by, "t"])
    depth = (pl.col("opens") - pl.col("closes")).cum_sum()
    nxt = pl.col("t").shift(-1)
    return (e.with_columns(depth=depth.over(by) if by else depth, end=nxt.over(by) if by else nxt)
            .filter(pl.col("end").is_not_null())
            .select(*by, pl.col("t").alias("start"), "end", "depth"))
