"""What-if: each step's dependency graph replayed with changed durations (``traceparse whatif``, issue 24 item 5).

The graph is :data:`traceparse.measures.critical_path.dependency_graph`'s, replayed by the one engine
(:class:`traceparse.measures.replay.Replayer`); docs/critical_path.md says what every edge is. An edit changes
the weights of some edges:

``drop NAME[@RANK]``   a host op or annotation takes no time: the ``thread`` edges it owns (its self time) weigh
                       nothing; its children keep theirs. NAME matches a name exactly or as a glob (``fnmatch``).
``scale KEY=FACTOR``   GPU work of a kind (``kernel``, ``memcpy``, ``memset``) or kernel category (kernel-share's:
                       ``gemm``, ``convolution``, ...) takes FACTOR times as long; ``comm`` (or ``communication``)
                       scales all communication: communication kernels, collective calls' and annotations' own
                       time, and each collective from its last member's joining to a member's leaving.
``balance``            every rank behaves like the median rank: per name (host operators, annotations and runtime
                       calls by self time, kernels, copies and memsets by duration, over the steps; neither
                       collectives, synchronisations nor step annotations, whose time is waiting), a rank whose
                       time per step exceeds the median over the ranks has that name's edges scaled by
                       median / its own, where the excess is at least 1% of the rank's mean step (a
                       straggler's, not noise). Of an even number of ranks the median is the lower middle one, a
                       rank's own figure: of two ranks, the other one (their mean would leave half of a
                       straggler's excess in the prediction).

The predicted step of a rank is the replayed time between its step window's two ends (the nodes at its start and
end: the ``ProfilerStep#N`` annotation's own, where there is one), each step replayed from its measured start (an
edge into the step from another step leaves at its source's measured time): what one step gains is never carried
into the next, where a node no edge explains, kept where it was measured, would make it read as slower. With no
edit every node lands where it was measured, so the prediction is the measured step; with speed-ups only, no
step is predicted slower. Time the trace does not show (``untraced`` edges: a host thread
running nothing the trace records, a stream idle before work whose launch is not in the trace) is replayed as
measured: whatif says where the path holds such time rather than guess what it was.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceparse import expr
from traceparse.errors import InputError
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.measures.critical_path import (EDGE_KINDS, INSTANCE_TRACE, SYNC_CALLS, critical_paths,
                                              dependency_graph, edge_coverage)
from traceparse.measures.gpu_behind import gpu_behind
from traceparse.measures.nesting import over_median, step_time_by_name
from traceparse.measures.replay import Replayer
from traceparse.measures.step_paths import step_windows
from traceparse.measures.steps import STEP_NAME, step_free

#: ``--scale`` keys that are kinds of GPU work (the kernel categories are the others), and ``comm``.
SCALE_KINDS = ("kernel", "memcpy", "memset", "comm")
#: Segments of GPU activities (an activity's own ``stream`` edge, start → end) by the kind they are.
GPU_SEGMENTS = {"kernel": "kernel", "copy": "memcpy", "memset": "memset", "communication": "kernel"}


@dataclass(frozen=True)
class Drop:
    """``--drop NAME[@RANK]``: the host ops and annotations named NAME (exactly or as a glob) take no time."""

    pattern: str
    rank: int | None = None

    @property
    def text(self) -> str:
        return f"--drop {self.pattern}" + (f"@{self.rank}" if self.rank is not None else "")

    def matches(self, names: pl.Series) -> pl.Series:
        """Which of ``names`` the pattern matches (exactly, or as a glob)."""
        hit = [n for n in names.unique().to_list() if n == self.pattern or fnmatch.fnmatchcase(n, self.pattern)]
        return names.is_in(hit)


@dataclass(frozen=True)
class Scale:
    """``--scale KEY=FACTOR``: GPU work of a kind or kernel category (or all communication) × FACTOR."""

    key: str
    factor: float

    @property
    def text(self) -> str:
        return f"--scale {self.key}={self.factor:g}"


def scale_keys() -> list[str]:
    """The valid ``--scale`` keys: :data:`SCALE_KINDS`, ``communication`` and the kernel categories in force
    (kernel-share's, plugins' rows included)."""
    categories = dict.fromkeys(c for c, _ in expr.kernel_categories())
    categories[expr.OTHER_CATEGORY] = None
    return list(dict.fromkeys([*SCALE_KINDS, "communication", *categories]))


def parse_drop(text: str) -> Drop:
    """``NAME`` or ``NAME@RANK`` (RANK a whole number) as a :class:`Drop`; a one-line error for an empty name."""
    name, rank = text, None
    head, sep, tail = text.rpartition("@")
    if sep and tail.isascii() and tail.isdigit() and head:
        name, rank = head, int(tail)
    if not name.strip():
        raise InputError(f"--drop {text!r}: expected NAME or NAME@RANK (a host op or annotation's name or glob)")
    return Drop(name, rank)


def parse_scale(text: str) -> Scale:
    """``KEY=FACTOR`` as a :class:`Scale`: KEY one of :func:`scale_keys`, FACTOR a finite number ≥ 0."""
    key, sep, value = text.partition("=")
    key = key.strip()
    valid = scale_keys()
    if not sep:
        raise InputError(f"--scale {text!r}: expected KIND_OR_CATEGORY=FACTOR, e.g. gemm=0.5")
    if key not in valid:
        raise InputError(f"--scale {text!r}: unknown kind or category {key!r}; valid: {', '.join(valid)}")
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not math.isfinite(factor) or factor < 0:
        raise InputError(f"--scale {text!r}: FACTOR a number ≥ 0, got {value!r}")
    return Scale("comm" if key == "communication" else key, factor)


@dataclass
class Applied:
    """What one edit changed: its text, what it matched (``calls``: events, or names for ``--balance``;
    ``ranks``; ``names``), and the time it took out of (negative: added to) the matched edges inside the steps:
    ``removed_ns`` per step of the ranks it touched, ``by_rank`` per step of each of them (``None`` for a trace
    without ranks). Time taken out of an edge off the critical path gains nothing. ``in_steps``: the events it
    matched inside the step windows, ``windows``: how many windows those lie in (of the ranks they are on): what
    ``removed_ns`` covers, where ``calls`` counts the whole trace (an nsys capture's 1,114 kernels beside the 372
    of its one step)."""

    text: str
    calls: int = 0
    ranks: list = field(default_factory=list)
    removed_ns: int = 0
    names: list = field(default_factory=list)
    by_rank: dict = field(default_factory=dict)
    in_steps: int = 0
    windows: int = 0


@dataclass
class WhatIf:
    """The result of :func:`what_if`: per step of every rank the measured and predicted step time; the new critical
    path's length per step and its largest parts; what each edit matched; what the trace cannot replay."""

    steps: pl.DataFrame
    path_ns: float
    top: list[dict]
    applied: list[Applied]
    cannot: list[str]
    missing: list[str]
    #: What the replay of host-measured steps cannot show (the GPU behind the steps: :mod:`.gpu_behind`).
    notes: list[str] = field(default_factory=list)


# -- the graph's parts an edit touches ----------------------------------------------------------------------------
def _itself() -> pl.Expr:
    """A GPU activity's own edge: ``stream``, from its start node to its end node."""
    return ((pl.col("edge") == "stream") & (pl.col("src_node") == 2 * pl.col("event_id"))
            & (pl.col("dst_node") == 2 * pl.col("event_id") + 1))


def _own_time() -> pl.Expr:
    """A host event's own time: the ``thread`` edges it owns (not time the trace does not show)."""
    return (pl.col("edge") == "thread") & pl.col("event_id").is_not_null() & (pl.col("segment") != "untraced")


def _kernel_leaving() -> pl.Expr:
    """A communication kernel's ``leave`` edge: its own time once the last member joined (the kernel's end; its
    ``stream`` edge, from its start, is the one it waits on): a kernel that runs faster ends sooner after it."""
    return (pl.col("edge") == "leave") & pl.col("stream_id").is_not_null()


def _scale_mask(graph: pl.DataFrame, key: str) -> pl.Expr:
    if key == "comm":
        return ((pl.col("segment") == "communication") & pl.col("edge").is_in(["thread", "stream", "leave",
                                                                                 "enqueue"]))
    if key in ("kernel", "memcpy", "memset"):
        segments = [s for s, k in GPU_SEGMENTS.items() if k == key]
        mine = _itself() & pl.col("segment").is_in(segments)
        # NCCL kernels too: their ends come from the leave edge wherever they waited (halving only their stream
        # edge left every kernel that waited as long as it ran)
        return mine | _kernel_leaving() if key == "kernel" else mine
    return _itself() & pl.col("segment").is_in(["kernel", "communication"]) & (pl.col("category") == key)


def _weights(graph: pl.DataFrame) -> np.ndarray:
    return graph["weight_ns"].cast(pl.Float64).to_numpy().copy()


def _in_steps(graph: pl.DataFrame, windows: pl.DataFrame) -> np.ndarray:
    """Per edge: whether its destination lies inside one of its trace's step windows (measured times)."""
    inside = np.zeros(graph.height, dtype=bool)
    trace = pl.when(pl.col("dst_trace") == INSTANCE_TRACE).then(pl.col("src_trace")).otherwise(pl.col("dst_trace"))
    keyed = graph.select(trace.alias("t"), "dst_ns").with_row_index("i")
    for (t,), w in windows.group_by("trace_id", maintain_order=True):
        rows = keyed.filter(pl.col("t") == t)
        if rows.height == 0:
            continue
        times = rows["dst_ns"].to_numpy()
        hit = np.zeros(len(times), dtype=bool)
        for a, b in w.select("start_ns", "end_ns").iter_rows():
            hit |= (times > a) & (times <= b)
        inside[rows["i"].to_numpy()[hit]] = True
    return inside


def apply_edits(graph: pl.DataFrame, events: pl.DataFrame, windows: pl.DataFrame, drops=(), scales=(),
                balance: bool = False, cut: frozenset = frozenset()) -> tuple[np.ndarray, list[Applied]]:
    """The weight of every edge of ``graph`` after the edits (graph row order), and what each edit matched.

    ``windows``: the step windows (:func:`step_windows`), over which an edit's time per step is counted. A drop
    that matches no host op or annotation (on its rank) is a one-line :class:`InputError`; so is a rank the trace
    does not have, and ``balance`` on a trace of one rank. ``cut``: as :func:`balance_factors`'s."""
    graph = graph.with_columns(pl.col("name", "category").cast(pl.String))  # matched as text against names
    w = _weights(graph)
    inside = _in_steps(graph, windows)
    ranks = sorted(r for r in graph["rank"].drop_nulls().unique().to_list())
    applied = []
    host_owned = graph.select(_own_time()).to_series().to_numpy()  # a host op's or annotation's own time
    for d in drops:
        if d.rank is not None and d.rank not in ranks:
            where = f"ranks {', '.join(map(str, ranks))}" if ranks else "one trace without ranks"
            raise InputError(f"{d.text}: no rank {d.rank} in the trace ({where})")
        names = graph["name"].fill_null("")
        hit = host_owned & d.matches(names).to_numpy()
        if d.rank is not None:
            hit &= (graph["rank"] == d.rank).fill_null(False).to_numpy()
        if not hit.any():
            on = f" on rank {d.rank}" if d.rank is not None else ""
            raise InputError(f"{d.text}: no host op or annotation{on} is named {d.pattern!r} (exactly or as a glob)")
        before = w.copy()
        w[hit] = 0
        matched = graph.filter(pl.Series(hit))
        applied.append(_applied(d.text, matched.select("trace_id", "event_id").unique().height, graph, windows,
                                (before - w) * inside, sorted(matched["name"].unique().to_list()), hit & inside))
    for s in scales:
        hit = graph.select(_scale_mask(graph, s.key)).to_series().fill_null(False).to_numpy()
        before = w.copy()
        w[hit] = w[hit] * s.factor
        matched = graph.filter(pl.Series(hit))
        calls = matched.filter(_itself()).select("trace_id", "event_id").unique().height if s.key != "comm" else \
            matched.select("trace_id", "event_id").unique().height
        applied.append(_applied(s.text, calls, graph, windows, (before - w) * inside * hit, matched=hit & inside))
    if balance:
        if len(ranks) < 2:
            raise InputError("--balance: the trace is not a run of several ranks (every rank behaves like the "
                             "median rank needs ranks to compare)")
        before = w.copy()
        step_ns = dict(windows.group_by("trace_id").agg((pl.col("end_ns") - pl.col("start_ns")).mean()).iter_rows())
        factors = balance_factors(events, graph, step_ns, cut)
        names: set = set()
        changed = np.zeros(graph.height, dtype=bool)
        if factors.height:
            kind = (pl.when(_itself()).then(pl.col("segment").replace_strict(GPU_SEGMENTS, default=None))
                    .when(_own_time()).then(pl.col("category")))
            keyed = graph.select(pl.col("trace_id").alias("t"), kind.alias("kind"), "name").with_row_index("i")
            hits = keyed.join(factors, left_on=["t", "kind", "name"], right_on=["trace_id", "kind", "name"],
                              how="inner")
            idx = hits["i"].to_numpy()
            w[idx] = w[idx] * hits["factor"].to_numpy()
            changed[idx] = True
            names = set(hits["name"].to_list())
        applied.append(_applied("--balance", int(factors.select("kind", "name").unique().height), graph, windows,
                                (before - w) * inside, sorted(names), changed & inside))
    return w, applied


def _per_event(graph: pl.DataFrame, taken: np.ndarray) -> pl.DataFrame:
    """The time ``taken`` out of the edges (graph row order) per trace and event, each event's once: its host
    pieces (``thread`` edges) add up, but a GPU activity's ``stream`` edge and a collective's ``leave`` edge are
    two ways to one end, the same work (summed, halving the communication of a Megatron rank took 69.2 ms out
    of 45.7 ms a step). Columns: ``trace_id``, ``taken``."""
    rows = (graph.select("trace_id", "event_id", own=pl.col("edge") == "thread")
            .with_columns(taken=pl.Series(taken, dtype=pl.Float64)).filter(pl.col("taken") != 0))
    loose = rows.filter(pl.col("event_id").is_null()).select("trace_id", "taken")
    events = (rows.filter(pl.col("event_id").is_not_null()).group_by("trace_id", "event_id")
              .agg(pl.max_horizontal(pl.col("taken").filter(pl.col("own")).sum(),
                                     pl.col("taken").filter(~pl.col("own")).max().fill_null(0.0)).alias("taken"))
              .select("trace_id", "taken"))
    return pl.concat([events, loose.cast(events.schema)])


def _applied(text: str, calls: int, graph: pl.DataFrame, windows: pl.DataFrame, taken: np.ndarray,
             names: list | None = None, matched: np.ndarray | None = None) -> Applied:
    """An :class:`Applied`: the time ``taken`` out of each edge (graph row order, 0 outside the steps), each
    event's once (:func:`_per_event`), summed per rank and divided by that rank's steps, for the ranks (traces)
    whose edges it changed; and the events of the edges ``matched`` inside the steps (graph row order), with the
    step windows of their ranks."""
    per = _per_event(graph, taken).group_by("trace_id").agg(pl.col("taken").sum())
    steps = dict(windows.group_by("trace_id").agg(pl.len()).iter_rows())
    rank_of = dict(windows.select("trace_id", "rank").unique().iter_rows())
    by_rank, total, n = {}, 0.0, 0
    for trace, ns in per.iter_rows():
        k = max(1, steps.get(trace, 0))
        by_rank[rank_of.get(trace)] = round(ns / k)
        total, n = total + ns, n + k
    touched = sorted((r for r in by_rank if r is not None))
    in_steps, in_windows = 0, 0
    if matched is not None and matched.any():
        events = graph.filter(pl.Series(matched)).select("trace_id", "event_id").unique()
        in_steps = events.height
        in_windows = sum(steps.get(t, 0) for t in events["trace_id"].unique().to_list())
    return Applied(text, calls, touched, round(total / n) if n else 0, names or [],
                   dict(sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))), in_steps, in_windows)


#: ``--balance`` takes out a name's excess on a rank only where it is at least this share of the rank's mean step:
#: a straggler's excess, not the noise by which any two ranks differ in every name (taking that out too, the
#: minimum of two ranks' figures name by name, predicted the FSDP2 twins 16-17% faster than their balanced run).
BALANCE_MIN_EXCESS = 0.01


def balance_factors(events: pl.DataFrame, graph: pl.DataFrame, step_ns: dict | None = None,
                    cut: frozenset = frozenset()) -> pl.DataFrame:
    """Per (trace, kind, name): the factor that takes out a rank's time per step above the (lower) median over the
    ranks (:data:`traceparse.measures.step_time_by_name`; 0 on a rank that never runs it), where it exceeds it by
    at least :data:`BALANCE_MIN_EXCESS` of its mean step (``step_ns``: trace -> ns; without it, by any amount):
    median / own, or less of the excess where taking all of it would leave the rank less work than the median
    rank has (:func:`_up_to_the_median_rank`). Neither collectives, step annotations, synchronisations nor
    synchronous copies (:data:`SYNC_CALLS`): their time is waiting (a straggler's peers wait in
    ``hipMemcpyWithStream`` for the GPU that waits for it). The traces ``cut`` (ranks cut short: their work after the
    cut is missing, not undone) are neither evened out nor counted in the medians."""
    table = step_time_by_name(events)
    if table.height == 0:
        return pl.DataFrame(schema={"trace_id": pl.String, "kind": pl.String, "name": pl.String,
                                    "factor": pl.Float64})
    waiting = (pl.col("name").str.contains(STEP_NAME) | expr.collective(pl.col("name").fill_null("")).is_not_null()
               | ((pl.col("kind") == "api") & ((expr.api_class(pl.col("name")) == "synchronize")
                                               | pl.col("name").fill_null("").str.contains(SYNC_CALLS))))
    table = table.with_columns(pl.col("trace_id").cast(pl.String), pl.col("kind").cast(pl.String)).filter(~waiting)
    traces = [t for t in graph.filter(pl.col("dst_trace") != INSTANCE_TRACE)["dst_trace"].unique().to_list()
              if t not in cut]
    cells = over_median(table, traces)
    over = [(tr, kind, name, own, median) for tr, kind, name, own, median in cells
            if own > median and own - median >= BALANCE_MIN_EXCESS * (step_ns or {}).get(tr, 0)]
    share = _up_to_the_median_rank(cells, over, traces)
    rows = [(tr, kind, name, 1.0 - (1.0 - median / own) * share[(tr, _domain(kind))])
            for tr, kind, name, own, median in over if share[(tr, _domain(kind))] > 0]
    return pl.DataFrame(rows, schema={"trace_id": pl.String, "kind": pl.String, "name": pl.String,
                                      "factor": pl.Float64}, orient="row")


def _domain(kind: str) -> str:
    """Where a name's time is spent: on the GPU (kernels, copies, memsets: their durations) or on the host (self
    times)."""
    return "gpu" if kind in expr.GPU_KINDS else "host"


def _up_to_the_median_rank(cells: list[tuple], over: list[tuple], traces: list) -> dict[tuple, float]:
    """Per (trace, domain): the share of its names' excess over their medians that ``--balance`` takes out, so that no
    rank's work per step (host, GPU) falls below the median rank's: min(1, (own total - median rank's total) / its
    excess), or the whole of a name that is most of the excess (:data:`DOMINANT_EXCESS`). Why: each name's median
    comes from whichever rank is in the middle for that name, and a rank's stalls fall in different operators from
    step to step and rank to rank (on ASTRA-sim's Megatron run 10-75 ms in aten::reshape on one rank, aten::empty on
    another): taken out name by name, every rank came out 23-43% faster than measured, the median rank and the
    fastest (588.8 -> 334.1 ms) too."""
    import statistics

    totals: dict[tuple, float] = {}
    for tr, kind, _, own, _ in cells:
        key = (tr, _domain(kind))
        totals[key] = totals.get(key, 0.0) + own
    middle = {d: statistics.median_low([totals.get((tr, d), 0.0) for tr in traces]) for d in ("host", "gpu")}
    excess: dict[tuple, float] = {}
    largest: dict[tuple, float] = {}
    for tr, kind, _, own, median in over:
        key = (tr, _domain(kind))
        excess[key] = excess.get(key, 0.0) + own - median
        largest[key] = max(largest.get(key, 0.0), own - median)
    out = {}
    for key, ns in excess.items():
        allowed = max(0.0, totals.get(key, 0.0) - middle[key[1]])
        if largest[key] >= DOMINANT_EXCESS * ns:  # one thing the rank does more: a straggler's, taken out whole
            allowed = max(allowed, largest[key])
        out[key] = min(1.0, allowed / ns) if ns > 0 else 0.0
    return out


#: A name whose excess is at least this share of a rank's excess (over all its names) is the rank's own extra
#: work, taken out whole by ``--balance`` even where the rank's total is less above the median rank's (the
#: others wait inside their own operators for it: FSDP2's slow-loader rank sleeps 30 ms a step in DataLoader, its
#: total is 25.6 ms above the median rank's, and the balanced twin measured the whole 30 ms less).
DOMINANT_EXCESS = 0.5


# -- the replayed graph's critical path ---------------------------------------------------------------------------
def replayed_graph(graph: pl.DataFrame, replayer: Replayer, at: np.ndarray, weights: np.ndarray,
                   frozen: np.ndarray | None = None) -> pl.DataFrame:
    """``graph`` with every node at its replayed time (``src_ns``, ``dst_ns``; a ``frozen`` edge's source at its
    measured time, as the replay had it), ``weight_ns`` the edited weights and ``critical`` chosen again: each
    node's in-edge that arrived last (source time + weight), ties to the later source, then an explicit edge over
    an inferred one, then program order (:data:`EDGE_KINDS`)."""
    src_at, dst_at = replayer.sources(at, frozen), at[replayer.dst]
    w = np.rint(weights).astype(np.int64)
    order = pl.col("edge").replace_strict({k: i for i, k in enumerate(EDGE_KINDS)}, return_dtype=pl.Int32)
    g = graph.with_columns(src_ns=pl.Series(src_at), dst_ns=pl.Series(dst_at), weight_ns=pl.Series(w),
                           _arr=pl.Series(src_at + w)).with_row_index("_i")
    g = g.with_columns(gap_ns=pl.col("dst_ns") - pl.col("src_ns"), _order=order)
    best = (g.sort(["_arr", "src_ns", "inferred", "_order"], descending=[True, True, False, False])
            .group_by("dst_trace", "dst_node", maintain_order=True).agg(pl.col("_i").first()))
    chosen = np.zeros(g.height, dtype=bool)
    chosen[best["_i"].to_numpy()] = True
    return g.with_columns(critical=pl.Series(chosen)).drop("_i", "_arr", "_order")


def _gpu_edited(graph: pl.DataFrame, weights: np.ndarray, gpu_ns: int) -> str:
    """Where the edits change the GPU activities' own time: what the GPU's time per step would be, about (its
    measured time per step scaled as the activities' time is), which the host-measured steps do not show."""
    own = graph.select(_itself()).to_series().to_numpy()
    before = float(graph["weight_ns"].to_numpy()[own].sum())
    after = float(np.asarray(weights)[own].sum())
    if before <= 0 or abs(after - before) < 0.005 * before:
        return ""
    return (f" With the edits the GPU's activities take {fmt_pct(100 * after / before)} of their time: about "
            f"{fmt_ns(gpu_ns * after / before)} of GPU work a step.")


def _across_steps(replayer: Replayer, windows: pl.DataFrame) -> np.ndarray:
    """Per edge of the replayer's graph, whether it leads into a step from outside it: its source is in another
    step (by step number: the ranks' same step stays one) or in none. A node is in step N of its trace when its
    measured time is after the step's start and at most its end, so the node at a step's start
    (:meth:`Replayer.window_nodes`) is the step before's, and the step is replayed from it as measured. A
    collective instance's node (:data:`INSTANCE_TRACE`: where its members meet) is in every step: the wait of
    one rank for another goes through it."""
    step = np.full(len(replayer), -1, dtype=np.int64)
    traces = np.array([k[0] if k[0] is not None else "" for k in replayer.keys], dtype=object)
    meeting = traces == INSTANCE_TRACE
    for (trace,), rows in windows.select("trace_id", "step", "start_ns", "end_ns").sort("start_ns").group_by(
            "trace_id", maintain_order=True):
        mine = np.flatnonzero(traces == (trace if trace is not None else ""))
        times = replayer.measured[mine]
        starts, ends, numbers = (rows[c].to_numpy() for c in ("start_ns", "end_ns", "step"))
        at = np.searchsorted(starts, times, side="left") - 1  # the last window starting before the node
        inside = (at >= 0) & (times <= ends[np.clip(at, 0, None)])
        step[mine[inside]] = numbers[at[inside]]
    return (step[replayer.src] != step[replayer.dst]) & ~meeting[replayer.src] & ~meeting[replayer.dst]


def top_segments(segments: pl.DataFrame, paths: int, top: int, names: dict | None = None) -> list[dict]:
    """The ``top`` largest parts of the paths' ``segments`` (rank, lane, kind, name), per path (step of a rank),
    with their share of the paths' total length; ``names``: the trace's thread names, for the lanes
    (:func:`traceparse.expr.lane_label`)."""
    if segments.height == 0:
        return []
    total = int(segments["duration_ns"].sum())
    rows = (segments.with_columns(lane=expr.lane_label(names), name=step_free(pl.col("name")))
            .group_by("segment_rank", "lane", "segment", "name")
            .agg(ns=pl.col("duration_ns").sum()).filter(pl.col("ns") > 0)
            .sort(["ns", "segment_rank", "lane", "name"], descending=[True, False, False, False], nulls_last=True)
            .head(top))
    return [{"rank": r["segment_rank"], "lane": r["lane"], "kind": r["segment"], "name": r["name"],
             "per_step_ns": round(r["ns"] / max(paths, 1)), "share_pct": expr.pct(r["ns"], total)}
            for r in rows.iter_rows(named=True)]


# -- what the trace cannot replay ---------------------------------------------------------------------------------
def missing_edges(events: pl.DataFrame) -> list[str]:
    """The edges the trace cannot give, in words (docs/critical_path.md: which formats carry which edges)."""
    row = edge_coverage(events)
    out = []
    if not row["host"]:
        out.append("no host events: only the GPU streams' order can be replayed")
    elif not row["threads"]:
        out.append("host events without a thread id: the host's program order cannot be replayed")
    else:
        if not row["api"]:
            out.append("no runtime calls (launches, synchronisations): no wait of the host for the GPU, nor for "
                       "another thread but at a collective's end, can be replayed")
        if not row["ops"]:
            out.append("no operators (only annotations and collective calls): the host's own work is untraced "
                       "time, replayed as measured")
    return out


def _untraced_notes(paths: pl.DataFrame, segments: pl.DataFrame, min_pct: float = 10.0) -> list[str]:
    """One line per rank whose untraced time on the predicted paths is at least ``min_pct`` of the path's length
    (the whole the path table's shares are of)."""
    if segments.height == 0:
        return []
    n = paths.height
    untraced = segments.filter(pl.col("segment") == "untraced").with_columns(name=step_free(pl.col("name")))
    # "mostly": the part with the most time (not the most segments), ties to the name
    most = (untraced.group_by("segment_rank", "name").agg(part=pl.col("duration_ns").sum())
            .sort(["part", "name"], descending=[True, False]).group_by("segment_rank", maintain_order=True)
            .agg(pl.col("name").first()))
    per_rank = (untraced.group_by("segment_rank").agg(ns=pl.col("duration_ns").sum())
                .join(most, on="segment_rank", how="left", nulls_equal=True)
                .sort(["ns", "segment_rank"], descending=[True, False], nulls_last=True)
                .select("segment_rank", "ns", "name"))
    # the predicted path's length, the whole of the table of its largest parts (top_segments): one share per figure
    length = float(segments["duration_ns"].sum()) / max(n, 1)
    out = []
    for rank, ns, name in per_rank.iter_rows():
        per = ns / max(n, 1)
        if length > 0 and 100 * per / length >= min_pct:
            who = f" on rank {rank}" if rank is not None else ""
            out.append(f"{fmt_ns(per)} per step of the predicted path ({fmt_pct(100 * per / length)}) is time"
                       f"{who} that the trace does not show, mostly {name}: replayed as measured (what the trace "
                       "does not record cannot be shortened or removed)")
    return out


# -- the whole what-if -----------------------------------------------------------------------------------------------
def _replayed(graph: pl.DataFrame, events: pl.DataFrame, windows: pl.DataFrame, drops=(), scales=(),
              balance: bool = False, cut: frozenset = frozenset()) -> tuple:
    """The edits applied to ``graph`` and every step of ``windows`` replayed with them: (weights, what each edit
    matched, the :class:`Replayer`, the edges frozen at their measured times, every node's replayed time, each
    window's first and last node and whether it has both, and the steps: ``windows`` with ``measured_ns``,
    ``predicted_ns`` and ``gain_ns``)."""
    weights, applied = apply_edits(graph, events, windows, drops, scales, balance, cut)
    replayer = Replayer(graph)
    # each step replayed from its measured start: an edge from another step (or from before the steps) leaves at its
    # source's measured time, so that time saved in one step is never carried into the next as a later start of
    # nothing (a node no edge explains stays where it was measured: the next step would have waited for it, and
    # read as slower by what the step before gained)
    frozen = _across_steps(replayer, windows)
    at = replayer.run(weights, frozen)
    first, last = replayer.window_nodes(graph, windows)
    ok = (first >= 0) & (last >= 0) & (first != last)
    measured = (windows["end_ns"] - windows["start_ns"]).to_numpy()
    predicted = np.maximum(measured + np.where(ok, at[last] - replayer.measured[last], 0), 0)
    steps = windows.with_columns(measured_ns=pl.Series(measured, dtype=pl.Int64),
                                 predicted_ns=pl.Series(predicted, dtype=pl.Int64))
    steps = steps.with_columns(gain_ns=pl.col("measured_ns") - pl.col("predicted_ns"))
    return weights, applied, replayer, frozen, at, first, last, ok, steps


def slowest_step(steps: pl.DataFrame) -> dict | None:
    """The slowest rank's step, measured and predicted, in the mean over the steps every rank has: ranks that meet
    at collectives step together, so the job goes at this pace, and a gain on one rank alone is none (a run's
    rank 0 predicted 7.4 ms a step faster, the others unchanged: "mean step gain 2.2 ms", the job's 0.15 ms).
    None for a trace of one rank, or where no step number is every rank's."""
    ranks = steps["rank"].drop_nulls().n_unique()
    if ranks < 2:
        return None
    per_step = (steps.filter(pl.col("rank").is_not_null()).group_by("step")
                .agg(pl.col("rank").n_unique().alias("ranks"), pl.col("measured_ns").max(),
                     pl.col("predicted_ns").max())
                .filter(pl.col("ranks") == ranks))
    if per_step.height == 0:
        return None
    m, p = float(per_step["measured_ns"].mean()), float(per_step["predicted_ns"].mean())
    return {"steps": per_step.height, "measured_ns": round(m), "predicted_ns": round(p), "gain_ns": round(m - p),
            "gain_pct": expr.pct(m - p, m)}


def step_gains(events: pl.DataFrame, graph: pl.DataFrame, drops=(), scales=()) -> pl.DataFrame | None:
    """Per step of every rank, what the edits gain: the steps of ``graph`` (a chosen dependency graph of
    ``events``) replayed as :func:`what_if` replays them (``trace_id``, ``step``, ``rank``, ``measured_ns``,
    ``predicted_ns``, ``gain_ns``), for a rule that wants what a change would gain, not only what lies on the
    path; None where nothing can be replayed (no steps, an edit matching nothing)."""
    windows = step_windows(events, graph)
    if windows.height == 0:
        return None
    try:
        return _replayed(graph, events, windows, drops, scales)[-1]
    except InputError:
        return None



def what_if(events: pl.DataFrame, drops=(), scales=(), balance: bool = False, align_clocks: bool = False,
            top: int = 8, graph: pl.DataFrame | None = None, names: dict | None = None,
            cut: frozenset = frozenset()) -> WhatIf:
    """Replay every step of ``events`` (a trace, or a run's ranks) with the edits and return, per step of each rank,
    ``measured_ns`` and ``predicted_ns`` (and ``gain_ns`` = measured − predicted), the predicted critical path (its
    mean length per step and ``top`` largest parts, their lanes named by ``names``: the trace's thread names), what
    each edit matched, and what cannot be replayed. ``cut``: the trace ids of a run's ranks cut short, which
    ``balance`` leaves as they are (:func:`balance_factors`).

    A trace without a timeline, without host events on a thread or without steps cannot be replayed: a one-line
    :class:`InputError` says which."""
    if graph is None:
        graph = dependency_graph(events, align_clocks=align_clocks)
    if graph.height == 0:
        raise InputError("no timeline to replay: the trace has no events placed in time")
    if not (graph["edge"] == "thread").any():
        raise InputError("no host events on a thread: whatif needs the host's program order (" +
                         "; ".join(missing_edges(events) or ["no thread edges"]) + ")")
    windows = step_windows(events, graph)
    if windows.height == 0:
        raise InputError("no steps to replay: the trace has no ProfilerStep#N, no step range and no optimizer "
                         "mark (whatif predicts step times)")
    r = _replayed(graph, events, windows, drops, scales, balance, frozenset(cut))
    weights, applied, replayer, frozen, at, first, last, ok, steps = r
    # the predicted path: the replayed graph's critical edges, from each window's replayed end to its start
    moved = replayed_graph(graph, replayer, at, weights, frozen)
    new_windows = windows.with_columns(  # a step's nodes were replayed from its start node's measured time
        start_ns=pl.Series(np.where(ok, replayer.measured[first], windows["start_ns"].to_numpy())),
        end_ns=pl.Series(np.where(ok, at[last], windows["end_ns"].to_numpy())))
    paths, segments = critical_paths(moved, new_windows)
    length = float(paths["length_ns"].mean()) if paths.height else 0.0
    cannot = _untraced_notes(paths, segments)
    behind = gpu_behind(events) if isinstance(events, pl.DataFrame) else None
    # only where the GPU sets the pace is there something the replay of the host's steps cannot show
    paces = behind is not None and behind.paces
    notes = [behind.sentence() + _gpu_edited(graph, weights, behind.gpu_ns)] if paces else []
    return WhatIf(steps.sort("step", "rank", nulls_last=True), length, top_segments(segments, paths.height, top, names),
                  applied, cannot, missing_edges(events), notes)
