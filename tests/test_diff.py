"""``traceparse diff`` on real traces, its deltas checked against totals computed here with json / csv."""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli, us_to_ns as _ns

TORCH = FIXTURES / "torch"
NSYS = FIXTURES / "nsys"
KIND_OF_CAT = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_runtime": "api",
               "cuda_driver": "api"}


def _torch_totals(path: Path) -> dict[tuple[str, str], list[int]]:
    """(kind, name) -> [calls, time_ns] from the raw JSON."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        kind = KIND_OF_CAT.get(e.get("cat"))
        if e.get("ph") == "X" and kind:
            totals[(kind, e["name"])][0] += 1
            totals[(kind, e["name"])][1] += _ns(e["dur"])
    return totals


#: Host categories nested on a thread, as diff nests them: operators, annotations and runtime calls.
HOST_CATS = {"cpu_op": "op", "user_annotation": "marker", "cuda_runtime": "api", "cuda_driver": "api"}


def _torch_host_self(path: Path, in_steps: bool = False) -> dict[tuple[str, str], list[int]]:
    """(kind, name) -> [calls, self time in ns] of the host operators and annotations (not ProfilerStep#N), from
    the raw JSON: on each thread, an event's duration less its direct children's (the events of
    :data:`HOST_CATS` inside it, sorted by start, longest first); names with no time at all (instants) are no
    row. ``in_steps``: only the events that start inside a ProfilerStep#N (as diff's per-step figures take
    them)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    steps = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events if e.get("ph") == "X"
             and e.get("cat") == "user_annotation" and re.match(r"^ProfilerStep#\d+$", e.get("name", ""))]
    threads: dict[tuple, list[tuple]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATS:
            start = _ns(e["ts"])
            if not in_steps or any(a <= start < b for a, b in steps):
                threads[(e["pid"], e["tid"])].append((start, start + _ns(e["dur"]), HOST_CATS[e["cat"]], e["name"]))
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for rows in threads.values():
        rows.sort(key=lambda r: (r[0], -r[1]))
        children, open_ = [0] * len(rows), []
        for i, (start, end, _, _) in enumerate(rows):
            while open_ and rows[open_[-1]][1] <= start and rows[open_[-1]][1] > rows[open_[-1]][0]:
                open_.pop()  # ended before this one starts (a zero-length event stays a parent of what starts there)
            if open_:
                assert end <= rows[open_[-1]][1], "not nested: this oracle holds for nested events only"
                children[open_[-1]] += end - start
            open_.append(i)
        for (start, end, kind, name), inside in zip(rows, children):
            if kind != "api" and not re.match(r"^ProfilerStep#\d+$", name):
                totals[(kind, name)][0] += 1
                totals[(kind, name)][1] += end - start - inside
    return {key: value for key, value in totals.items() if value[1] > 0}  # a name of instants only: no work


def _raw_name(row: dict) -> str:
    """The one spelling a row was written as (the same on both sides of a torch-vs-torch diff)."""
    (name,) = set(row["names_a"]) | set(row["names_b"])
    return name


def _diff(a: str, b: str) -> dict:
    code, out, err = run_cli("diff", a, b, "--json")
    assert code == 0, err
    return json.loads(out)


def _torch_steps(path: Path) -> int:
    """How many ProfilerStep#N annotations (host side: cat user_annotation) the raw JSON has."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    return len({e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                and re.match(r"^ProfilerStep#\d+$", e.get("name", ""))})


def test_torch_sweep_deltas_match_independent_totals(store):
    """Whole-trace figures (--per trace) are the raw totals."""
    a_path, b_path = TORCH / "resnet18_bs4.json.gz", TORCH / "resnet18_bs64.json.gz"
    code, out, err = run_cli("diff", str(a_path), str(b_path), "--json", "--per", "trace")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["basis"]["per"] == "trace"
    ta, tb = ({**_torch_totals(p), **_torch_host_self(p)} for p in (a_path, b_path))
    keys = set(ta) | set(tb)
    assert len(doc["rows"]) == len(keys)
    for row in doc["rows"]:
        key = (row["kind"], _raw_name(row))  # mangled kernel names are shown demangled; names_a/b as written
        calls_a, time_a = ta.get(key, [0, 0])
        calls_b, time_b = tb.get(key, [0, 0])
        assert (row["calls_a"], row["time_a_ns"], row["calls_b"], row["time_b_ns"]) == (calls_a, time_a, calls_b,
                                                                                       time_b), key
        assert row["delta_ns"] == time_b - time_a and row["delta_calls"] == calls_b - calls_a
        assert row["status"] == ("new" if key not in ta else "vanished" if key not in tb else "both")
    changes = [abs(r["delta_ns"]) for r in doc["rows"]]
    assert changes == sorted(changes, reverse=True)
    gpu = [k for k in keys if k[0] in ("kernel", "memcpy", "memset")]
    s = doc["summary"]
    assert s["gpu"]["time_a_ns"] == sum(ta[k][1] for k in gpu if k in ta)
    assert s["gpu"]["time_b_ns"] == sum(tb[k][1] for k in gpu if k in tb)
    assert s["gpu"]["delta_ns"] == s["gpu"]["time_b_ns"] - s["gpu"]["time_a_ns"]
    assert s["api"]["time_a_ns"] == sum(v[1] for k, v in ta.items() if k[0] == "api")
    assert s["host"]["time_b_ns"] == sum(v[1] for k, v in tb.items() if k[0] in ("op", "marker")) > 0
    assert s["new"] == len(set(tb) - set(ta)) and s["vanished"] == len(set(ta) - set(tb))
    assert s["new"] > 0 and s["vanished"] > 0  # cuDNN picks other kernels at batch 64
    categories = {c["category"]: c for c in doc["categories"]}
    assert sum(c["time_a_ns"] for c in categories.values()) == sum(v[1] for v in ta.values())
    assert sum(c["time_b_ns"] for c in categories.values()) == sum(v[1] for v in tb.values())
    assert {"api", "memcpy", "convolution", "gemm", "host op", "annotation"} <= set(categories)


def test_torch_sweep_is_per_step_by_default(store):
    """Both traces mark steps: every row is its raw total divided by the trace's ProfilerStep count."""
    a_path, b_path = TORCH / "resnet18_bs4.json.gz", TORCH / "resnet18_bs64.json.gz"
    doc = _diff(str(a_path), str(b_path))
    na, nb = _torch_steps(a_path), _torch_steps(b_path)
    basis = doc["basis"]
    assert {k: basis[k] for k in ("per", "steps_a", "steps_b", "step_source_a", "step_source_b", "ranks_a",
                                  "ranks_b")} == {"per": "step", "steps_a": na, "steps_b": nb,
                                                  "step_source_a": "ProfilerStep#N", "step_source_b": "ProfilerStep#N",
                                                  "ranks_a": 1, "ranks_b": 1}
    # the step times, first on screen: each trace's mean ProfilerStep#N, from the raw JSON
    for path, key in ((a_path, "step_time_a_ns"), (b_path, "step_time_b_ns")):
        durations = [_ns(e["dur"]) for e in json.load(gzip.open(path))["traceEvents"]
                     if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                     and re.match(r"^ProfilerStep#\d+$", e.get("name", ""))]
        assert basis[key] == round(sum(durations) / len(durations))
    ta, tb = ({**_torch_totals(p), **_torch_host_self(p, in_steps=True)} for p in (a_path, b_path))
    for row in doc["rows"]:
        key = (row["kind"], _raw_name(row))
        calls_a, time_a = ta.get(key, [0, 0])
        calls_b, time_b = tb.get(key, [0, 0])
        assert row["time_a_ns"] == round(Decimal(time_a) / na) and row["time_b_ns"] == round(Decimal(time_b) / nb)
        assert row["calls_a"] == pytest.approx(calls_a / na) and row["calls_b"] == pytest.approx(calls_b / nb)
    assert doc["differences"] == []  # same GPU, same world, same number of steps


def test_a_trace_against_itself_changes_nothing(store):
    path = str(TORCH / "alexnet_bs16.json.gz")
    doc = _diff(path, path)
    assert all(r["delta_ns"] == 0 and r["status"] == "both" for r in doc["rows"])
    assert doc["summary"]["gpu"]["delta_ns"] == 0 and doc["summary"]["new"] == 0


def test_aggregated_summary_against_timed_trace_of_the_same_capture(store):
    """nsys stats summaries (aggregated rows: calls and totals) against the SQLite export of the same capture:
    every kernel and API call matches, with no change; the summary's figures are the CSV's."""
    a = [str(NSYS / "resnet18_bs8_cuda_gpu_kern_sum.csv"), str(NSYS / "resnet18_bs8_cuda_api_sum.csv")]
    code, out, err = run_cli("ingest", *a, "-q", "--json")
    assert code == 0, err
    summary_id = json.loads(out)["traces"][0]["id"]
    doc = _diff(summary_id, str(NSYS / "resnet18_bs8.sqlite.gz"))
    expected = {}
    for name, kind in (("resnet18_bs8_cuda_gpu_kern_sum.csv", "kernel"), ("resnet18_bs8_cuda_api_sum.csv", "api")):
        with open(NSYS / name, newline="") as f:
            for r in csv.DictReader(f):
                # diff drops the CUPTI version suffix of API names (cudaLaunchKernelExC_v11060)
                name_ = re.sub(r"_v\d+$", "", r["Name"]) if kind == "api" else r["Name"]
                assert (kind, name_) not in expected
                expected[(kind, name_)] = (int(r.get("Instances") or r["Num Calls"]), int(r["Total Time (ns)"]))
    rows = {(r["kind"], r["name"]): r for r in doc["rows"] if r["kind"] in ("kernel", "api")}
    assert set(rows) == set(expected)
    for key, (calls, time_ns) in expected.items():
        r = rows[key]
        assert (r["calls_a"], r["time_a_ns"]) == (calls, time_ns), key
        assert (r["calls_b"], r["time_b_ns"], r["delta_ns"]) == (calls, time_ns, 0), key
    assert doc["summary"]["kernel"]["delta_ns"] == 0 and doc["summary"]["api"]["delta_ns"] == 0
    # the SQLite export also has the copies and memsets, which the two summaries do not report: not "new", left
    # out and said so
    assert not {r["kind"] for r in doc["rows"]} & {"memcpy", "memset"}
    assert [d for d in doc["differences"] if "recorded in" in d] == ["annotations recorded in B only: left out",
                                                                     "copies recorded in B only: left out",
                                                                     "memsets recorded in B only: left out"]


def test_terminal_output_has_categories_names_and_a_total_line(store):
    code, out, err = run_cli("diff", str(TORCH / "vgg16_bs8.json.gz"), str(TORCH / "vgg16_bs16.json.gz"),
                             "--top", "5")
    assert code == 0, err
    assert "by category" in out and "top 5 of" in out
    total = [line for line in out.splitlines() if line.startswith("total per step: GPU time")]
    assert len(total) == 1 and re.search(r"-> [\d.]+ ms \(\+[\d.]+ ms, \+[\d.]+%\)", total[0])


def test_unknown_trace_is_a_one_line_error(store):
    code, out, err = run_cli("diff", "nonexistent-id", str(TORCH / "vgg16_bs8.json.gz"))
    assert code == 2 and out == ""
    assert err == (f"traceparse: error: nonexistent-id: no such file, and no store at {store}: ingest a trace first, "
                   "or give --store\n")  # the store is made by ingesting, and the first TRACE is resolved first


@pytest.mark.parametrize("name", ["resnet18_bs16.json.gz"])
def test_diff_of_the_shared_sample_and_the_fixture(samples_dir, store, name):
    """Two runs of the same configuration on the same GPU: kernels match by name, the change is small."""
    doc = _diff(str(samples_dir / "torch" / f"torch_{name}"), str(TORCH / name))
    kernels = [r for r in doc["rows"] if r["kind"] == "kernel"]
    matched = sum(r["time_a_ns"] for r in kernels if r["status"] == "both")
    assert matched / doc["summary"]["kernel"]["time_a_ns"] > 0.5


def test_a_run_against_its_straggler_twin_says_the_step_time_first(tmp_path):
    """A balanced run against its straggler twin: the step went up 171% and the diff showed only the work in it
    (GPU -7.7%, API -28%), summed over the ranks without saying so. The step time comes first now, as analyze's
    summary gives it, and the per-step figures say they are summed over the ranks."""
    from traceparse.figures import fmt_ns

    runs = [FIXTURES / "torch" / "multirank" / name for name in ("nccl2_balanced", "nccl2_slow_rank1")]
    store = str(tmp_path / "s")
    steps = []
    for run in runs:
        code, out, err = run_cli("--store", store, "analyze", "--json", "--rule", "kernel-share", str(run))
        assert code == 0, err
        (summary,) = json.loads(out)["summary"]
        steps.append(summary["step_time_ns"])
    code, out, err = run_cli("--store", store, "--width", "200", "diff", *map(str, runs))
    assert code == 0, err
    a, b = steps
    assert f"step time: A {fmt_ns(a)} -> B {fmt_ns(b)} (" in out
    assert "a run's figures are summed over its ranks (A 2, B 2)" in out


@pytest.mark.parametrize("run, name, kind, slow", [
    ("ddp4", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "marker", 1),
    # the DTensor dispatch (PythonSubclass) grew 9-12 ms a step on every rank (43.5 ms summed: waiting inside it),
    # more than the hook's 30 ms on rank 2 alone: summed over the ranks it was named instead
    ("fsdp4", "autograd::engine::evaluate_function: AddBackward0", "op", 2)])
def test_a_step_change_is_said_with_the_work_that_grew(tmp_path, run, name, kind, slow):
    """Balanced -> slow twin (ddp4: rank 1's data loading sleeps; fsdp4: rank 2's backward hook): the step grew
    36 and 18 ms while every row diff listed got shorter, with no word that they do not explain it. The host's
    operators and annotations are compared now (self time), and the line says the step grew in the ranks'
    waiting, naming the work that grew most on one rank and by how much a step there (from the raw JSON of every
    rank: each rank's self time in its steps, per step). Step times from the raw ProfilerStep#N of each rank."""
    import statistics
    from fractions import Fraction

    from helpers import raw_steps
    from traceparse.figures import fmt_ns

    runs = FIXTURES / "torch" / "multirank"
    twins = (f"{run}_balanced", f"{run}_slow_{'loader' if run == 'ddp4' else 'hook'}")
    means, per_rank = [], []
    for twin in twins:
        ranks = sorted((runs / twin).glob("rank*.json.gz"))
        durations = [e - s for p in ranks for s, e in raw_steps(p).values()]
        means.append(round(statistics.fmean(durations)))
        per_rank.append({int(p.name[4:].split(".")[0]): Fraction(_torch_host_self(p, in_steps=True)[(kind, name)][1],
                                                               _torch_steps(p)) for p in ranks})
    change = means[1] - means[0]
    grew = {r: per_rank[1][r] - per_rank[0][r] for r in per_rank[0]}
    assert max(grew, key=grew.get) == slow and grew[slow] > change / 2
    code, out, err = run_cli("--store", str(tmp_path), "diff", *(str(runs / t) for t in twins), "--json")
    assert code == 0, err
    doc = json.loads(out)
    row = next(r for r in doc["rows"] if r["name"] == name)
    assert row["category"] == ("annotation" if kind == "marker" else "host op") and row["delta_ns"] > 0
    line = doc["step_time_unexplained"]
    assert line.startswith(f"the step time's +{fmt_ns(change)} is mostly the ranks waiting in collectives (their "
                           "time grew by more than half of it): a rank arrives later than the others; ")
    word = "annotation" if kind == "marker" else "host operator"
    assert (f"the work that grew most on one rank is {name} ({word} on rank {slow}, +{fmt_ns(round(grew[slow]))} "
            "per step)") in line
    code, out, err = run_cli("--store", str(tmp_path), "--width", "400", "diff", *(str(runs / t) for t in twins))
    assert " ".join(line.split()) in " ".join(out.split())  # wrapped on screen
    if run == "ddp4":  # the GPU's and the runtime's work got shorter per step
        assert doc["summary"]["gpu"]["delta_ns"] < 0 and doc["summary"]["api"]["delta_ns"] < 0


def test_a_step_that_shrank_in_waiting_is_said_the_other_way(tmp_path):
    """The slow-loader twin against the balanced one (B the faster): the step shrank as the waiting did; the line
    said "a rank arrives later" and "the work that grew most ... -41.13 ms"."""
    from traceparse.figures import fmt_ns

    runs = FIXTURES / "torch" / "multirank"
    forward, backward = (json.loads(run_cli("--store", str(tmp_path), "diff", str(runs / x), str(runs / y),
                                            "--json")[1]) for x, y in (("ddp4_balanced", "ddp4_slow_loader"),
                                                                       ("ddp4_slow_loader", "ddp4_balanced")))
    change = forward["basis"]["step_time_b_ns"] - forward["basis"]["step_time_a_ns"]
    line = backward["step_time_unexplained"]
    assert line.startswith(f"the step time's -{fmt_ns(change)} is mostly less waiting in collectives (their time "
                           "shrank by more than half of it): the ranks arrive closer together; the work that shrank "
                           "most on one rank is enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ "
                           "(annotation on rank 1, -")
    assert "grew" not in line and "later" not in line


def test_a_late_rank_whose_work_no_row_holds_is_said_so(tmp_path):
    """nccl2's rank 1 sleeps outside any annotation: the others' NCCL kernels spin for it, and no row of work grows
    by a tenth of the step's change on any rank (the largest, a cuDNN kernel on rank 0, +150 us)."""
    runs = FIXTURES / "torch" / "multirank"
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(runs / "nccl2_balanced"),
                             str(runs / "nccl2_slow_rank1"), "--json")
    assert code == 0, err
    line = json.loads(out)["step_time_unexplained"]
    assert line.endswith("a rank arrives later than the others; no kernel, call, operator or annotation grew by a "
                         "tenth of it on any rank: the late rank spends it in time no traced call covers; analyze B "
                         "(stragglers, critical-path) says which rank and why")


def test_a_step_change_work_accounts_for_needs_no_line(tmp_path):
    """The same trace at four times the batch: its GPU work grew with the step."""
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"),
                             str(FIXTURES / "torch" / "resnet18_bs64.json.gz"), "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_unexplained"] is None


def test_a_step_change_no_row_accounts_for_is_said(tmp_path):
    """The slow loader's rank 1 alone, its loader's annotation taken out (edited here: as a loader the profiler
    does not annotate would be), against the balanced twin's rank 1: its step grew by the loader's 40 ms, which
    no kernel, call, operator or annotation holds: the line says where the time can be."""
    from helpers import raw_steps
    from traceparse.figures import fmt_ns

    runs = FIXTURES / "torch" / "multirank"
    doc = json.loads(gzip.decompress((runs / "ddp4_slow_loader" / "rank1.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("enumerate(DataLoader)")]
    slow = tmp_path / "slow_rank1.json.gz"
    slow.write_bytes(gzip.compress(json.dumps(doc).encode()))
    means = [round(sum(e - s for s, e in raw_steps(p).values()) / len(raw_steps(p)))
             for p in (runs / "ddp4_balanced" / "rank1.json.gz", slow)]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "diff", str(runs / "ddp4_balanced" / "rank1.json.gz"),
                             str(slow), "--json")
    assert code == 0, err
    line = json.loads(out)["step_time_unexplained"]
    assert line.startswith(f"the step time's +{fmt_ns(means[1] - means[0])} is not in what diff compares (")
    assert line.endswith("it is host time no traced call covers (Python between operators, data loading without "
                         "an annotation) or waiting for another rank; analyze B (critical-path, stragglers) says "
                         "which")


def test_a_time_neither_side_recorded_is_not_recorded(tmp_path):
    """The trimmed NCCL runs hold no runtime call (their raw files have no cuda_runtime event): diff said "API time
    0 ns -> 0 ns (±0 ns, -)", a measured zero; it says "not recorded", and --json has nulls."""
    runs = [TORCH / "multirank" / name for name in ("nccl2_balanced", "nccl2_slow_rank1")]
    for run in runs:
        for path in run.glob("rank*.json.gz"):
            with gzip.open(path, "rt") as f:
                assert not any(e.get("cat") == "cuda_runtime" for e in json.load(f)["traceEvents"])
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "--width", "300", "diff", *map(str, runs))
    assert code == 0, err
    total = next(line for line in out.splitlines() if line.startswith("total per step: "))
    assert "; API time not recorded; " in total and "0 ns -> 0 ns" not in total
    code, out, err = run_cli("--store", store, "diff", "--json", *map(str, runs))
    api = json.loads(out)["summary"]["api"]
    assert api == {"time_a_ns": None, "time_b_ns": None, "delta_ns": None, "delta_pct": None}


def test_a_time_one_side_recorded_is_left_out_and_says_whose(tmp_path):
    """A kernel summary with the API summary of its capture against the kernel summary alone: the API calls are
    left out (recorded in A only), and the total line says so rather than "API time 0 ns -> 0 ns"."""
    store = str(tmp_path / "s")
    kern, api = NSYS / "resnet18_bs8_cuda_gpu_kern_sum.csv", NSYS / "resnet18_bs8_cuda_api_sum.csv"
    code, out, err = run_cli("--store", store, "ingest", "-q", "--json", str(kern), str(api))
    assert code == 0, err
    both = json.loads(out)["traces"][0]["id"]
    code, out, err = run_cli("--store", store, "--width", "300", "diff", both, str(kern))
    assert code == 0, err
    total = next(line for line in out.splitlines() if line.startswith("total: "))
    assert total.startswith("total: GPU time 2.977 ms -> 2.977 ms (±0 ns, ±0.0%); API time left out (recorded in A "
                            "only); ")
    code, out, err = run_cli("--store", store, "diff", "--json", both, str(kern))
    summary = json.loads(out)["summary"]
    assert summary["api"] == {"time_a_ns": None, "time_b_ns": None, "delta_ns": None, "delta_pct": None,
                              "recorded_in": "A"}
    with kern.open(newline="") as f:
        kernels = sum(int(r["Total Time (ns)"]) for r in csv.DictReader(f))
    assert (summary["gpu"]["time_a_ns"], summary["gpu"]["time_b_ns"]) == (kernels, kernels) == (2_977_255,) * 2


def test_two_reports_sharing_no_kind_of_row_print_no_empty_table(tmp_path):
    """An nsys API summary against a kernel summary: each kind is recorded by one side only and left out, so
    nothing is left to compare; diff printed two empty tables and a total of nothing after its warning."""
    api, kern = NSYS / "resnet18_bs8_cuda_api_sum.csv", NSYS / "resnet18_bs8_cuda_gpu_kern_sum.csv"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "--width", "200", "diff", str(api), str(kern))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == ("not the same setup: API calls recorded in A only: left out; kernels recorded in B only: "
                        "left out")
    assert [line.split()[0] for line in lines[1:3]] == ["A", "B"]
    assert lines[3:] == ["figures are whole-trace totals, not per step: A no steps, B no steps",
                         "nothing to compare: A and B share no kernel, memcpy, memset, API, operator or annotation "
                         "row that diff compares"]
    code, out, err = run_cli("--store", store, "diff", "--json", str(api), str(kern))
    doc = json.loads(out)
    assert (doc["rows"], doc["categories"]) == ([], [])


def test_new_and_vanished_names_never_read_alike(tmp_path):
    """torch's and nsys's spellings of one step's kernels, matched as written (--exact): both lists showed
    "Kernel<…>" (two different cutlass kernels) and four identical "Kernel<…ImplicitGemmConvolution<…>>" lines.
    Shortened together, every listed name reads unlike every other, in one list and across the two, and fits its
    line."""
    a, b = TORCH / "resnet18_bs8.json.gz", NSYS / "resnet18_bs8.sqlite.gz"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "--width", "80", "diff", "--exact", "--top", "60", str(a), str(b))
    assert code == 0, err
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("not matched, only in A (vanished): "))
    listed = [line for line in lines[start:] if line.startswith("  ") and not line.startswith("  ...")]
    code, doc, err = run_cli("--store", store, "diff", "--exact", "--json", str(a), str(b))
    unmatched = json.loads(doc)["summary"]["unmatched"]
    # every name listed (--top 60); the host's operators and annotations are left out (the capture records no
    # operator, so its NVTX ranges' self time holds what torch gives its operators)
    assert len(listed) == len(unmatched["a"]) + len(unmatched["b"]) == 48 + 52
    labels = [line[9:] for line in listed]  # after "  kernel "
    assert len(set(labels)) == len(labels)
    assert all(len(line) <= 80 for line in listed)
    assert "Kernel<…>" not in labels
