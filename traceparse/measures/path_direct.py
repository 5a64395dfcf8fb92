"""The critical paths of every window straight from the graph's edges as they were built: no sort of the graph.

:func:`~traceparse.measures.critical_path.critical_paths` walks the measure's graph
(:data:`~traceparse.measures.critical_path.dependency_graph`): every edge sorted by destination, source and kind,
each edge's replay weight (a median per kind of edge), then every node numbered in order of time. The
``critical-path`` rule needs none of it but the choice of each node's critical in-edge and the walks; on the
139 MB trace's 640,000 edges the sort, the weights and the graph's 20 columns put in order were half of that.
:func:`direct_critical_paths` finds the same paths from the unsorted edges
(:meth:`~traceparse.measures.critical_path.DependencyGraph.unchosen`):

- each destination's best explicit and best inferred in-edge (:func:`choose_critical`'s packed source time, edge
  kind and source) are maxima over an array indexed by the destination's key, ``np.maximum.at``, not segmented
  maxima of the sorted edges;
- a node's time and lane (host or GPU) come from the edge where the sorted graph shows it first (as a source, the
  least destination, kind and row; else as a destination, the least source, kind and row), ``np.minimum.at`` again;
- each window's last node is found in one sorted array of the nodes' (trace, time, GPU before host, number)
  packed in an integer, not in the nodes numbered by an argsort;
- a node is its key (trace code × width + number): the walk's arrays are indexed by it (keys are dense).

Where the keys do not fit (a null trace id, a null end, a trace spanning days, keys too sparse) it answers None
and the caller walks the measure's graph. A test checks that the two give the same paths on every fixture.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import polars as pl

from traceparse.measures import path_walk
from traceparse.measures.critical_path import (EDGE_KINDS, _dense, _Keys, chosen_edge, pack_preference,
                                                 path_bounds, path_frames)

_MAX = np.iinfo(np.int64).max


def direct_critical_paths(edges: pl.DataFrame, windows: pl.DataFrame, texts: pl.DataType = pl.String,
                          columns: Iterable[str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """``critical_paths(DependencyGraph.chosen(edges), windows, texts, columns)``, from ``edges``
    (:meth:`~traceparse.measures.critical_path.DependencyGraph.unchosen`) without choosing over a sorted graph;
    None where the keys do not fit (module docstring)."""
    if edges.height == 0 or edges["src_trace"].null_count() or edges["dst_trace"].null_count():
        return None
    keys = _Keys(edges, nulls_last=True)
    order = pl.col("edge").to_physical().cast(pl.Int64)  # its place in EDGE_KINDS
    narrow = edges.select(_d=keys.key("dst"), _s=keys.key("src"), _o=order, src_ns="src_ns", dst_ns="dst_ns",
                          inferred="inferred", host=pl.col("tid").is_not_null())
    if any(narrow[c].null_count() for c in ("_d", "_s", "_o", "src_ns", "dst_ns", "inferred")):
        return None
    d, s, o = (narrow[c].to_numpy() for c in ("_d", "_s", "_o"))
    size = max(int(d.max()), int(s.max())) + 1
    if min(int(d.min()), int(s.min())) < 0 or not _dense(np.array([size - 1]), edges.height):
        return None
    src_ns = narrow["src_ns"].to_numpy()
    critical = _critical(d, s, o, src_ns, narrow["inferred"].to_numpy(), size)
    nodes = _first_edges(d, s, o, size)
    if critical is None or nodes is None:
        return None
    at = np.where(nodes[1], src_ns[nodes[0]], narrow["dst_ns"].to_numpy()[nodes[0]])  # each node's time
    windows, bounds = path_bounds(windows)
    start = _last_nodes(keys, nodes[2], at, narrow["host"].to_numpy()[nodes[0]], bounds)
    if start is None:
        return None
    time_of = np.zeros(size, dtype=np.int64)
    time_of[nodes[2]] = at
    last = np.where(start >= 0, time_of[np.maximum(start, 0)], 0).astype(np.int64)
    rows = np.flatnonzero(critical)
    into = np.full(size, -1, dtype=np.int64)
    into[d[rows]] = np.arange(len(rows), dtype=np.int64)  # of two, the later row, as the sorted graph's walk keeps
    walked, reps, reached = path_walk.walk(into, s[rows].astype(np.int64), src_ns[rows].astype(np.int64), start, last,
                                           bounds["start_ns"].to_numpy().astype(np.int64))
    return path_frames(edges, windows, bounds, rows[walked], reps, reached, last, texts, columns)


def _critical(d: np.ndarray, s: np.ndarray, o: np.ndarray, src_ns: np.ndarray, inferred: np.ndarray,
              size: int) -> np.ndarray | None:
    """Whether each edge is its destination's critical in-edge, as
    :func:`~traceparse.measures.critical_path._critical_in_order` decides it (the same packed number,
    :func:`~traceparse.measures.critical_path.pack_preference`), each destination's best explicit and best
    inferred edge found by ``np.maximum.at`` over the destinations' keys; None where the number does not fit."""
    packing = pack_preference(src_ns.astype(np.int64), o, s)  # a copy: packed in place
    if packing is None:
        return None
    packed, layout = packing
    best_explicit = np.full(size, -1, dtype=np.int64)
    np.maximum.at(best_explicit, d[~inferred], packed[~inferred])
    best_inferred = np.full(size, -1, dtype=np.int64)
    np.maximum.at(best_inferred, d[inferred], packed[inferred])
    c_s, c_o = chosen_edge(best_explicit, best_inferred, layout)
    return (s == c_s[d]) & (o == c_o[d])


def _first_edges(d: np.ndarray, s: np.ndarray, o: np.ndarray, size: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every node's first edge in the sorted graph's order (by destination, source, edge kind in alphabetical
    order, then row; every edge as a source before any as a destination, as
    :class:`~traceparse.measures.critical_path._Nodes` reads them): ``(row, as_source, key)`` per node, nodes by
    key; None where (key, kind, row) does not fit in 62 bits."""
    n = len(d)
    alphabet = np.array([sorted(EDGE_KINDS).index(k) for k in EDGE_KINDS], dtype=np.int64)[o]
    b_row, b_kind = max(n.bit_length(), 1), len(EDGE_KINDS).bit_length()
    if (size - 1).bit_length() + b_kind + b_row > 62:
        return None
    row = np.arange(n, dtype=np.int64)
    low = (alphabet << b_row) | row
    as_source = np.full(size, _MAX, dtype=np.int64)
    np.minimum.at(as_source, s, (d << (b_kind + b_row)) | low)
    as_destination = np.full(size, _MAX, dtype=np.int64)
    np.minimum.at(as_destination, d, (s << (b_kind + b_row)) | low)
    key = np.flatnonzero((as_source < _MAX) | (as_destination < _MAX))
    source = as_source[key] < _MAX
    first = np.where(source, as_source[key], as_destination[key]) & ((1 << b_row) - 1)
    return first, source, key


def _last_nodes(keys: _Keys, node: np.ndarray, at: np.ndarray, host: np.ndarray, bounds: pl.DataFrame
                ) -> np.ndarray | None:
    """Each window's last node (its key; -1: none): of its trace's nodes at or before the window's end, the last
    by time, GPU before host, then number, as :class:`~traceparse.measures.critical_path._Nodes` orders them;
    the nodes (``node``: keys, ``at``: times, ``host``) packed in one integer each and sorted. None where that
    does not fit in 62 bits (a trace spanning days)."""
    width = keys.width
    code, number = node // width, node % width
    low = np.full(keys.traces + 2, _MAX, dtype=np.int64)
    np.minimum.at(low, code, at)
    since = at - low[code]
    b_time, b_number = max(int(since.max()).bit_length(), 1), max(int(number.max()).bit_length(), 1)
    if int(code.max()).bit_length() + b_time + 1 + b_number > 62:
        return None
    shift = b_time + 1 + b_number
    packed = np.sort((code << shift) | (since << (1 + b_number)) | (host.astype(np.int64) << b_number) | number)
    start = np.full(bounds.height, -1, dtype=np.int64)
    for w, (trace, end) in enumerate(zip(bounds["trace_id"].to_list(), bounds["end_ns"].to_list())):
        c = keys.codes.get(trace)
        if c is None or low[c] == _MAX or end is None or end < low[c]:
            continue
        reach = min(end - int(low[c]), (1 << b_time) - 1)  # every node of the trace is at most this
        at_pos = int(np.searchsorted(packed, (c << shift) | (reach << (1 + b_number)) | ((1 << (1 + b_number)) - 1),
                                     side="right")) - 1
        if at_pos >= 0 and int(packed[at_pos]) >> shift == c:
            start[w] = c * width + (int(packed[at_pos]) & ((1 << b_number) - 1))
    return start
