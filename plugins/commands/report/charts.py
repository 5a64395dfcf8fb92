"""The report's interactive charts: plotly figures drawn from :mod:`.data`, as JSON the page hands to plotly.js.

Every text that comes from the trace (kernel names, categories, device
labels) is HTML-escaped before it goes into a figure: plotly.js reads a few
HTML tags in labels and decodes entities, so an escaped name is shown as
written and never as markup.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from traceparse.errors import ResourceError
from traceparse.names import cut_apart, short_name, short_names
from traceparse.text import visible
from traceparse.report import fmt_ns, fmt_number, fmt_pct
from traceparse.threads import thread_names

from . import data

#: Colours of the rank breakdown's parts and of idle time.
IDLE_COLOUR = "#d9d9d9"
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac",
           "#eeca3b")
#: Characters of a kernel name on a bar's axis label and in its hover text.
LABEL_WIDTH = 60
HOVER_WIDTH = 160
#: Members drawn as lines on the busy timeline; more become the rows of a heatmap.
LINES_UP_TO = 2
#: Members drawn as lines on the collectives chart; more become the rows of a heatmap.
LINES_UP_TO_MEMBERS = 8
#: Top margin of a figure with subplot titles: plotly's toolbar (top right, about 30 px) sits above them.
TOP_WITH_SUBPLOT_TITLES = 64
#: Bottom margin of a figure whose legend sits under its x axis's title.
LEGEND_BELOW_MARGIN = 110
#: Colour of time spent waiting for other ranks.
WAIT_COLOUR = "#e45756"
#: A colour per precision, the same for its roof and its points on the roofline.
PRECISION_COLOURS = {"fp32": "#4c78a8", "fp64": "#b279a2", "fp16": "#72b7b2", "bf16": "#9d755d",
                     "tf32_tensor": "#f58518", "fp16_tensor": "#e45756", "bf16_tensor": "#ff9da6",
                     "fp8_tensor": "#eeca3b", "int8_tensor": "#bab0ac", "fp64_tensor": "#54a24b"}


@dataclass
class Chart:
    """One chart of the page: an id (the div's), a title, a sentence under it, and the plotly figure."""

    id: str
    title: str
    note: str
    figure: object  # plotly.graph_objects.Figure


def esc(text) -> str:
    """Trace-derived text made safe for a plotly label: ``&``, ``<`` and ``>`` as entities, which plotly.js decodes
    back for display (it decodes no ``&quot;``, and without ``<`` a quote can start no tag); control, direction
    and invisible characters shown as the terminal shows them (``\u202e``), so that a label reads as written."""
    return html.escape(visible(str(text)), quote=False)


def _layout(fig, legend_below: bool = False, **extra) -> None:
    """The charts' common layout. ``legend_below``: the legend at the bottom of the figure, under the x axis's
    title (a legend placed relative to the plot runs into that title on a short chart)."""
    base = dict(template="plotly_white", margin=dict(l=60, r=20, t=30, b=50), height=360,
                legend=dict(orientation="h", y=-0.2), font=dict(size=12))
    layout = {**base, **extra}
    if legend_below:
        layout["legend"] = dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0)
        layout["margin"] = {**layout["margin"], "b": LEGEND_BELOW_MARGIN}
    fig.update_layout(**layout)


def _pcts(values: list) -> list[str]:
    """Percentages as a chart's hover text shows them: fmt_pct's, so that a bin busy for 0.02% does not read
    "busy 0.0%" (plotly's own ``:.1f`` rounds it to none)."""
    return [fmt_pct(v) for v in values]


def timeline_chart(go, tl: dict) -> Chart:
    """GPU busy % per member over time: a line per member, or a heatmap (a row per member) for more than
    :data:`LINES_UP_TO` members."""
    fig = go.Figure()
    members = tl["members"]
    if len(members) <= LINES_UP_TO:
        for i, m in enumerate(members):
            fig.add_trace(go.Scatter(x=tl["x_ms"], y=m["busy_pct"], mode="lines", name=esc(m["label"]),
                                     line=dict(width=1.5, color=PALETTE[i % len(PALETTE)], shape="hvh"),
                                     customdata=_pcts(m["busy_pct"]),
                                     hovertemplate="%{x:,.3f} ms: busy %{customdata}<extra>" + esc(m["label"])
                                                   + "</extra>"))
        _layout(fig, legend_below=True, xaxis_title="time from the first GPU activity (ms)",
                yaxis_title="GPU busy (%)", yaxis_range=[0, 102])
    else:
        fig.add_trace(go.Heatmap(x=tl["x_ms"], y=[esc(m["label"]) for m in members],
                                 z=[m["busy_pct"] for m in members], zmin=0, zmax=100, colorscale="Blues",
                                 customdata=[_pcts(m["busy_pct"]) for m in members],
                                 colorbar=dict(title=dict(text="busy %"), thickness=12),
                                 hovertemplate="%{y}, %{x:,.3f} ms: busy %{customdata}<extra></extra>"))
        _layout(fig, xaxis_title="time from the first GPU activity (ms)",
                yaxis=dict(autorange="reversed", automargin=True), height=max(300, 28 * len(members) + 140))
    note = (f"Share of each bin of {fmt_ns(tl['width_ns'])} in which the GPU runs a kernel, copy or memset; "
            "the rest of the bin is idle.")
    return Chart("chart-timeline", "GPU busy over time", note, fig)


def steps_chart(go, sb: dict) -> Chart:
    """Per step: each member's GPU busy time, with the idle rest of the step stacked on it."""
    fig = go.Figure()
    for i, m in enumerate(sb["members"]):
        x = [f"step {n}" for n in m["step"]]
        label = esc(m["label"])
        fig.add_trace(go.Bar(x=x, y=[b / 1e6 for b in m["busy_ns"]], name=f"{label} busy", offsetgroup=str(i),
                             marker_color=PALETTE[i % len(PALETTE)], legendgroup=str(i), legendrank=i,
                             hovertemplate="%{x}: busy %{y:,.3f} ms<extra>" + label + "</extra>"))
        fig.add_trace(go.Bar(x=x, y=[d / 1e6 for d in m["idle_ns"]], base=[b / 1e6 for b in m["busy_ns"]],
                             name="idle", offsetgroup=str(i), marker_color=IDLE_COLOUR, legendgroup="idle",
                             showlegend=i == 0, legendrank=10_000,
                             hovertemplate="%{x}: idle %{y:,.3f} ms<extra>" + label + "</extra>"))
    _layout(fig, barmode="group", yaxis_title="time in the step (ms)")
    return Chart("chart-steps", "GPU busy and idle per step", "Each step's window (as the summary counts steps): the "
                 "time the GPU is busy (coloured) and idle (grey).", fig)


def categories_chart(go, cats: list[dict]) -> Chart:
    """Kernel time by category, as a donut."""
    fig = go.Figure(go.Pie(labels=[esc(c["category"]) for c in cats], values=[c["time_ns"] / 1e6 for c in cats],
                           hole=0.45, sort=False, textinfo="label+percent",
                           customdata=[c["calls"] for c in cats],
                           hovertemplate="%{label}: %{value:,.3f} ms, %{percent}, %{customdata:,} calls<extra></extra>",
                           marker=dict(colors=[PALETTE[i % len(PALETTE)] for i in range(len(cats))])))
    _layout(fig, showlegend=False)
    total = sum(c["time_ns"] for c in cats)
    return Chart("chart-categories", "Kernel time by category", f"{fmt_ns(total)} of kernel time.", fig)


def names_chart(go, names: dict) -> Chart:
    """The kernels with the most time, one bar each, longest on top (the rest are named in the note)."""
    full = [n["name"] for n in names["names"]]
    short = cut_apart(short_names(full, LABEL_WIDTH, compact=True), LABEL_WIDTH)  # equal labels would share a bar
    rows = [(label, short_name(n["name"], HOVER_WIDTH), n["time_ns"], n["calls"])
            for label, n in zip(short, names["names"])]
    labels = [esc(label) for label, *_ in rows]
    if len(set(labels)) < len(set(full)):  # cut alike after all: number them
        labels = [f"{label} ({i})" for i, label in enumerate(labels, 1)]
    total = names["total_ns"] or 1
    fig = go.Figure(go.Bar(
        y=labels[::-1], x=[r[2] / 1e6 for r in rows][::-1], orientation="h", marker_color=PALETTE[0],
        customdata=[[esc(r[1]), fmt_pct(100.0 * r[2] / total), r[3]] for r in rows][::-1],
        hovertemplate="%{customdata[0]}<br>%{x:,.3f} ms (%{customdata[1]} of kernel time), "
                      "%{customdata[2]:,} calls<extra></extra>"))
    _layout(fig, xaxis_title="kernel time (ms)", height=max(360, 24 * len(rows) + 100),
            margin=dict(l=20, r=20, t=30, b=50), yaxis=dict(automargin=True))
    note = (f"The {len(rows):,} kernels with the most time" if len(rows) > 1 else "The one kernel") + \
        ", names shortened (hover for more)"
    if names["rest_names"]:
        note += (f"; the other {names['rest_names']} names take {fmt_ns(names['rest_ns'])} "
                 f"({fmt_pct(100.0 * names['rest_ns'] / total)})")
    return Chart("chart-names", "Kernel time by name", note + ".", fig)


def copies_chart(go, make_subplots, rows: list[dict]) -> Chart:
    """Bytes and time of the copies by direction, side by side; a panel the trace has no figures for (a TAU
    profile's copies have time but no bytes) is left out, and the note says so."""
    x = [esc(r["direction"]) for r in rows]
    rate = [f"{fmt_number(r['bytes'] / r['time_ns'])} GB/s" if r["bytes"] and r["time_ns"] else "-" for r in rows]
    custom = [[r["copies"], g] for r, g in zip(rows, rate)]
    panels = [(key, title, colour, scale, unit) for key, title, colour, scale, unit in (
        ("bytes", "bytes (MB)", PALETTE[1], 1e6, "MB"), ("time_ns", "time (ms)", PALETTE[0], 1e6, "ms"))
        if any(r[key] for r in rows)]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels])
    for col, (key, title, colour, scale, unit) in enumerate(panels, 1):
        fig.add_trace(go.Bar(x=x, y=[(r[key] or 0) / scale for r in rows], marker_color=colour,
                             name=title.split()[0], customdata=custom,
                             hovertemplate="%{x}: %{y:,.3f} " + unit + " in %{customdata[0]:,} copies, "
                                           "%{customdata[1]}<extra></extra>"), row=1, col=col)
    _layout(fig, showlegend=False, margin=dict(l=60, r=20, t=TOP_WITH_SUBPLOT_TITLES, b=50))
    note = ("Host-to-device (HtoD), device-to-host (DtoH), device-to-device (DtoD) and peer copies: "
            + " and ".join({"bytes": "bytes moved", "time_ns": "time taken"}[p[0]] for p in panels) + ".")
    drawn = [p[0] for p in panels]
    missing = [{"bytes": "bytes", "time_ns": "times"}[k] for k in ("bytes", "time_ns") if k not in drawn]
    if missing:
        note += f" The trace gives no {missing[0]} for its copies: that panel is left out."
    return Chart("chart-copies", "Copies by direction", note, fig)


def collectives_chart(go, make_subplots, late: dict) -> Chart:
    """At each collective: how late each member (rank) arrived (top; lines, or a heatmap for more than
    :data:`LINES_UP_TO_MEMBERS` members) and the others' wait it caused, coloured by the member that arrived
    last (bottom): a straggler is the line high above the others and the colour of most of the bars."""
    members, collectives = late["members"], late["collectives"]
    x = list(range(1, len(collectives) + 1))
    labels = [esc(c["label"]) for c in collectives]
    colour = {m["label"]: PALETTE[i % len(PALETTE)] for i, m in enumerate(members)}
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.55, 0.45],
                        subplot_titles=("arrival after the first member (ms)", "wait caused, by who arrived last (ms)"))
    if len(members) <= LINES_UP_TO_MEMBERS:
        for m in members:
            fig.add_trace(go.Scatter(x=x, y=[None if v is None else v / 1e6 for v in m["late_ns"]],
                                     mode="lines+markers", name=esc(m["label"]), legendgroup=esc(m["label"]),
                                     line=dict(color=colour[m["label"]], width=1.5), customdata=labels,
                                     hovertemplate="%{customdata}: arrived %{y:,.3f} ms after the first<extra>"
                                                   + esc(m["label"]) + "</extra>"), row=1, col=1)
    else:
        fig.add_trace(go.Heatmap(x=x, y=[esc(m["label"]) for m in members], colorscale="Reds", zmin=0,
                                 z=[[None if v is None else v / 1e6 for v in m["late_ns"]] for m in members],
                                 colorbar=dict(title=dict(text="late (ms)"), thickness=12, len=0.5, y=0.78),
                                 hovertemplate="%{y}, collective %{x}: %{z:,.3f} ms after the first<extra></extra>"),
                      row=1, col=1)
        fig.update_yaxes(autorange="reversed", row=1, col=1)
    for m in members:
        mine = [c["caused_ns"] / 1e6 if c["last"] == m["label"] else 0.0 for c in collectives]
        if not any(mine):
            continue
        fig.add_trace(go.Bar(x=x, y=mine, name=f"{esc(m['label'])} last", marker_color=colour[m["label"]],
                             legendgroup=esc(m["label"]), showlegend=len(members) > LINES_UP_TO_MEMBERS,
                             customdata=labels, hovertemplate="%{customdata}: the others waited %{y:,.3f} ms for "
                             + esc(m["label"]) + "<extra></extra>"), row=2, col=1)
    _layout(fig, legend_below=True, barmode="stack", height=520,
            margin=dict(l=60, r=20, t=TOP_WITH_SUBPLOT_TITLES, b=50))
    fig.update_xaxes(title_text="collective, in the order they complete", row=2, col=1)
    counts: dict[str, int] = {}
    for c in collectives:
        counts[c["last"]] = counts.get(c["last"], 0) + 1
    most = max(counts, key=lambda k: (counts[k], -list(colour).index(k)))
    note = (f"{most} arrived last at {counts[most]:,} of {len(collectives):,} collectives. Top: each member's arrival "
            "after the first; bottom: the other members' waits at that collective, added up, each moment of waiting "
            "counted once (at the collective waited for first) and only inside the steps, so the bars add up to "
            "the time the members waited.")
    return Chart("chart-collectives", "Arrival at each collective", note, fig)


def ranks_chart(go, rows: list[dict]) -> Chart:
    """Per rank: its mean step time, split into the time it waited at collectives for the last rank and the
    rest of the step (the straggler is the rank that waits least: the others wait for it)."""
    fig = go.Figure()
    y = [esc(r["label"]) for r in rows]
    steps = [max(r["steps"], 1) for r in rows]
    parts = (("waited at collectives for the last to arrive", [r["waited_ns"] for r in rows], WAIT_COLOUR),
             ("rest of the step", [r["step_ns"] - r["waited_ns"] for r in rows], PALETTE[0]))
    for label, values, colour in parts:
        fig.add_trace(go.Bar(y=y, x=[v / n / 1e6 for v, n in zip(values, steps)], orientation="h", name=label,
                             marker_color=colour,
                             customdata=[fmt_pct(100.0 * v / r["step_ns"] if r["step_ns"] else 0)
                                         for v, r in zip(values, rows)],
                             hovertemplate="%{y}: " + label + " %{x:,.3f} ms per step (%{customdata})"
                                           "<extra></extra>"))
    _layout(fig, legend_below=True, barmode="stack", xaxis_title="mean time per step (ms)",
            legend_traceorder="normal", height=max(300, 40 * len(rows) + 160), yaxis=dict(autorange="reversed"))
    least = min(rows, key=lambda r: r["waited_ns"] / r["step_ns"] if r["step_ns"] else 1.0)
    note = (f"Each rank's step time (its steps' windows) and the part of it spent waiting at collectives (each "
            f"wait counted once). {least['label']} waits least: "
            f"{fmt_pct(100.0 * least['waited_ns'] / least['step_ns'] if least['step_ns'] else 0)} of its step time.")
    return Chart("chart-ranks", "Step time per rank", note, fig)


#: Time on the critical path the trace does not show (darker than the steps' grey under it).
UNTRACED_COLOUR = "#9e9e9e"
#: The critical path's segment kinds in the order of the legend.
PATH_KINDS = ("host op", "runtime", "launch", "sync", "kernel", "copy", "memset", "queue", "communication",
              "join", "wake-up", "stream wait", "untraced")


def critical_path_chart(go, cp: dict) -> Chart:
    """Each step's critical path over a per-rank timeline: every rank's steps as grey bars on its row, the path's
    segments over them coloured by kind on the row of the rank they ran on, and a dashed line where the path moves
    to another rank (at a collective that rank joined last)."""
    fig = go.Figure()
    t0 = cp["t0_ns"]
    ms = lambda ns: (ns - t0) / 1e6  # noqa: E731
    steps = cp["steps"]
    fig.add_trace(go.Bar(y=[esc(s["row"]) for s in steps], x=[(s["end_ns"] - s["start_ns"]) / 1e6 for s in steps],
                         base=[ms(s["start_ns"]) for s in steps], orientation="h", name="step", width=0.8,
                         marker=dict(color=IDLE_COLOUR), customdata=[s["step"] for s in steps],
                         hovertemplate="%{y}, step %{customdata}: %{x:,.3f} ms<extra></extra>"))
    kinds = [k for k in PATH_KINDS if any(s["kind"] == k for s in cp["segments"])]
    kinds += sorted({s["kind"] for s in cp["segments"]} - set(kinds))
    for i, kind in enumerate(kinds):
        mine = [s for s in cp["segments"] if s["kind"] == kind]
        colour = UNTRACED_COLOUR if kind == "untraced" else PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Bar(
            y=[esc(s["row"]) for s in mine], x=[(s["end_ns"] - s["start_ns"]) / 1e6 for s in mine],
            base=[ms(s["start_ns"]) for s in mine], orientation="h", name=esc(kind), width=0.4,
            marker=dict(color=colour, line=dict(width=0)),
            customdata=[[esc(short_name(s["name"] or "-", HOVER_WIDTH)), esc(s["lane"]), s["step"]] for s in mine],
            hovertemplate="%{customdata[0]}<br>%{y} %{customdata[1]}, step %{customdata[2]}: %{x:,.3f} ms"
                          "<extra>" + esc(kind) + "</extra>"))
    if cp["crossings"]:
        x, y = [], []
        for c in cp["crossings"]:
            x += [ms(c["at_ns"]), ms(c["at_ns"]), None]
            y += [esc(c["from_row"]), esc(c["to_row"]), None]
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="to another rank", line=dict(color="#333", dash="dot"),
                                 hoverinfo="skip"))
    _layout(fig, legend_below=True, barmode="overlay", xaxis_title="time from the first step (ms)",
            height=max(360, 50 * len(cp["rows"]) + 260),
            yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=[esc(r) for r in cp["rows"]]))
    n = len({s["step"] for s in steps})
    crossed = len(cp["crossings"])
    drawn = "" if cp["paths_drawn"] == cp["paths"] else (
        f" Only the {cp['paths_drawn']} slowest steps' paths of {cp['paths']} are drawn: all of them would take more "
        f"than {data.MAX_PATH_SEGMENTS:,} bars.")
    if cp["ranks"]:
        note = (f"Per step ({n}), the critical path of the rank whose step took longest, over every rank's steps "
                "(grey): each segment on the row of the rank it ran on, coloured by what it is"
                + (f"; it moves to another rank {crossed} times (dotted)." if crossed else ".")) + drawn
    else:
        note = (f"Per step ({n}), its critical path over the step (grey): each segment on the row of the thread or "
                "stream it ran on, coloured by what it is.") + drawn
    return Chart("chart-critical-path", "Critical path of each step", note, fig)


def _colour(precision: str, i: int) -> str:
    return PRECISION_COLOURS.get(precision, PALETTE[(i + 5) % len(PALETTE)])


def roofline_chart(go, roof: dict) -> Chart:
    """Arithmetic intensity against attained GFLOP/s per kernel name, log-log, under the GPU's roofs."""
    fig = go.Figure()
    points = roof["points"]
    lo = min(p["ai"] for p in points) / 4
    hi = max(p["ai"] for p in points) * 4
    dram = roof.get("dram_gbps")
    if roof["roofs"] and dram:
        ridges = [peak / dram for _, peak in roof["roofs"]]
        lo, hi = min(lo, min(ridges) / 4), max(hi, max(ridges) * 4)
        top = max(ridges)
        fig.add_trace(go.Scatter(x=[lo, top], y=[dram * lo, dram * top], mode="lines", name="DRAM roof",
                                 line=dict(color="#555", width=1.5),
                                 hovertemplate=f"DRAM: {dram:,.0f} GB/s<extra></extra>"))
    for i, (precision, peak) in enumerate(roof["roofs"]):
        ridge = peak / dram
        fig.add_trace(go.Scatter(x=[ridge, hi], y=[peak, peak], mode="lines", name=f"{esc(precision)} roof",
                                 line=dict(color=_colour(precision, i), dash="dash", width=1.5),
                                 hovertemplate=f"{esc(precision)}: {peak:,.0f} GFLOP/s, ridge {ridge:.3g} FLOP/B"
                                               "<extra></extra>"))
    longest = max(p["time_ns"] or 0 for p in points) or 1
    by_precision: dict[str, list[dict]] = {}
    for p in points:
        by_precision.setdefault(p["precision"] or "unknown", []).append(p)
    for i, (precision, group) in enumerate(sorted(by_precision.items())):
        fig.add_trace(go.Scatter(
            x=[p["ai"] for p in group], y=[p["gflops"] for p in group], mode="markers", name=esc(precision),
            marker=dict(size=[6 + 30 * math.sqrt((p["time_ns"] or 0) / longest) for p in group], opacity=0.7,
                        color=_colour(precision, i), line=dict(width=0.5, color="#333")),
            customdata=[[esc(short_name(p["name"], HOVER_WIDTH)), fmt_ns(p["time_ns"]), esc(p["bound"] or "-")]
                        for p in group],
            hovertemplate="%{customdata[0]}<br>%{x:.3g} FLOP/B, %{y:,.1f} GFLOP/s, %{customdata[1]}, "
                          "%{customdata[2]}-bound<extra></extra>"))
    _layout(fig, xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
            yaxis=dict(type="log", title="attained GFLOP/s"), height=440)
    gpu = f"roofs of the {esc(roof['gpu'])}" if roof.get("gpu") else "no GPU in the catalog: no roofs"
    if roof.get("source") == "shapes":
        return Chart("chart-roofline", "Roofline", "One point per operator and shapes, its area proportional to its "
                     "kernels' time; FLOPs and bytes derived from the recorded shapes (docs/flops.md), not measured; "
                     f"{gpu}.", fig)
    return Chart("chart-roofline", "Roofline", f"One point per kernel name, its area proportional to its time; "
                 f"{gpu}.", fig)


def require_plotly():
    """The plotly modules (graph_objects, make_subplots, io, offline), or ImportError when plotly is missing."""
    import plotly.graph_objects as go
    import plotly.io as pio
    import plotly.offline as offline
    from plotly.subplots import make_subplots

    return go, make_subplots, pio, offline


def build_charts(trace, gpu: str | None = None, bins: int = data.DEFAULT_BINS) -> tuple[list[Chart], list[str]]:
    """Every chart the trace has data for, and a sentence for each chart left out (and why)."""
    go, make_subplots, _, _ = require_plotly()
    events = trace.events
    charts: list[Chart] = []
    missing: list[str] = []
    late = data.collective_lateness(events)  # a run's charts first: where its straggler shows
    if late:
        charts.append(collectives_chart(go, make_subplots, late))
        ranks = data.rank_steps(events)
        if ranks:
            charts.append(ranks_chart(go, ranks))
    elif events["rank"].drop_nulls().n_unique() > 1:
        missing.append("Arrival at each collective, step time per rank: the ranks share no collective call.")
    try:
        cp = data.critical_path(events, thread_names(trace.meta))
    except ResourceError as exc:  # the other charts stand; this one says why it is not drawn
        cp = None
        missing.append(f"Critical path of each step: not computed, {exc}.")
    else:
        if not cp:
            missing.append("Critical path of each step: the trace has no host events on a thread to follow.")
    if cp:
        charts.append(critical_path_chart(go, cp))
    tl = data.timeline(events, bins)
    if tl:
        charts.append(timeline_chart(go, tl))
    else:
        missing.append("GPU busy over time: the trace has no timed kernels, copies or memsets.")
    sb = data.step_busy(events) if tl else None
    if sb:
        charts.append(steps_chart(go, sb))
    else:
        missing.append("GPU busy per step: the trace marks no steps (ProfilerStep#N, step ranges, optimizer annotations) with timed GPU work.")
    cats = data.kernel_categories(events)
    names = data.kernel_names(events)
    if cats:
        charts.append(categories_chart(go, cats))
    if names["names"]:
        charts.append(names_chart(go, names))
    if not cats and not names["names"]:
        missing.append("Kernel time: the trace has no kernel durations.")
    rows = data.copies(events)
    if rows and any((r["bytes"] or 0) or (r["time_ns"] or 0) for r in rows):
        charts.append(copies_chart(go, make_subplots, rows))
    else:
        missing.append("Copies: the trace has no memcpy with bytes or time.")
    roof = data.roofline_points(trace, gpu)
    if roof:
        charts.append(roofline_chart(go, roof))
    else:
        missing.append("Roofline: the trace has no FLOP counts (ncu metrics or torch.profiler with_flops).")
    return charts, missing
