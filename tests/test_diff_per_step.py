"""``traceparse diff`` per step, with demangled kernel names and the setup's differences (issue 21).

The nsys capture's SQLite export (fixtures/nsys/resnet18_bs8.sqlite.gz: one NVTX ``train_step`` range) and
the torch trace (fixtures/torch/resnet18_bs8.json.gz: two ``ProfilerStep#N``) ran the same ResNet18 batch-8
step on one H100. Every expected figure is computed here from the raw SQLite (sqlite3) and JSON (json,
Decimal); the mangled names torch wrote are paired with nsys's demangled ones through the capture's own
``mangledName`` column, not through traceparse's demangler.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from collections import defaultdict
from decimal import Decimal

import pytest

from helpers import FIXTURES, run_cli, us_to_ns

SQLITE = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"
TORCH = FIXTURES / "torch" / "resnet18_bs8.json.gz"
NCCL_RANK0 = FIXTURES / "torch" / "multirank" / "nccl2_balanced" / "rank0.json.gz"


def _per(total: int, steps: int) -> int:
    return int((Decimal(total) / steps).to_integral_value())  # half to even, as Decimal rounds by default


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """From the SQLite: kernel (name -> [calls, time]), mangled -> demangled names, train_step ranges."""
    path = tmp_path_factory.mktemp("sqlite") / "capture.sqlite"
    with gzip.open(SQLITE) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(path)
    kernels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    demangled = {}
    for name, mangled, start, end in db.execute(
            "SELECT d.value, m.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds d ON d.id = k.demangledName JOIN StringIds m ON m.id = k.mangledName"):
        kernels[name][0] += 1
        kernels[name][1] += end - start
        demangled[mangled] = name
    steps = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'train_step' AND end IS NOT NULL").fetchone()[0]
    db.close()
    return {"kernels": dict(kernels), "demangled": demangled, "steps": steps}


@pytest.fixture(scope="module")
def torch_trace():
    with gzip.open(TORCH, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    kernels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            kernels[e["name"]][0] += 1
            kernels[e["name"]][1] += us_to_ns(e["dur"])
    steps = {e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
             and re.match(r"^ProfilerStep#\d+$", e["name"])}
    return {"kernels": dict(kernels), "steps": len(steps)}


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    code, out, err = run_cli("--store", str(store), "diff", str(TORCH), str(SQLITE), "--json")
    assert code == 0, err
    return json.loads(out)


def test_figures_are_per_step_of_each_trace(doc, capture, torch_trace):
    assert (torch_trace["steps"], capture["steps"]) == (2, 1)
    assert {k: v for k, v in doc["basis"].items() if not k.startswith(("step_time", "ranks", "outside"))} == {
        "per": "step", "steps_a": 2, "steps_b": 1, "step_source_a": "ProfilerStep#N",
        "step_source_b": "range train_step"}
    kernels = [r for r in doc["rows"] if r["kind"] == "kernel"]
    for r in kernels:
        raw_a = [torch_trace["kernels"][n] for n in r["names_a"]]
        raw_b = [capture["kernels"][n] for n in r["names_b"]]
        assert r["time_a_ns"] == _per(sum(t for _, t in raw_a), 2), r["name"]
        assert r["time_b_ns"] == _per(sum(t for _, t in raw_b), 1), r["name"]
        assert r["calls_a"] == pytest.approx(sum(c for c, _ in raw_a) / 2)
        assert r["calls_b"] == sum(c for c, _ in raw_b)
    total_a = sum(t for _, t in torch_trace["kernels"].values())
    total_b = sum(t for _, t in capture["kernels"].values())
    s = doc["summary"]["kernel"]
    assert s["time_b_ns"] == total_b
    assert abs(s["time_a_ns"] - total_a / 2) <= len(kernels) / 2  # each row rounded to the ns once
    # per step the same work is within 1% (whole traces: the torch side has twice the kernels, about +100%)
    assert abs(s["delta_pct"]) < 1
    assert 95 < 100 * (total_a - total_b) / total_b < 105


def test_mangled_names_meet_their_demangled_twins(doc, capture, torch_trace):
    mangled = [n for n in torch_trace["kernels"] if n.startswith("_Z")]
    assert len(mangled) == 2 and all(n in capture["demangled"] for n in mangled)
    rows = {n: r for r in doc["rows"] for n in r["names_a"]}
    for name in mangled:
        r = rows[name]
        assert r["status"] == "renamed" and r["names_b"] == [capture["demangled"][name]]
        # shown demangled; nsys writes the parameter list (T1::Params), the demangler the full type: the spelling
        # key leaves parameter lists out
        twin = capture["demangled"][name]
        assert not r["name"].startswith("_Z") and r["name"][:r["name"].rfind(">(")] == twin[:twin.rfind(">(")]
    assert not [r for r in doc["rows"] if r["kind"] == "kernel" and r["status"] in ("new", "vanished")]


def test_the_step_count_difference_is_one_line_at_the_top(doc, tmp_path):
    # one H100 each: no device line; the capture records no operator, so neither they nor the annotations (whose
    # self time is what their operators leave) are compared
    operators = ["host operators recorded in A only: left out",
                 "annotations left out: their self time counts the host operators inside them, which A alone records"]
    assert doc["differences"] == ["steps: A 2, B 1", *operators]
    code, out, err = run_cli("--store", str(tmp_path), "--width", "300", "diff", str(TORCH), str(SQLITE), "--top", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "not the same setup: " + "; ".join(["steps: A 2, B 1", *operators])
    assert not [r for r in doc["rows"] if r["kind"] in ("op", "marker")]
    assert any(line.startswith("figures per step: A 2 steps (ProfilerStep#N), B 1 step (range train_step)")
               for line in lines[:5])
    assert any(line.startswith("total per step: GPU time") for line in lines)


def test_another_device_and_world_size_are_named(tmp_path):
    with gzip.open(NCCL_RANK0, "rt", encoding="utf-8") as f:
        raw = json.load(f)
    with gzip.open(TORCH, "rt", encoding="utf-8") as f:
        single = json.load(f)
    device_b = raw["deviceProperties"][0]["name"]
    device_a = single["deviceProperties"][0]["name"]
    world = raw["distributedInfo"]["world_size"]
    steps_b = len({e["name"] for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                   and re.match(r"^ProfilerStep#\d+$", e.get("name", ""))})
    assert device_a != device_b and world == 2 and "distributedInfo" not in single
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(TORCH), str(NCCL_RANK0), "--json")
    assert code == 0, err
    doc = json.loads(out)
    api_b = any(e.get("cat") in ("cuda_runtime", "cuda_driver") for e in raw["traceEvents"])
    assert not api_b  # the rank trace was kept to its GPU work: its API calls are unknown, not vanished
    assert doc["differences"] == [f"device: A {device_a}, B {device_b}", f"world size: A not given, B {world}",
                                  f"steps: A 2, B {steps_b}", "API calls recorded in A only: left out"]
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(TORCH), str(NCCL_RANK0))
    assert out.splitlines()[0].startswith(f"not the same setup: device: A {device_a}, B {device_b}; world size")


def test_per_trace_on_request_and_per_step_refused_without_steps(tmp_path, capture, torch_trace):
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(TORCH), str(SQLITE), "--json", "--per", "trace")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["basis"]["per"] == "trace"
    assert doc["summary"]["kernel"]["time_a_ns"] == sum(t for _, t in torch_trace["kernels"].values())
    summary_csv = FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_kern_sum.csv"
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(TORCH), str(summary_csv), "--per", "step")
    assert code == 2 and out == ""
    assert err == ("traceparse: error: --per step: B marks no steps (no ProfilerStep#N annotations and no NVTX "
                   "range named like train_step); use --per trace\n")
