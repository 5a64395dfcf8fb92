"""``traceparse diff`` per step counts only the steps' work: a whole-process nsys capture against torch.

The shared sample ``nsys/resnet18_bs16.sqlite.gz`` captured 1.47 s of a process (start-up, cuLibraryLoadData,
the data set's copies) with one NVTX ``train_step`` range of 20.8 ms; ``torch/torch_resnet18_bs16.json.gz``
profiled two ``ProfilerStep#N`` of the same ResNet18 batch-16 step. Per step, diff divided the capture's
whole totals by its one step: 13.6 ms of kernels and 302.8 ms of API calls "a step" against torch's 4.6 ms and
6.1 ms. Every expected figure here is computed from the raw SQLite (sqlite3) and JSON (json, Decimal): an API
call belongs to a step when it starts inside it, GPU work when the call that launched it (same correlation
id) does.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import run_cli, us_to_ns
from traceparse.figures import fmt_ns


def _per(total: int, steps: int) -> int:
    return int((Decimal(total) / steps).to_integral_value())  # half to even


@pytest.fixture
def capture(samples_dir, tmp_path):
    """Kernel, copy, memset and API time in the capture's train_step range, and outside it."""
    path = tmp_path / "capture.sqlite"
    with gzip.open(samples_dir / "nsys" / "resnet18_bs16.sqlite.gz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(path)
    (start, end), = db.execute("SELECT start, end FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                               "WHERE s.value = 'train_step' UNION SELECT start, end FROM NVTX_EVENTS "
                               "WHERE text = 'train_step'").fetchall()
    out = {}
    for kind, table in (("kernel", "KERNEL"), ("memcpy", "MEMCPY"), ("memset", "MEMSET")):
        out[kind] = db.execute(
            f"SELECT sum(g.end - g.start), count(*) FROM CUPTI_ACTIVITY_KIND_{table} g JOIN "
            f"CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId "
            f"WHERE r.start >= {start} AND r.start < {end}").fetchone()
        out[kind + "_all"] = db.execute(f"SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_{table}").fetchone()[0]
    out["api"] = db.execute(f"SELECT sum(end - start), count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                            f"WHERE start >= {start} AND start < {end}").fetchone()
    out["api_all"] = db.execute("SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    db.close()
    return out


@pytest.fixture
def torch_side(samples_dir):
    with gzip.open(samples_dir / "torch" / "torch_resnet18_bs16.json.gz", "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]
    steps = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    api = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launched = {e["args"]["correlation"]: us_to_ns(e["ts"]) for e in api if "correlation" in e.get("args", {})}

    def inside(at: int) -> bool:
        return any(lo <= at < hi for lo, hi in steps)

    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return {"steps": len(steps),
            "gpu": sum(us_to_ns(e["dur"]) for e in gpu if inside(launched[e["args"]["correlation"]])),
            "gpu_all": sum(us_to_ns(e["dur"]) for e in gpu),
            "api": sum(us_to_ns(e["dur"]) for e in api if inside(us_to_ns(e["ts"]))),
            "api_all": sum(us_to_ns(e["dur"]) for e in api),
            "kernels": sum(1 for e in gpu if e["cat"] == "kernel")}


def test_per_step_counts_the_work_inside_the_steps(samples_dir, tmp_path, capture, torch_side):
    torch_path = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    nsys_path = samples_dir / "nsys" / "resnet18_bs16.sqlite.gz"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "diff", str(torch_path), str(nsys_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    basis = doc["basis"]
    assert (basis["per"], basis["steps_a"], basis["steps_b"]) == ("step", 2, 1)
    gpu_b = sum(capture[k][0] for k in ("kernel", "memcpy", "memset"))
    gpu_all_b = sum(capture[k + "_all"] for k in ("kernel", "memcpy", "memset"))
    assert basis["outside_steps_b"] == {"gpu_ns": gpu_all_b - gpu_b, "api_ns": capture["api_all"] - capture["api"][0]}
    assert basis["outside_steps_a"] == {"gpu_ns": torch_side["gpu_all"] - torch_side["gpu"],
                                        "api_ns": torch_side["api_all"] - torch_side["api"]}
    s = doc["summary"]
    assert s["gpu"]["time_b_ns"] == gpu_b  # 5.699 ms, not the capture's 21.01 ms
    assert s["kernel"]["time_b_ns"] == capture["kernel"][0]
    assert s["api"]["time_b_ns"] == capture["api"][0]  # 10.78 ms, not 302.8 ms
    kernels = [r for r in doc["rows"] if r["kind"] == "kernel"]
    assert sum(r["calls_b"] for r in kernels) == capture["kernel"][1] == torch_side["kernels"] / 2 == 372
    # each side's rows rounded to the ns once: the sums within half a ns a row of the exact figure
    assert abs(s["gpu"]["time_a_ns"] - torch_side["gpu"] / 2) <= doc["summary"]["matched"] / 2
    assert abs(s["api"]["time_a_ns"] - torch_side["api"] / 2) <= doc["summary"]["matched"] / 2
    assert abs(s["kernel"]["delta_pct"]) < 1  # the same kernels a step: within 1%, where +198% was shown

    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", "300", "diff", str(torch_path),
                             str(nsys_path))
    assert code == 0, err
    from traceparse.figures import fmt_ns
    line = next(line for line in out.splitlines() if line.startswith("figures per step"))
    assert line.endswith(f"each trace's work in its steps divided by its step count; outside the steps, left out: "
                         f"A {fmt_ns(torch_side['api_all'] - torch_side['api'])} of API time, "
                         f"B {fmt_ns(capture['api_all'] - capture['api'][0])} of API time and "
                         f"{fmt_ns(gpu_all_b - gpu_b)} of GPU time")


def test_per_trace_still_counts_everything(samples_dir, tmp_path, capture):
    nsys_path = samples_dir / "nsys" / "resnet18_bs16.sqlite.gz"
    torch_path = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "diff", str(torch_path), str(nsys_path), "--json",
                             "--per", "trace")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["api"]["time_b_ns"] == capture["api_all"]
    assert "outside_steps_b" not in doc["basis"]


def test_one_rank_against_its_run_says_the_ranks_differ(samples_dir, tmp_path):
    """Rank 0 of the balanced gloo run against the run: both say world size 4, so nothing was named at the top,
    yet every row read about +300% (the run summed over 4 ranks). The number of ranks diffed is a difference."""
    run = samples_dir / "multirank" / "gloo4_resnet18_bs16"
    ranks = sorted(run.glob("rank*.json.gz"))
    worlds = set()
    for path in ranks:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            worlds.add(json.load(f)["distributedInfo"]["world_size"])
    assert worlds == {len(ranks)} == {4}
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "diff", str(ranks[0]), str(run), "--json")
    assert code == 0, err
    assert json.loads(out)["differences"] == ["ranks: A 1, B 4 (a run's figures are summed over its ranks)"]
    code, out, err = run_cli("--store", store, "diff", str(run), str(run), "--json")
    assert code == 0, err
    assert json.loads(out)["differences"] == []
    code, out, err = run_cli("--store", store, "diff", str(run), str(ranks[0]))
    assert code == 0, err
    assert out.splitlines()[0] == ("not the same setup: ranks: A 4, B 1 (a run's figures are summed over its "
                                   "ranks)")


def test_compare_warns_of_runs_of_other_rank_counts(samples_dir, tmp_path):
    """compare of the 4-rank gloo run beside the single-process trace of the same step: the run's GPU and API
    times are summed over its ranks (about 4x), which no warning said."""
    run = samples_dir / "multirank" / "gloo4_resnet18_bs16"
    single = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    ranks = len(list(run.glob("rank*.json.gz")))
    with gzip.open(single, "rt", encoding="utf-8") as f:
        assert "distributedInfo" not in json.load(f)
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "compare", str(run), str(single), "--json")
    assert code == 0, err
    expected = (f"the traces hold 1, {ranks} ranks: the GPU and API times are summed over a run's ranks, compare "
                "them per rank (divide by the ranks) or the shares and step times")
    assert expected in json.loads(out)["warnings"]
    assert f"traceparse: warning: {expected}\n" in err
    twin = samples_dir / "multirank" / "gloo4_resnet18_bs16_slow_rank2"
    code, out, err = run_cli("--store", store, "compare", str(run), str(twin), "--json")
    assert code == 0, err
    assert not [w for w in json.loads(out)["warnings"] if "ranks" in w]


def test_host_time_over_all_the_ranks_steps_is_said_to_be_summed_over_threads(tmp_path):
    """gloo runs each all-reduce on threads of its own, two in flight at once: rank 0 of gloo4_slow_rank2 has
    its gloo:all_reduce annotations on 8 threads, and the run's communication read 733.6 ms a step beside a
    137.1 ms step of 4 ranks (548.4 ms), with no word why. The line now says host time is summed over threads;
    the raw file shows the two threads' annotations overlapping in time."""
    multirank = Path(__file__).resolve().parent.parent / "fixtures" / "torch" / "multirank"
    with gzip.open(multirank / "gloo4_slow_rank2" / "rank0.json.gz", "rt") as f:
        spans = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in json.load(f)["traceEvents"]
                       if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce")
    assert len({tid for _, _, tid in spans}) == 8
    assert any(b[0] < a[1] and b[2] != a[2] for a, b in zip(spans, spans[1:]))  # two at once, on two threads
    args = ("--store", str(tmp_path / "s"), "diff", str(multirank / "gloo4_balanced"),
            str(multirank / "gloo4_slow_rank2"))
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    basis = doc["basis"]
    comm = next(c for c in doc["categories"] if c["category"] == "communication")
    whole_b = basis["step_time_b_ns"] * basis["ranks_b"]
    assert comm["time_b_ns"] > whole_b and basis["ranks_b"] == 4
    said = (f"B's communication {fmt_ns(comm['time_b_ns'])} a step, more than its 4 ranks' steps "
            f"({fmt_ns(whole_b)})")
    assert said in doc["host_over_steps"] and doc["host_over_steps"].endswith(
        "host time is summed over each rank's threads, and a call on two threads at once counts twice "
        "(stragglers and critical-path count it once)")
    code, screen, err = run_cli("--width", "300", *args)
    assert code == 0, err
    assert said in screen
