"""Which worker event carries out each communication call of a rank, where the two are recorded apart.

gloo returns from a collective call (``c10d::allreduce_``) once the work is queued; a worker thread of the call's
process group then runs the exchange, recorded as an annotation of its own (``gloo:all_reduce``), and that
annotation's end is when the rank left the collective. Nothing in the trace ties the two: they are on different
threads and the annotation names neither the call nor its group. What ties them is order and data: a worker
takes its group's calls in the order they were made, soon after each, and moves the call's tensor, whose shape
the annotation records as the call does (an all-gather's input, a reduce-scatter's input, an all-reduce's
tensor). The process-group settlement (:mod:`traceparse.measures.comm_groups`) needs the link to know when each call
ended, and to give the annotation its call's group and collective (gloo runs a reduce-scatter as an all-reduce).
"""

from __future__ import annotations

import bisect
import json
from functools import lru_cache

import polars as pl

#: How many later worker events a call's link is looked for among (the first unlinked one of the call's data).
LOOK_AHEAD = 64


@lru_cache(maxsize=4096)
def tensor_sizes(dims: str | None) -> frozenset[int]:
    """The element counts of the tensor shapes in ``dims`` (``input_dims``: JSON, a list of shapes, a shape a list
    of sizes, a list of tensors a list of shapes), the empty shapes left out (a scalar, or an argument that is
    no tensor); ``{1}`` where only those are (a scalar all-reduced); empty where ``dims`` is no such JSON."""
    if not dims:
        return frozenset()
    try:
        value = json.loads(dims)
    except ValueError:
        return frozenset()
    sizes: set[int] = set()
    scalar = False

    def visit(item) -> None:
        nonlocal scalar
        if not isinstance(item, list):
            return
        if item and all(isinstance(x, int) and not isinstance(x, bool) for x in item):
            count = 1
            for x in item:
                count *= x
            sizes.add(count)
        elif not item:
            scalar = True
        else:
            for x in item:
                visit(x)

    if isinstance(value, list):
        for item in value:
            visit(item)
    return frozenset(sizes) if sizes else frozenset({1}) if scalar else frozenset()


def carried_out_by(calls: pl.DataFrame, workers: pl.DataFrame) -> pl.DataFrame:
    """Each of ``calls`` linked to the worker event that carried it out: on the same ``member``, the first of
    ``workers`` not linked yet that starts at or after the call and moves a tensor of a size the call has
    (:func:`tensor_sizes` of ``input_dims``), among the next :data:`LOOK_AHEAD`; calls in order of start.
    Both frames: ``member``, ``_row`` (a row id), ``start_ns``, ``input_dims``. Columns: ``_row`` (the call's),
    ``_by`` (the worker's); calls with no such worker are left out."""
    linked_call: list[int] = []
    linked_by: list[int] = []
    by_member: dict = {}  # member -> (starts, rows, sizes, taken), the workers in order of start
    for member, row, start, dims in workers.sort("start_ns").select(
            "member", "_row", "start_ns", "input_dims").iter_rows():
        starts, rows, sizes, taken = by_member.setdefault(member, ([], [], [], []))
        starts.append(start)
        rows.append(row)
        sizes.append(tensor_sizes(dims))
        taken.append(False)
    for member, row, start, dims in calls.sort("start_ns").select(
            "member", "_row", "start_ns", "input_dims").iter_rows():
        wanted = tensor_sizes(dims)
        if member not in by_member or not wanted:
            continue
        starts, rows, sizes, taken = by_member[member]
        at = bisect.bisect_left(starts, start)
        for i in range(at, min(at + LOOK_AHEAD, len(starts))):
            if not taken[i] and sizes[i] & wanted:
                taken[i] = True  # a worker event carries out one call
                linked_call.append(row)
                linked_by.append(rows[i])
                break
    return pl.DataFrame({"_row": linked_call, "_by": linked_by}, schema={"_row": pl.UInt32, "_by": pl.UInt32})
