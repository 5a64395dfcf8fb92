"""Exporter ``chrome``: a trace as Chrome Trace Event JSON, for Perfetto UI and chrome://tracing.

Layout of the timeline:

* one process per GPU (``pid`` = the device id, as Kineto does; moved to
  1000000000 + id if a host process has that pid), one track (``tid``) per
  CUDA stream: kernels, copies and memsets, and any other row that has a
  device but no host process;
* host rows (API calls, operators, markers, regions, sync) on their own
  ``pid`` / ``tid``; host rows that name no process go to the process
  "host (no pid)" (pid 2000000000), tid 0 when the thread is unknown;
* flow arrows (``ph`` ``s`` at the API call, ``f`` with ``bp`` ``e`` at the
  GPU activity, ``cat`` ``launch``) from each launch API call to the GPU work
  with the same ``correlation_id``;
* ``process_name`` / ``thread_name`` / ``process_sort_index`` metadata events;
* the critical path of every step (docs/critical_path.md: the chain of work that held it, across ranks on a
  run) on its own process "critical path" (``pid`` 3000000000, shown first): one track per trace (a run's
  rank) holding one slice (``cat`` ``critical_path``) per segment of its steps' paths, named as the segment
  is (the op, kernel or collective; ``rank R:`` before it where it ran on another rank; ``args``: ``kind``,
  ``rank`` and ``lane`` it ran on, ``step``, ``edge``, ``event_id``), and per step one flow (``s``, ``t``…, ``f``; ``cat`` ``critical_path``, one ``id`` per
  step) through its segments in time order, each point at the middle of its slice. Zero-length segments are
  left out; a trace without host events on a thread (GPU work alone) gets no such track. The chrome reader does not read these back (they carry no ``args.traceparse``).

Times: ``ts`` and ``dur`` are microseconds written as decimals with exactly
three digits after the point, made from the integer nanoseconds (no float
rounding). A timed row with no duration becomes an instant event (``ph`` ``i``).

A run's rows (each rank numbering its ``event_id`` from 0) are numbered rank after rank
(:func:`one_numbering`), so that the file reads back; launch flows join within a rank.

Round trip: every event's ``args.traceparse`` holds the normalized row (every
schema column except ``trace_id``; columns that are null in the whole batch are
left out), and the document's first key ``traceparse`` holds
``{"schema_version", "export_version", "trace": {...}}`` (the trace's format,
tags and devices). Rows that cannot sit on a timeline exactly, i.e. aggregated
rows (no ``start_ns``) and counters (a Chrome counter event's ``args`` must be
its series), are kept in the top-level array ``traceparseRows``; timed
counters are also drawn as ``ph`` ``C`` events for display. Non-finite floats
(JSON has no NaN) are listed in ``traceparseNonFinite`` as
``[event_id, column, "NaN" | "Infinity" | "-Infinity"]``. The ``chrome`` reader
reads all of this back into the same rows.

The file is written in batches of rows (one JSON event per line), never as
one Python list; ``.gz`` in the output name gzips it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import uuid
from pathlib import Path
from typing import IO, Iterator

import polars as pl

from traceparse import expr
from traceparse.exporter import Exporter
from traceparse.errors import ResourceError
from traceparse.plugins import hookimpl
from traceparse.schema import DTYPES, SCHEMA_VERSION
from traceparse.threads import thread_names
from traceparse.trace import Trace

#: Version of this export layout (the keys above); the reader checks it.
EXPORT_VERSION = 1
#: Top-level keys of the layout.
MARKER_KEY = "traceparse"
ROWS_KEY = "traceparseRows"
NON_FINITE_KEY = "traceparseNonFinite"
#: Rows per batch written at once.
BATCH_ROWS = 50_000
#: Kinds that run on a GPU stream.
GPU_KINDS = ("kernel", "memcpy", "memset")
#: Process for host rows with no pid, and the offset for device pids that clash with host pids.
NO_PID = 2_000_000_000
DEVICE_PID_OFFSET = 1_000_000_000
#: The process of the critical-path tracks, and the category of their slices and flows.
PATH_PID = 3_000_000_000
PATH_CAT = "critical_path"
#: Columns of the embedded row (all but trace_id).
ROW_COLUMNS = [c for c in DTYPES if c != "trace_id"]


class ChromeExporter(Exporter):
    name = "chrome"
    description = "Chrome Trace Event JSON (Perfetto UI, chrome://tracing), with the normalized rows embedded"
    suffixes = (".json", ".json.gz")

    def export(self, trace: Trace, out: Path) -> None:
        out = Path(out)
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
        try:
            if out.name.endswith(".gz"):
                f = gzip.open(tmp, "wt", encoding="utf-8", newline="\n", compresslevel=6)
            else:
                f = open(tmp, "w", encoding="utf-8", newline="\n")
            with f:
                write_chrome(trace, f)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)


def write_chrome(trace: Trace, f: IO[str]) -> dict[str, int]:
    """Write ``trace`` as Chrome Trace Event JSON to the text stream ``f``; return event counts by phase."""
    events = one_numbering(trace.events).sort("event_id")
    placed = _place(events)
    counts = {"X": 0, "i": 0, "C": 0, "s": 0, "f": 0, "M": 0, "rows": 0}
    header = {"schema_version": SCHEMA_VERSION, "export_version": EXPORT_VERSION, "trace": _trace_info(trace)}
    f.write("{" + json.dumps(MARKER_KEY) + ":" + json.dumps(header, default=str) + ",\n")
    f.write('"displayTimeUnit":"ns",\n"traceEvents":[\n')
    writer = _JsonArray(f)
    timeline = placed.filter(pl.col("start_ns").is_not_null() & (pl.col("kind") != "counter"))
    counters = placed.filter(pl.col("start_ns").is_not_null() & (pl.col("kind") == "counter")
                             & pl.col("value").is_not_null() & pl.col("value").is_finite())
    for line in _metadata_events(pl.concat([timeline, counters]), trace):
        writer.write(line)
        counts["M"] += 1
    non_finite: list[list] = []
    for batch in _batches(timeline):
        lines = _slice_events(batch, non_finite)
        writer.write_many(lines)
        for ph, n in batch.group_by(pl.when(pl.col("duration_ns").is_null()).then(pl.lit("i")).otherwise(pl.lit("X"))
                                    ).len().iter_rows():
            counts[ph] += n
    for batch in _batches(counters):
        writer.write_many(_counter_events(batch))
        counts["C"] += batch.height
    for batch in _batches(_flows(placed)):
        writer.write_many(_flow_events(batch))
        counts["s"] += int(batch["first"].sum())
        counts["f"] += batch.height
    path_lines, counts["path"] = critical_path_events(events, thread_names(trace.meta))
    writer.write_many(path_lines)
    f.write("\n],\n" + json.dumps(ROWS_KEY) + ":[\n")
    side = placed.filter(pl.col("start_ns").is_null() | (pl.col("kind") == "counter"))
    writer = _JsonArray(f)
    for batch in _batches(side):
        writer.write_many(_row_json(batch, non_finite))
        counts["rows"] += batch.height
    f.write("\n],\n" + json.dumps(NON_FINITE_KEY) + ":" + json.dumps(non_finite) + "\n}\n")
    return counts


class _JsonArray:
    """Writes array elements one per line, with the commas between them."""

    def __init__(self, f: IO[str]):
        self.f = f
        self.first = True

    def write(self, line: str) -> None:
        self.f.write(line if self.first else ",\n" + line)
        self.first = False

    def write_many(self, lines: list[str]) -> None:
        if lines:
            self.write(",\n".join(lines))


def _batches(df: pl.DataFrame) -> Iterator[pl.DataFrame]:
    for offset in range(0, df.height, BATCH_ROWS):
        yield df.slice(offset, BATCH_ROWS)


def one_numbering(events: pl.DataFrame) -> pl.DataFrame:
    """A run's rows (each rank's trace numbers its ``event_id``s from 0) numbered as one trace's: rank after rank
    (in rank order), each rank's ids moved past the last rank's, with the ids that point at rows (``parent_id``,
    ``data_from``) moved alike; so that every row of the file has its own id and the file reads back. One trace's
    rows are left as they are."""
    if events.height == 0 or events["trace_id"].n_unique() < 2:
        return events
    order = (events.group_by("trace_id").agg(rank=pl.col("rank").min(), size=pl.col("event_id").max() + 1)
             .sort("rank", "trace_id", nulls_last=True))
    offsets = order.with_columns(offset=pl.col("size").cum_sum() - pl.col("size")).select("trace_id", "offset")
    out = []
    for trace_id, offset in offsets.iter_rows():
        rows = events.filter(pl.col("trace_id") == trace_id)
        moved = pl.col("data_from").str.json_decode(pl.List(pl.Int64)).list.eval(pl.element() + offset)
        out.append(rows.with_columns(
            event_id=pl.col("event_id") + offset, parent_id=pl.col("parent_id") + offset,
            data_from=pl.when(pl.col("data_from").is_null()).then(None)
            .otherwise(pl.concat_str(pl.lit("["), moved.list.eval(pl.element().cast(pl.String)).list.join(","),
                                     pl.lit("]")))))
    return pl.concat(out)


def _trace_info(trace: Trace) -> dict:
    meta = trace.meta
    return {"id": meta.id, "format": meta.format, "variant": meta.variant, "tool": meta.tool,
            "tool_version": meta.tool_version, "tags": meta.tags, "source_paths": meta.source_paths,
            "devices": [dataclasses.asdict(d) for d in meta.devices]}


def _place(events: pl.DataFrame) -> pl.DataFrame:
    """Add ``_pid`` / ``_tid`` (where the row goes on the timeline) and ``_on_device``."""
    host_pids = set(events["pid"].drop_nulls().unique().to_list())
    devices = events["device_id"].drop_nulls().unique().to_list()
    clash = any(d in host_pids for d in devices)
    offset = DEVICE_PID_OFFSET if clash else 0
    on_device = (pl.col("kind").cast(pl.String).is_in(GPU_KINDS)
                 | (pl.col("pid").is_null() & pl.col("device_id").is_not_null()))
    no_device_pid = NO_PID + 1  # GPU work whose device is unknown
    return events.with_columns(_on_device=on_device).with_columns(
        _pid=pl.when(pl.col("_on_device"))
        .then(pl.when(pl.col("device_id").is_not_null()).then(pl.col("device_id").cast(pl.Int64) + offset)
              .otherwise(pl.lit(no_device_pid, dtype=pl.Int64)))
        .otherwise(pl.col("pid").fill_null(NO_PID)),
        _tid=pl.when(pl.col("_on_device")).then(pl.col("stream_id").fill_null(0))
        .otherwise(pl.col("tid").fill_null(0)),
    )


def _metadata_events(placed: pl.DataFrame, trace: Trace) -> list[str]:
    """process_name / process_sort_index / thread_name events for every process and track on the timeline."""
    names = {d.id: d.name for d in trace.meta.devices if d.id is not None}
    lines = []
    procs = placed.group_by("_pid").agg(dev=pl.col("_on_device").any(), device=pl.col("device_id").drop_nulls().first())
    for pid, dev, device in procs.sort("_pid").iter_rows():
        if dev and pid != NO_PID + 1:
            label = f"GPU {device}" + (f" ({names[device]})" if names.get(device) else "")
            sort = 1_000_000 + int(device)
        elif pid == NO_PID + 1:
            label, sort = "GPU (no device id)", 2_000_000
        elif pid == NO_PID:
            label, sort = "host (no pid)", 999_999
        else:
            label, sort = f"host process {pid}", int(pid) % 1_000_000
        lines.append(_meta_event("process_name", pid, 0, {"name": label}))
        lines.append(_meta_event("process_sort_index", pid, 0, {"sort_index": sort}))
    threads = placed.group_by("_pid", "_tid").agg(dev=pl.col("_on_device").any())
    for pid, tid, dev in threads.sort("_pid", "_tid").iter_rows():
        label = f"stream {tid}" if dev else (f"thread {tid}" if pid != NO_PID else "host rows (no pid / tid)")
        lines.append(_meta_event("thread_name", pid, tid, {"name": label}))
    return lines


def _meta_event(name: str, pid: int, tid: int, args: dict) -> str:
    return json.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}, separators=(",", ":"))


def _us(column: str) -> pl.Expr:
    """Integer ns -> decimal microseconds text with three decimals, exactly."""
    ns = pl.col(column)
    magnitude = ns.abs()
    return pl.concat_str([
        pl.when(ns < 0).then(pl.lit("-")).otherwise(pl.lit("")),
        (magnitude // 1000).cast(pl.String), pl.lit("."),
        (magnitude % 1000).cast(pl.String).str.zfill(3),
    ])


def _row_json(batch: pl.DataFrame, non_finite: list[list]) -> list[str]:
    """Each row of ``batch`` as a JSON object of its schema columns (all-null columns left out)."""
    keep = [c for c in ROW_COLUMNS if batch[c].null_count() < batch.height or c == "event_id"]
    for c in keep:
        if batch[c].dtype == pl.Float64:
            bad = batch.filter(pl.col(c).is_not_null() & ~pl.col(c).is_finite())
            for event_id, value in bad.select("event_id", c).iter_rows():
                non_finite.append([event_id, c, "NaN" if math.isnan(value) else ("Infinity" if value > 0
                                                                                   else "-Infinity")])
    cols = [pl.col(c).cast(pl.String) if isinstance(batch[c].dtype, pl.Enum) else pl.col(c) for c in keep]
    return batch.select(pl.struct(cols).struct.json_encode()).to_series().to_list()


def _slice_events(batch: pl.DataFrame, non_finite: list[list]) -> list[str]:
    """The X / i events of a batch of timed rows, each with its row in ``args.traceparse``."""
    rows = _row_json(batch, non_finite)
    instant = pl.col("duration_ns").is_null()
    heads = batch.select(
        pl.struct(
            ph=pl.when(instant).then(pl.lit("i")).otherwise(pl.lit("X")),
            cat=pl.col("kind").cast(pl.String),
            name=pl.coalesce(pl.col("name"), pl.col("kind").cast(pl.String)),
            pid=pl.col("_pid"), tid=pl.col("_tid"),
        ).struct.json_encode().str.strip_suffix("}").alias("head"),
        _us("start_ns").alias("ts"),
        pl.when(instant).then(pl.lit(',"s":"t"')).otherwise(pl.concat_str([pl.lit(',"dur":'), _us("duration_ns")]))
        .alias("dur"),
    )
    return [f'{h},"ts":{ts}{d},"args":{{"traceparse":{r}}}}}'
            for h, ts, d, r in zip(heads["head"], heads["ts"], heads["dur"], rows)]


def _counter_events(batch: pl.DataFrame) -> list[str]:
    """Display-only ``C`` events for timed counters (their rows are in the side array)."""
    out = batch.select(
        pl.struct(ph=pl.lit("C"), cat=pl.lit("counter"), name=pl.coalesce(pl.col("name"), pl.lit("counter")),
                  pid=pl.col("_pid"), tid=pl.col("_tid")).struct.json_encode().str.strip_suffix("}").alias("head"),
        _us("start_ns").alias("ts"),
        pl.struct(value=pl.col("value")).struct.json_encode().alias("args"),
    )
    return [f'{h},"ts":{ts},"args":{a}}}' for h, ts, a in zip(out["head"], out["ts"], out["args"])]


def _flows(placed: pl.DataFrame) -> pl.DataFrame:
    """Pairs (launch API call, GPU activity) joined on correlation_id."""
    api = (placed.filter((pl.col("kind") == "api") & pl.col("correlation_id").is_not_null()
                         & pl.col("start_ns").is_not_null())
           .sort("event_id").unique(subset=["trace_id", "correlation_id"], keep="first", maintain_order=True)
           .select("trace_id", "correlation_id", pl.col("_pid").alias("api_pid"), pl.col("_tid").alias("api_tid"),
                   pl.col("start_ns").alias("api_start")))
    gpu = placed.filter(pl.col("kind").cast(pl.String).is_in(GPU_KINDS) & pl.col("correlation_id").is_not_null()
                        & pl.col("start_ns").is_not_null())
    pairs = gpu.join(api, on=["trace_id", "correlation_id"], how="inner").sort("event_id")
    # a run's ranks reuse correlation ids: there each (rank, correlation) pair is its own flow
    flow = (pl.col("correlation_id") if placed["trace_id"].n_unique() < 2
            else pl.struct("trace_id", "correlation_id").rank("dense").cast(pl.Int64))
    return (pairs.with_columns(correlation_id=flow)
            .select("event_id", "correlation_id", "api_pid", "api_tid", "api_start", "_pid", "_tid", "start_ns",
                    first=pl.col("correlation_id").is_first_distinct()))


def _flow_events(batch: pl.DataFrame) -> list[str]:
    """A ``s`` event at the API call (once per correlation id) and a ``f`` (binding to the enclosing slice) at
    each GPU activity it launched."""
    out = batch.select(
        pl.concat_str([pl.lit('{"ph":"s","cat":"launch","name":"launch","id":'), pl.col("correlation_id").cast(pl.String),
                       pl.lit(',"pid":'), pl.col("api_pid").cast(pl.String), pl.lit(',"tid":'),
                       pl.col("api_tid").cast(pl.String), pl.lit(',"ts":'), _us("api_start"), pl.lit("}")]).alias("s"),
        pl.concat_str([pl.lit('{"ph":"f","bp":"e","cat":"launch","name":"launch","id":'),
                       pl.col("correlation_id").cast(pl.String), pl.lit(',"pid":'), pl.col("_pid").cast(pl.String),
                       pl.lit(',"tid":'), pl.col("_tid").cast(pl.String), pl.lit(',"ts":'), _us("start_ns"),
                       pl.lit("}")]).alias("f"),
    )
    lines = []
    for s, f, first in zip(out["s"], out["f"], batch["first"]):
        if first:
            lines.append(s)
        lines.append(f)
    return lines


def _us_int(ns: int) -> str:
    """Integer ns as decimal microseconds with three decimals, exactly (the text :func:`_us` writes)."""
    sign = "-" if ns < 0 else ""
    return f"{sign}{abs(ns) // 1000}.{abs(ns) % 1000:03d}"


def critical_path_events(events: pl.DataFrame, names: dict | None = None) -> tuple[list[str], int]:
    """The critical-path process of the export (module docstring): its metadata, one slice per segment of every
    step's path and one flow per step through them; and the number of slices. None without host events on a
    thread (the GPU streams' order alone is no path worth a track)."""
    from traceparse.measures.step_paths import step_paths

    try:
        paths, segments, on_threads = step_paths(events)
    except ResourceError as exc:  # the rest of the export stands; the track's name says why it is empty
        return [_meta_event("process_name", PATH_PID, 0, {"name": f"critical path: not computed, {exc}"}),
                _meta_event("process_sort_index", PATH_PID, 0, {"sort_index": -1})], 0
    segments = segments.filter(pl.col("duration_ns") > 0)
    if segments.height == 0 or not on_threads:  # GPU work alone: no path worth a track
        return [], 0
    owners = paths.select("trace_id", "rank").unique().sort("rank", "trace_id", nulls_last=True).rows()
    tids = {trace: i for i, (trace, _) in enumerate(owners)}
    lines = [_meta_event("process_name", PATH_PID, 0, {"name": "critical path"}),
             _meta_event("process_sort_index", PATH_PID, 0, {"sort_index": -1})]
    for trace, rank in owners:
        label = f"rank {rank}: each step's critical path" if rank is not None else "each step's critical path"
        lines.append(_meta_event("thread_name", PATH_PID, tids[trace], {"name": label}))
    rows = (segments.with_columns(lane=expr.lane_label(names, otherwise=None))
            .sort("trace_id", "step", "start_ns", nulls_last=False))
    flow = 0
    for (trace, step), path in rows.group_by("trace_id", "step", maintain_order=True):
        tid = tids[trace]
        points = []
        for r in path.iter_rows(named=True):
            args = {"kind": r["segment"], "rank": r["segment_rank"], "lane": r["lane"], "step": r["step"],
                    "edge": r["edge"], "event_id": r["event_id"]}
            name = r["name"] or r["segment"]
            if r["segment_rank"] is not None and r["segment_rank"] != r["rank"]:
                name = f"rank {r['segment_rank']}: {name}"  # the path crossed to another rank
            lines.append(json.dumps({"ph": "X", "cat": PATH_CAT, "name": name, "pid": PATH_PID,
                                     "tid": tid, "ts": 0, "dur": 0, "args": args}, separators=(",", ":"))
                         .replace('"ts":0,"dur":0', f'"ts":{_us_int(r["start_ns"])},"dur":{_us_int(r["duration_ns"])}',
                                  1))
            points.append(r["start_ns"] + r["duration_ns"] // 2)
        if len(points) < 2:
            continue
        flow += 1
        for i, at in enumerate(points):
            ph = "s" if i == 0 else ("f" if i == len(points) - 1 else "t")
            bind = ',"bp":"e"' if ph == "f" else ""
            lines.append(f'{{"ph":"{ph}"{bind},"cat":"{PATH_CAT}","name":"critical path","id":{flow},'
                         f'"pid":{PATH_PID},"tid":{tid},"ts":{_us_int(at)}}}')
    return lines, int(rows.height)


@hookimpl
def traceparse_exporters():
    return [ChromeExporter()]
