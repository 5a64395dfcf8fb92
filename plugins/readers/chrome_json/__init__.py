"""Chrome Trace Event JSON, decoded once for every reader of it: a library module, not a reader.

The torch (Kineto) and chrome readers read the same container format. They
share what decodes it (:mod:`.decoder`): one msgspec :class:`Event` struct
(generic in its ``args``, so each reader keeps only the arguments it needs)
and one streaming decoder that reads the ``traceEvents`` array chunk by chunk,
in memory bounded by the chunk size, and salvages a file cut short. Times
(decimal microseconds) become integer nanoseconds through
:mod:`traceparse.units`.
"""

from traceparse_plugins.readers.chrome_json.decoder import (
    CHUNK_BYTES, Event, check_file, gc_paused, stream_events, time_ns, times_ns, what, where,
)

__all__ = ["CHUNK_BYTES", "Event", "check_file", "gc_paused", "stream_events", "time_ns", "times_ns", "what",
           "where"]
