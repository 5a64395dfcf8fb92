"""`traceparse roofline` on a ROCm trace places its work against the AMD GPU's roofs (issue 17).

The public ROCm traces have no per-kernel counters and no operator FLOPs (the MI300X BERT trace was recorded with
``with_flops=True`` but carries no ``args.flops``). The torch path of the roofline takes FLOPs from the operators
(``args.flops``, what torch.profiler's with_flops writes) and time from their kernels. So this test uses a
**hand-built copy** of tracelens_mi300x_vf_bert_small.json.gz in which every ``aten::addmm`` gets
``args.flops = 2·M·K·N`` from its own ``Input Dims`` (the formula torch uses for addmm), written at test time;
everything else is the real trace. Expected figures are computed here from the raw JSON and from
plugins/catalog/gpus.toml (tomllib), not by traceparse.
"""

from __future__ import annotations

import gzip
import json
import tomllib
from decimal import Decimal

import pytest

from helpers import FIXTURES, REPO, run_cli, us_to_ns

BERT = FIXTURES / "torch" / "rocm" / "tracelens_mi300x_vf_bert_small.json.gz"
CATALOG = {g["name"]: g for g in tomllib.loads((REPO / "plugins" / "catalog" / "gpus.toml").read_text())["gpu"]}


@pytest.fixture(scope="module")
def bert_with_flops(tmp_path_factory):
    with gzip.open(BERT, "rt") as f:
        data = json.load(f, parse_float=Decimal)
    flops = 0
    for e in data["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm":
            (m, k), (_, n) = e["args"]["Input Dims"][1], e["args"]["Input Dims"][2]
            e["args"]["flops"] = 2 * m * k * n
            flops += 2 * m * k * n
    gemm_ns = sum(us_to_ns(e["dur"]) for e in data["traceEvents"]
                  if e.get("cat") == "kernel" and e["name"].startswith("Cijk_"))
    addmms = sum(1 for e in data["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm")
    cijk = sum(1 for e in data["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("Cijk_"))
    assert addmms == cijk == 26  # each addmm launches one hipBLASLt GEMM: the ops' GPU time is the GEMMs' time
    path = tmp_path_factory.mktemp("rocm") / "bert_mi300x_with_addmm_flops.json"
    path.write_text(json.dumps(data, default=str))
    return path, flops, gemm_ns


def roofline(tmp_path, path, *args):
    code, out, err = run_cli("--store", str(tmp_path / "store"), "roofline", "--json", str(path), *args)
    assert code == 0, err
    return json.loads(out)


def test_roofline_against_the_identified_mi300x(tmp_path, bert_with_flops):
    path, flops, gemm_ns = bert_with_flops
    out = roofline(tmp_path, path)
    mi300x = CATALOG["MI300X"]
    assert out["gpu"] == "MI300X"
    assert out["gpu_source"] == "MI300X (matched the trace's device 'AMD Instinct MI300X VF')"
    total = out["total"]
    assert total["flops"] == flops and out["flops_measured"] == flops and out["flops_estimated"] == 0
    assert total["time_ns"] == gemm_ns
    assert total["achieved_gflops"] == pytest.approx(flops / gemm_ns, abs=1e-4)  # FLOP/ns = GFLOP/s
    # the roofs: the catalog's MI300X figures, exactly
    assert total["peak_gflops"] == mi300x["peak_tflops"]["fp32"] * 1000 == 163_400
    assert total["peak_gbps"] == mi300x["dram_gbps"] == 5300
    assert total["ridge_ai"] == pytest.approx(163_400 / 5300, abs=1e-4)
    assert out["peak_tensor_gflops"] == mi300x["peak_tflops"]["tf32_tensor"] * 1000
    assert total["roof_pct"] == pytest.approx(100 * flops / gemm_ns / 163_400, abs=1e-3)
    assert total["dram_bytes"] is None and total["bound"] is None  # no byte counts: no memory side, said so
    assert "DRAM byte counts" in out["missing"]


@pytest.mark.parametrize("gpu, entry", [("MI300X", "MI300X"), ("mi325x", "MI325X"), ("MI250", "MI250 GCD")])
def test_gpu_option_picks_the_amd_roof(tmp_path, bert_with_flops, gpu, entry):
    path, flops, gemm_ns = bert_with_flops
    out = roofline(tmp_path, path, "--gpu", gpu)
    spec = CATALOG[entry]
    assert out["gpu"] == entry and out["gpu_source"] == f"{entry} (from --gpu)"
    assert out["total"]["peak_gflops"] == spec["peak_tflops"]["fp32"] * 1000
    assert out["total"]["peak_gbps"] == spec["dram_gbps"]
    assert out["total"]["roof_pct"] == pytest.approx(100 * flops / gemm_ns / (spec["peak_tflops"]["fp32"] * 1000),
                                                     abs=1e-3)


def test_the_real_rocm_trace_is_placed_from_its_shapes(tmp_path):
    """Without counters or recorded FLOPs, the real trace's operators are placed from their recorded shapes: the
    26 addmm calls' FLOPs are 2·M·K·N from their Input Dims, their time the hipBLASLt GEMMs they launched."""
    with gzip.open(BERT, "rt") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    addmm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    flops = sum(2 * e["args"]["Input Dims"][1][0] * e["args"]["Input Dims"][1][1] * e["args"]["Input Dims"][2][1]
                for e in addmm)
    gemm_ns = sum(us_to_ns(e["dur"]) for e in events if e.get("cat") == "kernel" and e["name"].startswith("Cijk_"))
    out = roofline(tmp_path, BERT)
    assert out["derived_from"] == "shapes" and "not measured" in out["note"]
    rows = [i for i in out["items"] if i["operator"] == "aten::addmm"]
    assert sum(i["calls"] for i in rows) == len(addmm) == 26
    assert sum(i["flops"] for i in rows) == flops
    assert sum(i["time_ns"] for i in rows) == gemm_ns
    assert {i["precision"] for i in rows} == {"bf16_tensor"}  # bf16 inputs: the tensor-core peak
    code, text, err = run_cli("--store", str(tmp_path / "store"), "roofline", str(BERT))
    assert code == 0, err
    assert "derived from the operators' recorded shapes" in " ".join(text.split())
