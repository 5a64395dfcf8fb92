"""Reader ``jax``: JAX/XLA profiles: the XPlane protobuf (``*.xplane.pb``) and its JSON timelines.

``jax.profiler.trace(log_dir)`` writes ``log_dir/plugins/profile/<run>/<host>.xplane.pb`` (an XSpace:
planes of lines of events with stats), ``perfetto_trace.json.gz`` with ``create_perfetto_trace=True``, and
xprof / TensorBoard add ``<host>.trace.json.gz`` when they open it. The JSON timelines are Chrome Trace
Event JSON (the ``chrome`` reader's container, which this reader refines). Each form has its module, both
giving the intermediate table of :mod:`.events`, which turns it into event rows the same way:
:mod:`.timeline` (the JSON), :mod:`.xplane` (the protobuf, with the devices' properties only it has);
:mod:`.sniff` recognises them by content and :mod:`.profile_dir` picks one file per host from a profile
directory, so ``traceparse analyze log_dir/`` reads what JAX wrote. docs/formats/jax.md says what is read.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Trace, TraceMeta

from traceparse_plugins.readers.jax.events import accelerators, thread_names, to_rows, without_profiler_frames
from traceparse_plugins.readers.jax.profile_dir import profile_files
from traceparse_plugins.readers.jax.sniff import is_xspace, sniff


class JaxReader(Reader):
    name = "jax"
    description = "JAX/XLA profiles: XPlane protobuf (*.xplane.pb), trace-viewer and Perfetto JSON, profile directories"
    variants = ("XSpace protobuf (.xplane.pb), JAX 0.4 to 0.11, CUDA and ROCm",
                "xprof trace-viewer JSON (.trace.json.gz)", "JAX's perfetto_trace.json.gz",
                "a jax.profiler.trace directory (plugins/profile/<run>/)")
    patterns = ("*.xplane.pb", "*.trace.json.gz", "perfetto_trace.json.gz")
    refines = "chrome"

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """A profile directory becomes its chosen files (one trace per host); a file is one trace."""
        groups = []
        for path in paths:
            if path.is_dir():
                groups.extend([f] for f in profile_files(path))
            else:
                groups.append([path])
        return groups

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        if path.is_dir():  # given to read() directly (a forced --format): the directory's first chosen file
            files = profile_files(path)
            if not files:
                raise bad_input(path, None, "no JAX profile here (no *.xplane.pb, *.trace.json.gz or "
                                            "perfetto_trace.json.gz, nor a plugins/profile/<run>/ holding them)")
            path = files[0]
        meta = TraceMeta(tool="jax.profiler")
        modules = None
        if is_xspace(read_head(path, 4096)) or path.name.endswith(".xplane.pb"):
            from traceparse_plugins.readers.jax.xplane import read_xspace

            raw, modules = read_xspace(path, options, meta)
            meta.variant = "XSpace protobuf"
        else:
            from traceparse_plugins.readers.jax.timeline import read_timeline

            raw = read_timeline(path, options)
            meta.variant = "xprof trace-viewer JSON" if not path.name.startswith("perfetto") else "JAX Perfetto JSON"
        accelerators(raw, meta.devices)
        raw, left_out = without_profiler_frames(raw)
        if left_out:
            meta.extra["profiler_frames_left_out"] = left_out
        rows, notes = to_rows(raw)
        rows = _work(rows, modules, meta)
        if notes.unplaced:
            plane, line = notes.unplaced_at
            options.warn(f"{path}: {notes.unplaced} kernels, copies or memsets (by their stats) on {plane} are on a "
                         f"thread that names no stream (the first on thread {line}): read with no stream")
        if notes.impossible:
            options.warn(f"{path}: kernel launch configurations no GPU can have, left empty: "
                         + "; ".join(f"{n}× {what}" for what, n in sorted(notes.impossible.items())))
        names = thread_names(raw)
        if names:
            meta.extra["thread_names"] = names
        _summarise(meta, rows)
        meta.warnings = options.warnings
        return Trace(rows, meta)


#: Why a JSON timeline gives no roofline (meta.extra["no_flops_reason"], which arithmetic-intensity prints).
NO_HLO = ("a JAX JSON timeline carries no HLO: the FLOPs of XLA's kernels come from the compiled modules in the "
          "<host>.xplane.pb beside it (give that file, or the profile directory that holds it)")


def _work(rows: pl.DataFrame, modules: list | None, meta: TraceMeta) -> pl.DataFrame:
    """The kernels' FLOPs and bytes from the compiled modules (:mod:`.hlo_kernels`); the JSON forms have none."""
    if modules is None:
        if rows.select((pl.col("kind") == "kernel").any()).item():
            meta.extra["no_flops_reason"] = NO_HLO
        return rows.drop("_program_id")
    from traceparse_plugins.readers.jax.hlo_kernels import attach

    rows, notes = attach(rows, modules)
    meta.summary.update(hlo_modules=len(modules), kernels_with_flops=notes.with_flops,
                        kernels_matched_by_hlo_op=notes.by_hlo_op, kernels_matched_by_schedule=notes.by_schedule,
                        kernels_matched_by_name=notes.by_name, kernels_unmatched=notes.unmatched + notes.without_module)
    return rows.drop("_program_id")


def _summarise(meta: TraceMeta, rows: pl.DataFrame) -> None:
    """What the reader found, for ``traceparse show``: rows of each kind, devices and streams with GPU work."""
    kinds = rows.group_by("kind").len().sort("kind")
    meta.summary.update({f"{k}_rows": n for k, n in kinds.iter_rows()})
    gpu = rows.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
    meta.summary["streams"] = gpu.select("device_id", "stream_id").unique().height


@hookimpl
def traceparse_readers():
    return [JaxReader()]
