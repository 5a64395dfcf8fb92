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
    # consumer and workstation boards, as nvidia-smi and torch.cuda.get_device_name() print them
    "NVIDIA GeForce RTX 3090": "RTX 3090",
    "NVIDIA GeForce RTX 3070": "RTX 3070",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA GeForce RTX 4080": "RTX 4080",
    "NVIDIA GeForce RTX 4070 Ti": "RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070": "RTX 4070",
    "NVIDIA GeForce RTX 5090": "RTX 5090",
    "NVIDIA GeForce RTX 5080": "RTX 5080",
    "NVIDIA GeForce RTX 5070 Ti": "RTX 5070 Ti",
    "NVIDIA GeForce RTX 5070": "RTX 5070",
    "NVIDIA RTX A6000": "RTX A6000",
    "NVIDIA RTX A5000": "RTX A5000",
    "NVIDIA RTX A4000": "RTX A4000",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
    "NVIDIA RTX 5000 Ada Generation": "RTX 5000 Ada",
    "NVIDIA RTX 4000 Ada Generation": "RTX 4000 Ada",
}


@pytest.mark.parametrize("device_name, entry", sorted(DEVICE_NAMES.items()))
def test_real_device_names_match(device_name, entry):
    spec = find_gpu(device_name)
    assert spec is not None and spec["name"] == entry


@pytest.mark.parametrize("device_name", [
    "Intel(R) Data Center GPU Max 1550", "",
    # other chips, or other boards, behind a catalog entry's name: never taken for it
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 4070 Ti SUPER", "NVIDIA GeForce RTX 4070 SUPER", "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA RTX 4000 SFF Ada Generation", "NVIDIA RTX A5000 Laptop GPU", "Quadro RTX 6000",
    "NVIDIA GeForce RTX 5070 Ti Laptop GPU"])
def test_unknown_devices_do_not_match(device_name):
    assert find_gpu(device_name) is None


#: Spec-sheet facts of the consumer and workstation boards, typed here from NVIDIA's specification pages and
#: data sheets: CUDA cores, boost clock (MHz), memory interface (bits) and data rate (Gbps), and the FP32
#: TFLOPS NVIDIA states. The catalog's SM count, bandwidth and FP32 peak must follow from them.
SPEC_SHEETS = {
    "RTX 3090": (10496, 1695, 384, 19.5, 35.58), "RTX 3070": (5888, 1725, 256, 14, 20.31),
    "RTX 4090": (16384, 2520, 384, 21, 82.58), "RTX 4080": (9728, 2505, 256, 22.4, 48.74),
    "RTX 4070 Ti": (7680, 2610, 192, 21, 40.09), "RTX 4070": (5888, 2475, 192, 21, 29.15),
    "RTX 5090": (21760, 2407, 512, 28, 104.8), "RTX 5080": (10752, 2617, 256, 30, 56.28),
    "RTX 5070 Ti": (8960, 2452, 256, 28, 43.94), "RTX 5070": (6144, 2512, 192, 28, 30.87),
    "RTX A6000": (10752, 1800, 384, 16, 38.71), "RTX A5000": (8192, 1695, 384, 16, 27.77),
    "RTX A4000": (6144, 1560, 256, 14, 19.17), "RTX 6000 Ada": (18176, 2505, 384, 20, 91.06),
    "RTX 5000 Ada": (12800, 2550, 256, 18, 65.28), "RTX 4000 Ada": (6144, 2175, 160, 18, 26.73),
}


@pytest.mark.parametrize("name", sorted(SPEC_SHEETS))
def test_consumer_and_workstation_figures_follow_from_the_spec_sheets(name):
    cores, boost, bus, rate, fp32 = SPEC_SHEETS[name]
    entry = next(e for e in load_catalog() if e["name"] == name)
    assert entry["sm_count"] == cores // 128  # 128 FP32 cores per SM on GA10x, AD10x and GB20x
    assert entry["clocks"]["boost_mhz"] == boost
    assert entry["dram_gbps"] == pytest.approx(bus * rate / 8, rel=1e-9)
    assert entry["peak_tflops"]["fp32"] == pytest.approx(cores * 2 * boost / 1e6, rel=5e-4)
    assert entry["peak_tflops"]["fp32"] == pytest.approx(fp32, rel=5e-4)
    assert entry["exclude"] and "laptop" in entry["exclude"]


def test_tensor_peaks_of_consumer_boards_against_the_whitepapers():
    """Dense tensor peaks as NVIDIA's whitepapers and data sheets give them (sparsity figures halved here): GeForce
    runs FP16 with FP32 accumulate at half the FP16-accumulate rate, RTX A-series at full rate."""
    rtx4090 = find_gpu("NVIDIA GeForce RTX 4090")["peak_tflops"]  # Ada whitepaper: 165.2 / 82.6 / 660.6
    assert (rtx4090["fp16_tensor"], rtx4090["tf32_tensor"], rtx4090["int8_tensor"]) == pytest.approx(
        (165.2, 82.6, 660.6), rel=1e-3)
    rtx3090 = find_gpu("NVIDIA GeForce RTX 3090")["peak_tflops"]  # GA102 whitepaper: 71 / 35.6 / 284
    assert (rtx3090["fp16_tensor"], rtx3090["tf32_tensor"], rtx3090["int8_tensor"]) == pytest.approx(
        (71.0, 35.6, 284.0), rel=3e-3)
    a6000 = find_gpu("NVIDIA RTX A6000")["peak_tflops"]  # data sheet: 309.7 tensor TFLOPS with sparsity
    assert a6000["fp16_tensor"] == pytest.approx(309.7 / 2, rel=1e-3)
    for name in ("NVIDIA GeForce RTX 5090", "NVIDIA RTX 6000 Ada Generation"):  # no dense figure published
        assert not [p for p in find_gpu(name)["peak_tflops"] if p.endswith("_tensor")]


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
    assert spec["name"] == "A100 PCIe 80GB" and how == "A100 PCIe 80GB (from gpu=)"  # Python's spelling
    with pytest.raises(InputError, match=r"^gpu='B9000': not in the GPU catalog \(known: A100 PCIe 40GB, "):
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
        return [{"name": "RTX 3080 Ti", "match": ["rtx 3080 ti"], "sm_count": 80, "memory_gb": 12, "dram_gbps": 912,
                 "peak_tflops": {"fp32": 34.1}, "host_link": {"name": "PCIe 4.0 x16", "gbps": 31.5},
                 "sources": {"peak_tflops": "NVIDIA GA102 whitepaper"}}]


def test_a_plugin_can_add_a_gpu():
    reg = reset_registry([_ExtraGPU()])
    try:
        spec = find_gpu("NVIDIA GeForce RTX 3080 Ti", reg)
        assert spec["name"] == "RTX 3080 Ti" and spec["dram_gbps"] == 912
        assert find_gpu("NVIDIA H100 80GB HBM3", reg)["name"] == "H100 SXM"
    finally:
        reset_registry()


# -- peaks given by hand (--peak-flops, --peak-bw) ---------------------------------------------------------
NCU_PAGE = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"


def _roofline(store, *args: str) -> dict:
    import json

    code, out, err = run_cli("--store", str(store), "roofline", str(NCU_PAGE), "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_peaks_by_hand_replace_the_catalogs_on_the_roofline(tmp_path):
    catalog = _roofline(tmp_path)
    assert catalog["gpu"] == "H100 SXM"
    # the kernels held to the FP32 roof alone (others mix precisions, whose roof is a blend of peaks)
    fp32 = [i for i in catalog["items"] if i["precision"] == "fp32" and i["peak_gflops"] == 67_000.0]
    assert len(fp32) > 3 and {i["peak_gbps"] for i in fp32} == {3350.0}  # the H100 SXM data sheet's figures
    hand = _roofline(tmp_path, "--peak-flops", "fp32=1000", "--peak-bw", "100")
    assert hand["gpu"] == "H100 SXM, peaks by hand"
    assert hand["gpu_source"].startswith("peaks given by hand: fp32 1,000 GFLOP/s, DRAM 100 GB/s; the rest from "
                                         "H100 SXM (matched the trace's device")
    by_name = {i["name"]: i for i in hand["items"]}
    for item in fp32:
        mine = by_name[item["name"]]
        assert (mine["peak_gflops"], mine["peak_gbps"], mine["ridge_ai"]) == (1000.0, 100.0, 10.0)
        assert mine["bound"] == ("memory" if mine["arithmetic_intensity"] < 10.0 else "compute")
        assert mine["arithmetic_intensity"] == item["arithmetic_intensity"]  # the trace's own figures are kept
    tensor = [i for i in hand["items"] if i["precision"] == "tf32_tensor"]
    assert tensor and all(i["peak_gbps"] == 100.0 for i in tensor)  # the bandwidth is every kernel's
    assert all(i["peak_gflops"] > 1000.0 for i in tensor)  # its compute roof stays the catalog's tf32 peak


def test_peaks_by_hand_stand_alone_for_a_gpu_the_catalog_lacks():
    from traceparse.catalog import GpuChoice

    trace = Trace(None, TraceMeta(devices=[Device(id=0, name="Voodoo5 6000")]))
    spec, how = gpu_for_trace(trace, GpuChoice(peak_gflops=(("fp32", 5000.0),), dram_gbps=200.0))
    assert spec["name"] == "peaks given by hand"
    assert spec["peak_tflops"] == {"fp32": 5.0} and spec["dram_gbps"] == 200.0
    assert how == ("peaks given by hand: fp32 5,000 GFLOP/s, DRAM 200 GB/s (the trace's GPU 'Voodoo5 6000' is not "
                   "in the catalog; pass gpu=NAME)")
    assert gpu_for_trace(trace, GpuChoice()) == (None, "the trace's GPU 'Voodoo5 6000' is not in the catalog; "
                                                       "pass gpu=NAME")


def test_analyze_takes_peaks_by_hand(store):
    import json

    code, out, err = run_cli("analyze", str(NCU_PAGE), "--rule", "arithmetic-intensity", "--json",
                             "--gpu", "a100", "--peak-bw", "1000")
    assert code in (0, 1), err
    finding = json.loads(out)["findings"][0]
    assert finding["metrics"]["gpu"] == "A100 SXM4 40GB, peaks by hand"
    assert finding["metrics"]["gpu_source"] == ("peaks given by hand: DRAM 1,000 GB/s; the rest from A100 SXM4 40GB "
                                                "(from --gpu)")


@pytest.mark.parametrize("command", ["analyze", "roofline"])
@pytest.mark.parametrize("args, message", [
    (["--peak-flops", "fp32"], "argument --peak-flops: expected PRECISION=GFLOPS with PRECISION one of fp64, fp32, "
                               "fp16, bf16, fp64_tensor, fp32_tensor, tf32_tensor, fp16_tensor, bf16_tensor, "
                               "fp8_tensor, int8_tensor, got 'fp32'"),
    (["--peak-flops", "tf33=5"], "argument --peak-flops: expected PRECISION=GFLOPS with PRECISION one of fp64, fp32, "
                                 "fp16, bf16, fp64_tensor, fp32_tensor, tf32_tensor, fp16_tensor, bf16_tensor, "
                                 "fp8_tensor, int8_tensor, got 'tf33=5'"),
    (["--peak-flops", "fp32=-5"], "argument --peak-flops: expected a positive number of GFLOPS, got 'fp32=-5'"),
    (["--peak-flops", "fp32=lots"], "argument --peak-flops: expected a positive number of GFLOPS, got 'fp32=lots'"),
    (["--peak-bw", "0"], "argument --peak-bw: expected a positive number of GB/s, got '0'"),
    (["--peak-bw", "inf"], "argument --peak-bw: expected a positive number of GB/s, got 'inf'"),
])
def test_bad_peaks_are_one_line_errors(tmp_path, capsys, command, args, message):
    from traceparse.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--store", str(tmp_path), command, str(NCU_PAGE), *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"traceparse {command}: error: {message}"


def test_b200_from_a_real_trace():
    """A B200 (a real torch.profiler trace's deviceProperties: AMD-AGI/TraceLens tests/traces/b200) was not in the
    catalog, so its roofline had no roofs. A GB200's B200 (higher clocks and peaks) is not taken for it."""
    from traceparse.catalog import find_gpu

    spec = find_gpu("NVIDIA B200")
    assert spec["name"] == "B200" and spec["sm_count"] == 148 and spec["compute_capability"] == "10.0"
    assert spec["peak_tflops"]["bf16_tensor"] == 4500.0 / 2  # NVIDIA's 4.5 PFLOPS is with sparsity
    assert find_gpu("NVIDIA GB200") is None or find_gpu("NVIDIA GB200")["name"] != "B200"
