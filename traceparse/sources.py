"""Opening input files: transparent gzip, the head used for sniffing, content hashes."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from traceparse.errors import InputError

HEAD_BYTES = 64 * 1024
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic number."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing gzip transparently."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of the (decompressed) content; empty for a directory."""
    if path.is_dir():
        return b""
    try:
        with open_binary(path) as f:
            return f.read(size)
    except (OSError, EOFError):
        with open(path, "rb") as f:  # a gzip cut short: sniff what is there
            return f.read(size)


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


def content_size(paths: list[Path]) -> int:
    """Total on-disk size of ``paths`` (files under directories included)."""
    total = 0
    for path in paths:
        if path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        else:
            total += path.stat().st_size
    return total


def sha256_of(paths: list[Path]) -> str:
    """A content hash of one or more files or directories, independent of where they are.

    A single file hashes to the sha256 of its bytes; several files, or a
    directory, hash to the sha256 of their sorted (name, file sha256) pairs.
    """
    files: list[tuple[str, Path]] = []
    for path in paths:
        if path.is_dir():
            files.extend((str(p.relative_to(path)), p) for p in sorted(path.rglob("*")) if p.is_file())
        else:
            files.append((path.name, path))
    if len(paths) == 1 and not paths[0].is_dir():
        return _file_sha256(paths[0])
    outer = hashlib.sha256()
    for name, p in sorted(files):
        outer.update(f"{name}\0{_file_sha256(p)}\n".encode())
    return outer.hexdigest()


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
