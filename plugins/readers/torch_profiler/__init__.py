"""Reader ``torch``: torch.profiler / Kineto Chrome traces (.json, .json.gz), PyTorch 1.8 to 2.x.

A Kineto trace is a Chrome Trace Event JSON document (the ``chrome``
reader's container, which this reader *refines*: when both claim a file,
this one reads it). The shared Chrome-JSON decoder
(:mod:`traceparse_plugins.readers.chrome_json`) reads the ``traceEvents``
array in chunks, so memory stays bounded by the chunk size however large the
file is. Timestamps are decimal microseconds, converted exactly to integer
nanoseconds by :mod:`traceparse.units`.

Layout: :mod:`.sniff` recognises a Kineto document, :mod:`.kineto` is the
form (the event arguments and top-level keys kept, the trace metadata),
:mod:`.events` turns decoded events into rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import polars as pl

from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.trace import Trace, TraceMeta

from traceparse_plugins.readers.chrome_json import (
    CHUNK_BYTES, content_bytes, decode_threads, decode_workers, map_chunks,
)
from traceparse.meta import UNREAD
from traceparse_plugins.readers.torch_profiler.backend import fill_backend
from traceparse_plugins.readers.torch_profiler.coerce import Coercions
from traceparse_plugins.readers.torch_profiler.columnar import fast_rows
from traceparse_plugins.readers.torch_profiler.events import rows_of
from traceparse_plugins.readers.torch_profiler.kineto import NO_SCHEMA, Document, KinetoEvent, fill_meta
from traceparse_plugins.readers.torch_profiler.memory import memory_rows, with_counters
from traceparse_plugins.readers.torch_profiler.peers import with_group_choices
from traceparse_plugins.readers.torch_profiler.sniff import sniff
from traceparse_plugins.readers.torch_profiler.threads import collect_thread_names


class TorchProfilerReader(Reader):
    name = "torch"
    description = "torch.profiler / Kineto Chrome trace (export_chrome_trace, tensorboard_trace_handler)"
    variants = ("Kineto JSON, PyTorch 1.8 to 2.x", "gzip-compressed (.json.gz, .pt.trace.json.gz)")
    patterns = ("*.json", "*.json.gz", "*.pt.trace.json", "*.pt.trace.json.gz")
    refines = "chrome"

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        meta = TraceMeta(tool="torch.profiler")
        chunk = int(options.params.get("chunk_bytes", CHUNK_BYTES))
        small = is_small(path, options.params.get("small_bytes"))
        workers = 0 if small else decode_workers(path, chunk, options.params.get("workers"))
        threads = 0 if small else decode_threads(workers, options.params.get("threads"))
        return Trace(_batches(path, meta, options, chunk, workers, threads, small), meta)


#: A file whose content is smaller than this is read by the careful path alone, in one batch and in this
#: thread: the fast path's fixed cost per chunk (Arrow's reader, its schema, a second decoding to check)
#: and a decoding thread's hand-off cost more than they save below it. Measured on the first N events of
#: real traces (CPU per read, careful whole against fast in chunks): a four-event file 6.5 against 20.7 ms;
#: even at 0.7 MB (AlexNet, two GPUs) and 2.5 to 5 MB (an 8-layer GPT) (docs/scale.md, "Many small ranks").
SMALL_FILE_BYTES = 1024 * 1024


def is_small(path: Path, requested=None) -> bool:
    """True when ``path``'s (uncompressed) content is under ``requested`` bytes (the reader parameter
    ``small_bytes``; default :data:`SMALL_FILE_BYTES`): read it whole by the careful path, one batch."""
    limit = SMALL_FILE_BYTES if requested is None else int(requested)
    return limit > 0 and content_bytes(path) < limit


def _batches(path: Path, meta: TraceMeta, options: ReadOptions, chunk_bytes: int,
             workers: int = 0, threads: int = 0, small: bool = False) -> Iterator[pl.DataFrame]:
    """Decode the trace chunk by chunk, yielding a batch of rows per chunk; fills ``meta`` on the way.

    The shared decoder (:func:`~traceparse_plugins.readers.chrome_json.map_chunks`)
    cuts the ``traceEvents`` array into chunks; each is turned into rows by the
    fast path (:mod:`.columnar`: Arrow columns, no Python per event) or, where an
    event needs it (or with the reader parameter ``fast=false``), by the careful
    path (msgspec structs, :func:`chunk_rows`); both give the same rows. With
    ``workers`` > 0 this happens in that many worker processes, this process
    only collecting the batches in order; else in ``threads`` threads of this
    one (:func:`~traceparse_plugins.readers.chrome_json.decode_threads`); the
    batches are the same. A ``small`` file (:func:`is_small`) is one chunk read by the careful path: one batch.
    ``[memory]`` events become counter rows in the events' order
    (:mod:`.memory`). Integer arguments written in another JSON type are
    coerced and counted; one warning at the end says what (:mod:`.coerce`).
    """
    coerced = Coercions()
    names: dict[str, str] = {}
    on_document = lambda doc: (fill_meta(meta, doc), fill_backend(meta, doc))  # noqa: E731
    fast = fast_rows if options.params.get("fast", True) not in (False, "0", "false", "no") and not small else None
    for _, (batch, counts, chunk_names) in map_chunks(
            path, options, KinetoEvent, Document, chunk_rows, workers=workers, chunk_bytes=chunk_bytes,
            label="torch.profiler trace", array_form=True, on_document=on_document, fast=fast,
            threads=threads):
        coerced.merge(counts)
        names.update(chunk_names)  # chunks come in file order: a thread named twice keeps its last name
        yield with_group_choices(batch, meta)  # the groups are the header's (distributedInfo precedes the events)
    if names:
        meta.extra["thread_names"] = names
    if meta.variant == NO_SCHEMA and options.incomplete_notes:  # its keys after the events were cut off with them
        meta.variant = "Kineto (no schemaVersion read: the file is cut short before it)"
    if coerced:
        options.warn(coerced.warning(path))
    if coerced.unread:
        options.warn(coerced.unread_warning(path))
        meta.extra[UNREAD] = dict(coerced.unread)


def chunk_rows(path: Path, events: list,
               coerced: Coercions | None = None) -> tuple[pl.DataFrame, Coercions, dict[str, str]]:
    """The rows of one chunk of decoded events (``[memory]`` counters after the others), what was coerced,
    and the chunk's thread names (:mod:`.threads`).

    Runs in a decoding worker (hence module-level, and a bad event raises
    :class:`~traceparse_plugins.readers.chrome_json.EventError`, placed by the caller).
    """
    coerced = Coercions() if coerced is None else coerced
    batch = with_counters(rows_of(events, coerced), memory_rows(events, coerced))
    names: dict[str, str] = {}
    collect_thread_names(events, names)
    return batch, coerced, names


@hookimpl
def traceparse_readers():
    return [TorchProfilerReader()]
