"""What an nvprof name says: the kind of activity, the copy direction, the correlation id.

nvprof names GPU work the same way in every form: kernels by their demangled
signature (``void foo<int=1>(float*, int)``), copies as ``[CUDA memcpy HtoD]``
(``DtoH``, ``DtoD``, ``HtoH``, ``PtoP``, ``HtoA``, ...), sets as
``[CUDA memset]``, unified-memory activity as ``[Unified Memory ...]``. In a
GPU trace a kernel name is followed by its correlation id (``foo(int) [112]``);
in an API trace a launch is ``cudaLaunchKernel (foo(int) [112])``.
"""

from __future__ import annotations

import polars as pl

from traceparse.schema import COPY_KINDS

#: Copy directions nvprof writes that the schema's ``copy_kind`` has; others (HtoA, AtoD, ...) stay null.
SCHEMA_COPY_KINDS = frozenset(COPY_KINDS)
#: nvprof's SrcMemType / DstMemType words (lower-cased) -> schema memory kind; others stay null.
MEMORY_WORDS = {"pageable": "pageable", "pinned": "pinned", "device": "device", "array": "array",
                "managed": "managed"}

_COPY = r"^\[CUDA memcpy (\w+)\]$"
_TRAILING_ID = r"^(.*\S)\s+\[([0-9]+)\]$"
_API_LAUNCH = r"^(\S+)\s+\((.*)\s+\[([0-9]+)\]\)$"
UNIFIED_MEMORY_GROUP = "Unified Memory"


def split_correlation(names: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(name without a trailing ``[id]``, the id) for GPU-trace names; the id is null where there is none."""
    groups = names.str.extract_groups(_TRAILING_ID)
    base = pl.when(groups.struct.field("1").is_not_null()).then(groups.struct.field("1")).otherwise(names)
    return base, groups.struct.field("2").cast(pl.Int64)


def split_api_launch(names: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(API name, correlation id) for API-trace names such as ``cudaLaunchKernel (foo(int) [112])``."""
    groups = names.str.extract_groups(_API_LAUNCH)
    base = pl.when(groups.struct.field("1").is_not_null()).then(groups.struct.field("1")).otherwise(names)
    return base, groups.struct.field("3").cast(pl.Int64)


def gpu_kind(names: pl.Expr) -> pl.Expr:
    """The kind of a GPU activity from its name: memcpy, memset, marker (other bracketed names) or kernel."""
    return (pl.when(names.str.starts_with("[CUDA memcpy ")).then(pl.lit("memcpy"))
            .when(names.str.starts_with("[CUDA memset")).then(pl.lit("memset"))
            .when(names.str.starts_with("[") & names.str.ends_with("]")).then(pl.lit("marker"))
            .otherwise(pl.lit("kernel")))


def copy_kind(names: pl.Expr) -> pl.Expr:
    """The schema's copy direction of a ``[CUDA memcpy X]`` name; null for other names and other directions."""
    direction = names.str.extract(_COPY, 1)
    return pl.when(direction.is_in(list(SCHEMA_COPY_KINDS))).then(direction)


def marker_group(names: pl.Expr, kinds: pl.Expr) -> pl.Expr:
    """``Unified Memory`` for unified-memory markers, null otherwise."""
    return pl.when((kinds == "marker") & names.str.starts_with("[Unified Memory")).then(pl.lit(UNIFIED_MEMORY_GROUP))


def memory_kind(words: pl.Expr) -> pl.Expr:
    """Schema memory kind of nvprof's SrcMemType/DstMemType words (Pageable, Pinned, Device, ...); null otherwise."""
    lowered = words.str.strip_chars().str.to_lowercase()
    return lowered.replace_strict(list(MEMORY_WORDS), list(MEMORY_WORDS.values()), default=None,
                                  return_dtype=pl.String)
