"""Every rule on the public ROCm torch.profiler traces (issue 17, "Done when"), against independent computations.

The expected figures are computed here in plain Python over the raw JSON (``parse_float=Decimal``, microseconds
to integer ns by :func:`helpers.us_to_ns`), never by traceparse: kernel time per category (by a small
classifier of the ROCm library names written here: rocBLAS/hipBLASLt ``Cijk_*`` GEMMs, MIOpen ``igemm_*``
convolutions and transposes, CK / Triton attention), HIP API time per class, per-device GPU span/busy/idle on the
device ids the trace writes (device 2 on the MI250 trace), launch statistics from correlation ids, the copies'
time and overlap. The GPU must be identified as the right AMD Instinct entry and named. Finally an NVIDIA-shaped
copy of the MI250 trace (HIP names replaced by their CUDA twins, the device renamed) must give the same figures
from every rule: ROCm is read like CUDA.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli, run_rule, union, us_to_ns
from traceparse.analysis import analyze
from traceparse.catalog import gpu_for_trace
from traceparse.ingest import read_paths

ROCM_DIR = FIXTURES / "torch" / "rocm"
MI250 = ROCM_DIR / "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
MI210 = ROCM_DIR / "tracelens_mi210_gpu_only.json.gz"
MI300X_TRITON = ROCM_DIR / "tracelens_mi300x_torch_compile_triton.json.gz"
MI300X_BERT = ROCM_DIR / "tracelens_mi300x_vf_bert_small.json.gz"
ROCM = [MI250, MI210, MI300X_TRITON, MI300X_BERT]
#: The catalog entry each trace's device is, and how its deviceProperties say so.
EXPECTED_GPU = {MI250.name: "MI250 GCD", MI210.name: "MI210", MI300X_TRITON.name: "MI300X",
                MI300X_BERT.name: "MI300X"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def events(path: Path, *cats: str) -> list[dict]:
    return [e for e in raw(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def span(e: dict) -> tuple[int, int]:
    start = us_to_ns(e["ts"])
    return start, start + us_to_ns(e["dur"])


# -- independent classifiers -----------------------------------------------------------------------------
def category(name: str) -> str:
    """What a ROCm trace's kernel is, by the library that wrote it (first test wins)."""
    n = name.lower()
    if name.startswith("Cijk_"):                 # rocBLAS / hipBLASLt Tensile GEMMs
        return "gemm"
    if name.startswith("igemm_"):                # MIOpen implicit-GEMM convolutions (fwd, bwd, wrw)
        return "convolution"
    if name == "attn_fwd" or name.startswith("ck_fmha") or "fmha" in n:  # Triton / CK flash attention
        return "attention"
    if name.startswith("triton_"):               # Inductor pointwise / reduction kernels
        return "triton-fused"
    if "batch_norm" in n or "layer_norm" in n:
        return "normalization"
    if "max_pool" in n:
        return "pooling"
    if "multi_tensor_apply" in n:
        return "optimizer"
    if "indexselect" in n:
        return "embedding"
    if name.startswith("batched_transpose") or "direct_copy_kernel" in n:  # MIOpen layout transposes, copies
        return "layout/copy"
    if "reduce_kernel" in n:
        return "reduction/softmax"
    if "elementwise" in n or name.startswith("SubTensorOp"):  # torch's and MIOpen's tensor ops
        return "elementwise"
    return "other"


def api_class(name: str) -> str:
    if re.match(r"hip\w*Launch", name):
        return "launch"
    if name.startswith("hipMemcpy"):
        return "memcpy"
    if re.match(r"hip\w*Synchronize", name):
        return "synchronize"
    if name.startswith(("hipMalloc", "hipFree")):
        return "allocation"
    return "other"


# -- every rule runs, names its devices ------------------------------------------------------------------
@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_every_rule_runs_through_the_cli(tmp_path, path):
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", str(path))
    assert code == 0, err
    assert "Traceback" not in err
    findings = json.loads(out)["findings"]
    rules = {f["rule"] for f in findings}
    assert {"kernel-share", "api-share", "gpu-idle", "launch-stats", "arithmetic-intensity",
            "low-kernel-concurrency", "hotspots"} <= rules
    gpu_events = events(path, *GPU_CATS)
    devices = {str(e["args"]["device"]) for e in gpu_events}

    def no_null_device(obj):  # no rule reports a null device when every GPU event names one
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key in ("device", "device_id"):
                    assert value is not None and str(value) != "None", (obj, path.name)
                no_null_device(value)
        elif isinstance(obj, list):
            for value in obj:
                no_null_device(value)

    for f in findings:
        if f["rule"] != "memory":  # memory samples of the host are "host" by design
            no_null_device(f["items"])
            no_null_device(f["metrics"])
    idle = next(f for f in findings if f["rule"] == "gpu-idle")
    assert set(idle["metrics"]["devices"]) == devices
    assert "None" not in idle["message"]


@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_device_is_identified_as_its_amd_instinct(path):
    trace = read_paths([path])[0]
    props = raw(path)["deviceProperties"]
    spec, how = gpu_for_trace(trace)
    assert spec is not None and spec["name"] == EXPECTED_GPU[path.name], how
    # the properties that identify it, from the raw deviceProperties
    want = spec["identify"]
    assert props[0]["warpSize"] == want["warp_size"] == 64
    assert props[0]["numSms"] == want["sm_count"] == spec["sm_count"]
    assert f"{props[0]['computeMajor']}.{props[0]['computeMinor']}" == want["compute_capability"]
    assert abs(props[0]["totalGlobalMem"] / 2**30 - want["memory_gib"]) <= 0.03 * want["memory_gib"]
    if props[0]["name"] == "AMD Radeon Graphics":  # the generic name: identified by properties, and says so
        assert "identified from the trace's device 'AMD Radeon Graphics' by its properties" in how
        assert "104 compute units, 64 GiB, warp size 64, compute capability 9.0" in how
        assert "MI250 GCD and MI210 have these properties" in how  # the look-alike is named, not hidden
    else:
        assert f"matched the trace's device {props[0]['name']!r}" in how
    # named in the findings that use the catalog
    finding = run_rule(trace, "arithmetic-intensity")
    assert finding.metrics["gpu"] == EXPECTED_GPU[path.name]
    assert finding.metrics["gpu_source"] == how
    assert [d.name for d in trace.meta.devices] == [p["name"] for p in props]


# -- kernel-share --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_kernel_share(path):
    kernels = events(path, "kernel")
    total = sum(us_to_ns(e["dur"]) for e in kernels)
    by_cat: dict[str, dict] = defaultdict(lambda: {"calls": 0, "time_ns": 0, "kernels": set()})
    for e in kernels:
        c = by_cat[category(e["name"])]
        c["calls"] += 1
        c["time_ns"] += us_to_ns(e["dur"])
        c["kernels"].add(e["name"])
    assert "other" not in by_cat, [e["name"] for e in kernels if category(e["name"]) == "other"]
    finding = run_rule(read_paths([path])[0], "kernel-share", "kernel-share.top=1000")
    m = finding.metrics
    assert m["kernel_time_ns"] == total
    assert m["calls"] == len(kernels) and m["kernels"] == len({e["name"] for e in kernels})
    assert set(m["categories"]) == set(by_cat)
    for cat, want in by_cat.items():
        got = m["categories"][cat]
        assert (got["calls"], got["time_ns"], got["kernels"]) == (want["calls"], want["time_ns"],
                                                                  len(want["kernels"])), cat
        assert got["share_pct"] == pytest.approx(100 * want["time_ns"] / total, abs=1e-4)
    # each kernel's row, its category as classified here
    assert {i["name"]: i["category"] for i in finding.items} == {e["name"]: category(e["name"]) for e in kernels}
    # no ROCm GEMM is "other": every Cijk_ kernel is a GEMM
    cijk = sum(us_to_ns(e["dur"]) for e in kernels if e["name"].startswith("Cijk_"))
    assert cijk > 0 and m["categories"]["gemm"]["time_ns"] >= cijk


def test_kernel_categories_of_rocm_libraries():
    """Names the fixtures lack: CK attention and GEMMs, MIOpen batch norm and naive convolution."""
    import polars as pl

    from traceparse.expr import kernel_category

    names = {
        "ck_fmha_fwd_hdim128_bf16_batch_b128x128x32": "attention",
        "fmha_fwd_d128_bf16_batch_b128x128x32x128x32x128_r4x1x1_w32x32x16_qr_async_vr_psddv_nlogits_nbias": "attention",
        "_ZN2ck27kernel_gemm_xdl_cshuffle_v3": "gemm",
        "MIOpenBatchNormFwdTrainSpatial": "normalization",
        "MIOpenBatchNormBwdSpatial": "normalization",
        "naive_conv_fwd_nchw_float_double_float": "convolution",
        "MIOpenConvUni": "convolution",
        "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0": "gemm",
    }
    got = pl.DataFrame({"name": list(names)}).select(kernel_category(pl.col("name")).alias("c"))["c"].to_list()
    assert dict(zip(names, got)) == names


# -- api-share -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_api_share(path):
    calls = events(path, "cuda_runtime", "cuda_driver")
    per_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    per_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in calls:
        for table, key in ((per_name, e["name"]), (per_class, api_class(e["name"]))):
            table[key][0] += 1
            table[key][1] += us_to_ns(e["dur"])
    total = sum(t for _, t in per_name.values())
    finding = run_rule(read_paths([path])[0], "api-share", "api-share.top=1000")
    m = finding.metrics
    assert (m["api_time_ns"], m["api_calls"], m["api_names"]) == (total, len(calls), len(per_name))
    for cls in ("launch", "memcpy", "synchronize", "allocation", "other"):
        want = per_class.get(cls, [0, 0])
        assert [m["classes"][cls]["calls"], m["classes"][cls]["time_ns"]] == want, cls
    assert m["classes"]["graph_launch"]["calls"] == 0
    items = {i["name"]: (i["class"], i["calls"], i["time_ns"]) for i in finding.items}
    assert items == {n: (api_class(n), c, t) for n, (c, t) in per_name.items()}
    # the HIP names this issue is about
    for name, cls in (("hipLaunchKernel", "launch"), ("hipExtModuleLaunchKernel", "launch"),
                      ("hipModuleLaunchKernel", "launch"), ("hipMemcpyWithStream", "memcpy"),
                      ("hipDeviceSynchronize", "synchronize"), ("hipMalloc", "allocation")):
        if name in items:
            assert items[name][0] == cls


# -- gpu-idle ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_gpu_idle_per_device_as_written(path):
    per_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events(path, *GPU_CATS):
        per_device[e["args"]["device"]].append(span(e))
    expected = {}
    for device, spans in per_device.items():
        busy = sum(e - s for s, e in union(spans))
        whole = max(e for _, e in spans) - min(s for s, _ in spans)
        expected[str(device)] = {"span_ns": whole, "busy_ns": busy, "idle_ns": whole - busy}
    if path == MI250:
        assert set(expected) == {"2"}  # kernels run on device 2 while deviceProperties number from 0
    m = run_rule(read_paths([path])[0], "gpu-idle").metrics
    assert set(m["devices"]) == set(expected)
    for device, want in expected.items():
        got = m["devices"][device]
        assert {k: got[k] for k in want} == want, device
    assert m["span_ns"] == sum(w["span_ns"] for w in expected.values())
    assert m["busy_ns"] == sum(w["busy_ns"] for w in expected.values())


# -- launch-stats --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_launch_stats_link_kernels_to_hip_launches(path):
    launches = {e["args"]["correlation"]: e for e in events(path, "cuda_runtime", "cuda_driver")
                if api_class(e["name"]) == "launch"}
    kernels = events(path, "kernel")
    linked = [(k, launches[k["args"]["correlation"]]) for k in kernels if k["args"].get("correlation") in launches]
    assert len(linked) == len(kernels)  # every kernel of these traces has its HIP launch call
    used = {id(launch): launch for _, launch in linked}
    delays = sorted(span(k)[0] - span(l)[0] for k, l in linked)
    short = sum(1 for k, l in linked if us_to_ns(k["dur"]) < us_to_ns(l["dur"]))
    m = run_rule(read_paths([path])[0], "launch-stats").metrics
    assert (m["kernels"], m["linked_kernels"], m["direct_kernels"]) == (len(kernels),) * 3
    assert m["launches"] == len(used)
    assert m["launch_time_ns"] == sum(us_to_ns(l["dur"]) for l in used.values())
    assert (m["delay_ns_min"], m["delay_ns_max"]) == (delays[0], delays[-1])
    assert m["delay_ns_p50"] == delays[-(-len(delays) // 2) - 1]  # nearest rank: position ceil(n/2)
    assert m["short_kernel_pct"] == pytest.approx(100 * short / len(kernels), abs=1e-4)
    assert m["graph_launches"] == 0


# -- copies --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [MI250, MI300X_BERT], ids=lambda p: p.name)
def test_memcpy_rules(path):
    copies = events(path, "gpu_memcpy")
    assert copies
    kernels = union([span(e) for e in events(path, "kernel")])
    copy_ns = sum(us_to_ns(e["dur"]) for e in copies)
    overlapped = 0
    for start, end in union([span(e) for e in copies]):
        overlapped += sum(max(0, min(end, ke) - max(start, ks)) for ks, ke in kernels)
    trace = read_paths([path])[0]
    m = run_rule(trace, "low-memcpy-overlap").metrics
    assert (m["memcpy_time_ns"], m["overlapped_ns"]) == (copy_ns, overlapped)
    devices = Counter(str(e["args"]["device"]) for e in copies)
    assert {d: v["copies"] for d, v in m["devices"].items()} == dict(devices)
    kernel_busy = sum(e - s for s, e in kernels)
    assert m["memcpy_to_kernel_ratio"] == pytest.approx(copy_ns / kernel_busy, abs=1e-4)
    # the copies' direction as written (args.kind), their sizes where written
    ev = trace.events
    import polars as pl

    rows = ev.filter(pl.col("kind") == "memcpy")
    assert rows["copy_kind"].cast(str).to_list() == [e["args"]["kind"] for e in copies]
    assert rows["bytes"].to_list() == [int(e["args"]["bytes"]) if "bytes" in e["args"] else None for e in copies]
    assert rows["device_id"].to_list() == [e["args"]["device"] for e in copies]
    throughput = run_rule(trace, "low-memcpy-throughput")
    host_device = [e for e in copies if e["args"]["kind"] in ("HtoD", "DtoH")]
    sized = [e for e in host_device if "bytes" in e["args"]]
    assert throughput.metrics["skipped_copies"] == len(host_device) - len(sized)
    if path == MI300X_BERT:  # one 1-byte DtoD copy, against the MI300X's HBM bandwidth from the catalog
        (d2d,) = copies
        assert "5,300 GB/s" in throughput.message and "MI300X" in throughput.message
        gbps = int(d2d["args"]["bytes"]) / us_to_ns(d2d["dur"])  # bytes per ns = GB/s
        (item,) = [i for i in throughput.items if i["copy_kind"] == "DtoD"]
        assert (item["copies"], item["bytes"], item["time_ns"]) == (1, 1, us_to_ns(d2d["dur"]))
        # the rule rounds to 4 decimals, or to 4 significant figures where those are more
        assert item["achieved_gbps"] == round(gbps, max(4, 3 - math.floor(math.log10(gbps))))
        assert item["peak_gbps"] == 5300  # the MI300X's HBM bandwidth, catalog dram_gbps
        assert item["pct_of_peak"] == pytest.approx(100 * 2 * gbps / 5300, abs=1e-4)  # read + write


# -- the same trace, written by CUDA -------------------------------------------------------------------------
# hipMemcpyWithStream copies and waits for the copy (PyTorch's memcpy_and_sync on ROCm): the blocking cudaMemcpy
CUDA_TWIN = {"hipLaunchKernel": "cudaLaunchKernel", "hipExtModuleLaunchKernel": "cuLaunchKernel",
             "hipMemcpyWithStream": "cudaMemcpy", "hipDeviceSynchronize": "cudaDeviceSynchronize",
             "hipGetDevicePropertiesR0600": "cudaGetDeviceProperties"}


def twin_names(value):
    """``value`` with every HIP API name (a string, or a dict key) replaced by its CUDA twin, at any depth."""
    if isinstance(value, dict):
        return {twin_names(k): twin_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [twin_names(v) for v in value]
    return CUDA_TWIN.get(value, value) if isinstance(value, str) else value


def test_rocm_reads_like_the_same_trace_from_cuda(tmp_path):
    """The MI250 trace and its NVIDIA twin (HIP calls renamed to their CUDA twins, the device named an A100, warp
    size 32): every rule gives the same figures, except those that name the GPU and its peaks."""
    data = raw(MI250)
    for e in data["traceEvents"]:
        if e.get("name") in CUDA_TWIN:
            e["name"] = CUDA_TWIN[e["name"]]
    for props in data["deviceProperties"]:
        props.update(name="NVIDIA A100-SXM4-80GB", warpSize=32, numSms=108, computeMajor=8, computeMinor=0)
    twin = tmp_path / "cuda_twin.json"
    twin.write_text(json.dumps(data, default=str))
    rocm, cuda = read_paths([MI250])[0], read_paths([twin])[0]
    rocm_findings = {(f.rule, f.title): f for f in analyze(rocm)}
    cuda_findings = {(f.rule, f.title): f for f in analyze(cuda)}
    assert set(rocm_findings) == set(cuda_findings)
    named_gpu = {"gpu", "gpu_source", "peak_gbps", "peak_source", "sm_count"}  # the twin says 108 SMs, MI250 104
    peak_figures = {"peak_gflops", "ridge_ai", "roof_pct", "bound"}  # the roofline's figures against each GPU's peaks
    for key, r in rocm_findings.items():
        c = cuda_findings[key]
        assert r.severity == c.severity, key
        # the API calls keep their own names wherever a metric names them (gpu-idle's host activity, the
        # critical path's parts): the HIP name is the CUDA one
        assert twin_names({k: v for k, v in r.metrics.items() if k not in named_gpu | peak_figures}) == \
               {k: v for k, v in c.metrics.items() if k not in named_gpu | peak_figures}, key
        strip = (lambda items: [{k: (CUDA_TWIN.get(v, v) if isinstance(v, str) else v) for k, v in i.items()
                                 if k not in named_gpu | peak_figures} for i in items])
        assert strip(r.items) == strip(c.items), key
    roof = ("arithmetic-intensity", "Roofline: arithmetic intensity and attained performance")  # from the shapes
    assert rocm_findings[roof].metrics["gpu"] == "MI250 GCD" and cuda_findings[roof].metrics["gpu"] == "A100 SXM4 80GB"
    assert rocm_findings[roof].metrics["derived_from"] == "shapes"
