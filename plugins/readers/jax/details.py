"""The ``key:value`` texts of XLA's GPU profiler stats: ``kernel_details``, ``memcpy_details``, ``Memset_details``.

``kernel_details`` comes in three forms, all ``key:value`` words separated by spaces:

* CUDA (JAX 0.4 to 0.11, and the ROCm builds of JAX ~0.6): ``regs:16 static_shared:0 dynamic_shared:256
  grid:512,1,1 block:256,1,1 occ_pct:25``;
* ROCm, JAX 0.8: `` grid:256,1,1 block:256,1,1 private_mem:0 group_mem:8704 occ_pct:0`` (no registers;
  ``group_mem`` is the LDS a work-group uses, static and dynamic together, so it lands in
  ``dynamic_smem_bytes`` as Kineto's one "shared memory" figure does; ``occ_pct:0`` means not computed);
* TensorFlow's profiler of 2020: ``regs:0 shm:... grid:... block:...`` (its values were not initialised:
  they fail the checks below and are left out).

A value a GPU cannot have (more than :data:`MAX_REGISTERS` registers per thread, a block of more than
:data:`MAX_BLOCK_THREADS` threads, a grid dimension past 2^31 − 1, shared memory past
:data:`MAX_SHARED_BYTES`) is left empty and counted, so that the kernel is kept with the launch
configuration it can be trusted for (the MI300X capture of JAX ~0.6 writes 2,191,487,992 registers).

``memcpy_details``: ``kind_src:pinned kind_dst:device size:4 dest:0 async:1`` (CUDA) or ``kind:Unknown size:0
dest:512 async:1`` (ROCm); ``Memset_details``: ``kind:unknown num_bytes:4 async:1``.
"""

from __future__ import annotations

import polars as pl

#: Most registers a thread can have (NVIDIA: 255; AMD CDNA: 512 VGPRs with AGPRs).
MAX_REGISTERS = 512
#: Most threads in a block (NVIDIA and AMD: 1024).
MAX_BLOCK_THREADS = 1024
#: Most shared memory (LDS) a block can have: 228 KiB on Hopper, 160 KiB on MI300X; 1 MiB leaves margin.
MAX_SHARED_BYTES = 1 << 20
_INT32_MAX = 2**31 - 1
_WORD = r"(?:^|\s){key}:(\S*)"
#: memcpy_details' memory kinds -> the schema's memory kinds (``unknown`` and ROCm's ``Unknown`` stay empty).
MEMORY = {"pinned": "pinned", "pageable": "pageable", "device": "device", "managed": "managed", "array": "array"}


def field(text: pl.Expr, key: str) -> pl.Expr:
    """The value of ``key:value`` in a details text (null when absent)."""
    return text.str.extract(_WORD.format(key=key), 1)


def _int(text: pl.Expr) -> pl.Expr:
    """Decimal digits as Int64 (null otherwise; a number too long for Int64 too)."""
    return pl.when(text.str.contains(r"^[0-9]{1,18}$")).then(text).cast(pl.Int64, strict=False)


def _dim(text: pl.Expr, key: str, axis: int) -> pl.Expr:
    return _int(field(text, key).str.split(",").list.get(axis, null_on_oob=True))


def kernel_columns(details: pl.Expr) -> dict[str, pl.Expr]:
    """Launch-configuration columns from a ``kernel_details`` text, unchecked (:func:`checked` bounds them).

    ``registers_per_thread`` (``regs``), ``static_smem_bytes`` (``static_shared``), ``dynamic_smem_bytes``
    (``dynamic_shared``, else ROCm's ``group_mem``), ``grid_x`` .. ``block_z``, and ``_occ_pct`` (``occ_pct``,
    the theoretical occupancy the profiler computed, in %).
    """
    out = {"registers_per_thread": _int(field(details, "regs")),
           "static_smem_bytes": _int(field(details, "static_shared")),
           "dynamic_smem_bytes": pl.coalesce(_int(field(details, "dynamic_shared")),
                                             _int(field(details, "group_mem")))}
    for key in ("grid", "block"):
        for axis, name in enumerate("xyz"):
            out[f"{key}_{name}"] = _dim(details, key, axis)
    out["_occ_pct"] = field(details, "occ_pct").cast(pl.Float64, strict=False)
    return out


#: column -> (the check it must pass, what the warning says it is).
def _checks() -> dict[str, tuple[pl.Expr, str]]:
    block = (pl.col("block_x").fill_null(1) * pl.col("block_y").fill_null(1) * pl.col("block_z").fill_null(1))
    return {
        "registers_per_thread": (pl.col("registers_per_thread") <= MAX_REGISTERS, f"registers > {MAX_REGISTERS}"),
        "static_smem_bytes": (pl.col("static_smem_bytes") <= MAX_SHARED_BYTES, "shared memory > 1 MiB"),
        "dynamic_smem_bytes": (pl.col("dynamic_smem_bytes") <= MAX_SHARED_BYTES, "shared memory > 1 MiB"),
        "grid": (pl.max_horizontal("grid_x", "grid_y", "grid_z") <= _INT32_MAX, "grid dimension > 2^31-1"),
        "block": (block <= MAX_BLOCK_THREADS, f"block > {MAX_BLOCK_THREADS} threads"),
    }


def checked(frame: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """``frame`` with launch-configuration values no GPU can have left empty; and how many of each were.

    Grid and block are checked as a whole (all three dimensions emptied together).
    """
    counts: dict[str, int] = {}
    updates = []
    for column, (ok, label) in _checks().items():
        columns = [f"{column}_{a}" for a in "xyz"] if column in ("grid", "block") else [column]
        if not all(c in frame.columns for c in columns):
            continue
        bad = ~ok.fill_null(True)
        n = frame.select(bad.sum()).item()
        if n:
            counts[label] = counts.get(label, 0) + int(n)
            updates += [pl.when(bad).then(None).otherwise(pl.col(c)).alias(c) for c in columns]
    if updates:
        frame = frame.with_columns(updates)
    return frame, counts


def copy_columns(details: pl.Expr, name: pl.Expr, device: pl.Expr) -> dict[str, pl.Expr]:
    """``bytes``, ``copy_kind``, ``src_memory``, ``dst_memory``, ``src_device``, ``dst_device`` of a copy, from its
    ``memcpy_details``, its name and the GPU it runs on (``device``).

    The direction comes from the name XLA gives the copy (``MemcpyH2D``, ``MemcpyD2H``, ``MemcpyD2D``,
    ``MemcpyP2P``; ``MemcpyOther``: unknown); the memory kinds from ``kind_src`` / ``kind_dst``. A peer copy
    (``MemcpyP2P``, a data-parallel program's exchange between GPUs) goes from the GPU it runs on to ``dest``
    (``kind_src:device kind_dst:device size:8224 dest:1``); the other copies' ``dest`` is not another GPU.
    """
    direction = name.str.extract(r"^Memcpy([HDP])2([HDP])", 0).replace_strict(
        {"MemcpyH2D": "HtoD", "MemcpyD2H": "DtoH", "MemcpyD2D": "DtoD", "MemcpyH2H": "HtoH", "MemcpyP2P": "PtoP"},
        default=None, return_dtype=pl.String)
    peer = direction == "PtoP"
    dest = _int(field(details, "dest"))
    return {"bytes": _int(field(details, "size")),
            "src_device": pl.when(peer).then(device).cast(pl.Int32, strict=False),
            "dst_device": pl.when(peer & (dest <= _INT32_MAX)).then(dest).cast(pl.Int32, strict=False),
            "copy_kind": direction,
            "src_memory": field(details, "kind_src").str.to_lowercase().replace_strict(MEMORY, default=None,
                                                                                       return_dtype=pl.String),
            "dst_memory": field(details, "kind_dst").str.to_lowercase().replace_strict(MEMORY, default=None,
                                                                                       return_dtype=pl.String)}


def memset_bytes(details: pl.Expr) -> pl.Expr:
    """The bytes a memset sets, from its ``Memset_details`` (``num_bytes``)."""
    return _int(field(details, "num_bytes"))
