"""Which operator call launched each piece of GPU work, and what one training step costs per layer type.

Definitions (docs/predict.md explains them with an example):

* *Operator*: a row of kind ``op`` (torch.profiler's ``cpu_op``). Annotations
  (``ProfilerStep#N``, ``Optimizer.step#...``: kind ``marker``) and Python
  regions are not operators.
* *Outermost operator*: an operator not enclosed in time by another operator
  of the same host thread (pid, tid): the ``aten::conv2d`` a module's forward
  calls (not the ``aten::cudnn_convolution`` inside it), or
  ``autograd::engine::evaluate_function: ConvolutionBackward0`` on the
  autograd thread. This is one layer call.
* *Attribution*: a GPU activity (kernel, memcpy, memset) belongs to the
  operator whose ``external_id`` equals its own ``external_id`` (Kineto sets
  it to the innermost operator running when the launch was made), or, when
  that is missing or matches no operator, to the operator of the API call with
  the same ``correlation_id``; the call's GPU time is then added to the
  outermost operator enclosing that operator. GPU work that links to no
  operator is *unattributed* (reported, not modelled).
* *Layer call*: an outermost operator with GPU work. Its time is Σ
  duration_ns of its GPU activities (not their union), its type, pass and ops
  come from :mod:`traceparse_plugins.predict.layers`.
* *Per step*: torch.profiler marks each active step with a ``ProfilerStep#N``
  annotation. Step time = the mean duration of the host-side annotations
  (kind marker with a pid; the device-side copies are used only when the host
  ones are missing); per-step layer figures = totals over the trace / the
  number of steps. A trace with no step annotations counts as one step lasting
  its GPU span (first GPU activity start to last end), with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceparse.errors import InputError
from traceparse.figures import fmt_pct
from traceparse.measures import op_flops
from traceparse.trace import Trace
from traceparse_plugins.predict import layers

GPU_KINDS = ("kernel", "memcpy", "memset")
STEP_MARKER = r"^ProfilerStep#\d+$"
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
_NO_THREAD = -1


@dataclass
class TraceProfile:
    """One trace's layer calls and step figures."""

    trace_id: str | None
    path: str | None
    tags: dict[str, str]
    steps: int
    step_ns: float
    step_source: str
    #: One row per layer call: top_id, name, layer_type, pass, gpu_ns, activities, ops.
    calls: pl.DataFrame
    gpu_ns: int
    attributed_ns: int
    warnings: list[str] = field(default_factory=list)
    #: One row per GPU activity: event_id, top_id (null: unattributed), correlation_id, duration_ns.
    activities: pl.DataFrame | None = None

    def per_type(self) -> pl.DataFrame:
        """Per (layer_type, pass): calls, ops and GPU time per step (ops summed over calls that have them)."""
        return (self.calls.group_by("layer_type", "pass")
                .agg(calls=pl.len() / self.steps, ops=pl.col("ops").sum() / self.steps,
                     gpu_ns=pl.col("gpu_ns").sum() / self.steps,
                     calls_without_ops=pl.col("ops").is_null().sum())
                .with_columns(order=pl.col("layer_type").replace_strict(
                    {t: i for i, t in enumerate(layers.TYPE_ORDER)}, default=len(layers.TYPE_ORDER)))
                .sort("order", "pass").drop("order"))


def profile(trace: Trace) -> TraceProfile:
    """Attribute the GPU time of ``trace`` to layer calls (see the module docstring)."""
    events = trace.events
    label = f"trace {trace.id} ({trace.meta.path})"
    ops = (events.filter((pl.col("kind") == "op") & pl.col("start_ns").is_not_null()
                         & pl.col("duration_ns").is_not_null())
           .select("event_id", "name", pl.col("pid").fill_null(_NO_THREAD), pl.col("tid").fill_null(_NO_THREAD),
                   pl.col("start_ns").alias("start"), (pl.col("start_ns") + pl.col("duration_ns")).alias("end"),
                   "external_id", "input_dims", "input_types", "concrete_inputs", "flops"))
    if ops.height == 0:
        raise InputError(f"{label} has no operator events: predict needs torch.profiler traces "
                         "(cpu_op events linked to kernels by External id)")
    warnings: list[str] = []
    ops = _with_top(ops)
    tops = _tops(ops, events)
    steps, step_ns, step_source = _steps(events, warnings, label)
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("start_ns").is_not_null())
    gpu_ns = int(gpu["duration_ns"].sum() or 0)
    linked = _link(gpu, events, ops)
    per_top = (linked.filter(pl.col("top_id").is_not_null())
               .group_by("top_id").agg(gpu_ns=pl.col("duration_ns").sum(), activities=pl.len()))
    attributed_ns = int(per_top["gpu_ns"].sum() or 0)
    if gpu_ns and attributed_ns < gpu_ns:
        share = 100.0 * (gpu_ns - attributed_ns) / gpu_ns
        if share >= 1.0:
            warnings.append(f"{label}: {fmt_pct(share)} of the GPU time links to no operator (unattributed)")
    ops_per_top = _ops(ops, tops, steps, warnings, label)
    calls = (tops.join(per_top, left_on="event_id", right_on="top_id", how="inner")
             .join(ops_per_top, on="event_id", how="left")
             .select(pl.col("event_id").alias("top_id"), "name", "layer_type", "pass", "gpu_ns", "activities", "ops")
             .sort("top_id"))
    missing = calls.filter(pl.col("ops").is_null())
    if missing.height:
        warnings.append(f"{label}: {missing.height} layer calls have no recorded shapes (record_shapes off?) "
                        "and are left out of the fit")
    return TraceProfile(trace.id, trace.meta.path, dict(trace.meta.tags), steps, step_ns, step_source, calls,
                        gpu_ns, attributed_ns, warnings,
                        linked.select("event_id", "top_id", "correlation_id", "duration_ns"))


def _with_top(ops: pl.DataFrame) -> pl.DataFrame:
    """Add ``top_id``: the event_id of the outermost operator enclosing each operator (itself if outermost)."""
    thread = ["pid", "tid"]
    ops = ops.sort([*thread, "start", "end"], descending=[False, False, False, True])
    prev_end = pl.col("end").cum_max().shift(1).over(thread)
    ops = ops.with_columns(is_top=prev_end.is_null() | (pl.col("start") >= prev_end))
    return ops.with_columns(top_id=pl.when("is_top").then(pl.col("event_id")).forward_fill().over(thread))


def _tops(ops: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """The outermost operators with their layer type and pass (optimizer steps found by their annotation)."""
    tops = ops.filter("is_top").select("event_id", "name", "pid", "tid", "start", "end")
    names = tops["name"].unique().to_list()
    kind_of = {n: layers.layer_type(n) for n in names}
    tops = tops.with_columns(layer_type=pl.col("name").replace_strict(kind_of, default=layers.OTHER))
    markers = (events.filter((pl.col("kind") == "marker") & pl.col("name").str.contains(layers.OPTIMIZER_MARKER)
                             & pl.col("start_ns").is_not_null() & pl.col("pid").is_not_null())
               .select(pl.col("pid"), pl.col("tid").fill_null(_NO_THREAD), pl.col("start_ns").alias("m_start"),
                       (pl.col("start_ns") + pl.col("duration_ns")).alias("m_end")).sort("m_start"))
    if markers.height:
        tops = tops.sort("start").join_asof(markers, left_on="start", right_on="m_start", by=["pid", "tid"],
                                            strategy="backward", check_sortedness=False)
        tops = tops.with_columns(layer_type=pl.when(pl.col("m_end") >= pl.col("end"))
                                 .then(pl.lit(layers.OPTIMIZER)).otherwise(pl.col("layer_type"))).drop("m_start",
                                                                                                       "m_end")
    passes = {(n, k): layers.pass_of(n, k) for n, k in tops.select("name", "layer_type").unique().iter_rows()}
    tops = tops.with_columns(pass_=pl.struct("name", "layer_type").map_elements(
        lambda s: passes[(s["name"], s["layer_type"])], return_dtype=pl.String)).rename({"pass_": "pass"})
    return _backward_by_time(tops, events)


def _backward_by_time(tops: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Mark as backward the forward-named operators that run, on a thread, between the first and last
    ``evaluate_function`` operator of that thread in the same step (the autograd engine's own work)."""
    steps = (events.filter((pl.col("kind") == "marker") & pl.col("name").str.contains(STEP_MARKER)
                           & pl.col("pid").is_not_null() & pl.col("start_ns").is_not_null())
             .select(pl.col("start_ns").alias("s_start"), pl.col("name").alias("step")).sort("s_start"))
    tops = tops.sort("start")
    if steps.height:
        tops = tops.join_asof(steps, left_on="start", right_on="s_start", strategy="backward",
                              check_sortedness=False).drop("s_start")
    else:
        tops = tops.with_columns(step=pl.lit(None, dtype=pl.String))
    engine = pl.col("name").str.contains("autograd::engine::evaluate_function")
    spans = (tops.filter(engine).group_by("pid", "tid", "step")
             .agg(b_start=pl.col("start").min(), b_end=pl.col("end").max()))
    tops = tops.join(spans, on=["pid", "tid", "step"], how="left", nulls_equal=True)
    inside = (pl.col("start") >= pl.col("b_start")) & (pl.col("end") <= pl.col("b_end"))
    return tops.with_columns(
        pl.when((pl.col("pass") == "forward") & inside.fill_null(False)).then(pl.lit("backward"))
        .otherwise(pl.col("pass")).alias("pass")).drop("step", "b_start", "b_end")


def _link(gpu: pl.DataFrame, events: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """GPU activities with ``top_id``: by their External id, else through their launch API call's."""
    op_top = (ops.filter(pl.col("external_id").is_not_null())
              .sort("event_id").unique(subset=["external_id"], keep="first")
              .select("external_id", "top_id"))
    api = (events.filter((pl.col("kind") == "api") & pl.col("correlation_id").is_not_null()
                         & pl.col("external_id").is_not_null())
           .sort("event_id").unique(subset=["correlation_id"], keep="first")
           .select("correlation_id", pl.col("external_id").alias("api_external_id")))
    linked = (gpu.select("event_id", "external_id", "correlation_id", "duration_ns")
              .join(op_top, on="external_id", how="left")
              .join(api, on="correlation_id", how="left")
              .join(op_top.rename({"external_id": "api_external_id", "top_id": "api_top_id"}),
                    on="api_external_id", how="left"))
    return linked.with_columns(top_id=pl.coalesce("top_id", "api_top_id"))


def _steps(events: pl.DataFrame, warnings: list[str], label: str) -> tuple[int, float, str]:
    markers = events.filter((pl.col("kind") == "marker") & pl.col("name").str.contains(STEP_MARKER)
                            & pl.col("duration_ns").is_not_null())
    host = markers.filter(pl.col("pid").is_not_null())
    chosen, source = (host, "ProfilerStep annotations (host)") if host.height else \
        (markers, "ProfilerStep annotations (device)")
    if chosen.height:
        per_step = chosen.group_by("name").agg(pl.col("duration_ns").max())
        return per_step.height, float(per_step["duration_ns"].mean()), source
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("start_ns").is_not_null())
    if gpu.height == 0:
        raise InputError(f"{label} has no timed GPU activity to attribute")
    span = int(gpu.select((pl.col("start_ns") + pl.col("duration_ns")).max() - pl.col("start_ns").min()).item())
    warnings.append(f"{label}: no ProfilerStep#N annotations; the whole trace counts as one step of its GPU span")
    return 1, float(span), "GPU span (no step annotations)"


def _ops(ops: pl.DataFrame, tops: pl.DataFrame, steps: int, warnings: list[str], label: str) -> pl.DataFrame:
    """Operations per outermost operator: ``event_id`` (of the outermost operator), ``ops``."""
    keys = ops.select("name", "input_dims", "input_types", "concrete_inputs").unique()
    parsed = {(n, d, t, c): layers.parse_dims(d) for n, d, t, c in keys.iter_rows()}
    outputs: dict[tuple, tuple] = {}
    for (name, *_), dims in parsed.items():
        if name in layers.CONV_BACKWARD:
            key = layers.conv_backward_key(dims)
            if key is not None:
                outputs.setdefault(key, tuple(dims[0]))
    assumed = 0
    rows = []
    for (name, text, types, concrete), dims in parsed.items():
        conv = mm = None
        if name in layers.ATTENTION or name in layers.CONV_FORWARD or name in layers.CONV_BACKWARD \
                or name in layers.MATMUL or name in layers.RECURRENT:
            key = layers.conv_key(dims) if name in layers.CONV_FORWARD else None
            found = op_flops.cost(name, dims, op_flops.parse(types), op_flops.parse(concrete),
                                  conv_output=outputs.get(key) if key is not None else None)
            if found is not None and found.assumed and name in layers.CONV_FORWARD:
                assumed += 1
            flops = found.flops if found is not None else None
            if name in layers.MATMUL:
                mm = flops
            else:
                conv = flops
        rows.append((name, text, types, concrete, conv, mm, layers.elements(dims)))
    if assumed:
        warnings.append(f"{label}: {assumed} forward convolution shapes have neither a recorded stride and padding "
                        "nor a backward call to take the output size from; their FLOPs assume output size = input "
                        "size (stride 1)")
    formulas = pl.DataFrame(rows, schema={"name": pl.String, "input_dims": pl.String, "input_types": pl.String,
                                          "concrete_inputs": pl.String, "conv": pl.Float64, "mm": pl.Float64,
                                          "elements": pl.Float64}, orient="row")
    ops = ops.join(formulas, on=["name", "input_dims", "input_types", "concrete_inputs"], how="left",
                   nulls_equal=True)
    recorded = pl.col("flops").is_not_null() & (pl.col("flops") > 0)
    is_conv = pl.col("name").is_in(list(layers.CONV_FORWARD | layers.CONV_BACKWARD | layers.ATTENTION
                                        | layers.RECURRENT))
    is_mm = pl.col("name").is_in(list(layers.MATMUL))
    ops = ops.with_columns(conv=pl.when(is_conv & recorded).then("flops").otherwise("conv"),
                           mm=pl.when(is_mm & recorded).then("flops").otherwise("mm"))
    conv = _outermost_sum(ops, "conv")
    mm = _outermost_sum(ops, "mm")
    elem = ops.group_by("top_id").agg(elements=pl.col("elements").max())
    params = ops.filter(pl.col("name") == ACCUMULATE_GRAD)["elements"].sum()
    params_per_step = float(params) / steps if params else None
    out = (tops.select("event_id", "layer_type")
           .join(conv, left_on="event_id", right_on="top_id", how="left")
           .join(mm, left_on="event_id", right_on="top_id", how="left")
           .join(elem, left_on="event_id", right_on="top_id", how="left"))
    ops_expr = (pl.when(pl.col("layer_type").is_in(["convolution", "attention", "recurrent"])).then("conv")
                .when(pl.col("layer_type") == "linear").then("mm")
                .when((pl.col("layer_type") == layers.OPTIMIZER) & (pl.col("elements").fill_null(0) <= 1))
                .then(pl.lit(params_per_step, dtype=pl.Float64))
                .otherwise("elements"))
    return out.select("event_id", ops_expr.alias("ops"))


def _outermost_sum(ops: pl.DataFrame, column: str) -> pl.DataFrame:
    """Per top_id, Σ ``column`` over operators that have it and are not nested in another that has it."""
    thread = ["pid", "tid"]
    has = ops.filter(pl.col(column).is_not_null()).sort([*thread, "start", "end"],
                                                        descending=[False, False, False, True])
    prev_end = pl.col("end").cum_max().shift(1).over(thread)
    return (has.filter(prev_end.is_null() | (pl.col("start") >= prev_end))
            .group_by("top_id").agg(pl.col(column).sum()))
