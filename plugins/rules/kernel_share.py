"""Rule ``kernel-share``: which kernels own the GPU time.

Definition: kernels are grouped by name; for each, calls = sum of calls and
time_ns = sum of duration_ns (so aggregated rows, e.g. nvprof summaries,
count with their totals); share_pct = 100 × time_ns / total kernel time, and
gpu_share_pct = 100 × time_ns / total GPU activity time (kernels, memcpy and
memset: nvprof's "GPU activities" Time(%)). Items are sorted by time. Each
kernel also gets a category from :data:`CATEGORIES`, the first pattern that
matches its name (case-insensitive), and the finding's metrics give the time
and share per category.
"""

from __future__ import annotations

import polars as pl

from traceparse.plugins import hookimpl
from traceparse.rule import Finding, Rule, RuleOptions
from traceparse.trace import Trace
from traceparse_plugins.rules._rows import first_match

#: (category, regular expression on the kernel name); the first match wins.
CATEGORIES: list[tuple[str, str]] = [
    ("communication", r"nccl"),
    ("normalization", r"batch_?norm|layer_?norm|group_?norm|instance_?norm|rms_?norm|\bbn_(fw|bw)|::bn_|welford"),
    ("pooling", r"pool"),
    ("gemm/conv", r"gemm|gemv|conv|cutlass|xmma|wgmma|hmma|winograd|dgrad|wgrad|fprop|matmul|splitkreduce|cublas"
                  r"|s1688|h1688|s884|h884|s16816|h16816|implicit_convolve"),
    ("reduction", r"reduce|reduction|softmax|nll_loss|cross_entropy|argmax|argmin|topk|cumsum|scan_kernel"),
    ("elementwise", r"elementwise|vectorized|multi_tensor_apply|foreach|fill|copy|threshold|relu|sigmoid|tanh"
                    r"|gelu|silu|dropout|clamp|scale|add_kernel|mul_kernel|cast"),
]
OTHER = "other"


def categorize(names: pl.Expr) -> pl.Expr:
    """A polars expression giving the category of each kernel name (see :data:`CATEGORIES`)."""
    return first_match(names, CATEGORIES, OTHER, lowercase=True)


class KernelShare(Rule):
    name = "kernel-share"
    description = "Kernels ranked by total GPU time, with their share, and time per kernel category"
    definition = __doc__
    thresholds = {
        "top": 15,                        # items listed
        "dominant_kernel_pct": 101.0,     # a kernel above this share is a warning (off by default)
    }
    kinds = ("kernel",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        kernels = events.filter(pl.col("kind") == "kernel")
        gpu_ns = int(events.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))["duration_ns"].sum() or 0)
        timed = pl.col("duration_ns").count() > 0  # a sum over no durations is unknown, not 0
        by_name = (kernels.group_by("name")
                   .agg(calls=pl.col("calls").sum(), time_ns=pl.when(timed).then(pl.col("duration_ns").sum()))
                   .with_columns(category=categorize(pl.col("name")))
                   .sort(["time_ns", "name"], descending=[True, False]))
        total = int(by_name["time_ns"].sum() or 0)
        known = by_name["time_ns"].null_count() < by_name.height
        by_name = by_name.with_columns(
            share_pct=(100.0 * pl.col("time_ns") / total) if total else pl.lit(None, dtype=pl.Float64),
            gpu_share_pct=(100.0 * pl.col("time_ns") / gpu_ns) if gpu_ns else pl.lit(None, dtype=pl.Float64),
        )
        by_category = (by_name.group_by("category")
                       .agg(calls=pl.col("calls").sum(), time_ns=pl.when(pl.col("time_ns").count() > 0)
                            .then(pl.col("time_ns").sum()), kernels=pl.len())
                       .with_columns(share_pct=100.0 * pl.col("time_ns") / total if total else pl.lit(None))
                       .sort(["time_ns", "category"], descending=[True, False]))
        items = [
            {"name": r["name"], "category": r["category"], "calls": r["calls"], "time_ns": r["time_ns"],
             "share_pct": _round(r["share_pct"]), "gpu_share_pct": _round(r["gpu_share_pct"])}
            for r in by_name.head(int(t["top"])).iter_rows(named=True)
        ]
        categories = {r["category"]: {"calls": r["calls"], "time_ns": r["time_ns"], "kernels": r["kernels"],
                                      "share_pct": _round(r["share_pct"])}
                      for r in by_category.iter_rows(named=True)}
        top = items[0] if items else None
        dominant = top is not None and top["share_pct"] is not None and top["share_pct"] > t["dominant_kernel_pct"]
        if top and not total:
            message = (f"{by_name.height} distinct kernels, {int(by_name['calls'].sum())} calls, but the trace "
                       "gives them no durations (e.g. a metrics-only log), so their shares cannot be computed.")
        elif top:
            lead = by_category.row(0, named=True)
            message = (f"{by_name.height} distinct kernels, {int(by_name['calls'].sum())} calls, "
                       f"{total / 1e6:.3f} ms of kernel time; the top kernel takes {top['share_pct']:.1f}%; "
                       f"{lead['category']} kernels take {lead['share_pct']:.1f}%.")
        else:
            message = "No kernel time in this trace."
        return [Finding(self.name, "warning" if dominant else "info", "Where the kernel time goes", message,
                        "Optimise the top kernels first: their share bounds what any speed-up elsewhere can give."
                        if dominant else "",
                        metrics={"kernel_time_ns": total if known else None,
                                 "gpu_time_ns": gpu_ns if known else None, "kernels": by_name.height,
                                 "calls": int(by_name["calls"].sum() or 0), "categories": categories},
                        items=items)]


def _round(value):
    return None if value is None else round(value, 4)


@hookimpl
def traceparse_rules():
    return [KernelShare()]
