"""Command ``compare``: one row of figures per trace, ordered by a tag (e.g. a batch-size sweep).

Figures per trace (``--json`` keys in ``metrics``):

* ``span_ns``, ``idle_ns``, ``idle_pct``: as the ``gpu-idle`` rule gives them
  (GPU span from first to last GPU activity, summed over devices, and its idle
  share; null without timed GPU rows: a summary's totals have no span);
* ``overlap_pct``: as ``low-memcpy-overlap`` (share of memcpy time that
  overlaps kernels); ``concurrency_pct``: as ``low-kernel-concurrency``
  (share of kernel busy time with two or more kernels running); null when
  there is nothing to measure (no memcpy / no kernels, or aggregated rows only);
* ``category_pct``: as ``kernel-share``, the share of kernel time per kernel
  category;
* ``kernel_ns``, ``memcpy_ns``, ``memset_ns``, ``api_ns``: Σ duration_ns of the
  rows of that kind over the whole trace (every step and rank; timed events
  preferred over aggregated rows of the same kind, as the rules do, so no call
  counts twice), null where the trace has no row of the kind; ``gpu_ns`` =
  kernel + memcpy + memset;
* ``step_time_ns``: the mean duration of the trace's steps as ``analyze``'s
  summary counts them (``ProfilerStep#N``, else step ranges, else optimizer
  annotations: :func:`step_metrics`), ``steps`` their number; null / 0
  without steps; ``samples_per_s``: with a ``batch`` tag (a
  number), batch / step time in seconds, the training or inference
  throughput; null without either;
* ``kernel_pattern_pct``: for each ``--kernel REGEX``, 100 × Σ time of the
  kernels whose name matches / ``gpu_ns`` (nvprof's "GPU activities" Time(%),
  the seed study's "% of time in ncclBroadcast");
  ``api_pattern_pct``: for each ``--api REGEX``, 100 × Σ time of the matching
  API calls / ``api_ns`` (nvprof's "API calls" Time(%)). Patterns are
  case-insensitive regular expressions searched anywhere in the name.

The figures come from the measures the rules use (:mod:`traceparse.measures`),
so compare shows what ``traceparse analyze`` reports. Rows are ordered by the
``--by`` tag's value (numerically when every value is a number); a trace
without the tag is an error. ``--series TAG`` groups the rows by another
tag's value first (e.g. the GPU of a sweep run on two GPUs) and draws one line
per value in the plot. Rows are named by their trace's file (not its id) and
every tag is a column. Traces from different GPUs are compared with a
warning.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl
from rich import box
from rich.table import Table
from rich.text import Text

from traceparse import expr, measures
from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.figures import fmt_pct, shares_shown
from traceparse.plugins import hookimpl
from traceparse.report import _format_column, fitted_table, trace_label
from traceparse.run import trace_ranks
from traceparse.text import literal
from traceparse.trace import Trace
from traceparse.verdict import Column

KINDS = ("kernel", "memcpy", "memset", "api")
CATEGORY_ORDER = list(expr.KERNEL_CATEGORY_NAMES)
PLOT_SUFFIXES = (".png", ".svg", ".html")
#: The tag that holds the number of samples per step, for ``samples_per_s``.
BATCH_TAG = "batch"


def trace_metrics(trace: Trace, kernel_patterns: list[str], api_patterns: list[str]) -> dict[str, Any]:
    """The compare figures of one trace (see the module docstring)."""
    events = trace.events
    present = set(events["kind"].cast(pl.String).unique().to_list())
    metrics: dict[str, Any] = {"span_ns": None, "idle_ns": None, "idle_pct": None}
    if present & set(expr.GPU_KINDS):
        busy = measures.device_busy(events)
    if present & set(expr.GPU_KINDS) and busy.height:  # timed GPU rows: a summary's totals have no span
        span, idle = int(busy["span_ns"].sum() or 0), int(busy["idle_ns"].sum() or 0)
        metrics.update(span_ns=span, idle_ns=idle, idle_pct=expr.pct(idle, span))
    copies = measures.overlap(events, a=("memcpy",), b=("kernel",))
    metrics["overlap_pct"] = expr.pct(int(copies["overlapped_ns"].sum() or 0), int(copies["time_ns"].sum() or 0))
    kernels = measures.concurrency(events)
    busy_ns = int(kernels["busy_ns"].sum() or 0)
    metrics["concurrency_pct"] = (None if kernels.height == 0 else
                                  expr.pct(int(kernels["concurrent_ns"].sum() or 0), busy_ns) if busy_ns else 0.0)
    # per category over the whole trace (a run's rows are per rank: one rank's over every rank's was each share)
    categories = measures.time_by_category(events).group_by("category").agg(pl.col("time_ns").sum())
    kernel_ns = int(categories["time_ns"].sum() or 0)
    shares = {r["category"]: expr.pct(r["time_ns"], kernel_ns) for r in categories.iter_rows(named=True)}
    metrics["category_pct"] = {c: shares[c] for c in CATEGORY_ORDER if c in shares}
    metrics["category_pct"].update({c: v for c, v in shares.items() if c not in CATEGORY_ORDER})
    by_name = measures.time_by_name(events, kinds=KINDS, prefer_timed=True)
    totals = {kind: int(by_name.filter(pl.col("kind") == kind)["time_ns"].sum() or 0) for kind in KINDS}
    for kind in KINDS:  # a kind the trace has no row of is unknown ("-"), not 0 (a kernel summary has no API)
        metrics[f"{kind}_ns"] = totals[kind] if kind in present else None
    metrics["gpu_ns"] = (totals["kernel"] + totals["memcpy"] + totals["memset"] if present & set(expr.GPU_KINDS)
                         else None)  # no GPU row at all: not recorded, not a measured 0
    kernel_rows, api_rows = by_name.filter(pl.col("kind") == "kernel"), by_name.filter(pl.col("kind") == "api")
    metrics.update(step_metrics(events))
    metrics["kernel_pattern_pct"] = {p: _share(kernel_rows, p, metrics["gpu_ns"]) for p in kernel_patterns}
    metrics["api_pattern_pct"] = {p: _share(api_rows, p, totals["api"]) for p in api_patterns}
    return metrics


def step_metrics(events: pl.DataFrame) -> dict[str, Any]:
    """``steps`` and ``step_time_ns`` (their mean duration, rounded to the ns; null without steps): the steps
    ``analyze``'s summary counts (:func:`traceparse.summary.step_windows`: ``ProfilerStep#N``, else ranges
    named like steps such as an NVTX ``train_step``, else optimizer annotations), so that the two agree."""
    from traceparse.summary import step_windows

    windows = step_windows(events)
    if windows is None or not windows.height:
        return {"steps": 0, "step_time_ns": None}
    return {"steps": windows["step"].n_unique(),
            "step_time_ns": round(int(windows["duration_ns"].sum()) / windows.height)}


def samples_per_s(tags: dict[str, str], step_time_ns: int | None) -> float | None:
    """The ``batch`` tag / the step time in seconds (4 decimals); null without a numeric batch tag or steps."""
    try:
        batch = float(tags.get(BATCH_TAG, ""))
    except ValueError:
        return None
    if not step_time_ns or not math.isfinite(batch) or batch <= 0:
        return None
    return round(batch * 1e9 / step_time_ns, 4)


def _share(by_name: pl.DataFrame, pattern: str, whole: int) -> float | None:
    """100 × the time of the names matching ``pattern`` (case-insensitive) / ``whole``."""
    part = by_name.filter(pl.col("name").str.contains(f"(?i){pattern}"))["time_ns"].sum() or 0
    return expr.pct(part, whole)


def _check_pattern(option: str, pattern: str) -> str:
    try:
        re.compile(pattern)
        pl.Series([""]).str.contains(f"(?i){pattern}")
    except (re.error, pl.exceptions.ComputeError) as exc:
        raise InputError(f"{option} {pattern!r}: not a valid regular expression ({exc})") from None
    return pattern


def sort_key(value: str):
    """Order tag values numerically when they parse as numbers, else as text (numbers first)."""
    try:
        number = float(value)
        if not math.isnan(number):
            return (0, number, value)
    except ValueError:
        pass
    return (1, 0.0, value)


#: ``--series device``: the GPU named in each trace's metadata, for traces without a ``device`` tag.
DEVICE_SERIES = "device"


def series_of(row: dict, series: str | None) -> str | None:
    """A row's value of the ``series`` tag; for ``device`` without such a tag, the trace's GPU name."""
    if not series:
        return None
    if series in row["tags"]:
        return row["tags"][series]
    return row["device"] if series == DEVICE_SERIES else None


def _device_of(t: Trace) -> str | None:
    """The GPU models of a trace (of a run: of its ranks), each once: eight ranks on one model are that model."""
    return ", ".join(dict.fromkeys(d.name for d in t.meta.devices if d.name)) or None


def _require_tag(traces: list[Trace], tag: str, option: str) -> None:
    missing = [t for t in traces if tag not in t.meta.tags
               and not (option == "--series" and tag == DEVICE_SERIES and _device_of(t))]
    if missing:
        t = missing[0]
        raise InputError(f"trace {t.id} ({t.meta.path}) has no tag {tag!r} (its tags: "
                         f"{', '.join(f'{k}={v}' for k, v in t.meta.tags.items()) or 'none'}); "
                         f"ingest it with --tag {tag}=VALUE, or add it with traceparse tag {t.id} {tag}=VALUE"
                         if option == "--by" else
                         f"{option} {tag}: trace {t.id} ({t.meta.path}) has no tag {tag!r} (its tags: "
                         f"{', '.join(f'{k}={v}' for k, v in t.meta.tags.items()) or 'none'})")


def _label(trace: Trace, traces: list[Trace]) -> str:
    """The trace's short name (:func:`traceparse.report.trace_label`); with its folder when another trace of
    the comparison has the same name (two sweeps' ``resnet18_bs4.json.gz``)."""
    label = trace_label(trace.meta)
    if sum(trace_label(t.meta) == label for t in traces) > 1 and trace.meta.path:
        return f"{Path(trace.meta.path).parent.name}/{label}"
    return label


def compare_rows(traces: list[Trace], by: str | None, kernel_patterns: list[str],
                 api_patterns: list[str], series: str | None = None) -> list[dict]:
    """The rows of ``compare --json``: ordered by the ``series`` tag, then by the ``by`` tag."""
    if by:
        _require_tag(traces, by, "--by")
    if series:
        _require_tag(traces, series, "--series")
    traces = sorted(traces, key=lambda t: (sort_key(t.meta.tags.get(series) or _device_of(t) or "") if series
                                           else (0, 0.0, ""), sort_key(t.meta.tags[by]) if by else (0, 0.0, "")))
    rows = []
    for t in traces:
        metrics = trace_metrics(t, kernel_patterns, api_patterns)
        metrics["samples_per_s"] = samples_per_s(t.meta.tags, metrics["step_time_ns"])
        rows.append({"trace": t.id, "label": _label(t, traces), "path": t.meta.path, "format": t.meta.format,
                     "device": _device_of(t),
                     "tags": dict(t.meta.tags), "metrics": metrics})
    return rows


def device_warning(rows: list[dict], series: str | None = None) -> str | None:
    """A warning when traces compared as like for like name different devices, else None: none when the
    devices are what is compared (``--series`` whose every line holds one device, as ``--series gpu`` does).
    Each device is named once, with the first of its traces."""
    groups: dict[str | None, set[str]] = {}
    for r in rows:
        if r["device"]:
            groups.setdefault(series_of(r, series), set()).add(r["device"])
    if all(len(devices) <= 1 for devices in groups.values()):
        return None
    by_device: dict[str, list[str]] = {}
    for r in rows:
        if r["device"]:
            by_device.setdefault(r["device"], []).append(f"{r['label']} ({r['trace']})")
    listed = "; ".join(f"{device}: {traces[0]}" + (f" and {len(traces) - 1:,} more" if len(traces) > 1 else "")
                       for device, traces in by_device.items())
    return f"the traces come from {len(by_device):,} devices ({listed}); their figures are not like for like"


# -- terminal -------------------------------------------------------------------
_EIGHTHS = " ▏▎▍▌▋▊▉"
BAR_WIDTH = 6


def bar(pct: float | None, width: int = BAR_WIDTH) -> Text:
    """An inline bar of ``width`` cells for a percentage (full = 100), followed by its value."""
    if pct is None:
        return Text("-".rjust(width + 6))
    filled = max(0.0, min(100.0, pct)) / 100.0 * width
    whole, frac = int(filled), int((filled - int(filled)) * 8)
    cells = "█" * whole + (_EIGHTHS[frac] if whole < width else "")
    text = Text(cells.ljust(width), style="cyan")
    text.append(f"{_pct_figure(pct):>6}")
    return text


def _pct_figure(pct: float) -> str:
    """A percentage in a column headed "%", without the sign: ``59.6``; ``<0.1`` where more than none rounds to
    0.0 and ``>99.9`` where less than all rounds to 100.0 (:func:`traceparse.figures.fmt_pct`)."""
    return fmt_pct(pct).removesuffix("%")


def row_labels(rows: list[dict], by: str | None, series: str | None = None) -> tuple[str, list[str]]:
    """The first column of the figure tables: (its header, one label per row): the ``series`` and ``by`` tags'
    values (``H100 16``) when given, else each trace's short name (its file, not its id)."""
    tags = [t for t in (series, by) if t]
    if not tags:
        return "trace", [r["label"] for r in rows]
    return " ".join(tags), [" ".join(series_of(r, t) or "-" for t in tags) for r in rows]


def tag_keys(rows: list[dict], by: str | None, series: str | None = None) -> list[str]:
    """Every tag of the rows once: ``series``, ``by``, then the others in order of first appearance."""
    keys = [t for t in (series, by) if t]
    for r in rows:
        keys.extend(k for k in r["tags"] if k not in keys)
    return keys


def _table(title: str, first: str) -> Table:
    table = Table(title=literal(title), header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(literal(first), no_wrap=True)
    return table


def _bar_tables(console, title: str, first: str, labels: list[str], headers: list[str],
                values: list[list[float | None]]) -> None:
    """Print bar columns (one per header; ``values[row][column]``), split over as many tables as the width needs,
    so no column is ever cut off."""
    first_width = max([len(first), *map(len, labels)]) + 2
    groups: list[list[int]] = [[]]
    used = first_width
    for i, header in enumerate(headers):
        width = max(BAR_WIDTH + 6, len(header)) + 3
        if groups[-1] and used + width > console.width:
            groups.append([])
            used = first_width
        groups[-1].append(i)
        used += width
    for n, group in enumerate(groups):
        table = _table(title + (f" ({n + 1}/{len(groups)})" if len(groups) > 1 else ""), first)
        for i in group:
            table.add_column(literal(headers[i]), no_wrap=True, min_width=max(BAR_WIDTH + 6, len(headers[i])))
        for label, row in zip(labels, values):
            table.add_row(literal(label), *[bar(row[i]) for i in group])
        console.print(table)


def render(console, rows: list[dict], by: str | None, series: str | None = None) -> None:
    """Tables with one row per trace: the traces with their tags, steps and throughput; times; the rules'
    figures; kernel-time shares; pattern shares. Every table fits the console's width without cutting a number
    (a column that does not fit is dropped with a note, or goes to a further table)."""
    first, labels = row_labels(rows, by, series)
    keys = tag_keys(rows, by, series)
    columns = [Column("label", "trace", "name"), *[Column(f"tag {k}", k, "text") for k in keys],
               Column("step_time_ns", "step", "ns"), Column("samples_per_s", "samples/s", "number")]
    data = [{"label": r["label"], **{f"tag {k}": series_of(r, k) for k in keys},
             **{k: r["metrics"][k] for k in ("step_time_ns", "samples_per_s")}} for r in rows]
    for part in fitted_table(columns, data, console.width, title="traces (step: mean step time; "
                                                                 "samples/s: batch / step)"):
        console.print(part)
    columns = [Column("label", first, "name"), Column("span_ns", "GPU spans, summed", "ns"),
               Column("kernel_ns", "kernel", "ns"), Column("memcpy_ns", "memcpy", "ns"), Column("api_ns", "API", "ns"),
               Column("memset_ns", "memset", "ns")]
    data = [{"label": label, **{c.key: r["metrics"][c.key] for c in columns[1:]}} for label, r in zip(labels, rows)]
    for part in fitted_table(columns, data, console.width, title="GPU and API time over the whole trace (every "
                                                                 "step and rank, not per step)"):
        console.print(part)
    _bar_tables(console, "rule figures, % (memcpy time overlapping kernels; kernel busy time with 2+ kernels; "
                         "GPU span idle)", first, labels, ["memcpy overlap", "kernel concurrency", "GPU idle"],
                [[r["metrics"][k] for k in ("overlap_pct", "concurrency_pct", "idle_pct")] for r in rows])
    categories = _union(r["metrics"]["category_pct"] for r in rows)
    if categories:
        # each trace's categories rounded together, as analyze's summary and kernel-share show them (87.96% is
        # 87.9% where the categories add up to 100, not 88.0% here and 87.9% there)
        _bar_tables(console, "share of kernel time by kernel category, %", first, labels, categories,
                    [shares_shown([r["metrics"]["category_pct"].get(c) for c in categories]) for r in rows])
    kernel_patterns = list(rows[0]["metrics"]["kernel_pattern_pct"]) if rows else []
    api_patterns = list(rows[0]["metrics"]["api_pattern_pct"]) if rows else []
    if kernel_patterns or api_patterns:
        _bar_tables(console, "--kernel: share of GPU time (kernels + memcpy + memset), %; --api: share of API "
                             "time, %", first, labels,
                    [f"kernel /{p}/" for p in kernel_patterns] + [f"API /{p}/" for p in api_patterns],
                    [[r["metrics"]["kernel_pattern_pct"][p] for p in kernel_patterns]
                     + [r["metrics"]["api_pattern_pct"][p] for p in api_patterns] for r in rows])


def _union(dicts) -> list[str]:
    seen: list[str] = []
    for d in dicts:
        seen.extend(k for k in d if k not in seen)
    order = {c: i for i, c in enumerate(CATEGORY_ORDER)}
    return sorted(seen, key=lambda c: (order.get(c, len(order)), c))


# -- plot -------------------------------------------------------------------------
def share_series(rows: list[dict]) -> dict[str, dict[str, list[float | None]]]:
    """The plotted figures: panel title -> {figure label -> one value per row}."""
    categories = _union(r["metrics"]["category_pct"] for r in rows)
    rule = {label: [r["metrics"][key] for r in rows] for label, key in
            (("memcpy overlap", "overlap_pct"), ("kernel concurrency", "concurrency_pct"), ("GPU idle", "idle_pct"))}
    shares = {f"{c} (of kernel time)": [r["metrics"]["category_pct"].get(c) for r in rows] for c in categories}
    for p in (rows[0]["metrics"]["kernel_pattern_pct"] if rows else {}):
        shares[f"kernel /{p}/ (of GPU time)"] = [r["metrics"]["kernel_pattern_pct"][p] for r in rows]
    for p in (rows[0]["metrics"]["api_pattern_pct"] if rows else {}):
        shares[f"API /{p}/ (of API time)"] = [r["metrics"]["api_pattern_pct"][p] for r in rows]
    times = {label: [None if r["metrics"][key] is None else r["metrics"][key] / 1e6 for r in rows]
             for label, key in (("step", "step_time_ns"), ("GPU spans, summed", "span_ns"), ("kernel", "kernel_ns"),
                                ("memcpy", "memcpy_ns"), ("API", "api_ns"))}
    panels = {"rule figures (%)": rule, "time shares (%)": shares, "time (ms)": times}
    if any(r["metrics"].get("samples_per_s") is not None for r in rows):
        panels["throughput (samples/s)"] = {"samples/s": [r["metrics"].get("samples_per_s") for r in rows]}
    return panels


def x_axis(rows: list[dict], by: str | None) -> tuple[bool, list[float], list[float], list[str]]:
    """(numeric, x of each row, tick positions, tick labels): the ``by`` tag's value when every value is a
    number, else the position of the row's ``by`` value (of its trace's name without ``by``) among them."""
    values = [r["tags"][by] if by else r["label"] for r in rows]
    numeric = bool(by) and all(sort_key(v)[0] == 0 for v in values)
    ticks = sorted(dict.fromkeys(values), key=sort_key) if by else list(dict.fromkeys(values))
    if numeric:
        return True, [float(v) for v in values], [float(v) for v in ticks], ticks
    where = {v: float(i) for i, v in enumerate(ticks)}
    return False, [where[v] for v in values], [where[v] for v in ticks], ticks


def plot_lines(rows: list[dict], by: str | None, series: str | None = None) -> dict[str, dict[str, list[tuple]]]:
    """What the plot draws: panel title -> {line label -> [(x, y), ...]}, one line per figure, and with
    ``series`` one line per figure and value of that tag (``GPU idle · gpu=H100``), each through the rows of
    that value only; points without a value are left out."""
    _, xs, _, _ = x_axis(rows, by)
    groups = list(dict.fromkeys(series_of(r, series) for r in rows)) if series else [None]
    out: dict[str, dict[str, list[tuple]]] = {}
    for title, figures in share_series(rows).items():
        lines = out.setdefault(title, {})
        for label, values in figures.items():
            for group in groups:
                points = [(x, v) for x, v, r in zip(xs, values, rows)
                          if v is not None and (group is None or series_of(r, series) == group)]
                if points:
                    lines[label if group is None else f"{label} · {series}={group}"] = points
    return out


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_STYLES = ("-", "--", ":", "-.")


def plot(rows: list[dict], by: str | None, out: Path, series: str | None = None) -> None:
    """Each figure against the ``by`` tag (one line per ``series`` value), as PNG, SVG or an HTML page: drawn
    by plotly (interactive) where the ``html`` extra is installed, else matplotlib's SVG inline."""
    if out.suffix.lower() == ".html":
        try:
            import plotly.graph_objects as go
            import plotly.io as pio
            from plotly.subplots import make_subplots
        except ImportError:
            pass
        else:
            figure = _plotly_figure(go, make_subplots, rows, by, series)
            chart = pio.to_html(figure, include_plotlyjs=True, full_html=False)
            out.write_text(_html_page(rows, by, chart, series), encoding="utf-8")
            return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--out needs matplotlib, which is in the optional 'plot' extra: "
                         "pip install 'traceparse[plot]'"
                         + (" (or, for .html, plotly: pip install 'traceparse[html]')"
                            if out.suffix.lower() == ".html" else "")) from None
    numeric, xs, ticks, tick_labels = x_axis(rows, by)
    groups = list(dict.fromkeys(series_of(r, series) for r in rows)) if series else [None]
    panels = plot_lines(rows, by, series)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 6.5), layout="constrained")
    trend = numeric or (bool(by) and series is not None)  # points of one sweep: a line shows its trend
    for ax, (title, lines) in zip(axes, panels.items()):
        figures = list(dict.fromkeys(label.split(" · ")[0] for label in lines))
        for label, points in lines.items():
            figure, _, group = label.partition(" · ")
            i = figures.index(figure)
            g = groups.index(group.partition("=")[2]) if group else 0
            ax.plot([p[0] for p in points], [p[1] for p in points], color=f"C{i % 10}",
                    marker=_MARKERS[(g if series else i) % len(_MARKERS)], ms=max(4.0, 9.0 - 1.5 * (0 if series else i)),
                    # traces that are not points of one sweep get markers only: a line would suggest a trend
                    linestyle=_STYLES[g % len(_STYLES)] if trend else "", label=label, alpha=0.9)
        ax.set_title(title)
        ax.set_xlabel(by or "trace")
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, tick_labels, rotation=0 if numeric else 30, ha="center" if numeric else "right")
        ax.minorticks_off()
        if title.endswith("(%)"):
            ax.set_ylim(-3, 103)  # lines at 0 or 100 stay visible off the frame
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            below = -0.14 if numeric else -0.16 - 0.012 * max(len(str(v)) for v in tick_labels)  # clear rotated labels
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, below), ncols=2, frameon=False)
    fig.suptitle(f"traceparse compare: {len(rows):,} traces" + (f" by {by}" if by else "")
                 + (f", one line per {series}" if series else ""))
    suffix = out.suffix.lower()
    if suffix == ".html":
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
        svg = buffer.getvalue()
        svg = svg[svg.find("<svg"):]
        out.write_text(_html_page(rows, by, svg, series), encoding="utf-8")
    else:
        fig.savefig(out, dpi=110, bbox_inches="tight")  # legends sit below the axes: keep them in
    plt.close(fig)


def _plotly_figure(go, make_subplots, rows: list[dict], by: str | None, series: str | None):
    """The plot of :func:`plot` as a plotly figure: one panel per kind of figure, one line per figure (and
    ``series`` value), the same points as matplotlib's."""
    numeric, _, ticks, tick_labels = x_axis(rows, by)
    panels = plot_lines(rows, by, series)
    figure = make_subplots(rows=1, cols=len(panels), subplot_titles=[html.escape(t) for t in panels])
    trend = numeric or (bool(by) and series is not None)
    for col, (title, lines) in enumerate(panels.items(), 1):
        for label, points in lines.items():
            figure.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points],
                                        mode="lines+markers" if trend else "markers", name=html.escape(label),
                                        legendgroup=html.escape(label)), row=1, col=col)
        log = numeric and min(ticks) > 0 and max(ticks) / min(ticks) >= 4
        figure.update_xaxes(title_text=html.escape(by or "trace"), type="log" if log else None,
                            tickvals=ticks, ticktext=[html.escape(str(t)) for t in tick_labels], row=1, col=col)
        if title.endswith("(%)"):
            figure.update_yaxes(range=[-3, 103], row=1, col=col)
    figure.update_layout(title=html.escape(f"traceparse compare: {len(rows):,} traces" + (f" by {by}" if by else "")
                                           + (f", one line per {series}" if series else "")),
                         height=560, width=max(640, 560 * len(panels)), legend=dict(orientation="h", y=-0.2),
                         margin=dict(t=90))
    return figure


def _html_page(rows: list[dict], by: str | None, svg: str, series: str | None = None) -> str:
    keys = tag_keys(rows, by, series)
    # the step, samples/s and span columns as the terminal's tables show them: one unit a column, its decimals
    # (the page wrote 14.610 ms where the screen wrote 14.61, a step of 2.5 s as 2500.000 ms)
    figures = [_format_column(c, [r["metrics"][c.key] for r in rows]) for c in (
        Column("step_time_ns", "step", "ns"), Column("samples_per_s", "samples/s", "number"),
        Column("span_ns", "GPU spans, summed", "ns"))]
    head = ["trace", *keys, *[header for header, _ in figures], "memcpy overlap %", "kernel concurrency %",
            "GPU idle %"]
    body = []
    for n, r in enumerate(rows):
        m = r["metrics"]
        cells = [r["label"], *[series_of(r, k) or "-" for k in keys], *[texts[n] for _, texts in figures],
                 *["-" if m[k] is None else _pct_figure(m[k])
                   for k in ("overlap_pct", "concurrency_pct", "idle_pct")]]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>traceparse compare</title>"
            "<style>body{font-family:sans-serif} td,th{padding:2px 8px;text-align:right}</style></head><body>\n"
            f"{svg}\n<table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>\n"
            + "\n".join(body) + "\n</table>\n<pre>" + html.escape(json.dumps({"rows": rows}, indent=1))
            + "</pre></body></html>\n")


class CompareCommand(Command):
    name = "compare"
    help = "one row of figures per trace, ordered by a tag (e.g. a batch-size sweep), with an optional plot"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        self.add_common_options(parser, traces="+", json=True, fmt=True)
        parser.add_argument("--by", metavar="TAG", help="order the traces by this tag (e.g. batch); every trace needs it")
        parser.add_argument("--kernel", action="append", default=[], metavar="REGEX",
                            help="also show the share of GPU time in kernels matching REGEX (repeatable)")
        parser.add_argument("--api", action="append", default=[], metavar="REGEX",
                            help="also show the share of API time in calls matching REGEX (repeatable)")
        parser.add_argument("--series", metavar="TAG",
                            help="group the traces by this tag (e.g. gpu) and plot one line per value; 'device': "
                                 "by the GPU each trace names (the plot's default when they name several)")
        parser.add_argument("--out", metavar="FILE", help="plot each share against the tag (.png, .svg or .html)")

    def run(self, args: argparse.Namespace, session) -> int:
        kernel_patterns = [_check_pattern("--kernel", p) for p in args.kernel]
        api_patterns = [_check_pattern("--api", p) for p in args.api]
        out = Path(args.out) if args.out else None
        if out is not None and out.suffix.lower() not in PLOT_SUFFIXES:
            raise InputError(f"--out {args.out}: expected a file name ending in {', '.join(PLOT_SUFFIXES)}")
        traces = session.resolve_all(args.traces, fmt=args.format, group=True)  # a capture's files: one trace
        seen, unique = set(), []
        for t in traces:  # the same trace named twice is one row
            if t.id not in seen:
                seen.add(t.id)
                unique.append(t)
        rows = compare_rows(unique, args.by, kernel_patterns, api_patterns, series=args.series)
        warning = device_warning(rows, args.series)
        plot_series = args.series or (DEVICE_SERIES if warning else None)  # never one line through two GPUs
        if warning:
            session.warn(warning + ("; the plot has one line per device" if out is not None and not args.series
                                    else ""))
        notes = _comparability(rows, [trace_ranks(t) for t in unique])
        for note in notes:
            session.warn(note)
        if out is not None:
            plot(rows, args.by, out, series=plot_series)
            if not args.quiet:
                session.err.print(literal(f"wrote {out}"))
        if args.json:
            self.print_json({"by": args.by, "series": args.series, "rows": rows,
                             "warnings": ([warning] if warning else []) + notes})
        else:
            render(session.out, rows, args.by, args.series)
        return 0


def _comparability(rows: list[dict], ranks: list[int] = ()) -> list[str]:
    """What makes the rows' figures unlike each other, said once each: traces that give their GPU work as
    totals (no span, no idle, no overlap), traces with different numbers of steps (the time columns are
    whole-trace totals, so a trace of more steps has more of everything) and, ``ranks`` being each row's number
    of ranks, runs of different numbers of ranks (the times are summed over a run's ranks)."""
    notes = []
    if len(set(ranks)) > 1:
        notes.append(f"the traces hold {', '.join(f'{n:,}' for n in sorted(set(ranks)))} ranks: the GPU and API "
                     "times are summed over a run's ranks, compare them per rank (divide by the ranks) or the "
                     "shares and step times")
    totals = [r["label"] for r in rows if r["metrics"]["span_ns"] is None and r["metrics"]["gpu_ns"]]
    if totals:
        notes.append(f"{', '.join(totals)}: GPU work as totals, with no timeline: its span, idle and overlap are "
                     "unknown (-)")
    unrecorded: dict[tuple, list[str]] = {}  # the traces that lack a kind -> the kinds they lack
    for kind, words in (("kernel", "kernels"), ("memcpy", "copies"), ("api", "API calls"), ("memset", "memsets")):
        missing = tuple(r["label"] for r in rows if r["metrics"][f"{kind}_ns"] is None)
        if missing:
            unrecorded.setdefault(missing, []).append(words)
    if unrecorded:  # a "-" of the times table: nothing of the kind was recorded, which is no measured 0
        said = [f"{', '.join(kinds[:-1]) + ' and ' if len(kinds) > 1 else ''}{kinds[-1]} in "
                f"{'every trace' if len(whom) == len(rows) else ', '.join(whom)}" for whom, kinds in unrecorded.items()]
        notes.append(f"not recorded, so their time is unknown (-) rather than 0: {'; '.join(said)}")
    counts = {r["metrics"]["steps"] for r in rows if r["metrics"]["steps"]}
    if len(counts) > 1:
        notes.append(f"the traces hold {', '.join(str(c) for c in sorted(counts))} steps: the GPU and API times "
                     "are whole-trace totals, compare them per step (divide by the steps) or the step times")
    return notes


@hookimpl
def traceparse_commands():
    return [CompareCommand()]
