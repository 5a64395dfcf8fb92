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
* A formula operator that owns a sparse tensor's accessor (``aten::_values``,
  ``aten::_indices``, ...: :data:`SPARSE_ACCESSORS`) ran on a sparse tensor,
  whose recorded dims are the dense shape: it is never placed (no dense
  formula fits its work) and its kernels count as not placed.
"""

from __future__ import annotations

import polars as pl

from traceparse.expr import by_id
from traceparse.measures import op_flops
from traceparse.measures.base import picked, shared
from traceparse.measures.nesting import climb

_NO_THREAD = -1
#: Operators only a sparse tensor has (COO's values and indices, CSR/CSC's compressed indices): one running
#: inside a formula operator says that operator was given a sparse tensor. Kineto records a sparse tensor's dims
#: as its dense shape (and its strides as ``[]``), so the formula would cost the dense operation: a sparse
#: gradient's ``aten::add`` into a 200,000-row embedding read as three dense 51 MB tensors.
SPARSE_ACCESSORS = ("aten::_values", "aten::_indices", "aten::values", "aten::indices", "aten::_nnz",
                    "aten::crow_indices", "aten::col_indices", "aten::ccol_indices", "aten::row_indices")
_WORK_SCHEMA = {"event_id": pl.Int64, "name": pl.String, "input_dims": pl.String, "input_types": pl.String,
                "flops": pl.Float64, "bytes": pl.Float64, "family": pl.String, "dtype": pl.String,
                "assumed": pl.String}


def has_kernel_work(events: pl.DataFrame) -> bool:
    """Whether any kernel row carries the FLOPs its source derived for it (a JAX trace's HLO; one filter, once in an
    analysis: the rule asks whether it applies, then the roofline which source to take)."""
    return shared(events, "has_kernel_work", lambda: bool(
        events.select(((pl.col("kind") == "kernel") & (pl.col("flops") > 0)).any()).item()))


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
            "formula_calls": calls.height, "without_kernels": 0, "sparse_calls": 0}
    return calls.sort("event_id"), info


def has_formula_ops(events: pl.DataFrame) -> bool:
    """Whether any operator row has recorded shapes and a name in the formula table (two column filters, once in an
    analysis: :func:`has_kernel_work`)."""
    return shared(events, "has_formula_ops", lambda: bool(
        events.select(((pl.col("kind") == "op") & pl.col("input_dims").is_not_null()
                       & pl.col("name").is_in(list(op_flops.FAMILY))).any()).item()))


def formula_costs(ops: pl.DataFrame) -> pl.DataFrame:
    """Per operator row with a formula: event_id, name, input_dims, input_types, flops, bytes, family, dtype,
    assumed (each distinct argument list is worked out once; with a :data:`_TRACE` column, each trace's rows
    with its own convolutions' output shapes, and that column kept)."""
    by = [_TRACE] if _TRACE in ops.columns else []
    args = ["name", "input_dims", "input_types", "concrete_inputs"]
    candidates = ops.filter(pl.col("name").is_in(list(op_flops.FAMILY)) & pl.col("input_dims").is_not_null())
    keys = candidates.select(*by, *args).unique()
    outputs = _conv_outputs(keys, by)
    found_of: dict[tuple, op_flops.Cost | None] = {}  # a run's ranks repeat their argument lists: each costed once
    rows = []
    for row in keys.iter_rows():
        trace = row[0] if by else None
        name, dims_text, types_text, concrete_text = row[len(by):]
        dims = op_flops.parse(dims_text)
        key = (trace, tuple(dims[0]), tuple(dims[1])) if (op_flops.FAMILY[name] == "conv" and dims and len(dims) > 1
                                                          and op_flops.is_shape(dims[0])
                                                          and op_flops.is_shape(dims[1])) else None
        output = outputs.get(key) if key else None
        if (name, dims_text, types_text, concrete_text, output) not in found_of:
            found_of[name, dims_text, types_text, concrete_text, output] = op_flops.cost(
                name, dims, op_flops.parse(types_text), op_flops.parse(concrete_text), conv_output=output)
        found = found_of[name, dims_text, types_text, concrete_text, output]
        if found is not None:
            rows.append((*row, found.flops, found.bytes, found.family, found.dtype, found.assumed))
    table = pl.DataFrame(rows, orient="row", schema={
        **{c: ops.schema[c] for c in by}, "name": pl.String, "input_dims": pl.String, "input_types": pl.String,
        "concrete_inputs": pl.String, "flops": pl.Float64, "bytes": pl.Float64, "family": pl.String,
        "dtype": pl.String, "assumed": pl.String})
    return (candidates.select(*by, "event_id", *args)
            .join(table, on=[*by, *args], how="inner", nulls_equal=True)
            .drop("concrete_inputs").select(*by, *_WORK_SCHEMA))


def _conv_outputs(keys: pl.DataFrame, by: list[str]) -> dict[tuple, tuple]:
    """(trace, input shape, weight shape) -> output shape, from the convolution_backward calls (their
    grad_output), for the pairs whose every backward call in that trace gives one output shape: two (one weight
    at stride 1 and 2 on one input) say nothing of which a forward call had, so neither is taken. The trace is
    the :data:`_TRACE` column of ``by``, else None."""
    seen: dict[tuple, set] = {}
    backward = keys.filter(pl.col("name").replace_strict(op_flops.FAMILY, default=None) == "conv backward")
    for row in backward.select(*by, "name", "input_dims").iter_rows():
        trace = row[0] if by else None
        shapes = op_flops.conv_backward_shapes(row[-2], op_flops.parse(row[-1]))
        if shapes is not None:
            gy, x, w = shapes
            seen.setdefault((trace, tuple(x), tuple(w)), set()).add(tuple(gy))
    return {key: next(iter(out)) for key, out in seen.items() if len(out) == 1}


def owners(ops: pl.DataFrame, formula: pl.DataFrame) -> pl.DataFrame:
    """Per operator: ``event_id``, ``owner`` (the innermost formula operator enclosing it, itself included; null
    when none) and, for formula operators, ``leaf`` (true when no other formula operator has it as owner of a
    formula operator inside it). ``formula``: the formula operators' ``event_id`` (and :data:`_TRACE`, where
    ``ops`` holds several traces: then kept, and operators nest within their trace).

    The operators of a thread are ordered by start (longest first on a tie); each starts with the last formula
    operator before it as candidate and, while the candidate ends before the operator does, steps to the
    candidate's own candidate: every step goes to an earlier operator enclosing the innermost answer, so it
    ends there in as many rounds as formula operators nest. All operators step at once
    (:func:`~traceparse.measures.nesting.climb`; a polars gather of every row per round took three times as long).
    """
    import numpy as np

    by = [_TRACE] if _TRACE in ops.columns else []
    thread = [*by, "pid", "tid"]
    frame = (ops.select(*by, "event_id", pl.col("pid").fill_null(_NO_THREAD), pl.col("tid").fill_null(_NO_THREAD),
                        "start", "end")
             .join(formula.select(*by, "event_id").unique().with_columns(formula=pl.lit(True)),
                   on=[*by, "event_id"], how="left")
             .with_columns(pl.col("formula").fill_null(False))
             .sort([*thread, "start", "end", "event_id"], descending=[False] * len(thread) + [False, True, False]))
    n = frame.height
    is_formula = frame["formula"].to_numpy()
    end = frame["end"].to_numpy()
    thread_id = frame.select(t=pl.struct(thread).rle_id())["t"].to_numpy()
    first = np.flatnonzero(np.diff(thread_id, prepend=-1))[thread_id]  # the first row of each row's thread
    last = np.maximum.accumulate(np.where(is_formula, np.arange(n, dtype=np.int64), -1))
    cand = np.full(n, -1, dtype=np.int64)
    cand[1:] = last[:-1]  # the last formula operator before the row, if on its thread
    cand[cand < first] = -1
    cand = climb(cand, lambda c, row: end[c] < end[row])  # while the candidate ends before the operator does
    ids = frame["event_id"]
    has = cand >= 0
    raw = np.zeros(n, dtype=np.int64)
    raw[has] = ids.to_numpy()[cand[has]]
    enclosing = pl.select(pl.when(pl.Series(has)).then(pl.Series(raw, dtype=ids.dtype))).to_series()
    owner = pl.select(pl.when(frame["formula"]).then(ids).otherwise(enclosing)).to_series()
    parents = (frame.select(*by, event_id=enclosing).filter(frame["formula"]).drop_nulls().unique()
               .with_columns(parent=pl.lit(True)))
    return (frame.select(*by, "event_id", owner=owner, formula="formula")
            .join(parents, on=[*by, "event_id"], how="left", maintain_order="left")
            .select(*by, "event_id", "owner",
                    leaf=pl.when("formula").then(pl.col("parent").is_null())))


#: The column numbering each trace of a frame that holds several (a run's ranks, whose event ids, External ids
#: and threads repeat): every join and thread of :func:`placed_calls` is within one trace.
_TRACE = "_trace"


def placed_calls(events) -> tuple[pl.DataFrame, dict]:
    """The placed calls (module docstring) with their kernels' time, and figures about what was left out.

    Rows: event_id, name, input_dims, input_types, flops, bytes, family, dtype, assumed, time_ns, kernels,
    kernel_names (list). The dict: ``kernel_ns`` (all kernels), ``placed_ns``, ``uncovered_ns`` (kernels
    owned by a formula operator that encloses another), ``formula_calls`` (formula operators),
    ``without_kernels`` (placed candidates that launched none: CPU work), ``sparse_calls`` (candidates given a
    sparse tensor: not placed). ``events`` may hold several traces
    (a run's ranks): each trace is worked out alone, all in one pass (a loop over 256 ranks took 8.6 s), and
    its rows come in the order the traces first appear, each trace's by event id.
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
            "formula_calls": 0, "without_kernels": 0, "sparse_calls": 0}
    traces = ops["trace_id"].unique(maintain_order=True).to_list()
    number = {t: i for i, t in enumerate(traces) if t is not None}
    code = (pl.when(pl.col("trace_id").is_null()).then(traces.index(None) if None in traces else -1)
            .otherwise(pl.col("trace_id").replace_strict(number, default=-1, return_dtype=pl.Int32))
            .cast(pl.Int32).alias(_TRACE))
    ops, kernels, api = (frame.with_columns(code).drop("trace_id") for frame in (ops, kernels, api))
    work = formula_costs(ops)
    info["formula_calls"] = work.height
    if work.height == 0:
        return empty, info
    owned = owners(ops, work)
    on_sparse = _on_sparse_tensors(ops, owned)
    linked = _link(kernels, api, ops).join(owned, left_on=[_TRACE, "op_id"], right_on=[_TRACE, "event_id"],
                                           how="left")
    per_owner = (linked.filter(pl.col("owner").is_not_null())
                 .group_by(_TRACE, "owner").agg(time_ns=pl.col("duration_ns").sum(), kernels=pl.len(),
                                                kernel_names=pl.col("name").unique().sort()))
    leaves = owned.filter(pl.col("leaf").fill_null(False)).select(_TRACE, "event_id")
    calls = (work.join(leaves, on=[_TRACE, "event_id"], how="inner")
             .join(per_owner, left_on=[_TRACE, "event_id"], right_on=[_TRACE, "owner"], how="left"))
    if on_sparse.height:  # their kernels stay theirs (no enclosing call is placed with them), not placed
        info["sparse_calls"] = calls.join(on_sparse, on=[_TRACE, "event_id"], how="semi").height
        calls = calls.join(on_sparse, on=[_TRACE, "event_id"], how="anti")
    placed = calls.filter(pl.col("kernels").is_not_null()).sort(_TRACE, "event_id")
    uncovered = per_owner.join(leaves, left_on=[_TRACE, "owner"], right_on=[_TRACE, "event_id"], how="anti")
    info.update(placed_ns=int(placed["time_ns"].sum() or 0), uncovered_ns=int(uncovered["time_ns"].sum() or 0),
                without_kernels=calls.height - placed.height)
    return placed.select(list(empty.columns)).cast(empty.schema), info


def _on_sparse_tensors(ops: pl.DataFrame, owned: pl.DataFrame) -> pl.DataFrame:
    """The formula operators (:data:`_TRACE`, ``event_id``) that own a sparse tensor's accessor
    (:data:`SPARSE_ACCESSORS`): they ran on a sparse tensor. ``owned``: :func:`owners` of ``ops``."""
    accessors = ops.filter(pl.col("name").is_in(SPARSE_ACCESSORS)).select(_TRACE, "event_id")
    if accessors.height == 0:
        return accessors
    return (owned.join(accessors, on=[_TRACE, "event_id"], how="semi").select(_TRACE, event_id="owner")
            .drop_nulls().unique())


def _link(kernels: pl.DataFrame, api: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Kernels (:data:`_TRACE`, name, duration_ns) with ``op_id``: the operator of their External id, else of their
    launch's; in a trace whose External ids are correlation ids (:func:`_ids_are_correlations`), the innermost
    operator around the launch call on its thread."""
    by_nesting = _ids_are_correlations(kernels)
    if by_nesting:
        nested = [frame.filter(pl.col(_TRACE).is_in(by_nesting)) for frame in (kernels, api, ops)]
        kernels, api, ops = (frame.filter(~pl.col(_TRACE).is_in(by_nesting)) for frame in (kernels, api, ops))
    key = [_TRACE, "external_id"]
    api = api.filter(pl.col("external_id").is_not_null())
    # the columns used before the sort: sorting the operators' argument texts along took 20 ms
    op_of = (by_id(ops.filter(pl.col("external_id").is_not_null()).select(*key, "event_id"))
             .unique(subset=key, keep="first").select(*key, pl.col("event_id").alias("op_id")))
    api = (by_id(api.select(_TRACE, "correlation_id", "external_id", "event_id"))
           .unique(subset=[_TRACE, "correlation_id"], keep="first")
           .select(_TRACE, "correlation_id", pl.col("external_id").alias("api_external_id")))
    linked = (kernels.join(op_of, on=key, how="left")
              .join(api, on=[_TRACE, "correlation_id"], how="left")
              .join(op_of.rename({"external_id": "api_external_id", "op_id": "api_op_id"}),
                    on=[_TRACE, "api_external_id"], how="left"))
    linked = linked.select(_TRACE, "name", "duration_ns", op_id=pl.coalesce("op_id", "api_op_id"))
    return pl.concat([linked, _link_by_nesting(*nested)]) if by_nesting else linked


def _ids_are_correlations(kernels: pl.DataFrame) -> list[int]:
    """The traces (:data:`_TRACE`) where every kernel's External id is its own correlation id (at least two
    kernels): Kineto before pytorch/kineto#1001 wrote the correlation id there for GPU activities and runtime
    calls, so the id names whatever operator happens to have that number (a GEMM credited to an
    ``aten::dropout`` that launched nothing, a kernel that ran 20 ms before its ``aten::addmm``)."""
    both = kernels.filter(pl.col("external_id").is_not_null() & pl.col("correlation_id").is_not_null())
    same = both.group_by(_TRACE).agg(n=pl.len(), same=(pl.col("external_id") == pl.col("correlation_id")).all())
    return sorted(same.filter((pl.col("n") >= 2) & pl.col("same"))[_TRACE].to_list())


def _link_by_nesting(kernels: pl.DataFrame, api: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Kernels with ``op_id``: the innermost operator open on the launch call's thread when the call began."""
    from traceparse.measures.nesting import parents

    thread = [_TRACE, "pid", "tid"]
    calls = api.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
                       & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null())
    host = pl.concat([
        ops.filter(pl.col("pid").is_not_null() & pl.col("tid").is_not_null()).select(
            _TRACE, pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "event_id",
            start_ns=pl.col("start"), duration_ns=pl.col("end") - pl.col("start"), call=pl.lit(False)),
        calls.select(_TRACE, pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "event_id", "start_ns",
                     "duration_ns", call=pl.lit(True))])
    if host.height == 0:
        return kernels.select(_TRACE, "name", "duration_ns", op_id=pl.lit(None, pl.Int64))
    nested = host.with_columns(parents(host, thread))
    launch_op = (nested.filter(pl.col("call"))
                 .join(ops.select(_TRACE, parent_event_id="event_id").unique(), on=[_TRACE, "parent_event_id"])
                 .select(_TRACE, "event_id", op_id="parent_event_id")
                 .join(calls.sort("event_id").unique(subset=[_TRACE, "correlation_id"], keep="first")
                       .select(_TRACE, "event_id", "correlation_id"), on=[_TRACE, "event_id"])
                 .select(_TRACE, "correlation_id", "op_id"))
    return (kernels.join(launch_op, on=[_TRACE, "correlation_id"], how="left")
            .select(_TRACE, "name", "duration_ns", "op_id"))
