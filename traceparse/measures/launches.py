"""GPU work linked to the host call that launched it, and why each stream waits between its activities."""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.expr import kind_is
from traceparse.measures.base import Measure, keyed, picked, shared, unkeyed

_SIDE_COLUMNS = ["trace_id", "event_id", "kind", "name", "device_id", "stream_id", "correlation_id", "start_ns",
                 "duration_ns", "tid"]
STREAM = ["trace_id", "device_id", "stream_id"]
#: Default kernel-wait threshold: a gap shorter than this between queued activities is launch overhead.
KERNEL_WAIT_NS = 30_000


def _projection(events: pl.DataFrame, kinds) -> pl.DataFrame:
    """Timed GPU rows of ``kinds`` and timed API rows with a correlation id, with a ``side`` column (shared by the
    measures of one analysis that ask for it: :func:`traceparse.measures.base.shared`)."""
    kinds = tuple(kinds)
    return shared(events, "launch_projection", lambda: _project(events, kinds), kinds)


def _project(events: pl.DataFrame, kinds: tuple) -> pl.DataFrame:
    timed = pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()
    gpu = kind_is(*kinds) & timed
    kind = pl.col("kind").cast(pl.String)
    columns = [pl.col(c) if c != "kind" else kind for c in _SIDE_COLUMNS]
    side = pl.when(gpu).then(pl.lit("gpu")).otherwise(pl.lit("api"))
    if not _uncorrelated(events, kinds):  # the common case: every GPU row has its correlation id
        api = (pl.col("kind") == "api") & timed & pl.col("correlation_id").is_not_null()
        return keyed(picked(events, gpu | api, *columns, side=side))
    api = ((pl.col("kind") == "api") & timed
           & (pl.col("correlation_id").is_not_null() | pl.col("external_id").is_not_null()))
    rows = keyed(picked(events, gpu | api, *columns, "external_id", side=side))
    return _paired_by_external_id(rows).filter(
        (pl.col("side") == "gpu") | pl.col("correlation_id").is_not_null()).drop("external_id")


def _uncorrelated(events: pl.DataFrame, kinds: tuple) -> bool:
    """Whether some timed GPU row of ``kinds`` has no correlation id but an external id (a ROCm build's trace:
    :func:`_paired_by_external_id`); shared, as the projection is."""
    def compute() -> bool:
        gpu = kind_is(*kinds) & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()
        return bool(events.lazy().select(
            (gpu & pl.col("correlation_id").is_null() & pl.col("external_id").is_not_null()).any()).collect().item())

    return shared(events, "launch_uncorrelated", compute, kinds)


def _covering(events: pl.DataFrame, kinds) -> tuple:
    """The kinds whose projection to link for the activities of ``kinds``: :data:`traceparse.expr.GPU_KINDS` where
    ``kinds`` are some of them and every one's rows are linked by correlation id alone (then the links of
    ``kinds``' rows are those of the GPU activities, and launch-stats' kernels share gpu-idle's link, 45 ms on
    the 139 MB trace, instead of linking them again); else ``kinds`` themselves."""
    kinds = tuple(kinds)
    every = tuple(expr.GPU_KINDS)
    if kinds != every and set(kinds) <= set(every) and not _uncorrelated(events, every):
        return every
    return kinds


def _of_kinds(linked: pl.DataFrame, kinds) -> pl.DataFrame:
    """The rows of :func:`_linked` of ``kinds`` alone, each launch's ``launch_gpu_rows`` counted among those (what
    linking a projection of ``kinds`` alone gives, :func:`_covering`); ``linked`` itself when it has no others."""
    kinds = list(kinds)
    if linked["kind"].is_in(kinds).all():
        return linked
    return linked.filter(pl.col("kind").is_in(kinds)).with_columns(
        launch_gpu_rows=pl.when(pl.col("launch_event_id").is_not_null())
        .then(pl.len().over("trace_id", "launch_event_id")).cast(pl.Int64))


def _paired_by_external_id(rows: pl.DataFrame) -> pl.DataFrame:
    """Where a trace gives its GPU rows no correlation id at all (a PyTorch-on-ROCm build writes none, only each
    launch's and its kernel's shared ``External id``), a GPU row and a launch call that alone share an external
    id are each other's: their external id stands in for the correlation id. An operator's id shared by several
    launches or kernels (the usual meaning of ``External id``) links nothing."""
    on_gpu = pl.col("side") == "gpu"
    launch = (pl.col("side") == "api") & expr.api_class(pl.col("name")).is_in(["launch", "graph_launch"])
    pair = ["trace_id", "external_id"]
    none_correlated = ~(on_gpu & pl.col("correlation_id").is_not_null()).any().over("trace_id")
    alone = (on_gpu.sum().over(pair) == 1) & (launch.sum().over(pair) == 1) & (on_gpu | launch)
    use = none_correlated & pl.col("correlation_id").is_null() & pl.col("external_id").is_not_null() & alone
    return rows.with_columns(correlation_id=pl.when(use).then(pl.col("external_id"))
                             .otherwise(pl.col("correlation_id")))


def _linked(rows: pl.DataFrame) -> pl.DataFrame:
    """The GPU rows of a projection, each with the API call of the same trace and correlation id (or nulls);
    shared, as the projection is."""
    return shared(rows, "linked", lambda: _link(rows))


def _link(rows: pl.DataFrame) -> pl.DataFrame:
    gpu = rows.filter(pl.col("side") == "gpu").drop("side")
    # only the calls of a correlation id some GPU row has (45,000 of 100,000 API rows): the others link nothing
    called = pl.col("correlation_id").is_in(gpu["correlation_id"].drop_nulls().implode())
    api = (rows.filter((pl.col("side") == "api") & called).sort("start_ns", "event_id")
           .group_by("trace_id", "correlation_id", maintain_order=True).first()
           .select("trace_id", "correlation_id", launch_event_id="event_id", launch_name="name",
                   launch_start_ns="start_ns", launch_duration_ns="duration_ns", launch_tid="tid"))
    linked = gpu.join(api, on=["trace_id", "correlation_id"], how="left", nulls_equal=False)
    return linked.with_columns(
        launch_class=pl.when(pl.col("launch_name").is_not_null()).then(expr.api_class(pl.col("launch_name"))),
        delay_ns=pl.col("start_ns") - pl.col("launch_start_ns"),
        launch_gpu_rows=pl.when(pl.col("launch_event_id").is_not_null())
        .then(pl.len().over("trace_id", "launch_event_id")).cast(pl.Int64))


def stream_gaps(projection: pl.DataFrame, kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
    """Every GPU activity of a :func:`_projection` with its launch (:func:`_linked`), in stream order, with
    ``end_ns``, ``prev_end`` (the latest end before it on its stream), ``gap`` (its start − ``prev_end`` when
    positive, else 0) and ``category`` of the gap: host_wait, kernel_wait, other (null: no gap). The gaps
    :class:`StreamIdle` sums and :class:`~traceparse.measures.gap_activity.GapActivity` fills (shared, as the
    projection is); ``stream_id`` null is -1 here."""
    return shared(projection, "stream_gaps", lambda: _stream_gaps(projection, kernel_wait_ns), (kernel_wait_ns,))


def _stream_gaps(projection: pl.DataFrame, kernel_wait_ns: int) -> pl.DataFrame:
    rows = _linked(projection).with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns"))
    rows = rows.with_columns(pl.col("stream_id").fill_null(-1)).sort(*STREAM, "start_ns", "end_ns", "event_id")
    prev_end = pl.col("end_ns").cum_max().shift(1).over(STREAM)
    gaps = rows.with_columns(prev_end=prev_end).with_columns(
        gap=pl.when(pl.col("start_ns") > pl.col("prev_end")).then(pl.col("start_ns") - pl.col("prev_end"))
        .otherwise(0))
    category = (pl.when(pl.col("gap") <= 0).then(None)
                .when(pl.col("launch_start_ns") > pl.col("prev_end")).then(pl.lit("host_wait"))
                .when(pl.col("gap") < kernel_wait_ns).then(pl.lit("kernel_wait"))
                .otherwise(pl.lit("other")))
    return gaps.with_columns(category=category)


class Launches(Measure):
    """Every timed GPU activity of ``kinds`` (default kernel, memcpy, memset) with the host call that launched it.

    The link is the correlation id: the API row (kind ``api``) of the same
    trace with the activity's ``correlation_id`` (of several, the first to
    start). A CUDA/HIP graph launch has one correlation id for every kernel it
    replays, so those kernels share one launch. Columns: ``trace_id``,
    ``event_id``, ``kind``, ``name``, ``device_id``, ``stream_id``,
    ``correlation_id``, ``start_ns``, ``duration_ns``, ``tid`` (null: GPU
    side), and of the launch (null when none is linked): ``launch_event_id``,
    ``launch_name``, ``launch_class`` (:func:`traceparse.expr.api_class`:
    launch, graph_launch, memcpy, ...), ``launch_start_ns``,
    ``launch_duration_ns``, ``launch_tid``, ``delay_ns`` = activity start −
    launch start, ``launch_gpu_rows`` = the GPU activities linked to that
    launch. Sorted by trace and event id.

    Part: the GPU rows and the API rows with a correlation id (a projection);
    combine: the join. Valid partitions: device, trace, row chunks.
    """

    name = "launches"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=expr.GPU_KINDS) -> pl.DataFrame:
        return _projection(events, kinds)

    def combine(self, parts: list[pl.DataFrame], kinds=expr.GPU_KINDS) -> pl.DataFrame:
        out = _linked(pl.concat(parts)).drop("tid").sort("trace_id", "event_id")
        return unkeyed(out).select(
            "trace_id", "event_id", "kind", "name", "device_id", "stream_id", "correlation_id", "start_ns",
            "duration_ns", "launch_event_id", "launch_name", "launch_class", "launch_start_ns", "launch_duration_ns",
            "launch_tid", "delay_ns", "launch_gpu_rows")


#: The columns of one launch-delay item of :class:`LaunchSummary` (the ``top`` list), in order.
TOP_COLUMNS = ["event_id", "name", "launch_name", "device_id", "stream_id", "launch_duration_ns", "duration_ns",
               "delay_ns", "launch_gpu_rows"]


class LaunchSummary(Measure):
    """Per trace, :class:`Launches` summed up small enough to gather from every rank: counts, sorted numbers, top items.

    One row per trace (``trace_id``) with timed GPU activities of ``kinds``
    (default kernel, memcpy, memset), linked to their launch calls as in
    :class:`Launches`. *Direct* activities are those whose launch call is of
    class ``launch``, *graph* ones of class ``graph_launch``; a launch call
    counts once however many activities it launched. Columns: ``rows``,
    ``linked``, ``direct``, ``graph`` (activities), ``short`` (direct ones
    shorter than their launch call), ``launch_excess_ns`` (Σ over direct
    activities of max(0, launch call − activity duration)),
    ``graph_launches`` and ``graph_launch_time_ns`` (distinct graph launch
    calls, Σ of their durations); two sorted ``List[Int64]`` columns,
    ``launch_ns`` (the durations of the distinct direct launch calls) and
    ``delay_ns`` (activity start − launch start of every linked activity), so
    that quantiles over all the traces of a run stay exact; and ``top``: the
    ``top`` linked activities with the longest delay (ties: lower event id
    first) as a list of structs of :data:`TOP_COLUMNS`. Only ``top`` holds
    names: a rank's result is about 16 bytes per launch instead of a row of
    :class:`Launches` with two names. Sorted by trace.

    Part: the projection of :class:`Launches`; combine: the join, then the
    per-trace summary. Valid partitions: device, trace, row chunks.
    """

    name = "launch_summary"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=expr.GPU_KINDS, top: int = 10) -> pl.DataFrame:
        return _projection(events, _covering(events, kinds))

    def combine(self, parts: list[pl.DataFrame], kinds=expr.GPU_KINDS, top: int = 10) -> pl.DataFrame:
        rows = unkeyed(_of_kinds(_linked(pl.concat(parts)), kinds))
        # longest delay first (ties: lower event id), so that each trace's first linked rows are its top items
        rows = rows.sort(["trace_id", "delay_ns", "event_id"], descending=[False, True, False], nulls_last=True)
        linked = pl.col("launch_event_id").is_not_null()
        direct = pl.col("launch_class") == "launch"
        graph = pl.col("launch_class") == "graph_launch"
        first = pl.col("first_of_call")  # one row per launch call: its activity with the lowest event id

        def count(cond: pl.Expr) -> pl.Expr:
            return cond.fill_null(False).sum().cast(pl.Int64)

        out = rows.with_columns(
            first_of_call=linked & (pl.col("event_id") == pl.col("event_id").min().over("trace_id", "launch_event_id"))
        ).group_by("trace_id", maintain_order=True).agg(
            rows=pl.len().cast(pl.Int64), linked=count(linked), direct=count(direct), graph=count(graph),
            short=count(direct & (pl.col("duration_ns") < pl.col("launch_duration_ns"))),
            launch_excess_ns=(pl.col("launch_duration_ns") - pl.col("duration_ns")).clip(0)
            .filter(direct.fill_null(False)).sum().cast(pl.Int64),
            graph_launches=count(graph & first),
            graph_launch_time_ns=pl.col("launch_duration_ns").filter((graph & first).fill_null(False)).sum()
            .cast(pl.Int64),
            launch_ns=pl.col("launch_duration_ns").filter((direct & first).fill_null(False)).sort(),
            delay_ns=pl.col("delay_ns").filter(linked).sort(),
            top=pl.struct(TOP_COLUMNS).filter(linked).head(top))
        # the top items' names are views into the partition's string buffers: copy them, so that a rank's result
        # does not keep (or, on a cluster, send) every name of the rank
        out = out.with_columns(pl.Series("top", out["top"].to_list(), dtype=out.schema["top"]))
        return out.sort("trace_id", nulls_last=False).select(
            "trace_id", "rows", "linked", "direct", "graph", "short", "launch_excess_ns", "graph_launches",
            "graph_launch_time_ns", "launch_ns", "delay_ns", "top")


class StreamIdle(Measure):
    """Why each stream waits: its idle gaps split into host wait, kernel wait and other (HTA's idle time breakdown).

    Per stream (``trace_id``, ``device_id``, ``stream_id``), the timed GPU
    activities of ``kinds`` (default kernel, memcpy, memset) in order of
    start; each activity after the first has a gap = its start − the latest
    end of the activities before it on that stream, when positive. The gap is
    **host wait** when the activity's launch call (:class:`Launches`) started
    after that latest end: when the stream went idle nothing was queued for
    it, the GPU waited for the host. Otherwise it is **kernel wait** when
    shorter than ``kernel_wait_ns`` (default 30 µs: the overhead between
    back-to-back queued activities), else **other** (queued work waiting on
    something else: an event of another stream, a copy, a synchronization; or
    an activity with no linked launch).

    Columns: ``trace_id``, ``device_id``, ``stream_id``, ``activities``,
    ``span_ns`` (first start to last end), ``busy_ns``, ``idle_ns`` (Σ gaps),
    ``host_wait_ns``, ``kernel_wait_ns``, ``other_ns``, and the number of
    gaps of each: ``gaps``, ``host_wait_gaps``, ``kernel_wait_gaps``,
    ``other_gaps``; ``unlinked_ns``: the part of ``other_ns`` before activities with no linked launch (whose
    wait cannot be told). Sorted by stream.

    Part: the projection of :class:`Launches`; combine: the sweep. Valid
    partitions: device, trace, row chunks.
    """

    name = "stream_idle"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=expr.GPU_KINDS, kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
        return _projection(events, kinds)

    def combine(self, parts: list[pl.DataFrame], kinds=expr.GPU_KINDS,
                kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
        gaps = stream_gaps(pl.concat(parts), kernel_wait_ns)

        def of(label: str):
            return [pl.col("gap").filter(pl.col("category") == label).sum().alias(f"{label}_ns"),
                    (pl.col("category") == label).sum().cast(pl.Int64).alias(f"{label}_gaps")]

        unlinked = (pl.col("category") == "other") & pl.col("launch_start_ns").is_null()
        out = (gaps.group_by(STREAM).agg(
            activities=pl.len().cast(pl.Int64), first=pl.col("start_ns").min(), last=pl.col("end_ns").max(),
            idle_ns=pl.col("gap").sum(), gaps=(pl.col("gap") > 0).sum().cast(pl.Int64),
            *of("host_wait"), *of("kernel_wait"), *of("other"), unlinked_ns=pl.col("gap").filter(unlinked).sum())
            .with_columns(span_ns=pl.col("last") - pl.col("first"))
            .with_columns(busy_ns=pl.col("span_ns") - pl.col("idle_ns"),
                          stream_id=pl.when(pl.col("stream_id") >= 0).then(pl.col("stream_id")))
            .sort(STREAM, nulls_last=False))
        return unkeyed(out).select(
            *STREAM, "activities", "span_ns", "busy_ns", "idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns",
            "gaps", "host_wait_gaps", "kernel_wait_gaps", "other_gaps", "unlinked_ns")


launches = Launches()
launch_summary = LaunchSummary()
stream_idle = StreamIdle()
