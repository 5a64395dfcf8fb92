"""The GPU catalog: device names as tools write them, the figures' completeness, and extension by a plugin."""

from __future__ import annotations

import pytest

from helpers import FIXTURES, run_cli
from traceparse.catalog import find_gpu, gpu_for_trace
from traceparse.errors import InputError
from traceparse.plugins import hookimpl, reset_registry
from traceparse.trace import Device, Trace, TraceMeta
from traceparse_plugins.catalog import PRECISIONS, load_catalog

#: Device names as nvidia-smi, nvprof, nsys, ncu and torch.profiler print them -> catalog entry.
DEVICE_NAMES = {
    "Tesla K80": "K80",
    "Tesla K80 (0)": "K80",
    "Tesla M40": "M40",
    "Tesla M40 24GB": "M40 24GB",
    "Quadro M6000": "M6000",
    "Quadro M6000 24GB": "M6000 24GB",
    "Tesla P40": "P40",
    "Tesla P100-PCIE-16GB": "P100 PCIe 16GB",
    "Tesla P100-PCIE-12GB": "P100 PCIe 12GB",
    "Tesla P100-SXM2-16GB": "P100 SXM2",
    "Tesla P100-PCIE": "P100 PCIe 16GB",       # nvprof's gpu-trace Device column cuts names
    "Tesla V100-SXM2-16GB": "V100 SXM2",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-16GB": "V100 PCIe",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "Tesla T4": "T4",
    "A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA L4": "L4",
    "NVIDIA L40": "L40",
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA GH200 480GB": "GH200",
}


@pytest.mark.parametrize("device_name, entry", sorted(DEVICE_NAMES.items()))
def test_real_device_names_match(device_name, entry):
    spec = find_gpu(device_name)
    assert spec is not None and spec["name"] == entry


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 4090", "Intel(R) Data Center GPU Max 1550", ""])
def test_unknown_devices_do_not_match(device_name):
    assert find_gpu(device_name) is None


def test_required_gpus_are_there():
    names = {e["name"] for e in load_catalog()}
    for required in ("K80", "M40", "M6000", "P40", "P100 PCIe 16GB", "P100 PCIe 12GB", "P100 SXM2", "V100 PCIe",
                     "V100 SXM2", "T4", "A100 SXM4 40GB", "A100 SXM4 80GB", "A100 PCIe 40GB", "A100 PCIe 80GB", "L4",
                     "L40S", "H100 SXM", "H100 PCIe", "H100 NVL", "H200"):
        assert required in names


@pytest.mark.parametrize("entry", load_catalog(), ids=lambda e: e["name"])
def test_every_figure_has_its_source_and_unit_sense(entry):
    assert entry["match"] and all(m == m.lower() for m in entry["match"])
    for key in ("sm_count", "memory_gb", "dram_gbps", "peak_tflops", "host_link"):
        assert key in entry, key
    assert set(entry["peak_tflops"]) <= set(PRECISIONS)
    assert "fp32" in entry["peak_tflops"]
    assert entry["host_link"]["gbps"] > 0 and entry["host_link"]["name"]
    sources = entry["sources"]
    for key in ("sm_count", "memory_gb", "dram_gbps", "host_link"):
        assert sources.get(key), f"{entry['name']}: no source for {key}"
    for precision in entry["peak_tflops"]:
        assert sources.get(f"peak_tflops.{precision}") or sources.get("peak_tflops"), precision
    if "clocks" in entry:
        assert sources.get("clocks")
    # dense tensor figures exceed the same precision on the CUDA cores
    peaks = entry["peak_tflops"]
    for precision in ("fp16", "bf16", "fp64"):
        if precision in peaks and f"{precision}_tensor" in peaks:
            assert peaks[f"{precision}_tensor"] >= peaks[precision]


def test_figures_against_the_datasheets():
    """Spot checks typed from NVIDIA's datasheets (sparsity figures halved by hand here)."""
    h100 = find_gpu("NVIDIA H100 80GB HBM3")
    assert h100["dram_gbps"] == 3350 and h100["sm_count"] == 132
    assert h100["peak_tflops"]["fp32"] == 67 and h100["peak_tflops"]["tf32_tensor"] == 989 / 2
    assert h100["peak_tflops"]["bf16_tensor"] == 1979 / 2 and h100["peak_tflops"]["fp8_tensor"] == 3958 / 2
    a100 = find_gpu("NVIDIA A100-SXM4-80GB")
    assert a100["dram_gbps"] == 2039 and a100["peak_tflops"]["fp32"] == 19.5 and a100["peak_tflops"]["tf32_tensor"] == 156
    v100 = find_gpu("Tesla V100-SXM2-16GB")
    assert v100["dram_gbps"] == 900 and v100["peak_tflops"]["fp32"] == 15.7
    assert find_gpu("Tesla K80")["peak_tflops"]["fp32"] == 8.73 / 2
    assert find_gpu("Tesla P100-PCIE-12GB")["dram_gbps"] == 549
    assert find_gpu("NVIDIA L4")["peak_tflops"]["fp8_tensor"] == 485 / 2
    assert find_gpu("Tesla T4")["host_link"] == {"name": "PCIe 3.0 x16", "gbps": 15.75}
    assert find_gpu("NVIDIA H100 PCIe")["host_link"]["gbps"] == 63.0
    assert find_gpu("NVIDIA GH200 480GB")["host_link"]["name"] == "NVLink-C2C"
    assert "PCI-SIG" in find_gpu("Tesla T4")["sources"]["host_link"]  # the shared [pcie] text is filled in


def test_gpu_for_trace_prefers_gpu_option_and_explains():
    trace = Trace(None, TraceMeta(devices=[Device(id=0, name="Tesla V100-SXM2-16GB")]))
    spec, how = gpu_for_trace(trace)
    assert spec["name"] == "V100 SXM2" and "Tesla V100-SXM2-16GB" in how
    spec, how = gpu_for_trace(trace, "a100 80gb pcie")
    assert spec["name"] == "A100 PCIe 80GB" and how == "A100 PCIe 80GB (from --gpu)"
    with pytest.raises(InputError, match=r"^--gpu 'B9000': not in the GPU catalog \(known: A100 PCIe 40GB, "):
        gpu_for_trace(trace, "B9000")


def test_unknown_gpu_option_exits_2(store):
    path = FIXTURES / "ncu" / "handwritten" / "raw_2021_scaled_units.csv"
    code, _, err = run_cli("analyze", str(path), "--gpu", "Voodoo5")
    assert code == 2
    assert err.startswith("traceparse: error: --gpu 'Voodoo5': not in the GPU catalog (known: ")


class _ExtraGPU:
    """A third-party plugin adding a GPU through the hook, as docs/gpu_catalog.md shows."""

    __name__ = "extra_gpu"

    @staticmethod
    @hookimpl
    def traceparse_gpu_specs():
        return [{"name": "RTX 4090", "match": ["rtx 4090"], "sm_count": 128, "memory_gb": 24, "dram_gbps": 1008,
                 "peak_tflops": {"fp32": 82.6}, "host_link": {"name": "PCIe 4.0 x16", "gbps": 31.5},
                 "sources": {"peak_tflops": "NVIDIA Ada whitepaper"}}]


def test_a_plugin_can_add_a_gpu():
    reg = reset_registry([_ExtraGPU()])
    try:
        spec = find_gpu("NVIDIA GeForce RTX 4090", reg)
        assert spec["name"] == "RTX 4090" and spec["dram_gbps"] == 1008
        assert find_gpu("NVIDIA H100 80GB HBM3", reg)["name"] == "H100 SXM"
    finally:
        reset_registry()
