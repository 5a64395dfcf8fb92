"""What a measure is: a per-partition part and a combine step, so one measure runs on a trace, a rank or a chunk.

A measure turns events into a polars frame. It is written as two steps, as
Nsight Systems recipes map over reports and reduce: ``part(events)`` reduces
one partition of the event table (a device, a trace/rank, or a chunk of rows)
to a small partial frame, and ``combine(parts)`` merges the partial frames of
every partition into the result. Calling the measure runs both on the whole
table; :func:`partitioned` runs ``part`` per partition and combines, and gives
the same frame (a test checks it for every measure on every fixture).

Every measure keys its results by ``trace_id`` (each trace has its own clock
and its own ranks) and, where it works per device, ``device_id``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, ClassVar, Iterator

import polars as pl

#: The partitions a measure may declare valid: by device, by trace (a rank), by arbitrary row chunks.
PARTITIONS = ("device_id", "trace_id", "rows")
#: Per-device key of every measure that works per device.
DEVICE = ["trace_id", "device_id"]
#: Stand-ins for null keys while joining (device ids are never negative; a trace id is never empty).
_NO_DEVICE = -1
_NO_TRACE = ""


class Measure:
    """A measure: ``part(events, **params)`` per partition, ``combine(parts, **params)`` over the partitions.

    Subclasses set ``name``, ``partitions`` (the subset of :data:`PARTITIONS`
    for which partitioned-then-combined equals the whole) and document their
    output columns in their docstring.
    """

    name: ClassVar[str] = ""
    partitions: ClassVar[tuple[str, ...]] = PARTITIONS

    def part(self, events: pl.DataFrame, **params: Any) -> pl.DataFrame:
        """The partial result of one partition of the event table."""
        raise NotImplementedError

    def combine(self, parts: list[pl.DataFrame], **params: Any) -> pl.DataFrame:
        """The result of the whole table from the partial results of its partitions."""
        raise NotImplementedError

    def __call__(self, events: pl.DataFrame, **params: Any) -> pl.DataFrame:
        """The measure of the whole table: ``combine([part(events)])``.

        While a partition runner is set (:func:`parts_by`, e.g. a Dask
        cluster measuring a run's ranks), it may compute the parts instead:
        ``combine`` still runs here, over the parts it returns.
        """
        runner = _RUNNER.get()
        if runner is not None and "trace_id" in self.partitions:
            parts = runner(self, events, params)
            if parts is not None:
                return self.combine(parts, **params)
        return self.combine([self.part(events, **params)], **params)

    def __repr__(self) -> str:
        return f"<measure {self.name}>"


def partitioned(measure: Measure, events: pl.DataFrame, *, by: str | None = None, chunks: int | None = None,
                **params: Any) -> pl.DataFrame:
    """Run ``measure`` per partition of ``events`` and combine: by the values of column ``by``, or in ``chunks`` row slices.

    Raises ``ValueError`` for a partition the measure does not declare valid.
    """
    if (by is None) == (chunks is None):
        raise ValueError("partitioned: give exactly one of by=COLUMN or chunks=N")
    kind = by if by is not None else "rows"
    if kind not in measure.partitions:
        raise ValueError(f"measure {measure.name} cannot be partitioned by {kind}; "
                         f"valid: {', '.join(measure.partitions)}")
    if by is not None:
        frames = events.partition_by(by, maintain_order=True)
    else:
        size = max(1, math.ceil(events.height / max(1, chunks)))
        frames = [events.slice(i, size) for i in range(0, events.height, size)]
    frames = frames or [events]
    return measure.combine([measure.part(f, **params) for f in frames], **params)


#: The partition runner in effect (see :func:`parts_by`).
_RUNNER: ContextVar[Callable[[Measure, pl.DataFrame, dict], list[pl.DataFrame] | None] | None] = ContextVar(
    "traceparse_partition_runner", default=None)


@contextmanager
def parts_by(runner: Callable[[Measure, pl.DataFrame, dict], list[pl.DataFrame] | None]) -> Iterator[None]:
    """Within the block, measures called on a table ask ``runner(measure, events, params)`` for their parts.

    The runner returns the parts of ``events`` by ``trace_id`` (one per rank
    of a run, computed wherever it likes: a Dask cluster reads each rank's
    partition from the store), or None to let the measure run as usual (a
    table it does not know). Only measures valid by ``trace_id`` ask.
    """
    token = _RUNNER.set(runner)
    try:
        yield
    finally:
        _RUNNER.reset(token)


def keyed(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with null ``trace_id`` / ``device_id`` replaced by stand-ins, so nulls group and join like values."""
    exprs = []
    if "trace_id" in frame.columns:
        exprs.append(pl.col("trace_id").cast(pl.String).fill_null(_NO_TRACE))
    if "device_id" in frame.columns:
        exprs.append(pl.col("device_id").cast(pl.Int32).fill_null(_NO_DEVICE))
    return frame.with_columns(exprs)


def unkeyed(frame: pl.DataFrame) -> pl.DataFrame:
    """The inverse of :func:`keyed`: stand-ins back to nulls."""
    exprs = []
    if "trace_id" in frame.columns:
        exprs.append(pl.when(pl.col("trace_id") != _NO_TRACE).then(pl.col("trace_id")).alias("trace_id"))
    if "device_id" in frame.columns:
        exprs.append(pl.when(pl.col("device_id") != _NO_DEVICE).then(pl.col("device_id")).alias("device_id"))
    return frame.with_columns(exprs)


def rows_of(events: pl.DataFrame, kinds: Any) -> pl.DataFrame:
    """The rows of ``kinds``: a tuple of kind names, one kind name, or a boolean polars expression."""
    from traceparse.expr import kind_is

    if isinstance(kinds, pl.Expr):
        return events.filter(kinds)
    if isinstance(kinds, str):
        kinds = (kinds,)
    return events.filter(kind_is(*kinds))


def placed() -> pl.Expr:
    """Rows that are intervals: a start and a duration."""
    return pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()
