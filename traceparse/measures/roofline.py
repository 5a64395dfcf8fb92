"""The roofline of a trace: FLOPs by precision, DRAM bytes and time per kernel, against a GPU's peaks.

The definitions (counters used, tensor-core evidence, lower bounds, the
figures) are in docs/roofline.md and in the ``arithmetic-intensity`` rule's
definition, which reports them; the ``roofline`` command plots them. This is
not a partitioned :class:`~traceparse.measures.Measure`: ``model_gflops``
spreads the FLOPs the counters miss over the whole trace's kernels.
"""

from __future__ import annotations

import re

import polars as pl

from traceparse.measures import op_flops, op_work

SASS = {  # precision -> x in {prefix}__sass_thread_inst_executed_op_{x}{add,mul,fma}_pred_on.sum
    "fp64": "d", "fp32": "f", "fp16": "h",
}
SASS_METRIC = re.compile(r"^(?P<prefix>sm|smsp)__sass_thread_inst_executed_op_(?P<x>[dfh])(?P<op>add|mul|fma)_pred_on\.sum$")
NVPROF_FLOPS = {"flop_count_dp": "fp64", "flop_count_sp": "fp32", "flop_count_hp": "fp16"}
TENSOR_OPS = re.compile(r"^(?P<prefix>sm|smsp)__ops_path_tensor_(?:op_(?P<op>[a-z0-9]+)_)?src_(?P<src>[a-z0-9]+)"
                        r"(?:_dst_(?P<dst>[a-z0-9]+))?(?:_sparsity_(?P<sparsity>on|off))?\.sum$")
TENSOR_SRC = {"tf32": "tf32_tensor", "fp16": "fp16_tensor", "bf16": "bf16_tensor", "fp8": "fp8_tensor",
              "fp64": "fp64_tensor", "int8": "int8_tensor"}
GMMA = ("sm__inst_executed_pipe_tensor_op_gmma.sum", "smsp__inst_executed_pipe_tensor_op_gmma.sum")
DRAM_READ_WRITE = ("dram__bytes_read.sum", "dram__bytes_write.sum")
DRAM_TOTAL = "dram__bytes.sum"
NVPROF_TRANSACTIONS = ("dram_read_transactions", "dram_write_transactions")
NVPROF_BYTES = ("dram_read_bytes", "dram_write_bytes")
SM_CLOCK = ("sm__cycles_elapsed.avg.per_second", "SM Frequency")

#: A kernel name whose template arguments are float and none half-precision (``CUDAFunctor_add<float>``): its
#: half-precision FMA counts are HFMA2.MMA register moves (sm_80+), not FLOPs. 21 such kernels of the VGG11 ncu
#: fixture read twice as many "fp16" FLOPs as fp32 ones, an fp32 add labelled fp16 at three times its work.
FLOAT_TYPED = re.compile(r"\bfloat\b")
HALF_TYPED = re.compile(r"half|bf16|bfloat16|__nv_bfloat|fp16|f16|hmma", re.I)
MATMUL_NAME = re.compile(r"gemm|conv|fprop|dgrad|wgrad|mma|matmul|attention|flash|xmma|cutlass|cudnn|cublas", re.I)
TENSOR_NAME = re.compile(r"tf32|tfloat32|bfloat16|half_t|hmma|gmma|imma|dmma|tensorop|tensor_op|tensor\d+x\d+x\d+|bf16|f16f16|fp16|_f16|"
                         r"e4m3|e5m2|fp8|int8|(?<![a-z])[hsidb]\d{3,5}(?=gemm|conv|fprop|dgrad|wgrad|_)", re.I)
SIMT_NAME = re.compile(r"_ffma_|sgemm|dgemm|simt|gemv|gemmsn|gemmk1", re.I)
NAME_PRECISION = (  # first match wins
    (re.compile(r"tf32|tfloat32", re.I), "tf32_tensor"),
    (re.compile(r"bf16|bfloat16", re.I), "bf16_tensor"),
    (re.compile(r"e4m3|e5m2|fp8", re.I), "fp8_tensor"),
    (re.compile(r"int8|imma|i8i8|(?<![a-z])i\d{3,5}", re.I), "int8_tensor"),
    (re.compile(r"dmma|(?<![a-z])d\d{3,5}", re.I), "fp64_tensor"),
)
#: cuBLAS's JIT-built Hopper/Blackwell GEMMs (``nvjet_sm90_tst_256x128_...``): tensor-core kernels (WGMMA/UMMA
#: only), their name's letters the types of the operands, the compute and the output (``hsh``, ``tst``; FP8
#: GEMMs name both operands first: ``qqtst``). What each operand letter is, read off real kernels
#: (fixtures/make_gemm_kernel_trace.py, an H200 with CUDA 13): h fp16, t bf16, q e4m3, r e5m2; fp32 GEMMs ran as
#: ``sm80_xmma_gemm_..._ffma`` (SIMT) and, with TF32, ``sm90_xmma_gemm_f32f32_tf32f32_...``, not as nvjet.
NVJET_NAME = re.compile(r"(?:^|[^a-z])nvjet_(?:sm\d+_)?(?P<types>[a-z]{3,5})_", re.I)
NVJET_OPERAND_PRECISION = {"h": "fp16_tensor", "t": "bf16_tensor", "q": "fp8_tensor", "r": "fp8_tensor"}
DEFAULT_TENSOR_PRECISION = "fp16_tensor"
#: roof_pct above this (measurement noise allowed for) means the peaks cannot be the GPU's
ABOVE_ROOF_PCT = 105.0
PRECISION_SRC = {v: k for k, v in TENSOR_SRC.items()}


def uses_tensor_cores_by_name(name: str | None) -> bool:
    """True when a kernel name says it runs MMA instructions on tensor cores (see the module docstring)."""
    if not name:
        return False
    if NVJET_NAME.search(name):
        return True
    return bool(MATMUL_NAME.search(name) and TENSOR_NAME.search(name) and not SIMT_NAME.search(name))


def tensor_precision_from_name(name: str | None) -> str:
    """The tensor precision a kernel name gives (tf32, bf16, fp8, int8, fp64; fp16 by default)."""
    return _named_precision(name) or DEFAULT_TENSOR_PRECISION


def _named_precision(name: str | None) -> str | None:
    """The tensor precision a kernel name spells out, None where it names none."""
    if not name:
        return None
    nvjet = NVJET_NAME.search(name)
    if nvjet:
        return NVJET_OPERAND_PRECISION.get(nvjet["types"][0].lower())
    return next((precision for pattern, precision in NAME_PRECISION if pattern.search(name)), None)



# -- computation ---------------------------------------------------------------
def roofline(trace, spec: dict | None, model_gflops: float = 0.0, group: str = "launch",
             op_group: str | None = None) -> dict:
    """The roofline figures of a trace: ``{"source", "items", "total", "extra", "peaks"}`` (module docstring).

    ``source`` is, first that applies: ``"counters"`` (kernel metrics),
    ``"torch-ops"`` (operator FLOPs recorded by torch, no bytes), ``"shapes"``
    (FLOPs and bytes derived from shapes, :mod:`.op_work`: those a reader put on
    the kernels, from a JAX trace's HLO, ``extra["derived_from"]`` ``"hlo"``;
    else the operators' recorded shapes, ``"shapes"``), or ``"none"``. ``group`` is ``"launch"`` (an item per
    kernel launch) or ``"name"`` (launches of one kernel name summed; the
    item's ``launches`` counts them). ``op_group`` groups the ``"shapes"``
    items: ``"call"`` (one per operator call) or ``"shape"`` (the calls of one
    operator with the same shapes and dtypes); by default it follows
    ``group`` (launch: call, name: shape). Items are sorted by time, longest
    first. ``trace`` is a :class:`~traceparse.trace.Trace` or its events.
    """
    events = trace if isinstance(trace, pl.DataFrame) else trace.events

    def kernels() -> pl.DataFrame:  # the kernel rows, every column: only for the counters' and torch-ops' sources
        return events.filter(pl.col("kind") == "kernel")

    counters = events.filter((pl.col("kind") == "counter") & pl.col("parent_id").is_not_null()
                             & pl.col("value").is_not_null())
    per_kernel = _kernel_counters(kernels(), counters) if counters.height else []  # no counter: no per-kernel sweep
    has_counts = any(r["flops"] is not None or r["dram_bytes"] is not None for r in per_kernel)
    if has_counts:
        return _from_counters(per_kernel, spec, model_gflops, group)
    ops = events.filter((pl.col("kind") == "op") & pl.col("flops").is_not_null() & (pl.col("flops") > 0))
    if ops.height:
        return _from_torch_ops(ops, kernels(), spec)
    op_group = op_group or ("call" if group == "launch" else "shape")
    if op_work.has_kernel_work(events):
        shaped = _from_shapes(events, spec, op_group, kernels=True)
        if shaped is not None:
            return shaped
    if op_work.has_formula_ops(events):
        shaped = _from_shapes(events, spec, op_group)
        if shaped is not None:
            return shaped
    return {"source": "none", "items": [], "total": {}, "extra": {}, "peaks": _peaks(spec)}


def _kernel_counters(kernels: pl.DataFrame, counters: pl.DataFrame) -> list[dict]:
    """Per kernel: FLOPs by precision, tensor evidence, DRAM bytes, time (one dict per kernel row)."""
    parents = kernels.select(pl.col("event_id").alias("parent_id"), pl.col("calls").fill_null(1).alias("launches"))
    linked = counters.join(parents, on="parent_id", how="inner")
    linked = linked.with_columns(total=pl.col("value") * pl.col("launches"))
    wanted = set(NVPROF_FLOPS) | set(GMMA) | set(DRAM_READ_WRITE) | {DRAM_TOTAL} | set(NVPROF_TRANSACTIONS) \
        | set(NVPROF_BYTES) | set(SM_CLOCK)
    named = (linked.filter(pl.col("name").is_in(list(wanted)) | pl.col("name").str.contains(SASS_METRIC.pattern))
             .group_by("parent_id", "name").agg(pl.col("total").sum(), pl.col("value").mean().alias("mean")))
    by_kernel: dict[int, dict[str, tuple[float, float]]] = {}
    for pid, name, total, mean in named.iter_rows():
        by_kernel.setdefault(pid, {})[name] = (total, mean)
    tensor = _tensor_flops(linked)
    rows = []
    for k in kernels.select("event_id", "name", "duration_ns", "start_ns", "calls").iter_rows(named=True):
        m = by_kernel.get(k["event_id"], {})
        flops = _sass_flops(m)
        if not flops:
            flops = {prec: m[name][0] for name, prec in NVPROF_FLOPS.items() if name in m}
        t = tensor.get(k["event_id"], {"flops": {}, "collected": set()})
        gmma = next((m[n][0] for n in GMMA if n in m), None)
        rows.append(_classify(k, flops, t, gmma, _dram_bytes(m), _clock(m)))
    return rows


def _sass_flops(m: dict) -> dict[str, float]:
    """add + mul + 2 × fma per precision, from the first prefix (sm, then smsp) that has the metrics."""
    for prefix in ("sm", "smsp"):
        out = {}
        for precision, x in SASS.items():
            names = {op: f"{prefix}__sass_thread_inst_executed_op_{x}{op}_pred_on.sum" for op in ("add", "mul", "fma")}
            if any(n in m for n in names.values()):
                out[precision] = sum(m[n][0] * (2 if op == "fma" else 1) for op, n in names.items() if n in m)
        if out:
            return out
    return {}


def _tensor_flops(linked: pl.DataFrame) -> dict[int, dict]:
    """Per kernel: tensor FLOPs by precision from ops_path metrics, without counting one op twice."""
    ops = linked.filter(pl.col("name").str.contains(TENSOR_OPS.pattern))
    if not ops.height:
        return {}
    parts = ops.with_columns(pl.col("name").str.extract_groups(TENSOR_OPS.pattern)).unnest("name")
    rank = lambda col: pl.col(col).is_not_null().cast(pl.Int8)  # noqa: E731 - null (a total) ranks first
    parts = parts.with_columns(prefix_rank=(pl.col("prefix") == "smsp").cast(pl.Int8))
    parts = parts.filter(pl.col("prefix_rank") == pl.col("prefix_rank").min().over("parent_id"))
    parts = parts.with_columns(op_rank=rank("op"))
    parts = parts.filter(pl.col("op_rank") == pl.col("op_rank").min().over("parent_id", "src"))
    parts = parts.with_columns(dst_rank=rank("dst"), op=pl.col("op").fill_null(""))
    parts = parts.filter(pl.col("dst_rank") == pl.col("dst_rank").min().over("parent_id", "src", "op"))
    parts = parts.with_columns(sp_rank=rank("sparsity"), dst=pl.col("dst").fill_null(""))
    parts = parts.filter(pl.col("sp_rank") == pl.col("sp_rank").min().over("parent_id", "src", "op", "dst"))
    sums = parts.group_by("parent_id", "src").agg(pl.col("total").sum())
    out: dict[int, dict] = {}
    for pid, src, total in sums.iter_rows():
        entry = out.setdefault(pid, {"flops": {}, "collected": set()})
        entry["collected"].add(src)
        precision = TENSOR_SRC.get(src, f"{src}_tensor")
        entry["flops"][precision] = entry["flops"].get(precision, 0.0) + total
    return out


def _dram_bytes(m: dict) -> float | None:
    if any(n in m for n in DRAM_READ_WRITE):
        return sum(m[n][0] for n in DRAM_READ_WRITE if n in m)
    if DRAM_TOTAL in m:
        return m[DRAM_TOTAL][0]
    if any(n in m for n in NVPROF_BYTES):
        return sum(m[n][0] for n in NVPROF_BYTES if n in m)
    if any(n in m for n in NVPROF_TRANSACTIONS):
        return 32 * sum(m[n][0] for n in NVPROF_TRANSACTIONS if n in m)
    return None


def _clock(m: dict) -> float | None:
    for name in SM_CLOCK:
        if name in m:
            return m[name][1]
    return None


def _classify(kernel: dict, sass: dict, tensor: dict, gmma: float | None, dram: float | None,
              clock: float | None) -> dict:
    """One kernel's FLOPs by precision, tensor-core verdict and whether its FLOPs are a lower bound."""
    flops = dict(sass)
    name = kernel["name"]
    half_moves = flops.get("fp16", 0.0) if FLOAT_TYPED.search(name or "") and not HALF_TYPED.search(name or "") else 0.0
    if half_moves:  # HFMA2.MMA register moves of a kernel whose types are float: no half-precision arithmetic
        del flops["fp16"]
    tensor_flops = {p: v for p, v in tensor["flops"].items()}
    measured_tensor = sum(tensor_flops.values())
    name_precision = tensor_precision_from_name(name)
    evidence = None
    if measured_tensor > 0:
        evidence = "tensor ops metrics"
    elif (gmma or 0) > 0 or uses_tensor_cores_by_name(name):
        src = PRECISION_SRC.get(name_precision)
        if src in tensor["collected"]:
            evidence = None  # the ops metric of its precision was collected and reads 0: no MMA ran
        else:
            evidence = "gmma instructions" if (gmma or 0) > 0 else "kernel name"
    for precision, value in tensor_flops.items():
        if value:
            flops[precision] = flops.get(precision, 0.0) + value
    lower_bound = evidence is not None and measured_tensor == 0
    has_flops = bool(sass) or bool(tensor_flops)
    return {
        "event_id": kernel["event_id"], "name": name, "time_ns": kernel["duration_ns"],
        "flops_by_precision": {p: v for p, v in flops.items() if v}, "flops": sum(flops.values()) if has_flops else None,
        "dram_bytes": dram, "tensor_core": evidence is not None, "tensor_evidence": evidence,
        "flops_lower_bound": lower_bound, "lower_bound_precision": name_precision if lower_bound else None,
        "flops_estimated": 0.0, "sm_clock_hz": clock, "aggregated": kernel.get("start_ns") is None,
        "calls": kernel.get("calls") or 1, "half_moves": half_moves,
    }


def _from_counters(all_rows: list[dict], spec: dict | None, model_gflops: float, group: str) -> dict:
    rows = [r for r in all_rows if r["flops"] is not None or r["dram_bytes"] is not None]
    # a kernel name whose counters sit on its aggregated row (nvprof: the summary's, or the launches of a trace
    # summed for a metrics log of another run) stands for its timed launches: they are not kernels without counts
    summarized = {r["name"] for r in rows if r["aggregated"]}
    without = [r for r in all_rows if r["flops"] is None and r["dram_bytes"] is None
               and not (r["name"] in summarized and not r["aggregated"])]
    measured_total = sum(r["flops"] or 0.0 for r in rows)
    estimated_total = 0.0
    lower = [r for r in rows if r["flops_lower_bound"]]
    if model_gflops > 0 and lower:
        missing = model_gflops * 1e9 - measured_total
        lower_time = sum(r["time_ns"] or 0 for r in lower)
        if missing > 0 and lower_time > 0:
            for r in lower:
                r["flops_estimated"] = missing * (r["time_ns"] or 0) / lower_time
                precision = r["lower_bound_precision"]
                r["flops_by_precision"][precision] = r["flops_by_precision"].get(precision, 0.0) + r["flops_estimated"]
            estimated_total = missing
    peaks = _peaks(spec)
    units = rows if group == "launch" else _group_by_name(rows)
    items = [_item(r, peaks) for r in units]
    items.sort(key=lambda i: (-(i["time_ns"] or 0), i["event_id"]))
    by_precision: dict[str, float] = {}
    for r in rows:
        for p, v in r["flops_by_precision"].items():
            by_precision[p] = by_precision.get(p, 0.0) + v
    with_flops = [r for r in rows if r["flops"] is not None]
    total_flops = sum((r["flops"] or 0) + r["flops_estimated"] for r in with_flops) if with_flops else None
    with_bytes = [r for r in rows if r["dram_bytes"] is not None]
    total_bytes = sum(r["dram_bytes"] for r in with_bytes) if with_bytes else None
    with_time = [r for r in rows if r["time_ns"] is not None]
    total_time = sum(r["time_ns"] for r in with_time) if with_time else None
    total = {"name": "total", **_figures(total_flops, total_bytes, total_time, by_precision, peaks, None),
             "peak_mix": _mix(by_precision)}
    clocks = [r["sm_clock_hz"] for r in rows if r["sm_clock_hz"]]
    boost = (spec or {}).get("clocks", {}).get("boost_mhz")
    mean_clock = sum(clocks) / len(clocks) if clocks else None
    extra = {
        "flops_measured": _num(measured_total), "flops_estimated": _num(estimated_total),
        "flops_by_precision": {p: _num(v) for p, v in sorted(by_precision.items())},
        "kernels": len(rows), "kernels_with_flop_counts": len(with_flops), "kernels_with_byte_counts": len(with_bytes),
        "kernels_with_time": len(with_time), "tensor_core_kernels": sum(r["tensor_core"] for r in rows),
        "lower_bound_kernels": sum(1 for r in rows if r["flops_lower_bound"] and not r["flops_estimated"]),
        "lower_bound_time_ns": sum(r["time_ns"] or 0 for r in rows if r["flops_lower_bound"]),
        "sm_clock_mhz": round(mean_clock / 1e6, 1) if mean_clock else None,
        "boost_clock_mhz": boost,
        "clock_ratio": round(mean_clock / 1e6 / boost, 4) if mean_clock and boost else None,
        "model_gflops": model_gflops or None,
        "kernels_without_counts": len(without),
        "half_move_kernels": sum(1 for r in rows if r.get("half_moves")),
        "half_moves_left_out": _num(sum(r.get("half_moves") or 0.0 for r in rows)),
        "kernels_without_counts_time_ns": sum(r["time_ns"] or 0 for r in without),
    }
    return {"source": "counters", "items": items, "total": total, "extra": extra, "peaks": peaks}


def _item(r: dict, peaks: dict) -> dict:
    """The JSON item of one kernel (or one group of launches of a kernel name)."""
    lower_bound = r["flops_lower_bound"] and not r["flops_estimated"]
    held_to = r["lower_bound_precision"] if lower_bound else None
    flops = None if r["flops"] is None else r["flops"] + r["flops_estimated"]
    figures = _figures(flops, r["dram_bytes"], r["time_ns"], r["flops_by_precision"], peaks, held_to)
    item = {"event_id": r["event_id"], "name": r["name"], **figures,
            "precision": _dominant(r["flops_by_precision"], r["lower_bound_precision"] if r["flops_lower_bound"] else None),
            "tensor_core": r["tensor_core"], "flops_lower_bound": lower_bound,
            "flops_estimated": _num(r["flops_estimated"]) or None}
    if "launches" in r:
        item["launches"] = r["launches"]
    return item


def _group_by_name(rows: list[dict]) -> list[dict]:
    """Launches of the same kernel name summed into one row (first event_id kept); ``launches`` counts them (an
    aggregated row counts its calls)."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.get(r["name"])
        if g is None:
            groups[r["name"]] = dict(r, flops_by_precision=dict(r["flops_by_precision"]), launches=r["calls"])
            continue
        g["launches"] += r["calls"]
        for key in ("flops", "dram_bytes", "time_ns"):
            if r[key] is not None:
                g[key] = (g[key] or 0) + r[key]
        for p, v in r["flops_by_precision"].items():
            g["flops_by_precision"][p] = g["flops_by_precision"].get(p, 0.0) + v
        g["flops_estimated"] += r["flops_estimated"]
        g["tensor_core"] = g["tensor_core"] or r["tensor_core"]
        if r["flops_lower_bound"] and not g["flops_lower_bound"]:
            g["flops_lower_bound"], g["lower_bound_precision"] = True, r["lower_bound_precision"]
    return list(groups.values())


def _from_torch_ops(ops: pl.DataFrame, kernels: pl.DataFrame, spec: dict | None) -> dict:
    """Operator FLOPs against GPU time (kernels sharing the operator's external_id), no bytes."""
    gpu_time = (kernels.filter(pl.col("external_id").is_not_null())
                .group_by("external_id").agg(gpu_ns=pl.col("duration_ns").sum()))
    joined = ops.join(gpu_time, on="external_id", how="left")
    joined = joined.with_columns(time_ns=pl.coalesce("gpu_ns", "duration_ns"),
                                 on_gpu=pl.col("gpu_ns").is_not_null())
    grouped = (joined.group_by("name").agg(flops=pl.col("flops").sum(), time_ns=pl.col("time_ns").sum(),
                                          calls=pl.len(), gpu_calls=pl.col("on_gpu").sum())
               .sort(["time_ns", "name"], descending=[True, False]))
    peaks = _peaks(spec)
    items = []
    for r in grouped.iter_rows(named=True):
        figures = _figures(r["flops"], None, r["time_ns"], {"fp32": r["flops"]}, peaks, None)
        items.append({"name": r["name"], **figures, "precision": "fp32", "calls": r["calls"],
                      "time_from": "kernels" if r["gpu_calls"] == r["calls"] else
                      ("operator (CPU)" if r["gpu_calls"] == 0 else "mixed")})
    total_flops = float(grouped["flops"].sum())
    total_time = int(grouped["time_ns"].sum())
    total = {"name": "total", **_figures(total_flops, None, total_time, {"fp32": total_flops}, peaks, None)}
    extra = {"flops_measured": _num(total_flops), "flops_estimated": 0, "operators": int(grouped["calls"].sum()),
             "operators_timed_on_gpu": int(grouped["gpu_calls"].sum()),
             "peak_tensor_gflops": peaks.get("tf32_tensor") or peaks.get("fp16_tensor"),
             "missing": "DRAM byte counts (arithmetic intensity, bound and the memory roof need them)"}
    return {"source": "torch-ops", "items": items, "total": total, "extra": extra, "peaks": peaks}


#: What the "shapes" source says of its figures, wherever they are shown.
SHAPES_NOTE = ("FLOPs and bytes derived from the operators' recorded shapes (formulas: docs/flops.md), not "
               "measured; bytes count each tensor read and written once, a lower bound on DRAM traffic")
#: The same, for FLOPs a JAX trace's compiled modules gave its kernels.
HLO_NOTE = ("FLOPs and bytes derived from the compiled XLA modules' shapes (the dots and convolutions of each "
            "kernel's HLO instruction: docs/flops.md), not measured; bytes count each tensor read and written once, "
            "a lower bound on DRAM traffic")


def _from_shapes(events: pl.DataFrame, spec: dict | None, op_group: str, kernels: bool = False) -> dict | None:
    """Operator calls placed by :func:`.op_work.placed_calls` (``kernels``: kernels that carry FLOPs,
    :func:`.op_work.kernel_calls`): FLOPs and bytes from their shapes, the time of their kernels. None when no
    call was placed."""
    calls, info = op_work.kernel_calls(events) if kernels else op_work.placed_calls(events)
    if calls.height == 0:
        return None
    names = calls["kernel_names"].explode().drop_nulls().unique()  # each kernel name looked at once
    tensor = {n: _tensor_by_name(n) for n in names.to_list()}
    calls = calls.with_columns(tensor=pl.col("kernel_names").list.eval(
        pl.element().replace_strict(tensor, default=None, return_dtype=pl.String).drop_nulls().unique().sort())
        .list.join(","))
    kinds = calls.select("family", "dtype", "tensor").unique()  # a handful: the precision of each, once
    kinds = kinds.with_columns(precision=pl.Series(
        [shape_precision(f, d, set(t.split(",")) - {""}) for f, d, t in kinds.iter_rows()], dtype=pl.String))
    calls = calls.join(kinds, on=["family", "dtype", "tensor"], how="left", nulls_equal=True)
    if op_group == "shape":
        units = (calls.group_by("name", "input_dims", "input_types", "family", "precision", maintain_order=True)
                 .agg(pl.col("event_id").first(), pl.col("flops").sum(),
                      pl.when(pl.col("bytes").null_count() == 0).then(pl.col("bytes").sum()).alias("bytes"),
                      pl.col("time_ns").sum(), pl.col("kernels").sum(), pl.len().alias("calls"),
                      pl.col("assumed").drop_nulls().first()))
    else:
        units = calls.with_columns(calls=pl.lit(1, dtype=pl.UInt32))
    peaks = _peaks(spec)
    items = []
    for r in units.iter_rows(named=True):
        by_precision = {r["precision"]: r["flops"]} if r["precision"] else {}
        figures = _figures(r["flops"], r["bytes"], r["time_ns"], by_precision, peaks, None)
        if not r["precision"]:
            figures.update(peak_gflops=None, ridge_ai=None, bound=None, roof_pct=None)
        above = _above_roof(figures)
        items.append({"event_id": r["event_id"], "name": f"{r['name']} {shapes_label(r['input_dims'])}",
                      "operator": r["name"], "input_dims": r["input_dims"], "input_types": r["input_types"],
                      "family": r["family"], **figures, "precision": r["precision"],
                      "tensor_core": (r["precision"] or "").endswith("_tensor"), "flops_lower_bound": False,
                      "flops_estimated": None, "calls": r["calls"], "kernels": r["kernels"],
                      "assumed": r["assumed"], "above_roof": above})
    items.sort(key=lambda i: (-(i["time_ns"] or 0), i["event_id"]))
    # each precision's FLOPs added up in the calls' order, the precisions in the order they first come (as the
    # loop over 24,000 calls this replaces did: its sum to the last bit, and the mix's order); + 0.0 as its start
    sums = (calls.filter(pl.col("precision").is_not_null() & (pl.col("precision") != ""))
            .group_by("precision", maintain_order=True).agg(pl.col("flops").cum_sum().last()))
    by_precision: dict[str, float] = {p: v + 0.0 for p, v in sums.iter_rows()}
    total_flops = float(calls["flops"].sum())
    with_bytes = calls.filter(pl.col("bytes").is_not_null())
    total_bytes = float(with_bytes["bytes"].sum()) if with_bytes.height == calls.height else None
    total_time = int(calls["time_ns"].sum())
    total = {"name": "total", **_figures(total_flops, total_bytes, total_time, by_precision, peaks, None),
             "peak_mix": _mix(by_precision)}
    total_above = _above_roof(total)
    kernel_ns = info["kernel_ns"]
    extra = {
        "derived_from": "hlo" if kernels else "shapes", "note": HLO_NOTE if kernels else SHAPES_NOTE,
        "flops_measured": 0, "flops_estimated": 0, "flops_derived": _num(total_flops),
        "flops_by_precision": {p: _num(v) for p, v in sorted(by_precision.items())},
        "operator_calls": calls.height, "items": len(items),
        "calls_without_bytes": calls.height - with_bytes.height,
        "calls_with_assumptions": int(calls["assumed"].is_not_null().sum()),
        "items_above_roof": sum(1 for i in items if i["above_roof"]), "total_above_roof": total_above,
        "formula_calls_without_kernels": info["without_kernels"], "sparse_calls": info.get("sparse_calls", 0),
        "kernels": int(calls["kernels"].sum()),
        "kernel_time_ns": kernel_ns, "placed_time_ns": info["placed_ns"],
        "placed_time_pct": round(100.0 * info["placed_ns"] / kernel_ns, 2) if kernel_ns else None,
        "kernels_with_flop_counts": 0, "kernels_with_byte_counts": 0,
        "tensor_core_kernels": 0, "lower_bound_kernels": 0, "lower_bound_time_ns": 0,
        "sm_clock_mhz": None, "boost_clock_mhz": None, "clock_ratio": None, "model_gflops": None,
        "missing": None,
    }
    return {"source": "shapes", "items": items, "total": total, "extra": extra, "peaks": peaks}


def _above_roof(figures: dict) -> bool:
    """Whether derived figures sit above their roof; if so their roof_pct is dropped (set to None).

    Derived bytes assume every tensor comes from DRAM: a call whose tensors sat in cache runs faster than the
    DRAM roof allows for them, and a share of the roof above 100% would mislead.
    """
    if figures.get("roof_pct") is not None and figures["roof_pct"] > 100.0:
        figures["roof_pct"] = None
        return True
    return False


def _tensor_by_name(name: str) -> str | None:
    """The tensor precision a kernel's name gives when it says tensor cores ("tensor": none named), else None."""
    if not uses_tensor_cores_by_name(name):
        return None
    return _named_precision(name) or "tensor"


def shape_precision(family: str, dtype: str | None, tensor: set[str]) -> str | None:
    """The peak a placed call is held to: matrix work (GEMM, convolution, attention) in fp16/bf16/fp8 (or tf32,
    where the source says the work ran so) runs on tensor cores; in fp32 when one of its kernels' names says
    tensor cores (``tensor``: the precisions those names give, "tensor" for none) at TF32 unless the names give
    only another precision; else the dtype's own (fp32, fp16, bf16, fp64). None when the dtype is not recorded."""
    if dtype is None:
        return None
    if family not in op_flops.MATRIX_FAMILIES:
        return dtype if dtype not in ("fp8", "tf32") else None
    if dtype in ("fp16", "bf16", "fp8", "tf32"):
        return f"{dtype}_tensor"
    if not tensor:
        return dtype
    if dtype == "fp64":
        return "fp64_tensor"
    named = tensor - {"tensor"}
    return "tf32_tensor" if not named or "tf32_tensor" in named else sorted(named)[0]


def shapes_label(dims_text: str | None) -> str:
    """A call's tensor shapes for a row label: ``[16x9216, 9216x4096]`` (scalars and empty inputs left out)."""
    dims = op_flops.parse(dims_text) or []
    shapes = ["x".join(map(str, d)) for d in dims if op_flops.is_shape(d)]
    return "[" + ", ".join(shapes) + "]"


def _peaks(spec: dict | None) -> dict[str, float]:
    """GFLOP/s per precision and ``dram`` GB/s from a catalog entry (empty when unknown)."""
    if not spec:
        return {}
    out = {p: float(v) * 1000.0 for p, v in (spec.get("peak_tflops") or {}).items() if v}
    if spec.get("dram_gbps"):
        out["dram"] = float(spec["dram_gbps"])
    return out


def _figures(flops, dram_bytes, time_ns, by_precision: dict, peaks: dict, held_to: str | None) -> dict:
    """The roofline keys of one item (see the module docstring); None where an input is missing."""
    ai = flops / dram_bytes if flops is not None and dram_bytes else None
    achieved = flops / time_ns if flops is not None and time_ns else None
    peak = _peak_gflops(by_precision, peaks, held_to)
    gbps = peaks.get("dram")
    ridge = peak / gbps if peak and gbps else None
    bound = roof = None
    if ai is not None and ridge is not None:
        bound = "memory" if ai < ridge else "compute"
    if achieved is not None and peak:
        attainable = min(peak, ai * gbps) if ai is not None and gbps else peak
        roof = 100.0 * achieved / attainable if attainable else None
    return {"flops": _num(flops), "dram_bytes": _num(dram_bytes), "time_ns": time_ns,
            "arithmetic_intensity": _round(ai), "achieved_gflops": _round(achieved), "peak_gflops": _round(peak),
            "peak_gbps": _round(gbps), "ridge_ai": _round(ridge), "bound": bound, "roof_pct": _round(roof)}


def _peak_gflops(by_precision: dict, peaks: dict, held_to: str | None) -> float | None:
    """flops / Σ(flops_p / peak_p): the rate at which the mix of precisions would run at peak."""
    if held_to is not None:
        return peaks.get(held_to)
    work = {p: v for p, v in by_precision.items() if v}
    if not work:
        return peaks.get("fp32")
    if any(p not in peaks for p in work):
        return None
    seconds = sum(v / peaks[p] for p, v in work.items())
    return sum(work.values()) / seconds if seconds else None


def _mix(by_precision: dict) -> dict[str, float]:
    """Each precision's share of the FLOPs (%, most first): what the whole's peak (:func:`_peak_gflops`) is a mix
    of, so that a peak of 408 TFLOP/s is not read as one precision's."""
    work = {p: float(v) for p, v in by_precision.items() if v}
    total = sum(work.values())
    return {p: round(100.0 * v / total, 4) for p, v in sorted(work.items(), key=lambda kv: (-kv[1], kv[0]))} \
        if total else {}


def _dominant(by_precision: dict, held_to: str | None) -> str | None:
    if held_to:
        return held_to
    work = {p: v for p, v in by_precision.items() if v}
    return max(work, key=work.get) if work else None


def _num(value):
    """An exact integer when the value is whole (FLOP and byte counts), else the float."""
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def _round(value, digits: int = 4):
    return None if value is None else round(float(value), digits)

