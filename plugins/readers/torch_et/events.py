"""The step to event rows: the Kineto trace's rows, each operator with the operators whose tensors it read.

For every operator of the execution trace that is linked to its Kineto row (:mod:`.link`) and every tensor
among its inputs, the producer is the linked operator that wrote that tensor (had it among its outputs) and
ended last at or before the consumer started: the last write the consumer can have read. An operator and
the ones it calls list the same tensor as their output; the "ended before the consumer started" rule keeps a
consumer's own callers out. The producers of an operator become its ``data_from`` (their ``event_id``s, a JSON
list); the critical-path graph turns those on another thread into ``data`` edges (docs/critical_path.md).
"""

from __future__ import annotations

import json
from bisect import bisect_right

import polars as pl

from traceparse_plugins.readers.torch_et.execution_trace import ExecutionTrace
from traceparse_plugins.readers.torch_et.link import Link


def with_data_from(events: pl.DataFrame, et: ExecutionTrace, link: Link) -> tuple[pl.DataFrame, dict]:
    """``events`` (the Kineto trace, normalized) with ``data_from`` filled, and what was found (for the meta)."""
    host = pl.col("stream_id").is_null() & pl.col("tid").is_not_null()  # not the GPU's copy of an annotation
    ops = events.filter(pl.col("kind").cast(pl.String).is_in(["op", "marker"]) & pl.col("external_id").is_not_null()
                        & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null() & host)
    ops = ops.select("event_id", "external_id", "name", "pid", "tid", "start_ns",
                     end_ns=pl.col("start_ns") + pl.col("duration_ns")).filter(
        pl.len().over("external_id", "name") == 1)
    placed = link.operators.join(ops, on=["external_id", "name"], how="inner")
    at = {node: (eid, start, end, (pid, tid)) for node, eid, start, end, pid, tid in placed.select(
        "node_id", "event_id", "start_ns", "end_ns", "pid", "tid").iter_rows()}
    writers: dict[tuple, list[tuple[int, int, int]]] = {}
    for node in et.nodes:
        if node.id in at:
            eid, start, end, _ = at[node.id]
            for tensor in node.outputs:
                writers.setdefault(tensor, []).append((end, start, eid))
    for lst in writers.values():
        lst.sort()
    lane = {eid: thread for eid, _, _, thread in at.values()}
    producers: dict[int, set[int]] = {}
    for node in et.nodes:
        if node.id not in at:
            continue
        eid, start, _, _ = at[node.id]
        for tensor in node.inputs:
            lst = writers.get(tensor)
            if not lst:
                continue
            i = bisect_right(lst, start, key=lambda w: w[0]) - 1
            while i >= 0 and lst[i][2] == eid:  # an in-place operator of no duration: not its own producer
                i -= 1
            if i >= 0:
                producers.setdefault(eid, set()).add(lst[i][2])
    pairs = sum(len(p) for p in producers.values())
    across = sum(1 for c, ps in producers.items() for p in ps if lane[p] != lane[c])
    column = {eid: json.dumps(sorted(ps), separators=(",", ":")) for eid, ps in producers.items()}
    out = events.with_columns(data_from=pl.col("event_id").replace_strict(column, default=None,
                                                                          return_dtype=pl.String))
    facts = {"operators_placed": len(at), "data_dependencies": pairs, "across_threads": across}
    return out, facts
