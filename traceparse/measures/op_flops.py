"""FLOPs and bytes of one framework operator call from its recorded shapes: the one formula table.

A torch.profiler trace recorded with ``record_shapes=True`` gives each
operator call its input shapes (``input_dims``), dtypes (``input_types``) and
non-tensor arguments (``concrete_inputs``: stride, padding, ``is_causal``...).
:data:`FORMULAS` turns those into the work the call does: one row per family
of operators, with the formula and where it comes from. docs/flops.md shows
the same table (a test checks that both list the same operators).

Conventions (those of ``torch.utils.flop_counter`` and of TraceLens):

- a multiply-add is 2 FLOPs; a GEMM's bias addition is not counted;
- bytes = (every tensor input + the outputs) × element size: each tensor
  read or written once, the least traffic the call can have (a lower bound on
  DRAM bytes, not a measurement); the output shapes are not recorded, so each
  family says how they follow from the inputs;
- an element-wise or normalization call counts a fixed number of FLOPs per
  element of its main tensor.

Everything here is derived from shapes, never measured: the roofline and the
``arithmetic-intensity`` rule say so wherever they use it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

#: Bytes per element of the dtypes torch.profiler writes in "Input type" (lower-cased); tensor lists and
#: unknown names have none, so their bytes are left out.
DTYPE_BYTES = {
    "double": 8, "long int": 8, "long": 8, "float": 4, "int": 4, "unsigned int": 4, "c10::half": 2,
    "c10::bfloat16": 2, "short int": 2, "short": 2, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1, "unsigned char": 1, "signed char": 1, "bool": 1,
}
#: The dtype (as "Input type" names it) of each number torch.profiler writes for a ScalarType argument (c10's
#: ScalarType enum: an ``out_dtype`` in "Concrete Inputs"); a number not here has no known size.
SCALAR_TYPES = {
    "0": "unsigned char", "1": "signed char", "2": "short int", "3": "int", "4": "long int", "5": "c10::half",
    "6": "float", "7": "double", "11": "bool", "15": "c10::bfloat16", "23": "c10::float8_e5m2",
    "24": "c10::float8_e4m3fn", "25": "c10::float8_e5m2fnuz", "26": "c10::float8_e4m3fnuz",
}
#: Precision of the floating-point dtypes (the GPU catalog's peak names).
DTYPE_PRECISION = {
    "double": "fp64", "float": "fp32", "c10::half": "fp16", "c10::bfloat16": "bf16",
    "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8",
    "c10::float8_e5m2fnuz": "fp8",
}
#: Families whose work runs on matrix units (tensor cores) when the kernels and dtype allow it.
MATRIX_FAMILIES = ("gemm", "grouped gemm", "conv", "conv backward", "attention", "attention backward", "rnn",
                   "rnn backward")
#: XLA element types (as XLA prints them, a kernel row's ``input_types`` in a JAX trace) -> precision.
XLA_PRECISION = {"f64": "fp64", "f32": "fp32", "f16": "fp16", "bf16": "bf16", "f8e4m3fn": "fp8", "f8e5m2": "fp8",
                 "f8e4m3fnuz": "fp8", "f8e5m2fnuz": "fp8", "f8e4m3": "fp8", "f8e4m3b11fnuz": "fp8"}
#: The HLO operation a kernel row's FLOPs come from (``op`` of its ``concrete_inputs``) -> its family.
XLA_FAMILY = {"dot": "gemm", "convolution": "conv"}

TORCH = "torch.utils.flop_counter (PyTorch)"
TRACELENS = "TraceLens PerfModel (AMD-AGI/TraceLens, perf_model.py)"
CUDNN_RNN = ("cuDNN's RNN (per layer and direction, one input-to-hidden GEMM over every step, one hidden-to-hidden "
             "GEMM per step; LSTM 4 gates, GRU 3, plain RNN 1, carried by the weights' shapes)")


@dataclass(frozen=True)
class Formula:
    """One family of operators: its FLOPs and bytes in words, and the source of the formula."""

    family: str
    ops: tuple[str, ...]
    flops: str
    outputs: str
    source: str


#: The formula table: one row per family (docs/flops.md prints it).
FORMULAS: tuple[Formula, ...] = (
    Formula("gemm", ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::bmm", "aten::baddbmm",
                     "aten::matmul", "aten::linear", "aten::_scaled_mm"),
            "2 × batch × M × N × K (A[batch, M, K] × B[batch, K, N]; linear: x[..., K] × weight[N, K]ᵀ; the bias "
            "addition of addmm, baddbmm and linear, the ReLU/GELU of _addmm_activation and the scaling of "
            "_scaled_mm are not counted)",
            "batch × M × N, in A's dtype (_scaled_mm: in its out_dtype)",
            f"{TORCH}: mm_flop, addmm_flop, bmm_flop, baddbmm_flop, _scaled_mm_flop"),
    Formula("grouped gemm", ("aten::_grouped_mm", "aten::_scaled_grouped_mm"),
            "2 × M × N × K summed over the groups (a mixture of experts' GEMMs in one call, the groups cut by "
            "offs): A[M_total, K] × B[G, K, N] 2 × M_total × K × N; A[G, M, K] × B[K, N_total] 2 × M × K × N_total; "
            "A[M, K_total] × B[K_total, N] 2 × M × K_total × N; A[G, M, K] × B[G, K, N] 2 × G × M × K × N. offs is "
            "a tensor the trace does not record, so rows past its last offset (padding) count too; the bias and the "
            "scaling of _scaled_grouped_mm are not counted",
            "M_total × N, M × N_total, G × M × N (grouped along K) or G × M × N, in A's dtype (_scaled_grouped_mm: "
            "in its out_dtype)",
            "written here, from the shapes torch._grouped_mm documents (torch.utils.flop_counter has no formula)"),
    Formula("conv", ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                     "aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::miopen_convolution",
                     "aten::_convolution_mode", "aten::conv2d_padding", "aten::conv_transpose1d",
                     "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::cudnn_convolution_transpose"),
            "2 × N × ∏(weight shape) × ∏(output spatial) (transposed: × ∏(input spatial)), i.e. 2 × output "
            "elements × C_in/groups × kernel area; the output size from stride, padding and dilation in "
            "concrete_inputs: ⌊(in + 2·pad − dil·(k − 1) − 1) / stride⌋ + 1",
            "N × C_out × output spatial", f"{TORCH}: conv_flop_count; output size as TraceLens CONV.get_output_shape"),
    Formula("conv backward", ("aten::convolution_backward", "aten::cudnn_convolution_backward",
                              "aten::convolution_backward_overrideable", "aten::miopen_convolution_backward",
                              "aten::mkldnn_convolution_backward"),
            "the forward's FLOPs for each gradient output_mask asks for: input gradient + weight gradient "
            "(both when the mask is not recorded; the bias gradient is not counted)",
            "input gradient (input's shape), weight gradient (weight's shape), bias gradient (C_out), "
            "as output_mask asks", f"{TORCH}: conv_backward_flop"),
    Formula("attention", ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                          "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                          "aten::_scaled_dot_product_flash_attention_for_cpu",
                          "aten::_scaled_dot_product_attention_math"),
            "2 × B × H_q × L_q × L_kv × (E_qk + E_v) (QKᵀ and PV); halved when is_causal is True and L_q = L_kv",
            "B × H_q × L_q × E_v", f"{TORCH}: sdpa_flop_count; causal halving as {TRACELENS} SDPA.flops_func"),
    Formula("attention backward", ("aten::_scaled_dot_product_flash_attention_backward",
                                   "aten::_scaled_dot_product_efficient_attention_backward",
                                   "aten::_scaled_dot_product_cudnn_attention_backward"),
            "2 × B × H_q × L_q × L_kv × (3·E_qk + 2·E_v) (scores recomputed, dV, dP, dQ, dK); halved when "
            "is_causal is True and L_q = L_kv",
            "dQ, dK, dV (the shapes of q, k, v)", f"{TORCH}: sdpa_backward_flop_count; causal halving as TraceLens"),
    Formula("rnn", ("aten::_cudnn_rnn", "aten::miopen_rnn"),
            "2 × tokens × Σ elements of the weight matrices (every layer and direction: input-to-hidden, "
            "hidden-to-hidden and projection weights, each applied once per token); tokens: the input's "
            "elements over its last dimension (batch × sequence, or a packed sequence's length); the gates' "
            "element-wise work and the biases are not counted",
            "batch × sequence × hidden (or projection) size × directions, and the last hidden (and cell) state",
            f"written here: the gates' GEMMs of {CUDNN_RNN}"),
    Formula("rnn backward", ("aten::_cudnn_rnn_backward", "aten::miopen_rnn_backward"),
            "the forward's FLOPs for the gradient through the sequence (always: the weight gradient needs it), "
            "and the forward's FLOPs again for the weight gradient where output_mask asks for it (both when the "
            "mask is not recorded)",
            "the gradients output_mask asks for: input (the input's shape), hidden and cell state, weights (the "
            "flat weight buffer)", f"written here, as conv backward: {CUDNN_RNN}"),
    Formula("normalization", ("aten::layer_norm", "aten::native_layer_norm", "aten::batch_norm",
                              "aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
                              "aten::_batch_norm_impl_index", "aten::group_norm", "aten::native_group_norm",
                              "aten::instance_norm"),
            "5 per element of the input (statistics 3, normalize and scale 2); a batch norm in eval mode "
            "(training False): 2 per element",
            "the input's shape", f"{TRACELENS}: Normalization.flops_func, per-channel terms left out"),
    Formula("normalization backward", ("aten::native_layer_norm_backward", "aten::native_batch_norm_backward",
                                       "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward",
                                       "aten::native_group_norm_backward", "aten::layer_norm_backward",
                                       "aten::batch_norm_backward"),
            "9 per element of the input (training backward with the input gradient: 4 + 5)",
            "the input gradient (the first input's shape)",
            f"{TRACELENS}: Normalization.flops_func_bwd, per-channel terms left out"),
    Formula("softmax", ("aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"),
            "3 per element (exponent, sum, divide)", "the input's shape", f"{TRACELENS}: Softmax.flops_func"),
    Formula("softmax backward", ("aten::_softmax_backward_data", "aten::_log_softmax_backward_data"),
            "6 per element (twice the forward's)", "the first input's shape", f"{TRACELENS}: Softmax.flops_bwd"),
    Formula("unary", ("aten::relu", "aten::relu_", "aten::gelu", "aten::gelu_", "aten::silu", "aten::silu_",
                      "aten::sigmoid", "aten::sigmoid_", "aten::tanh", "aten::tanh_", "aten::hardtanh",
                      "aten::hardtanh_", "aten::leaky_relu", "aten::leaky_relu_", "aten::elu", "aten::elu_",
                      "aten::clamp_min", "aten::clamp_min_", "aten::exp", "aten::log", "aten::neg", "aten::abs",
                      "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::dropout", "aten::native_dropout"),
            "1 per element of the input", "the input's shape", f"{TRACELENS}: UnaryElementwise.flops_func"),
    Formula("binary", ("aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div",
                       "aten::div_", "aten::threshold_backward", "aten::gelu_backward", "aten::silu_backward",
                       "aten::sigmoid_backward", "aten::tanh_backward", "aten::native_dropout_backward"),
            "1 per element of the output (the broadcast of the two inputs' shapes)",
            "the broadcast shape of the tensor inputs", f"{TRACELENS}: BinaryElementwise.flops_func"),
)

#: Where an RNN call's arguments sit: its sizes in ``concrete_inputs`` (hidden_size, proj_size or None,
#: bidirectional), and its hx and cx among the inputs.
RNN_ARGS = {"aten::_cudnn_rnn": (7, 8, 13, (4, 5)), "aten::miopen_rnn": (6, None, 11, (3, 4))}

#: Operator name -> its family.
FAMILY: dict[str, str] = {op: f.family for f in FORMULAS for op in f.ops}

#: Where the non-tensor arguments sit in ``concrete_inputs`` (positions of the ATen schema).
CONV_ARGS = {  # name -> (stride, padding, dilation, transposed, output_padding) positions; None: not an argument
    "aten::conv1d": (3, 4, 5, None, None), "aten::conv2d": (3, 4, 5, None, None),
    "aten::conv3d": (3, 4, 5, None, None), "aten::_convolution_mode": (3, 4, 5, None, None),
    "aten::conv2d_padding": (3, 4, 5, None, None),
    "aten::convolution": (3, 4, 5, 6, 7), "aten::_convolution": (3, 4, 5, 6, 7),
    "aten::cudnn_convolution": (3, 2, 4, None, None), "aten::miopen_convolution": (4, 3, 5, None, None),
    "aten::mkldnn_convolution": (4, 3, 5, None, None),
    "aten::conv_transpose1d": (3, 4, 7, True, 5), "aten::conv_transpose2d": (3, 4, 7, True, 5),
    "aten::conv_transpose3d": (3, 4, 7, True, 5), "aten::cudnn_convolution_transpose": (4, 2, 5, True, 3),
}
CONV_BACKWARD_ARGS = {"aten::convolution_backward": (4, 5, 6, 7, 8, 10),  # + output_mask position
                      "aten::convolution_backward_overrideable": (4, 5, 6, 7, 8, 10)}
#: Position of ``is_causal`` in ``concrete_inputs``.
CAUSAL_ARG = {
    "aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4, "aten::_scaled_dot_product_attention_math": 5,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
}
BATCH_NORM_TRAINING_ARG = {"aten::batch_norm": 5, "aten::native_batch_norm": 5, "aten::cudnn_batch_norm": 5,
                           "aten::miopen_batch_norm": 5, "aten::_batch_norm_impl_index": 5}
PER_ELEMENT = {"normalization": 5, "normalization backward": 9, "softmax": 3, "softmax backward": 6, "unary": 1,
               "binary": 1}


@dataclass(frozen=True)
class Cost:
    """The work of one operator call, derived from its shapes (never measured)."""

    flops: float
    #: (inputs + outputs) × element size; None when a tensor's dtype is not recorded or not known
    bytes: float | None
    family: str
    #: precision of the inputs (fp32, fp16, bf16, fp64, fp8), None when not recorded
    dtype: str | None
    #: what had to be assumed for want of a recorded argument, or None
    assumed: str | None = None


def parse(text: str | None) -> list | None:
    """A JSON-text column value (``input_dims``, ``input_types``, ``concrete_inputs``) as a list, or None."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def is_shape(d) -> bool:
    """A non-empty list of integers from 0 to 2^63 - 1 (a tensor's dims as recorded: torch sizes are int64)."""
    return isinstance(d, list) and len(d) > 0 and all(isinstance(x, int) and not isinstance(x, bool)
                                                      and 0 <= x < 2 ** 63 for x in d)


def cost(name: str, dims: list | None, types: list | None = None, concrete: list | None = None,
         conv_output: tuple | None = None) -> Cost | None:
    """The FLOPs and bytes of one call of ``name`` from its recorded arguments, or None without a formula.

    ``conv_output``: a forward convolution's output shape found elsewhere (its backward call's grad_output),
    used when ``concrete`` has no stride and padding (traces from before PyTorch recorded them).
    """
    family = FAMILY.get(name)
    if family is None or not dims:
        return None
    try:
        if family == "gemm":
            found = _gemm(name, dims, types, concrete)
        elif family == "grouped gemm":
            found = _grouped_gemm(name, dims, types, concrete)
        elif family == "conv":
            found = _conv(name, dims, types, concrete, conv_output)
        elif family == "conv backward":
            found = _conv_backward(name, dims, types, concrete)
        elif family in ("rnn", "rnn backward"):
            found = _rnn(name, family, dims, types, concrete)
        elif family in ("attention", "attention backward"):
            found = _attention(name, family, dims, types, concrete)
        else:
            found = _per_element(name, family, dims, types, concrete)
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None  # arguments that do not fit the operator's schema: no figure rather than a wrong one
    if found is None or not math.isfinite(found.flops) or (found.bytes is not None and not math.isfinite(found.bytes)):
        return None  # shapes too large to be real (a damaged file): no figure
    return found


# -- families ------------------------------------------------------------------------------------------------
def _gemm(name: str, dims: list, types: list | None, concrete: list | None = None) -> Cost | None:
    if name == "aten::linear":
        if len(dims) < 2 or not is_shape(dims[0]) or not is_shape(dims[1]) or len(dims[1]) != 2:
            return None
        x, w = dims[0], dims[1]
        if x[-1] != w[1]:
            return None
        rows, k, n = math.prod(x[:-1]), w[1], w[0]
        out = rows * n
        flops = 2.0 * rows * k * n
        return Cost(flops, _bytes(dims, types, out, _dtype_at(types, 0)), "gemm", _precision(types, 0))
    first = 1 if name in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm") else 0
    if len(dims) < first + 2 or not is_shape(dims[first]) or not is_shape(dims[first + 1]):
        return None
    a, b = dims[first], dims[first + 1]
    m = a[-2] if len(a) >= 2 else 1
    k = a[-1]
    n = b[-1] if len(b) >= 2 else 1
    if (b[-2] if len(b) >= 2 else b[0]) != k:
        return None
    batch = math.prod(_broadcast(a[:-2], b[:-2]))
    out = batch * m * n
    out_dtype = _dtype_at(types, first)
    if name == "aten::_scaled_mm":  # (self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
        code = _arg(concrete or [], 6)
        if code:  # a ScalarType's number; none given: the result is in self's dtype
            out_dtype = SCALAR_TYPES.get(code)
    return Cost(2.0 * batch * m * n * k, _bytes(dims, types, out, out_dtype), "gemm", _precision(types, first))


#: Where a grouped GEMM's arguments sit: offs (a 1-D tensor, one entry per group) and out_dtype (a ScalarType's
#: number in ``concrete_inputs``).
GROUPED_ARGS = {"aten::_grouped_mm": (2, 4), "aten::_scaled_grouped_mm": (4, 7)}


def _grouped_gemm(name: str, dims: list, types: list | None, concrete: list | None) -> Cost | None:
    if len(dims) < 2 or not is_shape(dims[0]) or not is_shape(dims[1]):
        return None
    a, b = dims[0], dims[1]
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:  # groups of A's rows, one B each
        (m, k), n, out = a, b[2], a[0] * b[2]
    elif len(a) == 3 and len(b) == 2 and a[2] == b[0]:  # one A each, groups of B's columns
        m, k, n, out = a[1], a[2], b[1], a[1] * b[1]
    elif len(a) == 2 and len(b) == 2 and a[1] == b[0]:  # groups along K: one output per group
        offs = dims[GROUPED_ARGS[name][0]] if len(dims) > GROUPED_ARGS[name][0] else None
        groups = offs[0] if is_shape(offs) and len(offs) == 1 else None
        if not groups:
            return None
        (m, k), n = a, b[1]
        out = groups * m * n
    elif len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:  # a batch of equal groups
        m, k, n, out = a[0] * a[1], a[2], b[2], a[0] * a[1] * b[2]
    else:
        return None
    out_dtype = _dtype_at(types, 0)
    code = _arg(concrete or [], GROUPED_ARGS[name][1])
    if code:  # a ScalarType's number; none given: the result is in A's dtype
        out_dtype = SCALAR_TYPES.get(code)
    return Cost(2.0 * m * k * n, _bytes(dims, types, out, out_dtype), "grouped gemm", _precision(types, 0))


def conv_output_shape(name: str, x: list, w: list, concrete: list | None) -> tuple | None:
    """The output shape of a forward convolution from stride, padding, dilation (and output padding) in
    ``concrete``, or None when they are not recorded (or padding is given as 'same'/'valid' text)."""
    where = CONV_ARGS.get(name)
    if where is None or not concrete:
        return None
    stride_at, padding_at, dilation_at, transposed_at, out_pad_at = where
    spatial = len(x) - 2
    stride = _ints(concrete, stride_at, spatial, 1)
    padding = _ints(concrete, padding_at, spatial, 0)
    dilation = _ints(concrete, dilation_at, spatial, 1)
    if stride is None or padding is None or dilation is None:
        return None
    transposed = transposed_at is True or (isinstance(transposed_at, int) and _flag(concrete, transposed_at))
    kernel = w[2:]
    if transposed:
        out_pad = _ints(concrete, out_pad_at, spatial, 0) if out_pad_at is not None else [0] * spatial
        if out_pad is None:
            return None
        size = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1
                for i, k, s, p, d, o in zip(x[2:], kernel, stride, padding, dilation, out_pad)]
        return (x[0], w[1], *size)  # a transposed convolution's weight is [C_in, C_out/groups, k...]
    size = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(x[2:], kernel, stride, padding, dilation)]
    return (x[0], w[0], *size)


def _conv(name: str, dims: list, types: list | None, concrete: list | None, conv_output: tuple | None) -> Cost | None:
    if len(dims) < 2 or not is_shape(dims[0]) or not is_shape(dims[1]) or len(dims[0]) < 3 \
            or len(dims[1]) != len(dims[0]):
        return None
    x, w = dims[0], dims[1]
    assumed = None
    out = conv_output_shape(name, x, w, concrete)
    transposed = out is not None and name in CONV_ARGS and _is_transposed(name, concrete)
    if out is None:
        if conv_output is not None and len(conv_output) == len(x):
            out = tuple(conv_output)
        else:
            out = (x[0], w[0], *x[2:])
            assumed = "output size = input size (stride 1): stride and padding not recorded"
    conv_spatial = x[2:] if transposed else out[2:]
    flops = 2.0 * x[0] * math.prod(w) * math.prod(conv_spatial)
    if min(out) <= 0:
        return None
    return Cost(flops, _bytes(dims, types, math.prod(out), _dtype_at(types, 0)), "conv", _precision(types, 0),
                assumed)


#: Backward convolutions of PyTorch before 1.11, whose schema begins ``(self, grad_output, weight)``; since 1.11
#: ``aten::convolution_backward`` begins ``(grad_output, input, weight)`` and these are gone.
SELF_FIRST_CONV_BACKWARD = frozenset({"aten::cudnn_convolution_backward", "aten::miopen_convolution_backward",
                                      "aten::mkldnn_convolution_backward"})


def conv_backward_shapes(name: str, dims: list) -> tuple[list, list, list] | None:
    """(grad_output, input, weight) shapes of a backward convolution's recorded ``Input Dims``, in the order of
    its schema (:data:`SELF_FIRST_CONV_BACKWARD`); None when the first three are not shapes."""
    if not dims or len(dims) < 3 or not all(is_shape(d) for d in dims[:3]):
        return None
    first, second, w = dims[0], dims[1], dims[2]
    return (second, first, w) if name in SELF_FIRST_CONV_BACKWARD else (first, second, w)


def _conv_backward(name: str, dims: list, types: list | None, concrete: list | None) -> Cost | None:
    shapes = conv_backward_shapes(name, dims)
    if shapes is None:
        return None
    gy, x, w = shapes
    where = CONV_BACKWARD_ARGS.get(name)
    mask = None
    transposed = False
    if where is not None and concrete:
        mask = _bools(concrete, where[5])
        transposed = _flag(concrete, where[3])
    assumed = None if mask is not None else "both the input and the weight gradient (output_mask not recorded)"
    mask = mask or [True, True, False]
    forward = 2.0 * x[0] * math.prod(w) * math.prod(x[2:] if transposed else gy[2:])
    flops = forward * (int(bool(mask[0])) + int(bool(len(mask) > 1 and mask[1])))
    outputs = (math.prod(x) if mask[0] else 0) + (math.prod(w) if len(mask) > 1 and mask[1] else 0) \
        + (w[1] if transposed else w[0]) * (1 if len(mask) > 2 and mask[2] else 0)
    return Cost(flops, _bytes(dims, types, outputs, _dtype_at(types, 1)), "conv backward", _precision(types, 1),
                assumed)


def _rnn(name: str, family: str, dims: list, types: list | None, concrete: list | None) -> Cost | None:
    # (input, weight[], weight_stride0, ...): the weights, a tensor list of every layer's and direction's
    # matrices and bias vectors; each matrix multiplies every token once (the input-to-hidden GEMM of all steps
    # at once, the hidden-to-hidden one step by step)
    x, weights = dims[0], dims[1] if len(dims) > 1 else None
    if not is_shape(x) or len(x) < 2 or not isinstance(weights, list) or not weights:
        return None
    if not all(is_shape(w) for w in weights) or not any(len(w) == 2 for w in weights):
        return None
    tokens = math.prod(x[:-1])
    forward = 2.0 * tokens * sum(math.prod(w) for w in weights if len(w) == 2)
    if family == "rnn":
        out = _rnn_outputs(name, dims, concrete, tokens)
        return Cost(forward, None if out is None else _bytes(dims, types, out, _dtype_at(types, 0)), "rnn",
                    _precision(types, 0))
    mask = _bools(concrete, len(concrete) - 1) if concrete else None  # output_mask: the last argument
    assumed = None if mask is not None and len(mask) == 4 else "the weight gradient too (output_mask not recorded)"
    mask = mask if mask is not None and len(mask) == 4 else [True, True, True, True]
    flops = forward * (1 + int(bool(mask[3])))
    # the gradients asked for: input (its shape), hx and cx (their shapes: arguments 4 and 5), the weights (the
    # flat weight buffer, argument 3)
    sizes = [math.prod(dims[i]) if len(dims) > i and is_shape(dims[i]) else 0 for i in (0, 4, 5, 3)]
    out = sum(size for size, asked in zip(sizes, mask) if asked)
    return Cost(flops, _bytes(dims, types, out, _dtype_at(types, 0)), "rnn backward", _precision(types, 0),
                assumed)


def _rnn_outputs(name: str, dims: list, concrete: list | None, tokens: int) -> int | None:
    """The elements a forward RNN call writes: its output (tokens × hidden or projection size × directions) and
    its last hidden and cell states (the shapes of hx and cx: arguments 4 and 5 of cudnn's, 3 and 4 of MIOpen's);
    None where the sizes are not recorded."""
    hidden_at, proj_at, bidirectional_at, states = RNN_ARGS[name]
    hidden = _arg(concrete or [], hidden_at)
    proj = _arg(concrete or [], proj_at) if proj_at is not None else "0"
    if not hidden or not hidden.isdigit() or not proj or not proj.isdigit():
        return None
    directions = 2 if _flag(concrete, bidirectional_at) else 1
    out = tokens * (int(proj) or int(hidden)) * directions
    return out + sum(math.prod(dims[i]) for i in states if len(dims) > i and is_shape(dims[i]))


def _attention(name: str, family: str, dims: list, types: list | None, concrete: list | None) -> Cost | None:
    first = 1 if family == "attention backward" else 0
    q, k, v = (dims[first + i] if len(dims) > first + i else None for i in range(3))
    if not (is_shape(q) and is_shape(k) and is_shape(v)) or not len(q) == len(k) == len(v) == 4:
        return None
    b, h, lq, e_qk = q
    lkv, e_v = k[2], v[3]
    causal_at = CAUSAL_ARG.get(name)
    causal = bool(concrete) and causal_at is not None and _flag(concrete, causal_at)
    assumed = None if concrete else "not causal (is_causal not recorded)"
    if family == "attention":
        flops = 2.0 * b * h * lq * lkv * (e_qk + e_v)
        out = b * h * lq * e_v
    else:
        flops = 2.0 * b * h * lq * lkv * (3 * e_qk + 2 * e_v)
        out = math.prod(q) + math.prod(k) + math.prod(v)
    if causal and lq == lkv:
        flops /= 2
    return Cost(flops, _bytes(dims, types, out, _dtype_at(types, first)), family, _precision(types, first), assumed)


def _per_element(name: str, family: str, dims: list, types: list | None, concrete: list | None) -> Cost | None:
    # the main tensor is the first argument of every family here (input, self, grad_output): where it is not
    # recorded (a nested tensor's dims are [], its type ''), a later tensor (a layer norm's weight) is not it
    tensors = [i for i, d in enumerate(dims) if _sized_tensor(dims, types, i)]
    if not tensors or tensors[0] != 0:
        return None
    main = dims[0]
    if family == "binary":
        shape = main
        for i in tensors[1:2]:
            shape = _broadcast(shape, dims[i])
        out = math.prod(shape)
    else:
        out = math.prod(main)
    per = PER_ELEMENT[family]
    training_at = BATCH_NORM_TRAINING_ARG.get(name)
    if training_at is not None and concrete and len(concrete) > training_at and concrete[training_at] == "False":
        per = 2
    dtype = _dtype_at(types, tensors[0])
    return Cost(float(per * out), _bytes(dims, types, out, dtype), family, _precision(types, tensors[0]))


# -- helpers -------------------------------------------------------------------------------------------------
def _broadcast(a: list, b: list) -> list:
    """NumPy broadcasting of two shapes (ValueError when they do not broadcast)."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return out


def _dtype_at(types: list | None, i: int) -> str | None:
    if not types or i >= len(types) or not isinstance(types[i], str):
        return None
    return types[i].lower()


def _precision(types: list | None, i: int) -> str | None:
    return DTYPE_PRECISION.get(_dtype_at(types, i) or "")


def _is_tensor(types: list | None, i: int) -> bool:
    """Whether input ``i`` is a tensor: its recorded type is a dtype (not Scalar, ScalarList, '' ...)."""
    dtype = _dtype_at(types, i)
    return types is None or dtype in DTYPE_BYTES


def _sized_tensor(dims: list, types: list | None, i: int) -> bool:
    """Whether input ``i`` is a tensor of recorded dims: a shape, or ``[]`` with a dtype (a 0-dimensional tensor,
    1 element; ``[]`` of type '' is a tensor whose dims were not recorded, such as a nested tensor's)."""
    d = dims[i]
    return _is_tensor(types, i) and (is_shape(d) or (d == [] and _dtype_at(types, i) in DTYPE_BYTES))


def _bytes(dims: list, types: list | None, out_elements: int, out_dtype: str | None) -> float | None:
    """(Σ tensor inputs + outputs) × element size; None when a tensor input's or the output's dtype is unknown."""
    if not types:
        return None
    total = 0
    for i, d in enumerate(dims):
        dtype = _dtype_at(types, i)
        if dtype is None or dtype not in DTYPE_BYTES:
            if is_shape(d) and dtype not in (None, "", "scalar", "scalarlist"):
                return None  # a tensor (or tensor list) of a dtype we cannot size
            continue
        if isinstance(d, list) and (is_shape(d) or d == []):
            total += math.prod(d) * DTYPE_BYTES[dtype]  # [] with a dtype: a 0-dimensional tensor, 1 element
    size = DTYPE_BYTES.get(out_dtype or "")
    if size is None:
        return None
    return float(total + out_elements * size)


def _arg(concrete: list, i: int | None):
    if i is None or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    return concrete[i].strip()


def _ints(concrete: list, i: int | None, n: int, default: int) -> list[int] | None:
    """An int-list argument ("[2, 2]" or "2") broadcast to ``n`` dims; ``default`` when empty; None if not ints."""
    text = _arg(concrete, i)
    if text is None:
        return None
    if text == "":
        return [default] * n
    try:
        value = json.loads(text)
    except ValueError:
        return None
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    if len(values) == 1:
        values = values * n
    return values if len(values) == n else None


def _flag(concrete: list, i: int | None) -> bool:
    return _arg(concrete, i) == "True"


def _bools(concrete: list, i: int | None) -> list[bool] | None:
    text = _arg(concrete, i)
    if not text or not (text.startswith("[") and text.endswith("]")):
        return None
    parts = [p.strip() for p in text[1:-1].split(",")]
    if not parts or any(p not in ("True", "False") for p in parts):
        return None
    return [p == "True" for p in parts]


def _is_transposed(name: str, concrete: list | None) -> bool:
    where = CONV_ARGS.get(name)
    if where is None:
        return False
    transposed_at = where[3]
    if transposed_at is True:
        return True
    return bool(concrete) and isinstance(transposed_at, int) and _flag(concrete, transposed_at)
