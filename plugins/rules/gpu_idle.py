"""Rule ``gpu-idle``: time a device runs nothing between its first and last GPU activity.

Definition: GPU activity is the timed events of kind kernel, memcpy and
memset (markers and sync events are not work), as half-open intervals
``[start_ns, start_ns + duration_ns)``. Per device (``device_id``; rows with
no device form one group): span = end of its last activity − start of its
first; busy = the length of the union of its activity intervals; idle =
span − busy = the total length of the gaps between the merged intervals
(intervals that touch leave no gap; nested or overlapping ones merge).
Metrics sum over devices: ``span_ns`` = Σ span, ``idle_ns`` = Σ idle,
``idle_pct`` = 100 × idle_ns / span_ns (the idle share of device-time, so
two devices each idle half of their span give 50%); ``busy_ns``, ``gaps``
(their number) and per-device figures in ``devices``.

Aggregated rows (nvprof / nsys summaries) have no start time, so they cannot
place work in time: they are left out, and a trace with only aggregated GPU
rows gets an info finding saying so.

Items: the ``top`` longest gaps: ``device_id``, ``start_offset_ns`` (from the
trace's first GPU activity on any device), ``length_ns``, and ``before`` /
``after``: the name of the activity on that device that ends where the gap
starts / starts where it ends.

On a run of many ranks (one trace of every rank's events), the figures sum
over every rank's devices; ``devices`` names each ``rank R:D`` and every
item has its ``rank``. The time at stake (``impact_ns``) is the idle time
of the mean device (``idle_ns`` / devices): per GPU, so per rank on a run;
the whole it is part of (``impact_whole``) is the mean device's span, so the
summary's share of it is ``idle_pct``; with several devices, ``impact_range``
names the least and the most idle one, with their idle time.

Severity: warning when ``idle_pct`` ≥ ``warning_idle_pct``, critical from
``critical_idle_pct`` (Nsight Systems' ``gpu_time_util`` flags time under
50% busy); also a warning when one gap lasts at least ``warning_gap_ms``
(500 ms, Nsight Systems' ``gpu_gaps``), however small the idle share of a
long trace.

The finding also says why each stream waits (HTA's idle time breakdown).
Per stream (device,
stream), its timed GPU activities in order of start; a gap is the time from
the latest end of the activities before one to its start. The gap is host
wait when that activity's launch call (linked by correlation id; a graph
launch for every kernel it replays) started after the stream went idle:
nothing was queued, the GPU waited for the host. Otherwise kernel wait when
shorter than ``kernel_wait_below_ns`` (the overhead between back-to-back
queued kernels), else other (queued work waiting for something else: an
event of another stream, a copy, a synchronization; or an activity whose
launch is not in the trace). Stream gaps are counted per stream, so with
several streams their sum can exceed the device's idle time: it is no part
of the span, and only the reasons' shares of it are used. Metrics:
``ranks_without_gpu`` (a run's ranks that recorded no GPU activity, left out of every figure and named),
``host_wait_pct``, ``kernel_wait_pct``, ``other_wait_pct`` (the reasons'
shares of the streams' gap time), ``host_wait_ns``, ``kernel_wait_ns``,
``other_wait_ns`` (the devices' ``idle_ns`` split by those shares, so they
add up to it to the nanosecond; where no stream has a gap of its own, the devices idling only between activities
of different streams, all of it is other), ``unlinked_wait_ns`` (the part of ``other_wait_ns`` before copies or
kernels linked to no launch call: their wait cannot be told; where it is most of "other" the sentence says so
and the suggestion is not "queued work waiting"), and ``streams`` ({"device:stream": activities, span_ns,
idle_ns, host_wait_ns, kernel_wait_ns, other_wait_ns}, the most idle stream
first; the screen shows the worst few and one row for the rest). The breakdown does
not change the severity; it picks the suggestion (host wait or other).

What the host did while the GPU waited for it: each moment of a host-wait gap
goes to the innermost host row (op, annotation, runtime call, region) running
then on the thread that launched the activity ending the gap; moments when
that thread recorded nothing go to "(no traced call)" (a step's
``ProfilerStep#N`` annotation is no activity: time inside it that no other row
covers is untraced Python between operators; it read as an activity), gaps
whose activity has no launch in the trace to "(no launch in the trace)". Names that differ only by a
trailing step number (``ProfilerStep#3``) are one activity (``ProfilerStep#N``).
``host_activity`` ({activity: kind, wait_ns, share_pct, gaps}, the seven
largest, then one "(other activities)" row for the rest): ``share_pct`` is
the activity's share of the streams' host-wait gap time (the shares add up to
100), ``wait_ns`` that share of ``host_wait_ns`` (so they add up to it),
``gaps`` the host-wait gaps it had a part in.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.meta import incomplete_notes, incomplete_ranks
from traceparse.plugins import hookimpl
from traceparse.figures import ends_early, fmt_count, fmt_ns, fmt_pct, listed, shares_shown
from traceparse.measures.base import exact_sum
from traceparse.measures.steps import step_free
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.run import device_label, in_rank_order, mean_range, rank_labels, rank_of, whole_ranks_only
from traceparse.trace import Trace

#: The reasons' shares of the idle time (one whole): rounded together wherever they are shown.
WAIT_SHARES = ("host_wait_pct", "kernel_wait_pct", "other_wait_pct")
FIGURES = {"span_ns": "ns", "busy_ns": "ns", "idle_ns": "ns", "idle_pct": "pct", "gaps": "count",
           "untimed_rows": "problem_count", "host_wait_pct": "pct", "kernel_wait_pct": "pct",
           "other_wait_pct": "pct"}
#: Screen labels: the span is the GPU's (first to last activity), not the trace's of the summary; the busy time is
#: the time behind the summary's "GPU busy" share (alone under the sentence, "busy" did not say whose); the idle
#: share is not the idle time.
LABELS = {"span_ns": "GPU span", "busy_ns": "GPU busy, overlaps counted once", "idle_pct": "idle share"}
#: The gaps' columns; one device's table leaves out the device (its items keep ``device_id``), so the
#: names before and after each gap get the width.
COLUMNS = [Column("device_id", "device", "number"), Column("start_offset_ns", "start offset", "ns"),
           Column("length_ns", "length", "ns"), Column("before", "before", "name"), Column("after", "after", "name")]
RANK = Column("rank", "rank", "number")
DEVICES = [Column("device", "device", "text"), Column("span_ns", "span", "ns"), Column("busy_ns", "busy", "ns"),
           Column("idle_ns", "idle", "ns"), Column("idle_pct", "idle %", "pct"), Column("gaps", "gaps", "count")]
HOST_ACTIVITY = [Column("activity", "what the host ran", "name"), Column("kind", "kind", "text"),
                 Column("wait_ns", "host wait", "ns"), Column("share_pct", "share", "pct"),
                 Column("gaps", "in gaps", "count")]  # a gap can hold several activities: no sum of the gaps
#: Host activities named in ``host_activity``; the rest are one row.
ACTIVITY_ROWS = 7
#: The row standing for every activity after the :data:`ACTIVITY_ROWS` largest.
OTHER_ACTIVITIES = "(other activities)"
STREAMS = [Column("stream", "device:stream", "text"), Column("activities", "activities", "count"),
           Column("span_ns", "span", "ns"), Column("idle_ns", "idle", "ns"), Column("host_wait_ns", "host wait", "ns"),
           Column("kernel_wait_ns", "kernel wait", "ns"), Column("other_wait_ns", "other", "ns")]
SUGGESTION_OTHER = ("Most stream idle time is queued work waiting for something else than the host: look for "
                    "cross-stream event waits, synchronous copies and synchronisations inside the step.")
SUGGESTION_BLIND = ("Record the runtime calls (torch.profiler's CUDA activity with its cuda_runtime events, nsys's "
                    "CUDA API trace) to tell a GPU waiting for the host from one waiting for other work; meanwhile "
                    "look at what the host does before the longest gaps.")
SUGGESTION_UNLINKED = ("The trace ties no runtime call to the GPU work it queued (a correlation id, rocprof's "
                       "arrows): record with a tool or option that does (torch.profiler, nsys, rocprof "
                       "--hip-trace) to tell a GPU waiting for the host from one waiting for other work; meanwhile "
                       "look at what the host does before the longest gaps.")
SUGGESTION_PART_UNLINKED = ("Most of the idle time comes before copies or kernels the trace ties to no runtime "
                            "call, so whether they were queued cannot be told: record with the links where the tool "
                            "can (correlation ids; rocprof draws arrows for launches, not always for copies); "
                            "meanwhile look at what the host does before the longest gaps.")
SUGGESTION = ("The GPU waits for the host. Look at what the host does before the longest gaps: "
              "data loading (more DataLoader workers, pin_memory, prefetching), Python overhead and "
              "many small kernel launches (CUDA graphs, torch.compile), and synchronisations "
              "(.item(), .cpu(), {sync}) that stop the host from queueing work ahead.")


class GpuIdle(Rule):
    name = "gpu-idle"
    cost = 3  # every stream's gaps and a sweep of the launching threads
    description = "Gaps where a device runs no kernel, copy or memset, between its first and last activity"
    definition = __doc__
    thresholds = {
        "warning_idle_pct": 25.0,    # idle share of the span at or above this: warning
        "critical_idle_pct": 50.0,   # ... at or above this: critical
        "top": 10,                   # longest gaps listed
        "warning_gap_ms": 500.0,     # one gap at least this long is a warning whatever the idle share
        "kernel_wait_below_ns": 30000,   # a queued gap shorter than this is kernel wait (launch overhead)
    }
    kinds = expr.GPU_KINDS
    impact_per_rank = True  # the idle time of the mean device: on a run of one GPU a rank, per rank

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        gpu = expr.kind_is(*expr.GPU_KINDS)  # counted, not collected: a run's rows stay in the store
        gpu_rows, placed = events.select(gpu.sum(), (gpu & expr.timed() & pl.col("duration_ns").is_not_null())
                                         .sum().alias("placed")).row(0)
        untimed = gpu_rows - placed
        per_device = measures.device_busy(events)
        recorded = set(per_device["trace_id"].to_list())
        per_device, left = whole_ranks_only(trace, per_device)  # ranks cut short: their GPU record is partial
        if per_device.height == 0:
            return [Finding(self.name, "info", "No timed GPU activity",
                            f"The trace's {gpu_rows} GPU rows are aggregated (no start times), so idle gaps "
                            "cannot be placed in time.",
                            metrics={"span_ns": 0, "idle_ns": 0, "idle_pct": None, "untimed_rows": untimed},
                            figures={"span_ns": "ns", "idle_ns": "ns", "idle_pct": "pct",
                                     "untimed_rows": "problem_count"},
                            labels=LABELS)]
        gaps = _without(measures.gaps(events, longest=int(t["top"])), left)  # each rank's longest: enough
        span_ns = exact_sum(per_device["span_ns"])  # each device's span fits Int64, their sum may not
        idle_ns = exact_sum(per_device["idle_ns"])
        busy_ns = exact_sum(per_device["busy_ns"])
        n_gaps = int(per_device["gaps"].sum())
        idle_pct = expr.pct(idle_ns, span_ns)
        ranks = rank_labels(trace)
        devices = {device_label(ranks, r["trace_id"], r["device_id"]): {"span_ns": r["span_ns"], "busy_ns": r["busy_ns"],
                                                 "idle_ns": r["idle_ns"], "idle_pct": expr.pct(r["idle_ns"], r["span_ns"]),
                                                 "gaps": r["gaps"]}
                   for r in in_rank_order(per_device, ranks).iter_rows(named=True)}
        origin = int(per_device["first_ns"].min())
        # longest first; gaps of one length as shown (a run's ranks) in rank order, then by start
        rank = rank_of(ranks)
        longest = gaps.with_columns(_shown=expr.as_shown("length"), _rank=rank).sort(
            ["_shown", "_rank", "start", "device_id", "length"], descending=[True, False, False, False, True],
            nulls_last=False)
        items = [{**({"rank": ranks.get(r["trace_id"])} if ranks else {}),
                  "device_id": r["device_id"], "start_offset_ns": r["start"] - origin, "length_ns": r["length"],
                  "before": r["before"], "after": r["after"]}
                 for r in longest.head(int(t["top"])).iter_rows(named=True)]
        severity = grade(idle_pct, warning=t["warning_idle_pct"], critical=t["critical_idle_pct"])
        long_gap = int(gaps["length"].max() or 0) >= t["warning_gap_ms"] * 1e6
        if severity == "info" and long_gap:
            severity = "warning"
        n_dev = per_device.height
        if n_dev > 1:
            message = (f"The {n_dev} GPUs ran nothing for {fmt_pct(idle_pct or 0)} of their time between first and "
                       f"last activity ({fmt_ns(idle_ns / n_dev)} of {fmt_ns(span_ns / n_dev)} a GPU on average), "
                       f"in {fmt_count(n_gaps, 'gap')}")
        else:
            message = (f"The GPU ran nothing for {fmt_ns(idle_ns)} of {fmt_ns(span_ns)} between first and last "
                       f"activity: {fmt_pct(idle_pct or 0)} idle, in {fmt_count(n_gaps, 'gap')}")
        message += (f"; the longest is {fmt_ns(items[0]['length_ns'])}." if items else ".")
        if untimed:
            message += f" {untimed:,} aggregated GPU rows left out: they have no start time."
        without = sorted(r for tid, r in ranks.items() if tid not in recorded)
        cut = sorted(set(incomplete_ranks(trace.meta)) & set(without))
        if cut:  # its GPU work was after the cut: not "recorded none"
            said = ends_early(cut)
            message += (f" {said[0].upper()}{said[1:]} before any of {'its' if len(cut) == 1 else 'their'} GPU "
                        "activity: left out of these figures.")
        if partial := sorted(r for tid, r in left.items() if tid in recorded):
            said = ends_early(partial)
            one = len(partial) == 1
            message += (f" {said[0].upper()}{said[1:]}: {'its' if one else 'their'} GPU activity was written in "
                        f"part only (gaps where work went unwritten), so {'it is' if one else 'they are'} left out "
                        "of these figures.")
        idle_ranks = [r for r in without if r not in cut]
        if idle_ranks:
            message += (f" {listed('rank', idle_ranks, shown=8).capitalize()} recorded no GPU activity and "
                        f"{'is' if len(idle_ranks) == 1 else 'are'} left out of these figures.")
        # no launch call, or none linked to the GPU work it queued: when work was queued cannot be seen
        calls, links, hip = events.select(
            _calls=(pl.col("kind") == "api").any(), _links=(expr.kind_is(*expr.GPU_KINDS) & (
                pl.col("correlation_id").is_not_null() | pl.col("external_id").is_not_null())).any(),
            _hip=((pl.col("kind") == "api") & pl.col("name").str.starts_with("hip")).any()
            & ~((pl.col("kind") == "api") & pl.col("name").str.starts_with("cuda")).any()).row(0)
        blind = not calls or not links
        breakdown, streams, reasons = self._breakdown(events, t, ranks, idle_ns, left, partly_linked=not blind)
        # cut short with nothing whole to show instead (a single trace, every rank of a run): said, not left out.
        # One stream a device keeps the first part of its work; of several, each is written as its buffers fill,
        # and one stops before another (fsdp4's rank 0 cut at 60%: 67% idle, 5% whole)
        cut_all = (set(ranks.values()) <= set(incomplete_ranks(trace.meta))) if ranks else bool(
            incomplete_notes(trace.meta))
        if cut_all and len(streams) > n_dev:
            message += (" Every rank's trace ends early (cut short), and their" if ranks else
                        " The trace ends early (cut short), and its") + (
                " streams' activities are written as their buffers fill: one stream's may stop before another's, "
                "and the work lost shows as idle time here.")
        message += reasons
        activity, sentence = self._host_activity(events, t, breakdown["host_wait_ns"], left)
        message += sentence
        suggestion = ""
        if blind and reasons:
            message += (" The trace has no runtime calls (launches): whether work was queued in a gap cannot be "
                        "told, so host waits count as other." if not calls else
                        " The trace links no runtime call to the GPU work it queued: whether work was queued in a "
                        "gap cannot be told, so host waits count as other.")
        if severity != "info":
            suggestion = SUGGESTION.format(sync="hipDeviceSynchronize" if hip else "cudaDeviceSynchronize")
            if blind:
                suggestion = SUGGESTION_BLIND if not calls else SUGGESTION_UNLINKED
            elif (breakdown["other_wait_pct"] or 0) > (breakdown["host_wait_pct"] or 0):
                # "queued work waiting for something else" only where the queueing was seen
                suggestion = (SUGGESTION_OTHER if 2 * breakdown["unlinked_wait_ns"] <= breakdown["other_wait_ns"]
                              else SUGGESTION_PART_UNLINKED)
        return [Finding(self.name, severity, "GPU idle" if severity != "info" else "GPU idle time", message,
                        suggestion,
                        metrics={"span_ns": span_ns, "idle_ns": idle_ns, "idle_pct": idle_pct, "busy_ns": busy_ns,
                                 "gaps": n_gaps, "untimed_rows": untimed, "devices": devices,
                                 "ranks_without_gpu": without, **breakdown,
                                 "streams": streams, "host_activity": activity},
                        items=items, items_title="longest gaps", columns=([RANK] if ranks else []) + (COLUMNS if n_dev > 1 else COLUMNS[1:]),
                        figures=FIGURES, labels=LABELS if n_dev == 1 else {
                            **LABELS, "span_ns": "GPU spans, summed", "busy_ns": "busy, summed", "idle_ns": "idle, summed"},
                        worst={"devices": "idle_ns"}, shares=[WAIT_SHARES],
                        tables={"devices": DEVICES, **({"streams": STREAMS} if len(streams) > 1 else {}),
                                **({"host_activity": HOST_ACTIVITY} if activity else {})},
                        impact_ns=round(idle_ns / n_dev),
                        impact_whole=("the GPU's span" if n_dev == 1 else "the mean GPU's span",
                                      round(span_ns / n_dev)),
                        impact_range=mean_range(in_rank_order(per_device, ranks), "idle_ns", ranks))]

    def _host_activity(self, events, t: dict, host_wait_ns: int, left: dict) -> tuple[dict, str]:
        """The host-wait time by what the launching thread did (see the definition): the table, a sentence; the
        ranks ``left`` out (:func:`~traceparse.run.whole_ranks_only`) are not counted."""
        rows = _without(measures.gap_activity(events, kernel_wait_ns=int(t["kernel_wait_below_ns"])), left)
        if rows.height == 0:
            return {}, ""
        merged = (rows.with_columns(name=step_free(pl.col("name")).str.replace(r"#\d+$", "#N"))
                  .group_by("kind", "name").agg(pl.col("wait_ns").sum(), pl.col("gaps").sum())
                  .sort(["wait_ns", "name"], descending=[True, False], nulls_last=True))
        total = int(merged["wait_ns"].sum())
        if not total:
            return {}, ""
        shown, rest = merged.head(ACTIVITY_ROWS), merged.slice(ACTIVITY_ROWS)
        table = {r["name"]: {"kind": r["kind"], "wait_ns": round(host_wait_ns * r["wait_ns"] / total),
                             "share_pct": expr.pct(r["wait_ns"], total), "gaps": r["gaps"]}
                 for r in shown.iter_rows(named=True)}
        if rest.height:
            table[OTHER_ACTIVITIES] = {"kind": None, "wait_ns": round(host_wait_ns * rest["wait_ns"].sum() / total),
                                       "share_pct": expr.pct(int(rest["wait_ns"].sum()), total),
                                       # a gap holds several activities: their gaps summed were more than
                                       # the gaps there are (2,000 "in gaps" of 748), and which are distinct
                                       # is not kept: no count
                                       "gaps": None}
        # as the table shows them: rounded together, so that they add up to 100 (16.95% read 16.9% here, 17.0% there)
        shares = shares_shown([v["share_pct"] for v in table.values()])
        named = ", ".join(f"{name} {fmt_pct(share)}" for name, share in list(zip(table, shares))[:3])
        return table, f" The host, while the GPU waited for it, was in: {named}."

    def _breakdown(self, events, t: dict, ranks: dict, idle_ns: int, left: dict,
                   partly_linked: bool = True) -> tuple[dict, dict, str]:
        """Idle time split into host wait, kernel wait and other by the streams' gaps: metrics, the streams table
        (worst first), a sentence (which says how much of "other" comes before unlinked work where the trace links
        some of its work to launch calls, ``partly_linked``; where it links none, the rule says that instead).

        Each stream's gaps are classified; the shares of the three reasons in the streams' gap time split the
        devices' idle time (streams overlap, so the gaps of several streams may cover one idle moment: their
        sum is no part of the span, their shares are).
        """
        per_stream = _without(measures.stream_idle(events, kernel_wait_ns=int(t["kernel_wait_below_ns"])), left)
        total = exact_sum(per_stream["idle_ns"])
        parts = {"host_wait_ns": exact_sum(per_stream["host_wait_ns"]),
                 "kernel_wait_ns": exact_sum(per_stream["kernel_wait_ns"]),
                 "other_wait_ns": exact_sum(per_stream["other_ns"])}
        unlinked = exact_sum(per_stream["unlinked_ns"])
        between = not total and idle_ns  # the devices idle between activities of different streams, in no
        if between:  # stream's gap: why cannot be told from a stream (an nvprof trace's memset and copy, 4.6 ms apart)
            parts, total = {**parts, "other_wait_ns": idle_ns}, idle_ns
        shares = {k.replace("_ns", "_pct"): expr.pct(v, total) for k, v in parts.items()}
        # idle × share in integers (exact at any size; a float loses the last digits of 1.8e19 ns), the three
        # adding up to the idle time to the nanosecond
        metrics = {**_apportioned(idle_ns, parts, total), **shares,
                   "unlinked_wait_ns": (2 * idle_ns * unlinked + total) // (2 * total) if total else 0}
        # most idle first; streams idle alike as shown (a run's ranks often are) in rank order, not by nanoseconds
        # no one sees nor by their trace ids' hashes
        rank = rank_of(ranks)
        per_stream = per_stream.with_columns(_shown=expr.as_shown("idle_ns"), _rank=rank).sort(
            ["_shown", "_rank", "trace_id", "device_id", "stream_id", "idle_ns"],
            descending=[True, False, False, False, False, True], nulls_last=True).drop("_shown", "_rank")
        streams = {f"{device_label(ranks, r.get('trace_id'), r['device_id'])}:{_device_key(r['stream_id'])}": {
            "activities": r["activities"], "span_ns": r["span_ns"], "idle_ns": r["idle_ns"],
            "host_wait_ns": r["host_wait_ns"], "kernel_wait_ns": r["kernel_wait_ns"], "other_wait_ns": r["other_ns"]}
            for r in per_stream.iter_rows(named=True)}
        if not total:
            return metrics, streams, ""
        if between:
            return metrics, streams, (" The idle time lies between activities of different streams, in no stream's "
                                      "own gap: why the GPU waited cannot be told from a stream (counted as other).")
        who = ("the stream waits, by its" if per_stream.height == 1
               else f"the {per_stream.height:,} streams wait, by their")
        host, kernel, other = shares_shown([shares[k] for k in WAIT_SHARES])  # as the figures show them
        sentence = (f" Why {who} gap time: host wait {fmt_pct(host)} (nothing queued), kernel wait {fmt_pct(kernel)} "
                    f"(queued, gaps under {fmt_ns(int(t['kernel_wait_below_ns']))}), other {fmt_pct(other)}.")
        # most of an "other" worth naming is before unlinked work
        if partly_linked and 2 * unlinked > parts["other_wait_ns"] and (shares["other_wait_pct"] or 0) >= 10:
            sentence += (f" Of the other, {fmt_pct(expr.pct(unlinked, parts['other_wait_ns']))} is before copies or "
                         "kernels the trace links to no launch call: whether they were queued cannot be told.")
        return metrics, streams, sentence


def _without(rows: pl.DataFrame, left: dict) -> pl.DataFrame:
    """``rows`` (a measure's, by ``trace_id``) but those of the traces ``left`` out."""
    return rows.filter(~pl.col("trace_id").is_in(list(left))) if left and rows.height else rows


def _device_key(device_id: int | None) -> str:
    return "?" if device_id is None else str(device_id)


def _apportioned(whole: int, parts: dict[str, int], total: int) -> dict[str, int]:
    """``whole`` split in proportion to ``parts`` (which add up to ``total``), in integers that add up to ``whole``:
    each part's floor, then a nanosecond more to those of largest remainder."""
    if not total:
        return dict.fromkeys(parts, 0)
    floors = {k: whole * v // total for k, v in parts.items()}
    left = whole - sum(floors.values())
    for k in sorted(parts, key=lambda k: (-(whole * parts[k] % total), k))[:left]:
        floors[k] += 1
    return floors


@hookimpl
def traceparse_rules():
    return [GpuIdle()]

