"""Command ``traceparse roofline TRACE [--gpu NAME] [--out FILE.png|.svg|.html]``: the roofline of a trace.

The figures are those of the ``arithmetic-intensity`` rule
(:func:`traceparse.measures.roofline.roofline`): per kernel
(or per kernel name, the default) FLOPs, DRAM bytes, time, arithmetic
intensity, achieved GFLOP/s, and the GPU's roofs from the catalog. The
terminal gets a table sorted by time; ``--out`` writes a log-log chart
(memory roof, one compute roof per precision in the trace, a point per row
with its area proportional to its time) with matplotlib, which is in the
optional ``plot`` extra. ``--model NAME`` (needs torch) or ``--model-gflops``
let the model's FLOPs stand in for tensor-core work the trace did not count.
"""

from __future__ import annotations

import argparse
import html
import io
from pathlib import Path


from traceparse import expr
from traceparse.catalog import gpu_for_trace
from traceparse.command import gpu_choice
from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.plugins import hookimpl
from traceparse.names import short_names
from traceparse.summary import other_devices
from traceparse.report import fitted_table, fmt_ns, short_name, shown_path
from traceparse.verdict import Column
from traceparse.figures import fmt_number, fmt_pct
from traceparse.text import literal, markup_literal
from traceparse.measures.roofline import roofline

CHART_SUFFIXES = (".png", ".svg", ".html")
PLOT_EXTRA_HINT = "install the plot extra: pip install 'traceparse[plot]' (matplotlib)"
LABELLED_POINTS = 8
PRECISION_COLOURS = {"fp32": "#1f77b4", "fp64": "#9467bd", "fp16": "#17becf", "bf16": "#8c564b",
                     "tf32_tensor": "#ff7f0e", "fp16_tensor": "#d62728", "bf16_tensor": "#e377c2",
                     "fp8_tensor": "#bcbd22", "int8_tensor": "#7f7f7f", "fp64_tensor": "#2ca02c"}


class RooflineCommand(Command):
    name = "roofline"
    help = "roofline of a trace: arithmetic intensity and GFLOP/s per kernel against the GPU's roofs"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        self.add_common_options(parser, traces="*", json=True, fmt=True,
                                trace_help="a store id (or prefix) or a path; several paths only when they are one "
                                           "capture (an nvprof GPU trace log and the metrics log of the same "
                                           "program; default: the last ingested trace)")
        self.add_gpu_options(parser)
        parser.add_argument("--out", metavar="FILE", help="write the chart: .png, .svg or .html (needs matplotlib, "
                                                          "the plot extra)")
        parser.add_argument("--group", choices=("name", "launch"), default="name",
                            help="a row per kernel name (default) or per kernel launch")
        parser.add_argument("--top", type=int, default=20, metavar="N", help="rows in the table (0: all; default 20)")
        parser.add_argument("--model-gflops", type=float, default=0.0, metavar="GFLOP",
                            help="FLOPs of the profiled work, for tensor-core work the trace did not count")
        parser.add_argument("--model", metavar="NAME", help="torchvision model (vgg11, resnet18, ...) whose FLOPs "
                                                           "stand in for uncounted tensor-core work (needs torch)")
        parser.add_argument("--batch", type=int, default=16, help="batch size for --model (default 16)")
        parser.add_argument("--step", choices=("train", "forward"), default="train",
                            help="--model work per profiled step: train = 3 x forward (default), or forward")

    def run(self, args: argparse.Namespace, session) -> int:
        out = Path(args.out) if args.out else None
        if out is not None:
            if out.suffix.lower() not in CHART_SUFFIXES:
                raise InputError(f"--out {args.out}: expected a .png, .svg or .html file name")
            if not (out.suffix.lower() == ".html" and _plotly() is not None):
                require_matplotlib()
        model_gflops, model_note = _model_gflops(args)
        traces = session.resolve_all(args.traces, fmt=args.format, group=True)
        if len(traces) != 1:
            raise InputError(f"roofline takes one trace; these {len(args.traces)} arguments make {len(traces)} "
                             "traces: give one, or the files of one capture")
        trace = traces[0]
        choice = gpu_choice(args)
        spec, how = gpu_for_trace(trace, choice)
        result = roofline(trace, spec, model_gflops=model_gflops, group=args.group)
        others = other_devices(trace.meta)
        if result["source"] == "none" and others and not (trace.events["kind"] == "kernel").any():
            kinds = ", ".join(sorted(others))
            raise InputError(f"{trace.meta.path or trace.id}: no GPU kernels to place on a GPU's roofline: the "
                             f"trace's devices are {kinds}s (hotspots gives their ops' time)")
        if result["source"] == "none" and not trace.events.select(expr.kind_is(*expr.GPU_KINDS).any()).item():
            raise InputError(f"{trace.meta.path or trace.id}: no GPU kernels to place on a GPU's roofline: the trace "
                             "recorded no GPU activity (a CPU-only run; hotspots gives its operators' time)")
        if result["source"] == "none":
            raise InputError(f"{trace.meta.path or trace.id}: no FLOP or DRAM byte counts to put on a roofline "
                             "(ncu metrics, or torch.profiler with record_shapes=True or with_flops, or a JAX "
                             "profile's .xplane.pb, are needed; see docs/roofline.md)")
        if args.json:
            self.print_json({"trace": trace.id, "gpu": spec["name"] if spec else None, "gpu_source": how,
                             "model_note": model_note, "group": args.group, "total": result["total"],
                             **result["extra"], "items": result["items"]})
        else:
            print_text(session.out, trace, spec, how, result, args.top, model_note)
        if out is not None:
            write_chart(out, trace, spec, result, gpu=choice)
            if not args.quiet:
                session.err.print(literal(f"wrote {out}"))
        return 0


def require_matplotlib():
    """The matplotlib module (Agg backend), or a one-line InputError naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise InputError(f"--out needs matplotlib, which is not installed: {PLOT_EXTRA_HINT}") from None
    matplotlib.use("Agg")
    return matplotlib


def _model_gflops(args) -> tuple[float, str | None]:
    if args.model and args.model_gflops:
        raise InputError("give --model or --model-gflops, not both")
    if args.model_gflops:
        return args.model_gflops, f"model FLOPs given: {args.model_gflops:g} GFLOP"
    if not args.model:
        return 0.0, None
    from traceparse_plugins.commands.flops import model_flops

    forward = model_flops(args.model, args.batch)
    factor = 3 if args.step == "train" else 1
    gflops = factor * forward / 1e9
    how = "3 x forward (backward ~ 2 x forward)" if factor == 3 else "forward only"
    return gflops, f"model FLOPs: {args.model} batch {args.batch}, {how} = {gflops:.2f} GFLOP"


# -- text -----------------------------------------------------------------------
def roof_lines(result: dict) -> list[tuple[str, float, float]]:
    """(precision, peak GFLOP/s, ridge FLOP/byte) of the roofs worth drawing: fp32 and the trace's precisions."""
    peaks = result["peaks"]
    wanted = ["fp32"] + sorted(set(result["extra"].get("flops_by_precision", {}))
                               | {i["precision"] for i in result["items"] if i.get("precision")})
    out = []
    for p in dict.fromkeys(wanted):
        if p in peaks and "dram" in peaks:
            out.append((p, peaks[p], peaks[p] / peaks["dram"]))
    return sorted(out, key=lambda r: r[1])


def print_text(console, trace, spec, how, result, top: int, model_note: str | None) -> None:
    """The roofline as text: the roofs, the total, and a table of the rows sorted by time."""
    total, extra, items = result["total"], result["extra"], result["items"]
    console.print(f"[bold]Roofline[/bold] of {markup_literal(trace.id)}  {markup_literal(shown_path(trace.meta.path))}")
    if spec:
        roofs = "; ".join(f"{p} {peak:,.0f} GFLOP/s (ridge {ridge:.3g} FLOP/B)" for p, peak, ridge in roof_lines(result))
        dram = spec.get("dram_gbps")
        dram = fmt_number(dram) if isinstance(dram, (int, float)) else "?"
        console.print(literal(f"GPU: {how}. Roofs: DRAM {dram} GB/s; {roofs}"))
    else:
        console.print(literal(f"GPU unknown: {how}; peaks, bound and roof % are left out."))
    if model_note:
        console.print(literal(model_note))
    if extra.get("note"):
        whose = "these kernels" if extra.get("derived_from") == "hlo" else "these operators' kernels"
        console.print(literal(f"{extra['note']}; {whose} are {fmt_pct(extra['placed_time_pct'])} of "
                              "the trace's kernel time." if extra.get("placed_time_pct") is not None
                              else extra["note"] + "."))
    time_total = total.get("time_ns") or 0
    console.print(f"Total: {_g(total['flops'], 1e9, 'GFLOP')}, {_g(total['dram_bytes'], 1e9, 'GB')}, "
                  f"{fmt_ns(total['time_ns'])}; AI {_f(total['arithmetic_intensity'])} FLOP/B, "
                  f"{_f(total['achieved_gflops'])} GFLOP/s"
                  + (f", {total['bound']}-bound at {fmt_pct(total['roof_pct'])} of the roof"
                     if total.get("bound") else ""))
    shown = items if top <= 0 else items[:top]
    rows = [{"name": i["name"], "n": i.get("launches", i.get("calls", 1)), "time_ns": i["time_ns"],
             "share": 100.0 * (i["time_ns"] or 0) / time_total if time_total else None, "flops": i["flops"],
             "ai": i["arithmetic_intensity"], "gflops": i["achieved_gflops"], "roof_pct": i["roof_pct"],
             "prec": _precision_label(i), "bound": i.get("bound") or "-"} for i in shown]
    label = "kernel [shapes]" if extra.get("derived_from") == "hlo" else "operator [shapes]"
    columns = TABLE_COLUMNS if result["source"] != "shapes" else \
        [Column("name", label, "name"), *TABLE_COLUMNS[1:]]  # a row per operator (or kernel) and shapes
    for part in fitted_table(columns, rows, console.width):
        console.print(part)
    if len(items) > len(shown):
        console.print(f"({len(items) - len(shown):,} more rows; --top 0 lists all)")
    console.print("prec.: the precision of most of the row's FLOPs (TC: tensor cores); *: a tensor-core kernel whose "
                  "tensor FLOPs were not counted, so its FLOPs, FLOP/B and GFLOP/s are lower bounds; ~: FLOPs "
                  "partly estimated from the model (docs/roofline.md).")
    if extra.get("missing"):
        console.print(literal(f"missing: {extra['missing']}"))


#: The terminal table's columns, the most important first (the last are dropped on a narrow screen).
TABLE_COLUMNS = [Column("name", "kernel", "name"), Column("time_ns", "time", "ns"), Column("share", "%", "pct"),
                 Column("prec", "prec.", "text"), Column("flops", "FLOPs", "flops"), Column("ai", "FLOP/B", "number"),
                 Column("gflops", "GFLOP/s", "number"), Column("roof_pct", "roof%", "pct"),
                 Column("bound", "bound", "text"), Column("n", "n", "count")]


def _precision_label(item: dict) -> str:
    """A short precision label: ``tf32 TC`` for tensor work, ``*`` for lower bounds, ``~`` for estimates."""
    precision = item.get("precision") or "-"
    label = precision.replace("_tensor", " TC")
    if item.get("flops_lower_bound"):
        label += "*"
    elif item.get("flops_estimated"):
        label += "~"
    return label


def _f(value, digits: int = 3) -> str:
    """A figure as analyze's arithmetic-intensity writes it (:func:`traceparse.figures.fmt_number`: 52.35 FLOP/B
    there read 52.4 here), a percentage to one decimal (``digits`` 1); ``-`` when unknown."""
    if value is None:
        return "-"
    return fmt_pct(value).removesuffix("%") if digits == 1 else fmt_number(value)


def _g(value, scale: float, unit: str = "", digits: int = 4) -> str:
    """``value / scale`` as :func:`_f` writes it, with ``unit``: never with an exponent (12,345 GFLOP read
    "1.234e+04 GFLOP")."""
    if value is None:
        return "-"
    text = fmt_number(value / scale)
    return f"{text} {unit}" if unit else text


# -- chart ----------------------------------------------------------------------
def _plotly():
    """plotly's graph_objects when the ``html`` extra is installed, else None."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    return go


def write_chart(out: Path, trace, spec, result, gpu=None) -> None:
    """Write the log-log roofline chart as PNG, SVG or HTML: the HTML page draws it with plotly (the ``html``
    extra, interactive) where installed, else holds matplotlib's SVG; the table follows the chart."""
    go = _plotly() if out.suffix.lower() == ".html" else None
    if go is not None:
        import plotly.io as pio

        from traceparse_plugins.commands.report import charts, data  # the report page's roofline chart

        roof = data.roofline_points(trace, gpu)
        body = (pio.to_html(charts.roofline_chart(go, roof).figure, include_plotlyjs=True, full_html=False)
                if roof else "<p>no kernel has both FLOPs and DRAM bytes: nothing to plot</p>")
        try:
            out.write_text(_html_page(trace, spec, result, body, svg=False), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"--out {out}: cannot write the chart ({exc.strerror or exc})") from None
        return
    matplotlib = require_matplotlib()
    figure = draw_chart(matplotlib, trace, spec, result)
    suffix = out.suffix.lower()
    import matplotlib.pyplot as plt

    try:
        if suffix == ".html":
            buffer = io.StringIO()
            figure.savefig(buffer, format="svg", bbox_inches="tight")
            out.write_text(_html_page(trace, spec, result, buffer.getvalue()), encoding="utf-8")
        else:
            figure.savefig(out, format=suffix[1:], dpi=150, bbox_inches="tight")
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write the chart ({exc.strerror or exc})") from None
    finally:
        plt.close(figure)


def draw_chart(matplotlib, trace, spec, result):
    """The matplotlib figure: memory roof, compute roofs, a point per row sized by its time."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    items = result["items"]
    plotted = [i for i in items if i["arithmetic_intensity"] and i["achieved_gflops"]]
    skipped = [i for i in items if i not in plotted]
    roofs = roof_lines(result)
    labelled_count = min(LABELLED_POINTS, len(plotted))
    fig, ax = plt.subplots(figsize=(10, 6.2 + 0.16 * labelled_count))
    fig.subplots_adjust(bottom=(0.65 + 0.16 * labelled_count) / (6.2 + 0.16 * labelled_count))
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [i["arithmetic_intensity"] for i in plotted]
    ys = [i["achieved_gflops"] for i in plotted]
    if roofs:
        x_lo = min(xs + [r[2] for r in roofs] + [1.0]) / 4
        x_hi = max(xs + [r[2] for r in roofs] + [1.0]) * 4
        peak_top = max([r[1] for r in roofs] + ys)
        y_lo = min(ys + [peak_top / 1e4]) / 3
    else:  # no roofs (unknown GPU): frame the points
        x_lo, x_hi = min(xs + [1.0]) / 10, max(xs + [1.0]) * 10
        peak_top, y_lo = max(ys + [1.0]) * 3, min(ys + [1.0]) / 10
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, peak_top * 3)
    dram = result["peaks"].get("dram")
    if dram and roofs:
        ridge_max = max(r[2] for r in roofs)
        ax.plot([x_lo, ridge_max], [x_lo * dram, ridge_max * dram], color="black", lw=1.8)
        ax.text(x_lo * 1.3, x_lo * 1.3 * dram * 1.35, f"DRAM {dram:,.0f} GB/s", rotation=0, fontsize=8,
                color="black", va="bottom")
    for precision, peak, ridge in roofs:
        colour = PRECISION_COLOURS.get(precision, "grey")
        ax.plot([ridge, x_hi], [peak, peak], color=colour, lw=1.8)
        ax.plot([ridge, ridge], [y_lo, peak], color=colour, lw=0.8, ls=":")
        # the label sits left of the ridge, above the memory roof, where no point can be
        ax.text(ridge / 1.15, peak * 1.06, f"{precision} {peak / 1000:,.1f} TFLOP/s, ridge {ridge:.3g}",
                ha="right", va="bottom", fontsize=8, color=colour)
    time_total = sum(i["time_ns"] or 0 for i in items) or 1
    for i in plotted:
        share = (i["time_ns"] or 0) / time_total
        size = 20 + 2000 * share
        colour = PRECISION_COLOURS.get(i.get("precision") or "fp32", "grey")
        if i.get("flops_lower_bound"):
            ax.scatter([i["arithmetic_intensity"]], [i["achieved_gflops"]], s=size, facecolors="none",
                       edgecolors=colour, linewidths=1.5, marker="^", zorder=3)
        else:
            ax.scatter([i["arithmetic_intensity"]], [i["achieved_gflops"]], s=size, color=colour, alpha=0.6,
                       edgecolors="black", linewidths=0.4, zorder=3)
    labelled = sorted(plotted, key=lambda i: -(i["time_ns"] or 0))[:LABELLED_POINTS]
    for rank, i in enumerate(labelled, 1):
        ax.annotate(str(rank), (i["arithmetic_intensity"], i["achieved_gflops"]), textcoords="offset points",
                    xytext=(5, 5), fontsize=8, fontweight="bold", zorder=4)
    key = [f"{rank}  {short_name(i['name'], 58)}  ({fmt_pct(100 * (i['time_ns'] or 0) / time_total)} of time"
           f"{', lower bound' if i.get('flops_lower_bound') else ''})" for rank, i in enumerate(labelled, 1)]
    if key:
        fig.text(0.07, 0.005, "\n".join(key), fontsize=7.5, family="monospace", va="bottom")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved GFLOP/s")
    gpu = spec["name"] if spec else "unknown GPU (no roofs)"
    ax.set_title(f"Roofline: {Path(trace.meta.path or trace.id or '').name} on {gpu}", fontsize=11)
    ax.grid(True, which="major", ls="-", lw=0.3, alpha=0.5)
    ax.grid(True, which="minor", ls=":", lw=0.2, alpha=0.4)
    present = list(dict.fromkeys(i.get("precision") or "fp32" for i in plotted))
    handles = [Line2D([], [], marker="o", ls="", color=PRECISION_COLOURS.get(p, "grey"), label=p) for p in present]
    if any(i.get("flops_lower_bound") for i in plotted):
        handles.append(Line2D([], [], marker="^", ls="", markerfacecolor="none", markeredgecolor="black",
                              label="tensor-core kernel, FLOPs a lower bound"))
    handles.append(Line2D([], [], marker="o", ls="", color="grey", alpha=0.5, label="area ∝ time"))
    ax.legend(handles=handles, loc="lower right", fontsize=8, framealpha=0.9)
    if skipped:
        skipped_ns = sum(i["time_ns"] or 0 for i in skipped)
        ax.text(0.01, 0.01, f"not plotted: {len(skipped):,} rows without FLOPs or DRAM bytes "
                            f"({fmt_pct(100 * skipped_ns / time_total)} of the time)", fontsize=7, color="grey",
                transform=ax.transAxes)
    return fig


def _html_page(trace, spec, result, chart: str, svg: bool = True) -> str:
    """The roofline page: its title, the chart (an SVG, or plotly's <div> when ``svg`` is false) and the table."""
    rows = []
    for i, name in zip(result["items"], short_names([i["name"] for i in result["items"]], 70)):
        cells = [name, i.get("launches", 1), fmt_ns(i["time_ns"]), _g(i["flops"], 1e9),
                 _g(i["dram_bytes"], 1e9, digits=3), _f(i["arithmetic_intensity"]), _f(i["achieved_gflops"]),
                 i.get("bound") or "-", _f(i["roof_pct"], 1), i.get("precision") or "-",
                 "lower bound" if i.get("flops_lower_bound") else ""]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("kernel", "n", "time", "GFLOP", "GB", "FLOP/B", "GFLOP/s", "bound",
                                              "roof %", "precision", "note"))
    title = html.escape(f"Roofline of {trace.id} on {spec['name'] if spec else 'unknown GPU'}")
    if svg:  # matplotlib's file, from its <svg> element on; else plotly's <div> as it is
        chart = chart[chart.find("<svg"):] if "<svg" in chart else chart
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title><style>"
            "body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;font-size:13px}"
            "td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right} td:first-child{text-align:left}"
            f"</style></head><body><h1>{title}</h1>\n{chart}\n<table><tr>{head}</tr>{''.join(rows)}</table>"
            "</body></html>\n")


@hookimpl
def traceparse_commands():
    return [RooflineCommand()]
