"""From the parsed ncu tables to traceparse events: a kernel row per launch, a counter row per metric.

Values: thousands separators removed, then brought to base units
(:mod:`.units`) only through :mod:`traceparse.units`: a float value is the
exact product of the decimal and its unit's factor, rounded once (factor-1
units: the nearest double of the decimal), and a kernel's duration is an
exact integer of ns, rounded half to even, so ``167.52 usecond`` is exactly
167520 ns.
``n/a``, ``no data`` and empty values are not metrics (no row), nor are the values ncu marks ``(!)``
(``(!) nan``: not collected, a launch that failed), with a warning. A semicolon list is an
instanced metric (``--print-metric-instances``): skipped, with a warning.
A value that is not a number is an error when its metric has a unit; a
unit-less text value (``CachePreferNone``, a device name) is an attribute,
not a measurement, and is not made a counter.

``device__attribute_*`` metrics describe the GPU, not the launch: they fill
the trace's device list (name, SMs, memory, clocks, compute capability) and
``Device.extra``, and are not repeated as counters on every kernel.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from traceparse import units as registry
from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.trace import Device

from .parsed import Parsed
from .units import TIME_SPELLINGS, conversion

# [0-9], not \d: polars' \d is Unicode (Arabic-Indic digits passed, then failed the cast: issue 16)
NUMBER = r"^[+-]?([0-9]{1,3}(,[0-9]{3})+|[0-9]+)(\.[0-9]+)?([eE][+-]?[0-9]+)?$|^[+-]?\.[0-9]+([eE][+-]?[0-9]+)?$"
DEVICE_PREFIX = "device__attribute_"
#: What ncu writes where a metric has no value for a launch (ncu 2025.3 writes ``no data`` in its raw CSV page).
NOT_MEASURED = ["", "n/a", "N/A", "no data"]
#: Kernel-table columns and the metrics that fill them, raw-page name first, details-page label second.
DURATION = ("gpu__time_duration.sum", "Duration")
REGISTERS = ("launch__registers_per_thread", "Registers Per Thread")
STATIC_SMEM = ("launch__shared_mem_per_block_static", "Static Shared Memory Per Block")
DYNAMIC_SMEM = ("launch__shared_mem_per_block_dynamic", "Dynamic Shared Memory Per Block")
GRID = ("launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z")
BLOCK = ("launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z")
SECTION_OF_DURATION = ("GPU Speed Of Light Throughput", "GPU Speed Of Light", "SpeedOfLight")
_TRIPLE = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")


def to_events(path: Path, parsed: Parsed, options: ReadOptions) -> tuple[pl.DataFrame, list[Device], dict]:
    """The event table, the devices and a summary of one parsed ncu output."""
    metrics = parsed.metrics
    device_rows = metrics.filter(pl.col("name").str.starts_with(DEVICE_PREFIX))
    metrics = metrics.filter(~pl.col("name").str.starts_with(DEVICE_PREFIX))
    values = _values(path, metrics, options).sort("line", maintain_order=True)
    kernels = _kernels(path, parsed.kernels, values)
    n_kernels = kernels.height
    event_of = kernels.select("key", parent_id=pl.int_range(0, n_kernels, dtype=pl.Int64))
    counters = (values.join(event_of, on="key", how="left", maintain_order="left")
                .select(kind=pl.lit("counter"), name="name", value="value", value_min="value_min",
                        value_max="value_max", unit="base", group="group", parent_id="parent_id",
                        calls=pl.lit(1, dtype=pl.Int64)))
    rules = _rules(path, parsed.rules).join(event_of, on="key", how="left", maintain_order="left")
    rule_rows = rules.select(kind=pl.lit("counter"), name=pl.lit("rule:") + pl.col("name"), value="value",
                             unit=pl.lit("%"), group=pl.lit("rule"), parent_id="parent_id",
                             calls=pl.lit(1, dtype=pl.Int64))
    # a --print-summary row stands for its invocations: their count, their total time (the mean's, times them)
    kernel_rows = kernels.drop("key", "line", "invocations").with_columns(
        kind=pl.lit("kernel"), calls=kernels["invocations"],
        duration_ns=(pl.col("duration_ns") * kernels["invocations"]).cast(pl.Int64))
    counters = counters.with_columns(calls=pl.col("parent_id").replace_strict(
        pl.int_range(0, n_kernels, eager=True), kernels["invocations"], return_dtype=pl.Int64))
    events = pl.concat([kernel_rows, counters, rule_rows], how="diagonal_relaxed")
    events = events.with_columns(event_id=pl.int_range(0, events.height, dtype=pl.Int64))
    devices = _devices(path, parsed, device_rows, kernels)
    summary = {"kernels": n_kernels, "metric_values": counters.height, "rule_results": rule_rows.height,
               "metric_names": values["name"].n_unique(), "form": parsed.form}
    extra = {"ncu_rules": _rule_summary(rules), "ncu_rule_results": _rule_results(rules)} if rules.height else {}
    return events, devices, {"summary": summary, "extra": extra}


def _values(path: Path, metrics: pl.DataFrame, options: ReadOptions) -> pl.DataFrame:
    """Metric rows with ``value`` (float, base units) and ``base`` (the base unit); drops non-measurements."""
    clean = pl.col("raw").str.strip_chars()
    frame = metrics.with_columns(clean=clean, unit=pl.col("unit").fill_null("").str.strip_chars())
    failed = frame.filter(pl.col("clean").str.starts_with("(!)"))
    if failed.height:  # ncu's own mark of a value it could not collect (a launch that failed): no measurement
        options.warn(f"{path}: {failed.height} metric values marked '(!)' by ncu (not collected, e.g. "
                     f"{failed['clean'][0]!r} for {failed['name'][0]!r}) were left out")
        frame = frame.filter(~pl.col("clean").str.starts_with("(!)"))
    frame = frame.filter(~pl.col("clean").is_in(NOT_MEASURED) & pl.col("clean").is_not_null())
    instanced = frame.filter(pl.col("clean").str.contains(";"))
    if instanced.height:
        options.warn(f"{path}: {instanced.height} instanced metric values (lists separated by ';', one value per "
                     "instance) were skipped: they are not one number")
        frame = frame.filter(~pl.col("clean").str.contains(";"))
    frame = frame.with_columns(numeric=pl.col("clean").str.contains(NUMBER))
    bad = frame.filter(~pl.col("numeric") & (pl.col("unit") != ""))
    if bad.height:
        row = bad.row(0, named=True)
        where = row["line"] if row["line"] is not None else f"result {row['key']}"
        raise bad_input(path, where, f"metric {row['name']!r} ({row['unit']}): value {row['raw']!r} is not a number")
    frame = frame.filter(pl.col("numeric")).with_columns(number=pl.col("clean").str.replace_all(",", ""))
    units = frame["unit"].unique().to_list()
    table = {u: conversion(u) for u in units}
    unknown = sorted(u for u, c in table.items() if not c.known)
    if unknown:
        options.warn(f"{path}: units not recognised, values kept as written: {', '.join(unknown)}")
    unit_frame = pl.DataFrame({"unit": units, "base": [table[u].base for u in units],
                               "scaled": [table[u].factor != 1 for u in units]},
                              schema={"unit": pl.String, "base": pl.String, "scaled": pl.Boolean})
    frame = frame.join(unit_frame, on="unit", how="left", maintain_order="left")
    scaled = frame.filter(pl.col("scaled")).select("number", "unit").unique()
    exact = {}
    for n, u in scaled.iter_rows():
        try:
            exact[(n, u)] = registry.to_float(n, scale=table[u].factor)
        except ValueError:
            row = frame.filter((pl.col("number") == n) & (pl.col("unit") == u)).row(0, named=True)
            where = row["line"] if row["line"] is not None else f"result {row['key']}"
            raise bad_input(path, where, f"metric {row['name']!r} ({u}): value {row['raw']!r} is out of range"
                            ) from None
    scaled_values = pl.DataFrame({"number": [k[0] for k in exact], "unit": [k[1] for k in exact],
                                  "scaled_value": list(exact.values())},
                                 schema={"number": pl.String, "unit": pl.String, "scaled_value": pl.Float64})
    frame = (frame.join(scaled_values, on=["number", "unit"], how="left", maintain_order="left")
             .with_columns(value=pl.when(pl.col("scaled")).then(pl.col("scaled_value"))
                           .otherwise(pl.col("number").cast(pl.Float64))))
    frame = _bounds(frame, {u: c.factor for u, c in table.items()})
    return frame.select("key", "line", "group", "name", "unit", "base", "value", "number",
                        "value_min", "value_max", "number_min", "number_max")


def _bounds(frame: pl.DataFrame, factors: dict) -> pl.DataFrame:
    """``value_min`` / ``value_max`` (and their numbers as written) from the Minimum and Maximum columns of
    ``--print-summary per-kernel`` text, in the base unit as ``value``; null for the forms without them."""
    out = {}
    if "raw_min" not in frame.columns or frame["raw_min"].null_count() == frame.height:
        return frame.with_columns(number_min=pl.lit(None, dtype=pl.String), number_max=pl.lit(None, dtype=pl.String),
                                  value_min=pl.lit(None, dtype=pl.Float64), value_max=pl.lit(None, dtype=pl.Float64))
    for bound in ("min", "max"):
        raw = frame[f"raw_{bound}"]
        numbers, values = [], []
        for text, unit in zip(raw.to_list(), frame["unit"].to_list()):
            clean = text.strip().replace(",", "") if text is not None and re.match(NUMBER, text.strip()) else None
            numbers.append(clean)
            if clean is None:
                values.append(None)
                continue
            try:
                values.append(registry.to_float(clean, scale=factors[unit]) if factors[unit] != 1 else float(clean))
            except ValueError:
                values.append(None)
        out[f"number_{bound}"] = pl.Series(numbers, dtype=pl.String)
        out[f"value_{bound}"] = pl.Series(values, dtype=pl.Float64)
    return frame.with_columns(**out)


def _kernels(path: Path, kernels: pl.DataFrame, values: pl.DataFrame) -> pl.DataFrame:
    """One row per kernel with the schema's launch columns filled from identity columns and metrics."""
    def metric(names: tuple[str, ...], alias: str, sections: tuple[str, ...] | None = None) -> pl.DataFrame:
        cond = pl.col("name").is_in(list(names))
        if sections is not None:  # a details-page label is only that metric in its own section
            cond = (pl.col("name") == names[0]) | ((pl.col("name").is_in(list(names[1:])))
                                                    & pl.col("group").is_in(list(sections)))
        picked = values.filter(cond).with_columns(rank=pl.col("name").replace_strict(
            {n: i for i, n in enumerate(names)}, default=len(names), return_dtype=pl.Int64))
        return (picked.sort(["key", "rank"]).group_by("key", maintain_order=True).first()
                .select("key", pl.col("value").alias(alias), pl.col("number").alias(alias + "_number"),
                        pl.col("unit").alias(alias + "_unit"), pl.col("number_min").alias(alias + "_number_min"),
                        pl.col("number_max").alias(alias + "_number_max")))

    out = kernels
    for names, alias, sections in ((DURATION, "duration", SECTION_OF_DURATION), (REGISTERS, "registers", None),
                                   (STATIC_SMEM, "static_smem", None), (DYNAMIC_SMEM, "dynamic_smem", None)):
        out = out.join(metric(names, alias, sections), on="key", how="left", maintain_order="left")
    for names in (GRID, BLOCK):
        for name in names:
            out = out.join(metric((name,), name), on="key", how="left", maintain_order="left")
    exact_ns, min_ns, max_ns = ([_duration_ns(n, u) for n, u in zip(out[c].to_list(), out["duration_unit"].to_list())]
                                for c in ("duration_number", "duration_number_min", "duration_number_max"))
    grid = [_triple(v) for v in out["grid"].to_list()]
    block = [_triple(v) for v in out["block"].to_list()]
    cols = {
        "name": out["name"],
        "duration_ns": pl.Series(exact_ns, dtype=pl.Int64),
        "min_ns": pl.Series(min_ns, dtype=pl.Int64),
        "max_ns": pl.Series(max_ns, dtype=pl.Int64),
        "registers_per_thread": out["registers"].cast(pl.Int32, strict=False),
        "static_smem_bytes": out["static_smem"].cast(pl.Int64, strict=False),
        "dynamic_smem_bytes": out["dynamic_smem"].cast(pl.Int64, strict=False),
        "device_id": _int(out["device"], pl.Int32),
        "context_id": _int(out["context"], pl.Int32),
        "stream_id": _int(out["stream"], pl.Int64),
        "pid": _int(out["pid"], pl.Int64),
        "invocations": _int(out["invocations"], pl.Int64).fill_null(1),
    }
    for axis, i in (("x", 0), ("y", 1), ("z", 2)):
        cols[f"grid_{axis}"] = pl.Series([g[i] if g else None for g in grid], dtype=pl.Int32)
        cols[f"block_{axis}"] = pl.Series([b[i] if b else None for b in block], dtype=pl.Int32)
        cols[f"grid_{axis}"] = cols[f"grid_{axis}"].fill_null(out[GRID[i]].cast(pl.Int32, strict=False))
        cols[f"block_{axis}"] = cols[f"block_{axis}"].fill_null(out[BLOCK[i]].cast(pl.Int32, strict=False))
    return pl.DataFrame(cols).with_columns(key=out["key"], line=out["line"])


def _duration_ns(number: str | None, unit: str | None) -> int | None:
    """A duration as integer ns (:func:`traceparse.units.to_int`, half to even); None if absent.

    A duration in a unit that is not a time is kept as written, rounded.
    """
    if number is None:
        return None
    try:
        if unit in TIME_SPELLINGS:
            return registry.to_int(number, unit, to="ns", spellings=TIME_SPELLINGS)
        return registry.to_int(number, "ns")
    except ValueError:
        return None


def _triple(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    m = _TRIPLE.match(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _int(series: pl.Series, dtype) -> pl.Series:
    return series.str.strip_chars().str.replace_all(",", "").cast(dtype, strict=False)


def _rules(path: Path, rules: pl.DataFrame) -> pl.DataFrame:
    """Rule results with their estimated speedup as a number (null when the rule gives none)."""
    speed = pl.col("speedup").fill_null("").str.strip_chars().str.replace_all(",", "")
    out = rules.with_columns(speed=speed)
    bad = out.filter((pl.col("speed") != "") & ~pl.col("speed").str.contains(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"))
    if bad.height:
        row = bad.row(0, named=True)
        raise bad_input(path, row["line"], f"rule {row['name']!r}: estimated speedup {row['speedup']!r} is not a number")
    return out.with_columns(value=pl.when(pl.col("speed") == "").then(None).otherwise(pl.col("speed"))
                            .cast(pl.Float64))


#: Most rule results kept with their text in the trace metadata (the rule rows themselves are all kept).
MAX_RULE_RESULTS = 2000


def _rule_results(rules: pl.DataFrame) -> list[dict]:
    """Each rule result as ncu wrote it, for the findings to quote: launch (the kernel row's event_id), rule,
    type (OPT, INF, WRN, ...), speed-up % and its kind, text; the first :data:`MAX_RULE_RESULTS`."""
    return [{"launch": r["parent_id"], "rule": r["name"], "type": r["type"], "speedup_pct": r["value"],
             "speedup_type": (r["speedup_type"] or "").lower() or None, "text": r["description"]}
            for r in rules.head(MAX_RULE_RESULTS).iter_rows(named=True)]


def _rule_summary(rules: pl.DataFrame) -> dict:
    """Per rule name: how often it fired, by type, the speedup kind and one description (bounded size)."""
    summary = {}
    grouped = rules.group_by("name", maintain_order=True).agg(
        results=pl.len(), types=pl.col("type").value_counts(), speedup_types=pl.col("speedup_type").unique(),
        max_speedup_pct=pl.col("value").max(), example=pl.col("description").first(), section=pl.col("group").first())
    for row in grouped.iter_rows(named=True):
        summary[row["name"]] = {
            "section": row["section"], "results": row["results"],
            "types": {t["type"]: t["count"] for t in sorted(row["types"], key=lambda t: t["type"] or "") if t["type"]},
            "speedup_types": sorted(s for s in row["speedup_types"] if s),
            "max_speedup_pct": row["max_speedup_pct"], "example": row["example"],
        }
    return summary


def _devices(path: Path, parsed: Parsed, device_rows: pl.DataFrame, kernels: pl.DataFrame) -> list[Device]:
    """Devices from ``device__attribute_*`` metrics, else from the Device/CC columns."""
    devices: dict[int | None, Device] = {}
    if device_rows.height:
        first_key_per_device = kernels.select("key", "device_id").unique(subset="device_id", keep="first",
                                                                          maintain_order=True)
        for key, device_id in first_key_per_device.iter_rows():
            attrs = {r["name"][len(DEVICE_PREFIX):]: (r["raw"] or "").strip()
                     for r in device_rows.filter(pl.col("key") == key).iter_rows(named=True)}
            devices[device_id] = _device_from_attributes(device_id, attrs)
    for row in parsed.kernels.iter_rows(named=True):
        device_id = _to_int(row.get("device"))
        if device_id not in devices:
            devices[device_id] = Device(id=device_id, compute_capability=(row.get("cc") or None))
        elif devices[device_id].compute_capability is None and row.get("cc"):
            devices[device_id].compute_capability = row["cc"]
    sms = parsed.metrics.filter(pl.col("name") == "# SMs")
    if sms.height:
        sm_count = _to_int(sms["raw"][0])
        for device in devices.values():
            device.sm_count = device.sm_count or sm_count
    return [d for _, d in sorted(devices.items(), key=lambda item: (item[0] is None, item[0] or 0))]


def _device_from_attributes(device_id: int | None, attrs: dict[str, str]) -> Device:
    major, minor = attrs.get("compute_capability_major"), attrs.get("compute_capability_minor")
    clock_khz = _to_int(attrs.get("max_gpu_frequency_khz") or attrs.get("clock_rate"))
    mem_khz = _to_int(attrs.get("max_mem_frequency_khz") or attrs.get("memory_clock_rate"))
    extra = {}
    for name, raw in attrs.items():
        number = _to_number(raw)
        extra[name] = number if number is not None else raw
    return Device(
        id=device_id if device_id is not None else _to_int(attrs.get("device_index")),
        name=attrs.get("display_name") or None,
        sm_count=_to_int(attrs.get("multiprocessor_count")),
        memory_bytes=_to_int(attrs.get("total_memory")),
        compute_capability=f"{major}.{minor}" if major and minor else None,
        core_clock_mhz=clock_khz / 1000 if clock_khz else None,
        memory_clock_mhz=mem_khz / 1000 if mem_khz else None,
        extra=extra,
    )


def _to_number(text: str | None) -> int | float | None:
    if text is None or not re.match(NUMBER, text.strip()):
        return None
    clean = text.strip().replace(",", "")
    value = registry.parse(clean)
    return int(value) if value == value.to_integral_value() and "e" not in clean.lower() else float(value)


def _to_int(text) -> int | None:
    number = _to_number(str(text)) if text is not None else None
    return int(number) if number is not None else None
