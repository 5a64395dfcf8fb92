"""Tensor-core evidence and precision read from GEMM kernel names, on real kernels of one GEMM in six precisions.

fixtures/torch/gemm_kernels/ was made on an H200 (CUDA 13, PyTorch 2.11) by fixtures/make_gemm_kernel_trace.py:
a 4096³ GEMM in fp32 (TF32 off), TF32, fp16, bf16, e4m3 and e5m2×e4m3, each inside a ``gemm <precision>``
annotation (the torch trace), and the same GEMMs counted by Nsight Compute without any tensor-op metric (the
CSV), so the kernel's name is all that says it ran on tensor cores. cuBLAS ran fp16, bf16 and FP8 as Hopper
``nvjet_sm90_*`` kernels, whose names hold no "gemm": before, the FP8 GEMMs read as fp32 kernels held to the fp32
roof and the fp16/bf16 ones as no tensor work.
"""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from helpers import FIXTURES
from traceparse.ingest import read_paths
from traceparse.measures.roofline import roofline, tensor_precision_from_name, uses_tensor_cores_by_name

HERE = FIXTURES / "torch" / "gemm_kernels"
TRACE = HERE / "gemm_precisions.json.gz"
NCU_CSV = HERE / "gemm_precisions_ncu_raw.csv"
MADE = json.loads((HERE / "gemm_precisions_made.json").read_text())
#: What each annotation's GEMM ran in, as the script asked for it: its tensor-core precision (None: SIMT fp32).
ASKED = {"fp32": None, "tf32": "tf32_tensor", "fp16": "fp16_tensor", "bf16": "bf16_tensor",
         "fp8_e4m3": "fp8_tensor", "fp8_e5m2": "fp8_tensor"}


def is_copy(name: str) -> bool:
    """The dtype conversions around the GEMMs (``elementwise_kernel``), not GEMMs."""
    return "elementwise_kernel" in name


def gemm_kernels_by_annotation() -> dict[str, set[str]]:
    """{precision: the GEMM kernel names launched inside its ``gemm <precision>`` annotation}, from the raw JSON:
    kernel → its launch by correlation id → the annotation around the launch on the launching thread."""
    events = json.loads(gzip.decompress(TRACE.read_bytes()))["traceEvents"]
    spans = [(e["tid"], e["ts"], e["ts"] + e["dur"], e["name"].removeprefix("gemm "))
             for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gemm ")]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    found: dict[str, set[str]] = {}
    for kernel in (e for e in events if e.get("cat") == "kernel" and not is_copy(e["name"])):
        launch = launches[kernel["args"]["correlation"]]
        label = next(p for tid, start, end, p in spans if tid == launch["tid"] and start <= launch["ts"] < end)
        found.setdefault(label, set()).add(kernel["name"])
    return found


def test_every_precision_ran_its_own_gemm_kernel():
    found = gemm_kernels_by_annotation()
    assert sorted(found) == sorted(MADE["precisions"]) == sorted(ASKED)
    assert all(len(names) == 1 for names in found.values())
    assert sum(name.startswith("nvjet_") for names in found.values() for name in names) == 4


@pytest.mark.parametrize("precision", sorted(ASKED))
def test_the_kernel_name_says_the_precision_its_gemm_ran_in(precision):
    (name,) = gemm_kernels_by_annotation()[precision]
    assert uses_tensor_cores_by_name(name) is (ASKED[precision] is not None)
    if ASKED[precision]:
        assert tensor_precision_from_name(name) == ASKED[precision]


def test_ncu_counts_without_tensor_metrics_take_the_tensor_precision_from_the_name():
    rows = [r for r in csv.reader(NCU_CSV.open(newline="")) if len(r) > 1]
    column = rows[0].index("Kernel Name")
    gemms = [r[column] for r in rows[2:] if not is_copy(r[column])]
    assert len(gemms) == len(MADE["precisions"])  # one launch each, in the script's order
    items = {i["name"]: i for i in roofline(read_paths([NCU_CSV])[0], None, group="launch")["items"]}
    for precision, name in zip(MADE["precisions"], gemms):
        item = items[name]
        assert item["tensor_core"] is (ASKED[precision] is not None), name
        if ASKED[precision]:
            # no tensor-op metric: the SASS FLOPs miss the MMA work, a lower bound held to the name's tensor peak
            assert (item["precision"], item["flops_lower_bound"]) == (ASKED[precision], True), name
        else:
            assert (item["precision"], item["flops_lower_bound"]) == ("fp32", False), name
