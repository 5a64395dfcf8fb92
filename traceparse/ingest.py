"""From input paths to normalized traces: pick the reader, read, store."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from traceparse.errors import InputError, TraceparseError
from traceparse.meta import INCOMPLETE
from traceparse.plugins import Registry, registry as default_registry
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import FileHashes, check_readable, content_size, read_head, sha256_of, source_notes
from traceparse.store import Store, trace_id_for
from traceparse.trace import Trace, TraceMeta


@dataclass
class IngestResult:
    """What one ingest did: the trace's metadata and whether it was already stored; ``replaced``: the reading
    that this one replaced (the same bytes as another reader, or another release of it, had read them), by its
    reader (:attr:`TraceMeta.reader`)."""

    meta: TraceMeta
    already_stored: bool
    replaced: str | None = None


#: A Git LFS pointer file: what a clone without git-lfs holds in place of a large file (a profiler's report).
LFS_POINTER = re.compile(rb"version https://git-lfs\.github\.com/spec/v1\r?\noid sha256:[0-9a-f]{64}\r?\n"
                         rb"size (\d{1,19})\r?\n")


def detect_reader(path: Path, reg: Registry) -> Reader:
    """The reader most confident it can read ``path``; an :class:`InputError` naming those tried if none is.

    Every reader sniffs (see :meth:`Reader.sniff` for the confidence scale);
    a reader that another claiming reader refines (:attr:`Reader.refines`) is
    set aside, then the highest confidence wins, the reader registered first
    on a tie.
    """
    head = read_head(path)
    scores: dict[str, float] = {}
    for name, reader in reg.readers.items():
        try:
            score = float(reader.sniff(path, head))
        except Exception:  # a sniffer must never stop detection
            score = 0.0
        if score > 0:
            scores[name] = score
    refined = {reg.readers[name].refines for name in scores}
    best, best_score = None, 0.0
    for name, score in scores.items():
        if name not in refined and score > best_score:
            best, best_score = reg.readers[name], score
    if best is None:
        if path.is_file() and path.stat().st_size == 0:
            raise InputError(f"{path}: the file is empty")
        lfs = LFS_POINTER.match(head)
        if lfs:  # a repository's large file that was never fetched: the profiler's output is elsewhere
            raise InputError(f"{path}: a Git LFS pointer, not the file itself (a {int(lfs.group(1)):,}-byte object "
                             "git-lfs did not fetch: `git lfs pull` in its repository brings it)")
        tried = ", ".join(sorted(reg.readers)) or "none installed"
        raise InputError(f"{path}: not a format traceparse recognises (tried: {tried}; `traceparse formats` lists "
                         "the forms each reads)")
    return best


def lone_file(path: Path) -> Path | None:
    """The one file of a directory that holds nothing else (hidden entries aside), else None: a folder a
    profiler wrote one trace into (``tensorboard_trace_handler``'s) names that trace, not a run of one rank."""
    if not path.is_dir():
        return None
    try:
        entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    except OSError:
        return None
    return entries[0] if len(entries) == 1 and entries[0].is_file() else None


def _sniffs(reader: Reader, path: Path) -> bool:
    """Whether ``reader`` claims ``path`` (a file by its first bytes, a directory by its name and entries)."""
    try:
        return float(reader.sniff(path, read_head(path))) > 0
    except Exception:  # a sniffer must never stop reading
        return False


def plan(paths: list[Path], fmt: str = "auto", reg: Registry | None = None) -> list[tuple[Reader, list[Path]]]:
    """Group input paths into traces, each with the reader that will read it.

    With ``fmt="auto"`` each path is sniffed; the paths a reader claims are
    then grouped by that reader (e.g. the CSV reports of one nsys capture
    become one trace). A reader with :attr:`Reader.companions` is offered the
    paths those readers claimed too: the ones it puts in its groups are its to
    read (a PyTorch execution trace with the Kineto trace of the same step).
    """
    reg = reg or default_registry()
    forced = None if fmt == "auto" else reg.reader(fmt)
    claimed: dict[str, list[Path]] = {}
    readers: dict[str, Reader] = {}
    for path in paths:
        check_readable(path, allow_empty=True)
        if forced:
            reader = forced
            lone = lone_file(path)
            if lone is not None and not _sniffs(forced, path) and _sniffs(forced, lone):
                path = lone  # a folder the reader does not read, of one file it does
        else:
            try:
                reader = detect_reader(path, reg)
            except InputError:
                lone = lone_file(path)
                if lone is None:
                    raise
                path, reader = lone, detect_reader(lone, reg)  # a folder of one trace is that trace
        readers[reader.name] = reader
        claimed.setdefault(reader.name, []).append(path)
    grouped: dict[str, list[list[Path]]] = {}
    taken: set[Path] = set()
    for name in [n for n in claimed if readers[n].companions] + [n for n in claimed if not readers[n].companions]:
        offered = [p for other in readers[name].companions if other != name for p in claimed.get(other, [])
                   if p not in taken]
        own = [p for p in claimed[name] if p not in taken]
        groups_of = readers[name].group(own + offered) if own else []
        lent = set(offered)
        grouped[name] = [g for g in groups_of if not set(g) <= lent]  # companions' paths alone go back to them
        taken.update(p for g in grouped[name] for p in g if p in lent)
    return [(readers[name], group) for name in claimed for group in grouped[name]]


def read_group(reader: Reader, paths: list[Path], progress: Callable[[int], None] | None = None,
               params: dict | None = None, sha256: str | None = None) -> Trace:
    """Read one group of paths with ``reader`` into a (possibly streamed) :class:`Trace`.

    The metadata gets the source paths, content hash, format and id; the
    reader's warnings are appended to ``meta.warnings`` as it reads, and so are the notes of the streams it
    opened (:func:`traceparse.sources.source_notes`: a gzip stream cut short), whatever the format.
    """
    trace = _open_group(reader, paths, progress, params)
    _identify(trace.meta, sha256 or sha256_of(paths))
    return trace


def _open_group(reader: Reader, paths: list[Path], progress: Callable[[int], None] | None,
                params: dict | None) -> Trace:
    """:func:`read_group` but for the content hash and id (:func:`_identify`)."""
    options = ReadOptions(progress=progress or (lambda n: None), params=dict(params or {}))
    with source_notes() as notes:
        trace = reader.read(paths, options)
    for message in notes:  # a stream cut short (a gzip file cut)
        options.incomplete(message)
    trace.refuse_empty = True  # the one rule of every reader: a trace with no events is not stored
    meta = trace.meta
    meta.source_paths = [str(p) for p in paths]
    meta.format = meta.format or reader.name
    # warnings given while reading, and later while a streamed trace is consumed, all land in the metadata
    meta.warnings.extend(w for w in options.warnings if w not in meta.warnings)
    options.warnings = meta.warnings
    meta.extra[INCOMPLETE] = options.incomplete_notes  # filled on, as a streamed trace is consumed
    return trace


def _identify(meta: TraceMeta, sha256: str) -> None:
    meta.sha256 = sha256
    meta.id = trace_id_for(sha256)


def ingest(paths: list[Path | str], *, store: Store, fmt: str = "auto", tags: dict[str, str] | None = None,
           params: dict | None = None, progress_factory=None, reg: Registry | None = None,
           ahead: FileHashes | None = None) -> list[IngestResult]:
    """Ingest ``paths`` into ``store``; content already there is recognised by its hash and not read again.

    ``progress_factory(description, total_bytes)`` may return a context
    manager yielding an ``advance(n)`` callable, for a progress bar. ``ahead``: the files' hashes as worked out
    ahead by the caller (:class:`~traceparse.sources.FileHashes`), else each group's is worked out beside its
    reader.
    """
    reg = reg or default_registry()
    results = []
    groups = plan([Path(p) for p in paths], fmt, reg)
    for done, (reader, group) in enumerate(groups):
        try:
            results.append(_ingest_group(reader, group, store, tags, params, progress_factory, ahead,
                                         reading=reg.reading_of(reader)))
        except TraceparseError as exc:
            if len(groups) > 1:  # say what the earlier groups left in the store, and what was not read
                stored = [f"{_label(g)} as {r.meta.id}" for (_, g), r in zip(groups, results)]
                skipped = [_label(g) for _, g in groups[done + 1:]]
                exc.args = (f"{exc} [stored: {', '.join(stored) or 'none'}; not stored: "
                            f"{', '.join([_label(group)] + skipped)}]",)
            raise
    return results


def _label(group: list[Path]) -> str:
    return str(group[0]) + (f" (+{len(group) - 1})" if len(group) > 1 else "")


def _ingest_group(reader: Reader, group: list[Path], store: Store, tags, params, progress_factory,
                  ahead: FileHashes | None = None, reading: str | None = None) -> IngestResult:
    """Hash the group, and unless the store has its content as ``reading`` (the reader and its release,
    :meth:`~traceparse.plugins.Registry.reading_of`) read it, read and store it.

    The hash (whose id the store is asked for) is worked out in a thread while the reader starts: the first
    batch is read meanwhile (:meth:`Trace.prefetch`; hashlib lets go of the interpreter), which took 0.1 s off
    the 139 MB benchmark trace's ingest on 2 cores. Content already stored is given up after that first batch:
    a stored trace is never read again in full. A reader that refuses the group (or fails) stops the hash and its
    error is raised at once, without asking the store: a refused 4 GB sparse file waited 5 to 16 s for the hash
    of the content it had refused at byte 200.
    """
    progress = _LateProgress()
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceparse-hash") as hasher:
        hashing = hasher.submit(sha256_of, group, stop, ahead)
        try:
            trace = _open_group(reader, group, progress, params)
            trace.prefetch()
        except BaseException:
            stop.set()
            raise
        sha256 = hashing.result()
    trace_id = trace_id_for(sha256)
    trace.meta.reader = reading
    # the same bytes stored as another reader read them (another --format, an older traceparse that took them for
    # another format, or another release of the reader: its fixes) are read again, and this reading replaces that
    # one, keeping its tags: a path gives what this traceparse reads, never an older one's figures
    stored = store.meta(trace_id) if store.has(trace_id) else None
    replace = stored is not None and (stored.format != trace.meta.format
                                      or (reading is not None and stored.reader != reading))
    if stored is not None and not replace:
        trace.close()
        meta = store.update_tags(trace_id, tags or {})
        store.set_last(trace_id)
        return IngestResult(meta, already_stored=True)
    _identify(trace.meta, sha256)
    label = group[0].name + (f" (+{len(group) - 1})" if len(group) > 1 else "")
    bar = progress_factory(f"reading {label}", content_size(group)) if progress_factory else nullcontext(None)
    with bar as advance:
        progress.attach(advance)
        trace.meta.tags.update({**(stored.tags if replace else {}), **(tags or {})})
        meta = store.write(trace, replace=replace)
    return IngestResult(meta, already_stored=False,
                        replaced=(stored.reader or f"{stored.format} (an earlier traceparse)") if replace else None)


class _LateProgress:
    """A reader's progress callback whose bar comes later: what is read before it (the prefetched batch, while
    the content is hashed) is counted and handed to the bar when it starts."""

    def __init__(self):
        self.advance: Callable[[int], None] | None = None
        self.pending = 0

    def __call__(self, n: int) -> None:
        if self.advance is None:
            self.pending += n
        else:
            self.advance(n)

    def attach(self, advance: Callable[[int], None] | None) -> None:
        self.advance = advance or (lambda n: None)
        if advance is not None and self.pending:
            advance(self.pending)
        self.pending = 0


def read_paths(paths: list[Path | str], fmt: str = "auto", params: dict | None = None,
               reg: Registry | None = None) -> list[Trace]:
    """Read paths into in-memory traces without touching a store."""
    import polars as pl

    from traceparse.repeats import find_repeats

    reg = reg or default_registry()
    traces = []
    for reader, group in plan([Path(p) for p in paths], fmt, reg):
        trace = read_group(reader, group, params=params)  # its events are conformed by the Trace itself
        repeats = find_repeats(trace.events)
        if repeats is not None:  # GPU work recorded twice: kept once, as the store keeps it
            trace.events = trace.events.filter(~pl.col("event_id").is_in(repeats.event_ids))
            trace.meta.warnings.append(repeats.warning(trace.meta.path or "the trace"))
        trace.meta.event_count = trace.events.height
        traces.append(trace)
    return traces
