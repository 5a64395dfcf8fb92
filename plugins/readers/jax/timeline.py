"""The JSON timelines of a JAX profile: ``<host>.trace.json.gz`` (xprof's trace viewer) and ``perfetto_trace.json.gz``.

Both are Chrome Trace Event JSON converted from the XPlane by XLA's own code (JAX writes
``perfetto_trace.json.gz`` with ``jax.profiler.trace(..., create_perfetto_trace=True)``; xprof and
TensorBoard's profile plugin write ``*.trace.json.gz``): one process per plane, named by a ``process_name``
metadata event (``/device:GPU:0``, ``/host:CPU``), one thread per line, named by ``thread_name``
(``Stream #14(Compute,MemcpyD2D)``, ``python3``, and in the trace viewer's file xprof's derived lines
``XLA Modules``, ``XLA Ops``, ``Steps``, ``Launch Stats``); the events are complete (``X``) events whose
``args`` are the XPlane stats as text. They are decoded chunk by chunk by the shared Chrome-JSON decoder
(:mod:`traceparse_plugins.readers.chrome_json`; a file cut short keeps its complete events and warns) into
the intermediate table of :mod:`.events`; the names of processes and threads, written before the events
by both converters, are joined on at the end so their order does not matter.

What the JSON lacks beside the XPlane: the devices' properties (name, SMs, clock, memory bandwidth), and in
xprof 2.20.7's trace-viewer file the ``kernel_details`` stat (grid, block, registers, shared memory); its
theoretical occupancy is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions

from traceparse_plugins.readers.chrome_json import CHUNK_BYTES, Event, stream_events, time_ns
from traceparse_plugins.readers.jax.events import RAW_SCHEMA, STATS, empty_raw


class Args(msgspec.Struct, gc=False):
    """The ``args`` kept: the stats of :data:`.events.STATS` and a metadata event's ``name``."""

    correlation_id: Any = None
    hlo_op: Any = None
    hlo_module: Any = None
    kernel_details: Any = None
    memcpy_details: Any = None
    Memset_details: Any = None
    theoretical_occupancy_pct: Any = None
    cuda_graph_id: Any = None
    step_num: Any = None
    name: Any = None


XlaEvent = Event[Args]


class _Document(msgspec.Struct):
    traceEvents: list[XlaEvent] = []


def read_timeline(path: Path, options: ReadOptions) -> pl.DataFrame:
    """The intermediate table (:data:`.events.RAW_SCHEMA`) of a JSON timeline."""
    chunk = int(options.params.get("chunk_bytes", CHUNK_BYTES))
    parts: list[pl.DataFrame] = []
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    skipped: dict[str, int] = {}
    for offset, events in stream_events(path, options, XlaEvent, _Document, chunk_bytes=chunk,
                                        label="JAX trace (Chrome JSON)", array_form=True):
        rows: dict[str, list] = {c: [] for c in ("pid", "tid", "name", "start_ns", "duration_ns", *STATS)}
        for i, e in enumerate(events):
            if e.ph == "M":
                label = _text(e.args.name) if e.args is not None else None
                if e.name == "process_name" and label is not None:
                    processes[e.pid] = label
                elif e.name == "thread_name" and label is not None:
                    threads[(e.pid, e.tid)] = label
                continue
            if e.ph != "X":
                if e.ph is None and e.name is None:
                    continue  # both converters end the array with an empty object
                key = e.ph or "(none)"
                skipped[key] = skipped.get(key, 0) + 1
                continue
            index = offset + i
            rows["pid"].append(_id(e.pid))
            rows["tid"].append(_id(e.tid))
            rows["name"].append(e.name)
            rows["start_ns"].append(_ns(path, index, "ts", e.ts))
            rows["duration_ns"].append(_ns(path, index, "dur", e.dur))
            args = e.args
            for stat in STATS:
                rows[stat].append(None if args is None else _text(getattr(args, stat)))
        if rows["name"]:
            parts.append(pl.DataFrame(rows, schema={"pid": pl.Int64, "tid": pl.Int64, "name": pl.String,
                                                    "start_ns": pl.Int64, "duration_ns": pl.Int64,
                                                    **{s: pl.String for s in STATS}}))
    if skipped:
        options.warn(f"{path}: skipped events that are not complete (X) events: "
                     + ", ".join(f"{n} {ph}" for ph, n in sorted(skipped.items())))
    if not parts:
        return empty_raw()
    events = pl.concat(parts)
    plane = pl.DataFrame({"pid": [_id(p) for p in processes], "plane": list(processes.values())},
                         schema={"pid": pl.Int64, "plane": pl.String})
    line = pl.DataFrame({"pid": [_id(p) for p, _ in threads], "tid": [_id(t) for _, t in threads],
                         "line": list(threads.values())},
                        schema={"pid": pl.Int64, "tid": pl.Int64, "line": pl.String})
    events = (events.join(plane, on="pid", how="left", maintain_order="left")
              .join(line, on=["pid", "tid"], how="left", maintain_order="left"))
    return events.select(pl.col("plane").fill_null(""), pl.col("line").fill_null(""), line_id="tid", pid="pid",
                         **{c: c for c in RAW_SCHEMA if c not in ("plane", "line", "line_id", "pid")})


def _text(value: Any) -> str | None:
    """A stat's value as text (XLA writes them as text; a number written bare is read as its decimal)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return str(value)
    return None


def _id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63 else None


def _ns(path: Path, index: int, field: str, raw: msgspec.Raw) -> int | None:
    """A decimal-microseconds JSON number -> integer ns, exactly; a one-line error naming the event if not a time."""
    try:
        value = time_ns(raw)
    except ValueError as exc:
        raise bad_input(path, f"traceEvents[{index}].{field}",
                        f"a time in microseconds, got {bytes(raw).decode(errors='replace')[:40]!r} ({exc})") from None
    if value is None:
        raise bad_input(path, f"traceEvents[{index}].{field}", "a time in microseconds (a complete event has one)")
    return value
