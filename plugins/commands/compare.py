"""Command ``compare``: one row of figures per trace, ordered by a tag (e.g. a batch-size sweep).

Figures per trace (``--json`` keys in ``metrics``):

* ``span_ns``, ``idle_ns``, ``idle_pct``: as the ``gpu-idle`` rule gives them
  (GPU span from first to last GPU activity, summed over devices, and its idle
  share; null without GPU rows, 0 / 0 / null with aggregated ones only);
* ``overlap_pct``: as ``low-memcpy-overlap`` (share of memcpy time that
  overlaps kernels); ``concurrency_pct``: as ``low-kernel-concurrency``
  (share of kernel busy time with two or more kernels running); null when
  there is nothing to measure (no memcpy / no kernels, or aggregated rows only);
* ``category_pct``: as ``kernel-share``, the share of kernel time per kernel
  category;
* ``kernel_ns``, ``memcpy_ns``, ``memset_ns``, ``api_ns``: Σ duration_ns of the
  rows of that kind (timed events preferred over aggregated rows of the same
  kind, as the rules do, so no call counts twice); ``gpu_ns`` = kernel +
  memcpy + memset;
* ``kernel_pattern_pct``: for each ``--kernel REGEX``, 100 × Σ time of the
  kernels whose name matches / ``gpu_ns`` (nvprof's "GPU activities" Time(%),
  the seed study's "% of time in ncclBroadcast");
  ``api_pattern_pct``: for each ``--api REGEX``, 100 × Σ time of the matching
  API calls / ``api_ns`` (nvprof's "API calls" Time(%)). Patterns are
  case-insensitive regular expressions searched anywhere in the name.

The figures come from the measures the rules use (:mod:`traceparse.measures`),
so compare shows what ``traceparse analyze`` reports. Rows are ordered by the
``--by`` tag's value (numerically when every value is a number); a trace
without the tag is an error. Traces from different GPUs are compared with a
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
from traceparse.plugins import hookimpl
from traceparse.report import fmt_ns
from traceparse.trace import Trace
KINDS = ("kernel", "memcpy", "memset", "api")
CATEGORY_ORDER = list(expr.KERNEL_CATEGORY_NAMES)
PLOT_SUFFIXES = (".png", ".svg", ".html")


def trace_metrics(trace: Trace, kernel_patterns: list[str], api_patterns: list[str]) -> dict[str, Any]:
    """The compare figures of one trace (see the module docstring)."""
    events = trace.events
    present = set(events["kind"].cast(pl.String).unique().to_list())
    metrics: dict[str, Any] = {"span_ns": None, "idle_ns": None, "idle_pct": None}
    if present & set(expr.GPU_KINDS):
        busy = measures.device_busy(events)
        span, idle = int(busy["span_ns"].sum() or 0), int(busy["idle_ns"].sum() or 0)
        metrics.update(span_ns=span, idle_ns=idle, idle_pct=expr.pct(idle, span))
    copies = measures.overlap(events, a=("memcpy",), b=("kernel",))
    metrics["overlap_pct"] = expr.pct(int(copies["overlapped_ns"].sum() or 0), int(copies["time_ns"].sum() or 0))
    kernels = measures.concurrency(events)
    busy_ns = int(kernels["busy_ns"].sum() or 0)
    metrics["concurrency_pct"] = (None if kernels.height == 0 else
                                  expr.pct(int(kernels["concurrent_ns"].sum() or 0), busy_ns) if busy_ns else 0.0)
    categories = measures.time_by_category(events)
    kernel_ns = int(categories["time_ns"].sum() or 0)
    shares = {r["category"]: expr.pct(r["time_ns"], kernel_ns) for r in categories.iter_rows(named=True)}
    metrics["category_pct"] = {c: shares[c] for c in CATEGORY_ORDER if c in shares}
    metrics["category_pct"].update({c: v for c, v in shares.items() if c not in CATEGORY_ORDER})
    by_name = measures.time_by_name(events, kinds=KINDS, prefer_timed=True)
    totals = {kind: int(by_name.filter(pl.col("kind") == kind)["time_ns"].sum() or 0) for kind in KINDS}
    for kind in KINDS:
        metrics[f"{kind}_ns"] = totals[kind]
    metrics["gpu_ns"] = totals["kernel"] + totals["memcpy"] + totals["memset"]
    kernel_rows, api_rows = by_name.filter(pl.col("kind") == "kernel"), by_name.filter(pl.col("kind") == "api")
    metrics["kernel_pattern_pct"] = {p: _share(kernel_rows, p, metrics["gpu_ns"]) for p in kernel_patterns}
    metrics["api_pattern_pct"] = {p: _share(api_rows, p, totals["api"]) for p in api_patterns}
    return metrics


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


def compare_rows(traces: list[Trace], by: str | None, kernel_patterns: list[str],
                 api_patterns: list[str]) -> list[dict]:
    """The rows of ``compare --json``, ordered by the ``by`` tag."""
    if by:
        missing = [t for t in traces if by not in t.meta.tags]
        if missing:
            t = missing[0]
            raise InputError(f"trace {t.id} ({t.meta.path}) has no tag {by!r} (its tags: "
                             f"{', '.join(f'{k}={v}' for k, v in t.meta.tags.items()) or 'none'}); "
                             f"ingest it with --tag {by}=VALUE")
        traces = sorted(traces, key=lambda t: sort_key(t.meta.tags[by]))
    return [{"trace": t.id, "path": t.meta.path, "format": t.meta.format,
             "device": ", ".join(d.name for d in t.meta.devices if d.name) or None,
             "tags": dict(t.meta.tags), "metrics": trace_metrics(t, kernel_patterns, api_patterns)}
            for t in traces]


def device_warning(rows: list[dict]) -> str | None:
    """A warning when the traces name different devices, else None."""
    devices = {r["device"] for r in rows if r["device"]}
    if len(devices) <= 1:
        return None
    listed = "; ".join(f"{r['trace']}: {r['device']}" for r in rows if r["device"])
    return f"the traces come from different devices ({listed}); their figures are not like for like"


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
    text.append(f"{pct:6.1f}")
    return text


def _label(row: dict, by: str | None) -> str:
    name = Path(row["path"]).name if row["path"] else ""
    return row["tags"][by] if by else (name or row["trace"])


def _table(title: str, first: str) -> Table:
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(first, no_wrap=True)
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
            table.add_column(headers[i], no_wrap=True, min_width=max(BAR_WIDTH + 6, len(headers[i])))
        for label, row in zip(labels, values):
            table.add_row(label, *[bar(row[i]) for i in group])
        console.print(table)


def render(console, rows: list[dict], by: str | None) -> None:
    """Tables with one row per trace: times; the rules' figures; kernel-time shares; pattern shares."""
    first = by or "trace"
    labels = [_label(r, by) for r in rows]
    table = _table("GPU and API time", first)
    for column in ("trace", "GPU span", "kernel", "memcpy", "memset", "API"):
        table.add_column(column, justify="left" if column == "trace" else "right", no_wrap=True)
    for label, r in zip(labels, rows):
        m = r["metrics"]
        table.add_row(label, r["trace"][:8], *[fmt_ns(m[k]) for k in
                                               ("span_ns", "kernel_ns", "memcpy_ns", "memset_ns", "api_ns")])
    console.print(table)
    _bar_tables(console, "rule figures, % (memcpy time overlapping kernels; kernel busy time with 2+ kernels; "
                         "GPU span idle)", first, labels, ["memcpy overlap", "kernel concurrency", "GPU idle"],
                [[r["metrics"][k] for k in ("overlap_pct", "concurrency_pct", "idle_pct")] for r in rows])
    categories = _union(r["metrics"]["category_pct"] for r in rows)
    if categories:
        _bar_tables(console, "share of kernel time by kernel category, %", first, labels, categories,
                    [[r["metrics"]["category_pct"].get(c) for c in categories] for r in rows])
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
    """The plotted series: panel title -> {line label -> one value per row}."""
    categories = _union(r["metrics"]["category_pct"] for r in rows)
    rule = {label: [r["metrics"][key] for r in rows] for label, key in
            (("memcpy overlap", "overlap_pct"), ("kernel concurrency", "concurrency_pct"), ("GPU idle", "idle_pct"))}
    shares = {f"{c} (of kernel time)": [r["metrics"]["category_pct"].get(c) for r in rows] for c in categories}
    for p in (rows[0]["metrics"]["kernel_pattern_pct"] if rows else {}):
        shares[f"kernel /{p}/ (of GPU time)"] = [r["metrics"]["kernel_pattern_pct"][p] for r in rows]
    for p in (rows[0]["metrics"]["api_pattern_pct"] if rows else {}):
        shares[f"API /{p}/ (of API time)"] = [r["metrics"]["api_pattern_pct"][p] for r in rows]
    times = {label: [None if r["metrics"][key] is None else r["metrics"][key] / 1e6 for r in rows]
             for label, key in (("GPU span", "span_ns"), ("kernel", "kernel_ns"), ("memcpy", "memcpy_ns"),
                                ("API", "api_ns"))}
    return {"rule figures (%)": rule, "time shares (%)": shares, "time (ms)": times}


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def plot(rows: list[dict], by: str | None, out: Path) -> None:
    """Each share (and the times) against the tag, as PNG, SVG or an HTML page with the SVG inline."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--out needs matplotlib, which is in the optional 'plot' extra: "
                         "pip install 'traceparse[plot]'") from None
    labels = [r["tags"][by] if by else (Path(r["path"]).name if r["path"] else r["trace"]) for r in rows]
    numeric = bool(by) and all(sort_key(v)[0] == 0 for v in labels)
    xs = [float(v) for v in labels] if numeric else list(range(len(rows)))
    series = share_series(rows)
    fig, axes = plt.subplots(1, 3, figsize=(18, 6.5), layout="constrained")
    for ax, (title, lines) in zip(axes, series.items()):
        for i, (label, values) in enumerate(lines.items()):
            points = [(x, v) for x, v in zip(xs, values) if v is not None]
            if not points:
                continue
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=_MARKERS[i % len(_MARKERS)], ms=max(4.0, 9.0 - 1.5 * i),
                    # traces that are not points of one numeric sweep get markers only: a line would suggest a trend
                    linestyle=("-" if i < 10 else "--") if numeric else "", label=label, alpha=0.9)
        ax.set_title(title)
        ax.set_xlabel(by or "trace")
        if numeric and min(xs) > 0 and max(xs) / min(xs) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, labels, rotation=0 if numeric else 30, ha="center" if numeric else "right")
        ax.minorticks_off()
        if title.endswith("(%)"):
            ax.set_ylim(-3, 103)  # lines at 0 or 100 stay visible off the frame
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            below = -0.14 if numeric else -0.16 - 0.012 * max(len(str(v)) for v in labels)  # clear rotated labels
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, below), ncols=2, frameon=False)
    fig.suptitle(f"traceparse compare: {len(rows)} traces" + (f" by {by}" if by else ""))
    suffix = out.suffix.lower()
    if suffix == ".html":
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", bbox_inches="tight")
        svg = buffer.getvalue()
        svg = svg[svg.find("<svg"):]
        out.write_text(_html_page(rows, by, svg), encoding="utf-8")
    else:
        fig.savefig(out, dpi=110, bbox_inches="tight")  # legends sit below the axes: keep them in
    plt.close(fig)


def _html_page(rows: list[dict], by: str | None, svg: str) -> str:
    head = ["trace", *([by] if by else []), "GPU span (ms)", "memcpy overlap %", "kernel concurrency %", "GPU idle %"]
    body = []
    for r in rows:
        m = r["metrics"]
        cells = [r["trace"], *([r["tags"][by]] if by else []),
                 "-" if m["span_ns"] is None else f"{m['span_ns'] / 1e6:.3f}",
                 *["-" if m[k] is None else f"{m[k]:.1f}" for k in ("overlap_pct", "concurrency_pct", "idle_pct")]]
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
        parser.add_argument("--out", metavar="FILE", help="plot each share against the tag (.png, .svg or .html)")

    def run(self, args: argparse.Namespace, session) -> int:
        kernel_patterns = [_check_pattern("--kernel", p) for p in args.kernel]
        api_patterns = [_check_pattern("--api", p) for p in args.api]
        out = Path(args.out) if args.out else None
        if out is not None and out.suffix.lower() not in PLOT_SUFFIXES:
            raise InputError(f"--out {args.out}: expected a file name ending in {', '.join(PLOT_SUFFIXES)}")
        traces = session.resolve_all(args.traces, fmt=args.format)
        seen, unique = set(), []
        for t in traces:  # the same trace named twice is one row
            if t.id not in seen:
                seen.add(t.id)
                unique.append(t)
        rows = compare_rows(unique, args.by, kernel_patterns, api_patterns)
        warning = device_warning(rows)
        if warning:
            session.warn(warning)
        if out is not None:
            plot(rows, args.by, out)
            if not args.quiet:
                session.err.print(f"wrote {out}")
        if args.json:
            self.print_json({"by": args.by, "rows": rows, "warnings": [warning] if warning else []})
        else:
            render(session.out, rows, args.by)
        return 0


@hookimpl
def traceparse_commands():
    return [CompareCommand()]
