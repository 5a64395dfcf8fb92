"""GPU work recorded more than once: the same kernel, copy or memset written twice into one trace.

A stream runs one thing at a time, so two GPU activities of one kind, name, device, stream, start, duration
and correlation id are one activity recorded twice: a trace concatenated with itself, a merge that took a file
twice, a buffer a tool flushed twice. Counted twice, such work doubles the GPU time, makes a stream look
concurrent with itself (a resnet18 trace written twice read "concurrency 100%") and every kernel launched "two
by one call". The store keeps each once and the trace's metadata says how many were dropped: a table with the
repeats in it gives no figure a user can trust, and without them it is the trace the tool meant to write.

Rows without a start (a summary's aggregated rows) are never repeats: two summaries may well hold equal rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

#: What makes two rows one activity: every column of this key equal (nulls equal to nulls).
KEY = ("kind", "device_id", "stream_id", "start_ns", "duration_ns", "name", "correlation_id")
#: How the warning names each of the kinds a stream runs one at a time (:data:`traceparse.expr.GPU_KINDS`).
_NOUNS = {"kernel": ("kernel", "kernels"), "memcpy": ("copy", "copies"), "memset": ("memset", "memsets")}


@dataclass
class Repeats:
    """The rows that repeat an earlier row of the same activity: their ``event_id``s, how many of each kind, and
    the first one (its kind, name, event and the event it repeats) for the warning."""
    event_ids: list[int]
    per_kind: dict[str, int]
    first: tuple[str, str, int, int]

    def warning(self, where: str) -> str:
        """The one line the trace's metadata keeps."""
        from traceparse.validate import excerpt

        kind, name, repeat, original = self.first
        count = len(self.event_ids)
        kinds = ", ".join(f"{n:,} {_NOUNS[k][n != 1]}" for k, n in sorted(self.per_kind.items()))
        return (f"{where}: {count:,} GPU activit{'y is' if count == 1 else 'ies are'} recorded again ({kinds}): "
                f"the same kind, name, device, stream, start, duration and correlation as an earlier one, which a "
                f"stream cannot run twice; each is counted once (the first: {kind} {excerpt(name)}, event {repeat:,} "
                f"repeats event {original:,})")


def find_repeats(events: pl.LazyFrame | pl.DataFrame) -> Repeats | None:
    """The rows of ``events`` (a conformed event table, lazy or not) that repeat an earlier GPU activity, in
    ``event_id`` order; None when there are none (the common case costs one pass over the GPU rows' key)."""
    import polars as pl

    from traceparse.expr import GPU_KINDS

    gpu = (events.lazy().select("event_id", *KEY)
           .filter(pl.col("kind").cast(pl.String).is_in(GPU_KINDS) & pl.col("start_ns").is_not_null()))
    # a repeat starts when its original does: no start twice, no repeat (two columns read, not eight)
    if not gpu.select(pl.col("start_ns").is_duplicated().any()).collect().item():
        return None
    flagged = gpu.with_columns(_first=pl.col("event_id").min().over(list(KEY))).filter(
        pl.col("event_id") != pl.col("_first"))
    repeated = flagged.sort("event_id").select("event_id", pl.col("kind").cast(pl.String), "name", "_first").collect()
    if repeated.height == 0:
        return None
    per_kind = dict(repeated.group_by("kind").len().iter_rows())
    repeat, kind, name, original = repeated.row(0)
    return Repeats(repeated["event_id"].to_list(), per_kind, (kind, name or "", repeat, original))
