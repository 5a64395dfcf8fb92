"""One msgspec event struct and one streaming decoder for Chrome Trace Event JSON.

The file is read in chunks of the ``traceEvents`` array (object form
``{"traceEvents": [...]}``, or array form ``[...]``, whose closing bracket the
format lets writers leave out), so memory stays bounded by the chunk size
however large the file is: each chunk is cut at an event boundary (the
prefix that decodes as a list of events) and decoded with msgspec into
:class:`Event` structs holding only the fields a reader keeps. A file cut
short (JSON or gzip stream) keeps its complete events and warns.

Hostile input (see :class:`_Guarded`): a path that is not a regular file is
refused in one line before it is opened; JSON nested deeper than msgspec
reads is refused in one line; bytes that are not UTF-8 are replaced by
U+FFFD and counted in one warning. Memory stays bounded: a run of whitespace
(a gzip bomb of spaces) is collapsed as it streams, events may be separated
by any amount of whitespace, and an event longer than :data:`MAX_EVENT_BYTES`
(or 8 chunks) is refused rather than buffered.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, TypeVar

import msgspec
import polars as pl

from traceparse import units
from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary

CHUNK_BYTES = 8 * 1024 * 1024  # peak memory grows with it; speed hardly does (benchmarks/)
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
MAX_EVENT_BYTES = 64 * 1024 * 1024  # one event longer than this (or than 8 chunks) is refused, not buffered
_JSON_BLANK = b" \t\r\n"
_NEXT_EVENT = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{")

A = TypeVar("A")


class Event(msgspec.Struct, Generic[A], gc=False):
    """One trace event: the fields every Chrome trace has; ``args`` typed by the reader (``Event[MyArgs]``).

    ``ts`` and ``dur`` stay raw JSON text, converted exactly by :func:`times_ns`.
    """

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    args: A | None = None


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while millions of acyclic objects are made.

    Decoding creates one struct per event; with the collector running, its
    passes over them cost more than the decoding itself.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def where(message: str, offset: int = 0) -> str:
    """The record a msgspec validation message points at: ``traceEvents[N].field``."""
    m = re.search(r"at `\$(?:\.traceEvents)?\[(\d+)\]([^`]*)`", message)
    if m:
        return f"traceEvents[{offset + int(m.group(1))}]{m.group(2)}"
    m = re.search(r"at `\$([^`]*)`", message)
    if m and m.group(1):
        return m.group(1).lstrip(".")
    return f"traceEvents[{offset}...]"


def what(message: str) -> str:
    """A msgspec message without its location."""
    return message.split(" - at ")[0]


# -- times ---------------------------------------------------------------------------------------------------
def times_ns(raw: pl.Series) -> pl.Series:
    """Raw JSON times in decimal microseconds -> exact integer ns (:mod:`traceparse.units`, half to even).

    An absent or ``null`` field gives null; a quoted number is read as the
    number. Raises :class:`traceparse.units.NumberError` at the first value
    that is not a number.
    """
    text = raw.cast(pl.String).str.strip_chars(" \t\r\n").str.strip_chars('"')
    text = pl.select(pl.when(text.is_in(["", "null"])).then(None).otherwise(text)).to_series()
    return units.column_to_int(text, "us", to="ns")


def time_ns(raw: msgspec.Raw | bytes) -> int | None:
    """One raw JSON time in decimal microseconds -> exact integer ns; None when absent or null (ValueError if bad)."""
    text = bytes(raw).decode("utf-8", errors="replace").strip().strip('"')
    if not text or text == "null":
        return None
    return units.to_int(text, "us", to="ns")


# -- the streaming decoder -----------------------------------------------------------------------------------
def stream_events(path: Path, options: ReadOptions, event_type: type, document_type: type, *,
                  chunk_bytes: int = CHUNK_BYTES, label: str = "Chrome trace", array_form: bool = True,
                  on_document: Callable[[Any], None] | None = None) -> Iterator[tuple[int, list]]:
    """Decode the events of ``path`` chunk by chunk; yield ``(index of the first event, events)``.

    ``event_type`` is an :class:`Event` specialisation; ``document_type`` a
    struct with ``traceEvents: list[event_type]`` and whatever top-level keys
    the reader keeps. ``on_document`` receives the document decoded from the
    keys before the array, and again from the keys after it once the end is
    reached (object form only). ``label`` names the format in errors;
    ``array_form`` accepts a bare ``[...]`` array of events.
    """
    check_file(path)
    repairs: list[int] = [0]  # invalid UTF-8 sequences replaced, over the whole file
    events_decoder = _Guarded(msgspec.json.Decoder(list[event_type]), path, repairs)
    document_decoder = _Guarded(msgspec.json.Decoder(document_type), path, repairs)
    max_event = max(MAX_EVENT_BYTES, 8 * chunk_bytes)
    with open_binary(path) as f:
        reader = _ChunkReader(f, chunk_bytes, options, path)
        head, events_start, form = reader.find_array(label, array_form)
        if form == "object" and on_document is not None:
            on_document(_decode_document(path, document_decoder, head + b'"traceEvents": []}', "the header", label))
        buf = bytearray(b"[") + events_start  # always "[" followed by whole events from index 1
        offset = 0  # index within traceEvents of the first event in buf
        while True:
            more = reader.read()
            if more is None:
                break
            if not more.translate(None, _JSON_BLANK):  # only whitespace: insignificant between JSON tokens
                if buf[-1:] != b" ":
                    buf += b" "
                continue
            buf += more
            split = _split_events(path, events_decoder, buf, offset)
            if split is None:
                if len(buf) > max_event:
                    raise bad_input(path, f"traceEvents[{offset}]",
                                    f"an event longer than {max_event >> 20} MiB: not a trace traceparse reads")
                continue
            events, cut = split
            start = buf.find(b"{", cut)
            del buf[1: start if start > 0 else len(buf)]
            yield offset, events
            offset += len(events)
            del events
        events, document = _decode_tail(path, events_decoder, document_decoder, bytes(buf[1:]), offset, options,
                                        reader.truncated, form)
        if document is not None and on_document is not None:
            on_document(document)
        if repairs[0]:
            options.warn(f"{path}: {repairs[0]} byte sequence{'s' if repairs[0] != 1 else ''} not valid UTF-8; "
                         "read as U+FFFD (the replacement character)")
        yield offset, events  # the last events (maybe none: a reader may still want its empty batch)


def check_file(path: Path) -> None:
    """Refuse, in one line, a path that is not a regular file (a directory, a FIFO, a device)."""
    try:
        if path.is_dir():
            raise bad_input(path, None, "a directory, not a file: give the trace file itself")
        if not path.is_file():
            raise bad_input(path, None, "not a regular file" if path.exists() else "no such file")
    except OSError as exc:
        raise bad_input(path, None, f"cannot be read: {exc.strerror or exc}") from None


class _Guarded:
    """A msgspec decoder that turns the hostile cases into one-line errors or counted repairs.

    * JSON nested deeper than msgspec's limit (RecursionError) -> a one-line :class:`InputError`;
    * bytes that are not UTF-8 (UnicodeDecodeError) -> decoded again with each bad sequence replaced by
      U+FFFD, counted in ``repairs[0]`` for one warning per file.
    msgspec's ValidationError and DecodeError pass through, for the caller to place.
    """

    def __init__(self, decoder: msgspec.json.Decoder, path: Path, repairs: list[int]):
        self.decoder, self.path, self.repairs = decoder, path, repairs

    def decode(self, data: bytes):
        try:
            return self.decoder.decode(data)
        except RecursionError:
            raise bad_input(self.path, None, "JSON nested too deeply to read (deeper than any trace is)") from None
        except UnicodeDecodeError:
            pass
        fixed = bytes(data).decode("utf-8", errors="replace")
        self.repairs[0] += fixed.count("\ufffd") - bytes(data).count("\ufffd".encode())
        try:
            return self.decoder.decode(fixed.encode())
        except RecursionError:
            raise bad_input(self.path, None, "JSON nested too deeply to read (deeper than any trace is)") from None


class _ChunkReader:
    """Reads the (decompressed) file in chunks, noting a gzip stream cut short."""

    def __init__(self, f, chunk_bytes: int, options: ReadOptions, path: Path):
        self.f, self.chunk_bytes, self.options, self.path = f, chunk_bytes, options, path
        self.truncated = False
        self.raw = getattr(f, "fileobj", None) or f  # the compressed file, for progress in its bytes
        self.pos = 0

    def read(self) -> bytes | None:
        """The next chunk of (decompressed) content, None at the end.

        Reads in small steps so that a gzip stream cut short still yields
        everything before the cut.
        """
        pieces, size = [], 0
        while size < self.chunk_bytes and not self.truncated:
            try:
                piece = self.f.read1(min(1 << 20, self.chunk_bytes - size))
            except EOFError:
                self.truncated = True
                break
            except OSError as exc:
                raise bad_input(self.path, None, f"cannot be read: {exc}") from None
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
        data = b"".join(pieces)
        raw_pos = self.raw.tell()
        self.options.progress(raw_pos - self.pos)
        self.pos = raw_pos
        return data or None

    def find_array(self, label: str, array_form: bool) -> tuple[bytes, bytes, str]:
        """(the document before ``"traceEvents"``, the bytes after its ``[``, ``"object"`` or ``"array"``)."""
        buf = b""
        while True:
            data = self.read()
            if data is None:
                raise bad_input(self.path, None, f'not a {label}: no "traceEvents" array found')
            buf += data
            stripped = buf.lstrip(b" \t\r\n\xef\xbb\xbf")
            if array_form and stripped.startswith(b"["):
                return b"", stripped[1:], "array"
            m = _ARRAY_START.search(buf)
            if m:
                return buf[: m.start()], buf[m.end():], "object"
            if len(buf) > 64 * 1024 * 1024:
                raise bad_input(self.path, None, f'not a {label}: no "traceEvents" array in the first 64 MiB')


def _split_events(path: Path, decoder: _Guarded, buf: bytearray, offset: int) -> tuple[list, int] | None:
    """Decode the longest run of whole events in ``buf`` (which starts with ``[``); return them and where they end.

    A candidate end is a ``}`` followed by ``,`` and ``{`` (whitespace
    allowed). It is a real event boundary exactly when ``buf[:end] + "]"``
    decodes as a list: inside a string or a nested object the brackets would
    not balance. In practice the last candidate is the one. The ``]`` is
    written over the byte after the candidate for the attempt and put back.
    """
    pos = len(buf)
    for _ in range(1000):
        pos = buf.rfind(b"}", 1, pos)
        if pos < 0:
            return None
        if not _NEXT_EVENT.match(buf, pos + 1):  # "}" then "," then "{", any whitespace between
            continue
        saved = buf[pos + 1]
        buf[pos + 1] = ord("]")
        try:
            with memoryview(buf) as view:
                chunk = bytes(view[: pos + 2])  # decoded Raw values point into it: buf must stay resizable
            with gc_paused():
                return decoder.decode(chunk), pos + 1
        except msgspec.ValidationError as exc:
            raise bad_input(path, where(str(exc), offset), f"unexpected value in a trace event: {what(str(exc))}") \
                from None
        except msgspec.DecodeError:
            continue
        finally:
            buf[pos + 1] = saved
    return None


def _decode_document(path: Path, decoder: _Guarded, data: bytes, where_: str, label: str):
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise bad_input(path, where_, f"unexpected value: {exc}") from None
    except msgspec.DecodeError:
        raise bad_input(path, where_, f"not valid JSON: this is not a {label}") from None


def _decode_tail(path: Path, events_decoder, document_decoder, buf: bytes, offset: int, options: ReadOptions,
                 truncated: bool, form: str) -> tuple[list, Any]:
    """Decode the last events (and, in object form, the keys after the array); salvage a file cut short."""
    try:
        with gc_paused():
            if form == "object":
                document = document_decoder.decode(b'{"traceEvents": [' + buf)
                return document.traceEvents, document
            return events_decoder.decode(b"[" + buf), None
    except msgspec.ValidationError as exc:
        raise bad_input(path, where(str(exc), offset), f"unexpected value in a trace event: {what(str(exc))}") \
            from None
    except msgspec.DecodeError:
        pass
    if form == "array" and not truncated:
        try:  # the format allows leaving out the final ]
            with gc_paused():
                return events_decoder.decode(b"[" + buf.rstrip().rstrip(b",") + b"]"), None
        except msgspec.ValidationError as exc:
            raise bad_input(path, where(str(exc), offset), f"unexpected value in a trace event: {what(str(exc))}") \
                from None
        except msgspec.DecodeError:
            pass
    split = _split_events(path, events_decoder, bytearray(b"[") + buf, offset)
    if split is not None:
        events = split[0]
    else:
        try:  # the last complete event may be the only one left
            events = events_decoder.decode(b"[" + buf.rstrip().rstrip(b",") + b"]")
        except msgspec.DecodeError:
            events = []
    kept = offset + len(events)
    if kept == 0:
        raise bad_input(path, None, "the trace ends before its first complete event (truncated file?)")
    options.warn(f"{path}: the file ends early (truncated{' gzip stream' if truncated else ' JSON'}); "
                 f"kept the {kept} complete events")
    return events, None
