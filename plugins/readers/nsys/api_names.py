"""CUDA API names as CUDA documents them, without the version nsys records with an entry point.

nsys 2025 records versioned entry points: ``cudaDeviceSynchronize_v3020``, ``cudaGraphLaunch_v10000``,
``cuGetProcAddress_v2``. Its own reports strip only a four-digit version (``nsys stats`` prints
``cudaDeviceSynchronize`` but ``cudaGraphLaunch_v10000``: the H200 capture of fixtures/nsys/acceptance);
traceparse strips any, so one API has one name in every export, report and tool (CUPTI through
torch.profiler writes ``cudaGraphLaunch``), and ``compare``/``diff`` match them.
"""

from __future__ import annotations

import polars as pl

#: A version suffix on an API entry point's name.
VERSION_SUFFIX = r"_v[0-9]+$"


def api_name(name: pl.Expr) -> pl.Expr:
    """``name`` without its entry point's version suffix."""
    return name.str.replace(VERSION_SUFFIX, "")
