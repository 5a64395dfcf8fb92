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
import os
import threading
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, ClassVar, Iterator

import polars as pl

#: Rows over which a table counts as large: memory comes first there (a large measure is not kept for the other
#: rules, :attr:`Measure.large`; ``analyze`` runs the rules one at a time, :func:`traceparse.analysis.rule_threads`).
LARGE_TABLE_ROWS = 1_000_000
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
    #: Set True when the result's rows of one trace depend only on that trace's events and the result is sorted
    #: by ``trace_id`` first: then on a :class:`PartitionedEvents` (a run's ranks) ``combine([part(rank)])`` runs
    #: per rank, where the rank is, and only the small results are concatenated. False (the default, and the
    #: collective measures, which match rows across ranks): the ranks' parts are combined together.
    per_trace: ClassVar[bool] = False
    #: Set True for a measure whose result is as large as the table and that one rule asks for (the dependency
    #: graph): on a table of more than :data:`LARGE_TABLE_ROWS` rows :func:`sharing` does not keep it, so it is
    #: let go once that rule is done instead of living until the analysis ends.
    large: ClassVar[bool] = False

    def part(self, events: pl.DataFrame, **params: Any) -> pl.DataFrame:
        """The partial result of one partition of the event table."""
        raise NotImplementedError

    def combine(self, parts: list[pl.DataFrame], **params: Any) -> pl.DataFrame:
        """The result of the whole table from the partial results of its partitions."""
        raise NotImplementedError

    def __call__(self, events: pl.DataFrame, **params: Any) -> pl.DataFrame:
        """The measure of the whole table: ``combine([part(events)])``.

        On a :class:`PartitionedEvents` (a run's ranks, in the store) it runs
        partition by partition (:meth:`PartitionedEvents.measure`), in this
        process or on a Dask cluster, with the same result. Inside
        :func:`sharing` (``analyze``) a measure of one table with the same
        parameters is computed once (:func:`shared`).
        """
        if self.large and table_rows(events) > LARGE_TABLE_ROWS:
            return self._measure(events, params)
        return shared(events, self.name, lambda: self._measure(events, params), params)

    def _measure(self, events: pl.DataFrame, params: dict) -> pl.DataFrame:
        if isinstance(events, PartitionedEvents):
            return events.measure(self, params)
        return self.combine([self.part(events, **params)], **params)

    def __repr__(self) -> str:
        return f"<measure {self.name}>"


# -- results shared by the rules of one analysis ----------------------------------------------------------------
class SharedResults:
    """What :func:`shared` computed in one :func:`sharing` scope: per table (by identity), per key, its value.

    An entry lives as long as its table: it is dropped when the table is (a run's group of ranks read for a
    measure and let go takes its entries with it), so the scope never keeps a table alive. ``hits`` and
    ``misses`` count the look-ups.

    On a table of more than :data:`LARGE_TABLE_ROWS` rows the values kept for it take at most a quarter of the
    table's memory: beyond that, the least recently asked are let go (asked again, they are computed again).
    Kept whole, a 1 GB trace's shared values (its kernel rows and launch projections in several near-identical
    variants, the kernels linked to their launches, the self times) took 1.5 GB, three times its table; most
    are asked by one rule only.

    Rules may run at once in threads (``analyze``): a value asked by a second thread while the first computes
    it is waited for, not computed again. No two computations can wait on each other: a value's computation
    asks only for values below it (a measure needs the measures it is built on, never one built on it).
    """

    def __init__(self) -> None:
        self.tables: dict[int, dict[tuple, Any]] = {}
        self.hits = 0
        self.misses = 0
        self.dropped = 0  # values let go to keep a large table's within its budget
        self._lock = threading.Lock()
        self._computing: dict[tuple, threading.Event] = {}  # (table id, key) -> set when its value is in
        self._budgets: dict[int, int] = {}  # table id -> bytes its values may take (large tables only)
        self._sizes: dict[int, dict[tuple, int]] = {}  # table id -> key -> bytes, least recently asked first

    def get(self, table: Any, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time ``key`` is asked of ``table``, then the same value."""
        ident = id(table)
        with self._lock:
            entries = self.tables.get(ident)
            if entries is None:
                entries = self.tables[ident] = {}
                if isinstance(table, pl.DataFrame) and (table.height > LARGE_TABLE_ROWS or ident in _KEPT_GROUPS):
                    self._budgets[ident] = table.estimated_size() // 4
                    self._sizes[ident] = {}
                weakref.finalize(table, self._forget, ident)  # its entries go with it (ids are reused)
            if key in entries:
                self.hits += 1
                self._touch(ident, key)
                return entries[key]
            pending = self._computing.get((ident, key))
            if pending is None:
                self.misses += 1
                done = self._computing[(ident, key)] = threading.Event()
        if pending is not None:  # another thread computes it: its value, or (it failed) this thread's own try
            pending.wait()
            with self._lock:
                self.hits += 1
                if key in entries:
                    return entries[key]
            return self.get(table, key, compute)
        try:
            value = compute()
            with self._lock:
                entries[key] = value
                self._keep_within(ident, key, value)
        finally:
            with self._lock:
                del self._computing[(ident, key)]
            done.set()
        return value

    def _touch(self, ident: int, key: tuple) -> None:
        sizes = self._sizes.get(ident)
        if sizes is not None and key in sizes:
            sizes[key] = sizes.pop(key)  # now the most recently asked

    def _keep_within(self, ident: int, key: tuple, value: Any) -> None:
        """Note ``value``'s size; let the least recently asked values of a large table go past its budget (never
        the one just computed)."""
        sizes = self._sizes.get(ident)
        if sizes is None:
            return
        sizes[key] = _bytes(value)
        entries = self.tables[ident]
        while sum(sizes.values()) > self._budgets[ident] and len(sizes) > 1:
            oldest = next(iter(sizes))
            del sizes[oldest]
            entries.pop(oldest, None)
            self.dropped += 1

    def _forget(self, ident: int) -> None:
        """Drop a table's entries (its finalizer: may run inside any allocation, so it takes no lock)."""
        self.tables.pop(ident, None)
        self._sizes.pop(ident, None)
        self._budgets.pop(ident, None)

    def clear(self) -> None:
        """Drop every entry."""
        self.tables.clear()
        self._sizes.clear()
        self._budgets.clear()


def _bytes(value: Any) -> int:
    """About how much memory ``value`` holds: its frames and series (one level into tuples, lists, dicts)."""
    if isinstance(value, (pl.DataFrame, pl.Series)):
        return value.estimated_size()
    if isinstance(value, (tuple, list, dict)):
        return sum(v.estimated_size() for v in (value.values() if isinstance(value, dict) else value)
                   if isinstance(v, (pl.DataFrame, pl.Series)))
    return 0


_SCOPE: ContextVar[SharedResults | None] = ContextVar("traceparse_shared_results", default=None)


@contextmanager
def sharing() -> Iterator[SharedResults]:
    """A scope in which what the rules of one analysis ask of a table is computed once (:func:`shared`).

    ``analyze`` runs its rules (and the summary) inside one: kernel intervals, step windows, launches linked to
    their calls, the measures themselves, asked by several rules, are computed for the first. A scope inside
    a scope is the outer one. Outside any scope nothing is kept.
    """
    scope = _SCOPE.get()
    if scope is not None:
        yield scope
        return
    scope = SharedResults()
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
        scope.clear()


def shared(table: Any, name: str, compute: Callable[[], Any], params: dict | tuple = ()) -> Any:
    """``compute()``, or inside :func:`sharing` the value computed before for ``table`` (by identity), ``name``
    and ``params``: a generic memo, knowing no format and no measure.

    ``params`` (a dict of keyword arguments, or a tuple) must be plain values (numbers, strings, None, and
    tuples, lists or dicts of them); anything else (a polars expression) is not compared, and ``compute``
    runs every time. The value is shared: whoever gets it must not change it in place (polars frames are
    not changed in place by the operations the rules use).
    """
    scope = _SCOPE.get()
    if scope is None:
        return compute()
    key = _frozen(params)
    if key is None:
        return compute()
    return scope.get(table, (name, key), compute)


_PLAIN = (str, int, float, bool, type(None))


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key (dicts sorted, lists as tuples), or None when it holds anything but plain values."""
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        items = [_frozen(v) for v in value]
        return None if any(i is None for i in items) else ("seq", tuple(items))
    if isinstance(value, dict):
        items = [(k, _frozen(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]
        return None if any(i is None for _, i in items) else ("map", tuple(items))
    return None


def rank_result(events: pl.DataFrame, measure: Measure, params: dict, finish: bool) -> pl.DataFrame:
    """``measure.part`` of one partition's events, finished by ``combine`` when ``finish`` (see :attr:`Measure.per_trace`).

    The one per-rank step of a measure on a run, in this process or on a Dask worker alike.
    """
    part = measure.part(events, **params)
    return measure.combine([part], **params) if finish else part


#: Most rows of the partitions a :class:`PartitionedEvents` reads together (small ranks share the fixed cost of
#: a measure; a rank of this size or more is read alone, so memory stays bounded by the largest rank or this).
GROUP_ROWS = 250_000
#: Most memory the groups of a :class:`PartitionedEvents` read in this process may take together while kept for
#: the rest of the analysis: within it every group is read once (8 ranks of 140 MB: 176 reads of 35 ms each were
#: a fifth of ``analyze``), past it a group is read each time a measure goes through it, one in memory at a time.
KEPT_GROUP_BYTES = 1 << 30
#: ... and at most this share of the machine's memory (a small machine keeps less).
KEPT_GROUP_MEMORY_SHARE = 1 / 8


def kept_group_bytes() -> int:
    """The memory a run's groups may take while kept: :data:`KEPT_GROUP_BYTES`, at most
    :data:`KEPT_GROUP_MEMORY_SHARE` of the machine's physical memory where the system says how much it has."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return KEPT_GROUP_BYTES
    return min(KEPT_GROUP_BYTES, int(physical * KEPT_GROUP_MEMORY_SHARE)) if physical > 0 else KEPT_GROUP_BYTES


#: The ids of the groups kept in memory (:func:`kept_group_bytes`): like a large table's, the values shared for
#: one of them take at most a quarter of its memory (:class:`SharedResults`), so that what eight ranks keep
#: does not grow to eight single traces' worth.
_KEPT_GROUPS: set[int] = set()


class PartitionedEvents:
    """An event table held as one partition per trace (a stored run's ranks), read one partition at a time.

    What a rule gets as ``trace.events`` of a run in ``analyze``
    (:meth:`traceparse.store.Store.load_run` with ``lazy=True``), so that a
    large run's table is never in memory at once (the groups read are kept
    only within :func:`kept_group_bytes`):

    - a measure called on it runs :func:`rank_result` per partition through
      :meth:`map` (in this process, or on a Dask cluster when
      :attr:`executor` is set, see :mod:`traceparse.distributed`) and
      concatenates the per-trace results in ``trace_id`` order (the order its
      combine sorts by) or, for a measure that is not :attr:`Measure.per_trace`,
      combines the partitions' parts;
    - ``filter``, ``select``, ``height``, ``columns``, ``schema`` and a
      column (``events["kind"]``) are answered by a lazy scan of the
      partitions' Parquet files, whole-table semantics, reading only what the
      query needs;
    - anything else reads the whole table once (counted in
      :attr:`whole_loads`, kept for the rest of the analysis): correct, not
      bounded.

    ``paths`` are the partitions' Parquet files in the order of the whole
    table; ``trace_ids`` their trace ids; ``kind_counts`` the rows per kind
    when the caller knows them; ``sizes`` their rows. Small partitions are
    read together, up to :data:`GROUP_ROWS` rows at a time (:meth:`groups`),
    so that a run of a thousand one-kernel ranks pays each measure's fixed
    cost a few times, not a thousand (a measure valid by trace is valid on
    any set of whole traces). :attr:`loaded` counts the partitions read for
    measures, :attr:`most_at_once` the most groups alive at once (tests
    hold it to 1 past the budget, and to the groups' number within it).
    """

    def __init__(self, paths: list[Any], trace_ids: list[str], executor: Callable | None = None,
                 kind_counts: dict[str, int] | None = None, sizes: list[int] | None = None):
        self.paths = [str(p) for p in paths]
        self.trace_ids = list(trace_ids)
        #: Rows per kind of the whole table when known without reading it (the store's metadata), else None.
        self.kind_counts = kind_counts
        #: Rows of each partition when known (the store's metadata), else None: each partition is read alone.
        self.sizes = list(sizes) if sizes is not None else None
        #: ``executor(fn, args) -> [fn(events of partition i, *args) for each i]``, or None: in this process.
        self.executor = executor
        self.loaded = 0
        self.most_at_once = 0
        self.whole_loads = 0
        self._alive = 0
        self._whole: pl.DataFrame | None = None
        self._last: tuple[tuple[int, ...], pl.DataFrame] | None = None
        self._kept: dict[tuple[int, ...], pl.DataFrame] = {}  # groups read once and kept (kept_group_bytes)
        self._kept_bytes = 0
        # rules run at once in threads (``analyze``): one reads a group or the whole table at a time, and a
        # measure that goes through several groups holds the others' to theirs, so that one group is in memory
        self._reading = threading.RLock()
        self._one_group = threading.RLock()

    # -- measures ---------------------------------------------------------------
    def groups(self, order: list[int] | None = None) -> list[list[int]]:
        """The partitions read together: consecutive ones (in ``order``, default the table's) up to
        :data:`GROUP_ROWS` rows in all; a partition at least that large, or of unknown size, alone."""
        order = list(range(len(self.paths))) if order is None else order
        if self.sizes is None:
            return [[i] for i in order]
        out: list[list[int]] = []
        rows = 0
        for i in order:
            size = self.sizes[i]
            if out and rows + size <= GROUP_ROWS:
                out[-1].append(i)
                rows += size
            else:
                out.append([i])
                rows = size
        return out

    def map(self, fn: Callable, *args: Any, threads: int = 1) -> list[Any]:
        """``[fn(events, *args)]`` for every group of partitions (:meth:`groups`; on a cluster, every partition),
        in table order; here, one group in memory at a time beside the kept ones. ``fn`` must not assume one
        trace per call.

        ``threads`` > 1: where every group can be kept (:func:`kept_group_bytes`, judged from the first group's
        memory per row), ``fn`` runs on that many groups at once, in threads (``fn`` must be safe to, as polars
        and numpy work is); else one group after the other, as without."""
        if self.executor is not None:
            return self.executor(fn, args)
        groups = self.groups()
        if len(groups) == 1:
            return [fn(self.group(groups[0]), *args)]
        with self._one_group:
            first = fn(self.group(groups[0]), *args)
            if threads > 1 and self._all_fit(groups):
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="traceparse-group") as pool:
                    return [first, *pool.map(lambda g: fn(self.group(g), *args), groups[1:])]
            return [first, *(fn(self.group(g), *args) for g in groups[1:])]

    def _all_fit(self, groups: list[list[int]]) -> bool:
        """Whether ``groups`` are all kept, or all would be: their rows at the memory per row of a group read
        already, within :func:`kept_group_bytes`."""
        with self._reading:  # (another thread may be keeping a group)
            if all(tuple(g) in self._kept for g in groups):
                return True
            if self.sizes is None or not self._kept:
                return False
            key, frame = next(iter(self._kept.items()))
        rows = sum(self.sizes[i] for i in key)
        wanted = sum(self.sizes[i] for g in groups for i in g)
        return rows > 0 and frame.estimated_size() * wanted <= kept_group_bytes() * rows

    def partition(self, i: int) -> pl.DataFrame:
        """Partition ``i``'s events, read from its file (counted while alive in :attr:`most_at_once`)."""
        return self.group([i])

    def group(self, indices: list[int]) -> pl.DataFrame:
        """The events of the partitions ``indices``, in that order, read from their files as one frame.

        Groups are kept for the rest of the analysis while together they take at most :func:`kept_group_bytes`:
        measure after measure then reads each rank's file once. Past that budget the last group read is kept
        until another is asked for, so that only one of those is in memory at a time.
        """
        key = tuple(indices)
        with self._reading:
            kept = self._kept.get(key)
            if kept is not None:
                return kept
            if self._last is not None and self._last[0] == key:
                return self._last[1]
            self._last = None  # let the previous group go before reading the next one
            # one call: the files are read in parallel; one chunk, not one per file (a filter on 1,000 chunks of
            # 4 rows took 90 ms, on one chunk 5 ms); the columns null in every rank of the group take no memory
            from traceparse.events_file import read_events

            events = read_events([self.paths[i] for i in indices]).rechunk()
            size = events.estimated_size()
            if self._kept_bytes + size <= kept_group_bytes():
                self._kept[key] = events
                self._kept_bytes += size
                _KEPT_GROUPS.add(id(events))
                weakref.finalize(events, _KEPT_GROUPS.discard, id(events))
            else:
                self._last = (key, events)
            self.loaded += len(indices)
            self._alive += 1
            self.most_at_once = max(self.most_at_once, self._alive)
            weakref.finalize(events, self._release)
            return events

    def _release(self) -> None:
        with self._reading:
            self._alive -= 1

    def measure(self, measure: Measure, params: dict) -> pl.DataFrame:
        """``measure`` of the whole table, computed partition by partition (see the class docstring)."""
        if "trace_id" not in measure.partitions or not self.paths:  # it must see the whole table
            return measure.combine([measure.part(self.whole(), **params)], **params)
        finish = measure.per_trace
        if self.executor is not None:
            results = self.executor(rank_result, (measure, params, finish))
            if not finish:
                return measure.combine(results, **params)
            order = sorted(range(len(results)), key=lambda i: self.trace_ids[i])
            return pl.concat([results[i] for i in order])
        groups = self.groups()
        if len(groups) == 1:  # every partition together: what the whole table gives, its files read once
            return rank_result(self.group(groups[0]), measure, params, True)  # combine([part]) either way
        with self._one_group:
            if not finish:
                return measure.combine([rank_result(self.group(g), measure, params, False) for g in groups],
                                       **params)
            # per-trace results in trace-id order (the order combine sorts by). Where the groups fit the budget,
            # from the groups as they are kept (in table order), sorted by trace id after (a trace's rows do not
            # depend on the other traces of its group, and keep their order: the sort is stable); else from
            # groups of partitions in trace-id order, read one at a time. With nothing kept yet the first group
            # is read to judge by (its result is lost at most once, past the budget).
            parts = [] if self._kept else [rank_result(self.group(groups[0]), measure, params, True)]
            if self._all_fit(groups):
                parts += [rank_result(self.group(g), measure, params, True) for g in groups[len(parts):]]
                if all("trace_id" in part.columns for part in parts):
                    return pl.concat(parts).sort("trace_id", maintain_order=True)
            by_id = sorted(range(len(self.paths)), key=lambda i: self.trace_ids[i])
            return pl.concat([rank_result(self.group(g), measure, params, True) for g in self.groups(by_id)])

    # -- the table, lazily ------------------------------------------------------
    def lazy(self) -> pl.LazyFrame:
        """The whole table as a lazy scan of the partitions (rows in table order); a table of one group
        (:meth:`groups`) from memory, read once (a scan of a thousand small files costs 0.1 s a query)."""
        if self.executor is None and self.paths:
            groups = self.groups()
            if len(groups) == 1:
                return self.group(list(range(len(self.paths)))).lazy()
            with self._reading:  # every group kept in memory: a query of them, not of the files again
                kept = [self._kept.get(tuple(g)) for g in groups]
            if all(frame is not None for frame in kept):
                return pl.concat([frame.lazy() for frame in kept])
        from traceparse.schema import DTYPES

        # a store written before a column joined the schema lacks it: null there, as read_events gives it
        return pl.scan_parquet(self.paths, schema=DTYPES, missing_columns="insert", extra_columns="ignore")

    def filter(self, *predicates: Any, **constraints: Any) -> pl.DataFrame:
        """``DataFrame.filter`` of the whole table: only the matching rows are read into memory."""
        return self.lazy().filter(*predicates, **constraints).collect()

    def select(self, *exprs: Any, **named: Any) -> pl.DataFrame:
        """``DataFrame.select`` of the whole table (an aggregate reads only its columns)."""
        return self.lazy().select(*exprs, **named).collect()

    def __getitem__(self, column: str) -> pl.Series:
        """One column of the whole table."""
        if not isinstance(column, str):
            return self.whole()[column]
        return self.select(column).to_series()

    @property
    def height(self) -> int:
        """Rows of the whole table."""
        return int(self.lazy().select(pl.len()).collect().item())

    def __len__(self) -> int:
        return self.height

    @property
    def schema(self) -> pl.Schema:
        """The table's schema."""
        return self.lazy().collect_schema()

    @property
    def columns(self) -> list[str]:
        """The table's column names."""
        return self.schema.names()

    def whole(self) -> pl.DataFrame:
        """The whole table in memory (once; counted in :attr:`whole_loads`): what the other DataFrame methods use."""
        with self._reading:
            if self._whole is None:
                self.whole_loads += 1
                from traceparse.schema import empty_frame

                self._whole = self.lazy().collect() if self.paths else empty_frame()
            return self._whole

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.whole(), name)

    def __repr__(self) -> str:
        return f"<PartitionedEvents {len(self.paths)} partitions>"


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


def table_rows(events: Any) -> int:
    """The rows of an event table: a DataFrame's height, a run's from its ranks' sizes when the store knows them."""
    sizes = getattr(events, "sizes", None)
    return sum(sizes) if sizes is not None else events.height


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
    kinds = tuple(sorted(set(kinds)))  # the same rows in the same order, whatever the order the kinds are named in
    return shared(events, "rows_of", lambda: events.filter(kind_is(*kinds)), kinds)


def picked(events: pl.DataFrame, predicate: pl.Expr, *columns: Any, **named: Any) -> pl.DataFrame:
    """``events.filter(predicate).select(*columns, **named)`` as one query, so that only those columns are
    filtered: an eager filter copies every one of the table's fifty-odd columns first (15 ms on 300,000 rows)."""
    return events.lazy().filter(predicate).select(*columns, **named).collect()


def placed() -> pl.Expr:
    """Rows that are intervals: a start and a duration."""
    return pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()


def exact_sum(values: pl.Series) -> int:
    """Σ of an integer column as a Python int, exact whatever its size (nulls count as 0).

    polars adds Int64 columns in Int64 and wraps past 2^63 without a word: two ranks whose clocks jump by
    9.2e18 ns each have spans that add up to -4.7e16 ns. Figures summed over devices, streams or ranks (spans,
    idle times, step times) use this instead: each part fits Int64, their sum may not.
    """
    if values.dtype.is_integer():
        values = values.cast(pl.Int128)
    total = values.sum()
    return int(total or 0)


def exact_total(column: str) -> pl.Expr:
    """The aggregation form of :func:`exact_sum`: Σ of an integer column in Int128 (never wraps)."""
    return pl.col(column).cast(pl.Int128).sum()
