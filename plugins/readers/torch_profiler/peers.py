"""Communication calls that name no process group: the groups and peers they may be of, from the rank's groups.

gloo's calls are recorded as ``c10d::*`` operators and ``gloo:*`` annotations without their process group, and
``c10d::send``/``c10d::recv_`` record their peer as their third argument in the numbering of that unnamed
group: rank 2 sending to rank 3 over the pipeline group ``[2, 3]`` records ``1``. Kineto's
``distributedInfo.pg_config`` lists the groups the rank belongs to, with their ranks. So a peer is one of
``ranks[peer]`` over those groups: ``peer_rank`` where that is one rank; where it is several (``1`` is rank 1
in the default group and rank 3 in ``[2, 3]``), ``peer_rank`` is null and ``peer_rank_choices`` lists them, the
default group's first. A collective is over one of those groups: ``process_group_choices`` lists their names
where there are several. Which one it is shows only across the run's ranks (the transfer's other side names
this rank; the members of a collective leave it together), and :mod:`traceparse.measures.comm` settles it there.
"""

from __future__ import annotations

import json

import polars as pl

from traceparse.trace import TraceMeta

from traceparse_plugins.readers.torch_profiler.events import PEER_ARGUMENT_OPS

#: Collectives that are point-to-point (their other side is a peer, not a group).
TRANSFERS = ("send", "recv", "send_recv")


def member_groups(meta: TraceMeta) -> list[tuple[str, list[int]]] | None:
    """The name and ranks of each process group this trace's rank belongs to (``pg_config``), largest group
    first; None where the trace does not say its rank, or any group's name or ranks is missing (then a call
    cannot be placed in every group it may be of)."""
    info = meta.distributed or {}
    rank = info.get("rank")
    groups = info.get("process_groups")
    if not isinstance(rank, int) or not groups:
        return None
    found = []
    for group in groups:
        name, ranks = group.get("name"), group.get("ranks")
        if name is None or not isinstance(ranks, list) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            return None
        if rank in ranks:
            found.append((str(name), ranks))
    return sorted(found, key=lambda g: len(g[1]), reverse=True) or None


def peer_choices(local: int, me: int, groups: list[tuple[str, list[int]]]) -> list[int]:
    """The ranks a peer numbered ``local`` in an unnamed group of ``me``'s may be, largest group first, each once,
    never ``me`` (no rank sends to itself)."""
    out: list[int] = []
    for _, ranks in groups:
        if 0 <= local < len(ranks) and ranks[local] != me and ranks[local] not in out:
            out.append(ranks[local])
    return out


def with_group_choices(batch: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """``batch`` with what its communication rows that name no process group may be, from the rank's groups
    (:func:`member_groups`): the c10d calls' peers (:data:`PEER_ARGUMENT_OPS`) made run ranks (``peer_rank``
    where one rank fits, else ``peer_rank_choices``, a JSON list, and ``peer_rank`` null); the collectives'
    groups (``process_group_choices``, a JSON list of names) where the rank belongs to several. As it is where
    the trace lists no groups, and where a peer fits none of them."""
    groups = member_groups(meta) if batch.height and "collective" in batch.columns else None
    if not groups or len(groups) < 2:  # in the default group alone, every call reads as it is
        return batch
    unnamed = pl.col("collective").is_not_null() & pl.col("process_group").is_null()
    calls = unnamed & pl.col("name").is_in(PEER_ARGUMENT_OPS) & pl.col("peer_rank").is_not_null()
    collectives = unnamed & ~pl.col("collective").is_in(TRANSFERS)
    found = batch.select(calls=pl.col("peer_rank").filter(calls).unique().implode(), collectives=collectives.any())
    locals_, any_collective = found["calls"][0].to_list(), found["collectives"][0]
    if not locals_ and not any_collective:
        return batch
    me = meta.distributed["rank"]
    choices = {p: peer_choices(p, me, groups) for p in locals_}
    one = {p: c[0] for p, c in choices.items() if len(c) == 1}
    several = {p: json.dumps(c) for p, c in choices.items() if len(c) > 1}
    local = pl.col("peer_rank")
    names = json.dumps([name for name, _ in groups])
    return batch.with_columns(
        peer_rank=pl.when(calls & local.is_in(list(several))).then(None)
        .when(calls & local.is_in(list(one))).then(local.replace_strict(one, default=None, return_dtype=pl.Int32))
        .otherwise(local).cast(pl.Int32),
        peer_rank_choices=pl.when(calls).then(local.replace_strict(several, default=None, return_dtype=pl.String)),
        process_group_choices=pl.when(collectives).then(pl.lit(names, dtype=pl.String)))
