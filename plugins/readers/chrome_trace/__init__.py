"""Reader ``chrome``: Chrome Trace Event JSON: traceparse's own ``chrome`` exports exactly, other Chrome traces generally.

Two forms (see each module): :mod:`.export`, a traceparse export (its first
key is ``"traceparse"``, see plugins/exporters/chrome.py), read back row for
row; and any other Chrome trace (object form ``{"traceEvents": [...]}`` or
array form ``[...]``), whose events :mod:`.events` turns into rows. Both are
decoded with the shared Chrome-JSON decoder
(:mod:`traceparse_plugins.readers.chrome_json`); :mod:`.sniff` recognises
them. Readers of a more specific Chrome-JSON format (torch) declare that they
refine this one.
"""

from __future__ import annotations

from pathlib import Path

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Trace

from traceparse_plugins.readers.chrome_json import check_file
from traceparse_plugins.readers.chrome_trace.events import read_plain
from traceparse_plugins.readers.chrome_trace.export import EXPORT_VERSION, is_export, read_export
from traceparse_plugins.readers.chrome_trace.sniff import sniff

__all__ = ["ChromeTraceReader", "EXPORT_VERSION"]


class ChromeTraceReader(Reader):
    name = "chrome"
    description = "Chrome Trace Event JSON: traceparse `export --to chrome` files (exact), other Chrome traces"
    variants = ("traceparse chrome export, layout 1", "Chrome Trace Event JSON, object or array form",
                "gzip-compressed (.json.gz)")
    patterns = ("*.json", "*.json.gz", "*.trace.json")

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        check_file(path)  # a directory or FIFO is refused before anything opens it
        try:
            trace = read_export(path, options) if is_export(read_head(path, 4096)) else read_plain(path, options)
        except RecursionError:
            raise bad_input(path, None, "JSON nested too deeply to read (deeper than any trace is)") from None
        except UnicodeDecodeError as exc:
            raise bad_input(path, None, f"not UTF-8 text (byte {exc.start} of a decoded piece)") from None
        trace.meta.warnings = options.warnings  # the same list: warnings made while reading land in the metadata
        return trace


@hookimpl
def traceparse_readers():
    return [ChromeTraceReader()]
