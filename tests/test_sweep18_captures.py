"""Sweep 18's real captures (fixtures/torch/sweep18/, fixtures/nsys/sweep18/; README there): what traceparse says
about them against figures computed here from the raw files with gzip, json and sqlite3 alone.

For every trace: the step count and each step's time, the GPU's busy share of its span and the time of each kind
of GPU work, the top kernel's total time, the copy time overlapping kernels; and what each workload is known to
hold (the script that made it): 3 or 5 steps, the repeat=2 schedule's step numbers, the skipped fp16 step, the
cuDNN RNN streams.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from helpers import FIXTURES, intersect, run_cli, union, us_to_ns

TORCH = FIXTURES / "torch" / "sweep18"
NSYS = FIXTURES / "nsys" / "sweep18" / "lstm_gru_nsys.sqlite.gz"
NAMES = ["lstm_gru", "embbag_sparse", "amp_accum", "infer", "repeat2_cycle1", "repeat2_cycle2"]
GPU_CATS = {"kernel": "kernels", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def raw(name: str) -> list[dict]:
    with gzip.open(TORCH / f"{name}.json.gz", "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def span(e: dict) -> tuple[int, int]:
    start = us_to_ns(e["ts"])
    return start, start + us_to_ns(e["dur"])


def oracle(events: list[dict]) -> dict:
    """The figures of one trace from its raw events."""
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    merged = union(span(e) for e in gpu)
    kernels = union(span(e) for e in events if e.get("cat") == "kernel")
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    by_kernel: Counter = Counter()
    for e in events:
        if e.get("cat") == "kernel":
            by_kernel[e["name"]] += us_to_ns(e["dur"])
    steps = sorted((span(e), e["name"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    return {
        "busy_ns": sum(b - a for a, b in merged), "gpu_span_ns": merged[-1][1] - merged[0][0],
        "kernel_ns": sum(us_to_ns(e["dur"]) for e in gpu if e["cat"] == "kernel"),
        "memset_ns": sum(us_to_ns(e["dur"]) for e in gpu if e["cat"] == "gpu_memset"),
        "memcpy_ns": sum(us_to_ns(e["dur"]) for e in copies),
        "overlap_ns": sum(intersect(*span(e), kernels) for e in copies),
        "top_kernel": by_kernel.most_common(1)[0],
        "steps": [(name, b - a) for (a, b), name in steps],
        "step_busy_ns": [sum(intersect(a, b, [m]) for m in merged) for (a, b), _ in steps],
    }


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory) -> dict[str, dict]:
    store = tmp_path_factory.mktemp("store")
    out = {}
    for name in NAMES:
        code, text, err = run_cli("--store", str(store), "analyze", str(TORCH / f"{name}.json.gz"), "--json")
        assert code == 0, err
        out[name] = json.loads(text)
    code, text, err = run_cli("--store", str(store), "analyze", str(NSYS), "--json")
    assert code == 0, err
    out["nsys"] = json.loads(text)
    return out


def finding(doc: dict, rule: str) -> dict:
    found = [f for f in doc["findings"] if f["rule"] == rule]
    assert len(found) == 1, rule
    return found[0]


# -- what the scripts ran, read from the raw JSON ------------------------------------------------------------
def test_the_captures_hold_the_steps_the_script_profiled():
    expected = {"lstm_gru": [1, 2, 3], "embbag_sparse": [1, 2, 3], "amp_accum": [1, 2, 3], "infer": [1, 2, 3, 4, 5],
                "repeat2_cycle1": [3, 4], "repeat2_cycle2": [7, 8]}  # repeat=2: skip 1, wait 1, warm-up 1, active 2
    for name, numbers in expected.items():
        steps = oracle(raw(name))["steps"]
        assert [int(n.split("#")[1]) for n, _ in steps] == numbers, name
        recorded = json.loads((TORCH / f"{name.split('_cycle')[0]}_steps.json").read_text())
        assert len(recorded["step_wall_ms"]) == recorded["steps_run_under_profiler"]


def test_the_raw_counts_of_each_capture():
    counts = {name: Counter(e.get("cat") for e in raw(name)) for name in NAMES}
    assert {n: (c["kernel"], c["gpu_memcpy"], c["gpu_memset"], c["python_function"]) for n, c in counts.items()} == {
        "lstm_gru": (2583, 3, 681, 0), "embbag_sparse": (438, 54, 6, 0), "amp_accum": (601, 15, 12, 2783),
        "infer": (400, 85, 5, 0), "repeat2_cycle1": (36, 2, 2, 0), "repeat2_cycle2": (36, 2, 2, 0)}
    # cuDNN's RNN kernels run on 11 streams; every other capture on the default stream alone
    streams = {n: {e["args"]["stream"] for e in raw(n) if e.get("cat") in GPU_CATS} for n in NAMES}
    assert len(streams["lstm_gru"]) == 11 and all(streams[n] == {7} for n in NAMES if n != "lstm_gru")


# -- traceparse against the oracle ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_steps_busy_share_gpu_time_and_top_kernel_equal_the_raw_json(analyzed, name):
    want = oracle(raw(name))
    doc = analyzed[name]
    summary = doc["summary"][0]
    times = [t for _, t in want["steps"]]
    assert summary["steps"] == len(times) and summary["step_source"] == "ProfilerStep#N"
    assert (summary["step_min_ns"], summary["step_max_ns"]) == (min(times), max(times))
    assert summary["step_time_ns"] == round(sum(times) / len(times))
    assert summary["gpu_busy_pct"] == round(100 * want["busy_ns"] / want["gpu_span_ns"], 4)
    idle = finding(doc, "gpu-idle")["metrics"]
    assert (idle["busy_ns"], idle["span_ns"]) == (want["busy_ns"], want["gpu_span_ns"])
    parts = {p["part"]: p["time_ns"] for p in summary["gpu_time"]["parts"]}
    assert parts["kernels"] == want["kernel_ns"] and parts.get("memset", 0) == want["memset_ns"]
    assert sum(v for k, v in parts.items() if k not in ("kernels", "memset")) == want["memcpy_ns"]
    assert summary["gpu_time"]["total_ns"] == want["kernel_ns"] + want["memset_ns"] + want["memcpy_ns"]
    top = finding(doc, "kernel-share")["items"][0]
    assert (top["time_ns"], top["name"] in want["top_kernel"][0]) == (want["top_kernel"][1], True)
    overlap = finding(doc, "low-memcpy-overlap")["metrics"]
    assert (overlap["memcpy_time_ns"], overlap["overlapped_ns"]) == (want["memcpy_ns"], want["overlap_ns"])


def test_the_figures_in_numbers(analyzed):
    """The oracle's own figures, pinned: a change of the fixtures or of the oracle shows here."""
    lstm, amp = oracle(raw("lstm_gru")), oracle(raw("amp_accum"))
    assert (lstm["busy_ns"], lstm["gpu_span_ns"], lstm["top_kernel"][1]) == (21_255_487, 55_766_258, 8_528_138)
    assert [t for _, t in lstm["steps"]] == [17_360_351, 19_064_193, 19_677_648]
    assert (amp["busy_ns"], amp["top_kernel"][1], amp["overlap_ns"]) == (4_910_403, 834_752, 0)
    # the skipped fp16 step (loss × inf in ProfilerStep#2): the scaler found inf and AdamW did not run, so that
    # step's GPU work is half a millisecond short of the others'
    assert amp["step_busy_ns"] == [1_803_642, 1_302_705, 1_804_056]
    assert json.loads((TORCH / "amp_accum_skipped.json").read_text()) == {"steps_whose_scale_dropped": [2]}


def test_the_skipped_step_runs_no_optimizer_kernels():
    events = raw("amp_accum")
    steps = sorted((span(e), e["name"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    # AdamW's foreach kernels launched from inside Optimizer.step: by the launch's correlation id, per step
    opt = [span(e) for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")]
    launches = {e["args"]["correlation"]: span(e)[0] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per_step: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") != "kernel" or e["args"].get("correlation") not in launches:
            continue
        at = launches[e["args"]["correlation"]]
        if any(a <= at <= b for a, b in opt):
            per_step[next(n for (a, b), n in steps if a <= at <= b)] += 1
    assert per_step["ProfilerStep#2"] < per_step["ProfilerStep#1"] == per_step["ProfilerStep#3"]


def test_the_per_step_busy_chart_of_the_report_equals_the_raw_json(tmp_path):
    want = oracle(raw("amp_accum"))
    page = tmp_path / "amp.html"
    code, _, err = run_cli("--store", str(tmp_path / "s"), "report", str(TORCH / "amp_accum.json.gz"),
                           "--html", str(page))
    assert code == 0, err
    text = page.read_text()
    start = text.index('<script type="application/json" id="figures">') + len(
        '<script type="application/json" id="figures">')
    figures = json.loads(text[start:text.index("</script>", start)])
    bars = {d["name"]: d["y"] for d in figures["chart-steps"]["data"]}
    assert [round(v * 1e6) for v in bars["GPU 0 busy"]] == want["step_busy_ns"]
    assert [round((b + i) * 1e6) for b, i in zip(bars["GPU 0 busy"], bars["idle"])] == [t for _, t in want["steps"]]


def test_the_two_cycles_of_one_process_diff_step_by_step(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path), "diff", str(TORCH / "repeat2_cycle1.json.gz"),
                             str(TORCH / "repeat2_cycle2.json.gz"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    a, b = oracle(raw("repeat2_cycle1")), oracle(raw("repeat2_cycle2"))
    step_a = round(sum(t for _, t in a["steps"]) / 2)
    step_b = round(sum(t for _, t in b["steps"]) / 2)
    basis = doc["basis"]
    assert (basis["steps_a"], basis["steps_b"]) == (2, 2)
    assert (basis["step_time_a_ns"], basis["step_time_b_ns"]) == (step_a, step_b) == (1_841_488, 1_711_942)
    # GPU time per step: each cycle's kernels, copies and memsets (all inside its steps) over its 2 steps; diff
    # rounds each name's time per step to the ns and adds those, so its total may differ by half a ns a name
    gpu_rows = [r for r in doc["rows"] if r["kind"] in ("kernel", "memcpy", "memset")]
    for side, want in (("a", a), ("b", b)):
        total = want["kernel_ns"] + want["memcpy_ns"] + want["memset_ns"]
        shown = doc["summary"]["gpu"][f"time_{side}_ns"]
        assert shown == sum(r[f"time_{side}_ns"] for r in gpu_rows)
        assert abs(shown - total / 2) <= len(gpu_rows) / 2
    assert (doc["summary"]["gpu"]["time_a_ns"], doc["summary"]["gpu"]["time_b_ns"]) == (251_408, 251_309)


# -- the Nsight Systems capture of the same model -------------------------------------------------------------
def nsys_oracle(tmp: Path) -> dict:
    db = tmp / "lstm.sqlite"
    db.write_bytes(gzip.decompress(NSYS.read_bytes()))
    con = sqlite3.connect(db)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    kernels = list(con.execute("SELECT start, end, demangledName, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    memsets = list(con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET"))
    steps = list(con.execute("SELECT start, end, text FROM NVTX_EVENTS WHERE text LIKE 'step %' ORDER BY start"))
    con.close()
    merged = union([(a, b) for a, b, _, _ in kernels] + memsets)
    by_kernel: Counter = Counter()
    for a, b, n, _ in kernels:
        by_kernel[names[n]] += b - a
    return {"kernels": len(kernels), "streams": len({s for *_, s in kernels}), "busy_ns": sum(b - a for a, b in merged),
            "gpu_span_ns": merged[-1][1] - merged[0][0], "kernel_ns": sum(b - a for a, b, _, _ in kernels),
            "memset_ns": sum(b - a for a, b in memsets), "top_kernel": by_kernel.most_common(1)[0],
            "steps": [(t, b - a) for a, b, t in steps]}


def test_the_nsys_capture_equals_its_sqlite(analyzed, tmp_path):
    want = nsys_oracle(tmp_path)
    assert (want["kernels"], want["streams"]) == (2583, 11)
    assert want["steps"] == [("step 1", 16_205_633), ("step 2", 13_432_512), ("step 3", 13_042_774)]
    summary = analyzed["nsys"]["summary"][0]
    times = [t for _, t in want["steps"]]
    assert (summary["steps"], summary["step_min_ns"], summary["step_max_ns"]) == (3, min(times), max(times))
    assert summary["step_time_ns"] == round(sum(times) / 3)
    assert summary["gpu_busy_pct"] == round(100 * want["busy_ns"] / want["gpu_span_ns"], 4)
    parts = {p["part"]: p["time_ns"] for p in summary["gpu_time"]["parts"]}
    assert parts == {"kernels": want["kernel_ns"], "memset": want["memset_ns"]}
    top = finding(analyzed["nsys"], "kernel-share")["items"][0]
    assert (top["name"], top["time_ns"]) == want["top_kernel"] == (
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(T1::Params)", 8_657_155)
    # nsys stats' own kernel summary, written beside it, says the same
    rows = (NSYS.parent / "lstm_gru_nsys_cuda_gpu_kern_sum.csv").read_text().splitlines()
    first = rows[1].split(",")
    assert (int(first[1]), int(first[2])) == (8_657_155, 672)
