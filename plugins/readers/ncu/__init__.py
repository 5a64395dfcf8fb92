"""Reader ``ncu``: NVIDIA Nsight Compute results, one kernel row per profiled launch and a counter row per metric.

Forms read (all versions 2019.x to 2025.x that traceparse knows of):
- ``ncu --csv`` (details page): one CSV record per kernel × metric with
  ``Section Name, Metric Name, Metric Unit, Metric Value`` (+ rule records);
- ``ncu --csv --page raw``: one record per kernel, a column per metric and a
  units row under the header (with or without ``--print-units base``);
- plain-text console output (``==PROF==`` lines, a ``[pid] process@host``
  line, a kernel line per launch and a table per section);
- ``.ncu-rep`` report files, through NVIDIA's ``ncu_report`` Python module
  (the ``ncu-report`` package, extra ``ncu``; also in Nsight Compute's
  ``extras/python``) when it can be imported.

Definition of the rows:
- kernel (one per profiled launch, file order): ``name`` as ncu prints it,
  ``grid_*``/``block_*`` from the ``Grid Size``/``Block Size`` columns or the
  ``launch__grid_dim_*``/``launch__block_dim_*`` metrics,
  ``registers_per_thread``, ``static_smem_bytes``, ``dynamic_smem_bytes``
  (``launch__*`` metrics or the Launch Statistics labels),
  ``duration_ns`` = ``gpu__time_duration.sum`` (or the SOL section's
  ``Duration``), ``device_id``, ``context_id``, ``stream_id``, ``pid``;
  ``start_ns`` null (ncu serialises and replays kernels: no timeline),
  ``calls`` 1.
- counter (one per kernel × metric): ``name`` = the metric name (raw page,
  .ncu-rep) or label (details page, text), ``value`` in base units
  (:mod:`.units`: ns, byte, hz, ``<count>/s``, %), ``unit`` the base unit (null
  for plain numbers), ``group`` = the section (details, text), ``parent_id`` =
  the kernel's ``event_id``.
- rule result (details page, text): a counter named ``rule:<Rule Name>``
  (text output has no rule names: ``rule:<type>``), ``value`` = the
  estimated speedup in % (null when the rule gives none), ``unit`` "%",
  ``group`` "rule". Rule types, speedup kinds and one description per rule
  are summarised in the trace metadata (``extra.ncu_rules``).
- ``device__attribute_*`` metrics fill the trace's devices (name, SM count,
  memory, clocks, compute capability) instead of counters.
"""

from __future__ import annotations

from pathlib import Path

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.schema import conform
from traceparse.sources import read_head
from traceparse.trace import Trace, TraceMeta

from .csv_form import looks_like_ncu_csv, read_csv
from .events import to_events
from .report_form import REPORT_SUFFIXES, looks_like_report, read_report
from .sniff import sniff
from .text_form import looks_like_ncu_text, read_text

TOOL = "Nsight Compute"


class NcuReader(Reader):
    name = "ncu"
    description = "NVIDIA Nsight Compute (ncu) kernel profiles: per-launch metrics, sections and rule results"
    variants = (
        "ncu --csv (details page: Section/Metric Name/Unit/Value, rule rows), 2019.x-2025.x",
        "ncu --csv --page raw (one row per kernel, units row), with or without --print-units base",
        "plain-text ncu output (==PROF== lines, section tables)",
        ".ncu-rep report (needs NVIDIA's ncu_report module: pip install 'traceparse[ncu]'; else export with "
        "ncu --import FILE --csv --page raw)",
    )
    patterns = ("*.csv", "*.txt", "*.log", "*.ncu-rep", "*.nsight-cuprof-report")

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        if path.is_dir():
            raise bad_input(path, None, "is a directory; the ncu reader reads one file (CSV, text or .ncu-rep)")
        head = read_head(path)
        if path.name.endswith(REPORT_SUFFIXES) or looks_like_report(head):
            parsed = read_report(path, options)
        else:
            if looks_like_ncu_csv(head) or not looks_like_ncu_text(head):
                parsed = read_csv(path, options)
            else:
                parsed = read_text(path, options)
        if parsed.kernels.height == 0:
            raise bad_input(path, None, "Nsight Compute output with no profiled kernel results")
        for note in parsed.notes:
            if note.startswith(("==ERROR==", "==WARNING==")):
                options.warn(f"{path}: {note}")
        events, devices, info = to_events(path, parsed, options)
        # the same list: warnings given while reading end up in the trace's metadata
        meta = TraceMeta(tool=TOOL, tool_version=parsed.tool_version, variant=parsed.form, devices=devices,
                         summary=info["summary"], extra=info["extra"], warnings=options.warnings)
        return Trace(conform(events), meta)


@hookimpl
def traceparse_readers():
    return [NcuReader()]
