"""Rule ``low-memcpy-throughput``: achieved bytes/s of copies against the peak of the link they cross.

The Visual Profiler's "Low Memcpy Throughput". Definition: over memcpy rows
whose ``bytes`` and ``duration_ns`` are both known (timed events, and
aggregated rows, whose totals give the same ratio), per copy direction
achieved_gbps = Σ bytes / Σ duration_ns (bytes per ns = GB/s, 1 GB = 10⁹ B),
i.e. the time-weighted mean throughput. When the trace has timed copies,
aggregated memcpy rows are ignored (they summarize the same copies).

Peaks (per direction, GB/s):
- HtoD and DtoH: the host link of the GPU (PCIe generation × lanes, or
  NVLink-C2C), from the GPU catalog entry of ``--gpu`` or of the device the
  trace names (``host_link.gbps``); ``host_link_gbps`` > 0 overrides it; when
  neither is known, ``default_host_link_gbps`` = 15.75, the per-direction
  rate of PCIe 3.0 x16 (8 GT/s × 16 lanes × 128/130 encoding / 8), the link of
  the K80, P40, P100 and V100 PCIe cards of nvprof's time. Like the
  catalog's figures it is the spec-sheet rate: pinned copies usually reach
  75-85% of it, pageable ones much less. The message says which peak was used.
- DtoD: the GPU's DRAM bandwidth (catalog ``dram_gbps``, or ``dram_gbps`` > 0);
  a device-to-device copy reads and writes every byte, so its DRAM traffic is
  2 × bytes (as CUDA's bandwidthTest counts it): pct_of_peak = 100 × 2 ×
  achieved_gbps / peak. No DRAM figure: no peak.
- PtoP and HtoH: no peak (listed, peak null).

Metrics (the host-device copies, HtoD and DtoH together): ``achieved_gbps``,
``peak_gbps``, ``pct_of_peak`` = 100 × achieved_gbps / peak_gbps,
``copy_time_ns``, ``bytes``, ``peak_source``; ``skipped_copies`` counts copies of
unknown direction, size or duration. Items, one per direction: ``copy_kind``,
``copies``, ``bytes``, ``time_ns``, ``achieved_gbps``, ``peak_gbps``,
``pct_of_peak``, ``link``, ``above_peak``.

No share of a peak above 100% is given: a direction whose copies ran faster
than its assumed peak (device-to-device copies served partly from the L2
cache, a host link faster than the catalog's) has ``pct_of_peak`` null and
``above_peak`` true, and the message says why; so has the host-device
``pct_of_peak`` metric, where the copies together or either direction alone ran faster than the assumed
peak (and no time is at stake).

Severity: warning when the host-device pct_of_peak is under
``warning_below_pct`` and host-device copies take at least
``min_copy_time_us``; critical under ``critical_below_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import measures
from traceparse.catalog import gpu_for_trace
from traceparse.expr import HOST_DEVICE, gbps, pct
from traceparse.errors import spelled
from traceparse.figures import fmt_bytes, fmt_count, fmt_ns, fmt_number, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace
from traceparse.verdict import aggregated_note

FIGURES = {"achieved_gbps": "gbps", "peak_gbps": "gbps", "pct_of_peak": "pct", "copy_time_ns": "ns",
           "bytes": "bytes", "peak_source": "text", "skipped_copies": "problem_count"}
#: Screen labels where the key's words would read like another figure: the host link's peak (not the roofline's DRAM
#: peak), the time of the host-device copies whose size is known (not copy-dominated's of every copy).
LABELS = {"peak_gbps": "link peak", "copy_time_ns": "copy time (size known)"}
COLUMNS = [Column("copy_kind", "copy", "text"), Column("copies", "copies", "count"), Column("bytes", "bytes", "bytes"),
           Column("time_ns", "time", "ns"), Column("achieved_gbps", "achieved", "gbps"),
           Column("peak_gbps", "peak", "gbps"), Column("pct_of_peak", "% of peak", "pct"), Column("link", "link", "text")]

#: Each direction's link and how many times a copied byte crosses it.
LINKS = {"HtoD": ("host link", 1), "DtoH": ("host link", 1), "DtoD": ("DRAM", 2)}


class LowMemcpyThroughput(Rule):
    name = "low-memcpy-throughput"
    description = "Achieved copy throughput against the peak of the host link (HtoD/DtoH) or DRAM (DtoD)"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 50.0,          # host-device copies under this % of the link's peak: warning
        "critical_below_pct": 10.0,         # ... under this %: critical
        "min_copy_time_us": 100.0,          # ... when host-device copies take at least this long
        "host_link_gbps": 0.0,              # > 0: the host link's peak per direction, overriding the catalog
        "default_host_link_gbps": 15.75,    # used when the GPU is unknown: PCIe 3.0 x16 per direction
        "dram_gbps": 0.0,                   # > 0: DRAM bandwidth for DtoD copies, overriding the catalog
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        copies = measures.copy_stats(trace.events)
        ignored_aggregated = int(copies["ignored_rows"].max() or 0)
        usable = pl.col("copy_kind").is_not_null() & pl.col("mean_bytes").is_not_null() & pl.col("duration_known")
        skipped = int(copies.filter(~usable)["copies"].sum() or 0)
        per_kind = (copies.filter(usable).group_by("copy_kind")
                    .agg(copies=pl.col("copies").sum(), bytes=pl.col("bytes").sum(), time_ns=pl.col("time_ns").sum())
                    .sort("time_ns", "copy_kind", descending=[True, False]))
        host_peak, host_source, dram_peak, dram_source = _peaks(trace, options)
        peaks = {"host link": host_peak, "DRAM": dram_peak}
        items = []
        for r in per_kind.iter_rows(named=True):
            link, factor = LINKS.get(r["copy_kind"], (None, 1))
            peak = peaks.get(link)
            achieved = gbps(r["bytes"], r["time_ns"])
            share = pct(factor * r["bytes"] / r["time_ns"], peak) if peak and r["time_ns"] else None
            items.append({"copy_kind": r["copy_kind"], "copies": r["copies"], "bytes": r["bytes"],
                          "time_ns": r["time_ns"], "achieved_gbps": achieved, "peak_gbps": peak,
                          "pct_of_peak": None if share is not None and share > 100 else share,
                          "link": link if factor == 1 else f"{link}, read + write",  # the share counts both
                          "above_peak": share is not None and share > 100})
        host = per_kind.filter(pl.col("copy_kind").is_in(HOST_DEVICE))
        host_bytes = int(host["bytes"].sum() or 0)
        host_ns = int(host["time_ns"].sum() or 0)
        achieved = gbps(host_bytes, host_ns)
        host_pct = pct(host_bytes / host_ns, host_peak) if host_ns else None
        # one direction faster than the peak assumed for each disproves it too (HtoD at 17.14 GB/s beside
        # DtoH at 12.25 on a link assumed 15.75: "96.1% of it" together, and 156.6 ms lost against it)
        faster = max((i for i in items if i["copy_kind"] in HOST_DEVICE and i["above_peak"]),
                     key=lambda i: i["achieved_gbps"] or 0, default=None)
        host_above = host_pct is not None and (host_pct > 100 or faster is not None)
        if host_above:  # no share of a peak above 100%: the assumed peak is not the link's
            host_pct = None
        severity = "info"
        if host_ns >= t["min_copy_time_us"] * 1e3:
            severity = grade(host_pct, warning=t["warning_below_pct"], critical=t["critical_below_pct"],
                             higher_is_worse=False)
        if host_ns and host_above:
            rate = (f"{fmt_number(achieved)} GB/s, above" if faster is None else
                    f"{fmt_number(achieved)} GB/s, {faster['copy_kind']} alone {fmt_number(faster['achieved_gbps'])} "
                    "GB/s, above")
            message = (f"Host-device copies moved {fmt_bytes(host_bytes)} in {fmt_ns(host_ns)}: "
                       f"{rate} the {host_peak:,g} GB/s per direction assumed for the "
                       "host link "
                       f"({host_source}), so the link is faster than assumed and no share of its peak is given: "
                       + spelled("pass --gpu NAME or --set low-memcpy-throughput.host_link_gbps=GBPS.",
                                 'pass gpu=NAME or settings={"low-memcpy-throughput": {"host_link_gbps": GBPS}}.'))
        elif host_ns:
            message = (f"Host-device copies moved {fmt_bytes(host_bytes)} in {fmt_ns(host_ns)}: "
                       f"{fmt_number(achieved)} GB/s, {fmt_pct(host_pct)} of the host link's {host_peak:,g} GB/s "
                       "per direction. "
                       f"Peak: {host_source}.")
        else:
            message = "No host-device copy with a known size and duration."
        dtod = next((i for i in items if i["copy_kind"] == "DtoD"), None)
        if dtod is not None:
            if dtod["above_peak"]:
                dram_part = (f", faster than the DRAM bandwidth allows ({dram_peak:,g} GB/s, counting the read and the "
                             f"write; peak: {dram_source}): the bytes came partly from the L2 cache, so no share of "
                             "the DRAM peak is given.")
            elif dtod["pct_of_peak"] is not None:
                dram_part = (f", {fmt_pct(dtod['pct_of_peak'])} of the DRAM bandwidth, {dram_peak:,g} GB/s, counting "
                             f"the read and the write; peak: {dram_source}.")
            else:
                dram_part = f"; no DRAM peak: {dram_source}."
            message += f" Device-to-device copies: {fmt_number(dtod['achieved_gbps'])} GB/s" + dram_part
        if skipped:
            host_skipped = int(copies.filter(~usable & pl.col("copy_kind").is_in(HOST_DEVICE))["copies"].sum() or 0)
            of_host = f" ({host_skipped:,} of them host-device)" if host_skipped and host_skipped < skipped else ""
            message += (f" {fmt_count(skipped, 'copy', 'copies')} skipped{of_host}: direction, size or duration "
                        "unknown.")
        message += aggregated_note(ignored_aggregated)
        suggestion = ""
        if severity != "info":
            host_rows = copies.filter(usable & pl.col("copy_kind").is_in(HOST_DEVICE))
            pinned = host_rows.height > 0 and bool(  # every host side known and pinned: nothing to pin
                (pl.concat([host_rows["src_memory"], host_rows["dst_memory"]]).cast(pl.String)
                 .is_in(["pinned", "device"])).fill_null(False).all())  # a side of unknown memory is not known pinned
            suggestion = (("The copies are from and to pinned memory already: merge small copies into large ones "
                           "(see inefficient-memcpy-size)" if pinned else
                           "Copy from pinned host memory (DataLoader(pin_memory=True), tensor.pin_memory(), "
                           "cudaHostAlloc/cudaHostRegister) so the DMA engine reads it directly, and merge small "
                           "copies into large ones (see pageable-memcpy and inefficient-memcpy-size)")
                          + ". If the link is slower than assumed (a x8 slot, an older PCIe generation), set "
                          "low-memcpy-throughput.host_link_gbps.")
        return [Finding(self.name, severity, "Low memcpy throughput" if severity != "info" else "Memcpy throughput",
                        message, suggestion,
                        metrics={"achieved_gbps": achieved, "peak_gbps": host_peak, "pct_of_peak": host_pct,
                                 "copy_time_ns": host_ns, "bytes": host_bytes, "peak_source": host_source,
                                 "skipped_copies": skipped},
                        items=items, columns=COLUMNS, figures=FIGURES,
                        labels=LABELS,  # at stake: the time beyond the copies at peak
                        impact_ns=max(0, host_ns - round(host_bytes / host_peak))
                        if host_peak and not host_above else None)]


def _peaks(trace: Trace, options: RuleOptions) -> tuple[float, str, float | None, str]:
    """(host link peak, where it came from, DRAM peak or None, where it came from), in GB/s."""
    t = options.thresholds
    spec, how = gpu_for_trace(trace, options.gpu)
    link_gbps, link_name = _host_link(spec)
    if t["host_link_gbps"] > 0:
        host, host_source = float(t["host_link_gbps"]), "set with low-memcpy-throughput.host_link_gbps"
    elif link_gbps:
        host = float(link_gbps)
        host_source = f"{link_name + ' of ' if link_name else ''}{how}"
    else:
        host = float(t["default_host_link_gbps"])
        why = f"{spec['name']} has no host link figure in the catalog" if spec else how
        host_source = (f"assumed: PCIe 3.0 x16 by default, because {why}; "
                       "set low-memcpy-throughput.host_link_gbps to change it")
    if t["dram_gbps"] > 0:
        return host, host_source, float(t["dram_gbps"]), "set with low-memcpy-throughput.dram_gbps"
    if spec and spec.get("dram_gbps"):
        return host, host_source, float(spec["dram_gbps"]), how
    why = f"{spec['name']} has no DRAM figure in the catalog" if spec else how
    return host, host_source, None, why


def _host_link(spec: dict | None) -> tuple[float | None, str | None]:
    """The host link's GB/s per direction and its name, from a catalog entry (``host_link: {gbps, name}``)."""
    if not spec:
        return None, None
    link = spec.get("host_link")
    if isinstance(link, dict):
        return link.get("gbps"), link.get("name")
    return spec.get("host_link_gbps"), None


@hookimpl
def traceparse_rules():
    return [LowMemcpyThroughput()]
