"""Rule ``api-share``: where the host's CUDA API time goes, by call and by class of call.

As in the seed report's cudaLaunchKernel and memory-API analysis, and
nvprof's "API calls" section. Definition: the rows of kind ``api`` (CUDA
runtime and driver calls), timed events and aggregated rows alike, grouped
by name: calls = Σ calls, time_ns = Σ duration_ns, share_pct = 100 ×
time_ns / api_time_ns, where api_time_ns is the total time of all API rows
(so shares add up to 100, like nvprof's Time(%) column of "API calls"). When
the trace has timed API events, aggregated API rows are ignored (they
summarize the same calls). Calls that nest, e.g. a driver call inside a
runtime call where a tool records both, count in both.

Each name gets the class of the first pattern of :data:`API_CLASSES` that
matches it (a regular expression on the start of the name, so version
suffixes such as ``_v11060`` or ``_ptsz`` still match); names matching none
are "other".

Metrics: ``api_time_ns``, ``api_calls``, ``api_names`` (distinct names),
``classes`` ({class: {calls, time_ns, share_pct}}), and one
``<class>_share_pct`` per class (launch, memcpy, synchronize, allocation,
other). Items: the names with the most time: ``name``, ``class``, ``calls``,
``time_ns``, ``share_pct``.

Severity: warning when a class's share reaches its ``<class>_warning_pct``.
By default only launch (80%: the host does little but launch kernels, the
seed's case, typical of launch-bound small kernels) and allocation (20%:
allocation in the steady state can be avoided) warn; a host blocked in a
synchronize or a synchronous copy is waiting for the GPU, which is normal
when the GPU is the bottleneck, so those are off (101) unless set lower.
"""

from __future__ import annotations

import polars as pl

from traceparse.plugins import hookimpl
from traceparse.rule import Finding, Rule, RuleOptions
from traceparse.trace import Trace
from traceparse_plugins.rules._rows import calls_expr, first_match, pct, prefer_timed

#: (class, regular expression matched at the start of the API name); the first match wins.
API_CLASSES: list[tuple[str, str]] = [
    # kernel launches, including CUDA < 9's cudaConfigureCall/cudaSetupArgument/cudaLaunch sequence and graphs
    ("launch", r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch|cudaConfigureCall|cudaSetupArgument"
               r"|__cudaPushCallConfiguration|__cudaPopCallConfiguration)"),
    # data movement: copies, memsets, managed-memory prefetch
    ("memcpy", r"^(cudaMemcpy|cuMemcpy|cudaMemset|cuMemset|cudaMemPrefetchAsync|cuMemPrefetchAsync)"),
    # the host waits for the GPU
    ("synchronize", r"^(cudaDeviceSynchronize|cudaThreadSynchronize|cudaStreamSynchronize|cudaEventSynchronize"
                    r"|cudaStreamWaitEvent|cuCtxSynchronize|cuStreamSynchronize|cuEventSynchronize"
                    r"|cuStreamWaitEvent)"),
    # device, host (pinned) and managed memory allocation and release
    ("allocation", r"^(cudaMalloc|cudaFree|cudaHostAlloc|cudaHostRegister|cudaHostUnregister|cudaMemPool"
                   r"|cuMemAlloc|cuMemFree|cuMemHostAlloc|cuMemHostRegister|cuMemHostUnregister|cuMemCreate"
                   r"|cuMemRelease|cuMemMap|cuMemUnmap|cuMemAddressReserve|cuMemAddressFree|cuMemPool)"),
]
OTHER = "other"
CLASSES = tuple(c for c, _ in API_CLASSES) + (OTHER,)

SUGGESTIONS = {
    "launch": ("The host spends its API time launching kernels: with many short kernels the GPU waits for the "
               "launches. Launch fewer, larger kernels: CUDA graphs (torch.cuda.graphs, torch.compile "
               "mode='reduce-overhead'), kernel fusion (torch.compile), larger batches."),
    "memcpy": ("Synchronous copies block the host: use cudaMemcpyAsync / non_blocking=True from pinned memory, "
               "and fewer, larger copies."),
    "synchronize": ("The host often waits for the GPU: remove synchronisations from the step (.item(), .cpu(), "
                    "printing tensors, torch.cuda.synchronize) or move them to the end of the step."),
    "allocation": ("Allocation and release calls take a large share: reuse buffers (a caching allocator or "
                   "memory pool, cudaMallocAsync), allocate once outside the loop, avoid cudaFree in the loop."),
    "other": "Look at the top calls: queries and attribute calls in the loop can usually be hoisted out of it.",
}


def classify(names: pl.Expr) -> pl.Expr:
    """A polars expression giving the class of each API name (see :data:`API_CLASSES`)."""
    return first_match(names, API_CLASSES, OTHER)


class ApiShare(Rule):
    name = "api-share"
    description = "CUDA API time by call and by class (launch, memcpy, synchronize, allocation, other)"
    definition = __doc__
    thresholds = {
        "top": 15,                          # items listed
        "launch_warning_pct": 80.0,         # a class's share of API time at or above its value is a warning
        "memcpy_warning_pct": 101.0,        # (101: off)
        "synchronize_warning_pct": 101.0,
        "allocation_warning_pct": 20.0,
        "other_warning_pct": 101.0,
    }
    kinds = ("api",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        api, ignored_aggregated = prefer_timed(trace.events.filter(pl.col("kind") == "api"))
        by_name = (api.with_columns(calls=calls_expr(), duration_ns=pl.col("duration_ns").fill_null(0))
                   .group_by("name").agg(calls=pl.col("calls").sum(), time_ns=pl.col("duration_ns").sum())
                   .with_columns(**{"class": classify(pl.col("name").fill_null(""))})
                   .sort(["time_ns", "name"], descending=[True, False]))
        total = int(by_name["time_ns"].sum() or 0)
        calls = int(by_name["calls"].sum() or 0)
        by_class = by_name.group_by("class").agg(calls=pl.col("calls").sum(), time_ns=pl.col("time_ns").sum())
        per_class = {r["class"]: r for r in by_class.iter_rows(named=True)}
        classes = {c: {"calls": per_class.get(c, {}).get("calls", 0), "time_ns": per_class.get(c, {}).get("time_ns", 0),
                       "share_pct": pct(per_class.get(c, {}).get("time_ns", 0), total)} for c in CLASSES}
        items = [{"name": r["name"], "class": r["class"], "calls": r["calls"], "time_ns": r["time_ns"],
                  "share_pct": pct(r["time_ns"], total)}
                 for r in by_name.head(int(t["top"])).iter_rows(named=True)]
        flagged = [c for c in CLASSES
                   if classes[c]["share_pct"] is not None and classes[c]["share_pct"] >= t[f"{c}_warning_pct"]]
        if total:
            ranked = sorted(CLASSES, key=lambda c: -classes[c]["time_ns"])
            message = (f"{calls} API calls ({by_name.height} distinct) take {total / 1e6:.3f} ms; "
                       + ", ".join(f"{c} {classes[c]['share_pct']:.1f}%" for c in ranked if classes[c]["time_ns"])
                       + f". The top call is {items[0]['name']} ({items[0]['share_pct']:.1f}%).")
        else:
            message = f"{calls} API calls, with no recorded time."
        if ignored_aggregated:
            message += (f" {ignored_aggregated} aggregated API rows ignored: the trace's timed API events "
                        "already count those calls.")
        metrics = {"api_time_ns": total, "api_calls": calls, "api_names": by_name.height, "classes": classes}
        metrics.update({f"{c}_share_pct": classes[c]["share_pct"] for c in CLASSES})
        return [Finding(self.name, "warning" if flagged else "info",
                        "API time dominated by " + " and ".join(flagged) if flagged else "Where the API time goes",
                        message, " ".join(SUGGESTIONS[c] for c in flagged), metrics=metrics, items=items)]


@hookimpl
def traceparse_rules():
    return [ApiShare()]
