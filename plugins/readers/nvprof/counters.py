"""Tying metric and event counters to the kernel rows they were measured on.

nvprof reports ``--metrics`` / ``--events`` per kernel name and device, not
per launch. A counter row's ``parent_id`` is the ``event_id`` of a kernel row
of that name in the same process: the kernel's aggregated row (a summary row)
when the log has one, else its earliest timed row; a matching device is
preferred, an unknown device on either side matches. When the log has no
row for that kernel at all, an aggregated kernel row is created for it with
``calls`` the largest invocation count of its counters and no duration
(nvprof did not report one, and none is invented).
"""

from __future__ import annotations

import polars as pl

_KEYS = ["_kernel", "pid", "device_id"]


def link_counters(events: pl.DataFrame) -> pl.DataFrame:
    """Number the rows (``event_id``), add kernel rows counters need, and set counters' ``parent_id``.

    ``events`` carries a ``_kernel`` column (the kernel name of counter
    rows, null elsewhere); it is dropped from the result.
    """
    needed = {"_kernel": pl.String, "start_ns": pl.Int64, "pid": pl.Int64, "device_id": pl.Int32}
    events = events.with_columns(pl.lit(None, dtype=dtype).alias(name) for name, dtype in needed.items()
                                 if name not in events.columns)
    counters = events.filter(pl.col("_kernel").is_not_null())
    if counters.height:
        events = pl.concat([events, _missing_kernels(events, counters)], how="diagonal_relaxed")
    events = events.with_columns(event_id=pl.int_range(pl.len(), dtype=pl.Int64))
    if not counters.height:
        return events.drop("_kernel")
    kernels = (events.filter(pl.col("kind") == "kernel")
               .select("event_id", pl.col("name").alias("_kernel"), "pid", "device_id", "start_ns")
               .sort(["start_ns", "event_id"], nulls_last=False))
    counters = events.filter(pl.col("_kernel").is_not_null()).select("event_id", *_KEYS)
    exact = counters.join(kernels.unique(_KEYS, keep="first", maintain_order=True).select(
        *_KEYS, pl.col("event_id").alias("exact")), on=_KEYS, how="left", nulls_equal=True)
    loose = exact.join(kernels.unique(["_kernel", "pid"], keep="first", maintain_order=True).select(
        "_kernel", "pid", pl.col("event_id").alias("loose")), on=["_kernel", "pid"], how="left", nulls_equal=True)
    parents = loose.select("event_id", pl.coalesce("exact", "loose").alias("parent_id"))
    return events.join(parents, on="event_id", how="left").drop("_kernel").sort("event_id")


def _missing_kernels(events: pl.DataFrame, counters: pl.DataFrame) -> pl.DataFrame:
    """Aggregated kernel rows for counter kernels that no kernel row of the same process names."""
    known = events.filter(pl.col("kind") == "kernel").select(pl.col("name").alias("_kernel"), "pid").unique()
    wanted = (counters.group_by(_KEYS, maintain_order=True).agg(calls=pl.col("calls").max())
              .join(known, on=["_kernel", "pid"], how="anti", nulls_equal=True))
    return wanted.select(kind=pl.lit("kernel"), name=pl.col("_kernel"), calls="calls", pid="pid",
                         device_id="device_id")
