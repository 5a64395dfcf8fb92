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
    #: What :meth:`incomplete` said: kept in the trace's metadata (``extra["incomplete"]``) and repeated by every
    #: ``analyze`` of it, not only on the ingest that found it.
    incomplete_notes: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """Record a parse warning."""
        self.warnings.append(message)

    def incomplete(self, message: str) -> None:
        """Record that the input ends before its end (a profiler killed, a copy cut short): a warning that every
        analysis of the trace repeats, since its figures cover only what was read."""
        self.warn(message)
        if message not in self.incomplete_notes:
            self.incomplete_notes.append(message)


class Reader:
    """Base class for format readers.

    Subclasses set ``name`` (what ``--format`` takes), ``description``,
    ``variants`` (the forms of the format it reads, shown by
    ``traceparse formats``) and ``patterns`` (file-name globs it usually
    has), and implement :meth:`sniff` and :meth:`read`.

    ``refines`` names the reader of the container format this one
    specialises (the torch reader's Kineto traces are Chrome Trace Event
    JSON: it refines ``"chrome"``). When both claim a file (sniff above 0),
    the refining reader reads it, whatever their confidences: a reader
    therefore never needs to know its neighbours' formats, and sniffs only
    for its own.

    A built-in reader is a package with the same layout in every format:
    ``__init__.py`` (the Reader and its hookimpl), ``sniff.py``, one module
    per form it reads, ``events.py`` (the step to event rows); decimal text
    becomes integers only through :mod:`traceparse.units`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    variants: ClassVar[tuple[str, ...]] = ()
    patterns: ClassVar[tuple[str, ...]] = ()
    refines: ClassVar[str | None] = None
    #: Names of readers whose files this one may read together with its own (a PyTorch execution trace with
    #: the Kineto trace of the same step, which the ``torch`` reader claims): :func:`traceparse.ingest.plan`
    #: offers their claimed paths to :meth:`group`, and a path this reader puts in a group is its to read.
    companions: ClassVar[tuple[str, ...]] = ()

    def sniff(self, path: Path, head: bytes) -> float:
        """Confidence in [0, 1] that ``path`` is this format, on this scale.

        ====  ==============================================================
        1.0   a magic number or signature the tool writes (``SQLite format
              3`` is not one: it says SQLite, not whose)
        0.8   a self-describing header or structure of this format (its
              column names, its table names, its top-level keys)
        0.5   structure seen but generic (a JSON object with the expected
              key, a table whose header is not decisive)
        0.2   only the file name or extension
        0.0   not this format
        ====  ==============================================================

        ``head`` is the first 64 KiB of the file (decompressed when the file
        is gzip), or empty for a directory. The reader with the highest
        confidence above 0 reads the file (a tie goes to the reader
        registered first), except that a reader which :attr:`refines`
        another beats it whenever both are above 0. A sniffer reads only
        ``head`` (or, for a directory or a database, a few names inside
        it), never raises, and knows nothing of other readers' formats.
        """
        return 0.0

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Split the paths this reader claimed into traces (default: one per path).

        A reader whose format spreads one capture over several files (nsys
        stats reports ``PREFIX_REPORT.csv``) groups them here. A reader with
        :attr:`companions` also gets the paths they claimed; a group must hold
        at least one path of its own, and companion paths it leaves out go
        back to their reader.
        """
        return [[p] for p in paths]

    def ranks(self, group: list[Path]) -> list[list[Path]]:
        """The ranks in one trace's files (one group from :meth:`group`), where the user asks for a run of them
        (``ingest DIR --run NAME``): one list of paths per rank, each read as a trace of its own. Default: the
        group is one rank's. A format that keeps a whole job's processes in one folder (TAU's
        ``profile.N.C.T``, a file per node) splits it here, so that a run of it has a rank per process."""
        return [group]

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        """Read one trace from ``paths`` (one group from :meth:`group`).

        Raise :class:`traceparse.errors.InputError` for bad input, naming the
        file, the line or record, and what was expected. Keep what was
        complete in a truncated file and ``options.warn`` about it.
        """
        raise NotImplementedError
