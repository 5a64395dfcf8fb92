"""The work of XLA's HLO instructions: FLOPs of dots and convolutions, and the bytes of their tensors.

XLA's profiler records no FLOPs on the XPlane (no ``flops`` nor ``bytes_accessed`` stat in the captures of
JAX 0.6 to 0.11; xprof computes them later with XLA's cost analysis), but it stores each compiled module's
``HloProto`` (:mod:`.hlo_schema`), which gives every instruction's opcode, shapes and dimension numbers. From
them, the conventions of docs/flops.md (a multiply-add is 2 FLOPs; each tensor read or written once):

* ``dot``: 2 × ∏(result dimensions) × ∏(lhs contracting dimensions) (= 2 · batch · M · N · K);
* ``convolution``: 2 × ∏(output dimensions) × kernel input features × ∏(kernel spatial dimensions)
  (feature groups already divide the kernel's input features);
* library calls: cuBLAS / hipBLASLt (custom-call targets ``__cublas$gemm``, ``__cublas$lt$matmul``...) as a
  dot, with the dimension numbers of their ``gemm_backend_config``; cuDNN / MIOpen convolutions
  (``__cudnn$convForward``, ``...BackwardInput``, ``...BackwardFilter``) as the forward convolution they
  describe (the forward output is operand 0 for the input gradient, operand 1 for the filter gradient);
* a ``fusion`` counts the dots and convolutions of its fused computation (nested fusions included), and
  nothing for its element-wise work;
* bytes: every distinct operand and every result array × element size (a library call's scratch
  workspace, its last ``s8``/``u8`` result, left out): the least traffic the instruction can have.

An instruction with no dot or convolution has no :class:`Work`. The precision the matrix work ran in: the
dot's ``algorithm`` where set; an ``f32`` dot at ``DEFAULT`` precision is assumed to run on TF32 tensor cores
(JAX's default on NVIDIA GPUs since Ampere; ``jax_default_matmul_precision="highest"`` turns it off) and says
so; else the operands' element type.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cached_property

#: PrimitiveType number -> (name as XLA prints it, bits per element); xla_data.proto.
ELEMENT = {1: ("pred", 8), 2: ("s8", 8), 3: ("s16", 16), 4: ("s32", 32), 5: ("s64", 64), 6: ("u8", 8),
           7: ("u16", 16), 8: ("u32", 32), 9: ("u64", 64), 10: ("f16", 16), 11: ("f32", 32), 12: ("f64", 64),
           15: ("c64", 64), 16: ("bf16", 16), 18: ("c128", 128), 19: ("f8e5m2", 8), 20: ("f8e4m3fn", 8),
           21: ("s4", 4), 22: ("u4", 4), 23: ("f8e4m3b11fnuz", 8), 24: ("f8e5m2fnuz", 8), 25: ("f8e4m3fnuz", 8),
           26: ("s2", 2), 27: ("u2", 2), 28: ("f8e4m3", 8), 29: ("f8e3m4", 8), 30: ("s1", 1), 31: ("u1", 1),
           32: ("f4e2m1fn", 4), 33: ("f8e8m0fnu", 8)}
TUPLE = 13
#: Opcodes that run no GPU work of their own (XLA aliases or forwards their buffers).
NO_WORK = frozenset({"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "after-all",
                     "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain"})
#: cuDNN / MIOpen convolution targets -> which convolution: forward, input gradient, filter gradient.
CONV_TARGETS = {"__cudnn$convForward": "forward", "__cudnn$convBiasActivationForward": "forward",
                "__cudnn$convForwardGraph": "forward", "__cudnn$convBackwardInput": "input",
                "__cudnn$convBackwardFilter": "filter"}
#: PrecisionConfig.Algorithm -> the precision its matrix work runs in (x3, x6, x9 algorithms: none).
ALGORITHM = {1: "fp8", 2: "fp8", 3: "fp16", 4: "fp16", 5: "bf16", 6: "bf16", 9: "tf32", 11: "fp32", 12: "fp64"}
_ALGORITHM_NAMES = {"ALG_DOT_ANY_F8_ANY_F8_F32": 1, "ALG_DOT_ANY_F8_ANY_F8_F32_FAST_ACCUM": 2,
                    "ALG_DOT_F16_F16_F16": 3, "ALG_DOT_F16_F16_F32": 4, "ALG_DOT_BF16_BF16_BF16": 5,
                    "ALG_DOT_BF16_BF16_F32": 6, "ALG_DOT_TF32_TF32_F32": 9, "ALG_DOT_F32_F32_F32": 11,
                    "ALG_DOT_F64_F64_F64": 12}
TF32_ASSUMED = ("f32 dot at XLA's DEFAULT precision: TF32 tensor cores assumed (JAX's GPU default; "
                "jax_default_matmul_precision='highest' runs it in fp32)")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def kernel_name(instruction_name: str) -> str:
    """The name XLA gives the kernel it emits for an instruction (``gemm_fusion_dot.17`` -> ``gemm_fusion_dot_17``)."""
    return _NOT_NAME.sub("_", instruction_name)


@dataclass(frozen=True)
class Work:
    """The matrix work of one instruction: FLOPs, bytes, and the shapes and types it was computed from."""

    instruction: str
    op: str                       # "dot" or "convolution": the first one counted
    flops: int
    bytes: int | None             # None when an element type has no known size
    dims: list[list[int]]         # operand shapes of that dot / convolution (lhs, rhs)
    types: list[str]              # their element types, as XLA names them (bf16, f32)
    compute: str | None           # the precision the matrix work ran in, when the HLO says (or it is assumed)
    assumed: str | None
    count: int                    # dots and convolutions counted
    dimension_numbers: dict | None


class Module:
    """One compiled module (``HloModuleProto``): its instructions by id and by name, and their :class:`Work`."""

    def __init__(self, proto) -> None:
        self.name: str = proto.name
        self.id: int = proto.id
        self.proto = proto
        self.computations = {c.id: c for c in proto.computations}
        self.by_id = {i.id: i for c in proto.computations for i in c.instructions}
        self.by_name = {i.name: i for i in self.by_id.values()}
        self._work: dict[int, Work | None] = {}

    @cached_property
    def by_kernel_name(self) -> dict[str, object]:
        """Instructions by the name of the kernel XLA emits for them (names two instructions share left out)."""
        out: dict[str, object] = {}
        clashes = set()
        for inst in self.by_id.values():
            key = kernel_name(inst.name)
            if key in out:
                clashes.add(key)
            out[key] = inst
        return {k: v for k, v in out.items() if k not in clashes}

    @cached_property
    def scheduled_work(self) -> list:
        """The entry computation's instructions that run GPU work, in the order of the module's schedule (the
        order its kernels run on one stream), or in the computation's order where the module has no schedule."""
        entry = self.computations.get(self.proto.entry_computation_id)
        if entry is None:
            return []
        sequences = self.proto.schedule.sequences
        sequence = sequences[entry.id] if entry.id in sequences else None
        ordered = ([self.by_id[i] for i in sequence.instruction_ids if i in self.by_id] if sequence is not None
                   else list(entry.instructions))
        return [i for i in ordered if i.opcode not in NO_WORK]

    def signature(self, inst) -> tuple:
        """What identifies an instruction's computation up to its name: opcode, shapes, fused opcodes (XLA
        reuses one kernel for instructions alike in these)."""
        inner = tuple(sorted(i.opcode for c in inst.called_computation_ids if c in self.computations
                             for i in self.computations[c].instructions))
        return (inst.opcode, _text(inst.shape), tuple(_text(self.by_id[o].shape) for o in inst.operand_ids
                                                      if o in self.by_id), inner, inst.custom_call_target)

    def work(self, inst) -> Work | None:
        """The matrix work of an instruction (module docstring); None when it has no dot or convolution."""
        if inst.id not in self._work:
            self._work[inst.id] = self._compute(inst)
        return self._work[inst.id]

    # -- computation -----------------------------------------------------------
    def _compute(self, inst) -> Work | None:
        parts = list(self._matrix_parts(inst, depth=0))
        if not parts:
            return None
        flops = sum(p[1] for p in parts)
        first = parts[0]
        return Work(instruction=inst.name, op=first[0], flops=flops, bytes=self._bytes(inst), dims=first[2],
                    types=first[3], compute=first[4], assumed=first[5], count=len(parts), dimension_numbers=first[6])

    def _matrix_parts(self, inst, depth: int):
        """(op, flops, operand dims, operand types, compute, assumed, dimension numbers) of each dot and
        convolution an instruction computes."""
        if depth > 8:
            return
        op = inst.opcode
        if op == "dot":
            yield self._dot(inst, _dot_numbers(inst.dot_dimension_numbers), _precision(inst.precision_config))
        elif op == "convolution":
            yield self._conv(inst, "forward")
        elif op == "custom-call":
            target = inst.custom_call_target
            if target.startswith("__cublas"):
                config = _backend(inst).get("gemm_backend_config") or {}
                numbers = config.get("dot_dimension_numbers")
                if isinstance(numbers, dict):
                    yield self._dot(inst, {k: [int(v) for v in numbers.get(k) or []] for k in _DOT_KEYS},
                                    _json_precision(config.get("precision_config")))
            elif target in CONV_TARGETS:
                yield self._conv(inst, CONV_TARGETS[target])
        elif op in ("fusion", "call"):
            for c in inst.called_computation_ids:
                for inner in self.computations[c].instructions if c in self.computations else ():
                    yield from self._matrix_parts(inner, depth + 1)

    def _operand(self, inst, k: int):
        ids = inst.operand_ids
        return self.by_id.get(ids[k]).shape if k < len(ids) and ids[k] in self.by_id else None

    def _dot(self, inst, numbers: dict, precision: tuple[int, list[int]]):
        lhs, rhs, result = self._operand(inst, 0), self._operand(inst, 1), _first_array(inst.shape)
        if lhs is None or rhs is None or result is None:
            return ("dot", 0, [], [], None, None, numbers)
        k = math.prod(lhs.dimensions[d] for d in numbers["lhs_contracting_dimensions"]
                      if d < len(lhs.dimensions))
        flops = 2 * math.prod(result.dimensions) * k
        types = [_type(lhs), _type(rhs)]
        compute, assumed = _compute_precision(types, *precision)
        return ("dot", flops, [list(lhs.dimensions), list(rhs.dimensions)], types, compute, assumed, numbers)

    def _conv(self, inst, kind: str):
        d = inst.convolution_dimension_numbers
        result = _first_array(inst.shape)
        a, b = self._operand(inst, 0), self._operand(inst, 1)
        output = {"forward": result, "input": a, "filter": b}[kind]
        kernel = result if kind == "filter" else b
        if output is None or kernel is None or a is None or b is None:
            return ("convolution", 0, [], [], None, None, None)
        kdims = kernel.dimensions
        if d.kernel_input_feature_dimension >= len(kdims) or any(s >= len(kdims) for s in d.kernel_spatial_dimensions):
            return ("convolution", 0, [], [], None, None, None)
        flops = (2 * math.prod(output.dimensions) * kdims[d.kernel_input_feature_dimension]
                 * math.prod(kdims[s] for s in d.kernel_spatial_dimensions))
        types = [_type(a), _type(b)]
        return ("convolution", flops, [list(a.dimensions), list(b.dimensions)], types, None, None,
                {"kind": kind})

    def _bytes(self, inst) -> int | None:
        """Distinct operands + results, in bytes (a library call's scratch workspace left out)."""
        arrays = []
        for o in dict.fromkeys(inst.operand_ids):
            if o in self.by_id:
                arrays.extend(_arrays(self.by_id[o].shape))
        results = _arrays(inst.shape)
        if (inst.opcode == "custom-call" and inst.shape.element_type == TUPLE and len(results) > 1
                and ELEMENT.get(results[-1].element_type, ("",))[0] in ("s8", "u8")):
            results = results[:-1]
        bits = 0
        for a in arrays + results:
            size = ELEMENT.get(a.element_type)
            if size is None:
                return None
            bits += size[1] * math.prod(a.dimensions)
        return (bits + 7) // 8


_DOT_KEYS = ("lhs_contracting_dimensions", "rhs_contracting_dimensions", "lhs_batch_dimensions",
             "rhs_batch_dimensions")


def _dot_numbers(numbers) -> dict:
    return {k: list(getattr(numbers, k)) for k in _DOT_KEYS}


def _precision(config) -> tuple[int, list[int]]:
    """(algorithm, operand precisions) of a PrecisionConfig message."""
    return config.algorithm, list(config.operand_precision)


def _json_precision(config) -> tuple[int, list[int]]:
    """The same from a backend config's JSON (``{"operand_precision": ["DEFAULT", ...], "algorithm": ...}``)."""
    if not isinstance(config, dict):
        return 0, []
    names = {"DEFAULT": 0, "HIGH": 1, "HIGHEST": 2}
    precisions = [names.get(p, -1) if isinstance(p, str) else p for p in config.get("operand_precision") or []]
    algorithm = config.get("algorithm")
    return (_ALGORITHM_NAMES.get(algorithm, 0 if algorithm in (None, "ALG_UNSET") else -1)
            if isinstance(algorithm, str) or algorithm is None else int(algorithm)), precisions


def _compute_precision(types: list[str], algorithm: int, precisions: list[int]) -> tuple[str | None, str | None]:
    """The precision a dot's matrix work runs in, and the assumption made (module docstring)."""
    if algorithm in ALGORITHM:
        return ALGORITHM[algorithm], None
    if algorithm == 0 and types and all(t == "f32" for t in types) and all(p == 0 for p in precisions):
        return "tf32", TF32_ASSUMED
    return None, None


def _backend(inst) -> dict:
    """An instruction's backend config (JSON on GPU); empty when it is not JSON."""
    try:
        value = json.loads(inst.backend_config or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _arrays(shape) -> list:
    """The array shapes of a shape (a tuple's elements, flattened)."""
    if shape.element_type == TUPLE:
        return [a for t in shape.tuple_shapes for a in _arrays(t)]
    return [shape] if shape.element_type in ELEMENT else []


def _first_array(shape):
    arrays = _arrays(shape)
    return arrays[0] if arrays else None


def _type(shape) -> str:
    return ELEMENT.get(shape.element_type, (f"type{shape.element_type}",))[0]


def _text(shape) -> str:
    if shape.element_type == TUPLE:
        return "(" + ",".join(_text(t) for t in shape.tuple_shapes) + ")"
    return f"{_type(shape)}[{','.join(map(str, shape.dimensions))}]"
