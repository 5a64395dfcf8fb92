"""Reading ``.ncu-rep`` report files through NVIDIA's ``ncu_report`` Python module.

The report format is private; NVIDIA's Python interface to it,
``ncu_report`` (``load_report``), is on the package registry as
``ncu-report`` (NVIDIA's own licence, so the optional extra ``ncu``:
``pip install 'traceparse[ncu]'``; it imports on a machine without a GPU) and
also ships in Nsight Compute's ``extras/python`` folder. It is looked for: an
importable ``ncu_report`` (the package), then the folder named by
``$TRACEPARSE_NCU_PYTHON``, then the usual install folders. Without it the
reader stops with a one-line error saying how to install it or how to export
the report as CSV.

Each action (profiled kernel launch) of each range becomes a kernel; its
metrics are read like a raw-page row (values in base units, with their
unit strings), so the same conversion applies. The metrics ncu's own raw CSV
export leaves out are left out here too (``breakdown:``, ``regex:``,
``group:``), and ncu's internal ``derived_tempMetric*`` (which ncu 2025.3.1's
export prints, and the CSV reader also leaves out); a metric without a value
(``has_value()`` false: an instanced metric with no total, which the export
leaves blank or writes ``no data``) gives no row. So a report and its
``ncu --import R --csv --page raw`` export give the same figures (the CSV to
the digits it prints). Kernel names are the demangled names the installed
module gives; its demangler may spell templates differently from the
``ncu`` that wrote the CSV (``(int)128`` for ``128``).
"""

from __future__ import annotations

import glob
import importlib
import os
import sys
from pathlib import Path

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions

from .parsed import KERNEL_COLUMNS, METRIC_COLUMNS, Parsed, frame

REPORT_SUFFIXES = (".ncu-rep", ".nsight-cuprof-report")
REPORT_MAGIC = b"NVR\x00"
INSTALL_GLOBS = ("/opt/nvidia/nsight-compute/*/extras/python", "/usr/local/cuda*/nsight-compute*/extras/python",
                 "/usr/local/NVIDIA-Nsight-Compute*/extras/python")
#: Metric names the raw CSV export does not list: section breakdowns, patterns, groups, ncu's temporaries.
SKIPPED_METRICS = ("breakdown:", "regex:", "group:", "derived_tempMetric")
EXPORT_HINT = "export it with: ncu --import {path} --csv --page raw > {stem}_raw.csv"


def find_ncu_report():
    """The ``ncu_report`` module, or None when it cannot be found."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    candidates = [os.environ.get("TRACEPARSE_NCU_PYTHON", "")]
    for pattern in INSTALL_GLOBS:
        candidates.extend(sorted(glob.glob(pattern), reverse=True))
    for folder in candidates:
        if folder and Path(folder, "ncu_report.py").is_file():
            sys.path.insert(0, folder)
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                sys.path.remove(folder)
    return None


def read_report(path: Path, options: ReadOptions) -> Parsed:
    """Parse a .ncu-rep file with ``ncu_report`` into string tables."""
    module = find_ncu_report()
    hint = EXPORT_HINT.format(path=path, stem=path.name.split(".")[0])
    if module is None:
        raise bad_input(path, None, "reading .ncu-rep files needs NVIDIA's ncu_report Python module: pip install "
                                    "'traceparse[ncu]' (or set TRACEPARSE_NCU_PYTHON to Nsight Compute's "
                                    "extras/python folder), or " + hint)
    try:
        context = module.load_report(str(path))
    except Exception as exc:  # the module raises its own types
        raise bad_input(path, None, f"ncu_report could not load the report ({exc}); {hint}") from None
    kernels = {c: [] for c in KERNEL_COLUMNS}
    metrics = {c: [] for c in METRIC_COLUMNS}
    index = 0
    for r in range(context.num_ranges()):
        rng = context.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            key = f"{r}:{a}"
            names = list(action.metric_names())
            values = {n: _metric(module, action.metric_by_name(n)) for n in names}
            kernel = {"key": key, "line": index, "id": str(index), "name": _action_name(module, action),
                      "device": _text(values.get("launch__device_id")), "context": _text(values.get("launch__context_id")),
                      "stream": _text(values.get("launch__stream_id"))}
            for col in KERNEL_COLUMNS:
                kernels[col].append(kernel.get(col))
            for name in names:
                value = values[name]
                if value is None or name.startswith(SKIPPED_METRICS):
                    continue
                raw, unit = value
                for col, item in (("key", key), ("line", index), ("group", None), ("name", name), ("unit", unit),
                                  ("raw", raw)):
                    metrics[col].append(item)
            index += 1
            options.progress(0)
    return Parsed("ncu-rep", frame(KERNEL_COLUMNS, kernels), frame(METRIC_COLUMNS, metrics),
                  notes=["rule results are not read from .ncu-rep files; export with ncu --import FILE --csv "
                         "to get them"])


def _action_name(module, action) -> str:
    """The demangled kernel name when the module offers it, else the function name."""
    base = getattr(getattr(module, "IAction", None), "NameBase_DEMANGLED", None)
    if base is not None:
        try:
            return action.name(base)
        except TypeError:
            pass
    return action.name()


def _metric(module, metric) -> tuple[str, str] | None:
    """(value as text, unit) of one metric; None when it has no value."""
    if metric is None:
        return None
    if hasattr(metric, "has_value") and not metric.has_value():  # an instanced metric with no total, "no data"
        return None
    kinds = getattr(module, "IMetric", None)
    kind = metric.kind() if hasattr(metric, "kind") else None
    unit = metric.unit() if hasattr(metric, "unit") else ""
    if kinds is not None and kind == getattr(kinds, "ValueKind_STRING", object()):
        return metric.as_string(), ""
    if kinds is not None and kind in (getattr(kinds, "ValueKind_UINT64", None), getattr(kinds, "ValueKind_UINT32", None)):
        return str(metric.as_uint64()), unit or ""
    try:
        value = metric.as_double()
    except Exception:  # a metric kind without a number
        return None
    if value != value:  # NaN: no value
        return None
    return repr(float(value)), unit or ""


def _text(value: tuple[str, str] | None) -> str | None:
    if value is None:
        return None
    raw = value[0]
    return raw[:-2] if raw.endswith(".0") else raw


def looks_like_report(head: bytes) -> bool:
    """True when ``head`` starts with the .ncu-rep magic bytes."""
    return head.startswith(REPORT_MAGIC)
