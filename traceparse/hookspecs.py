"""Hook specifications: the whole plugin interface of traceparse.

A plugin is a module (or object) with functions named like the hooks below,
decorated with ``traceparse.hookimpl``, registered through the ``traceparse``
entry-point group of its package::

    [project.entry-points.traceparse]
    myplugin = "my_package.my_module"

Every hook here is collecting: each plugin returns a list and the core
concatenates them. Built-in readers and rules use the same hooks.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("traceparse")


@hookspec
def traceparse_readers():
    """Return a list of :class:`traceparse.reader.Reader` instances.

    Called once when the plugin manager starts. Each reader's ``name`` must be
    unique; it is what ``--format NAME`` selects and what ``traceparse
    formats`` lists. With ``--format auto`` every reader's ``sniff`` is asked
    and the most confident one reads the file.
    """


@hookspec
def traceparse_rules():
    """Return a list of :class:`traceparse.rule.Rule` instances.

    Called once when the plugin manager starts. ``traceparse analyze`` runs
    every rule that applies to a trace (or those named with ``--rule``);
    ``traceparse rules`` lists them with their thresholds.
    """


@hookspec
def traceparse_exporters():
    """Return a list of :class:`traceparse.exporter.Exporter` instances.

    ``traceparse export TRACE --to NAME --out PATH`` calls the exporter whose
    ``name`` is NAME.
    """


@hookspec
def traceparse_commands():
    """Return a list of :class:`traceparse.command.Command` instances.

    Each becomes a sub-command of the ``traceparse`` CLI (for analyses that
    are more than a rule: comparing traces, charts, models). The built-in
    ``ingest``, ``analyze``, ``list`` ... come through this hook too (plugin
    ``core_commands``, marked ``tryfirst`` so they are listed first). A
    command declares its TRACE arguments, ``--json`` and ``--format`` with
    :func:`traceparse.command.add_common_options` and prints its JSON with
    :func:`traceparse.command.print_json` (one envelope for every command).
    Two commands of the same name: a warning, and the one collected later
    wins, as for every other hook.
    """


@hookspec
def traceparse_gpu_specs():
    """Return a list of GPU specification dicts for the GPU catalog.

    Each dict has at least ``name`` and ``match`` (a list of lower-case
    substrings that must all occur in the device name a tool writes, e.g.
    ``["h100", "hbm3"]``), and any of the figures documented in
    docs/gpu_catalog.md: ``sm_count``, ``memory_gb``, ``dram_gbps``,
    ``peak_tflops`` (dense TFLOP/s per precision: ``fp64``, ``fp32``,
    ``fp16``, ``bf16``, ``tf32_tensor``, ``fp16_tensor``, ...),
    ``host_link`` (``{"name": "PCIe 5.0 x16", "gbps": 63.0}``, one
    direction), clocks, and ``sources`` (where each figure comes from).
    Later plugins' entries with the same ``name`` replace earlier ones.
    """


@hookspec
def traceparse_kernel_categories():
    """Return a list of ``(category, regex)`` rows that classify kernels by name, ahead of the built-in table.

    The regular expression is searched in the lower-cased kernel name (Rust
    regex syntax, as polars uses). Rows of every plugin come first, in
    registration order, then :data:`traceparse.expr.KERNEL_CATEGORIES`; the
    first row that matches a name gives its category (kernel-share, compare,
    diff and every measure by category use it). A category may be a built-in
    one (``"gemm"``) or a new one (``"my-library"``). Example::

        @hookimpl
        def traceparse_kernel_categories():
            return [("attention", r"^my_paged_attention_"), ("gemm", r"^mylib_gemm")]
    """
