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

Severity: warning when ``idle_pct`` ≥ ``warning_idle_pct``, critical from
``critical_idle_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.plugins import hookimpl
from traceparse.rule import Finding, Rule, RuleOptions
from traceparse.trace import Trace
from traceparse_plugins.rules._rows import pct

#: Event kinds that are work on the device.
ACTIVITY = ("kernel", "memcpy", "memset")
#: Stands in for a null device_id while joining (device ids are never negative).
NO_DEVICE = -1


class GpuIdle(Rule):
    name = "gpu-idle"
    description = "Gaps where a device runs no kernel, copy or memset, between its first and last activity"
    definition = __doc__
    thresholds = {
        "warning_idle_pct": 25.0,    # idle share of the span at or above this: warning
        "critical_idle_pct": 50.0,   # ... at or above this: critical
        "top": 10,                   # longest gaps listed
    }
    kinds = ACTIVITY

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        gpu = trace.events.filter(pl.col("kind").is_in(ACTIVITY))
        timed = (gpu.filter(pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null())
                 .with_columns(pl.col("device_id").fill_null(NO_DEVICE)))
        untimed = gpu.height - timed.height
        if timed.height == 0:
            return [Finding(self.name, "info", "No timed GPU activity",
                            f"The trace's {gpu.height} GPU rows are aggregated (no start times), so idle gaps "
                            "cannot be placed in time.",
                            metrics={"span_ns": 0, "idle_ns": 0, "idle_pct": None, "untimed_rows": untimed})]
        by = ["device_id"]
        timed = timed.with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns"))
        spans = timed.group_by(by).agg(first=pl.col("start_ns").min(), last=pl.col("end_ns").max())
        gaps = intervals.gaps(timed, by)
        per_device = (spans.join(gaps.group_by(by).agg(idle_ns=pl.col("length").sum(), gaps=pl.len()), on=by,
                                 how="left")
                      .with_columns(span_ns=pl.col("last") - pl.col("first"),
                                    idle_ns=pl.col("idle_ns").fill_null(0), gaps=pl.col("gaps").fill_null(0))
                      .with_columns(busy_ns=pl.col("span_ns") - pl.col("idle_ns"))  # = |union| per device
                      .sort(by))
        span_ns = int(per_device["span_ns"].sum())
        idle_ns = int(per_device["idle_ns"].sum())
        busy_ns = int(per_device["busy_ns"].sum())
        idle_pct = pct(idle_ns, span_ns)
        devices = {_device_key(r["device_id"]): {"span_ns": r["span_ns"], "busy_ns": r["busy_ns"],
                                                 "idle_ns": r["idle_ns"], "idle_pct": pct(r["idle_ns"], r["span_ns"]),
                                                 "gaps": r["gaps"]}
                   for r in per_device.iter_rows(named=True)}
        items = self._largest_gaps(timed, gaps, int(t["top"]))
        severity = "info"
        if idle_pct is not None:
            if idle_pct >= t["critical_idle_pct"]:
                severity = "critical"
            elif idle_pct >= t["warning_idle_pct"]:
                severity = "warning"
        n_dev = per_device.height
        message = (f"The GPU{'s' if n_dev > 1 else ''} ran nothing for {idle_ns / 1e6:.3f} ms of "
                   f"{span_ns / 1e6:.3f} ms{' (summed over ' + str(n_dev) + ' devices)' if n_dev > 1 else ''} "
                   f"between first and last activity: {idle_pct or 0:.1f}% idle, in {len(gaps)} gaps")
        message += (f"; the longest is {items[0]['length_ns'] / 1e6:.3f} ms." if items else ".")
        if untimed:
            message += f" {untimed} aggregated GPU rows left out: they have no start time."
        suggestion = ""
        if severity != "info":
            suggestion = ("The GPU waits for the host. Look at what the host does before the longest gaps: "
                          "data loading (more DataLoader workers, pin_memory, prefetching), Python overhead and "
                          "many small kernel launches (CUDA graphs, torch.compile), and synchronisations "
                          "(.item(), .cpu(), cudaDeviceSynchronize) that stop the host from queueing work ahead.")
        return [Finding(self.name, severity, "GPU idle" if severity != "info" else "GPU idle time", message,
                        suggestion,
                        metrics={"span_ns": span_ns, "idle_ns": idle_ns, "idle_pct": idle_pct, "busy_ns": busy_ns,
                                 "gaps": len(gaps), "untimed_rows": untimed, "devices": devices},
                        items=items)]

    @staticmethod
    def _largest_gaps(timed: pl.DataFrame, gaps: pl.DataFrame, top: int) -> list[dict]:
        """The ``top`` longest gaps with the names of the activities that end before and start after them.

        Several activities can end (or start) at the same instant; the first in the trace's order is named.
        """
        origin = int(timed["start_ns"].min())
        longest = gaps.sort(["length", "start"], descending=[True, False]).head(top).with_row_index("gap")
        events = timed.select("device_id", "event_id", "name", "start_ns", "end_ns")

        def named(on_gap: str, on_event: str, alias: str) -> pl.DataFrame:
            return (longest.select("gap", "device_id", on_gap)
                    .join(events, left_on=["device_id", on_gap], right_on=["device_id", on_event], how="inner")
                    .sort("event_id").group_by("gap").agg(pl.col("name").first().alias(alias)))

        longest = (longest.join(named("start", "end_ns", "before"), on="gap", how="left")
                   .join(named("end", "start_ns", "after"), on="gap", how="left").sort("gap"))
        return [{"device_id": None if r["device_id"] == NO_DEVICE else r["device_id"],
                 "start_offset_ns": r["start"] - origin, "length_ns": r["length"],
                 "before": r["before"], "after": r["after"]}
                for r in longest.iter_rows(named=True)]


def _device_key(device_id: int) -> str:
    return "?" if device_id == NO_DEVICE else str(device_id)


@hookimpl
def traceparse_rules():
    return [GpuIdle()]
