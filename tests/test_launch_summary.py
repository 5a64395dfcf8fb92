"""launch-stats from per-trace summaries: the finding over every launch row; a rank keeps names for its top items only.

The oracle is the rule's algorithm before the summaries (one row per kernel
launch from :data:`traceparse.measures.launches`, quantiles over all of them,
the top items sorted over all of them), written out here; the rule must give
its metrics, items and impact exactly, on the real gloo runs (rank by rank
and whole), a synthetic run whose ranks tie on every delay, and the shared
torch traces with direct and graph launches.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys

import polars as pl
import pytest

from helpers import FIXTURES, REPO, as_shown, read_torch, run_cli, run_rule
from traceparse import expr, measures
from traceparse.measures.base import PartitionedEvents, rank_result
from traceparse.run import ingest_run
from traceparse.schema import conform
from traceparse.store import Store
from traceparse.trace import Trace, TraceMeta

MULTIRANK = REPO.parent / "shared" / "samples" / "multirank"
TORCH = REPO.parent / "shared" / "samples" / "torch"
GLOO = "gloo4_resnet18_bs16_slow_rank2"
needs_samples = pytest.mark.skipif(not (MULTIRANK / GLOO).is_dir(), reason="shared multirank samples not present")
THRESHOLDS = {"launch_outlier_ns": 50000, "delay_outlier_ns": 100000, "top": 10}


def nearest_rank(values: list[int], p: float):
    return values[max(1, math.ceil(p * len(values))) - 1] if values else None


def oracle(events, top: int = 10, ranks: dict | None = None) -> tuple[dict, list[dict], int]:
    """launch-stats' metrics, items and impact_ns from every launch row (the rule before per-trace summaries);
    ``ranks`` ({trace id: rank}) for a run, whose items say their rank."""
    rows = measures.launches(events, kinds=("kernel",))
    linked = rows.filter(pl.col("launch_event_id").is_not_null())
    direct = linked.filter(pl.col("launch_class") == "launch")
    graph = linked.filter(pl.col("launch_class") == "graph_launch")
    direct_calls = direct.unique(["trace_id", "launch_event_id"])
    graph_calls = graph.unique(["trace_id", "launch_event_id"])
    launch_ns = sorted(direct_calls["launch_duration_ns"].to_list())
    everything = sorted(linked["delay_ns"].to_list())
    delays = [d for d in everything if d >= 0]  # a kernel before its launch: clocks disagree, not a delay
    short = int((direct["duration_ns"] < direct["launch_duration_ns"]).sum())
    metrics = {
        "kernels": rows.height, "linked_kernels": linked.height, "direct_kernels": direct.height,
        "launches": direct_calls.height, "launch_time_ns": sum(launch_ns),
        "graph_launches": graph_calls.height, "graph_kernels": graph.height,
        "kernels_per_graph_launch": round(graph.height / graph_calls.height, 4) if graph_calls.height else None,
        "graph_launch_time_ns": int(graph_calls["launch_duration_ns"].sum() or 0),
        "launch_ns_p50": nearest_rank(launch_ns, 0.5), "launch_ns_p90": nearest_rank(launch_ns, 0.9),
        "launch_ns_max": launch_ns[-1] if launch_ns else None,
        "clock_inconsistent": len(everything) - len(delays),
        "delay_ns_min": delays[0] if delays else None, "delay_ns_p50": nearest_rank(delays, 0.5),
        "delay_ns_p90": nearest_rank(delays, 0.9), "delay_ns_p99": nearest_rank(delays, 0.99),
        "delay_ns_max": delays[-1] if delays else None,
        "short_kernel_pct": expr.pct(short, direct.height),
        "launch_outliers": sum(1 for v in launch_ns if v >= THRESHOLDS["launch_outlier_ns"]),
        "delay_outliers": sum(1 for v in delays if v >= THRESHOLDS["delay_outlier_ns"]),
    }
    # longest delay first to the 4 significant figures the screen shows; delays that read alike: on a run the
    # lower rank first, then the longer delay; ties: lower event id, then the earlier trace (rows are in trace
    # order): a stable sort
    ranks = ranks or {}

    def key(ir):
        i, r = ir
        rank = ranks.get(r["trace_id"])
        return (-as_shown(r["delay_ns"]), rank is None, rank or 0, -r["delay_ns"], r["event_id"], i)

    ordered = sorted(((i, r) for i, r in enumerate(linked.iter_rows(named=True)) if r["delay_ns"] >= 0), key=key)
    items = [{**({"rank": ranks[r["trace_id"]]} if ranks else {}),
              "name": r["name"], "launch_name": r["launch_name"], "device_id": r["device_id"],
              "stream_id": r["stream_id"], "launch_ns": r["launch_duration_ns"], "kernel_ns": r["duration_ns"],
              "delay_ns": r["delay_ns"], "graph_kernels": r["launch_gpu_rows"]} for _, r in ordered[:top]]
    excess = sum(max(0, a - b) for a, b in zip(direct["launch_duration_ns"], direct["duration_ns"]))
    idle = int(measures.device_busy(events)["idle_ns"].sum() or 0)
    metrics["gpu_idle_ns"] = idle  # gpu-idle's idle time, also where there is no excess to cap (it read 0 there)
    return metrics, items, min(excess, idle)  # no more at stake than the GPU was idle


def check_against_oracle(trace, whole_events, top: int = 10) -> None:
    f = run_rule(trace, "launch-stats", f"launch-stats.top={top}")
    run = ((trace.meta.extra or {}).get("run") or {}) if trace.meta.format == "run" else {}
    metrics, items, impact = oracle(whole_events, top, {t: int(r) for r, t in (run.get("ranks") or {}).items()})
    assert f.metrics == metrics
    assert json.dumps(f.items) == json.dumps(items)
    ranks = max(1, len(((trace.meta.extra or {}).get("run") or {}).get("ranks") or {})) if trace.meta.format == "run" else 1
    assert f.impact_ns == round(impact / ranks)  # a run's time at stake is per rank


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The real slow-rank gloo run and a synthetic 3-rank run (every rank a copy of one: delays tie across ranks)."""
    if not (MULTIRANK / GLOO).is_dir():
        pytest.skip("shared multirank samples not present")
    store = Store(tmp_path_factory.mktemp("store"))
    synthetic = tmp_path_factory.mktemp("ranks") / "synthetic3"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"),
                    str(MULTIRANK / GLOO / "rank0.json.gz"), str(synthetic), "--ranks", "3", "--skew-us", "300"],
                   check=True, capture_output=True)
    return store, {name: ingest_run([path], store=store, jobs=1).run["id"]
                   for name, path in ((GLOO, MULTIRANK / GLOO), ("synthetic3", synthetic))}


@needs_samples
@pytest.mark.parametrize("name", [GLOO, "synthetic3"])
@pytest.mark.parametrize("top", [10, 3000])
def test_launch_stats_of_a_run_equals_the_rule_over_every_launch_row(runs, name, top):
    store, ids = runs
    whole = store.load_run(ids[name])
    lazy = store.load_run(ids[name], lazy=True)
    check_against_oracle(lazy, whole.events, top)
    check_against_oracle(whole, whole.events, top)
    assert lazy.events.whole_loads == 0 and lazy.events.most_at_once == 1


def two_traces_that_tie() -> pl.DataFrame:
    """Traces "b" then "a", the same launches (b's kernels on device 1, a's on device 0): every delay ties.

    Per trace: cudaLaunchKernel at 0 for 30 ns launches K1 [50, 60) (delay 50, shorter than its launch: 20 ns
    of excess); cudaLaunchKernel at 100 for 5 ns launches K2 [120, 160) (delay 20).
    """
    frames = []
    for trace_id, device in (("b", 1), ("a", 0)):
        rows = [{"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 30, "correlation_id": 1},
                {"kind": "kernel", "name": "K1", "start_ns": 50, "duration_ns": 10, "correlation_id": 1,
                 "device_id": device, "stream_id": 7},
                {"kind": "api", "name": "cudaLaunchKernel", "start_ns": 100, "duration_ns": 5, "correlation_id": 2},
                {"kind": "kernel", "name": "K2", "start_ns": 120, "duration_ns": 40, "correlation_id": 2,
                 "device_id": device, "stream_id": 7}]
        frames.append(conform(pl.DataFrame(rows), trace_id=trace_id))
    return pl.concat(frames)


def test_ties_across_traces_list_the_earlier_trace_id_first(tmp_path):
    events = two_traces_that_tie()
    per_trace = measures.launch_summary(events, kinds=("kernel",), top=3)
    assert per_trace.equals(measures.partitioned(measures.launch_summary, events, by="trace_id",
                                                 kinds=("kernel",), top=3))
    assert per_trace.select("trace_id", "rows", "linked", "direct", "short", "launch_excess_ns").rows() == \
        [("a", 2, 2, 2, 1, 20), ("b", 2, 2, 2, 1, 20)]
    assert per_trace["delay_ns"].to_list() == [[20, 50], [20, 50]]
    assert per_trace["launch_ns"].to_list() == [[5, 30], [5, 30]]
    # in memory (the traces keep their ids, as a run's ranks do) and as a run's partitions, rank b's file first
    paths = []
    for trace_id in ("b", "a"):
        paths.append(tmp_path / f"{trace_id}.parquet")
        events.filter(pl.col("trace_id") == trace_id).write_parquet(paths[-1])
    for table in (events, PartitionedEvents(paths, ["b", "a"])):
        trace = Trace(table, TraceMeta(id="ab"), stamp_trace_id=False)
        f = run_rule(trace, "launch-stats", "launch-stats.top=3")
        assert [(i["name"], i["device_id"], i["delay_ns"]) for i in f.items] == [("K1", 0, 50), ("K1", 1, 50),
                                                                                   ("K2", 0, 20)]
        m = f.metrics
        assert (m["kernels"], m["launches"], m["launch_time_ns"], m["delay_ns_p50"], m["delay_ns_p90"]) == \
            (4, 4, 70, 20, 50)
        assert (m["short_kernel_pct"], f.impact_ns) == (50.0, 40)
        check_against_oracle(trace, events, top=3)


@needs_samples
def test_a_ranks_result_holds_numbers_per_launch_and_names_only_for_its_top_items(runs):
    store, ids = runs
    table = store.load_run(ids[GLOO], lazy=True).events
    assert isinstance(table, PartitionedEvents)
    params = {"kinds": ("kernel",), "top": 10}
    for i in range(len(table.paths)):
        events = table.partition(i)
        result = rank_result(events, measures.launch_summary, params, True)
        full = measures.launches(events, kinds=("kernel",))
        linked = full.filter(pl.col("launch_event_id").is_not_null())
        assert result.height == 1 and linked.height > 1000
        # no string column but the trace id; the names are in the top items only, at most `top` of them
        strings = [c for c, t in result.schema.items() if t == pl.String]
        assert strings == ["trace_id"]
        assert result.schema["launch_ns"] == pl.List(pl.Int64) and result.schema["delay_ns"] == pl.List(pl.Int64)
        assert len(result["top"][0]) == 10
        # one number per linked kernel and per direct launch call: the delays and call durations, sorted
        assert result["delay_ns"][0].to_list() == sorted(linked["delay_ns"].to_list())
        direct_calls = linked.filter(pl.col("launch_class") == "launch").unique("launch_event_id")
        assert result["launch_ns"][0].to_list() == sorted(direct_calls["launch_duration_ns"].to_list())
        # what the client keeps of a rank: a small fraction of the launch rows with both names; the top items'
        # names are copies (as views into the partition's buffers they would pickle every name of the rank: 40 KB)
        assert result.estimated_size() < full.estimated_size() / 4
        assert len(pickle.dumps(result.select("top"))) < 10_000 < len(pickle.dumps(full.select("name")))


TORCH_TRACES = ["resnet18_bs32_compiled_cudagraphs.json.gz", "gpt_1024d_8l_bs8_bf16.json.gz",
                "dp2_alexnet_bs16.json.gz"]


@pytest.mark.skipif(not TORCH.is_dir(), reason="the shared samples are not next to the repository")
@pytest.mark.parametrize("name", TORCH_TRACES)
def test_launch_stats_of_a_trace_with_direct_and_graph_launches_equals_the_rule_over_every_row(name):
    trace = read_torch(TORCH / name)
    check_against_oracle(trace, trace.events)
    check_against_oracle(trace, trace.events, top=1)


def test_kernels_before_their_launch_are_clock_inconsistent_not_negative_delays():
    """Hand-made edge case: one kernel starts 5 us before its launch call (clock-inconsistent input)."""
    from traceparse.schema import conform
    from traceparse.trace import Trace, TraceMeta

    rows = []
    for i, (launch, kernel) in enumerate([(1000, 3000), (10000, 5000), (20000, 26000)]):
        rows.append({"kind": "api", "name": "cudaLaunchKernel", "start_ns": launch, "duration_ns": 500,
                     "pid": 1, "tid": 1, "correlation_id": i + 1, "trace_id": "t"})
        rows.append({"kind": "kernel", "name": f"k{i}", "start_ns": kernel, "duration_ns": 100, "device_id": 0,
                     "stream_id": 7, "correlation_id": i + 1, "trace_id": "t"})
    trace = Trace(conform(pl.DataFrame(rows)), TraceMeta(id="t"))
    f = run_rule(trace, "launch-stats")
    assert f.metrics["clock_inconsistent"] == 1
    assert (f.metrics["delay_ns_min"], f.metrics["delay_ns_max"]) == (2000, 6000)
    assert all(i["delay_ns"] >= 0 for i in f.items) and len(f.items) == 2
    assert "1 kernels start before their launch call" in f.message


def test_the_gpu_idle_time_is_gpu_idle_s_where_no_launch_outlasts_its_kernel(tmp_path):
    """A JAX GPT whose every launch is a graph launch: no direct launch outlasts its kernel, and launch-stats'
    ``gpu_idle_ns`` read 0 while gpu-idle said the GPU was idle 10.08 ms. It is gpu-idle's figure."""
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(FIXTURES / "jax" / "jax_gpt"),
                             "--rule", "launch-stats", "--rule", "gpu-idle", "--json")
    assert code == 0, err
    found = {f["rule"]: f for f in json.loads(out)["findings"]}
    assert found["gpu-idle"]["metrics"]["idle_ns"] > 0
    assert found["launch-stats"]["metrics"]["gpu_idle_ns"] == found["gpu-idle"]["metrics"]["idle_ns"]
    assert found["launch-stats"]["impact_ns"] in (None, 0)
