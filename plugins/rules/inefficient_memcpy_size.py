"""Rule ``inefficient-memcpy-size``: many small copies, which cannot reach the link's bandwidth.

The Visual Profiler's "Inefficient Memcpy Size". Each copy pays a fixed cost
(the API call, DMA setup, a PCIe round trip) besides its bytes/bandwidth
time, so a copy of ``s`` bytes over a link of bandwidth ``B`` with fixed cost
``L`` reaches at most ``s / (s + L·B)`` of the link's peak.

Definition: the copies considered are memcpy rows whose direction
(``copy_kind``) is in the ``copy_kinds`` threshold (default HtoD, DtoH, PtoP:
the copies that cross a link) and whose ``bytes`` and ``duration_ns`` are
known. A copy's size is ``bytes / calls``: exact for a timed event (calls =
1); for an aggregated row (nvprof / nsys summaries) it is the mean size, and
the row's calls count as small, or not, all together: on a summary alone the
message says so (a row of mean 7.8 MB may hold many 3 kB copies). A copy is *small* when
its size is under ``small_below_bytes``. When the trace has timed copies,
aggregated memcpy rows are ignored (they summarize the same copies).

Metrics: ``copies`` and ``copy_time_ns`` (the copies considered),
``small_copies``, ``small_copy_time_ns``, ``small_bytes``,
``small_copy_share_pct`` = 100 × small_copy_time_ns / copy_time_ns,
``skipped_copies`` (copies of unknown direction or size, not considered).
Items: the small copies grouped by direction and size (``copy_kind``,
``size_bytes``; an aggregated row gives its mean size, marked
``aggregated``), with ``copies``, ``time_ns``, ``avg_ns``, ``share_pct`` (of
copy_time_ns) and ``achieved_gbps``, the most time first.

Default threshold, 128 KiB, from torch.profiler traces on an H100 (PCIe 5.0 x16): large
pinned copies reach 54 GB/s, a 32-128 byte copy takes 0.8-1.0 µs on the GPU
and its cudaMemcpyAsync call 7-10 µs on the host. With the GPU-side cost
alone (L ≈ 1 µs, L·B ≈ 54 KB) a 128 KiB copy reaches at most 71% of the
achievable rate; counting the host call (L ≈ 8 µs) it reaches 23% on PCIe 5.0
and, with PCIe 3.0's ≈ 12 GB/s (L·B ≈ 96 KB), 58%. Below 128 KiB, fixed costs
take over a quarter of a copy's time on every PCIe generation.

Severity: warning when ``small_copies`` ≥ ``min_small_copies``, they take
at least ``min_small_time_us`` and ``small_copy_share_pct`` ≥
``warning_share_pct``; critical from ``critical_share_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace
from traceparse.verdict import aggregated_note

FIGURES = {"copies": "count", "copy_time_ns": "ns", "small_copies": "count", "small_copy_time_ns": "ns",
           "small_bytes": "bytes", "small_copy_share_pct": "pct", "skipped_copies": "problem_count"}
#: Screen labels where the key's words would read like another figure: the time of the copies that cross a link (HtoD,
#: DtoH, PtoP), not copy-dominated's of every copy.
LABELS = {"copy_time_ns": "link copy time"}
COLUMNS = [Column("copy_kind", "copy", "text"), Column("size_bytes", "size", "bytes_binary"),
           Column("copies", "copies", "count"), Column("time_ns", "time", "ns"), Column("avg_ns", "mean", "ns"),
           Column("share_pct", "share %", "pct"), Column("achieved_gbps", "achieved", "gbps"),
           Column("aggregated", "aggregated", "text")]


class InefficientMemcpySize(Rule):
    name = "inefficient-memcpy-size"
    description = "Small copies whose fixed per-copy cost keeps them far from the link's bandwidth"
    definition = __doc__
    thresholds = {
        "small_below_bytes": 131072,              # a copy under this size is small (128 KiB; see the definition)
        "copy_kinds": ["HtoD", "DtoH", "PtoP"],   # copy directions considered
        "min_small_copies": 10,                   # fewer small copies than this is never a warning
        "min_small_time_us": 100.0,               # small copies taking less time than this: never a warning
        "warning_share_pct": 25.0,                # small copies take at least this % of copy time: warning
        "critical_share_pct": 75.0,               # ... and at least this %: critical
        "top": 10,                                # items listed
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        copies = measures.copy_stats(trace.events)
        ignored_aggregated = int(copies["ignored_rows"].max() or 0)
        usable = (expr.is_copy_kind(t["copy_kinds"]) & pl.col("mean_bytes").is_not_null() & pl.col("duration_known"))
        in_scope = pl.col("copy_kind").is_null() | expr.is_copy_kind(t["copy_kinds"])
        skipped = int(copies.filter(in_scope & ~usable)["copies"].sum() or 0)
        considered = copies.filter(usable).with_columns(small=pl.col("mean_bytes") < int(t["small_below_bytes"]))
        n_copies = int(considered["copies"].sum() or 0)
        copy_ns = int(considered["time_ns"].sum() or 0)
        small = considered.filter("small")
        n_small = int(small["copies"].sum() or 0)
        small_ns = int(small["time_ns"].sum() or 0)
        small_bytes = int(small["bytes"].sum() or 0)
        share = expr.pct(small_ns, copy_ns)
        groups = (small.group_by("copy_kind", "size_bytes", "aggregated")
                  .agg(copies=pl.col("copies").sum(), time_ns=pl.col("time_ns").sum(), bytes=pl.col("bytes").sum())
                  .sort(["time_ns", "copies", "size_bytes", "copy_kind"], descending=[True, True, False, False]))
        items = []
        for r in groups.head(int(t["top"])).iter_rows(named=True):
            item = {"copy_kind": r["copy_kind"], "size_bytes": r["size_bytes"], "copies": r["copies"],
                    "time_ns": r["time_ns"], "avg_ns": round(r["time_ns"] / r["copies"], 1),
                    "share_pct": expr.pct(r["time_ns"], copy_ns), "achieved_gbps": expr.gbps(r["bytes"], r["time_ns"])}
            if r["aggregated"]:
                item["aggregated"] = True
            items.append(item)
        severity = "info"
        if n_small >= int(t["min_small_copies"]) and small_ns >= t["min_small_time_us"] * 1000:
            severity = grade(share, warning=t["warning_share_pct"], critical=t["critical_share_pct"])
        limit = _size(int(t["small_below_bytes"]))
        kinds = "/".join(t["copy_kinds"])
        if n_copies == 0:
            message = (f"No {kinds} copy with a known size and duration"
                       + (f" ({skipped} copies skipped: direction or size unknown)." if skipped else "."))
        elif bool(considered["aggregated"].all()):  # a summary: one mean size per row, not each copy's
            message = (f"{n_copies:,} {kinds} copies in summary rows, which give a mean size per row, not each "
                       f"copy's: {n_small:,} are in rows whose mean is under {limit}, taking {fmt_ns(small_ns)}, "
                       f"{fmt_pct(share or 0)} of the {fmt_ns(copy_ns)} of copy time. How many single copies are "
                       f"under {limit} a summary cannot say (a row of mean 7.8 MB may hold many 3 kB copies).")
        else:
            message = (f"{n_small:,} of {n_copies:,} {kinds} copies are smaller than {limit}; they take "
                       f"{fmt_ns(small_ns)}, {fmt_pct(share or 0)} of the {fmt_ns(copy_ns)} of copy time.")
            if skipped:
                message += f" {skipped} copies skipped: direction or size unknown."
        message += aggregated_note(ignored_aggregated)
        suggestion = ""
        if severity != "info":
            suggestion = ("Batch small transfers into fewer, larger ones: gather small tensors into one "
                          "contiguous (pinned) buffer and copy it once, keep small constants and scalars on the "
                          "GPU instead of copying them every step, and avoid per-element .item()/.cpu() calls.")
        return [Finding(self.name, severity, "Inefficient memcpy size" if severity != "info" else "Memcpy sizes",
                        message, suggestion,
                        metrics={"copies": n_copies, "copy_time_ns": copy_ns, "small_copies": n_small,
                                 "small_copy_time_ns": small_ns, "small_bytes": small_bytes,
                                 "small_copy_share_pct": share, "skipped_copies": skipped},
                        items=items, columns=COLUMNS, figures=FIGURES, labels=LABELS, impact_ns=small_ns)]


def _size(n: int) -> str:
    """A byte count in KiB/MiB when it is a whole number of them."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


@hookimpl
def traceparse_rules():
    return [InefficientMemcpySize()]
