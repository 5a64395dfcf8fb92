"""rocprof v1's ``results.json`` events to rows of the normalized event table (the package docstring says what
each track holds). Decoded chunk by chunk by the shared Chrome-JSON decoder (a file cut short keeps its complete
events and warns); the tracks are named by metadata events written before the events, and rows wait for their
track's name only until the end of the file, so their order does not matter."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.figures import fmt_count
from traceparse.reader import ReadOptions
from traceparse.trace import Trace, TraceMeta
from traceparse.validate import ascii_id

from traceparse_plugins.readers.chrome_json import CHUNK_BYTES, Event, stream_events


class Args(msgspec.Struct, gc=False):
    """The ``args`` rocprof writes (every value as text; a track label's ``name``)."""

    name: Any = None
    Name: Any = None
    KernelName: Any = None
    BeginNs: Any = None
    EndNs: Any = None
    pid: Any = None
    tid: Any = None
    proc_id: Any = msgspec.field(default=None, name="proc-id")
    dev_id: Any = msgspec.field(default=None, name="dev-id")
    gpu_id: Any = msgspec.field(default=None, name="gpu-id")
    stream_id: Any = msgspec.field(default=None, name="stream-id")
    queue_id: Any = msgspec.field(default=None, name="queue-id")
    grd: Any = None
    wgr: Any = None
    vgpr: Any = None


class RocEvent(Event[Args], gc=False):
    """A rocprof event: a flow event's ``id`` besides what every Chrome event has."""

    id: Any = None


class _Document(msgspec.Struct):
    traceEvents: list[RocEvent] = []


#: A track label: the kind of its rows (the index ROCm 3.0–3.3 wrote before the label dropped).
_LABEL = re.compile(r"^(?:\d+ )?(CPU HIP API|CPU HSA API|CPU KFD API|COPY|GPU(\d+)|Markers and Ranges)$")
#: rocprof's own mark of a dispatch packet on the HSA track: no call of the program.
DISPATCH_MARK = "hsa_dispatch"
#: The name rocprof gives a queue's barrier packet among the dispatches (ROCm before 6.2).
BARRIER = "<barrier packet>"
#: A copy's direction, from its name.
_DIRECTIONS = {"CopyHostToDevice": "HtoD", "CopyDeviceToHost": "DtoH", "CopyDeviceToDevice": "DtoD",
               "CopyHostToHost": "HtoH"}
#: The rows' columns and types, as they are built.
#: (Int64 throughout: a value past a narrower column is the core's validation to drop, with its warning)
_SCHEMA = {"kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "duration_ns": pl.Int64, "pid": pl.Int64,
           "tid": pl.Int64, "device_id": pl.Int64, "stream_id": pl.Int64, "copy_kind": pl.String, "group": pl.String,
           "grid_x": pl.Int64, "block_x": pl.Int64, "registers_per_thread": pl.Int64, "_track": pl.Int64,
           "_lane": pl.Int64, "_ts": pl.Int64, "_dur": pl.Int64, "_at": pl.Int64}
#: A flow event's end: its id, track, lane and time in microseconds (as the events' own ``ts``).
_FLOW = {"_id": pl.Int64, "_track": pl.Int64, "_lane": pl.Int64, "_ts": pl.Int64}


def read_results(path: Path, options: ReadOptions) -> Trace:
    """The rows of a rocprof v1 ``results.json``, in file order."""
    rows: dict[str, list] = {c: [] for c in _SCHEMA}
    tracks: dict[int, str] = {}
    skipped: dict[str, int] = {}
    flows: dict[str, dict[str, list]] = {ph: {c: [] for c in _FLOW} for ph in ("s", "t")}
    chunk = int(options.params.get("chunk_bytes", CHUNK_BYTES))
    for offset, events in stream_events(path, options, RocEvent, _Document, chunk_bytes=chunk,
                                        label="rocprof trace (results.json)", array_form=False):
        for i, e in enumerate(events):
            ph = e.ph
            if ph == "X":
                _add(rows, path, offset + i, e)
            elif ph == "M":
                label = e.args.name if e.args is not None else None
                track = ascii_id(e.pid)
                if e.name == "process_name" and isinstance(label, str) and track is not None:
                    tracks[track] = label
            elif ph in ("s", "t"):  # an arrow from a call to the copy or dispatch it queued (or back)
                ends = flows[ph]
                for column, value in zip(_FLOW, (ascii_id(e.id), ascii_id(e.pid), ascii_id(e.tid),
                                                 _micro(e.ts))):
                    ends[column].append(value)
            elif not (ph is None and e.name is None):  # {} opens the file
                skipped[ph or "(none)"] = skipped.get(ph or "(none)", 0) + 1
    frame = pl.DataFrame(rows, schema=_SCHEMA)
    processes = frame["pid"].drop_nulls().unique()
    if processes.len() == 1:  # the old form's calls: the one process the copies and dispatches name
        frame = frame.with_columns(pl.col("pid").fill_null(processes[0]))
    kinds = {t: _LABEL.match(label) for t, label in tracks.items()}
    track_kind = pl.DataFrame({"_track": list(kinds), "_kind": [_kind(m) for m in kinds.values()],
                               "_device": [ascii_id(m.group(2)) if m and m.group(2) else None
                                           for m in kinds.values()]},
                              schema={"_track": pl.Int64, "_kind": pl.String, "_device": pl.Int64})
    frame = frame.join(track_kind, on="_track", how="left", maintain_order="left")
    unknown = frame.filter(pl.col("_kind").is_null())
    if unknown.height:
        named = {tracks.get(t, f"an unnamed track (pid {t})") for t in unknown["_track"].unique().to_list()}
        options.warn(f"{path}: {fmt_count(unknown.height, 'event')} on tracks this reader does not read, skipped: "
                     + ", ".join(sorted(named)))
    frame = frame.filter(pl.col("_kind").is_not_null())
    # the barrier packets a queue runs between dispatches (a synchronize's, a stream wait's): rocprof records them
    # among the dispatches until ROCm 6.2 moved them to tracks of their own (skipped above); no GPU work either way
    barrier = (pl.col("_kind") == "kernel") & (pl.col("name") == BARRIER)
    barriers = frame.filter(barrier).height
    if barriers:
        options.warn(f"{path}: {fmt_count(barriers, 'barrier packet')} (a queue's barriers between dispatches, "
                     "recorded among them) left out: no GPU work")
        frame = frame.filter(~barrier)
    # a dispatch rocprof recorded twice, once with its time and once zero-length at the same start (36 of 85 in a
    # real trace): the copy with no time would stand between the stream's gap and the dispatch it waited for
    key = ["_track", "stream_id", "name", "start_ns"]
    zero = pl.col("_kind").is_in(["kernel", "memcpy"]) & (pl.col("duration_ns") == 0)
    timed = frame.filter(pl.col("_kind").is_in(["kernel", "memcpy"]) & (pl.col("duration_ns") > 0)).select(key)
    twice = frame.with_row_index("_twice").filter(zero).join(timed, on=key, how="semi", nulls_equal=True)["_twice"]
    if twice.len():
        options.warn(f"{path}: {fmt_count(twice.len(), 'zero-length record')} of dispatches or copies recorded again "
                     "with their time (same lane, name and start) left out")
        frame = frame.with_row_index("_twice").filter(~pl.col("_twice").is_in(twice.implode())).drop("_twice")
    frame = _linked(frame, pl.DataFrame(flows["s"], schema=_FLOW), pl.DataFrame(flows["t"], schema=_FLOW))
    gpu = pl.col("_kind").is_in(["kernel", "memcpy"])
    roctx_marker = (pl.col("_kind") == "roctx") & (pl.col("duration_ns") <= 1)  # rocprof writes a marker 1 ns long
    dispatch_mark = (pl.col("_kind") == "api") & (pl.col("name") == DISPATCH_MARK)
    frame = frame.with_columns(
        kind=pl.when(roctx_marker | dispatch_mark).then(pl.lit("marker"))
        .when(pl.col("_kind") == "roctx").then(pl.lit("region")).otherwise(pl.col("_kind")),
        duration_ns=pl.when(roctx_marker).then(0).otherwise(pl.col("duration_ns")),
        device_id=pl.when(gpu).then(pl.coalesce("device_id", "_device", pl.lit(_only_gpu(kinds), pl.Int64))),
        stream_id=pl.when(gpu).then(pl.col("stream_id")),
        copy_kind=pl.when(pl.col("_kind") == "memcpy").then(pl.col("copy_kind")),
        group=pl.when(pl.col("_kind") == "roctx").then(pl.lit("roctx")).otherwise(pl.col("group")))
    if skipped:
        options.warn(f"{path}: skipped events that are not timeline slices: "
                     + ", ".join(f"{n} {ph}" for ph, n in sorted(skipped.items())))
    meta = TraceMeta(tool="rocprof", variant="rocprof v1 results.json")
    meta.summary.update({f"{k}_rows": n for k, n in frame.group_by("kind").len().sort("kind").iter_rows()})
    meta.warnings = options.warnings
    return Trace(frame.sort("_at", maintain_order=True).drop("_track", "_lane", "_ts", "_dur", "_at", "_kind",
                                                             "_device"), meta)


def _only_gpu(kinds: dict[int, re.Match | None]) -> int | None:
    """The device of a trace's one GPU track, None where it has several or none. rocprof's COPY track names no
    device, and its copies had none: a trace of one GPU read as that GPU and a second, unknown one ("the 2 GPUs
    ... the longest gap 5.534 ms" of a 3.069 ms mean span); with one GPU traced, its copies are that GPU's."""
    devices = {ascii_id(m.group(2)) for m in kinds.values() if m and m.group(2)}
    return devices.pop() if len(devices) == 1 else None


def _linked(frame: pl.DataFrame, starts: pl.DataFrame, ends: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with ``correlation_id``: each call and the copy or dispatch it queued share their arrow's id.

    rocprof writes no correlation id; its arrows (``DataFlow`` flow events) start inside the call (at its
    midpoint, on its thread) and end where the copy or dispatch starts, on its lane, in the events' own
    microseconds. An arrow from a call track (HIP, HSA) to a GPU track that starts no later than the operation
    is a launch link; the others link no launch and are left out: rocprof draws an arrow from a kernel back to the
    ``hipStreamSynchronize`` that waited for it, and for an operation a synchronize waited for, the arrow from the
    call track starts inside the synchronize at the operation's end (35 of 86 such arrows in a real trace).
    Calls and operations are found by their track, lane and time as the arrow gives them."""
    arrows = starts.join(ends, on="_id", how="inner", suffix="_end").drop_nulls()
    kinds = frame.select("_track", "_kind").unique("_track")
    arrows = (arrows.join(kinds, on="_track", how="inner").filter(pl.col("_kind") == "api").drop("_kind")
              .join(kinds.rename({"_track": "_track_end"}), on="_track_end", how="inner")
              .filter(pl.col("_kind").is_in(["kernel", "memcpy"]) & (pl.col("_ts") <= pl.col("_ts_end")))
              .drop("_kind"))
    if arrows.height == 0:
        return _contained(frame.with_row_index("_row").with_columns(correlation_id=pl.lit(None, dtype=pl.Int64))
                          ).drop("_row")
    ops = (arrows.select(_track="_track_end", _lane="_lane_end", _ts="_ts_end", correlation_id="_id")
           .sort("correlation_id").unique(["_track", "_lane", "_ts"], keep="first", maintain_order=True))
    rows = frame.with_row_index("_row")
    # one operation an arrow: of the rows starting in its microsecond on its lane, the longest (rocprof also
    # writes zero-length records of dispatches it could not time)
    op_ids = (rows.join(ops, on=["_track", "_lane", "_ts"], how="inner")
              .sort(["correlation_id", "duration_ns", "_row"], descending=[False, True, False])
              .unique("correlation_id", keep="first", maintain_order=True)
              .unique("_row", keep="first", maintain_order=True).select("_row", "correlation_id"))
    # an arrow from HSA's hsa_dispatch mark (the dispatch packet rocprof saw written) names no call: left out
    marks = rows.filter((pl.col("_kind") == "api") & (pl.col("name") == DISPATCH_MARK)).select("_track", "_lane",
                                                                                             "_ts").unique()
    # the call whose time holds the arrow's start: the last call of that thread starting at or before it
    calls = (rows.filter((pl.col("_kind") == "api") & (pl.col("name") != DISPATCH_MARK)).drop_nulls(["_ts", "_dur"])
             .select("_row", "_track", "_lane", _start="_ts", _end=pl.col("_ts") + pl.col("_dur")).sort("_start"))
    found = (arrows.select("_track", "_lane", "_ts", correlation_id="_id")
             .join(marks, on=["_track", "_lane", "_ts"], how="anti")
             .join(op_ids.select("correlation_id"), on="correlation_id", how="semi").sort("_ts", "correlation_id")
             .join_asof(calls, left_on="_ts", right_on="_start", by=["_track", "_lane"], strategy="backward",
                        check_sortedness=False)  # sorted by time as a whole, so within each thread
             .filter(pl.col("_row").is_not_null() & (pl.col("_ts") <= pl.col("_end")))
             .unique("_row", keep="first", maintain_order=True)
             .unique("correlation_id", keep="first", maintain_order=True).select("_row", "correlation_id"))
    # a link has both ends: an operation whose call was not found keeps no id
    ids = pl.concat([op_ids.join(found.select("correlation_id"), on="correlation_id", how="semi"), found])
    return _contained(rows.join(ids, on="_row", how="left", maintain_order="left")).drop("_row")


#: Synchronous copy calls: the copy runs inside the call (not ``...Async``: those return before it runs).
_SYNC_COPY = r"^hipMemcpy(?:[A-Z][A-Za-z]*)?$"


def _contained(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (with ``_row``, ``correlation_id``) with each copy that no arrow links given to the synchronous copy
    call it ran inside: rocprof draws no arrow for some copies (23 of 23 in a real trace), and a ``hipMemcpy``
    returns only once its copy is done, so the copy lies within the call. Only where the calls holding the copy
    are on one thread of its process (the innermost of them: ``hipMemcpyToSymbol`` holds a ``hipMemcpy``);
    copies inside calls of several threads stay unlinked. The id given is new (past every arrow's)."""
    copies = rows.filter((pl.col("_kind") == "memcpy") & pl.col("correlation_id").is_null()).select(
        "_row", "pid", _s="start_ns", _e=pl.col("start_ns") + pl.col("duration_ns"))
    calls = rows.filter((pl.col("_kind") == "api") & pl.col("name").str.contains(_SYNC_COPY)
                        & pl.col("correlation_id").is_null()).select(
        _call="_row", pid="pid", tid="tid", _cs="start_ns", _ce=pl.col("start_ns") + pl.col("duration_ns"))
    if copies.height == 0 or calls.height == 0:
        return rows
    holding = (copies.join(calls, on="pid", how="inner")
               .filter((pl.col("_cs") <= pl.col("_s")) & (pl.col("_e") <= pl.col("_ce"))))
    one_thread = holding.group_by("_row").agg(pl.col("tid").n_unique().alias("_threads")).filter(
        pl.col("_threads") == 1)
    innermost = (holding.join(one_thread.select("_row"), on="_row", how="semi")
                 .sort(["_row", "_cs", "_ce"], descending=[False, True, False])
                 .unique("_row", keep="first", maintain_order=True)
                 .unique("_call", keep="first", maintain_order=True)  # a call holds one copy: the first in the file
                 .sort("_row"))  # the ids in file order, the same on every read
    if innermost.height == 0:
        return rows
    base = int(rows["correlation_id"].max() or 0) + 1
    pairs = innermost.with_columns(_id=pl.int_range(base, base + pl.len(), dtype=pl.Int64))
    ids = pl.concat([pairs.select("_row", "_id"), pairs.select(_row="_call", _id="_id")])
    return (rows.join(ids, on="_row", how="left", maintain_order="left")
            .with_columns(correlation_id=pl.coalesce("correlation_id", "_id")).drop("_id"))


def _micro(raw: msgspec.Raw) -> int | None:
    """A top-level ``ts`` or ``dur``: whole microseconds, written as text or bare (what the arrows are placed by)."""
    return ascii_id(bytes(raw).decode("ascii", errors="replace").strip().strip('"')) if raw else None


def _kind(match: re.Match | None) -> str | None:
    """The rows' kind of a track label matched by :data:`_LABEL` (None: a track this reader does not read)."""
    if match is None:
        return None
    label = match.group(1)
    return ("api" if label.startswith("CPU ") else "memcpy" if label == "COPY"
            else "roctx" if label == "Markers and Ranges" else "kernel")


def _add(rows: dict[str, list], path: Path, index: int, e: RocEvent) -> None:
    """One complete event's row (its kind comes from its track, joined at the end)."""
    a = e.args or Args()
    begin, end = _int(path, index, "BeginNs", a.BeginNs), _int(path, index, "EndNs", a.EndNs)
    if begin is None or end is None:
        raise bad_input(path, f"traceEvents[{index}].args", "BeginNs and EndNs (rocprof writes both on every event)")
    if end < begin:
        raise bad_input(path, f"traceEvents[{index}].args.EndNs",
                        f"an end no earlier than BeginNs, got {end} < {begin}")
    name = a.KernelName or a.Name or e.name
    rows["_at"].append(index)
    rows["_track"].append(ascii_id(e.pid))
    rows["_lane"].append(ascii_id(e.tid))
    rows["_ts"].append(_micro(e.ts))
    rows["_dur"].append(_micro(e.dur))
    rows["kind"].append(None)
    rows["name"].append(name if isinstance(name, str) else None)
    rows["start_ns"].append(begin)
    rows["duration_ns"].append(end - begin)
    # before ROCm 4.3, args.pid was the track and args.proc-id the process (on copies and dispatches only: a call
    # of that form names no process, filled in below where the file has one)
    pid = ascii_id(a.pid)
    rows["pid"].append(ascii_id(a.proc_id) if a.proc_id is not None else None if pid == ascii_id(e.pid) else pid)
    rows["tid"].append(ascii_id(a.tid))
    rows["device_id"].append(ascii_id(a.dev_id if a.dev_id is not None else a.gpu_id))
    stream = ascii_id(a.stream_id)
    rows["stream_id"].append(stream if stream is not None else ascii_id(e.tid))
    rows["copy_kind"].append(_DIRECTIONS.get(name))
    rows["group"].append(e.cat)
    grid, group_size = ascii_id(a.grd), ascii_id(a.wgr)
    # the counter path's kernel record: grd and wgr are work-items in all (x·y·z); the workgroups are their ratio
    whole = grid is not None and group_size and grid % group_size == 0
    rows["grid_x"].append(grid // group_size if whole else None)
    rows["block_x"].append(group_size if whole else None)
    rows["registers_per_thread"].append(ascii_id(a.vgpr))


def _int(path: Path, index: int, field: str, value: Any) -> int | None:
    """An integer rocprof wrote as text (or bare); None where absent; a one-line error where it is no integer."""
    if value is None:
        return None
    number = ascii_id(value)
    if number is None:
        raise bad_input(path, f"traceEvents[{index}].args.{field}",
                        f"an integer of nanoseconds, got {str(value)[:40]!r}")
    return number
