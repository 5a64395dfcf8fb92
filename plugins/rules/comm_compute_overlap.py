"""Rule ``comm-compute-overlap``: how much communication-kernel time runs while compute kernels run.

Definition. Communication kernels are the NCCL and RCCL kernels of every NCCL version (``ncclKernel_*``,
``ncclDevKernel_*`` including ``Generic``, ``ncclSendRecvKernel_*``, ...); compute kernels are the other
kernels. Per rank and device (a trace without ranks: per device), overlapped = Σ over
communication kernels of |kernel ∩ union of the same device's compute kernels|; ``overlap_pct`` = 100 ×
overlapped / communication time, over all ranks. Only timed kernels count.

Metrics: ``comm_time_ns``, ``overlapped_ns``, ``overlap_pct``, ``comm_share_pct`` = 100 × the time
communication kernels run / the time any kernel runs (both unions per rank and device, summed: two
collectives in flight at once on two streams count once, so the share is at most 100), ``members`` (``rank`` or ``device``), ``ranks`` ({rank or
device: kernels, comm_time_ns, overlapped_ns, overlap_pct}). Items per rank (device), least overlapped
first: ``rank``, ``device``, ``kernels``, ``comm_time_ns``, ``overlapped_ns``, ``exposed_ns`` (the time
communication kernels run while no compute kernel runs: on the timeline, so two collectives at once count once,
and it is not always ``comm_time_ns`` − ``overlapped_ns``), ``overlap_pct``.

Waiting. Where the collectives run as communication kernels on every rank (NCCL, RCCL), a kernel starts when
its stream reaches it and spins until the last rank's kernel of the collective starts: that time is waiting for
a later rank, which no overlap can hide (the stragglers rule says whose). ``waiting_ns`` is the time the
members' kernels spin so while none of their compute kernels runs, over the whole trace as the communication
and exposed time are (the stragglers rule counts its ``waited_ns`` inside the steps), at most their exposed time;
per rank in
``ranks`` and the items. ``moving_overlap_pct`` = 100 × (overlapped − spin beside compute) / (communication time
− spin): the overlap of the time the kernels do their own work, where the spin is all of the kernels' spinning
(``spin_ns``: each kernel's, summed as the communication time is), beside compute or not, and the spin beside
compute the part of it while compute kernels run. Four real DDP ranks' RCCL kernels (AMD GPUs) spun 150.8 of
their 164.9 ms, 39 ms of it beside compute: their own work overlaps 30.8%, not the 81.7% of taking off the exposed
spin alone. The time at stake (``impact_ns``) is the exposed communication less the waiting; the severity
grades ``moving_overlap_pct`` where there is waiting, else
``overlap_pct``. Where a member lost its collectives' kernels (a rank cut short, or one whose GPU activities were
not recorded: stragglers leaves it out of the arrivals), its waits are unknown and so are the others' waits for it:
the waiting is a floor, the time at stake is None (not the exposed time less a floor: Megatron's tensor-parallel
ranks with rank 0 cut read 202.5 ms lost per rank, 66.1 ms whole) and the severity at most a warning. On four
real FSDP2 ranks where rank 2 sleeps 30 ms a step, the other ranks' communication overlapped 30% of its time,
but 96 of their 99 ms of exposed communication was waiting for rank 2: the rule said "low overlap, 75 ms lost"
and advised bucketing and prefetching; the moving time overlaps 84.7%.

Severity: when communication takes at least ``min_comm_share_pct`` of the kernel busy time, warning under
``warning_below_pct`` overlap, critical under ``critical_below_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import ends_early, fmt_ns, fmt_pct, listed
from traceparse.measures.base import picked
from traceparse.measures.comm import (arrivals_unknown, comm_kernels, device_spin, device_spin_split,
                                      has_communication)
from traceparse.measures.comm_sources import point_to_point_only
from traceparse.meta import incomplete_ranks
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"comm_time_ns": "ns", "overlapped_ns": "ns", "overlap_pct": "pct", "comm_share_pct": "pct"}
#: Screen labels where the key's words would read like another figure: the communication's overlap, not the copies'
#: (low-memcpy-overlap).
LABELS = {"overlapped_ns": "comm overlapped", "overlap_pct": "comm overlap", "waiting_ns": "comm waiting",
          "moving_overlap_pct": "moving overlap"}
COLUMNS = [Column("rank", "rank", "number"), Column("device", "device", "number"),
           Column("kernels", "kernels", "count"), Column("comm_time_ns", "comm time", "ns"),
           Column("overlapped_ns", "overlapped", "ns"), Column("exposed_ns", "exposed", "ns"),
           Column("overlap_pct", "overlap %", "pct")]
#: A rank's communication time spent waiting for a later rank (a column only where kernels wait so).
WAITING = Column("waiting_ns", "waiting", "ns")
RANKS = [Column("rank", "rank / device", "text"), Column("kernels", "kernels", "count"),
         Column("comm_time_ns", "comm time", "ns"), Column("overlapped_ns", "overlapped", "ns"),
         Column("overlap_pct", "overlap %", "pct")]


class CommComputeOverlap(Rule):
    name = "comm-compute-overlap"
    description = "Share of communication-kernel time during which compute kernels run on the same device"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 50.0,   # overlap under this is a warning ...
        "critical_below_pct": 10.0,  # ... and under this critical ...
        "min_comm_share_pct": 5.0,   # ... when communication takes at least this % of the kernel busy time
    }
    kinds = ("kernel",)

    def applies_to(self, trace: Trace) -> bool:
        return has_communication(trace.events, kernels_only=True)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        per = measures.comm_overlap(events)
        if per.height == 0:
            return [Finding(self.name, "info", "No timed communication kernels",
                            "The trace's communication kernels have no start times, so overlap cannot be measured.",
                            metrics={"comm_time_ns": 0, "overlapped_ns": 0, "overlap_pct": None},
                            figures=FIGURES, labels=LABELS)]
        ranked = per["rank"].is_not_null().any()
        label = "rank" if ranked else "device"
        comm_ns = int(per["comm_time_ns"].sum())
        overlapped_ns = int(per["overlapped_ns"].sum())
        pct = expr.pct(overlapped_ns, comm_ns)
        # unions per rank and device: collectives in flight at once on two streams count once
        layers = measures.rank_time(events)
        comm_union = int(layers["comm_ns"].sum() or 0)
        busy_ns = int((layers["compute_ns"] + layers["comm_exposed_ns"]).sum() or 0)
        exposed_ns = int(layers["comm_exposed_ns"].sum() or 0)
        share = expr.pct(comm_union, busy_ns) if busy_ns else 100.0
        waiting = _waiting(events, layers, ranked)  # {rank or device: ns}, {} where no kernel waits
        waiting_ns = sum(waiting.values())
        unknown = set(arrivals_unknown(events)) if waiting else set()  # lost their kernels: waits not known
        # exposed on the timeline (two collectives at once on two streams count once), as the time at stake is:
        # each kernel's own exposed time, summed, ran past it (187.8 ms where the timeline has 185.3)
        on_timeline = {(t, r, d): ns for t, r, d, ns in layers.select(
            "trace_id", "rank", "device_id", "comm_exposed_ns").iter_rows()}
        items = [{"rank": r["rank"], "device": r["device_id"], "kernels": r["kernels"],
                  "comm_time_ns": r["comm_time_ns"], "overlapped_ns": r["overlapped_ns"],
                  "exposed_ns": on_timeline.get((r["trace_id"], r["rank"], r["device_id"]), r["exposed_ns"]),
                  "overlap_pct": r["overlap_pct"],
                  **({"waiting_ns": _waited(waiting, r["rank"] if ranked else r["device_id"], unknown)}
                     if waiting else {})}
                 for r in per.sort(["overlap_pct", "rank", "device_id"], nulls_last=True).iter_rows(named=True)]
        ranks: dict = {}
        for r in per.iter_rows(named=True):
            key = str(r["rank"] if ranked else r["device_id"])
            agg = ranks.setdefault(key, {"kernels": 0, "comm_time_ns": 0, "overlapped_ns": 0})
            for k in agg:
                agg[k] += r[k]
        for key, agg in ranks.items():
            agg["overlap_pct"] = expr.pct(agg["overlapped_ns"], agg["comm_time_ns"])
        if waiting:
            for r in per.iter_rows(named=True):
                member = r["rank"] if ranked else r["device_id"]
                ranks[str(member)]["waiting_ns"] = _waited(waiting, member, unknown)
        # the kernels' own work: their time less all their spinning, its overlap less the spinning beside compute
        split = device_spin_split(events) if waiting else {}
        spun_ns = sum(ns for ns, _ in split.values())
        own_ns = max(0, comm_ns - spun_ns)
        own_overlapped = min(own_ns, max(0, overlapped_ns - sum(beside for _, beside in split.values())))
        moving_pct = expr.pct(own_overlapped, own_ns) if waiting else None
        severity = "info"
        if share is not None and share >= t["min_comm_share_pct"]:
            severity = grade(moving_pct if waiting else pct, warning=t["warning_below_pct"],
                             critical=t["critical_below_pct"], higher_is_worse=False)
        n = len(ranks)
        message = (f"{fmt_pct(pct or 0)} of {fmt_ns(comm_ns)} of communication-kernel time "
                   f"({n} {label}{'s' if n != 1 else ''}) runs while compute kernels run "
                   f"({fmt_ns(overlapped_ns)}); communication runs during {fmt_pct(share or 0)} of the time kernels "
                   "run.")
        if waiting_ns:
            message += (f" {'At least ' if unknown else ''}{fmt_ns(waiting_ns)} of the exposed {fmt_ns(exposed_ns)} "
                        "is kernels spinning until a "
                        "later rank's kernel of the same collective starts: waiting for that rank (stragglers says "
                        "which), which no overlap can hide. Of the "
                        f"{fmt_ns(own_ns)} the kernels do their own work (the rest of their time they spin, beside "
                        f"compute or not), {'at least ' if unknown and moving_pct else ''}{fmt_pct(moving_pct or 0)} "
                        "overlaps compute.")
        at_stake = max(0, exposed_ns - waiting_ns)
        if unknown:  # stragglers leaves them out of the arrivals, and says why
            left = sorted(unknown)
            one = len(left) == 1
            message += (f" {listed(label, left).capitalize()} {'has' if one else 'have'} fewer "
                        "communication kernels than collective calls: how long "
                        f"{'it' if one else 'they'} waited for a later rank is unknown (left out of the "
                        "waiting, as stragglers leaves it out of the arrivals), and so is how long the others' "
                        f"kernels spun waiting for {'it' if one else 'them'}: the waiting here is of the "
                        f"{label}s compared alone, a floor, and of the exposed time at most "
                        f"{fmt_ns(at_stake)} is time overlap could win, how much is not known (no time at stake "
                        "is given).")
            if severity == "critical":  # not critical on a time at stake that is not known
                severity = "warning"
        cut = incomplete_ranks(trace.meta) if ranked else []
        if cut and not waiting:  # a cut rank lacks the kernels its peers' spun for: the waits cannot be told apart
            said = ends_early(cut)
            message += (f" {said[0].upper()}{said[1:]}: {'its' if len(cut) == 1 else 'their'} communication kernels "
                        "after the cut are missing, so how long the others' kernels spun waiting for a later rank "
                        "cannot be told from the GPUs: that waiting counts as exposed here.")
        if n == 1:
            message += f" One {label} alone: the figure is that {label}'s."
        p2p = point_to_point_only(picked(events, comm_kernels(), "collective")["collective"])
        if p2p:
            message += P2P_SENTENCE
        suggestion = ("" if severity == "info" else P2P_SUGGESTION if p2p else
                      "Overlap communication with compute: DistributedDataParallel buckets (bucket_cap_mb) so "
                      "gradients reduce during the backward pass, FSDP prefetching (forward_prefetch, "
                      "backward_prefetch), communication on its own stream, and no synchronisation between "
                      "the backward pass and the collectives. Tensor-parallel all-reduces, whose result the next "
                      "layer needs at once, overlap only where the layer's work is split to run beside them "
                      "(Megatron-LM's --tp-comm-overlap, PyTorch's asynchronous tensor parallelism).")
        metrics = {"comm_time_ns": comm_ns, "overlapped_ns": overlapped_ns, "overlap_pct": pct,
                   "comm_share_pct": share, "members": label, "ranks": ranks}
        if waiting:
            metrics.update(waiting_ns=waiting_ns, spin_ns=spun_ns, moving_overlap_pct=moving_pct)
        # the ranks' table only where a rank has several devices: else it is the devices' table again
        per_rank = {"ranks": RANKS + ([WAITING] if waiting else [])} if ranked and n < len(items) else {}
        columns = [c for c in COLUMNS if ranked or c.key != "rank"] + ([WAITING] if waiting else [])
        return [Finding(self.name, severity, "Low communication/compute overlap" if severity != "info"
                        else "Communication/compute overlap", message, suggestion,
                        metrics=metrics, items=items, items_title="devices", columns=columns,
                        figures={**FIGURES, **({"waiting_ns": "ns", "moving_overlap_pct": "pct"} if waiting else {})},
                        labels=LABELS, tables=per_rank, worst={"ranks": "-overlap_pct"},
                        impact_ns=None if unknown else at_stake)]


#: Said where every communication kernel is a point-to-point transfer (a pipeline's sends and receives).
P2P_SENTENCE = (" Every communication kernel is a point-to-point transfer (send, receive: a pipeline's stages "
                "passing activations and gradients); a stage's kernel spins until its peer's starts, so most of "
                "their time is a stage waiting for its neighbour (stragglers says whether a stage is slow or it "
                "is the pipeline's bubble).")
#: What to do about a pipeline's exposed transfers (instead of the data-parallel advice).
P2P_SUGGESTION = ("Overlap the pipeline's transfers with compute: post the receives early and send without "
                  "waiting (isend/irecv or batch_isend_irecv, waited only where the tensor is needed), so the "
                  "next micro-batch computes while this one moves; the waiting no overlap hides: even out the "
                  "stages and use more micro-batches (stragglers).")


def _waited(waiting: dict, member, unknown: set) -> int | None:
    """``member``'s time spinning for a later rank (``waiting``: :func:`_waiting`): 0 where it waited none, None
    where it is unknown (``unknown``: members left out of the arrivals)."""
    return None if member in unknown else waiting.get(member, 0)


def _waiting(events, layers: pl.DataFrame, ranked: bool) -> dict[int, int]:
    """{rank (device where the trace has no ranks): the time its communication kernels spin for a later rank's
    while none of its compute kernels runs, over the whole trace}, each at most its exposed communication; {} where
    the collectives are not waited for on the device (gloo, a single rank)."""
    waited = device_spin(events)  # to each kernel's end
    key = "rank" if ranked else "device_id"
    exposed = dict(layers.group_by(key).agg(pl.col("comm_exposed_ns").sum()).iter_rows())
    return {m: max(0, min(int(ns), int(exposed.get(m, 0)))) for m, ns in waited.items()}


@hookimpl
def traceparse_rules():
    return [CommComputeOverlap()]
