"""From a typed ``nsys stats`` report to rows of the normalized event table.

Trace reports (``cuda_gpu_trace``, ``cuda_api_trace``) give one timed event
per row. Summary reports give one aggregated row per name: ``start_ns`` null,
``duration_ns`` the total time, ``calls`` the count, ``min_ns`` / ``max_ns``;
``cuda_gpu_mem_size_sum`` gives the total ``bytes``. Only what a report has
is filled; the rest stays null.
"""

from __future__ import annotations

import polars as pl

from traceparse.trace import Device

from traceparse_plugins.readers.nsys import memops
from traceparse_plugins.readers.nsys.api_names import api_name
from traceparse_plugins.readers.nsys.report_table import ReportTable

_DEVICE = r"^(?P<name>.*?)\s*\((?P<id>[0-9]+)\)\s*$"


def _col(frame: pl.DataFrame, name: str, dtype: pl.DataType = pl.Int64) -> pl.Expr:
    return pl.col(name) if name in frame.columns else pl.lit(None, dtype=dtype)


def gpu_trace(table: ReportTable) -> pl.DataFrame:
    """``cuda_gpu_trace`` / ``gputrace``: kernels, copies and memsets with start and duration."""
    f = table.frame
    kind = memops.kind_of_name(pl.col("name"), "kernel")
    duration = pl.col("duration") if "duration" in f.columns else pl.col("end") - pl.col("start")
    is_kernel = pl.col("kind") == "kernel"
    is_copy = pl.col("kind") == "memcpy"
    is_memset = pl.col("kind") == "memset"
    out = f.select(
        kind=kind,
        name=pl.col("name"),
        start_ns=pl.col("start"),
        duration_ns=duration,
        calls=pl.lit(1, dtype=pl.Int64),
        correlation_id=_col(f, "corr"),
        grid_x=_col(f, "grid_x"), grid_y=_col(f, "grid_y"), grid_z=_col(f, "grid_z"),
        block_x=_col(f, "block_x"), block_y=_col(f, "block_y"), block_z=_col(f, "block_z"),
        registers_per_thread=_col(f, "regs"),
        _ssmem=_col(f, "ssmem"), _dsmem=_col(f, "dsmem"), _bytes=_col(f, "bytes"),
        _src=_col(f, "src_kind", pl.String), _dst=_col(f, "dst_kind", pl.String),
        device_id=_device_ids(f),
        context_id=_col(f, "context"),
        stream_id=_col(f, "stream"),
        pid=_col(f, "pid"),
        tid=_col(f, "tid"),
    )
    return out.with_columns(
        static_smem_bytes=pl.when(is_kernel).then(pl.col("_ssmem")),
        dynamic_smem_bytes=pl.when(is_kernel).then(pl.col("_dsmem")),
        bytes=pl.when(is_copy | is_memset).then(pl.col("_bytes")),
        copy_kind=pl.when(is_copy).then(memops.copy_kind_of_name(pl.col("name"))),
        src_memory=pl.when(is_copy).then(memops.memory_kind(pl.col("_src"))),
        # a memset's SrcMemKd is the kind of memory it sets: kept as where it writes
        dst_memory=pl.when(is_copy).then(memops.memory_kind(pl.col("_dst")))
        .when(is_memset).then(memops.memory_kind(pl.col("_src"))),
    ).drop("_ssmem", "_dsmem", "_bytes", "_src", "_dst")


def _device_ids(frame: pl.DataFrame) -> pl.Expr:
    """``Device`` cells (``NVIDIA H100 80GB HBM3 (0)``, or a bare number) -> device ids, parsed once per value."""
    if "device" not in frame.columns:
        return pl.lit(None, dtype=pl.Int64)
    values = frame["device"].cast(pl.String).unique(maintain_order=True).drop_nulls()
    ids = pl.select(pl.when(values.str.contains(r"^\s*[0-9]+\s*$")).then(values.str.strip_chars())
                    .otherwise(values.str.extract(_DEVICE, 2)).cast(pl.Int32, strict=False)).to_series()
    return pl.col("device").cast(pl.String).replace_strict(values.to_list(), ids.to_list(), default=None,
                                                          return_dtype=pl.Int64)


def devices_of(table: ReportTable) -> list[Device]:
    """Devices named in a trace report's ``Device`` column (``NVIDIA H100 80GB HBM3 (0)``)."""
    if "device" not in table.frame.columns:
        return []
    parsed = (table.frame.select(pl.col("device").cast(pl.String).unique().str.extract_groups(_DEVICE).alias("d"))
              .unnest("d").with_columns(pl.col("id").cast(pl.Int32, strict=False)).drop_nulls("id")
              .unique().sort("id"))
    return [Device(id=int(r["id"]), name=r["name"] or None) for r in parsed.iter_rows(named=True)]


def api_trace(table: ReportTable) -> pl.DataFrame:
    """``cuda_api_trace``: one api event per call."""
    f = table.frame
    duration = pl.col("duration") if "duration" in f.columns else pl.col("end") - pl.col("start")
    return f.select(
        kind=pl.lit("api"),
        name=api_name(pl.col("name")),
        start_ns=pl.col("start"),
        duration_ns=duration,
        calls=pl.lit(1, dtype=pl.Int64),
        correlation_id=_col(f, "corr"),
        pid=_col(f, "pid"),
        tid=_col(f, "tid"),
    )


#: Summary report -> (column holding the name, kind of its rows or None to tell from the name).
_SUMMARY: dict[str, tuple[str, str | None]] = {
    "cuda_gpu_kern_sum": ("name", "kernel"),
    "cuda_api_sum": ("name", "api"),
    "nvtx_sum": ("range", "marker"),
    "cuda_gpu_mem_time_sum": ("operation", None),
    "cuda_gpu_mem_size_sum": ("operation", None),
    "cuda_gpu_sum": ("operation", None),
}


def _nvtx_names(frame: pl.DataFrame) -> tuple[pl.Expr, pl.Expr]:
    """(name, group) of nvtx_sum ranges.

    Recent nsys writes every range as ``DOMAIN:NAME`` (``:train_step`` in the
    default domain); older releases write a bare name, prefixed only when a
    domain exists. When every range of the report has a ``:`` and one starts
    with it, the report uses the prefixed form: the domain goes to ``group``
    (null for the default domain) and the name is what follows, as the
    SQLite export gives them. Otherwise names stay as written.
    """
    ranges = frame["range"].cast(pl.String)
    prefixed = ranges.len() > 0 and bool(ranges.str.contains(":").all()) and bool(ranges.str.starts_with(":").any())
    if not prefixed:
        return pl.col("range"), pl.lit(None, dtype=pl.String)
    parts = pl.col("range").str.splitn(":", 2)
    domain = parts.struct.field("field_0")
    return parts.struct.field("field_1"), pl.when(domain != "").then(domain)


def summary(table: ReportTable) -> pl.DataFrame:
    """A summary report: one aggregated row per name (nvtx_sum: per range and style, as nsys lists them)."""
    f = table.frame
    name_col, kind = _SUMMARY[table.report]
    name = pl.col(name_col)
    group = pl.lit(None, dtype=pl.String)
    if table.report == "nvtx_sum":
        name, group = _nvtx_names(f)
    elif table.report == "cuda_api_sum":
        name = api_name(name)
    if kind is None:
        kind_expr = memops.kind_of_name(name, "kernel")
    else:
        kind_expr = pl.lit(kind)
    is_copy = kind_expr == "memcpy"
    sizes = table.report == "cuda_gpu_mem_size_sum"
    return f.select(
        kind=kind_expr,
        name=name,
        start_ns=pl.lit(None, dtype=pl.Int64),
        duration_ns=pl.lit(None, dtype=pl.Int64) if sizes else _col(f, "total_time"),
        calls=_col(f, "count"),
        min_ns=pl.lit(None, dtype=pl.Int64) if sizes else _col(f, "min"),
        max_ns=pl.lit(None, dtype=pl.Int64) if sizes else _col(f, "max"),
        bytes=_col(f, "total") if sizes else pl.lit(None, dtype=pl.Int64),
        copy_kind=pl.when(is_copy).then(memops.copy_kind_of_name(name)),
        group=group,
    )


def merge_memory_summaries(by_time: pl.DataFrame | None, by_size: pl.DataFrame | None) -> pl.DataFrame | None:
    """One row per memory operation from the by-time and by-size summaries of the same capture.

    The two reports list the same operations; the by-time one gives time,
    calls, min and max, the by-size one the total bytes.
    """
    if by_time is None or by_size is None:
        return by_time if by_time is not None else by_size
    sizes = by_size.select("name", pl.col("bytes").alias("_size_bytes"), pl.col("calls").alias("_size_calls"))
    merged = by_time.join(sizes, on="name", how="full", coalesce=True)
    return merged.with_columns(
        kind=pl.coalesce("kind", memops.kind_of_name(pl.col("name"), "kernel")),
        calls=pl.coalesce("calls", "_size_calls"),
        bytes=pl.col("_size_bytes"),
        copy_kind=pl.coalesce("copy_kind", pl.when(memops.kind_of_name(pl.col("name"), "kernel") == "memcpy")
                              .then(memops.copy_kind_of_name(pl.col("name")))),
    ).drop("_size_bytes", "_size_calls")


def to_events(table: ReportTable) -> pl.DataFrame:
    """The event rows of any report traceparse reads."""
    if table.report == "cuda_gpu_trace":
        return gpu_trace(table)
    if table.report == "cuda_api_trace":
        return api_trace(table)
    return summary(table)
