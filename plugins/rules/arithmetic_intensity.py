"""Rule ``arithmetic-intensity``: the roofline figures of every kernel and of the whole trace.

Definition, per kernel (a kernel row and the counter rows whose ``parent_id``
is its ``event_id``; a counter's value is per launch, the mean for nvprof's
per-name metrics, so it counts value × the kernel row's ``calls``: an
aggregated row's totals, one launch for a timed row). Only kernels with FLOP
or byte counts are items; the others are counted in
``kernels_without_counts``:

- FLOPs by precision from SASS instruction counts (ncu):
  ``add + mul + 2 × fma`` of ``sm__sass_thread_inst_executed_op_{d,f,h}{add,mul,fma}_pred_on.sum``
  (``smsp__`` spelling too) → fp64, fp32, fp16; or the legacy nvprof metrics
  ``flop_count_dp``, ``flop_count_sp``, ``flop_count_hp``.
- Tensor-core FLOPs where ncu counted them: ``sm__ops_path_tensor_[op_<OP>_]src_<T>[_dst_<T>][_sparsity_on|off].sum``
  (1 op = 1 FLOP: an MMA's multiply-add counts 2, checked on VGG11's
  convolutions, whose tf32 ops equal 2 × N·H·W·K·C·R·S); one spelling per
  source type is used (totals before per-instruction ones, no double
  counting), mapped to tf32/fp16/bf16/fp8/fp64/int8 tensor precisions.
- A kernel uses tensor cores when those ops are > 0, or when
  ``sm__inst_executed_pipe_tensor_op_gmma.sum`` > 0 (Hopper warpgroup MMA), or
  when its name says so (tf32, hmma, h884/s1688/h16816-style tiles,
  tensorop, bf16, fp8 ... in a GEMM/convolution kernel name, and no SIMT
  marker such as ``_ffma_`` or ``sgemm``; cuBLAS's ``nvjet_*`` GEMMs, their
  operand type the letter after ``nvjet_smNN_``) - unless the ops metric of the
  precision its name gives was collected and reads 0. Neither
  ``sm__inst_executed_pipe_tensor.sum`` nor ``..._op_hmma.sum`` is taken as
  evidence: on sm_80+ they also count HFMA2.MMA register moves, so
  element-wise and batch-norm kernels read millions (measured on H100 with ncu 2025).
  A tensor-core kernel whose tensor FLOPs were not counted has
  ``flops_lower_bound`` true: its SASS FLOPs miss the MMA work.
- ``model_gflops`` > 0 (the FLOPs of the profiled work, e.g. from
  ``traceparse flops``) stands in for the uncounted tensor work: the part of
  it not measured (model − measured, when positive) is spread over the
  lower-bound kernels in proportion to their time (``flops_estimated``).
- DRAM bytes = ``dram__bytes_read.sum + dram__bytes_write.sum`` (or
  ``dram__bytes.sum``); nvprof: ``(dram_read_transactions +
  dram_write_transactions) × 32`` or ``dram_read_bytes + dram_write_bytes``.
- time_ns = the kernel's ``duration_ns`` (ncu: ``gpu__time_duration.sum``).

Figures: arithmetic_intensity = flops / dram_bytes (FLOP/byte);
achieved_gflops = flops / time_ns; peak_gflops = the device's peak for the
work's precisions, flops / Σ_p(flops_p / peak_p) (one precision: its peak;
fp32 SASS work → fp32 peak, TF32 tensor work → tf32_tensor peak; a
lower-bound kernel is held to the tensor peak its name gives);
peak_gbps = DRAM bandwidth; ridge_ai = peak_gflops / peak_gbps; bound =
memory when arithmetic_intensity < ridge_ai, else compute; roof_pct = 100 ×
achieved_gflops / min(peak_gflops, arithmetic_intensity × peak_gbps). Peaks
come from the GPU catalog (``--gpu`` or the trace's device); an unknown GPU
leaves the peak-dependent figures null and says so.

A torch.profiler trace recorded ``with_flops`` has FLOPs on operator rows
but no byte counts: items are then per operator name with achieved GFLOP/s
(GPU time of the operator's kernels, joined by ``external_id``, else the
operator's own time) against the fp32 peak, and the message says what is
missing.

A torch.profiler trace recorded with ``record_shapes=True`` and no counters
(the common case: PyTorch 2.11 writes no per-operator FLOPs) has its FLOPs and
bytes derived from the operators' recorded shapes (the formula table of
docs/flops.md): GEMMs, convolutions and
their backward, scaled-dot-product attention (causal halved), normalization,
softmax and element-wise operators. Items are per operator and shapes (the
calls of ``aten::addmm [4096, 16x9216, 9216x4096]``): FLOPs and bytes
(inputs + outputs × element size: each tensor moved once, a lower bound on
DRAM traffic) from the formulas; time = Σ duration of the kernels the calls
launched (by External id, else through the launching API call's), including
those of operators nested in them that have no formula of their own. An
operator that encloses another with a formula (``aten::linear`` around
``aten::addmm``, ``aten::conv2d`` around ``aten::cudnn_convolution``) is not
an item: its inner operator is. The peak: GEMM, convolution and attention
work in fp16/bf16/fp8 is held to that tensor-core peak, in fp32 to the TF32
tensor peak when a kernel name says tensor cores, else to the fp32 peak;
element-wise work to its dtype's peak. A row above its roof (derived bytes
assume DRAM; tensors in cache move faster) has no % of roof
(``above_roof``). The message says that these figures are derived from
shapes, not measured, and what share of the kernel time the items cover
(``placed_time_pct``). Counters, then the FLOPs torch recorded
(``with_flops``), win over shapes when a trace has them.

A JAX trace read from its ``.xplane.pb`` has FLOPs and bytes on the kernels
themselves: the reader derives them from the compiled modules' HLO (the dots
and convolutions of the instruction each kernel computes, docs/flops.md) and
sets ``flops``, ``bytes``, ``input_dims``, ``input_types`` on the kernel rows.
Items are then per kernel name and shapes (``gemm_fusion_dot_19
[4096x512, 512x2048]``), time = Σ duration of those kernels, held to the
tensor-core peak of the dot's type (bf16, fp16, fp8; an f32 dot at XLA's
DEFAULT precision to TF32, which the item's ``assumed`` says). They come after
counters and torch's own FLOPs, before operator shapes. A JAX JSON timeline
has no HLO: the message says to give the ``.xplane.pb``.

A trace with neither counter rows linked to kernels nor operator FLOPs nor
kernels with derived FLOPs nor operators with a formula and recorded shapes is
answered at once (column filters, before any per-kernel work): an info finding
saying there is nothing to place on a roofline (and why, where the reader
says: ``no_flops_reason``).
"""

from __future__ import annotations

import polars as pl

from traceparse.catalog import gpu_for_trace
from traceparse.measures import op_work
from traceparse.measures.roofline import ABOVE_ROOF_PCT, roofline
from traceparse.errors import spelled
from traceparse.figures import fmt_ns, fmt_number, fmt_pct, shares_shown
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions
from traceparse.trace import Trace

#: Arithmetic intensity is FLOP per byte, not a dimensionless ratio: it read "59.64×" beside the sentence's "59.64
#: FLOP/byte".
FIGURES = {"flops": "flops", "dram_bytes": "bytes", "time_ns": "ns", "arithmetic_intensity": "flop_per_byte",
           "achieved_gflops": "number", "peak_gflops": "number", "peak_gbps": "gbps", "ridge_ai": "flop_per_byte",
           "bound": "text", "roof_pct": "pct", "gpu": "text", "gpu_source": "text"}
#: Screen labels where the key's words would read like another figure: the operators' kernel time (not all of it:
#: kernel-share's), the DRAM peak (not a copy link's).
LABELS = {"time_ns": "their kernel time", "peak_gbps": "DRAM peak", "peak_gflops": "peak GFLOP/s, the mix's",
          "ridge_ai": "ridge", "achieved_gflops": "achieved GFLOP/s"}
COLUMNS = [Column("name", "name", "name"), Column("time_ns", "time", "ns"), Column("flops", "FLOPs", "flops"),
           Column("dram_bytes", "DRAM bytes", "bytes"), Column("arithmetic_intensity", "FLOP/byte", "flop_per_byte"),
           Column("achieved_gflops", "GFLOP/s", "number"), Column("roof_pct", "% of roof", "pct"),
           Column("bound", "bound", "text"), Column("precision", "precision", "text"),
           Column("tensor_core", "tensor core", "text")]


class ArithmeticIntensity(Rule):
    name = "arithmetic-intensity"
    cost = 2  # every operator's shapes and owners
    description = "Roofline per kernel: FLOPs, DRAM bytes, arithmetic intensity, GFLOP/s against the GPU's roofs"
    definition = __doc__
    thresholds = {
        "top": 25,                 # items listed, longest first (0: every kernel)
        "model_gflops": 0.0,       # > 0: GFLOPs of the profiled work, to estimate uncounted tensor-core FLOPs
    }
    kinds = ("kernel", "op")

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        spec, how = gpu_for_trace(trace, options.gpu)
        if not has_counts(trace.events):  # say so at once: no per-kernel sweep over a trace with nothing to place
            return [self._nothing(trace, spec, how)]
        result = roofline(trace, spec, model_gflops=float(options.thresholds.get("model_gflops") or 0.0),
                          op_group="shape")
        if result["source"] == "none":
            return [self._nothing(trace, spec, how)]
        top = int(options.thresholds.get("top") or 0)
        items = result["items"] if top <= 0 else result["items"][:top]
        total = result["total"]
        metrics = dict(total, gpu=spec["name"] if spec else None, gpu_source=how, **result["extra"])
        return [Finding(self.name, "info", "Roofline: arithmetic intensity and attained performance",
                        _message(result, spec, how), _suggestion(result), metrics=metrics, items=items,
                        columns=COLUMNS, figures=FIGURES, labels=LABELS)]


    def _nothing(self, trace: Trace, spec: dict | None, how: str) -> Finding:
        events = trace.events
        kernels, shapes, device_ops = events.select(
            kernels=(pl.col("kind") == "kernel").any(),
            shapes=((pl.col("kind") == "op") & pl.col("input_dims").is_not_null()).any(),
            device_ops=((pl.col("kind") == "op") & pl.col("device_id").is_not_null() & pl.col("pid").is_null()).any(),
        ).row(0)
        ncu = ("Profile with ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,"
               "dram__bytes_write.sum,sm__sass_thread_inst_executed_op_{f,h,d}{add,mul,fma}_pred_on.sum,"
               "sm__ops_path_tensor_src_tf32_dst_fp32.sum (see docs/roofline.md)")
        if not kernels and device_ops:  # an accelerator's own operators, no GPU kernels: a TPU's XLA ops
            message = ("The trace's operators ran on accelerator devices that record no GPU kernels (XLA ops of a "
                       "TPU): this rule places GPU kernels on a GPU's roofline, so there is nothing to place.")
            suggestion = ""
            how = "none: the trace's devices ran no GPU kernels"
        elif not kernels:  # a CPU-only trace, or one whose GPU was not traced: no roofline of a GPU to draw
            message = ("The trace has no GPU kernels (its operators ran on the CPU, or the GPU was not traced): "
                       "there is nothing to place on a GPU roofline.")
            suggestion = ""
            how = "none: the trace has no GPU kernels"  # not "pass --gpu NAME": no GPU's roof would be used
        else:
            message = _nothing_message(trace)
            suggestion = ncu + ("." if shapes else ", or record torch.profiler with record_shapes=True (FLOPs and "
                                                   "bytes are then derived from the shapes).")
        return Finding(self.name, "info", "No FLOP or byte counts", message, suggestion,
                       metrics={"gpu": spec["name"] if spec else None, "gpu_source": how},
                       figures={"gpu": "text", "gpu_source": "text"})


def has_counts(events: pl.DataFrame) -> bool:
    """Whether the trace could give any roofline figure: a counter row linked to a kernel, an operator's FLOPs,
    or an operator with a FLOPs formula and recorded shapes.

    Column filters only, so a trace without any is answered in milliseconds, whatever its size.
    """
    linked = events.select(((pl.col("kind") == "counter") & pl.col("parent_id").is_not_null()
                            & pl.col("value").is_not_null()).any()).item()
    if linked:
        return True
    if events.select(((pl.col("kind") == "op") & (pl.col("flops") > 0)).any()).item():
        return True
    return op_work.has_kernel_work(events) or op_work.has_formula_ops(events)


# -- text ----------------------------------------------------------------------
def _message(result: dict, spec: dict | None, how: str) -> str:
    total, extra = result["total"], result["extra"]
    parts = []
    if result["source"] == "shapes":
        parts.append(_shapes_message(total, extra, spec))
    elif result["source"] == "torch-ops":
        parts.append(f"{extra['operators']:,} operators with FLOPs: {fmt_number(total['flops'] / 1e9)} GFLOP in "
                     f"{fmt_ns(total['time_ns'])} = {fmt_number(total['achieved_gflops'])} GFLOP/s"
                     + (f", {fmt_pct(total['roof_pct'])} of the fp32 peak" if total["roof_pct"] is not None else "")
                     + ". The trace has FLOPs but no DRAM byte counts: arithmetic intensity, the memory roof and "
                       "memory/compute-bound cannot be given.")
    else:
        flops = total["flops"]
        parts.append(f"{extra['kernels']:,} kernels, {extra['kernels_with_flop_counts']:,} with FLOP counts, "
                     f"{extra['kernels_with_byte_counts']:,} with DRAM bytes.")
        if flops is not None and total["dram_bytes"]:
            parts.append(f"Total: {fmt_number(flops / 1e9)} GFLOP over {fmt_number(total['dram_bytes'] / 1e9)} GB = "
                         f"{fmt_number(total['arithmetic_intensity'])} FLOP/byte"
                         + (f" in {fmt_ns(total['time_ns'])}" if total["time_ns"] else "")
                         + (f", {fmt_number(total['achieved_gflops'])} GFLOP/s" if total["achieved_gflops"] is not None else "")
                         + ".")
        if total["bound"]:
            ridge = f" (ridge {fmt_number(total['ridge_ai'])} FLOP/byte{_peak_of(total)})" \
                if total["ridge_ai"] is not None else ""
            at = (f" at {fmt_pct(total['roof_pct'])} of its roof" if total["roof_pct"] is not None
                  else _no_roof_share(total))
            parts.append(f"Against {spec['name']}'s roofs{ridge} the whole is {total['bound']}-bound{at}.")
        if extra.get("half_move_kernels"):
            parts.append(f"{extra['half_move_kernels']:,} kernels whose names say float read half-precision FMA "
                         f"counts ({fmt_number(extra['half_moves_left_out'] / 1e9)} GFLOP): HFMA2.MMA register moves "
                         "on sm_80 and later, not arithmetic, left out of their FLOPs.")
        if extra["lower_bound_kernels"]:
            parts.append(f"{extra['lower_bound_kernels']:,} tensor-core kernels "
                         f"({fmt_ns(extra['lower_bound_time_ns'])}) have no tensor FLOP counts: their SASS FLOPs "
                         "are a lower bound, so their arithmetic intensity and GFLOP/s are too.")
        if extra["flops_estimated"]:
            parts.append(f"{fmt_number(extra['flops_estimated'] / 1e9)} of the {fmt_number((total['flops'] or 0) / 1e9)} GFLOP are "
                         f"estimated from model_gflops={extra['model_gflops']}, the rest measured.")
        above = [i["roof_pct"] for i in result["items"] if (i["roof_pct"] or 0) > ABOVE_ROOF_PCT]
        if above:
            parts.append(f"{len(above):,} rows sit above their roof (up to {max(above):.0f}%): the peak figures do not "
                         f"fit the GPU that ran them; check {spelled('--gpu', 'gpu=')}.")
        if extra["clock_ratio"] and extra["clock_ratio"] < 0.95:
            parts.append(f"The SM clock while profiling averaged {extra['sm_clock_mhz']:.0f} MHz, "
                         f"{100 * extra['clock_ratio']:.0f}% of the {extra['boost_clock_mhz']} MHz boost clock the "
                         "peaks assume (ncu locks clocks to base by default).")
    if spec is None:
        parts.append(f"No peak figures: {how}. Figures that need no peak are given.")
    else:
        parts.append(f"GPU: {how}.")
    return " ".join(parts)


def _peak_of(total: dict) -> str:
    """The whole's peak and what it is of: "; peak 408,197 GFLOP/s for its FLOPs' precisions, tf32_tensor 95.1%,
    fp32 4.2%" (the peak of a mix is the rate at which that mix would run at each precision's peak)."""
    mix = total.get("peak_mix") or {}
    if total.get("peak_gflops") is None or not mix:
        return ""
    if len(mix) == 1:
        return f"; the {next(iter(mix))} peak, {fmt_number(total['peak_gflops'])} GFLOP/s"
    return (f"; peak {fmt_number(total['peak_gflops'])} GFLOP/s for its FLOPs' precisions, "
            + ", ".join(f"{p} {fmt_pct(share)}" for p, share in list(zip(mix, shares_shown(list(mix.values()))))[:3])
            + (f" and {len(mix) - 3:,} more" if len(mix) > 3 else ""))


def _shapes_message(total: dict, extra: dict, spec: dict | None) -> str:
    """The figures of the "shapes" source, saying first that they are derived, not measured."""
    if extra.get("derived_from") == "hlo":
        text = (f"Derived from the compiled XLA modules' shapes, not measured: {extra['operator_calls']:,} kernels "
                f"({extra['items']:,} kernel shapes) computing dots or convolutions (docs/flops.md): "
                f"{fmt_number(total['flops'] / 1e9)} GFLOP")
    else:
        text = (f"Derived from recorded shapes, not measured: {extra['operator_calls']:,} operator calls "
                f"({extra['items']:,} operator shapes) with a FLOPs formula (docs/flops.md): "
                f"{fmt_number(total['flops'] / 1e9)} GFLOP")
    if total["dram_bytes"]:
        text += (f" over {fmt_number(total['dram_bytes'] / 1e9)} GB (each tensor read and written once: a lower bound "
                 f"on DRAM traffic) = {fmt_number(total['arithmetic_intensity'])} FLOP/byte")
    text += f", in {fmt_ns(total['time_ns'])} of their kernels = {fmt_number(total['achieved_gflops'] / 1e3)} TFLOP/s."
    if extra["placed_time_pct"] is not None:
        whose = "They" if extra.get("derived_from") == "hlo" else "These operators' kernels"
        text += (f" {whose} are {fmt_pct(extra['placed_time_pct'])} of the trace's kernel time "
                 f"({fmt_ns(extra['kernel_time_ns'])}).")
    if total["bound"] and spec:
        ridge = f" (ridge {fmt_number(total['ridge_ai'])} FLOP/byte{_peak_of(total)})" \
            if total["ridge_ai"] is not None else ""
        at = f" at {fmt_pct(total['roof_pct'])} of its roof" if total["roof_pct"] is not None else ""
        text += f" Against {spec['name']}'s roofs{ridge} the whole is {total['bound']}-bound{at}."
    if extra["items_above_roof"]:
        if extra["items_above_roof"] == 1:
            text += (" 1 row runs faster than its roof allows for its derived bytes (its tensors came partly from "
                     "cache, or the peak is not the one it ran at): its % of roof is left out.")
        else:
            text += (f" {extra['items_above_roof']:,} rows run faster than their roof allows for their derived bytes "
                     "(their tensors came partly from cache, or the peak is not the one they ran at): their % of "
                     "roof is left out.")
    if extra["calls_with_assumptions"] and extra.get("derived_from") == "hlo":
        text += (f" {extra['calls_with_assumptions']} kernels run f32 dots at XLA's DEFAULT precision, held to the "
                 "TF32 tensor-core peak (JAX's GPU default; the item's 'assumed' says so).")
    elif extra["calls_with_assumptions"]:
        text += (f" {extra['calls_with_assumptions']} calls lacked an argument their formula needs and were "
                 "counted on an assumption (the item's 'assumed' says which).")
    if extra["calls_without_bytes"]:
        text += f" {extra['calls_without_bytes']} calls have no bytes (a dtype not recorded)."
    if extra.get("sparse_calls"):
        calls = "1 call" if extra["sparse_calls"] == 1 else f"{extra['sparse_calls']:,} calls"
        text += (f" {calls} on sparse tensors are left out: their recorded shapes are the dense ones, which no "
                 "formula here fits.")
    return text


def _suggestion(result: dict) -> str:
    extra = result["extra"]
    if result["source"] == "shapes":
        return ("For measured FLOPs and DRAM bytes, profile the kernels with ncu (docs/roofline.md); the derived "
                "bytes assume each tensor moves once, so memory-bound verdicts here are optimistic.")
    if result["source"] == "torch-ops":
        return "Profile the kernels with ncu (dram__bytes_read/write.sum) for the memory side of the roofline."
    if extra.get("lower_bound_kernels"):
        return ("Collect sm__ops_path_tensor_src_<type>[_dst_fp32].sum (see ncu --query-metrics) for tensor FLOPs, or "
                "set arithmetic-intensity.model_gflops to the model's FLOPs (traceparse flops MODEL).")
    return ""


def _nothing_message(trace: Trace) -> str:
    text = ("The trace has kernels but no FLOP or DRAM byte counters linked to them, no operator FLOPs and no "
            "operator with recorded shapes and a FLOPs formula: there is nothing to place on a roofline.")
    reason = trace.meta.extra.get("no_flops_reason") if trace.meta is not None else None
    return f"{text} {reason[:1].upper()}{reason[1:]}." if reason else text


@hookimpl
def traceparse_rules():
    return [ArithmeticIntensity()]


def _no_roof_share(total: dict) -> str:
    """Why the whole has no share of its roof: no kernel time, or no floating-point work (a roof of 0 FLOP/s at
    0 FLOP/byte), where its DRAM bandwidth against the peak is what it attained (an ncu report of 12 copy and
    fill kernels, all timed, was told it had "no kernel time in the trace")."""
    if not total.get("time_ns"):
        return "; with no kernel time in the trace, its share of the roof is unknown"
    if total.get("dram_bytes") and total.get("peak_gbps"):
        gbps = total["dram_bytes"] / total["time_ns"]  # bytes per ns are GB/s
        return (f"; it counts no floating-point work, so no share of a compute roof: its DRAM traffic ran at "
                f"{fmt_number(gbps)} GB/s, {fmt_pct(100 * gbps / total['peak_gbps'])} of the "
                f"{fmt_number(total['peak_gbps'])} GB/s peak")
    return "; it counts no floating-point work, so no share of a compute roof"
