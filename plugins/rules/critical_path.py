"""Rule ``critical-path``: per step, the chain of work that held it, across ranks, and what it is made of.

Definition. The dependency graph of a step (docs/critical_path.md: host
threads in order, launch → GPU work, stream order, blocking calls waiting for the GPU work they waited for,
collectives across ranks: every rank leaves an instance once its last rank joined). The critical path of a
step runs backwards from the step's end (the trace's steps: ``ProfilerStep#N``, a step range, an optimizer
mark; else the
trace's span) following at every point the dependency that came last, and stops at the step's start. Its
``length_ns`` is the sum of its segments: never more than the step; the step time it does not cover lies
before the first point the path reached. On a run, every rank's every step has its path; where it crosses to
another rank at a collective (that rank joined last), that rank's work is on it.

Segment kinds: ``host op`` (an operator's or annotation's own time), ``runtime`` (other runtime calls),
``launch`` (launch calls and the latency to the GPU work they launched), ``sync`` (a blocking call's own
time and its wake-up once the GPU work it waited for ended), ``untraced`` (a thread running nothing the trace
shows, or only its step annotation; a stream idle before work whose launch the trace lacks), ``wake-up`` and
``stream wait`` (inferred: a thread resuming after another's event, a stream after another stream's work),
``kernel`` (by category), ``copy``, ``memset``, ``queue`` (queued behind the previous work of its stream),
``communication`` (a collective's own time: from the last rank's joining to the end, and the collective calls
and annotations). From the view of the rank whose step it is, a segment on another rank, for the part of it
between this rank's own joining of a collective and the last rank's joining, is ``waiting for another rank``.

Metrics (means over the paths: every step of every rank): ``steps`` (distinct steps), ``paths`` (steps ×
ranks), ``step_ns``, ``length_ns``, ``unexplained_ns`` (step − length), ``by_kind`` ({kind: ns}, each segment
by its own kind on whatever rank it is; they add up to ``length_ns``, and no item is larger than its kind),
``host_ops`` (host op time by name,
the ``top`` largest and ``(others)``), ``kernel_categories``, ``wait_ns`` and ``wait_pct`` (waiting for
another rank, and its share of the length), ``other_rank_ns`` and ``other_rank_pct`` (all of the path's time
on other ranks), ``crossings`` (collectives per path where it crossed to another rank), ``collectives`` (collective
instances in the graph, over all ranks and steps), ``point_to_point`` (every one of them a send or receive: a
pipeline's transfers, and the message says so), ``untraced_pct`` and
``inferred_pct`` (shares of the length the trace does not show, or that rest on inferred edges), ``missing``
(the edges the trace cannot give, in words), ``per_step`` (per path: ``step``, ``rank``, ``step_ns``,
``length_ns``, ``unexplained_ns``, ``wait_ns``, ``other_rank_ns``, ``crossings`` [{``collective``, ``name``,
``from_rank``, ``to_rank``, ``offset_ns``: the last rank's joining, from the step's start, ``instance``: the
collective instance's node}], ``top``: its three
largest parts) and
``ranks`` ({rank: ``steps``, ``length_ns``, ``wait_ns``, ``other_rank_ns`` (means per step), ``crossed_to``
({rank: collectives})}). Items: the largest parts of the paths, summed over them and given per path (per
step): ``rank``, ``lane`` (``thread T`` or ``stream S``), ``kind``, ``name``, ``per_step_ns``, ``share_pct``
(of the length), ``other_rank`` (it was on another rank's path), ``paths`` (how many paths it lies on) and
``per_path_ns`` (its time on each of those: a part of one rank's path, on a run, is said so, not only per mean
path).

``held_pct``: the largest share of the other ranks' paths that one part of one rank holds (an event's own time:
a host op, an annotation, a runtime call, a kernel, a copy; not communication, queueing nor untraced time): on
each path of a rank other than its own, its time there, but at most how much longer it takes per step on its
rank than on the median rank (:func:`_held`), summed over those paths and over their length. Where
collectives wait on the device (NCCL), the path crosses to the holding rank at a collective by which the ranks
are nearly in step again, so ``wait_pct`` stays near 0 while the other rank's delay is most of the path (a real
FSDP2 twin whose rank 1 sleeps 30 ms in its DataLoader: ``wait_pct`` 0.4%, the DataLoader 37% of rank 0's
path). The cap is the median rank's: in a balanced run of four ranks every waiting rank's path crosses to the
last one and runs back through its GEMMs, a quarter of the path, which take as long on every rank: 0.3%.

Severity: on a run, the larger of ``wait_pct`` and ``held_pct`` at or above ``warning_pct`` is a warning (a
rank holds the others; the title names its largest part on the others' paths, and the run's summary gets a
line naming it), at or above ``critical_pct`` critical; otherwise, and on a single trace, info. Time at stake
(``impact_ns``) on a run: the mean rank's waiting for other ranks over its steps, or the part's time on the
other ranks' paths over the ranks, whichever is larger; none on a single trace.

What removing it gains: where the part that holds the others is a host op or annotation, every step is replayed
without it (as ``whatif --drop NAME@RANK``), and the message says how much shorter each step is on the mean rank
(``drop_gain_ns``) and on the slowest rank (``drop_gain_slowest_ns``, at whose pace ranks in lockstep go): its
time on the path is not its gain where other work takes its place (a 30 ms hook sleep on four FSDP2 ranks took
30.3 ms of each step's path; the replay gains 11.0 ms on the slowest rank, the job measured 12.1 ms). The part's
time at stake is then no more than that gain over the ranks' steps.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict

import numpy as np
import polars as pl

from traceparse import expr, measures
from traceparse.errors import ResourceError, spelled
from traceparse.figures import ends_early, fmt_ns, fmt_pct, listed
from traceparse.meta import device_nouns, incomplete_ranks
from traceparse.measures.comm_sources import point_to_point_only
from traceparse.measures.critical_path import INSTANCE_TRACE, DependencyGraph, critical_paths, edge_coverage
from traceparse.measures.gpu_behind import gpu_behind
from traceparse.measures.nesting import over_median
from traceparse.measures.path_direct import direct_critical_paths
from traceparse.measures.path_windows import windowed_critical_paths, windowed_steps
from traceparse.measures.step_paths import step_windows
from traceparse.measures.steps import step_free
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.threads import thread_names
from traceparse.trace import Trace

FIGURES = {"steps": "count", "paths": "count", "step_ns": "ns", "length_ns": "ns", "unexplained_ns": "ns",
           "wait_ns": "ns",
           "wait_pct": "pct", "held_pct": "pct", "other_rank_ns": "ns", "untraced_pct": "pct", "inferred_pct": "pct"}
#: Screen labels where the key's words would read like another figure: the wait's share apart from the wait.
LABELS = {"wait_pct": "wait share", "held_pct": "held by one part"}
#: Without marked steps the path runs over each trace's span: a window, not a step (the summary says "none marked").
UNMARKED_LABELS = {"steps": "windows (no steps)", "step_ns": "window"}
RANK = Column("rank", "rank", "number")
COLUMNS = [Column("lane", "thread / stream", "text"), Column("kind", "kind", "text"), Column("name", "name", "name"),
           Column("per_step_ns", "per step", "ns"), Column("share_pct", "share", "pct")]
#: The same columns where no step is marked: the figures are of the one window over the trace.
UNMARKED_COLUMNS = [Column("per_step_ns", "per window", "ns") if c.key == "per_step_ns" else c for c in COLUMNS]
OTHER_RANK = "waiting for another rank"


class CriticalPath(Rule):
    name = "critical-path"
    cost = 10  # a dependency graph of every event, walked per step: half of analyze
    description = "Per step, the chain of work that held it (across ranks) and what it is made of"
    definition = __doc__
    impact_per_rank = True  # the path of one rank's steps: per rank already
    thresholds = {
        "warning_pct": 10.0,      # share of the path spent waiting for another rank at or above this: warning
        "critical_pct": 25.0,     # ... at or above this: critical
        "top": 8,                 # largest parts listed
        "min_wait_ns": 20000,     # shorter untraced gaps are overhead: no inferred wake-up into them
        "max_wake_ns": 5000000,   # an inferred wake-up follows the other thread's (stream's) event by at most this
        "align_clocks": False,    # ranks on several hosts: align clocks on collective end times
    }
    kinds = ("op", "marker", "api", "region", "kernel", "memcpy", "memset")

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        missing = _missing(events, device_nouns(trace.meta))
        names = thread_names(trace.meta)
        windows = windowed_steps(events)
        params = None  # the graph's parameters, where the whole graph is built (a replay can build it again)
        unstepped: list = []  # ranks that mark no step beside ranks that do (one large trace: none)
        if windows is not None:  # one large trace: a group of steps at a time, never its whole graph
            paths, segments = windowed_critical_paths(events, windows, int(t["min_wait_ns"]), int(t["max_wake_ns"]),
                                                      keep=functools.partial(_lean, names=names),
                                                      texts=pl.Categorical)
            joins, instances, p2p = None, 0, False  # one trace whose collectives join no other member (windowed)
            ranks_known = bool(events["rank"].is_not_null().any())
        else:
            params = {"min_wait_ns": int(t["min_wait_ns"]), "max_wake_ns": int(t["max_wake_ns"]),
                      "align_clocks": bool(t["align_clocks"])}
            try:  # the edges as built, walked without sorting the graph (path_direct); else the measure's graph
                graph = measures.dependency_graph.unchosen(events, **params)
                chosen = graph is None
                graph = measures.dependency_graph(events, **params) if chosen else graph
            except ResourceError as exc:  # the other rules' findings stand; this one says why it has none
                return [Finding(self.name, "info", "Critical path not computed",
                                f"Not computed: {exc}. " + spelled(
                                    "`analyze --step N` (or `--window START:END`)",
                                    "Analysing traceparse.window.cut(trace, traceparse.window.step_windows(trace, "
                                    "N), 'step N')") + " follows the paths of some steps at a time.",
                                metrics={"missing": missing})]
            if graph.height == 0:
                return [Finding(self.name, "info", "No timeline", "The trace has no timed events to follow: a "
                                "critical path needs events placed in time.",
                                metrics={"steps": 0, "paths": 0, "missing": missing}, figures={"paths": "count"})]
            windows = step_windows(events, graph, spans=True)
            found = None if chosen else direct_critical_paths(graph, windows, texts=pl.Categorical,
                                                              columns=_LEAN_INPUT)
            if found is None:  # keys that do not fit: the measure's graph, chosen and sorted
                graph = graph if chosen else DependencyGraph.chosen(graph)
                found = critical_paths(graph, windows, texts=pl.Categorical, columns=_LEAN_INPUT)
            paths, segments = found
            segments = _lean(segments, names)
            joins, instances = _joins(graph), _instances(graph)
            p2p = point_to_point_only(joins.filter(pl.col("dst_trace") == INSTANCE_TRACE)["category"].cast(pl.String))
            ranks_known = graph["rank"].is_not_null().any()
            # ranks whose traces mark no step beside ranks that do: no window of their own (step_windows)
            unstepped = (sorted(set(graph["rank"].drop_nulls().unique().to_list())
                                - set(windows["rank"].drop_nulls().to_list()))
                         if ranks_known and windows.height and windows["step"].is_not_null().any() else [])
            del graph, found
        parts = _split_waits(segments, joins)
        n = paths.height  # paths: one per step of each rank
        length = int(paths["length_ns"].sum())
        per_step = lambda ns: round(ns / n) if n else 0  # noqa: E731
        # each segment by its own kind, on whatever rank it is: the parts below (items) are never larger than their
        # kind (rank 1's DataLoader 50.1% of the path against "host op 26.2%" when the kinds were split by waits);
        # the part of the path on other ranks while this rank waited is its own figure (wait_ns)
        summed = _per_part(segments)  # what the sums and tops below group: parts of paths, not every segment
        own = summed.rename({"segment": "kind"})
        by_kind = _sums(own, "kind", per_step)
        host_ops = _sums(own.filter(pl.col("kind") == "host op"), "name", per_step, top=int(t["top"]))
        kernels = _sums(own.filter(pl.col("kind") == "kernel"), "category", per_step)
        wait_ns = int(parts.filter(pl.col("kind") == OTHER_RANK)["duration_ns"].sum())
        other_ns = int(summed.filter(pl.col("other"))["duration_ns"].sum())
        untraced = int(summed.filter(pl.col("segment") == "untraced")["duration_ns"].sum())
        inferred = int(summed.filter(pl.col("inferred"))["duration_ns"].sum())
        crossings = _crossings(segments, paths)
        key = ["trace_id", "step"]
        waits = dict(((a, b), int(c)) for a, b, c in parts.filter(pl.col("kind") == OTHER_RANK).group_by(key)
                     .agg(pl.col("duration_ns").sum()).iter_rows())
        others = dict(((a, b), int(c)) for a, b, c in summed.filter(pl.col("other")).group_by(key)
                      .agg(pl.col("duration_ns").sum()).iter_rows())
        details = []
        tops = _top_per_path(summed, 3)  # every path's three largest parts at once, not a query per path
        for p in paths.sort("step", "rank", nulls_last=True).iter_rows(named=True):
            k = (p["trace_id"], p["step"])
            details.append({"step": p["step"], "rank": p["rank"], "step_ns": p["step_ns"],
                            "length_ns": p["length_ns"], "unexplained_ns": p["unexplained_ns"],
                            "wait_ns": waits.get(k, 0), "other_rank_ns": others.get(k, 0),
                            "crossings": crossings.get(k, []), "top": tops.get(k, [])})
        # parts of no time are no part of the path: a path of instants (a TPU trace whose host the graph links no
        # timed event of) listed "MemoryDeallocation 0 ns" as its part
        items = [i for i in _top(summed, int(t["top"]), n, length) if i["per_step_ns"] or i["per_path_ns"]]
        wait_pct = expr.pct(wait_ns, length)
        held_pct, held_ns, held_by = _held(segments, paths, events) if ranks_known else (None, 0, None)
        worst = max(wait_pct or 0.0, held_pct or 0.0)
        severity = grade(worst, warning=t["warning_pct"], critical=t["critical_pct"]) if ranks_known else "info"
        rank_rows = _per_rank(details) if ranks_known else {}
        metrics = {"steps": paths["step"].n_unique(), "paths": n, "step_ns": per_step(int(paths["step_ns"].sum())),
                   "length_ns": per_step(length),
                   "unexplained_ns": per_step(int(paths["unexplained_ns"].sum())), "by_kind": by_kind,
                   "host_ops": host_ops, "kernel_categories": kernels, "wait_ns": per_step(wait_ns),
                   "wait_pct": wait_pct, "held_pct": held_pct, "other_rank_ns": per_step(other_ns),
                   "other_rank_pct": expr.pct(other_ns, length),
                   "crossings": round(sum(len(d["crossings"]) for d in details) / n, 4) if n else 0,
                   "collectives": instances, "point_to_point": p2p,
                   "untraced_pct": expr.pct(untraced, length), "inferred_pct": expr.pct(inferred, length),
                   "missing": missing, "per_step": details, "ranks": rank_rows}
        unmarked = bool(windows["step"].is_null().all())  # no step marked: one window over each trace's span
        behind = gpu_behind(events) if isinstance(events, pl.DataFrame) and not unmarked else None
        if behind is not None:  # the path is the host's: say that the GPU, behind it, sets the pace
            metrics["gpu_behind"] = behind.as_dict()
        message = _message(metrics, items, details, ranks_known, unmarked)
        if unstepped:
            one = len(unstepped) == 1
            its, has = ("its", "has") if one else ("their", "have")
            message += (f" {listed('rank', unstepped).capitalize()} {'marks' if one else 'mark'} no step (no "
                        f"ProfilerStep or other step in {its} trace): {'it' if one else 'they'} {has} no path of "
                        f"{its} own, and {its} work is on the paths only where another rank's path crosses to "
                        f"{'it' if one else 'them'}.")
            metrics["unstepped_ranks"] = unstepped
        if cut := incomplete_ranks(trace.meta):  # a profiler killed mid-write: its lost work is no time traced
            said = ends_early(cut)
            message += (f" {said[0].upper()}{said[1:]}: {'its' if len(cut) == 1 else 'their'} work after the cut is "
                        "missing, and the path runs through what was read (the missing work is time the trace does "
                        "not show).")
        if behind is not None:
            message += " " + behind.sentence()
        holder = None
        if held_by is not None and held_pct >= (wait_pct or 0.0):  # the part that holds the others most
            part = {"segment_rank": held_by["rank"], "lane": held_by["lane"], "segment": held_by["kind"],
                    "name": held_by["name"]}
            mine = summed.filter(pl.all_horizontal(pl.col(c).eq_missing(v) for c, v in part.items()))
            holder = next(iter(_top(mine, 1, n, length)), None)
        if holder is None:
            holder = next((i for i in items if i["other_rank"] and i["kind"] != "communication"), None)
        title = "Critical path of each step" if not unmarked else "Critical path of the trace (no steps marked)"
        suggestion = ""
        summary = None
        if behind is not None and behind.paces:  # on the summary too: its step time is the host's, the GPU's longer
            summary = ("GPU behind", f"the steps are the host's: the GPU's work of {behind.behind} of "
                                     f"{behind.steps:,} steps ends {fmt_ns(behind.tail_min_ns)} to "
                                     f"{fmt_ns(behind.tail_max_ns)} after them, {fmt_ns(behind.gpu_ns)} of GPU "
                                     f"work a step against the host's {fmt_ns(behind.step_ns)}")
        gained = None
        if severity != "info":
            title = "Critical path: waits for another rank"
            if holder is not None:
                title = f"Rank {holder['rank']}'s {_short(holder['name'])} holds the step"
                suggestion = (f"Rank {holder['rank']} holds the others: shorten {holder['name']} ({holder['kind']}, "
                              f"{fmt_ns(holder['per_step_ns'])} per step on {holder['lane']}), or move it off the "
                              "path (overlap it with communication, or do it on every rank alike).")
                gained = _gain_without(events, holder, params) if holder["kind"] == "host op" and params else None
                if gained is not None:
                    message += _gain_sentence(gained, holder)
                    metrics.update(drop_gain_ns=gained["mean_ns"], drop_gain_slowest_ns=gained["slowest_ns"])
                summary = ("critical path", f"rank {holder['rank']}'s {_short(holder['name'])} ({holder['kind']}, "
                           f"{holder['lane']}) holds the step: {fmt_ns(holder['per_step_ns'])} of each step's "
                           f"critical path ({fmt_pct(holder['share_pct'])})"
                           + (f"; without it each step is {fmt_ns(gained['mean_ns'])} shorter (replayed)"
                              if gained is not None else ""))
        return [Finding(self.name, severity, title, message, suggestion, metrics=metrics, items=items,
                        columns=([RANK] if ranks_known else []) + (UNMARKED_COLUMNS if unmarked else COLUMNS),
                        figures=FIGURES,
                        labels={**LABELS, **(UNMARKED_LABELS if unmarked else {})},
                        impact_ns=max(per_step(wait_ns) * (n // max(1, len(rank_rows))),
                                      _held_at_stake(held_ns, gained, n, len(rank_rows))) if ranks_known else None,
                        summary=summary)]


def _short(name: str, width: int = 48) -> str:
    """A name for a title: its last part (``autograd::engine::evaluate_function: torch::autograd::X`` is X; a
    kernel's ``void ns::Kernel2<T>(T::Params)`` is ``Kernel2<T>``: not its argument list, nor a ``::`` inside
    brackets), cut to ``width``."""
    name = name.rsplit(": ", 1)[-1]
    if name.endswith(")"):  # a C++ signature: its argument list goes
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i] if i > 0 else name
                break
    name = name.removeprefix("void ")
    depth, cut = 0, 0
    for i, ch in enumerate(name):
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if depth == 0 and name.startswith("::", i):
            cut = i + 2
    name = name[cut:] or name
    return name if len(name) <= width else name[:width - 1] + "…"


#: The texts of a path's segments, as categoricals: a few thousand distinct names over millions of segments (the
#: 1 GB trace's 3.4 million), grouped and filtered on integers, not texts.
_TEXTS = ("trace_id", "segment_trace", "edge", "segment", "name", "category", "lane")


#: The segments' columns :func:`_lean` reads (a run's millions of segments are made of these only).
_LEAN_INPUT = ("rank", "step", "index", "segment_rank", "inferred", "start_ns", "end_ns", "duration_ns", "dst_node",
               "tid", "stream_id", *(c for c in _TEXTS if c != "lane"))


def _lean(segments: pl.DataFrame, names: dict | None = None) -> pl.DataFrame:
    """The columns of the path's segments the rule reads, with ``other`` (the segment is on another rank than
    the path's) and ``lane``, the texts as categoricals (:data:`_TEXTS`); sums and tops cast them back to text
    before they sort, so ties fall as they would on the texts. A lane's text is made once per distinct lane (a
    few dozen over half a million segments)."""
    own = pl.col("segment_rank").fill_null(-1) == pl.col("rank").fill_null(-1)
    key = _lane_key(segments)
    on = ["_lane"] if key is not None else ["tid", "stream_id"]
    lean = segments.select(
        "rank", "step", "index", "segment_rank", "inferred", "start_ns", "end_ns", "duration_ns", "dst_node",
        "tid", "stream_id", *(pl.col(c).cast(pl.Categorical) for c in _TEXTS if c != "lane"), other=~own,
        **({} if key is None else {"_lane": key}))
    lanes = (lean.select(*{"tid": None, "stream_id": None, **dict.fromkeys(on)}).unique(on)  # a row per lane
             .with_columns(lane=expr.lane_label(names).cast(pl.Categorical)).select(*on, "lane"))
    return lean.join(lanes, on=on, how="left", nulls_equal=True, maintain_order="left").drop(
        "tid", "stream_id", *(["_lane"] if key is not None else []))


def _lane_key(segments: pl.DataFrame) -> pl.Expr | None:
    """One integer per lane (its thread where it has one, as :func:`traceparse.expr.lane_label` names it, else its
    stream; null for neither), so that the lanes are told apart on one column, not two; None where the ids are
    too large to double."""
    bound = 1 << 61
    for column in ("tid", "stream_id"):
        values = segments[column]
        if values.null_count() < values.len() and not -bound < values.min() <= values.max() < bound:
            return None
    return (pl.when(pl.col("tid").is_not_null()).then(pl.col("tid") * 2)
            .when(pl.col("stream_id").is_not_null()).then(pl.col("stream_id") * 2 + 1))


#: What a part of a path is: the columns :func:`_per_part` groups by.
_PART = ("trace_id", "step", "segment_rank", "lane", "segment", "name", "category", "inferred", "other")


def _per_part(segments: pl.DataFrame) -> pl.DataFrame:
    """The segments summed per path and part (``duration_ns``: their sum), with the columns the sums and tops
    group by: each of those groups these, not every segment (the 139 MB trace's 475,000 segments are some 9,000
    parts); the sums of integers come out the same. Grouped on one integer made of the nine columns' codes
    (:func:`_part_key`) where it fits, not on nine columns (475,000 segments: 17 -> 12 ms)."""
    key = _part_key(segments)
    if key is None:
        return segments.group_by(*_PART).agg(pl.col("duration_ns").sum())
    return (segments.select(*_PART, "duration_ns", _k=key).group_by("_k")
            .agg(*(pl.col(c).first() for c in _PART), pl.col("duration_ns").sum()).drop("_k"))


def _part_key(segments: pl.DataFrame) -> pl.Series | None:
    """One integer per part (:data:`_PART`: each column's physical code, a null as one less than its least,
    offset and multiplied into place), or None where the columns' ranges multiply past 2^62."""
    if segments.height == 0:
        return None
    codes = segments.select(pl.col(c).to_physical().cast(pl.Int64) for c in _PART)
    key, span = np.zeros(segments.height, dtype=np.int64), 1
    for column in codes.iter_columns():
        low = column.min()
        low = -1 if low is None else int(low) - 1  # a null is below every value
        width = (low + 1 if column.max() is None else int(column.max())) - low + 1
        if span * width >= 1 << 62:
            return None
        key += (column.fill_null(low).to_numpy() - low) * span
        span *= width
    return pl.Series(key, dtype=pl.Int64)


def _text(*columns: str) -> list[pl.Expr]:
    """``columns`` (categoricals of :func:`_lean`) as text again: for sorting a small aggregate as the texts sort."""
    return [pl.col(c).cast(pl.String) for c in columns]


def _sums(segments: pl.DataFrame, by: str, per_step, top: int | None = None) -> dict:
    rows = (segments.group_by(by).agg(ns=pl.col("duration_ns").sum()).with_columns(_text(by))
            .sort(["ns", by], descending=[True, False], nulls_last=True))
    out = {str(k): per_step(int(v)) for k, v in rows.iter_rows()}
    if top is not None and len(out) > top:
        kept = dict(list(out.items())[:top])
        kept["(others)"] = sum(list(out.values())[top:])
        return kept
    return out


def _top(segments: pl.DataFrame, top: int, steps: int, length: int | None = None) -> list[dict]:
    """The largest parts (rank, lane, kind, name) of ``segments``, per step: a step's own name left out
    (``(nothing traced in ProfilerStep#3)`` is ``... ProfilerStep#N)``), so that one part of every step is one row,
    as whatif shows it, not a row per step ranked below parts smaller in all."""
    part = ["segment_rank", "lane", "segment", "name"]
    rows = (segments.group_by(*part, "trace_id", "step").agg(ns=pl.col("duration_ns").sum(),
                                                             other=pl.col("other").any())
            .with_columns(_text("lane", "segment", "name"))
            .with_columns(step_free(pl.col("name")))
            .group_by(*part).agg(pl.col("ns").sum(), pl.col("other").any(),
                                 _paths=pl.struct("trace_id", "step").n_unique())
            .sort(["ns", "segment_rank", "lane", "name"], descending=[True, False, False, False], nulls_last=True)
            .head(top))
    out = []
    for r in rows.iter_rows(named=True):
        item = {"rank": r["segment_rank"], "lane": r["lane"], "kind": r["segment"], "name": r["name"],
                "per_step_ns": round(r["ns"] / max(steps, 1)), "other_rank": r["other"],
                "paths": r["_paths"], "per_path_ns": round(r["ns"] / max(r["_paths"], 1))}
        if length is not None:
            item["share_pct"] = expr.pct(r["ns"], length)
        out.append(item)
    return out


#: The event kind of a GPU segment's own time (a host segment's is its ``category``: the owner's kind).
_EVENT_KIND = {"kernel": "kernel", "copy": "memcpy", "memset": "memset"}
#: Segments that are an event's own time, comparable with the same name on the other ranks.
_OWN_TIME = ("host op", "runtime", "launch", "sync", *_EVENT_KIND)


def _held(segments: pl.DataFrame, paths: pl.DataFrame, events) -> tuple[float | None, int, dict | None]:
    """The part of one rank that holds the other ranks' paths most: (its held time's share of those paths'
    length, that time in ns summed over them, the part: ``rank``, ``lane``, ``kind``, ``name``), or (None, 0,
    None).

    A part (rank, lane, kind, name: an event's own time, not communication, queueing or untraced time) holds
    another rank's path for its time on that path, but only for as long as it takes longer on its rank than on
    the median rank, per step (:data:`traceparse.measures.step_time_by_name`; of an even number of ranks the
    lower middle one's): the path of a rank that waited at a collective crosses to the last rank to arrive and
    runs back through that rank's work, which in a balanced run is the same work as its own. On four balanced
    ranks a GEMM kernel of the last rank took a quarter of the others' paths; it takes no longer there than
    anywhere, so it holds nothing."""
    on = segments.filter(pl.col("other") & pl.col("segment").is_in(list(_OWN_TIME)))
    if on.height == 0:
        return None, 0, None
    kind = pl.col("segment").replace_strict(_EVENT_KIND, default=pl.col("category"), return_dtype=pl.String)
    part = ["segment_trace", "segment_rank", "lane", "segment", "name"]
    per_path = on.with_columns(kind=kind).group_by("trace_id", "step", *part, "kind").agg(
        ns=pl.col("duration_ns").sum()).with_columns(_text("trace_id", "segment_trace", "lane", "segment", "name"))
    excess = _excess_per_step(events, per_path.select("segment_trace", "kind", "name").unique())
    held = (per_path.join(excess, on=["segment_trace", "kind", "name"], how="inner")
            .with_columns(held=pl.min_horizontal("ns", "excess"))
            .group_by(*part).agg(ns=pl.col("held").sum())
            .filter(pl.col("ns") > 0)
            .sort(["ns", "segment_rank", "lane", "name"], descending=[True, False, False, False], nulls_last=True))
    if held.height == 0:
        return 0.0, 0, None
    top = held.row(0, named=True)
    rank = -1 if top["segment_rank"] is None else top["segment_rank"]
    others = paths.filter(pl.col("rank").fill_null(-1) != rank)
    who = {"rank": top["segment_rank"], "lane": top["lane"], "kind": top["segment"], "name": top["name"]}
    return expr.pct(int(top["ns"]), int(others["length_ns"].sum())), int(top["ns"]), who


def _gain_without(events, holder: dict, params: dict) -> dict | None:
    """What the steps gain with the part that holds them (a host op or annotation of one rank) taking no time:
    every step of every rank replayed without it (:func:`traceparse.measures.whatif.step_gains`, as ``whatif
    --drop NAME@RANK``): ``mean_ns`` (per step, the mean over the paths) and ``slowest_ns`` (the slowest rank's
    step, measured less predicted, as whatif says it: ranks in lockstep run at its pace), or None where it cannot
    be replayed.

    Its time on the others' paths is not what removing it gains: work beside it (its rank's GPU work, another
    thread) takes its place (a 30 ms sleep in a gradient hook on four FSDP2 ranks took 30.3 ms of each step's
    path; the replay gains 7.1 ms on the mean rank, 11.0 on the slowest, and the job measured 12.1 ms)."""
    import glob

    from traceparse.measures.whatif import Drop, slowest_step, step_gains

    try:
        graph = measures.dependency_graph(events, **params)
    except ResourceError:
        return None
    steps = step_gains(events, graph, drops=[Drop(glob.escape(holder["name"]), holder["rank"])])
    if steps is None or steps.height == 0:
        return None
    slowest = slowest_step(steps)
    return {"mean_ns": round(float(steps["gain_ns"].mean())), "paths": steps.height,
            "slowest_ns": slowest["gain_ns"] if slowest is not None else None}


def _gain_sentence(gained: dict, holder: dict) -> str:
    """What the replay without the holding part gains, beside its time on the path."""
    name = holder["name"].replace("'", "'\\''")
    slowest = (f" and the slowest rank's {fmt_ns(gained['slowest_ns'])} (the ranks step together at its pace)"
               if gained["slowest_ns"] is not None else "")
    text = (f" Replayed without it (whatif --drop '{name}@{holder['rank']}'), each step is "
            f"{fmt_ns(gained['mean_ns'])} shorter on the mean rank{slowest}: what removing it gains")
    if gained["mean_ns"] < 0.8 * holder["per_step_ns"]:
        text += (f", less than its {fmt_ns(holder['per_step_ns'])} a step on the path, where other work (its rank's "
                 "GPU work, another thread) takes its place")
    return text + "."


def _held_at_stake(held_ns: int, gained: dict | None, paths: int, ranks: int) -> int:
    """The time at stake of the part that holds the others: its time on their paths over the ranks, but no more
    than the replay without it gains a rank over its steps (the job's: the slowest rank's step, at whose pace the
    ranks go; else the mean rank's)."""
    at_stake = round(held_ns / max(1, ranks))
    if gained is not None:
        per_step = gained["slowest_ns"] if gained["slowest_ns"] is not None else gained["mean_ns"]
        at_stake = min(at_stake, round(max(0, per_step) * paths / max(1, ranks)))
    return at_stake


def _excess_per_step(events, wanted: pl.DataFrame) -> pl.DataFrame:
    """``wanted`` (``segment_trace``, ``kind``, ``name``) with ``excess``: how much longer that name takes per
    step on that trace's rank than on the median rank (:func:`traceparse.measures.nesting.over_median`), in ns;
    rows of no excess left out."""
    table = measures.step_time_by_name(events)
    traces = sorted(set(table["trace_id"].drop_nulls().to_list()))
    asked = set(wanted.iter_rows())
    rows = [(tr, kind, name, extra) for tr, kind, name, own, median in over_median(table, traces)
            if (tr, kind, name) in asked and (extra := round(own - median)) > 0]
    return pl.DataFrame(rows, schema={"segment_trace": pl.String, "kind": pl.String, "name": pl.String,
                                      "excess": pl.Int64}, orient="row")


def _top_per_path(segments: pl.DataFrame, top: int) -> dict[tuple, list[dict]]:
    """{(trace, step): the ``top`` largest parts of that path} (:func:`_top` of each path, per step), all paths
    in one query."""
    path = ["trace_id", "step"]
    rows = (segments.group_by(*path, "segment_rank", "lane", "segment", "name")
            .agg(ns=pl.col("duration_ns").sum(), other=pl.col("other").any())
            .with_columns(_text("trace_id", "lane", "segment", "name"))
            .sort([*path, "ns", "segment_rank", "lane", "name", "segment"],
                  descending=[False, False, True, False, False, False, False], nulls_last=True)
            .group_by(path, maintain_order=True).head(top))
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows.iter_rows(named=True):
        out[(r["trace_id"], r["step"])].append({"rank": r["segment_rank"], "lane": r["lane"], "kind": r["segment"],
                                                "name": r["name"], "per_step_ns": r["ns"], "other_rank": r["other"]})
    return dict(out)


def _joins(graph: pl.DataFrame) -> pl.DataFrame:
    """The graph's ``join`` edges in the measure's order (by destination, then source: the sorted graph's), whether
    ``graph`` is the measure's or the edges as built (:meth:`DependencyGraph.unchosen`): :func:`_split_waits` keeps
    the last of a rank's joinings of an instance."""
    return graph.filter(pl.col("edge") == "join").sort("dst_node", "src_trace", "src_node", nulls_last=True,
                                                       maintain_order=True)


def _instances(graph: pl.DataFrame) -> int:
    """How many collective instances the graph holds (each is one node of the instance trace)."""
    joins = graph.filter((pl.col("edge") == "join") & (pl.col("dst_trace") == INSTANCE_TRACE))
    return joins["dst_node"].n_unique() if joins.height else 0


def _crossings(segments: pl.DataFrame, paths: pl.DataFrame) -> dict[tuple, list[dict]]:
    """{(trace, step): the collectives where the path moves to another rank, latest first}: a ``join`` segment
    right after (``index`` + 1) a ``leave`` segment of the same path on another rank, every path in one query."""
    path = ["trace_id", "step"]
    leaves = segments.filter(pl.col("edge") == "leave").select(*path, "index", from_rank="segment_rank")
    rows = (segments.filter((pl.col("edge") == "join") & (pl.col("index") > 0))
            .with_columns(_prev=pl.col("index") - 1)
            .join(leaves, left_on=[*path, "_prev"], right_on=[*path, "index"], how="inner", nulls_equal=True)
            .filter(pl.col("segment_rank").ne_missing(pl.col("from_rank")))
            .with_columns(_text("trace_id", "category", "name")).sort([*path, "index"]))
    if rows.height == 0:
        return {}
    starts = paths.select(*path, _start="start_ns")
    rows = rows.join(starts, on=path, how="left", nulls_equal=True, maintain_order="left").select(
        *path, collective=pl.when(pl.col("category").is_not_null() & (pl.col("category") != ""))
        .then(pl.col("category")).otherwise(pl.col("name")), name="name", from_rank="from_rank",
        to_rank="segment_rank", offset_ns=pl.col("end_ns") - pl.col("_start"),
        instance=-pl.col("dst_node") - 1)  # the graph numbers instance nodes -1, -2, ...: instance 0, 1, ...
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows.iter_rows(named=True):
        out[(r.pop("trace_id"), r.pop("step"))].append(r)
    return dict(out)


def _split_waits(segments: pl.DataFrame, joins: pl.DataFrame | None) -> pl.DataFrame:
    """The path's segments by what they are from the view of the rank whose step it is: its own segments by their
    kind; a segment on another rank, inside a time when this rank had joined a collective and waited for the last
    rank to join it (from its own joining to the instance), is ``waiting for another rank`` for that part, and
    its own kind for the rest. ``joins``: the graph's ``join`` edges (None: it has none). Columns: those of
    ``segments`` with ``kind``; a split segment is two rows.

    Every path at once: each path's waits merged into disjoint intervals, and a segment's part inside them is
    ``covered(end) - covered(start)``, the waited time before each point found by an as-of join."""
    rows = segments.with_columns(kind=pl.col("segment"))
    if segments.height == 0 or joins is None or joins.height == 0:
        return rows
    # a rank's joining of each instance (the last join edge of that node and rank, as a dict would keep)
    joined = (joins.select("dst_node", "src_rank", began="src_ns")
              .unique(["dst_node", "src_rank"], keep="last", maintain_order=True))
    waits = (segments.filter((pl.col("edge") == "join") & pl.col("other"))
             .join(joined, left_on=["dst_node", "rank"], right_on=["dst_node", "src_rank"], how="inner",
                   nulls_equal=True)
             .filter(pl.col("began") < pl.col("end_ns")).select("trace_id", "step", a="began", b="end_ns"))
    if waits.height == 0:
        return rows
    # one number per path (trace, step; a step may be null)
    ids = rows.select("trace_id", "step").unique(maintain_order=True).with_row_index("_p")
    rows = rows.join(ids, on=["trace_id", "step"], how="left", nulls_equal=True, maintain_order="left")
    waits = waits.join(ids, on=["trace_id", "step"], how="inner", nulls_equal=True).select("_p", "a", "b")
    reach = pl.col("b").cum_max().shift(1).over("_p")
    length = pl.col("b") - pl.col("a")
    merged = (waits.sort("_p", "a", "b")
              .with_columns(_g=(reach.is_null() | (pl.col("a") > reach)).cum_sum().over("_p"))
              .group_by("_p", "_g").agg(pl.col("a").min(), pl.col("b").max())
              .sort("_p", "a").with_columns(before=length.cum_sum().over("_p") - length)
              .select("_p", "a", "b", "before"))

    def covered(at: str) -> pl.Series:
        """Per row of ``rows``, the waited time of its path before its ``at``."""
        found = (rows.with_row_index("_row").select("_row", "_p", x=pl.col(at)).sort("x")
                 .join_asof(merged, left_on="x", right_on="a", by="_p", strategy="backward", check_sortedness=False))
        return found.sort("_row").select(
            (pl.col("before") + (pl.min_horizontal("x", "b") - pl.col("a")).clip(0)).fill_null(0)).to_series()

    rows = rows.with_columns(_in=pl.when(pl.col("other")).then(covered("end_ns") - covered("start_ns"))
                             .otherwise(0).cast(pl.Int64))
    waited = rows.filter(pl.col("_in") > 0).with_columns(kind=pl.lit(OTHER_RANK, dtype=rows["kind"].dtype),
                                                         duration_ns=pl.col("_in"))
    rest = rows.with_columns(duration_ns=pl.col("duration_ns") - pl.col("_in")).filter(
        (pl.col("duration_ns") > 0) | (pl.col("_in") == 0))
    return pl.concat([rest, waited]).drop("_in", "_p")


def _per_rank(details: list[dict]) -> dict:
    """{rank: its paths' means per step and the ranks it crossed to}, from the per-step details."""
    out: dict[str, dict] = {}
    by_rank: dict = defaultdict(list)
    for d in details:
        by_rank[d["rank"]].append(d)
    for rank in sorted(by_rank, key=lambda r: (r is None, r)):
        rows = by_rank[rank]
        to = Counter(c["to_rank"] for d in rows for c in d["crossings"])
        out["-" if rank is None else str(rank)] = {
            "steps": len(rows), "length_ns": round(sum(d["length_ns"] for d in rows) / len(rows)),
            "wait_ns": round(sum(d["wait_ns"] for d in rows) / len(rows)),
            "other_rank_ns": round(sum(d["other_rank_ns"] for d in rows) / len(rows)),
            "crossed_to": {str(k): v for k, v in sorted(to.items(), key=lambda kv: (kv[0] is None, kv[0]))}}
    return out


def _missing(events, nouns: dict[int, str] | None = None) -> list[str]:
    """The edges this trace cannot give, in words (docs/critical_path.md: which formats carry which edges);
    ``nouns``: :func:`traceparse.meta.device_nouns`, the trace's devices that are no GPU (TPUs)."""
    row = edge_coverage(events)
    out = []
    if not row["host"]:
        out.append("no host events: the path follows the GPU streams only (stream order); launches, "
                   "synchronisations and host work are not in the trace")
    elif not row["threads"]:
        out.append("host events without a thread id: launches link calls to GPU work, but the path cannot follow "
                   "the host from one call to the next")
    else:
        if not row["api"] and row["gpu"]:
            out.append("no runtime calls (launches, synchronisations): GPU work is linked to the operator of the "
                       "same external id where it has one, and no wait for the GPU, nor for another thread but at "
                       "a collective's end, can be seen")
        if not row["ops"] and not row["regions"]:
            out.append("no operators (only annotations and collective calls): the host's own work between them is "
                       "untraced time")
    others = sorted(set((nouns or {}).values()))
    if not row["gpu"] and others:  # a TPU's ops are XLA's device lines: nothing links them to the host's calls
        out.append(f"no GPU streams: the {' and '.join(others)}s' ops are not in the graph (nothing in the trace "
                   "links them to the host's calls), so the path follows the host only")
    elif not row["gpu"]:
        out.append("no timed GPU work")
    return out


def _message(m: dict, items: list[dict], details: list[dict], ranks_known: bool, unmarked: bool = False) -> str:
    """The finding's prose: the path against its step (its trace's span where no step is marked), its parts."""
    if not m["paths"]:
        return "No step window to follow."
    parts = sorted(((k, v) for k, v in m["by_kind"].items() if v), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{k} {fmt_pct(expr.pct(v, m['length_ns']))}" for k, v in parts[:4])
    kinds = f": {kinds}" if kinds else " (it reached no event that takes time)"
    ranks = len(m["ranks"])
    counted = (f"{m['steps']:,} step{'s' if m['steps'] != 1 else ''}" + (f" × {ranks:,} ranks" if ranks > 1 else ""))
    if ranks > 1 and m["paths"] != m["steps"] * ranks:  # ranks that hold different steps: say how many paths
        counted = f"{m['paths']:,} paths over {m['steps']:,} steps of {ranks:,} ranks"
    if unmarked:
        text = (f"No steps are marked: from the first to the last event the graph links ({fmt_ns(m['step_ns'])}"
                f"{' a rank' if ranks > 1 else ''}; the summary's span counts every event), the critical path is "
                f"{fmt_ns(m['length_ns'])}{kinds}.")
    else:
        text = (f"Per step the critical path is {fmt_ns(m['length_ns'])} of a {fmt_ns(m['step_ns'])} step"
                f" ({counted}){kinds}.")
    each = " a window" if unmarked else " per step"  # no step marked: the one window over the trace
    if m["unexplained_ns"]:
        text += (f" {fmt_ns(m['unexplained_ns'])}{each} lies before the first event the path reached.")
    if ranks_known:
        to = Counter(c["to_rank"] for d in details for c in d["crossings"])
        if to:
            rank, count = sorted(to.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            first = next(c for d in details for c in d["crossings"] if c["to_rank"] == rank)
            at = len({c["instance"] for d in details for c in d["crossings"] if c["to_rank"] == rank})
            times = f", {count:,} times over the {len(details):,} paths" if count != at else ""
            one = "point-to-point transfer" if m.get("point_to_point") else "collective"  # a pipeline's sends
            text += (f" It crosses to rank {rank} at {at} of the {m['collectives']} {one}"
                     f"{'s' if m['collectives'] != 1 else ''} ({first['name']}{times}):"
                     f" {fmt_ns(m['other_rank_ns'])} per step ({fmt_pct(m['other_rank_pct'])}) runs on other ranks, "
                     f"{fmt_ns(m['wait_ns'])} of it ({fmt_pct(m['wait_pct'])} of the path) while this rank had joined "
                     f"a {'transfer' if m.get('point_to_point') else 'collective'} and waited for them.")
    def much(item: dict) -> str:
        # a part on some of the paths only, given per mean path alone, read as its time on them (28.05 ms a step
        # of an untraced stretch that took 224.4 ms of rank 7's step, the one path it lies on of 8)
        if item["paths"] >= m["paths"]:
            return f"{fmt_ns(item['per_step_ns'])}{each}"
        on = "the one path" if item["paths"] == 1 else f"each of the {item['paths']:,} paths"
        return (f"{fmt_ns(item['per_path_ns'])} of {on} it lies on ({fmt_ns(item['per_step_ns'])} of the mean "
                f"path)")

    if items and items[0]["per_step_ns"]:  # a path of no length has no largest part worth naming
        lead = items[0]
        who = f"rank {lead['rank']} {lead['lane']}" if lead.get("rank") is not None else lead["lane"]
        text += f" Its largest part: {lead['kind']} {lead['name']} on {who}, {much(lead)}."
        off = next((i for i in items if i["other_rank"] and i["kind"] != "communication"), None)
        if off is not None and off is not lead:
            text += f" On rank {off['rank']}: {off['kind']} {off['name']} ({off['lane']}), {much(off)}."
    if m["untraced_pct"]:
        text += f" {fmt_pct(m['untraced_pct'])} of the path is time the trace does not show."
    if m["inferred_pct"]:
        text += (f" {fmt_pct(m['inferred_pct'])} rests on inferred waits (a thread woken by another, a stream by "
                 "another).")
    for line in m["missing"]:
        text += f" The trace has {line}."
    return text


@hookimpl
def traceparse_rules():
    return [CriticalPath()]
