"""Reader ``chrome``: Chrome Trace Event JSON: traceparse's own ``chrome`` exports exactly, other Chrome traces generally.

A traceparse export (its first key is ``"traceparse"``, see
plugins/exporters/chrome.py) is read back row for row: each event's
``args.traceparse`` object and each element of ``traceparseRows`` is one
normalized row, with its ``event_id``; ``traceparseNonFinite`` restores NaN and
infinities. Flow and metadata events carry no rows and are skipped. An export
of a newer layout or schema version than this traceparse knows is refused.
The trace's tags and devices come back from the ``traceparse`` header.

Any other Chrome trace (object form ``{"traceEvents": [...]}`` or array form
``[...]``, whose closing bracket the format lets writers leave out) is read
generally: complete events (``ph`` ``X``) and ``B``/``E`` pairs (matched per
pid/tid, innermost first) become ``region`` rows, instant events (``i``, ``I``,
``R``) ``marker`` rows of duration 0, counter events (``C``) one ``counter``
row per numeric argument (named ``NAME.ARG`` when the event has several);
``cat`` goes to ``group``; integer ``pid`` / ``tid`` are kept, string ones
(labels) are not. Timestamps are decimal microseconds, converted to integer
ns exactly (decimal arithmetic, sub-ns digits rounded half up). Other phases
(metadata, flows, async, objects) are skipped and counted in a warning.

A file cut short keeps its complete events and warns.
"""

from __future__ import annotations

import io
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.schema import DTYPES, SCHEMA_VERSION, conform
from traceparse.sources import open_binary
from traceparse.trace import Device, Trace, TraceMeta

#: The export layout version this reader understands (plugins/exporters/chrome.py EXPORT_VERSION).
EXPORT_VERSION = 1
_MARKER = re.compile(rb'^\s*\{\s*"traceparse"\s*:')
_KINETO_HINTS = (b'"cpu_op"', b'"cuda_runtime"', b'"External id"', b'"deviceProperties"', b'"schemaVersion"',
                 b'"Operator"', b'"python_function"', b'"PyTorch Profiler', b'"kernel"')
#: Columns as read from JSON (enums as text; conform() checks and casts them).
_READ_SCHEMA = {c: (pl.String if isinstance(t, pl.Enum) else t) for c, t in DTYPES.items() if c != "trace_id"}


class _ExportArgs(msgspec.Struct):
    traceparse: msgspec.Raw = msgspec.Raw()


class _ExportEvent(msgspec.Struct):
    ph: str | None = None
    args: _ExportArgs | None = None


class _ExportDocument(msgspec.Struct):
    traceparse: dict[str, Any]
    traceEvents: list[_ExportEvent] = []
    traceparseRows: list[msgspec.Raw] = []
    traceparseNonFinite: list[tuple[int, str, str]] = []


class _Event(msgspec.Struct):
    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    args: dict[str, Any] | None = None


class _Document(msgspec.Struct):
    traceEvents: list[_Event] = []


def _row_type(dtype: pl.DataType) -> type:
    if dtype.is_integer():
        return int
    if dtype.is_float():
        return float
    return str


#: One embedded row, typed from the schema: used only to name the bad field when a row does not fit.
_Row = msgspec.defstruct(
    "_Row",
    [("event_id", int), ("kind", str)]
    + [(c, _row_type(t) | None, None) for c, t in DTYPES.items() if c not in ("trace_id", "event_id", "kind")],
    forbid_unknown_fields=True,
)

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class ChromeTraceReader(Reader):
    name = "chrome"
    description = "Chrome Trace Event JSON: traceparse `export --to chrome` files (exact), other Chrome traces"
    variants = ("traceparse chrome export, layout 1", "Chrome Trace Event JSON, object or array form",
                "gzip-compressed (.json.gz)")
    patterns = ("*.json", "*.json.gz", "*.trace.json")

    def sniff(self, path: Path, head: bytes) -> float:
        if _MARKER.match(head):
            return 0.99
        if b'"traceEvents"' in head:
            return 0.05 if any(h in head for h in _KINETO_HINTS) else 0.4
        stripped = head.lstrip()
        if stripped.startswith(b"[") and b'"ph"' in head:
            return 0.4
        return 0.0

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        with open_binary(path) as f:
            try:
                data = f.read()
            except (OSError, EOFError) as exc:
                raise bad_input(path, None, f"cannot be read (truncated gzip?): {exc}") from None
        options.progress(path.stat().st_size)
        trace = _read_export(path, data, options) if _MARKER.match(data[:4096]) else _read_plain(path, data, options)
        trace.meta.warnings = options.warnings  # the same list: warnings made while reading land in the metadata
        return trace


# -- traceparse exports --------------------------------------------------------
def _read_export(path: Path, data: bytes, options: ReadOptions) -> Trace:
    try:
        doc = msgspec.json.decode(data, type=_ExportDocument)
    except msgspec.ValidationError as exc:
        raise bad_input(path, _where(str(exc)), f"not a traceparse Chrome export: {_what(str(exc))}") from None
    except msgspec.DecodeError:
        doc = _salvage_export(path, data, options)
    header = doc.traceparse
    version = header.get("export_version")
    if not isinstance(version, int) or version > EXPORT_VERSION:
        raise bad_input(path, "traceparse.export_version",
                        f"export layout version {version!r}; this traceparse reads versions up to {EXPORT_VERSION}")
    schema = header.get("schema_version")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise bad_input(path, "traceparse.schema_version",
                        f"rows of schema version {schema!r}; this traceparse knows schema version {SCHEMA_VERSION}")
    raws = [bytes(e.args.traceparse) for e in doc.traceEvents if e.args is not None and bytes(e.args.traceparse)]
    raws += [bytes(r) for r in doc.traceparseRows]
    events = _rows_frame(path, raws)
    if doc.traceparseNonFinite:
        events = _patch_non_finite(path, events, doc.traceparseNonFinite)
    info = header.get("trace") or {}
    meta = TraceMeta(tool=info.get("tool"), tool_version=info.get("tool_version"),
                     variant=f"traceparse chrome export (layout {version}) of a {info.get('format') or '?'} trace")
    meta.tags.update({str(k): str(v) for k, v in (info.get("tags") or {}).items()})
    known = set(Device.__dataclass_fields__)
    meta.devices = [Device(**{k: v for k, v in d.items() if k in known})
                    for d in info.get("devices") or [] if isinstance(d, dict)]
    meta.extra.update({"source_format": info.get("format"), "source_variant": info.get("variant"),
                       "source_trace_id": info.get("id"), "source_paths": info.get("source_paths")})
    return Trace(events, meta)


def _rows_frame(path: Path, raws: list[bytes]) -> pl.DataFrame:
    """The embedded rows as a table of the schema, sorted by event_id."""
    if not raws:
        return conform(pl.DataFrame({"kind": pl.Series([], dtype=pl.String)}))
    try:
        df = pl.read_ndjson(io.BytesIO(b"\n".join(raws)), schema=_READ_SCHEMA)
    except Exception:  # noqa: BLE001 - polars raises several types; find the bad row for the message
        _raise_bad_row(path, raws)
        raise bad_input(path, None, "embedded rows do not match the traceparse schema") from None
    try:
        df = conform(df.sort("event_id"))
    except ValueError as exc:
        raise bad_input(path, "embedded rows", str(exc)) from None
    if df["event_id"].null_count() or df["event_id"].n_unique() != df.height:
        raise bad_input(path, "embedded rows", "every row needs its own event_id")
    return df


def _raise_bad_row(path: Path, raws: list[bytes]) -> None:
    decoder = msgspec.json.Decoder(_Row)
    for i, raw in enumerate(raws):
        try:
            decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise bad_input(path, f"embedded row {i}", f"not a traceparse row: {_what(str(exc))}") from None


def _patch_non_finite(path: Path, events: pl.DataFrame, patches: list[tuple[int, str, str]]) -> pl.DataFrame:
    by_column: dict[str, dict[int, float]] = {}
    for event_id, column, text in patches:
        if DTYPES.get(column) != pl.Float64 or text not in _NON_FINITE:
            raise bad_input(path, "traceparseNonFinite", f"[event_id, float column, NaN|Infinity|-Infinity], "
                            f"got {[event_id, column, text]!r}")
        by_column.setdefault(column, {})[event_id] = _NON_FINITE[text]
    updates = []
    for column, values in by_column.items():
        lookup = pl.DataFrame({"event_id": list(values), "_v": list(values.values())},
                              schema={"event_id": pl.Int64, "_v": pl.Float64})
        patched = events.select("event_id").join(lookup, on="event_id", how="left", maintain_order="left")["_v"]
        updates.append(pl.when(patched.is_not_null()).then(patched).otherwise(pl.col(column)).alias(column))
    return events.with_columns(updates)


def _salvage_export(path: Path, data: bytes, options: ReadOptions) -> _ExportDocument:
    """A truncated export: keep the header and the complete event lines."""
    lines = data.split(b"\n")
    try:
        header = msgspec.json.decode(lines[0].rstrip(b",") + b"}")
    except msgspec.DecodeError:
        raise bad_input(path, 1, "not valid JSON: expected a traceparse Chrome export header") from None
    events = []
    for line in lines[3:]:
        line = line.rstrip().rstrip(b",")
        if not line.startswith(b"{"):
            break
        try:
            events.append(msgspec.json.decode(line, type=_ExportEvent))
        except (msgspec.DecodeError, msgspec.ValidationError):
            break
    kept = sum(1 for e in events if e.args is not None and bytes(e.args.traceparse))
    if kept == 0:
        raise bad_input(path, None, "the file ends before its first complete event (truncated file?)")
    options.warn(f"{path}: the file ends early (truncated); kept the {kept} complete timeline rows "
                 f"(aggregated rows and counters, stored after the timeline, are lost)")
    return _ExportDocument(traceparse=header["traceparse"], traceEvents=events)


# -- plain Chrome traces -----------------------------------------------------------
_EVENTS = msgspec.json.Decoder(list[_Event])
_DOCUMENT = msgspec.json.Decoder(_Document)


def _read_plain(path: Path, data: bytes, options: ReadOptions) -> Trace:
    events = _decode_plain(path, data, options)
    rows: dict[str, list] = {c: [] for c in ("kind", "name", "start_ns", "duration_ns", "pid", "tid", "group",
                                             "value")}
    open_spans: dict[tuple, list] = {}
    skipped: dict[str, int] = {}

    def add(kind, name, start, dur, e, value=None):
        rows["kind"].append(kind)
        rows["name"].append(name)
        rows["start_ns"].append(start)
        rows["duration_ns"].append(dur)
        rows["pid"].append(e.pid if isinstance(e.pid, int) else None)
        rows["tid"].append(e.tid if isinstance(e.tid, int) else None)
        rows["group"].append(e.cat)
        rows["value"].append(value)

    for index, e in enumerate(events):
        ph = e.ph or ""
        if ph == "X":
            add("region", e.name, _ns(path, index, "ts", e.ts), _ns(path, index, "dur", e.dur, required=False), e)
        elif ph == "B":
            open_spans.setdefault((e.pid, e.tid), []).append((e, _ns(path, index, "ts", e.ts)))
        elif ph == "E":
            stack = open_spans.get((e.pid, e.tid))
            if not stack:
                skipped["E without B"] = skipped.get("E without B", 0) + 1
                continue
            begin, start = stack.pop()
            add("region", begin.name or e.name, start, _ns(path, index, "ts", e.ts) - start, begin)
        elif ph in ("i", "I", "R"):
            add("marker", e.name, _ns(path, index, "ts", e.ts), 0, e)
        elif ph == "C":
            numeric = {k: v for k, v in (e.args or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            start = _ns(path, index, "ts", e.ts)
            for key, value in numeric.items():
                add("counter", e.name if len(numeric) == 1 else f"{e.name}.{key}", start, None, e, float(value))
        else:
            skipped[ph or "(none)"] = skipped.get(ph or "(none)", 0) + 1
    unclosed = sum(len(s) for s in open_spans.values())
    if unclosed:
        options.warn(f"{path}: {unclosed} B events have no matching E; left out")
    if skipped:
        options.warn(f"{path}: skipped events that are not timeline slices: "
                     + ", ".join(f"{n} {ph}" for ph, n in sorted(skipped.items())))
    df = pl.DataFrame(rows, schema={"kind": pl.String, "name": pl.String, "start_ns": pl.Int64,
                                    "duration_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
                                    "group": pl.String, "value": pl.Float64})
    meta = TraceMeta(variant="Chrome Trace Event JSON")
    return Trace(df, meta)


def _decode_plain(path: Path, data: bytes, options: ReadOptions) -> list[_Event]:
    stripped = data.lstrip()
    try:
        if stripped.startswith(b"["):
            try:
                return _EVENTS.decode(stripped)
            except msgspec.DecodeError:
                closed = stripped.rstrip().rstrip(b",") + b"]"  # the format allows leaving out the final ]
                events = _EVENTS.decode(closed)
                return events
        return _DOCUMENT.decode(data).traceEvents
    except msgspec.ValidationError as exc:
        raise bad_input(path, _where(str(exc)), f"unexpected value in a Chrome trace event: {_what(str(exc))}") \
            from None
    except msgspec.DecodeError:
        return _salvage_plain(path, data, options)


def _salvage_plain(path: Path, data: bytes, options: ReadOptions) -> list[_Event]:
    """Keep the longest prefix of whole events of a file cut short."""
    m = re.search(rb'"traceEvents"\s*:\s*\[', data)
    body = data[m.end():] if m else data.lstrip()[1:] if data.lstrip().startswith(b"[") else None
    if body is None:
        raise bad_input(path, None, "not valid JSON: expected Chrome Trace Event JSON") from None
    pos = len(body)
    for _ in range(2000):
        pos = body.rfind(b"}", 0, pos)
        if pos < 0:
            break
        try:
            events = _EVENTS.decode(b"[" + body[: pos + 1] + b"]")
        except msgspec.DecodeError:
            continue
        except msgspec.ValidationError as exc:
            raise bad_input(path, _where(str(exc)), f"unexpected value in a Chrome trace event: {_what(str(exc))}") \
                from None
        options.warn(f"{path}: the file ends early (truncated JSON); kept the {len(events)} complete events")
        return events
    raise bad_input(path, None, "not valid JSON, and no complete Chrome trace event found") from None


def _ns(path: Path, index: int, field: str, raw: msgspec.Raw, required: bool = True) -> int | None:
    """A decimal-microseconds JSON number -> integer ns, exactly."""
    text = bytes(raw).decode()
    if not text or text == "null":
        if required:
            raise bad_input(path, f"traceEvents[{index}].{field}", "a time in microseconds")
        return None
    try:
        return int((Decimal(text.strip('"')) * 1000).to_integral_value(rounding=ROUND_HALF_UP))
    except (InvalidOperation, ValueError):
        raise bad_input(path, f"traceEvents[{index}].{field}", f"a time in microseconds, got {text[:40]!r}") from None


def _where(message: str) -> str:
    m = re.search(r"at `\$([^`]*)`", message)
    return m.group(1).lstrip(".") if m else ""


def _what(message: str) -> str:
    return message.split(" - at ")[0]


@hookimpl
def traceparse_readers():
    return [ChromeTraceReader()]
