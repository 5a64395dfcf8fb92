"""TAU Performance System profiles as traceparse rows (reader ``tau``).

Reads ``profile.<node>.<context>.<thread>`` text profiles (a directory of
them, ``MULTI__<METRIC>/`` directories with one metric each, or loose
files), merged ``tauprofile.xml`` and snapshot XML, and pprof's text
report. Routines become aggregated rows (region; kernel, memcpy, sync or
api where TAU's CUDA support marks them), with calls, Subrs, exclusive and
inclusive time, TAU group, node/context/thread as pid/device_id/tid and
call paths as ``call_path`` + ``parent_id``; other metrics and user events
become counter rows. docs/formats/tau.md has the details.
"""

from __future__ import annotations

from traceparse.plugins import hookimpl

from .reader import TauReader


@hookimpl
def traceparse_readers():
    return [TauReader()]
