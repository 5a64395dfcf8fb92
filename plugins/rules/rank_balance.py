"""Rule ``rank-balance``: where each rank's GPU time goes, and how unevenly the ranks are busy (HTA's temporal breakdown).

Definition. Per rank and device (a trace without ranks: per device),
over the span from the device's first to its last GPU activity (timed kernels, copies, memsets):
``compute_ns`` = time compute kernels run; ``comm_exposed_ns`` = time communication kernels run and no
compute kernel does; ``memcpy_ns`` = time copies or memsets run and no kernel does; ``idle_ns`` = time
nothing runs. The four add up to ``span_ns``; ``busy_ns`` = compute + exposed communication + memcpy. A
rank with several devices sums them. Each figure's share of the span is its ``_pct``. Communication here
is on the GPU: a host-side collective (gloo) does not occupy it, and the GPU's wait for it is idle time.
Rows without a device (copies whose device the trace does not say) count towards a rank, not a device.

``work_ns`` = compute + memcpy: the work a rank's GPU does. ``imbalance`` = max work / mean work over the
ranks (1.0: even); ``slowest_rank`` has the most work, ``fastest_rank`` the least (of equals, the lowest); both
are None where every rank's work is the same but for noise (within 0.1%, or 1 us), where naming one would pick it
on a few ns. The work is the GPU's: a rank slowed on the host (a data
loader, a sleep before its collectives) does the same GPU work as the others and is the stragglers rule's.
Exposed communication is not work: a communication kernel spins until every rank's has started, so the rank
that waits for a straggler has the most of it (on a real FSDP2 run over NCCL whose rank 1 sleeps in a
gradient hook, rank 0's GPU spent 75.7 ms in exposed communication against rank 1's 6.5, and judged by busy
time, HTA's, rank 0 was the "busiest" rank, where its work was 130.2 ms against 111.1). Who holds whom is
the stragglers rule's; the message names the rank with the most exposed communication when it exceeds a
tenth of its span.

Metrics: ``imbalance``, ``slowest_rank``, ``fastest_rank``, ``members`` (``rank`` or ``device``),
``compute_ns``, ``comm_exposed_ns``, ``memcpy_ns``, ``idle_ns``, ``span_ns``, ``busy_ns``, ``work_ns`` (summed
over ranks), ``ranks`` ({rank: span_ns, compute_ns, comm_exposed_ns, memcpy_ns, idle_ns, busy_ns, work_ns,
compute_pct, comm_exposed_pct, memcpy_pct, idle_pct}). Items: every rank, most work first.

A rank whose input ends early (its file cut short: the run says which) did less of everything; it is listed
but left out of the comparison (``incomplete_ranks``), which is of the whole ranks, as are the totals and the
shares of the span.

Ranks whose traces hold different numbers of steps (``ProfilerStep#N`` or the other steps a trace marks, each
trace its own) did different amounts of work: their work is compared per step (``compared_per_step``; each rank's
``steps`` in ``ranks``), and the time at stake is per step times the fewest steps.

Severity: ``imbalance`` at or above ``warning_imbalance`` is a warning, at or above ``critical_imbalance``
critical. One rank (or device) alone is info and says so. Time at stake: the most work less the mean.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import (SAME_NS, SAME_SAID, ends_early, fmt_ns, fmt_pct, fmt_ratio, same_figure,
                                shares_shown)
from traceparse.measures.base import exact_sum, exact_total
from traceparse.measures.comm import has_communication
from traceparse.measures.steps import steps_of
from traceparse.meta import incomplete_ranks
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

PARTS = ("compute", "comm_exposed", "memcpy", "idle")
FIGURES = {"imbalance": "ratio", "slowest_rank": "number", "fastest_rank": "number", "compute_ns": "ns",
           "comm_exposed_ns": "ns", "memcpy_ns": "ns", "idle_ns": "ns"}
#: The ranks with the most and the least GPU work, not the slowest and fastest steps: "slowest rank 0" read beside
#: stragglers' rank 3, whose late arrival the others wait for while its GPU does less.
LABELS = {"slowest_rank": "most GPU work", "fastest_rank": "least GPU work"}
COLUMNS = [Column("rank", "rank / device", "number"), Column("span_ns", "span", "ns"),
           Column("compute_ns", "compute", "ns"), Column("memcpy_ns", "memcpy", "ns"), Column("work_ns", "work", "ns"),
           Column("comm_exposed_ns", "exposed comm", "ns"), Column("idle_ns", "idle", "ns"),
           Column("idle_pct", "idle %", "pct")]
_SUMS = ["span_ns", "compute_ns", "comm_exposed_ns", "memcpy_ns", "idle_ns", "busy_ns", "work_ns"]
#: Exposed communication over this share of a rank's span is named in the message (its wait at collectives).
WAITING_SHARE = 10.0


class RankBalance(Rule):
    name = "rank-balance"
    impact_per_rank = True  # the most work over the mean: per rank already
    description = "Per rank: compute, exposed communication, memcpy and idle time; how unevenly ranks are busy"
    definition = __doc__
    thresholds = {
        "warning_imbalance": 1.2,   # max/mean work at or above this: warning
        "critical_imbalance": 1.5,  # ... at or above this: critical
    }
    kinds = expr.GPU_KINDS

    def applies_to(self, trace: Trace) -> bool:
        events = trace.events
        return bool(events["rank"].drop_nulls().n_unique() > 1) or has_communication(events)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        per = measures.rank_time(trace.events)
        ranked = per["rank"].is_not_null().any()
        label = "rank" if ranked else "device"
        key = "rank" if ranked else "device_id"
        per = per.filter(pl.col(key).is_not_null())
        if per.height == 0:
            return [Finding(self.name, "info", "No timed GPU activity per rank",
                            "No rank or device has timed kernels, copies or memsets.",
                            metrics={"imbalance": None, "slowest_rank": None, "fastest_rank": None},
                            figures=FIGURES)]
        per = per.with_columns(work_ns=pl.col("compute_ns") + pl.col("memcpy_ns"))
        rows = (per.group_by(key).agg(exact_total(c) for c in _SUMS).rename({key: "member"})
                .with_columns(**{f"{p}_pct": pl.when(pl.col("span_ns") > 0)
                                 .then((100.0 * pl.col(f"{p}_ns") / pl.col("span_ns")).round(4)) for p in PARTS})
                .sort("member"))
        # a rank whose file was cut short did less of everything: compared, it read as the least busy
        cut = sorted(set(incomplete_ranks(trace.meta)) & set(rows["member"].to_list())) if ranked else []
        compared = rows.filter(~pl.col("member").is_in(cut)) if cut else rows
        # ranks whose traces hold different numbers of steps did different amounts of work: compared per step
        steps = steps_of(trace.events, per, "rank") if ranked else {}
        counted = {steps.get(m) for m in compared["member"].to_list()}
        per_step = len(counted) > 1 and None not in counted
        if per_step:
            compared = compared.with_columns(work_ns=(pl.col("work_ns") / pl.col("member").replace_strict(
                steps, return_dtype=pl.Int64)).round(0).cast(pl.Int64))
        work = compared["work_ns"]
        mean = work.mean() if compared.height else None
        imbalance = round(float(work.max()) / mean, 4) if mean and compared.height > 1 else None
        by_work = compared.sort(["work_ns", "member"], descending=[True, False])
        even = compared.height > 1 and same_figure(float(work.max()), float(work.min()), SAME_NS)
        slowest = None if even or compared.height < 2 else by_work["member"][0]
        fastest = None if even or compared.height < 2 else compared.sort(["work_ns", "member"])["member"][0]
        # the shares of the span are of the whole ranks where some were cut short (a cut rank's record has gaps
        # where work went unwritten: fsdp4's rank 0 cut at 60% made "idle" 11.3% of the span, 4.6% whole), as
        # gpu-idle's and the summary's; every rank stays in the table
        whole = compared if cut and compared.height else rows
        totals = {c: exact_sum(whole[c]) for c in _SUMS}
        over = (f"Over all {label}s" if whole is rows else f"Over the whole {label}" if whole.height == 1
                else f"Over the {whole.height:,} whole {label}s")
        ranks = {str(r["member"]): {k: v for k, v in r.items() if k != "member"} for r in rows.iter_rows(named=True)}
        in_order = rows.sort("member") if even else rows.sort(["work_ns", "member"], descending=[True, False])
        items = [{"rank": r["member"], "span_ns": r["span_ns"], "compute_ns": r["compute_ns"],
                  "comm_exposed_ns": r["comm_exposed_ns"], "memcpy_ns": r["memcpy_ns"], "idle_ns": r["idle_ns"],
                  "busy_ns": r["busy_ns"], "work_ns": r["work_ns"], "idle_pct": r["idle_pct"]}
                 for r in in_order.iter_rows(named=True)]  # alike: rank order
        if per_step:
            for member, count in steps.items():
                if str(member) in ranks:
                    ranks[str(member)]["steps"] = count
        metrics = {"imbalance": imbalance, "slowest_rank": slowest, "fastest_rank": fastest, "members": label,
                   **totals, "ranks": ranks, **({"incomplete_ranks": cut} if cut else {}),
                   **({"compared_per_step": True} if per_step else {})}
        # the parts of the span, a partition of it: rounded together so that they add up to 100 as shown
        parts_pct = shares_shown([expr.pct(totals[f"{p}_ns"], totals["span_ns"]) or 0 for p in PARTS])
        shares = ", ".join(f"{p.replace('_', ' ')} {fmt_pct(share)}" for p, share in zip(PARTS, parts_pct))
        if rows.height == 1:
            info = trace.meta.distributed
            alone = f" (rank {info['rank']} of {info.get('world_size', '?')})" if "rank" in info else ""
            return [Finding(self.name, "info", "One rank alone" if alone else f"One {label} alone",
                            f"Only {label} {slowest}{alone} has GPU activity ({shares}); balance needs several "
                            f"{label}s (ingest the rank directory as a run).",
                            metrics={**metrics, "imbalance": None}, items=items, columns=COLUMNS, figures=FIGURES)]
        severity = grade(imbalance, warning=t["warning_imbalance"], critical=t["critical_imbalance"])
        if compared.height > 1:
            message = (f"{_spread_said(compared.height, label, slowest, fastest, work, per_step)}; imbalance (max/mean "
                       f"work{' per step' if per_step else ''}) {fmt_ratio(imbalance)}. {over}: {shares} of the span.")
            if per_step:
                held = ", ".join(f"{label} {m} {steps[m]}" for m in compared["member"].to_list())
                message += (f" The {label}s' traces hold different numbers of steps ({held}): their work is compared "
                            "per step.")
        else:
            message = (f"{compared.height} whole {label}{'' if compared.height == 1 else 's'}: too few to compare. "
                       f"{over}: {shares} of the span.")
        if cut:
            said = ends_early(cut)
            message += (f" {said[0].upper()}{said[1:]}: {'its' if len(cut) == 1 else 'their'} figures cover what "
                        "was read" + (", and are left out of the comparison and the totals." if whole is compared
                                      else "."))
        waiting = (rows.filter(pl.col("comm_exposed_pct") > WAITING_SHARE)
                   .sort(["comm_exposed_ns", "member"], descending=[True, False]))
        if waiting.height and rows.height > 1:
            w = waiting.row(0, named=True)
            message += (f" {label.capitalize()} {w['member']}'s GPU spent {fmt_ns(float(w['comm_exposed_ns']))} "
                        f"({fmt_pct(w['comm_exposed_pct'])} of its span) in communication kernels with no compute "
                        "beside them: transfers, or waiting at collectives for another rank (stragglers says which).")
        suggestion = (f"Even out the work per {label}: uneven shards or sequence lengths, a pipeline or "
                      "model-parallel split with unequal stages, or extra work (logging, evaluation) on one "
                      f"{label}." if severity != "info" else "")
        return [Finding(self.name, severity, "Ranks unevenly busy" if severity != "info" else "Rank time breakdown",
                        message, suggestion, metrics=metrics, items=items, columns=COLUMNS, figures=FIGURES,
                        labels=LABELS,
                        # ranks alike in work: a folded table keeps the most idle (a straggler's peers wait)
                        worst={"items": "idle_ns"} if even else {},
                        # one per-rank table: the items (ranks is JSON's)
                        impact_ns=(int((work.max() - mean) * (min(steps.values()) if per_step else 1))
                                   if imbalance is not None else None))]


def _spread_said(count: int, label: str, slowest, fastest, work: pl.Series, per_step: bool = False) -> str:
    """Who has the most and the least work (``64 ranks: most work on rank 5 (...), least on 0 (...)``), or, where
    no rank has more than noise (``slowest`` None), that they all do the same: ``64 ranks: the same work on each,
    19.85 ms of compute and copies (within 0.1%)``."""
    each = " a step" if per_step else ""
    if slowest is None:
        return (f"{count:,} {label}s: the same work on each, {fmt_ns(float(work.max()))} of compute and copies{each} "
                f"({SAME_SAID}; a {label} slower on the host than on its GPU is the stragglers rule's)")
    return (f"{count:,} {label}s: most work on {label} {slowest} ({fmt_ns(float(work.max()))} of compute and "
            f"copies{each}), least on {fastest} ({fmt_ns(float(work.min()))}{each})")


@hookimpl
def traceparse_rules():
    return [RankBalance()]
