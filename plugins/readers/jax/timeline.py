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
from msgspec.structs import astuple

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.units import NumberError
from traceparse.validate import fits_int64

from traceparse_plugins.readers.chrome_json import CHUNK_BYTES, Event, stream_events
from traceparse_plugins.readers.chrome_json.decoder import raw_times_ns
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
    program_id: Any = None
    name: Any = None


XlaEvent = Event[Args]
_ARG_FIELDS = Args.__struct_fields__
_NO_ARGS = astuple(Args())


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
        if not events:
            continue
        # transposed in C (astuple + zip), as the torch reader does; Python touches each event a few times
        ph, _, name, pid, tid, ts, dur, args = zip(*map(astuple, events))
        keep = []
        for i, p in enumerate(ph):
            if p == "X":
                keep.append(i)
            elif p == "M":
                e = events[i]
                label = _text(e.args.name) if e.args is not None else None
                if e.name == "process_name" and label is not None:
                    processes[e.pid] = label
                elif e.name == "thread_name" and label is not None:
                    threads[(e.pid, e.tid)] = label
            elif not (p is None and name[i] is None):  # both converters end the array with an empty object
                skipped[p or "(none)"] = skipped.get(p or "(none)", 0) + 1
        if not keep:
            continue
        kept_args = [astuple(args[i]) if args[i] is not None else _NO_ARGS for i in keep]
        columns = dict(zip(_ARG_FIELDS, zip(*kept_args)))
        frame = {"pid": pl.Series([_id(pid[i]) for i in keep], dtype=pl.Int64),
                 "tid": pl.Series([_id(tid[i]) for i in keep], dtype=pl.Int64),
                 "name": pl.Series([name[i] for i in keep], dtype=pl.String)}
        for field, key, raws in (("start_ns", "ts", ts), ("duration_ns", "dur", dur)):
            try:
                frame[field] = raw_times_ns([raws[i] for i in keep]).alias(field)
            except NumberError as exc:
                raise bad_input(path, f"traceEvents[{offset + keep[exc.index]}].{key}",
                                f"a time in microseconds, got {exc.text!r} ({exc.reason})") from None
            missing = frame[field].is_null().arg_true()
            if missing.len():
                raise bad_input(path, f"traceEvents[{offset + keep[missing[0]]}].{key}",
                                "a time in microseconds (a complete event has one)")
        for stat in STATS:
            values = columns[stat]
            frame[stat] = pl.Series([v if v is None or type(v) is str else _text(v) for v in values], dtype=pl.String)
        parts.append(pl.DataFrame(frame))
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
    return value if isinstance(value, int) and not isinstance(value, bool) and fits_int64(value) else None
