"""A generic Chrome trace (object or array form) to rows of the normalized event table.

Complete events (``ph`` ``X``) and ``B``/``E`` pairs (matched per pid/tid in
time order, an ``E`` to the innermost open ``B`` of its name) become ``region`` rows, instant events (``i``, ``I``,
``R``) ``marker`` rows of duration 0, counter events (``C``) one ``counter``
row per numeric argument (named ``NAME.ARG`` when the event has several);
``cat`` goes to ``group``; integer ``pid`` / ``tid`` are kept (digits as text too),
other strings (labels) are not. Timestamps are decimal microseconds, converted to integer
ns exactly by :mod:`traceparse.units` (sub-ns digits rounded half to even).
Asynchronous events (nestable ``b``/``e`` and legacy ``S``/``F``, paired by
their id, category and scope in time order) become ``region`` rows of group
``async`` (spans that may overlap: no thread's nesting), their instants
(``n``, ``T``, ``p``) markers of that group; ``thread_name`` metadata names
threads. Other phases (flows, objects, other metadata) are skipped and
counted in a warning. The events are decoded chunk by chunk by the shared Chrome-JSON
decoder; a file cut short keeps its complete events and warns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.figures import fmt_count
from traceparse.schema import ASYNC_GROUP
from traceparse.threads import THREAD_NAMES
from traceparse.trace import Trace, TraceMeta
from traceparse.validate import ascii_int, fits_int64

from traceparse_plugins.readers.chrome_json import CHUNK_BYTES, Event, stream_events, time_ns

class ChromeEvent(Event[dict[str, Any]], gc=False):
    """A generic Chrome event: every argument kept (counter events carry their values there), and the ids that
    pair asynchronous events (as written: a number, a text, ``id2``'s object)."""

    id: msgspec.Raw = msgspec.Raw()
    id2: msgspec.Raw = msgspec.Raw()
    scope: str | None = None


#: Asynchronous phases: nestable (``b`` begin, ``e`` end, ``n`` instant) and the legacy ones (``S`` start,
#: ``F`` finish, ``T``/``p`` steps).
_ASYNC_BEGIN, _ASYNC_END, _ASYNC_INSTANT = ("b", "S"), ("e", "F"), ("n", "T", "p")


class _Document(msgspec.Struct):
    traceEvents: list[ChromeEvent] = []


def read_plain(path: Path, options: ReadOptions) -> Trace:
    """Read a generic Chrome trace into region, marker and counter rows."""
    rows: dict[str, list] = {c: [] for c in ("kind", "name", "start_ns", "duration_ns", "pid", "tid", "group",
                                             "value", "_at")}
    open_spans: dict[tuple, list] = {}
    ends: dict[tuple, list] = {}
    asynchronous: dict[tuple, list] = {}
    thread_names: dict[str, str] = {}
    skipped: dict[str, int] = {}
    out_of_range: dict[str, int] = {}

    def id_of(value, field: str):
        """An integer pid/tid within Int64 (or its digits as text: Hermes writes ``"tid": "1"``); a label or a
        number past Int64 is no id (the latter counted)."""
        value = ascii_int(value)
        if value is None:
            return None
        if fits_int64(value):
            return value
        out_of_range[field] = out_of_range.get(field, 0) + 1
        return None

    def add(kind, name, start, dur, e, value=None, at=None, group=None):
        rows["_at"].append(index if at is None else at)  # the file position the row stands at
        rows["kind"].append(kind)
        rows["name"].append(name)
        rows["start_ns"].append(start)
        rows["duration_ns"].append(dur)
        rows["pid"].append(id_of(e.pid, "pid"))
        rows["tid"].append(id_of(e.tid, "tid"))
        rows["group"].append(group or e.cat)
        rows["value"].append(value)

    chunk = int(options.params.get("chunk_bytes", CHUNK_BYTES))
    for offset, events in stream_events(path, options, ChromeEvent, _Document, chunk_bytes=chunk):
        for i, e in enumerate(events):
            index = offset + i
            ph = e.ph or ""
            if ph == "X":
                add("region", e.name, _ns(path, index, "ts", e.ts), _ns(path, index, "dur", e.dur, required=False), e)
            elif ph in ("B", "E"):  # paired below, per thread in time order
                ends.setdefault((e.pid, e.tid), []).append((_ns(path, index, "ts", e.ts), index, ph, e))
            elif ph in ("i", "I", "R"):
                add("marker", e.name, _ns(path, index, "ts", e.ts), 0, e)
            elif ph in _ASYNC_BEGIN or ph in _ASYNC_END:  # paired below, per id in time order
                key = (e.pid, e.cat, bytes(e.id), bytes(e.id2), e.scope, ph in ("S", "F"))
                asynchronous.setdefault(key, []).append((_ns(path, index, "ts", e.ts), index,
                                                         "B" if ph in _ASYNC_BEGIN else "E", e))
            elif ph in _ASYNC_INSTANT:
                add("marker", e.name, _ns(path, index, "ts", e.ts), 0, e, group=ASYNC_GROUP)
            elif ph == "M":
                name = (e.args or {}).get("name")
                if e.name == "thread_name" and isinstance(name, str) and id_of(e.tid, "tid") is not None:
                    thread_names[f"{id_of(e.pid, 'pid')}/{id_of(e.tid, 'tid')}"] = name
                elif e.name not in ("process_name", "process_labels", "process_sort_index", "thread_sort_index"):
                    skipped["M"] = skipped.get("M", 0) + 1
            elif ph == "C":
                numeric = {k: v for k, v in (e.args or {}).items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)}
                start = _ns(path, index, "ts", e.ts)
                for key, value in numeric.items():
                    add("counter", e.name if len(numeric) == 1 else f"{e.name}.{key}", start, None, e, float(value))
            else:
                skipped[ph or "(none)"] = skipped.get(ph or "(none)", 0) + 1
    for events in ends.values():
        _pair(events, add, skipped, open_spans)
    unclosed = sum(len(s) for s in open_spans.values())
    if unclosed:
        options.warn(f"{path}: {unclosed} B events have no matching E; left out")
    open_async: dict[tuple, list] = {}
    for events in asynchronous.values():  # overlapping spans of one lane: group "async", no thread's nesting
        _pair(events, lambda *a, **k: add(*a, **k, group=ASYNC_GROUP), skipped, open_async, strict=True)
    unclosed = sum(len(s) for s in open_async.values())
    if unclosed:
        options.warn(f"{path}: {fmt_count(unclosed, 'asynchronous begin')} (b, S) without a matching end, left out")
    if out_of_range:
        options.warn(f"{path}: ids past 64-bit integers: "
                     + "; ".join(f"{field} {n}× out of the column's range, left empty"
                                 for field, n in sorted(out_of_range.items())))
    if skipped:
        options.warn(f"{path}: skipped events that are not timeline slices: "
                     + ", ".join(f"{n} {ph}" for ph, n in sorted(skipped.items())))
    df = pl.DataFrame(rows, schema={"kind": pl.String, "name": pl.String, "start_ns": pl.Int64,
                                    "duration_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
                                    "group": pl.String, "value": pl.Float64, "_at": pl.Int64})
    df = df.sort("_at", maintain_order=True).drop("_at")  # a pair stands where its E stands in the file
    meta = TraceMeta(variant="Chrome Trace Event JSON")
    if thread_names:
        meta.extra[THREAD_NAMES] = thread_names
    return Trace(df, meta)


def _pair(events: list, add, skipped: dict, open_spans: dict, strict: bool = False) -> None:
    """One thread's ``B``/``E`` events, (ts, file index, phase, event), paired into regions in time order (ties in
    file order; writers list them out of order): an ``E`` closes the innermost open ``B`` of its name, else the
    innermost one (the spec lets ``E`` leave its name out). ``strict`` (an asynchronous id's ``b``/``e``): a named
    end closes only a begin of its name, and is counted unmatched otherwise. What stays open goes to
    ``open_spans``."""
    stack: list = []
    for ts, at_index, ph, e in sorted(events, key=lambda x: (x[0], x[1])):
        if ph == "B":
            stack.append((e, ts))
            continue
        if not stack:
            skipped["E without B"] = skipped.get("E without B", 0) + 1
            continue
        at = next((i for i in range(len(stack) - 1, -1, -1) if e.name and stack[i][0].name == e.name),
                  None if strict and e.name else len(stack) - 1)
        if at is None:
            skipped["e without b"] = skipped.get("e without b", 0) + 1
            continue
        begin, start = stack.pop(at)
        add("region", begin.name or e.name, start, ts - start, begin, at=at_index)
    if stack:
        open_spans[id(events)] = stack


def _ns(path: Path, index: int, field: str, raw: msgspec.Raw, required: bool = True) -> int | None:
    """A decimal-microseconds JSON number -> integer ns, exactly (:func:`chrome_json.time_ns`)."""
    try:
        value = time_ns(raw)
    except ValueError as exc:
        raise bad_input(path, f"traceEvents[{index}].{field}",
                        f"a time in microseconds, got {bytes(raw).decode(errors='replace')[:40]!r} ({exc})") from None
    if value is None and required:
        raise bad_input(path, f"traceEvents[{index}].{field}", "a time in microseconds")
    return value
