"""Kineto's ``[memory]`` instant events (``profile_memory=True``) as counter rows.

Each allocation or free the caching allocator reports is an instant event
(``"ph": "i"``, ``"name": "[memory]"``) whose arguments are ``Bytes`` (the
change: positive for an allocation, negative for a free), ``Total Allocated``
and ``Total Reserved`` (the allocator's totals on that device after the
change), ``Device Id``, ``Device Type`` and ``Addr``. Each event becomes up to three
``counter`` rows at its ``ts`` (one for each of these it gives: PyTorch 1.9 gave ``Bytes`` alone), every one with
``unit`` ``byte``:

=====================  ==================================
name                   value
=====================  ==================================
``allocated_bytes``    ``Total Allocated``
``reserved_bytes``     ``Total Reserved``
``allocation_bytes``   ``Bytes`` (negative for a free)
=====================  ==================================

``device_id`` is ``Device Id`` for a GPU (any ``Device Type`` but 0); host
memory (``Device Type`` 0, CPU, whose ``Device Id`` is -1) has a null device.
``pid``/``tid`` are the host thread that allocated; ``duration_ns`` is null.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceparse.units import NumberError

from traceparse_plugins.readers.chrome_json.decoder import EventError, times_ns
from traceparse_plugins.readers.torch_profiler.coerce import Coercions, int_column
from traceparse_plugins.readers.torch_profiler.kineto import KinetoEvent

MEMORY_EVENT = "[memory]"
#: counter name -> the Args field it comes from
COUNTERS = {"allocated_bytes": "mem_allocated", "reserved_bytes": "mem_reserved", "allocation_bytes": "mem_bytes"}
#: c10::DeviceType of host memory
CPU_DEVICE_TYPE = 0


def memory_frame(path: Path, events: list[KinetoEvent], offset: int, coerced: Coercions) -> pl.DataFrame | None:
    """The counter rows of the ``[memory]`` events in ``events`` (None when there are none)."""
    try:
        return memory_rows(events, coerced)
    except EventError as exc:
        raise exc.at(path, offset) from None


def memory_rows(events: list[KinetoEvent], coerced: Coercions) -> pl.DataFrame | None:
    """:func:`memory_frame` where the caller names the record: a bad time raises :class:`EventError`."""
    index = [i for i, e in enumerate(events) if e.name == MEMORY_EVENT and e.ph in ("i", "I") and e.args is not None]
    if not index:
        return None
    picked = [events[i] for i in index]
    try:
        ts = times_ns(pl.Series([bytes(e.ts) for e in picked], dtype=pl.Binary))
    except NumberError as exc:
        raise EventError(index[exc.index], ".ts", f"a time in microseconds, got {exc.text!r} ({exc.reason})") \
            from None

    def ints(field: str, key: str, dtype: pl.DataType = pl.Int64) -> pl.Series:
        return int_column([getattr(e.args, field) for e in picked], f"args.{key}", dtype, coerced)

    return counter_rows(pl.Series(index, dtype=pl.UInt32), ts, ints("mem_device_id", "Device Id", pl.Int32),
                        ints("mem_device_type", "Device Type", pl.Int32),
                        pl.Series([e.pid for e in picked], dtype=pl.Int64, strict=False),
                        pl.Series([e.tid for e in picked], dtype=pl.Int64, strict=False),
                        {field: ints(field, key) for field, key in KEYS.items()})


#: the Args field of each counter's value -> its JSON key
KEYS = {"mem_allocated": "Total Allocated", "mem_reserved": "Total Reserved", "mem_bytes": "Bytes"}


def counter_rows(event: pl.Series, ts: pl.Series, device: pl.Series, device_type: pl.Series, pid: pl.Series,
                 tid: pl.Series, values: dict[str, pl.Series]) -> pl.DataFrame:
    """The counter rows of ``[memory]`` events given as columns (one value per event; ``event`` its index in
    the chunk, kept as ``_event`` for :func:`with_counters`): a row for each counter the event gives, in
    :data:`COUNTERS` order; ``values`` by Args field (:data:`KEYS`). An old Kineto (PyTorch 1.9) gives ``Bytes``
    alone: one row, not three of which two are empty (12,838 events counted as 38,514)."""
    n = len(ts)
    base = pl.DataFrame({
        "_event": event,
        "start_ns": ts,
        "device_id": device,
        "_type": device_type,
        "pid": pid,
        "tid": tid,
    }).with_columns(device_id=pl.when(pl.col("_type") != CPU_DEVICE_TYPE).then(pl.col("device_id")))
    frames = [base.with_columns(name=pl.lit(name), value=values[field].cast(pl.Float64))
              for name, field in COUNTERS.items()]
    k = pl.int_range(0, 3 * n, eager=True)
    return (pl.concat(frames).drop("_type")[(k % 3) * n + k // 3]  # event by event, its counters in order
            .filter(pl.col("value").is_not_null())
            .with_columns(kind=pl.lit("counter"), unit=pl.lit("byte")))


def with_counters(rows: pl.DataFrame, counters: pl.DataFrame | None) -> pl.DataFrame:
    """A chunk's rows and its counter rows, each where its event is in the chunk (``_event``, then dropped):
    the table is in the file's order however the file was cut into chunks."""
    if counters is None:
        if "_event" not in rows.columns:
            return rows
        rows = rows.clone()  # a new frame of the same columns: dropping one in place runs no query
        rows.drop_in_place("_event")
        return rows
    both = pl.concat([rows, counters], how="diagonal_relaxed")
    return both.sort("_event", maintain_order=True).drop("_event") if rows.height else both.drop("_event")
