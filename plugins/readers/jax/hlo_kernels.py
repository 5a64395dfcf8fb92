"""Which HLO instruction each kernel computes, and that instruction's FLOPs and bytes on the kernel's row.

A kernel row names its module (``hlo_module``, and the ``program_id`` stat: the ``HloModuleProto``'s id) and
what XLA ran (``hlo_op``). It is matched to one instruction of that module (:mod:`.hlo_cost`), first way that
applies:

1. **by ``hlo_op``**: the instruction of that name (each thunk launched alone: ``gemm_fusion_dot.17``,
   ``custom-call.1``);
2. **by the schedule**: kernels a CUDA graph replays (XLA's command buffers) all name the command buffer
   (``command_buffer_1``); the kernels of one replay (one ``correlation_id``), in time order, are paired with
   the module's scheduled instructions that run GPU work when there are as many, and each pair fits: the
   kernel is named after its instruction, or after an instruction alike in opcode, shapes and fused
   opcodes (XLA emits one kernel for such instructions and names it after the first), or it is a library
   kernel (``nvjet_sm90_...``, ``Cijk_...``: a name no instruction has) and the instruction a library call;
3. **by name**: a kernel named after an instruction (``gemm_fusion_dot_17`` → ``gemm_fusion_dot.17``; ROCm's
   ``.kd`` suffix dropped), for replays that do not pair up. Library kernels stay unmatched then.

An instruction may run as several kernels (MIOpen's convolution: ``Im3d2Col`` then its GEMM; cuDNN's: two
``convertTensor_kernel`` then the GEMM). A run of consecutive kernels of one instruction on a device holds as
many *executions* as the shortest pattern of their names repeats in it (``A A B``: one; ``A B A B``: two;
``A A``: two); an execution's FLOPs and bytes are shared among its kernels in
proportion to their durations, so any sum over kernels is the instructions' and every kernel's FLOP/s is
its execution's. Columns set on the kernels of instructions with a dot or a convolution: ``flops``,
``bytes``, ``input_dims`` (the dot's or convolution's operand shapes, JSON), ``input_types`` (their XLA
element types: ``bf16``, ``f32``), ``concrete_inputs`` (JSON: ``instruction``, ``op``, ``matched``, ``dots``,
the dot dimension numbers, ``compute`` (the precision the matrix work ran in, where the HLO says or it is
assumed), ``assumed``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import polars as pl

from traceparse_plugins.readers.jax.hlo_cost import NO_WORK, Module, _backend, kernel_name

#: Library fusion kinds whose kernels are the library's (named by it, not by XLA).
_LIBRARY_FUSIONS = ("__cublas", "__cudnn", "__custom_fusion", "__hipblas", "__miopen")
OUT_SCHEMA = {"event_id": pl.Int64, "flops": pl.Float64, "bytes": pl.Int64, "input_dims": pl.String,
              "input_types": pl.String, "concrete_inputs": pl.String}


@dataclass
class HloNotes:
    """How the kernels were matched, for the trace's summary."""

    kernels: int = 0
    by_hlo_op: int = 0
    by_schedule: int = 0
    by_name: int = 0
    unmatched: int = 0
    without_module: int = 0
    with_flops: int = 0
    unmatched_names: dict[str, int] = field(default_factory=dict)


def attach(rows: pl.DataFrame, modules: list[Module]) -> tuple[pl.DataFrame, HloNotes]:
    """``rows`` (with a ``_program_id`` column) with the work columns set on the kernels it can match."""
    notes = HloNotes()
    kernels = (rows.filter((pl.col("kind") == "kernel") & pl.col("hlo_module").is_not_null())
               .select("event_id", "name", "start_ns", "duration_ns", "device_id", "correlation_id", "hlo_module",
                       "hlo_op", "_program_id")
               .sort("device_id", "start_ns", "event_id", nulls_last=True))
    notes.kernels = kernels.height
    if not kernels.height or not modules:
        notes.without_module = kernels.height
        return rows, notes
    by_id = {m.id: m for m in modules}
    names: dict[str, list[Module]] = {}
    for m in modules:
        names.setdefault(m.name, []).append(m)
    matched: dict[int, tuple[Module, object, str]] = {}
    for (program, module_name), group in kernels.group_by("_program_id", "hlo_module", maintain_order=True):
        module = by_id.get(program)
        if module is None or module.name != module_name:
            candidates = names.get(module_name, [])
            module = candidates[0] if len(candidates) == 1 else None
        if module is None:
            notes.without_module += group.height
            continue
        _match(module, group, matched, notes)
    return _write(rows, kernels, matched, notes), notes


def _match(module: Module, group: pl.DataFrame, matched: dict, notes: HloNotes) -> None:
    """Match one module's kernels (module docstring), recording each in ``matched`` by event id."""
    rest = []
    for event_id, op, corr, name in group.select("event_id", "hlo_op", "correlation_id", "name").iter_rows():
        inst = module.by_name.get(op) if op is not None else None
        if inst is not None and inst.opcode not in NO_WORK:
            matched[event_id] = (module, inst, "hlo_op")
            notes.by_hlo_op += 1
        else:
            rest.append((event_id, corr, _strip(name)))
    replays: dict[object, list[tuple[int, str]]] = {}
    for event_id, corr, name in rest:  # in time order already
        replays.setdefault(corr, []).append((event_id, name))
    cache: dict[tuple[str, ...], tuple[list, str]] = {}
    for kernels in replays.values():
        key = tuple(n for _, n in kernels)
        if key not in cache:
            cache[key] = _pair(module, list(key))
        instructions, how = cache[key]
        for (event_id, name), inst in zip(kernels, instructions):
            if inst is None:
                notes.unmatched += 1
                notes.unmatched_names[name] = notes.unmatched_names.get(name, 0) + 1
                continue
            matched[event_id] = (module, inst, how)
            if how == "schedule":
                notes.by_schedule += 1
            else:
                notes.by_name += 1


def _strip(name: str | None) -> str:
    """A kernel's name without ROCm's ``.kd`` suffix."""
    name = name or ""
    return name[:-3] if name.endswith(".kd") else name


def _pair(module: Module, names: list[str]) -> tuple[list, str]:
    """The instruction of each kernel of one replay, and how they were found ("schedule" or "name")."""
    scheduled = module.scheduled_work
    if len(scheduled) == len(names) and all(_fits(module, inst, n) for inst, n in zip(scheduled, names)):
        return scheduled, "schedule"
    return [module.by_kernel_name.get(n) for n in names], "name"


def _fits(module: Module, inst, name: str) -> bool:
    """Whether a kernel of this name can be this instruction's (module docstring, way 2)."""
    if kernel_name(inst.name) == name:
        return True
    other = module.by_kernel_name.get(name)
    if other is not None:
        return module.signature(other) == module.signature(inst)
    if inst.opcode in ("custom-call", "convolution"):
        return True
    if inst.opcode == "fusion":
        kind = (_backend(inst).get("fusion_backend_config") or {}).get("kind") or ""
        return isinstance(kind, str) and kind.startswith(_LIBRARY_FUSIONS)
    return False


def _write(rows: pl.DataFrame, kernels: pl.DataFrame, matched: dict, notes: HloNotes) -> pl.DataFrame:
    """The work columns of the matched kernels joined onto ``rows`` (an execution's work shared by duration)."""
    out = {k: [] for k in OUT_SCHEMA}
    run: list[tuple[int, str, int, object, str]] = []  # (event id, name, duration, work, how) of the run being read
    last_key = None

    def flush():
        names = [r[1] for r in run]
        period = _period(names)
        for k in range(0, len(run), period):
            _share(run[k: k + period], out)
        notes.with_flops += len(run)
        run.clear()

    for event_id, name, duration, device in kernels.select("event_id", "name", "duration_ns", "device_id").iter_rows():
        hit = matched.get(event_id)
        work = hit[0].work(hit[1]) if hit is not None else None
        key = (device, hit[0].id, hit[1].id) if work is not None else None
        if run and key != last_key:
            flush()
        last_key = key
        if work is not None:
            run.append((event_id, name, duration or 0, work, hit[2]))
    if run:
        flush()
    if not out["event_id"]:
        return rows
    frame = pl.DataFrame(out, schema=OUT_SCHEMA)
    shared = [c for c in frame.columns if c != "event_id" and c in rows.columns]  # bytes: the copies' own
    joined = rows.join(frame, on="event_id", how="left", maintain_order="left", suffix="_work")
    return joined.with_columns(pl.coalesce(f"{c}_work", c).alias(c) for c in shared).drop(f"{c}_work" for c in shared)


def _period(names: list[str]) -> int:
    """The kernels of one execution in a run of one instruction's kernels: the shortest repeating pattern of
    their names that fills the run (``A A B``: one execution; ``A B A B``: two; ``A A``: two)."""
    n = len(names)
    for p in range(1, n + 1):
        if n % p == 0 and all(names[i] == names[i % p] for i in range(n)):
            return p
    return n


def _share(execution: list, out: dict) -> None:
    """One execution's work shared among its kernels in proportion to their durations (evenly when they have
    none), the bytes' remainder on the last so that they add up."""
    total = sum(max(d, 0) for _, _, d, _, _ in execution)
    work = execution[0][3]
    left = work.bytes
    for k, (event_id, _, duration, _, how) in enumerate(execution):
        share = (max(duration, 0) / total) if total else 1 / len(execution)
        if work.bytes is None:
            part = None
        elif k == len(execution) - 1:
            part = left
        else:
            part = int(work.bytes * share)
            left -= part
        out["event_id"].append(event_id)
        out["flops"].append(float(work.flops) * share if len(execution) > 1 else float(work.flops))
        out["bytes"].append(part)
        out["input_dims"].append(json.dumps(work.dims))
        out["input_types"].append(json.dumps(work.types))
        out["concrete_inputs"].append(json.dumps(_facts(work, how)))


def _facts(work, how: str) -> dict:
    """The ``concrete_inputs`` of a kernel with work: what its FLOPs were computed from, and how it was matched."""
    facts = {"instruction": work.instruction, "op": work.op, "matched": how}
    if work.count > 1:
        facts["dots"] = work.count
    if work.dimension_numbers:
        facts.update(work.dimension_numbers)
    if work.compute:
        facts["compute"] = work.compute
    if work.assumed:
        facts["assumed"] = work.assumed
    return facts
