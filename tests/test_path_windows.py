"""Issue 25: the critical paths of one large trace, a group of its steps at a time (``traceparse.measures.
path_windows``), so that the graph of the whole trace is never in memory at once.

The oracle is the whole graph's paths (``critical_paths`` over ``dependency_graph``, which test_critical_path
checks against the raw JSON): on real traces of every format with steps, the windowed paths and segments must
be the same frames, row for row, with each step its own group (the most cuts) and with a few steps a group.
Handwritten traces pin the edges that reach into a window from far before it: a thread or a stream idle for a
second, a launch call long before its kernel, a blocking call that began before the window.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from helpers import FIXTURES, REPO, gpu, host, run_rule, table
from traceparse import plugins
from traceparse.ingest import detect_reader
from traceparse.measures import dependency_graph
from traceparse.measures import path_windows
from traceparse.measures.critical_path import critical_paths
from traceparse.measures.path_windows import WindowIndex, window_events, windowed, windowed_critical_paths
from traceparse.measures.step_paths import step_windows
from traceparse.reader import ReadOptions
from traceparse.trace import Trace

SAMPLES = REPO.parent / "shared" / "samples"
#: Real traces with two steps or more, of every reader that gives a timeline: torch (CUDA, CUDA graphs, side
#: streams, ROCm, a rank of a two-GPU NCCL run, a TensorBoard file), nsys (SQLite), JAX (Perfetto JSON, XPlane).
REAL = [
    FIXTURES / "torch" / "resnet18_bs16.json.gz",
    FIXTURES / "torch" / "mlp_no_profilerstep_60.json.gz",
    FIXTURES / "torch" / "acceptance" / "compiled_cudagraphs_h200.json.gz",
    FIXTURES / "torch" / "acceptance" / "side_stream_copies.json.gz",
    FIXTURES / "torch" / "acceptance" / "sdpa_eager.json.gz",
    FIXTURES / "torch" / "rocm" / "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    FIXTURES / "torch" / "multirank" / "fsdp2_slow_loader" / "rank1.json.gz",
    FIXTURES / "torch" / "tb" / "vm_478.1795433570177480236.pt.trace.json",
    FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz",
    FIXTURES / "nsys" / "acceptance" / "llama_graphs_node.sqlite.gz",
    FIXTURES / "jax" / "jax_gpt" / "plugins" / "profile" / "2026_11_25_00_53_35" / "perfetto_trace.json.gz",
    FIXTURES / "jax" / "jax_mlp" / "plugins" / "profile" / "2026_11_25_00_53_13" / "vm.xplane.pb",
]


def read(path: Path) -> pl.DataFrame:
    """A trace read by the reader its sniffing picks, all batches collected, as one stored trace's table."""
    trace = detect_reader(path, plugins.registry()).read([path], ReadOptions())
    return trace.events.with_columns(trace_id=pl.lit("t"))


def whole_and_windowed(events: pl.DataFrame, rows: int) -> tuple[tuple, tuple, pl.DataFrame]:
    graph = dependency_graph(events)
    windows = step_windows(events, graph)
    whole = critical_paths(graph, windows)
    return whole, windowed_critical_paths(events, windows.select("trace_id", "rank", "step", "start_ns", "end_ns"),
                                          rows=rows), windows


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_windowed_paths_are_the_whole_graphs(path):
    events = read(path)
    for rows in (1, events.height // 3):
        (paths, segments), (w_paths, w_segments), windows = whole_and_windowed(events, rows)
        assert windows.height >= 2
        assert paths.height == windows.height and segments.height > 0
        assert_frame_equal(w_paths, paths)
        assert_frame_equal(w_segments, segments)


def test_each_step_its_own_group_or_one_group_for_all(monkeypatch):
    events = read(FIXTURES / "torch" / "mlp_no_profilerstep_60.json.gz")
    windows = step_windows(events, dependency_graph(events))
    spans = []
    real = path_windows.window_events
    monkeypatch.setattr(path_windows, "window_events",
                        lambda ev, lo, hi, *a: spans.append((lo, hi)) or real(ev, lo, hi, *a))
    windowed_critical_paths(events, windows, rows=1)
    assert len(spans) == windows.height == 60
    assert spans == sorted(windows.select("start_ns", "end_ns").rows())
    spans.clear()
    windowed_critical_paths(events, windows, rows=events.height)
    assert spans == [(windows["start_ns"].min(), windows["end_ns"].max())]


# -- what reaches into a window from far before it (handwritten) ---------------------------------------------
SECOND = 1_000_000_000
#: Step 2 starts a second after step 1 ended. Thread 2 (a loader) last ran in step 1 and resumes in step 2; the
#: stream's last kernel before step 2 ran in step 1; kernel K2 of step 2 was launched by a call in step 1 (it
#: queued behind K1 a second); the synchronisation that ends step 2 began before it.
IDLE = [
    host("marker", "ProfilerStep#1", 0, 1_000),
    host("op", "forward", 0, 900),
    host("api", "cudaLaunchKernel", 100, 120, correlation_id=1),
    host("api", "cudaLaunchKernel", 200, 220, correlation_id=2),
    host("op", "load", 50, 400, tid=2),
    gpu("K1", 150, SECOND + 100, correlation_id=1),
    host("api", "cudaDeviceSynchronize", SECOND - 50, SECOND + 2_000),
    host("marker", "ProfilerStep#2", SECOND + 1_000, SECOND + 5_000),
    gpu("K2", SECOND + 100, SECOND + 1_900, correlation_id=2),
    host("op", "load", SECOND + 1_500, SECOND + 1_700, tid=2),
    host("op", "backward", SECOND + 2_000, SECOND + 4_000),
    host("api", "cudaLaunchKernel", SECOND + 2_100, SECOND + 2_120, correlation_id=3),
    gpu("K3", SECOND + 2_200, SECOND + 4_500, correlation_id=3),
]


def test_a_window_takes_what_reaches_into_it_from_far_before():
    events = table(*IDLE)
    names = window_events(events, SECOND + 1_000, SECOND + 5_000, margin_ns=0).select("name", "tid").rows()
    assert ("load", 2) in names                   # the loader's last run before the window: its idle edge
    assert ("K1", None) in names                  # the stream's last kernel before: K2 queued behind it
    assert names.count(("cudaLaunchKernel", 1)) == 3   # K2's launch call (a second before), K3's, and K1's
    assert ("cudaDeviceSynchronize", 1) in names  # began before the window, ends in it
    assert ("ProfilerStep#1", 1) in names         # what thread 1 ran last before the window
    assert ("forward", 1) not in names            # what nothing in step 2 depends on
    (paths, segments), (w_paths, w_segments), _ = whole_and_windowed(events, rows=1)
    assert_frame_equal(w_paths, paths)
    assert_frame_equal(w_segments, segments)
    step2 = segments.filter(pl.col("step") == 2).sort("index").select("segment", "name", "start_ns").rows()
    assert step2[-2:] == [("sync", "cudaDeviceSynchronize", SECOND + 1_900), ("kernel", "K2", SECOND + 1_000)]
    # event ids in row order: node 2e is event e's start, 2e + 1 its end
    graph = dependency_graph(window_events(events, SECOND + 1_000, SECOND + 5_000, margin_ns=0))
    edges = set(graph.select("edge", "src_node", "dst_node").rows())
    assert ("launch", 2 * 3, 2 * 8) in edges      # K2's launch call, a second before K2 started
    assert ("stream", 2 * 5 + 1, 2 * 8) in edges  # K2 queued behind K1 on the stream
    assert ("thread", 2 * 4 + 1, 2 * 9) in edges  # the loader idle for a second, then loading again
    assert ("sync", 2 * 8 + 1, 2 * 6 + 1) in edges  # the blocking call that began before the window waited for K2


#: A stream whose activities overlap (a programmatic dependent launch starts while its predecessor runs): B runs
#: from step 1 into step 2, C and E start after it and end long before step 2, D starts in step 2 while B still
#: runs; a blocking call in step 2 waits for D. D's end follows B's end, and B's end follows A's end (A had
#: ended last when B started): A must be taken, though C ended later and E started later.
OVERLAP = [
    host("marker", "ProfilerStep#1", 0, 1_000),
    gpu("A", 0, 40),
    gpu("B", 5, SECOND + 2_000),
    gpu("C", 10, 45),
    gpu("E", 12, 30),
    host("marker", "ProfilerStep#2", SECOND + 1_000, SECOND + 5_000),
    gpu("D", SECOND + 1_500, SECOND + 2_500),
    host("op", "step", SECOND + 1_000, SECOND + 4_000),
    host("api", "cudaStreamSynchronize", SECOND + 1_200, SECOND + 2_600),
]


def test_on_a_stream_of_overlapping_activities_a_window_takes_what_they_queue_behind():
    events = table(*OVERLAP)
    names = window_events(events, SECOND + 1_000, SECOND + 5_000).select("name").to_series().to_list()
    assert {"A", "B", "D"} <= set(names)
    (paths, segments), (w_paths, w_segments), _ = whole_and_windowed(events, rows=1)
    assert_frame_equal(w_paths, paths)
    assert_frame_equal(w_segments, segments)
    step2 = segments.filter(pl.col("step") == 2).sort("index").select("segment", "name", "src_node").rows()
    # event ids in row order: A is 1, B 2; the last segment is B's from A's end (node 3), cut at the step's start
    assert step2[-1] == ("kernel", "B", 2 * 1 + 1)


def test_the_index_picks_the_same_rows_as_a_fresh_one():
    events = table(*IDLE)
    index = WindowIndex(events)
    for lo, hi in [(0, 10), (SECOND, SECOND + 3_000), (SECOND + 4_000, SECOND + 9_000)]:
        assert_frame_equal(window_events(events, lo, hi, 0, index), window_events(events, lo, hi, 0))


# -- when a trace is read window by window -------------------------------------------------------------------
def test_only_a_large_table_of_one_trace_and_rank_is_windowed(monkeypatch):
    events = read(FIXTURES / "torch" / "resnet18_bs16.json.gz")
    assert not windowed(events)  # 20-odd thousand rows: the whole graph
    monkeypatch.setattr(path_windows, "LARGE_TABLE_ROWS", 100)
    assert windowed(events)
    two = pl.concat([events, events.with_columns(trace_id=pl.lit("u"))])
    assert not windowed(two)     # a run's traces: its collectives join the ranks' paths
    ranked = events.with_columns(rank=pl.when(pl.col("event_id") < 10).then(0).otherwise(1).cast(pl.Int32))
    assert not windowed(ranked)
    produced = events.with_columns(data_from=pl.when(pl.col("event_id") == 5).then(pl.lit("[1]")))
    assert not windowed(produced)  # a tensor's producer may lie anywhere before its consumer


@pytest.mark.skipif(not (SAMPLES / "torch").exists(), reason="the shared samples are not here")
def test_one_process_driving_two_gpus_is_not_windowed(monkeypatch):
    monkeypatch.setattr(path_windows, "LARGE_TABLE_ROWS", 100)
    events = read(SAMPLES / "torch" / "dp2_resnet18_bs16.json.gz")
    assert not windowed(events)  # its NCCL instances join the two GPUs' paths


@pytest.mark.parametrize("path", [FIXTURES / "torch" / "resnet18_bs16.json.gz",
                                  FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz"], ids=lambda p: p.name)
def test_the_rule_says_the_same_read_window_by_window(monkeypatch, path):
    events = read(path)
    trace = Trace(events=events)
    whole = run_rule(trace, "critical-path")
    calls = []
    real = path_windows.windowed_critical_paths
    monkeypatch.setattr(path_windows, "LARGE_TABLE_ROWS", 100)
    import traceparse_plugins.rules.critical_path as rule

    monkeypatch.setattr(rule, "windowed_critical_paths",
                        lambda *a, **k: calls.append(1) or real(*a, **{**k, "rows": 1}))
    windowed_finding = run_rule(Trace(events=events), "critical-path")
    assert calls == [1]
    assert windowed_finding.title == whole.title
    assert windowed_finding.message == whole.message
    assert windowed_finding.metrics == whole.metrics
    assert windowed_finding.items == whole.items
    assert whole.metrics["paths"] >= 2


def test_the_report_and_the_chrome_export_draw_the_same_paths_window_by_window(monkeypatch):
    from traceparse.measures import step_paths
    from traceparse_plugins.commands.report.data import critical_path
    from traceparse_plugins.exporters.chrome import critical_path_events

    events = read(FIXTURES / "torch" / "resnet18_bs16.json.gz")
    report, export = critical_path(events), critical_path_events(events)
    assert report["segments"] and export[1] > 0
    calls = []
    real = step_paths.windowed_critical_paths
    monkeypatch.setattr(path_windows, "LARGE_TABLE_ROWS", 100)
    monkeypatch.setattr(step_paths, "windowed_critical_paths",
                        lambda *a, **k: calls.append(1) or real(*a, **{**k, "rows": 1}))
    assert critical_path(events) == report
    assert critical_path_events(events) == export
    assert calls == [1, 1]
