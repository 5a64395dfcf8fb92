"""Command ``traceparse flops MODEL [--batch N] [--input 3x224x224]``: pen-and-paper FLOPs of a CNN, per layer.

For the torchvision models of :mod:`.cnn_models` (torchvision's own when it
is installed) the model is run once on PyTorch's ``meta`` device (shapes
only, no arithmetic, no memory), and every leaf layer gets:

- output shape (batch first) and parameter count;
- forward FLOPs, counted like ``torch.utils.flop_counter.FlopCounterMode``
  and like ncu's tensor ops: a multiply-add is 2 FLOPs, so a convolution is
  2 × N·K·H_out·W_out·(C/groups)·R·S and a linear layer 2 × rows·in·out
  (bias additions and element-wise layers - ReLU, pooling, batch norm,
  dropout - count 0: they are memory-bound and add well under 1%);
- bytes moved: (input + output + parameter elements) × element size, the
  least traffic the layer can have (each tensor read or written once).

Totals are printed with the training-step estimate 3 × forward (the backward
pass computes two products of the forward's size: input and weight
gradients). This needs the optional ``torch`` extra.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import asdict, dataclass

from rich.table import Table

from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.plugins import hookimpl
from traceparse.text import literal

TORCH_HINT = "install the torch extra: pip install 'traceparse[torch]'"
INPUT_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")
TRAIN_FACTOR = 3


@dataclass
class Layer:
    """One leaf layer's row of the table."""

    index: int
    layer: str
    type: str
    output_shape: list[int]
    params: int
    flops: int
    bytes_moved: int


def require_torch():
    """The torch module, or a one-line InputError naming the extra."""
    try:
        import torch
    except ImportError:
        raise InputError(f"traceparse flops needs PyTorch, which is not installed: {TORCH_HINT}") from None
    return torch


def load_model(name: str):
    """A model on the meta device: torchvision's when importable, else the definition in :mod:`.cnn_models`."""
    torch = require_torch()
    from traceparse_plugins.commands.cnn_models import MODEL_NAMES, build

    if name not in MODEL_NAMES:
        raise InputError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    try:
        import torchvision.models as tvm
    except Exception:  # not installed, or built for another torch: "operator torchvision::nms does not exist"
        tvm = None
    with torch.device("meta"):
        model = getattr(tvm, name)(weights=None) if tvm is not None else build(name)
    return model.eval()


def parse_input(text: str) -> tuple[int, int, int]:
    """``CxHxW`` (e.g. 3x224x224) as a tuple; InputError otherwise."""
    m = INPUT_SHAPE.match(text.strip())
    if not m or 0 in (int(m.group(1)), int(m.group(2)), int(m.group(3))):
        raise InputError(f"--input {text!r}: expected CxHxW with positive sizes, e.g. 3x224x224")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def layer_table(name: str, batch: int = 1, input_shape: tuple[int, int, int] = (3, 224, 224)) -> list[Layer]:
    """The per-layer rows of ``name`` for a batch of ``batch`` inputs of ``input_shape``."""
    torch = require_torch()
    if batch < 1:
        raise InputError(f"--batch {batch}: must be at least 1")
    model = load_model(name)
    rows: list[Layer] = []

    def hook(module, inputs, output, qualified):
        x = inputs[0]
        params = sum(p.numel() for p in module.parameters(recurse=False))
        flops = _flops(torch, module, x, output)
        size = x.element_size()
        rows.append(Layer(len(rows) + 1, qualified, type(module).__name__, list(output.shape), params, flops,
                          size * (x.numel() + output.numel() + params)))

    handles = [module.register_forward_hook(lambda m, i, o, q=qualified: hook(m, i, o, q))
               for qualified, module in model.named_modules() if not list(module.children())]
    try:
        with torch.no_grad():
            model(torch.empty((batch, *input_shape), device="meta"))
    except RuntimeError as exc:
        raise InputError(f"{name} cannot take an input of {batch}x{'x'.join(map(str, input_shape))}: "
                         f"{str(exc).splitlines()[0]}") from None
    finally:
        for handle in handles:
            handle.remove()
    return rows


def _flops(torch, module, x, output) -> int:
    """Forward FLOPs of one layer (2 per multiply-add, conv and linear only; see the module docstring)."""
    nn = torch.nn
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        kernel = 1
        for k in module.kernel_size:
            kernel *= k
        return 2 * output.numel() * (module.in_channels // module.groups) * kernel
    if isinstance(module, nn.Linear):
        rows = x.numel() // module.in_features
        return 2 * rows * module.in_features * module.out_features
    return 0


def model_flops(name: str, batch: int = 1, input_shape: tuple[int, int, int] = (3, 224, 224)) -> int:
    """Total forward FLOPs of ``name`` at ``batch`` (what the roofline's ``--model`` uses)."""
    return sum(row.flops for row in layer_table(name, batch, input_shape))


class FlopsCommand(Command):
    name = "flops"
    help = "pen-and-paper FLOPs, parameters and bytes per layer of a torchvision CNN (needs torch)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model", metavar="MODEL", help="vgg11, vgg13, vgg16, vgg19, alexnet, resnet18, resnet34 "
                                                           "or resnet50")
        parser.add_argument("--batch", type=int, default=1, metavar="N", help="batch size (default 1)")
        parser.add_argument("--input", default="3x224x224", metavar="CxHxW", help="input shape (default 3x224x224)")
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        shape = parse_input(args.input)
        rows = layer_table(args.model, args.batch, shape)
        total_flops = sum(r.flops for r in rows)
        total = {"params": sum(r.params for r in rows), "flops": total_flops,
                 "bytes_moved": sum(r.bytes_moved for r in rows), "train_step_flops": TRAIN_FACTOR * total_flops}
        if args.json:
            self.print_json({"model": args.model, "batch": args.batch, "input": list(shape),
                             "layers": [asdict(r) for r in rows], "total": total})
            return 0
        table = Table(header_style="bold", show_edge=False,
                      title=literal(f"{args.model}, batch {args.batch}, input {args.input}: forward pass"),
                      title_justify="left")
        for col in ("#", "layer", "type", "output shape", "params", "GFLOP", "MB moved"):
            table.add_column(col, justify="left" if col in ("layer", "type", "output shape") else "right")
        for r in rows:
            table.add_row(str(r.index), literal(r.layer), literal(r.type), "x".join(map(str, r.output_shape)),
                          f"{r.params:,}",
                          f"{r.flops / 1e9:.4f}" if r.flops else "-", f"{r.bytes_moved / 1e6:.2f}")
        table.add_section()
        table.add_row("", "total", "", "", f"{total['params']:,}", f"{total_flops / 1e9:.4f}",
                      f"{total['bytes_moved'] / 1e6:.2f}")
        session.out.print(table)
        session.out.print(f"forward: {total_flops:,} FLOPs ({total_flops / 1e9:.2f} GFLOP; a multiply-add = 2 FLOPs, "
                          "convolutions and linear layers only). Training step (forward + backward) ~ 3 x forward = "
                          f"{total['train_step_flops'] / 1e9:.2f} GFLOP.")
        return 0


@hookimpl
def traceparse_commands():
    return [FlopsCommand()]
