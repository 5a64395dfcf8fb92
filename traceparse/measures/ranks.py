"""A measure's per-trace rows merged across a run's ranks, so a run's table has one row per name, not per rank.

On a run (one trace of every rank's events) the per-trace measures give one
row per rank and key; a share of "the run" must be of the run's total, and a
name table must list each name once. :func:`merge_ranks` sums the rows of
each key over the ranks and says on how many ranks the key appears and how
uneven it is across them; on a single trace it changes nothing but adds the
same columns (``ranks`` = 1).
"""

from __future__ import annotations

import polars as pl


def merge_ranks(frame: pl.DataFrame, by: list[str], sums: list[str], spread: str | None = None) -> pl.DataFrame:
    """``frame`` grouped by ``by`` over its traces (a run's ranks): ``sums`` summed, ``ranks`` counted.

    ``ranks`` is the number of distinct ``trace_id`` with the key; with
    ``spread`` (a time column), ``rank_max_ns`` and ``rank_min_ns`` are the
    largest and smallest per-rank value of that column among the ranks that
    have the key, and ``rank_imbalance`` their ratio max / mean over those
    ranks (1.0 when they agree; null without time). A sum over a column that
    is null on every row of the key stays null (an unknown time is not 0).
    """
    aggs = [pl.when(pl.col(c).count() > 0).then(pl.col(c).sum()).alias(c) for c in sums]
    aggs.append(pl.col("trace_id").n_unique().cast(pl.Int64).alias("ranks"))
    if spread is not None:
        per_rank = (frame.group_by(*by, "trace_id").agg(pl.col(spread).sum().alias("__t")))
        spread_of = per_rank.group_by(by).agg(rank_max_ns=pl.col("__t").max(), rank_min_ns=pl.col("__t").min(),
                                              __mean=pl.col("__t").mean())
        spread_of = spread_of.with_columns(
            rank_imbalance=pl.when(pl.col("__mean") > 0).then((pl.col("rank_max_ns") / pl.col("__mean")).round(4))
        ).drop("__mean")
        return frame.group_by(by).agg(aggs).join(spread_of, on=by, how="left", nulls_equal=True)
    return frame.group_by(by).agg(aggs)
