"""Events on one stream run one after another: undo the overlaps nvprof's printed precision makes.

nvprof's text and CSV logs print ``Start`` with a few digits (``154.629s``:
1 ms; ``212.42ms``: 10 us), while ``Duration`` keeps more. Read back, a copy
that ended a fraction of a millisecond before the next kernel on its stream
can appear to run into it; overlap and concurrency figures would then count
time that cannot exist (CUDA runs the work of one stream in order, one piece
after another). :func:`serialize_streams` orders each stream's timed GPU
events and starts each no earlier than the previous one's end.
"""

from __future__ import annotations

import polars as pl

#: Kinds that run on a stream (the GPU activity of a trace).
STREAM_KINDS = ("kernel", "memcpy", "memset")
#: What makes one stream: the process, the device, the context and the stream id.
STREAM_KEY = ("pid", "device_id", "context_id", "stream_id")


def serialize_streams(events: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """``events`` with the timed GPU events of each stream moved so none starts before the previous one ends.

    Per stream (:data:`STREAM_KEY`), events of :data:`STREAM_KINDS` with a
    start, a duration and a stream id are ordered by start (ties in file
    order); each new start is ``max(start, previous new end)``, so an event
    moves only later, only as far as needed, and keeps its duration. Other
    rows are untouched; row order is kept. Returns (events, how many were
    moved, the largest move in ns).
    """
    if events.height == 0 or not set(STREAM_KEY) <= set(events.columns):
        return events, 0, 0
    rows = events.with_row_index("__row")
    on_stream = (pl.col("kind").cast(pl.String).is_in(STREAM_KINDS) & pl.col("start_ns").is_not_null()
                 & pl.col("duration_ns").is_not_null() & pl.col("stream_id").is_not_null())
    timed = rows.filter(on_stream).sort([*STREAM_KEY, "start_ns", "__row"], nulls_last=True)
    if timed.height < 2:
        return events, 0, 0
    key = [pl.col(k) for k in STREAM_KEY]
    # new start_i = C_i + max over j <= i of (start_j - C_j), C_i = the durations before i on the stream
    before = (pl.col("duration_ns").cum_sum() - pl.col("duration_ns")).over(key)
    timed = timed.with_columns(__before=before).with_columns(
        __new=(pl.col("start_ns") - pl.col("__before")).cum_max().over(key) + pl.col("__before"))
    shift = timed.select("__row", __shift=pl.col("__new") - pl.col("start_ns"))
    moved = shift.filter(pl.col("__shift") > 0)
    if moved.height == 0:
        return events, 0, 0
    out = (rows.join(shift, on="__row", how="left")
           .with_columns(start_ns=pl.col("start_ns") + pl.col("__shift").fill_null(0))
           .sort("__row").drop("__row", "__shift"))
    return out, moved.height, int(moved["__shift"].max())
