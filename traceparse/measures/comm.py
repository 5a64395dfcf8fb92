"""Communication: collective kernels against compute, collective instances across ranks, per-rank time.

A distributed run is one event table holding every rank's events with ``rank`` set (a run's combined trace);
one trace of a process driving several GPUs has ``rank`` null and its devices take the ranks' place. The
*members* of a collective are then the ranks, or the devices of that one process (only its communication
kernels say which device took part), or the one process alone.

Communication events are the rows :func:`traceparse.expr.is_communication` recognises: a ``collective`` the
reader filled in, or a communication name (NCCL/RCCL kernels of every NCCL version, ``c10d::*`` operators,
``record_param_comms``, ``gloo:``/``nccl:`` annotations, nsys NCCL ranges). Compute kernels are the other
kernels.

The per-device measures key by ``trace_id``, ``rank`` and ``device_id`` (a run's ranks are separate traces,
so a rank is one trace); the collective measures match instances across traces, by rank.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceparse import expr, intervals
from traceparse.measures.base import PARTITIONS, Measure, PartitionedEvents, keyed, placed, shared, unkeyed
from traceparse.measures.comm_groups import settled_groups, settled_peers, worker_collectives
from traceparse.measures.comm_sources import COMPLETION_SOURCES, SOURCES, is_transfer
from traceparse.measures.overlap import overlap
from traceparse.measures.steps import step_series
from traceparse.schema import DTYPES

#: Host operators that block their thread until a collective's exchange is done, running nothing themselves: a
#: functional collective's ``wait_tensor`` (gloo runs the exchange on a worker thread; NCCL's returns at once and
#: the stream waits instead). A thread resuming from one may have been woken (the critical path's ``wake``).
BLOCKING_WAITS = ("_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
#: Key of the per-device communication measures: a rank's device (a run's ranks are separate traces).
MEMBER = ["trace_id", "rank", "device_id"]
_NO_RANK = -1  # stand-in for a null rank or device while grouping and joining
_VALID = (*PARTITIONS, "rank")


def comm_kernels() -> pl.Expr:
    """Communication kernels (NCCL/RCCL of every version, or a ``collective`` the reader set on a kernel)."""
    return expr.kind_is("kernel") & expr.is_communication()


def compute_kernels() -> pl.Expr:
    """Every kernel that is not communication."""
    return expr.kind_is("kernel") & ~expr.is_communication()


def has_communication(events: Any, kernels_only: bool = False) -> bool:
    """Whether any event of ``events`` is communication (``kernels_only``: any communication kernel): what the
    communication rules ask to know whether they apply. Answered once per analysis (:func:`shared`), and from the
    table's distinct names (a few hundred), not its rows (12-25 ms on 300,000 rows, asked three times)."""
    def compute() -> tuple[bool, bool]:
        names = events.select(pl.col("name").fill_null(""), kernel=expr.kind_is("kernel"),
                              set=pl.col("collective").is_not_null()).unique()
        found = names.with_columns(comm=pl.col("set") | expr.collective(pl.col("name")).is_not_null())
        return (bool(found["comm"].any()), bool(found.filter(pl.col("kernel"))["comm"].any()))

    anything, kernel = shared(events, "has_communication", compute)
    return kernel if kernels_only else anything


def _keyed(frame: pl.DataFrame) -> pl.DataFrame:
    return keyed(frame).with_columns(pl.col("rank").cast(pl.Int32).fill_null(_NO_RANK))


def _unkeyed(frame: pl.DataFrame) -> pl.DataFrame:
    return unkeyed(frame).with_columns(pl.when(pl.col("rank") != _NO_RANK).then(pl.col("rank")).alias("rank"))


# -- communication kernels against compute kernels --------------------------------------------------------------
class CommOverlap(Measure):
    """Per (``trace_id``, ``rank``, ``device_id``): communication-kernel time and the part of it overlapped by compute.

    :data:`traceparse.measures.overlap` with ``a`` = :func:`comm_kernels` and ``b`` = :func:`compute_kernels`,
    per rank (so ranks sharing a GPU, or traces without an id, never cover each other's kernels). Columns:
    ``trace_id``, ``rank``, ``device_id``, ``kernels`` (communication kernels), ``comm_time_ns`` = Σ their durations,
    ``overlapped_ns`` = Σ over them of |kernel ∩ union of the device's compute kernels|, ``exposed_ns`` =
    comm − overlapped, ``overlap_pct`` = 100 × overlapped / comm (null without communication time). Only
    devices with communication kernels have a row. Timed kernels only.

    Part: the overlap measure's edges per rank; combine: the overlap measure's combine per rank. Valid partitions: rank, trace, device, row chunks.
    """

    name = "comm_overlap"
    per_trace = True
    partitions = _VALID

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        ranks = _rank_of_trace(events)
        if ranks is not None:  # one rank per trace (a run's ranks): the trace key keeps ranks apart, in one pass
            return (overlap.part(events, a=comm_kernels(), b=compute_kernels())
                    .join(ranks, on="trace_id", how="left", nulls_equal=True))
        groups = events.partition_by("rank", maintain_order=True) or [events]
        return pl.concat([overlap.part(g, a=comm_kernels(), b=compute_kernels())
                          .with_columns(rank=pl.lit(g["rank"][0] if g.height else None, dtype=pl.Int32))
                          for g in groups])

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        every = pl.concat(parts)
        ranks = _rank_of_trace(every)
        if ranks is not None:
            per_rank = [overlap.combine([every.drop("rank")], a=comm_kernels(), b=compute_kernels())
                        .join(ranks, on="trace_id", how="left", nulls_equal=True)]
        else:
            per_rank = [overlap.combine([g.drop("rank")], a=comm_kernels(), b=compute_kernels())
                        .with_columns(rank=pl.lit(g["rank"][0], dtype=pl.Int32))
                        for g in every.partition_by("rank", maintain_order=True)]
        schema = {"trace_id": pl.String, "rank": pl.Int32, "device_id": pl.Int32, "count": pl.Int64,
                  "time_ns": pl.Int64, "overlapped_ns": pl.Int64}
        rows = pl.concat([r.select(*schema) for r in per_rank]) if per_rank else pl.DataFrame(schema=schema)
        out = (_keyed(rows).filter(pl.col("count") > 0).group_by(MEMBER)
               .agg(kernels=pl.col("count").sum(), comm_time_ns=pl.col("time_ns").sum(),
                    overlapped_ns=pl.col("overlapped_ns").sum())
               .with_columns(exposed_ns=pl.col("comm_time_ns") - pl.col("overlapped_ns"),
                             overlap_pct=pl.when(pl.col("comm_time_ns") > 0)
                             .then((100.0 * pl.col("overlapped_ns") / pl.col("comm_time_ns")).round(4)))
               .sort(MEMBER))
        return _unkeyed(out).select(*MEMBER, "kernels", "comm_time_ns", "overlapped_ns", "exposed_ns", "overlap_pct")


def _rank_of_trace(frame: pl.DataFrame) -> pl.DataFrame | None:
    """``trace_id`` → ``rank`` (keyed trace ids: null as ""), when every trace of ``frame`` holds one rank; else
    None (a trace of several ranks is measured rank by rank)."""
    pairs = keyed(frame.select("trace_id", "rank")).unique()
    if pairs["trace_id"].n_unique() != pairs.height:
        return None
    return pairs.with_columns(pl.col("rank").cast(pl.Int32))


# -- collective instances ------------------------------------------------------------------------------------
#: The columns of a :class:`Collectives` part (a candidate row) and their types: the events' own, then the end,
#: the source (:data:`SOURCES`) and the step the call starts in (:func:`_with_steps`).
CANDIDATE_SCHEMA = {**{c: DTYPES[c] for c in (
    "trace_id", "event_id", "rank", "device_id", "stream_id", "pid", "tid", "name", "collective", "seq",
    "process_group", "process_group_choices", "peer_rank", "peer_rank_choices", "input_dims", "start_ns")},
    "end_ns": pl.Int64, "bytes": DTYPES["bytes"], "source": pl.String, "step": pl.Int64}
_COLUMNS = list(CANDIDATE_SCHEMA)


def _source() -> pl.Expr:
    family = expr.communication_family(pl.col("name").fill_null(""))
    record = pl.col("name") == "record_param_comms"
    # a transfer's peer identifies it as a sequence number does a collective (and is the group's rank, mapped)
    identified = pl.col("seq").is_not_null() | (is_transfer() & pl.col("peer_rank").is_not_null())
    return (pl.when(expr.kind_is("op") & record & identified).then(pl.lit(SOURCES[0]))
            .when(expr.kind_is("op") & (family == "c10d op")).then(pl.lit(SOURCES[1]))
            .when(expr.kind_is("op") & record).then(pl.lit(SOURCES[2]))
            .when(expr.kind_is("marker", "op", "region") & pl.col("pid").is_not_null()).then(pl.lit(SOURCES[3]))
            .when(expr.kind_is("kernel")).then(pl.lit(SOURCES[4])))


def _candidates(events: pl.DataFrame) -> pl.DataFrame:
    """The communication rows that may stand for a collective call, each with its source (one lazy query: the
    filters read the columns they test, and only the chosen rows' own columns are copied, not every column of
    every timed row); and, where point-to-point kernels ran, the rows that say which transfer calls ran as one
    kernel (:func:`_batch_marks`)."""
    rows = events.lazy().filter(placed()).with_columns(expr.collective_of())
    rows = rows.filter(pl.col("collective").is_not_null())
    rows = (rows.with_columns(source=_source(), end_ns=pl.col("start_ns") + pl.col("duration_ns"))
            .filter(pl.col("source").is_not_null())
            .select(pl.col(c) for c in _COLUMNS if c != "step")).collect()
    rows = _with_steps(rows, events)
    marks = _batch_marks(events, rows)
    return rows if marks is None else pl.concat([rows, marks], how="vertical_relaxed")


#: The step source whose numbers are the job's own, the same on every rank (``ProfilerStep#N``: step N of the
#: training loop), as :func:`traceparse.measures.steps.step_series` names it; other sources number a trace's
#: steps from 1 in order, which says nothing across ranks.
NUMBERED_STEPS = "ProfilerStep#N"
#: ``instance`` of a collective numbered within its step: step × this + its place in the step.
STEP_STRIDE = 1 << 24


def _with_steps(rows: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (candidates) with ``step``: the :data:`NUMBERED_STEPS` step of ``events`` each host-side row starts
    in, on its trace; null for kernels (a GPU runs behind its host's steps) and outside every step."""
    if rows.height == 0:
        return rows.with_columns(step=pl.lit(None, dtype=pl.Int64))
    steps = step_series(events)
    steps = steps.filter(pl.col("source") == NUMBERED_STEPS) if steps.height else steps
    if steps.height == 0:
        return rows.with_columns(step=pl.lit(None, dtype=pl.Int64))
    key = pl.col("trace_id").fill_null("")
    found = (rows.with_row_index("_row").filter(pl.col("source") != "kernel")
             .select("_row", "start_ns", _t=key).sort("start_ns")
             .join_asof(steps.select("step", "end_ns", _t=key, _s="start_ns").sort("_s"), left_on="start_ns",
                        right_on="_s", by="_t", strategy="backward", check_sortedness=False)
             .filter(pl.col("start_ns") < pl.col("end_ns")).select("_row", "step"))
    return (rows.with_row_index("_row").join(found, on="_row", how="left").sort("_row").drop("_row")
            .with_columns(pl.col("step").cast(pl.Int64)))


def calls_steps(calls: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (:class:`Collectives` rows) with ``step``: the :data:`NUMBERED_STEPS` step each host-side call
    arrived in (null for a kernel's arrival and outside every step): which steps of the job a rank's collectives
    are of."""
    rows = calls.with_row_index("_call").select("_call", "trace_id", "source", start_ns="arrival_ns")
    return calls.with_columns(step=_with_steps(rows, events).sort("_call")["step"])


#: The host annotation that ends a batch of point-to-point calls (``batch_isend_irecv``; PyTorch's coalescing
#: manager): the batch's one kernel is launched inside it.
BATCH_MARK = "nccl:coalesced"
#: Sources of :func:`_candidates` rows that are no call (never an instance): a :data:`BATCH_MARK` annotation
#: and the launch of a point-to-point kernel (on its thread, at the launch's start).
MARK_SOURCES = ("batch", "launch")


def _batch_marks(events: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame | None:
    """The :data:`MARK_SOURCES` rows of ``events``, in the candidates' columns, where ``rows`` (the candidates)
    hold point-to-point kernels: the host's :data:`BATCH_MARK` annotations and the runtime calls that launched
    those kernels (matched by correlation id within the trace); None where there are none."""
    kernels = rows.filter((pl.col("source") == "kernel") & is_transfer())
    if kernels.height == 0:
        return None
    timed = events.lazy().filter(placed())
    launched = (timed.filter(expr.kind_is("kernel") & pl.col("correlation_id").is_not_null())
                .join(kernels.lazy().select("trace_id", "event_id"), on=["trace_id", "event_id"], how="semi")
                .select("trace_id", "correlation_id"))
    launches = (timed.filter(expr.kind_is("api") & pl.col("correlation_id").is_not_null())
                .join(launched, on=["trace_id", "correlation_id"], how="semi")
                .with_columns(source=pl.lit("launch")))
    marks = (timed.filter(expr.kind_is("marker") & (pl.col("name") == BATCH_MARK) & pl.col("pid").is_not_null())
             .with_columns(source=pl.lit("batch")))
    out = (pl.concat([launches, marks])
           .with_columns(collective=pl.lit("send_recv"), end_ns=pl.col("start_ns") + pl.col("duration_ns"),
                         seq=pl.lit(None, dtype=rows.schema["seq"]),
                         process_group=pl.lit(None, dtype=rows.schema["process_group"]),
                         process_group_choices=pl.lit(None, dtype=rows.schema["process_group_choices"]),
                         peer_rank=pl.lit(None, dtype=rows.schema["peer_rank"]),
                         peer_rank_choices=pl.lit(None, dtype=rows.schema["peer_rank_choices"]),
                         bytes=pl.lit(None, dtype=rows.schema["bytes"]), step=pl.lit(None, dtype=pl.Int64))
           .select(pl.col(c).cast(rows.schema[c]) for c in _COLUMNS)).collect()
    return out if out.height else None


def _members(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with ``member``: the rank; without ranks, the device of communication kernels on several
    devices; else the one process (null)."""
    if rows["rank"].is_not_null().any():
        return rows.filter(pl.col("rank").is_not_null()).with_columns(member=pl.col("rank").cast(pl.Int32))
    kernels = rows.filter((pl.col("source") == "kernel") & pl.col("device_id").is_not_null())
    if kernels["device_id"].n_unique() > 1:
        return kernels.with_columns(member=pl.col("device_id").cast(pl.Int32))
    return rows.with_columns(member=pl.lit(None, dtype=pl.Int32))


def _instances(rows: pl.DataFrame, sources: tuple[str, ...] = SOURCES) -> pl.DataFrame:
    """Each member's rows of its preferred source, outermost calls only, numbered per process group."""
    rows = _members(worker_collectives(settled_groups(rows)).filter(pl.col("source").is_in(list(sources))))
    level = pl.col("source").replace_strict({s: i for i, s in enumerate(SOURCES)}, return_dtype=pl.Int32)
    # collectives and transfers each from their own best source: a run of both (pipeline and data parallel)
    # whose collectives have sequence numbers and transfers none kept no transfer at all
    best = pl.col("level").min().over("member", is_transfer())
    rows = rows.with_columns(level=level).filter(pl.col("level") == best)
    # a collective call inside another of the same thread (or kernel stream) is part of it, not another one
    thread = ["member", "trace_id", "pid", "tid", "device_id", "stream_id"]
    rows = rows.sort([*thread, "start_ns", "event_id"], nulls_last=False)
    outer_end = pl.col("end_ns").cum_max().shift(1).over(thread)
    rows = rows.filter(outer_end.is_null() | (pl.col("start_ns") >= outer_end))
    rows = settled_peers(rows)
    rows = rows.with_columns(call_group=pl.col("process_group"), process_group=_transfer_group())
    group = ["member", "process_group"]
    rows = rows.sort(["member", "process_group", "start_ns", "trace_id", "event_id"], nulls_last=False)
    rows = rows.with_columns(index=pl.int_range(pl.len(), dtype=pl.Int64).over(group),
                             _in_step=pl.int_range(pl.len(), dtype=pl.Int64).over(*group, "step"))
    by_seq = pl.col("seq").is_not_null().all().over("process_group")
    # numbered within their step where every call of the group has one: ranks that profiled different steps
    # (one started a step later) meet at the same collective of the same step, not at their n-th
    by_step = pl.col("step").is_not_null().all().over("process_group")
    return rows.with_columns(instance=pl.when(by_seq).then(pl.col("seq"))
                             .when(by_step).then(pl.col("step") * STEP_STRIDE + pl.col("_in_step"))
                             .otherwise(pl.col("index"))).drop("level", "_in_step")


def paired_transfer() -> pl.Expr:
    """An instance that is one transfer between two ranks (its ``process_group`` names them: ``0 1↔2``)."""
    return is_transfer() & pl.col("process_group").cast(pl.String).str.contains("↔", literal=True).fill_null(False)


def _transfer_group() -> pl.Expr:
    """``process_group``, and for a point-to-point transfer whose peer is known (``peer_rank``) between ranks, the
    pair of ranks it runs between as well (``0 1↔2``: the group, then the pair): stage 1 of a pipeline receives
    from stage 0 and sends to stage 2, so its n-th transfer is not stage 2's n-th, and a transfer has two
    members, not the group. Numbered within the pair, both ways together: a 1F1B schedule batches a stage's send
    with its receive from the same peer (one rendezvous, one kernel), in the same order on both sides. A peer is
    a run's rank: readers map a group's numbering through the group's ranks where they know them
    (``record_param_comms`` gives them; a ``c10d::`` operator's group is one of its rank's), and where several
    ranks fit, :func:`~traceparse.measures.comm_groups.settled_peers` has chosen one."""
    peer, me = pl.col("peer_rank"), pl.col("member")
    pair = pl.format("{}↔{}", pl.min_horizontal(me, peer), pl.max_horizontal(me, peer))
    known = is_transfer() & peer.is_not_null() & pl.col("rank").is_not_null() & (peer != me)  # members: ranks
    return (pl.when(known).then(pl.concat_str([pl.col("process_group"), pair], separator=" ", ignore_nulls=True))
            .otherwise(pl.col("process_group")).alias("process_group"))


class Collectives(Measure):
    """Collective instances per member: when each rank (device) arrived at each collective and when it left.

    Members as in the module docstring. A member's instances are its communication rows of its most
    preferred source (:data:`SOURCES`): ``record_param_comms`` with a sequence number, else its ``c10d::*``
    operators, else ``record_param_comms``, else host annotations, else communication kernels; a call nested
    in another of the same thread is part of it. An instance is identified across members by
    (``process_group``, ``seq``) where every row of that process group has a sequence number, else as the
    n-th collective of that process group in its step on each member where every call of the group lies in a
    ``ProfilerStep#N`` (``step`` × :data:`STEP_STRIDE` + its place in the step: ranks that profiled different
    steps meet at the same step's), else as the n-th on each member (``index``, from 0, by arrival):
    ``instance`` is that key. Columns: ``member``, ``rank``, ``device_id``, ``trace_id``, ``process_group``,
    ``instance``, ``index``, ``seq``, ``collective``, ``name``, ``source``, ``arrival_ns`` (start of the call),
    ``end_ns``, ``bytes``. Sorted by process group, instance and member.

    Part: the candidate rows of a partition; combine: the choice of source per member and the numbering.
    Valid partitions: rank, trace, device, row chunks.
    """

    name = "collectives"
    partitions = _VALID

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        return _candidates(events)

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        rows = _instances(pl.concat(parts))
        return (rows.rename({"start_ns": "arrival_ns"})
                .sort(["process_group", "instance", "member"], nulls_last=False)
                .select("member", "rank", "device_id", "trace_id", "process_group", "instance", "index", "seq",
                        "collective", "name", "source", "arrival_ns", "end_ns", "bytes"))


def clock_offsets(parts: list[pl.DataFrame], done: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per member, how far its clock is ahead of the first member's, from collective end times.

    All members leave a collective together, so for each instance the difference of a member's end time and
    the first (lowest) member's end time is its clock offset plus noise; the median over instances is
    taken. Point-to-point transfers are left out: a send may end before its receive does (a message small
    enough to leave eagerly). End times come from the events that end with the collective, as
    :func:`completions` pairs them with the instances: communication kernels where the members have them, else
    host annotations (a gloo worker's ``gloo:all_reduce``), else the instances themselves; a member whose ends are
    of another source than the others' (it lost some kernels, or recorded none) has no offset. The pairing is the
    instances': ranks that profiled different steps meet at the same collective of the same step (the k-th kernel
    of each paired one rank's step 3 with the others' step 2, and read its clock one step, 146 ms, off).
    ``parts`` are :class:`Collectives` parts; ``done``: their :func:`completions`, where the caller has them.
    Columns: ``member``, ``offset_ns`` (0 for the first).
    """
    done = (completions(parts) if done is None else done).filter(~is_transfer())
    sources = done.filter(pl.col("done_source") != "call")["done_source"]
    best = next((s for s in COMPLETION_SOURCES[0] + COMPLETION_SOURCES[1] if s in set(sources.to_list())), "call")
    chosen = done.filter(pl.col("done_source") == best).select("member", "process_group", "instance",
                                                                end_ns="done_ns")
    if best == "call":  # no kernel or annotation: the calls' own ends
        chosen = done.select("member", "process_group", "instance", end_ns="done_ns")
    if chosen.height == 0:
        return pl.DataFrame(schema={"member": pl.Int32, "offset_ns": pl.Int64})
    first = chosen["member"].drop_nulls().min() if chosen["member"].is_not_null().any() else None
    ref = chosen.filter(pl.col("member") == first if first is not None else pl.col("member").is_null())
    joined = chosen.join(ref.select("process_group", "instance", ref_end=pl.col("end_ns")),
                         on=["process_group", "instance"], how="inner", nulls_equal=True)
    return (joined.group_by("member").agg(offset_ns=(pl.col("end_ns") - pl.col("ref_end")).median()
                                          .round(0).cast(pl.Int64))
            .sort("member", nulls_last=False))


def _short_members(found: pl.DataFrame, calls: pl.DataFrame) -> list:
    """The members with more than :data:`CUT_AT_END` fewer of ``found``'s rows (their collectives' kernels or
    annotations) than another member with as many collective calls (``calls``: :func:`_instances` of every
    source): they lost some (a rank whose file was cut short kept its calls but not every ``gloo:all_reduce`` of
    its worker thread), and matching the k-th of each pairs their rows with other collectives (such a rank's
    clock read 62.8 ms off)."""
    if found.height == 0 or calls.height == 0:
        return []
    counted = (calls.group_by("member").agg(calls=pl.len())
               .join(found.group_by("member").agg(rows=pl.len()), on="member", how="left", nulls_equal=True)
               .with_columns(pl.col("rows").fill_null(0)))
    # a few fewer at the end is the profiler stopping while they were queued (:func:`_cut_at_the_end`), which
    # the k-th matching survives: one rank's last all-reduce kernel missing must not lose it every kernel
    return counted.filter(pl.col("rows") < pl.col("rows").max().over("calls") - CUT_AT_END)["member"].to_list()


def completions(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Per collective instance and member, the event during which the member takes part: it starts when the
    member joins the instance and ends when the member leaves it.

    ``parts`` are :class:`Collectives` parts; instances, members and arrivals are those of :class:`Collectives`.
    A member's taking part is its communication kernel where every member has them (an NCCL kernel starts on
    its stream and spins until every rank's kernel has started), else its host annotation where every member
    has them (gloo's worker thread runs ``gloo:all_reduce`` until the exchange is over), else the instance's own
    call (``done_source`` ``"call"``). Kernels and annotations are matched to instances as the k-th of their
    collective on that member and process group, in order of start; an instance with no k-th one keeps its own
    call (a source that names no process group is matched whatever the group). Columns: ``member``, ``rank``,
    ``device_id``, ``trace_id``, ``process_group``, ``instance``,
    ``collective``, ``event_id`` and ``name`` (the instance's call), ``arrival_ns`` (its start),
    ``done_event_id``, ``done_name``, ``done_source``, ``join_ns`` (the start of the event taking part),
    ``done_ns`` (its end), ``done_tid`` and ``done_stream_id`` (its thread or stream). Sorted by process group,
    instance and member.
    """
    out_columns = ["member", "rank", "device_id", "trace_id", "process_group", "instance", "collective",
                   "event_id", "name", "arrival_ns", "done_event_id", "done_name", "done_source", "join_ns",
                   "done_ns", "done_tid", "done_stream_id"]
    rows = pl.concat(parts) if parts else pl.DataFrame()
    if rows.height == 0:
        schema = {"member": pl.Int32, "rank": pl.Int32, "device_id": pl.Int32, "trace_id": pl.String,
                  "process_group": pl.String, "instance": pl.Int64, "collective": pl.String, "event_id": pl.Int64,
                  "name": pl.String, "arrival_ns": pl.Int64, "done_event_id": pl.Int64, "done_name": pl.String,
                  "done_source": pl.String, "join_ns": pl.Int64, "done_ns": pl.Int64, "done_tid": pl.Int64,
                  "done_stream_id": pl.Int64}
        return pl.DataFrame(schema=schema)
    inst = _instances(rows).rename({"start_ns": "arrival_ns"})
    members = set(inst["member"].to_list())
    found = None
    for sources in COMPLETION_SOURCES:
        candidates = _instances(rows, sources)
        have = set(candidates["member"].to_list()) if candidates.height else set()
        # kernels on two members or more: a member with none (its GPU's activities not recorded) keeps its calls,
        # and is left out of the device arrivals (:func:`_blind_members`), not every member put on its host's
        if have == members or (sources == ("kernel",) and len(have) >= 2 and have < members):
            # a member that lost some of them keeps its own calls (as an instance with no k-th one does)
            short = _short_members(candidates.filter(~is_transfer()), inst.filter(~is_transfer()))
            found = candidates.filter(~pl.col("member").is_in(short, nulls_equal=True)) if short else candidates
            found = found if found.height else None  # every member short (every rank's file cut): their calls
            break
    # one source may name the process group where the other does not (a c10d operator and its NCCL kernel):
    # then the k-th of a collective on a member, whatever its group. The calls' own groups, not the instances'
    # (a transfer's names its pair, which no kernel does); and a transfer's kernel is the k-th transfer of its
    # member whatever its group (a batch's kernel names none)
    same_groups = found is not None and not (inst["call_group"].is_null().all()
                                             or found["call_group"].is_null().all())
    group = pl.when(~is_transfer()).then(pl.col("call_group")) if same_groups else pl.lit(None, dtype=pl.String)
    key = ["member", "_pg", "_family"]
    inst = (inst.with_columns(_pg=group, _family=_matching_family())
            .sort([*key, "arrival_ns", "trace_id", "event_id"], nulls_last=False))
    inst = inst.with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64).over(key))
    if found is not None and found["source"][0] == "kernel":
        inst = _batched(inst, rows, found, key)
    done = {"done_event_id": pl.Int64, "done_name": pl.String, "done_source": pl.String, "join_ns": pl.Int64,
            "done_ns": pl.Int64, "done_tid": pl.Int64, "done_stream_id": pl.Int64}
    if found is not None:
        found = (found.with_columns(_pg=group, _family=_matching_family())
                 .sort([*key, "start_ns", "trace_id", "event_id"], nulls_last=False)
                 .with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64).over(key))
                 .select(*key, "_k", done_event_id="event_id", done_name="name", done_source="source",
                         join_ns="start_ns", done_ns="end_ns", done_tid="tid", done_stream_id="stream_id"))
        inst = inst.join(found, on=[*key, "_k"], how="left", nulls_equal=True)
    else:
        inst = inst.with_columns(*[pl.lit(None, dtype=t).alias(c) for c, t in done.items()])
    own = pl.col("done_event_id").is_null()
    inst = inst.with_columns(
        done_source=pl.when(own).then(pl.lit("call")).otherwise(pl.col("done_source")),
        done_name=pl.when(own).then(pl.col("name")).otherwise(pl.col("done_name")),
        join_ns=pl.when(own).then(pl.col("arrival_ns")).otherwise(pl.col("join_ns")),
        done_ns=pl.when(own).then(pl.col("end_ns")).otherwise(pl.col("done_ns")),
        done_tid=pl.when(own).then(pl.col("tid")).otherwise(pl.col("done_tid")),
        done_stream_id=pl.when(own).then(pl.col("stream_id")).otherwise(pl.col("done_stream_id")),
        done_event_id=pl.when(own).then(pl.col("event_id")).otherwise(pl.col("done_event_id")))
    return inst.sort(["process_group", "instance", "member"], nulls_last=False).select(out_columns)


def _batched(inst: pl.DataFrame, rows: pl.DataFrame, kernels: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """``inst`` (:func:`completions`' instances, ``_k`` numbered per ``key``) with each point-to-point call's
    ``_k`` that of its *unit*, where the calls of a batch ran as one kernel: the calls then take the k-th kernel
    by unit, not by call. Unchanged where nothing is batched, or the units do not pair one to one with each
    member's point-to-point kernels (a launch not traced: the calls are then matched one by one, as before).

    Why: ``batch_isend_irecv`` (a 1F1B pipeline's send with its receive, from the same peer) queues its calls and
    launches one ``ncclDevKernel_SendRecv`` for all of them, inside a :data:`BATCH_MARK` annotation that follows
    them on their thread; a lone ``isend``/``irecv`` launches its own kernel inside its call. On a real 1F1B run,
    24 calls and 15 kernels a rank: matched call by call, no rank had a kernel for every call, and the waits fell
    back to the hosts' (19.6 ms a step where the GPUs waited about twice as long).

    A unit: a call that launched a point-to-point kernel (a launch on its thread inside it), alone; a call that
    launched none, with the others before the next :data:`BATCH_MARK` on its thread that launched one (the batch).
    Units are numbered per member in order of their start (a batch's: its annotation's), as the kernels are by
    theirs.
    """
    marks = rows.filter(pl.col("source").is_in(list(MARK_SOURCES)) & pl.col("rank").is_not_null())
    calls = inst.filter(is_transfer())
    if marks.height == 0 or calls.height == 0 or calls["member"].is_null().any():
        return inst
    thread = ["trace_id", "pid", "tid"]
    launches = marks.filter(pl.col("source") == "launch").select(*thread, _at=pl.col("start_ns")).sort("_at")
    batches = marks.filter(pl.col("source") == "batch").select(*thread, "start_ns", "end_ns", _unit="event_id")

    def launching(frame: pl.DataFrame, start: str, end: str) -> pl.Series:
        """Whether each row of ``frame`` (one thread's intervals) has a launch inside it."""
        found = frame.with_row_index("_i").sort(start).join_asof(
            launches, left_on=start, right_on="_at", by=thread, strategy="forward", check_sortedness=False)
        return found.sort("_i").select(pl.col("_at").is_not_null() & (pl.col("_at") <= pl.col(end))).to_series()

    batches = batches.filter(launching(batches, "start_ns", "end_ns")).select(*thread, "_unit", _unit_ns="start_ns")
    calls = calls.select(*key, *thread, "arrival_ns", "end_ns", "event_id").with_columns(
        _own=launching(calls, "arrival_ns", "end_ns"))
    # a call that launched nothing belongs to the next batch on its thread (if no call that launched its own
    # kernel comes first: then it is its own unit, with no kernel, and the count below tells)
    bounds = pl.concat([batches.with_columns(_batch=pl.lit(True)),
                        calls.filter("_own").select(*thread, _unit="event_id", _unit_ns="arrival_ns",
                                                    _batch=pl.lit(False))]).sort("_unit_ns")
    pending = calls.filter(~pl.col("_own")).sort("arrival_ns").join_asof(
        bounds, left_on="arrival_ns", right_on="_unit_ns", by=thread, strategy="forward",
        check_sortedness=False)
    pending = pending.with_columns(
        _unit=pl.when(pl.col("_batch")).then(pl.col("_unit")).otherwise(pl.col("event_id")),
        _unit_ns=pl.when(pl.col("_batch")).then(pl.col("_unit_ns")).otherwise(pl.col("arrival_ns")))
    units = pl.concat([calls.filter("_own").select(*key, "trace_id", "event_id", _unit="event_id",
                                                   _unit_ns="arrival_ns"),
                       pending.select(*key, "trace_id", "event_id", "_unit", "_unit_ns")])
    units = units.with_columns(_uk=pl.struct("_unit_ns", "trace_id", "_unit").rank("dense").over(key) - 1)
    counts = units.group_by(key).agg(_n=pl.col("_uk").max() + 1).join(
        kernels.filter(is_transfer()).with_columns(_pg=pl.lit(None, dtype=pl.String), _family=_matching_family())
        .group_by("member", "_family").agg(_kernels=pl.len()), on=["member", "_family"], how="left")
    if (units.select("trace_id", "_unit").n_unique() == units.height
            or not (counts["_n"] == counts["_kernels"].fill_null(0)).all()):
        return inst  # nothing batched, or units and kernels do not pair one to one
    return (inst.join(units.select(*key, "trace_id", "event_id", _uk=pl.col("_uk").cast(pl.Int64)),
                      on=[*key, "trace_id", "event_id"], how="left", nulls_equal=True)
            .with_columns(_k=pl.coalesce("_uk", "_k")).drop("_uk"))


def _matching_family() -> pl.Expr:
    """The ``collective`` a call and its kernel are matched on: point-to-point ones (:data:`POINT_TO_POINT`) as one.

    NCCL runs every send and receive as one kernel, ``ncclDevKernel_SendRecv``: Kineto names its collective
    (``send``, ``recv``) on a lone ``isend``/``irecv`` but not on a batch (``batch_isend_irecv``), whose kernel's
    name says only ``send_recv``. Matched by collective, a ``c10d::recv_`` found no kernel, and the whole run fell
    back to host arrivals (a pipeline's host runs far ahead of its GPU).
    """
    return (pl.when(is_transfer()).then(pl.lit("send_recv"))
            .otherwise(pl.col("collective")))


_INT64 = (-2**63, 2**63 - 1)


def _moved(ns: pl.Expr, offset: pl.Expr) -> pl.Expr:
    """``ns - offset`` computed in Int128 and kept inside Int64: a time moved onto another member's clock.

    Both are Int64, so their difference may not be (a member's clock 9.2e18 ns behind the first one's, a
    time near 2^63): it is clipped to Int64's range, never wrapped to the other end of it.
    """
    return (ns.cast(pl.Int128) - offset.cast(pl.Int128)).clip(*_INT64).cast(pl.Int64)


def _device_arrivals(rows: pl.DataFrame, parts: list[pl.DataFrame], done: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (:class:`Collectives` rows) with each arrival moved to the member's communication kernel, where
    every instance of every member has one (:func:`completions`): ``arrival`` is then ``"device"``, else
    ``"host"`` and the arrivals are the calls'. ``host_arrival_ns`` keeps the call's start. Instances whose
    kernels the trace ended before (:func:`_cut_at_the_end`) are left out of device arrivals.

    Why: an NCCL (RCCL) call returns at once and only queues its kernel; the host of a rank runs on, often
    many milliseconds ahead of its GPU (FSDP issues its all-gathers a layer ahead). It is the device that
    waits: its kernel starts when its stream reaches it and spins until every rank's kernel has started. The
    calls' starts would count as waiting the time a host spent ahead of its own GPU (on a real FSDP2 run,
    a wait of 78.7 ms a step where the slow rank's planted sleep cost 28.8 ms, and a balanced run's rank named
    its straggler). gloo and other host-side collectives have no kernel: their calls are the arrivals.
    ``done``: the parts' :func:`completions`.
    """
    no_kernel = [pl.lit(None, dtype=t).alias(c) for c, t in _KERNEL.items()]
    cut = _cut_at_the_end(done) if done.height == rows.height and done.height > 0 else None
    if cut is None and done.height == rows.height and (blind := _blind_members(done)):
        # the members that lost their kernels are left out where two or more others' arrivals are their devices'
        seen = ~pl.col("member").is_in(blind, nulls_equal=True)
        others = done.filter(seen)
        if others["member"].n_unique() > 1 and (cut := _cut_at_the_end(others)) is not None:
            rows, done = rows.filter(seen), others
    if cut is None:
        return rows.with_columns(*no_kernel, host_arrival_ns=pl.col("arrival_ns"), arrival=pl.lit("host"))
    if cut.height:
        gone = ["process_group", "instance"]
        rows = rows.join(cut, on=gone, how="anti", nulls_equal=True)
        done = done.join(cut, on=gone, how="anti", nulls_equal=True)
    joins = done.select("member", "process_group", "instance", _join="join_ns", kernel_event_id="done_event_id",
                        kernel_name="done_name", kernel_end_ns="done_ns")
    rows = rows.join(joins, on=["member", "process_group", "instance"], how="left", nulls_equal=True)
    if rows["_join"].null_count():
        return rows.drop("_join", *_KERNEL).with_columns(*no_kernel, host_arrival_ns=pl.col("arrival_ns"),
                                                          arrival=pl.lit("host"))
    return rows.with_columns(host_arrival_ns=pl.col("arrival_ns"), arrival_ns=pl.col("_join"),
                             arrival=pl.lit("device")).drop("_join")


def _blind_members(done: pl.DataFrame) -> list:
    """Of :func:`completions`' rows, the members none of whose collectives has its kernel where another member's
    have theirs: members that lost most of their kernels (:func:`_short_members`: a rank whose file was cut short
    kept 10 of its 63, from several streams' records, not the first ten) and so keep their calls. Their arrivals
    on the device are unknown; the others' are known, and their hosts' would not do (a balanced FSDP run, rank 0's
    file cut, named rank 3 a critical straggler on host arrivals)."""
    kernel = pl.col("done_source") == "kernel"
    seen = done.group_by("member").agg(kernel.any().alias("_kernel"))
    if not bool(seen["_kernel"].any()):
        return []
    return seen.filter(~pl.col("_kernel"))["member"].to_list()


def _cut_at_the_end(done: pl.DataFrame) -> pl.DataFrame | None:
    """Of :func:`completions`' rows, the instances (``process_group``, ``instance``) left out of device arrivals
    because the trace ended before a member's kernel ran (an empty frame where every member of every instance has
    its kernel), or None where arrivals must be the hosts': no kernel at all, or some member has none at an
    instance before its last one that has (or none at all).

    Why: the profiler stops while the last collective's kernels are still queued (a Megatron run: 85
    ``nccl:all_reduce`` calls a rank, 84 kernels, on all 8 ranks). That one instance made every arrival the
    host's, and the hosts run ahead of their GPUs: the straggler's cost came out twice the device's (1.476 s)."""
    kernel = pl.col("done_source") == "kernel"
    if not bool(done.select(kernel.any()).item()):
        return None
    member = pl.col("member").fill_null(_NO_RANK)
    last_kernel = done.filter(kernel).group_by(member.alias("_m")).agg(_last=pl.col("arrival_ns").max())
    missing = (done.filter(~kernel).with_columns(_m=member)
               .join(last_kernel, on="_m", how="left"))
    if bool(missing.select((pl.col("_last").is_null() | (pl.col("arrival_ns") <= pl.col("_last"))).any()).item()):
        return None
    most = missing.group_by("_m", "process_group").len()["len"].max()
    if most is not None and most > CUT_AT_END:  # not the profiler stopping: calls and kernels that do not pair
        return None
    return missing.select("process_group", "instance").unique()


#: Most collectives of a member and process group whose kernels the trace may have ended before
#: (:func:`_cut_at_the_end`): those in flight when the profiler stopped. More kernels missing at the end is calls
#: and kernels that do not pair (a pipeline's batched transfers with no launch to say which kernel is whose: 24
#: calls, 15 kernels a rank), and the arrivals stay the hosts'.
CUT_AT_END = 2


#: The member's communication kernel of a device arrival (:func:`_device_arrivals`; null for a host arrival).
_KERNEL = {"kernel_event_id": pl.Int64, "kernel_name": pl.String, "kernel_end_ns": pl.Int64}


def kernel_spin() -> pl.Expr:
    """Over :class:`CollectiveWaits` rows of device arrivals: how long the member's kernel spun waiting for the
    last member's to start, min(``wait_ns``, its own duration) (a kernel that ended first waited no longer)."""
    return pl.min_horizontal("wait_ns", pl.col("kernel_end_ns") - pl.col("arrival_ns")).clip(lower_bound=0)


class CollectiveWaits(Measure):
    """Per collective instance and member: its arrival, the last member's arrival, and its wait for it.

    From :class:`Collectives`, with arrivals on the device where every member's collectives ran as
    communication kernels (:func:`_device_arrivals`: the kernel's start, ``arrival`` ``"device"``; else the
    call's start, ``"host"``; ``host_arrival_ns`` is the call's start either way): for each
    (``process_group``, ``instance``), ``last_arrival_ns`` = the latest arrival of its members,
    ``last_member`` = the member that arrived then (of several at the same instant, the lowest), ``members`` =
    how many members have it, and per member ``wait_ns`` = last arrival − its arrival (0 for the last) and
    ``last`` (it is the last member). With ``align_clocks`` (ranks on
    several hosts, whose clocks differ), every member's arrival is first moved by its
    :func:`clock_offsets` (members leave a collective together). Columns: those of :class:`Collectives`
    plus ``host_arrival_ns``, ``arrival``, ``kernel_event_id``, ``kernel_name`` and ``kernel_end_ns`` (the
    member's communication kernel, on device arrivals; null on host ones), ``offset_ns``, ``last_arrival_ns``,
    ``last_member``, ``members``, ``wait_ns``, ``last``. On device arrivals a member's kernel spins for
    min(``wait_ns``, its duration) of its time: it started, and waited for the last member's kernel to start.

    Part and valid partitions: those of :class:`Collectives`.
    """

    name = "collective_waits"
    partitions = _VALID

    def part(self, events: pl.DataFrame, align_clocks: bool = False) -> pl.DataFrame:
        return _candidates(events)

    def combine(self, parts: list[pl.DataFrame], align_clocks: bool = False) -> pl.DataFrame:
        done = completions(parts)
        rows = _device_arrivals(collectives.combine(parts), parts, done)
        if align_clocks:
            rows = rows.join(clock_offsets(parts, done), on="member", how="left", nulls_equal=True)
        else:
            rows = rows.with_columns(offset_ns=pl.lit(0, dtype=pl.Int64))
        rows = rows.with_columns(offset_ns=pl.col("offset_ns").fill_null(0),
                                 arrival_ns=_moved(pl.col("arrival_ns"), pl.col("offset_ns").fill_null(0)),
                                 kernel_end_ns=_moved(pl.col("kernel_end_ns"), pl.col("offset_ns").fill_null(0)),
                                 host_arrival_ns=_moved(pl.col("host_arrival_ns"),
                                                        pl.col("offset_ns").fill_null(0)))
        inst = ["process_group", "instance"]
        member_key = pl.col("member").fill_null(_NO_RANK)
        last = (rows.sort([*inst, "arrival_ns", "member"], descending=[False, False, True, False], nulls_last=False)
                .group_by(inst, maintain_order=True)
                .agg(last_arrival_ns=pl.col("arrival_ns").first(), last_member=pl.col("member").first(),
                     members=pl.len().cast(pl.Int64)))
        out = (rows.join(last, on=inst, how="left", nulls_equal=True)
               .with_columns(wait_ns=_moved(pl.col("last_arrival_ns"), pl.col("arrival_ns")),
                             last=member_key == pl.col("last_member").fill_null(_NO_RANK))
               .sort([*inst, "member"], nulls_last=False))
        return out


# -- per-rank time breakdown (HTA's temporal breakdown) ------------------------------------------------------
_LAYERS = {"compute": compute_kernels, "kernels": lambda: expr.kind_is("kernel"),
           "gpu": lambda: expr.kind_is(*expr.GPU_KINDS), "comm": comm_kernels}


class RankTime(Measure):
    """Per (``trace_id``, ``rank``, ``device_id``): where the device's time goes, compute first (HTA's temporal breakdown).

    Over the span from the device's first to its last GPU activity (kernel, memcpy, memset; timed rows):
    ``compute_ns`` = |union of compute kernels|, ``comm_exposed_ns`` = time communication kernels run and no
    compute kernel does, ``memcpy_ns`` = time copies or memsets run and no kernel does, ``idle_ns`` = time
    nothing runs; the four add up to ``span_ns``. ``busy_ns`` = span − idle; ``comm_ns`` = |union of the
    communication kernels| (exposed or not). Communication here is on the device: a host-side collective
    (gloo) does not occupy the GPU, and the GPU's wait for it is idle time.

    Part: the unions of each layer per member; combine: their merge (union is associative). Valid
    partitions: rank, trace, device, row chunks.
    """

    name = "rank_time"
    per_trace = True
    partitions = _VALID

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        frames = []
        for layer, select in _LAYERS.items():
            rows = _keyed(events.filter(select() & placed()))
            frames.append(intervals.union(rows, MEMBER).with_columns(layer=pl.lit(layer)))
        return pl.concat(frames)

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        merged = intervals.merge(pl.concat(parts), ["layer", *MEMBER])
        length = pl.col("end") - pl.col("start")
        wide = merged.group_by(MEMBER).agg(
            **{f"{layer}_union": length.filter(pl.col("layer") == layer).sum() for layer in _LAYERS},
            first_ns=pl.col("start").filter(pl.col("layer") == "gpu").min(),
            last_ns=pl.col("end").filter(pl.col("layer") == "gpu").max())
        wide = wide.filter(pl.col("first_ns").is_not_null()).with_columns(
            pl.col(f"{layer}_union").fill_null(0).cast(pl.Int64) for layer in _LAYERS)
        out = (wide.with_columns(span_ns=pl.col("last_ns") - pl.col("first_ns"),
                                 compute_ns=pl.col("compute_union"),
                                 comm_exposed_ns=pl.col("kernels_union") - pl.col("compute_union"),
                                 memcpy_ns=pl.col("gpu_union") - pl.col("kernels_union"),
                                 busy_ns=pl.col("gpu_union"), comm_ns=pl.col("comm_union"))
               .with_columns(idle_ns=pl.col("span_ns") - pl.col("busy_ns"))
               .sort(MEMBER))
        return _unkeyed(out).select(*MEMBER, "first_ns", "last_ns", "span_ns", "compute_ns", "comm_exposed_ns",
                                    "memcpy_ns", "idle_ns", "busy_ns", "comm_ns")


comm_overlap = CommOverlap()
collectives = Collectives()
collective_waits = CollectiveWaits()
rank_time = RankTime()


def member_windows(events: Any, members: pl.DataFrame) -> dict[Any, list[tuple[int, int]]]:
    """Each member's step windows, ``[(start_ns, end_ns), ...]`` in its own clock: its steps
    (:func:`traceparse.measures.steps.step_series`: ``ProfilerStep#N``, step ranges, iteration marks), else
    one window over the span of its timed events.

    ``members`` has ``member`` and ``rank`` (as :class:`Collectives` rows do). A rank's events are its rows;
    the devices (or the process) of one trace share that trace's steps. On a run's partitions
    (:class:`traceparse.measures.base.PartitionedEvents`, one rank each) every rank is measured in turn. The
    windows bound what a member can wait: a wait is counted inside them only, so it is never longer than the
    member's step time (:func:`member_steps`). Steps that touch or overlap are one window.
    """
    return member_windows_counted(events, members)[0]


def member_windows_counted(events: Any, members: pl.DataFrame) -> tuple[dict[Any, list[tuple[int, int]]],
                                                                          dict[Any, int]]:
    """:func:`member_windows`, and each member's number of steps: the distinct steps of its step series, 1 for a
    member whose one window is the span of its events, 0 for one without events. Not the number of windows:
    steps end to end (``--step all`` lays the steps it cuts so; a step annotation ending where the next begins)
    are one window, and a wait "per step" divided by that one window was longer than a step."""
    wanted = members.select("member", "rank").unique()
    if isinstance(events, PartitionedEvents):
        per_rank: dict[Any, tuple[list[tuple[int, int]], int]] = {}
        for found in events.map(_rank_windows):
            per_rank.update(found)
        found = {r["member"]: per_rank.get(r["rank"], ([], 0)) for r in wanted.iter_rows(named=True)}
    else:
        found = {}
        for r in wanted.iter_rows(named=True):
            rows = events.filter(pl.col("rank") == r["rank"]) if r["rank"] is not None else events
            found[r["member"]] = _windows(rows)
    return {m: w for m, (w, _) in found.items()}, {m: n for m, (_, n) in found.items()}


def member_steps(events: Any, members: pl.DataFrame) -> dict[Any, int]:
    """Each member's step time: the total length of its :func:`member_windows`."""
    return {m: sum(e - s for s, e in w) for m, w in member_windows(events, members).items()}


def _rank_windows(events: pl.DataFrame) -> dict[Any, tuple[list[tuple[int, int]], int]]:
    """{rank: (step windows, steps)} of a group of a run's partitions (each one rank's rows, in its own trace).

    The ranks whose trace has ``ProfilerStep#N`` annotations get them in one pass over the group (one rank per
    trace: per trace is per rank); the others, rank by rank (their steps may come from ranges or marks,
    chosen per rank).
    """
    from traceparse.measures.steps import step_series

    out: dict[Any, tuple[list[tuple[int, int]], int]] = {}
    ranks = _rank_of_trace(events.filter(pl.col("rank").is_not_null()))
    if ranks is not None and ranks.height > 1:
        s = step_series(events)
        if s.height and (s["source"] == "ProfilerStep#N").all():
            counts = dict(keyed(s).join(ranks, on="trace_id", how="inner").group_by("rank")
                          .agg(pl.col("step").n_unique()).iter_rows())
            merged = intervals.union(keyed(s).select("trace_id", "start_ns", "duration_ns"), ["trace_id"])
            merged = merged.join(ranks, on="trace_id", how="inner")
            for (rank,), rows in merged.sort("start").group_by("rank", maintain_order=True):
                out[rank] = ([(int(a), int(b)) for a, b in rows.select("start", "end").iter_rows()],
                             int(counts.get(rank, 0)))
    for rank in events["rank"].drop_nulls().unique().to_list():
        if rank not in out:
            out[rank] = _windows(events.filter(pl.col("rank") == rank))
    return out


def _windows(rows: pl.DataFrame) -> tuple[list[tuple[int, int]], int]:
    """The step windows of one member's rows and its number of steps (:func:`member_windows_counted`)."""
    from traceparse.measures.steps import step_series

    s = step_series(rows.with_columns(trace_id=pl.lit(None, dtype=pl.String)))
    if s.height:
        merged = intervals.union(s.select("start_ns", "duration_ns"))
        return [(int(a), int(b)) for a, b in merged.select("start", "end").iter_rows()], int(s["step"].n_unique())
    first, last = rows.filter(placed()).select(pl.col("start_ns").min().alias("first"),
                                               (pl.col("start_ns") + pl.col("duration_ns")).max().alias("last")).row(0)
    return ([], 0) if first is None or last is None else ([(int(first), int(last))], 1)


def member_compute(events: Any, waits: pl.DataFrame) -> pl.DataFrame | None:
    """Each member's compute kernels (``member``, ``start_ns``, ``duration_ns``), for the members of ``waits``
    (:class:`CollectiveWaits` rows): a rank's, a device's (the members of one process driving several GPUs), or
    every compute kernel (the one process). What a member's GPU did while its communication kernel waited, for
    :func:`waiting_time`; None where the waits are not the device's (host-side collectives such as gloo's)."""
    if waits.height == 0 or not bool((waits["arrival"] == "device").all()):
        return None
    rows = events.filter(compute_kernels(), placed())
    if waits["rank"].is_not_null().any():
        member = pl.col("rank").cast(pl.Int32)
    elif waits["member"].is_not_null().any():
        member = pl.col("device_id").cast(pl.Int32)
    else:
        member = pl.lit(_NO_RANK, dtype=pl.Int32)
    return rows.select(member=member, start_ns="start_ns", duration_ns="duration_ns").filter(
        pl.col("member").is_not_null())


def arrivals_unknown(events: Any) -> list:
    """The members with collective calls whose arrivals the waits leave out: they lost the communication kernels
    of their calls while others kept theirs (:func:`_blind_members`), so how long they waited is unknown, not
    nothing."""
    calls = collectives(events)["member"].drop_nulls().unique().to_list()
    waits = set(collective_waits(events, align_clocks=False)["member"].drop_nulls().to_list())
    return sorted(m for m in calls if m not in waits)


def device_spin(events: Any) -> dict[Any, int]:
    """{member: the time its communication kernels spin for a later rank's kernel while none of its compute
    kernels runs, over the whole trace}: time the GPU is busy with nothing but waiting for another rank. A member
    is a rank (a device where the trace has no ranks); {} where the collectives are not waited for on the device
    (gloo's host-side waits, one member alone). What "GPU busy" holds that is no work: the all-reduces of a
    tensor-parallel run spin hundreds of ms for the slowest rank and count as busy. Over the whole trace, as
    "GPU busy" and the communication time it is set against are (counted inside the steps only, two NCCL ranks
    whose steps cover part of the capture read "1.3% waiting" where 2.5% of the GPUs' span was). Computed once
    per analysis (comm-compute-overlap and the summary ask it of the same table)."""
    def compute() -> dict[Any, int]:
        waits = collective_waits(events, align_clocks=False)  # stragglers' parameters: measured once
        if waits.height == 0 or waits["member"].n_unique() < 2:
            return {}
        busy = member_compute(events, waits)
        if busy is None:
            return {}
        return {m: int(ns) for m, ns in waiting_time(waits, _whole(waits), busy).iter_rows() if m is not None}

    return dict(shared(events, "device_spin", compute))


def device_spin_split(events: Any) -> dict[Any, tuple[int, int]]:
    """{member: (the time its communication kernels spin for a later rank's kernel, the part of it during which
    its compute kernels run)}, each kernel's spin counted as its kernel's time is (summed over the kernels, not
    their union): what comes off a member's communication time, and off the part of it that overlaps compute, to
    leave the time the kernels do their own work and its overlap. {} as :func:`device_spin`'s. A spin that overlaps
    compute is no work either: four real DDP ranks' kernels spun 150.8 of their 164.9 ms, 39 of it beside compute,
    and the overlap of their own work read 81.7% where it was 30.8%."""
    def compute() -> dict[Any, tuple[int, int]]:
        waits = collective_waits(events, align_clocks=False)
        if waits.height == 0 or waits["member"].n_unique() < 2:
            return {}
        busy = member_compute(events, waits)
        if busy is None:
            return {}
        rows = spun(waits).filter(pl.col("wait_ns") > 0)
        if rows.height == 0:
            return {}
        key = pl.col("member").fill_null(_NO_RANK).cast(pl.Int32)
        offsets, _ = _step_cover(rows, {})
        spins = rows.select(member=key, start_ns=pl.col("arrival_ns"), duration_ns=pl.col("wait_ns")).filter(
            pl.col("start_ns").is_not_null())
        spins = spins.with_columns(beside=intervals.overlap_with(spins, _on_waits_clock(busy, offsets), ["member"]))
        totals = spins.group_by("member").agg(pl.col("duration_ns").sum(), pl.col("beside").sum())
        return {(None if m == _NO_RANK else m): (int(ns), int(beside)) for m, ns, beside in totals.iter_rows()}

    return dict(shared(events, "device_spin_split", compute))


def _whole(waits: pl.DataFrame) -> dict[Any, list[tuple[int, int]]]:
    """Each member's one window that holds all its waits, in its own clock (:func:`waiting_time`'s windows move by
    the member's ``offset_ns``): waits counted wherever they are, not only inside steps."""
    rows = spun(waits).filter(pl.col("wait_ns") > 0)
    if rows.height == 0:
        return {}
    off = pl.col("offset_ns").fill_null(0) if "offset_ns" in rows.columns else pl.lit(0)
    spans = rows.group_by("member").agg(lo=(pl.col("arrival_ns") + off).min() - 1,
                                        hi=(pl.col("arrival_ns") + pl.col("wait_ns") + off).max() + 1)
    return {m: [(int(lo), int(hi))] for m, lo, hi in spans.iter_rows()}


def _union_lengths(*frames: pl.DataFrame) -> dict[int, int]:
    """Per member, the length of the union of the intervals of ``frames`` (each ``member``, ``start_ns``,
    ``duration_ns``)."""
    merged = intervals.union(pl.concat([f.select("member", "start_ns", "duration_ns") for f in frames]), ["member"])
    return dict(merged.group_by("member").agg((pl.col("end") - pl.col("start")).sum()).iter_rows())


def spun(waits: pl.DataFrame) -> pl.DataFrame:
    """``waits`` (:class:`CollectiveWaits` rows) with each device arrival's ``wait_ns`` cut where its kernel ended
    (:func:`kernel_spin`): a member waits in its communication kernel, and no longer once that kernel is done (a
    broadcast's root sends and ends 1.5–3.3 ms before the last rank's kernel starts: that was no wait)."""
    if "kernel_end_ns" not in waits.columns or "arrival" not in waits.columns:
        return waits
    device = (pl.col("arrival") == "device") & pl.col("kernel_end_ns").is_not_null()
    return waits.with_columns(wait_ns=pl.when(device).then(kernel_spin()).otherwise(pl.col("wait_ns")))


def waiting_time(waits: pl.DataFrame, windows: dict[Any, list[tuple[int, int]]],
                 busy: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per member, the time it spent waiting, counted once: |union of its waits ∩ its step windows|.

    ``waits`` are :class:`CollectiveWaits` rows (any subset: e.g. only the instances one rank was last at);
    a wait is the interval from the member's arrival to the last arrival (on the aligned clock, so the
    windows move by the member's ``offset_ns`` too), on the device at most until the member's own kernel ended
    (:func:`spun`). Collectives in flight at once (gloo keeps two) wait
    over the same time: the union counts it once, and the windows keep it inside the member's steps, so
    no member waits longer than its step time.

    Waits on the device (``arrival`` ``"device"``: communication kernels spinning for the last rank's) count
    only where ``busy`` (:func:`member_compute`: the member's compute kernels) runs nothing: FSDP's all-gathers
    wait on a stream of their own while the layer before computes, and that wait costs the rank nothing.
    Columns: ``member``, ``waited_ns``.
    """
    rows = spun(waits).filter(pl.col("wait_ns") > 0)
    if rows.height == 0:
        return pl.DataFrame(schema={"member": pl.Int32, "waited_ns": pl.Int64})
    key = pl.col("member").fill_null(_NO_RANK).cast(pl.Int32)
    spans = intervals.union(rows.select(member=key, start_ns=pl.col("arrival_ns"), duration_ns=pl.col("wait_ns")),
                            ["member"])
    offsets, cover = _step_cover(rows, windows)
    spans = spans.select("member", start_ns=pl.col("start"), duration_ns=pl.col("end") - pl.col("start"))
    inside = intervals.overlap_with(spans, cover, ["member"])
    out = (spans.with_columns(inside.alias("waited_ns")).group_by("member")
           .agg(pl.col("waited_ns").sum().cast(pl.Int64)).sort("member"))
    device = "arrival" in rows.columns and bool((rows["arrival"] == "device").all())
    if device and busy is not None and busy.height:
        # |waits ∩ steps ∩ compute| by inclusion-exclusion over union lengths (A waits, W steps, B compute)
        a, w = spans, cover
        b = _on_waits_clock(busy.filter(pl.col("member").is_in(a["member"].unique().implode())), offsets)
        n = [_union_lengths(*f) for f in ((a,), (w,), (b,), (a, w), (a, b), (w, b), (a, w, b))]
        covered = {m: n[0].get(m, 0) + n[1].get(m, 0) + n[2].get(m, 0) - n[3].get(m, 0) - n[4].get(m, 0)
                   - n[5].get(m, 0) + n[6].get(m, 0) for m in n[0]}
        out = out.with_columns(waited_ns=pl.col("waited_ns") - pl.col("member").replace_strict(
            covered, default=0, return_dtype=pl.Int64))
    return out.with_columns(member=pl.when(pl.col("member") != _NO_RANK).then(pl.col("member")))


def _on_waits_clock(busy: pl.DataFrame, offsets: dict[int, int]) -> pl.DataFrame:
    """``busy`` (:func:`member_compute`'s intervals) moved onto the clock of the waits, each member by its
    ``offsets`` (:func:`_step_cover`'s)."""
    return busy.with_columns(start_ns=_moved(pl.col("start_ns"), pl.col("member").replace_strict(
        offsets, default=0, return_dtype=pl.Int64)))


def _step_cover(rows: pl.DataFrame, windows: dict[Any, list[tuple[int, int]]]) -> tuple[dict[int, int], pl.DataFrame]:
    """The members' clock offsets ({member key: ns}) and their step ``windows`` as intervals on the clock of the
    waits (``member`` keyed as :func:`waiting_time` keys it, ``start_ns``, ``duration_ns``)."""
    key = pl.col("member").fill_null(_NO_RANK).cast(pl.Int32)
    offsets = dict(rows.select(key.alias("m"), pl.col("offset_ns").fill_null(0)).unique("m").iter_rows())
    cover = pl.DataFrame(
        [{"member": _NO_RANK if m is None else m,
          "start_ns": min(max(a - offsets.get(_NO_RANK if m is None else m, 0), _INT64[0]), _INT64[1]),
          "duration_ns": b - a} for m, w in windows.items() for a, b in w],
        schema={"member": pl.Int32, "start_ns": pl.Int64, "duration_ns": pl.Int64})
    return offsets, cover


def waiting_by_instance(waits: pl.DataFrame, windows: dict[Any, list[tuple[int, int]]],
                        busy: pl.DataFrame | None = None) -> pl.DataFrame:
    """:func:`waiting_time` put down to the instances: per member and instance, the part of the member's time
    waited that is first waited at that instance, so that a member's instances add up to its time waited.

    Collectives in flight at once wait over the same time; a moment of waiting belongs to the instance that was
    waiting first (by arrival, then end), counted as :func:`waiting_time` counts it: inside the member's steps
    and, on the device, where its compute kernels (``busy``) run nothing. This is what a chart of the wait at
    each collective adds up, and the wait each rank causes (stragglers): never more than the time the members
    waited (a sum of raw waits counted the same moment at every collective in flight, 1,146.8 ms of a run whose
    ranks waited 665.9). Columns: ``member``, ``process_group``, ``instance``, ``waited_ns``.
    """
    schema = {"member": waits.schema.get("member", pl.Int32), "process_group": waits.schema.get(
        "process_group", pl.String), "instance": waits.schema.get("instance", pl.Int64), "waited_ns": pl.Int64}
    rows = spun(waits).filter(pl.col("wait_ns") > 0)
    if rows.height == 0:
        return pl.DataFrame(schema=schema)
    key = pl.col("member").fill_null(_NO_RANK).cast(pl.Int32)
    end = pl.col("arrival_ns") + pl.col("wait_ns")
    held = (rows.select(key.alias("key"), "member", "process_group", "instance", "arrival_ns", end.alias("end"))
            .sort(["key", "arrival_ns", "end", "process_group", "instance"], nulls_last=True)
            .with_columns(before=pl.col("end").cum_max().shift(1).over("key")))
    # the part of each wait no earlier wait of the member covered: disjoint pieces whose union is the members'
    first = pl.max_horizontal("arrival_ns", pl.col("before").fill_null(pl.col("arrival_ns")))
    pieces = held.with_columns(start_ns=first, duration_ns=(pl.col("end") - first).clip(lower_bound=0))
    offsets, cover = _step_cover(rows, windows)
    spans = pieces.select(pl.col("key").alias("member"), "start_ns", "duration_ns")
    inside = intervals.overlap_with(spans, cover, ["member"])
    device = "arrival" in rows.columns and bool((rows["arrival"] == "device").all())
    if device and busy is not None and busy.height:
        # a device wait counts where its compute kernels run nothing: |piece ∩ steps \ busy| =
        # |piece ∩ (steps ∪ busy)| - |piece ∩ busy|, so that a member's pieces add up to waiting_time's figure
        b = _on_waits_clock(busy, offsets)
        either = pl.concat([cover, b.select(cover.columns).cast(cover.schema)])
        inside = intervals.overlap_with(spans, either, ["member"]) - intervals.overlap_with(spans, b, ["member"])
    pieces = pieces.with_columns(inside.alias("waited_ns"))
    return pieces.select("member", "process_group", "instance", pl.col("waited_ns").cast(pl.Int64))
