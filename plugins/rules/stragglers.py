"""Rule ``stragglers``: which rank arrives last at the collectives, and what its lateness costs the others.

Definition. Collective instances: on each rank the
arrival at a collective is the start of its host-side call (``record_param_comms`` with a sequence number,
else the ``c10d::*`` operator, else ``record_param_comms``, else a host annotation such as
``gloo:all_reduce``), or of its communication kernel where only GPU events exist; an instance is matched
across ranks by (process group, sequence number) where the trace has one, else as the n-th collective of
that process group on each rank. A trace of one process driving several GPUs (rank null) compares its
devices' communication kernels instead. Where every member's every collective ran as a communication kernel
(NCCL, RCCL), the arrival is that kernel's start (the call only queues it; the device waits, in the kernel),
and a wait counts only where the member's compute kernels run nothing (a kernel waiting on a stream of its own
while the member computes costs it nothing). In each instance the last rank to arrive holds the others: each
other rank waits last arrival − its own arrival, on the device no longer than its own kernel ran (a broadcast's
root is done before the last rank starts: it waited only while its kernel ran).

Per rank: ``last_count`` (instances it arrived last at, of those with two or more ranks), ``waited_ns`` =
the time it spent waiting, counted once: the length of the union of its waiting intervals [arrival, last
arrival) inside its step windows (gloo keeps two collectives in flight, whose waits cover the same time;
waits outside the steps are not step time), ``step_ns`` = its step time (Σ of its host-side
``ProfilerStep#N`` windows, else the span of its events), so ``waited_ns`` ≤ ``step_ns`` always;
``wait_caused_ns`` = Σ over the other ranks of their time waited at the instances where it was last, each moment
of a rank's waiting put down to one instance, the one it was waiting at first (collectives in flight at once
wait over the same time), so that the ranks' ``wait_caused_ns`` add up to their ``waited_ns``. The candidate
straggler is the rank with the largest ``wait_caused_ns``;
``step_time_lost_pct`` = 100 × its ``step_time_at_stake_ns`` / Σ step time of the other ranks (≤ 100), and
``wait_caused_per_step_ns`` = its ``wait_caused_ns`` / (ranks − 1) / its steps: what each other rank waits
for it in a step. Where the candidate's own trace covers fewer of the steps than the others' do (its profiler
ran over one step of three), the others' step time and steps are those of their step windows lying more than
half inside the time the candidate's trace covers: they can wait for it only then (a rank so profiled made the
others wait 98.4 ms in one step, "7.5% of their step time" over all three, 22% of the step it shares); the
message says which steps each holds.

Step time at stake: a rank's step is its host's, and a wait on its device lengthens it only where the host waits
for the GPU (in synchronising calls, runtime calls of 1 ms or more, collective calls, and with GPU work running
past the step's end). Where the collectives wait on the device, each waiting rank's part of the wait
caused counts at most its ``host_held_ns`` (scaled down by host_held / waited where that is less):
``step_time_at_stake_ns`` (of the candidate) and ``step_time_lost_per_step_ns``; the message says so where it
is less than the wait (an 8-rank Megatron run's GPUs waited 210.8 ms a step for the slowest rank, 34.7% of
their step time, while their hosts ran ahead through all but 48.7 ms of it).

What the straggler did: for a named straggler rank, per name (host operators and annotations by their self
time, kernels, copies and memsets by their duration, each counted when it starts inside a step; not
collectives or step annotations, whose time is waiting), its
time per step on every rank (0 where a rank never runs it) and the median over the ranks.
``slow_rank_host`` and ``slow_rank_gpu`` list the ``top_excess`` names whose time on the straggler exceeds the
median rank's most, by at least ``min_excess_pct`` of the straggler's step time: ``kind``, ``name``,
``slow_ns`` and ``median_ns`` (per step), ``excess_ns``. The message names them (or says nothing exceeds it,
and when the straggler's trace has no operators, that host work between annotations could not be
compared), each with how much of the others' wait per step its excess accounts for; the suggestion starts
with the one of most excess where that is at least half the wait (:data:`EXPLAINS_PCT`), and otherwise says
that what the trace records on the straggler explains little of it (a sleep in a hook the trace does not
show: 1.9 ms more a step of an operator against a 73.9 ms wait was offered as where to start).

Where no single part explains half the wait but the listed GPU parts together do (kernels of one stream add
up: a slow pipeline stage's extra layers spread over three GEMM kernels), the suggestion says the straggler's
GPU work explains the wait. Where every instance is a point-to-point transfer (a pipeline's sends and
receives), the text says "point-to-point transfers" and gives a pipeline's advice; where the run has
point-to-point transfers (alone, or beside a data-parallel job's collectives) and the most waited-for rank
itself waits at least :data:`BUBBLE_FRACTION` of the wait it causes, the finding is the pipeline's bubble,
info, with no straggler named. The candidate is the most waited-for rank, except where the others wait at
least ``warning_pct`` of their step time and one rank waits under :data:`LONE_FRACTION` of what they do while
making them wait: that rank, which the others wait for through one another too (a pipeline's slow last stage,
whose neighbours are last at the others' collectives because they waited for it).

Under the warning line, a candidate that still stands out (it costs the others at least half of
``warning_pct`` of their step time, and more than twice what any other rank costs them) is named as info,
"Most waited for", with what it does longer than the median rank: the waits count only where the waiting
rank's GPU computed nothing, and a late rank can cost the others more where their delayed communication no
longer overlaps their compute (four real FSDP2 ranks, rank 2 sleeping in a gradient hook: 8.7% by waits).

Metrics: ``straggler_rank`` (the candidate when ``step_time_lost_pct`` reaches ``warning_pct``, else null:
no rank stands out), ``collectives`` (instances), ``wait_caused_ns`` and ``wait_caused_per_step_ns`` (of the
candidate), ``step_time_at_stake_ns``, ``step_time_lost_per_step_ns``, ``others_step_ns``,
``step_time_lost_pct``, ``incomplete_collectives`` (instances some rank lacks), ``members`` (``rank``,
``device`` or ``process``), ``clock`` (``shared`` or ``aligned on collective ends``), ``ranks`` ({rank:
last_count, wait_caused_ns, waited_ns, step_ns, host_held_ns where known}), ``slow_rank_host``,
``slow_rank_gpu`` (above; empty without a straggler rank), ``as_slow`` (the other ranks as slow as the
straggler: like it, they spent under :data:`AS_SLOW_FRACTION` of the way from its share of their steps spent
waiting to the most-waiting rank's; the one a hair earlier causes no wait but is no faster, and is named beside
it). Items: every rank, most wait caused first (the straggler's peers next to it). Where the ranks' collectives
end more than :data:`CLOCKS_APART_NS` apart on their own clocks (they leave a collective together), the message
says their clocks likely differ and how to align them; unless every rank's trace names one and the same host
(one machine, one clock: then it says the waits are no clock difference, and aligning is not offered).

Hosts: where the ranks' traces name two hosts or more (PyTorch 2.13's ``host_name``, nsys's ``Hostname``), a
straggler's (or most-waited-for rank's) message adds the waits the
ranks caused summed by host, each with its share of them all; ``hosts`` = {host: {ranks, wait_caused_ns}}, and
the items get a ``host`` column. Where every rank of one host (two or more) made the others wait longer than any
rank of another host, the host is slow, not one rank: the suggestion says to look at that host first, and the
summary line says so. Time at stake (``impact_ns``): the candidate's
``step_time_at_stake_ns`` over the number of ranks, the mean per rank; ``impact_range`` names the least (the
straggler's own: nothing) and the rank that waited for it most. The finding of a straggler gives the run's
summary a line naming it.

Clocks: ranks on one host share its clock, so arrivals compare as they are. Ranks on several hosts do not:
with ``align_clocks`` each rank's clock is moved by the median over instances of (its end − the first
rank's end) of the events that end with the collective (communication kernels, else backend annotations),
since all ranks leave a collective together.

Severity: ``step_time_lost_pct`` at or above ``warning_pct`` is a warning, at or above ``critical_pct``
critical; a balanced run is info. One rank alone (a single rank's trace) is info and says so.
"""

from __future__ import annotations

import statistics

import polars as pl

from traceparse import expr, measures
from traceparse.errors import spelled
from traceparse.figures import ends_early, fmt_count, fmt_ns, fmt_pct, listed, rank_ranges, shares_shown
from traceparse.measures.base import exact_sum, picked
from traceparse.measures.comm import (arrivals_unknown, calls_steps, comm_kernels, has_communication,
                                     member_compute, member_windows_counted, paired_transfer, waiting_by_instance,
                                     waiting_time)
from traceparse.measures.comm_sources import point_to_point_only
from traceparse.measures.host_held import host_held
from traceparse.measures.nesting import over_median
from traceparse.measures.steps import is_step_annotation, steps_of
from traceparse.meta import incomplete_ranks, ranks_by_host
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.run import impact_range
from traceparse.trace import Trace

FIGURES = {"straggler_rank": "number", "collectives": "count", "wait_caused_ns": "ns",
           "wait_caused_per_step_ns": "ns", "step_time_lost_pct": "pct"}
COLUMNS = [Column("rank", "rank", "number"), Column("device", "device", "number"),
           Column("last_count", "last", "count"), Column("wait_caused_ns", "wait caused", "ns"),
           Column("waited_ns", "waited", "ns"), Column("step_ns", "time in steps", "ns"),
           Column("host_held_ns", "host held", "ns"),  # where the hosts waited for their GPUs less than they waited
           Column("host", "host", "text")]  # a run whose traces name two hosts or more
#: Hosts named one by one in the sentence of the waits caused per host; the rest are counted.
HOSTS_NAMED = 4
#: A member is as slow as the straggler where its share of its step time spent waiting is within this fraction
#: of the way from the straggler's share to the most-waiting member's (two ranks sleeping alike: the one 9 us
#: earlier waits 0.1 ms, the others 150 ms).
AS_SLOW_FRACTION = 0.1
#: Members whose collectives end further apart than this on their own clocks cannot share one clock: they leave a
#: collective together (ranks of one host: 0.3 ms at most in the runs made here).
CLOCKS_APART_NS = 1_000_000
#: The items' title: their times are totals over the steps, beside a message that speaks per step.
ITEMS_TITLE = "ranks, totals over all steps"


class Stragglers(Rule):
    name = "stragglers"
    description = "The rank that arrives last at collectives, and the share of the others' step time it costs"
    definition = __doc__
    impact_per_rank = True  # the wait it causes, over the ranks: a mean per rank
    thresholds = {
        "warning_pct": 10.0,     # others' step time lost to the straggler at or above this: warning
        "critical_pct": 25.0,    # ... at or above this: critical
        "align_clocks": False,   # ranks on several hosts: align clocks on collective end times
        "top_excess": 5,         # the straggler's host ops / GPU work listed that take longer than the median rank's
        "min_excess_pct": 1.0,   # ... by at least this share of the straggler's step time
    }
    kinds = ("op", "marker", "kernel")

    def applies_to(self, trace: Trace) -> bool:
        return has_communication(trace.events)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        waits = measures.collective_waits(events, align_clocks=bool(t["align_clocks"]))
        clock = "aligned on collective ends" if t["align_clocks"] else "shared"
        if waits.height == 0:
            return [Finding(self.name, "info", "No collective calls",
                            "The trace has communication events but none placed in time.",
                            metrics={"straggler_rank": None, "collectives": 0}, figures=FIGURES)]
        label = "rank" if waits["rank"].is_not_null().any() else (
            "device" if waits["member"].is_not_null().any() else "process")
        n_instances = waits.select("process_group", "instance").unique().height
        members = waits["member"].unique().sort(nulls_last=False).to_list()
        p2p = point_to_point_only(waits["collective"])
        noun = "point-to-point transfers" if p2p else "collectives"
        # a pipeline: its stages' transfers (alone, or beside data-parallel collectives over other groups)
        transfers = waits.filter(paired_transfer()).select("process_group", "instance").unique().height
        if len(members) < 2:
            info = trace.meta.distributed
            who = (f"rank {members[0]}" if label == "rank" else
                   f"rank {info['rank']} of {info.get('world_size', '?')}" if "rank" in info else "one process")
            return [Finding(self.name, "info", "One rank alone",
                            f"{n_instances} collectives on {who} only: finding a straggler needs the traces of "
                            "every rank of the run (ingest the rank directory as a run).",
                            metrics={"straggler_rank": None, "collectives": n_instances, "members": label,
                                     "clock": clock}, figures=FIGURES)]
        shared = waits.filter(pl.col("members") > 1)
        windows, steps_per_member = member_windows_counted(events, waits)
        step = {m: sum(e - a for a, e in w) for m, w in windows.items()}
        busy = member_compute(events, waits)
        waited = dict(waiting_time(waits, windows, busy).iter_rows())
        caused, caused_on = _caused(shared, windows, busy)
        # a device wait lengthens a rank's step only where its host waits for its GPU: at most that long
        held = host_held(events, windows) if busy is not None and label == "rank" else {}
        hidden = {m: held[m] / waited[m] for m in held if waited.get(m, 0) > held[m]}
        caused_on = {c: {m: round(ns * hidden.get(m, 1.0)) for m, ns in on.items()} for c, on in caused_on.items()}
        stake = {c: sum(on.values()) for c, on in caused_on.items()}
        per = (waits.group_by("member").agg(device=pl.col("device_id").drop_nulls().first(),
                                            rank=pl.col("rank").first())
               .join(shared.filter(pl.col("last")).group_by("member").agg(last_count=pl.len().cast(pl.Int64)),
                     on="member", how="left", nulls_equal=True)
               .with_columns(pl.col("last_count").fill_null(0),
                             waited_ns=pl.col("member").replace_strict(waited, default=0, return_dtype=pl.Int64),
                             wait_caused_ns=pl.col("member").replace_strict(caused, default=0, return_dtype=pl.Int64),
                             step_ns=pl.col("member").replace_strict(step, default=0, return_dtype=pl.Int64))
               .sort(["wait_caused_ns", "member"], descending=[True, False], nulls_last=True))
        per = _busiest_first(per, t["warning_pct"])
        top = per.row(0, named=True)
        candidate = top["member"]
        others = per.filter(pl.col("member") != candidate)
        caused_ns = int(top["wait_caused_ns"])
        stake_ns = int(stake.get(candidate, 0))
        others_step = exact_sum(others["step_ns"])
        # the others' steps in the time the candidate's own trace covers: a straggler whose trace holds one step of
        # three made them wait in that one (98.4 ms was "7.5% of their step time" over nine rank-steps, 22% of three)
        compared = _compared_windows(windows, waits, candidate)
        if compared is not None:
            others_step = sum(e - a for m, w in compared.items() if m != candidate for a, e in w)
        share = expr.pct(stake_ns, others_step)
        severity = grade(share, warning=t["warning_pct"], critical=t["critical_pct"])
        blind = label == "rank" and _lost_kernels(events, waits, incomplete_ranks(trace.meta))
        graded, severity = severity, "info" if blind else severity
        # a pipeline whose most waited-for stage waits about as much itself: its bubble, not a slow stage
        bubble = transfers > 0 and severity != "info" and top["waited_ns"] >= BUBBLE_FRACTION * caused_ns
        severity = "info" if bubble else severity
        straggler = candidate if severity != "info" else None
        calls = measures.collectives(events)
        left_out = arrivals_unknown(events)
        incomplete_keys = _with_left_out(waits, calls, left_out).filter(
            pl.col("members") < _expected_members(trace.meta.distributed, len(members) + len(left_out))).select(
            "process_group", "instance").unique()
        incomplete = incomplete_keys.height
        n_steps = max(steps_per_member.get(candidate, 0), 1)
        # per step of a waiting rank: the others' steps counted each (a rank whose trace holds one step of three
        # waited in one: 224 ms over 7 rank-steps is 32 ms a step, not 24.9 over 3 ranks x 3 steps)
        marked = steps_of(events, waits, "member")  # a rank without steps of its own (its span one window): as before
        waiting_steps = [marked.get(m, 0) for m in members if m != candidate]
        rank_steps = (max(len(members) - 1, 1) * n_steps if compared is not None or not waiting_steps
                      or min(waiting_steps) == 0 else sum(waiting_steps))
        per_step_ns = round(caused_ns / rank_steps)
        lost_per_step_ns = round(stake_ns / rank_steps)
        capped = stake_ns < caused_ns  # the others' hosts ran on through part of the wait
        hidden_sentence = _hidden_sentence(stake_ns, share, lost_per_step_ns, label) if capped else ""
        hosts = _present_hosts(trace.meta, per) if label == "rank" else {}
        host_of = {rank: host for host, ranks in hosts.items() for rank in ranks}
        items = [{"rank": r["rank"], "device": r["device"], "last_count": r["last_count"],
                  "wait_caused_ns": r["wait_caused_ns"], "waited_ns": r["waited_ns"], "step_ns": r["step_ns"],
                  **({"host_held_ns": held.get(r["member"])} if capped else {}),
                  **({"host": host_of.get(r["rank"])} if len(hosts) > 1 else {})}
                 for r in per.iter_rows(named=True)]
        ranks = {_key(r["member"]): {**{k: r[k] for k in ("last_count", "wait_caused_ns", "waited_ns", "step_ns")},
                                     **({"host_held_ns": held[r["member"]]} if r["member"] in held else {})}
                 for r in per.sort("member", nulls_last=False).iter_rows(named=True)}
        who = f"{label} {candidate}"
        each = f"{label}s" if len(members) > 2 else label
        peers = _as_slow(per, candidate)
        stands_out = straggler is None and not bubble and _stands_out(per, share, t["warning_pct"], peers)
        also = peers if straggler is not None or stands_out else []
        if also:  # the straggler's peers first in the table, after it
            first = {candidate, *also}
            items = [i for i in items if _member_of(i, label) in first] + [
                i for i in items if _member_of(i, label) not in first]
        if blind and graded != "info":  # the hosts' calls, for kernels lost with the cut: no verdict
            title = f"Not graded: {who} most waited for on the hosts' calls"
            message = (f"{who} arrived last at {top['last_count']} of {n_instances} {noun}, and the other {each} "
                       f"waited for it {fmt_ns(caused_ns)} in all ({fmt_pct(share)} of their step time, "
                       f"{graded} by the figure), on their hosts' calls: not graded, as "
                       + ("ranks cut short lost the communication kernels that say"
                          if _lost_to_the_cut(events, waits, incomplete_ranks(trace.meta)) else
                          f"{listed(label, _kernelless(events, waits))} recorded no communication kernel, and "
                          "the kernels say") +
                       " when each GPU arrived, and a host runs ahead of its GPU, by any amount (the whole run's "
                       "GPUs can name another rank, or none).")
            suggestion = ""
        elif straggler is not None:
            names = _listed(label, [candidate, *also])
            title = f"Straggler: {who}" if not also else f"Stragglers: {names}"
            message = (f"{who} arrived last at {top['last_count']} of {n_instances} {noun}. The other "
                       f"{each} waited for it {fmt_ns(caused_ns)} in all (each wait counted once), " + (
                           f"{fmt_ns(per_step_ns)} per {label} per step." + hidden_sentence if capped else
                           f"{fmt_pct(share)} of their step time: {fmt_ns(per_step_ns)} per {label} per step."))
            if also:
                message += _as_slow_sentence(per, shared, candidate, also, label)
            message += _relayed_sentence(per, candidate, also, label)
            suggestion = (f"Find what {names} {'do' if also else 'does'} before {'their' if also else 'its'} "
                          f"{noun} that the others do not: uneven data (batch sizes, sequence lengths), a "
                          "slower input pipeline or host, extra work in hooks or logging on "
                          f"{'those ranks' if also else 'that rank'}, or a slower GPU or link.")
            if p2p:
                message += P2P_SENTENCE
                suggestion = P2P_SUGGESTION + suggestion
        elif bubble:
            title = "Pipeline bubble: every stage waits, none is slow"
            waited_each = "; ".join(f"{label} {r['member']} {fmt_ns(r['waited_ns'])} "
                                    f"({fmt_pct(expr.pct(r['waited_ns'], r['step_ns']) or 0)} of its step time)"
                                    for r in per.sort("member", nulls_last=False).iter_rows(named=True))
            among = (f"{n_instances} point-to-point transfers" if p2p else
                     f"{transfers} point-to-point transfers and {n_instances - transfers} collectives")
            message = (f"{len(members)} {label}s, {among}. Every {label} waits in its sends and receives"
                       f"{'' if p2p else ' and its collectives'}: {waited_each}. The most waited-for, {who}, "
                       f"waits itself {fmt_pct(expr.pct(top['waited_ns'], caused_ns) or 0)} as long as it makes "
                       "the others wait: no stage is much slower than the others, this is the pipeline's bubble (its stages "
                       "idle while it fills and drains: with p stages and m micro-batches a step, GPipe and 1F1B "
                       "leave each stage idle about (p - 1) / (m + p - 1) of it).")
            suggestion = ("Shrink the bubble: more micro-batches per step (smaller ones), or an interleaved "
                          "schedule (several stages a rank).")
        elif stands_out:  # under the line, but the one rank (or the few alike) the others wait for
            title = f"Most waited for: {_listed(label, [candidate, *also]) if also else who}, under the warning line"
            but = f" but {_listed(label, also)}" if also else ""
            message = (f"{who} arrived last at {top['last_count']} of {n_instances} {noun} and made the other "
                       f"{each} wait {fmt_ns(caused_ns)} " + (
                           f"({fmt_ns(per_step_ns)} per {label} per step), more than twice any other {label}{but}."
                           + hidden_sentence + f" That is under the {t['warning_pct']:g}% warning line."
                           if capped else
                           f"({fmt_pct(share)} of their step time, under the {t['warning_pct']:g}% warning line), "
                           f"more than twice any other {label}{but}.") +
                       f" A wait counts where the waiting {label}'s GPU computed nothing; a late {label} can cost "
                       "the others more where their communication, delayed behind the wait, no longer overlaps "
                       "their compute (critical-path weighs that).")
            if also:
                message += _as_slow_sentence(per, shared, candidate, also, label)
            suggestion = ""
        else:
            title = "No straggler"
            message = (f"{len(members)} {label}s, {n_instances} {noun}: no {label} stands out; the most "
                       f"waited-for, {who}, made the others wait {fmt_ns(caused_ns)} " + (
                           f"({fmt_ns(per_step_ns)} per {label} per step)." + hidden_sentence if capped else
                           f"({fmt_pct(share or 0)} of their step time)."))
            suggestion = ""
        by_host = _caused_by_host(per, hosts) if straggler is not None or title.startswith("Most waited") else []
        if len(by_host) > 1:
            message += _hosts_sentence(by_host)
        cut_short = incomplete_ranks(trace.meta) if label == "rank" else []
        absent = _absent_ranks(trace.meta.distributed, [*members, *left_out]) if label == "rank" else []
        if incomplete and absent:  # the run lacks ranks: a wait for them shows as nobody's
            shown = listed("rank", absent, shown=RANKS_NAMED)
            one = len(absent) == 1
            message += (f" {shown.capitalize()} {'is' if one else 'are'} missing from the run ({len(absent):,} of "
                        f"{trace.meta.distributed['world_size']:,} ranks), so {incomplete} {noun} lack "
                        f"{'it' if one else 'them'}: a wait for {'it' if one else 'them'} is counted as no "
                        f"{label}'s here, and shows as the others' communication kernels running long with none of "
                        "them late (comm-compute-overlap's exposed communication).")
        elif incomplete:
            message += _missing_sentence(events, calls, incomplete_keys, incomplete, label)
        if compared is not None:
            message += _compared_sentence(events, calls, candidate, n_steps, label)
        if left_out:
            message += _left_out_sentence(events, calls, left_out, label, cut_short)
        if cut_short := [r for r in cut_short if r not in left_out]:
            # a profiler killed mid-write: what the rest of the rules read of that rank is partial too
            said = ends_early(cut_short)
            message += (f" {said[0].upper()}{said[1:]}: {'its' if len(cut_short) == 1 else 'their'} collectives "
                        "after the cut are missing, and the figures cover what was read.")
        cut = calls.select("process_group", "instance").unique().height - n_instances
        if cut > 0:  # left out of the device's arrivals (measures.comm._cut_at_the_end)
            message += (f" {cut} more {noun[:-1] if cut == 1 else noun} at the trace's end "
                        f"{'is' if cut == 1 else 'are'} left out: the profiler stopped before "
                        f"{'its' if cut == 1 else 'their'} kernels ran.")
        message += _host_arrivals_sentence(events, waits, label, noun, cut_short)
        stride = _median_step(step, steps_per_member)
        if t["align_clocks"]:
            message += " Clocks aligned on collective end times."
        elif (apart := _clocks_apart(events)) > CLOCKS_APART_NS and apart > stride > 0:
            # further apart than a step: not a rank late at its collectives; whatever the verdict, it is unfounded
            one_host = _one_host(trace.meta, members) if label == "rank" else None
            message += (f" The {label}s' collectives end up to {fmt_ns(apart)} apart (the median over the "
                        f"collectives), more than a step ({fmt_ns(stride)}), though {label}s leave a collective "
                        "together: " + (f"every {label} ran on {one_host}, on one clock, so these traces are of "
                                        "different runs, and no wait here compares the same collectives."
                                        if one_host is not None else
                                        "these traces are of different runs, or their clocks differ by that much, "
                                        "and no wait here compares the same collectives; if the clocks differ, "
                                        + spelled("--set stragglers.align_clocks=true",
                                                  'settings={"stragglers": {"align_clocks": True}}')
                                        + " aligns them on the collectives' ends."))
        elif apart > CLOCKS_APART_NS and straggler is not None and cut_short:
            message += (f" The {label}s' collectives end up to {fmt_ns(apart)} apart (the median over the "
                        f"collectives): with a {label}'s trace cut short that may be its collectives paired with "
                        "others' after the cut, not its clock.")
        elif apart > CLOCKS_APART_NS and straggler is not None:
            one_host = _one_host(trace.meta, members) if label == "rank" else None
            if one_host is not None:  # one machine, one clock: the gap is not the clocks'
                message += (f" The {label}s' collectives end up to {fmt_ns(apart)} apart (the median over the "
                            f"collectives), though every {label} ran on {one_host}, on one clock: the waits are "
                            "not a difference of clocks, but some ranks left their collectives late (their threads "
                            "descheduled, as where more ranks than cores run on one machine).")
            else:
                several = (f"they ran on {len(hosts)} hosts" if len(hosts) > 1 else "several hosts")
                message += (f" The {label}s' collectives end up to {fmt_ns(apart)} apart (the median over the "
                            f"collectives), which {label}s on one clock cannot do, as they leave a collective "
                            f"together: their clocks likely differ ({several}), and the waits may be that "
                            "difference; " + spelled("--set stragglers.align_clocks=true",
                                                     'settings={"stragglers": {"align_clocks": True}}')
                            + " aligns them on the collectives' ends.")
        excess = {"slow_rank_host": [], "slow_rank_gpu": []}
        named = straggler if straggler is not None else (candidate if title.startswith("Most waited") else None)
        # a rank left out (its GPU's arrivals lost) may still be the one the others wait for: its calls started on
        # its host after their kernels had started, and its kernels could start no earlier
        late = (_late_on_host(calls, waits, left_out, windows, busy, waited)
                if left_out and label == "rank" and not blind else None)
        if late is not None:
            late_rank, late_count, late_ns = late
            late_share = expr.pct(late_ns, exact_sum(per["step_ns"]))  # of the compared ranks' step time
            counted = [marked.get(m, 0) for m in members]  # the compared ranks' own steps, as a wait per step is
            late_step_ns = round(late_ns / (sum(counted) if min(counted, default=0) > 0
                                            else len(members) * max(max(steps_per_member.values(), default=1), 1)))
            if (late_share or 0) >= t["warning_pct"] and (straggler is None or late_share > (share or 0)):
                severity = grade(late_share, warning=t["warning_pct"], critical=t["critical_pct"])
                straggler, named, who = late_rank, None, f"{label} {late_rank}"
                title = f"Straggler: {who}"
                message = (f"{who.capitalize()}'s arrivals on its GPU are not recorded, but its calls started on its "
                           f"host after every other {label}'s kernel of the collective had started, at "
                           f"{late_count} of {n_instances} {noun}: its kernels could start no earlier, so the other "
                           f"{label}s waited at least {fmt_ns(late_ns)} for it in all (each wait counted once, where "
                           f"their GPUs computed nothing), {fmt_pct(late_share)} of their step time: at least "
                           f"{fmt_ns(late_step_ns)} per {label} per step. Among the others: "
                           + message)
                suggestion = (f"Start with {who}: what it does before its collectives that the others do not "
                              "(uneven data, a slower input pipeline or host, hooks or logging), and profile it "
                              "again with its GPU activities recorded to see its GPU's own part.")
                late_summary = ("straggler", f"{who}: the others wait at least {fmt_ns(late_step_ns)} per step for "
                                             f"it ({fmt_pct(late_share)} of their step time; from its host's calls)")
                caused_ns = stake_ns = late_ns
                per_step_ns = lost_per_step_ns = late_step_ns
                share, capped = late_share, False
            else:
                late = None
        if named is not None and label == "rank":
            floor = t["min_excess_pct"] / 100 * step.get(candidate, 0) / n_steps
            excess = slow_rank_excess(events, waits, named, int(t["top_excess"]), floor)
            message += _excess_sentence(who, excess, floor, per_step_ns, t["min_excess_pct"])
            if not _has_operators(events, waits, named):
                message += (f" The trace of {who} has no operators (recorded or trimmed without them): only "
                            "annotations and GPU work could be compared, not the host's work between them.")
            lead = max(excess["slow_rank_host"] + excess["slow_rank_gpu"],
                       key=lambda r: r["slow_ns"] - r["median_ns"], default=None)
            if lead is not None and _explains(lead, per_step_ns) >= EXPLAINS_PCT:
                suggestion = (f"Start with {lead['name']} on {who}: {fmt_ns(lead['slow_ns'])} a step against "
                              f"{fmt_ns(lead['median_ns'])} on the median rank. " + suggestion)
            elif (gpu_more := _gpu_excess_ns(excess)) and straggler is not None and (
                    100.0 * gpu_more >= EXPLAINS_PCT * per_step_ns):  # no one kernel, but its GPU work together
                kernels = len(excess["slow_rank_gpu"])
                suggestion = (f"{who}'s GPU work explains the wait: the {kernels} kernels of largest excess "
                              f"take {fmt_ns(gpu_more)} a step more there than on the median rank "
                              f"({_wait_part(gpu_more, per_step_ns)}), led by "
                              f"{lead['name']}: {who} has more work to do than the others. " + suggestion)
            elif lead is not None and straggler is not None:  # a lead that is no cause is not where to start
                suggestion = (f"What the trace records on {who} explains little of the wait (its largest excess, "
                              f"{lead['name']}, is {fmt_pct(_explains(lead, per_step_ns))} of it): look at what "
                              f"{who} does that the trace does not show, time between its operators (data "
                              "loading, hooks, I/O, a sleep), with record_function ranges or a host profiler. "
                              + suggestion)
        whole_host = _whole_host_slow(per, by_host) if len(by_host) > 1 else None
        if whole_host is not None:  # said first: where to look before which operator
            suggestion = (f"Every rank on {whole_host} made the others wait longer than any rank elsewhere: the host "
                          f"is slow, not one rank; look at {whole_host} itself (other jobs on it, its input pipeline "
                          "and storage, its GPUs' clocks and its network link) first. " + suggestion)
        summary = (("straggler", f"{who}{f' (as slow: {_listed(label, also)})' if also else ''}: the others "
                                 f"wait {fmt_ns(per_step_ns)} per step for it " + (
                                     f"on their GPUs, at most {fmt_ns(lost_per_step_ns)} of it in their steps "
                                     f"({fmt_pct(share)} of their step time)" if capped else
                                     f"({fmt_pct(share)} of their step time)")
                                 + (f"; every rank of {whole_host} is slow" if whole_host else ""))
                   if straggler is not None else None)
        if late is not None:  # the straggler known from its host's calls alone
            summary = late_summary
        return [Finding(self.name, severity, title, message, suggestion,
                        metrics={"straggler_rank": straggler, "collectives": n_instances,
                                 "wait_caused_ns": caused_ns, "wait_caused_per_step_ns": per_step_ns,
                                 "step_time_at_stake_ns": stake_ns, "step_time_lost_per_step_ns": lost_per_step_ns,
                                 "others_step_ns": others_step, "step_time_lost_pct": share,
                                 "incomplete_collectives": incomplete, "cut_collectives": max(cut, 0),
                                 "members": label, "clock": clock,
                                 "ranks": ranks, "as_slow": [_key(m) for m in also], **excess,
                                 **({"hosts": {h: {"ranks": r, "wait_caused_ns": c} for h, r, c in by_host}}
                                    if len(by_host) > 1 else {})},
                        items=items, items_title=ITEMS_TITLE,
                        columns=[c for c in COLUMNS if (c.key != "device" or per["device"].is_not_null().any())
                                 and (c.key != "host" or len(hosts) > 1) and (c.key != "host_held_ns" or capped)],
                        figures=FIGURES, **(_bubble_impact(per, members, label) if bubble else
                                            dict(impact_ns=None) if blind and graded != "info" else
                                            dict(impact_ns=round(late[2] / (len(members) + len(left_out))))
                                            if late is not None else dict(
                            impact_ns=round(stake_ns / len(members)),
                            impact_range=_caused_range(caused_on.get(candidate, {}), members, per, label))),
                        summary=summary)]


def _compared_windows(windows: dict, waits: pl.DataFrame, candidate) -> dict | None:
    """The members' step windows (``{member: [(start, end)]}``) that lie in the time the ``candidate``'s own trace
    covers, more than half of each, on the waits' clock; None where every window does (the ranks profiled the
    same steps, the common case) or where a member has none there (clocks apart, not fewer steps). A member
    waits for the candidate only while the candidate's trace runs: the others' steps outside it are no step time
    its lateness could take."""
    offsets = dict(waits.select("member", pl.col("offset_ns").fill_null(0)).unique("member").iter_rows())
    own = windows.get(candidate) or []
    if not own:
        return None
    shift = offsets.get(candidate, 0)
    lo, hi = min(a for a, _ in own) - shift, max(e for _, e in own) - shift
    kept, dropped = {}, False
    for member, spans in windows.items():
        shift = offsets.get(member, 0)
        kept[member] = [(a, e) for a, e in spans if 2 * (min(e - shift, hi) - max(a - shift, lo)) > e - a]
        dropped = dropped or len(kept[member]) < len(spans)
    # a member with no window in that time: the clocks differ (or the traces are of other runs), not the steps
    whole = all(kept[m] for m in kept if m != candidate)
    return kept if dropped and whole else None


def _compared_sentence(events, calls: pl.DataFrame, candidate, n_steps: int, label: str) -> str:
    """`` Rank 2's trace holds ProfilerStep#3, the others' #2 to #4: the others' time is compared in the step its
    trace covers.`` (:func:`_compared_windows`): the share and the waits per step are of that time."""
    steps = calls_steps(calls, events).filter(pl.col("step").is_not_null() & pl.col("member").is_not_null())
    own = steps.filter(pl.col("member") == candidate)["step"]
    theirs = steps.filter(pl.col("member") != candidate)["step"]
    who = f"{label} {candidate}".capitalize()
    held = (f" holds {_steps_said(own.min(), own.max())}, the others' {_steps_said(theirs.min(), theirs.max()).removeprefix('ProfilerStep')}"
            if own.len() and theirs.len() else " covers part of the others' steps")
    return (f" {who}'s trace{held}: the others' time is compared in the "
            + ("step" if n_steps == 1 else f"{n_steps:,} steps") + " its trace covers.")


def _hidden_sentence(stake_ns: int, share: float | None, lost_per_step_ns: int, label: str) -> str:
    """What of the others' device waits could have lengthened their steps, where their hosts waited for their GPUs
    less than their GPUs waited (:func:`~traceparse.measures.host_held.host_held`): the rest passed while the
    hosts ran their own work."""
    return (f" Their steps could be shorter by at most {fmt_ns(stake_ns)} of it ({fmt_pct(share or 0)} of their "
            f"step time, {fmt_ns(lost_per_step_ns)} per {label} per step): no longer than that did their hosts wait "
            "for their GPUs (in blocking and collective calls, and with GPU work running past a step's end); the "
            "rest of the wait passed while their hosts ran their own work.")


def _present_hosts(meta, per: pl.DataFrame) -> dict[str, list[int]]:
    """{host: its ranks among the members} of a run whose traces name their hosts (:func:`ranks_by_host`)."""
    present = set(per["rank"].drop_nulls().to_list())
    hosts = {h: [r for r in ranks if r in present] for h, ranks in ranks_by_host(meta).items()}
    return {h: ranks for h, ranks in hosts.items() if ranks}


def _one_host(meta, members: list) -> str | None:
    """The one host every member (rank) ran on, where every member's trace names it; else None."""
    hosts = ranks_by_host(meta)
    named = {r for ranks in hosts.values() for r in ranks}
    if len(hosts) == 1 and all(m in named for m in members):
        return next(iter(hosts))
    return None


def _caused_by_host(per: pl.DataFrame, hosts: dict[str, list[int]]) -> list[tuple[str, list[int], int]]:
    """(host, its ranks, the wait they caused the others) per host, most caused first (then host order)."""
    caused = dict(zip(per["rank"].to_list(), per["wait_caused_ns"].to_list()))
    rows = [(h, ranks, sum(int(caused.get(r) or 0) for r in ranks)) for h, ranks in hosts.items()]
    return sorted(rows, key=lambda row: -row[2])


def _hosts_sentence(by_host: list[tuple[str, list[int], int]]) -> str:
    """The waits the ranks caused, summed by host: each host's ranks, time and share of all the waits caused."""
    total = sum(c for _, _, c in by_host)
    shares = shares_shown([100.0 * c / total for _, _, c in by_host]) if total else [0.0] * len(by_host)
    parts = [f"{h} (rank{'s' if len(r) > 1 else ''} {rank_ranges(r)}) {fmt_ns(c)}"
             + (f", {share:.1f}%" if total else "")
             for (h, r, c), share in zip(by_host[:HOSTS_NAMED], shares)]
    rest = by_host[HOSTS_NAMED:]
    if rest:
        parts.append(f"{len(rest):,} more hosts {fmt_ns(sum(c for _, _, c in rest))}"
                     + (f", {sum(shares[HOSTS_NAMED:]):.1f}%" if total else ""))
    return f" The ranks ran on {len(by_host)} hosts; the waits they caused, by host: " + "; ".join(parts) + "."


def _whole_host_slow(per: pl.DataFrame, by_host: list[tuple[str, list[int], int]]) -> str | None:
    """The host of two ranks or more each of which made the others wait longer than any rank of another host did
    (the host, not one rank, is slow); else None."""
    caused = dict(zip(per["rank"].to_list(), per["wait_caused_ns"].to_list()))
    for host, ranks, _ in by_host:
        elsewhere = [int(caused.get(r) or 0) for h, rs, _ in by_host if h != host for r in rs]
        if len(ranks) > 1 and elsewhere and min(int(caused.get(r) or 0) for r in ranks) > max(elsewhere):
            return host
    return None


def _missing_sentence(events, calls: pl.DataFrame, keys: pl.DataFrame, count: int, label: str) -> str:
    """`` 126 collectives are missing on some ranks: rank 3 lacks 63; ranks 0, 1 and 2 lack 63 each.`` and, for a
    member that shares no collective with any other, in which steps its calls are against the others' (a rank
    profiled at other steps: ProfilerStep#12-14 against #2-4, compared with no one). ``keys``: the incomplete
    instances (``process_group``, ``instance``); ``calls``: :func:`~traceparse.measures.comm.collectives`."""
    key = ["process_group", "instance"]
    calls = calls.filter(pl.col("member").is_not_null())
    present = calls.select(*key, "member").unique()
    expected = keys.join(present.select("process_group", "member").unique(), on="process_group", how="inner",
                         nulls_equal=True)
    lacking = expected.join(present, on=[*key, "member"], how="anti", nulls_equal=True)
    by_count: dict[int, list] = {}
    for member, n in lacking.group_by("member").agg(n=pl.len()).sort("member").iter_rows():
        by_count.setdefault(n, []).append(member)
    parts = [f"{listed(label, who, shown=RANKS_NAMED)} lack{'s' if len(who) == 1 else ''} {n:,}"
             + ("" if len(who) == 1 else " each")
             for n, who in sorted(by_count.items(), key=lambda kv: (-kv[0], kv[1]))]
    said = f" {count:,} collectives are missing on some {label}s" + (f": {'; '.join(parts)}." if parts else ".")
    shared = present.group_by(key).agg(n=pl.len()).filter(pl.col("n") > 1)
    alone = sorted(set(present["member"].unique().to_list())
                   - set(present.join(shared, on=key, how="semi", nulls_equal=True)["member"].unique().to_list()))
    if not alone or len(alone) == present["member"].n_unique():
        return said
    steps = (calls_steps(calls, events).filter(pl.col("step").is_not_null())
             .group_by(pl.col("member").is_in(alone).alias("alone"))
             .agg(first=pl.col("step").min(), last=pl.col("step").max()))
    span = {a: (f, l) for a, f, l in steps.iter_rows()}
    one = len(alone) == 1
    said += (f" {listed(label, alone, shown=RANKS_NAMED).capitalize()} took part in none of the others' "
             "collectives")
    if True in span and False in span:
        (f1, l1), (f2, l2) = span[True], span[False]
        said += (f": {'its' if one else 'their'} calls are in {_steps_said(f1, l1)}, the others' in "
                 f"{_steps_said(f2, l2)}, so the traces were profiled at different steps")
    else:
        said += ": the traces were profiled at different times, or numbered the collectives apart"
    return said + f", and {'it is' if one else 'they are'} compared with no {label} (no wait either way)."


def _steps_said(first: int, last: int) -> str:
    """``ProfilerStep#12 to #14`` (``#12`` for one step)."""
    return f"ProfilerStep#{first}" + (f" to #{last}" if last != first else "")


def _with_left_out(waits: pl.DataFrame, calls: pl.DataFrame, left_out: list) -> pl.DataFrame:
    """``waits`` with each instance's ``members`` counting the ``left_out`` members that called it (they took part;
    only their arrivals are unknown: :func:`~traceparse.measures.comm.arrivals_unknown`)."""
    if not left_out:
        return waits
    key = ["process_group", "instance"]
    extra = calls.filter(pl.col("member").is_in(left_out)).group_by(key).agg(_extra=pl.len().cast(pl.Int64))
    return (waits.join(extra, on=key, how="left", nulls_equal=True)
            .with_columns(members=pl.col("members") + pl.col("_extra").fill_null(0)).drop("_extra"))


def _left_out_sentence(events, calls: pl.DataFrame, left_out: list, label: str, cut_short: list) -> str:
    """What the comparison leaves out and why: the ``left_out`` members (arrivals unknown), each with its calls and
    communication kernels, and the reason where it is known: their trace ends early (``cut_short``)."""
    kernels = dict(picked(events, comm_kernels() & pl.col("rank").is_not_null(), "rank").group_by("rank")
                   .agg(kernels=pl.len()).iter_rows())
    called = dict(calls.filter(pl.col("member").is_in(left_out)).group_by("member").agg(n=pl.len()).iter_rows())
    one = len(left_out) == 1
    counts = "; ".join(("" if one else f"{label} {m}: ") + f"{fmt_count(kernels.get(m, 0), 'kernel')} for "
                       f"{fmt_count(called.get(m, 0), 'call')}" for m in left_out[:RANKS_NAMED])
    more = f"; {len(left_out) - RANKS_NAMED} more {label}s" if len(left_out) > RANKS_NAMED else ""
    its = "its" if one else "their"
    cut = [m for m in left_out if m in cut_short]
    why = ("; its trace ends early (cut short)" if one and cut else f"; {ends_early(cut)}" if cut else "")
    return (f" {listed(label, left_out, shown=RANKS_NAMED).capitalize()} {'has' if one else 'have'} fewer "
            f"communication kernels than collective calls ({counts}{more}{why}): which call each kernel ran for "
            f"cannot be told, so {its} arrivals on the GPU are unknown; {'it is' if one else 'they are'} left out, "
            f"and the other {label}s are compared on their kernels' starts.")


def _absent_ranks(distributed: dict, present: list) -> list[int]:
    """The ranks below the run's world size that are not ``present`` (its rank files lack them), in order; [] where
    no world size is known. The run checked the world size against its files (never an absurd one)."""
    world = distributed.get("world_size")
    if not isinstance(world, int) or world <= len(present):
        return []
    have = {m for m in present if m is not None}
    return [r for r in range(world) if r not in have]


def _expected_members(distributed: dict, present: int) -> pl.Expr:
    """How many members each collective instance should have: its process group's size where the run names the
    group (``process_groups``), the world size for a collective of no group (the default group's), else (a group
    the run does not describe) the most members any of its instances has; a point-to-point transfer between two
    ranks (its group names them: ``0 1↔2``), two. A run missing a rank lacks it at every collective of its
    groups: counted against the members present, none was incomplete."""
    sizes = {str(g["name"]): int(g["size"]) for g in distributed.get("process_groups") or []
             if g.get("name") is not None and isinstance(g.get("size"), int)}
    world = distributed.get("world_size")
    default = max(int(world), present) if isinstance(world, int) else present
    seen = pl.col("members").max().over("process_group").cast(pl.Int64)
    named = pl.col("process_group").cast(pl.String).replace_strict(sizes, default=None, return_dtype=pl.Int64) \
        .fill_null(seen) if sizes else seen
    return (pl.when(paired_transfer()).then(pl.lit(2, dtype=pl.Int64))
            .when(pl.col("process_group").is_null()).then(pl.lit(default, dtype=pl.Int64)).otherwise(named))


def _stands_out(per: pl.DataFrame, share: float | None, warning_pct: float, peers: list = ()) -> bool:
    """Whether the most waited-for member, under the warning line, still stands out: it costs the others at least
    half the warning line's share of their step time, and makes them wait more than twice as long as any other
    member but its ``peers`` (those as slow as it, :func:`_as_slow`: two slow ranks share the waits they cause)."""
    if share is None or share < warning_pct / 2 or per.height < 2:
        return False
    rest = per.slice(1).filter(~pl.col("member").is_in(list(peers)).fill_null(False))["wait_caused_ns"]
    return rest.len() == 0 or per["wait_caused_ns"][0] > 2 * rest.max()


def _bubble_impact(per: pl.DataFrame, members: list, label: str) -> dict:
    """``impact_ns`` and ``impact_range`` of a pipeline's bubble: what every stage waits (its own waits, a mean over
    the members), not what the most waited-for stage makes the others wait (that stage's own waits counted 0 ns:
    a balanced pipeline's bottleneck line read "0 ns on rank 1" for a stage waiting 12.9 ms)."""
    waited = dict(zip(per["member"].to_list(), per["waited_ns"].to_list()))
    parts = _member_parts(waited, members, per, label)
    return {"impact_ns": round(sum(ns for ns, _ in parts) / len(members)), "impact_range": impact_range(parts, label)}


def _caused(shared: pl.DataFrame, windows: dict, busy: pl.DataFrame) -> tuple[dict, dict]:
    """The wait each member causes (``{last member: ns}``) and on whom (``{last member: {waiting member: ns}}``):
    each moment a member waited goes to one instance, the one it was waiting at first
    (:func:`~traceparse.measures.comm.waiting_by_instance`), and so to that instance's last member. What the members
    caused adds up to what the others waited. Counted as a union per causing member, a moment in which a rank
    waited at two collectives in flight went to both of their last members: on a Megatron run of 8 ranks, the two
    slow ranks "caused" 70.0% and 59.5% of the others' step time, where the others waited 3.93 s and the ranks
    caused 6.22 s."""
    pieces = waiting_by_instance(shared, windows, busy)
    key = ["process_group", "instance"]
    last = shared.select(*key, "last_member").unique(subset=key)
    pieces = (pieces.join(last, on=key, how="left", nulls_equal=True)
              .filter(pl.col("member").ne_missing(pl.col("last_member")) & (pl.col("waited_ns") > 0)))
    caused, caused_on = {}, {}
    for member, causer, ns in (pieces.group_by("member", "last_member").agg(pl.col("waited_ns").sum())
                               .sort("last_member", "member", nulls_last=True).iter_rows()):
        caused[causer] = caused.get(causer, 0) + int(ns)
        caused_on.setdefault(causer, {})[member] = int(ns)
    return caused, caused_on


def _caused_range(on: dict, members: list, per: pl.DataFrame, label: str) -> dict | None:
    """:attr:`~traceparse.rule.Finding.impact_range` of the wait the straggler causes, whose mean over the members
    is the time at stake: the least (the straggler's own, nothing) and the most one member waited for it."""
    return impact_range(_member_parts(on, members, per, label), label)


def _member_parts(ns_of: dict, members: list, per: pl.DataFrame, label: str) -> list[tuple[int, str]]:
    """(ns, name) of each member, its ns from ``ns_of`` (0 where absent), named "rank N" where the members are
    ranks, else by their label and key: the parts of an :func:`~traceparse.run.impact_range`."""
    rank_of = dict(zip(per["member"].to_list(), per["rank"].to_list()))

    def name(member) -> str:
        rank = rank_of.get(member)
        return f"rank {rank}" if label == "rank" and rank is not None else f"{label} {_key(member)}"

    return [(int(ns_of.get(m, 0) or 0), name(m)) for m in members]


#: A member that waits less than this fraction of the median other member's share of its step time, where the
#: others wait, is the one they all wait for, directly or through one another (:func:`_busiest_first`).
LONE_FRACTION = 0.5


def _busiest_first(per: pl.DataFrame, warning_pct: float) -> pl.DataFrame:
    """``per`` (most wait caused first) with the member that barely waits first, where the others wait at least
    ``warning_pct`` of their step time (the median other member) and one member waits under
    :data:`LONE_FRACTION` of that and makes them wait: it runs while they wait for it, some of them through
    another member.

    Why: the wait a member causes is counted at the instances it is last to, so along a chain the member in
    the middle collects it. On a real DP2 × PP4 job over gloo whose rank 7 (the last stage of the second
    pipeline) runs its layers three times over, ranks 5 and 6 (the stages before it, late because they waited
    for its gradients) made the others wait most, 2.74 s each against rank 7's 2.27; each waited itself 75% of
    its steps, so the finding read as the pipeline's bubble, "none is slow". Rank 7 waited 17% of its steps, every
    other rank 71-78%. Of several such members, the least waiting (then the most causing). Otherwise unchanged: a
    balanced job's ranks, whose few milliseconds of waits differ by chance, keep the most waited-for first."""
    share = {r["member"]: r["waited_ns"] / r["step_ns"] for r in per.iter_rows(named=True) if r["step_ns"]}
    caused = dict(zip(per["member"].to_list(), per["wait_caused_ns"].to_list()))
    if len(share) < 3:  # two members: the last arrival is the one the other waits for
        return per
    lone = []
    for member, mine in share.items():
        median = statistics.median(v for m, v in share.items() if m != member)
        if caused.get(member) and median >= warning_pct / 100 and mine < LONE_FRACTION * median:
            lone.append((mine, -caused[member], member))
    if not lone:
        return per
    first = min(lone, key=lambda x: (x[0], x[1]))[2]
    key = pl.col("member").fill_null(-1) == (-1 if first is None else first)
    return pl.concat([per.filter(key), per.filter(~key)])


def _relayed_sentence(per: pl.DataFrame, candidate, also: list, label: str) -> str:
    """Where members the table lists made the others wait longer than the straggler ``candidate`` (put first by
    :func:`_busiest_first`), why they are not named: they waited themselves most of their steps, late because they
    waited (a pipeline's stages before the slow one). Else ""."""
    top = per.filter(pl.col("member") == candidate)
    if top.height == 0:
        return ""
    caused = int(top["wait_caused_ns"][0])
    more = per.filter((pl.col("wait_caused_ns") > caused) & ~pl.col("member").is_in([candidate, *also]))
    if more.height == 0:
        return ""
    more = more.sort(["wait_caused_ns", "member"], descending=[True, False])
    one = more.height == 1
    shown = more.head(RANKS_NAMED)
    own = fmt_pct(expr.pct(int(top["waited_ns"][0]), int(top["step_ns"][0])) or 0)
    waited = _and([fmt_pct(expr.pct(w, st) or 0) for w, st in zip(shown["waited_ns"], shown["step_ns"])])
    caused_said = _and([fmt_ns(ns) for ns in shown["wait_caused_ns"]])
    return (f" {listed(label, shown['member'].to_list(), shown=RANKS_NAMED).capitalize()} made the others wait "
            f"longer ({caused_said}{'' if one else ' in all'}) but {'was' if one else 'were'} late because "
            f"{'it' if one else 'they'} waited: {waited} of {'its' if one else 'their'} step time waiting, where "
            f"{label} {candidate} waited {own} of its own (a chain of waits, as a pipeline's earlier stages "
            "wait for a slow later one).")


def _as_slow(per: pl.DataFrame, candidate) -> list:
    """The other members as slow as the straggler ``candidate``: those that, like it, spent almost none of their
    steps waiting (:data:`AS_SLOW_FRACTION`), while the others wait for both. Of two ranks sleeping alike, one
    arrives last everywhere and causes every wait; the other, a hair earlier, causes none but is no faster."""
    share = {r["member"]: r["waited_ns"] / r["step_ns"] for r in per.iter_rows(named=True) if r["step_ns"]}
    if candidate not in share or len(share) < 3:
        return []
    low, high = share[candidate], max(share.values())
    if high <= low:
        return []
    line = low + AS_SLOW_FRACTION * (high - low)
    return sorted((m for m, v in share.items() if m != candidate and v <= line), key=lambda m: (m is None, m or 0))


def _as_slow_sentence(per: pl.DataFrame, shared: pl.DataFrame, candidate, also: list, label: str) -> str:
    """What the members as slow as the straggler waited, against the median member, and how close behind the
    straggler they arrived."""
    waited = dict(zip(per["member"].to_list(), per["waited_ns"].to_list()))
    others = sorted(v for m, v in waited.items() if m != candidate and m not in also)
    median = others[len(others) // 2] if others else 0
    gaps = shared.filter(pl.col("member").is_in(also) & (pl.col("last_member") == candidate))["wait_ns"]
    ahead = int(gaps.median()) if gaps.len() else None
    gap = ("" if ahead is None else f", arriving with {label} {_key(candidate)}" if ahead == 0
           else f", arriving a median {fmt_ns(ahead)} before {label} {_key(candidate)}")
    most = max(waited[m] for m in also)
    one = len(also) == 1
    return (f" {_listed(label, also).capitalize()} {'is' if one else 'are'} as slow: "
            f"{'it' if one else 'each'} waited {'' if one else 'at most '}{fmt_ns(most)} in all where the median "
            f"other {label} waited {fmt_ns(median)}{gap}; the others wait for {'both' if one else 'all of them'}.")


def _listed(label: str, members: list) -> str:
    """``rank 7``, ``ranks 7 and 3``: members by their keys (:func:`~traceparse.figures.listed`)."""
    return listed(label, [_key(m) for m in members])


def _member_of(item: dict, label: str):
    """The member an item row is of: its rank, or its device where members are devices."""
    return item["rank"] if label == "rank" else item["device"] if label == "device" else None


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _median_step(step: dict, steps: dict) -> int:
    """The members' median step time: each member's time in its steps (``step``) over its number of steps
    (``steps``); 0 where none is known."""
    per = [ns / steps[m] for m, ns in step.items() if steps.get(m)]
    return round(statistics.median(per)) if per else 0


def _clocks_apart(events) -> int:
    """How far apart the members' clocks are, from their collectives' ends (:func:`~traceparse.measures.comm.
    clock_offsets`, the median over the collectives of each member's end against the first's): the spread."""
    offsets = measures.collective_waits(events, align_clocks=True).group_by("member").agg(
        pl.col("offset_ns").first())["offset_ns"].drop_nulls()
    return int(offsets.max() - offsets.min()) if offsets.len() > 1 else 0


def _key(member) -> str:
    return "-" if member is None else str(member)


def slow_rank_excess(events, waits: pl.DataFrame, rank: int, top: int, floor: float = 0) -> dict[str, list[dict]]:
    """What the straggler ``rank`` does longer than the median rank, per step (:data:`measures.step_time_by_name`).

    Per name (host operators and annotations by self time; kernels, copies and memsets by duration; neither
    communication nor step annotations, whose time is waiting), its time per step on each rank (0 on a rank
    without it) and the median over the ranks (of an even number, the lower middle rank's: of two ranks, the
    other one, not their mean); ``slow_rank_host`` and ``slow_rank_gpu`` are the ``top`` names
    whose time on ``rank`` exceeds the median most, by at least ``floor`` ns a step: ``kind``, ``name``,
    ``slow_ns``, ``median_ns`` (per step), ``excess_ns`` = the difference.
    """
    traces = dict(waits.select("trace_id", "rank").unique().iter_rows())
    slow_trace = next((tr for tr, r in traces.items() if r == rank), None)
    if slow_trace is None:
        return {"slow_rank_host": [], "slow_rank_gpu": []}
    step_names = picked(events, is_step_annotation(events), "name")["name"].drop_nulls().unique().implode()
    waiting = pl.col("name").is_in(step_names) | expr.collective(pl.col("name").fill_null("")).is_not_null()
    table = measures.step_time_by_name(events).filter(~waiting)
    rows = [{"kind": kind, "name": name, "slow_ns": round(slow), "median_ns": round(median),
             "excess_ns": round(slow) - round(median)}
            for tr, kind, name, slow, median in over_median(table, traces)
            if tr == slow_trace and slow > median and round(slow) - round(median) >= floor]
    rows.sort(key=lambda r: (-r["excess_ns"], r["kind"], r["name"]))
    gpu = [r for r in rows if r["kind"] in expr.GPU_KINDS]
    host = [r for r in rows if r["kind"] not in expr.GPU_KINDS and r["kind"] != "api"]
    return {"slow_rank_host": host[:top], "slow_rank_gpu": gpu[:top]}


def _has_operators(events, waits: pl.DataFrame, rank: int) -> bool:
    """True when the rank's trace holds operators other than collective calls (a trimmed trace has none)."""
    traces = [tr for tr, r in waits.select("trace_id", "rank").unique().iter_rows() if r == rank]
    ops = (pl.col("trace_id").is_in(traces) & expr.kind_is("op")
           & expr.collective(pl.col("name").fill_null("")).is_null() & (pl.col("name") != "record_param_comms"))
    return bool(events.select(ops.any()).item())


#: A longer part of the straggler that explains less than this share of the wait per step is no place to start.
EXPLAINS_PCT = 50.0

#: Said of a straggler whose waits are all point-to-point (sends and receives: a pipeline's stages).
P2P_SENTENCE = (" These are point-to-point transfers (sends and receives, as between a pipeline's stages): a "
                "rank waits in its receive (or its send) until its peer gets there, so a stage slower than the "
                "others makes them wait; with even stages what remains is the schedule's own bubble (the "
                "pipeline filling and draining).")
#: What to do first about a slow pipeline stage.
P2P_SUGGESTION = ("Even out the pipeline's stages (fewer layers on the slow stage, or more on the others), then "
                  "shrink the bubble: more micro-batches per step, or a 1F1B or interleaved schedule. ")


def _host_arrivals_sentence(events, waits: pl.DataFrame, label: str, noun: str, cut_short: list = ()) -> str:
    """Where the arrivals are the calls' host starts though the members ran communication kernels (their calls and
    kernels did not pair one to one: :func:`~traceparse.measures.comm.completions`), a sentence that says so, with
    each count, and why: ``cut_short`` ranks (their trace ends early: the kernels after the cut are missing), else
    calls batched into one kernel; else ""."""
    differ = _unpaired(events, waits)
    if differ.height == 0:
        return ""
    shown = "; ".join(f"{label} {r} {c} calls, {k} kernels" for r, c, k in differ.head(RANKS_NAMED).iter_rows())
    more = f" and {differ.height - RANKS_NAMED} more {label}s" if differ.height > RANKS_NAMED else ""
    cut = sorted(set(cut_short) & set(differ["rank"].to_list()))
    none = differ.filter(pl.col("kernels") == 0)["rank"].to_list()
    why = (f"{ends_early(cut)}: the GPU work after the cut is missing" if cut
           else f"{listed(label, none)} recorded no communication kernel at all (its GPU's activities not "
                "recorded), and one rank's kernels alone compare with nothing" if none and len(none) == differ.height
           else "calls batched together, as batch_isend_irecv does, run as one kernel")
    return (f" The arrivals are the calls' starts on the host, not their kernels' on the GPU: the {noun}' calls "
            f"and communication kernels do not pair one to one ({shown}{more}; {why}), and a host that runs ahead "
            "of its GPU makes these waits the hosts', which can be far from the GPUs' (the kernels' time is in "
            "comm-compute-overlap).")


def _unpaired(events, waits: pl.DataFrame) -> pl.DataFrame:
    """Where the arrivals are the calls' host starts though the members ran communication kernels, the ranks whose
    calls and kernels differ in number (``rank``, ``calls``, ``kernels``), in rank order; else an empty frame."""
    none = pl.DataFrame(schema={"rank": pl.Int32, "calls": pl.UInt32, "kernels": pl.UInt32})
    if waits.height == 0 or not bool((waits["arrival"] == "host").all()):
        return none
    kernels = picked(events, comm_kernels() & pl.col("rank").is_not_null(), "rank").group_by("rank").agg(
        kernels=pl.len())
    if kernels.height == 0:
        return none
    calls = waits.group_by("rank").agg(calls=pl.len())
    counts = calls.join(kernels, on="rank", how="left").with_columns(pl.col("kernels").fill_null(0))
    return counts.filter(pl.col("calls") != pl.col("kernels")).sort("rank")


def _lost_kernels(events, waits: pl.DataFrame, cut_short: list) -> bool:
    """Whether the arrivals fell back to the hosts' calls because ranks lost communication kernels: cut short
    (:func:`_lost_to_the_cut`), or with none at all while another rank has them (its GPU's activities not recorded:
    nccl2 with rank 0's GPU events gone read "critical: rank 1, 75.63 ms a step" on the hosts' calls, 70.25 on the
    GPUs). No verdict is graded then."""
    return _lost_to_the_cut(events, waits, cut_short) or bool(_kernelless(events, waits))


def _late_on_host(calls: pl.DataFrame, waits: pl.DataFrame, left_out: list, windows: dict, busy,
                  waited: dict) -> tuple[int, int, int] | None:
    """Of the ``left_out`` members (their GPU arrivals unknown, :func:`~traceparse.measures.comm.arrivals_unknown`),
    the one the compared members waited for longest at least, from its calls' starts on its host: a kernel starts
    no earlier than its call, so where a call started after the compared members' kernels had, each of them waited
    at least until then. Counted as their own waits are (:func:`~traceparse.measures.comm.waiting_time`: once, in
    their steps, where their GPUs computed nothing), less what they waited anyway (``waited``). (``member``, how
    many collectives its call came after every compared kernel, the extra wait summed over the compared members),
    or None where it came after none."""
    key = ["process_group", "instance"]
    last = pl.col("arrival_ns") + pl.col("wait_ns")
    best = None
    for member in left_out:
        host = calls.filter(pl.col("member") == member).select(*key, _host="arrival_ns")
        moved = waits.join(host, on=key, how="left", nulls_equal=True)
        late_at = moved.filter(pl.col("_host") > last).select(key).unique().height
        if late_at == 0:
            continue
        moved = moved.with_columns(wait_ns=pl.max_horizontal(last, pl.col("_host").fill_null(last))
                                   - pl.col("arrival_ns")).drop("_host")
        extra = sum(max(0, int(ns) - int(waited.get(m, 0))) for m, ns in waiting_time(moved, windows, busy).iter_rows())
        if extra > 0 and (best is None or extra > best[2]):
            best = (member, late_at, extra)
    return best


def _kernelless(events, waits: pl.DataFrame) -> list:
    """The ranks with collective calls and no communication kernel, where the arrivals fell back to the hosts'
    calls though other ranks ran such kernels."""
    return _unpaired(events, waits).filter(pl.col("kernels") == 0)["rank"].to_list()


def _lost_to_the_cut(events, waits: pl.DataFrame, cut_short: list) -> bool:
    """Whether the arrivals fell back to the hosts' calls because ranks cut short lost communication kernels: then
    no verdict is graded, as a host that runs ahead of its GPU names its own straggler (every rank of the balanced
    fsdp4 run cut at 70%: "critical: rank 3", where the whole run's GPUs name none)."""
    return bool(cut_short) and bool(set(cut_short) & set(_unpaired(events, waits)["rank"].to_list()))


#: The ranks whose calls and kernels differ in number named in the host-arrivals sentence; the rest are counted.
RANKS_NAMED = 4

#: A pipeline's most waited-for stage that waits itself at least this fraction of the wait it causes is not a
#: slow stage: its waits and the others' are the schedule's bubble (two even stages, GPipe with 4 micro-batches:
#: 71%; a stage with three times the layers of the other: 9%).
BUBBLE_FRACTION = 0.5


def _gpu_excess_ns(excess: dict) -> int:
    """The straggler's listed GPU work a step over the median rank's, summed (kernels of one stream run one at a
    time, so their excesses add up)."""
    return sum(max(0, r["slow_ns"] - r["median_ns"]) for r in excess["slow_rank_gpu"])


def _explains(row: dict, wait_per_step_ns: int) -> float:
    """How much of each other rank's wait per step a part's excess on the straggler (its time a step over the
    median rank's) accounts for, in percent (at most 100)."""
    if not wait_per_step_ns:
        return 0.0
    return min(100.0, 100.0 * max(0, row["slow_ns"] - row["median_ns"]) / wait_per_step_ns)


def _excess_sentence(who: str, excess: dict, floor: float, wait_per_step_ns: int,
                     floor_pct: float = 1.0) -> str:
    """The parts longer on the straggler than on the median rank, each with its excess, then how much of the wait
    the largest explains and, where several kernels are listed, they together (kernels of a stream add up).

    No share per part: the parts overlap (a host operator and the kernels it launched) or add up past the wait
    (a slow stage's extra GPU work that the others partly overlap), so shares of the wait per part could add up
    to more than the whole."""
    parts = []
    for key, what in (("slow_rank_host", "host"), ("slow_rank_gpu", "GPU")):
        for r in excess[key][:2]:
            more = max(0, r["slow_ns"] - r["median_ns"])
            parts.append(f"{r['name']} ({what}, {fmt_ns(r['slow_ns'])} a step against {fmt_ns(r['median_ns'])}, "
                         f"{fmt_ns(more)} more)")
    if not parts:
        return (f" Nothing the trace records on {who} runs longer than on the median rank by {fmt_ns(floor)} a "
                f"step or more ({fmt_pct(floor_pct)} of its step): it does not explain the wait.")
    text = f" Longer on {who} than on the median rank, per step: " + "; ".join(parts) + "."
    if wait_per_step_ns:
        lead = max(excess["slow_rank_host"] + excess["slow_rank_gpu"], key=lambda r: r["slow_ns"] - r["median_ns"])
        said = [_share_of_wait(lead["slow_ns"] - lead["median_ns"], wait_per_step_ns, "the largest excess is")]
        kernels = len(excess["slow_rank_gpu"])
        if kernels > 1:
            said.append(_share_of_wait(_gpu_excess_ns(excess), wait_per_step_ns,
                                       f"the {kernels} kernels of largest excess add up to"))
        text += f" Against the {fmt_ns(wait_per_step_ns)} a step the others wait: " + "; ".join(said) + "."
    if not excess["slow_rank_gpu"]:
        text += f" No kernel or copy takes {fmt_ns(floor)} a step longer there."
    elif not excess["slow_rank_host"]:
        text += f" No host operator or annotation takes {fmt_ns(floor)} a step longer there."
    return text


def _wait_part(more_ns: int, wait_per_step_ns: int, wait: str = "the wait") -> str:
    """How much of the wait (called ``wait``) an excess a step accounts for: its share, or more than all of it."""
    if more_ns > wait_per_step_ns:
        return f"more than all of {wait}"
    return f"{fmt_pct(100.0 * more_ns / wait_per_step_ns)} of {wait}"


def _share_of_wait(more_ns: int, wait_per_step_ns: int, what: str) -> str:
    """``what`` and an excess a step, with the share of the wait it accounts for: at most all of it."""
    more_ns = max(0, more_ns)
    return f"{what} {fmt_ns(more_ns)}, " + _wait_part(more_ns, wait_per_step_ns, "it")


@hookimpl
def traceparse_rules():
    return [Stragglers()]
