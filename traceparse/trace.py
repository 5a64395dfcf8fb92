"""A trace: the normalized event table plus what is known about its source."""

from __future__ import annotations

from typing import Iterable, Iterator

import polars as pl

from traceparse.meta import Device, TraceMeta  # noqa: F401 - the metadata, re-exported (no polars there)
from traceparse.schema import DTYPES, conform, empty_frame
from traceparse.validate import Validator, validate_devices


class _Prefetched:
    """A reader's batches whose first one was read ahead (:meth:`Trace.prefetch`)."""

    def __init__(self, first: pl.DataFrame, rest: Iterator[pl.DataFrame]):
        self.first, self.rest = first, rest

    def __iter__(self) -> Iterator[pl.DataFrame]:
        first, self.first = self.first, None
        if first is not None:
            yield first
        yield from self.rest

    def close(self) -> None:
        close = getattr(self.rest, "close", None)
        if close is not None:
            close()


class Trace:
    """The events of one trace (a polars DataFrame of :mod:`traceparse.schema`) and its metadata.

    A reader hands back ``events`` as one raw DataFrame or as an iterator of
    raw DataFrame batches (so a trace larger than memory can be written to
    the store batch by batch). Raw means: any subset of the schema's columns,
    enums as text, no ``event_id`` needed. The trace conforms them here, and
    only here (:func:`traceparse.schema.conform`): :attr:`events` and
    :meth:`batches` always give normalized frames: every schema column in
    order with its schema type, ``kind`` the Enum, ``event_id`` numbered from
    0 across batches (unless the reader numbered rows itself) and ``trace_id``
    set to ``meta.id`` (null while the trace has no id, as when a reader is
    called directly; the store's id once it is ingested). A run's combined
    trace (:meth:`traceparse.store.Store.load_run`) is made with
    ``stamp_trace_id=False``: each row keeps the ``trace_id`` of its rank.
    """

    def __init__(self, events: pl.DataFrame | Iterable[pl.DataFrame], meta: TraceMeta | None = None, *,
                 stamp_trace_id: bool = True):
        self._source: pl.DataFrame | Iterable[pl.DataFrame] | None = events
        self._events: pl.DataFrame | None = None  # the conformed table, once built
        self._stamped: str | None = None  # the id _events' trace_id column holds
        self._stamp = stamp_trace_id
        self.meta = meta or TraceMeta()
        #: Set by the core's ingest path (:func:`traceparse.ingest.read_group`): a trace that gives no
        #: events at all is refused (exit 2) instead of stored empty.
        self.refuse_empty = False

    @classmethod
    def from_store(cls, events: pl.DataFrame, meta: TraceMeta) -> "Trace":
        """A trace the store wrote: normalized and validated at ingest, so not conformed or validated again.

        Only when ``events`` has exactly the schema's columns, in order, with
        their types (what :meth:`batches` wrote); anything else (a store of
        an older schema) takes the usual path through conform and validation.
        Loading the benchmark trace took 0.5 s longer with the checks redone.
        """
        trace = cls(events, meta)
        if list(events.schema.items()) == list(DTYPES.items()):
            trace._source, trace._events, trace._stamped = None, events, None  # stamped on first use if needed
        return trace

    def prefetch(self) -> None:
        """Start a streamed trace's reader now: its first raw batch is read and kept for :meth:`batches`.

        The core's ingest calls it while the content hash is worked out in another thread, so that the two
        overlap (the id is needed only when the first batch is conformed). Nothing for a trace read whole or
        already consumed, or a reader that gives no batch.
        """
        if not self.is_streamed or self._source is None or isinstance(self._source, _Prefetched):
            return
        batches = iter(self._source)
        try:
            first = next(batches)
        except StopIteration:
            self._source = ()
            return
        self._source = _Prefetched(first, batches)

    def close(self) -> None:
        """Give up a streamed trace that will not be consumed (its reader's generator is closed, its file with it)."""
        source, self._source = self._source, None
        close = getattr(source, "close", None)
        if close is not None:
            close()

    @property
    def is_streamed(self) -> bool:
        """True while the events are still an unread iterator of batches."""
        return self._events is None and not isinstance(self._source, pl.DataFrame)

    def batches(self) -> Iterator[pl.DataFrame]:
        """The events as conformed batches, ``event_id`` numbered across them; consumes a streamed trace.

        A trace read whole gives one batch, :attr:`events`. A streamed trace
        gives the reader's batches as they come (empty ones too, conformed),
        none when the reader gave none.
        """
        if self.is_streamed:
            yield from self._conformed_batches()
        else:
            yield self.events

    @property
    def events(self) -> pl.DataFrame:
        """All events as one conformed DataFrame (a streamed trace is collected on first use)."""
        if self._events is None:
            frames = list(self._conformed_batches())
            self._events = pl.concat(frames) if frames else self._with_trace_id(empty_frame())
            self._stamped = self.meta.id
        if self.meta.id is not None and self._stamped != self.meta.id:  # the id came after the events
            self._events, self._stamped = self._with_trace_id(self._events), self.meta.id
        return self._events

    @events.setter
    def events(self, value: pl.DataFrame) -> None:
        """Replace the events (a raw or conformed DataFrame; conformed on the next read)."""
        self._source, self._events, self._stamped = value, None, None

    def _conformed_batches(self) -> Iterator[pl.DataFrame]:
        """The reader's raw events, conformed batch by batch: the one path every event takes."""
        source, self._source = self._source, None  # an iterator can be read only once
        if source is None:
            raise RuntimeError("the events of this streamed trace were already consumed by batches()")
        validator = Validator(where=self.meta.path or "the trace")
        next_id = 0
        try:
            for batch in (source,) if isinstance(source, pl.DataFrame) else source:
                trace_id = self.meta.id if self._stamp else None  # set in the same query (as _with_trace_id)
                batch = conform(validator.check(batch), first_event_id=next_id, trace_id=trace_id)
                next_id += batch.height
                yield batch
        finally:  # the warnings count what was dropped, also when the consumer stopped early
            found = validator.warnings() + validate_devices(self.meta.devices, validator.where)
            self.meta.warnings.extend(w for w in found if w not in self.meta.warnings)
        validator.finish(refuse_empty=self.refuse_empty, said=self.meta.warnings)

    def _with_trace_id(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` with ``trace_id`` = ``meta.id``; unchanged while the trace has no id."""
        trace_id = self.meta.id
        if trace_id is None or not self._stamp:
            return frame
        column = frame["trace_id"]
        if column.null_count() == 0 and (column == trace_id).all():
            return frame  # already stamped (a trace loaded from the store)
        return frame.with_columns(pl.lit(trace_id, dtype=pl.String).alias("trace_id"))

    @property
    def id(self) -> str | None:
        """The store id (``meta.id``); None for a trace not read through the core."""
        return self.meta.id

    def of_kind(self, *kinds: str) -> pl.DataFrame:
        """Events of the given kinds."""
        return self.events.filter(pl.col("kind").is_in(kinds))

    def to_pandas(self):
        """The events as a pandas DataFrame, for notebooks: exact integers, the same dtypes on every trace
        (:func:`pandas_frame`)."""
        return pandas_frame(self.events)

    def __repr__(self) -> str:
        n = "streamed" if self.is_streamed else f"{self.events.height:,} events"  # a count, as everywhere
        return f"<Trace {self.meta.id or '(not stored)'} {self.meta.format} {n}>"


class RunTrace(Trace):
    """A run whose events stay in the store: ``events`` is a partitioned table read rank by rank
    (:meth:`traceparse.store.Store.load_run` with ``lazy=True``)."""

    def __init__(self, table, meta: TraceMeta):
        super().__init__(empty_frame(), meta, stamp_trace_id=False)
        self._table = table

    @property
    def is_streamed(self) -> bool:
        return False

    @property
    def events(self):
        """The run's :class:`traceparse.measures.base.PartitionedEvents`."""
        return self._table

    def batches(self):
        """One batch per rank, read in turn."""
        for i in range(len(self._table.paths)):
            yield self._table.partition(i)

    def of_kind(self, *kinds: str) -> pl.DataFrame:
        return self._table.filter(pl.col("kind").is_in(kinds))

    def to_pandas(self):
        """Every rank's events as one pandas DataFrame (read into memory whole), as :meth:`Trace.to_pandas`."""
        return pandas_frame(self._table.lazy().collect())


def pandas_frame(frame: pl.DataFrame):
    """``frame`` (events, or a :func:`traceparse.sql` result) as a pandas DataFrame whose integer columns are
    pandas' nullable integers (``Int64``, ``Int32``; a null is ``pd.NA``).

    Plain ``DataFrame.to_pandas()`` turns an integer column with a null into float64: the dtype of
    ``duration_ns`` or ``tid`` then changes from trace to trace, and integers past 2**53 (JAX's 64-bit thread
    ids, nanosecond timestamps of long runs) are rounded. Enums stay pandas categoricals with every category,
    text pandas' strings, floats float64 (a null is NaN).
    """
    import pandas as pd
    import pyarrow as pa

    ints = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
            pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
            pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype()}
    return frame.to_pandas(types_mapper=ints.get)
