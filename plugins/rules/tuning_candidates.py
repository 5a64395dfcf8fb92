"""Rule ``tuning-candidates``: kernels and routines ranked by a derived counter metric × their time.

After Malony, Lim, Shende, Norris, "Performance Analysis of CUDA Deep
Learning Networks using TAU" (table "VGG Tuning Candidates":
(warps/inst) × exec_t and (gmem/inst) × exec_t).

Definition: each derived metric of :data:`DERIVED_METRICS` (plus the
``extra_metrics`` threshold) is a ratio of counter sums, numerator /
denominator, with alternatives for the counter names of each tool (TAU's
CUPTI events ``CUDA.<GPU>.domain_<x>.<event>`` are matched by their event
name, nvprof events/metrics, ncu metrics, PAPI); the first alternative
whose counters the trace has is used. Counters are the counter rows whose
``parent_id`` is a kernel or routine row (of ``thresholds["kinds"]``);
TAU's inclusive counter rows (``... (inc)``) and call-path duplicates of
routines are left out. Per routine name, the counters and the routine's
time (exclusive_ns, else duration_ns) are summed over threads and
launches; value = sum(numerator) / sum(denominator), or for an
alternative with no denominator (a metric that is already a ratio, e.g.
ncu's ``sm__inst_executed.avg.per_cycle_active``) the time-weighted mean.
score = value × time_ns for metrics where more is worse, time_ns / value
where less is worse (IPC). Items: the ``top`` routines of each metric by
score: name, metric, value, time_ns, score.
"""

from __future__ import annotations

import polars as pl

from traceparse.errors import InputError
from traceparse.expr import flat_rows, kind_is
from traceparse.figures import fmt_number
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions
from traceparse.trace import Trace

FIGURES = {"counters_seen": "count"}
#: A score is a time in ns (the routine's time weighted by its metric), said as such: "28,573" alone named no unit.
#: It stays a plain number in ns, not a duration column: the scores of different metrics differ by orders of
#: magnitude, and one unit for the column would show the smaller ones as <0.001 ms.
COLUMNS = [Column("name", "name", "name"), Column("metric", "metric", "text"), Column("value", "value", "metric"),
           Column("time_ns", "time", "ns"), Column("score", "score (ns)", "number")]
#: What a score is, where the finding gives scores.
SCORE_SAID = ("A score is the routine's time in ns weighted by the metric: time × value, or time ÷ value where "
              "more is better (ipc).")

#: The derived metrics, in one table. "score": "value_x_time" (more is worse) or "time_over_value".
DERIVED_METRICS: list[dict] = [
    {"name": "warps_per_inst", "score": "value_x_time",
     "description": "warps launched per issued instruction (lower is better; the paper's warps/inst)",
     "alternatives": [
         {"numerator": ["warps_launched"], "denominator": ["inst_issued"]},                  # CUPTI events (TAU)
         {"numerator": ["warps_launched"], "denominator": ["inst_issued1", "inst_issued2"]},  # Kepler events
         {"numerator": ["smsp__warps_launched.sum"], "denominator": ["smsp__inst_issued.sum"]},  # ncu
     ]},
    {"name": "gmem_per_inst", "score": "value_x_time",
     "description": "global memory load and store instructions per executed instruction (the paper's gld/ins)",
     "alternatives": [
         {"numerator": ["global_load", "global_store"], "denominator": ["inst_executed"]},    # CUPTI events
         {"numerator": ["gld_request", "gst_request"], "denominator": ["inst_executed"]},    # Kepler events
         {"numerator": ["inst_executed_global_loads", "inst_executed_global_stores"],         # nvprof metrics
          "denominator": ["inst_executed"]},
         {"numerator": ["smsp__inst_executed_op_global_ld.sum", "smsp__inst_executed_op_global_st.sum"],
          "denominator": ["smsp__inst_executed.sum"]},                                        # ncu
     ]},
    {"name": "ipc", "score": "time_over_value",
     "description": "instructions executed per active cycle (higher is better; scored by time / IPC)",
     "alternatives": [
         {"numerator": ["inst_executed"], "denominator": ["active_cycles"]},                  # CUPTI events
         {"numerator": ["sm__inst_executed.sum"], "denominator": ["sm__cycles_active.sum"]},  # ncu
         {"numerator": ["smsp__inst_executed.sum"], "denominator": ["sm__cycles_active.sum"]},
         {"numerator": ["sm__inst_executed.avg.per_cycle_active"], "denominator": []},        # ncu, a ratio already
         {"numerator": ["ipc"], "denominator": []},                                           # nvprof metric
         {"numerator": ["executed_ipc"], "denominator": []},                                  # nvprof 7.x-10.x
         {"numerator": ["PAPI_TOT_INS"], "denominator": ["PAPI_TOT_CYC"]},                    # CPU routines (PAPI)
     ]},
]

#: TAU's name of a CUPTI event counter: CUDA.<device>.domain_<x>.<event>
_TAU_CUPTI = r"^CUDA\..*\.domain_[a-z]\.(.+)$"
_INCLUSIVE = " (inc)"
SCORES = ("value_x_time", "time_over_value")


def check_definition(spec: dict) -> dict:
    """A derived-metric definition, validated (InputError saying what is wrong); the table's entries pass."""
    def fail(what: str):
        raise InputError(f"tuning-candidates: derived metric {spec.get('name')!r}: {what}")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise InputError("tuning-candidates: a derived metric needs a 'name'")
    if spec.get("score", "value_x_time") not in SCORES:
        fail(f"'score' must be one of {', '.join(SCORES)}")
    alternatives = spec.get("alternatives")
    if not isinstance(alternatives, list) or not alternatives:
        fail("needs 'alternatives': a list of {'numerator': [counters], 'denominator': [counters]}")
    for alt in alternatives:
        if not isinstance(alt, dict) or not alt.get("numerator") or not all(
                isinstance(c, str) for c in [*alt.get("numerator", []), *alt.get("denominator", [])]):
            fail("each alternative needs a non-empty 'numerator' list of counter names (and a 'denominator' list)")
    return {"name": spec["name"], "score": spec.get("score", "value_x_time"),
            "description": spec.get("description", ""), "alternatives": alternatives}


def _for_this(definitions: list[dict], events: pl.DataFrame) -> list[dict]:
    """The metrics to say are lacking: on a trace with no GPU kernel (an MPI code under TAU), those that CPU
    counters can give, with only their CPU alternatives ("ipc needs PAPI_TOT_INS and PAPI_TOT_CYC"), not the
    GPU's warps and global loads; every one elsewhere."""
    if events.lazy().select(kind_is("kernel").any()).collect().item():
        return definitions
    cpu = [{**spec, "alternatives": [a for a in spec["alternatives"] if _on_cpu(a)]} for spec in definitions]
    return [spec for spec in cpu if spec["alternatives"]] or definitions


def _on_cpu(alt: dict) -> bool:
    """An alternative of CPU counters (PAPI's)."""
    return all(c.startswith("PAPI_") for c in [*alt["numerator"], *(alt.get("denominator") or [])])


def _how_to_count(events: pl.DataFrame) -> str:
    """How to record the counters: GPU counters where the trace ran kernels, CPU ones (PAPI) where it did not (an MPI
    code profiled with TAU was told to collect CUDA counters)."""
    if events.lazy().select(kind_is("kernel").any()).collect().item():
        return ("Profile with the counters of a metric, e.g. TAU_METRICS=TIME:CUDA.<GPU>.domain_d.inst_executed:..., "
                "or ncu --metrics smsp__inst_executed.sum,...")
    return "Profile with CPU counters for IPC, e.g. TAU_METRICS=TIME:PAPI_TOT_INS:PAPI_TOT_CYC (TAU built with PAPI)."


def _lacking(spec: dict, present: set[str]) -> str:
    """What a metric lacks, from the alternative the trace comes nearest to: "ipc needs active_cycles beside
    inst_executed" (a trace with inst_executed), else the first alternative's counters."""
    def counters(alt: dict) -> list[str]:
        return [*alt["numerator"], *(alt.get("denominator") or [])]

    def need(alt: dict) -> list[str]:
        return [c for c in counters(alt) if c not in present]

    touched = [a for a in spec["alternatives"] if len(need(a)) < len(counters(a))]
    nearest = min(touched, key=lambda a: len(need(a))) if touched else spec["alternatives"][0]
    have = [c for c in counters(nearest) if c in present]
    if not need(nearest):  # the counters are there, on kernels without a time (nvprof --metrics alone)
        return f"{spec['name']} has {', '.join(have)}, but on no routine or kernel with a time to weigh it by"
    return f"{spec['name']} needs {' and '.join(need(nearest))}" + (f" beside {', '.join(have)}" if have else "")


def formula_text(alt: dict) -> str:
    """An alternative as text, e.g. ``(global_load + global_store) / inst_executed``."""
    def side(names: list[str]) -> str:
        return names[0] if len(names) == 1 else "(" + " + ".join(names) + ")"
    num = side(alt["numerator"])
    return num if not alt.get("denominator") else f"{num} / {side(alt['denominator'])}"


def counter_key(name: pl.Expr) -> pl.Expr:
    """The name a counter is matched by: TAU's CUPTI names lose their ``CUDA.<GPU>.domain_<x>.`` prefix."""
    return pl.coalesce(name.str.extract(_TAU_CUPTI, 1), name)


class TuningCandidates(Rule):
    name = "tuning-candidates"
    description = "Kernels/routines ranked by derived counter metrics (warps/inst, gmem/inst, IPC) x time"
    definition = __doc__
    thresholds = {
        "top": 10,                            # routines listed per metric
        "kinds": ["kernel", "region", "op"],  # rows whose counters count
        "extra_metrics": [],                  # more definitions, same shape as DERIVED_METRICS entries (JSON)
    }
    kinds = ("counter",)

    def __init__(self, definitions: list[dict] | None = None):
        """``definitions`` replaces :data:`DERIVED_METRICS` (a plugin may pass the table plus its own)."""
        self.definitions = [check_definition(d) for d in (definitions if definitions is not None
                                                          else DERIVED_METRICS)]

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        definitions = self.definitions + [check_definition(d) for d in (t.get("extra_metrics") or [])]
        events = trace.events
        parents = events.filter(kind_is(*t["kinds"]))
        parents, _ = flat_rows(parents)
        parents = parents.select(pl.col("event_id").alias("parent_id"), "name",
                                 pl.coalesce("exclusive_ns", "duration_ns").alias("time_ns"))
        counters = (events.filter((pl.col("kind") == "counter") & pl.col("parent_id").is_not_null()
                                  & ~pl.col("name").str.ends_with(_INCLUSIVE) & pl.col("value").is_not_null())
                    .select("parent_id", counter_key(pl.col("name")).alias("key"), "value"))
        counters = counters.join(parents.select("parent_id"), on="parent_id", how="semi")
        present = set(counters["key"].unique().to_list())
        wide = (counters.group_by(["parent_id", "key"]).agg(pl.col("value").sum())
                .pivot(on="key", index="parent_id", values="value") if counters.height else None)
        items, used, missing = [], {}, []
        for spec in definitions:
            alt = next((a for a in spec["alternatives"]
                        if set(a["numerator"]) | set(a.get("denominator") or []) <= present), None)
            if alt is None or wide is None:
                missing.append(spec["name"])
                continue
            ranked = _rank(parents.join(wide, on="parent_id", how="inner"), spec, alt)
            if ranked.height == 0:  # its counters belong to no routine kept (a thread's file missing)
                missing.append(spec["name"])
                continue
            used[spec["name"]] = {"formula": formula_text(alt), "description": spec["description"],
                                  "routines": ranked.height}
            items.extend({"name": r["name"], "metric": spec["name"], "value": _round(r["value"]),
                          "time_ns": r["time_ns"], "score": _round(r["score"])}
                         for r in ranked.head(int(t["top"])).iter_rows(named=True))
        metrics = {"metrics": used, "not_computable": missing,
                   "counters_seen": len(present)}
        if not used:
            return [Finding(self.name, "info", "Tuning candidates: no derived metric computable",
                            "None of the derived metrics can be computed: "
                            + "; ".join(_lacking(spec, present) for spec in _for_this(definitions, events)) + ".",
                            _how_to_count(events),
                            metrics=metrics, figures=FIGURES)]
        lead = {m: next(i for i in items if i["metric"] == m) for m in used}
        parts = [f"{m}: {v['name']!r} (value {fmt_number(v['value'])}, score {fmt_number(v['score'])} ns)"
                 for m, v in lead.items()]
        message = "Top candidates by " + "; ".join(parts) + ". " + SCORE_SAID
        return [Finding(self.name, "info", "Tuning candidates: derived metric x time", message,
                        "Look first at the routines that lead several metrics: their time is high and their "
                        "instruction mix or memory traffic is poor.", metrics=metrics, items=items,
                        columns=COLUMNS, figures=FIGURES)]


def _rank(table: pl.DataFrame, spec: dict, alt: dict) -> pl.DataFrame:
    num, den = alt["numerator"], alt.get("denominator") or []
    needed = [*num, *den]
    table = table.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in needed) & pl.col("time_ns").is_not_null())
    if den:
        per_name = table.group_by("name").agg(
            time_ns=pl.col("time_ns").sum(), num=pl.sum_horizontal(num).sum(), den=pl.sum_horizontal(den).sum())
        per_name = per_name.with_columns(value=pl.when(pl.col("den") != 0).then(pl.col("num") / pl.col("den")))
    else:
        per_name = table.group_by("name").agg(
            time_ns=pl.col("time_ns").sum(),
            weighted=(pl.sum_horizontal(num) * pl.col("time_ns")).sum())
        per_name = per_name.with_columns(value=pl.when(pl.col("time_ns") > 0)
                                         .then(pl.col("weighted") / pl.col("time_ns")))
    if spec["score"] == "time_over_value":
        score = pl.when(pl.col("value") > 0).then(pl.col("time_ns") / pl.col("value"))
    else:
        score = pl.col("value") * pl.col("time_ns")
    return (per_name.with_columns(score=score).filter(pl.col("score").is_not_null())
            .sort(["score", "name"], descending=[True, False]))


def _round(value, digits: int = 6):
    return None if value is None else round(float(value), digits)


@hookimpl
def traceparse_rules():
    return [TuningCandidates()]
