"""The critical paths found straight from the graph's unsorted edges (``path_direct``) are the paths walked over
the measure's sorted graph (``critical_paths`` over ``dependency_graph``), frame for frame, on real traces and
runs (steps, no steps, collectives across ranks, pipelines' transfers, clocks aligned); and the rule's finding is
the same where the direct walk declines and the rule walks the measure's graph."""
from __future__ import annotations

import polars as pl
import pytest

from helpers import FIXTURES, read_torch, run_of, run_rule
from traceparse.measures import dependency_graph
from traceparse.measures.critical_path import DependencyGraph, critical_paths
from traceparse.measures.path_direct import direct_critical_paths
from traceparse.measures.step_paths import step_windows

SOURCES = ["torch/resnet18_bs8.json.gz", "torch/mlp_no_profilerstep_60.json.gz", "torch/multirank/fsdp4_slow_loader",
           "torch/multirank/gloo4_slow_rank2", "torch/multirank/nccl2_slow_rank1", "torch/multirank/pp2_1f1b_slow_stage1",
           "torch/multirank/pp4_gloo_slow_stage2", "torch/multirank/ddp4_slow_hook"]


def events_of(source: str) -> pl.DataFrame:
    path = FIXTURES / source
    return run_of(path).events if path.is_dir() else read_torch(path).events.with_columns(trace_id=pl.lit("t"))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("align_clocks", [False, True])
def test_direct_paths_are_the_measures_paths(source, align_clocks):
    events = events_of(source)
    graph = dependency_graph(events, align_clocks=align_clocks)
    windows = step_windows(events, graph, spans=True)
    expected = critical_paths(graph, windows)
    edges = DependencyGraph().unchosen(events, align_clocks=align_clocks)
    assert edges.height == graph.height
    assert DependencyGraph.chosen(edges).equals(graph)  # the measure is the chosen edges
    found = direct_critical_paths(edges, step_windows(events, edges, spans=True))
    assert found is not None
    assert found[0].equals(expected[0])
    assert found[1].equals(expected[1])
    assert expected[1].height > 50
    lean = ["trace_id", "step", "index", "segment", "name", "start_ns", "duration_ns"]
    some = direct_critical_paths(edges, windows, texts=pl.Categorical, columns=lean)
    assert some[1].equals(critical_paths(graph, windows, texts=pl.Categorical, columns=lean)[1])


def test_a_null_trace_id_is_walked_on_the_measures_graph():
    """Edges of a trace without an id: the direct walk declines (the measure's numbering puts null traces first)."""
    events = read_torch(FIXTURES / "torch/resnet18_bs8.json.gz").events
    edges = DependencyGraph().unchosen(events.with_columns(trace_id=pl.lit(None, dtype=pl.String)))
    assert edges.height and direct_critical_paths(edges, step_windows(events, edges, spans=True)) is None


@pytest.mark.parametrize("source", ["torch/resnet18_bs8.json.gz", "torch/multirank/gloo4_slow_rank2"])
def test_the_rule_says_the_same_where_the_direct_walk_declines(source, monkeypatch):
    from traceparse.ingest import read_paths

    path = FIXTURES / source
    trace = run_of(path) if path.is_dir() else read_paths([path])[0]
    direct = run_rule(trace, "critical-path")
    rule = __import__("traceparse_plugins.rules.critical_path", fromlist=["x"])
    monkeypatch.setattr(rule, "direct_critical_paths", lambda *args, **kwargs: None)
    measured = run_rule(trace, "critical-path")
    assert measured.to_dict() == direct.to_dict()
    assert direct.metrics["paths"] > 0
