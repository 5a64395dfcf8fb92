"""From TAU's routine tables (any of its forms) to the normalized event table.

Every form (text profiles, MULTI__ directories, merged XML, pprof) is first
brought to the same four tables, then turned into rows here:

- ``routines``: one row per routine per thread, times already in ns;
  each becomes a row of kind region (or kernel / memcpy / sync / api, see
  :mod:`.classify`) with ``calls``, ``subcalls`` (Subrs), ``exclusive_ns``,
  ``duration_ns`` = inclusive time, ``group``, ``pid`` = node, ``tid`` =
  thread, ``device_id`` = context (the ``CUDA Device`` for GPU threads that
  name one), ``call_path`` = the routine's full name with callers, ``name``
  = its last part, ``parent_id`` = the row of the caller path on the same
  thread, where the profile has it;
- ``counters``: other metrics of a routine (PAPI, CUPTI, a second time
  metric); two counter rows per routine and metric, ``METRIC`` with the
  exclusive value and ``METRIC (inc)`` with the inclusive value, each with
  ``parent_id`` = the routine's row and its calls, group and thread;
- ``user_events``: counter rows (calls = numevents, value = mean,
  value_min, value_max, value_sumsq); a context event
  (``NAME : CALL PATH``) gets the routine of that path as parent;
- ``threads``: GPU-thread facts from metadata (CUDA device/context/stream).
"""

from __future__ import annotations

import polars as pl

from .classify import attach_copy_bytes, copy_kind_expr, kind_expr

#: The largest node, context or thread number (the node becomes the ``pid`` column, Int64).
ID_MAX = 2**63 - 1
THREAD = ["node", "context", "thread"]

ROUTINES = {"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64, "seq": pl.Int64, "raw": pl.String,
            "calls": pl.Int64, "subcalls": pl.Int64, "group": pl.String, "exclusive_ns": pl.Int64,
            "duration_ns": pl.Int64}
COUNTERS = {"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64, "raw": pl.String, "dup": pl.Int64,
            "metric": pl.String, "exclusive": pl.Float64, "inclusive": pl.Float64, "unit": pl.String}
USER_EVENTS = {"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64, "name": pl.String, "calls": pl.Int64,
               "value": pl.Float64, "value_min": pl.Float64, "value_max": pl.Float64, "value_sumsq": pl.Float64}
THREADS = {"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64, "cuda_device": pl.Int64,
           "cuda_context": pl.Int64, "cuda_stream": pl.Int64, "gpu_thread": pl.Boolean}

#: suffix of the counter row holding a metric's inclusive value
INCLUSIVE_SUFFIX = " (inc)"


def empty(schema: dict) -> pl.DataFrame:
    """An empty table of one of the schemas above."""
    return pl.DataFrame(schema=schema)


def normalized_path(raw: pl.Expr) -> pl.Expr:
    """TAU's name with its call path separators as `` => `` and the padding TAU adds to names trimmed."""
    return raw.str.replace_all(r"\s+=>\s+", " => ").str.strip_chars()


def with_dup(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Number repeated names within a thread (``dup``, in row order), so a name written twice stays two routines."""
    keys = [*THREAD, *by]
    repeated = df.select(pl.struct(keys).is_duplicated()).to_series()
    if not repeated.any():
        return df.with_columns(dup=pl.lit(0, pl.Int64))
    df = df.with_row_index("_row")
    numbered = df.filter(repeated).select("_row", dup=pl.int_range(pl.len()).over(keys).cast(pl.Int64))
    return (df.join(numbered, on="_row", how="left").sort("_row")
            .with_columns(pl.col("dup").fill_null(0)).drop("_row"))


def build_events(routines: pl.DataFrame, counters: pl.DataFrame, user_events: pl.DataFrame,
                 threads: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """The event rows, and counts of what could not be attached (for warnings)."""
    notes: dict[str, int] = {}
    r = routines.select(list(ROUTINES)).cast(ROUTINES)
    r = r.sort([*THREAD, "seq"], nulls_last=False, maintain_order=True)
    r = with_dup(r, ["raw"]).with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))
    r = r.with_columns(call_path=normalized_path(pl.col("raw")))
    r = r.with_columns(parts=pl.col("call_path").str.split(" => "))
    r = r.with_columns(
        name=pl.col("parts").list.last(),
        parent_path=pl.when(pl.col("parts").list.len() > 1)
        .then(pl.col("parts").list.head(pl.col("parts").list.len() - 1).list.join(" => ")),
    ).with_columns(caller=pl.col("parent_path").str.split(" => ").list.last()).drop("parts")
    first = r.filter(pl.col("dup") == 0).select(*THREAD, pl.col("call_path").alias("parent_path"),
                                                 pl.col("event_id").alias("parent_id"))
    r = r.join(first, on=[*THREAD, "parent_path"], how="left", nulls_equal=True, maintain_order="left")
    t = threads.select(list(THREADS)).cast(THREADS).unique(THREAD, keep="first")
    r = r.join(t, on=THREAD, how="left", nulls_equal=True, maintain_order="left")
    r = r.with_columns(kind=kind_expr(pl.col("group")))
    r = r.with_columns(copy_kind=pl.when(pl.col("kind") == "memcpy").then(copy_kind_expr()))
    placement = [
        pl.col("node").alias("pid"),
        pl.col("thread").alias("tid"),
        pl.coalesce(pl.col("cuda_device"), pl.col("context")).cast(pl.Int32).alias("device_id"),
        pl.col("cuda_context").cast(pl.Int32).alias("context_id"),
        pl.col("cuda_stream").alias("stream_id"),
    ]
    rows = r.select("event_id", "kind", "name", "duration_ns", "exclusive_ns", "calls", "subcalls", "group",
                    "call_path", "parent_id", "copy_kind", *placement)
    next_id = r.height
    parts = [rows]

    if counters.height:
        c = counters.select(list(COUNTERS)).cast(COUNTERS)
        joined = c.join(r.select(*THREAD, "raw", "dup", "event_id", "calls", "group", *placement),
                        on=[*THREAD, "raw", "dup"], how="inner", nulls_equal=True, maintain_order="left")
        notes["counters_without_routine"] = c.height - joined.height
        both = pl.concat([
            joined.select(pl.col("metric").alias("name"), pl.col("exclusive").alias("value"), pl.col("event_id"),
                          pl.lit(0).alias("_order"), *[pl.col(x) for x in ("calls", "group", "unit", "pid", "tid",
                                                                             "device_id", "context_id", "stream_id")]),
            joined.select((pl.col("metric") + INCLUSIVE_SUFFIX).alias("name"), pl.col("inclusive").alias("value"),
                          pl.col("event_id"), pl.lit(1).alias("_order"),
                          *[pl.col(x) for x in ("calls", "group", "unit", "pid", "tid", "device_id", "context_id",
                                                "stream_id")]),
        ]).sort(["event_id", "_order", "name"], maintain_order=True)
        counter_rows = both.select(
            pl.int_range(next_id, next_id + both.height, dtype=pl.Int64).alias("event_id"),
            pl.lit("counter").alias("kind"), "name", "value", "unit", "calls", "group",
            pl.col("event_id").alias("parent_id"), "pid", "tid", "device_id", "context_id", "stream_id")
        next_id += counter_rows.height
        parts.append(counter_rows)

    if user_events.height:
        u = user_events.select(list(USER_EVENTS)).cast(USER_EVENTS)
        u = u.with_columns(context_path=normalized_path(pl.col("name").str.splitn(" : ", 2).struct.field("field_1")))
        u = u.join(first.rename({"parent_path": "context_path"}), on=[*THREAD, "context_path"], how="left",
                   nulls_equal=True, maintain_order="left")
        u = u.join(t, on=THREAD, how="left", nulls_equal=True, maintain_order="left")
        event_rows = u.select(
            pl.int_range(next_id, next_id + u.height, dtype=pl.Int64).alias("event_id"),
            pl.lit("counter").alias("kind"), "name", "calls", "value", "value_min", "value_max", "value_sumsq",
            "parent_id", *placement)
        parts.append(event_rows)

    events = attach_copy_bytes(pl.concat(parts, how="diagonal_relaxed"))
    return events, notes
