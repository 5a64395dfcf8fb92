"""Reader ``nsys``: Nsight Systems output, in each form a user may have.

* ``nsys stats`` reports written with ``--format csv`` (or ``tsv``, or the
  default console table): ``cuda_gpu_trace`` / ``cuda_api_trace`` give timed
  kernel, memcpy, memset and api events; ``cuda_gpu_kern_sum``,
  ``cuda_api_sum``, ``cuda_gpu_mem_time_sum``, ``cuda_gpu_mem_size_sum``,
  ``nvtx_sum`` and ``cuda_gpu_sum`` give aggregated rows. Their 2020-2021 names
  (``gputrace``, ``gpukernsum``, ``cudaapisum``, ``gpumemtimesum``,
  ``gpumemsizesum``, ``nvtxppsum`` / ``nvtxsum``, ``gpusum``) and column
  spellings are read too. The files ``PREFIX_REPORT.csv`` of one capture,
  ingested together, become one trace (:mod:`.capture`).
* the SQLite export (``nsys export --type sqlite``, also gzip-compressed),
  and the same tables as a directory of Parquet or Arrow files
  (``nsys export --type parquetdir`` / ``arrowdir``): :mod:`.sqlite_export`
  over :mod:`.tables`.
* the report file itself (``.nsys-rep``, ``.qdrep``), exported to SQLite with
  ``nsys`` when it is installed: :mod:`.nsys_rep`.

docs/formats/nsys.md describes each form, the column histories and the units.
"""

from __future__ import annotations

from pathlib import Path

from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Trace

from traceparse_plugins.readers.nsys import capture, sniff as sniffing
from traceparse_plugins.readers.nsys.nsys_rep import read_report
from traceparse_plugins.readers.nsys.sqlite_export import read_export_dir, read_sqlite


class NsysReader(Reader):
    name = "nsys"
    description = ("Nsight Systems: nsys stats CSV reports, the SQLite / Parquet / Arrow export, "
                   ".nsys-rep / .qdrep (with nsys)")
    variants = (
        "nsys stats --format csv/tsv reports, 2020-2025 names and columns: cuda_gpu_trace (gputrace), "
        "cuda_api_trace, cuda_gpu_kern_sum (gpukernsum), cuda_api_sum (cudaapisum), cuda_gpu_mem_time_sum "
        "(gpumemtimesum), cuda_gpu_mem_size_sum (gpumemsizesum), nvtx_sum (nvtxsum, nvtxppsum), cuda_gpu_sum",
        "the reports of one capture (PREFIX_REPORT.csv) ingested together as one trace",
        "nsys stats default console table (column format)",
        "SQLite export (nsys export --type sqlite), plain or .gz",
        "Parquet and Arrow exports (nsys export --type parquetdir / arrowdir): a directory of one file per table",
        ".nsys-rep / .qdrep, exported with nsys when it is on PATH or $TRACEPARSE_NSYS",
    )
    patterns = ("*.nsys-rep", "*.qdrep", "*.sqlite", "*.sqlite.gz", "*_cuda_gpu_trace.csv", "*_gputrace.csv",
                "*_cuda_api_trace.csv", "*_cuda_gpu_kern_sum.csv", "*_cuda_api_sum.csv", "*_nvtx_sum.csv")

    def sniff(self, path: Path, head: bytes) -> float:
        return sniffing.sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Report files of one capture (``PREFIX_REPORT.csv``) together; SQLite and report files alone, but a
        report with its SQLite export beside it (``rank0.nsys-rep`` and ``rank0.sqlite``, as ``nsys export``
        writes it) is one group, the export first: one capture, read once."""
        text, single = [], []
        kinds: dict[Path, str | None] = {}
        for path in paths:
            kinds[path] = kind = sniffing.kind_of(path, read_head(path, 64) if path.is_file() else b"")
            (single if kind in ("rep", "sqlite", "tables") else text).append(path)
        exports = {(p.parent, _stem(p)): p for p in single if kinds[p] == "sqlite"}
        groups, paired = [], set()
        for path in single:
            export = exports.get((path.parent, _stem(path))) if kinds[path] == "rep" else None
            if export is not None and export not in paired:
                groups.append([export, path])
                paired.update((export, path))
        groups += [[p] for p in single if p not in paired]
        return sorted(groups, key=lambda g: single.index(g[0])) + capture.group(text)

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        if len(paths) == 2 and [sniffing.kind_of(p, read_head(p, 64)) for p in paths] == ["sqlite", "rep"]:
            export, report = paths
            trace = read_sqlite(export, options)
            made_from = trace.meta.extra.get("export_param_input_file")
            options.warn(f"{report}: read from its SQLite export beside it, {export.name} (nsys was not run)"
                         + (f"; but that export says it was made from {made_from}" if made_from and
                            made_from != report.name else ""))
            return trace
        if len(paths) == 1:
            kind = sniffing.kind_of(paths[0], read_head(paths[0], 64))
            if kind == "rep":
                return read_report(paths[0], options)
            if kind == "sqlite":
                return read_sqlite(paths[0], options)
            if kind == "tables":
                return read_export_dir(paths[0], options)
        return capture.read_capture(paths, options)


def _stem(path: Path) -> str:
    """The name without its nsys extension: ``rank0`` of rank0.nsys-rep, rank0.qdrep, rank0.sqlite, rank0.sqlite.gz."""
    name = path.name
    for ext in (".nsys-rep", ".qdrep", ".sqlite.gz", ".sqlite"):
        if name.lower().endswith(ext):
            return name[:-len(ext)]
    return name


@hookimpl
def traceparse_readers():
    return [NsysReader()]
