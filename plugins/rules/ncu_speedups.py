"""Rule ``ncu-speedups``: kernels ranked by the speed-up Nsight Compute's own rules estimate for them.

Source: the rule results of an ncu details page (``ncu --csv`` with sections;
text output too), which the ncu reader stores as ``counter`` rows named
``rule:<Rule Name>`` in ``group`` ``rule``, ``value`` = ncu's "Estimated
Speedup" in %, ``parent_id`` = the profiled launch (a ``kernel`` row with its
``duration_ns``). ncu gives each speed-up a kind, kept per rule name in
``meta.extra["ncu_rules"][name]["speedup_types"]``: ``global`` (a share of
the whole kernel's time) or ``local`` (a share of the part of the kernel the
rule looks at, so an upper bound of the whole-kernel gain).

Definition: per launch, est_saved_ns = duration_ns × speed-up / 100 for each
rule result with a speed-up of at least ``min_speedup_pct``; the launch's
saving is the largest of its rules' (their estimates overlap: they are never
added). Per kernel name: launches, time_ns (Σ duration), est_saved_ns (Σ of
the launches' savings), best_rule (the rule that gives the largest saving
summed over the kernel's launches, each launch's largest of that rule), speedup_pct (that rule's largest
speed-up), speedup_kind (global / local), saved_pct = 100 × est_saved_ns /
the profiled kernel time of all launches. Metrics: ``kernel_time_ns`` (Σ
duration of every profiled launch), ``est_saved_ns`` (Σ over launches),
``est_saved_pct`` = 100 × est_saved_ns / kernel_time_ns, ``global_saved_ns``
and ``global_saved_pct`` (the same from ``global`` speed-ups only),
``launches_with_speedups``, ``rule_results`` (every rule result ncu gave:
OPT, INF, WRN, ..., with a speed-up or not), ``rule_types`` ({type:
results}), ``speedup_results`` (results with a speed-up of at least
``min_speedup_pct``), ``rules`` (per rule name: results with a speed-up,
its kind, Σ over launches of the rule's largest est_saved_ns there: one
rule's several results for one launch estimate the same time). Table ``ncu_says``: what ncu's rules say, one
row per rule, type and text (from ``meta.extra["ncu_rule_results"]``),
the first ``top``: launches it was said of, the largest speed-up, the
text; warnings and optimisation hints (OPT) first, keyed "1", "2", ... A trace whose rule results estimate no
speed-up (the text output of ``--section SpeedOfLight``) gets an info
finding that still lists them.

Severity: graded on ``global_saved_pct`` (a local speed-up is not a share
of the kernel's time, so it ranks kernels but does not raise the severity):
warning when it is ≥ ``warning_saved_pct``, critical from
``critical_saved_pct``. The rule applies only to a trace with ncu rule
results.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.names import short_name
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

RULE_PREFIX = "rule:"
RULE_GROUP = "rule"
FIGURES = {"kernel_time_ns": "ns", "est_saved_ns": "ns", "est_saved_pct": "pct", "global_saved_ns": "ns",
           "global_saved_pct": "pct", "launches_with_speedups": "count", "rule_results": "count",
           "speedup_results": "count"}
#: Screen labels where the key's words would read like another figure: each share apart from its time.
LABELS = {"est_saved_pct": "est saved share", "global_saved_pct": "global saved share"}
COLUMNS = [Column("name", "kernel", "name"), Column("launches", "launches", "count"), Column("time_ns", "time", "ns"),
           Column("best_rule", "ncu rule", "text"), Column("speedup_kind", "kind", "text"),
           Column("speedup_pct", "est. speed-up", "pct"), Column("est_saved_ns", "est. saving", "ns"),
           Column("saved_pct", "of kernel time", "pct")]
RULES_TABLE = [Column("rule", "ncu rule", "text"), Column("kind", "kind", "text"),
               Column("results", "results", "count"), Column("est_saved_ns", "est. saving", "ns")]
SAYS_TABLE = [Column("n", "#", "text"), Column("type", "type", "text"), Column("rule", "ncu rule", "text"),
              Column("launches", "launches", "count"), Column("speedup_pct", "est. speed-up", "pct"),
              Column("text", "ncu says", "text")]
#: Rule-result types in the order they are listed: what to change first, what is informational last.
TYPE_ORDER = {"ERR": 0, "ERROR": 0, "WRN": 1, "WARN": 1, "OPT": 2, "INF": 3}
SUGGESTION = ("Open the top kernels in Nsight Compute (or read the rule's description with "
              "`traceparse show TRACE --json`, extra.ncu_rules): the named rule says what limits the kernel "
              "(tail effect of the launch configuration, occupancy limited by registers or shared memory, ...). "
              "Global estimates are of the whole kernel; local ones only of the part the rule looks at.")


def rule_results(events: pl.DataFrame) -> pl.DataFrame:
    """ncu rule-result rows with a speed-up, joined to their launch: rule, speedup_pct, kernel name, duration."""
    rules = events.filter(expr.kind_is("counter") & (pl.col("group") == RULE_GROUP)
                          & pl.col("name").str.starts_with(RULE_PREFIX) & pl.col("value").is_not_null())
    kernels = events.filter(expr.kind_is("kernel")).select(
        "trace_id", parent_id="event_id", kernel="name", duration_ns="duration_ns")
    return (rules.select("trace_id", "parent_id", rule=pl.col("name").str.strip_prefix(RULE_PREFIX),
                         speedup_pct="value")
            .join(kernels, on=["trace_id", "parent_id"], how="inner", nulls_equal=True))


class NcuSpeedups(Rule):
    name = "ncu-speedups"
    description = "Kernels ranked by the speed-up Nsight Compute's own rules estimate (ncu details pages)"
    definition = __doc__
    thresholds = {
        "warning_saved_pct": 10.0,    # est. saving of the profiled kernel time at or above this: warning
        "critical_saved_pct": 30.0,   # ... at or above this: critical
        "min_speedup_pct": 1.0,       # rule results estimating less than this are left out
        "top": 10,                    # kernels listed
    }
    kinds = ("counter",)
    needs = "ncu's rule results (a details page, text output or report with rules)"

    def applies_to(self, trace: Trace) -> bool:
        """Only traces with ncu rule results (``rule:*`` counters in group ``rule``)."""
        ev = trace.events
        return ev.filter(expr.kind_is("counter") & (pl.col("group") == RULE_GROUP)).height > 0

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        said = trace.meta.extra.get("ncu_rule_results") or []
        types = _type_counts(trace)
        n_results = sum(types.values())
        says_rows = _says(said)
        says = {str(i + 1): row for i, row in enumerate(says_rows[:int(t["top"])])}
        kinds = {name: (info.get("speedup_types") or ["?"])[0]
                 for name, info in (trace.meta.extra.get("ncu_rules") or {}).items()}
        launches = events.filter(expr.kind_is("kernel"))
        kernel_ns = int(launches["duration_ns"].sum() or 0)
        results = rule_results(events).filter(pl.col("speedup_pct") >= float(t["min_speedup_pct"]))
        results = results.with_columns(
            est_saved_ns=(pl.col("duration_ns").cast(pl.Float64) * pl.col("speedup_pct") / 100.0).round(0)
            .cast(pl.Int64),
            kind=pl.col("rule").replace_strict(kinds, default="?", return_dtype=pl.String))
        if results.height == 0:
            typed = ", ".join(f"{k} {v}" for k, v in types.items())
            return [Finding(self.name, "info", "No speed-up estimated by ncu" if not n_results
                            else "What ncu's rules say (no speed-up estimated)",
                            f"{launches.height:,} profiled launches, {n_results:,} rule results from ncu"
                            + (f" ({typed})" if typed else "") + "; none estimates a speed-up of "
                            f"{t['min_speedup_pct']}% or more." + (f" The first: {says_rows[0]['type']} "
                                                                    f"{says_rows[0]['text']}" if says_rows else ""),
                            metrics={"kernel_time_ns": kernel_ns, "est_saved_ns": 0, "est_saved_pct": 0.0,
                                     "global_saved_ns": 0, "global_saved_pct": 0.0,
                                     "launches_with_speedups": 0, "rule_results": n_results,
                                     "rule_types": types, "speedup_results": 0, "ncu_says": says},
                            figures=FIGURES, labels=LABELS, tables={"ncu_says": SAYS_TABLE}, impact_ns=0)]
        best_per_launch = _best_per_launch(results)
        saved_ns = int(best_per_launch["est_saved_ns"].sum())
        saved_pct = expr.pct(saved_ns, kernel_ns)
        global_ns = int(_best_per_launch(results.filter(pl.col("kind") == "global"))["est_saved_ns"].sum() or 0)
        global_pct = expr.pct(global_ns, kernel_ns)
        time_by_name = launches.group_by("name").agg(launches=pl.len(), time_ns=pl.col("duration_ns").sum())
        # one rule can say several things of one launch (LaunchConfiguration: too few blocks, too few threads per
        # block), each an estimate of the same time: a rule's saving at a launch is its largest, never their sum
        by_launch_rule = (results.group_by("trace_id", "parent_id", "kernel", "rule", "kind")
                          .agg(results=pl.len(), est_saved_ns=pl.col("est_saved_ns").max(),
                               speedup_pct=pl.col("speedup_pct").max()))
        per_rule = (by_launch_rule.group_by("kernel", "rule", "kind")
                    .agg(rule_saved=pl.col("est_saved_ns").sum(), speedup_pct=pl.col("speedup_pct").max())
                    .sort(["rule_saved", "rule"], descending=[True, False])
                    .group_by("kernel", maintain_order=True).first())
        by_name = (best_per_launch.group_by("kernel").agg(est_saved_ns=pl.col("est_saved_ns").sum())
                   .join(per_rule.select("kernel", best_rule="rule", speedup_kind="kind", speedup_pct="speedup_pct"),
                         on="kernel")
                   .join(time_by_name, left_on="kernel", right_on="name", how="left")
                   .sort(["est_saved_ns", "kernel"], descending=[True, False]))
        items = [{"name": r["kernel"], "launches": r["launches"], "time_ns": r["time_ns"],
                  "best_rule": r["best_rule"], "speedup_kind": r["speedup_kind"], "speedup_pct": r["speedup_pct"],
                  "est_saved_ns": r["est_saved_ns"], "saved_pct": expr.pct(r["est_saved_ns"], kernel_ns)}
                 for r in by_name.head(int(t["top"])).iter_rows(named=True)]
        rules = {r["rule"]: {"kind": r["kind"], "results": r["results"], "est_saved_ns": r["est_saved_ns"]}
                 for r in by_launch_rule.group_by("rule", "kind").agg(results=pl.col("results").sum(),
                                                                      est_saved_ns=pl.col("est_saved_ns").sum())
                 .sort(["est_saved_ns", "rule"], descending=[True, False]).iter_rows(named=True)}
        severity = grade(global_pct, warning=t["warning_saved_pct"], critical=t["critical_saved_pct"])
        top = items[0]
        message = (f"ncu's rules estimate that {best_per_launch.height:,} of {launches.height:,} profiled launches "
                   f"could run faster: up to {fmt_ns(saved_ns)} of {fmt_ns(kernel_ns)} "
                   f"({fmt_pct(saved_pct or 0)}) if each launch's best estimate held, {fmt_ns(global_ns)} "
                   f"({fmt_pct(global_pct or 0)}) from whole-kernel (global) estimates. The largest: "
                   f"{top['best_rule']} on {short_name(top['name'], 60)} ({top['speedup_kind']} speed-up up to "
                   f"{fmt_pct(top['speedup_pct'])}).")
        return [Finding(self.name, severity, "Speed-ups ncu estimates", message,
                        SUGGESTION if severity != "info" else "",
                        metrics={"kernel_time_ns": kernel_ns, "est_saved_ns": saved_ns, "est_saved_pct": saved_pct,
                                 "global_saved_ns": global_ns, "global_saved_pct": global_pct,
                                 "launches_with_speedups": best_per_launch.height, "rule_results": n_results,
                                 "rule_types": types, "speedup_results": results.height, "rules": rules,
                                 "ncu_says": says},
                        items=items, items_title="kernels", columns=COLUMNS, figures=FIGURES, labels=LABELS,
                        tables={"rules": RULES_TABLE, "ncu_says": SAYS_TABLE},
                        impact_ns=global_ns, impact_said="to gain")]


def _type_counts(trace: Trace) -> dict[str, int]:
    """Rule results per type (OPT, INF, WRN, ...) over every rule name, from the reader's per-rule summary."""
    counts: dict[str, int] = {}
    for info in (trace.meta.extra.get("ncu_rules") or {}).values():
        for kind, n in (info.get("types") or {}).items():
            counts[kind] = counts.get(kind, 0) + int(n)
    return dict(sorted(counts.items(), key=lambda kv: (TYPE_ORDER.get(kv[0], 9), kv[0])))


def _says(results: list[dict]) -> list[dict]:
    """One row per (rule, type, text) ncu wrote: launches it was said of and its largest speed-up; OPT/WRN first."""
    rows: dict[tuple, dict] = {}
    for r in results:
        key = (r.get("rule"), r.get("type"), r.get("text"))
        row = rows.setdefault(key, {"type": r.get("type"), "rule": r.get("rule"), "launches": 0,
                                    "speedup_pct": None, "text": r.get("text")})
        row["launches"] += 1
        if r.get("speedup_pct") is not None:
            row["speedup_pct"] = max(row["speedup_pct"] or 0.0, float(r["speedup_pct"]))
    return sorted(rows.values(), key=lambda r: (TYPE_ORDER.get(r["type"], 9), -(r["speedup_pct"] or 0),
                                                -r["launches"], r["rule"] or "", r["text"] or ""))


def _best_per_launch(results: pl.DataFrame) -> pl.DataFrame:
    """Each launch's rule result with the largest estimated saving (ties: the rule name first in order)."""
    return (results.sort(["est_saved_ns", "rule"], descending=[True, False])
            .group_by("trace_id", "parent_id", maintain_order=True).first())


@hookimpl
def traceparse_rules():
    return [NcuSpeedups()]
