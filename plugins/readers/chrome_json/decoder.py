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

import codecs
import gc
import os
import re
import threading
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import msgspec
import polars as pl

from traceparse import units
from traceparse.cores import usable_cores as _cores
from traceparse.errors import InputError, TraceparseError, bad_input
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary

CHUNK_BYTES = 8 * 1024 * 1024  # peak memory grows with it; speed hardly does (benchmarks/)
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
MAX_EVENT_BYTES = 64 * 1024 * 1024  # one event longer than this (or than 8 chunks) is refused, not buffered
_JSON_BLANK = b" \t\r\n"


def _append(buf: bytearray, more: bytes) -> bool:
    """Add a chunk read from the file to ``buf``; False when it held only whitespace, which is insignificant
    between JSON tokens and kept as one space (a run of blank chunks never grows the buffer)."""
    if more.isspace() and not more.translate(None, _JSON_BLANK):  # isspace stops at the first other byte
        if buf[-1:] != b" ":
            buf += b" "
        return False
    buf += more
    return True
_NEXT_EVENT = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{")
_NEXT_KEYED_EVENT = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{(?=[ \t\r\n]*\")")
#: a time as profilers write it: up to 15 integer and 3 decimal digits (microseconds to nanoseconds, exactly)
_SIMPLE_TIME = r"^([0-9]{1,15})(?:\.([0-9]{1,3}))?$"

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
    passes over them cost more than the decoding itself. Threads that decode
    at once share one pause: the collector runs again when the last one is done.
    """
    with _GC_LOCK:
        if _GC_PAUSES[0] == 0:
            _GC_PAUSES[1] = gc.isenabled()
            gc.disable()
        _GC_PAUSES[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSES[0] -= 1
            if _GC_PAUSES[0] == 0 and _GC_PAUSES[1]:
                gc.enable()


_GC_LOCK = threading.Lock()
_GC_PAUSES = [0, False]  # pauses under way, whether the collector ran before the first


def where(message: str, offset: int = 0) -> str:
    """The record a msgspec validation message points at: ``traceEvents[N].field``."""
    m = re.search(r"at `\$(?:\.traceEvents)?\[(\d+)\]([^`]*)`", message)
    if m:
        return f"traceEvents[{offset + int(m.group(1))}]{m.group(2)}"
    m = re.search(r"at `\$([^`]*)`", message)
    if m and m.group(1):
        return m.group(1).lstrip(".")
    return f"traceEvents[{offset}...]"


def unexpected(path: Path, message: str, offset: int = 0) -> Exception:
    """The one-line error for a msgspec validation ``message``: where, and what was unexpected, in a trace event
    or in a key of the document beside ``traceEvents`` (``"with_flops": true`` where an integer was expected)."""
    place = where(message, offset)
    whose = "a trace event" if place.startswith("traceEvents[") else "the document's keys"
    return bad_input(path, place, f"unexpected value in {whose}: {what(message)}")


def what(message: str) -> str:
    """A msgspec message without its location."""
    return message.split(" - at ")[0]


# -- times ---------------------------------------------------------------------------------------------------
def times_ns(raw: pl.Series) -> pl.Series:
    """Raw JSON times in decimal microseconds -> exact integer ns (:mod:`traceparse.units`, half to even).

    An absent or ``null`` field gives null; a quoted number is read as the
    number. Raises :class:`traceparse.units.NumberError` at the first value
    that is not a number. Times as profilers write them (at most 15 integer
    and 3 decimal digits, no sign or exponent) are converted in one vectorized
    step (one query: a small file's few times cost what a query costs); any other cell goes through
    :func:`traceparse.units.column_to_int`, which gives the same integer for the common ones.
    """
    return _times_ns(raw.to_frame("raw").lazy(), raw.name)


def _times_ns(frame: pl.LazyFrame, name: str) -> pl.Series:
    """:func:`times_ns` of the column ``raw`` of ``frame`` (String or Binary), named ``name``."""
    text = pl.col("raw").cast(pl.String).str.strip_chars(" \t\r\n").str.strip_chars('"')
    text = pl.when(text.is_in(["", "null"])).then(None).otherwise(text)
    parts = pl.col("text").str.extract_groups(_SIMPLE_TIME).struct
    fast = parts.field("1").cast(pl.Int64) * 1000 + parts.field("2").str.pad_end(3, "0").cast(pl.Int64).fill_null(0)
    out = frame.select(text=text).with_columns(fast=fast).with_columns(
        todo=pl.col("text").is_not_null() & pl.col("fast").is_null()).collect()
    if not out["todo"].any():
        return out["fast"].alias(name)
    todo = out["todo"].arg_true()
    try:
        slow = units.column_to_int(out["text"].gather(todo), "us", to="ns")
    except units.NumberError as exc:
        raise units.NumberError(int(todo[exc.index]), exc.text, exc.reason) from None
    return out["fast"].scatter(todo, slow).alias(name)


def raw_times_ns(raws: Sequence[msgspec.Raw]) -> pl.Series:
    """:func:`times_ns` of decoded ``msgspec.Raw`` values, joined into one buffer (no bytes object per event)."""
    if not raws:
        return pl.Series([], dtype=pl.Int64)
    if len(raws) <= SMALL_TIMES:
        small = _small_times_ns(raws)
        if small is not None:
            return small
    joined = b"\x00".join(raws)  # NUL cannot appear in a JSON value: it separates them
    if joined.count(b"\x00") == len(raws) - 1:
        try:
            text = joined.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            frame = pl.LazyFrame({"raw": [text]}, schema={"raw": pl.String})
            return _times_ns(frame.select(pl.col("raw").str.split("\x00").explode()), "")
    return times_ns(pl.Series(list(map(bytes, raws)), dtype=pl.Binary))


#: At most this many times are converted in Python (:func:`_small_times_ns`): a small file's few times, where a
#: polars query costs more than the conversion.
SMALL_TIMES = 256
_SIMPLE_TIME_RE = re.compile(r"([0-9]{1,15})(?:\.([0-9]{1,3}))?")


def _small_times_ns(raws: Sequence[msgspec.Raw]) -> pl.Series | None:
    """:func:`raw_times_ns` of a few times, each read as the vectorized step reads it (the same stripping, the
    same pattern, the same integer); None when one is not UTF-8 or not written as profilers write times (the
    vectorized path, and :func:`traceparse.units.column_to_int`, read it then)."""
    out = []
    for raw in raws:
        try:
            text = bytes(raw).decode("utf-8").strip(" \t\r\n").strip('"')
        except UnicodeDecodeError:
            return None
        if text in ("", "null"):
            out.append(None)
            continue
        m = _SIMPLE_TIME_RE.fullmatch(text)
        if m is None:
            return None
        out.append(int(m.group(1)) * 1000 + (int(m.group(2).ljust(3, "0")) if m.group(2) else 0))
    return pl.Series("", out, dtype=pl.Int64)


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
        if form == "object":
            _check_header(path, head, label, repairs, document_decoder if on_document is not None else None,
                          on_document)
        buf = bytearray(b"[") + events_start  # always "[" followed by whole events from index 1
        offset = 0  # index within traceEvents of the first event in buf
        while True:
            more = reader.read()
            if more is None:
                break
            if not _append(buf, more):
                continue
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
    * bytes that are not UTF-8 (:func:`not_utf8`) -> decoded again with each bad sequence replaced by
      U+FFFD, counted in ``repairs[0]`` for one warning per file.
    msgspec's ValidationError and DecodeError pass through, for the caller to place.
    """

    def __init__(self, decoder: msgspec.json.Decoder, path: Path, repairs: list[int]):
        self.decoder, self.path, self.repairs = decoder, path, repairs

    def decode(self, data: bytes, count: bool = True):
        """``data`` decoded; its bad UTF-8 sequences counted in ``repairs`` once it decodes, unless ``count`` is
        false (an attempt among several over the same bytes, whose caller counts the one it keeps:
        :func:`_split_events`)."""
        try:
            if is_utf8(data):  # msgspec checks the strings it decodes, not the values it keeps raw
                return self.decoder.decode(data)
        except RecursionError:
            raise bad_input(self.path, None, "JSON nested too deeply to read (deeper than any trace is)") from None
        except UnicodeDecodeError:
            pass
        except msgspec.DecodeError as exc:  # msgspec 0.23 and later say so in a DecodeError
            if not not_utf8(exc):
                raise
        fixed = bytes(data).decode("utf-8", errors="replace")
        try:
            decoded = self.decoder.decode(fixed.encode())
        except RecursionError:
            raise bad_input(self.path, None, "JSON nested too deeply to read (deeper than any trace is)") from None
        if count:  # a document that does not decode is not counted: it is tried again in parts
            self.repairs[0] += bad_sequences(data)
        return decoded


def not_utf8(exc: Exception) -> bool:
    """Whether msgspec refused the bytes as not UTF-8: a UnicodeDecodeError before msgspec 0.23, a DecodeError
    ("Invalid UTF-8 encoded string") from 0.23 on, where a syntax error is a DecodeError too."""
    return isinstance(exc, UnicodeDecodeError) or (isinstance(exc, msgspec.DecodeError) and "UTF-8" in str(exc))


def is_utf8(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is UTF-8 throughout, raw values too (an operator's ``Input type`` or ``Concrete Inputs``,
    kept as ``msgspec.Raw`` unchecked): a bad byte there reached the columns and stopped the read."""
    whole = data.obj if isinstance(data, memoryview) else data  # a chunk's view: its document, ASCII around it
    if whole.isascii():
        return True
    try:
        codecs.utf_8_decode(data, "strict", True)
    except UnicodeDecodeError:
        return False
    return True


def bad_sequences(data: bytes | bytearray | memoryview) -> int:
    """How many byte sequences of ``data`` are not UTF-8 (each read as one U+FFFD)."""
    raw = bytes(data)
    return raw.decode("utf-8", errors="replace").count("\ufffd") - raw.count("\ufffd".encode())


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

    def check_rest(self) -> None:
        """Read the rest of a compressed file, raising its stream's own error if it is damaged (a CRC mismatch
        at its end, bad deflate data): the garbage a damaged stream decompresses into fails to decode before
        the damage shows, and the damage is what to report, as reading it whole first would (the file read in
        one chunk). A stream cut short, or an uncompressed file, is left as it is."""
        if getattr(self.f, "fileobj", None) is None:
            return
        while not self.truncated and self.read() is not None:
            pass

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


def _split_events(path: Path, decoder: _Guarded, buf: bytearray, offset: int, *,
                  raise_validation: bool = False) -> tuple[list, int] | None:
    """Decode the longest run of whole events in ``buf`` (which starts with ``[``); return them and where they end.

    A candidate end is a ``}`` followed by ``,`` and ``{`` (whitespace
    allowed). It is a real event boundary exactly when ``buf[:end] + "]"``
    decodes as a list: inside a string or a nested object the brackets would
    not balance. In practice the last candidate is the one, tried first. When
    it is not (a name holding ``},{``), the real boundaries are found in one
    pass over the buffer (:func:`event_ends`) and the last one whose events
    decode is found by bisection: the work is linear in the buffer whatever
    the names hold (trying candidate after candidate, each a decode of the
    whole buffer, took 361 s on a 17 KB gzip).
    """
    pos = buf.rfind(b"}", 1)
    while pos > 0 and not _NEXT_EVENT.match(buf, pos + 1):  # "}" then "," then "{", any whitespace between
        pos = buf.rfind(b"}", 1, pos)
    if pos < 0:
        return None
    tried = _decode_prefix(path, decoder, buf, pos + 1, offset, raise_validation)
    if tried is None:
        ends = [end for end, _ in event_ends(buf) if end < pos + 1]
        lo, hi = 0, len(ends) - 1
        while lo <= hi:  # the events before a real boundary decode unless a damaged one is among them: monotone
            mid = (lo + hi) // 2
            attempt = _decode_prefix(path, decoder, buf, ends[mid], offset, raise_validation)
            if attempt is None:
                hi = mid - 1
            else:
                tried, lo = attempt, mid + 1
    if tried is not None:  # the bad UTF-8 of the events kept, counted once (not at every attempt of the search)
        decoder.repairs[0] += bad_sequences(memoryview(buf)[: tried[1]])
    return tried


def _decode_prefix(path: Path, decoder: _Guarded, buf: bytearray, end: int, offset: int,
                   raise_validation: bool) -> tuple[list, int] | None:
    """The events of ``buf[:end]`` (``end`` just after an event's ``}``), or None when they do not decode.

    The ``]`` is written over the byte at ``end`` for the attempt and put back.
    """
    saved = buf[end]
    buf[end] = ord("]")
    try:
        with memoryview(buf) as view:
            chunk = bytes(view[: end + 1])  # decoded Raw values point into it: buf must stay resizable
        with gc_paused():
            return decoder.decode(chunk, count=False), end
    except msgspec.ValidationError as exc:
        if raise_validation:  # a worker's chunk: the caller knows the offset
            raise
        raise unexpected(path, str(exc), offset) from None
    except msgspec.DecodeError:
        return None
    finally:
        buf[end] = saved


#: The tokens that matter for nesting: a whole JSON string (escapes and all), a bracket, or a quote that opens a
#: string the buffer does not close.
_TOKENS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[][{}]|"')  # possessive: an unclosed string fails in one pass


def event_ends(buf: bytes | bytearray, start: int = 1) -> list[tuple[int, int]]:
    """The real event boundaries of an event array's bytes: ``(end of an event, start of the next)`` each.

    ``buf[start:]`` is inside the array, between events (after its ``[``). One pass of a tokenizer that skips
    whole strings (the regular expression engine walks a string's bytes, not Python), counting nesting: an
    event ends where its ``}`` brings the depth back to the array's, and a boundary is such an end followed by
    ``,`` and ``{``. Stops at the array's ``]`` or at a string the buffer does not close. Linear in the buffer,
    whatever its strings hold.
    """
    return _scan(buf, start)[0]


def _scan(buf: bytes | bytearray, start: int = 1) -> tuple[list[tuple[int, int]], bool]:
    """:func:`event_ends`, and whether the scan stopped at a string the buffer does not close."""
    out, depth = [], 0
    for m in _TOKENS.finditer(buf, start):
        token = m.group()
        first = token[:1]
        if first == b'"':
            if len(token) == 1:  # a string that does not end in the buffer
                return out, True
            continue
        if first in b"{[":
            depth += 1
            continue
        depth -= 1
        if depth < 0:  # the array's own "]"
            break
        if depth == 0 and first == b"}":
            nxt = _NEXT_EVENT.match(buf, m.end())
            if nxt:
                out.append((m.end(), nxt.end() - 1))
    return out, False


def _check_header(path: Path, head: bytes, label: str, repairs: list[int], decoder: _Guarded | None,
                  on_document: Callable[[Any], None] | None) -> None:
    """The document's keys before ``"traceEvents"`` (``head``), decoded as the reader's document and handed to
    ``on_document``; or, where the reader keeps none of them, checked to be JSON all the same: a Kineto file whose
    ``"deviceProperties"`` key was lost (``{ {...}, ...``) was read as a plain Chrome trace, its kernels as host
    ranges, and "no GPU activity" said of a trace of 200 kernels. The error names the line."""
    data = head + b'"traceEvents": []}'
    if decoder is None:
        decoder = _Guarded(msgspec.json.Decoder(), path, repairs)
    try:
        document = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise bad_input(path, "the header", f"unexpected value: {exc}") from None
    except msgspec.DecodeError as exc:
        found = re.search(r"\(byte (\d+)\)", str(exc))
        line = head[: int(found.group(1))].count(b"\n") + 1 if found and int(found.group(1)) < len(head) else None
        detail = str(exc).split(" (byte ")[0]
        raise bad_input(path, line if line is not None else "the header",
                        f'the keys before "traceEvents" are not valid JSON ({detail}); a {label} is one JSON '
                        "document") from None
    if on_document is not None:
        on_document(document)


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
        raise unexpected(path, str(exc), offset) from None
    except msgspec.DecodeError:
        pass
    if form == "array" and not truncated:
        try:  # the format allows leaving out the final ]
            with gc_paused():
                return events_decoder.decode(b"[" + buf.rstrip().rstrip(b",") + b"]"), None
        except msgspec.ValidationError as exc:
            raise unexpected(path, str(exc), offset) from None
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
    options.incomplete(f"{path}: the file ends early (truncated{' gzip stream' if truncated else ' JSON'}); "
                       f"kept the {kept} complete events")
    return events, None


# -- the parallel decoder ------------------------------------------------------------------------------------
class EventError(Exception):
    """A bad value in one event, found while converting decoded events: the decoder names the record.

    ``index`` is the event's position in the list handed to the converter,
    ``field`` what follows ``traceEvents[N]`` in the message (``".ts"``), and
    ``expected`` the rest of the one-line message.
    """

    def __init__(self, index: int, field: str, expected: str):
        super().__init__(index, field, expected)
        self.index, self.field, self.expected = index, field, expected

    def at(self, path: Path, offset: int) -> Exception:
        """The one-line :class:`InputError` for the event, ``offset`` events into ``traceEvents``."""
        return bad_input(path, f"traceEvents[{offset + self.index}]{self.field}", self.expected)


#: Chunks in flight per worker (decoded or being decoded, not yet written): memory is bounded by
#: ``max(2, workers * IN_FLIGHT_PER_WORKER)`` chunks of raw bytes and of rows, plus the one being written.
IN_FLIGHT_PER_WORKER = 2
#: Fewest cores on which a large trace is decoded in worker processes by default (see :func:`decode_workers`).
MIN_CORES = 4
#: Most worker processes chosen by default: the fastest count measured on 16 cores (see :func:`decode_workers`).
MAX_DEFAULT_WORKERS = 4
_MISPLIT = "misplit"


def decode_workers(path: Path, chunk_bytes: int, requested: int | None = None) -> int:
    """How many worker processes decode ``path`` (0: this process decodes it alone).

    ``requested`` (the ``workers`` reader parameter), else ``$TRACEPARSE_DECODE_WORKERS``, else: one fewer
    than the cores, at most :data:`MAX_DEFAULT_WORKERS` (this process reads, cuts, validates and writes, so
    more workers wait on it), on a machine of :data:`MIN_CORES` cores or more, for a file of at least 4
    chunks. A smaller file, or a smaller machine, is decoded here: on 2 cores a decoding worker beside this
    process was measured slower (26.6 s against 22.9 s, median of 3 alternating runs on a loaded box), with
    1.3× the CPU and 1.7× the memory. On the 16-core GPU machine (benchmarks/bench_workers.py, the 139 MB
    trace, median of 3): 0 workers 4.56 s, 1 5.73 s, 2 4.17 s, 4 3.21 s, 8 3.59 s, 16 3.96 s, at 399 MB,
    1.5 GB, 2.4 GB and 3.6 GB for 0, 4, 8 and 16.
    """
    requested = _requested(requested, "TRACEPARSE_DECODE_WORKERS")
    if requested is not None:
        return requested
    cores = _cores()
    if cores < MIN_CORES or content_bytes(path) < 4 * chunk_bytes:
        return 0
    return min(cores - 1, MAX_DEFAULT_WORKERS)


def decode_threads(workers: int, requested: int | None = None) -> int:
    """How many threads of this process decode chunks when no worker process does (0: the reading thread).

    ``requested`` (the ``threads`` reader parameter), else ``$TRACEPARSE_DECODE_THREADS``, else 2 on a machine
    of 2 cores or more: two threads decode the next chunks while this one validates and hands on the last
    (Arrow's parse and polars' work run without the interpreter's lock, so they overlap). With one decoding
    thread that thread was the critical path on 2 cores (17 chunks of the 139 MB benchmark trace at about
    100 ms each, one after the other, while this thread and the Parquet writer mostly waited).
    """
    if workers > 0:
        return 0
    requested = _requested(requested, "TRACEPARSE_DECODE_THREADS")
    if requested is not None:
        return requested
    return 2 if _cores() >= 2 else 0


def _requested(requested: int | None, variable: str) -> int | None:
    """The count asked for: the reader parameter, else the environment ``variable`` (digits only), else None."""
    if requested is None and os.environ.get(variable, "").strip().isdigit():
        requested = int(os.environ[variable])
    return None if requested is None else max(0, int(requested))


def content_bytes(path: Path) -> int:
    """The (uncompressed) size of the file's content: a gzip file's trailer says it (modulo 4 GiB)."""
    try:
        if not path.is_file():  # a FIFO or a device is refused later, unopened (check_file)
            return 0
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b" and size >= 18:
                f.seek(-4, os.SEEK_END)
                return max(int.from_bytes(f.read(4), "little"), size * 4)
    except OSError:
        return 0
    return size


def map_chunks(path: Path, options: ReadOptions, event_type: type, document_type: type,
               convert: Callable[[Path, list], Any], *, workers: int, chunk_bytes: int = CHUNK_BYTES,
               label: str = "Chrome trace", array_form: bool = True,
               on_document: Callable[[Any], None] | None = None,
               fast: Callable[[bytes], tuple[Any, int] | None] | None = None,
               threads: int = 0) -> Iterator[tuple[int, Any]]:
    """Decode and convert the events of ``path`` in ``workers`` processes; yield ``(offset, convert(path, events))``.

    The same contract as :func:`stream_events` (and the same errors and
    warnings), with the conversion done where the decoding is: this process
    reads the file and cuts the ``traceEvents`` array into chunks at
    candidate event boundaries (a ``}`` then ``,`` then ``{``) without
    decoding anything; each worker decodes a chunk as a list of events and
    hands it to ``convert`` (a module-level function, so that it pickles;
    it raises :class:`EventError` for a bad event). Results come back in file
    order. A candidate that was no boundary (inside a string, or between
    objects nested in an event) shows as a chunk that does not decode, since
    every chunk starts where the previous one, decoded, ended: it is merged
    with the next chunk and decoded again, so the output never depends on
    where the cuts fell. At most ``max(2, workers * IN_FLIGHT_PER_WORKER)``
    chunks are in flight, which bounds memory.

    ``workers`` 0 decodes in this process: in ``threads`` threads beside the one reading the file (Arrow's
    parse and polars' work let go of the interpreter), or with ``threads`` 0 each chunk when its turn comes;
    the same cuts and results.
    ``fast`` (a module-level function, so that it pickles) is tried first on each chunk but the last: it
    gets the chunk as the document ``{"e":[`` + its bytes (whole events, commas between) + ``]}`` and returns ``(what convert would make, the number
    of events)``, or None to leave the chunk to the decoding and ``convert`` (the careful path).
    """
    check_file(path)
    repairs = [0]
    max_event = max(MAX_EVENT_BYTES, 8 * chunk_bytes)
    spec = (event_type, document_type, convert, str(path), fast)
    pool = _pool(workers, threads)
    limit = max(2, max(workers, threads) * IN_FLIGHT_PER_WORKER)
    with open_binary(path) as f:
        reader = _ChunkReader(f, chunk_bytes, options, path)
        head, rest, form = reader.find_array(label, array_form)
        if form == "object":
            document_decoder = _Guarded(msgspec.json.Decoder(document_type), path, repairs)
            _check_header(path, head, label, repairs, document_decoder if on_document is not None else None,
                          on_document)
        # [data, separator after it, final, future, checked], in file order; data is the chunk as a document
        # (:func:`_wrap`) but for the final chunk, the end of the file as it is
        queue: list[list] = []
        state = {"offset": 0}
        here = _InThisProcess()

        def submit(data: bytes, sep: bytes, final: bool, checked: bool = False, local: bool = False) -> list:
            """A job for the pool, or (``local``: a chunk merged after a cut that was no boundary, perhaps large)
            for this process, which then sends no copy of it to a worker."""
            executor = here if local else pool
            return [data, sep, final, executor.submit(_decode_piece, spec, data, final, form, reader.truncated),
                    checked]

        def take_front() -> Iterator[tuple[int, Any]]:
            data, sep, final, future, checked = queue[0]
            try:
                result = future.result()
            except BrokenProcessPool:
                _POOLS.pop(workers, None)
                raise TraceparseError(f"{path}: a decoding worker process died (out of memory?); "
                                      "TRACEPARSE_DECODE_WORKERS=0 decodes in one process") from None
            if result == _MISPLIT:  # the cut was no boundary: decode this chunk and the next as one
                nxt = queue[1]
                nxt[3].cancel()
                merged = bytes(_events_of(data)) + sep + (nxt[0] if nxt[2] else _events_of(nxt[0]))
                if len(merged) > max_event and not nxt[2]:
                    raise bad_input(path, f"traceEvents[{state['offset']}]",
                                    f"an event longer than {max_event >> 20} MiB: not a trace traceparse reads")
                # cut the merged chunk at its last real boundary, found in one pass (event_ends), so a name full
                # of "},{" costs one scan, not a decode per fake cut; a chunk cut there that still does not decode
                # (damaged JSON) is merged whole, as before. A chunk that ends inside a string (a name of 50 MB)
                # is merged with the next without a decode: none could succeed
                ends, open_string = ([], False) if checked else _scan(merged, 0)
                if ends:
                    end, start = ends[-1]
                    queue[0:2] = [submit(_wrap(merged[:end]), merged[end:start], False, True, local=True),
                                  submit(merged[start:] if nxt[2] else _wrap(merged[start:]), nxt[1], nxt[2])]
                elif open_string and not nxt[2]:
                    queue[0:2] = [[_wrap(merged), nxt[1], False, _Done(_MISPLIT), False]]
                else:
                    queue[0:2] = [submit(merged if nxt[2] else _wrap(merged), nxt[1], nxt[2], local=True)]
                return
            del queue[0]
            yield from _settle(path, options, result, state, repairs, on_document, final)

        buf = bytearray(rest)
        while True:
            more = reader.read()
            if more is None:
                break
            if not _append(buf, more):
                continue
            cut = _last_candidate(buf)
            if cut is None:
                if len(buf) > max_event:
                    raise bad_input(path, f"traceEvents[{state['offset']}...]",
                                    f"an event longer than {max_event >> 20} MiB: not a trace traceparse reads")
                continue
            end, start = cut
            queue.append(submit(*_cut(buf, end, start), False))
            del buf[:start]
            while len(queue) > limit:
                try:
                    yield from take_front()
                except TraceparseError:  # an early chunk's error, the rest unread: a damaged stream says so first
                    reader.check_rest()
                    raise
        # the last events apart from the document's end: the fast path reads them, the careful path only the
        # (small) end. A cut there that was no boundary is merged back whole (as checked), never re-scanned.
        # Without a fast path nothing is gained by the cut: the rest is one chunk (a small file: one batch)
        tail = _last_candidate(buf, buf.rfind(b"]")) if fast is not None else None
        if tail is not None:
            end, start = tail
            queue.append(submit(*_cut(buf, end, start), False, True))
            del buf[:start]
        # the end is decoded here when its turn comes: never ahead of a cut that may yet be merged into it
        queue.append(submit(bytes(buf), b"", True, local=True))
        del buf
        while queue:
            yield from take_front()
    if repairs[0]:
        options.warn(f"{path}: {repairs[0]} byte sequence{'s' if repairs[0] != 1 else ''} not valid UTF-8; "
                     "read as U+FFFD (the replacement character)")


def _cut(buf: bytearray, end: int, start: int) -> tuple[bytes, bytes]:
    """The chunk ``buf[:end]`` as a document (:func:`_wrap`) and the separator ``buf[end:start]``: the chunk's
    bytes copied once, straight into the document."""
    with memoryview(buf) as view:
        return _wrap(view[:end]), bytes(view[end:start])


#: A chunk of events travels as the JSON document ``{"e":[events]}``: Arrow's JSON reader (the torch reader's fast
#: path) reads it as it is, msgspec reads the list inside it (:func:`chunk_list`), and neither needs a copy.
_OPEN, _CLOSE = b'{"e":[', b"]}"


def _wrap(events) -> bytes:
    """The document of a chunk: ``{"e":[`` + the events' bytes + ``]}``, in one copy."""
    return b"".join((_OPEN, events, _CLOSE))


def _events_of(document: bytes) -> memoryview:
    """The events' bytes inside a chunk's document (no copy)."""
    return memoryview(document)[len(_OPEN):-len(_CLOSE)]


def chunk_list(document: bytes) -> memoryview:
    """The JSON list of a chunk's events inside its document: ``[`` + the events + ``]`` (no copy)."""
    return memoryview(document)[len(_OPEN) - 1:1 - len(_CLOSE)]


def _settle(path: Path, options: ReadOptions, result: tuple, state: dict, repairs: list[int],
            on_document: Callable[[Any], None] | None, final: bool) -> Iterator[tuple[int, Any]]:
    """Turn one chunk's result into its output (or its error), now that every chunk before it is settled."""
    status, value, count, repaired, extra = result
    repairs[0] += repaired
    offset = state["offset"]
    if status == "event-error":
        raise value.at(path, offset)
    if status == "validation":
        local, message = value
        raise unexpected(path, message, offset)
    if status == "error":
        raise value
    state["offset"] = offset + count
    if final:
        document, salvaged = extra
        if salvaged is not None:
            kept = offset + count
            if kept == 0:
                raise bad_input(path, None, "the trace ends before its first complete event (truncated file?)")
            options.incomplete(f"{path}: the file ends early (truncated{' gzip stream' if salvaged else ' JSON'}); "
                               f"kept the {kept} complete events")
        if document is not None and on_document is not None:
            on_document(document)
    yield offset, value


def _last_candidate(buf: bytearray, before: int = -1) -> tuple[int, int] | None:
    """(end of the last candidate event boundary in ``buf`` (before ``before`` when that is not -1), start of
    the next event), or None.

    A candidate is a ``}`` followed by ``,`` and ``{`` and a key's ``"`` (any whitespace between): an event
    that has keys comes next (a cut is never made before an empty ``{}``, which a string full of ``},{}``
    would offer millions of times); whether it is a real boundary is settled by decoding.
    """
    pos = len(buf) if before < 0 else before
    for _ in range(1000):
        pos = buf.rfind(b"}", 0, pos)
        if pos < 0:
            return None
        m = _NEXT_KEYED_EVENT.match(buf, pos + 1)
        if m:
            return pos + 1, m.end() - 1
    return None


_DECODERS: dict = {}


def _decoders(event_type: type, document_type: type, path: Path, repairs: list[int]) -> tuple[_Guarded, _Guarded]:
    """This process's decoders for the types (built once per worker), counting repairs into ``repairs``."""
    key = (event_type, document_type)
    if key not in _DECODERS:
        _DECODERS[key] = (msgspec.json.Decoder(list[event_type]), msgspec.json.Decoder(document_type))
    events, document = _DECODERS[key]
    return _Guarded(events, path, repairs), _Guarded(document, path, repairs)


def _decode_piece(spec: tuple, data: bytes, final: bool, form: str, truncated: bool) -> tuple:
    """In a worker: decode one chunk and convert its events.

    Returns ``(status, value, events, repairs, extra)``: status ``"ok"``
    (value: what ``convert`` made), ``"misplit"`` (a plain string: the chunk
    does not decode, its end was no boundary), ``"event-error"`` (value: an
    :class:`EventError`), ``"validation"`` (value: (index, msgspec message)),
    or ``"error"`` (value: a one-line :class:`InputError`). For the final
    chunk ``extra`` is ``(document after the array or None, salvaged)``,
    ``salvaged`` None when the array ended properly, else whether the gzip
    stream was cut short.
    """
    event_type, document_type, convert, path_text, fast = spec
    path = Path(path_text)
    if fast is not None and not final:
        done = fast(data)
        if done is not None:
            value, count = done
            return ("ok", value, count, 0, None)
    repairs = [0]
    events_decoder, document_decoder = _decoders(event_type, document_type, path, repairs)
    extra = None
    try:
        with gc_paused():
            if not final:
                try:
                    events = events_decoder.decode(chunk_list(data))
                except msgspec.ValidationError:  # valid JSON, so a real cut: a wrongly typed value, refused
                    raise
                except msgspec.DecodeError:
                    return _MISPLIT
            else:
                events, document, salvaged = _decode_final(path, events_decoder, document_decoder, data, form,
                                                           truncated)
                if document is not None:
                    document.traceEvents = []  # the events go back as rows, not twice
                extra = (document, salvaged)
            value = convert(path, events)
    except msgspec.ValidationError as exc:
        return ("validation", (None, str(exc)), 0, repairs[0], extra)
    except EventError as exc:
        return ("event-error", exc, 0, repairs[0], extra)
    except InputError as exc:
        return ("error", exc, 0, repairs[0], extra)
    return ("ok", value, len(events), repairs[0], extra)


def _decode_final(path: Path, events_decoder: _Guarded, document_decoder: _Guarded, data: bytes, form: str,
                  truncated: bool) -> tuple[list, Any, bool | None]:
    """The last chunk's events, the document after the array (object form), and whether it was salvaged."""
    try:
        if form == "object":
            document = document_decoder.decode(b'{"traceEvents": [' + data)
            return document.traceEvents, document, None
        return events_decoder.decode(b"[" + data), None, None
    except msgspec.ValidationError:  # a DecodeError too: a wrongly typed key is refused, as by one process
        raise
    except msgspec.DecodeError:
        pass
    if form == "array" and not truncated:
        try:  # the format allows leaving out the final ]
            return events_decoder.decode(b"[" + data.rstrip().rstrip(b",") + b"]"), None, None
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError:
            pass
    split = _split_events(path, events_decoder, bytearray(b"[") + data, 0, raise_validation=True)
    if split is not None:
        events = split[0]
    else:
        try:  # the last complete event may be the only one left
            events = events_decoder.decode(b"[" + data.rstrip().rstrip(b",") + b"]")
        except msgspec.DecodeError:
            events = []
    return events, None, truncated


_POOLS: dict = {}


class _Done:
    """A job whose result is known without running it."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value

    def cancel(self) -> bool:
        return True


class _Deferred:
    """A job of :class:`_InThisProcess`: run when its result is first asked for, once."""

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.done, self.value = fn, args, False, None

    def result(self):
        if not self.done:
            self.value, self.done, self.fn, self.args = self.fn(*self.args), True, None, None
        return self.value

    def cancel(self) -> bool:
        self.fn = self.args = None
        return True


class _InThisProcess:
    """The executor of ``workers`` 0: each chunk decoded in this process when its turn comes."""

    @staticmethod
    def submit(fn: Callable, *args) -> _Deferred:
        return _Deferred(fn, args)


def _pool(workers: int, threads: int = 0):
    """A process pool of ``workers`` (kept for this process's later traces), started through a fork server;
    for ``workers`` 0, a pool of ``threads`` threads (kept too), or :class:`_InThisProcess` for none.

    This process, which may run threads (the Parquet writer, polars' pool), is never forked: workers are
    forks of a fresh fork server that has imported nothing (a process that has started polars' threads
    cannot be forked safely), and each imports the decoder and the reader itself on its first chunk.
    """
    if workers <= 0:
        if threads <= 0:
            return _InThisProcess()
        key = ("threads", threads)
        if key not in _POOLS:
            from concurrent.futures import ThreadPoolExecutor

            _POOLS[key] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="traceparse-decode")
        return _POOLS[key]
    pool = _POOLS.get(workers)
    if pool is None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if "forkserver" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([])  # not even __main__ (the default): the server stays a bare interpreter
        else:  # Windows: no fork at all
            context = multiprocessing.get_context("spawn")
        pool = _POOLS[workers] = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    return pool
