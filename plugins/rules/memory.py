"""Rule ``memory``: peak device memory (allocated and reserved), when it is reached, and a timeline.

Definition: the allocator's samples: counter rows named ``allocated_bytes``,
``[memory]`` or ``[memory] allocated`` (allocated), ``reserved_bytes`` or
``[memory] reserved`` (reserved). torch.profiler with
``profile_memory=True`` writes a ``[memory]`` event at every allocation and
release, with the totals after it: "allocated" is the bytes held by live
tensors, "reserved" the bytes the caching allocator holds from the device
(allocated plus cached free blocks). Per device (``device_id``; a sample
with no device is host memory, shown as ``host``): ``peak_allocated_bytes``
and ``peak_reserved_bytes`` (the largest sampled total), ``peak_ns`` (the
first sample at the allocated peak, from the trace's first memory sample),
``step`` (the ``ProfilerStep#N`` window holding that instant, null outside
every step), ``op`` (the innermost operator, kind ``op``, running at that
instant on the sample's thread, or on any thread when the sample has none),
``final_allocated_bytes`` (the last sample), ``samples`` (the allocator's
events: each gives its allocated and its reserved total, one sample), and ``timeline``: a
sparkline of the allocated total over the device's samples, ``width``
characters, each the highest total in its slice of time, scaled from 0 to
the peak. ``peak_allocated_bytes`` in the metrics is the highest over
devices (host memory excluded); ``capacity_bytes`` the device's memory as the
trace's device list gives it; ``peak_reserved_pct`` = 100 × peak reserved /
capacity.

Severity: warning when ``peak_reserved_pct`` ≥ ``reserved_warning_pct`` on
some device (close to running out of memory), critical from
``reserved_critical_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.measures.memory import sparkline
from traceparse.figures import fmt_bytes_binary, fmt_ns, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"peak_allocated_bytes": "bytes_binary", "peak_reserved_bytes": "bytes_binary", "peak_reserved_pct": "pct",
           "devices": "count", "samples": "count"}
#: Screen labels where the key's words would read like another figure: the peak reserved as a share of the device's
#: memory, apart from its bytes.
LABELS = {"peak_reserved_pct": "reserved % of memory"}
COLUMNS = [Column("device", "device", "text"), Column("peak_allocated_bytes", "peak allocated", "bytes_binary"),
           Column("peak_reserved_bytes", "peak reserved", "bytes_binary"),
           Column("peak_reserved_pct", "reserved % of memory", "pct"), Column("peak_ns", "peak at", "ns"),
           Column("step", "step", "number"), Column("op", "op", "name"),
           Column("final_allocated_bytes", "final allocated", "bytes_binary"), Column("samples", "samples", "count"),
           Column("timeline", "allocated over time", "text")]


class Memory(Rule):
    name = "memory"
    description = "Peak device memory allocated and reserved, when (step, operator) it peaks, and a timeline"
    definition = __doc__
    thresholds = {
        "reserved_warning_pct": 90.0,    # peak reserved at or above this % of the device's memory: warning
        "reserved_critical_pct": 98.0,   # ... at or above this: critical
        "width": 40,                     # characters of the timeline sparkline
    }
    kinds = ("counter",)

    def applies_to(self, trace: Trace) -> bool:
        return measures.memory_samples(trace.events).height > 0

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        samples = measures.memory_samples(events)
        if samples.height == 0:
            return [Finding(self.name, "info", "No memory samples",
                            "The trace has no allocator samples (torch.profiler: record with profile_memory=True).",
                            metrics={"devices": 0, "samples": 0}, figures={"devices": "count", "samples": "count"})]
        peaks = measures.memory_peaks(events)
        steps = measures.steps(events).filter(pl.col("on_host"))
        ops = events.filter(expr.kind_is("op") & expr.timed() & pl.col("duration_ns").is_not_null())
        capacity = {d.id: d.memory_bytes for d in trace.meta.devices if d.id is not None}
        origin = int(samples["start_ns"].min())
        items, worst = [], "info"
        for (trace_id, device), rows in peaks.group_by(["trace_id", "device_id"], maintain_order=True):
            by_series = {r["series"]: r for r in rows.iter_rows(named=True)}
            alloc, reserved = by_series.get("allocated"), by_series.get("reserved")
            head = alloc or reserved
            at = head["peak_ns"]
            series = samples.filter(_same(pl.col("trace_id"), trace_id) & _same(pl.col("device_id"), device)
                                    & (pl.col("series") == head["series"]))
            cap = capacity.get(device) if device is not None else None
            reserved_pct = expr.pct(reserved["peak_bytes"], cap) if reserved and cap else None
            if device is not None:
                worst = max(worst, grade(reserved_pct, warning=t["reserved_warning_pct"],
                                         critical=t["reserved_critical_pct"]), key=("info", "warning", "critical").index)
            items.append({
                "device": "host" if device is None else str(device),
                "peak_allocated_bytes": _int(alloc["peak_bytes"]) if alloc else None,
                "peak_reserved_bytes": _int(reserved["peak_bytes"]) if reserved else None,
                "peak_reserved_pct": reserved_pct, "peak_ns": at - origin,
                "step": _step_at(steps, trace_id, at), "op": _op_at(ops, trace_id, at, head["peak_pid"], head["peak_tid"]),
                "final_allocated_bytes": _int(alloc["final_bytes"]) if alloc else None,
                "samples": int(max(r["samples"] for r in by_series.values())),  # an event gives both totals
                "timeline": sparkline(series["start_ns"].to_list(), series["value"].to_list(), int(t["width"]), lo=0.0),
                "capacity_bytes": cap,
            })
        items.sort(key=lambda i: (i["device"] == "host", i["device"]))
        on_device = [i for i in items if i["device"] != "host"] or items
        top = max(on_device, key=lambda i: i["peak_allocated_bytes"] or 0)
        metrics = {"peak_allocated_bytes": top["peak_allocated_bytes"],
                   "peak_reserved_bytes": max((i["peak_reserved_bytes"] or 0 for i in on_device), default=None),
                   "peak_reserved_pct": max((i["peak_reserved_pct"] for i in on_device
                                             if i["peak_reserved_pct"] is not None), default=None),
                   "capacity_bytes": top["capacity_bytes"], "devices": len(items),
                   "samples": sum(i["samples"] for i in items)}
        where = "Host memory" if top["device"] == "host" else f"Device {top['device']}"
        message = (f"{where}: peak allocated {_binary(top['peak_allocated_bytes'])}"
                   + (f", peak reserved {_binary(top['peak_reserved_bytes'])}" if top["peak_reserved_bytes"] else "")
                   + (f" ({fmt_pct(top['peak_reserved_pct'])} of {_binary(top['capacity_bytes'])})"
                      if top["peak_reserved_pct"] is not None else "")
                   + f", reached {fmt_ns(top['peak_ns'])} into the memory timeline"
                   + (f" in step {top['step']}" if top["step"] is not None else "")
                   + (f" during {top['op']}" if top["op"] else "") + f". Allocated over time: {top['timeline']}")
        suggestion = ("Reserved memory is close to the device's capacity: free references early, use activation "
                      "checkpointing, a smaller batch or mixed precision; set PYTORCH_CUDA_ALLOC_CONF="
                      "expandable_segments:True against fragmentation." if worst != "info" else "")
        title = "Host memory" if top["device"] == "host" else "Device memory"  # no device sampled: the host's
        return [Finding(self.name, worst, title, message, suggestion, metrics=metrics, items=items,
                        columns=COLUMNS, figures=FIGURES, labels=LABELS)]


def _same(column: pl.Expr, value) -> pl.Expr:
    return column.is_null() if value is None else column == value


def _int(value):
    return None if value is None else int(value)


def _binary(nbytes) -> str:
    """A byte count in binary units scaled to its size (``1.868 MiB``, not ``0.002 GiB``), as the table shows it."""
    return "?" if nbytes is None else fmt_bytes_binary(nbytes)


def _step_at(steps: pl.DataFrame, trace_id, at: int):
    hit = steps.filter(_same(pl.col("trace_id"), trace_id) & (pl.col("start_ns") <= at) & (pl.col("end_ns") > at))
    return int(hit["step"][0]) if hit.height else None


def _op_at(ops: pl.DataFrame, trace_id, at: int, pid, tid):
    """The innermost operator running at ``at`` (latest start; shorter first on equal starts), on the thread if known."""
    hit = ops.filter(_same(pl.col("trace_id"), trace_id) & (pl.col("start_ns") <= at)
                     & (pl.col("start_ns") + pl.col("duration_ns") > at))
    if pid is not None and tid is not None:
        hit = hit.filter((pl.col("pid") == pid) & (pl.col("tid") == tid))
    if not hit.height:
        return None
    return hit.sort(["start_ns", "duration_ns", "event_id"], descending=[True, False, False])["name"][0]


@hookimpl
def traceparse_rules():
    return [Memory()]
