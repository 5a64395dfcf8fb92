"""What a format reader is: the object a plugin returns from ``traceparse_readers``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from traceparse.trace import Trace


@dataclass
class ReadOptions:
    """What the core passes to :meth:`Reader.read`.

    ``progress(n)`` reports that ``n`` more bytes of the input were consumed
    (drives the progress bar); ``warn(msg)`` records a parse warning (it ends
    up in the trace metadata and on stderr); ``params`` holds reader-specific
    settings (e.g. ``stream_threshold_bytes``).
    """

    progress: Callable[[int], None] = lambda n: None
    warnings: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def warn(self, message: str) -> None:
        """Record a parse warning."""
        self.warnings.append(message)


class Reader:
    """Base class for format readers.

    Subclasses set ``name`` (what ``--format`` takes), ``description``,
    ``variants`` (the forms of the format it reads, shown by
    ``traceparse formats``) and ``patterns`` (file-name globs it usually
    has), and implement :meth:`sniff` and :meth:`read`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    variants: ClassVar[tuple[str, ...]] = ()
    patterns: ClassVar[tuple[str, ...]] = ()

    def sniff(self, path: Path, head: bytes) -> float:
        """Confidence in [0, 1] that ``path`` is this format.

        ``head`` is the first 64 KiB of the file (decompressed when the file
        is gzip), or empty for a directory. 0 means "not mine"; the reader
        with the highest confidence above 0 reads the file.
        """
        return 0.0

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Split the paths this reader claimed into traces (default: one per path).

        A reader whose format spreads one capture over several files (nsys
        stats reports ``PREFIX_REPORT.csv``) groups them here.
        """
        return [[p] for p in paths]

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        """Read one trace from ``paths`` (one group from :meth:`group`).

        Raise :class:`traceparse.errors.InputError` for bad input, naming the
        file, the line or record, and what was expected. Keep what was
        complete in a truncated file and ``options.warn`` about it.
        """
        raise NotImplementedError
