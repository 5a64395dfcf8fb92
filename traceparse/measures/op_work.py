"""Operator calls with FLOPs and bytes from their recorded shapes, timed by the kernels they launched.

Definitions (the ``arithmetic-intensity`` rule and ``roofline`` use them on a
torch.profiler trace with no counters; docs/flops.md):

* A *formula operator* is an operator row (kind ``op``) that
  :func:`traceparse.measures.op_flops.cost` gives FLOPs for.
* Operators nest in time on their host thread (pid, tid). An operator's
  *owner* is the innermost formula operator enclosing it, itself included.
* A kernel belongs to the operator whose ``external_id`` equals its own
  (Kineto sets it to the innermost operator running at the launch), else to
  the operator of the API call with the same ``correlation_id``; through it,
  to that operator's owner.
* A *placed call* is a formula operator that encloses no other formula
  operator (``aten::cudnn_convolution``, not the ``aten::conv2d`` around it;
  ``aten::addmm``, not ``aten::linear``) and owns at least one kernel: its
  FLOPs and bytes are the formula's, its time the sum of its kernels'
  durations (not their union). A formula operator that encloses another is
  never placed, so no work is counted twice; kernels it owns directly (an
  autocast copy inside ``aten::linear``) are left out, and counted in
  ``uncovered``.
"""

from __future__ import annotations

import polars as pl

from traceparse.measures import op_flops
from traceparse.measures.base import picked

_NO_THREAD = -1
_WORK_SCHEMA = {"event_id": pl.Int64, "name": pl.String, "input_dims": pl.String, "input_types": pl.String,
                "flops": pl.Float64, "bytes": pl.Float64, "family": pl.String, "dtype": pl.String,
                "assumed": pl.String}


def has_kernel_work(events: pl.DataFrame) -> bool:
    """Whether any kernel row carries the FLOPs its source derived for it (a JAX trace's HLO; one filter)."""
    return bool(events.select(((pl.col("kind") == "kernel") & (pl.col("flops") > 0)).any()).item())


def kernel_calls(events) -> tuple[pl.DataFrame, dict]:
    """Kernel rows that carry FLOPs as placed calls, one per kernel: the frame and dict of :func:`placed_calls`.

    The source set ``flops`` and ``bytes`` on the kernel (the JAX reader: from the dot or convolution of the HLO
    instruction the kernel computes), ``input_dims`` / ``input_types`` (that operation's operand shapes and XLA
    element types) and ``concrete_inputs`` (JSON: ``op``, the precision it ran in as ``compute``, ``assumed``).
    The family follows ``op`` (:data:`.op_flops.XLA_FAMILY`), the dtype ``compute``, else the first operand's
    type; the time is the kernel's duration.
    """
    kernels = events.filter((pl.col("kind") == "kernel") & pl.col("duration_ns").is_not_null())
    work = kernels.filter(pl.col("flops").is_not_null() & (pl.col("flops") > 0))
    facts = pl.col("concrete_inputs")
    calls = work.select(
        "event_id", "name", "input_dims", "input_types", "flops", pl.col("bytes").cast(pl.Float64),
        family=facts.str.json_path_match("$.op").replace_strict(op_flops.XLA_FAMILY, default=None,
                                                                 return_dtype=pl.String),
        dtype=pl.coalesce(facts.str.json_path_match("$.compute"),
                          pl.col("input_types").str.json_path_match("$[0]").replace_strict(
                              op_flops.XLA_PRECISION, default=None, return_dtype=pl.String)),
        assumed=facts.str.json_path_match("$.assumed"),
        time_ns="duration_ns", kernels=pl.lit(1, dtype=pl.UInt32), kernel_names=pl.concat_list("name"))
    placed = int(calls["time_ns"].sum() or 0)
    info = {"kernel_ns": int(kernels["duration_ns"].sum() or 0), "placed_ns": placed, "uncovered_ns": 0,
            "formula_calls": calls.height, "without_kernels": 0}
    return calls.sort("event_id"), info


def has_formula_ops(events: pl.DataFrame) -> bool:
    """Whether any operator row has recorded shapes and a name in the formula table (two column filters)."""
    return bool(events.select(((pl.col("kind") == "op") & pl.col("input_dims").is_not_null()
                               & pl.col("name").is_in(list(op_flops.FAMILY))).any()).item())


def formula_costs(ops: pl.DataFrame) -> pl.DataFrame:
    """Per operator row with a formula: event_id, name, input_dims, input_types, flops, bytes, family, dtype,
    assumed (each distinct argument list is worked out once)."""
    candidates = ops.filter(pl.col("name").is_in(list(op_flops.FAMILY)) & pl.col("input_dims").is_not_null())
    keys = candidates.select("name", "input_dims", "input_types", "concrete_inputs").unique()
    outputs = _conv_outputs(keys)
    rows = []
    for name, dims_text, types_text, concrete_text in keys.iter_rows():
        dims = op_flops.parse(dims_text)
        key = (tuple(dims[0]), tuple(dims[1])) if (op_flops.FAMILY[name] == "conv" and dims and len(dims) > 1
                                                   and op_flops.is_shape(dims[0]) and op_flops.is_shape(dims[1])) \
            else None
        found = op_flops.cost(name, dims, op_flops.parse(types_text), op_flops.parse(concrete_text),
                              conv_output=outputs.get(key) if key else None)
        if found is not None:
            rows.append((name, dims_text, types_text, concrete_text, found.flops, found.bytes, found.family,
                         found.dtype, found.assumed))
    table = pl.DataFrame(rows, orient="row", schema={
        "name": pl.String, "input_dims": pl.String, "input_types": pl.String, "concrete_inputs": pl.String,
        "flops": pl.Float64, "bytes": pl.Float64, "family": pl.String, "dtype": pl.String, "assumed": pl.String})
    return (candidates.select("event_id", "name", "input_dims", "input_types", "concrete_inputs")
            .join(table, on=["name", "input_dims", "input_types", "concrete_inputs"], how="inner", nulls_equal=True)
            .drop("concrete_inputs").select(list(_WORK_SCHEMA)))


def _conv_outputs(keys: pl.DataFrame) -> dict[tuple, tuple]:
    """(input shape, weight shape) -> output shape, from the convolution_backward calls (their grad_output),
    for the pairs whose every backward call gives one output shape: two (one weight at stride 1 and 2 on one
    input) say nothing of which a forward call had, so neither is taken."""
    seen: dict[tuple, set] = {}
    backward = keys.filter(pl.col("name").replace_strict(op_flops.FAMILY, default=None) == "conv backward")
    for name, dims_text in backward.select("name", "input_dims").iter_rows():
        shapes = op_flops.conv_backward_shapes(name, op_flops.parse(dims_text))
        if shapes is not None:
            gy, x, w = shapes
            seen.setdefault((tuple(x), tuple(w)), set()).add(tuple(gy))
    return {key: next(iter(out)) for key, out in seen.items() if len(out) == 1}


def owners(ops: pl.DataFrame, formula_ids: pl.Series) -> pl.DataFrame:
    """Per operator: ``event_id``, ``owner`` (the innermost formula operator enclosing it, itself included; null
    when none) and, for formula operators, ``leaf`` (true when no other formula operator has it as owner of a
    formula operator inside it).

    The operators of a thread are ordered by start (longest first on a tie); each starts with the last formula
    operator before it as candidate and, while the candidate ends before the operator does, steps to the
    candidate's own candidate: every step goes to an earlier operator enclosing the innermost answer, so it
    ends there in as many rounds as formula operators nest.
    """
    thread = ["pid", "tid"]
    frame = (ops.select("event_id", pl.col("pid").fill_null(_NO_THREAD), pl.col("tid").fill_null(_NO_THREAD),
                        "start", "end")
             .with_columns(formula=pl.col("event_id").is_in(formula_ids.implode()))
             .sort([*thread, "start", "end", "event_id"], descending=[False, False, False, True, False])
             .with_row_index("row"))
    last = pl.when("formula").then(pl.col("row")).otherwise(None)
    frame = frame.with_columns(cand=last.shift(1).forward_fill().over(thread))
    end = frame["end"]
    cand = frame["cand"]
    for _ in range(10_000):  # bounded by the nesting depth; the bound only guards against a logic error
        cand_end = _at(end, cand)
        outside = (cand.is_not_null() & (cand_end < end)).fill_null(False)
        if not outside.any():
            break
        cand = pl.select(pl.when(outside).then(_at(cand, cand)).otherwise(cand)).to_series()
    ids = frame["event_id"]
    formula = frame["formula"]
    owner = pl.select(pl.when(formula).then(ids).otherwise(_at(ids, cand))).to_series()
    parents = _at(ids, cand).filter(formula).drop_nulls().unique()
    return pl.DataFrame({"event_id": ids, "owner": owner}).with_columns(
        leaf=pl.when(formula).then(~pl.col("event_id").is_in(parents.implode())))


def _at(values: pl.Series, index: pl.Series) -> pl.Series:
    """``values[index]``, null where ``index`` is null."""
    return values.gather(index.fill_null(0)).set(index.is_null(), None)


def placed_calls(events) -> tuple[pl.DataFrame, dict]:
    """The placed calls (module docstring) with their kernels' time, and figures about what was left out.

    Rows: event_id, name, input_dims, input_types, flops, bytes, family, dtype, assumed, time_ns, kernels,
    kernel_names (list). The dict: ``kernel_ns`` (all kernels), ``placed_ns``, ``uncovered_ns`` (kernels
    owned by a formula operator that encloses another), ``formula_calls`` (formula operators),
    ``without_kernels`` (placed candidates that launched none: CPU work). ``events`` may hold several traces
    (a run's ranks, whose event ids, External ids and threads repeat): each trace is worked out alone.
    """
    ops = picked(events, (pl.col("kind") == "op") & pl.col("start_ns").is_not_null()
                 & pl.col("duration_ns").is_not_null(),
                 "trace_id", "event_id", "name", "pid", "tid", pl.col("start_ns").alias("start"),
                 (pl.col("start_ns") + pl.col("duration_ns")).alias("end"), "external_id", "input_dims",
                 "input_types", "concrete_inputs")
    kernels = picked(events, (pl.col("kind") == "kernel") & pl.col("duration_ns").is_not_null(),
                     "trace_id", "name", "duration_ns", "external_id", "correlation_id")
    api = picked(events, (pl.col("kind") == "api") & pl.col("correlation_id").is_not_null(),
                 "trace_id", "event_id", "correlation_id", "external_id", "pid", "tid", "start_ns", "duration_ns")
    empty = pl.DataFrame(schema={**_WORK_SCHEMA, "time_ns": pl.Int64, "kernels": pl.UInt32,
                                 "kernel_names": pl.List(pl.String)})
    info = {"kernel_ns": int(kernels["duration_ns"].sum() or 0), "placed_ns": 0, "uncovered_ns": 0,
            "formula_calls": 0, "without_kernels": 0}
    parts = []
    for trace_id in ops["trace_id"].unique(maintain_order=True).to_list():
        mine = [frame.filter(pl.col("trace_id").eq_missing(trace_id)).drop("trace_id")
                for frame in (ops, kernels, api)]
        placed, part = _placed(*mine)
        for key in ("placed_ns", "uncovered_ns", "formula_calls", "without_kernels"):
            info[key] += part[key]
        if placed.height:
            parts.append(placed.select(list(empty.columns)).cast(empty.schema))
    return (pl.concat(parts) if parts else empty), info


def _placed(ops: pl.DataFrame, kernels: pl.DataFrame, api: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """:func:`placed_calls` on one trace's operators, kernels and API calls."""
    work = formula_costs(ops)
    info = {"placed_ns": 0, "uncovered_ns": 0, "formula_calls": work.height, "without_kernels": 0}
    if work.height == 0:
        return work, info
    owned = owners(ops, work["event_id"])
    linked = _link(kernels, api, ops).join(owned, left_on="op_id", right_on="event_id", how="left")
    per_owner = (linked.filter(pl.col("owner").is_not_null())
                 .group_by("owner").agg(time_ns=pl.col("duration_ns").sum(), kernels=pl.len(),
                                        kernel_names=pl.col("name").unique().sort()))
    leaves = owned.filter(pl.col("leaf").fill_null(False)).select("event_id")
    calls = (work.join(leaves, on="event_id", how="inner")
             .join(per_owner, left_on="event_id", right_on="owner", how="left"))
    placed = calls.filter(pl.col("kernels").is_not_null()).sort("event_id")
    uncovered = per_owner.join(leaves, left_on="owner", right_on="event_id", how="anti")
    info.update(placed_ns=int(placed["time_ns"].sum() or 0), uncovered_ns=int(uncovered["time_ns"].sum() or 0),
                without_kernels=calls.height - placed.height)
    return placed, info


def _link(kernels: pl.DataFrame, api: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Kernels (name, duration_ns) with ``op_id``: the operator of their External id, else of their launch's;
    where the External ids are correlation ids (:func:`_ids_are_correlations`), the innermost operator around
    the launch call on its thread."""
    if _ids_are_correlations(kernels):
        return _link_by_nesting(kernels, api, ops)
    api = api.filter(pl.col("external_id").is_not_null())
    op_of = (ops.filter(pl.col("external_id").is_not_null()).sort("event_id")
             .unique(subset=["external_id"], keep="first").select("external_id", pl.col("event_id").alias("op_id")))
    api = (api.sort("event_id").unique(subset=["correlation_id"], keep="first")
           .select("correlation_id", pl.col("external_id").alias("api_external_id")))
    linked = (kernels.join(op_of, on="external_id", how="left")
              .join(api, on="correlation_id", how="left")
              .join(op_of.rename({"external_id": "api_external_id", "op_id": "api_op_id"}),
                    on="api_external_id", how="left"))
    return linked.select("name", "duration_ns", op_id=pl.coalesce("op_id", "api_op_id"))


def _ids_are_correlations(kernels: pl.DataFrame) -> bool:
    """True when every kernel's External id is its own correlation id (at least two kernels): Kineto before
    pytorch/kineto#1001 wrote the correlation id there for GPU activities and runtime calls, so the id names
    whatever operator happens to have that number (a GEMM credited to an ``aten::dropout`` that launched
    nothing, a kernel that ran 20 ms before its ``aten::addmm``)."""
    both = kernels.filter(pl.col("external_id").is_not_null() & pl.col("correlation_id").is_not_null())
    return both.height >= 2 and bool((both["external_id"] == both["correlation_id"]).all())


def _link_by_nesting(kernels: pl.DataFrame, api: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Kernels with ``op_id``: the innermost operator open on the launch call's thread when the call began."""
    from traceparse.measures.nesting import parents

    thread = ["pid", "tid"]
    calls = api.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
                       & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null())
    host = pl.concat([
        ops.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null()).select(
            pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "event_id", start_ns=pl.col("start"),
            duration_ns=pl.col("end") - pl.col("start"), call=pl.lit(False)),
        calls.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "event_id", "start_ns",
                     "duration_ns", call=pl.lit(True))])
    if host.height == 0:
        return kernels.select("name", "duration_ns", op_id=pl.lit(None, pl.Int64))
    nested = host.with_columns(parents(host, thread))
    op_ids = ops["event_id"].implode()
    launch_op = (nested.filter(pl.col("call") & pl.col("parent_event_id").is_in(op_ids))
                 .select("event_id", op_id="parent_event_id")
                 .join(calls.sort("event_id").unique(subset=["correlation_id"], keep="first")
                       .select("event_id", "correlation_id"), on="event_id")
                 .select("correlation_id", "op_id"))
    return (kernels.join(launch_op, on="correlation_id", how="left")
            .select("name", "duration_ns", "op_id"))
