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

APEX (which writes TAU profiles, ``APEX_PROFILE_OUTPUT``/``apex_exec --apex:tau``)
names GPU activity with a ``GPU: `` prefix on the host's own thread, all in
group ``TAU_USER``: older APEX ``GPU: Kernel(DataElement*)``,
``GPU: Unified Memcpy HTOD``, ``GPU: Unified Memory copy DTOH``; current
APEX (``src/apex/cupti_trace.cpp``, ``hip_trace.cpp``)
``GPU: [CUDA] <kernel>``, ``GPU: [CUDA] Memcpy HtoD 0->0``,
``GPU: [CUDA] Memset``, ``GPU: [HIP] <kernel>``. A ``GPU: `` timer is a copy
or memset when its name says so, one of CUPTI's unified-memory events
(page faults, thrashing, ...) stays a region, and any other is a kernel.
Its byte counter (``GPU: Bytes <- NAME``, ``GPU: [CUDA] Bytes: NAME``) gives
the copy's ``bytes`` (mean × samples) and is marked ``unit`` byte.
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

#: APEX's prefix of GPU activity timers: "GPU: ", then "[CUDA] " / "[HIP] " in current APEX
APEX_GPU = r"^GPU: (?:\[\w+\] )?"

#: (kind, regular expression on the routine's own name, the last part of a call path)
NAME_KINDS: list[tuple[str, str]] = [
    ("memcpy", r"^(?:Unified )?Memory copy (?:Host to Device|Device to Host|Device to Device|Peer to Peer)"),
    # APEX: "GPU: Unified Memcpy HTOD", "GPU: Unified Memory copy DTOH", "GPU: [CUDA] Memcpy HtoD 0->0"
    ("memcpy", APEX_GPU + r"(?:Unified )?(?:Memcpy|Memory copy) (?i:[HDAP]to[HDAP])\b"),
    ("memset", APEX_GPU + r"Memset\b"),
    # CUPTI's unified-memory events that APEX names like copies but are not GPU work
    ("region", APEX_GPU + r"Unified Memory (?:CPU Page Fault|GPU Page Fault|Trashing|Thrashing|Throttling"
               r"|Remote Map|Count)"),
    ("kernel", APEX_GPU + r"\S"),
    # cudaLaunchKernel, cuCtxCreate_v2, "cudaError_t cudaMalloc(void **, size_t) C"
    ("api", r"^(?:[A-Za-z_][\w:]*[\s*]+)?(?:cuda|cu)[A-Z]\w*\s*(?:\(.*)?$"),
]

#: a caller that launches the GPU work below it in a call path
LAUNCH_CALLER = r"^(?:[A-Za-z_][\w:]*[\s*]+)?(?:cudaLaunch\w*|cuLaunch\w*)\s*(?:\(.*)?$"

#: routines on a GPU thread that are not GPU work
GPU_THREAD_NON_KERNELS = r"^\.TAU application$|^\[(?:CONTEXT|SAMPLE|UNWIND|SUMMARY)\]"

#: copy direction from a TAU copy name
COPY_KINDS: list[tuple[str, str]] = [
    ("HtoD", r"Host to Device|\b(?i:HtoD)\b"),
    ("DtoH", r"Device to Host|\b(?i:DtoH)\b"),
    ("DtoD", r"Device to Device|\b(?i:DtoD)\b"),
    ("PtoP", r"Peer to Peer|\b(?i:PtoP)\b"),
]

#: APEX's byte counter of a GPU copy: "GPU: Bytes <- NAME" (older APEX), "GPU: [CUDA] Bytes: NAME"
APEX_BYTES = APEX_GPU + r"Bytes(?: <-|:) (.+)$"

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


def attach_copy_bytes(events: pl.DataFrame) -> pl.DataFrame:
    """APEX copies get ``bytes`` from their byte counter (total = mean × samples), matched by name per thread.

    The counter names the copy without APEX's ``GPU: `` prefix; the counter
    rows get ``unit`` ``byte``.
    """
    if "value" not in events.columns or events.height == 0:
        return events
    is_bytes = (pl.col("kind") == "counter") & pl.col("name").str.contains(APEX_BYTES)
    counters = events.filter(is_bytes)
    if counters.height == 0:
        return events
    totals = (counters.with_columns(key=pl.col("name").str.extract(APEX_BYTES, 1).str.strip_chars())
              .group_by("pid", "tid", "key")
              .agg(_bytes=(pl.col("value") * pl.col("calls").fill_null(1)).sum().round(0).cast(pl.Int64)))
    copies = pl.col("kind") == "memcpy"
    key = pl.col("name").str.replace(APEX_GPU, "").str.strip_chars()
    events = (events.with_columns(key=pl.when(copies).then(key))
              .join(totals, on=["pid", "tid", "key"], how="left", nulls_equal=True, maintain_order="left"))
    if "bytes" not in events.columns:
        events = events.with_columns(bytes=pl.lit(None, dtype=pl.Int64))
    return events.with_columns(
        bytes=pl.coalesce(pl.col("bytes"), pl.col("_bytes")),
        unit=pl.when(is_bytes).then(pl.lit("byte")).otherwise(pl.col("unit")) if "unit" in events.columns
        else pl.when(is_bytes).then(pl.lit("byte")),
    ).drop("key", "_bytes")


def copy_kind_expr(name: str = "name") -> pl.Expr:
    """HtoD / DtoH / DtoD / PtoP from a copy's name, null when the name does not say."""
    expr = pl.lit(None, dtype=pl.String)
    for kind, pattern in reversed(COPY_KINDS):
        expr = pl.when(pl.col(name).str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    return expr
