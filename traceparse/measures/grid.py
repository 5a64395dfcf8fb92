"""How much of the kernel time leaves streaming multiprocessors without a block (grids smaller than the GPU)."""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.measures.base import DEVICE, Measure, keyed, placed, rows_of, unkeyed

#: Default length under which a kernel whose grid is unknown counts as too short to fill the GPU (ns).
SHORT_KERNEL_NS = 10_000

_SUMS = ["kernels", "time_ns", "with_grid", "small_grid", "small_grid_ns", "idle_sm_ns", "short", "short_ns"]


class GridFill(Measure):
    """Per device, kernel time on grids smaller than the GPU and the SM time they leave empty.

    Timed kernels, communication kernels left out (NCCL/RCCL run on a few
    blocks by design; whether they overlap compute is ``comm_overlap``'s
    question). A kernel's blocks = ``grid_x`` × ``grid_y`` × ``grid_z`` (a
    missing y or z counts 1; a missing ``grid_x``: grid unknown). With the
    GPU's ``sm_count`` known, a kernel with fewer blocks than SMs (Nsight
    Compute's "small grid") leaves ``1 − blocks / sm_count`` of the GPU
    without a block for its whole duration. A kernel whose grid (or the SM
    count) is unknown counts as leaving the GPU unused when it is shorter
    than ``short_ns``: it ends about as soon as it is launched.

    Per (``trace_id``, ``device_id``): ``kernels``, ``time_ns`` (Σ durations),
    ``with_grid`` (kernels judged by their grid), ``small_grid`` and
    ``small_grid_ns`` (kernels with fewer blocks than SMs, their time),
    ``idle_sm_ns`` (Σ ⌊duration × (sm_count − blocks) / sm_count⌋ over them),
    ``short`` and ``short_ns`` (kernels judged by length that are shorter
    than ``short_ns``, their time). Sums of rows: valid on any partition.
    """

    name = "grid_fill"

    def part(self, events: pl.DataFrame, sm_count: int | None = None, short_ns: int = SHORT_KERNEL_NS
             ) -> pl.DataFrame:
        rows = keyed(rows_of(events, ("kernel",)).filter(placed()))
        rows = rows.filter(~expr.is_communication())
        blocks = (pl.col("grid_x").cast(pl.Int64) * pl.col("grid_y").cast(pl.Int64).fill_null(1)
                  * pl.col("grid_z").cast(pl.Int64).fill_null(1))
        by_grid = blocks.is_not_null() & pl.lit(bool(sm_count))
        small = by_grid & (blocks < (sm_count or 0))
        short = ~by_grid & (pl.col("duration_ns") < short_ns)
        idle = pl.when(small).then(pl.col("duration_ns") * ((sm_count or 0) - blocks) // (sm_count or 1)).otherwise(0)
        return rows.group_by(DEVICE).agg(
            kernels=pl.len().cast(pl.Int64), time_ns=pl.col("duration_ns").sum().cast(pl.Int64),
            with_grid=by_grid.sum().cast(pl.Int64), small_grid=small.sum().cast(pl.Int64),
            small_grid_ns=pl.col("duration_ns").filter(small).sum().cast(pl.Int64),
            idle_sm_ns=idle.sum().cast(pl.Int64),
            short=short.sum().cast(pl.Int64), short_ns=pl.col("duration_ns").filter(short).sum().cast(pl.Int64))

    def combine(self, parts: list[pl.DataFrame], sm_count: int | None = None, short_ns: int = SHORT_KERNEL_NS
                ) -> pl.DataFrame:
        out = (pl.concat(parts).group_by(DEVICE).agg(pl.col(c).sum() for c in _SUMS)
               .sort(DEVICE))
        return unkeyed(out).select(*DEVICE, *_SUMS)


grid_fill = GridFill()
