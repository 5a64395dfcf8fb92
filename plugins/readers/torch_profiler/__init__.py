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

from traceparse_plugins.readers.chrome_json import CHUNK_BYTES, gc_paused, stream_events
from traceparse_plugins.readers.torch_profiler.backend import fill_backend
from traceparse_plugins.readers.torch_profiler.coerce import Coercions
from traceparse_plugins.readers.torch_profiler.events import to_frame
from traceparse_plugins.readers.torch_profiler.kineto import Document, KinetoEvent, fill_meta
from traceparse_plugins.readers.torch_profiler.memory import memory_frame
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
        return Trace(_batches(path, meta, options, chunk), meta)


def _batches(path: Path, meta: TraceMeta, options: ReadOptions, chunk_bytes: int) -> Iterator[pl.DataFrame]:
    """Decode the trace chunk by chunk, yielding a batch of rows per chunk; fills ``meta`` on the way.

    ``[memory]`` events become counter rows after the chunk's other rows
    (:mod:`.memory`). Integer arguments written in another JSON type are
    coerced and counted; one warning at the end says what (:mod:`.coerce`).
    """
    coerced = Coercions()
    names: dict[str, str] = {}
    for offset, events in stream_events(path, options, KinetoEvent, Document, chunk_bytes=chunk_bytes,
                                        label="torch.profiler trace", array_form=False,
                                        on_document=lambda doc: (fill_meta(meta, doc), fill_backend(meta, doc))):
        collect_thread_names(events, names)
        with gc_paused():
            batch = to_frame(path, events, offset, coerced)
            memory = memory_frame(path, events, offset, coerced)
        if memory is not None:
            batch = pl.concat([batch, memory], how="diagonal_relaxed")
        del events
        yield batch
    if names:
        meta.extra["thread_names"] = names
    if coerced:
        options.warn(coerced.warning(path))


@hookimpl
def traceparse_readers():
    return [TorchProfilerReader()]
