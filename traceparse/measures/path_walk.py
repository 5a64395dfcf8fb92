"""The backward walk of :func:`~traceparse.measures.critical_path.critical_paths`: from each window's last node,
each node's critical in-edge in turn, until the window's start.

Each node has at most one critical in-edge, so the edge walked after edge ``e`` is always the same one (the
critical in-edge of ``e``'s source): the walks are chains of one function on edges, :func:`next_edges`. Where
that function has no cycle (every real graph: an edge's source never happens after its destination, so a cycle
needs edges that take no time at all, all around it) the chains are followed with numpy, many steps at once
(:func:`walk_chains`); otherwise one node at a time in Python (:func:`walk_each`), which also stops at a node
seen twice. Both give the same walks.
"""
from __future__ import annotations

from array import array

import numpy as np

#: Steps in a block of :func:`walk_chains`: each chain is cut into blocks of this many steps, whose first edges are
#: found by jumps of this length, and the blocks are walked side by side.
BLOCK = 256
_NONE = np.iinfo(np.int64).min


def next_edges(into: np.ndarray, src_id: np.ndarray, src_ns: np.ndarray) -> np.ndarray:
    """For each critical edge, the one the walk takes after it (the critical in-edge of its source node), or
    ``len(src_ns)`` where the walk ends there: the source has no critical in-edge, or that edge's source happened
    after this one's (nodes of two traces under one id: the walk stops instead of going forwards in time)."""
    n = len(src_ns)
    following = into[src_id] if n else np.zeros(0, dtype=np.int64)
    ok = following >= 0
    ok[ok] = src_ns[following[ok]] <= src_ns[ok]
    return np.where(ok, following, n).astype(_index_type(n), copy=False)


def _index_type(n: int) -> type:
    """The integer type of an index up to ``n`` (a graph's edges: 4 bytes each below two billion, not 8)."""
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


def has_cycle(succ: np.ndarray, src_ns: np.ndarray) -> bool:
    """Whether the chains of ``succ`` (:func:`next_edges`) go round: only edges whose next edge starts at the same
    time can be on a cycle (times never increase along a chain), so those alone are followed, by repeated squaring
    of the function (each round doubles the steps taken; a chain that has not ended after more steps than there
    are such edges is on a cycle or runs into one)."""
    n = len(src_ns)
    ext = np.append(src_ns, _NONE)
    flat = np.flatnonzero((succ < n) & (ext[succ] == src_ns))
    m = len(flat)
    if m == 0:
        return False
    place = np.full(n + 1, m, dtype=_index_type(n))
    place[flat] = np.arange(m)
    jump = np.append(place[succ[flat]], m)  # m: the chain ends (or leaves the flat edges, where it cannot return)
    for _ in range(int(m).bit_length() + 1):
        jump = jump[jump]
    return bool((jump[:m] < m).any())


def walk_each(into: np.ndarray, src_id: np.ndarray, src_ns: np.ndarray, start: np.ndarray, start_ns: np.ndarray,
              stop_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walks one node at a time: from node ``start[w]`` (-1: no node) at time ``start_ns[w]``, each node's
    critical in-edge ``into[node]`` (-1: none) back to its source ``src_id[edge]`` at ``src_ns[edge]``, while the
    time is after ``stop_ns[w]``. A walk ends at a node with no in-edge, at a node seen twice (only a node left at
    an unchanged time can come round again: only those are remembered), or before an edge whose source happened
    after the time reached. Returns the edges walked (all walks one after the other), each walk's number of edges
    and the time it reached."""
    into_a = array("q", np.asarray(into, dtype=np.int64).tobytes())
    src_a = array("q", np.asarray(src_id, dtype=np.int64).tobytes())
    ns_a = array("q", np.asarray(src_ns, dtype=np.int64).tobytes())
    walked = array("q")  # 8 bytes a step, no int objects
    step_on = walked.append
    counts = np.zeros(len(start), dtype=np.int64)
    reached = np.asarray(start_ns, dtype=np.int64).copy()
    for w, (node, t, w_start) in enumerate(zip(start.tolist(), reached.tolist(), stop_ns.tolist())):
        if node < 0:
            continue
        seen, before = set(), len(walked)
        while t > w_start:
            i = into_a[node]
            if i < 0 or node in seen:
                break
            earlier = ns_a[i]
            if earlier > t:
                break
            step_on(i)
            if earlier == t:
                seen.add(node)
            node, t = src_a[i], earlier
        counts[w] = len(walked) - before
        reached[w] = t
    out = np.frombuffer(walked, dtype=np.int64) if len(walked) else np.zeros(0, dtype=np.int64)
    return out, counts, reached


def walk_chains(into: np.ndarray, src_id: np.ndarray, src_ns: np.ndarray, start: np.ndarray, start_ns: np.ndarray,
                stop_ns: np.ndarray, succ: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`walk_each`'s walks, for a graph whose chains have no cycle (:func:`has_cycle`), with numpy: each
    walk's chain is cut into blocks of :data:`BLOCK` steps, whose first edges are found by jumps of that many
    steps (all walks at once), then every block is followed side by side, a step of all of them at a time, and
    each walk is cut where it ends. Python touches each block once, not each step (the 3.9 million steps of 8
    ranks of the 139 MB trace: 0.86 s one at a time, 0.2 s so)."""
    n = len(src_ns)
    succ = next_edges(into, src_id, src_ns) if succ is None else succ
    succ = np.append(succ, n).astype(_index_type(n), copy=False)  # n: the end, which leads to itself
    ns = np.append(src_ns, _NONE)
    first = np.full(len(start), n, dtype=np.int64)
    has = start >= 0
    first[has] = into[start[has]]
    ok = has & (first >= 0) & (start_ns > stop_ns)
    first = np.where(ok, first, n)
    first[ns[first] > start_ns] = n  # the first edge's source after the walk's start
    jump = _power(succ, BLOCK)
    # the first edge of each block: a walk needs the next block while its last block's first edge is after
    # its stop (times never increase along a chain, so once one is not, the walk ends within that block)
    walks, heads = [], []
    w = np.flatnonzero(first < n)
    e = first[w]
    while len(w):
        walks.append(w)
        heads.append(e)
        going = ns[e] > stop_ns[w]
        w, e = w[going], jump[e[going]]
        w, e = w[e < n], e[e < n]
    if not walks:
        return np.zeros(0, dtype=np.int64), np.zeros(len(start), dtype=np.int64), start_ns.astype(np.int64)
    walks, heads = np.concatenate(walks), np.concatenate(heads)
    order = np.argsort(walks, kind="stable")  # each walk's blocks together, in the order they were found
    walks, heads = walks[order], heads[order]
    steps = np.empty((BLOCK, len(heads)), dtype=succ.dtype)
    edge = heads
    for k in range(BLOCK):
        steps[k] = edge
        edge = succ[edge]
    steps = steps.T.ravel()  # block after block, each walk's blocks one after the other
    owner = np.repeat(walks, BLOCK)
    # a walk takes an edge while it is not the end and the edge before it (in the walk) left the time after
    # the walk's stop
    before = np.empty(len(steps), dtype=np.int64)
    before[1:] = ns[steps[:-1]]
    begins = np.flatnonzero(np.concatenate([[True], owner[1:] != owner[:-1]]))
    before[begins] = np.iinfo(np.int64).max
    ends = np.append(np.flatnonzero((steps == n) | (before <= stop_ns[owner])), len(steps))
    sizes = np.diff(np.append(begins, len(steps)))
    taken = np.minimum(ends[np.searchsorted(ends, begins)], begins + sizes) - begins
    counts = np.zeros(len(start), dtype=np.int64)
    counts[owner[begins]] = taken
    within = np.arange(len(steps), dtype=np.int64) - np.repeat(begins, sizes)
    walked = steps[within < np.repeat(taken, sizes)].astype(np.int64)
    reached = start_ns.astype(np.int64).copy()
    last = begins + taken - 1
    reached[owner[begins]] = ns[steps[last]]
    return walked, counts, reached


def _power(succ: np.ndarray, steps: int) -> np.ndarray:
    """``succ`` applied ``steps`` (at least 1) times, by repeated squaring."""
    result, base = None, succ
    while steps:
        if steps & 1:
            result = base if result is None else base[result]
        steps >>= 1
        if steps:
            base = base[base]
    return result


def walk(into: np.ndarray, src_id: np.ndarray, src_ns: np.ndarray, start: np.ndarray, start_ns: np.ndarray,
         stop_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The walks of :func:`walk_each` (its arguments and answer), with numpy where the graph's chains have no
    cycle (:func:`walk_chains`)."""
    succ = next_edges(into, src_id, src_ns)
    if has_cycle(succ, src_ns):
        return walk_each(into, src_id, src_ns, start, start_ns, stop_ns)
    return walk_chains(into, src_id, src_ns, start, start_ns, stop_ns, succ=succ)
