"""Opening input files: transparent gzip, the head used for sniffing, content hashes; CSV lines as records."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import os
import threading
import zlib
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO, Iterator

from traceparse.errors import InputError

HEAD_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"

#: Longest line a text format may have (``open_binary(..., text=True)``); a longer one is refused.
MAX_LINE_BYTES = 32 * 1024 * 1024
#: A gzip stream may expand at most this many times its compressed size (profiler output: about 5 to 20)...
MAX_GZIP_RATIO = 200
#: ...once past this many decompressed bytes (a small, very regular file may expand more).
GZIP_RATIO_FLOOR = 32 * 1024 * 1024


#: What a damaged gzip stream raises: a CRC or length mismatch, a bad header (BadGzipFile), bad deflate data.
GZIP_DAMAGE = (gzip.BadGzipFile, zlib.error)

#: Notes of the streams read in this context (a gzip stream cut short), collected by :func:`source_notes`.
_NOTES: ContextVar[list[str] | None] = ContextVar("traceparse_source_notes", default=None)


def damaged_gzip(path: Path, exc: BaseException) -> InputError:
    """The one-line error for a gzip stream whose data is damaged (changed bytes): it names the file and what
    zlib said. Every reader says the same (the JSON, text and SQLite readers alike)."""
    return InputError(f"{path}: the gzip stream is damaged ({exc}); the file cannot be read")


def cut_gzip(path: Path, what: str = "") -> str:
    """The warning for a gzip stream cut short whose complete part was read (``what``: what was kept)."""
    return f"{path}: the gzip stream ends early (the file was cut short)" + (f"; {what}" if what else "")


def note(message: str) -> None:
    """Record a note about a stream read in this context (see :func:`source_notes`); none is kept outside one."""
    notes = _NOTES.get()
    if notes is not None and message not in notes:
        notes.append(message)


@contextmanager
def source_notes() -> Iterator[list[str]]:
    """Collect the notes (:func:`note`) of the streams opened inside the block: the core turns them into the
    trace's warnings, so that no reader has to know how its input was compressed."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic number."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: Path, *, text: bool = False) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing gzip transparently, with the work bounded.

    The decompressed bytes are counted: a gzip stream that expands more than
    :data:`MAX_GZIP_RATIO` times (past :data:`GZIP_RATIO_FLOOR` bytes) is refused
    with an :class:`InputError` as soon as it does (a compression bomb). With
    ``text`` (a reader of a line-oriented text format) a NUL byte (binary data,
    a sparse file) or a line longer than :data:`MAX_LINE_BYTES` is refused too.

    A damaged gzip stream (changed bytes: a CRC mismatch, bad deflate data) is
    a one-line :class:`InputError` (:func:`damaged_gzip`). A gzip stream cut
    short raises :class:`EOFError` after its complete part for a binary
    reader; for a text reader it ends after the last complete line, and a
    warning (:func:`cut_gzip`) is noted for the trace (:func:`source_notes`).
    """
    if is_gzip(path):
        inner = gzip.open(path, "rb")
        compressed = inner.fileobj  # the file under the gzip stream: its position is the compressed bytes read
    else:
        inner, compressed = open(path, "rb"), None
    if _starts_utf16(inner):  # text as Windows PowerShell's `>` writes it: read as UTF-8
        inner = _Utf16(inner)
        if compressed is None and not text:
            return _Utf16Buffer(inner, buffer_size=_CHUNK)
    if compressed is None and not text:
        return inner
    return _BoundedBuffer(_Bounded(path, inner, compressed, text), buffer_size=_CHUNK)


#: The byte-order marks of UTF-16 text (little- and big-endian).
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _starts_utf16(stream) -> bool:
    """Whether ``stream``'s content begins with a UTF-16 byte-order mark; a stream that cannot even give two bytes
    (a damaged or cut gzip header) is not, and says why at its first read, where its readers expect it."""
    try:
        return stream.peek(2)[:2] in UTF16_BOMS
    except (EOFError, *GZIP_DAMAGE, OSError):
        return False


class _Utf16Buffer(io.BufferedReader):
    """The buffered stream of a plain UTF-16 file as UTF-8: ``fileobj`` is the file itself, whose position (its
    own bytes) progress is counted in, as a gzip stream's is (the transcoded stream cannot seek or tell)."""

    @property
    def fileobj(self):
        return self.raw.inner


class _Utf16(io.RawIOBase):
    """UTF-16 text with its byte-order mark (a profiler's log redirected by Windows PowerShell) given as UTF-8
    bytes, so that every text reader reads it as it reads any other; undecodable units become U+FFFD."""

    def __init__(self, inner: BinaryIO):
        self.inner = inner
        self.decoder = codecs.getincrementaldecoder("utf-16")(errors="replace")
        self.over = b""

    @property
    def fileobj(self):
        return getattr(self.inner, "fileobj", None)

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        while True:
            raw = self.inner.read1(n if n and n > 0 else _CHUNK)  # a cut gzip stream raises EOFError here
            text = self.decoder.decode(raw, final=not raw)
            if text or not raw:
                return text.encode("utf-8")

    read = read1

    def readinto(self, buffer) -> int:
        data = self.over or self.read1(len(buffer))
        n = min(len(data), len(buffer))
        buffer[:n] = data[:n]
        self.over = data[n:]
        return n

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()


_CHUNK = 1 << 20


class _BoundedBuffer(io.BufferedReader):
    """The buffered stream :func:`open_binary` returns; ``fileobj`` is the compressed file under a gzip stream
    (as on :class:`gzip.GzipFile`), for progress counted in the file's own bytes."""

    @property
    def fileobj(self):
        return self.raw.compressed


class _Bounded(io.RawIOBase):
    """A raw stream over ``inner`` that counts what it gives and refuses what no profiler writes."""

    def __init__(self, path: Path, inner: BinaryIO, compressed, text: bool):
        self.path, self.inner, self.compressed, self.text = path, inner, compressed, text
        self.total = 0   # decompressed bytes given
        self.run = 0     # bytes since the last line break
        self.lines = 1
        self.tail = b""  # text from a gzip stream: the bytes after the last line break, held back until it ends
        self.ended = False
        self.over = b""  # what did not fit the caller's buffer

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.total

    def readinto(self, buffer) -> int:
        # read1 on a gzip stream: what was decompressed before a cut comes first, EOFError only after it
        data = self.over or self._read(min(len(buffer), _CHUNK))
        n = min(len(data), len(buffer))  # held-back text joined to a chunk may be longer than the buffer
        buffer[:n] = data[:n]
        self.over = data[n:]
        self._count(data[:n])
        return n

    def readall(self) -> bytes:
        chunks = []
        while data := (self.over or self._read(_CHUNK)):
            self.over = b""
            self._count(data)
            chunks.append(data)
        return b"".join(chunks)

    def _read(self, n: int) -> bytes:
        if self.compressed is None:
            return self.inner.read(n)
        while not self.ended:
            try:
                data = self.inner.read1(n)
            except EOFError:
                self.ended = True
                if not self.text:
                    raise
                lost = len(self.tail)
                self.tail = b""
                note(cut_gzip(self.path, "kept its complete lines" + (
                    f"; the last {lost:,} bytes, a line cut in the middle, were not read" if lost else "")))
                return b""
            except GZIP_DAMAGE as exc:
                raise damaged_gzip(self.path, exc) from None
            if not self.text:
                return data
            if not data:  # the stream's proper end: the last line is whole even without a line break
                self.ended = True
                out, self.tail = self.tail, b""
                return out
            data = self.tail + data
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            self.tail = data[cut:]
            if len(self.tail) > MAX_LINE_BYTES:
                raise InputError(f"{self.path}: line {self.lines:,} is longer than "
                                 f"{MAX_LINE_BYTES // (1024 * 1024)} MiB: not profiler text output")
            if cut:
                return data[:cut]
        return b""

    def _count(self, data: bytes) -> None:
        n = len(data)
        self.total += n
        if self.compressed is not None and self.total > GZIP_RATIO_FLOOR:
            packed = max(self.compressed.tell(), 1)
            if self.total > MAX_GZIP_RATIO * packed:
                raise InputError(f"{self.path}: the gzip stream expands more than {MAX_GZIP_RATIO} times "
                                 f"({self.total:,} bytes from {packed:,}): not profiler output (a compression bomb?)")
        if not self.text or not n:
            return
        nul = data.find(b"\0")
        if nul >= 0:
            raise InputError(f"{self.path}: binary data (a NUL byte at byte {self.total - n + nul:,}): "
                             "not a text file (a sparse or damaged file?)")
        breaks = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        if not breaks:
            self.run += n
        else:  # chunks are at most _CHUNK bytes: only the run across chunk edges can pass the ceiling
            self.run += min(breaks)
            if self.run <= MAX_LINE_BYTES:
                self.lines += data.count(b"\n") or data.count(b"\r")
                self.run = n - max(data.rfind(b"\n"), data.rfind(b"\r")) - 1
        if self.run > MAX_LINE_BYTES:
            raise InputError(f"{self.path}: line {self.lines:,} is longer than {MAX_LINE_BYTES // (1024 * 1024)} "
                             "MiB: not profiler text output")

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            super().close()


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of the (decompressed) content; empty for a directory."""
    if path.is_dir():
        return b""
    if not is_gzip(path):
        with open(path, "rb") as f:
            return _utf8_head(f.read(size))
    # a gzip stream damaged or cut short: sniff what decompresses before the damage; a one-line error if nothing
    out, failure = b"", None
    with gzip.open(path, "rb") as f:
        try:
            while len(out) < size and (piece := f.read1(size - len(out))):
                out += piece
        except EOFError:
            pass
        except GZIP_DAMAGE as exc:
            failure = exc
    if failure is not None and not out:
        raise damaged_gzip(path, failure)
    return _utf8_head(out)


def _utf8_head(head: bytes) -> bytes:
    """A head of UTF-16 text (:data:`UTF16_BOMS`) as UTF-8, as :func:`open_binary` gives the content; any other
    head as it is."""
    if head[:2] not in UTF16_BOMS:
        return head
    return head.decode("utf-16", errors="ignore").encode("utf-8")  # (a unit cut at the end: left out)


def check_readable(path: Path, *, allow_empty: bool = False) -> None:
    """Raise a one-line :class:`InputError` unless ``path`` is a readable file or directory.

    ``allow_empty`` lets an empty file through, for a reader to judge (an
    empty nsys report is normal beside its siblings of the same capture).
    """
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if not (path.is_file() or path.is_dir()):
        raise InputError(f"{path}: not a regular file or directory")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied")
    if not allow_empty and path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty")
    if path.is_file() and path.stat().st_size >= HEAD_BYTES:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
        if not head.strip(b"\0"):  # before hashing gigabytes of nothing
            raise InputError(f"{path}: the file starts with {HEAD_BYTES // 1024} KiB of NUL bytes "
                             "(a sparse or zeroed file, not profiler output)")


def content_size(paths: list[Path]) -> int:
    """Total on-disk size of ``paths`` (files under directories included)."""
    total = 0
    for path in paths:
        if path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        else:
            total += path.stat().st_size
    return total


class HashStopped(Exception):
    """:func:`sha256_of` was told to stop (its result is no longer wanted)."""


def sha256_of(paths: list[Path], stop: threading.Event | None = None, ahead: "FileHashes | None" = None) -> str:
    """A content hash of one or more files or directories, independent of where they are.

    A single file hashes to the sha256 of its bytes; several files, or a
    directory, hash to the sha256 of their sorted (name, file sha256) pairs. With ``stop``, it raises
    :class:`HashStopped` soon after the event is set (a hash worked out beside a reader that has already
    refused the file: 4 GB of a sparse file took 5 to 16 s to hash after the refusal at its byte 200).
    A file that ``ahead`` was given is not read again: its hash is taken from there (waited for if need be).
    """
    file_sha256 = ahead.file_sha256 if ahead is not None else _file_sha256
    files: list[tuple[str, Path]] = []
    for path in paths:
        if path.is_dir():
            files.extend((str(p.relative_to(path)), p) for p in sorted(path.rglob("*")) if p.is_file())
        else:
            files.append((path.name, path))
    if len(paths) == 1 and not paths[0].is_dir():
        return file_sha256(paths[0], stop)
    outer = hashlib.sha256()
    for name, p in sorted(files):
        outer.update(f"{name}\0{file_sha256(p, stop)}\n".encode())
    return outer.hexdigest()


class FileHashes:
    """The content hashes of the input files, worked out in a background thread from the moment a command has
    its paths: the hash of a trace is then ready, or nearly, when its reader needs it.

    ``traceparse ingest`` spends its first 0.3 to 0.5 s importing polars, pyarrow and the plugins, on one core;
    the hash (0.13 CPU s for the 139 MB benchmark trace; hashlib lets go of the interpreter) is done on the
    other one meanwhile, instead of beside the decoding, which wants both. Only regular files named directly
    are hashed ahead. :meth:`close` stops the thread (a refused file is not hashed to its end); a daemon
    thread, it never holds up the process's exit.
    """

    def __init__(self, paths: list[Path]):
        self._planned = dict.fromkeys(p for p in paths if p.is_file())  # in order, each once
        self._results: dict[Path, str | BaseException] = {}
        self._done = threading.Condition()
        self._stop = threading.Event()
        if self._planned:
            threading.Thread(target=self._run, name="traceparse-hash-ahead", daemon=True).start()

    def _run(self) -> None:
        for path in self._planned:
            try:
                result: str | BaseException = _file_sha256(path, self._stop)
            except BaseException as exc:  # an unreadable file, or stopped: the one who asks hashes it again
                result = exc
            with self._done:
                self._results[path] = result
                self._done.notify_all()
            if self._stop.is_set():
                return

    def file_sha256(self, path: Path, stop: threading.Event | None = None) -> str:
        """The sha256 of ``path``: as worked out ahead (waited for), else read now. Raises :class:`HashStopped`
        once ``stop`` is set."""
        if path in self._planned and not self._stop.is_set():
            with self._done:
                while path not in self._results and not self._stop.is_set():
                    if stop is not None and stop.is_set():
                        raise HashStopped(str(path))
                    self._done.wait(0.05)
                result = self._results.get(path)
            if isinstance(result, str):
                return result
        return _file_sha256(path, stop)

    def close(self) -> None:
        """Stop hashing ahead (what is left is hashed when asked for)."""
        self._stop.set()
        with self._done:
            self._done.notify_all()


_HASH_PIECE = 1 << 20


def _file_sha256(path: Path, stop: threading.Event | None = None) -> str:
    with open(path, "rb") as f:
        if stop is None:
            return hashlib.file_digest(f, "sha256").hexdigest()
        digest, piece = hashlib.sha256(), bytearray(_HASH_PIECE)
        view = memoryview(piece)
        while n := f.readinto(piece):
            if stop.is_set():
                raise HashStopped(str(path))
            digest.update(view[:n])
        return digest.hexdigest()


def quoted_records(lines: list[str]) -> tuple[list[str], list[int]]:
    """CSV lines joined into records where a quoted field holds a line break (RFC 4180: a kernel name or an NVTX
    range written over two lines), and the index of each record's first line. A doubled quote inside a field
    counts twice, so only an odd number of quotes on a line opens or closes a field across lines."""
    records: list[str] = []
    starts: list[int] = []
    inside = False
    for i, line in enumerate(lines):
        if inside:
            records[-1] += "\n" + line
        else:
            records.append(line)
            starts.append(i)
        if line.count('"') % 2:
            inside = not inside
    return records, starts
