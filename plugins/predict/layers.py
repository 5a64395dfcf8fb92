"""Layer types of framework operators, and how many operations each operator call performs.

Layer type: the first pattern of :data:`LAYER_TYPES` that matches the name of
the *outermost* operator (case-insensitive ``re.search``) wins; no match is
``other``. Calls inside an ``Optimizer.step`` annotation are ``optimizer step``
whatever their name (:mod:`attribution` checks that). The pass is
``backward`` for autograd operators (names with ``Backward`` / ``backward``
or ``autograd::engine::evaluate_function``), ``update`` for optimizer steps,
else ``forward``.

Operations ("ops") of one call, from the shapes torch.profiler records with
``record_shapes=True`` (``input_dims``, ``input_types``, ``concrete_inputs``) or
the ``flops`` it records with ``with_flops=True`` (used instead of the formula
for the operator that has it):

* convolution, linear / matmul, attention and recurrent (cuDNN's LSTM, GRU
  and RNN calls) operators: the FLOPs of the one
  formula table, :data:`traceparse.measures.op_flops.FORMULAS` (docs/flops.md):
  2 FLOPs per multiply-add; a convolution's output size from its stride,
  padding and dilation; a ``convolution_backward`` counts the gradients its
  output_mask asks for; attention counts QKᵀ and PV (backward: five products),
  halved when causal. A trace too old to record a forward convolution's
  stride and padding takes its output size from the backward call of the same
  (input, weight) shapes (its grad_output); with no backward (inference) it is
  assumed equal to the input's (stride 1, "same" padding) and a warning says
  how many calls that concerns;
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

from traceparse.measures import op_flops

#: (layer type, pattern on the outermost operator's name); first match wins.
LAYER_TYPES: list[tuple[str, str]] = [
    ("optimizer step", r"^optimizer\.|_foreach_|_fused_(sgd|adam)|\bsgd\b|\badamw?\b"),
    ("convolution", r"conv"),
    ("linear", r"linear|addmm|(^|::|\s)mm\b|bmm|matmul|(^|\s)mmbackward|grouped_?mm"),
    ("batch norm", r"batch_?norm"),
    ("ReLU", r"relu|threshold_backward"),
    ("pooling", r"pool|meanbackward|aten::mean\b"),
    ("loss", r"loss|nll|cross_entropy|log_?softmax"),
    ("attention", r"scaled_?dot_?product|flash_attention|efficient_attention|cudnn_attention|attentionbackward"),
    ("recurrent", r"lstm|\bgru|_gru|rnn"),
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


def _family(*names: str) -> frozenset[str]:
    """The operators of some families of the formula table."""
    return frozenset(op for f in op_flops.FORMULAS if f.family in names for op in f.ops)


CONV_FORWARD = _family("conv")
CONV_BACKWARD = _family("conv backward")
ATTENTION = _family("attention", "attention backward")
RECURRENT = _family("rnn", "rnn backward")
MATMUL = _family("gemm", "grouped gemm")


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


_is_shape = op_flops.is_shape


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
