"""Rule arithmetic-intensity and command roofline, checked against sums taken here from the ncu CSVs.

FLOPs = add + mul + 2·fma per precision (+ tensor ops), bytes = DRAM read +
write, time = gpu__time_duration.sum: computed with the csv module and
decimal; the peaks are typed in from NVIDIA's H100 SXM datasheet (67 TFLOP/s
FP32, 989/2 TFLOP/s dense TF32, 3.35 TB/s).
"""

from __future__ import annotations

import csv
import gzip
import re
import json
import sys
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from traceparse.catalog import find_gpu
from traceparse.ingest import read_paths
from traceparse.rule import RuleOptions
from traceparse.trace import Device, Trace, TraceMeta
from traceparse.measures.roofline import roofline
from traceparse_plugins.rules.arithmetic_intensity import ArithmeticIntensity

VGG11 = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"
H100_FP32_GFLOPS = 67_000.0
H100_TF32_GFLOPS = 989_000.0 / 2
H100_GBPS = 3350.0


def expected_per_kernel(path: Path) -> list[dict]:
    """FLOPs, bytes and time per kernel row of a raw page, from its columns."""
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 1]
    header, kernels = rows[0], [r for r in rows[2:] if r[0].isdigit()]
    ix = {h: i for i, h in enumerate(header)}

    def get(row, name):
        return Decimal(row[ix[name]].replace(",", "")) if name in ix else Decimal(0)

    out = []
    for row in kernels:
        by_precision = {}
        for x, precision in (("f", "fp32"), ("h", "fp16"), ("d", "fp64")):
            m = f"sm__sass_thread_inst_executed_op_{x}%s_pred_on.sum"
            by_precision[precision] = get(row, m % "add") + get(row, m % "mul") + 2 * get(row, m % "fma")
        by_precision["tf32_tensor"] = get(row, "sm__ops_path_tensor_src_tf32_dst_fp32.sum")
        name = row[ix["Kernel Name"]]
        half_moves = Decimal(0)
        if re.search(r"\bfloat\b", name) and not re.search(r"half|bf16|bfloat16|fp16|f16|hmma", name, re.I):
            half_moves, by_precision["fp16"] = by_precision["fp16"], Decimal(0)  # HFMA2.MMA moves, no arithmetic
        out.append({"name": name, "by_precision": by_precision, "half_moves": half_moves,
                    "flops": int(sum(by_precision.values())),
                    "dram_bytes": int(get(row, "dram__bytes_read.sum") + get(row, "dram__bytes_write.sum")),
                    "time_ns": int(get(row, "gpu__time_duration.sum"))})
    return out


def all_items(path) -> tuple[list[dict], dict]:
    trace = read_paths([path])[0]
    finding = ArithmeticIntensity().check(trace, RuleOptions(thresholds={"top": 0, "model_gflops": 0.0}))[0]
    return sorted(finding.items, key=lambda i: i["event_id"]), finding.metrics


def test_flops_bytes_and_time_per_kernel_equal_the_csv_sums():
    items, metrics = all_items(VGG11)
    expected = expected_per_kernel(VGG11)
    assert len(items) == len(expected) == 198
    assert [i["flops"] for i in items] == [e["flops"] for e in expected]
    assert [i["dram_bytes"] for i in items] == [e["dram_bytes"] for e in expected]
    assert [i["time_ns"] for i in items] == [e["time_ns"] for e in expected]
    assert metrics["flops"] == sum(e["flops"] for e in expected)
    assert metrics["dram_bytes"] == sum(e["dram_bytes"] for e in expected)
    assert metrics["time_ns"] == sum(e["time_ns"] for e in expected)
    assert metrics["flops_by_precision"]["tf32_tensor"] == sum(int(e["by_precision"]["tf32_tensor"]) for e in expected)
    assert metrics["flops_estimated"] == 0 and metrics["lower_bound_kernels"] == 0


def test_bound_and_roof_follow_from_the_h100_figures():
    items, metrics = all_items(VGG11)
    expected = expected_per_kernel(VGG11)
    checked = {"memory": 0, "compute": 0}
    for item, e in zip(items, expected):
        if not e["flops"] or not e["dram_bytes"]:
            continue
        work = {p: float(v) for p, v in e["by_precision"].items() if v}
        peaks = {"fp32": H100_FP32_GFLOPS, "tf32_tensor": H100_TF32_GFLOPS, "fp16": 133_800.0}
        peak = sum(work.values()) / sum(v / peaks[p] for p, v in work.items())
        ai = e["flops"] / e["dram_bytes"]
        achieved = e["flops"] / e["time_ns"]
        ridge = peak / H100_GBPS
        bound = "memory" if ai < ridge else "compute"
        roof = 100 * achieved / min(peak, ai * H100_GBPS)
        assert item["peak_gbps"] == H100_GBPS
        assert item["peak_gflops"] == pytest.approx(peak, rel=1e-6)
        assert item["ridge_ai"] == pytest.approx(ridge, rel=1e-4)
        assert item["arithmetic_intensity"] == pytest.approx(ai, rel=1e-4, abs=1e-4)
        assert item["achieved_gflops"] == pytest.approx(achieved, rel=1e-4, abs=1e-4)
        assert item["bound"] == bound
        assert item["roof_pct"] == pytest.approx(roof, rel=1e-4, abs=1e-4)
        checked[bound] += 1
    assert checked["memory"] > 50 and checked["compute"] >= 10
    conv = next(i for i in items if i["name"].startswith("sm90_xmma_fprop") and i["tensor_core"])
    assert conv["precision"] == "tf32_tensor" and not conv["flops_lower_bound"]


def test_the_wholes_peak_says_which_precisions_it_is_of():
    """"peak gflops 408,197" named no precision: it is the peak of the whole's mix (tf32 tensor GEMMs and fp32
    SIMT kernels), and the metrics and the message say so, each share from the CSV's FLOPs."""
    from traceparse.figures import fmt_number

    items, metrics = all_items(VGG11)
    expected = expected_per_kernel(VGG11)
    work: dict[str, float] = {}
    for e in expected:
        for p, v in e["by_precision"].items():
            work[p] = work.get(p, 0.0) + float(v)
    work = {p: v for p, v in work.items() if v}
    total = sum(work.values())
    shares = {p: round(100 * v / total, 4) for p, v in sorted(work.items(), key=lambda kv: -kv[1])}
    assert len(shares) == 3 and metrics["peak_mix"] == shares
    assert list(metrics["peak_mix"]) == list(shares)  # most first
    finding = ArithmeticIntensity().check(read_paths([VGG11])[0], RuleOptions(thresholds={"top": 0}))[0]
    assert 0 < shares["fp16"] < 0.05  # more than none: it read "fp16 0.0%"
    assert (f"peak {fmt_number(metrics['peak_gflops'])} GFLOP/s for its FLOPs' precisions, "
            f"tf32_tensor {shares['tf32_tensor']:.1f}%, fp32 {shares['fp32']:.1f}%, fp16 <0.1%") in finding.message


def test_a_tf32_named_kernel_whose_tf32_ops_read_zero_is_not_a_tensor_kernel():
    items, _ = all_items(VGG11)
    expected = expected_per_kernel(VGG11)
    zero = [i for i, e in zip(items, expected) if "tf32" in e["name"] and not e["by_precision"]["tf32_tensor"]]
    assert zero and not any(i["tensor_core"] or i["flops_lower_bound"] for i in zero)


def test_without_tensor_metrics_tf32_kernels_are_lower_bounds(samples_dir):
    path = samples_dir / "ncu" / "ncu_raw_resnet18_bs16.csv"
    items, metrics = all_items(path)
    expected = expected_per_kernel(path)
    assert [i["flops"] for i in items] == [e["flops"] for e in expected]
    assert [i["dram_bytes"] for i in items] == [e["dram_bytes"] for e in expected]
    tf32 = {n for n in (e["name"] for e in expected) if "tf32" in n or "tfloat32" in n}
    assert {i["name"] for i in items if i["flops_lower_bound"]} == tf32
    # nchwToNhwc and element-wise kernels read non-zero tensor-pipe instructions (HFMA2.MMA moves): not tensor work
    assert not any(i["tensor_core"] for i in items if "nchwToNhwc" in i["name"] or "elementwise" in i["name"])
    held = next(i for i in items if i["flops_lower_bound"])
    assert held["precision"] == "tf32_tensor" and held["peak_gflops"] == H100_TF32_GFLOPS
    assert metrics["lower_bound_kernels"] == sum(1 for i in items if i["flops_lower_bound"])


def test_model_flops_fill_in_what_tensor_cores_did(samples_dir):
    path = samples_dir / "ncu" / "ncu_raw_resnet18_bs16.csv"
    trace = read_paths([path])[0]
    model = 100.0  # GFLOP
    finding = ArithmeticIntensity().check(trace, RuleOptions(thresholds={"top": 0, "model_gflops": model}))[0]
    m = finding.metrics
    measured = sum(e["flops"] for e in expected_per_kernel(path))
    assert m["flops_measured"] == measured
    assert m["flops_estimated"] == pytest.approx(model * 1e9 - measured, rel=1e-9)
    assert m["flops"] == pytest.approx(model * 1e9, rel=1e-9)
    estimated = [i for i in finding.items if i["flops_estimated"]]
    assert sum(i["flops_estimated"] for i in estimated) == pytest.approx(model * 1e9 - measured, rel=1e-9)
    assert not any(i["flops_lower_bound"] for i in finding.items)
    assert "estimated from model_gflops=100.0" in finding.message


def test_unknown_gpu_still_reports_what_needs_no_peak():
    trace = read_paths([VGG11])[0]
    trace.meta.devices = [Device(id=0, name="Imaginary GPU 9000")]
    finding = ArithmeticIntensity().check(trace, RuleOptions(thresholds={"top": 3, "model_gflops": 0.0}))[0]
    m = finding.metrics
    assert m["gpu"] is None
    assert m["peak_gflops"] is None and m["bound"] is None and m["roof_pct"] is None
    assert m["flops"] == sum(e["flops"] for e in expected_per_kernel(VGG11))
    assert m["arithmetic_intensity"] is not None and m["achieved_gflops"] is not None
    assert "No peak figures: the trace's GPU 'Imaginary GPU 9000' is not in the catalog; pass gpu=NAME" in finding.message


def test_gpu_option_overrides_the_trace(store):
    code, out, _ = run_cli("analyze", str(VGG11), "--rule", "arithmetic-intensity", "--gpu", "A100-SXM4-80GB", "--json")
    assert code == 0
    metrics = json.loads(out)["findings"][0]["metrics"]
    assert metrics["gpu"] == "A100 SXM4 80GB" and metrics["peak_gbps"] == 2039.0


def test_details_page_without_counts_says_so():
    trace = read_paths([FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv"])[0]
    (finding,) = ArithmeticIntensity().check(trace, RuleOptions(thresholds=dict(ArithmeticIntensity.thresholds)))
    assert finding.title == "No FLOP or byte counts" and not finding.items


def _trace(rows: list[dict], device: str = "NVIDIA H100 80GB HBM3") -> Trace:
    from traceparse.schema import conform

    return Trace(conform(pl.DataFrame(rows)), TraceMeta(devices=[Device(id=0, name=device)]))


def test_nvprof_metrics_with_aggregated_rows():
    """flop_count_sp and DRAM transactions × 32 (nvprof), a counter's value being the mean of its calls."""
    rows = [
        {"event_id": 0, "kind": "kernel", "name": "sgemm_kernel", "duration_ns": 4_000_000, "calls": 10},
        {"event_id": 1, "kind": "counter", "name": "flop_count_sp", "value": 2.0e9, "calls": 10, "parent_id": 0},
        {"event_id": 2, "kind": "counter", "name": "flop_count_dp", "value": 0.0, "calls": 10, "parent_id": 0},
        {"event_id": 3, "kind": "counter", "name": "dram_read_transactions", "value": 1.0e6, "calls": 10,
         "parent_id": 0},
        {"event_id": 4, "kind": "counter", "name": "dram_write_transactions", "value": 0.5e6, "calls": 10,
         "parent_id": 0},
    ]
    result = roofline(_trace(rows, "Tesla P100-PCIE-16GB"), find_gpu("Tesla P100-PCIE-16GB"))
    (item,) = result["items"]
    assert item["flops"] == 20_000_000_000 and item["dram_bytes"] == 32 * 15_000_000
    assert item["achieved_gflops"] == 5000.0 and item["peak_gflops"] == 9300.0 and item["peak_gbps"] == 732.0
    assert item["bound"] == "compute"  # 41.7 FLOP/B > ridge 12.7


def test_nvprof_counter_on_a_timed_row_counts_one_launch():
    """nvprof's per-name mean linked to one timed launch: FLOPs of that launch, not of all ten."""
    rows = [
        {"event_id": 0, "kind": "kernel", "name": "k", "start_ns": 100, "duration_ns": 1000, "calls": 1},
        {"event_id": 1, "kind": "kernel", "name": "k", "start_ns": 5000, "duration_ns": 1000, "calls": 1},
        {"event_id": 2, "kind": "kernel", "name": "other", "start_ns": 9000, "duration_ns": 500, "calls": 1},
        {"event_id": 3, "kind": "counter", "name": "flop_count_sp", "value": 3.0e6, "calls": 10, "parent_id": 0},
        {"event_id": 4, "kind": "counter", "name": "dram_read_bytes", "value": 1.0e6, "calls": 10, "parent_id": 0},
    ]
    result = roofline(_trace(rows, "Tesla V100-SXM2-16GB"), find_gpu("Tesla V100-SXM2-16GB"))
    (item,) = result["items"]
    assert item["flops"] == 3_000_000 and item["dram_bytes"] == 1_000_000 and item["time_ns"] == 1000
    assert result["extra"]["kernels_without_counts"] == 2
    assert result["extra"]["kernels_without_counts_time_ns"] == 1500


def test_torch_trace_with_flops_but_no_bytes():
    rows = [
        {"event_id": 0, "kind": "op", "name": "aten::conv2d", "duration_ns": 50_000, "flops": 2.0e9, "external_id": 7},
        {"event_id": 1, "kind": "op", "name": "aten::addmm", "duration_ns": 30_000, "flops": 1.0e8, "external_id": 8},
        {"event_id": 2, "kind": "kernel", "name": "sm90_xmma_fprop", "duration_ns": 200_000, "external_id": 7},
        {"event_id": 3, "kind": "kernel", "name": "nchwToNhwc", "duration_ns": 50_000, "external_id": 7},
    ]
    finding = ArithmeticIntensity().check(_trace(rows), RuleOptions(thresholds={"top": 0, "model_gflops": 0.0}))[0]
    conv, addmm = finding.items
    assert conv["name"] == "aten::conv2d" and conv["time_ns"] == 250_000 and conv["achieved_gflops"] == 8000.0
    assert conv["roof_pct"] == pytest.approx(100 * 8000.0 / H100_FP32_GFLOPS, rel=1e-4)
    assert conv["dram_bytes"] is None and conv["arithmetic_intensity"] is None and conv["bound"] is None
    assert addmm["time_ns"] == 30_000 and addmm["time_from"] == "operator (CPU)"
    assert "no DRAM byte counts" in finding.message


# -- the roofline command ------------------------------------------------------------------------------
def test_roofline_text(store):
    code, out, err = run_cli("roofline", str(VGG11), "--top", "5")
    assert code == 0, err
    assert "H100 SXM" in out and "tf32_tensor 494,500 GFLOP/s (ridge 148 FLOP/B)" in out
    expected = expected_per_kernel(VGG11)
    total_gflop = sum(e["flops"] for e in expected) / 1e9
    assert f"Total: {total_gflop:.4g} GFLOP" in out
    assert "(40 more rows; --top 0 lists all)" in out  # 45 kernel names, grouped by name


def test_roofline_json_groups_by_name(store):
    code, out, _ = run_cli("roofline", str(VGG11), "--json", "--group", "name")
    data = json.loads(out)
    expected = expected_per_kernel(VGG11)
    by_name: dict[str, int] = {}
    for e in expected:
        by_name[e["name"]] = by_name.get(e["name"], 0) + e["flops"]
    assert {i["name"]: i["flops"] for i in data["items"]} == by_name
    assert sum(i["launches"] for i in data["items"]) == 198


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".html", b"<!DOCTYPE html>")])
def test_roofline_chart_files(tmp_path, store, suffix, magic):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"roofline{suffix}"
    code, _, err = run_cli("roofline", str(VGG11), "--out", str(out))
    assert code == 0, err
    data = out.read_bytes()
    assert data.startswith(magic)
    if suffix == ".html":
        assert b"<svg" in data and b"sm90_xmma" in data


def test_roofline_without_matplotlib(tmp_path, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = run_cli("roofline", str(VGG11), "--out", str(tmp_path / "r.png"))
    assert code == 2
    assert err == ("traceparse: error: --out needs matplotlib, which is not installed: install the plot extra: "
                   "pip install 'traceparse[plot]' (matplotlib)\n")
    assert not (tmp_path / "r.png").exists()


def test_roofline_bad_output_name(tmp_path, store):
    code, _, err = run_cli("roofline", str(VGG11), "--out", str(tmp_path / "r.pdf"))
    assert code == 2
    assert err == f"traceparse: error: --out {tmp_path / 'r.pdf'}: expected a .png, .svg or .html file name\n"


def test_roofline_on_a_trace_without_counts(store):
    path = FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv"
    code, _, err = run_cli("roofline", str(path))
    assert code == 2
    assert err.splitlines()[-1] == (f"traceparse: error: {path}: no FLOP or DRAM byte counts to put on a roofline "
                                    "(ncu metrics, or torch.profiler with record_shapes=True or with_flops, or a "
                                    "JAX profile's .xplane.pb, are needed; see docs/roofline.md)")


def test_details_page_with_metrics_and_scaled_units(store):
    """ncu --csv --metrics (2022-style details page): metric names as written, units scaled by 1000."""
    path = FIXTURES / "ncu" / "handwritten" / "details_2022_metrics.csv"
    scale = {"": 1, "inst": 1, "Mbyte": 10**6, "Kbyte": 10**3, "usecond": 10**3}
    per_kernel: dict[str, dict[str, Decimal]] = {}
    with open(path, newline="") as f:
        for row in csv.reader(line for line in f if line.startswith('"')):
            if row[0] == "ID":
                continue
            per_kernel.setdefault(row[0], {})[row[12]] = Decimal(row[14].replace(",", "")) * scale[row[13]]
    code, out, err = run_cli("analyze", str(path), "--rule", "arithmetic-intensity", "--gpu", "A100-SXM4-40GB",
                             "--json", "--set", "arithmetic-intensity.top=0")
    assert code == 0, err
    items = sorted(json.loads(out)["findings"][0]["items"], key=lambda i: i["event_id"])
    sass = "sm__sass_thread_inst_executed_op_f%s_pred_on.sum"
    for item, m in zip(items, per_kernel.values()):
        fp32 = m[sass % "add"] + m[sass % "mul"] + 2 * m[sass % "fma"]
        tf32 = m["sm__ops_path_tensor_src_tf32_dst_fp32.sum"]
        flops = fp32 + tf32
        dram = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
        time_ns = m["gpu__time_duration.sum"]
        assert (item["flops"], item["dram_bytes"], item["time_ns"]) == (int(flops), int(dram), int(time_ns))
        peak = float(flops) / (float(fp32) / 19_500 + float(tf32) / 156_000)  # A100 datasheet, GFLOP/s
        ai = float(flops / dram)
        assert item["peak_gflops"] == pytest.approx(peak, rel=1e-6)
        assert item["bound"] == ("memory" if ai < peak / 1555 else "compute")
        assert item["roof_pct"] == pytest.approx(100 * float(flops / time_ns) / min(peak, ai * 1555), rel=1e-4)
    assert [i["precision"] for i in items] == ["fp32", "tf32_tensor"]
    assert [i["tensor_core"] for i in items] == [False, True]


def test_half_precision_counts_of_float_kernels_are_register_moves_not_flops():
    """A float element-wise add (CUDAFunctor_add<float>) read twice as many half-precision FMA counts as fp32 ones:
    HFMA2.MMA register moves on sm_80+. It was labelled fp16 at three times its work; its FLOPs are its fp32
    ones now, and the message says how many kernels and GFLOP were left out (both from the CSV here)."""
    from traceparse.figures import fmt_number

    items, metrics = all_items(VGG11)
    expected = expected_per_kernel(VGG11)
    moved = [e for e in expected if e["half_moves"]]
    assert len(moved) == metrics["half_move_kernels"] >= 20
    assert metrics["half_moves_left_out"] == pytest.approx(float(sum(e["half_moves"] for e in moved)))
    add = next(i for i, e in zip(items, expected) if "CUDAFunctor_add<float>" in e["name"] and e["half_moves"])
    e = next(e for e in expected if e["name"] == add["name"] and e["half_moves"])
    assert add["precision"] == "fp32" and add["flops"] == int(e["by_precision"]["fp32"])
    finding = ArithmeticIntensity().check(read_paths([VGG11])[0], RuleOptions(thresholds={"top": 0}))[0]
    assert (f"{len(moved)} kernels whose names say float read half-precision FMA counts "
            f"({fmt_number(float(sum(e['half_moves'] for e in moved)) / 1e9)} GFLOP)") in finding.message


def test_roofline_of_a_cpu_only_trace_says_there_is_no_gpu_work(store):
    """A CPU-only trace recorded with shapes and FLOPs (PyTorch 2.13 on the CPU) has no kernel to place: the error
    says so instead of asking for the record_shapes and with_flops it has; its apostrophes are prose, not quoted
    values cut to an excerpt."""
    path = FIXTURES / "torch" / "cpu" / "convnet_cpu_torch213.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    assert doc["record_shapes"] == 1 and doc["with_flops"] == 1
    assert not any(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in doc["traceEvents"])
    code, _, err = run_cli("roofline", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}: no GPU kernels to place on a GPU's roofline: the trace recorded no "
                   "GPU activity (a CPU-only run; hotspots gives its operators' time)\n")


def test_apostrophes_are_not_quotes_in_one_line_errors():
    from traceparse.text import one_line

    prose = "the GPU's roofline" + " and more" * 20 + " the ranks' waits"
    assert one_line(prose) == prose
    value = "'" + "x" * 200 + "'"
    assert one_line(f"got {value} for the GPU's name") == f"got '{'x' * 79}…' for the GPU's name"
