"""The dependency graph of a step and its critical path: the chain of work that held the step, across ranks.

A node is the start or the end of an event (node ``2 × event_id`` is its start, ``2 × event_id + 1`` its end,
within its trace), or a collective instance (one node per instance, shared by its members). An edge
``u → v`` says that ``v`` could not happen before ``u``; docs/critical_path.md defines every kind of edge and
says which trace formats carry it:

``thread``      consecutive points of one host thread (events nest: the segment between two points belongs to
                the innermost event open there, or to nothing: time the trace does not show)
``stream``      the end of a GPU activity → the start of the next one on its stream (and the activity itself,
                start → end)
``launch``      a launch call's start → the start of the GPU work it launched (correlation id: a graph launch
                → every kernel of the graph; where the call is not in the trace, the operator of the same
                external id)
``sync``        the end of the GPU work a blocking call waited for → the call's end
``wake``        inferred: the end of an event of another thread → a thread resuming after a wait the trace does
                not show (a thread is woken by another; only where the trace records runtime calls)
``stream_wait`` inferred: the end of an activity of another stream → an activity that waited for it (a
                cross-stream event wait; only where the trace records runtime calls)
``enqueue``     a collective call → the start of the backend's work on it (gloo's worker annotation)
``data``        the end of the operator that wrote a tensor → the start of an operator of another thread that read it
                (the ``data_from`` column: a PyTorch execution trace read with its Kineto trace)
``join``        a member's joining a collective instance → the instance (all members leave once the last joined)
``leave``       the instance → each member's leaving it (the end of its kernel or annotation; none for a member
                done before the last one joined: a broadcast's root)

The **critical path** of a step is found backwards from the step's end: at every node, the in-edge whose
source happened last is the one that held it (the last-arriving dependency), and the path follows it. Every
edge's measured time (``gap_ns`` = its end − its start) is at most the time between its two nodes, and the
chosen edges' times are exactly that, so the path found this way is the longest path to the step's end in
the graph weighted by those times, and its segments add up to the time from where it starts to the step's
end: never more than the step. A replay (the ``whatif`` of issue 24) runs the same graph forwards: each node
at the latest of its in-edges' source times plus their ``weight_ns``; with the measured weights it gives back
the measured times.

:data:`dependency_graph` (a measure: per-trace part, a combine that adds the collectives across ranks) builds
the graph, every trace of a partition at once (a group of a run's ranks costs a fixed number of polars queries,
not a few dozen per rank); :func:`critical_paths` walks it for each step window and returns the path's segments.
The ``critical-path`` rule finds the same paths from the edges before they are chosen and sorted
(:meth:`DependencyGraph.unchosen`, :mod:`traceparse.measures.path_direct`): it needs no replay weights.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import polars as pl

from traceparse import expr
from traceparse.cores import available_memory, usable_cores
from traceparse.errors import ResourceError
from traceparse.figures import fmt_bytes
from traceparse.measures import path_walk
from traceparse.measures.base import Measure, PartitionedEvents, keyed, picked, placed, table_rows
from traceparse.measures.comm import BLOCKING_WAITS, CANDIDATE_SCHEMA, clock_offsets, collectives, completions
from traceparse.measures.launches import launches
from traceparse.measures.nesting import HOST_KINDS, parents
from traceparse.measures.steps import RANGE_KINDS, STEP_NAME, step_series

#: Blocking calls: the host waits in them until GPU work is done (synchronisations, synchronous copies: HIP's
#: ``hipMemcpyWithStream`` is PyTorch's copy-and-wait on ROCm, where CUDA builds call ``cudaMemcpyAsync`` then
#: ``cudaStreamSynchronize``; ``*MemcpyToSymbol``/``FromSymbol`` and HIP's driver-style ``hipMemcpyDtoH`` block too).
SYNC_CALLS = (r"Synchronize$|^(cuda|hip)Memcpy(2D|3D)?$|^cuMemcpy(DtoH|HtoD|DtoD|2D|3D)?(_v2)?$"
              r"|^hipMemcpyWithStream$|^hipMemcpy(DtoH|HtoD|DtoD)$|^(cuda|hip)Memcpy(To|From)Symbol$")
#: An untraced gap (host) or an unexplained wait (GPU) shorter than this is overhead, not a wait.
MIN_WAIT_NS = 20_000
#: A thread resuming (a stream starting) at most this long after another's event ended may have waited for it.
MAX_WAKE_NS = 5_000_000
#: Edge kinds in order of preference when two in-edges' sources happened at the same time.
EDGE_KINDS = ("thread", "stream", "launch", "sync", "enqueue", "leave", "join", "data", "wake", "stream_wait")
#: What a segment of the path is (docs/critical_path.md).
SEGMENT_KINDS = ("host op", "runtime", "launch", "sync", "untraced", "wake-up", "kernel", "copy", "memset",
                 "queue", "stream wait", "communication", "join")
#: The virtual trace of collective-instance nodes.
INSTANCE_TRACE = "(collective)"

#: The kinds of edge and segment as enums (one byte a row, in the orders above: sorts, joins and comparisons on
#: integers, not on the texts of a million edges); the names and categories as categoricals (a few thousand
#: distinct names over the edges: 120 -> 92 MB and 1.16 -> 1.00 CPU s for the 139 MB trace's graph).
EDGE_KIND = pl.Enum(EDGE_KINDS)
SEGMENT_KIND = pl.Enum(SEGMENT_KINDS)

EDGE_SCHEMA: dict[str, pl.DataType] = {
    "src_trace": pl.String, "src_node": pl.Int64, "src_ns": pl.Int64, "src_rank": pl.Int32,
    "dst_trace": pl.String, "dst_node": pl.Int64, "dst_ns": pl.Int64, "rank": pl.Int32,
    "edge": EDGE_KIND, "segment": SEGMENT_KIND, "name": pl.Categorical, "category": pl.Categorical,
    "event_id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "device_id": pl.Int32, "stream_id": pl.Int64,
    "inferred": pl.Boolean,
}
_COMM_SCHEMA = CANDIDATE_SCHEMA  # the collective candidates a part carries (every column the matching reads)


def _empty_edges() -> pl.DataFrame:
    return pl.DataFrame(schema=EDGE_SCHEMA)


#: The key of a trace while a graph is built: ``trace_id`` as an Int32 code in the order of the trace ids (joins,
#: sorts and windows on an integer, not a string).
_T = "trace_id"


def _no_edges() -> pl.DataFrame:
    """No edges, as the builder's frames are while a graph is built (trace codes, :data:`_T`)."""
    return pl.DataFrame(schema={**EDGE_SCHEMA, "src_trace": pl.Int32, "dst_trace": pl.Int32})


def _edges(frame: pl.DataFrame | pl.LazyFrame, **fixed: Any) -> pl.DataFrame:
    """``frame`` (some edge columns and ``trace_id``) as a frame of :data:`EDGE_SCHEMA`: both ends in the row's
    trace, the rest from ``fixed`` or null (the ranks are filled in by :func:`trace_edges`). A lazy ``frame`` is
    collected with it, in one query."""
    values = {"inferred": False, **fixed}
    lazy = isinstance(frame, pl.LazyFrame)
    names = frame.collect_schema().names() if lazy else frame.columns
    exprs = []
    for column, dtype in EDGE_SCHEMA.items():
        if column in names:
            exprs.append(pl.col(column).cast(dtype))
        elif column in ("src_trace", "dst_trace"):
            exprs.append(pl.col(_T).alias(column))
        else:
            exprs.append(pl.lit(values.get(column), dtype=dtype).alias(column))
    return frame.select(exprs).collect() if lazy else frame.select(exprs)


#: A column of names as its distinct names and each row's place among them (:func:`_name_codes`).
Coded = tuple[pl.Series, pl.Series]


def _name_codes(names: pl.Series) -> Coded:
    """The distinct names of ``names`` (no nulls) and each row's place among them: what is made of a name is
    made once per distinct name and gathered to the rows, and the names are hashed once for all of it."""
    distinct = names.unique()
    if names.len() == 0:  # no codes to look up (polars gives an empty column back as it was)
        return distinct, pl.Series(names.name, [], dtype=pl.Int64)
    return distinct, names.replace_strict(distinct, pl.int_range(distinct.len(), eager=True), return_dtype=pl.Int64)


def _per_name(names: pl.Series, classify: Callable[[pl.Expr], pl.Expr], coded: Coded | None = None) -> pl.Series:
    """``classify`` (an expression over names: a regular-expression table) of each of ``names`` (no nulls),
    evaluated once per distinct name: a trace repeats a few hundred names over hundreds of thousands of rows.
    ``coded``: :func:`_name_codes` of ``names``, where the caller classifies them more than one way."""
    distinct, codes = _name_codes(names) if coded is None else coded
    labels = pl.select(classify(pl.lit(distinct))).to_series()
    return labels.gather(codes).alias(names.name)


def _collective_of(frame: pl.DataFrame, coded: Coded | None = None) -> pl.Series:
    """:func:`traceparse.expr.collective_of` of ``frame``'s rows, the names classified once each (``coded``: as
    :func:`_per_name`'s, of the names with nulls as "")."""
    from_name = _per_name(frame["name"].fill_null(""), expr.collective, coded)
    return frame.select(pl.coalesce(pl.col("collective"), from_name)).to_series().alias("collective")


# -- each trace's own edges (every trace of a frame at once, keyed by trace) -------------------------------------
def on_a_thread() -> pl.Expr:
    """The rows whose start and end are points of the graph's host threads: timed host events with a process and
    a thread, not a source's own exclusive time (TAU's profiles)."""
    return (expr.kind_is(*HOST_KINDS) & pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & placed()
            & pl.col("exclusive_ns").is_null())


def _host_points(events: pl.DataFrame, windows: pl.DataFrame | None = None) -> pl.DataFrame:
    """The start and end points of each trace's timed host events, in order on each thread, with the event that
    owns the time after each point (the innermost one open there). ``windows`` (:data:`_T`, ``start_ns``,
    ``end_ns``): the trace's steps; a host range that is one of them is a step annotation, as ``ProfilerStep#N`` is
    (an NVTX range ``step 3``, a ``train_step`` annotation, a reader's marked step)."""
    host = picked(events, on_a_thread(),
                  _T, "event_id", "kind", "name", "pid", "tid", "start_ns", "duration_ns", "exclusive_ns", "collective")
    if host.height == 0:
        return pl.DataFrame()
    coded = _name_codes(host["name"].fill_null(""))  # the names hashed once: classified, and named, per name
    host = pl.concat([host.with_columns(_collective_of(host, coded)).select(
        _T, "event_id", "kind", "name", "pid", "tid", "start_ns", "duration_ns", "collective"),
        parents(host, [_T, "pid", "tid"])], how="horizontal")
    some = pl.col("duration_ns") > 0
    starts = host.select(_T, "event_id", "pid", "tid", "parent_event_id", t=pl.col("start_ns"),
                         is_end=pl.lit(0, dtype=pl.Int8), grp=pl.lit(1, dtype=pl.Int8), sub=pl.col("depth"))
    ends = host.select(_T, "event_id", "pid", "tid", "parent_event_id", t=pl.col("start_ns") + pl.col("duration_ns"),
                       is_end=pl.lit(1, dtype=pl.Int8), grp=pl.when(some).then(0).otherwise(1).cast(pl.Int8),
                       sub=pl.when(some).then(-pl.col("depth")).otherwise(pl.col("depth")))
    # at one instant: ends before starts (siblings), outer starts before inner ones, inner ends before outer
    # ones; a zero-length event's end right after its start
    # (the node number orders by event, then start before end)
    points = pl.concat([starts, ends]).with_columns(node=2 * pl.col("event_id") + pl.col("is_end"))
    points = expr.sort_rows(points, [_T, "pid", "tid", "t", "grp", "sub", "node"], lexsort=True)
    owner = pl.when(pl.col("is_end") == 0).then(pl.col("event_id")).otherwise(pl.col("parent_event_id"))
    points = points.with_columns(owner=owner)
    # what owns each point's time, gathered from the host row of its owner (a look-up by position, not a join of
    # half a million points), made once per host event, not per point
    rows = _rows_of(host, points)
    return pl.concat([points, _owned_time(host, windows, coded).select(pl.all().gather(rows))], how="horizontal")


def _owned_time(host: pl.DataFrame, windows: pl.DataFrame | None, coded: Coded) -> pl.DataFrame:
    """What the time each host event owns is, once per event (every thread edge out of its points takes it, twice
    as many): ``_segment`` (:func:`_host_segment`), ``_name`` (a step annotation's own time is ``(nothing traced in
    ProfilerStep#3)``) and ``_category`` (its collective, else its kind), in ``host``'s order. ``windows``: as
    :func:`_host_points`'s; ``coded``: :func:`_name_codes` of the names (nulls as "")."""
    # what each name is (a step's, its API class) and says (the name as a categorical, a step's own time as
    # "(nothing traced in ...)"), made per distinct name in one query and gathered to the events in another
    distinct, codes = coded
    name = pl.lit(distinct)
    labels = pl.select(_step=name.str.contains(STEP_NAME), _class=expr.api_class(name),
                       _plain=name.cast(pl.Categorical),
                       _stepped=pl.format("(nothing traced in {})", name).cast(pl.Categorical))
    info = pl.concat([host.select(owner_kind=pl.col("kind").cast(pl.String), owner_collective="collective",
                                  _no_name=pl.col("name").is_null()),
                      labels.select(pl.all().gather(codes))], how="horizontal")
    if windows is not None and windows.height:
        # only ranges can be step annotations: those few rows are matched with the windows, not every host event
        window = windows.select(_T, "start_ns", end_ns="end_ns").unique().with_columns(_window=pl.lit(True))
        ranges = host.with_row_index("_row").filter(expr.kind_is(*RANGE_KINDS)).select(
            "_row", _T, "start_ns", end_ns=pl.col("start_ns") + pl.col("duration_ns")).join(
            window, on=[_T, "start_ns", "end_ns"], how="inner")  # unique windows: a row each
        if ranges.height:
            stepped = np.zeros(host.height, dtype=bool)
            stepped[ranges["_row"].to_numpy()] = True
            info = info.with_columns(_step=pl.col("_step") | pl.Series(stepped))
    return info.select(
        _segment=_host_segment().cast(SEGMENT_KIND),
        _name=pl.when(pl.col("_no_name")).then(pl.lit(None, dtype=pl.Categorical)).when(pl.col("_step"))
        .then(pl.col("_stepped")).otherwise(pl.col("_plain")),
        _category=pl.coalesce("owner_collective", "owner_kind").cast(pl.Categorical))


def _rows_of(host: pl.DataFrame, points: pl.DataFrame) -> pl.Series:
    """The row of ``host`` (trace code, event id: unique) of each point's ``owner`` in its trace (null: none)."""
    width = max(int(host["event_id"].max()), int(points["owner"].max() or 0)) + 1
    key = host[_T].cast(pl.Int64).to_numpy() * width + host["event_id"].to_numpy()
    owner = points["owner"]
    wanted = points[_T].cast(pl.Int64).to_numpy() * width + owner.fill_null(0).to_numpy()
    if _dense(key, len(wanted)):  # each key's first row in an array over their range: a look-up each, no sort
        distinct, first = _first_seen(key)
        row_of = np.zeros(int(key.max()) + 1, dtype=np.int64)
        row_of[distinct] = first
        found = row_of[np.minimum(wanted, len(row_of) - 1)]
    else:
        order = np.argsort(key, kind="stable")
        found = order[np.clip(np.searchsorted(key[order], wanted), 0, len(order) - 1)]
    return pl.Series(found, dtype=pl.Int64).scatter(np.flatnonzero(owner.is_null().to_numpy()), None)


def _host_segment() -> pl.Expr:
    """The segment kind of host time owned by ``owner_kind`` / ``owner_collective`` (a collective call or
    annotation's own time is communication; a step annotation's own time is time the trace does not show), given
    ``_class`` (the owner's API class) and ``_step`` (the owner is a step annotation)."""
    cls = pl.col("_class")
    return (pl.when(pl.col("_step")).then(pl.lit("untraced"))
            .when(pl.col("owner_collective").is_not_null()).then(pl.lit("communication"))
            .when(pl.col("owner_kind") != "api").then(pl.lit("host op"))
            .when(cls.is_in(["launch", "graph_launch"])).then(pl.lit("launch"))
            .when(cls == "synchronize").then(pl.lit("sync"))
            .otherwise(pl.lit("runtime")))


def _thread_edges(points: pl.DataFrame) -> pl.DataFrame:
    """``thread`` edges: each point → the next point of its thread, owned by the innermost open event."""
    # the points are in order on each thread, threads one after the other: the next point of a thread is the next
    # row where that row is of the same thread (no window per thread over half a million points)
    # one lazy query: only the columns the edges take are copied, not every column of half a million points
    same = pl.all_horizontal(pl.col(c).eq_missing(pl.col(c).shift(-1)) for c in (_T, "pid", "tid"))
    rows = points.lazy().with_columns(dst_node=pl.when(same).then(pl.col("node").shift(-1)),
                                      dst_ns=pl.when(same).then(pl.col("t").shift(-1))
                                      ).filter(pl.col("dst_node").is_not_null())
    nothing = pl.col("owner").is_null()  # time no event owns
    rows = rows.select(_T, src_node="node", src_ns="t", dst_node="dst_node", dst_ns="dst_ns",
                       segment=pl.when(nothing).then(pl.lit("untraced", dtype=SEGMENT_KIND)).otherwise("_segment"),
                       name=pl.when(nothing).then(pl.lit("(nothing traced on the thread)", dtype=pl.Categorical))
                       .otherwise("_name"),
                       category="_category", event_id="owner", pid="pid", tid="tid")
    return _edges(rows, edge="thread")


def _linked_launches(events: pl.DataFrame, traces: pl.Series) -> pl.DataFrame:
    """:data:`~traceparse.measures.launches.launches` of ``events`` (the table as given: the measure, and the link
    under it, are shared with the rules that ask for them, gpu-idle's stream gaps), on the trace codes of
    ``traces`` (the keyed trace ids, sorted)."""
    return keyed(launches(events)).with_columns(
        pl.col(_T).replace_strict(traces, range(traces.len()), return_dtype=pl.Int32))


def _gpu_rows(events: pl.DataFrame, linked: pl.DataFrame) -> pl.DataFrame:
    """Each trace's timed GPU activities with their launch (call, or operator of the same external id), from
    ``linked``: their :func:`_linked_launches`."""
    if linked.height == 0:
        return pl.DataFrame()
    # the GPU rows' external ids and copy kinds (a join with those rows alone, on the event id alone in one trace)
    linked = expr.join_rows(linked, picked(events, expr.kind_is(*expr.GPU_KINDS), _T, "event_id", "external_id",
                                           "copy_kind"), on=[_T, "event_id"], how="left")
    ops = picked(events, expr.kind_is("op", "marker") & pl.col("pid").is_not_null() & placed()
                 & pl.col("external_id").is_not_null(),
                 _T, "external_id", op_event_id="event_id", op_start_ns="start_ns", op_name="name").sort("op_start_ns")
    unlinked = linked.filter(pl.col("launch_event_id").is_null() & pl.col("external_id").is_not_null())
    if ops.height and unlinked.height:
        # the operator of the same external id that started last before the activity (the innermost one)
        via = (unlinked.select(_T, "event_id", "external_id", "start_ns").sort("start_ns")
               .join_asof(ops, left_on="start_ns", right_on="op_start_ns", by=[_T, "external_id"],
                          strategy="backward", check_sortedness=False)
               .select(_T, "event_id", "op_event_id", "op_start_ns", "op_name"))
        linked = linked.join(via, on=[_T, "event_id"], how="left")
    else:
        linked = linked.with_columns(op_event_id=pl.lit(None, dtype=pl.Int64), op_start_ns=pl.lit(None, dtype=pl.Int64),
                                     op_name=pl.lit(None, dtype=pl.String))
    return expr.sort_rows(linked.with_columns(
        end_ns=pl.col("start_ns") + pl.col("duration_ns"),
        from_ns=pl.coalesce("launch_start_ns", "op_start_ns"),
        from_node=pl.coalesce(2 * pl.col("launch_event_id"), 2 * pl.col("op_event_id")),
        from_name=pl.coalesce("launch_name", "op_name"),
        from_call=pl.col("launch_event_id").is_not_null(),
    ), [_T, "device_id", "stream_id", "start_ns", "end_ns", "event_id"], nulls_last=False)


def _gpu_edges(gpu: pl.DataFrame) -> pl.DataFrame:
    """``stream`` edges (each activity, and the previous activity's end → the next start) and ``launch`` edges."""
    table = expr.kernel_categories()
    gpu = gpu.with_columns(_category=_per_name(gpu["name"].fill_null(""), lambda n: expr.kernel_category(n, table)))
    category = pl.col("_category")
    kind = pl.col("kind").cast(pl.String)
    segment = (pl.when(kind == "memcpy").then(pl.lit("copy")).when(kind == "memset").then(pl.lit("memset"))
               .when(category == "communication").then(pl.lit("communication")).otherwise(pl.lit("kernel")))
    lane = {"device_id": "device_id", "stream_id": "stream_id"}
    itself = gpu.select(_T, src_node=2 * pl.col("event_id"), src_ns="start_ns", dst_node=2 * pl.col("event_id") + 1,
                        dst_ns="end_ns", segment=segment, name="name",
                        category=pl.when(kind == "memcpy").then(pl.col("copy_kind").cast(pl.String))
                        .when(kind == "kernel").then(category), event_id="event_id", **lane)
    stream = [_T, "device_id", "stream_id"]
    # the activity before on its stream that ended last: its end, or where this one overlaps it (a programmatic
    # dependent launch starts while its predecessor runs) the previous activity's start
    ended_last = pl.when(pl.col("end_ns") == pl.col("end_ns").cum_max()).then(pl.col("event_id")).forward_fill()
    ordered = gpu.with_columns(last_id=ended_last.over(stream)).with_columns(
        last_id=pl.col("last_id").shift(1).over(stream), last_end=pl.col("end_ns").cum_max().shift(1).over(stream),
        prev_id=pl.col("event_id").shift(1).over(stream), prev_start=pl.col("start_ns").shift(1).over(stream))
    overlaps = pl.col("last_end") > pl.col("start_ns")
    prev = ordered.with_columns(prev_node=pl.when(overlaps).then(2 * pl.col("prev_id"))
                                .otherwise(2 * pl.col("last_id") + 1),
                                prev_end=pl.when(overlaps).then(pl.col("prev_start")).otherwise(pl.col("last_end")))
    prev = prev.filter(pl.col("prev_node").is_not_null() & (pl.col("prev_end") <= pl.col("start_ns")))
    queued = prev.select(_T, src_node="prev_node", src_ns="prev_end", dst_node=2 * pl.col("event_id"),
                         dst_ns="start_ns",
                         segment=pl.when(pl.col("from_ns").is_not_null()).then(pl.lit("queue"))
                         .otherwise(pl.lit("untraced")),
                         name=pl.when(pl.col("from_ns").is_not_null()).then(pl.col("name"))
                         .otherwise(pl.lit("(GPU idle: the launch is not in the trace)")),
                         event_id="event_id", **lane)
    # an activity that overlaps its predecessor still ends after it (what it did once its predecessor ended)
    tailing = (pl.col("last_end") > pl.col("start_ns")) & (pl.col("last_end") <= pl.col("end_ns"))
    tails = ordered.filter(tailing).select(
        _T, src_node=2 * pl.col("last_id") + 1, src_ns="last_end", dst_node=2 * pl.col("event_id") + 1, dst_ns="end_ns",
        segment=segment, name="name", category=pl.when(kind == "memcpy").then(pl.col("copy_kind").cast(pl.String))
        .when(kind == "kernel").then(category), event_id="event_id", **lane)
    launched = gpu.filter(pl.col("from_ns").is_not_null() & (pl.col("from_ns") <= pl.col("start_ns"))).select(
        _T, src_node="from_node", src_ns="from_ns", dst_node=2 * pl.col("event_id"), dst_ns="start_ns",
        segment=pl.lit("launch"), name="from_name",
        category=pl.when(pl.col("from_call")).then(pl.lit("launch call")).otherwise(pl.lit("operator")),
        event_id="event_id", **lane)
    return pl.concat([_edges(itself, edge="stream"), _edges(queued, edge="stream"), _edges(tails, edge="stream"),
                      _edges(launched, edge="launch")])


def _sync_edges(events: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """``sync`` edges: of the GPU work of its trace launched before a blocking call began, the activity that
    ended last within the call → the call's end. Work whose launch the trace does not hold (launched before
    the profiler started, or on a thread it did not record) counts as launched before the call: the calling
    thread was blocked in it, and a launch on a traced thread would be linked (a Qwen decode step's 14 ms
    ``cudaDeviceSynchronize`` over 500 such kernels was all "sync" on the path, none of it the GPU's)."""
    calls = picked(events, expr.kind_is("api") & placed() & pl.col("name").str.contains(SYNC_CALLS),
                   _T, "event_id", "name", "pid", "tid", "start_ns", end_ns=pl.col("start_ns") + pl.col("duration_ns"))
    if calls.height == 0 or gpu.height == 0:
        return _no_edges()
    by_end = gpu.select(_T, "event_id", "end_ns", "device_id", "stream_id",
                        launched=pl.col("from_ns").fill_null(np.iinfo(np.int64).min)).sort(_T, "end_ns", "event_id")
    ends = by_end["end_ns"].to_numpy()
    launched = by_end["launched"].to_numpy()
    # each trace's rows of by_end: [first, stop)
    bounds = by_end.with_row_index("row").group_by(_T).agg(first=pl.col("row").min(), stop=pl.col("row").max() + 1)
    calls = calls.join(bounds, on=_T, how="inner")
    found = []
    for call_id, trace, start, end, first, stop in calls.select(
            "event_id", _T, "start_ns", "end_ns", "first", "stop").iter_rows():
        i = first + int(np.searchsorted(ends[first:stop], end, side="right")) - 1
        steps = 0
        while i >= first and ends[i] >= start and steps < 10_000:
            if launched[i] <= start:
                found.append((trace, call_id, i))
                break
            i -= 1
            steps += 1
    if not found:
        return _no_edges()
    pairs = pl.DataFrame(found, schema={_T: pl.Int32, "event_id": pl.Int64, "row": pl.Int64}, orient="row")
    gpu_side = by_end.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64)).select(
        "row", gpu_event_id="event_id", gpu_end="end_ns", device_id="device_id", stream_id="stream_id")
    rows = pairs.join(gpu_side, on="row").join(calls, on=[_T, "event_id"]).select(
        _T, src_node=2 * pl.col("gpu_event_id") + 1, src_ns="gpu_end", dst_node=2 * pl.col("event_id") + 1,
        dst_ns="end_ns", segment=pl.lit("sync"), name="name", event_id="event_id", pid="pid", tid="tid",
        device_id="device_id", stream_id="stream_id")
    return _edges(rows, edge="sync")


def _wake_edges(points: pl.DataFrame, thread_edges: pl.DataFrame, min_wait_ns: int, max_wake_ns: int,
                waking: pl.DataFrame | None = None) -> pl.DataFrame:
    """``wake`` edges (inferred): a thread resuming after a gap of at least ``min_wait_ns`` in which it ran no
    event (or only an annotation: a range, not work; or a blocking wait,
    :data:`~traceparse.measures.comm.BLOCKING_WAITS`), or starting its first event, at most ``max_wake_ns``
    after an event of another thread of its process ended within the gap → from that end. ``waking`` (trace,
    event id): only the ends of those events wake a thread (else any event's)."""
    waiting = ((pl.col("segment") == "untraced") | pl.col("category").is_in(["marker", "region"])
               | pl.col("name").is_in(BLOCKING_WAITS))
    gaps = thread_edges.filter(waiting & (pl.col("dst_ns") - pl.col("src_ns") >= min_wait_ns)).select(
        pl.col("dst_trace").alias(_T), "pid", "tid", a="src_ns", b="dst_ns", dst_node="dst_node")
    # a thread's first point: it may have been waiting since before the trace began
    # (points are in order on each thread: its first point is the row where the thread changes)
    new_thread = pl.any_horizontal(~pl.col(c).eq_missing(pl.col(c).shift(1)) for c in (_T, "pid", "tid"))
    first = points.filter(new_thread | (pl.int_range(pl.len()) == 0)).select(
        _T, "pid", "tid", a=pl.lit(None, dtype=pl.Int64), b="t", dst_node="node")
    gaps = pl.concat([gaps, first.with_columns(a=pl.col("b") - max_wake_ns - 1)]).sort("b")
    ends = points.lazy().filter(pl.col("is_end") == 1)  # only the columns taken are copied
    if waking is not None:
        ends = ends.join(waking.lazy(), on=[_T, "event_id"], how="semi")
    ends = ends.select(_T, "pid", e_tid="tid", e="t", e_node="node", e_event="event_id").collect().sort("e")
    if gaps.height == 0 or ends.height == 0:
        return _no_edges()
    # the last end strictly before the resuming point: one at it may be the thread's own (a range, a Python frame
    # that held the wait, ending there), and would hide the other thread's end before it
    woke = gaps.with_columns(before=pl.col("b") - 1).join_asof(
        ends, left_on="before", right_on="e", by=[_T, "pid"], strategy="backward", check_sortedness=False)
    woke = woke.filter(pl.col("e").is_not_null() & (pl.col("e_tid") != pl.col("tid")) & (pl.col("e") > pl.col("a"))
                       & (pl.col("b") - pl.col("e") <= max_wake_ns))
    rows = woke.select(_T, src_node="e_node", src_ns="e", dst_node="dst_node", dst_ns="b", segment=pl.lit("wake-up"),
                       name=pl.lit("(resumed after another thread)"), event_id="e_event", pid="pid", tid="tid")
    return _edges(rows, edge="wake", inferred=True)


def _stream_wait_edges(gpu: pl.DataFrame, gpu_edges: pl.DataFrame, min_wait_ns: int, max_wake_ns: int) -> pl.DataFrame:
    """``stream_wait`` edges (inferred): an activity that started at least ``min_wait_ns`` after its launch and its
    stream's previous activity, at most ``max_wake_ns`` after an activity of another stream of its device ended
    in between → from that end (a cross-stream event wait: the trace does not say which event)."""
    starts = gpu_edges.filter(pl.col("edge").is_in(["launch", "stream"]) & (pl.col("dst_node") % 2 == 0)).group_by(
        "dst_trace", "dst_node").agg(p=pl.col("src_ns").max()).rename({"dst_trace": _T})
    rows = gpu.select(_T, "event_id", "device_id", "stream_id", s="start_ns", dst_node=2 * pl.col("event_id")).join(
        starts, on=[_T, "dst_node"], how="inner").filter(pl.col("s") - pl.col("p") >= min_wait_ns).sort("s")
    ends = gpu.select(_T, "device_id", e_stream="stream_id", e="end_ns", e_node=2 * pl.col("event_id") + 1,
                      e_event="event_id").sort("e")
    if rows.height == 0:
        return _no_edges()
    woke = rows.join_asof(ends, left_on="s", right_on="e", by=[_T, "device_id"], strategy="backward",
                          check_sortedness=False)
    woke = woke.filter(pl.col("e").is_not_null() & (pl.col("e_stream") != pl.col("stream_id"))
                       & (pl.col("e") > pl.col("p")) & (pl.col("s") - pl.col("e") <= max_wake_ns))
    out = woke.select(_T, src_node="e_node", src_ns="e", dst_node="dst_node", dst_ns="s", segment=pl.lit("stream wait"),
                      name=pl.lit("(waited for another stream)"), event_id="e_event", device_id="device_id",
                      stream_id="stream_id")
    return _edges(out, edge="stream_wait", inferred=True)


def _data_edges(events: pl.DataFrame) -> pl.DataFrame:
    """``data`` edges: the end of an operator that wrote a tensor → the start of an operator of its trace that read
    it, where the two ran on different threads (on one thread program order already says it). ``data_from`` lists
    each operator's producers (docs/schema.md); an edge is kept only where its producer ended before its consumer
    began. The time between is the consumer's thread waiting for the producer: a ``wake-up``, here not inferred."""
    if "data_from" not in events.columns or events["data_from"].null_count() == events.height:
        return _no_edges()
    host = events.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & placed())
    consumers = host.filter(pl.col("data_from").is_not_null()).select(
        _T, "event_id", "pid", "tid", "start_ns", producer=pl.col("data_from").str.json_decode(pl.List(pl.Int64)))
    producers = host.select(_T, producer="event_id", p_pid="pid", p_tid="tid", p_name="name",
                            p_end=pl.col("start_ns") + pl.col("duration_ns"))
    pairs = consumers.explode("producer").join(producers, on=[_T, "producer"], how="inner").filter(
        ((pl.col("p_pid") != pl.col("pid")) | (pl.col("p_tid") != pl.col("tid"))) & (pl.col("p_end") <= pl.col("start_ns")))
    rows = pairs.select(_T, src_node=2 * pl.col("producer") + 1, src_ns="p_end", dst_node=2 * pl.col("event_id"),
                        dst_ns="start_ns", segment=pl.lit("wake-up"), name="p_name", category=pl.lit("tensor"),
                        event_id="producer", pid="pid", tid="tid")
    return _edges(rows, edge="data")


def trace_edges(events: pl.DataFrame, min_wait_ns: int = MIN_WAIT_NS, max_wake_ns: int = MAX_WAKE_NS) -> pl.DataFrame:
    """Every edge of each trace's own graph (all but the collectives across members), as :data:`EDGE_SCHEMA`.

    ``events`` may hold many traces (a group of a run's ranks): they are built together, each edge within its
    own trace (``trace_id``; its ``rank`` is the trace's first non-null rank), in a fixed number of polars
    queries whatever the number of traces. Inferred edges (``wake``, ``stream_wait``) only in traces that
    record runtime calls: without them a host gap is work the trace does not show, not a wait; except that a
    thread resuming right after a collective on another thread of its process ended (a CPU-only run's DDP waiting
    for gloo's worker thread) is woken by it.
    """
    if events.height == 0:
        return _empty_edges()
    if _T not in events.columns:
        events = events.with_columns(pl.lit(None, dtype=pl.String).alias(_T))
    given = events  # the table as the other rules see it: the launches measure is shared with them
    events = keyed(events.with_columns(pl.col(_T).cast(pl.String)))
    traces = events[_T].unique().sort()
    events = events.with_columns(pl.col(_T).replace_strict(traces, range(traces.len()), return_dtype=pl.Int32))
    # the three columns first: an eager group-by of the whole table materialises every column (60 MB, 36 ms)
    per_trace = events.select(_T, "rank", "kind").group_by(_T).agg(
        _rank=pl.col("rank").drop_nulls().first().cast(pl.Int32), _runtime=expr.kind_is("api").any())
    with_runtime = per_trace.filter(pl.col("_runtime")).select(_T)
    parts = []
    # the steps as every command finds them (step_series: ProfilerStep#N, a reader's marked steps, NVTX ranges
    # named like steps, ...), each trace's own: a range that is one of them is a step annotation
    windows = keyed(step_series(given, by_trace=True).select("trace_id", "start_ns", "end_ns")).with_columns(
        pl.col(_T).replace_strict(traces, range(traces.len()), default=None, return_dtype=pl.Int32)).drop_nulls(_T)
    points = _host_points(events, windows)
    thread = _no_edges()
    if points.height:
        thread = _thread_edges(points)
        parts.append(thread)
    gpu = _gpu_rows(events, _linked_launches(given, traces))
    gpu_edges = _no_edges()
    if gpu.height:
        gpu_edges = _gpu_edges(gpu)
        parts += [gpu_edges, _sync_edges(events, gpu)]
    if points.height:
        parts.append(_data_edges(events))
    every = with_runtime.height == per_trace.height  # every trace records runtime calls: nothing to leave out

    def recording(frame: pl.DataFrame, column: str = _T) -> pl.DataFrame:
        """The rows of ``frame`` in traces that record runtime calls."""
        return frame if every else frame.join(with_runtime, left_on=column, right_on=_T, how="semi",
                                              maintain_order="left")  # the points stay in order on each thread

    if with_runtime.height and points.height:
        parts.append(_wake_edges(recording(points), recording(thread, "dst_trace"), min_wait_ns, max_wake_ns))
    if with_runtime.height < per_trace.height and points.height:
        # traces without runtime calls (a CPU-only run): a gap is work the trace does not show, unless it ends
        # right after a collective on another thread of the process ended (DDP's reducer waiting for gloo's
        # worker thread): only a collective's end wakes a thread there
        silent = per_trace.filter(~pl.col("_runtime")).select(_T)
        host = events.join(silent, on=_T, how="semi").filter(on_a_thread()).select(_T, "event_id", "name",
                                                                                  "collective")
        ended = host.filter(_collective_of(host).is_not_null()).select(_T, "event_id")
        if ended.height:
            points_of = points.join(silent, on=_T, how="semi", maintain_order="left")
            thread_of = thread.join(silent, left_on="dst_trace", right_on=_T, how="semi", maintain_order="left")
            parts.append(_wake_edges(points_of, thread_of, min_wait_ns, max_wake_ns, waking=ended))
    if with_runtime.height and gpu.height:
        parts.append(_stream_wait_edges(recording(gpu), recording(gpu_edges, "dst_trace"), min_wait_ns, max_wake_ns))
    if not parts:
        return _empty_edges()
    ranks = per_trace.select(dst_trace=_T, _rank="_rank")
    ids = pl.Series([t or None for t in traces.to_list()], dtype=pl.String)  # code -> trace id ("" -> null)
    trace_of = {f"{end}_trace": pl.col(f"{end}_trace").replace_strict(range(ids.len()), ids, return_dtype=pl.String)
                for end in ("src", "dst")}
    edges = pl.concat(parts)
    if ranks.height == 1:  # one trace (every edge is within it): its rank and id, without a join
        rank = pl.lit(ranks["_rank"][0], dtype=pl.Int32)
        return edges.with_columns(rank=rank, src_rank=rank,
                                  **{c: pl.lit(ids[0], dtype=pl.String) for c in trace_of}).select(list(EDGE_SCHEMA))
    return (edges.join(ranks, on="dst_trace", how="left", maintain_order="left")
            .with_columns(rank=pl.col("_rank"), src_rank=pl.col("_rank"), **trace_of)
            .select(list(EDGE_SCHEMA)))


# -- the measure -------------------------------------------------------------------------------------------------
class DependencyGraph(Measure):
    """The dependency graph of a trace or a run (module docstring, docs/critical_path.md): one row per edge.

    Columns (:data:`EDGE_SCHEMA` plus): ``trace_id`` (the trace the edge's time is on: its destination's, or
    for a ``join`` its source's), ``src_trace``/``src_node``/``src_ns``/``src_rank`` and
    ``dst_trace``/``dst_node``/``dst_ns``/``rank``: the edge's two nodes (trace, node number, time, rank;
    collective instances are nodes of the trace :data:`INSTANCE_TRACE`), ``edge`` (its kind), ``segment``,
    ``name``, ``category``, ``event_id`` (what the time between the two nodes is: the event that owns it),
    ``pid``/``tid`` or ``device_id``/``stream_id`` (its lane), ``inferred``; ``gap_ns`` = dst − src time;
    ``critical`` (the edge is its destination's last-arriving dependency, the one a critical path follows:
    the in-edge whose source happened last; inferred edges exist only where a thread or stream waited for
    something the trace does not name, so they are taken only when they are the last to arrive); ``weight_ns``
    (what a replay adds to the source's time: ``gap_ns`` on critical edges, on the others the least of ``gap_ns``
    and the median ``gap_ns`` of the critical edges of that edge and segment kind on its trace);
    ``offset_ns`` (how far the destination's rank clock was moved). Edges whose source is later than their
    destination (clocks of two ranks) are left out. With ``align_clocks`` (ranks on several hosts) each rank's
    times are moved by its :func:`traceparse.measures.comm.clock_offsets` (all ranks leave a collective together)
    and ``offset_ns`` says by how much: a step window of that rank moves by as much.

    Part: each trace's own edges (:func:`trace_edges`, every trace of the partition in one pass) and its
    collective calls; combine: the collectives
    matched across ranks (:func:`traceparse.measures.comm.completions`) as ``enqueue``/``join``/``leave``
    edges, and the choice of each node's critical edge. Valid partitions: trace (rank).
    """

    name = "dependency_graph"
    partitions = ("trace_id", "rank")
    large = True  # two edges or more per event, asked by one rule: not kept past it on a large table

    def part(self, events: pl.DataFrame, min_wait_ns: int = MIN_WAIT_NS, max_wake_ns: int = MAX_WAKE_NS,
             align_clocks: bool = False) -> pl.DataFrame:
        schema = {"edges": pl.List(pl.Struct(EDGE_SCHEMA)), "comm": pl.List(pl.Struct(_COMM_SCHEMA))}
        if events.height == 0:
            return pl.DataFrame(schema=schema)
        edges, comm = self._own(events, min_wait_ns, max_wake_ns)
        return pl.DataFrame([edges.to_struct("edges").implode(), comm.to_struct("comm").implode()]).cast(schema)

    @staticmethod
    def _own(events: pl.DataFrame, min_wait_ns: int, max_wake_ns: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The traces' own edges and their collective calls: every trace of ``events`` at once (a group of a run's
        small ranks: one pass, not one per rank)."""
        edges = trace_edges(events, min_wait_ns, max_wake_ns)
        comm = collectives.part(events).select(list(_COMM_SCHEMA)).cast(_COMM_SCHEMA)
        return edges, comm

    @classmethod
    def _own_of_group(cls, events: pl.DataFrame, min_wait_ns: int, max_wake_ns: int):
        """:meth:`_own` of a group of a run's ranks, None for a group of no rows (as :meth:`part` gives no part)."""
        return cls._own(events, min_wait_ns, max_wake_ns) if events.height else None

    def _measure(self, events: pl.DataFrame, params: dict) -> pl.DataFrame:
        """The whole table's graph; in memory (not a run read rank by rank) without packing the edges into one
        row of lists and out again, as ``combine([part(events)])`` would: the same frame, 1.23 → 1.12 CPU s on the
        139 MB benchmark trace, and a copy of the edges less in memory while it is built. Refused
        (:func:`check_graph_memory`) where it would not fit in the memory free."""
        own = self._gathered(events, params)
        if own is None:
            return super()._measure(events, params)
        return self._graph(own.pop(0), own.pop(0), params.get("align_clocks", False))  # the list holds neither

    def _gathered(self, events: pl.DataFrame, params: dict) -> list[pl.DataFrame] | None:
        """``[edges, comm]``: every trace's own edges and collective calls, built here (:meth:`_own`), in a list
        the caller empties (so that only the graph's builder holds them), or None where the measure's parts and
        combine build them (a run on a cluster, no rows). Refused (:func:`check_graph_memory`) where the
        graph would not fit in the memory free."""
        check_graph_memory(events)
        wait, wake = params.get("min_wait_ns", MIN_WAIT_NS), params.get("max_wake_ns", MAX_WAKE_NS)
        if isinstance(events, PartitionedEvents) and events.executor is None and events.paths:
            # a run read here, group by group: each group's edges as they are, concatenated once (packed into a
            # row of lists, as a part sent from a Dask worker must be, they were copied twice more, and every
            # rank's packed part was still held while the graph was built: 2.6 -> 2.0 GB for 8 ranks of 140 MB)
            edges, comm = [], []
            for own in events.map(self._own_of_group, wait, wake, threads=_threads()):
                if own is not None:
                    edges.append(own[0])
                    comm.append(own[1])
            if not edges:
                return None
            return [_concat_cleared(edges), _concat_cleared(comm)]
        if isinstance(events, PartitionedEvents) or events.height == 0:
            return None
        return list(self._own(events, wait, wake))

    def unchosen(self, events: pl.DataFrame, min_wait_ns: int = MIN_WAIT_NS, max_wake_ns: int = MAX_WAKE_NS,
                 align_clocks: bool = False) -> pl.DataFrame | None:
        """The graph's edges (:data:`EDGE_SCHEMA` and ``offset_ns``) before any is chosen: in the order they were
        built, without ``trace_id``, ``gap_ns``, ``critical`` or ``weight_ns``; :meth:`chosen` of them is the
        measure. For a caller that walks the paths and needs neither the sorted graph nor a replay's weights
        (:func:`traceparse.measures.path_direct.direct_critical_paths`). None where the measure's parts build
        the graph (a run on a cluster, no rows): ask the measure itself. Not shared (:func:`sharing`)."""
        own = self._gathered(events, {"min_wait_ns": min_wait_ns, "max_wake_ns": max_wake_ns})
        return None if own is None else self._placed(own.pop(0), own.pop(0), align_clocks)

    @staticmethod
    def chosen(edges: pl.DataFrame) -> pl.DataFrame:
        """The measure's graph from :meth:`unchosen`'s edges (each node's critical edge chosen, sorted)."""
        held = [edges]
        del edges
        out = _choose_critical(held)
        trace = pl.when(pl.col("dst_trace") == INSTANCE_TRACE).then(pl.col("src_trace")).otherwise(pl.col("dst_trace"))
        return out.select(trace.alias("trace_id"), pl.all())

    def combine(self, parts: list[pl.DataFrame], min_wait_ns: int = MIN_WAIT_NS, max_wake_ns: int = MAX_WAKE_NS,
                align_clocks: bool = False) -> pl.DataFrame:
        every = pl.concat(parts) if parts else self.part(pl.DataFrame())
        return self._graph(_unnest(every, "edges", EDGE_SCHEMA), _unnest(every, "comm", _COMM_SCHEMA), align_clocks)

    @staticmethod
    def _graph(edges: pl.DataFrame, comm: pl.DataFrame, align_clocks: bool) -> pl.DataFrame:
        """The graph from every trace's own edges and collective calls: the collectives across ranks placed, each
        node's critical edge chosen."""
        held = [DependencyGraph._placed(edges, comm, align_clocks)]
        del edges  # choose_critical's the only reference: it lets each column go once sorted
        return DependencyGraph.chosen(held.pop())

    @staticmethod
    def _placed(edges: pl.DataFrame, comm: pl.DataFrame, align_clocks: bool) -> pl.DataFrame:
        """Every trace's own edges and the collectives' edges across ranks (clocks aligned with
        ``align_clocks``), with ``offset_ns``; edges that would run backwards in time left out."""
        by: dict[int, int] = {}
        if align_clocks and comm.height:
            offsets = clock_offsets([comm])
            by = {m: o for m, o in zip(offsets["member"].to_list(), offsets["offset_ns"].to_list()) if m is not None}
        if by:  # every rank's own times on the first rank's clock, before the collectives are placed
            edges = edges.with_columns(
                src_ns=pl.col("src_ns") - pl.col("src_rank").replace_strict(by, default=0, return_dtype=pl.Int64),
                dst_ns=pl.col("dst_ns") - pl.col("rank").replace_strict(by, default=0, return_dtype=pl.Int64))
            moved = pl.col("rank").replace_strict(by, default=0, return_dtype=pl.Int64)
            comm = comm.with_columns(_o=moved).with_columns(
                start_ns=pl.col("start_ns") - pl.col("_o"), end_ns=pl.col("end_ns") - pl.col("_o")).drop("_o")
        edges = pl.concat([edges, collective_edges(comm, edges)])
        return edges.filter(pl.col("src_ns") <= pl.col("dst_ns")).with_columns(
            offset_ns=pl.col("rank").replace_strict(by, default=0, return_dtype=pl.Int64) if by
            else pl.lit(0, dtype=pl.Int64))


#: The memory the whole graph of a table takes while it is built, per row of the table, above the table itself:
#: 650 to 750 bytes measured (``analyze --rule critical-path`` against ``--rule memory``, peak resident memory) on
#: runs of 64 and 256 generated ranks and on 8 ranks of the 139 MB benchmark trace.
GRAPH_BYTES_PER_ROW = 800


def check_graph_memory(events) -> None:
    """Raise :class:`~traceparse.errors.ResourceError` where the whole graph of ``events`` would take more memory
    than this process could still take (:func:`traceparse.cores.available_memory`): a run's critical path is one
    graph of every rank (a large trace's alone is found a group of steps at a time), and a run of 64 ranks of
    300,000 events would need some 15 GB: said before, not killed by the system after."""
    rows = table_rows(events)
    needed = rows * GRAPH_BYTES_PER_ROW
    free = available_memory()
    if free is not None and needed > free:
        raise ResourceError(
            f"the critical path's graph of {rows:,} events would take about {fmt_bytes(needed)} of memory, more "
            f"than the {fmt_bytes(free)} this machine has free")


def _threads() -> int:
    """Groups of a run whose edges are built at once: two where this process may use two cores or more."""
    return min(2, usable_cores())


def _concat_cleared(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """``frames`` concatenated (their chunks, not copied), the list emptied: the caller holds no frame of it."""
    out = pl.concat(frames, how="vertical")
    frames.clear()
    return out


def _unnest(frame: pl.DataFrame, column: str, schema: dict) -> pl.DataFrame:
    if frame.height == 0:
        return pl.DataFrame(schema=schema)
    out = frame.select(column).explode(column).filter(pl.col(column).is_not_null()).unnest(column)
    return out if out.height else pl.DataFrame(schema=schema)


def collective_edges(comm: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """The ``enqueue``, ``join`` and ``leave`` edges of the collective calls ``comm`` (:class:`Collectives` parts of
    every member), given the members' own ``edges``: one node per instance with two members or more, at the last
    member's joining.

    A member joins at the start of the event taking part (:func:`traceparse.measures.comm.completions`) and
    leaves where that event stops waiting: a kernel at its end; a host annotation or call at the first point
    inside it, after the last member joined, that ends its own time (the start of the first child event after
    the wait, such as gloo's copy of the result, else its end)."""
    done = completions([comm]) if comm.height else pl.DataFrame()
    if done.height == 0:
        return _empty_edges()
    inst = ["process_group", "instance"]
    done = done.with_columns(members=pl.len().over(inst), last_ns=pl.col("join_ns").max().over(inst))
    done = done.filter(pl.col("members") > 1)
    if done.height == 0:
        return _empty_edges()
    ids = done.select(inst).unique(maintain_order=True).with_row_index("k").with_columns(
        node=-(pl.col("k").cast(pl.Int64) + 1))
    done = done.join(ids.drop("k"), on=inst, how="left", nulls_equal=True)
    done = done.with_columns(leave_node=2 * pl.col("done_event_id") + 1, leave_ns=pl.col("done_ns"))
    own = edges.filter((pl.col("edge") == "thread") & pl.col("event_id").is_not_null()).select(
        trace_id="dst_trace", done_event_id="event_id", own_node="dst_node", own_ns="dst_ns")
    host = done.filter(pl.col("done_source") != "kernel").select("trace_id", "done_event_id", "last_ns", *inst)
    if host.height and own.height:
        first = (host.join(own, on=["trace_id", "done_event_id"], how="inner")
                 .filter(pl.col("own_ns") >= pl.col("last_ns"))
                 .sort("own_ns").group_by([*inst, "trace_id", "done_event_id"], maintain_order=True).first())
        done = done.join(first.select(*inst, "trace_id", "done_event_id", "own_node", "own_ns"),
                         on=[*inst, "trace_id", "done_event_id"], how="left", nulls_equal=True).with_columns(
            leave_node=pl.coalesce("own_node", "leave_node"), leave_ns=pl.coalesce("own_ns", "leave_ns"))
    member_lane = {"rank": pl.col("rank"), "device_id": pl.col("device_id"), "tid": pl.col("done_tid"),
                   "stream_id": pl.col("done_stream_id")}
    join = done.select(src_trace="trace_id", src_node=2 * pl.col("done_event_id"), src_ns="join_ns",
                       src_rank="rank", dst_trace=pl.lit(INSTANCE_TRACE), dst_node="node", dst_ns="last_ns",
                       segment=pl.lit("join"), name="done_name", category="collective", event_id="done_event_id",
                       **member_lane)
    leave = done.filter(pl.col("leave_ns") >= pl.col("last_ns")).select(
        src_trace=pl.lit(INSTANCE_TRACE), src_node="node", src_ns="last_ns", src_rank=pl.lit(None, dtype=pl.Int32),
        dst_trace="trace_id", dst_node="leave_node", dst_ns="leave_ns", segment=pl.lit("communication"),
        name="done_name", category="collective", event_id="done_event_id", **member_lane)
    handed = done.filter((pl.col("done_source") == "host annotation") & (pl.col("done_event_id") != pl.col("event_id"))
                         & (pl.col("arrival_ns") <= pl.col("join_ns")))
    enqueue = handed.select(src_trace="trace_id", src_node=2 * pl.col("event_id"), src_ns="arrival_ns", src_rank="rank",
                            dst_trace="trace_id", dst_node=2 * pl.col("done_event_id"), dst_ns="join_ns",
                            segment=pl.lit("communication"), name="name", category=pl.lit("enqueue"),
                            event_id="event_id", **member_lane)

    def typed(frame: pl.DataFrame, edge: str) -> pl.DataFrame:
        return frame.with_columns(edge=pl.lit(edge), inferred=pl.lit(False)).select(
            [pl.col(c).cast(t) if c in frame.columns or c in ("edge", "inferred") else pl.lit(None, dtype=t).alias(c)
             for c, t in EDGE_SCHEMA.items()])

    return pl.concat([typed(join, "join"), typed(leave, "leave"), typed(enqueue, "enqueue")])


def shared_instances(events: pl.DataFrame) -> int:
    """How many collective instances of ``events`` have two members or more: each is a node of the graph that
    joins its members' paths (one process driving two GPUs has them within one trace)."""
    comm = collectives.part(events).select(list(_COMM_SCHEMA)).cast(_COMM_SCHEMA)
    return collective_edges(comm, _empty_edges()).filter(pl.col("edge") == "join")["dst_node"].n_unique()


class _Keys:
    """A node (trace, number) of an edge frame as one int64 (``trace code × width + number − smallest``), so that
    sorts, joins and look-ups run on one integer column, not on (string, int) pairs: codes follow the trace ids'
    order, a null trace first (``nulls_last=False``) or last, as the sorts they stand for put them. Its expressions
    are over the frame it was made from."""

    def __init__(self, frame: pl.DataFrame, nulls_last: bool):
        only = {end: _only_text(frame[f"{end}_trace"]) for end in ("src", "dst")}
        ends = pl.concat([pl.Series([text], dtype=pl.String) if text is not None else frame[f"{end}_trace"].unique()
                          for end, text in only.items()])  # each end's few, not both ends' every row
        traces = ends.drop_nulls().unique().sort().to_list()
        first = 0 if nulls_last else 1
        self.codes = {t: first + i for i, t in enumerate(traces)}
        self.null_code = len(traces) if nulls_last else 0
        self.traces = len(traces)
        # an end of one trace on every row (one trace's graph): its code, not a look-up per row
        self._only = {end: self.codes[text] for end, text in only.items() if text is not None}
        ends = [frame[c] for c in ("src_node", "dst_node")]
        self.low = min((e.min() for e in ends if e.null_count() < e.len()), default=0)
        self.width = max((e.max() for e in ends if e.null_count() < e.len()), default=0) - self.low + 1
        if (self.traces + 1) * self.width >= 2 ** 62:  # event ids are row numbers: never near this
            raise ValueError("critical path: too many nodes to number")

    def code(self, end: str) -> pl.Expr:
        """The code of the ``src`` or ``dst`` trace."""
        if end in self._only:
            return pl.lit(self._only[end], dtype=pl.Int64)
        return (pl.col(f"{end}_trace").replace_strict(self.codes, default=None, return_dtype=pl.Int64)
                .fill_null(self.null_code))

    def key(self, end: str) -> pl.Expr:
        """The key of the ``src`` or ``dst`` node."""
        return self.code(end) * self.width + (pl.col(f"{end}_node") - self.low)


def _only_text(column: pl.Series) -> str | None:
    """The text every row of ``column`` holds, else None (none, nulls, or two texts): found by comparing every row
    with the first, not by a hash of every row."""
    if column.len() == 0 or column.null_count():
        return None
    first = column[0]
    return first if (column == first).all() else None


def choose_critical(edges: pl.DataFrame) -> pl.DataFrame:
    """``edges`` with ``gap_ns``, ``critical`` and ``weight_ns`` (see :class:`DependencyGraph`), sorted.

    Each destination's critical in-edge is the explicit one whose source happened last (ties: edge kind in
    :data:`EDGE_KINDS` order, then source trace and node), unless an inferred one's source happened later still.
    Destinations and sources are one integer each (:class:`_Keys`); the edges sorted by destination (the order
    returned), each destination's choice is a segmented maximum (:func:`_critical_in_order`)."""
    return _choose_critical([edges])


def _choose_critical(held: list[pl.DataFrame]) -> pl.DataFrame:
    """:func:`choose_critical` of the one frame in ``held``, taken out of it: where the caller keeps no other
    reference, each column of the edges is let go as soon as it is sorted (the graph is not twice in memory)."""
    edges = held.pop().with_columns(gap_ns=pl.col("dst_ns") - pl.col("src_ns"))
    if edges.height == 0:
        return edges.with_columns(critical=pl.lit(False), weight_ns=pl.col("gap_ns"))
    keys = _Keys(edges, nulls_last=True)
    order = pl.col("edge").to_physical().cast(pl.Int32)  # the enum's index: its place in EDGE_KINDS
    alphabet = order.replace_strict({i: sorted(EDGE_KINDS).index(k) for i, k in enumerate(EDGE_KINDS)},
                                    return_dtype=pl.Int32)
    # the few columns the choice needs (the wide rows are gathered once, at the end)
    narrow = edges.select(_d=keys.key("dst"), _s=keys.key("src"), _o=order, _e=alphabet, src_ns="src_ns",
                          inferred="inferred", _known=pl.col("src_trace").is_not_null())
    final = expr.sort_rows(narrow.select("_d", "_s", "_e").with_row_index("_row"), ["_d", "_s", "_e"],
                           nulls_last=True, lexsort=True)["_row"]
    critical = _critical_in_order(narrow, final.to_numpy())
    if critical is None:
        critical = _critical_ranked(narrow)
    # a null source trace is never chosen: as the comparison of two null trace ids, which is null
    critical &= narrow["_known"].to_numpy()
    # each (trace, edge, segment) kind's median critical gap, as one number per triple
    # per trace: one trace's weights do not depend on the other traces in the table
    # a number per segment kind and per trace (any one-to-one numbering groups alike; a dense rank sorts 600,000
    # texts): the trace's code of the keys
    segment = pl.col("segment").to_physical().cast(pl.Int64) + 1
    pair = edges.select(_o=order, _g=segment.fill_null(0), _t=keys.code("dst")).select(
        _p=(pl.col("_t").cast(pl.Int64) * (len(EDGE_KINDS) + 1) + pl.col("_o").cast(pl.Int64)) * (edges.height + 1)
        + pl.col("_g").cast(pl.Int64))
    leave = (narrow["_o"] == EDGE_KINDS.index("leave")).to_numpy()
    gaps = pl.DataFrame({"_p": pair["_p"], "gap_ns": edges["gap_ns"], "critical": critical, "_leave": leave})
    typical = (gaps.filter(pl.col("critical")).group_by("_p")
               .agg(_typical=pl.col("gap_ns").median().round(0).cast(pl.Int64)))
    # a member's leaving of a collective it joined last is its own time after the last joining: a rank last at
    # every collective has no critical leave edge to take a typical one from, and weighed 0 its kernels ended the
    # moment another rank joined later in a replay
    weight = pl.when(pl.col("critical")).then(pl.col("gap_ns")).when(
        pl.col("_leave") & pl.col("_typical").is_null()).then(pl.col("gap_ns")).otherwise(
        pl.min_horizontal(pl.col("gap_ns"), pl.col("_typical").fill_null(0)))
    gaps = gaps.join(typical, on="_p", how="left", maintain_order="left").with_columns(weight_ns=weight)
    gaps = gaps.select(pl.col("critical", "weight_ns").gather(final))
    del narrow, pair, typical
    # the rows in their new order a column at a time, each column let go once gathered (where the caller holds no
    # other reference to the frame): the graph is not twice in memory at the end
    sorted_columns = []
    for name in edges.columns:
        column = edges.get_column(name)
        sorted_columns.append(_permuted(column, final) if name in _UNIFORM else column.gather(final))
        edges = edges.drop(name)
    return pl.concat([pl.DataFrame(sorted_columns), gaps], how="horizontal")


#: The graph's columns that hold one value on every row of a trace's graph: the only ones worth testing for it
#: before they are put in order (each test is a pass over the column; on a run's graph none holds one value).
_UNIFORM = ("src_trace", "dst_trace", "src_rank", "rank", "offset_ns")


def _permuted(column: pl.Series, order: pl.Series) -> pl.Series:
    """``column`` at ``order``, a permutation of its rows: the column itself where every row holds one value (a
    trace's graph: its trace id at both ends, its rank, no clock moved), as gathering it would give."""
    nulls = column.null_count()
    if nulls == column.len():
        return column
    if not nulls and column.dtype == pl.String and _only_text(column) is not None:
        return column
    if not nulls and (column.dtype.is_integer() or column.dtype == pl.Boolean) and column.min() == column.max():
        return column
    return column.gather(order)


def _critical_in_order(narrow: pl.DataFrame, final: np.ndarray) -> np.ndarray | None:
    """Whether each edge of ``narrow`` (:func:`choose_critical`'s narrow columns) is its destination's critical
    in-edge, from ``final`` (its rows in destination order): each destination's best explicit and best inferred
    in-edge are segmented maxima of one packed int64 (source time, then edge kind, then source, each offset so
    that larger is preferred), not a sort of every edge by five keys. None where the three do not fit in 62
    bits together (a trace spanning days) or a key is null: then :func:`_critical_ranked` does it."""
    cols = {c: narrow[c] for c in ("_d", "_s", "_o", "src_ns")}
    if any(c.null_count() for c in cols.values()):
        return None
    d, s, o, t = (cols[c].to_numpy()[final] for c in ("_d", "_s", "_o", "src_ns"))
    packing = pack_preference(t, o, s)  # t is a copy (the gather): packed in place
    if packing is None:
        return None
    packed, layout = packing
    inferred = narrow["inferred"].to_numpy()[final]
    first = np.flatnonzero(np.concatenate([[True], d[1:] != d[:-1]]))
    best_explicit = np.maximum.reduceat(np.where(inferred, -1, packed), first)
    best_inferred = np.maximum.reduceat(np.where(inferred, packed, -1), first)
    c_s, c_o = chosen_edge(best_explicit, best_inferred, layout)
    runs = np.diff(np.append(first, len(d)))
    critical = np.empty(len(d), dtype=bool)
    critical[final] = (s == np.repeat(c_s, runs)) & (o == np.repeat(c_o, runs))
    return critical


#: How :func:`pack_preference` placed an edge's parts in its number: the edge kind's and source's bits, and the
#: largest edge kind and source (each is stored as largest − value, so that larger numbers are preferred).
Layout = tuple[int, int, int, int]


def pack_preference(t: np.ndarray, o: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, Layout] | None:
    """Each edge's preference as its destination's critical in-edge in one int64, larger preferred: its source
    time since the first (``t``, changed in place into the packed numbers: each temporary here is 8 bytes an
    edge of fresh memory), then its edge kind (``o``, its place in :data:`EDGE_KINDS`, the first preferred),
    then its source (``s``, the least preferred); None where the three do not fit in 62 bits together (a trace
    spanning days)."""
    t -= t.min()
    o_high, s_high = int(o.max()), int(s.max())
    b_o, b_s = (o_high - int(o.min())).bit_length(), (s_high - int(s.min())).bit_length()
    if int(t.max()).bit_length() + b_o + b_s > 62:
        return None
    packed = t
    packed <<= b_o + b_s
    kind = o.astype(np.int64)
    np.subtract(o_high, kind, out=kind)
    kind <<= b_s
    packed |= kind
    del kind
    packed |= s_high - s
    return packed, (b_o, b_s, o_high, s_high)


def chosen_edge(best_explicit: np.ndarray, best_inferred: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """The source and edge kind of each destination's critical in-edge, from its best explicit and best inferred
    in-edge's packed numbers (:func:`pack_preference`; -1: none): an inferred edge only where its source happened
    later than the explicit one's, or there is none."""
    b_o, b_s, o_high, s_high = layout
    later = (best_inferred >> (b_o + b_s)) > (best_explicit >> (b_o + b_s))
    chosen = np.where((best_inferred >= 0) & ((best_explicit < 0) | later), best_inferred, best_explicit)
    return s_high - (chosen & ((1 << b_s) - 1)), o_high - ((chosen >> b_s) & ((1 << b_o) - 1))


def _critical_ranked(narrow: pl.DataFrame) -> np.ndarray:
    """:func:`_critical_in_order`'s answer by a sort of every edge by destination, kind of edge (explicit first),
    source time (latest first), edge kind and source: each destination's first explicit and first inferred edge
    are group heads."""
    ranked = expr.sort_rows(narrow.select("_d", "_s", "_o", "src_ns", "inferred").with_row_index("_row"),
                            ["_d", "inferred", "src_ns", "_o", "_s"], descending=[False, False, True, False, False],
                            lexsort=True)
    # per destination, its first explicit edge, then its first inferred one (at most one row each)
    head = ((pl.col("_d") != pl.col("_d").shift(1)) | (pl.col("inferred") != pl.col("inferred").shift(1))
            ).fill_null(True)
    heads = ranked.filter(head)
    later = ((pl.col("_d") == pl.col("_d").shift(-1)) & pl.col("src_ns").shift(-1).gt(pl.col("src_ns"))).fill_null(False)
    chosen = (heads.with_columns(_later=later, n_s=pl.col("_s").shift(-1), n_o=pl.col("_o").shift(-1))
              .filter((pl.col("_d") != pl.col("_d").shift(1)).fill_null(True))  # one row per destination
              .select(c_s=pl.when(pl.col("_later")).then(pl.col("n_s")).otherwise(pl.col("_s")),
                      c_o=pl.when(pl.col("_later")).then(pl.col("n_o")).otherwise(pl.col("_o"))))
    # every edge beside its destination's choice: ranked and chosen list the destinations in one order
    runs = ranked["_d"].rle().struct.field("len").to_numpy()
    c_s, c_o = (np.repeat(chosen[c].to_numpy(), runs) for c in ("c_s", "c_o"))
    mine = (ranked["_s"].to_numpy() == c_s) & (ranked["_o"].to_numpy() == c_o)
    critical = np.empty(narrow.height, dtype=bool)
    critical[ranked["_row"].to_numpy()] = mine
    return critical


dependency_graph = DependencyGraph()


# -- what a trace can give ------------------------------------------------------------------------------------------
def edge_coverage(events: pl.DataFrame) -> dict[str, int]:
    """Counts of the rows the graph's edges come from, for saying what a trace cannot give (the critical-path rule
    and whatif word it each their way): ``host`` (timed host events with a process), ``threads`` (those with a
    thread), ``api`` (runtime calls), ``ops`` (operators that are not communication), ``gpu`` (timed GPU work),
    ``regions`` (timed host regions: Python frames, a generic Chrome trace's slices).
    Operator names are classified once each (communication or not), not once per row, and only the operators'
    rows are grouped by name (the counts of the rest are sums over the table)."""
    host = (pl.col("pid").is_not_null() & expr.kind_is("op", "marker", "api", "region")
            & pl.col("start_ns").is_not_null())
    row = events.lazy().select(
        host=host.sum(), threads=(host & pl.col("tid").is_not_null()).sum(), api=expr.kind_is("api").sum(),
        gpu=(expr.kind_is(*expr.GPU_KINDS) & pl.col("start_ns").is_not_null()).sum(),
        regions=(host & expr.kind_is("region")).sum()).collect().row(0, named=True)
    counts = events.lazy().filter(expr.kind_is("op")).group_by(
        name=pl.when(pl.col("collective").is_null()).then(pl.col("name")), collective="collective").agg(
        rows=pl.len()).collect()
    ops = ~expr.is_communication() & (pl.col("name").fill_null("") != "record_param_comms")
    row["ops"] = counts.select(pl.col("rows").filter(ops).sum()).item()
    return {k: int(v or 0) for k, v in row.items()}


# -- the critical path of each step --------------------------------------------------------------------------------
SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "index": pl.Int64, "segment_trace": pl.String,
    "segment_rank": pl.Int32, "edge": pl.String, "segment": pl.String, "name": pl.String, "category": pl.String,
    "event_id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "device_id": pl.Int32, "stream_id": pl.Int64,
    "inferred": pl.Boolean, "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
    "src_trace": pl.String, "src_node": pl.Int64, "dst_trace": pl.String, "dst_node": pl.Int64,
}
PATH_SCHEMA: dict[str, pl.DataType] = {
    "trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
    "step_ns": pl.Int64, "length_ns": pl.Int64, "unexplained_ns": pl.Int64, "segments": pl.Int64,
}


def _dense(keys: np.ndarray, n: int) -> bool:
    """Whether non-negative ``keys`` span few enough values that an array over them costs at most twice what ``n``
    items do (a graph's nodes: numbered by event, about half as many as the edges' two ends)."""
    return int(keys.min()) >= 0 and int(keys.max()) < 2 * n + (1 << 16)


def _first_seen(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True)``: the distinct keys, sorted, and the index of each one's first
    appearance. Keys dense enough (:func:`_dense`) are counted in an array over their range instead of sorted
    stably (the 1.3 million keys of the 139 MB trace's graph: 36 -> 6 ms)."""
    n = len(keys)
    if n == 0 or not _dense(keys, n):
        return np.unique(keys, return_index=True)
    first = np.full(int(keys.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, keys, np.arange(n, dtype=np.int64))
    distinct = np.flatnonzero(first < n)
    return distinct.astype(keys.dtype, copy=False), first[distinct]


def _node_order(code: np.ndarray, at: np.ndarray, host: np.ndarray, number: np.ndarray) -> np.ndarray:
    """``np.lexsort((number, host, at, code))`` of nodes already in (code, number) order: one stable sort of the
    code, the time since the trace's first node and the host flag packed in an int64 where they fit (the
    4.6 million nodes of 256 ranks: 1.1 s -> 0.2 s), else the lexsort itself (clocks hours or years apart)."""
    n = len(code)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], code[1:] != code[:-1]]))
    low = np.minimum.reduceat(at, starts)
    if int(at.max()) - int(low.min()) < 1 << 62:  # no int64 difference below wraps
        since = at - np.repeat(low, np.diff(np.append(starts, n)))
        time_bits = max(int(since.max()).bit_length(), 1)
        if int(code.max()).bit_length() + time_bits + 1 <= 62:
            return np.argsort((code.astype(np.int64) << (time_bits + 1)) | (since << 1) | host.astype(np.int64),
                              kind="stable")
    return np.lexsort((number, host, at, code))


class _Nodes:
    """Every node of a graph once, numbered in order per trace (by trace id, nulls first; then time, GPU before
    host, node number), with numpy arrays only: ``times`` (each node's time, from its first appearance as an
    edge's source, else destination, with ``host`` from that edge), :meth:`ids` and :meth:`span`.

    A node is one int64 (:class:`_Keys`): unique, sort and look-up on integers, not on (string, int) pairs (a
    graph of 600,000 edges: 0.1 s instead of 0.5 s)."""

    def __init__(self, graph: pl.DataFrame):
        self.of = _Keys(graph, nulls_last=False)
        width = self.of.width
        on_host = graph["tid"].is_not_null().to_numpy()
        self._edges = graph.height
        # every edge's source key, then every edge's destination key: kept, for :meth:`ids_at`
        self._ends = keys = np.concatenate([self._keys(graph, "src"), self._keys(graph, "dst")])
        at = np.concatenate([graph["src_ns"].to_numpy(), graph["dst_ns"].to_numpy()])
        host = np.concatenate([on_host, on_host])
        self.keys, first = _first_seen(keys)  # sorted keys; each one's first appearance
        code = self.keys // width
        number = self.keys % width
        order = _node_order(code, at[first], host[first], number)  # trace, time, GPU before host, node
        self.rank = np.empty(len(order), dtype=np.int64)
        self.rank[order] = np.arange(len(order), dtype=np.int64)
        self.times = at[first][order]
        self.starts = np.searchsorted(code[order], np.arange(self.of.traces + 2), side="left")
        # keys as dense as their number: a node's number by its key in one look-up, not a binary search
        self._number = None
        if len(self.keys) and _dense(self.keys, len(keys)):
            self._number = np.full(int(self.keys[-1]) + 1, -1, dtype=np.int64)
            self._number[self.keys] = self.rank

    def _keys(self, frame: pl.DataFrame, end: str) -> np.ndarray:
        return frame.select(self.of.key(end)).to_series().to_numpy()

    def ids_at(self, rows: np.ndarray, end: str) -> np.ndarray:
        """The numbers of the ``src`` or ``dst`` nodes of the graph's edges ``rows`` (positions): their keys kept
        from the graph, not made again from their trace ids (a text look-up per edge)."""
        keys = self._ends[rows if end == "src" else rows + self._edges]
        if self._number is not None:
            return self._number[keys]
        return self.rank[np.searchsorted(self.keys, keys)]

    def span(self, trace: str | None) -> tuple[int, int]:
        """``[first, stop)``: the numbers of ``trace``'s nodes."""
        code = self.of.null_code if trace is None else self.of.codes.get(trace)
        if code is None:
            return 0, 0
        return int(self.starts[code]), int(self.starts[code + 1])


def critical_paths(graph: pl.DataFrame, windows: pl.DataFrame, texts: pl.DataType = pl.String,
                   columns: Iterable[str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The critical path of each window (a step of a trace or rank), from the graph of :data:`dependency_graph`.

    ``windows``: ``trace_id``, ``step``, ``start_ns``, ``end_ns`` (on the graph's clock). The path starts at the
    trace's last node at or before the window's end (the step annotation's end, where there is one), follows each
    node's critical edge backwards, and stops at the window's start (the segment that crosses it is cut there) or
    at a node with no edge into it. Returns ``(paths, segments)``: per window ``length_ns`` (Σ of its segments),
    ``step_ns`` (the window), ``unexplained_ns`` = step − length (time before the first node the path reached),
    ``segments`` (their number); and the segments, last first (``index`` 0 ends at the step's end), each with the
    edge it follows (its two nodes) and what the time is (:data:`SEGMENT_SCHEMA`; ``segment_rank`` is the rank it
    runs on, which differs from the window's ``rank`` where the path crossed to another rank at a collective).
    ``texts=pl.Categorical`` gives the text columns as categoricals: a caller that groups half a million segments
    by name gets them without a round trip through text (the edges' names are categoricals already).
    ``columns``: only these of the segments' columns (in :data:`SEGMENT_SCHEMA`'s order), for a caller that reads a
    few of millions of segments' (only what they are made of is gathered).
    """
    # the critical edges' ends only (their wide columns are gathered for the walked ones alone, at the end: a copy
    # of every critical edge's 18 columns was 0.7 GB of 8 ranks of 140 MB)
    rows = graph.select(pl.col("critical").arg_true()).to_series()
    critical_rows = rows.to_numpy()
    nodes = _Nodes(graph)
    # each node's critical in-edge (the row of the critical edges; of two, the later row, as a dict keeps), -1 for
    # none
    into = np.full(len(nodes.times), -1, dtype=np.int64)
    into[nodes.ids_at(critical_rows, "dst")] = np.arange(len(critical_rows), dtype=np.int64)
    src_id = np.asarray(nodes.ids_at(critical_rows, "src"), dtype=np.int64)
    src_ns = np.asarray(graph["src_ns"].to_numpy()[critical_rows], dtype=np.int64)  # never null: src <= dst
    times = nodes.times
    windows, bounds = path_bounds(windows)
    # each window's last node: the trace's last node at or before the window's end (-1: none)
    start = np.full(bounds.height, -1, dtype=np.int64)
    for w, (trace, w_end) in enumerate(zip(bounds["trace_id"].to_list(), bounds["end_ns"].to_list())):
        lo, hi = nodes.span(trace)
        at = lo + int(np.searchsorted(times[lo:hi], w_end, side="right")) - 1
        if at >= lo:
            start[w] = at
    last = np.where(start >= 0, times[np.maximum(start, 0)] if len(times) else 0, 0).astype(np.int64)
    # the walks backwards, each node's critical edge in turn (the path's segments are then gathered from the graph
    # in one query, not built row by row)
    walked, reps, reached = path_walk.walk(into, src_id, src_ns, start, last,
                                           bounds["start_ns"].to_numpy().astype(np.int64))
    return path_frames(graph, windows, bounds, critical_rows[walked], reps, reached, last, texts, columns)


def path_bounds(windows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``windows`` (:func:`critical_paths`') in the paths' order (trace, step), with ``rank``, and their
    ``trace_id``, ``rank``, ``step``, ``start_ns``, ``end_ns``."""
    windows = windows.sort("trace_id", "step", nulls_last=False)
    if "rank" not in windows.columns:
        windows = windows.with_columns(rank=pl.lit(None, dtype=pl.Int32))
    return windows, windows.select("trace_id", "rank", "step", "start_ns", "end_ns")


def path_frames(graph: pl.DataFrame, windows: pl.DataFrame, bounds: pl.DataFrame, walked: np.ndarray,
                reps: np.ndarray, reached: np.ndarray, last: np.ndarray, texts: pl.DataType = pl.String,
                columns: Iterable[str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`critical_paths`' answer from its walks: ``walked`` (the rows of ``graph`` each walk took, one walk
    after the other, as :func:`traceparse.measures.path_walk.walk` gives them), ``reps`` (each window's number of
    them), ``reached`` (the time each walk reached) and ``last`` (the time of each window's last node);
    ``windows`` and ``bounds`` as :func:`path_bounds` gives them."""
    edge_columns = ["src_trace", "src_node", "src_ns", "src_rank", "dst_trace", "dst_node", "dst_ns", "rank", "edge",
                    "segment", "name", "category", "event_id", "pid", "tid", "device_id", "stream_id", "inferred"]
    w_start = bounds["start_ns"].to_numpy().astype(np.int64)
    step_ns = bounds["end_ns"].to_numpy().astype(np.int64) - w_start
    # the segments tile [where the walk stopped, its last node]
    length = np.where(reps > 0, last - np.maximum(reached, w_start), 0)
    paths = bounds.with_columns(
        step_ns=pl.Series(step_ns, dtype=pl.Int64), length_ns=pl.Series(length, dtype=pl.Int64),
        unexplained_ns=pl.Series(step_ns - length, dtype=pl.Int64), segments=pl.Series(reps, dtype=pl.Int64))
    # each segment ends where the next one (walking back) starts; a path's first one at its last node
    first = np.concatenate([[0], np.cumsum(reps)[:-1]]).astype(np.int64) if len(reps) else reps
    ends = np.empty(len(walked), dtype=np.int64)
    if len(walked):
        ends[1:] = graph["src_ns"].to_numpy()[walked[:-1]]
        ends[first[reps > 0]] = last[reps > 0]
    paths = paths.cast(PATH_SCHEMA)
    # the trace ids as ``texts`` from the start (the walked edges' texts made once, not as text first: 4 million
    # segments of 8 ranks of 140 MB)
    per = windows.select(trace_id=pl.col("trace_id").cast(pl.String).cast(texts), w_rank=pl.col("rank").cast(pl.Int32),
                         step=pl.col("step").cast(pl.Int64), w_start=pl.col("start_ns").cast(pl.Int64))
    walked_rows = pl.Series(walked, dtype=pl.Int64)
    made = _segment_columns()
    asked = set(SEGMENT_SCHEMA if columns is None else columns)
    wanted = [c for c in SEGMENT_SCHEMA if c in asked]
    needed = {name for c in wanted for name in made[c][1]}
    segments = pl.concat([
        per.select(pl.all().gather(pl.Series(np.repeat(np.arange(len(reps)), reps), dtype=pl.Int64))),
        pl.DataFrame([_texts_of(graph[c], walked_rows, texts) if c in ("src_trace", "dst_trace", "edge", "segment")
                      else graph[c].gather(walked_rows) for c in edge_columns if c in needed]),
    ], how="horizontal").with_columns(
        index=pl.Series(np.arange(len(walked), dtype=np.int64) - np.repeat(first, reps), dtype=pl.Int64),
        end_ns=pl.Series(ends, dtype=pl.Int64))
    if "src_ns" in needed:
        segments = segments.with_columns(start_ns=pl.max_horizontal("src_ns", "w_start"))
    segments = segments.select(**{c: made[c][0] for c in wanted})
    schema = {c: (texts if t == pl.String else t) for c, t in SEGMENT_SCHEMA.items() if c in wanted}
    return paths, segments.cast(schema)


def _texts_of(column: pl.Series, rows: pl.Series, texts: pl.DataType) -> pl.Series:
    """``column`` (a graph's text or enum column) at ``rows``, as ``texts``: each distinct text made once (the
    enum's few kinds; the one trace id of a trace's graph), not once per row of half a million segments."""
    if texts == pl.String or not (column.dtype == pl.String or isinstance(column.dtype, pl.Enum)):
        return column.gather(rows).cast(texts)
    if isinstance(column.dtype, pl.Enum):  # its kinds as texts, gathered by its codes
        kinds = pl.Series(column.name, column.dtype.categories).cast(texts)
        return kinds.gather(column.gather(rows).to_physical())
    only = _only_text(column)
    if only is None:
        return column.gather(rows).cast(texts)
    return pl.Series(column.name, [only]).cast(texts).gather(pl.zeros(rows.len(), dtype=pl.Int64, eager=True))


def _segment_columns() -> dict[str, tuple[pl.Expr, tuple[str, ...]]]:
    """Each column of :data:`SEGMENT_SCHEMA`: how it is made from the walked edges (and their windows, ``w_*``),
    and which columns of the graph that needs."""
    same = ("edge", "segment", "name", "category", "event_id", "pid", "tid", "device_id", "stream_id", "inferred",
            "src_trace", "src_node", "dst_trace", "dst_node")
    made = {c: (pl.col(c), (c,)) for c in same}
    return {
        **made, "trace_id": (pl.col("trace_id"), ()), "rank": (pl.col("w_rank"), ()), "step": (pl.col("step"), ()),
        "index": (pl.col("index"), ()),
        "segment_trace": (pl.when(pl.col("dst_trace") == INSTANCE_TRACE).then(pl.col("src_trace"))
                          .otherwise(pl.col("dst_trace")), ("src_trace", "dst_trace")),
        "segment_rank": (pl.col("rank"), ("rank",)), "start_ns": (pl.col("start_ns"), ("src_ns",)),
        "end_ns": (pl.col("end_ns"), ()),
        "duration_ns": (pl.col("end_ns") - pl.col("start_ns"), ("src_ns",)),
    }


# -- replay: the graph run forwards -------------------------------------------------------------------------------
def replay(graph: pl.DataFrame, weight: pl.Expr | None = None) -> pl.DataFrame:
    """Every node of ``graph`` (:data:`dependency_graph`) placed again by running the graph forwards.

    A node with no in-edge stays at its measured time; any other is at the latest of its in-edges' source
    time plus their weight: ``weight_ns``, or the expression ``weight`` (over the graph's columns: a what-if
    scales the weights of a kind, e.g. ``pl.when(pl.col("segment") == "kernel").then(pl.col("weight_ns") // 2)
    .otherwise(pl.col("weight_ns"))``). With the measured weights every node lands where it was measured
    (each node's critical edge weighs its measured gap, every other edge at most its gap), so what a changed
    weight moves is the prediction. Nodes are taken in an order where every edge's source comes first
    (edges never run backwards in time; ties by a topological sort). Columns: ``trace``, ``node``,
    ``measured_ns``, ``replayed_ns``.
    """
    from traceparse.measures.replay import replay as run_forwards  # the one replay engine (whatif, predict)

    return run_forwards(graph, weight)
