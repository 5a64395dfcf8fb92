"""Built-in sub-commands (compare, diff, roofline, flops), registered through the ``traceparse`` entry points."""
