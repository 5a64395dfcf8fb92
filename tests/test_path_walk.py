"""The critical path's backward walk: the walk of many steps at a time with numpy (``walk_chains``) is the walk
one node at a time (``walk_each``) on real graphs and on random ones, and a graph whose chains go round is
walked one node at a time (hand-made graphs, as said at each)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from helpers import FIXTURES, read_torch, run_of
from traceparse.measures import dependency_graph, path_walk
from traceparse.measures.critical_path import critical_paths
from traceparse.measures.step_paths import step_windows


def walk_inputs(source: str) -> tuple:
    """The arguments ``critical_paths`` gives the walk for the steps of a real trace or run."""
    path = FIXTURES / source
    events = run_of(path).events if path.is_dir() else read_torch(path).events.with_columns(trace_id=pl.lit("t"))
    graph = dependency_graph(events)
    seen = []

    def keep(*args):
        seen.append(args)
        return path_walk.walk_each(*args)

    mp = pytest.MonkeyPatch()
    mp.setattr(path_walk, "walk", keep)
    try:
        critical_paths(graph, step_windows(events, graph, spans=True))
    finally:
        mp.undo()
    return seen[0]


def same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("source", ["torch/resnet18_bs8.json.gz", "torch/multirank/fsdp4_slow_loader",
                                    "torch/multirank/gloo4_slow_rank2"])
@pytest.mark.parametrize("block", [4, 7, path_walk.BLOCK])
def test_the_walk_by_blocks_is_the_walk_one_node_at_a_time_on_real_graphs(source, block, monkeypatch):
    """Blocks of 4 and 7 steps (every walk cut into many, ends inside blocks and on their edges) and of the
    default size; every step of every window, across ranks at collectives."""
    args = walk_inputs(source)
    monkeypatch.setattr(path_walk, "BLOCK", block)
    each = path_walk.walk_each(*args)
    assert not path_walk.has_cycle(path_walk.next_edges(*args[:3]), args[2])
    assert same(path_walk.walk_chains(*args), each)
    assert same(path_walk.walk(*args), each)
    walked, counts, _ = each
    assert len(walked) == counts.sum() > 80 and counts.max() > 4


def random_graph(rng: np.random.Generator, nodes: int, windows: int, stray: float) -> tuple:
    """A random graph as the walk sees it: node times with repeats, at most one critical in-edge a node whose
    source is one of the few nodes before it (long chains), or with chance ``stray`` any node: one later (the
    walk must stop there), at the same time (a chain may go round), or itself."""
    times = np.sort(rng.integers(0, nodes // 3 + 2, nodes))
    into = np.full(nodes, -1, dtype=np.int64)
    src_id, src_ns = [], []
    for v in range(1, nodes):
        if rng.random() < 0.02:
            continue
        u = int(rng.integers(0, nodes)) if rng.random() < stray else v - int(rng.integers(1, min(v, 3) + 1))
        into[v] = len(src_id)
        src_id.append(u)
        src_ns.append(int(times[u]))
    start = rng.integers(-1, nodes, windows)
    stop = rng.integers(-2, nodes // 3 + 2, windows)
    start_ns = np.where(start >= 0, times[np.maximum(start, 0)], 0)
    return (into, np.array(src_id, dtype=np.int64), np.array(src_ns, dtype=np.int64), start.astype(np.int64),
            start_ns.astype(np.int64), stop.astype(np.int64))


def cycle_by_hand(into: np.ndarray, src_id: np.ndarray, src_ns: np.ndarray) -> bool:
    """Whether following each edge's next edge (``next_edges``) ever comes back to an edge: one edge at a time."""
    succ = path_walk.next_edges(into, src_id, src_ns)
    for e in range(len(src_ns)):
        seen, at = set(), e
        while at < len(src_ns) and at not in seen:
            seen.add(at)
            at = int(succ[at])
        if at < len(src_ns):
            return True
    return False


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_by_blocks_is_the_walk_one_node_at_a_time_on_random_graphs(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    args = random_graph(rng, int(rng.integers(2, 400)), int(rng.integers(1, 30)), 0.0 if seed % 2 else 0.02)
    monkeypatch.setattr(path_walk, "BLOCK", int(rng.choice([2, 3, 8, 64])))
    each = path_walk.walk_each(*args)
    cycle = path_walk.has_cycle(path_walk.next_edges(*args[:3]), args[2])
    assert cycle == cycle_by_hand(*args[:3])
    if not cycle:
        assert same(path_walk.walk_chains(*args), each)
    assert same(path_walk.walk(*args), each)


def test_a_chain_that_goes_round_at_one_time_is_walked_one_node_at_a_time():
    """By hand: node 0 (30 ns) is held by node 1 (20 ns), node 1 by node 2 (10 ns), node 2 by node 1 at 10 ns
    again (two events under one id, at one time). The walk takes edges 0, 1, 2, then 1 again (node 1 was left
    at 20 ns, not at an unchanged time, so it was not remembered) and stops at node 2, seen at 10 ns."""
    into = np.array([0, 1, 2], dtype=np.int64)
    src_id = np.array([1, 2, 1], dtype=np.int64)
    src_ns = np.array([20, 10, 10], dtype=np.int64)
    start, start_ns, stop = np.array([0]), np.array([30]), np.array([0])
    assert path_walk.has_cycle(path_walk.next_edges(into, src_id, src_ns), src_ns)
    walked, counts, reached = path_walk.walk(into, src_id, src_ns, start, start_ns, stop)
    assert walked.tolist() == [0, 1, 2, 1] and counts.tolist() == [4] and reached.tolist() == [10]


def test_a_walk_ends_at_its_stop_at_a_node_with_no_edge_and_before_a_later_source():
    """By hand, four windows on one chain 5 -> 4 -> 3 -> 2 -> 1 (nodes at 50, 40, 30, 20, 10 ns; node 1 has no
    edge in; node 2's edge comes from node 4 at 45 ns in a second graph): stopped at 25 ns, at the chain's end,
    a window with no node, and a window that starts after its last node."""
    into = np.array([-1, -1, 0, 1, 2, 3], dtype=np.int64)  # node v's edge is v - 2 (nodes 2..5)
    src_id = np.array([1, 2, 3, 4], dtype=np.int64)
    src_ns = np.array([10, 20, 30, 40], dtype=np.int64)
    start = np.array([5, 5, -1, 3], dtype=np.int64)
    start_ns = np.array([50, 50, 0, 30], dtype=np.int64)
    stop = np.array([25, 0, 0, 30], dtype=np.int64)
    want = ([3, 2, 1, 3, 2, 1, 0], [3, 4, 0, 0], [20, 10, 0, 30])
    for walk in (path_walk.walk_each, path_walk.walk_chains):
        walked, counts, reached = walk(into, src_id, src_ns, start, start_ns, stop)
        assert (walked.tolist(), counts.tolist(), reached.tolist()) == want
    later = np.array([10, 45, 30, 40], dtype=np.int64)  # node 2's edge from 45 ns: after node 3's 30
    for walk in (path_walk.walk_each, path_walk.walk_chains):
        walked, counts, reached = walk(into, src_id, later, start[:1], start_ns[:1], np.array([0]))
        assert (walked.tolist(), counts.tolist(), reached.tolist()) == ([3, 2], [2], [30])
