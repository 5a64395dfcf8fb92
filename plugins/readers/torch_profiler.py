"""Reader for torch.profiler / Kineto Chrome traces (.json, .json.gz), PyTorch 1.8 to 2.x.

The trace is decoded in chunks of the ``traceEvents`` array, so memory stays
bounded by the chunk size however large the file is: each chunk is cut at an
event boundary (the prefix that decodes as a list of events) and decoded with
msgspec into typed structs holding only the fields traceparse keeps.
Timestamps are decimal microseconds; they are parsed as exact decimals and
become integer nanoseconds with no floating-point drift.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import msgspec
import polars as pl
from msgspec.structs import astuple

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import open_binary
from traceparse.trace import Device, Trace, TraceMeta

CHUNK_BYTES = 8 * 1024 * 1024  # peak memory grows with it; speed hardly does (benchmarks/)

#: Chrome-trace category (lower-cased) -> traceparse kind. Categories not here are skipped.
CATEGORY_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "api",
    "runtime": "api",
    "cuda_driver": "api",
    "driver": "api",
    "cuda_sync": "sync",
    "cpu_op": "op",
    "operator": "op",
    "user_annotation": "marker",
    "gpu_user_annotation": "marker",
    "python_function": "region",
}
#: Categories whose events run on the GPU (pid is the device, tid the stream).
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"}


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields traceparse keeps; the rest are skipped while decoding."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_legacy: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    device: int | None = None
    context: int | None = None
    stream: int | None = None
    bytes: int | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    registers: int | None = msgspec.field(default=None, name="registers per thread")
    shared_memory: int | None = msgspec.field(default=None, name="shared memory")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    flops: float | None = None


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    args: Args | None = None


class Document(msgspec.Struct):
    """The top-level keys of a Kineto trace other than the events."""

    traceEvents: list[Event] = []
    schemaVersion: int | None = None
    deviceProperties: list[dict] | None = None
    distributedInfo: dict | None = None
    traceName: str | None = None
    baseTimeNanoseconds: int | None = None
    cuda_runtime_version: int | None = None
    cuda_driver_version: int | None = None
    cupti_version: int | None = None
    record_shapes: int | None = None
    with_flops: int | None = None
    profile_memory: int | None = None


_EVENTS = msgspec.json.Decoder(list[Event])
_DOCUMENT = msgspec.json.Decoder(Document)
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_COPY_NAME = r"(?i)^memcpy\s+(\w+)\s*\((\w+)\s*->\s*(\w+)\)"


class TorchProfilerReader(Reader):
    name = "torch"
    description = "torch.profiler / Kineto Chrome trace (export_chrome_trace, tensorboard_trace_handler)"
    variants = ("Kineto JSON, PyTorch 1.8 to 2.x", "gzip-compressed (.json.gz, .pt.trace.json.gz)")
    patterns = ("*.json", "*.json.gz", "*.pt.trace.json", "*.pt.trace.json.gz")

    def sniff(self, path: Path, head: bytes) -> float:
        if b'"traceEvents"' not in head:
            return 0.0
        if b'"traceparse"' in head:  # a traceparse Chrome export: its own reader reads it
            return 0.1
        markers = (b'"deviceProperties"', b'"schemaVersion"', b'"cpu_op"', b'"cuda_runtime"', b'"Operator"',
                   b'"distributedInfo"', b'"PyTorch Profiler', b'"External id"', b'"python_function"')
        return 0.95 if any(m in head for m in markers) else 0.3

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        meta = TraceMeta(tool="torch.profiler")
        chunk = int(options.params.get("chunk_bytes", CHUNK_BYTES))
        return Trace(_batches(path, meta, options, chunk), meta)


def _batches(path: Path, meta: TraceMeta, options: ReadOptions, chunk_bytes: int) -> Iterator[pl.DataFrame]:
    """Decode the trace chunk by chunk, yielding a normalized batch per chunk; fills ``meta`` on the way."""
    with open_binary(path) as f:
        reader = _ChunkReader(f, chunk_bytes, options, path)
        head, events_start = reader.find_array()
        _fill_meta(meta, _decode_document(path, head + b'"traceEvents": []}', "the header"))
        buf = bytearray(b"[") + events_start  # always "[" followed by whole events from index 1
        offset = 0  # index within traceEvents of the first event in buf
        while True:
            more = reader.read()
            if more is None:
                break
            buf += more
            split = _split_events(path, buf, offset)
            if split is None:
                continue
            events, cut = split
            offset += len(events)
            start = buf.find(b"{", cut)
            del buf[1: start if start > 0 else len(buf)]
            with _gc_paused():
                batch = _frame(events)
            del events
            yield batch
        tail = _decode_tail(path, bytes(buf[1:]), offset, options, reader.truncated)
        if tail is not None:
            events, document = tail
            if document is not None:
                _fill_meta(meta, document)
            with _gc_paused():
                batch = _frame(events)
            del events, tail
            yield batch


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

    def find_array(self) -> tuple[bytes, bytes]:
        """Return (the document before ``"traceEvents"``, the bytes after its ``[``)."""
        buf = b""
        while True:
            data = self.read()
            if data is None:
                raise bad_input(self.path, None, 'not a torch.profiler trace: no "traceEvents" array found')
            buf += data
            m = _ARRAY_START.search(buf)
            if m:
                return buf[: m.start()], buf[m.end():]
            if len(buf) > 64 * 1024 * 1024:
                raise bad_input(self.path, None, 'not a torch.profiler trace: no "traceEvents" array in the first 64 MiB')


def _split_events(path: Path, buf: bytearray, offset: int) -> tuple[list[Event], int] | None:
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
        rest = bytes(buf[pos + 1: pos + 64]).lstrip()
        if not (rest.startswith(b",") and rest[1:].lstrip().startswith(b"{")):
            continue
        saved = buf[pos + 1]
        buf[pos + 1] = ord("]")
        try:
            with memoryview(buf) as view:
                chunk = bytes(view[: pos + 2])  # decoded Raw values point into it: buf must stay resizable
            with _gc_paused():
                return _EVENTS.decode(chunk), pos + 1
        except msgspec.ValidationError as exc:
            raise bad_input(path, _where(str(exc), offset), f"unexpected value in a trace event: {_what(str(exc))}") from None
        except msgspec.DecodeError:
            continue
        finally:
            buf[pos + 1] = saved
    return None


@contextmanager
def _gc_paused():
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


def _decode_document(path: Path, data: bytes, where: str) -> Document:
    try:
        return _DOCUMENT.decode(data)
    except msgspec.ValidationError as exc:
        raise bad_input(path, where, f"unexpected value: {exc}") from None
    except msgspec.DecodeError:
        raise bad_input(path, where, "not valid JSON: this is not a torch.profiler trace") from None


def _decode_tail(path: Path, buf: bytes, offset: int, options: ReadOptions, truncated: bool):
    """Decode the last events and the keys after the array; salvage a file cut short."""
    try:
        with _gc_paused():
            document = _DOCUMENT.decode(b'{"traceEvents": [' + buf)
        return document.traceEvents, document
    except msgspec.ValidationError as exc:
        raise bad_input(path, _where(str(exc), offset), f"unexpected value in a trace event: {_what(str(exc))}") from None
    except msgspec.DecodeError:
        pass
    split = _split_events(path, bytearray(b"[") + buf, offset)
    if split is not None:
        events = split[0]
    else:
        try:  # the last complete event may be the only one left
            events = _EVENTS.decode(b"[" + buf.rstrip().rstrip(b",") + b"]")
        except msgspec.DecodeError:
            events = []
    kept = offset + len(events)
    if kept == 0:
        raise bad_input(path, None, "the trace ends before its first complete event (truncated file?)")
    options.warn(f"{path}: the file ends early (truncated{' gzip stream' if truncated else ' JSON'}); "
                 f"kept the {kept} complete events")
    return events, None


def _where(message: str, offset: int) -> str:
    m = re.search(r"at `\$(?:\.traceEvents)?\[(\d+)\]([^`]*)`", message)
    if not m:
        return f"traceEvents[{offset}...]"
    return f"traceEvents[{offset + int(m.group(1))}]{m.group(2)}"


def _what(message: str) -> str:
    return message.split(" - at ")[0]


def _frame(events: list[Event]) -> pl.DataFrame:
    """Turn decoded events into a batch of the normalized schema (columns the trace has).

    The structs are transposed into columns in C (``astuple`` + ``zip``);
    filtering and mapping are polars expressions.
    """
    events = [e for e in events if e.ph == "X"]  # flows, instants and metadata are not kept
    if not events:
        return _EMPTY
    ph, cat, name, pid, tid, ts, dur, args = zip(*map(astuple, events))
    raw = pl.DataFrame({
        "ph": pl.Series(ph, dtype=pl.String),
        "cat": pl.Series(cat, dtype=pl.String),
        "name": pl.Series(name, dtype=pl.String),
        "pid": pl.Series(pid, dtype=pl.Int64, strict=False),  # "Spans" and other labels are not ids
        "tid": pl.Series(tid, dtype=pl.Int64, strict=False),
        "ts": pl.Series(list(map(bytes, ts)), dtype=pl.Binary),
        "dur": pl.Series(list(map(bytes, dur)), dtype=pl.Binary),
        "_i": pl.int_range(0, len(ph), eager=True),
    })
    category = pl.col("cat").str.to_lowercase()
    raw = raw.with_columns(kind=category.replace_strict(CATEGORY_KIND, default=None, return_dtype=pl.String),
                           gpu=category.is_in(list(GPU_CATEGORIES)))
    raw = raw.filter(pl.col("kind").is_not_null())
    if raw.height == 0:
        return _EMPTY
    keep = raw["_i"].to_list()
    a = [args[i] for i in keep]
    a_rows = [astuple(x) if x is not None else _NO_ARGS_ROW for x in a]
    (external, external_legacy, correlation, device, context, stream, nbytes, grid, block,
     registers, shared_memory, input_dims, flops) = zip(*a_rows)
    dims = {}
    for label, values in (("grid", grid), ("block", block)):
        xyz = zip(*(v if v and len(v) == 3 else _NO_DIM3 for v in values))  # one pass, transposed in C
        for axis, column in zip("xyz", xyz):
            dims[f"{label}_{axis}"] = pl.Series(column, dtype=pl.Int32)
    is_gpu = pl.col("gpu")
    df = raw.select(
        "kind", "name",
        start_ns=_decimal_us_to_ns(raw["ts"]),
        duration_ns=_decimal_us_to_ns(raw["dur"]),
        pid=pl.when(~is_gpu).then(pl.col("pid")),
        tid=pl.when(~is_gpu).then(pl.col("tid")),
    ).with_columns(
        device_id=pl.Series(device, dtype=pl.Int32),
        context_id=pl.Series(context, dtype=pl.Int32),
        stream_id=pl.Series(stream, dtype=pl.Int64),
        correlation_id=pl.Series(correlation, dtype=pl.Int64),
        external_id=pl.Series(external, dtype=pl.Int64).fill_null(pl.Series(external_legacy, dtype=pl.Int64)),
        registers_per_thread=pl.Series(registers, dtype=pl.Int32),
        bytes=pl.Series(nbytes, dtype=pl.Int64),
        flops=pl.Series(flops, dtype=pl.Float64),
        # lists of lists of integers: dropping whitespace gives compact JSON however the file was laid out
        input_dims=pl.Series(list(map(bytes, input_dims)), dtype=pl.Binary).cast(pl.String)
        .str.replace_all(r"\s+", "").replace("", None),
        _smem=pl.Series(shared_memory, dtype=pl.Int64),
        **dims,
    )
    copy = pl.col("name").str.extract_groups(_COPY_NAME)
    df = df.with_columns(copy=pl.when(pl.col("kind") == "memcpy").then(copy)).with_columns(
        copy_kind=pl.col("copy").struct.field("1"),
        src_memory=pl.col("copy").struct.field("2").str.to_lowercase(),
        dst_memory=pl.col("copy").struct.field("3").str.to_lowercase(),
        # Kineto reports one "shared memory" figure per kernel (static and dynamic together, not split);
        # it is kept as dynamic_smem_bytes and documented so in docs/schema.md.
        dynamic_smem_bytes=pl.when(pl.col("kind") == "kernel").then(pl.col("_smem")),
    ).drop("copy", "_smem")
    return df


_EMPTY = pl.DataFrame({"kind": pl.Series([], dtype=pl.String)})
_NO_ARGS_ROW = astuple(Args())
_NO_DIM3 = (None, None, None)


def _decimal_us_to_ns(values: pl.Series) -> pl.Series:
    """Decimal microsecond strings -> exact integer nanoseconds (sub-ns digits rounded half up).

    Empty or ``null`` values (a field absent or null) become null.
    """
    s = values.cast(pl.String)
    s = pl.select(pl.when(s.is_in(["", "null"])).then(None).otherwise(s)).to_series()
    plain = s.str.contains(r"^-?\d+(\.\d+)?$") | s.is_null()
    if not plain.all():  # exponent notation (rare): go through float
        floats = (s.cast(pl.Float64, strict=False) * 1000).round().cast(pl.Int64)
    else:
        floats = None
    whole = s.str.extract(r"^(-?\d+)").cast(pl.Int64)
    frac = s.str.extract(r"\.(\d+)").fill_null("")
    digits = (frac + "0000").str.slice(0, 4).cast(pl.Int64)  # tenths of a ns
    negative = s.str.starts_with("-")
    ns_abs = whole.abs() * 1000 + (digits + 5) // 10
    ns = pl.select(pl.when(negative).then(-ns_abs).otherwise(ns_abs)).to_series()
    if floats is not None:
        ns = pl.select(pl.when(plain).then(ns).otherwise(floats)).to_series()
    return ns.cast(pl.Int64)


def _fill_meta(meta: TraceMeta, doc: Document) -> None:
    if doc.deviceProperties:
        meta.devices = [
            Device(
                id=d.get("id"),
                name=d.get("name"),
                sm_count=d.get("numSms"),
                memory_bytes=d.get("totalGlobalMem"),
                compute_capability=(f"{d['computeMajor']}.{d['computeMinor']}"
                                    if "computeMajor" in d and "computeMinor" in d else None),
                extra={k: v for k, v in d.items()
                       if k not in ("id", "name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor")},
            )
            for d in doc.deviceProperties
            if isinstance(d, dict)
        ]
    if doc.distributedInfo:
        for key in ("rank", "world_size", "backend"):
            if key in doc.distributedInfo:
                meta.tags.setdefault(key, str(doc.distributedInfo[key]))
    if doc.schemaVersion is not None:
        meta.variant = f"Kineto schema {doc.schemaVersion}"
    elif meta.variant is None:
        meta.variant = "Kineto (no schemaVersion: PyTorch 1.x)"
    for key in ("traceName", "baseTimeNanoseconds", "cuda_runtime_version", "cuda_driver_version",
                "cupti_version", "record_shapes", "with_flops", "profile_memory"):
        value = getattr(doc, key)
        if value is not None:
            meta.extra[key] = value
    if doc.cupti_version is not None:
        meta.tool_version = f"CUPTI {doc.cupti_version}"


@hookimpl
def traceparse_readers():
    return [TorchProfilerReader()]
