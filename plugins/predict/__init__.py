"""Plugin ``predict``: per-layer and end-to-end performance models from torch.profiler traces.

``traceparse predict fit`` attributes each kernel's GPU time to the operator
call that launched it (:mod:`.attribution`), groups calls by layer type and
counts their operations (:mod:`.layers`), fits t = b0 + b1 × ops per layer
type and step = a0 + a1 × batch per network, and validates them
(:mod:`.model`); ``predict run`` predicts a step at another batch size;
``predict table`` writes a trace's flops table. docs/predict.md has the
definitions and the figures measured on the ResNet18 / VGG16 / AlexNet sweep.
"""

from __future__ import annotations

from traceparse.plugins import hookimpl


@hookimpl
def traceparse_commands():
    from traceparse_plugins.predict.command import PredictCommand

    return [PredictCommand()]
