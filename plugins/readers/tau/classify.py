"""Which TAU routines are GPU kernels, copies, synchronisations or CUDA API calls.

TAU times everything as a routine (a "timer"). With CUDA/CUPTI support it
puts GPU activity on extra threads of the process and tags the timers with
groups (TAU's GPU layer, ``TauGpu.cpp``):

- ``TAU_GPU_KERNEL`` kernels, ``TAU_GPU_MEMORY_COPY`` copies (named
  ``Memory copy Host to Device`` / ``Device to Host`` / ``Device to Device``),
  ``TAU_GPU_SYNCHRONIZATION``, ``TAU_GPU_API`` the CUDA calls on the host;
- GPU threads carry the metadata ``CUDA Device``, ``CUDA Context`` and
  ``CUDA Stream``.

Older TAU versions and pprof output have no such groups, so names decide
where they can: ``cuda*``/``cu*`` API names, ``Memory copy ...``, and on a
GPU thread (or under a ``cudaLaunch*`` caller) every other routine but the
top-level timer is a kernel. The tables below are the whole policy: the
first match wins, anything else is a ``region``.
"""

from __future__ import annotations

import polars as pl

#: (kind, regular expression on the `|`-separated TAU group list)
GROUP_KINDS: list[tuple[str, str]] = [
    ("kernel", r"(?:^|\|)\s*TAU_GPU_KERNEL\s*(?:$|\|)"),
    ("memcpy", r"(?:^|\|)\s*TAU_GPU_MEMORY_COPY\s*(?:$|\|)"),
    ("sync", r"(?:^|\|)\s*TAU_GPU_SYNCHRONIZATION\s*(?:$|\|)"),
    ("api", r"(?:^|\|)\s*TAU_GPU_API\s*(?:$|\|)"),
]

#: (kind, regular expression on the routine's own name, the last part of a call path)
NAME_KINDS: list[tuple[str, str]] = [
    ("memcpy", r"^(?:Unified )?Memory copy (?:Host to Device|Device to Host|Device to Device|Peer to Peer)"),
    # cudaLaunchKernel, cuCtxCreate_v2, "cudaError_t cudaMalloc(void **, size_t) C"
    ("api", r"^(?:[A-Za-z_][\w:]*[\s*]+)?(?:cuda|cu)[A-Z]\w*\s*(?:\(.*)?$"),
]

#: a caller that launches the GPU work below it in a call path
LAUNCH_CALLER = r"^(?:[A-Za-z_][\w:]*[\s*]+)?(?:cudaLaunch\w*|cuLaunch\w*)\s*(?:\(.*)?$"

#: routines on a GPU thread that are not GPU work
GPU_THREAD_NON_KERNELS = r"^\.TAU application$|^\[(?:CONTEXT|SAMPLE|UNWIND|SUMMARY)\]"

#: copy direction from a TAU copy name
COPY_KINDS: list[tuple[str, str]] = [
    ("HtoD", r"Host to Device"),
    ("DtoH", r"Device to Host"),
    ("DtoD", r"Device to Device"),
    ("PtoP", r"Peer to Peer"),
]

#: thread metadata that marks a TAU thread as a GPU (CUDA) stream
GPU_THREAD_KEYS = ("CUDA Device", "CUDA Context", "CUDA Stream")


def kind_expr(group: pl.Expr, name: str = "name", caller: str = "caller", gpu: str = "gpu_thread") -> pl.Expr:
    """The kind of each routine row: from its group, then its name, then its thread and caller."""
    expr = pl.lit("region")
    on_gpu = pl.col(gpu).fill_null(False) & ~pl.col(name).str.contains(GPU_THREAD_NON_KERNELS)
    under_launch = pl.col(caller).fill_null("").str.contains(LAUNCH_CALLER)
    expr = pl.when(on_gpu | under_launch).then(pl.lit("kernel")).otherwise(expr)
    for kind, pattern in reversed(NAME_KINDS):
        expr = pl.when(pl.col(name).str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    for kind, pattern in reversed(GROUP_KINDS):
        expr = pl.when(group.fill_null("").str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    return expr


def copy_kind_expr(name: str = "name") -> pl.Expr:
    """HtoD / DtoH / DtoD / PtoP from a copy's name, null when the name does not say."""
    expr = pl.lit(None, dtype=pl.String)
    for kind, pattern in reversed(COPY_KINDS):
        expr = pl.when(pl.col(name).str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    return expr
