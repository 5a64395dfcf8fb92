"""Reader for torch.profiler / Kineto Chrome traces (.json, .json.gz), PyTorch 1.8 to 2.x.

The trace is decoded in chunks of the ``traceEvents`` array, so memory stays
bounded by the chunk size however large the file is: each chunk is cut at an
event boundary (the prefix that decodes as a list of events) and decoded with
msgspec into typed structs holding only the fields traceparse keeps.
Timestamps are decimal microseconds; they are parsed as exact decimals and
become integer nanoseconds with no floating-point drift.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import open_binary
from traceparse.trace import Device, Trace, TraceMeta

CHUNK_BYTES = 32 * 1024 * 1024

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


class Args(msgspec.Struct):
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


class Event(msgspec.Struct):
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
        buf = events_start
        offset = 0  # index of buf's first event within traceEvents
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
            buf = buf[cut:].lstrip().lstrip(b",").lstrip()
            yield _frame(events)
        tail = _decode_tail(path, buf, offset, options, reader.truncated)
        if tail is not None:
            events, document = tail
            if document is not None:
                _fill_meta(meta, document)
            yield _frame(events)


class _ChunkReader:
    """Reads the (decompressed) file in chunks, noting a gzip stream cut short."""

    def __init__(self, f, chunk_bytes: int, options: ReadOptions, path: Path):
        self.f, self.chunk_bytes, self.options, self.path = f, chunk_bytes, options, path
        self.truncated = False
        self.raw = getattr(f, "fileobj", None) or f  # the compressed file, for progress in its bytes
        self.pos = 0

    def read(self) -> bytes | None:
        try:
            data = self.f.read(self.chunk_bytes)
        except EOFError:
            self.truncated = True
            return None
        except OSError as exc:
            raise bad_input(self.path, None, f"cannot be read: {exc}") from None
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


def _split_events(path: Path, buf: bytes, offset: int) -> tuple[list[Event], int] | None:
    """Decode the longest prefix of ``buf`` made of whole events; return them and where it ends.

    A candidate end is a ``}`` followed by ``,`` and ``{`` (whitespace
    allowed). It is a real event boundary exactly when the prefix decodes as
    a list: inside a string or a nested object the brackets would not
    balance. In practice the last candidate is the one.
    """
    pos = len(buf)
    for _ in range(1000):
        pos = buf.rfind(b"}", 0, pos)
        if pos < 0:
            return None
        rest = buf[pos + 1: pos + 64].lstrip()
        if not (rest.startswith(b",") and rest[1:].lstrip().startswith(b"{")):
            continue
        try:
            return _EVENTS.decode(b"[" + buf[: pos + 1] + b"]"), pos + 1
        except msgspec.ValidationError as exc:
            raise bad_input(path, _where(str(exc), offset), f"unexpected value in a trace event: {_what(str(exc))}") from None
        except msgspec.DecodeError:
            continue
    return None


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
        document = _DOCUMENT.decode(b'{"traceEvents": [' + buf)
        return document.traceEvents, document
    except msgspec.ValidationError as exc:
        raise bad_input(path, _where(str(exc), offset), f"unexpected value in a trace event: {_what(str(exc))}") from None
    except msgspec.DecodeError:
        pass
    split = _split_events(path, buf, offset)
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


def _kind(cat: str | None) -> str | None:
    if cat is None:
        return None
    return CATEGORY_KIND.get(cat) or CATEGORY_KIND.get(cat.lower())


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) else None


def _frame(events: list[Event]) -> pl.DataFrame:
    """Turn decoded events into a batch of the normalized schema (columns the trace has)."""
    kept = [(e, k) for e in events if e.ph == "X" and (k := _kind(e.cat)) is not None]
    if not kept:
        return pl.DataFrame({"kind": pl.Series([], dtype=pl.String)})
    evs = [e for e, _ in kept]
    gpu = [(e.cat or "").lower() in GPU_CATEGORIES for e in evs]
    args = [e.args or _NO_ARGS for e in evs]
    grid = [a.grid if a.grid and len(a.grid) == 3 else _NO_DIM3 for a in args]
    block = [a.block if a.block and len(a.block) == 3 else _NO_DIM3 for a in args]
    columns = {
        "kind": pl.Series([k for _, k in kept], dtype=pl.String),
        "name": [e.name for e in evs],
        "start_ns": _decimal_us_to_ns([bytes(e.ts) for e in evs]),
        "duration_ns": _decimal_us_to_ns([bytes(e.dur) for e in evs]),
        "device_id": pl.Series([a.device for a in args], dtype=pl.Int32),
        "context_id": pl.Series([a.context for a in args], dtype=pl.Int32),
        "stream_id": pl.Series([a.stream for a in args], dtype=pl.Int64),
        "pid": pl.Series([None if g else _int_or_none(e.pid) for e, g in zip(evs, gpu)], dtype=pl.Int64),
        "tid": pl.Series([None if g else _int_or_none(e.tid) for e, g in zip(evs, gpu)], dtype=pl.Int64),
        "correlation_id": pl.Series([a.correlation for a in args], dtype=pl.Int64),
        "external_id": pl.Series([a.external_id if a.external_id is not None else a.external_id_legacy
                                  for a in args], dtype=pl.Int64),
        "grid_x": pl.Series([g[0] for g in grid], dtype=pl.Int32),
        "grid_y": pl.Series([g[1] for g in grid], dtype=pl.Int32),
        "grid_z": pl.Series([g[2] for g in grid], dtype=pl.Int32),
        "block_x": pl.Series([b[0] for b in block], dtype=pl.Int32),
        "block_y": pl.Series([b[1] for b in block], dtype=pl.Int32),
        "block_z": pl.Series([b[2] for b in block], dtype=pl.Int32),
        "registers_per_thread": pl.Series([a.registers for a in args], dtype=pl.Int32),
        "bytes": pl.Series([a.bytes for a in args], dtype=pl.Int64),
        "flops": pl.Series([a.flops for a in args], dtype=pl.Float64),
        "input_dims": pl.Series([bytes(a.input_dims) or None for a in args], dtype=pl.Binary).cast(pl.String),
        "_smem": pl.Series([a.shared_memory for a in args], dtype=pl.Int64),
    }
    df = pl.DataFrame(columns)
    copy = pl.col("name").str.extract_groups(_COPY_NAME)
    is_copy = pl.col("kind") == "memcpy"
    df = df.with_columns(copy=pl.when(is_copy).then(copy)).with_columns(
        copy_kind=pl.col("copy").struct.field("1"),
        src_memory=pl.col("copy").struct.field("2").str.to_lowercase(),
        dst_memory=pl.col("copy").struct.field("3").str.to_lowercase(),
        # Kineto reports one "shared memory" figure per kernel: static plus dynamic, not split.
        # It is kept as dynamic_smem_bytes only when a kernel row says it, never split by guess.
        dynamic_smem_bytes=pl.when(pl.col("kind") == "kernel").then(pl.col("_smem")),
    ).drop("copy", "_smem")
    return df


_NO_ARGS = Args()
_NO_DIM3 = (None, None, None)


def _decimal_us_to_ns(values: list[bytes | None]) -> pl.Series:
    """Decimal microsecond strings -> exact integer nanoseconds (sub-ns digits rounded half up).

    Empty or ``null`` values (a field absent or null) become null.
    """
    s = pl.Series(values, dtype=pl.Binary).cast(pl.String)
    s = pl.select(pl.when(s.is_in(["", "null"])).then(None).otherwise(s)).to_series()
    plain = s.str.contains(r"^-?\d+(\.\d+)?$") | s.is_null()
    if not plain.all():  # exponent notation (rare): go through float
        floats = (s.cast(pl.Float64) * 1000).round().cast(pl.Int64)
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
