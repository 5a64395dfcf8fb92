"""Chrome Trace Event JSON, decoded once for every reader of it: a library module, not a reader.

The torch (Kineto) and chrome readers read the same container format. They
share what decodes it (:mod:`.decoder`): one msgspec :class:`Event` struct
(generic in its ``args``, so each reader keeps only the arguments it needs)
and one streaming decoder that reads the ``traceEvents`` array chunk by chunk,
in memory bounded by the chunk size, and salvages a file cut short; or
(:func:`map_chunks`) cuts the array into chunks decoded and converted in
worker processes, in memory bounded by the chunks in flight. Times
(decimal microseconds) become integer nanoseconds through
:mod:`traceparse.units`.
"""

from traceparse_plugins.readers.chrome_json.decoder import (
    CHUNK_BYTES, Event, EventError, check_file, content_bytes, decode_threads, decode_workers, gc_paused, map_chunks,
    stream_events, time_ns, times_ns, what, where,
)

__all__ = ["CHUNK_BYTES", "Event", "EventError", "check_file", "content_bytes", "decode_threads", "decode_workers", "gc_paused",
           "map_chunks", "stream_events", "time_ns", "times_ns", "what", "where"]
