"""Replay: a dependency graph run forwards with other weights. The one engine behind ``traceparse whatif`` and the
step-time predictor (``traceparse predict``).

The graph is :data:`traceparse.measures.critical_path.dependency_graph`'s (one row per edge ``u → v``: ``v`` could
not happen before ``u``; docs/critical_path.md). A replay places every node again: a node with no edge into it
stays at its measured time, any other at the latest of its in-edges' source time plus their weight. With the
measured weights (``weight_ns``: the measured gap on each node's critical edge, at most the gap on the others) every
node lands where it was measured; a changed weight (a kernel twice as fast, a host op that takes no time) moves
what depends on it, and the difference is the prediction.

:class:`Replayer` prepares a graph once (its nodes in an order where every edge's source comes first, the in-edges
of each node) and replays it as often as asked with a weight per edge: a what-if tries several edits on one graph,
the predictor replays one trace's graph at several batch sizes. This module imports nothing of the graph's
construction, so :mod:`traceparse.measures.critical_path` can hand its own ``replay`` to it.
"""

from __future__ import annotations

from graphlib import TopologicalSorter

import numpy as np
import polars as pl

NODE_SCHEMA = {"trace": pl.String, "node": pl.Int64, "measured_ns": pl.Int64, "replayed_ns": pl.Int64}


class Replayer:
    """A dependency graph prepared for replays.

    ``graph``: the edges (columns ``src_trace``, ``src_node``, ``src_ns``, ``dst_trace``, ``dst_node``, ``dst_ns``
    and ``weight_ns``), in any order; edge ``i`` of :meth:`run`'s weights is row ``i`` of ``graph``. Nodes are
    numbered 0..n-1 (:attr:`keys` gives each one's ``(trace, node)``, :attr:`measured` its measured time).
    """

    def __init__(self, graph: pl.DataFrame) -> None:
        src_keys = list(zip(graph["src_trace"].to_list(), graph["src_node"].to_list()))
        dst_keys = list(zip(graph["dst_trace"].to_list(), graph["dst_node"].to_list()))
        index: dict[tuple, int] = {}
        measured: list[int] = []
        for keys, times in ((src_keys, graph["src_ns"].to_list()), (dst_keys, graph["dst_ns"].to_list())):
            for k, t in zip(keys, times):
                if k not in index:
                    index[k] = len(measured)
                    measured.append(t)
        self.index = index
        self.keys: list[tuple] = list(index)
        self.measured = np.array(measured, dtype=np.int64)
        self.src = np.array([index[k] for k in src_keys], dtype=np.int64)
        self.dst = np.array([index[k] for k in dst_keys], dtype=np.int64)
        self.default = graph["weight_ns"].cast(pl.Int64).to_numpy() if "weight_ns" in graph.columns else None
        # an order where every edge's source comes first: edges never run backwards in time, so by measured time,
        # ties (zero-length edges) by a topological sort of the nodes at one instant
        order = TopologicalSorter()
        for u, v in zip(self.src.tolist(), self.dst.tolist()):
            order.add(v, u)
        for v in range(len(measured)):
            order.add(v)
        self.order = np.array(list(order.static_order()), dtype=np.int64)
        # the in-edges of each node, grouped in node order
        by_dst = np.argsort(self.dst, kind="stable")
        self._edges = by_dst
        counts = np.bincount(self.dst, minlength=len(measured))
        self._first = np.concatenate([[0], np.cumsum(counts)])

    def __len__(self) -> int:
        return len(self.keys)

    def run(self, weights: np.ndarray | None = None, frozen: np.ndarray | None = None) -> np.ndarray:
        """The replayed time of every node (numbered as :attr:`keys`) with ``weights`` per edge (ns, in the graph's
        row order; default the graph's ``weight_ns``). ``frozen`` (a boolean per edge): those edges leave from their
        source's measured time, not its replayed one, so that what happened before them does not move what they
        lead to (whatif replays each step from its measured start: :func:`traceparse.measures.whatif.what_if`)."""
        w = self.default if weights is None else np.asarray(weights)
        if w is None:
            raise ValueError("replay: the graph has no weight_ns and no weights were given")
        at = self.measured.tolist()
        src = self.src[self._edges].tolist()
        wt = np.rint(w[self._edges]).astype(np.int64).tolist() if w.dtype.kind == "f" else w[self._edges].tolist()
        first = self._first.tolist()
        if frozen is not None and np.asarray(frozen).any():
            # a frozen edge's source is a node of its own, at the measured time and with no edge into it
            fixed = np.flatnonzero(np.asarray(frozen, dtype=bool)[self._edges])
            src = np.asarray(src, dtype=np.int64)
            src[fixed] = len(at) + np.arange(len(fixed))
            at = at + self.measured[self.src[self._edges][fixed]].tolist()
            src = src.tolist()
        for v in self.order.tolist():
            lo, hi = first[v], first[v + 1]
            if lo == hi:
                continue
            best = at[src[lo]] + wt[lo]
            for i in range(lo + 1, hi):
                t = at[src[i]] + wt[i]
                if t > best:
                    best = t
            at[v] = best
        return np.array(at[:len(self.keys)], dtype=np.int64)

    def window_nodes(self, graph: pl.DataFrame, windows: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Per window (``trace_id``, ``start_ns``, ``end_ns`` on the graph's clock), the node at its start and the
        node at its end: the trace's last node at or before each time (host nodes after GPU ones at one instant,
        so a step annotation's own start and end where it has them); -1 where the trace has none by then."""
        host = np.zeros(len(self), dtype=bool)
        on_thread = graph["tid"].is_not_null().to_numpy()
        host[self.dst[on_thread]] = True
        host[self.src[(graph["edge"] == "thread").to_numpy()]] = True
        by_trace: dict = {}
        for i, (trace, node) in enumerate(self.keys):
            by_trace.setdefault(trace, []).append((int(self.measured[i]), bool(host[i]), node, i))
        arrays = {}
        for trace, rows in by_trace.items():
            rows.sort()
            arrays[trace] = (np.array([r[0] for r in rows], dtype=np.int64), np.array([r[3] for r in rows]))
        empty = (np.array([], dtype=np.int64), np.array([], dtype=np.int64))
        starts, ends = [], []
        for trace, a, b in windows.select("trace_id", "start_ns", "end_ns").iter_rows():
            times, ids = arrays.get(trace, empty)
            i = int(np.searchsorted(times, a, side="right")) - 1
            j = int(np.searchsorted(times, b, side="right")) - 1
            starts.append(int(ids[i]) if i >= 0 else -1)
            ends.append(int(ids[j]) if j >= 0 else -1)
        return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)

    def frame(self, at: np.ndarray) -> pl.DataFrame:
        """``at`` (from :meth:`run`) as rows ``trace``, ``node``, ``measured_ns``, ``replayed_ns``, sorted."""
        traces = [k[0] for k in self.keys]
        nodes = [k[1] for k in self.keys]
        return pl.DataFrame({"trace": traces, "node": nodes, "measured_ns": self.measured, "replayed_ns": at},
                            schema=NODE_SCHEMA).sort("trace", "node", nulls_last=False)

    def arrivals(self, at: np.ndarray, weights: np.ndarray | None = None,
                 frozen: np.ndarray | None = None) -> np.ndarray:
        """Per edge (graph row order), when it lets its destination happen in the replay ``at``: its source's time
        (a ``frozen`` edge's: the measured one, as :meth:`run`) plus its weight. A node's replayed time is the latest
        arrival of its in-edges."""
        w = self.default if weights is None else np.asarray(weights)
        return self.sources(at, frozen) + np.rint(w).astype(np.int64)

    def sources(self, at: np.ndarray, frozen: np.ndarray | None = None) -> np.ndarray:
        """Per edge (graph row order), its source's time in the replay ``at``; a ``frozen`` edge's, the measured one."""
        out = at[self.src]
        return out if frozen is None else np.where(np.asarray(frozen, dtype=bool), self.measured[self.src], out)


def replay(graph: pl.DataFrame, weight: pl.Expr | None = None) -> pl.DataFrame:
    """Every node of ``graph`` placed again by running it forwards (:class:`Replayer`), with ``weight_ns`` or the
    expression ``weight`` over the graph's columns as each edge's weight. Columns: ``trace``, ``node``,
    ``measured_ns``, ``replayed_ns``."""
    w = graph.select((weight if weight is not None else pl.col("weight_ns")).cast(pl.Int64)).to_series().to_numpy()
    r = Replayer(graph)
    return r.frame(r.run(w))
