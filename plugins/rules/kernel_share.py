"""Rule ``kernel-share``: which kernels own the GPU time.

Definition: kernels are grouped by name; for each, calls = sum of calls and
time_ns = sum of duration_ns (so aggregated rows, e.g. nvprof summaries,
count with their totals); share_pct = 100 × time_ns / total kernel time, and
gpu_share_pct = 100 × time_ns / total GPU activity time (kernels, memcpy and
memset: nvprof's "GPU activities" Time(%)); shown_pct is share_pct as the table shows it, rounded within its
category's share as shown (so that a category of one kernel and that kernel read the same). Items are sorted by
time. Each
kernel also gets a category (convolution, gemm, attention, normalization,
elementwise, ...: the kernel-category table in docs/rules.md), the first
whose pattern matches its name (case-insensitive), and the
finding's metrics give the time and share per category.

On a run (one trace of every rank), names and categories are merged across
the ranks: one row each, its
calls and time summed over the ranks, so every share is of the run's total
kernel time and the categories add up to 100; items and categories gain
``ranks`` (how many ranks ran it) and items ``rank_imbalance`` (its most
loaded rank's time over the mean of the ranks that ran it).

Severity: warning when the top kernel's ``share_pct`` is at or above
``dominant_kernel_pct`` (101: off).
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.run import rank_labels, trace_ranks
from traceparse.trace import Trace
from traceparse.figures import fmt_count, fmt_ns, fmt_pct, share_as_shown, shares_shown, shares_within

FIGURES = {"kernel_time_ns": "ns", "gpu_time_ns": "ns", "kernels": "count", "calls": "count"}
#: Screen labels where the key's words would read like another figure: distinct kernel names and their calls (launch-
#: stats' "kernels" are calls).
LABELS = {"kernels": "kernel names", "calls": "kernel calls"}
COLUMNS = [Column("name", "name", "name"), Column("category", "category", "text"), Column("calls", "calls", "count"),
           Column("time_ns", "time", "ns"), Column("share_pct", "share %", "pct", shown="shown_pct"),
           Column("gpu_share_pct", "GPU share %", "pct")]
#: On a run, each row's ranks: on how many it ran, and its most loaded rank's time over the mean rank's.
RUN_COLUMNS = [Column("ranks", "ranks", "count"), Column("rank_imbalance", "rank max/mean", "ratio")]
CATEGORY_TABLE = [Column("category", "category", "text"), Column("calls", "calls", "count"),
                  Column("time_ns", "time", "ns"), Column("kernels", "kernels", "count"),
                  Column("share_pct", "share %", "pct")]


class KernelShare(Rule):
    name = "kernel-share"
    description = "Kernels ranked by total GPU time, with their share, and time per kernel category"
    definition = __doc__
    thresholds = {
        "top": 15,                        # items listed
        "dominant_kernel_pct": 101.0,     # a kernel at or above this share is a warning (off by default)
    }
    kinds = ("kernel",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        run = bool(rank_labels(trace))
        # a run's ranks are separate traces: every name and category once, its time summed over the ranks
        per_trace = measures.time_by_name(events, kinds=expr.GPU_KINDS, prefer_timed=False)
        gpu = measures.merge_ranks(per_trace, ["kind", "name"], ["calls", "time_ns"], spread="time_ns")
        gpu_ns = int(gpu["time_ns"].sum() or 0)
        by_name = (gpu.filter(pl.col("kind") == "kernel")
                   .select("name", "calls", "time_ns", "ranks", "rank_imbalance")
                   .with_columns(category=expr.kernel_category(pl.col("name")))
                   .sort(["time_ns", "name"], descending=[True, False], nulls_last=True))
        total = int(by_name["time_ns"].sum() or 0)
        known = by_name["time_ns"].null_count() < by_name.height
        by_category = (measures.merge_ranks(measures.time_by_category(events), ["category"], ["calls", "time_ns"])
                       .join(by_name.group_by("category").agg(names=pl.len().cast(pl.Int64)), on="category",
                             how="left")
                       .sort(["time_ns", "category"], descending=[True, False], nulls_last=True))
        categories = {r["category"]: {"calls": r["calls"], "time_ns": r["time_ns"], "kernels": r["names"],
                                      "share_pct": expr.pct(r["time_ns"], total), **({"ranks": r["ranks"]} if run else {})}
                      for r in by_category.iter_rows(named=True)}
        # each category's share as the table shows it: rounded with the others, so that they add up to 100
        shown = dict(zip(categories, shares_shown([c["share_pct"] for c in categories.values()])))
        # every kernel's share rounded within its category's as shown: a category of one kernel and that kernel
        # read alike, and the kernels add up as the categories do
        within = shares_within([expr.pct(x, total) for x in by_name["time_ns"]], by_name["category"].to_list(),
                               shown)
        items = [
            {"name": r["name"], "category": r["category"], "calls": r["calls"], "time_ns": r["time_ns"],
             "share_pct": expr.pct(r["time_ns"], total), "shown_pct": None if seen is None else float(seen),
             "gpu_share_pct": expr.pct(r["time_ns"], gpu_ns),
             **({"ranks": r["ranks"], "rank_imbalance": r["rank_imbalance"]} if run else {})}
            for r, seen in zip(by_name.head(int(t["top"])).iter_rows(named=True), within)
        ]
        top = items[0] if items else None
        severity = grade(top["share_pct"] if top else None, warning=t["dominant_kernel_pct"])
        dominant = severity != "info"
        kernels = f"{fmt_count(by_name.height, 'distinct kernel')}, {fmt_count(int(by_name['calls'].sum()), 'call')}"
        if top and not total:
            message = (f"{kernels}, but the trace gives them no durations (e.g. a metrics-only log), so their shares "
                       "cannot be computed.")
        elif top:
            lead = by_category.row(0, named=True)
            n_ranks = trace_ranks(trace)
            # a rank that ran no kernel is not one the time is over: say which ranks it is over
            ran = per_trace.filter(pl.col("kind") == "kernel")["trace_id"].n_unique() if run else 0
            over = (f" over {n_ranks:,} ranks" if ran >= n_ranks else
                    f" over {ran:,} of {n_ranks:,} ranks (the others ran no kernel)") if run else ""
            message = (f"{kernels}, {fmt_ns(total)} of kernel time{over}; the top kernel takes "
                       f"{fmt_pct(share_as_shown(top['share_pct'], top['shown_pct']))}; "
                       f"{_category_phrase(lead['category'])} {fmt_pct(shown[lead['category']])}.")
        else:
            message = "No kernel time in this trace."
        return [Finding(self.name, "warning" if dominant else "info", "Where the kernel time goes", message,
                        "Optimise the top kernels first: their share bounds what any speed-up elsewhere can give."
                        if dominant else "",
                        metrics={"kernel_time_ns": total if known else None,
                                 "gpu_time_ns": gpu_ns if known else None, "kernels": by_name.height,
                                 "calls": int(by_name["calls"].sum() or 0), "categories": categories},
                        items=items, items_title="top kernels", columns=COLUMNS + (RUN_COLUMNS if run else []), figures=FIGURES, labels=LABELS,
                        tables={"categories": CATEGORY_TABLE + (RUN_COLUMNS[:1] if run else [])})]


@hookimpl
def traceparse_rules():
    return [KernelShare()]


def _category_phrase(category: str) -> str:
    """How the sentence names the leading category: "gemm kernels take"; "kernels of no known category take"
    for ``other`` ("other kernels take 100%" read as the rest of the kernels, beside the top kernel's 71.5%)."""
    if category == "other":
        return "kernels of no known category take"
    return f"{category} kernels take"
