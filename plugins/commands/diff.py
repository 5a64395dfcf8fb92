"""Command ``diff``: what changed between two traces, kernel by kernel, call by call and operator by operator.

Definition: in each trace, the rows of kind kernel, memcpy, memset and api are
grouped by (kind, name): calls = Σ calls (a trace event counts 1, an
aggregated row its number of calls), time = Σ duration_ns; the host operators
and annotations (kinds op and marker, but the steps' own ``ProfilerStep#N``)
by their self time, as hotspots counts it (:func:`host_self_time`), so that
nested operators are not counted twice; their category is ``host op`` or
``annotation``, or ``communication`` for a collective's call or annotation
(``gloo:all_reduce``: mostly waiting for the other ranks). When a trace has
both timed events and aggregated rows of one kind (e.g. an nvprof log with a
GPU trace and a summary), only the timed ones count, as in the rules
(the ``time_by_name`` measure), so no call is counted twice.
Names are matched in two passes. First exactly, except that API names lose
the CUPTI interface version some tools append (``cudaLaunchKernel_v7000`` in
an nsys SQLite export is ``cudaLaunchKernel`` in its stats reports and in
torch.profiler traces). Then the names left over on both sides are matched by
their spelling key (:func:`traceparse.expr.spelling_key`): copies and memsets
by direction (nsys ``[CUDA memcpy Host-to-Device]`` = torch ``Memcpy HtoD
(Pinned -> Device)``), kernels without parameter lists and with one spelling
of template arguments (``(bool)1`` = ``true``, ``(int)10`` = ``10``,
``<unnamed>`` = ``(anonymous namespace)``, spacing); names of one side that
share a key are summed into one row, status *renamed*. ``--exact`` skips the
second pass. Change = time in B − time in A (and the same for calls); a name
only in B is *new*, only in A *vanished*: the names diff could not match.
Rows are sorted by |change| (largest first). Kernels are also summarised by
the kernel categories of kernel-share (traceparse.expr.kernel_categories(): gemm, convolution, elementwise, ...; API calls
form the category ``api``, copies ``memcpy`` / ``memset``). The summary line
gives the total GPU time (kernels + memcpy + memset) and API time of A and B
and their change. Works for every format, since it needs only names,
durations and calls.

Mangled kernel names (``_Z...``, as torch.profiler writes some CUTLASS
kernels) are demangled (``itanium_demangler``) before matching, so they meet
their demangled twins in an nsys capture; the row keeps the spellings as
written in ``names_a`` / ``names_b`` and is *renamed* when they differ.

Per step. When both traces mark iterations (the steps the summary uses,
:func:`traceparse.summary.step_windows`: ``ProfilerStep#N``, else an NVTX
range named like ``train_step``), every figure (calls and time, each row
and total) is per step: the trace's work in its steps (:func:`step_work`:
API calls that start in a step, GPU work launched in one) divided by its
number of steps (time rounded to the ns), so a torch trace of 2 steps and an
nsys capture of 1 compare like for like, and a whole-process capture's
start-up is not divided by its one step (the work left out is said). Otherwise (``--per trace``, or a side without
steps) the figures are whole-trace totals, and a line says so. A different
device, world size or step count is one line at the top (``differences``
in ``--json``).
"""

from __future__ import annotations

import argparse
import polars as pl
from rich.text import Text

from traceparse import expr, measures
from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.figures import ends_early
from traceparse.meta import incomplete_notes, incomplete_ranks
from traceparse.measures.comm import BLOCKING_WAITS
from traceparse.plugins import hookimpl
from traceparse.names import demangle, fitted_names
from traceparse.report import fitted_table, fmt_ns, trace_label
from traceparse.run import trace_ranks, world_size_of
from traceparse.summary import step_windows
from traceparse.text import literal, visible
from traceparse.trace import Trace
from traceparse.verdict import Column

#: Host work compared by self time: operators and annotations (record_function ranges, NVTX ranges).
HOST_KINDS = ("op", "marker")
KINDS = ("kernel", "memcpy", "memset", "api", *HOST_KINDS)
GPU_KINDS = ("kernel", "memcpy", "memset")
#: The CUPTI interface version some tools append to API names (nsys: cudaLaunchKernel_v7000).
API_VERSION_SUFFIX = r"_v\d+$"
#: ``status`` of a row: in both traces under one name; in both under different spellings; only in B; only in A.
STATUSES = ("both", "renamed", "new", "vanished")
ROW_COLUMNS = ("kind", "category", "name", "status", "calls_a", "calls_b", "delta_calls", "time_a_ns", "time_b_ns",
               "delta_ns", "delta_pct", "names_a", "names_b")


def totals_by_name(trace: Trace, steps_only: bool = False) -> pl.DataFrame:
    """Calls and time per (trace, kind, name, raw name) of one trace (a run: per rank's trace), timed events
    preferred over aggregated rows.

    ``name`` is what is matched: API names without the CUPTI version suffix,
    mangled kernel names demangled (:func:`demangle`); ``raw`` the name as
    the trace wrote it (API names without the version suffix: that
    difference is not a renaming). ``steps_only``: only the work of the
    trace's steps (:func:`step_work`).
    """
    events = step_work(trace.events) if steps_only else trace.events
    rows = pl.concat([measures.time_by_name(events, kinds=(*GPU_KINDS, "api"), prefer_timed=True)
                      .select("trace_id", "kind", "name", "calls", "time_ns"), host_self_time(events)],
                     how="vertical_relaxed")
    mangled = rows.filter((pl.col("kind") == "kernel") & pl.col("name").str.starts_with("_Z"))["name"].to_list()
    readable = {n: demangle(n) for n in mangled}
    api = pl.col("kind") == "api"
    raw = pl.when(api).then(pl.col("name").str.replace(API_VERSION_SUFFIX, "")).otherwise(pl.col("name"))
    name = pl.when(api).then(raw).otherwise(pl.col("name").replace(readable)) if readable else raw
    return rows.select("trace_id", "kind", name=name, raw=raw, calls="calls",
                       time_ns=pl.col("time_ns").fill_null(0))


def host_self_time(events) -> pl.DataFrame:
    """Calls and self time per (trace, kind, name) of the host operators and annotations (:data:`HOST_KINDS`): the
    time each ran that no operator, runtime call or annotation inside it accounts for, as hotspots counts it
    (measure ``routine_time``), so that nested operators are not counted twice and the host rows add up to the
    traced host time. Step annotations (``ProfilerStep#N``, an NVTX ``train_step``: :func:`is_step_annotation`)
    are left out: they are the steps, not work in them. Without these rows a run whose step grew 36 ms in its
    data loading (an annotation) showed only rows that shrank."""
    from traceparse.measures.routines import routine_choices, routine_time
    from traceparse.measures.steps import is_step_annotation

    kinds = (*HOST_KINDS, "api")
    chosen = routine_choices(events, kinds)
    rows = routine_time(events, kinds=kinds, drop_nested=chosen["drop_nested"],
                        drop_aggregated=tuple(chosen["drop_aggregated"]))
    steps = (events.filter(expr.kind_is("marker") & is_step_annotation(events))
             .select(pl.col("name").cast(pl.String)).unique()["name"].to_list())
    step = (pl.col("kind") == "marker") & pl.col("name").is_in(steps)
    return (rows.filter(pl.col("kind").is_in(list(HOST_KINDS)) & ~step)
            .group_by("trace_id", "kind", "name").agg(pl.col("calls").sum(), pl.col("time_ns").sum())
            .filter(pl.col("time_ns") > 0)  # instants (a JAX trace's ThreadpoolListener::Record): no time, no work
            .select("trace_id", "kind", "name", pl.col("calls").cast(pl.Int64), pl.col("time_ns").cast(pl.Int64)))


def step_work(events: pl.DataFrame) -> pl.DataFrame:
    """The rows of :data:`KINDS` that belong to the trace's steps (:func:`traceparse.measures.steps.step_series`,
    per trace: a run's ranks each with their own): an API call that starts inside a step, GPU work whose
    launching API call (same ``correlation_id``) starts inside one, or, without such a call, that itself starts
    inside one. What a whole-process capture does outside its steps (start-up, library loading, the copies of
    the data set) is no step's work: divided by one ``train_step`` it read as 300 ms of API time a step. Rows
    without a start (aggregated summaries) belong to no step."""
    from traceparse.intervals import merge
    from traceparse.measures.steps import step_series

    steps = step_series(events).select(pl.col("trace_id").cast(pl.String).fill_null(""), start="start_ns",
                                       end="end_ns")
    # overlapping steps merged, so each row meets one window
    windows = merge(steps, by=["trace_id"]).select("trace_id", w_start="start", w_end="end").sort("w_start")
    rows = events.filter(pl.col("kind").is_in(list(KINDS)) & pl.col("start_ns").is_not_null()).with_columns(
        __k=pl.col("trace_id").cast(pl.String).fill_null(""))
    launches = (rows.filter((pl.col("kind") == "api") & pl.col("correlation_id").is_not_null())
                .group_by("__k", "correlation_id").agg(__launch=pl.col("start_ns").min()))
    gpu = pl.col("kind").is_in(list(GPU_KINDS)) & pl.col("__launch").is_not_null()
    placed = (rows.join(launches, on=["__k", "correlation_id"], how="left", nulls_equal=False)
              .with_columns(__at=pl.when(gpu).then(pl.col("__launch")).otherwise(pl.col("start_ns")))
              .sort("__at"))
    inside = placed.join_asof(windows.rename({"trace_id": "__k"}), left_on="__at", right_on="w_start", by="__k",
                              strategy="backward", check_sortedness=False)
    return inside.filter(pl.col("w_end").is_not_null() & (pl.col("__at") < pl.col("w_end"))).select(events.columns)


def _side(frame: pl.DataFrame) -> dict[tuple[str, str], tuple[int, int, frozenset]]:
    """(kind, name) -> (calls, time, the spellings as written), spellings that read the same summed."""
    out: dict[tuple[str, str], tuple[int, int, frozenset]] = {}
    for r in frame.iter_rows(named=True):
        calls, time, raws = out.get((r["kind"], r["name"]), (0, 0, frozenset()))
        out[(r["kind"], r["name"])] = (calls + int(r["calls"] or 0), time + int(r["time_ns"] or 0),
                                       raws | {r.get("raw") or r["name"]})
    return out


def matched_rows(ta: pl.DataFrame, tb: pl.DataFrame, exact: bool = False) -> list[dict]:
    """The names of A and B paired: exactly first, then (unless ``exact``) the leftovers by spelling key.

    One dict per row: kind, name (A's spelling; a copy's canonical name when several spellings were summed),
    status (:data:`STATUSES`), names_a / names_b (the spellings summed on each side), calls and time per side.
    """
    a, b = _side(ta), _side(tb)
    rows = []
    for key in a.keys() & b.keys():
        status = "both" if a[key][2] == b[key][2] else "renamed"  # e.g. a mangled name and its demangled twin
        rows.append(_row(key[0], key[1], status, {key: a[key]}, {key: b[key]}))
    left_a = {k: v for k, v in a.items() if k not in b}
    left_b = {k: v for k, v in b.items() if k not in a}
    if not exact:
        groups: dict[tuple[str, str], tuple[dict, dict]] = {}
        for side, left in ((0, left_a), (1, left_b)):
            for (kind, name), value in left.items():
                groups.setdefault((kind, expr.spelling_key(kind, name)), ({}, {}))[side][(kind, name)] = value
        for (kind, spelling), (in_a, in_b) in groups.items():
            if in_a and in_b:
                several = len(in_a) > 1 or kind in ("memcpy", "memset")
                name = spelling if several else next(iter(in_a))[1]
                rows.append(_row(kind, name, "renamed", in_a, in_b))
                for k in in_a:
                    del left_a[k]
                for k in in_b:
                    del left_b[k]
    rows += [_row(k[0], k[1], "vanished", {k: v}, {}) for k, v in left_a.items()]
    rows += [_row(k[0], k[1], "new", {}, {k: v}) for k, v in left_b.items()]
    return rows


def _row(kind: str, name: str, status: str, in_a: dict, in_b: dict) -> dict:
    return {"kind": kind, "name": name, "status": status,
            "calls_a": sum(v[0] for v in in_a.values()), "time_a_ns": sum(v[1] for v in in_a.values()),
            "calls_b": sum(v[0] for v in in_b.values()), "time_b_ns": sum(v[1] for v in in_b.values()),
            "names_a": sorted({raw for v in in_a.values() for raw in v[2]}),
            "names_b": sorted({raw for v in in_b.values() for raw in v[2]})}


def diff_tables(a: Trace | pl.DataFrame, b: Trace | pl.DataFrame, exact: bool = False, per_a: int = 1,
                per_b: int = 1, leave_out: tuple[str, ...] = ()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-name rows, per-category rows) of the change from ``a`` to ``b``.

    ``a`` / ``b``: the traces, or their :func:`totals_by_name` (of their steps' work, for per-step figures).
    ``per_a`` / ``per_b``: what each side's figures are divided by (its number of steps, for per-step
    figures; 1 for whole traces): calls become a mean per step (4 decimals), time integer ns, rounded half
    to even. ``leave_out``: kinds of rows to leave out (:func:`one_sided`).
    """
    schema = {"kind": pl.String, "name": pl.String, "status": pl.String, "calls_a": pl.Int64,
              "time_a_ns": pl.Int64, "calls_b": pl.Int64, "time_b_ns": pl.Int64, "names_a": pl.List(pl.String),
              "names_b": pl.List(pl.String)}
    ta, tb = (t if isinstance(t, pl.DataFrame) else totals_by_name(t) for t in (a, b))
    rows = pl.DataFrame(matched_rows(ta, tb, exact), schema=schema, orient="row")
    if leave_out:  # kinds one side did not record: not "vanished" or "new", unknown
        rows = rows.filter(~pl.col("kind").is_in(list(leave_out)))
    if per_a != 1 or per_b != 1:
        rows = rows.with_columns(
            calls_a=(pl.col("calls_a") / per_a).round(4), calls_b=(pl.col("calls_b") / per_b).round(4),
            time_a_ns=pl.col("time_a_ns").map_elements(lambda t: _per(t, per_a), return_dtype=pl.Int64),
            time_b_ns=pl.col("time_b_ns").map_elements(lambda t: _per(t, per_b), return_dtype=pl.Int64))
    rows = rows.with_columns(
        category=pl.when(pl.col("kind") == "kernel").then(expr.kernel_category(pl.col("name")))
        # a collective's host call or annotation (gloo:all_reduce, c10d::allreduce_) or its wait (a functional
        # collective's wait_tensor) is communication: mostly waiting for the other ranks, no operator's own work
        .when(pl.col("kind").is_in(list(HOST_KINDS)) & (expr.collective(pl.col("name")).is_not_null()
                                                        | pl.col("name").is_in(BLOCKING_WAITS)))
        .then(pl.lit("communication"))
        .otherwise(pl.col("kind").replace(CATEGORY_OF_KIND)),
        delta_calls=pl.col("calls_b") - pl.col("calls_a"),
        delta_ns=pl.col("time_b_ns") - pl.col("time_a_ns"),
    ).with_columns(
        delta_pct=pl.when(pl.col("time_a_ns") > 0).then(100.0 * pl.col("delta_ns") / pl.col("time_a_ns")),
    ).sort([pl.col("delta_ns").abs(), "kind", "name"], descending=[True, False, False]).select(ROW_COLUMNS)
    categories = (rows.group_by("category").agg(
        names=pl.len(), new=(pl.col("status") == "new").sum(), vanished=(pl.col("status") == "vanished").sum(),
        calls_a=pl.col("calls_a").sum(), calls_b=pl.col("calls_b").sum(),
        time_a_ns=pl.col("time_a_ns").sum(), time_b_ns=pl.col("time_b_ns").sum(),
    ).with_columns(delta_ns=pl.col("time_b_ns") - pl.col("time_a_ns"))
        .with_columns(delta_pct=pl.when(pl.col("time_a_ns") > 0).then(100.0 * pl.col("delta_ns") / pl.col("time_a_ns")))
        .sort([pl.col("delta_ns").abs(), "category"], descending=[True, False]))
    return rows, categories


def _per(total: int, n: int) -> int:
    """``total`` / ``n`` as an integer, rounded half to even (exact: integer arithmetic)."""
    q, r = divmod(total, n)
    return q + (1 if 2 * r > n or (2 * r == n and q % 2) else 0)


def step_count(trace: Trace) -> tuple[int, str | None]:
    """How many steps the trace marks and where they come from, as the summary finds them (0, None: none)."""
    n, source, _ = _steps(trace)
    return n, source


def _steps(trace: Trace) -> tuple[int, str | None, int | None]:
    """The trace's steps as the summary finds them: how many, their source, their mean duration in ns (over every
    rank's windows, as the summary's step time) or None."""
    steps = step_windows(trace.events)
    if steps is None or steps.height == 0:
        return 0, None, None
    return (int(steps["step"].n_unique()), str(steps["source"][0]),
            round(int(steps["duration_ns"].sum()) / steps.height))


def basis(a: Trace, b: Trace, per: str = "auto") -> dict:
    """What the figures are per: ``per`` ("step" or "trace"), each side's steps and their source, and the
    divisors; "auto" is per step when both sides have steps, else per trace."""
    (na, source_a, time_a), (nb, source_b, time_b) = _steps(a), _steps(b)
    if per == "step" and not (na and nb):
        without = " and ".join(label for label, n in (("A", na), ("B", nb)) if not n)
        raise InputError(f"--per step: {without} marks no steps (no ProfilerStep#N annotations and no NVTX range "
                         "named like train_step); use --per trace")
    chosen = "step" if per == "step" or (per == "auto" and na and nb) else "trace"
    return {"per": chosen, "steps_a": na, "steps_b": nb, "step_source_a": source_a, "step_source_b": source_b,
            "step_time_a_ns": time_a, "step_time_b_ns": time_b, "ranks_a": trace_ranks(a), "ranks_b": trace_ranks(b),
            "divisor_a": na if chosen == "step" else 1, "divisor_b": nb if chosen == "step" else 1}


def outside(whole: pl.DataFrame, inside: pl.DataFrame) -> dict:
    """What :func:`step_work` left out of a trace (its whole :func:`totals_by_name` less its steps'), in ns over
    the whole trace: ``gpu_ns`` (kernels, copies, memsets) and ``api_ns``."""
    def total(frame: pl.DataFrame, kinds) -> int:
        return int(frame.filter(pl.col("kind").is_in(list(kinds)))["time_ns"].sum() or 0)

    return {"gpu_ns": total(whole, GPU_KINDS) - total(inside, GPU_KINDS),
            "api_ns": total(whole, ("api",)) - total(inside, ("api",))}


def differences(a: Trace, b: Trace, base: dict) -> list[str]:
    """What differs between the two runs besides their work: device, world size, number of ranks diffed, step count
    (one text each)."""
    out = []
    devices = [sorted({d.name for d in t.meta.devices if d.name}) for t in (a, b)]
    if all(devices) and devices[0] != devices[1]:
        out.append(f"device: A {', '.join(devices[0])}, B {', '.join(devices[1])}")
    sizes = [world_size_of(t.meta) for t in (a, b)]
    if sizes[0] != sizes[1] and any(s is not None for s in sizes):
        out.append(f"world size: A {sizes[0] if sizes[0] is not None else 'not given'}, "
                   f"B {sizes[1] if sizes[1] is not None else 'not given'}")
    ranks = [base.get(f"ranks_{k}") or 1 for k in ("a", "b")]
    if ranks[0] != ranks[1]:  # a run's figures are summed over its ranks: one rank against four read -75%
        out.append(f"ranks: A {ranks[0]:,}, B {ranks[1]:,} (a run's figures are summed over its ranks)")
    if base["steps_a"] != base["steps_b"]:
        out.append(f"steps: A {base['steps_a'] or 'none marked'}, B {base['steps_b'] or 'none marked'}")
    for label, trace in (("A", a), ("B", b)):  # a profiler killed mid-write: its side lost work, not got faster
        if cut := incomplete_ranks(trace.meta):
            out.append(f"{label}: {ends_early(cut)}, and its figures cover what was read")
        elif incomplete_notes(trace.meta):
            out.append(f"{label} ends early (cut short): its figures cover what was read")
    return out


#: How a kind of row is named in the differences line.
WORDS = {"api": "API calls", "kernel": "kernels", "memcpy": "copies", "memset": "memsets", "op": "host operators",
         "marker": "annotations"}


def one_sided(kinds_a: set[str], kinds_b: set[str]) -> dict[str, str]:
    """The kinds diff compares that only one trace recorded ({kind: "A" or "B"}), from each trace's kinds of
    rows: two reports of one capture, one with the API calls and one without, would call every call
    "vanished, −100%"."""
    a, b = kinds_a & set(KINDS), kinds_b & set(KINDS)
    return {k: ("A" if k in a else "B") for k in sorted(a ^ b) if a and b}


def host_left_out(unrecorded: dict[str, str], both: set[str]) -> list[str]:
    """Where one side records host operators and the other not (a torch trace against an nsys capture), the
    annotations both record are left out too (added to ``unrecorded``), and the texts saying why: an
    annotation's self time is what no operator inside it accounts for, so a capture's NVTX ``backward`` holds
    the 8.5 ms that torch's ``backward`` gives its operators, and read as +2514%."""
    ops = [k for k in HOST_KINDS if k in unrecorded]
    if not ops:
        return []
    out = []
    for kind in HOST_KINDS:
        if kind not in unrecorded and kind in both:
            unrecorded[kind] = unrecorded[ops[0]]
            out.append(f"{WORDS[kind]} left out: their self time counts the {WORDS[ops[0]]} inside them, which "
                       f"{unrecorded[ops[0]]} alone records")
    return out


def basis_line(base: dict) -> str:
    """One line saying what the figures are per."""
    def side(label: str, key: str) -> str:
        n, source = base[f"steps_{key}"], base[f"step_source_{key}"]
        return f"{label} {n:,} step{'s' if n != 1 else ''} ({source})" if n else f"{label} no steps"

    sides = f"{side('A', 'a')}, {side('B', 'b')}"
    ranks = [base.get(f"ranks_{k}") or 1 for k in ("a", "b")]
    summed = (f"; a run's figures are summed over its ranks (A {ranks[0]}, B {ranks[1]})" if max(ranks) > 1
              else "")
    if base["per"] == "step":
        left = []
        for label, key in (("A", "a"), ("B", "b")):
            out = base.get(f"outside_steps_{key}") or {}
            parts = [f"{fmt_ns(out[k])} of {what} time" for k, what in (("api_ns", "API"), ("gpu_ns", "GPU"))
                     if out.get(k)]
            if parts:
                left.append(f"{label} {' and '.join(parts)}")
        outside_line = f"; outside the steps, left out: {', '.join(left)}" if left else ""
        return (f"figures per step: {sides}; each trace's work in its steps divided by its step count{summed}"
                f"{outside_line}")
    return f"figures are whole-trace totals, not per step: {sides}{summed}"


def step_time_line(base: dict) -> str | None:
    """``step time: A 50.5 ms -> B 137.1 ms (+86.6 ms, +171.5%)``: what a user asks first of two runs; None
    unless both mark steps."""
    a, b = base.get("step_time_a_ns"), base.get("step_time_b_ns")
    if a is None or b is None:
        return None
    return (f"step time: A {fmt_ns(a)} -> B {fmt_ns(b)} ({_signed_ns(b - a)}, "
            f"{_pct(round(100.0 * (b - a) / a, 4) if a else None)})")


#: The categories of host time (self time of operators, annotations and collective calls on host threads).
HOST_CATEGORIES = ("communication", "annotation", "host op")


def threads_line(base: dict, categories: pl.DataFrame) -> str | None:
    """Where a category of host time per step is more than all the ranks' steps last, a line saying why: host
    time is summed over each rank's threads, and a call on two threads at once counts twice (gloo runs its
    collectives on threads of its own, several in flight: "communication 733.6 ms" a step of four ranks whose
    steps last 137.1 ms). None where no category is so, or without per-step figures."""
    if base.get("per") != "step":
        return None
    over = []
    for key, label in (("a", "A"), ("b", "B")):
        step, ranks = base.get(f"step_time_{key}_ns"), base.get(f"ranks_{key}") or 1
        if not step:
            continue
        whole = step * ranks
        for name, ns in categories.filter(pl.col("category").is_in(list(HOST_CATEGORIES))).select(
                "category", f"time_{key}_ns").iter_rows():
            if ns is not None and ns > whole:
                steps = f"its {ranks:,} ranks' steps" if ranks > 1 else "its step"
                over.append(f"{label}'s {name} {fmt_ns(ns)} a step, more than {steps} ({fmt_ns(whole)})")
    if not over:
        return None
    return ("; ".join(over) + ": host time is summed over each rank's threads, and a call on two threads at once "
            "counts twice (stragglers and critical-path count it once)")


def unexplained_step_line(base: dict, totals: dict, grown: dict | None = None) -> str | None:
    """Where the step time changed by :data:`STEP_CHANGE_PCT` or more, a line saying where it went, unless the
    work diff compares (per rank) moved by half of that change or more; None otherwise.

    Where the collectives' time (``gpu_communication``, ``host_communication``: NCCL kernels spinning, a
    ``gloo`` worker's annotations, the c10d calls; summed over the ranks) moved by half the change or more, the
    ranks waited for a later one: the line says so, and names ``grown`` (:func:`work_grown`: the row of work
    that moved most on one rank), so an FSDP run's ReduceScatter spinning for a hook's sleep reads as waiting,
    not as GPU work that explains the step. Else, where no work moved with the step, that the change is not in
    what diff compares. A run whose step grew 35.9 ms showed only rows that got shorter, and no word that they
    do not explain it."""
    a, b = base.get("step_time_a_ns"), base.get("step_time_b_ns")
    if a is None or b is None or base["per"] != "step" or not a or abs(b - a) < STEP_CHANGE_PCT / 100 * a:
        return None
    change = b - a
    ranks = {k: base.get(f"ranks_{k}") or 1 for k in ("a", "b")}

    def per_rank(part: dict) -> float:
        return part["time_b_ns"] / ranks["b"] - part["time_a_ns"] / ranks["a"]

    def less(whole: dict, part: dict) -> dict:  # a total less its collectives' part
        if whole["delta_ns"] is None:
            return whole
        return {**whole, "time_a_ns": whole["time_a_ns"] - part["time_a_ns"],
                "time_b_ns": whole["time_b_ns"] - part["time_b_ns"]}

    moved = {label: per_rank(part) for label, part in (
        ("GPU time", less(totals["gpu"], totals["gpu_communication"])), ("API time", totals["api"]),
        ("host operators and annotations", less(totals["host"], totals["host_communication"])))
        if part["delta_ns"] is not None}  # a time a side did not record moved by no known amount
    waited = max((part["delta_ns"] for part in (totals["gpu_communication"], totals["host_communication"])
                  if part["delta_ns"] is not None), key=abs, default=None)
    if waited is not None and waited * change > 0 and abs(waited) >= 0.5 * abs(change):
        grew = "grew" if change > 0 else "shrank"
        if grown is not None and abs(grown["ns"]) >= GROWN_SHARE * abs(change):
            kind = KIND_WORD.get(grown["kind"], grown["kind"])
            on = f" on rank {grown['rank']}" if grown.get("rank") is not None else ""
            most = (f"; the work that {grew} most{' on one rank' if on else ''} is {grown['name']} ({kind}{on}, "
                    f"{_signed_ns(int(grown['ns']))} per step)")
        elif change > 0:  # a sleep, Python between operators, a loader the profiler does not annotate
            most = ("; no kernel, call, operator or annotation grew by a tenth of it on any rank: the late rank "
                    "spends it in time no traced call covers")
        else:
            most = "; no kernel, call, operator or annotation shrank by a tenth of it on any rank"
        if change > 0:
            return (f"the step time's {_signed_ns(change)} is mostly the ranks waiting in collectives (their time "
                    f"grew by more than half of it): a rank arrives later than the others{most}; analyze B "
                    "(stragglers, critical-path) says which rank and why")
        return (f"the step time's {_signed_ns(change)} is mostly less waiting in collectives (their time shrank by "
                f"more than half of it): the ranks arrive closer together{most}; analyze A (stragglers, "
                "critical-path) says which rank A waited for")
    if any(ns / change >= 0.5 for ns in moved.values()):  # one of them moved with the step, by half of it or more
        return None
    what = ", ".join(f"{label} {_signed_ns(round(ns))}" for label, ns in moved.items())
    each = " a rank" if max(ranks.values()) > 1 else ""
    return (f"the step time's {_signed_ns(change)} is not in what diff compares ({what} per step{each}): it is "
            "host time no traced call covers (Python between operators, data loading without an annotation) or "
            "waiting for another rank; analyze B (critical-path, stragglers) says which")


#: The share of the step's change from which the row of work that grew most on one rank is named as such.
GROWN_SHARE = 0.1

#: How many rows of work, by their change summed over the ranks, :func:`work_grown` looks at rank by rank.
GROWN_CANDIDATES = 20


def work_grown(rows: pl.DataFrame, sides: list[pl.DataFrame], rank_of: list[dict], base: dict) -> dict | None:
    """The row of work that moved most the way the step did on one rank (no collective's row, no synchronising
    call: their time is waiting): ``{"kind", "name", "rank" (None for a single trace), "ns"}`` (its change per
    step on that rank), or None.

    Per rank, not summed over the ranks: on a 4-rank FSDP run whose rank 2 sleeps in a backward hook, the DTensor
    dispatch (``PythonSubclass``) grew 9-12 ms a step on every rank (43.5 ms summed: the ranks waiting inside
    it), the hook's ``AddBackward0`` 30.2 ms on rank 2 alone. ``sides``: A's and B's :func:`totals_by_name` per
    trace; ``rank_of``: each side's {trace_id: rank}; ``base``: :func:`basis` (its step divisors)."""
    a, b = base.get("step_time_a_ns"), base.get("step_time_b_ns")
    if a is None or b is None or a == b:
        return None
    sync = (pl.col("kind") == "api") & (expr.api_class(pl.col("name")) == "synchronize")
    way = pl.col("delta_ns") > 0 if b > a else pl.col("delta_ns") < 0
    candidates = (rows.filter((pl.col("category") != "communication") & ~sync & way)
                  .sort(pl.col("delta_ns").abs(), descending=True).head(GROWN_CANDIDATES))
    if candidates.height == 0:
        return None
    per_side = []
    for side, ranks, divisor in zip(sides, rank_of, (base["divisor_a"], base["divisor_b"])):
        per_side.append(side.with_columns(rank=pl.col("trace_id").replace_strict(ranks, default=None,
                                                                                  return_dtype=pl.Int64))
                        .group_by("kind", "raw", "rank").agg(pl.col("time_ns").sum())
                        .with_columns(time_ns=pl.col("time_ns") / divisor))
    best = None
    for row in candidates.iter_rows(named=True):
        times = [{r: t for r, t in frame.filter((pl.col("kind") == row["kind"]) & pl.col("raw").is_in(names))
                  .group_by("rank").agg(pl.col("time_ns").sum()).iter_rows()}
                 for frame, names in zip(per_side, (row["names_a"], row["names_b"]))]
        for rank in set(times[0]) | set(times[1]):
            ns = times[1].get(rank, 0) - times[0].get(rank, 0)
            if (ns > 0 if b > a else ns < 0) and (best is None or abs(ns) > abs(best["ns"])):
                best = {"kind": row["kind"], "name": row["name"], "rank": rank, "ns": round(ns)}
    return best


def rank_map(trace: Trace) -> dict:
    """{trace_id: rank} of a run's ranks; {trace_id: None} of a single trace."""
    if "rank" not in trace.events.columns:
        return {}
    pairs = trace.events.select(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)).unique()
    return {t: (r if trace_ranks(trace) > 1 else None) for t, r in pairs.iter_rows()}


#: A kind of row in the words of a sentence.
KIND_WORD = {"op": "host operator", "marker": "annotation", "api": "API call", "memcpy": "copy"}


#: A step time that changed by less than this share of A's is no change diff asks to explain.
STEP_CHANGE_PCT = 5.0


#: The totals :func:`summary` gives, and the kinds of rows each sums.
TOTALS = {"gpu": GPU_KINDS, "kernel": ("kernel",), "api": ("api",), "host": HOST_KINDS}
#: The category of a row of host work (a kernel's is its kernel category; a copy's, memset's, API call's its kind).
CATEGORY_OF_KIND = {"op": "host op", "marker": "annotation"}


def summary(rows: pl.DataFrame, recorded: tuple[set[str], set[str]] | None = None,
            left_out: dict[str, str] | None = None) -> dict:
    """Totals of A and B: GPU time (kernel + memcpy + memset), kernel time, API time, the host operators' and
    annotations' self time (``host``), and the parts of the GPU and host times that are collectives' kernels, calls
    and annotations (``gpu_communication``, ``host_communication``: mostly waiting for the other ranks); names
    matched (by name, by spelling), new and vanished, and the names it could not match (``unmatched``: ``a`` and
    ``b``).

    ``recorded``: the kinds of rows A and B hold (each side's; None: every kind); ``left_out``: the kinds only one
    of them recorded, left out of the comparison (:func:`one_sided`). A total of kinds a side did not record, or
    that were left out, is None there, not 0 (and so is its change; ``recorded_in`` says which side recorded what
    was left out): two trimmed runs without runtime calls read "API time 0 ns -> 0 ns", a measured zero nobody
    measured."""
    def total(frame: pl.DataFrame, column: str) -> int:
        return int(frame[column].sum() or 0)

    kinds = recorded or (set(KINDS), set(KINDS))
    left_out = left_out or {}
    out = {}
    for label, of in TOTALS.items():
        frame = rows.filter(pl.col("kind").is_in(of))
        a, b = (total(frame, column) if (side & set(of)) - set(left_out) else None
                for column, side in (("time_a_ns", kinds[0]), ("time_b_ns", kinds[1])))
        both = a is not None and b is not None
        out[label] = {"time_a_ns": a, "time_b_ns": b, "delta_ns": b - a if both else None,
                      "delta_pct": round(100.0 * (b - a) / a, 4) if both and a else None}
        sides = {left_out[k] for k in of if k in left_out}
        if a is None and b is None and len(sides) == 1:
            out[label]["recorded_in"] = sides.pop()
    # the parts of the GPU and host rows that are collectives' kernels, calls and annotations (mostly waiting for
    # the other ranks)
    for label, of in (("gpu", GPU_KINDS), ("host", HOST_KINDS)):
        waiting = rows.filter(pl.col("kind").is_in(list(of)) & (pl.col("category") == "communication"))
        whole = out[label]
        a, b = (total(waiting, c) if whole[c] is not None else None for c in ("time_a_ns", "time_b_ns"))
        out[f"{label}_communication"] = {"time_a_ns": a, "time_b_ns": b,
                                         "delta_ns": b - a if a is not None and b is not None else None}
    count = {s: int((rows["status"] == s).sum()) for s in STATUSES}
    out["new"] = count["new"]
    out["vanished"] = count["vanished"]
    out["matched"] = count["both"] + count["renamed"]
    out["renamed"] = count["renamed"]
    out["unmatched"] = {side: sorted(rows.filter(pl.col("status") == status)["name"].to_list())
                        for side, status in (("a", "vanished"), ("b", "new"))}
    return out


def _signed_ns(ns: int) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "±") + fmt_ns(abs(ns))


def _pct(value) -> str:
    """A change in percent with its sign: ``+55.6%``; ``±0.0%`` for none (as ``±0 ns``), ``-<0.1%`` for one too
    small for a decimal (not ``+0.0%`` or ``-0.0%``, which read as no change with a direction)."""
    if value is None:
        return "-"
    if not value:
        return "±0.0%"
    text = f"{abs(value):.1f}"
    return ("+" if value > 0 else "-") + ("<0.1" if text == "0.0" else text) + "%"


CATEGORY_COLUMNS = [Column("category", "category", "text"), Column("time_a_ns", "A", "ns"),
                    Column("time_b_ns", "B", "ns"), Column("delta_ns", "B−A", "ns"), Column("delta_pct", "%", "pct"),
                    Column("new", "new", "count"), Column("vanished", "vanished", "count"),
                    Column("names", "names", "count")]
NAME_COLUMNS = [Column("name", "name", "name"), Column("status", "status", "text"), Column("time_a_ns", "A", "ns"),
                Column("time_b_ns", "B", "ns"), Column("delta_ns", "B−A", "ns"), Column("delta_pct", "%", "pct")]
#: Shown where the width allows (at least :data:`WIDE`): calls in A and B, and the kind.
WIDE_NAME_COLUMNS = [Column("calls_a", "calls A", "count"), Column("calls_b", "calls B", "count"),
                     Column("kind", "kind", "text")]
WIDE = 110


def render(console, a: Trace, b: Trace, rows: pl.DataFrame, categories: pl.DataFrame, totals: dict, top: int,
           base: dict | None = None, differ: list[str] = ()) -> None:
    """The terminal report: what differs besides the work (one line), A and B, what the figures are per, the
    category table, the top names by |change|, the totals, and the names diff could not match. Tables fit the
    console's width (numbers never cut; long names shortened from the middle with a numbered key; the least
    important columns dropped last)."""
    width = console.width
    if differ:
        console.print(literal("not the same setup: " + "; ".join(differ), style="yellow"))
    for label, trace in (("A", a), ("B", b)):
        line = Text(f"{label} ", style="bold")
        line.append(visible(f"{trace_label(trace.meta)}  {trace.id}  {_tags(trace)}".rstrip()))
        console.print(line)
    if base:
        step_line = step_time_line(base)
        if step_line:
            console.print(Text(step_line, style="bold"))
        console.print(Text(basis_line(base), style="dim" if base["per"] == "step" else "yellow"))
    if rows.height == 0:  # the tables and the total would be empty: no row, no total, nothing new or vanished
        console.print(literal("nothing to compare: A and B share no kernel, memcpy, memset, API, operator or "
                              "annotation row that diff compares", style="yellow"))
        return
    for part in fitted_table(CATEGORY_COLUMNS, categories.to_dicts(), width, title="by category"):
        console.print(part)
    threads = threads_line(base, categories) if base else None
    if threads:
        console.print(literal(threads, style="yellow"))
    shown = rows.head(top).to_dicts()
    for r in shown:
        r["status"] = "" if r["status"] == "both" else r["status"]
    columns = NAME_COLUMNS + (WIDE_NAME_COLUMNS if width >= WIDE else [])
    for part in fitted_table(columns, shown, width,
                             title=f"by name (top {len(shown):,} of {rows.height:,} by absolute change)"):
        console.print(part)
    if width < WIDE:
        console.print(Text(f"(calls A, calls B and kind: from {WIDE} columns, or in --json)", style="dim"))
    per = " per step" if base and base["per"] == "step" else ""
    host = (f"; host operators and annotations (self time) {total_said(totals['host'])}"
            if totals["host"]["time_a_ns"] is not None or totals["host"]["time_b_ns"] is not None else "")
    console.print(f"[bold]total{per}[/bold]: GPU time {total_said(totals['gpu'])}; API time "
                  f"{total_said(totals['api'])}{host}; {totals['matched']} names in both ({totals['renamed']} under "
                  f"another spelling), {totals['new']} new, {totals['vanished']} vanished")
    unexplained = base.get("step_time_unexplained") if base else None
    if unexplained:
        console.print(literal(unexplained, style="yellow"))
    unmatched = {status: _by_change(rows, status) for status in ("vanished", "new")}
    listed = [name for names in unmatched.values() for _, name in names[:top]]
    # shortened together, so that no two names read alike, in one list or across the two (--json has them whole)
    label = dict(zip(listed, fitted_names(listed, max(width - 10, 20))))
    for status, word in (("vanished", "only in A (vanished)"), ("new", "only in B (new)")):
        names = unmatched[status]
        if not names:
            continue
        console.print(f"[bold]not matched[/bold], {word}: {len(names)}")
        for kind, name in names[:top]:
            console.print(literal(f"  {kind:<6} {label[name]}"))
        if len(names) > top:
            console.print(Text(f"  ... and {len(names) - top:,} more (--top N shows more; --json lists all)",
                               style="dim"))


def total_said(part: dict) -> str:
    """One total of :func:`summary` in words: ``14.89 ms -> 84.08 ms (+69.19 ms, +464.7%)``; ``not recorded``
    where neither trace recorded rows of its kinds, and ``not recorded`` on the side that did not."""
    a, b = part["time_a_ns"], part["time_b_ns"]
    if a is None and b is None:
        return f"left out (recorded in {part['recorded_in']} only)" if part.get("recorded_in") else "not recorded"
    if a is None or b is None:
        return (f"{fmt_ns(a) if a is not None else 'not recorded'} -> "
                f"{fmt_ns(b) if b is not None else 'not recorded'}")
    return f"{fmt_ns(a)} -> {fmt_ns(b)} ({_signed_ns(part['delta_ns'])}, {_pct(part['delta_pct'])})"


def _by_change(rows: pl.DataFrame, status: str) -> list[tuple[str, str]]:
    return [(r["kind"], r["name"]) for r in rows.filter(pl.col("status") == status).iter_rows(named=True)]


class DiffCommand(Command):
    name = "diff"
    help = "compare two traces kernel by kernel, call by call and operator by operator"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="the first trace: store id (or prefix) or path")
        parser.add_argument("b", metavar="B", help="the second trace")
        parser.add_argument("--top", type=int, default=25, metavar="N", help="rows shown on screen (default 25)")
        parser.add_argument("--per", choices=("auto", "step", "trace"), default="auto",
                            help="figures per step (each trace's totals divided by its step count) or whole-trace "
                                 "totals; auto (default): per step when both traces mark steps")
        parser.add_argument("--exact", action="store_true",
                            help="match names only as written (no matching of copies and kernels across tools' "
                                 "spellings)")
        self.add_common_options(parser, json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        if args.top < 1:
            raise InputError(f"--top {args.top}: expected a number of rows, at least 1")
        a = session.resolve_one(args.a, args.format, "diff")
        b = session.resolve_one(args.b, args.format, "diff")
        present = {}
        for label, trace in (("A", a), ("B", b)):
            present[label] = set(trace.events["kind"].cast(pl.String).unique().to_list())
            if not present[label] & set(KINDS):
                session.warn(f"{label} ({trace.id}) has no kernel, memcpy, memset, API, operator or annotation rows "
                             f"(it has: {', '.join(sorted(present[label])) or 'no events'}); diff compares only "
                             "those")
        base = basis(a, b, args.per)
        differ = differences(a, b, base)
        unrecorded = one_sided(present["A"], present["B"])
        differ += [f"{WORDS.get(kind, kind)} recorded in {side} only: left out" for kind, side in unrecorded.items()]
        differ += host_left_out(unrecorded, present["A"] & present["B"])
        sides = [totals_by_name(t) for t in (a, b)]
        if base["per"] == "step":
            whole, sides = sides, [totals_by_name(t, steps_only=True) for t in (a, b)]
            for key, all_rows, inside in zip("ab", whole, sides):
                base[f"outside_steps_{key}"] = outside(all_rows, inside)
        rows, categories = diff_tables(*sides, exact=args.exact, per_a=base["divisor_a"], per_b=base["divisor_b"],
                                       leave_out=tuple(unrecorded))
        totals = summary(rows, (present["A"], present["B"]), unrecorded)
        grown = work_grown(rows, sides, [rank_map(t) for t in (a, b)], base) if base["per"] == "step" else None
        unexplained = unexplained_step_line(base, totals, grown)
        if args.json:
            doc = {"a": _trace_ref(a), "b": _trace_ref(b), "differences": differ,
                   "basis": {k: v for k, v in base.items() if not k.startswith("divisor")},
                   "summary": totals, "categories": categories.to_dicts(), "rows": rows.to_dicts(),
                   "step_time_unexplained": unexplained, "host_over_steps": threads_line(base, categories)}
            self.print_json(doc)
            return 0
        render(session.out, a, b, rows, categories, totals, args.top, {**base, "step_time_unexplained": unexplained},
               differ)
        return 0


def _trace_ref(trace: Trace) -> dict:
    return {"id": trace.id, "path": trace.meta.path, "format": trace.meta.format, "tags": trace.meta.tags}


def _tags(trace: Trace) -> str:
    return " ".join(f"{k}={v}" for k, v in trace.meta.tags.items())


@hookimpl
def traceparse_commands():
    return [DiffCommand()]
