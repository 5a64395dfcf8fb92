"""Rich terminal rendering: ingest summaries, trace details, findings."""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceparse.names import (cut_apart, fitted_names, key_entries, key_entry,  # noqa: F401 - re-exported
                              middle_cut, short_name, short_names, text_width)
from traceparse.figures import (NS_SCALES, decimals_for, fmt_bytes, fmt_bytes_binary, fmt_number,  # noqa: F401
                                fmt_ns, fmt_pct, fmt_ratio)  # re-exported
from traceparse.figures import SAME_SAID, listed, rank_ranges, share_as_shown, shares_shown
from traceparse.meta import PEAK_MEMORY_GBPS, PEAK_TFLOPS, TraceMeta, device_noun, grouped_by_host, hosts
from traceparse.text import literal, markup_literal, visible
from traceparse.verdict import SEVERITIES, Column

if TYPE_CHECKING:
    from traceparse.rule import Finding

SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "critical": "bold red"}
#: The units shown as a whole number with thousands separators.
COUNT_UNITS = ("count", "problem_count")


def fmt_unit(unit: str, value: Any) -> str:
    """A value for the screen, by its declared unit (:data:`traceparse.verdict.UNITS`)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _plain(value)
    if unit == "ns":
        return fmt_ns(value)
    if unit == "pct":
        return fmt_pct(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "bytes_binary":
        return fmt_bytes_binary(value)
    if unit in COUNT_UNITS:
        return f"{value:,}" if isinstance(value, int) else fmt_number(value)
    if unit == "gbps":
        return f"{fmt_number(float(value))} GB/s"
    if unit == "flops":
        return f"{fmt_number(value / 1e9)} GFLOP"
    if unit == "ratio":
        return fmt_ratio(value)
    if unit == "flop_per_byte":
        return f"{fmt_number(float(value))} FLOP/byte"
    if unit == "metric":  # a counter metric's value (IPC, warps per instruction): a number of its own, no "×"
        return fmt_number(float(value))
    return str(value) if isinstance(value, int) else fmt_number(value)


def shown_path(path: str | None) -> str:
    """A stored trace's path for the screen: relative to the working directory when it lies under it (as the
    user typed it, most often), else whole. JSON keeps the whole path."""
    if not path:
        return ""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") or os.path.isabs(relative) else relative


def trace_label(meta: TraceMeta) -> str:
    """A short name for a trace on screen, where its 16-character id says little: its file's name; for several
    files (an nsys capture's reports) the common start of their names and ``*`` (``resnet18_bs8_*``); a run's
    name; else the id."""
    import os

    names = [os.path.basename(p) for p in (meta.source_paths or [])]
    if len(names) == 1:
        return names[0]
    if len(names) > 1:
        common = os.path.commonprefix(names)
        return common + "*" if common else f"{names[0]} (+{len(names) - 1})"
    run = (meta.extra or {}).get("run") or {}
    return run.get("name") or (os.path.basename(meta.path) if meta.path else str(meta.id or ""))


def warning_count(n: int) -> str:
    """The panel line for warnings printed on stderr already (``ingest``): their number, where to see them."""
    return f"{n}, printed on stderr (`traceparse show` lists {'it' if n == 1 else 'them'})"


def trace_summary(meta: TraceMeta, already_stored: bool = False, title: str | None = None,
                  warnings: bool = True, width: int | None = None) -> Panel:
    """The panel ``ingest`` and ``show`` print: events per kind, span, devices, tags, warnings; titled ``title``,
    else "ingested" or "already in the store". ``warnings`` false (``ingest``, which printed them on stderr as
    it read): the panel gives their number instead of saying them a second time. Source paths longer than
    ``width`` allows are cut where they do not tell the files apart (a capture's reports keep their kinds)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("id", literal(meta.id or ""))
    sources = [shown_path(p) for p in meta.source_paths]
    if width:
        sources = cut_apart(sources, max(width - 17, 20))  # the panel's border and first column
    table.add_row("source", Text("\n").join(map(literal, sources)))
    table.add_row("format", literal(" / ".join(x for x in (meta.format, meta.variant) if x)))
    if meta.tool or meta.tool_version:
        table.add_row("tool", literal(" ".join(x for x in (meta.tool, meta.tool_version) if x)))
    names = hosts(meta)
    if names:
        table.add_row("host" if len(names) == 1 else "hosts", literal(", ".join(names)))
    summary = meta.summary or {}
    kinds = summary.get("events_per_kind", {})
    table.add_row("events", f"{meta.event_count:,}" + (" (" + ", ".join(f"{k} {v:,}" for k, v in kinds.items()) + ")"
                                                        if kinds else "") if meta.event_count is not None else "-")
    table.add_row("time span", fmt_ns(summary.get("span_ns")))
    for d in meta.devices:
        bits = [visible(d.name or "?")]
        identified = _identified(d)
        if identified:
            bits[0] += f" ({identified})"
        amd = str((d.extra or {}).get("vendor", "")).upper() == "AMD"  # a reader's word: HIP's units are CUs
        if d.compute_capability:
            bits.append(f"gfx {d.compute_capability}" if amd else f"sm {d.compute_capability}")
        if d.sm_count:
            bits.append(f"{d.sm_count} {'CUs' if amd else 'SMs'}")
        if d.memory_bytes:
            bits.append(fmt_bytes_binary(d.memory_bytes))  # as memory's "of 79.18 GiB", not "79 GiB" here
        bits.extend(_peaks(d.extra or {}))
        noun = f"{device_noun(d)} " if d.kind else "device "  # GPUs keep their "device N" rows
        table.add_row(literal(f"{noun}{d.id if d.id is not None else '?'}"), literal(", ".join(bits)))
    if meta.tags:
        table.add_row("tags", tags_text(meta.tags))
    if warnings or not meta.warnings:
        for w in meta.warnings:
            table.add_row(Text("warning", style="yellow"), literal(w))
    else:
        table.add_row(Text("warnings", style="yellow"), warning_count(len(meta.warnings)))
    title = title or ("already in the store" if already_stored else "ingested")
    return Panel(table, title=f"[bold]{markup_literal(title)}[/bold]", expand=False)


#: Hosts named in a run panel's line of hosts; the rest are counted.
HOSTS_LISTED = 4


def hosts_line(on: dict[str, str], ranks: int) -> str:
    """A run's line of hosts (its panel, its page) from {rank (text): host}: ``vm (every rank)``, or each host with
    its ranks (``2 — node-a: ranks 0–3; node-b: ranks 4–7``), the ranks whose host is not known counted."""
    by_host = grouped_by_host(on)
    unknown = ranks - len(on)
    if len(by_host) == 1 and not unknown:
        return f"{next(iter(by_host))} (every rank)"
    parts = [f"{host}: rank{'s' if len(r) > 1 else ''} {rank_ranges(r)}"
             for host, r in list(by_host.items())[:HOSTS_LISTED]]
    if len(by_host) > HOSTS_LISTED:
        parts.append(f"{len(by_host) - HOSTS_LISTED:,} more hosts")
    if unknown:
        parts.append(f"{unknown:,} rank{'s' if unknown != 1 else ''} not named")
    return f"{len(by_host)} — " + "; ".join(parts)


def tags_text(tags: dict) -> Text:
    """Tags on screen, ``KEY=VALUE`` in key order, each key and value shown literally."""
    return literal(" ".join(f"{k}={v}" for k, v in sorted(tags.items())))


def _identified(device) -> str:
    """For a device whose name is missing or generic: the catalog entry its properties name, and the look-alikes;
    for one that gives only its compute capability, the catalog entries of that compute capability."""
    from traceparse.catalog import candidates_by_cc, find_gpu, identify_gpu

    try:
        if device.name and find_gpu(device.name) is not None:
            return ""
        spec, fits = identify_gpu(device)
        family = candidates_by_cc(device) if spec is None else []
    except Exception:  # the catalog is an aid to the reader here, never a reason for show to fail
        return ""
    if family:
        return (f"compute capability {device.compute_capability}: one of {', '.join(family)}; "
                "no SM count or name in the trace to tell which")
    if spec is None:
        return ""
    others = [f for f in fits if f != spec["name"]]
    return f"{spec['name']} by its properties" + (f"; also fits {', '.join(others)}" if others else "")


#: Rows of a finding's per-rank, per-device or per-stream table shown on screen (``analyze --rows``); the rest
#: are one row.
TABLE_ROWS = 8


def render_findings(console: Console, findings: list[Finding], traces: dict[str, TraceMeta],
                    summaries: dict[str, dict] | None = None, full: bool = True,
                    rows: int = TABLE_ROWS) -> None:
    """Print each trace's summary panel, its findings worst first, its quiet rules in one line; then a tally.

    ``findings`` are shown in the order :func:`traceparse.analysis.order_findings`
    gives. ``summaries`` ({trace id: :func:`traceparse.summary.summarize`})
    open each trace's section, and with several traces a table of them (one
    row each) follows the findings. Findings with nothing to say
    (:func:`traceparse.analysis.is_quiet`) are shown in full, or with
    ``full=False`` (``analyze`` without ``--all``) named in one line at the
    end of their trace; a finding's table whose rows another
    finding of the trace already lists is not drawn again (:func:`repeated_tables`).
    A table of the finding's metrics (per rank, device or stream) shows its
    first ``rows`` rows (the rule lists the worst first) and one row for the
    rest, so that a report of 128 ranks is as long as one of 8.
    """
    from traceparse.analysis import is_quiet, order_findings

    summaries = summaries or {}
    ranked = order_findings(findings)
    by_trace: dict[Any, list[Finding]] = {}
    for finding in ranked:
        by_trace.setdefault(finding.trace, []).append(finding)
    silent = 0  # findings with nothing to say: not counted as findings, named at the end of their trace
    for trace in dict.fromkeys([*summaries, *by_trace]):  # the traces in the order given, findings or none
        meta = traces.get(trace)
        run = ((meta.extra or {}).get("run") or {}) if meta else {}
        where = (f"run {run['name']} ({len(run.get('ranks') or {})} ranks)" if meta and meta.format == "run"
                 and run.get("name") else (shown_path(meta.path) if meta else None))
        console.rule(f"[bold]{markup_literal(trace)}  {markup_literal(where)}[/bold]" if where
                     else f"[bold]{markup_literal(trace)}[/bold]")
        summary = summaries.get(trace)
        own = by_trace.get(trace, [])
        if summary is not None:
            console.print(summary_panel(summary, own))
        span = summary.get("span_ns") if summary else None
        nothing = [f for f in own if is_quiet(f, span)]
        silent += len(nothing)
        quiet = [] if full else nothing
        shown = [f for f in own if f not in quiet]
        repeats = repeated_tables(shown)
        for finding in shown:
            console.print(_finding_panel(finding, console.width, repeats.get(id(finding)), rows))
        if quiet:
            names = ", ".join(dict.fromkeys(f.rule for f in quiet))
            console.print(Text.assemble(("Nothing to report: ", "bold"), visible(names),
                                        (" (--all shows them)", "dim")))
    if len(summaries) > 1:
        console.print(summary_table(list(summaries.values()), traces, console.width))
    if findings:
        console.print(Text.from_markup(_tally(findings, silent)))


def _rows(finding: Finding) -> frozenset:
    """The (name, time) pairs of a finding's items: what two tables of one trace share when one repeats the other."""
    return frozenset((i.get("name"), i.get("time_ns")) for i in finding.items if i.get("name") is not None)


def repeated_tables(findings: list[Finding]) -> dict[int, str]:
    """{id(finding): the rule whose table it repeats}: the item tables not drawn, so that no table is shown twice.

    A finding's table repeats another's (of the same trace) when its rows
    (name and time) are the same set: then the narrower table (fewer
    columns) is kept, or on a tie the first; or when they are a part of the
    rows of another finding of the same rule (a per-thread table of one
    thread repeats the rule's main table).
    """
    out: dict[int, str] = {}
    rows = {id(f): _rows(f) for f in findings}
    for i, b in enumerate(findings):
        mine = rows[id(b)]
        for j, a in enumerate(findings):
            theirs = rows[id(a)]
            if not mine or a is b or a.trace != b.trace or not mine <= theirs:
                continue
            if a.rule == b.rule and mine != theirs:  # a part of its own rule's main table
                out[id(b)] = out.get(id(a), a.rule)
                break
            if mine == theirs and id(a) not in out and (len(finding_columns(a)), j) < (len(finding_columns(b)), i):
                out[id(b)] = a.rule
                break
    return out


def summary_panel(summary: dict, findings: list[Finding] = ()) -> Panel:
    """The panel a trace's section opens with: span, steps, GPU busy, GPU time by part (where copies or memsets
    have time), bottleneck, top kernel categories (shares of kernel time), findings."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    cut = summary.get("incomplete") or []
    if cut:  # first: every figure below covers only what was read (the header names the file)
        where = re.match(r"^\S+?(?::(\d+))?: (.+)$", cut[0], re.S) if len(cut) == 1 else None
        said = ((f"line {where[1]}: " if where[1] else "") + where[2]) if where else cut[0]
        grid.add_row(Text("incomplete", style="bold red"),
                     Text(visible(said) + (f" (and {len(cut) - 1:,} more)" if len(cut) > 1 else "")
                          + "; every figure here covers only what was read", style="red"))
    grid.add_row("span", fmt_ns(summary.get("span_ns")))
    grid.add_row("steps", steps_text(summary))
    procs = summary.get("gpu_processes") or {}
    if len(procs) > 1:  # one trace of a multi-process job: say what the figures are before any of them is read
        each = "; ".join(f"pid {pid}: GPU {', '.join(map(str, devices))}" for pid, devices in list(procs.items())[:4])
        grid.add_row(Text("processes", style="bold yellow"), Text(
            f"{len(procs):,} ran GPU work in this one trace ({visible(each)}{'; ...' if len(procs) > 4 else ''}): "
            "not a run of ranks; figures are per GPU, and a step is every process's range of it taken together "
            "(consecutive steps can overlap by the processes' skew)",
            style="yellow"))
    busy = summary.get("gpu_busy_pct")
    whole = "the GPU's span" if summary.get("gpu_devices", 1) <= 1 else "the mean GPU's span"  # gpu-idle's words
    unseen = summary.get("gpu_launches_unseen") or 0
    others = summary.get("other_devices") or {}
    lanes = summary.get("lane_busy_pct")
    if lanes is not None and busy is None and len(others) == 1:  # a TPU's work on its lanes: no GPU to speak of
        noun = next(iter(others))
        mean = "" if (summary.get("lane_devices") or 1) <= 1 else "mean "
        grid.add_row(literal(f"{noun} busy"),
                     literal(f"{fmt_pct(lanes)} of the {mean}{noun}'s span (first to last activity on its lanes)"))
    else:
        listed = summary.get("gpus_listed") or []
        grid.add_row("GPU busy", literal(f"- (no GPU activity read: the file ends early, and what was read holds none "
                                         f"of the work of the {_gpus(listed)} its header lists)"
                     if busy is None and listed and summary.get("incomplete")
                     else f"- ({unseen:,} kernel launch calls, but no GPU activity in this input: the GPU was not "
                          "traced, or its activity is in another file)"
                     if unseen else "- (the trace gives GPU time as totals, with no timeline)"
                     if summary.get("gpu_totals_only")
                     else f"- (no GPU work: the trace's devices are {_counted(others)}; hotspots has their time)"
                     if busy is None and others
                     else f"- (no GPU work read; {_unread(summary['unread_events'])} not read: their time is in no "
                          "figure)" if busy is None and summary.get("unread_events")
                     else f"- (the trace lists {_untimed(summary['gpu_untimed'])} but never when they ran (a "
                          "metrics-only log): no busy time to give)" if busy is None and summary.get("gpu_untimed")
                     else f"- (the trace recorded no GPU activity, though its header lists "
                          f"{_gpus(listed)})" if busy is None and listed
                     else "- (the trace recorded no GPU activity)" if busy is None
                     else f"{fmt_pct(busy)} of {whole} (first to last activity{cut_left_out(summary)})"
                     + _spin(summary)
                     + _short_span(summary)))
    split = summary.get("gpu_time")
    if split and (any(p["part"] != "kernels" for p in split["parts"]) or busy is None):  # the figure a summary has
        # a sum of the activities (two overlapping kernels count twice), not gpu-idle's busy time (their union)
        shown = shares_shown([p["share_pct"] for p in split["parts"]])
        grid.add_row("GPU time", f"{fmt_ns(split['total_ns'])} summed over activities: " + ", ".join(
            f"{p['part']} {fmt_unit('pct', share)}" for p, share in zip(split["parts"], shown)))
    worst = summary.get("bottleneck")
    if worst:
        style = SEVERITY_STYLE.get(worst.get("severity"), "white")
        per_rank = mean_of(worst.get("range"), summary.get("ranks") or 1)
        share = (f", {fmt_unit('pct', worst['share_pct'])} of {worst.get('whole') or 'the span'}"
                 if worst.get("share_pct") is not None else "")
        lost = (f", {fmt_ns(worst['impact_ns'])} {worst.get('said') or 'lost'}{per_rank}{share}"
                if worst.get("impact_ns") is not None
                else ", time lost unknown (the trace gives totals only)")
        line = Text.assemble((visible(worst.get("title", "")), "bold"), f"{lost} (", visible(worst["rule"]), ", ",
                             (visible(str(worst.get("severity", ""))), style), ")")
        if summary.get("gpu_bound"):
            # a busy GPU's own work sets the pace: the finding with most at stake is a remainder, not the cause
            line = Text.assemble(f"the GPU's own work ({fmt_pct(busy)} busy: top kernels below); the most at stake "
                                 "besides: ", line)
        grid.add_row("bottleneck", line)
    else:
        grid.add_row("bottleneck", "none: no finding here has 1% of the span or more at stake"
                     if summary.get("span_ns") else "none: no finding here has time at stake")
    for line in summary.get("highlights") or []:
        grid.add_row(literal(str(line["label"])), literal(str(line["text"])))
    cats = summary.get("top_categories") or []
    lane_ops = summary.get("top_lane_ops") or []
    if lane_ops and not cats and len(others) == 1:  # a TPU's own ops, where a GPU's summary names kernel categories
        grid.add_row(literal(f"top {next(iter(others))} ops"),
                     literal(", ".join(f"{short_name(o['name'], 40)} {fmt_unit('pct', o['share_pct'])}"
                                       for o in lane_ops) + " of their op time"))
    if cats:
        grid.add_row("top kernels", literal(", ".join(f"{c['category']} {fmt_unit('pct', category_share_shown(c))}"
                                                      for c in cats) + " of kernel time"))
    if findings:
        from traceparse.analysis import is_quiet

        span = summary.get("span_ns")
        silent = sum(1 for f in findings if is_quiet(f, span))
        grid.add_row("findings", Text.from_markup(_severity_counts(list(findings), silent)))
    return Panel(grid, title="[bold]summary[/bold]", title_align="left")


def mean_of(spread: dict | None, ranks: int) -> str:
    """What the bottleneck's time is a mean of, for the summary (terminal and page): `` per rank (mean of 2:
    20.9 ms on rank 0, 234.6 ms on rank 1)``, the least and the most where they differ as shown (``spread``:
    :attr:`traceparse.rule.Finding.impact_range`); `` per rank (mean of 8)`` on a run without them. Where several
    parts are the least or the most but for noise, their number stands for a name picked among equals: ``from 0 ns
    on rank 5 to 150.4 ms on 63 ranks``; where all are, ``(mean of 64, all within 0.1%)``."""
    if not spread:
        return f" per rank (mean of {ranks})" if ranks > 1 else ""
    parts, per = spread["parts"], spread["per"]
    if parts == 1:  # one rank of the run measured (the others recorded no GPU activity): its figure alone
        return f" on {spread['least']} alone ({'1 of ' if ranks > 1 else ''}{ranks:,} rank{'s' if ranks > 1 else ''})"
    # a mean over some of a run's ranks (one recorded no GPU activity) says of how many
    of = f"{parts:,} of {ranks:,} ranks" if per == "rank" and 1 < parts < ranks else f"{parts:,}"
    least, most = fmt_ns(spread["least_ns"]), fmt_ns(spread["most_ns"])
    if least == most or spread.get("least_like") == parts:
        return f" per {per} (mean of {of}{'' if least == most else ', all ' + SAME_SAID})"
    on_least, on_most = (_on(spread, end) for end in ("least", "most"))
    if parts == 2:
        return f" per {per} (mean of {of}: {least} on {on_least}, {most} on {on_most})"
    return f" per {per} (mean of {of}, from {least} on {on_least} to {most} on {on_most})"


def _on(spread: dict, end: str) -> str:
    """Which part the least (``end``: ``least``) or the most of ``spread`` is on: its name, or ``63 ranks`` where
    that many are alike (:data:`~traceparse.figures.SAME_SHARE`)."""
    alike = spread.get(f"{end}_like") or 1
    return spread[end] if alike == 1 else f"{alike:,} {spread['per']}s"


def _peaks(extra: dict) -> list[str]:
    """A device's peak figures as its reader gave them (:data:`traceparse.meta.PEAK_TFLOPS`, XLA's for a TPU):
    ``918 TFLOP/s peak``, ``1,638 GB/s memory peak``."""
    out = []
    for key, unit in ((PEAK_TFLOPS, "TFLOP/s"), (PEAK_MEMORY_GBPS, "GB/s memory")):
        value = extra.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e9:
            out.append(f"{value:,.0f} {unit} peak")
    return out


def _unread(unread: dict) -> str:
    """``2,136 events of 2 categories (mtia_ccp_events, mtia_runtime)``: what a reader skipped, named literally."""
    total = sum(unread.values())
    names = ", ".join(str(k) for k, _ in sorted(unread.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    more = ", …" if len(unread) > 3 else ""
    return (f"{total:,} event{'s' if total != 1 else ''} of {len(unread)} categor{'ies' if len(unread) != 1 else 'y'}"
            f" ({names}{more})")


#: Where the GPU's span is under this share of the trace's, the busy line says how short it is.
SHORT_GPU_SPAN_PCT = 10.0


#: Percentage points of a GPU's span from which the summary says what of its busy time is communication kernels
#: waiting for another GPU's (``gpu_spin_pct``): under it, the busy share is the work to the first decimal or so.
SPIN_SHOWN_PCT = 1.0


def spin_parts(summary: dict) -> tuple[str, str] | None:
    """The work and the spin of "GPU busy" as shown (``gpu_work_pct``, ``gpu_spin_pct``), or None where the spin is
    under :data:`SPIN_SHOWN_PCT`: the work is the busy share as shown less the spin as shown, so that the two add
    up to the busy share on screen (32.1% + 56.8% of 88.9%, not 88.8% or 89.0% by rounding each alone)."""
    spin, busy = summary.get("gpu_spin_pct"), summary.get("gpu_busy_pct")
    if not spin or busy is None or spin < SPIN_SHOWN_PCT:
        return None
    shown_spin = round(spin, 1)
    return fmt_pct(max(0.0, round(round(busy, 1) - shown_spin, 1))), fmt_pct(shown_spin)


def _spin(summary: dict) -> str:
    """What of "GPU busy" is communication kernels spinning for a later rank, and the work left: a GPU 89% busy
    whose all-reduces wait 57% of the time for the slowest rank works 32% of it."""
    parts = spin_parts(summary)
    if parts is None:
        return ""
    return f": {spin_said(summary, parts, 'comm-compute-overlap')}"


def spin_said(summary: dict, parts: tuple[str, str], source: str = "") -> str:
    """``32.1% work, 56.8% communication kernels waiting for another GPU's`` (``(source)`` after it where given);
    ``at most …, at least …`` and why, where a rank's collectives' arrivals are unknown (``gpu_spin_unknown_ranks``:
    cut short, its communication kernels lost): its waits, and the others' for it, are not counted."""
    unknown = summary.get("gpu_spin_unknown_ranks") or []
    said = f"{parts[0]} work, {parts[1]} communication kernels waiting for another GPU's"
    if not unknown:
        return f"{said} ({source})" if source else said
    whose = listed("rank", unknown, shown=8)
    return (f"at most {said.replace(' work, ', ' work, at least ', 1)} ({f'{source}; ' if source else ''}"
            f"{whose} lost {'its' if len(unknown) == 1 else 'their'} collectives' kernels: waits for "
            f"{'it' if len(unknown) == 1 else 'them'} are not counted)")


def cut_left_out(summary: dict) -> str:
    """``; rank 0, cut short, left out`` where "GPU busy" is of a run's whole ranks only (its ranks cut short
    recorded part of their GPU work: :func:`~traceparse.run.cut_rank_traces`), else ""."""
    ranks = summary.get("gpu_left_out_ranks") or []
    if not ranks:
        return ""
    return f"; {listed('rank', ranks, shown=8)}, cut short, left out"


def _short_span(summary: dict) -> str:
    """``: 11.0 us of the 33.73 ms traced`` where the GPU's span is a sliver of the trace's (a CUDA-graph capture
    whose two kernels ran back to back read ">99.9% busy" beside a 33.7 ms step), else ""."""
    gpu, span = summary.get("gpu_span_ns"), summary.get("span_ns")
    if not gpu or not span or 100.0 * gpu >= SHORT_GPU_SPAN_PCT * span:
        return ""
    return f": {fmt_ns(gpu)} of the {fmt_ns(span)} traced"


#: The GPU row kinds in words, one and several (:func:`_untimed`).
_GPU_NOUNS = {"kernel": ("kernel", "kernels"), "memcpy": ("copy", "copies"), "memset": ("memset", "memsets")}


def _untimed(kinds: dict[str, int]) -> str:
    """``3 kernels``, ``3 kernels and 1 copy``: the GPU rows a trace lists without times (summary's
    ``gpu_untimed``)."""
    return " and ".join(f"{n:,} {_GPU_NOUNS.get(k, (k, k + 's'))[n != 1]}" for k, n in kinds.items())


def category_share_shown(category: dict) -> Any:
    """A top kernel category's share as the kernel-share table shows it (``shown_pct``: rounded with every category,
    so that they add up to 100), its exact ``share_pct`` where a stored summary predates it."""
    shown = category.get("shown_pct")
    return category.get("share_pct") if shown is None else share_as_shown(category.get("share_pct"), shown)


def _gpus(names: list[str]) -> str:
    """``1 GPU (NVIDIA H100 80GB HBM3)``, ``8 GPUs (7 A, 1 B)``: the GPUs a trace lists, by name."""
    counts = Counter(names)
    each = ", ".join(name if len(counts) == 1 else f"{n} {name}" for name, n in counts.items())
    return f"{len(names)} GPU{'s' if len(names) != 1 else ''} ({each})"


def _counted(kinds: dict[str, int]) -> str:
    """``4 TPUs``, ``4 TPUs and 1 CUSTOM`` (device words are a reader's, printed literally)."""
    return " and ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in sorted(kinds.items()))


def steps_text(summary: dict) -> str:
    """Steps on screen: how many, where they come from, mean and spread (min–max, stdev)."""
    n = summary.get("steps") or 0
    if not n:
        return "none marked (no ProfilerStep#N annotations, step ranges or optimizer annotations)"
    source = summary.get("step_source") or ""
    windows = summary.get("step_windows") or n
    text = f"{n} ({source}{f', {windows} windows over the ranks' if windows != n else ''}), " \
           f"mean {fmt_ns(summary.get('step_time_ns'))}"
    if windows > 1:
        text += (f", {fmt_ns(summary.get('step_min_ns'))} to {fmt_ns(summary.get('step_max_ns'))}"
                 f" (stdev {fmt_ns(summary.get('step_stdev_ns'))})")
    cut = summary.get("steps_cut") or 0
    if cut:  # a step partly outside the window: what the cut trace has of it is no step's time
        who = ("it" if windows == 1 else "all of them") if cut >= windows else f"{cut:,} of them"
        text += (f"; the window cuts {who}: "
                 + ("its time is that of its part" if cut == 1 else "their times are those of their parts")
                 + " inside the window")
    covered, span = summary.get("steps_span_ns"), summary.get("span_ns")
    if covered is not None and span and covered < STEPS_HINT_SHARE * span:
        text += (f"; they cover {fmt_pct(100.0 * covered / span)} of the span (the rest is before or after them: "
                 "start-up, warm-up, teardown): --step all analyses the steps alone")
    return text


#: Steps that cover less than this share of the span get a hint to analyse them alone (``--step all``): a whole
#: process captured (nsys without a capture range) is mostly start-up, whose idle GPU outweighs every step's cause.
STEPS_HINT_SHARE = 0.5


#: The columns of the table of traces that ends a report of several.
SUMMARY_COLUMNS = [Column("trace", "trace", "text"), Column("step_time_ns", "step time", "ns"),
                   Column("gpu_busy_pct", "GPU busy", "pct"), Column("bottleneck", "bottleneck", "id"),
                   Column("impact_ns", "at stake", "ns"), Column("span_ns", "span", "ns"),
                   Column("steps", "steps", "count")]  # the most important first: the last are dropped first


def summary_table(summaries: list[dict], traces: dict[str, TraceMeta], width: int = 80) -> Group:
    """One row per trace: span, steps, step time, GPU busy, bottleneck and its time at stake; in natural order of
    their names (bs4, bs8, bs16, not bs16, bs4, bs8 as a shell's glob gives them)."""
    rows = []
    for s in summaries:
        rows.append({**s, "trace": _trace_name(traces.get(s["trace"]), s["trace"])})
        worst = s.get("bottleneck") or {}
        rows[-1].update(bottleneck=worst.get("rule", "-"), impact_ns=worst.get("impact_ns"))
    rows.sort(key=lambda r: natural_key(r["trace"]))
    columns = SUMMARY_COLUMNS
    if any(spin_parts(s) for s in summaries):  # a run whose busy GPUs partly spin for other ranks
        at = next(i for i, c in enumerate(columns) if c.key == "gpu_busy_pct") + 1
        columns = [*columns[:at], Column("gpu_work_pct", "GPU work", "pct"), *columns[at:]]
    return Group(Text("summary of the traces", style="bold"), *_fitted_table(columns, rows, width))


def natural_key(text: str) -> tuple:
    """A sort key that orders the numbers inside names by value: ``bs4 < bs8 < bs16``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part.lower())
                 for part in re.split(r"(\d+)", text) if part)


def _trace_name(meta: TraceMeta | None, trace_id: str) -> str:
    """A trace's short name in the table of traces: a run's name, else its file's name up to the first dot."""
    run = ((meta.extra or {}).get("run") or {}) if meta else {}
    if run.get("name"):
        return str(run["name"])
    if meta and meta.path:
        return meta.path.rstrip("/").rsplit("/", 1)[-1].split(".")[0] or trace_id
    return trace_id


def _tally(findings: list[Finding], silent: int = 0) -> str:
    """"2 findings: 1 critical, 1 warning; 11 rules with nothing to report" (markup), or "no findings; ...": the
    ``silent`` findings with nothing to say (all info, :func:`traceparse.analysis.is_quiet`) are not counted as
    findings."""
    said = len(findings) - silent
    counts = _severity_counts(findings, silent)
    if not said:
        return "no findings" + counts.removeprefix("none")
    return f"{said} finding{'s' if said != 1 else ''}: {counts}"


def _severity_counts(findings: list[Finding], silent: int = 0) -> str:
    """"1 critical, 1 warning; 11 rules with nothing to report" (markup), "none" for no finding: the summary's
    line of findings, and :func:`_tally` after its count."""
    counts = {sev: sum(1 for f in findings if f.severity == sev) for sev in reversed(SEVERITIES)}
    counts["info"] -= silent
    label = {"warning": "warnings"}  # "2 critical", "2 info", but "2 warnings"
    parts = [f"[{SEVERITY_STYLE[sev]}]{n} {label.get(sev, sev) if n != 1 else sev}[/{SEVERITY_STYLE[sev]}]"
             for sev, n in counts.items() if n]
    text = ", ".join(parts) or "none"
    if silent:
        text += f"; {silent} rule{'s' if silent != 1 else ''} with nothing to report"
    return text


def _finding_panel(finding: Finding, width: int = 80, repeats: str | None = None,
                   rows: int = TABLE_ROWS) -> Panel:
    style = SEVERITY_STYLE.get(finding.severity, "white")
    inner = max(20, width - 4)  # the panel's border and padding
    parts: list[Any] = [literal(finding.message)]
    pairs = unsaid_figures(finding)
    if pairs:
        widest = max(len(label) + len(value) for label, value in pairs)
        # two figures a line where every pair fits in half the panel; else one a line, long values wrapping
        across = 2 if len(pairs) > 3 and 2 * (widest + 4) <= inner else 1
        grid = Table.grid(padding=(0, 2))
        for _ in range(across):
            grid.add_column(style="dim", no_wrap=True)
            grid.add_column(justify="right", no_wrap=across > 1)
        for i in range(0, len(pairs), across):
            row = [cell for pair in pairs[i:i + across] for cell in pair]
            grid.add_row(*map(literal, row), *[""] * (2 * across - len(row)))
        parts.append(grid)
    for key, columns in finding.tables.items():
        data = finding.metrics.get(key)
        if isinstance(data, dict) and data and columns and not repeats_figures(finding, data, columns):
            parts.extend(_dict_table(key.replace("_", " "), data, columns, inner, rows,  # a title, not a key
                                     finding.worst.get(key)))
    if finding.items and repeats:
        parts.append(literal(f"(its {len(finding.items)} rows are in {repeats}'s table)", style="dim"))
    elif finding.items:
        columns = finding_columns(finding)
        items = items_as_shown(finding.items, columns)
        title = finding.items_title or None
        if columns and columns[0].key in MEMBER_KEYS:  # one row per rank: the worst
            worst = finding.worst.get("items")
            title = fold_title(title, items, rows, worst, columns)
            items = fold_rows(items, columns[0].key, columns[1:], rows, worst)
        parts.extend(_items_table(items, columns, inner, title))
    if finding.suggestion:
        parts.append(literal("→ " + finding.suggestion, style="green"))
    title = Text.from_markup(f"[{style}]{markup_literal(finding.severity.upper())}[/{style}]  "
                             f"[bold]{markup_literal(finding.rule)}[/bold]: {markup_literal(finding.title)}")
    # a title longer than the border (a narrow terminal) ends with an ellipsis, not cut off mid-word by the border
    title.truncate(max(1, width - 6), overflow="ellipsis")  # the corners and a space each side
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


#: The first column of an items table with one row per rank or device: such a table shows its first rows (the
#: rule lists the worst first) and one row for the rest.
MEMBER_KEYS = ("rank", "device", "device_id")


def repeats_figures(finding: Finding, data: dict, columns: list[Column]) -> bool:
    """True for a one-row table that repeats the headline figures (a per-device table of one device).

    That is: at least half of its value columns are headline figures of the
    finding, each with the same value (what is left, such as a count of
    kernels, the message says); such a table is not drawn.
    """
    if len(data) != 1:
        return False
    row = next(iter(data.values())) or {}
    values = [c.key for c in columns[1:]]
    shared = [k for k in values if k in finding.figures]
    return (bool(shared) and 2 * len(shared) >= len(values)
            and all(row.get(k) == finding.metrics.get(k) for k in shared))


#: The suffix a metric key carries for its declared unit; the screen label leaves it out (the value shows the unit).
UNIT_SUFFIXES = {"ns": "_ns", "pct": "_pct", "bytes": "_bytes", "bytes_binary": "_bytes", "gbps": "_gbps",
                 "flops": "_flops"}


def figure_label(key: str, unit: str) -> str:
    """A headline figure's label on screen: its key without the suffix of its declared unit, in words
    (``idle_ns`` declared in ns is "idle"; a key whose suffix is not its unit's is kept whole)."""
    suffix = UNIT_SUFFIXES.get(unit)
    if suffix and key.endswith(suffix) and len(key) > len(suffix):
        key = key[: -len(suffix)]
    elif suffix and suffix + "_" in key:  # ``delay_ns_p50`` shown in us: "delay p50", the unit in the value
        key = key.replace(suffix + "_", "_", 1)
    return key.replace("_", " ")


def shown_figures(finding: Finding) -> list[tuple[str, str]]:
    """The headline figures as the screen and the HTML report show them: (label, value) pairs in their declared
    order. The label is the finding's own (``Finding.labels``) else the key's words; a ``problem_count`` figure
    that is zero is left out (nothing was left out, so it says nothing), JSON keeps it; so is a figure the finding
    does not give at all (api-share's ``context_creation_ns`` where no call made a context), not shown as "-"."""
    pairs = []
    as_in_tables = table_shares(finding)
    together: dict[str, Any] = {}  # the shares of one whole a finding declares: rounded together, as its sentence
    for group in finding.shares:
        together.update(zip(group, shares_shown([finding.metrics.get(k) for k in group])))
    for key, unit in finding_figures(finding).items():
        value = finding.metrics.get(key)
        if unit == "problem_count" and value == 0 or key not in finding.metrics:
            continue
        if unit == "pct" and isinstance(value, float):
            value = together[key] if key in together else as_in_tables.get(value, value)
        label = finding.labels.get(key) or (figure_label(key, unit) if finding.figures else key)
        pairs.append((label, fmt_unit(unit, value)))
    return pairs


def items_as_shown(items: list[dict], columns: list[Column]) -> list[dict]:
    """``items`` with each share whose column declares the value it shows (``Column.shown``: rounded by the rule
    within a whole of its own) replaced by that value (a :class:`~traceparse.figures.Bound` where it reads 0 of a
    part more than none), for the screen and the HTML report; JSON keeps the exact shares."""
    pairs = [(c.key, c.shown) for c in columns if c.shown]
    if not pairs:
        return items
    return [{**item, **{key: share_as_shown(item.get(key), item.get(shown)) if item.get(shown) is not None
                        else item.get(key) for key, shown in pairs}} for item in items]


def table_shares(finding: Finding) -> dict[float, float]:
    """The shares of the finding's tables of shares of one whole that they show otherwise than rounded alone
    (:func:`~traceparse.figures.shares_shown`: so that they add up to 100), each with the value shown: a headline
    figure equal to one (api-share's launch share, a row of its classes table) shows the same, not 65.3% beside
    the table's 65.2%. A value two tables show differently is left out."""
    columns = finding_columns(finding)
    shown: dict[float, float] = {}
    for c in columns:  # shares the rule rounded itself: as it rounded them
        if c.unit == "pct" and c.shown:
            shown.update((item[c.key], share_as_shown(item[c.key], item[c.shown])) for item in finding.items
                         if isinstance(item.get(c.key), float) and item.get(c.shown) is not None)
    tables = [[item.get(c.key) for item in finding.items] for c in columns if c.unit == "pct" and not c.shown]
    for key, columns in finding.tables.items():
        data = finding.metrics.get(key)
        if isinstance(data, dict) and data:
            tables += [[row.get(c.key) if isinstance(row, dict) else None for row in data.values()]
                       for c in columns if c.unit == "pct"]
    apart: set[float] = set()
    for values in tables:
        for raw, adjusted in zip(values, shares_shown(values)):
            if isinstance(raw, float) and adjusted != round(raw, 1):
                if shown.setdefault(raw, adjusted) != adjusted:
                    apart.add(raw)
    return {raw: value for raw, value in shown.items() if raw not in apart}


def unsaid_figures(finding: Finding) -> list[tuple[str, str]]:
    """The headline figures (:func:`shown_figures`) that the finding's sentence does not already give: a panel
    on screen shows the sentence and then only these, not every figure a second time (JSON and the HTML report
    keep them all). A figure counts as said where its shown value is a number, a whole word of the sentence, and
    no other figure shows the same value (which of them the sentence meant cannot be told)."""
    pairs = shown_figures(finding)
    times = Counter(value for _, value in pairs)

    def said(value: str) -> bool:
        return (times[value] == 1 and any(c.isdigit() for c in value)
                and re.search(r"(?<![\w.,])" + re.escape(value) + r"(?!\w|[.,]\d)", finding.message) is not None)

    return [(label, value) for label, value in pairs if not said(value)]


def finding_figures(finding: Finding) -> dict[str, str]:
    """The headline figures: those the finding declares, else every scalar metric shown as is (screen and HTML)."""
    if finding.figures:
        return dict(finding.figures)
    return {k: "number" for k, v in finding.metrics.items() if not isinstance(v, (dict, list))}


def finding_columns(finding: Finding) -> list[Column]:
    """The item columns: those the finding declares, else every key of its items shown as is (screen and HTML)."""
    if finding.columns:
        return list(finding.columns)
    keys = dict.fromkeys(k for item in finding.items for k in item)
    return [Column(k, k, "number") for k in keys]


def _dict_table(title: str, data: dict[str, dict], columns: list[Column], width: int = 76,
                max_rows: int | None = None, worst: str | None = None) -> list[Any]:
    """A metric that is a table: the first declared column labels the row keys, the others its values.

    With ``max_rows``, a longer table shows ``max_rows`` rows and one row for
    the rest (:func:`fold_rows`): the worst by the column ``worst`` where the
    finding declares one (``Finding.worst``), else the first.
    """
    columns, rows = dict_rows(data, columns)
    if max_rows is not None:
        title = fold_title(title, rows, max_rows, worst, columns)
        rows = fold_rows(rows, columns[0].key, columns[1:], max_rows, worst)
    return _fitted_table(columns, rows, width, title=title)


def dict_rows(data: dict[str, dict], columns: list[Column]) -> tuple[list[Column], list[dict]]:
    """A metric that is a table ({row key: {column key: value}}) as the columns and rows of a table, on screen
    and on the page: the first declared column holds the row keys, as text; the others their values."""
    head, rest = columns[0], columns[1:]
    key_column = Column(head.key, head.label, head.unit if head.unit in ("name", "text") else "text")
    return [key_column, *rest], [{head.key: str(key), **{c.key: (row or {}).get(c.key) for c in rest}}
                                 for key, row in data.items()]


#: The fewest cells a cut text keeps beside its key number; in less, the cell shows the number alone.
MIN_CUT_CELLS = 10


def fold_rows(rows: list[dict], key: str, columns: list[Column], budget: int, worst: str | None = None) -> list[dict]:
    """``rows`` as a table of at most ``budget + 1`` rows shows them: all where they are that few; else
    ``budget`` of them and one row for the rest (:func:`_rest_row`, in the column ``key``).

    The rows kept are the worst by the column ``worst`` (:func:`worst_first`), so that a folded table of 256
    ranks names the rank that stands out, not ranks 0 to 7; without ``worst``, the first ones (a table its
    rule lists worst first already).
    """
    if len(rows) <= budget + 1:
        return rows
    rows = _shares_rounded_whole(rows, columns)
    order = worst_first(range(len(rows)), rows, worst) if worst else list(range(len(rows)))
    kept = set(order[:budget])
    return ([rows[i] for i in order[:budget]]
            + [_rest_row(key, columns, [r for i, r in enumerate(rows) if i not in kept])])


def _shares_rounded_whole(rows: list[dict], columns: list[Column]) -> list[dict]:
    """``rows`` with each share column (unit ``pct``) whose values are the shares of one whole rounded as they are
    shown when every row is (:func:`~traceparse.figures.shares_shown`): a folded table's rows read as they read
    unfolded, and as the summary and the rule's sentence give them (a category of 87.96% read 87.9% in the full
    table, where the rows add up to 100, and 88.0% once folded)."""
    shown = {c.key: shares_shown([r.get(c.key) for r in rows]) for c in columns if c.unit == "pct"}
    if not shown:
        return rows
    return [{**r, **{k: values[i] for k, values in shown.items()}} for i, r in enumerate(rows)]


def worst_first(indices, rows: list[dict], worst: str) -> list[int]:
    """``indices`` of ``rows`` ordered by the column ``worst``: its largest value first, or its smallest first
    where the name starts with ``-`` (``-overlap_pct``); rows without a number last; ties in their order, and
    values alike to four significant figures are ties (255 ranks idle 131.7 ms but for nanoseconds of skew keep
    their rank order, not one the nanoseconds pick)."""
    column, sign = worst.lstrip("-"), (1 if worst.startswith("-") else -1)

    def rank(i: int) -> tuple:
        value = rows[i].get(column)
        return (0, sign * float(f"{value:.4g}")) if _is_number(value) else (1, 0)

    return sorted(indices, key=rank)


def fold_title(title: str | None, rows: list[dict], budget: int, worst: str | None,
               columns: list[Column]) -> str | None:
    """The title of a table that :func:`fold_rows` folds by its worst rows, saying which rows it kept
    ("devices (8 of 256, most idle first)"), so that an order other than the rule's is never read as it;
    ``title`` unchanged where the table is not folded or keeps its first rows."""
    if not worst or len(rows) <= budget + 1:
        return title
    column = next((c for c in columns if c.key == worst.lstrip("-")), None)
    label = (column.label if column else worst.lstrip("-")).replace("\n", " ")
    said = f"{budget} of {len(rows)}, {'least' if worst.startswith('-') else 'most'} {label} first"
    return f"{title} ({said})" if title else said


def _rest_row(key: str, columns: list[Column], rows: list[dict]) -> dict:
    """One row standing for ``rows``: their number, and for each column the largest of their values.

    The largest, not the sum: the rows of such a table are often parts of
    different wholes (streams of different devices, whose spans overlap), so
    a sum could be larger than any whole.
    """
    out: dict[str, Any] = {key: f"({len(rows):,} more, max)"}
    for c in columns:
        values = [r.get(c.key) for r in rows if _is_number(r.get(c.key))]
        out[c.key] = max(values) if values else None
    return out


def _items_table(items: list[dict], columns: list[Column], width: int = 76, title: str | None = None) -> list[Any]:
    """The finding's items as a table that fits ``width`` (see :func:`_fitted_table`), under ``title`` if any."""
    return _fitted_table(columns, items, width, title=title)


#: Units whose cells are text: left-aligned, the only ones that may be shortened.
TEXT_UNITS = ("name", "text")
#: The least width a text column keeps before columns are dropped.
MIN_TEXT_WIDTH = 16
MIN_OTHER_TEXT_WIDTH = 8


def _fitted_table(columns: list[Column], rows: list[dict], width: int, title: str | None = None,
                  as_written: bool = False) -> list[Any]:
    """A table that fits ``width`` columns of screen without ever cutting a number.

    Each numeric column shows all its values in one unit (named in its
    header) at its full width, never wrapped. The name column (the first
    ``name`` column, else the first ``text`` one) is at least
    :data:`MIN_TEXT_WIDTH` wide; short text columns get their width, then the
    long ones share what is left equally; a name longer than its cell is shortened
    from the middle and numbered, and a key below the table gives the full
    names (shortened as kernel names are, or ``as_written``). When even that
    does not fit, the last declared columns (the least important) are dropped
    and a note below the table names them. A label may take two lines
    (``"host\\nmedian"``): its column is as wide as its longest line. Where
    a column would be dropped or a short text column (a kind, a thread) cut,
    headers wider than their cells go on two lines first
    (``"thread /\\nstream"``, ``"per step\\n(ms)"``), if that leaves out less.
    Returns the renderables: the table, then the key and the note if any.
    """
    if not columns:
        return []
    # a time column of zeros alone takes the finest unit of the table's other time columns ("other (us)" of 0s
    # beside "host wait (us)", not "(ns)")
    peaks = [max((abs(v) for v in _numbers([r.get(c.key) for r in rows])), default=0.0)
             for c in columns if c.unit == "ns"]
    zero_peak = min((p for p in peaks if p), default=0.0)
    formatted = [_format_column(c, [r.get(c.key) for r in rows], zero_peak=zero_peak) for c in columns]
    headers = [f[0] for f in formatted]
    cells = [f[1] for f in formatted]
    text_idx = [i for i, c in enumerate(columns) if c.unit in TEXT_UNITS]
    name_idx = next((i for i, c in enumerate(columns) if c.unit == "name"), text_idx[0] if text_idx else None)
    layout = _layout(columns, rows, headers, cells, width, text_idx, name_idx)
    if _squeezed(layout, text_idx, name_idx):  # a column dropped or a short text cut: headers on two lines
        folded = [h if i in (0, name_idx) else _folded(h, max((text_width(x) for x in cells[i]), default=0))
                  for i, h in enumerate(headers)]  # what names the rows keeps its header whole
        if folded != headers:
            cells_again = [list(c) for c in cells]
            again = _layout(columns, rows, folded, cells_again, width, text_idx, name_idx)
            if _squeeze_rank(again, text_idx, name_idx) < _squeeze_rank(layout, text_idx, name_idx):
                layout, headers, cells = again, folded, cells_again
    shown, widths, natural, dropped = layout
    key: dict[str, int] = {}
    table = Table(title=None if title is None else literal(title), title_justify="left", show_edge=False,
                  header_style="bold")
    for i in shown:
        c = columns[i]
        if c.unit in TEXT_UNITS:
            table.add_column(_header(headers[i]), no_wrap=True, width=widths[i], overflow="crop")
        else:
            table.add_column(_header(headers[i]), no_wrap=True, min_width=widths[i],
                             justify="left" if c.unit == "id" else "right")
    for r in range(len(rows)):  # the key numbers, in order of the rows
        for i in shown:
            if columns[i].unit in TEXT_UNITS and text_width(cells[i][r]) > widths[i]:
                key.setdefault(str(rows[r].get(columns[i].key)), len(key) + 1)
    for i in shown:  # long text cut to its cell, keeping what tells two cells apart, then its key number
        if columns[i].unit in TEXT_UNITS:
            long = [r for r in range(len(rows)) if text_width(cells[i][r]) > widths[i]]
            numbers = [f" [{key[str(rows[r].get(columns[i].key))]}]" for r in long]
            room = widths[i] - max((len(n) for n in numbers), default=0)
            if columns[i].unit == "name" and room > 0:  # shortened again for the cell's room, not cut from the
                # table's width: a TAU routine keeps its name before its location ("do_nonbo…{517,1}]" read before)
                cuts = fitted_names([visible(str(rows[r].get(columns[i].key))) for r in long], room, compact=True)
            else:
                cuts = cut_apart([cells[i][r] for r in long], room)
            for r, cut, number in zip(long, cuts, numbers):
                # too little room for a cut to tell anything ("ra…0) [11]"): the key number alone
                cells[i][r] = cut + number if room >= MIN_CUT_CELLS else number.strip()
    for r in range(len(rows)):
        table.add_row(*(literal(cells[i][r]) for i in shown))
    parts: list[Any] = [table]
    if key:  # a grid, so that a long name without spaces folds beside its number, not on a line of its own
        lines = Table.grid(padding=(0, 1))
        lines.add_column(style="dim", no_wrap=True)
        lines.add_column(overflow="fold")
        room = width - len(f"[{len(key)}]") - 1
        fulls = list(key)  # cut together: no two entries of the key read alike
        entries = cut_apart(fulls, max(room * 3 - 4, 8)) if as_written else key_entries(fulls, room)
        for full, entry in zip(fulls, entries):
            lines.add_row(f"[{key[full]}]", literal(entry))
        parts.append(lines)
    if dropped:
        parts.append(literal(f"(not shown at this width: {', '.join(dropped)})", style="dim"))
    return parts


def _layout(columns: list[Column], rows: list[dict], headers: list[str], cells: list[list[str]], width: int,
            text_idx: list[int], name_idx: int | None) -> tuple[list[int], dict[int, int], list[int], list[str]]:
    """Where :func:`_fitted_table` puts its columns: (the columns shown, their widths, each column's natural
    width, the labels of those dropped). A wide screen re-shortens the name column's ``headers``/``cells``."""
    natural = [max([_header_width(headers[i])] + [text_width(x) for x in cells[i]]) for i in range(len(columns))]
    if name_idx is not None and columns[name_idx].unit == "name":  # a wide screen shows more of each name
        room = width - 3 * len(columns) + 1 - sum(n for i, n in enumerate(natural) if i != name_idx)
        if room > NAME_WIDTH and natural[name_idx] > NAME_WIDTH:
            c = columns[name_idx]
            cells[name_idx] = _format_column(c, [r.get(c.key) for r in rows], room)[1]  # a name's header: its label
            natural[name_idx] = max([_header_width(headers[name_idx])] + [text_width(x) for x in cells[name_idx]])
    minimum = []
    for i, c in enumerate(columns):
        if i == name_idx:
            minimum.append(min(natural[i], max(MIN_TEXT_WIDTH, _header_width(headers[i]))))
        elif c.unit in TEXT_UNITS:
            minimum.append(min(natural[i], max(MIN_OTHER_TEXT_WIDTH, _header_width(headers[i]))))
        else:
            minimum.append(natural[i])
    shown = list(range(len(columns)))

    def overhead(n: int) -> int:  # one space of padding either side of a cell, a rule between cells
        return 2 * n + (n - 1)

    # drop the least important columns (the last declared), never the name column nor the first figure
    first_figure = next((i for i in shown if columns[i].unit not in TEXT_UNITS), None)
    while sum(minimum[i] for i in shown) + overhead(len(shown)) > width:
        candidates = [i for i in shown if i not in (name_idx, first_figure)]
        if not candidates:
            break
        shown.remove(candidates[-1])
    dropped = [(columns[i].label or columns[i].key).replace("\n", " ") for i in range(len(columns)) if i not in shown]
    # text columns share the width the figures leave: short ones whole first, then the long ones (the name
    # column and any other long names, e.g. the kernels before and after a gap) in equal shares
    widths = {i: minimum[i] for i in shown}
    spare = width - overhead(len(shown)) - sum(widths.values())
    short = [i for i in shown if i in text_idx and i != name_idx and natural[i] <= 20]
    for i in short:
        grow = max(0, min(spare, natural[i] - widths[i]))
        widths[i] += grow
        spare -= grow
    long = [i for i in shown if i in text_idx and i not in short]
    while spare > 0:
        wanting = [i for i in long if widths[i] < natural[i]]
        if not wanting:
            break
        share = max(1, spare // len(wanting))
        for i in wanting:
            grow = min(share, natural[i] - widths[i], spare)
            widths[i] += grow
            spare -= grow
    return shown, widths, natural, dropped


def _squeeze_rank(layout, text_idx: list[int], name_idx: int | None) -> tuple[int, int, int]:
    """How much a layout leaves out, worst first: columns dropped, short text columns cut (a kind, a lane: words
    a reader should see whole), then the characters the name column lacks."""
    shown, widths, natural, dropped = layout
    cut = [i for i in shown if i in text_idx and widths[i] < natural[i]]
    return (len(dropped), sum(1 for i in cut if i != name_idx),
            sum(natural[i] - widths[i] for i in cut if i == name_idx))


def _squeezed(layout, text_idx: list[int], name_idx: int | None) -> bool:
    """True when a layout drops a column or cuts a short text column."""
    rank = _squeeze_rank(layout, text_idx, name_idx)
    return bool(rank[0] or rank[1])


def _folded(header: str, cells_width: int) -> str:
    """``header`` on two lines, split at the space that makes its longest line shortest, where it is wider
    than its column's cells (``"thread / stream"`` over ``thread 1513`` is ``"thread /\nstream"``); else as it is."""
    if "\n" in header or len(header) <= cells_width or " " not in header:
        return header
    splits = [i for i, ch in enumerate(header) if ch == " "]
    best = min(splits, key=lambda i: (max(i, len(header) - i - 1), -i))
    return header[:best] + "\n" + header[best + 1:]


NAME_WIDTH = 60


def _header(header: str) -> Text:
    """A column's header on screen: each of its lines shown literally."""
    return Text("\n").join(literal(line) for line in header.split("\n"))


def _header_width(header: str) -> int:
    """A header's width on screen: its longest line (a label may be written on two lines, ``"host\\nmedian"``,
    so that a narrow column of figures keeps a long header)."""
    return max(len(line) for line in header.split("\n"))


def _numbers(values: list[Any]) -> list[float]:
    """The numbers of a column's values, both ends of an interval included (what its unit is chosen from)."""
    out = []
    for v in values:
        out.extend(float(x) for x in (_interval(v) or (v,)) if _is_number(x))
    return out


def _interval(value: Any) -> tuple[float, float] | None:
    """``value`` as an interval (low, high) when it is a pair of numbers (a tuple or list), else None: a cell
    that shows a range, ``[6.20, 7.75]``, in its column's unit."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_number(x) for x in value):
        return value[0], value[1]
    return None


def _format_column(column: Column, values: list[Any], name_width: int = 0,
                   zero_peak: float = 0.0) -> tuple[str, list[str]]:
    """A column's header and cells: every number of the column in one unit, chosen from its values (a time
    column of zeros alone: as if its largest were ``zero_peak``, its neighbours' unit); names shortened towards
    ``name_width`` (default :data:`NAME_WIDTH`), no two different ones alike."""
    label = column.label if column.label is not None else column.key
    nums = _numbers(values)
    peak = max((abs(v) for v in nums), default=0.0) or (zero_peak if column.unit == "ns" else 0.0)
    unit = column.unit
    if unit == "name":
        names = [v if isinstance(v, str) else None for v in values]
        shortened = iter(short_names([n for n in names if n is not None], name_width or NAME_WIDTH, compact=True))
        return label, [_blank_shown(visible(next(shortened))) if n is not None else _cell(column, v)
                       for n, v in zip(names, values)]
    if unit in TEXT_UNITS or not nums:
        return label, [_cell(column, v) for v in values]
    if unit == "ns":
        name, scale = next(((n, s) for n, s in NS_SCALES if peak >= s), ("ns", 1.0))
        digits = 0 if scale == 1.0 else _column_decimals(nums, scale, decimals_for(peak / scale))
        return f"{label} ({name})", [_fmt_scaled(v, scale, digits) for v in values]
    if unit in ("bytes", "bytes_binary"):
        scales = ((("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if unit == "bytes"
                  else (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)))
        name, scale = next(((n, s) for n, s in scales if peak >= s), ("B", 1.0))
        return f"{label} ({name})", [_fmt_scaled(v, scale, 0 if scale == 1.0 else decimals_for(peak / scale))
                                     for v in values]
    if unit == "gbps":
        return f"{label} (GB/s)", [_fmt_scaled(v, 1.0, decimals_for(peak)) for v in values]
    if unit == "flops":
        return f"{label} (GFLOP)", [_fmt_scaled(v, 1e9, decimals_for(peak / 1e9)) for v in values]
    if unit == "ratio":
        return label, [fmt_ratio(v) if _is_number(v) else _plain(v) for v in values]
    if unit in ("flop_per_byte", "metric"):  # each cell to its own figures: they span orders of magnitude (0.0833, 388)
        return label, [fmt_number(float(v)) if _is_number(v) else _plain(v) for v in values]
    if unit == "pct":  # a table's shares of one whole add up to 100 as shown, too
        return label, [fmt_unit("pct", v) if _is_number(v) else _plain(v) for v in shares_shown(values)]
    if unit in COUNT_UNITS or all(float(v).is_integer() for v in nums):
        if all(float(v).is_integer() for v in nums):
            return label, [f"{int(v):,}" if _is_number(v) else _fmt_scaled(v, 1.0, 0) for v in values]
    return label, [_fmt_scaled(v, 1.0, decimals_for(peak)) for v in values]


#: Most decimals a column takes beyond those of its largest value, so that its small values keep a figure.
EXTRA_DECIMALS = 2
#: A value of a column is shown to within this share of itself, where :data:`EXTRA_DECIMALS` allow.
SHOWN_WITHIN = 0.05


def _column_decimals(nums: list[float], scale: float, digits: int) -> int:
    """The decimals of a column: ``digits`` (those of its largest value), or up to :data:`EXTRA_DECIMALS` more where
    its smallest value shown as a number would be shown more than :data:`SHOWN_WITHIN` off (a TAU routine of
    0.59 s read "1" in a column of 2,654 s, 0.53 s "1" beside it). A value too small to show in the column's
    decimals reads "<1", "<0.1": true as it is, and it adds no decimals."""
    least = 0.5 * 10.0 ** -digits  # what rounds to a figure above none
    small = min((abs(v) / scale for v in nums if abs(v) / scale >= least), default=0.0)
    if not small or least <= SHOWN_WITHIN * small:
        return digits
    needed = math.ceil(math.log10(0.5 / (SHOWN_WITHIN * small)))
    return max(digits, min(needed, digits + EXTRA_DECIMALS))


def _blank_shown(name: str) -> str:
    """A name that is empty or only spaces, quoted (``""``, ``"   "``): a blank cell would say nothing, and two
    such names would look alike."""
    return f'"{name}"' if not name.strip() else name


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt_scaled(v: Any, scale: float, digits: int) -> str:
    """A number (or an interval, ``[low, high]``) divided by ``scale``, with ``digits`` decimals; one more than
    none too small to show in them reads ``<0.001`` (4 B in a column of MB, a copy of 4 B at 0.0026 GB/s beside
    13.10), not ``0.000`` or ``-0.000``, which say none."""
    pair = _interval(v)
    if pair is not None:
        return "[" + ", ".join(_fmt_scaled(x, scale, digits) for x in pair) + "]"
    if not _is_number(v):
        return _plain(v)
    value = float(v) / scale
    text = f"{value:,.{digits}f}"
    if value and not any(c in "123456789" for c in text):
        return ("-<" if value < 0 else "<") + (f"{10 ** -digits:.{digits}f}" if digits else "1")
    return text


def _plain(value: Any) -> str:
    """A value that is not a number, without Python's spelling: yes/no, -, a, b."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(_plain(v) for v in value)
    return visible(value)


def _cell(column: Column, value: Any) -> str:
    """A text cell: names lose their return type, parameters and deep template arguments."""
    if isinstance(value, str) and column.unit == "name":
        return visible(short_name(value, NAME_WIDTH, cut=False).replace(", ", ","))
    if column.unit in TEXT_UNITS:
        return _plain(value)
    return fmt_unit(column.unit, value)


def fitted_table(columns: list[Column], rows: list[dict], width: int, title: str | None = None,
                 as_written: bool = False) -> list[Any]:
    """A table of ``rows`` (dicts keyed by each column's key) that fits ``width`` screen columns without ever
    cutting a number: the renderables of :func:`_fitted_table` (the table, then the key to shortened names and a
    note naming dropped columns), for commands that lay out their own tables the way findings are laid out.
    ``as_written``: the key gives each shortened text as written (``traceparse sql``: not demangled, nothing
    dropped; at most three lines, cut in the middle beyond), not as a kernel name is shown."""
    return _fitted_table(columns, rows, width, title, as_written)
