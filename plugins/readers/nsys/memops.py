"""Names nsys gives to memory operations, and the copy directions and memory kinds they mean.

nsys names a copy ``[CUDA memcpy Host-to-Device]`` (2022 onwards, from the
export's ENUM_CUDA_MEMCPY_OPER labels) or ``[CUDA memcpy HtoD]`` (2020-2021,
the report scripts' own table), ``[CUDA Unified Memory memcpy HtoD]`` for
managed-memory migrations, and a memset ``[CUDA memset]``. Copies to or from
CUDA arrays (``HtoA``, ``AtoD``, ...) count as the host/device direction they
are: an array lives in device memory, and ``array`` is kept as its memory kind.
"""

from __future__ import annotations

import polars as pl

#: Direction as written (lower-case) -> traceparse copy kind.
DIRECTIONS: dict[str, str | None] = {
    "htod": "HtoD", "host-to-device": "HtoD",
    "dtoh": "DtoH", "device-to-host": "DtoH",
    "dtod": "DtoD", "device-to-device": "DtoD",
    "htoh": "HtoH", "host-to-host": "HtoH",
    "ptop": "PtoP", "peer-to-peer": "PtoP",
    "htoa": "HtoD", "host-to-array": "HtoD",
    "atoh": "DtoH", "array-to-host": "DtoH",
    "atoa": "DtoD", "array-to-array": "DtoD",
    "atod": "DtoD", "array-to-device": "DtoD",
    "dtoa": "DtoD", "device-to-array": "DtoD",
    "unified host-to-device": "HtoD", "unified device-to-host": "DtoH", "unified device-to-device": "DtoD",
    "unknown": None,
}
#: Memory kind as nsys labels it (lower-case) -> traceparse memory kind.
MEMORY_KINDS: dict[str, str | None] = {
    "pageable": "pageable", "pinned": "pinned", "device": "device", "array": "array", "managed": "managed",
    "device static": "device", "managed static": "managed", "unknown": None,
}
#: nsys's numbering of memory kinds, for exports without ENUM_CUDA_MEM_KIND (its own report
#: scripts of 2020-2021 hard-code this table; it is NOT CUPTI's CUpti_ActivityMemoryKind,
#: where 0 is UNKNOWN and 1 PAGEABLE). Value 4 was "Unknown" in 2021.1 and "Managed" later,
#: so it stays unknown here.
FALLBACK_MEM_KIND: dict[int, str] = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array",
                                     5: "Device Static", 6: "Managed Static", 7: "Unknown"}
#: copyKind numbering (same in nsys and CUPTI's CUpti_ActivityMemcpyKind), with nsys's labels.
FALLBACK_COPY_KIND: dict[int, str] = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
    5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device", 9: "Host-to-Host",
    10: "Peer-to-Peer", 11: "Unified Host-to-Device", 12: "Unified Device-to-Host", 13: "Unified Device-to-Device",
}
MEMSET_NAME = "[CUDA memset]"
_COPY = r"(?i)^\[CUDA (?:Unified Memory )?memcpy (.+?)\]$"


def kind_of_name(names: pl.Expr, default: str) -> pl.Expr:
    """``memcpy`` / ``memset`` for nsys memory-operation names, ``default`` for any other name."""
    bracketed = names.str.starts_with("[CUDA ")  # cheap test first: kernel names are long
    head = names.str.slice(0, 40)
    return (pl.when(bracketed & head.str.contains(r"^\[CUDA (Unified Memory )?memcpy")).then(pl.lit("memcpy"))
            .when(bracketed & head.str.starts_with("[CUDA memset")).then(pl.lit("memset"))
            .otherwise(pl.lit(default)))


def copy_kind_of_name(names: pl.Expr) -> pl.Expr:
    """The traceparse copy kind of a copy's name (null for other names and unknown directions)."""
    direction = names.str.slice(0, 80).str.extract(_COPY, 1).str.to_lowercase().str.strip_chars()
    return direction.replace_strict(DIRECTIONS, default=None, return_dtype=pl.String)


def memory_kind(labels: pl.Expr) -> pl.Expr:
    """nsys memory-kind labels (``Pageable``, ``Device Static``...) -> traceparse memory kinds."""
    return labels.str.to_lowercase().str.strip_chars().replace_strict(MEMORY_KINDS, default=None,
                                                                      return_dtype=pl.String)
