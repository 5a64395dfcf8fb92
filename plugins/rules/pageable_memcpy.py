"""Rule ``pageable-memcpy``: host-device copies from or to pageable (not page-locked) host memory.

The DMA engine cannot read pageable memory, so the driver stages such a copy
through a pinned bounce buffer in chunks: it runs at a fraction of the link's
rate, and the call returns only when the data is staged, so the copy does not
overlap host work or compute even when issued with cudaMemcpyAsync /
non_blocking=True.

Definition: the host-device copies are memcpy rows with ``copy_kind`` HtoD
or DtoH; the host side of a copy is its ``src_memory`` for HtoD and its
``dst_memory`` for DtoH. A copy is pageable when its host side is
"pageable". Timed events and aggregated rows count alike (calls, total
duration, total bytes); when the trace has timed copies, aggregated memcpy
rows are ignored (they summarize the same copies).

Metrics: ``pageable_copies``, ``pageable_bytes`` (bytes where known),
``pageable_time_ns``, ``host_device_time_ns`` (time of the host-device
copies whose host memory kind is known), ``pageable_share_pct`` = 100 ×
pageable_time_ns / host_device_time_ns, ``pageable_gbps`` and ``pinned_gbps``
(achieved Σ bytes / Σ time of each, for comparison), ``unknown_memory_copies``
(host-device copies whose host memory kind the source does not record, e.g.
nvprof summaries; they are left out). Items: the pageable copies by
``copy_kind`` (with ``src_memory``, ``dst_memory``): ``copies``, ``bytes``,
``time_ns``, ``share_pct`` of host_device_time_ns, ``achieved_gbps``.

Severity: warning when the pageable copies take at least
``min_pageable_time_us`` and ``warning_share_pct`` of the host-device copy
time, not counting pageable HtoD copies of at most ``async_htod_max_bytes``
(64 KiB: the driver stages them and the call returns at once, so they block
nothing; Nsight Systems' ``cuda_memcpy_sync`` rule leaves them out too);
``staged_htod_time_ns`` is their time.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import fmt_bytes, fmt_ns, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace
from traceparse.verdict import aggregated_note

FIGURES = {"pageable_copies": "count", "pageable_bytes": "bytes", "pageable_time_ns": "ns",
           "host_device_time_ns": "ns", "pageable_share_pct": "pct", "pageable_gbps": "gbps", "pinned_gbps": "gbps",
           "unknown_memory_copies": "problem_count"}
#: Screen labels where the key's words would read like another figure: the pageable bytes and throughput apart, the
#: time of the host-device copies whose host memory kind is known (not copy-dominated's of every such copy).
LABELS = {"pageable_bytes": "pageable bytes", "pageable_gbps": "pageable throughput",
          "pinned_gbps": "pinned throughput", "host_device_time_ns": "copy time (memory kind known)"}
COLUMNS = [Column("copy_kind", "copy", "text"), Column("src_memory", "from", "text"), Column("dst_memory", "to", "text"),
           Column("copies", "copies", "count"), Column("bytes", "bytes", "bytes"), Column("time_ns", "time", "ns"),
           Column("share_pct", "share %", "pct"), Column("achieved_gbps", "achieved", "gbps")]
GROUP = ["copy_kind", "src_memory", "dst_memory"]


class PageableMemcpy(Rule):
    name = "pageable-memcpy"
    description = "Host-device copies from/to pageable host memory: slow, and they cannot overlap compute"
    definition = __doc__
    thresholds = {
        "warning_share_pct": 10.0,      # pageable copies take at least this % of host-device copy time ...
        "min_pageable_time_us": 10.0,   # ... and at least this long: warning
        "async_htod_max_bytes": 65536,  # pageable HtoD copies up to this size return at once: not counted
        "top": 10,                      # items listed
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        copies = measures.copy_stats(trace.events)
        ignored_aggregated = int(copies["ignored_rows"].max() or 0)
        host_memory = pl.when(pl.col("copy_kind") == "HtoD").then(pl.col("src_memory")).otherwise(pl.col("dst_memory"))
        host_device = copies.filter(expr.is_copy_kind(expr.HOST_DEVICE)).with_columns(host_memory=host_memory)
        unknown = int(host_device.filter(pl.col("host_memory").is_null())["copies"].sum() or 0)
        known = host_device.filter(pl.col("host_memory").is_not_null() & pl.col("duration_known"))
        pageable = known.filter(pl.col("host_memory") == "pageable")
        pinned = known.filter(pl.col("host_memory") == "pinned")
        total_ns = int(known["time_ns"].sum() or 0)
        n_pageable = int(pageable["copies"].sum() or 0)
        pageable_ns = int(pageable["time_ns"].sum() or 0)
        pageable_bytes = int(pageable["bytes"].sum() or 0)
        share = expr.pct(pageable_ns, total_ns)
        sized = pl.col("bytes").is_not_null()
        groups = (pageable.group_by(GROUP)
                  .agg(copies=pl.col("copies").sum(),
                       bytes=pl.when(pl.col("bytes").count() > 0).then(pl.col("bytes").sum()),
                       time_ns=pl.col("time_ns").sum(), sized_ns=pl.col("time_ns").filter(sized).sum())
                  .sort(["time_ns", *GROUP], descending=[True, False, False, False]))
        items = [{"copy_kind": r["copy_kind"], "src_memory": r["src_memory"], "dst_memory": r["dst_memory"],
                  "copies": r["copies"], "bytes": r["bytes"], "time_ns": r["time_ns"],
                  "share_pct": expr.pct(r["time_ns"], total_ns), "achieved_gbps": expr.gbps(r["bytes"], r["sized_ns"])}
                 for r in groups.head(int(t["top"])).iter_rows(named=True)]
        staged = pageable.filter((pl.col("copy_kind") == "HtoD") & pl.col("mean_bytes").is_not_null()
                                 & (pl.col("mean_bytes") <= t["async_htod_max_bytes"]))
        staged_ns = int(staged["time_ns"].sum() or 0)
        blocking_share = expr.pct(pageable_ns - staged_ns, total_ns)
        warn = (pageable_ns - staged_ns >= t["min_pageable_time_us"] * 1e3
                and grade(blocking_share, warning=t["warning_share_pct"]) != "info")
        if total_ns:
            message = (f"{n_pageable} host-device copies use pageable host memory: {fmt_bytes(pageable_bytes)} "
                       f"in {fmt_ns(pageable_ns)}, {fmt_pct(share)} of the {fmt_ns(total_ns)} of "
                       f"host-device copy time.")
        else:
            message = "No host-device copy says whether its host memory is pageable or pinned."
        if unknown:
            message += f" {unknown:,} host-device copies left out: the source does not record their memory kind."
        message += aggregated_note(ignored_aggregated)
        suggestion = ("Allocate the host buffers page-locked: DataLoader(pin_memory=True) or tensor.pin_memory() "
                      "in PyTorch, cudaHostAlloc/cudaMallocHost or cudaHostRegister in CUDA; then copy with "
                      "non_blocking=True / cudaMemcpyAsync on a side stream so the copies overlap compute."
                      if warn else "")
        return [Finding(self.name, "warning" if warn else "info",
                        "Pageable memcpy" if warn else "Host memory of copies", message, suggestion,
                        metrics={"pageable_copies": n_pageable, "pageable_bytes": pageable_bytes,
                                 "pageable_time_ns": pageable_ns, "host_device_time_ns": total_ns,
                                 "pageable_share_pct": share,
                                 "pageable_gbps": _achieved(pageable), "pinned_gbps": _achieved(pinned),
                                 "unknown_memory_copies": unknown, "staged_htod_time_ns": staged_ns},
                        items=items, columns=COLUMNS, figures=FIGURES, labels=LABELS, impact_ns=pageable_ns)]


def _achieved(copies: pl.DataFrame) -> float | None:
    """Σ bytes / Σ duration over the copies whose size is known, in GB/s."""
    sized = copies.filter(pl.col("bytes").is_not_null())
    return expr.gbps(int(sized["bytes"].sum() or 0), int(sized["time_ns"].sum() or 0))


@hookimpl
def traceparse_rules():
    return [PageableMemcpy()]
