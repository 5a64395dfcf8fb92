"""The traceparse-export form of a Chrome trace, read back row for row.

A traceparse export (its first key is ``"traceparse"``, see
plugins/exporters/chrome.py): each event's ``args.traceparse`` object and
each element of ``traceparseRows`` is one normalized row, with its
``event_id``; ``traceparseNonFinite`` restores NaN and infinities. Flow and
metadata events carry no rows and are skipped. An export of a newer layout or
schema version than this traceparse knows is refused. The trace's tags and
devices come back from the ``traceparse`` header. A file cut short keeps its
complete timeline rows and warns.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.schema import DTYPES, SCHEMA_VERSION, conform
from traceparse.sources import open_binary
from traceparse.trace import Device, Trace, TraceMeta
from traceparse.validate import excerpt

from traceparse_plugins.readers.chrome_json import Event, what, where

#: The export layout version this reader understands (plugins/exporters/chrome.py EXPORT_VERSION).
EXPORT_VERSION = 1
_MARKER = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\{\s*"traceparse"\s*:')
#: Columns as read from JSON (enums as text; conform() checks and casts them).
_READ_SCHEMA = {c: (pl.String if isinstance(t, pl.Enum) else t) for c, t in DTYPES.items() if c != "trace_id"}


def is_export(head: bytes) -> bool:
    """True when the document's first key is ``"traceparse"``."""
    return bool(_MARKER.match(head))


class ExportArgs(msgspec.Struct):
    traceparse: msgspec.Raw = msgspec.Raw()


class _ExportDocument(msgspec.Struct):
    traceparse: dict[str, Any]
    traceEvents: list[Event[ExportArgs]] = []
    traceparseRows: list[msgspec.Raw] = []
    traceparseNonFinite: list[tuple[int, str, str]] = []


#: An export is read whole; a gzip that inflates past this many times its size (and past 256 MiB) is refused.
MAX_INFLATION = 100


def _read_bounded(f, path: Path) -> bytes:
    """The whole (decompressed) content, refusing a gzip bomb before it fills memory."""
    limit = max(256 << 20, MAX_INFLATION * path.stat().st_size)
    pieces, size = [], 0
    while True:
        piece = f.read(8 << 20)
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > limit:
            raise bad_input(path, None, f"decompresses to more than {limit >> 20} MiB ({MAX_INFLATION}× its size): "
                                        "refused as a compression bomb")
        pieces.append(piece)


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


def read_export(path: Path, options: ReadOptions) -> Trace:
    """Read a traceparse Chrome export back into its rows, metadata, tags and devices."""
    with open_binary(path) as f:
        try:
            data = _read_bounded(f, path)
        except (OSError, EOFError) as exc:
            raise bad_input(path, None, f"cannot be read (truncated gzip?): {exc}") from None
    options.progress(path.stat().st_size)
    try:
        doc = msgspec.json.decode(data, type=_ExportDocument)
    except msgspec.ValidationError as exc:
        raise bad_input(path, where(str(exc)), f"not a traceparse Chrome export: {what(str(exc))}") from None
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
    info = _part(path, header, "trace", dict, "an object")
    meta = TraceMeta(tool=_text(info.get("tool")), tool_version=_text(info.get("tool_version")),
                     variant=f"traceparse chrome export (layout {version}) of a {_text(info.get('format')) or '?'} "
                             "trace")
    meta.tags.update({str(k): str(v) for k, v in _part(path, info, "tags", dict, "an object").items()})
    known = set(Device.__dataclass_fields__) - {"extra"}
    devices = _part(path, info, "devices", list, "a list")
    for i, d in enumerate(devices):
        if not isinstance(d, dict):
            raise bad_input(path, f"traceparse.trace.devices[{i}]",
                            f"expected an object of device properties, got {type(d).__name__}")
    # the values themselves are checked with every reader's devices (traceparse.validate.validate_devices)
    meta.devices = [Device(**{k: v for k, v in d.items() if k in known},
                           extra=d["extra"] if isinstance(d.get("extra"), dict) else {}) for d in devices]
    meta.extra.update({"source_format": info.get("format"), "source_variant": info.get("variant"),
                       "source_trace_id": info.get("id"), "source_paths": info.get("source_paths")})
    return Trace(events, meta)


def _part(path: Path, parent: dict, key: str, kind: type, said: str):
    """``parent[key]`` of the export's header when it is of ``kind`` (empty when absent); else a one-line error
    naming it (``tags`` a list, ``devices`` an int, ``trace`` a list)."""
    value = parent.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        where = "traceparse" + ("" if key == "trace" else ".trace") + f".{key}"
        raise bad_input(path, where, f"expected {said}, got {type(value).__name__} {excerpt(value)}")
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


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
            raise bad_input(path, f"embedded row {i}", f"not a traceparse row: {what(str(exc))}") from None


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
            events.append(msgspec.json.decode(line, type=Event[ExportArgs]))
        except (msgspec.DecodeError, msgspec.ValidationError):
            break
    kept = sum(1 for e in events if e.args is not None and bytes(e.args.traceparse))
    if kept == 0:
        raise bad_input(path, None, "the file ends before its first complete event (truncated file?)")
    options.incomplete(f"{path}: the file ends early (truncated); kept the {kept} complete timeline rows "
                       f"(aggregated rows and counters, stored after the timeline, are lost)")
    return _ExportDocument(traceparse=header["traceparse"], traceEvents=events)
