"""The process group of each collective call and transfer that the trace leaves open (gloo names none).

A rank of a job with several groups (data parallel beside pipeline or tensor parallel) lists the groups it is in
(``process_group_choices``); which one a call ran over is settled from when the members leave it together
(:func:`settled_groups`). A transfer whose peer may be one of several ranks gets the one whose own transfers
name this rank the other way (:func:`settled_peers`). And a worker annotation that carried out a call of another
collective (gloo runs a reduce-scatter as ``gloo:all_reduce``) takes the call's (:func:`worker_collectives`).
:func:`traceparse.measures.comm._instances` applies all three before it numbers the instances.
"""

from __future__ import annotations

import polars as pl

from traceparse.measures.comm_links import carried_out_by, tensor_sizes
from traceparse.measures.comm_sources import COMPLETION_SOURCES, POINT_TO_POINT, SOURCES, is_transfer


#: How far apart (ns) the members of a collective may leave it, beyond twice the closest grouping's spread, for
#: a grouping of coarser groups to be taken (:func:`settled_groups`): gloo's members of one all-reduce leave
#: it within a fraction of a millisecond on one clock, two groups' all-reduces end milliseconds apart.
TOGETHER_NS = 100_000


def settled_groups(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (candidates of every source) with the collectives that name no process group and may be of several
    (``process_group_choices``: the rank's groups) given one: that of the *grouping* whose members leave their
    collectives together. Why: gloo names no group, and a job with data-parallel groups ``[0, 2]`` and ``[1, 3]``
    beside pipelines ``[0, 1]`` and ``[2, 3]`` all-reduces in pairs; matched as the n-th all-reduce of every
    rank, the two pairs' all-reduces were one, ranks waited for ranks they never met, and the ranks' clocks
    seemed 15 ms apart.

    A grouping is a set of same-size groups that together hold every such member once, built from the groups
    the members list (each group's members: the ranks listing it). Each is scored by how far apart its
    instances' members leave them (the median over instances of the last end less the first, the k-th
    collective of each member in its group), on the events that end with the collective: kernels where every
    member has them, else host annotations, else the calls. The coarsest grouping within twice the best score
    and :data:`TOGETHER_NS` is taken (a coarser one is never closer: its instances hold more members; of one
    size, the closest); where only one grouping is possible, that one. Only where no collective of the run
    names its group (a trace that names some is read as it says). ``process_group_choices`` dropped.

    A job may use several groupings at once: tensor parallelism inside data parallelism all-reduces
    activations over ``[0, 1]``, ``[2, 3]``, gathers parameters over ``[0, 2]``, ``[1, 3]`` and a loss over all
    four. So the calls are settled by *family* (the collective and the shapes it moves, :func:`_call_families`),
    each family present on every member on its own, scored on the worker events that carried its calls out
    (:func:`traceparse.measures.comm_links.carried_out_by`), which take their call's group and collective; what
    is left (a family some members lack, a worker event no call claims) is settled as one."""
    if "process_group_choices" not in rows.columns:
        return rows
    collective = ~is_transfer() & pl.col("rank").is_not_null()  # only ranks list choices
    open_ = collective & pl.col("process_group_choices").is_not_null() & pl.col("process_group").is_null()
    test = rows.select(open_=open_.any(), named=(collective & pl.col("process_group").is_not_null()).any())
    if not test["open_"][0] or test["named"][0]:
        return rows.drop("process_group_choices")
    rows = rows.with_row_index("_row")
    unsettled = rows.filter(open_).with_columns(member=pl.col("rank"))
    listed = (unsettled.select("member", _g=pl.col("process_group_choices").str.json_decode(pl.List(pl.String)))
              .explode("_g").drop_nulls().unique())
    members_of = {g: frozenset(m) for g, m in listed.group_by("_g").agg("member").iter_rows()}
    everyone = frozenset(listed["member"].to_list())
    groupings = _groupings(members_of, everyone)
    if not groupings:
        return rows.drop("process_group_choices", "_row")
    settled = []  # frames of _row, _group, _collective (null: the row's own)
    rest = unsettled
    families, nested = _call_families(unsettled, everyone)
    for family in families:
        size = _group_size(family)  # what the shapes say, where they say it
        fitting = [g for g in groupings if len(members_of[g[0]]) == size] or groupings
        chosen = fitting[0] if len(fitting) == 1 else _closest_grouping(family, fitting, members_of)
        group_of = {m: g for g in chosen for m in members_of[g]}
        group = pl.col("member").replace_strict(group_of, default=None, return_dtype=pl.String)
        settled.append(family.select("_row", _group=group, _collective=pl.lit(None, dtype=pl.String)))
        settled.append(family.filter(pl.col("_by").is_not_null())
                       .select(_row="_by", _group=group, _collective=pl.col("collective")))
        rest = rest.join(family.select("_row"), on="_row", how="anti").join(
            family.select(_row="_by").drop_nulls(), on="_row", how="anti")
    if settled and nested.height:  # a call inside another takes the group of the call around it
        outer = pl.concat(settled).select(_outer="_row", _group="_group")
        inner = nested.join(outer, on="_outer", how="inner").select(
            "_row", "_group", _collective=pl.lit(None, dtype=pl.String))
        settled.append(inner)
        rest = rest.join(inner.select("_row"), on="_row", how="anti")
    if rest.height:
        chosen = groupings[0] if len(groupings) == 1 else _closest_grouping(rest, groupings, members_of)
        group_of = {m: g for g in chosen for m in members_of[g]}
        settled.append(rest.select("_row", _group=pl.col("member").replace_strict(group_of, default=None,
                                                                                  return_dtype=pl.String),
                                   _collective=pl.lit(None, dtype=pl.String)))
    found = pl.concat(settled).unique("_row", keep="first")
    return (rows.join(found, on="_row", how="left")
            .with_columns(process_group=pl.when(open_).then(pl.col("_group")).otherwise(pl.col("process_group")),
                          collective=pl.coalesce("_collective", "collective"))
            .sort("_row").drop("_row", "_group", "_collective", "process_group_choices"))


#: Collectives whose data tells their group's size: an all-gather's output is the group's size times its input,
#: a reduce-scatter's input the group's size times its output.
_SIZED_BY_DATA = ("all_gather", "reduce_scatter")


def _group_size(family: pl.DataFrame) -> int | None:
    """The size of the group ``family``'s calls (:func:`_call_families`) run over where their shapes say it: an
    all-gather or a reduce-scatter that moves two tensor sizes, one a whole multiple (≥ 2) of the other, the
    same on every call; else None. Where every member is in step, the ends of a coarser grouping's instances
    are as close as the true one's, and only the data tells pairs from the world."""
    if family["collective"][0] not in _SIZED_BY_DATA:
        return None
    ratios = set()
    for dims in family["input_dims"].unique().to_list():
        sizes = sorted(tensor_sizes(dims))
        if len(sizes) != 2 or sizes[1] % sizes[0] or sizes[1] // sizes[0] < 2:
            return None
        ratios.add(sizes[1] // sizes[0])
    return ratios.pop() if len(ratios) == 1 else None


#: The sources of calls (not their worker events, nor kernels) among :data:`SOURCES`.
_CALL_SOURCES = SOURCES[:3]


def _outermost_calls(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``rows``' calls (:data:`_CALL_SOURCES`; ``_row``, ``member``, the candidates' columns) that no other call of
    their thread holds, and those inside another (``_c10d_functional::all_reduce`` holds ``c10d::allreduce_``:
    one call, :func:`traceparse.measures.comm._instances`) as ``_row`` and ``_outer`` (the enclosing call's
    ``_row``)."""
    thread = ["member", "trace_id", "pid", "tid"]
    calls = (rows.filter(pl.col("source").is_in(list(_CALL_SOURCES)))
             .sort([*thread, "start_ns", "event_id"], nulls_last=False))
    inside = pl.col("start_ns") < pl.col("end_ns").cum_max().shift(1).over(thread)
    calls = calls.with_columns(_inside=inside.fill_null(False))
    calls = calls.with_columns(_outer=pl.when(~pl.col("_inside")).then(pl.col("_row")).forward_fill().over(thread))
    return (calls.filter(~pl.col("_inside")).drop("_inside", "_outer"),
            calls.filter(pl.col("_inside")).select("_row", "_outer"))


def worker_collectives(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with each worker annotation that carried out a call of another collective given the call's: gloo
    runs a reduce-scatter as ``gloo:all_reduce``, and matched as the k-th of its collective, a reduce-scatter
    found no annotation (it ended with its own call, queued, not exchanged) and the all-reduces took the
    reduce-scatters' (the loss's all-reduce ended before some ranks had arrived). Only where, on some member, a
    collective's calls and its annotations differ in number (what :func:`settled_groups` links is already
    given); the link is :func:`traceparse.measures.comm_links.carried_out_by`'s."""
    collective = ~is_transfer() & pl.col("rank").is_not_null() & pl.col("collective").is_not_null()
    kind = (pl.when(pl.col("source").is_in(list(_CALL_SOURCES))).then(pl.lit("call"))
            .when(pl.col("source") == "host annotation").then(pl.lit("worker")))
    counts = (rows.filter(collective).with_columns(_kind=kind).drop_nulls("_kind")
              .group_by("rank", "collective", "_kind").len()
              .pivot("_kind", index=["rank", "collective"], values="len"))
    if "call" not in counts.columns or "worker" not in counts.columns or counts.select(
            (pl.col("call").fill_null(0) == pl.col("worker").fill_null(0)).all()).item():
        return rows
    rows = rows.with_row_index("_row")
    open_ = rows.filter(collective).with_columns(member=pl.col("rank"))
    calls, _ = _outermost_calls(open_)
    links = carried_out_by(calls, open_.filter(pl.col("source") == "host annotation"))
    given = links.join(calls.select("_row", _collective="collective"), on="_row", how="inner").select(
        _row="_by", _collective="_collective")
    return (rows.join(given, on="_row", how="left")
            .with_columns(collective=pl.coalesce("_collective", "collective"))
            .sort("_row").drop("_row", "_collective"))


def _call_families(unsettled: pl.DataFrame, everyone: frozenset) -> tuple[list[pl.DataFrame], pl.DataFrame]:
    """``unsettled`` (open collective rows: ``_row``, ``member``, the candidates' columns)'s outermost calls by
    family: the collective and the shapes it moves (``input_dims``), one frame per family that every one of
    ``everyone`` calls and whose every call is linked to the worker event that carried it out (``_by``: its
    ``_row``), the worker's source and end in place of the call's (the end of the exchange,
    :func:`_closest_grouping`'s signal). And the calls inside another of their thread
    (:func:`_outermost_calls`): they take its group."""
    calls, nested = _outermost_calls(unsettled)
    workers = unsettled.filter(pl.col("source") == "host annotation")
    if calls.height == 0:
        return [], nested
    links = carried_out_by(calls, workers) if workers.height else pl.DataFrame(
        schema={"_row": pl.UInt32, "_by": pl.UInt32})
    ends = workers.select(_by="_row", _by_source="source", _by_end="end_ns")
    calls = calls.join(links, on="_row", how="left").join(ends, on="_by", how="left")
    out = []
    for _, family in calls.group_by("collective", "input_dims", maintain_order=True):
        # a family some member lacks, or whose calls' ends are not all known (no shapes recorded, a worker cut
        # off by the trace's end: a call's own end is when it was queued), is left to the settlement of the rest
        if frozenset(family["member"].to_list()) != everyone or family["_by"].is_null().any():
            continue
        out.append(family.with_columns(source="_by_source", end_ns="_by_end").drop("_by_source", "_by_end"))
    return out, nested


def _groupings(members_of: dict[str, frozenset], everyone: frozenset) -> list[tuple[str, ...]]:
    """The ways to cover ``everyone`` once with groups of one size (:func:`settled_groups`), coarsest first:
    from each group, the groups of its size that share no member with those taken, in order of name."""
    by_size = sorted(members_of, key=lambda g: (-len(members_of[g]), g))
    found: list[tuple[str, ...]] = []
    for first in by_size:
        taken, covered = [first], set(members_of[first])
        for other in by_size:
            if other != first and len(members_of[other]) == len(members_of[first]) \
                    and not covered & members_of[other]:
                taken.append(other)
                covered |= members_of[other]
        grouping = tuple(sorted(taken))
        if covered == everyone and grouping not in found:
            found.append(grouping)
    return found


def _closest_grouping(rows: pl.DataFrame, groupings: list[tuple[str, ...]],
                      members_of: dict[str, frozenset]) -> tuple[str, ...]:
    """Of ``groupings`` (coarsest first), the coarsest whose members leave their collectives together
    (:func:`settled_groups`), judged on ``rows`` (the collectives to settle, every source)."""
    ends = None
    for sources in (*COMPLETION_SOURCES, tuple(SOURCES)):
        found = rows.filter(pl.col("source").is_in(list(sources)))
        if found.height and found["member"].n_unique() == rows["member"].n_unique():
            best = pl.col("source").replace_strict({s: i for i, s in enumerate(SOURCES)}, default=len(SOURCES),
                                                   return_dtype=pl.Int32)
            found = found.filter(best == best.min().over("member"))
            k = pl.int_range(pl.len(), dtype=pl.Int64).over("member", "step")  # the k-th in its step, as matched
            ends = found.sort(["member", "start_ns", "trace_id", "event_id"]).select("member", "end_ns", "step", _k=k)
            break
    if ends is None:
        return groupings[0]
    scores = []
    for grouping in groupings:
        group_of = {m: g for g in grouping for m in members_of[g]}
        spread = (ends.with_columns(_g=pl.col("member").replace_strict(group_of, default=None,
                                                                      return_dtype=pl.String))
                  .group_by("_g", "step", "_k").agg(apart=pl.col("end_ns").max() - pl.col("end_ns").min(), n=pl.len())
                  .filter(pl.col("n") > 1)["apart"].median())
        scores.append(float("inf") if spread is None else float(spread))
    bound = 2 * min(scores) + TOGETHER_NS
    # the coarsest within the bound; of one size, the closest (two groupings of pairs, data and tensor parallel)
    within = [(-len(members_of[g[0]]), score, i) for i, (g, score) in enumerate(zip(groupings, scores))
              if score <= bound]
    return groupings[min(within)[2]]


def settled_peers(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with each transfer whose peer the trace left open (``peer_rank_choices``: the ranks it may be, a JSON
    list, the likeliest first) given the one of them whose own transfers name this member as theirs, the other
    way (a send's peer receives from it; a ``send_recv`` either way): rank 2's peer ``1`` over an unnamed group
    is rank 3 where rank 3 receives from rank 2 and rank 1 does not. Where none or several do, the first listed
    (the default group's numbering, as the trace's number reads). Members are ranks; ``peer_rank_choices``
    dropped."""
    if "peer_rank_choices" not in rows.columns:
        return rows
    open_ = pl.col("peer_rank_choices").is_not_null() & pl.col("peer_rank").is_null() & is_transfer()
    if not rows.select(open_.any()).item():
        return rows.drop("peer_rank_choices")
    listed = pl.col("peer_rank_choices").str.json_decode(pl.List(pl.Int32))
    rows = rows.with_row_index("_row")
    transfers = rows.filter(is_transfer() & pl.col("member").is_not_null())
    # every (member, direction, rank it may exchange with) of the run's transfers
    may = pl.when(pl.col("peer_rank").is_not_null()).then(pl.concat_list(pl.col("peer_rank").cast(pl.Int32)))
    named = (transfers.select("member", "collective", may.otherwise(listed).alias("_may"))
             .explode("_may").drop_nulls("_may").unique())
    choices = (transfers.filter(open_).select("_row", "member", "collective", _may=listed)
               .with_columns(_order=pl.int_ranges(pl.col("_may").list.len())).explode("_may", "_order"))
    other_way = {"send": ["recv", "send_recv"], "recv": ["send", "send_recv"], "send_recv": list(POINT_TO_POINT)}
    answered = (choices.join(named.select(_may="member", member="_may", _back="collective"),
                             on=["_may", "member"], how="inner")
                .filter(pl.col("collective").replace_strict(other_way, return_dtype=pl.List(pl.String))
                        .list.contains(pl.col("_back")))
                .select("_row", "_may").unique())
    settled = answered.group_by("_row").agg(pl.col("_may").first(), n=pl.len()).filter(pl.col("n") == 1)
    first = choices.filter(pl.col("_order") == 0).select("_row", _first="_may")
    rows = (rows.join(settled.select("_row", _one="_may"), on="_row", how="left")
            .join(first, on="_row", how="left")
            .with_columns(peer_rank=pl.when(open_).then(pl.coalesce("_one", "_first")).otherwise("peer_rank")
                          .cast(pl.Int32)))
    return rows.sort("_row").drop("_row", "_one", "_first", "peer_rank_choices")
