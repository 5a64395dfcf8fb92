"""Layer types of framework operators, and how many operations each operator call performs.

Layer type: the first pattern of :data:`LAYER_TYPES` that matches the name of
the *outermost* operator (case-insensitive ``re.search``) wins; no match is
``other``. Calls inside an ``Optimizer.step`` annotation are ``optimizer step``
whatever their name (:mod:`attribution` checks that). The pass is
``backward`` for autograd operators (names with ``Backward`` / ``backward``
or ``autograd::engine::evaluate_function``), ``update`` for optimizer steps,
else ``forward``.

Operations ("ops") of one call, from the shapes torch.profiler records with
``record_shapes=True`` (``input_dims``) or the ``flops`` it records with
``with_flops=True`` (used instead of the formula for the operator that has it):

* convolution: FLOPs = 2 × N × C_out × ∏(output spatial) × ∏(weight dims 1..),
  i.e. 2 × output elements × (C_in / groups) × kernel area, for the forward
  operators (``aten::conv2d``, ``aten::convolution``, ``aten::cudnn_convolution``
  ...); 4 × the same for ``aten::convolution_backward`` (input gradient plus
  weight gradient, from its grad_output, input and weight shapes). The output
  spatial size of a forward call is not in its inputs: it is taken from the
  backward call of the same (input, weight) shapes in the trace (its
  grad_output); with no backward (inference) it is assumed equal to the input's
  (stride 1, "same" padding) and a warning says how many calls that concerns;
* linear / matmul: FLOPs = 2 × M × K × N (``aten::linear``, ``addmm``, ``mm``,
  ``bmm``, ``baddbmm``, ``matmul``; batch dimensions multiply M);
* every other layer type: the number of elements of the largest tensor among
  the inputs of the operator and of every operator it calls (for
  batch norm, ReLU, pooling, loss and elementwise work, time grows with
  that; a constant factor per type only rescales b1); scalars and
  0-dimensional tensors (both recorded as ``[]``) count 1;
* optimizer step: the largest input as above; torch's ``_foreach_*`` operators
  record no shapes for their tensor lists, so when that gives no more than 1
  the call counts the model's parameter elements (Σ elements of the inputs
  of the ``AccumulateGrad`` operators of one step).

Within one call, operators nested in an operator that already has a formula
are not counted again (``aten::conv2d`` calls ``aten::convolution`` calls
``aten::cudnn_convolution``: counted once), while siblings add up
(``AddmmBackward0`` runs two ``aten::mm``).
"""

from __future__ import annotations

import json
import math
import re

#: (layer type, pattern on the outermost operator's name); first match wins.
LAYER_TYPES: list[tuple[str, str]] = [
    ("optimizer step", r"^optimizer\.|_foreach_|_fused_(sgd|adam)|\bsgd\b|\badamw?\b"),
    ("convolution", r"conv"),
    ("linear", r"linear|addmm|(^|::|\s)mm\b|bmm|matmul|(^|\s)mmbackward"),
    ("batch norm", r"batch_?norm"),
    ("ReLU", r"relu|threshold_backward"),
    ("pooling", r"pool|meanbackward|aten::mean\b"),
    ("loss", r"loss|nll|cross_entropy|log_?softmax"),
    ("attention", r"scaled_?dot_?product|flash_attention|efficient_attention|cudnn_attention|attentionbackward"),
    ("layer norm", r"layer_?norm|rms_?norm"),
    ("activation", r"gelu|silu|tanh|sigmoid|softplus|hardswish|mish"),
    ("embedding", r"embedding"),
]
OTHER = "other"
OPTIMIZER = "optimizer step"
TYPE_ORDER = [t for t, _ in LAYER_TYPES] + [OTHER]
PASSES = ("forward", "backward", "update")
BACKWARD = r"(?i)backward|autograd::engine::evaluate_function"
#: Annotation (marker) that encloses an optimizer step.
OPTIMIZER_MARKER = r"^Optimizer\.step"

CONV_FORWARD = {"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                "aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::miopen_convolution",
                "aten::_convolution_mode", "aten::conv2d_padding"}
CONV_BACKWARD = {"aten::convolution_backward", "aten::cudnn_convolution_backward",
                 "aten::convolution_backward_overrideable", "aten::miopen_convolution_backward",
                 "aten::mkldnn_convolution_backward"}
ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
             "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
             "aten::_scaled_dot_product_flash_attention_backward",
             "aten::_scaled_dot_product_efficient_attention_backward",
             "aten::_scaled_dot_product_cudnn_attention_backward"}
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}


def layer_type(name: str) -> str:
    """The layer type of an outermost operator's name (see :data:`LAYER_TYPES`)."""
    lowered = (name or "").lower()
    for kind, pattern in LAYER_TYPES:
        if re.search(pattern, lowered):
            return kind
    return OTHER


def pass_of(name: str, kind: str) -> str:
    """forward, backward or update (optimizer step) for an outermost operator, from its name alone.

    :mod:`attribution` also counts as backward the operators that run on an
    autograd thread between its ``evaluate_function`` operators (gradient
    accumulation ``aten::add_``, for instance).
    """
    if kind == OPTIMIZER:
        return "update"
    return "backward" if re.search(BACKWARD, name or "") else "forward"


def parse_dims(text: str | None) -> list | None:
    """The ``input_dims`` JSON text as a list (one entry per input), or None."""
    if not text:
        return None
    try:
        dims = json.loads(text)
    except ValueError:
        return None
    return dims if isinstance(dims, list) else None


def _is_shape(d) -> bool:
    return isinstance(d, list) and len(d) > 0 and all(isinstance(x, int) and not isinstance(x, bool) for x in d)


def elements(dims: list | None) -> int | None:
    """Elements of the largest tensor input (a tensor list counts its total).

    None when no shapes were recorded; 1 when they were but every input is a
    scalar or a 0-dimensional tensor (torch records both as ``[]``).
    """
    if dims is None:
        return None
    best = 1
    for d in dims or []:
        if _is_shape(d):
            n = math.prod(d)
        elif isinstance(d, list) and d and all(_is_shape(x) for x in d):
            n = sum(math.prod(x) for x in d)
        else:
            continue
        best = max(best, n)
    return best


def conv_key(dims: list | None) -> tuple | None:
    """(input shape, weight shape) of a forward convolution, to find its backward."""
    if dims and len(dims) >= 2 and _is_shape(dims[0]) and _is_shape(dims[1]):
        return tuple(dims[0]), tuple(dims[1])
    return None


def conv_backward_key(dims: list | None) -> tuple | None:
    """(input shape, weight shape) of a ``convolution_backward`` call (inputs: grad_output, input, weight)."""
    if dims and len(dims) >= 3 and all(_is_shape(d) for d in dims[:3]):
        return tuple(dims[1]), tuple(dims[2])
    return None


def conv_forward_flops(dims: list | None, output: tuple | None) -> float | None:
    """2 × output elements × weight elements per output channel; ``output`` None: same spatial size as input."""
    key = conv_key(dims)
    if key is None:
        return None
    x, w = key
    if len(x) < 3 or len(w) < 3:
        return None
    out_spatial = output[2:] if output is not None and len(output) == len(x) else x[2:]
    return 2.0 * x[0] * w[0] * math.prod(out_spatial) * math.prod(w[1:])


def conv_backward_flops(dims: list | None) -> float | None:
    """4 × grad_output elements × weight elements per output channel (input and weight gradients)."""
    if not dims or len(dims) < 3 or not all(_is_shape(d) for d in dims[:3]):
        return None
    gy, _, w = dims[0], dims[1], dims[2]
    return 4.0 * math.prod(gy) * math.prod(w[1:])


def matmul_flops(name: str, dims: list | None) -> float | None:
    """2 × M × K × N for the matrix-multiply operators (batch dimensions multiply M)."""
    if not dims:
        return None
    shapes = [d for d in dims if _is_shape(d)]
    if name == "aten::linear":
        if len(shapes) < 2 or len(shapes[1]) != 2:
            return None
        x, w = shapes[0], shapes[1]
        return 2.0 * math.prod(x[:-1]) * w[1] * w[0]
    if name in ("aten::addmm", "aten::baddbmm"):
        shapes = [d for d in dims[1:3] if _is_shape(d)]
    else:
        shapes = [d for d in dims[:2] if _is_shape(d)]
    if len(shapes) != 2:
        return None
    a, b = shapes
    if len(a) < 2 or len(b) < 1:
        return None
    k = a[-1]
    n = b[-1] if len(b) >= 2 else 1
    return 2.0 * math.prod(a[:-1]) * k * n


def attention_flops(dims: list | None) -> float | None:
    """4 × B × heads × L × S × head dim for scaled dot-product attention (QKᵀ and PV), from the first three
    4-dimensional inputs (q, k, v; a backward's grad_output, q, k: the same shapes in self-attention)."""
    if not dims:
        return None
    shapes = [d for d in dims if _is_shape(d) and len(d) == 4][:3]
    if len(shapes) < 2:
        return None
    q, k = shapes[0], shapes[1]
    return 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
