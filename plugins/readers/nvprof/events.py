"""From the cells of nvprof result tables to rows of the normalized event table.

Each form maps as docs/formats/nvprof.md describes: a summary row becomes an
aggregated row (``start_ns`` null, ``duration_ns`` the total, ``calls``,
``min_ns``, ``max_ns``); a GPU- or API-trace row a timed event; a metric or
event result a ``counter`` row (``value`` the average, ``value_min``,
``value_max``, ``calls`` the invocations); a unified-memory summary row a
``marker`` row of group ``Unified Memory``. Conversions are polars
expressions over whole columns; a cell that must be a number and is not is
an error naming its line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceparse.errors import bad_input

from .devices import DeviceBook
from .names import UNIFIED_MEMORY_GROUP, copy_kind, gpu_kind, marker_group, memory_kind, split_api_launch, split_correlation
from .tables import EVENTS, METRICS, SUMMARY, TRACE, UNIFIED, Table
from .units import DIMENSION_UNITS, RATE_UNITS, SIZE_UNITS, TIME_UNITS, split_number, to_floats, to_ints

#: What each kind of number looks like, for error messages.
_EXPECTED = {"time": "a time such as 4.5440us", "size": "a size such as 4.0000KB", "int": "a whole number",
             "value": "a number, a percentage, a rate such as 1.2GB/s or a level such as Low (1)"}
_LEVEL = r"^\s*[A-Za-z]+ \(([0-9]+)\)\s*$"
_API_NAME = r"^cu(?:da)?[A-Z][A-Za-z0-9_]*$"  # cudaMalloc, cuDeviceGetAttribute, cudaLaunchKernel_ptsz


class Converter:
    """Converts the raw cells of one table, raising a one-line error at the first cell that is not a number."""

    def __init__(self, path: Path, table: Table):
        self.path, self.table = path, table
        frame = table.frame()
        cleaned = [_clean(pl.col(k)).alias(k) for k in frame.columns if not k.startswith("_")]
        self.frame = frame.with_columns(cleaned)

    def raw(self, key: str) -> pl.Series:
        """The cells of a column, stripped, null where absent or ``-`` (nvprof's not-applicable)."""
        if key not in self.frame.columns:
            return pl.Series(key, [None] * self.frame.height, dtype=pl.String)
        return self.frame[key]

    def numbers(self, **spec: tuple[str, str]) -> dict[str, pl.Series]:
        """Several columns at once, ``name=(key, kind)``: times (ns), sizes (bytes) or whole numbers, as Int64."""
        out = {name: self._number_series(key, kind) for name, (key, kind) in spec.items()}
        for name, (key, kind) in spec.items():
            self._check(key, self.raw(key), out[name], kind)
        return out

    def number(self, key: str, kind: str) -> pl.Series:
        """One column of times (ns), sizes (bytes) or whole numbers, exactly converted to Int64."""
        return self.numbers(value=(key, kind))["value"]

    def _number_series(self, key: str, kind: str) -> pl.Series:
        if key not in self.frame.columns:
            return pl.Series(key, [None] * self.frame.height, dtype=pl.Int64)
        cells = self.frame[key]
        if kind == "int":
            return cells.str.to_integer(strict=False)
        allowed = DIMENSION_UNITS[kind]
        if self.table.style == "csv" or self.table.units:  # a units row (CSV; text with -u): bare numbers
            unit = self.table.units.get(key)
            if unit is None and cells.is_not_null().any():
                where = self.table.units_line or self.table.header_line
                raise bad_input(self.path, where, f"column {self._label(key)!r} has no unit: expected one of "
                                                  f"{', '.join(allowed)} in the units row under the CSV header")
            if unit is not None and unit not in allowed:
                raise bad_input(self.path, self.table.units_line, f"column {self._label(key)!r}: unit {unit!r} is "
                                                                  f"not one of {', '.join(allowed)}")
            if unit is None:  # an empty column
                return pl.Series(key, [None] * self.frame.height, dtype=pl.Int64)
            return to_ints(cells, unit, allowed)
        parts = pl.DataFrame({"cell": cells}).select(*split_number(pl.col("cell")))
        return to_ints(parts[:, 0], parts[:, 1], allowed)

    def value(self, key: str) -> tuple[pl.Series, pl.Series]:
        """A column of counter values as (Float64 value, unit): %, byte/s, byte, ns, level or a plain number."""
        cells = self.raw(key)
        number, suffix = split_number(pl.col("cell"))
        level = pl.col("cell").str.extract(_LEVEL, 1)
        unit = (pl.when(level.is_not_null()).then(pl.lit("level"))
                .when(suffix == "%").then(pl.lit("%"))
                .when(suffix.is_in(list(RATE_UNITS))).then(pl.lit("byte/s"))
                .when(suffix.is_in(list(SIZE_UNITS))).then(pl.lit("byte"))
                .when(suffix.is_in(list(TIME_UNITS))).then(pl.lit("ns")))
        parts = pl.DataFrame({"cell": cells}).select(
            number=number, spelling=pl.when(~suffix.is_in(["", "%"])).then(suffix),
            level=level.cast(pl.Float64), unit=unit)
        exact = to_floats(parts["number"], parts["spelling"])
        value = parts["level"].fill_null(exact).alias("value")
        self._check(key, cells, value, "value")
        return value, parts["unit"]

    def _check(self, key: str, cells: pl.Series, result: pl.Series, kind: str) -> None:
        bad = cells.is_not_null() & result.is_null()
        if bad.any():
            i = int(bad.arg_max())
            raise bad_input(self.path, int(self.frame["_line"][i]),
                            f"column {self._label(key)!r}: expected {_EXPECTED[kind]}, found {cells[i]!r}")

    def _label(self, key: str) -> str:
        try:
            return self.table.labels[self.table.keys.index(key)]
        except ValueError:
            return key


def _clean(cell: pl.Expr) -> pl.Expr:
    stripped = cell.str.strip_chars()
    return pl.when(stripped.is_in(["-", ""])).then(None).otherwise(stripped)


def device_ids(cells: pl.Series, book: DeviceBook) -> pl.Series:
    """Device indices of device cells, resolving cut-off names against the log's full ones."""
    # in file order: the first value decides the type polars gives the list (issue 16: a device index of
    # 2**70 first or second made an internal error in about half the runs)
    mapping = {text: book.resolve(text) for text in cells.drop_nulls().unique(maintain_order=True).to_list()}
    return cells.replace_strict(list(mapping), pl.Series(list(mapping.values()), dtype=pl.Int32), default=None,
                                return_dtype=pl.Int32) \
        if mapping else pl.Series(cells.name, [None] * len(cells), dtype=pl.Int32)


def summary_frame(path: Path, table: Table, book: DeviceBook) -> pl.DataFrame:
    """Aggregated rows of a summary table (GPU activities, API calls, other sections as regions)."""
    c = Converter(path, table)
    types = c.frame["_type"]
    names = c.raw("name")
    if table.section_guessed and names.str.contains(_API_NAME).all():
        types = pl.Series(["API calls"] * len(names), dtype=pl.String)  # an API-only summary of the old layout
    frame = pl.DataFrame({"name": names, "group": types})
    kind = (pl.when(pl.col("group") == "GPU activities").then(gpu_kind(pl.col("name")))
            .when(pl.col("group") == "API calls").then(pl.lit("api")).otherwise(pl.lit("region")))
    return frame.with_columns(
        kind=kind,
        **c.numbers(duration_ns=("time", "time"), calls=("calls", "int"), min_ns=("min", "time"),
                    max_ns=("max", "time")),
        pid=pl.lit(table.pid, dtype=pl.Int64),
        device_id=device_ids(c.frame["_device"], book),
    ).with_columns(copy_kind=copy_kind(pl.col("name")), group=marker_group(pl.col("name"), pl.col("kind"))
                   .fill_null(pl.col("group")))


def trace_frame(path: Path, table: Table, book: DeviceBook) -> pl.DataFrame:
    """Timed events of a GPU trace, an API trace, or both in one table."""
    c = Converter(path, table)
    keys = set(table.keys)
    raw_names = c.raw("name")
    api_only = keys <= {"start", "duration", "name", "correlation"}
    frame = pl.DataFrame({"raw_name": raw_names, "grid": c.raw("grid"), "grid_x": c.raw("grid_x"),
                          "device": c.raw("device"), "src_mem": c.raw("src_mem"), "dst_mem": c.raw("dst_mem")})
    gpu_name, gpu_corr = split_correlation(pl.col("raw_name"))
    api_name, api_corr = split_api_launch(pl.col("raw_name"))
    no_gpu_columns = pl.col("grid").is_null() & pl.col("grid_x").is_null() & pl.col("device").is_null()
    is_api = (pl.lit(api_only) | (no_gpu_columns & ~pl.col("raw_name").str.starts_with("[")))
    frame = frame.with_columns(is_api=is_api).with_columns(
        name=pl.when("is_api").then(api_name).otherwise(gpu_name),
        name_corr=pl.when("is_api").then(api_corr).otherwise(gpu_corr),
    ).with_columns(kind=pl.when("is_api").then(pl.lit("api")).otherwise(gpu_kind(pl.col("name"))))
    spec = {"start_ns": ("start", "time"), "duration_ns": ("duration", "time"), "registers_per_thread": ("regs", "int"),
            "static_smem_bytes": ("ssmem", "size"), "dynamic_smem_bytes": ("dsmem", "size"), "bytes": ("size", "size"),
            "context_id": ("context", "int"), "stream_id": ("stream", "int"), "correlation_col": ("correlation", "int")}
    for axis in "xyz":
        spec[f"grid_{axis}"] = (f"grid_{axis}", "int")
        spec[f"block_{axis}"] = (f"block_{axis}", "int")
    columns = c.numbers(**spec)
    # Int64 as parsed: the core's validation drops (and counts) a value past Int32 (issue 16)
    frame = frame.with_columns(**columns, device_id=device_ids(c.raw("device"), book))
    frame = frame.with_columns(*_dims(c, "grid"), *_dims(c, "block"))
    um_bytes = _unified_memory_bytes(c)
    is_memset = pl.col("kind") == "memset"
    return frame.select(
        "kind", "name", "start_ns", "duration_ns", pl.lit(1, dtype=pl.Int64).alias("calls"),
        pl.lit(table.pid, dtype=pl.Int64).alias("pid"),
        "device_id", "context_id", "stream_id",
        pl.coalesce("correlation_col", "name_corr").alias("correlation_id"),
        *[pl.coalesce(f"{d}_{a}", f"_{d}_{a}").alias(f"{d}_{a}") for d in ("grid", "block") for a in "xyz"],
        "registers_per_thread", "static_smem_bytes", "dynamic_smem_bytes",
        pl.coalesce("bytes", um_bytes).alias("bytes"),
        copy_kind(pl.col("name")).alias("copy_kind"),
        pl.when(~is_memset).then(memory_kind(pl.col("src_mem"))).alias("src_memory"),
        pl.when(is_memset).then(memory_kind(pl.col("src_mem"))).otherwise(memory_kind(pl.col("dst_mem")))
        .alias("dst_memory"),
        marker_group(pl.col("name"), pl.col("kind")).alias("group"),
    )


def _dims(c: Converter, key: str) -> list[pl.Series]:
    """``(64 32 1)`` cells as three Int32 columns ``_key_x/y/z``; an error for a cell of another shape."""
    cells = c.raw(key)
    groups = pl.DataFrame({"cell": cells}).select(
        pl.col("cell").str.extract_groups(r"^\(\s*([0-9]+)\s+([0-9]+)\s+([0-9]+)\s*\)$").alias("g"))["g"]
    parsed = groups.struct.field("1")
    bad = cells.is_not_null() & parsed.is_null()
    if bad.any():
        i = int(bad.arg_max())
        raise bad_input(c.path, int(c.frame["_line"][i]),
                        f"column {c._label(key)!r}: expected a size such as (64 32 1), found {cells[i]!r}")
    return [groups.struct.field(str(n + 1)).cast(pl.Int32, strict=False).alias(f"_{key}_{axis}")
            for n, axis in enumerate("xyz")]


def _unified_memory_bytes(c: Converter) -> pl.Series:
    """Bytes in the Unified Memory column of unified-memory migrations (other cells there are not sizes)."""
    cells = c.raw("unified_memory")
    parts = pl.DataFrame({"cell": cells}).select(*split_number(pl.col("cell")))
    return to_ints(parts[:, 0], parts[:, 1], SIZE_UNITS)


def counter_frame(path: Path, table: Table, book: DeviceBook) -> pl.DataFrame:
    """Counter rows of metric or event results, each with the kernel name it belongs to (``_kernel``)."""
    c = Converter(path, table)
    value, unit = c.value("avg")
    value_min, _ = c.value("min")
    value_max, _ = c.value("max")
    kernels = c.frame["_kernel"]
    if kernels.is_null().any():
        i = int(kernels.is_null().arg_max())
        raise bad_input(path, int(c.frame["_line"][i]), "a metric or event row before any 'Kernel:' line: "
                                                          "expected the kernel it was measured on")
    return pl.DataFrame({
        "kind": pl.Series(["counter"] * c.frame.height, dtype=pl.String),
        "name": c.raw("counter"),
        "calls": c.number("invocations", "int"),
        "value": value, "value_min": value_min, "value_max": value_max, "unit": unit,
        "group": pl.Series(["metric" if table.form == METRICS else "event"] * c.frame.height, dtype=pl.String),
        "pid": pl.Series([table.pid] * c.frame.height, dtype=pl.Int64),
        "device_id": device_ids(c.frame["_device"], book),
        "_kernel": kernels.str.strip_chars(),
    })


def unified_memory_frame(path: Path, table: Table, book: DeviceBook) -> pl.DataFrame:
    """Marker rows of the unified-memory summary: count, total bytes and total time per kind of migration."""
    c = Converter(path, table)
    return pl.DataFrame({
        "kind": pl.Series(["marker"] * c.frame.height, dtype=pl.String),
        "name": c.raw("name"),
        "calls": c.number("count", "int"),
        "bytes": c.number("total_size", "size"),
        "duration_ns": c.number("total_time", "time"),
        "group": pl.Series([UNIFIED_MEMORY_GROUP] * c.frame.height, dtype=pl.String),
        "pid": pl.Series([table.pid] * c.frame.height, dtype=pl.Int64),
        "device_id": device_ids(c.frame["_device"], book),
    })


BUILDERS = {SUMMARY: summary_frame, TRACE: trace_frame, METRICS: counter_frame, EVENTS: counter_frame,
            UNIFIED: unified_memory_frame}


def table_frame(path: Path, table: Table, book: DeviceBook) -> pl.DataFrame:
    """The event rows of one table."""
    return BUILDERS[table.form](path, table, book)
