"""Device memory over time: the allocator's allocated and reserved totals, their peaks, and a timeline."""

from __future__ import annotations

import polars as pl

from traceparse.measures.base import DEVICE, Measure, keyed, unkeyed

#: Counter names that carry the allocator's totals, by series. torch.profiler's ``[memory]`` events
#: (profile_memory=True) become counter rows: ``[memory]`` / ``allocated_bytes`` = total allocated after the
#: event, ``[memory] reserved`` / ``reserved_bytes`` = total reserved (cached by the allocator).
MEMORY_COUNTERS = {
    "allocated": ("allocated_bytes", "[memory]", "[memory] allocated"),
    "reserved": ("reserved_bytes", "[memory] reserved"),
}
SERIES = tuple(MEMORY_COUNTERS)


def memory_series() -> pl.Expr:
    """``allocated`` or ``reserved`` for a counter row of :data:`MEMORY_COUNTERS`, else null."""
    name = pl.col("name")
    out = pl.lit(None, dtype=pl.String)
    for series, names in reversed(MEMORY_COUNTERS.items()):
        out = pl.when(name.is_in(list(names))).then(pl.lit(series)).otherwise(out)
    return out


class MemorySamples(Measure):
    """The allocator's samples: every timed counter row of :data:`MEMORY_COUNTERS`, in time order.

    Columns: ``trace_id``, ``device_id`` (null: host memory, or a source that
    does not say), ``series`` (allocated or reserved), ``start_ns``,
    ``value`` (bytes), ``event_id``, ``pid``, ``tid``. Sorted by device,
    series, time, event id.

    Part: the rows (a projection); combine: the sort. Valid partitions:
    device, trace, row chunks.
    """

    name = "memory_samples"
    per_trace = True

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        rows = events.filter((pl.col("kind") == "counter") & pl.col("start_ns").is_not_null()
                             & pl.col("value").is_not_null())
        return keyed(rows.select("trace_id", "device_id", series=memory_series(), start_ns="start_ns",
                                 value="value", event_id="event_id", pid="pid", tid="tid")
                     .filter(pl.col("series").is_not_null()))

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        return unkeyed(pl.concat(parts).sort(*DEVICE, "series", "start_ns", "event_id"))


class MemoryPeaks(Measure):
    """Per device and series, the peak of the allocator's total and when it is first reached.

    Over :class:`MemorySamples`, per (``trace_id``, ``device_id``,
    ``series``): ``samples``, ``first_ns`` / ``last_ns`` (first and last
    sample), ``min_bytes``, ``peak_bytes`` (the largest value), ``peak_ns``
    (the time of the first sample at the peak), ``peak_event_id``,
    ``peak_pid``, ``peak_tid`` (that sample's), ``final_bytes`` (the value of
    the last sample). Sorted by device and series.

    Part: the samples; combine: the figures. Valid partitions: device, trace,
    row chunks.
    """

    name = "memory_peaks"
    per_trace = True

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        return memory_samples.part(events)

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        samples = keyed(memory_samples.combine(parts))
        keys = [*DEVICE, "series"]
        at_peak = pl.col("value") == pl.col("value").max()
        out = (samples.group_by(keys).agg(
            samples=pl.len().cast(pl.Int64), first_ns=pl.col("start_ns").min(), last_ns=pl.col("start_ns").max(),
            min_bytes=pl.col("value").min(), peak_bytes=pl.col("value").max(),
            peak_ns=pl.col("start_ns").filter(at_peak).first(), peak_event_id=pl.col("event_id").filter(at_peak).first(),
            peak_pid=pl.col("pid").filter(at_peak).first(), peak_tid=pl.col("tid").filter(at_peak).first(),
            final_bytes=pl.col("value").last())
            .sort(keys))
        return unkeyed(out)


def sparkline(times: list[int], values: list[float], width: int = 40, lo: float | None = None,
              hi: float | None = None) -> str:
    """A terminal sparkline of a step series: ``width`` equal time bins, each the largest value in it (or carried).

    Block characters ▁..█ scale from ``lo`` (default the smallest value) to ``hi`` (default the largest).

    >>> sparkline([0, 10, 20, 30], [0, 5, 10, 5], width=4)
    '▁▅█▅'
    """
    if not times:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    t0, t1 = times[0], times[-1]
    span = max(t1 - t0, 1)
    bins: list[float | None] = [None] * width
    for t, v in zip(times, values):
        b = min(int((t - t0) * width / span), width - 1) if t1 > t0 else 0
        bins[b] = v if bins[b] is None else max(bins[b], v)
    out, current = [], values[0]
    for b in bins:
        current = current if b is None else b
        level = 0 if hi <= lo else round((current - lo) / (hi - lo) * (len(blocks) - 1))
        out.append(blocks[level])
    return "".join(out)


memory_samples = MemorySamples()
memory_peaks = MemoryPeaks()
