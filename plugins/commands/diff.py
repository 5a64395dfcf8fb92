"""Command ``diff``: what changed between two traces, kernel by kernel and API call by API call.

Definition: in each trace, the rows of kind kernel, memcpy, memset and api are
grouped by (kind, name): calls = Σ calls (a trace event counts 1, an
aggregated row its number of calls), time = Σ duration_ns. When a trace has
both timed events and aggregated rows of one kind (e.g. an nvprof log with a
GPU trace and a summary), only the timed ones count, as in the rules
(the ``time_by_name`` measure), so no call is counted twice.
Names are matched exactly between A and B, except that API names lose the
CUPTI interface version some tools append (``cudaLaunchKernel_v7000`` in an
nsys SQLite export is ``cudaLaunchKernel`` in its stats reports and in
torch.profiler traces); change = time in B − time in A
(and the same for calls); a name only in B is *new*, only in A *vanished*.
Rows are sorted by |change| (largest first). Kernels are also summarised by
the kernel categories of kernel-share (traceparse.expr.kernel_categories(): gemm, convolution, elementwise, ...; API calls
form the category ``api``, copies ``memcpy`` / ``memset``). The summary line
gives the total GPU time (kernels + memcpy + memset) and API time of A and B
and their change. Works for every format, since it needs only names,
durations and calls.
"""

from __future__ import annotations

import argparse

import polars as pl
from rich.table import Table

from traceparse import expr, measures
from traceparse.command import Command
from traceparse.plugins import hookimpl
from traceparse.report import fmt_ns, short_name
from traceparse.trace import Trace

KINDS = ("kernel", "memcpy", "memset", "api")
GPU_KINDS = ("kernel", "memcpy", "memset")
#: The CUPTI interface version some tools append to API names (nsys: cudaLaunchKernel_v7000).
API_VERSION_SUFFIX = r"_v\d+$"


def totals_by_name(trace: Trace) -> pl.DataFrame:
    """Calls and time per (kind, name) of one trace, timed events preferred over aggregated rows."""
    events = trace.events.with_columns(
        name=pl.when(expr.kind_is("api")).then(pl.col("name").str.replace(API_VERSION_SUFFIX, ""))
        .otherwise(pl.col("name")))
    rows = measures.time_by_name(events, kinds=KINDS, prefer_timed=True)
    return rows.select("kind", "name", "calls", pl.col("time_ns").fill_null(0))


def diff_tables(a: Trace, b: Trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-name rows, per-category rows) of the change from ``a`` to ``b``."""
    ta, tb = totals_by_name(a), totals_by_name(b)
    rows = ta.join(tb, on=["kind", "name"], how="full", coalesce=True, suffix="_b").rename(
        {"calls": "calls_a", "time_ns": "time_a_ns", "time_ns_b": "time_b_ns"})
    rows = rows.with_columns(
        status=pl.when(pl.col("calls_a").is_null()).then(pl.lit("new"))
        .when(pl.col("calls_b").is_null()).then(pl.lit("vanished")).otherwise(pl.lit("both")),
        category=pl.when(pl.col("kind") == "kernel").then(expr.kernel_category(pl.col("name"))).otherwise(pl.col("kind")),
    ).with_columns(pl.col("calls_a", "calls_b", "time_a_ns", "time_b_ns").fill_null(0)).with_columns(
        delta_calls=pl.col("calls_b") - pl.col("calls_a"),
        delta_ns=pl.col("time_b_ns") - pl.col("time_a_ns"),
    ).with_columns(
        delta_pct=pl.when(pl.col("time_a_ns") > 0).then(100.0 * pl.col("delta_ns") / pl.col("time_a_ns")),
    ).sort([pl.col("delta_ns").abs(), "kind", "name"], descending=[True, False, False]).select(
        "kind", "category", "name", "status", "calls_a", "calls_b", "delta_calls", "time_a_ns", "time_b_ns",
        "delta_ns", "delta_pct")
    categories = (rows.group_by("category").agg(
        names=pl.len(), new=(pl.col("status") == "new").sum(), vanished=(pl.col("status") == "vanished").sum(),
        calls_a=pl.col("calls_a").sum(), calls_b=pl.col("calls_b").sum(),
        time_a_ns=pl.col("time_a_ns").sum(), time_b_ns=pl.col("time_b_ns").sum(),
    ).with_columns(delta_ns=pl.col("time_b_ns") - pl.col("time_a_ns"))
        .with_columns(delta_pct=pl.when(pl.col("time_a_ns") > 0).then(100.0 * pl.col("delta_ns") / pl.col("time_a_ns")))
        .sort([pl.col("delta_ns").abs(), "category"], descending=[True, False]))
    return rows, categories


def summary(rows: pl.DataFrame) -> dict:
    """Totals of A and B: GPU time (kernel + memcpy + memset), kernel time, API time, and new / vanished names."""
    def total(frame: pl.DataFrame, column: str) -> int:
        return int(frame[column].sum() or 0)

    gpu = rows.filter(pl.col("kind").is_in(GPU_KINDS))
    api = rows.filter(pl.col("kind") == "api")
    kernels = rows.filter(pl.col("kind") == "kernel")
    out = {}
    for label, frame in (("gpu", gpu), ("kernel", kernels), ("api", api)):
        a, b = total(frame, "time_a_ns"), total(frame, "time_b_ns")
        out[label] = {"time_a_ns": a, "time_b_ns": b, "delta_ns": b - a,
                      "delta_pct": round(100.0 * (b - a) / a, 4) if a else None}
    out["new"] = int((rows["status"] == "new").sum())
    out["vanished"] = int((rows["status"] == "vanished").sum())
    out["matched"] = int((rows["status"] == "both").sum())
    return out


def _signed_ns(ns: int) -> str:
    return ("+" if ns > 0 else "-" if ns < 0 else "±") + fmt_ns(abs(ns))


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1f}%"


class DiffCommand(Command):
    name = "diff"
    help = "compare two traces kernel by kernel and API call by API call"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("a", metavar="A", help="the first trace: store id (or prefix) or path")
        parser.add_argument("b", metavar="B", help="the second trace")
        parser.add_argument("--top", type=int, default=25, metavar="N", help="rows shown on screen (default 25)")
        self.add_common_options(parser, json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        a = session.resolve(args.a, args.format)[0]
        b = session.resolve(args.b, args.format)[0]
        for label, trace in (("A", a), ("B", b)):
            present = set(trace.events["kind"].cast(pl.String).unique().to_list())
            if not present & set(KINDS):
                session.warn(f"{label} ({trace.id}) has no kernel, memcpy, memset or API rows (it has: "
                             f"{', '.join(sorted(present)) or 'no events'}); diff compares only those")
        rows, categories = diff_tables(a, b)
        totals = summary(rows)
        if args.json:
            doc = {"a": _trace_ref(a), "b": _trace_ref(b), "summary": totals,
                   "categories": categories.to_dicts(), "rows": rows.to_dicts()}
            self.print_json(doc)
            return 0
        out = session.out
        out.print(f"[bold]A[/bold] {a.id} {a.meta.path or ''}  {_tags(a)}")
        out.print(f"[bold]B[/bold] {b.id} {b.meta.path or ''}  {_tags(b)}")
        table = Table(header_style="bold", title="by category")
        for column in ("category", "names", "new", "vanished", "time A", "time B", "change", "%"):
            table.add_column(column, justify="left" if column == "category" else "right")
        for r in categories.iter_rows(named=True):
            table.add_row(r["category"], str(r["names"]), str(r["new"]), str(r["vanished"]), fmt_ns(r["time_a_ns"]),
                          fmt_ns(r["time_b_ns"]), _signed_ns(r["delta_ns"]), _pct(r["delta_pct"]))
        out.print(table)
        table = Table(header_style="bold", title=f"by name (top {min(args.top, rows.height)} of {rows.height} "
                                                 "by absolute change)")
        for column in ("kind", "name", "", "calls A", "calls B", "time A", "time B", "change", "%"):
            table.add_column(column, justify="left" if column in ("kind", "name", "") else "right",
                             overflow="fold" if column == "name" else "ellipsis")
        shown = rows.head(args.top)
        labels = [short_name(n, 60) for n in shown["name"]]
        clash = {label for label in labels if labels.count(label) > 1}
        for label, r in zip(labels, shown.iter_rows(named=True)):
            if label in clash:  # two kernels that differ only in what short_name hides: show more of the name
                label = r["name"] if len(r["name"]) <= 160 else r["name"][:159] + "…"
            status = {"new": "[green]new[/green]", "vanished": "[red]vanished[/red]"}.get(r["status"], "")
            table.add_row(r["kind"], label, status, f"{r['calls_a']:,}", f"{r['calls_b']:,}",
                          fmt_ns(r["time_a_ns"]), fmt_ns(r["time_b_ns"]), _signed_ns(r["delta_ns"]),
                          _pct(r["delta_pct"]))
        out.print(table)
        g, api = totals["gpu"], totals["api"]
        out.print(f"[bold]total[/bold]: GPU time {fmt_ns(g['time_a_ns'])} -> {fmt_ns(g['time_b_ns'])} "
                  f"({_signed_ns(g['delta_ns'])}, {_pct(g['delta_pct'])}); API time {fmt_ns(api['time_a_ns'])} -> "
                  f"{fmt_ns(api['time_b_ns'])} ({_signed_ns(api['delta_ns'])}, {_pct(api['delta_pct'])}); "
                  f"{totals['matched']} names in both, {totals['new']} new, {totals['vanished']} vanished")
        return 0


def _trace_ref(trace: Trace) -> dict:
    return {"id": trace.id, "path": trace.meta.path, "format": trace.meta.format, "tags": trace.meta.tags}


def _tags(trace: Trace) -> str:
    return " ".join(f"{k}={v}" for k, v in trace.meta.tags.items())


@hookimpl
def traceparse_commands():
    return [DiffCommand()]
