"""Issue 24: the dependency graph of a step (measure ``dependency_graph``) and its critical path (rule
``critical-path``).

Small handwritten traces pin every edge and the path exactly; on real traces the oracles read the raw JSON
(gzip + json, plain Python) and share no code with traceparse: step windows, collective arrivals and joins,
an operator's self time.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from helpers import (FIXTURES, REPO, gpu, host, raw_events, raw_steps, read_torch, run_cli, run_of, run_rule,
                     self_time, table, us_to_ns)
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.measures import dependency_graph, partitioned
from traceparse.measures.critical_path import INSTANCE_TRACE, critical_paths
from traceparse.measures.step_paths import step_windows

SAMPLES = REPO.parent / "shared" / "samples"
MULTIRANK = FIXTURES / "torch" / "multirank"
SLOW = SAMPLES / "multirank" / "gloo4_resnet18_bs16_slow_rank2"
BALANCED = SAMPLES / "multirank" / "gloo4_resnet18_bs16"
GRAPHS = SAMPLES / "torch" / "resnet18_bs32_compiled_cudagraphs.json.gz"
needs_samples = pytest.mark.skipif(not SLOW.exists(), reason="the shared multirank samples are not here")


def edges_of(graph: pl.DataFrame, edge: str) -> list[tuple]:
    return sorted(graph.filter(pl.col("edge") == edge).select("src_node", "dst_node", "segment", "gap_ns",
                                                             "critical").rows())


# -- the graph, exactly, on handwritten traces ---------------------------------------------------------------
#: One step: operator A launches kernel K (correlation 7) and runs op B; then a synchronisation waits for K.
STEP = [host("marker", "ProfilerStep#1", 0, 210), host("op", "A", 0, 100), host("api", "cudaLaunchKernel", 10, 20,
        correlation_id=7), host("op", "B", 30, 60), host("api", "cudaDeviceSynchronize", 100, 200),
        gpu("K", 25, 180, correlation_id=7)]


def test_every_edge_of_one_step():
    graph = dependency_graph(table(*STEP))
    # event ids: 0 step, 1 A, 2 launch, 3 B, 4 sync, 5 K; node 2e is a start, 2e + 1 an end
    assert edges_of(graph, "thread") == [
        (0, 2, "untraced", 0, True),      # step start -> A start (the step annotation's own time)
        (2, 4, "host op", 10, True),      # A's own time before the launch
        (3, 8, "untraced", 0, True),      # A ends, the sync starts at the same instant
        (4, 5, "launch", 10, True),       # the launch call
        (5, 6, "host op", 10, True),      # A again
        (6, 7, "host op", 30, True),      # B
        (7, 3, "host op", 40, True),      # A up to its end
        (8, 9, "sync", 100, False),       # the sync's own time: not what held its end
        (9, 1, "untraced", 10, True),     # the step annotation after the sync
    ]
    assert edges_of(graph, "launch") == [(4, 10, "launch", 15, True)]
    assert edges_of(graph, "stream") == [(10, 11, "kernel", 155, True)]
    assert edges_of(graph, "sync") == [(11, 9, "sync", 20, True)]  # K ended last within the sync: it held it
    assert set(graph["edge"]) == {"thread", "launch", "stream", "sync"}


def test_the_path_of_one_step_tiles_it():
    events = table(*STEP)
    graph = dependency_graph(events)
    windows = pl.DataFrame({"trace_id": ["t"], "rank": [None], "step": [1], "start_ns": [0], "end_ns": [210]},
                           schema_overrides={"rank": pl.Int32})
    paths, segments = critical_paths(graph, windows)
    assert paths.select("step_ns", "length_ns", "unexplained_ns").row(0) == (210, 210, 0)
    assert segments.sort("index").select("segment", "name", "start_ns", "end_ns").rows() == [
        ("untraced", "(nothing traced in ProfilerStep#1)", 200, 210), ("sync", "cudaDeviceSynchronize", 180, 200),
        ("kernel", "K", 25, 180), ("launch", "cudaLaunchKernel", 10, 25), ("host op", "A", 0, 10)]
    assert segments["duration_ns"].sum() == 210


def test_a_sync_waits_for_work_launched_before_the_trace():
    """Hand-written after a TraceLens Qwen decode trace (H100): its kernels were launched before the profiler
    started (no launch call in the trace), and the step's cudaDeviceSynchronize waited 14 ms for them. Without
    a launch, no sync edge was made and the path put the 14 ms on the host's "sync". Untraced launches count
    as made before the call: the path runs through the kernel the call waited for."""
    step = [host("marker", "ProfilerStep#1", 0, 210), host("op", "A", 0, 100),
            host("api", "cudaDeviceSynchronize", 100, 200),
            gpu("K1", 20, 120, correlation_id=901), gpu("K2", 120, 195, correlation_id=902)]  # no launch traced
    graph = dependency_graph(table(*step))
    # event ids: 0 step, 1 A, 2 the sync, 3 K1, 4 K2: K2's end (node 9) held the sync's end (node 5)
    assert edges_of(graph, "sync") == [(9, 5, "sync", 5, True)]
    windows = pl.DataFrame({"trace_id": ["t"], "rank": [None], "step": [1], "start_ns": [0], "end_ns": [210]},
                           schema_overrides={"rank": pl.Int32})
    paths, segments = critical_paths(graph, windows)
    kinds = dict(segments.group_by("segment").agg(pl.col("duration_ns").sum()).rows())
    assert kinds["sync"] == 5 and kinds["kernel"] == 100 + 75  # K1 then K2: not 100 ns of "sync"
    # before K1 the path has no edge (its launch is not in the trace): that time is said to be unexplained
    assert paths.select("length_ns", "unexplained_ns").row(0) == (190, 20)
    assert segments["duration_ns"].sum() == 190


def test_first_seen_is_numpys_unique_with_first_indices():
    """The nodes' distinct keys and first appearances, counted over a dense range or (keys too sparse) sorted,
    are exactly ``np.unique(keys, return_index=True)``."""
    import numpy as np

    from traceparse.measures.critical_path import _dense, _first_seen

    rng = np.random.default_rng(7)
    for n, high, dense in [(1, 1, True), (50, 10, True), (5_000, 3_000, True), (5_000, 10 ** 12, False),
                           (20_000, 70_000, True), (1_000, 200_000, False)]:
        keys = rng.integers(0, high, n, dtype=np.int64)
        distinct, first = _first_seen(keys)
        want, want_first = np.unique(keys, return_index=True)
        assert distinct.tolist() == want.tolist() and first.tolist() == want_first.tolist()
        assert _dense(keys, n) == dense
    assert [a.tolist() for a in _first_seen(np.zeros(0, dtype=np.int64))] == [[], []]


def test_the_path_with_categorical_texts_is_the_path_with_texts():
    events = run_of(MULTIRANK / "nccl2_slow_rank1").events  # two ranks: two traces' texts in one frame
    graph = dependency_graph(events)
    windows = step_windows(events, graph, spans=True)
    paths, segments = critical_paths(graph, windows)
    cat_paths, cat_segments = critical_paths(graph, windows, texts=pl.Categorical)
    texts = [c for c, t in segments.schema.items() if t == pl.String]
    assert set(texts) >= {"name", "category", "segment", "edge", "trace_id"}
    assert all(cat_segments.schema[c] == pl.Categorical for c in texts)
    assert cat_paths.equals(paths)
    assert cat_segments.with_columns(pl.col(texts).cast(pl.String)).equals(segments)
    assert segments.height > 100 and segments["trace_id"].n_unique() == 2


@pytest.mark.parametrize("columns", [["duration_ns"], ["segment_trace", "trace_id", "start_ns"],
                                     ["end_ns", "edge", "segment_rank", "index", "dst_node"]])
def test_the_segments_of_some_columns_are_those_columns_of_every_segment(columns):
    """``columns`` gives those of the segments' columns, in the schema's order, with the values the full segments
    have (a run's rule gathers only what it reads); the paths do not change."""
    from traceparse.measures.critical_path import SEGMENT_SCHEMA

    events = run_of(MULTIRANK / "nccl2_slow_rank1").events
    graph = dependency_graph(events)
    windows = step_windows(events, graph, spans=True)
    paths, segments = critical_paths(graph, windows)
    some_paths, some = critical_paths(graph, windows, columns=columns)
    assert some.columns == [c for c in SEGMENT_SCHEMA if c in columns]
    assert some_paths.equals(paths) and some.equals(segments.select(some.columns)) and some.height > 100


@pytest.mark.parametrize("source", ["torch/resnet18_bs8.json.gz", "torch/multirank/fsdp4_slow_loader"])
def test_each_nodes_choice_by_segmented_maxima_is_the_choice_by_sort(source, monkeypatch):
    """The critical in-edge of every node, from segmented maxima of one packed key, is the one the sort by five
    keys chooses (kept for keys too wide to pack): the same graph, edge for edge, explicit and inferred edges
    (wake-ups, stream waits), collectives across ranks."""
    import traceparse.measures.critical_path as cp

    path = FIXTURES / source
    events = run_of(path).events if path.is_dir() else read_torch(path).events.with_columns(trace_id=pl.lit("t"))
    fast = dependency_graph(events)
    monkeypatch.setattr(cp, "_critical_in_order", lambda narrow, final: None)
    slow = dependency_graph(events)
    assert fast.equals(slow)
    assert fast["critical"].sum() > 8000 and fast.filter(pl.col("critical") & pl.col("inferred")).height > 0


def test_the_choice_prefers_the_latest_source_then_the_edge_kind_then_an_inferred_edge_only_when_later():
    """By hand: node 9's in-edges tie on time (thread before launch), node 8's inferred edge is later than its
    explicit one, node 7's is not; node 6 has only an inferred edge."""
    import numpy as np

    from traceparse.measures.critical_path import EDGE_KINDS, _critical_in_order, _critical_ranked

    kind = {k: i for i, k in enumerate(EDGE_KINDS)}
    rows = [(9, 1, kind["launch"], 50, False), (9, 2, kind["thread"], 50, False), (9, 3, kind["stream"], 40, False),
            (8, 1, kind["thread"], 30, False), (8, 4, kind["wake"], 35, True),
            (7, 1, kind["thread"], 30, False), (7, 4, kind["wake"], 30, True),
            (6, 5, kind["stream_wait"], 10, True)]
    narrow = pl.DataFrame(rows, schema={"_d": pl.Int64, "_s": pl.Int64, "_o": pl.Int32, "src_ns": pl.Int64,
                                        "inferred": pl.Boolean}, orient="row")
    final = np.argsort(narrow["_d"].to_numpy(), kind="stable")
    want = [False, True, False, False, True, True, False, True]
    assert _critical_in_order(narrow, final).tolist() == want
    assert _critical_ranked(narrow).tolist() == want
    wide = narrow.with_columns(src_ns=pl.col("src_ns") * 10 ** 17)  # past 62 bits with the other keys: the sort
    assert _critical_in_order(wide, final) is None and _critical_ranked(wide).tolist() == want


def test_the_walk_stops_at_a_dependency_later_than_what_it_held():
    """Two traces' events under one trace id share node numbers: node 4 is an end at 20 ns in one and a start at
    30 ns in the other. The walk back from node 4 (30 ns) takes its edge from node 2 (10 ns); node 2's own edge
    comes from node 4 at 30 ns, later than 10: the walk stops there (it went round forever, growing its list of
    segments until memory ran out)."""
    from traceparse.measures.critical_path import EDGE_SCHEMA

    def edge(src, src_ns, dst, dst_ns):
        return {"src_trace": "t", "src_node": src, "src_ns": src_ns, "dst_trace": "t", "dst_node": dst,
                "dst_ns": dst_ns, "edge": "thread", "segment": "host op", "name": "x", "tid": 1, "critical": True}

    graph = pl.DataFrame([edge(2, 10, 4, 20), edge(4, 30, 2, 40)],
                         schema={**EDGE_SCHEMA, "critical": pl.Boolean}).cast(EDGE_SCHEMA)
    windows = pl.DataFrame({"trace_id": ["t"], "rank": [None], "step": [1], "start_ns": [0], "end_ns": [50]},
                           schema_overrides={"rank": pl.Int32})
    paths, segments = critical_paths(graph, windows)
    assert paths.select("length_ns", "segments").row(0) == (20, 1)
    assert segments.select("src_node", "dst_node", "start_ns", "end_ns").rows() == [(2, 4, 10, 30)]


def test_a_graph_launch_reaches_every_kernel_of_the_graph():
    events = table(host("api", "cudaGraphLaunch", 0, 5, correlation_id=9), gpu("k1", 10, 20, correlation_id=9),
                   gpu("k2", 20, 30, correlation_id=9), gpu("k3", 31, 40, correlation_id=9))
    graph = dependency_graph(events)
    assert edges_of(graph, "launch") == [(0, 2, "launch", 10, True), (0, 4, "launch", 20, False),
                                         (0, 6, "launch", 31, False)]
    # k2 and k3 waited for the kernel before them (queued), not for the launch
    assert [r[:3] + r[4:] for r in edges_of(graph, "stream") if r[2] == "queue"] == [(3, 4, "queue", True),
                                                                                      (5, 6, "queue", True)]


@pytest.mark.skipif(not GRAPHS.exists(), reason="the shared CUDA-graph sample is not here")
def test_graph_launches_on_a_real_trace_equal_the_raw_json():
    events = raw_events(GRAPHS)
    launches = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"
                and e["name"] == "cudaGraphLaunch"}
    replayed = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                and e.get("args", {}).get("correlation") in launches]
    graph = dependency_graph(read_torch(GRAPHS).events)
    from_graph = graph.filter((pl.col("edge") == "launch") & (pl.col("name") == "cudaGraphLaunch"))
    assert len(replayed) > 100
    assert from_graph.height == len(replayed)


def test_a_thread_woken_by_another_is_inferred_only_with_runtime_calls():
    # thread 2 runs nothing from 1000 to 60_000; thread 1's op ends at 59_000; a runtime call makes waits visible
    rows = [host("op", "work", 0, 1000, tid=2), host("op", "producer", 0, 59_000, tid=1),
            host("op", "consumer", 60_000, 61_000, tid=2), host("api", "cudaGetDevice", 61_000, 61_100, tid=1)]
    woke = dependency_graph(table(*rows)).filter(pl.col("edge") == "wake")
    assert woke.select("src_node", "dst_node", "gap_ns", "critical", "inferred").rows() == [(3, 4, 1000, True, True)]
    without = dependency_graph(table(*rows[:3]))
    assert "wake" not in set(without["edge"])  # no runtime calls: the gap is untraced time, not a wait
    assert without.filter(pl.col("dst_node") == 4).select("segment", "critical").rows() == [("untraced", True)]


def test_a_python_frame_that_held_the_wait_for_autograds_thread_is_woken_by_it(tmp_path):
    # sweep 18's amp_accum (with_stack=True): the main thread's `<built-in method run_backward ...>` frame spans
    # each backward, run by autograd's own thread; nothing of the main thread is inside it. The frame's end is
    # itself an end point of its thread at the resuming instant: the wake was looked up at or before that instant,
    # found the frame's own end, and no wake edge was made, so 6.112 ms a step (54%) of the path was "host op
    # run_backward", the wait itself. Oracle (raw JSON): each frame is woken by the last end on another thread of
    # its process inside it.
    path = FIXTURES / "torch" / "sweep18" / "amp_accum.json.gz"
    raw = raw_events(path)
    host_cats = ("cpu_op", "cuda_runtime", "cuda_driver", "python_function", "user_annotation")

    def end(e: dict) -> int:
        return us_to_ns(e["ts"]) + us_to_ns(e["dur"])

    frames = [e for e in raw if e["name"].startswith("<built-in method run_backward")]
    expected = sorted((max(end(e) for e in raw if e.get("cat") in host_cats and e["pid"] == f["pid"]
                           and e["tid"] != f["tid"] and us_to_ns(f["ts"]) < end(e) < end(f)), end(f)) for f in frames)
    assert len(expected) == 12  # 4 micro-batches x 3 steps
    graph = dependency_graph(read_torch(path).events)
    woke = graph.filter((pl.col("edge") == "wake") & pl.col("dst_ns").is_in([b for _, b in expected]))
    assert sorted(woke.select("src_ns", "dst_ns").rows()) == expected
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    host_ops = json.loads(out)["findings"][0]["metrics"]["host_ops"]
    assert not [name for name in host_ops if "run_backward" in name]


def test_an_nvtx_step_range_owns_untraced_time_as_profilerstep_does(tmp_path):
    # sweep 18's nsys capture: steps are the NVTX ranges "step 1".."step 3" (no ProfilerStep#N) and the trace has
    # no operators, only those ranges and runtime calls (raw SQLite below). A step range's own time was "host op
    # step N", 4.734 ms a step (33.3%), in a message that says the host's own work is untraced time; as a
    # ProfilerStep#N's, it is time the trace does not show
    import gzip
    import sqlite3

    path = FIXTURES / "nsys" / "sweep18" / "lstm_gru_nsys.sqlite.gz"
    db = tmp_path / "t.sqlite"
    db.write_bytes(gzip.decompress(path.read_bytes()))
    con = sqlite3.connect(db)
    ranges = [r[0] for r in con.execute("SELECT text FROM NVTX_EVENTS ORDER BY start")]
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    con.close()
    assert ranges == ["step 1", "step 2", "step 3"] and not {t for t in tables if "PYTORCH" in t or "OSRT" in t}
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    finding = json.loads(out)["findings"][0]
    metrics = finding["metrics"]
    assert metrics["host_ops"] == {} and "host op" not in metrics["by_kind"]
    top = finding["items"][0]
    assert (top["lane"], top["kind"], top["name"]) == ("thread 591 (python3)", "untraced", "(nothing traced in step N)")
    assert metrics["untraced_pct"] == round(100 * metrics["by_kind"]["untraced"] / metrics["length_ns"], 4)


def test_formats_give_the_edges_they_carry():
    from traceparse.ingest import read_paths

    csv = read_paths([FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv"])[0].events
    assert set(dependency_graph(csv)["edge"]) == {"stream"}  # no host events: stream order only
    api = read_paths([FIXTURES / "nvprof" / "handwritten" / "gpu_api_trace.log"])[0].events
    assert set(dependency_graph(api)["edge"]) == {"stream", "launch"}  # API rows without threads
    sqlite = read_paths([FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"])[0].events
    assert {"thread", "stream", "launch"} <= set(dependency_graph(sqlite)["edge"])


# -- collectives across ranks -----------------------------------------------------------------------------------
def raw_parts(folder: Path, pick) -> dict[int, dict[str, list[tuple[int, int]]]]:
    """{rank: {collective: [(start, end), ...] in order of start}} of the events ``pick`` selects."""
    out = {}
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        found: dict[str, list] = {}
        for e in raw_events(path):
            collective = pick(e)
            if collective:
                s = us_to_ns(e["ts"])
                found.setdefault(collective, []).append((s, s + us_to_ns(e["dur"])))
        out[rank] = {k: sorted(v) for k, v in found.items()}
    return out


def gloo_annotation(e: dict) -> str | None:
    if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"):
        return e["name"][5:]
    return None


def nccl_kernel(e: dict) -> str | None:
    if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_"):
        return "all_reduce" if "AllReduce" in e["name"] else "broadcast"
    return None


@pytest.mark.parametrize("folder, pick", [(MULTIRANK / "gloo4_slow_rank2", gloo_annotation),
                                          (MULTIRANK / "nccl2_slow_rank1", nccl_kernel)], ids=["gloo", "nccl"])
def test_every_rank_leaves_a_collective_when_the_last_one_joined(folder, pick):
    parts = raw_parts(folder, pick)
    ranks = sorted(parts)
    instants = sorted(max(parts[r][c][k][0] for r in ranks) for c in parts[ranks[0]]
                      for k in range(len(parts[ranks[0]][c])))
    graph = dependency_graph(run_of(folder).events)
    joins = graph.filter(pl.col("edge") == "join")
    # one node per instance, at the last member's joining: its part's start (gloo's annotation, NCCL's kernel)
    assert sorted(joins.group_by("dst_node").agg(pl.col("dst_ns").first())["dst_ns"]) == instants
    assert joins.height == len(instants) * len(ranks)
    assert sorted(joins["src_ns"]) == sorted(s for r in ranks for c in parts[r] for s, _ in parts[r][c])
    # each member leaves at the end of its part (these trimmed traces have nothing inside the annotations), where
    # that is after the last joining: gloo's broadcast root may be done before the last receiver joined
    leaves = graph.filter(pl.col("edge") == "leave")
    early = lambda r, c, k: parts[r][c][k][1] < max(parts[q][c][k][0] for q in ranks)  # noqa: E731
    ends = [parts[r][c][k][1] for r in ranks for c in parts[r] for k in range(len(parts[r][c])) if not early(r, c, k)]
    assert {c for r in ranks for c in parts[r] for k in range(len(parts[r][c])) if early(r, c, k)} == {"broadcast"}
    assert sorted(leaves["dst_ns"]) == sorted(ends)
    # the instance's critical join is its last member
    crit = joins.filter(pl.col("critical"))
    assert sorted(crit["src_ns"]) == instants


def test_the_run_graph_partitioned_by_rank_equals_the_whole():
    events = run_of(MULTIRANK / "nccl2_slow_rank1").events
    whole = dependency_graph(events).sort("trace_id", "dst_node", "src_trace", "src_node", "edge")
    parted = partitioned(dependency_graph, events, by="trace_id").sort("trace_id", "dst_node", "src_trace",
                                                                       "src_node", "edge")
    assert whole.equals(parted)
    assert whole.filter(pl.col("dst_trace") == INSTANCE_TRACE).height > 0


@pytest.mark.parametrize("source", ["torch/resnet18_bs8.json.gz", "torch/multirank/fsdp4_slow_loader",
                                    "torch/multirank/gloo4_slow_rank2"])
@pytest.mark.parametrize("align_clocks", [False, True])
def test_the_graph_of_a_table_in_memory_is_combine_of_its_one_part(source, align_clocks):
    """A table in memory gets its graph without packing the edges into one row of lists and out (the peak of the
    1 GB trace): the very frame the measure's part and combine give."""
    path = FIXTURES / source
    events = run_of(path).events if path.is_dir() else read_torch(path).events
    direct = dependency_graph(events, align_clocks=align_clocks)
    packed = dependency_graph.combine([dependency_graph.part(events, align_clocks=align_clocks)],
                                      align_clocks=align_clocks)
    assert direct.height > events.height and direct.equals(packed) and direct.schema == packed.schema


def test_a_group_of_ranks_is_built_in_one_pass_with_each_rank_as_alone(monkeypatch):
    """The ranks of a group (analyze reads small ranks together) are built at once, not rank by rank: each
    trace's own edges are those it has alone, and the per-trace work runs once for the whole group."""
    from traceparse.measures import critical_path as cp

    events = run_of(MULTIRANK / "gloo4_slow_rank2").events
    by_trace = events.partition_by("trace_id", maintain_order=True)
    assert len(by_trace) == 4
    order = ["dst_trace", "dst_node", "src_node", "edge"]
    alone = pl.concat([cp.trace_edges(t) for t in by_trace]).sort(order, nulls_last=True)
    calls = []
    real = cp._host_points
    monkeypatch.setattr(cp, "_host_points", lambda e, *more: calls.append(e["trace_id"].n_unique()) or real(e, *more))
    together = cp.trace_edges(events).sort(order, nulls_last=True)
    assert together.equals(alone)
    assert set(together["rank"]) == {0, 1, 2, 3} and (together["rank"] == together["src_rank"]).all()
    dependency_graph(events)
    assert calls == [4, 4]  # one pass over the four ranks, each time


# -- the critical path on real runs -----------------------------------------------------------------------------
@needs_samples
def test_on_the_slow_run_the_path_crosses_to_rank_2_and_holds_its_sleep():
    finding = run_rule(run_of(SLOW), "critical-path")
    m = finding.metrics
    calls = {"c10d::allreduce_": "all_reduce", "c10d::broadcast_": "broadcast"}
    arrivals = raw_parts(SLOW, lambda e: calls.get(e["name"]) if e.get("cat") == "cpu_op" else None)
    joins = raw_parts(SLOW, gloo_annotation)
    last_at = {}  # the instant of each instance (its last join) -> (its last joiner, its last arrival by c10d call)
    for c in joins[0]:
        for k in range(len(joins[0][c])):
            at = max(joins[r][c][k][0] for r in joins)
            latest = max(arrivals[r][c][k][0] for r in arrivals)
            last_at[at] = (max(joins, key=lambda r: joins[r][c][k][0]),
                           min(r for r in arrivals if arrivals[r][c][k][0] == latest))
    sleeps = {}
    for r in range(4):
        events = raw_events(SLOW / f"rank{r}.json.gz")
        steps = raw_steps(SLOW / f"rank{r}.json.gz")
        mine = [d for d in m["per_step"] if d["rank"] == r]
        assert sorted(d["step"] for d in mine) == sorted(steps)
        for d in mine:
            start, end = steps[d["step"]]
            assert d["step_ns"] == end - start
            assert d["length_ns"] <= d["step_ns"] and d["length_ns"] >= 0.95 * d["step_ns"]
            for c in d["crossings"]:  # every crossing goes to the rank that joined last, there
                assert last_at[start + c["offset_ns"]][0] == c["to_rank"]
            if r != 2:  # the others' paths cross to rank 2 where it arrived last
                assert any(c["to_rank"] == 2 and last_at[start + c["offset_ns"]][1] == 2 for c in d["crossings"]), d
        if r == 2:
            name = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
            hooks = {n: [e for e in events if e["name"] == name and s <= us_to_ns(e["ts"]) < t]
                     for n, (s, t) in steps.items()}
            sleeps = {n: max(self_time(events, e) for e in found) for n, found in hooks.items()}
            all_of_it = {n: sum(self_time(events, e) for e in found) for n, found in hooks.items()}
    # rank 2's hook (a sleep in AccumulateGrad) is on every rank's path: the largest part, at least the sleep's
    # self time and at most the self time of every call of that name in the step
    top = finding.items[0]
    assert (top["rank"], top["kind"], top["name"]) == (2, "host op", name)
    assert min(sleeps.values()) > 50_000_000
    assert 0.99 * sum(sleeps.values()) / 3 <= top["per_step_ns"] <= max(all_of_it.values())
    assert finding.severity == "critical" and finding.title == "Rank 2's AccumulateGrad holds the step"
    assert finding.summary == ("critical path", f"rank 2's AccumulateGrad (host op, thread {top['lane'][7:]}) holds "
                               f"the step: {fmt_ns(top['per_step_ns'])} of each step's critical path "
                               f"({fmt_pct(top['share_pct'])}); without it each step is "
                               f"{fmt_ns(m['drop_gain_ns'])} shorter (replayed)")
    # replayed without the hook, every rank gains about the sleep: nothing else of rank 2 holds them
    assert 0.9 * min(sleeps.values()) <= m["drop_gain_slowest_ns"] <= max(all_of_it.values())
    assert 0.9 * min(sleeps.values()) <= m["drop_gain_ns"] <= max(all_of_it.values())
    assert m["ranks"]["0"]["crossed_to"]["2"] >= 3


@needs_samples
def test_segments_add_up_to_the_length_and_never_exceed_the_step():
    events = run_of(SLOW).events
    graph = dependency_graph(events)
    windows = []
    for r in range(4):
        for n, (s, e) in raw_steps(SLOW / f"rank{r}.json.gz").items():
            windows.append({"trace_id": f"rank{r}", "rank": r, "step": n, "start_ns": s, "end_ns": e})
    paths, segments = critical_paths(graph, pl.DataFrame(windows, schema_overrides={"rank": pl.Int32}))
    sums = dict(((t, s), v) for t, s, v in segments.group_by("trace_id", "step").agg(pl.col("duration_ns").sum())
                .iter_rows())
    for p in paths.iter_rows(named=True):
        assert sums[(p["trace_id"], p["step"])] == p["length_ns"] <= p["step_ns"]
        assert p["length_ns"] + p["unexplained_ns"] == p["end_ns"] - p["start_ns"]
    # segments tile the path: each starts where the one before it (later in time) ended
    for (_, _), seg in segments.sort("index").group_by("trace_id", "step", maintain_order=True):
        assert seg["start_ns"].to_list()[:-1] == seg["end_ns"].to_list()[1:]


@needs_samples
def test_the_balanced_run_is_info():
    finding = run_rule(run_of(BALANCED), "critical-path")
    assert finding.severity == "info"
    assert finding.metrics["wait_pct"] < 10
    for d in finding.metrics["per_step"]:
        assert d["length_ns"] <= d["step_ns"]


def test_a_trimmed_run_says_what_it_cannot_see():
    folder = MULTIRANK / "nccl2_slow_rank1"
    finding = run_rule(run_of(folder), "critical-path")
    m = finding.metrics
    assert any(line.startswith("no runtime calls") for line in m["missing"])
    assert "no runtime calls" in finding.message
    for r in (0, 1):
        steps = raw_steps(folder / f"rank{r}.json.gz")
        for d in (d for d in m["per_step"] if d["rank"] == r):
            start, end = steps[d["step"]]
            assert d["step_ns"] == end - start and d["length_ns"] <= d["step_ns"]
    # the host's wait for the GPU (a cudaDeviceSynchronize the trimming dropped) is untraced time, said so
    assert m["untraced_pct"] > 50 and m["by_kind"]["untraced"] > 0
    assert finding.severity == "info"


def test_one_trace_and_the_json_envelope(tmp_path):
    path = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    steps = raw_steps(path)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    finding = json.loads(out)["findings"][0]
    m = finding["metrics"]
    assert finding["rule"] == "critical-path" and finding["severity"] == "info"
    assert [(d["step"], d["step_ns"]) for d in m["per_step"]] == sorted((n, e - s) for n, (s, e) in steps.items())
    assert all(d["length_ns"] <= d["step_ns"] for d in m["per_step"])
    assert sum(m["by_kind"].values()) == pytest.approx(m["length_ns"], abs=len(m["by_kind"]))
    assert m["ranks"] == {} and finding["impact_ns"] is None


# -- stragglers: what the slow rank did (issue 24 item 4) --------------------------------------------------------
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
COMMUNICATION = ("gloo:", "c10d::", "nccl:", "ProfilerStep#")


def raw_step_time_by_name(path: Path) -> tuple[dict[tuple[str, str], float], int]:
    """{(kind, name): time per step} of one rank from its raw JSON, and its step time: host operators and
    annotations by self time (duration − their direct children's on the thread, a stack sweep), GPU work by
    duration, each counted when it starts inside a ProfilerStep# window."""
    events = raw_events(path)
    steps = sorted(raw_steps(path).values())
    inside = lambda t: any(s <= t < e for s, e in steps)  # noqa: E731
    out: dict[tuple[str, str], int] = {}
    threads: dict = {}
    for i, e in enumerate(events):
        if e.get("cat") in HOST_CATS:
            threads.setdefault((e["pid"], e["tid"]), []).append(i)
        elif e.get("cat") in GPU_CATS and inside(us_to_ns(e["ts"])):
            key = (GPU_CATS[e["cat"]], e["name"])
            out[key] = out.get(key, 0) + us_to_ns(e["dur"])
    for rows in threads.values():
        rows.sort(key=lambda i: (us_to_ns(events[i]["ts"]), -us_to_ns(events[i]["dur"]), i))
        own = {i: us_to_ns(events[i]["dur"]) for i in rows}
        stack: list[int] = []
        for i in rows:
            s = us_to_ns(events[i]["ts"])
            while stack and us_to_ns(events[stack[-1]]["ts"]) + us_to_ns(events[stack[-1]]["dur"]) <= s:
                stack.pop()
            if stack:
                parent = stack[-1]
                parent_end = us_to_ns(events[parent]["ts"]) + us_to_ns(events[parent]["dur"])
                own[parent] -= min(s + us_to_ns(events[i]["dur"]), parent_end) - s
            stack.append(i)
        for i in rows:
            e = events[i]
            if e["cat"] in ("cpu_op", "user_annotation") and inside(us_to_ns(e["ts"])) \
                    and not e["name"].startswith(COMMUNICATION):
                key = ("op" if e["cat"] == "cpu_op" else "marker", e["name"])
                out[key] = out.get(key, 0) + max(own[i], 0)
    return {k: v / len(steps) for k, v in out.items()}, sum(e - s for s, e in steps)


def oracle_excess(folder: Path, slow: int, floor_pct: float, top: int = 5) -> dict[str, list[dict]]:
    import statistics

    per_rank, step_time = {}, {}
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        per_rank[rank], step_time[rank] = raw_step_time_by_name(path)
    floor = floor_pct / 100 * step_time[slow] / 3
    rows = []
    for key in set().union(*per_rank.values()):
        mine, median = per_rank[slow].get(key, 0.0), statistics.median_low(per_rank[r].get(key, 0.0) for r in per_rank)
        if mine > median and round(mine) - round(median) >= floor:
            rows.append({"kind": key[0], "name": key[1], "slow_ns": round(mine), "median_ns": round(median),
                         "excess_ns": round(mine) - round(median)})
    rows.sort(key=lambda r: (-r["excess_ns"], r["kind"], r["name"]))
    return {"slow_rank_host": [r for r in rows if r["kind"] in ("op", "marker")][:top],
            "slow_rank_gpu": [r for r in rows if r["kind"] in GPU_CATS.values()][:top]}


@needs_samples
def test_stragglers_names_what_rank_2_did_longer_than_the_median_rank():
    trace = run_of(SLOW)
    finding = run_rule(trace, "stragglers")
    m = finding.metrics
    want = oracle_excess(SLOW, 2, 1.0)
    assert m["slow_rank_host"] == want["slow_rank_host"] and m["slow_rank_gpu"] == want["slow_rank_gpu"] == []
    (sleep,) = m["slow_rank_host"]  # only the hook's sleep exceeds the median rank by 1% of a step
    assert sleep["name"] == "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    assert sleep["excess_ns"] > 55_000_000
    explains = min(100.0, 100 * sleep["excess_ns"] / m["wait_caused_per_step_ns"])
    assert explains > 50  # the sleep is the wait
    assert (f"Longer on rank 2 than on the median rank, per step: {sleep['name']} (host, "
            f"{fmt_ns(sleep['slow_ns'])} a step against {fmt_ns(sleep['median_ns'])}, {fmt_ns(sleep['excess_ns'])} "
            f"more). Against the {fmt_ns(m['wait_caused_per_step_ns'])} a step the others wait: the largest excess is "
            f"{fmt_ns(sleep['excess_ns'])}, {fmt_pct(explains)} of it.") in finding.message
    assert "No kernel or copy takes" in finding.message
    assert finding.suggestion.startswith(f"Start with {sleep['name']} on rank 2: ")
    # with no floor, every name longer on rank 2 is a candidate: the five largest of each side, as the raw JSON says
    everything = run_rule(trace, "stragglers", "stragglers.min_excess_pct=0").metrics
    want = oracle_excess(SLOW, 2, 0.0)
    assert everything["slow_rank_host"] == want["slow_rank_host"]
    assert everything["slow_rank_gpu"] == want["slow_rank_gpu"] and len(want["slow_rank_gpu"]) == 5


def test_a_longer_part_that_explains_little_of_the_wait_is_not_where_to_start(tmp_path):
    """nccl2_slow_rank1's rank 1 sleeps in a hook the trimmed trace does not record: its step 4 read "Start with
    DistributedDataParallel.forward on rank 1" for 1.9 ms more a step against a 73.9 ms wait. Each longer part
    is listed with its excess, the largest with how much of the wait it explains, and one under half of it is not
    offered as where to start."""
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(MULTIRANK / "nccl2_slow_rank1"), "--step", "4",
                             "--rule", "stragglers", "--json")
    assert code == 0, err
    [finding] = json.loads(out)["findings"]
    m = finding["metrics"]
    [lead] = m["slow_rank_host"]
    explains = 100 * (lead["slow_ns"] - lead["median_ns"]) / m["wait_caused_per_step_ns"]
    assert explains < 5
    assert (f"{lead['name']} (host, {fmt_ns(lead['slow_ns'])} a step against {fmt_ns(lead['median_ns'])}, "
            f"{fmt_ns(lead['slow_ns'] - lead['median_ns'])} more). Against the "
            f"{fmt_ns(m['wait_caused_per_step_ns'])} a step the others wait: the largest excess is "
            f"{fmt_ns(lead['slow_ns'] - lead['median_ns'])}, {fmt_pct(explains)} of it.") in finding["message"]
    assert not finding["suggestion"].startswith("Start with")
    assert finding["suggestion"].startswith(f"What the trace records on rank 1 explains little of the wait (its largest "
                                            f"excess, {lead['name']}, is {fmt_pct(explains)} of it)")


def test_stragglers_on_a_trimmed_run_says_it_cannot_compare_host_work():
    finding = run_rule(run_of(MULTIRANK / "nccl2_slow_rank1"), "stragglers")
    assert finding.metrics["straggler_rank"] == 1
    assert "The trace of rank 1 has no operators (recorded or trimmed without them)" in finding.message
    assert finding.metrics["slow_rank_host"] == []


# -- replay: the same graph run forwards -------------------------------------------------------------------------
def test_replay_with_the_measured_weights_gives_back_every_measured_time():
    from traceparse.measures.critical_path import replay

    runs = [MULTIRANK / "nccl2_slow_rank1"] + ([SLOW] if SLOW.exists() else [])
    for events in [table(*STEP)] + [run_of(folder).events for folder in runs]:
        placed = replay(dependency_graph(events))
        assert placed.height > 0 and (placed["replayed_ns"] == placed["measured_ns"]).all()


def test_replay_of_a_shorter_kernel_shortens_the_sync_and_the_step():
    from traceparse.measures.critical_path import replay

    graph = dependency_graph(table(*STEP))
    half = pl.when(pl.col("segment") == "kernel").then(pl.col("weight_ns") // 2).otherwise(pl.col("weight_ns"))
    at = dict(((t, n), r) for t, n, _, r in replay(graph, half).iter_rows())
    # K starts at 25 and now runs 77 ns; the sync (its own time weighs nothing: it only ever waited) ends its
    # 20 ns wake-up after K, and the step 10 ns after the sync: 25 + 77 + 20 + 10
    assert at[("t", 11)] == 102 and at[("t", 9)] == 122 and at[("t", 1)] == 132


def test_a_title_names_a_kernel_by_its_name_not_its_argument_list():
    """The four-GPU balanced run once titled "Rank 2's Params) holds the step": the last ``::`` part of a kernel's
    whole signature. A title takes the name before the argument list, outside template brackets."""
    from traceparse_plugins.rules.critical_path import _short

    kernel = ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
              "(cutlass_80_simt_sgemm_256x128_8x4_nn_align1::Params)")
    assert _short(kernel) == "Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_al…"
    assert _short("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert _short("autograd::engine::evaluate_function: AddBackward0") == "AddBackward0"
    assert [_short(n) for n in ("aten::mm", "DataLoader", "(weird)")] == ["mm", "DataLoader", "(weird)"]


def test_one_untraced_part_of_every_step_is_one_row_as_whatif_shows_it(tmp_path):
    """The rule listed "(nothing traced in ProfilerStep#1)", "#2", "#3" as rows of their own, each a third of the
    part and ranked below smaller parts; whatif (no edit: the same paths) shows the one part. They agree now."""
    import re as _re

    path = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", path, "--rule", "critical-path", "--json")
    assert code == 0, err
    items = json.loads(out)["findings"][0]["items"]
    assert not any(_re.search(r"ProfilerStep#\d", i["name"]) for i in items)
    code, out, err = run_cli("--store", store, "whatif", path, "--json", "--top", "1000")
    assert code == 0, err
    whatif = {(t["lane"], t["kind"], t["name"]): t["per_step_ns"] for t in json.loads(out)["path"]["top"]}
    mine = {(i["lane"], i["kind"], i["name"]): i["per_step_ns"] for i in items}
    key = next(k for k in mine if k[2] == "(nothing traced in ProfilerStep#N)")
    assert mine[key] == whatif[key] > 0


def test_lanes_carry_the_threads_names(tmp_path):
    """A path's lanes name the threads as the trace does ("thread 522 (python3)"), in analyze and whatif alike; an
    XLA host line's hashed id read "thread -7836944042475012629" though the profile names it. Names from the raw
    JSON's thread_name metadata events."""
    import gzip

    path = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    with gzip.open(path, "rt") as f:
        named = {e["tid"]: e["args"]["name"] for e in json.load(f)["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "thread_name"}
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    lanes = {i["lane"] for f in json.loads(out)["findings"] for i in f["items"]}
    threads = {lane for lane in lanes if lane.startswith("thread ")}
    # Kineto names a thread "thread 522 (python3)": the lane reads as the trace names it
    assert threads and threads == {named[tid] for tid in {int(lane.split()[1]) for lane in threads}}
    code, out, err = run_cli("--store", str(tmp_path), "whatif", str(path), "--json")
    assert code == 0, err
    assert {t["lane"] for t in json.loads(out)["path"]["top"] if t["lane"].startswith("thread ")} <= threads


def test_a_name_that_carries_its_id_is_the_lane():
    from traceparse.expr import lane_label

    names = {(0, -78): "tf_pjrt_thread_pool/-78", (0, 5): "python", (None, 9): "XLA Ops", (1, 6): "a", (2, 6): "b"}
    rows = pl.DataFrame({"tid": [-78, 5, 9, 6, None, None], "stream_id": [None, None, None, None, 7, None]},
                        schema={"tid": pl.Int64, "stream_id": pl.Int64})
    assert rows.select(lane_label(names)).to_series().to_list() == [
        "thread tf_pjrt_thread_pool/-78", "thread 5 (python)", "thread 9", "thread 6", "stream 7", "-"]


@pytest.mark.parametrize("run", ["ddp4_slow_loader", "ddp4_slow_hook", "fsdp2_slow_hook", "nccl2_slow_rank1"])
def test_no_part_is_larger_than_its_kind(tmp_path, run):
    """On ddp4_slow_loader the breakdown read "waiting for another rank 38.3%, ..., host op 26.2%" above a table
    whose rank 1 DataLoader row was 50.1% of the path: the same milliseconds under two kinds. Each segment keeps
    its own kind now: the kinds add up to the path, and every row of the table fits inside its kind."""
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(MULTIRANK / run), "--rule", "critical-path",
                             "--json")
    assert code == 0, err
    [finding] = json.loads(out)["findings"]
    m = finding["metrics"]
    assert abs(sum(m["by_kind"].values()) - m["length_ns"]) <= len(m["by_kind"])  # each kind rounded once
    assert "waiting for another rank" not in m["by_kind"]
    for item in finding["items"]:
        assert item["per_step_ns"] <= m["by_kind"][item["kind"]], item
    for name, ns in m["host_ops"].items():
        assert ns <= m["by_kind"]["host op"]
    assert m["wait_ns"] <= m["other_rank_ns"] <= m["length_ns"]


def test_the_straggler_table_says_its_times_are_totals_over_the_steps(tmp_path):
    """Its "step time (ms)" column held the sum of a rank's steps (328.6 ms) beside a message in ms per step (an
    82 ms step): the table is titled as totals now, each rank's time in steps the sum of its ProfilerStep#N."""
    folder = MULTIRANK / "ddp4_slow_loader"
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(folder), "--rule", "stragglers", "--json")
    assert code == 0, err
    [finding] = json.loads(out)["findings"]
    assert finding["items_title"] == "ranks, totals over all steps"
    assert {c["key"]: c["label"] for c in finding["columns"]}["step_ns"] == "time in steps"
    for item in finding["items"]:
        steps = raw_steps(folder / f"rank{item['rank']}.json.gz")
        assert len(steps) == 4 and item["step_ns"] == sum(e - s for s, e in steps.values())


@pytest.mark.parametrize("spread", [10 ** 9, 2 ** 62])
def test_nodes_are_ordered_as_a_lexsort_orders_them(spread):
    """The graph's nodes in order (trace, time, GPU before host, number) by one packed sort, as numpy's lexsort
    of the four orders them: ties of time and of the host flag included, and clocks 2^62 ns apart (no packing)."""
    import numpy as np

    from traceparse.measures.critical_path import _node_order

    rng = np.random.default_rng(7)
    code, number = rng.integers(0, 300, 50_000), rng.integers(0, 5_000, 50_000)
    first = np.lexsort((number, code))  # the order _Nodes has them in
    code, number = code[first], number[first]
    at = rng.integers(-spread // 2, spread // 2, 50_000)
    at[::3] = at[0]  # a third of the nodes at one time
    host = rng.integers(0, 2, 50_000).astype(bool)
    assert (_node_order(code, at, host, number) == np.lexsort((number, host, at, code))).all()


def test_a_rank_last_at_every_collective_keeps_its_kernels_own_time_in_a_replay():
    """Rank 1 of the NCCL pair sleeps 60 ms a step and is last at every all-reduce: none of its leave edges is
    critical (its kernel's own stream edge is), so there was no typical one to weigh them by and they weighed 0;
    in a replay where rank 0 joined later, rank 1's kernels would end the moment it joined. Such a leave edge
    weighs its measured time: its kernel's time after the last joining, here its whole length (the raw JSON)."""
    folder = MULTIRANK / "nccl2_slow_rank1"
    raw = raw_events(folder / "rank1.json.gz")
    lengths = sorted(round(e["dur"] * 1000) for e in raw if e.get("ph") == "X" and e.get("cat") == "kernel"
                     and e["name"].startswith("ncclDevKernel"))
    graph = dependency_graph(run_of(folder).events)
    leave = graph.filter((pl.col("edge") == "leave") & (pl.col("rank") == 1) & pl.col("stream_id").is_not_null())
    assert leave.height == len(lengths) > 0
    assert not leave["critical"].any()
    assert sorted(leave["weight_ns"].to_list()) == sorted(leave["gap_ns"].to_list()) == lengths
