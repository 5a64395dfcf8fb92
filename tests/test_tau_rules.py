"""hotspots and tuning-candidates: figures recomputed here from the profile files (plain Python) or by hand."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import ROUND_HALF_EVEN
from functools import partial

import polars as pl
import pytest

from helpers import FIXTURES, run_cli, us_to_ns
from traceparse.analysis import analyze
from traceparse.ingest import read_paths
from traceparse.schema import conform
from traceparse.trace import Trace, TraceMeta

TAU = FIXTURES / "tau"
CPI = TAU / "real" / "cpi-mpi"
MULTI = TAU / "handwritten" / "multi-cupti"


ns = partial(us_to_ns, rounding=ROUND_HALF_EVEN)  # the TAU reader rounds half to even


def flat_exclusive(path) -> dict[str, tuple[int, int]]:
    """{routine: (calls, exclusive ns)} of the flat (non call path) rows of a profile, read with str methods."""
    lines = path.read_text().splitlines()
    out = {}
    for line in lines[2:2 + int(lines[0].split()[0])]:
        _, name, rest = line.split('"', 2)
        if "=>" not in name:
            fields = rest.split()
            out[name.strip()] = (int(fields[0]), ns(fields[2]))
    return out


def finding(findings, title_start):
    return next(f for f in findings if f.title.startswith(title_start))


def test_hotspots_over_threads_match_the_files():
    trace = read_paths([CPI])[0]
    findings = analyze(trace, rules=["hotspots"])
    agg = finding(findings, "Hotspots: routines")
    per_file = [flat_exclusive(f) for f in sorted(CPI.iterdir())]
    names = set().union(*per_file)
    totals = {n: sum(p.get(n, (0, 0))[1] for p in per_file) for n in names}
    grand = sum(totals.values())
    assert agg.metrics["time_ns"] == grand and agg.metrics["threads"] == 4
    assert agg.metrics["routines"] == len(names) == 12 and agg.metrics["callpath_rows_skipped"] == 44
    ranked = sorted(names, key=lambda n: (-totals[n], n))
    assert [i["name"] for i in agg.items] == ranked
    for item in agg.items:
        times = [p.get(item["name"], (0, 0))[1] for p in per_file]
        assert item["time_ns"] == sum(times)
        assert item["calls"] == sum(p.get(item["name"], (0, 0))[0] for p in per_file)
        assert (item["min_ns"], item["max_ns"]) == (min(times), max(times))
        assert item["mean_ns"] == round(sum(times) / 4, 1)
        assert item["imbalance"] == round(max(times) / (sum(times) / 4), 4)
        assert item["share_pct"] == round(100 * sum(times) / grand, 4)
    assert agg.severity == "info"


def test_hotspots_per_thread_lists_each_threads_top_routines():
    trace = read_paths([CPI])[0]
    per_thread = finding(analyze(trace, rules=["hotspots"]), "Hotspots per thread")
    by_thread = defaultdict(list)
    for item in per_thread.items:
        by_thread[(item["pid"], item["device_id"], item["tid"])].append(item)
    # the raw (node, context, thread) in the JSON fields; on screen as TAU writes it, N.C.T (a context is no GPU:
    # "0/0 (device 1)" named an MPI process's context a device)
    assert sorted(by_thread) == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]
    for key, items in by_thread.items():
        assert {i["thread"] for i in items} == {f"{key[0]}.0.0"} and {i["thread_name"] for i in items} == {None}
    for f in sorted(CPI.iterdir()):
        node = f.name.split(".")[1]
        flat = flat_exclusive(f)
        top = sorted(flat, key=lambda n: (-flat[n][1], n))[:5]
        items = by_thread[(int(node), 0, 0)]
        assert [i["name"] for i in items] == top
        assert items[0]["share_pct"] == round(100 * flat[top[0]][1] / sum(v[1] for v in flat.values()), 4)


def test_hotspots_warns_on_imbalance_and_counts_timed_events_over_summaries():
    rows = pl.DataFrame({
        "kind": ["op", "op", "op", "op", "kernel", "kernel", "kernel"],
        "name": ["aten::conv", "aten::conv", "aten::relu", "aten::add", "k", "k", "k"],
        "start_ns": [0, 100, 50, 0, 10, 20, None],
        "duration_ns": [90, 900, 10, 3, 5, 7, 12],
        "calls": [1, 1, 1, 1, 1, 1, 2],
        "pid": [1, 1, 1, 1, None, None, None], "tid": [1, 2, 1, 3, None, None, None],
    })
    trace = Trace(conform(rows, trace_id="t"), TraceMeta(id="t"))
    agg = finding(analyze(trace, rules=["hotspots"]), "Hotspots: routines")
    # ops on 3 host threads, kernels on one (unknown) thread; the kernel summary row (start null) is dropped
    # because the kernel has timed events
    assert agg.metrics["threads"] == 4 and agg.metrics["threads_per_kind"] == {"op": 3, "kernel": 1}
    assert agg.metrics["aggregated_rows_skipped"] == 1
    conv = agg.items[0]
    # self time: the conv on thread 1 [0, 90) holds the relu [50, 60), so it counts 80; the one on thread 2, 900.
    # Thread 1 of process 1 is its main thread (tid = pid): a role of its own; threads 2 and 3 are the unnamed
    # peers. Among them the conv runs 900 on thread 2 and 0 on thread 3: mean 450, max/mean 2 (the main thread's
    # 80 alone is even)
    assert (conv["name"], conv["time_ns"], conv["max_ns"], conv["min_ns"], conv["threads"]) == ("aten::conv", 980, 900,
                                                                                                  0, 2)
    assert (conv["mean_ns"], conv["peers"], conv["imbalance"]) == (450.0, 2, 2.0)
    kernel = next(i for i in agg.items if i["name"] == "k")
    assert (kernel["time_ns"], kernel["calls"], kernel["imbalance"]) == (12, 2, 1.0)
    assert agg.severity == "warning"
    assert [i["name"] for i in agg.items] == ["aten::conv", "k", "aten::relu", "aten::add"]
    assert agg.metrics["self_time_rows"] == 4 and "Self time of 4 nested host events" in agg.message


def plain_counter(metric: str, thread: int) -> dict[str, float]:
    """Exclusive counter values per routine of one MULTI__ file."""
    path = MULTI / f"MULTI__{metric}" / f"profile.0.0.{thread}"
    lines = path.read_text().splitlines()
    out = {}
    for line in lines[2:2 + int(lines[0].split()[0])]:
        _, name, rest = line.split('"', 2)
        out[name] = float(rest.split()[2])
    return out


def test_tuning_candidates_from_tau_cupti_counters():
    trace = read_paths([MULTI])[0]
    (f,) = analyze(trace, rules=["tuning-candidates"])
    dev = "CUDA.Tesla_P100-PCIE-16GB"
    c = {k: plain_counter(f"{dev}.{d}.{k}", 1) for d, k in (
        ("domain_a", "warps_launched"), ("domain_d", "inst_issued"), ("domain_d", "inst_executed"),
        ("domain_a", "global_load"), ("domain_a", "global_store"), ("domain_q", "active_cycles"))}
    time = {name: ns(us) for name, us in _times(1).items()}
    expected = []
    for metric, value_of, score_of in (
        ("warps_per_inst", lambda n: c["warps_launched"][n] / c["inst_issued"][n], lambda v, t: v * t),
        ("gmem_per_inst", lambda n: (c["global_load"][n] + c["global_store"][n]) / c["inst_executed"][n],
         lambda v, t: v * t),
        ("ipc", lambda n: c["inst_executed"][n] / c["active_cycles"][n], lambda v, t: t / v),
    ):
        kernels = [n for n in c["inst_executed"] if c["inst_executed"][n] and n != ".TAU application"]
        scored = sorted(((score_of(value_of(n), time[n]), n) for n in kernels), key=lambda x: (-x[0], x[1]))
        expected += [{"name": n, "metric": metric, "value": round(value_of(n), 6), "time_ns": time[n],
                      "score": round(s, 6)} for s, n in scored]
    assert f.items == expected
    assert f.metrics["metrics"]["gmem_per_inst"]["formula"] == "(global_load + global_store) / inst_executed"
    assert f.items[0] == {"name": "relu_kernel", "metric": "warps_per_inst", "value": 0.019048, "time_ns": 1_500_062,
                          "score": 28572.609524}


def _times(thread: int) -> dict[str, str]:
    lines = (MULTI / "MULTI__TIME" / f"profile.0.0.{thread}").read_text().splitlines()
    out = {}
    for line in lines[2:2 + int(lines[0].split()[0])]:
        _, name, rest = line.split('"', 2)
        out[name] = rest.split()[2]
    return out


def ncu_like_trace() -> Trace:
    """Two launches of kernel A and one of B with ncu metric names; counters point at their launch."""
    kernels = pl.DataFrame({"event_id": [0, 1, 2], "kind": ["kernel"] * 3, "name": ["A", "A", "B"],
                            "start_ns": [0, 1000, 2000], "duration_ns": [100, 300, 50]})
    metrics = {
        "smsp__warps_launched.sum": [10, 30, 5],
        "smsp__inst_issued.sum": [1000, 1000, 100],
        "smsp__inst_executed.sum": [900, 1100, 100],
        "smsp__inst_executed_op_global_ld.sum": [90, 110, 50],
        "smsp__inst_executed_op_global_st.sum": [0, 0, 10],
        "sm__inst_executed.avg.per_cycle_active": [1.0, 3.0, 0.5],
    }
    counters = pl.DataFrame({
        "kind": ["counter"] * 18, "name": [m for m in metrics for _ in range(3)],
        "value": [float(v) for m in metrics for v in metrics[m]], "parent_id": [0, 1, 2] * 6,
    }).with_columns(event_id=pl.int_range(3, 21, dtype=pl.Int64))
    events = pl.concat([conform(kernels), conform(counters)])
    return Trace(events, TraceMeta(id="ncu"))


def test_tuning_candidates_with_ncu_metric_names():
    (f,) = analyze(ncu_like_trace(), rules=["tuning-candidates"])
    items = {(i["metric"], i["name"]): i for i in f.items}
    # A: warps 40 / issued 2000 over 400 ns; B: 5 / 100 over 50 ns
    assert items[("warps_per_inst", "A")] == {"name": "A", "metric": "warps_per_inst", "value": 0.02, "time_ns": 400,
                                              "score": 8.0}
    assert items[("warps_per_inst", "B")]["score"] == 2.5
    # (200 + 0) / 2000 and (50 + 10) / 100
    assert items[("gmem_per_inst", "A")]["value"] == 0.1 and items[("gmem_per_inst", "B")]["value"] == 0.6
    # ipc from the ratio metric, time-weighted: A (1*100 + 3*300) / 400 = 2.5; score = time / ipc
    assert items[("ipc", "A")]["value"] == 2.5 and items[("ipc", "A")]["score"] == 160.0
    assert items[("ipc", "B")]["value"] == 0.5 and items[("ipc", "B")]["score"] == 100.0
    assert f.metrics["metrics"]["ipc"]["formula"] == "sm__inst_executed.avg.per_cycle_active"


def test_tuning_candidates_extra_metric_from_the_command_line(store):
    code, out, err = run_cli("ingest", str(MULTI), "--json")
    assert code == 0, err
    extra = [{"name": "issue_overhead", "score": "value_x_time",
              "alternatives": [{"numerator": ["inst_issued"], "denominator": ["inst_executed"]}]}]
    code, out, err = run_cli("analyze", "--rule", "tuning-candidates", "--json",
                             "--set", f"tuning-candidates.extra_metrics={json.dumps(extra)}")
    assert code == 0, err
    doc = json.loads(out)
    (f,) = [x for x in doc["findings"] if x["rule"] == "tuning-candidates"]
    extra_items = [i for i in f["items"] if i["metric"] == "issue_overhead"]
    issued, executed = (plain_counter("CUDA.Tesla_P100-PCIE-16GB.domain_d." + k, 1)
                        for k in ("inst_issued", "inst_executed"))
    sgemm = "void sgemm_kernel<float>(float*, float const*, int)"
    got = {i["name"]: i["value"] for i in extra_items}
    assert got[sgemm] == round(issued[sgemm] / executed[sgemm], 6) == 1.05


def test_tuning_candidates_refuses_a_malformed_extra_metric(store):
    code, out, err = run_cli("ingest", str(MULTI))
    assert code == 0
    code, out, err = run_cli("analyze", "--rule", "tuning-candidates",
                             "--set", 'tuning-candidates.extra_metrics=[{"name": "x", "alternatives": []}]')
    assert code == 2 and err == ("traceparse: error: tuning-candidates: derived metric 'x': needs 'alternatives': "
                                 "a list of {'numerator': [counters], 'denominator': [counters]}\n")


def test_tuning_candidates_without_counters_says_so():
    (f,) = analyze(read_paths([CPI])[0], rules=["tuning-candidates"])
    assert f.title == "Tuning candidates: no derived metric computable" and f.items == []
    assert f.metrics["not_computable"] == ["warps_per_inst", "gmem_per_inst", "ipc"]
    # a CPU-only MPI profile is told what CPU counters its one CPU metric lacks: not a GPU's warps (it listed
    # every counter of every alternative as absent, then every GPU metric)
    assert f.message == "None of the derived metrics can be computed: ipc needs PAPI_TOT_INS and PAPI_TOT_CYC."
    # a CPU-only MPI profile is told how to count on the CPU, not to collect CUDA counters
    assert f.suggestion == ("Profile with CPU counters for IPC, e.g. TAU_METRICS=TIME:PAPI_TOT_INS:PAPI_TOT_CYC (TAU "
                            "built with PAPI).")


def test_tuning_candidates_name_the_partner_a_counter_lacks(tmp_path):
    """Hand-written after a real nvprof --metrics all --csv (leimingyu/magus, a GTX 1080 Ti): the trace had
    inst_executed and was told it had no counter named inst_executed."""
    from traceparse.trace import Trace, TraceMeta
    from traceparse.schema import conform
    import polars as pl

    rows = pl.DataFrame({"kind": ["kernel", "counter"], "name": ["matrixMul", "inst_executed"],
                         "duration_ns": [1000, None], "calls": [1, 1], "value": [None, 6_176_000.0],
                         "parent_id": [None, 0], "start_ns": [0, None]})
    (f,) = analyze(Trace(conform(rows), TraceMeta()), rules=["tuning-candidates"])
    assert "ipc needs active_cycles beside inst_executed" in f.message
    assert "gmem_per_inst needs global_load and global_store beside inst_executed" in f.message


def test_definitions_table_is_valid_and_a_plugin_can_extend_it():
    from traceparse_plugins.rules.tuning_candidates import DERIVED_METRICS, TuningCandidates

    mine = {"name": "l2_per_inst", "alternatives": [{"numerator": ["lts__t_bytes.sum"],
                                                     "denominator": ["smsp__inst_executed.sum"]}]}
    rule = TuningCandidates(DERIVED_METRICS + [mine])
    assert [d["name"] for d in rule.definitions] == ["warps_per_inst", "gmem_per_inst", "ipc", "l2_per_inst"]
    with pytest.raises(Exception, match="'score' must be one of value_x_time, time_over_value"):
        TuningCandidates([{**mine, "score": "bigger"}])


def test_a_routine_on_one_thread_alone_is_no_imbalance_warning(tmp_path):
    """Hand-written after a real TAU OpenMP + MPI profile (12 threads): MPI_Finalize runs on the master thread
    only, by design, and was warned of as "12.00x imbalanced" with advice to balance it across threads. A routine
    spread unevenly over two threads or more still warns."""
    def write(thread: int, rows: list[tuple[str, int]]):
        lines = [f"{len(rows) + 1} templated_functions_MULTI_TIME", "# Name Calls Subrs Excl Incl ProfileCalls #",
                 f'".TAU application" 1 {len(rows)} 0 {sum(t for _, t in rows)} 0 GROUP="TAU_DEFAULT" ']
        lines += [f'"{name}" 1 0 {t} {t} 0 GROUP="TAU_USER" ' for name, t in rows]
        lines += ["0 aggregates", ""]
        (tmp_path / f"profile.0.0.{thread}").write_text("\n".join(lines))

    write(0, [("MPI_Finalize()", 600_000), ("compute", 100_000)])
    write(1, [("compute", 100_000)])
    found = finding(analyze(read_paths([tmp_path])[0], rules=["hotspots"]), "Hotspots: routines by exclusive time")
    (finalize,) = [i for i in found.items if i["name"] == "MPI_Finalize()"]
    assert (finalize["threads"], finalize["imbalance"]) == (1, 2.0)  # listed as it is
    assert found.severity == "info" and "unevenly spread" not in found.message
    write(1, [("compute", 900_000)])  # now compute: 100 and 900 ms on two of three threads
    write(2, [("io", 100_000)])
    found = finding(analyze(read_paths([tmp_path])[0], rules=["hotspots"]), "Hotspots: routines by exclusive time")
    assert found.severity == "warning" and "'compute': max/mean 2.700×" in found.message


OUTSIDE = (" '.TAU application' is the time in no instrumented routine: code the profile did not instrument, or "
           "threads idle between parallel regions (worker threads waiting for work); the routines after it are "
           "where the instrumented time went.")


def test_the_top_level_timer_leading_is_said_to_be_time_outside_the_routines():
    """An HPX run's `pprof -s` (SC15 APEX tutorial, 71 threads, mostly idle workers): '.TAU application' leads
    with 85.5% of the time, time in no instrumented routine, which hotspots says rather than offer it as a
    routine to speed up."""
    (trace,) = read_paths([FIXTURES / "tau" / "real" / "pprof" / "sc15-apex-hpx-pprof-s.txt"])
    assert trace.meta.extra["outside_routines"] == ".TAU application"
    (hot,) = [f for f in analyze(trace, rules=["hotspots"]) if f.title.startswith("Hotspots: routines")]
    assert hot.items[0]["name"] == ".TAU application" and OUTSIDE in hot.message


def test_a_routine_leading_over_the_top_level_timer_gets_no_such_note():
    """The pthread matmult run's `pprof -s`: 'compute' leads; '.TAU application' (1 ms exclusive) is named
    nowhere in the message."""
    (trace,) = read_paths([FIXTURES / "tau" / "real" / "pprof" / "taustubs-matmult-pprof-s.txt"])
    (hot,) = [f for f in analyze(trace, rules=["hotspots"]) if f.title.startswith("Hotspots: routines")]
    assert hot.items[0]["name"] == "compute" and "no instrumented routine" not in hot.message


def test_a_folder_of_mpi_ranks_profiles_is_a_run_of_a_rank_per_node(tmp_path):
    """``ingest cpi-mpi --run cpi``: the folder's four files are MPI ranks 0-3 (profile.N.0.0, node N), but the
    folder was one trace and the run had one rank ("world size 1 (1 ranks stored)", beside "12 routines on 4
    threads of 4 processes"). A run of it now has a rank per node, each read from its own file and given its
    rank by it; the routines' time is the files' (exclusive time, in microseconds, read here from the raw rows)."""
    import re

    excl = {}
    for node in range(4):
        for line in (CPI / f"profile.{node}.0.0").read_text().splitlines():
            m = re.match(r'^"MPI_File_open\(\)\s*" \d+ \d+ (\S+) ', line)
            if m:
                excl[node] = float(m.group(1))
    assert sorted(excl) == [0, 1, 2, 3]
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "ingest", str(CPI), "--run", "cpi", "--json")
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["world_size"] == 4 and run["rank_from"] == {str(n): "trace" for n in range(4)}
    assert run["source_paths"] == {str(n): [str(CPI / f"profile.{n}.0.0")] for n in range(4)}
    code, out, err = run_cli("--store", store, "analyze", "cpi", "--json", "--rule", "hotspots")
    assert code == 0, err
    f = next(f for f in json.loads(out)["findings"] if f["rule"] == "hotspots")
    item = next(i for i in f["items"] if i["name"] == "MPI_File_open()")
    assert item["calls"] == 4 and item["time_ns"] == round(sum(excl.values()) * 1000)
    code, out, err = run_cli("--store", store, "ingest", str(CPI), "--json")  # without --run: one trace, as before
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["traces"]) == 1 and not doc.get("runs")
