"""Steps: the ``ProfilerStep#N`` annotations torch.profiler writes around each step (measure ``steps``), and
:func:`step_series`, the steps a trace has whatever marks them (the one source of steps for every command)."""

from __future__ import annotations

import re

import polars as pl

from traceparse.measures.base import Measure, keyed, rows_of, shared, unkeyed
from traceparse.schema import STEP_NAME  # the validation step checks its number fits Int64


class Steps(Measure):
    """One window per step: the rows named ``ProfilerStep#N`` (of ``kinds``, default any) with a duration.

    Per (``trace_id``, ``step`` = N, ``on_host``: the annotation has a ``pid``,
    as the host-side ones do; the device-side copies have none): ``start_ns``
    (first start), ``end_ns`` (last end), ``duration_ns`` (the longest
    annotation of the step), ``annotations`` (how many). Sorted by trace,
    side and step.

    Part: those figures per partition; combine: min, max, max and sum of
    them. Valid partitions: device, trace, row chunks.
    """

    name = "steps"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=None) -> pl.DataFrame:
        rows = events if kinds is None else rows_of(events, kinds)
        rows = keyed(rows.filter(pl.col("name").str.contains(STEP_NAME) & pl.col("duration_ns").is_not_null()))
        return (rows.group_by("trace_id", step=pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64, strict=False),
                              on_host=pl.col("pid").is_not_null())
                .agg(start_ns=pl.col("start_ns").min(), end_ns=(pl.col("start_ns") + pl.col("duration_ns")).max(),
                     duration_ns=pl.col("duration_ns").max(), annotations=pl.len().cast(pl.Int64)))

    def combine(self, parts: list[pl.DataFrame], kinds=None) -> pl.DataFrame:
        out = (pl.concat(parts).group_by("trace_id", "on_host", "step")
               .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("duration_ns").max(),
                    pl.col("annotations").sum())
               .sort("trace_id", "on_host", "step", descending=[False, True, False]))
        return unkeyed(out).select("trace_id", "on_host", "step", "start_ns", "end_ns", "duration_ns", "annotations")


steps = Steps()


# -- the steps a trace has, whatever marks them --------------------------------
#: The ``group`` of a row its reader marks as one step (JAX's ``StepTraceAnnotation``): :func:`step_series`.
STEP_GROUP = "step"
#: Host-side ranges that mark one iteration where the trace has no ``ProfilerStep#N``: an NVTX range or
#: annotation named like ``train_step``, ``step 3``, ``iteration 7``, ``iter_12`` (not ``Optimizer.step``, nor a
#: Python frame that with_stack records: ``torch/utils/_pytree.py(1462): tree_iter`` ran 240 times a step, nor one
#: JAX's Python tracer records, ``$file.py:N name`` or ``$builtins name``: 30 calls of ``iter()`` of 110–600 ns
#: were "30 steps, mean 255 ns" of a 10.3 ms trace).
STEP_RANGE = r"(?i)(^|[^a-z])(step|iter|iteration)([^a-z]|$)"
NOT_STEP_RANGE = r"(?i)optim|(\.py|>)\(\d+\): |^<built-in |^\$"
#: A name's trailing number (``step 3``, ``iter_12``, ``step3``): ranges whose names differ only by it are one
#: series, each range keeping its number. Groups: stem, separator, number.
TRAILING_NUMBER = r"^(.*?[^\d\s_#:.\-])([\s_#:.\-]*)([0-9]{1,18})$"  # a longer number is part of the name
#: Annotations that recur once per iteration where nothing else marks one (torch's own optimizer
#: annotations), in order of preference, with the edge of the iteration each sits at: ``"end"`` (the
#: mark ends its iteration: step k runs from the end of mark k-1 to the end of mark k, the first from
#: the trace's first host row) or ``"start"`` (step k runs from the start of mark k to the start of
#: mark k+1, the last to the trace's last host row).
ITERATION_MARKS = ((r"^Optimizer\.step#", "end"), (r"^Optimizer\.zero_grad#", "start"))
#: Range kinds (NVTX ranges, user annotations, regions).
RANGE_KINDS = ("marker", "region")
STEP_SCHEMA = pl.Schema({"trace_id": pl.String, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                         "duration_ns": pl.Int64, "source": pl.String})


def step_free(name: pl.Expr) -> pl.Expr:
    """A name with its step number left out (``(nothing traced in ProfilerStep#3)`` → ``… ProfilerStep#N)``, an
    NVTX step range ``step 3`` → ``step N``), so that one part of every step adds up (whatif's path, the
    critical-path rule's parts, hotspots' annotations, gpu-idle's host activity); the critical path's
    ``(nothing traced in step 3)`` → ``(nothing traced in step N)`` too."""
    inner = name.str.extract(r"^\(nothing traced in (.+)\)$", 1)
    return (pl.when(inner.is_not_null()).then(pl.format("(nothing traced in {})", _step_free(inner)))
            .otherwise(_step_free(name)))


def _step_free(name: pl.Expr) -> pl.Expr:
    ranged = name.str.contains(STEP_RANGE) & ~name.str.contains(NOT_STEP_RANGE) & name.str.contains(TRAILING_NUMBER)
    return (pl.when(ranged).then(name.str.replace(TRAILING_NUMBER, "${1}${2}N"))
            .otherwise(name.str.replace(r"ProfilerStep#\d+", "ProfilerStep#N")))


def step_series(events: pl.DataFrame, by_trace: bool = False) -> pl.DataFrame:
    """The trace's steps from what it has: one row per trace and step, the one source of steps for every command.

    In this order, the first that the trace has:

    1. the ``ProfilerStep#N`` annotations (measure :data:`steps`), step N, the
       host-side ones where a trace has them; source ``"ProfilerStep#N"``;
    2. the rows a reader marks as steps (``group`` :data:`STEP_GROUP`: the tool itself
       says the range is one step, as JAX's ``StepTraceAnnotation`` does), numbered by
       their name's trailing number (``train 3`` is step 3), else from 1 in order of
       start; the host-side ones where a trace has them; source ``"marked step train N"``;
    3. host-side ranges (a ``pid``) whose name reads as an iteration
       (:data:`STEP_RANGE`): names that differ only by a trailing number
       (``step 2`` .. ``step 5``) are one series keeping their numbers,
       source ``"range step N"``; a repeated constant name (``train_step``)
       is numbered from 1 in order of start, source ``"range train_step"``;
       of several series, the one with the most time;
    4. a repeated host-side annotation of :data:`ITERATION_MARKS`
       (``Optimizer.step#SGD.step``): one step per instance, source
       ``"one per Optimizer.step#SGD.step"``.

    Columns of :data:`STEP_SCHEMA` (``duration_ns`` = ``end_ns - start_ns``,
    so a step's time is the same wherever it is shown); sorted by trace and
    step; empty when the trace marks no step.

    ``events`` of several traces are one table (a run: the source and the
    series chosen for all); with ``by_trace`` each trace chooses its own, as
    if it were alone, in a fixed number of queries whatever the number of
    traces (what a measure finished per trace needs on a group of ranks).
    """
    return shared(events, "step_series", lambda: _step_series(events, by_trace), (by_trace,))


def steps_of(events: pl.DataFrame, owners: pl.DataFrame, key: str) -> dict:
    """{owner: the steps its own traces mark} (:func:`step_series`, each trace its own), for the rows of ``owners``
    (``trace_id`` and ``key``: a run's ranks, a rule's members); an owner whose traces mark none is left out. Ranks
    whose traces hold different numbers of steps did different amounts of work: compared per step."""
    series = step_series(events, by_trace=True)
    if series.height == 0:
        return {}
    counts = dict(series.group_by("trace_id").agg(pl.col("step").n_unique()).iter_rows())
    out: dict = {}
    for trace_id, owner in owners.select("trace_id", key).unique().iter_rows():
        if owner is not None and counts.get(trace_id):
            out[owner] = out.get(owner, 0) + counts[trace_id]
    return out


def is_step_annotation(events: pl.DataFrame) -> pl.Expr:
    """True for the rows of ``events`` that are its step annotations, whose time is the step's, not work in it:
    ``ProfilerStep#N``, the rows a reader marks as steps (group :data:`STEP_GROUP`), and the ranges of the series
    :func:`step_series` chose from names (``step 3`` of ``range step N``, each ``train_step`` of
    ``range train_step``). Ranges named like steps that are not the chosen series are not."""
    name = pl.col("name").fill_null("")
    out = name.str.contains(STEP_NAME)
    if "group" in events.columns:
        out = out | (pl.col("group") == STEP_GROUP).fill_null(False)
    series = [source.removeprefix("range ") for source in step_series(events)["source"].drop_nulls().unique().to_list()
              if source.startswith("range ")]
    if series:
        parts = name.str.extract_groups(TRAILING_NUMBER)
        stem = (parts.struct.field("1") + parts.struct.field("2") + pl.lit("N")).fill_null("")
        out = out | (pl.col("kind").cast(pl.String).is_in(RANGE_KINDS) & (name.is_in(series) | stem.is_in(series)))
    return out


def _step_series(events: pl.DataFrame, by_trace: bool) -> pl.DataFrame:
    if by_trace:
        return _by_trace(events)
    found = _profiler_steps(events)
    if found.height == 0:
        found = _marked_steps(events)
    if found.height == 0:
        found = _range_steps(events)
    if found.height == 0:
        found = _mark_steps(events)
    return (found.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns")).select(STEP_SCHEMA.names())
            .cast(dict(STEP_SCHEMA)).sort("trace_id", "step", nulls_last=False))


def _by_trace(events: pl.DataFrame) -> pl.DataFrame:
    """:func:`step_series` of each trace of ``events`` alone (``by_trace``), all traces at once."""
    key = pl.col("trace_id").cast(pl.String).fill_null("")
    found = []
    rest = events
    for source in (_profiler_steps, lambda e: _marked_steps(e, by_trace=True), lambda e: _range_steps(e, by_trace=True),
                   lambda e: _mark_steps(e, by_trace=True)):
        if rest.height == 0:
            break
        got = source(rest)
        if got.height:
            found.append(got.with_columns(pl.col("trace_id").cast(pl.String)))
            rest = rest.filter(~key.is_in(got.select(key).unique().to_series().implode()))
    found = pl.concat([f.select("trace_id", "step", "start_ns", "end_ns", "source") for f in found]) if found \
        else pl.DataFrame(schema=STEP_SCHEMA)
    return (found.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns")).select(STEP_SCHEMA.names())
            .cast(dict(STEP_SCHEMA)).sort("trace_id", "step", nulls_last=False))


def _profiler_steps(events: pl.DataFrame) -> pl.DataFrame:
    s = steps(events)
    if s.height == 0:
        return pl.DataFrame(schema=STEP_SCHEMA)
    s = s.with_columns(pl.col("trace_id").cast(pl.String))
    host = pl.col("on_host") == pl.col("on_host").max().over(pl.col("trace_id").fill_null(""))
    return s.filter(host).select("trace_id", "step", "start_ns", "end_ns", source=pl.lit("ProfilerStep#N"))


def _marked_steps(events: pl.DataFrame, by_trace: bool = False) -> pl.DataFrame:
    if "group" not in events.columns:
        return pl.DataFrame(schema=STEP_SCHEMA)
    rows = events.filter((pl.col("group") == STEP_GROUP) & pl.col("kind").is_in(RANGE_KINDS)
                         & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null())
    if rows.height == 0:
        return pl.DataFrame(schema=STEP_SCHEMA)
    key = pl.col("trace_id").cast(pl.String).fill_null("")
    rows = rows.filter(pl.col("pid").is_not_null() == pl.col("pid").is_not_null().max().over(key))
    parts = pl.col("name").str.extract_groups(TRAILING_NUMBER)
    bare = pl.col("name").str.contains(r"^[0-9]{1,18}$")  # a step named by its number alone (TensorFlow's "0")
    rows = rows.select(pl.col("trace_id").cast(pl.String), "start_ns",
                       end_ns=pl.col("start_ns") + pl.col("duration_ns"),
                       stem=pl.when(bare).then(pl.lit("")).otherwise(parts.struct.field("1").fill_null(pl.col("name"))),
                       number=pl.when(bare).then(pl.col("name").cast(pl.Int64, strict=False))
                       .otherwise(parts.struct.field("3").cast(pl.Int64)))
    if by_trace:  # each trace numbered and labelled by its own rows
        rows = rows.with_columns(__k=key)
        renumber = pl.col("number").is_null().any().over("__k")
        rows = rows.sort("start_ns").with_columns(
            number=pl.when(renumber).then(pl.int_range(1, pl.len() + 1).over("__k").cast(pl.Int64))
            .otherwise(pl.col("number")))
        stems = pl.col("stem").drop_nulls().unique()
        labels = rows.group_by("__k").agg(
            source=pl.when((stems.len() == 1) & (stems.first() == "")).then(pl.lit("marked step N"))
            .when(stems.len() == 1).then(pl.format("marked step {} N", stems.first()))
            .otherwise(pl.lit("marked steps")))
        return (rows.group_by("trace_id", "__k", step="number").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
                .join(labels, on="__k", how="left").select("trace_id", "step", "start_ns", "end_ns", "source"))
    if rows["number"].is_null().any():
        rows = rows.sort("start_ns").with_columns(number=pl.int_range(1, pl.len() + 1).over(key).cast(pl.Int64))
    stems = sorted(rows["stem"].drop_nulls().unique().to_list())
    label = ("marked step N" if stems == [""] else f"marked step {stems[0]} N") if len(stems) == 1 else "marked steps"
    return (rows.group_by("trace_id", step="number").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
            .with_columns(source=pl.lit(label)))


def _host_ranges(events: pl.DataFrame, name: pl.Expr) -> pl.DataFrame:
    return events.filter(pl.col("kind").is_in(RANGE_KINDS) & pl.col("pid").is_not_null()
                         & pl.col("start_ns").is_not_null() & (pl.col("duration_ns") > 0) & name
                         ).select(pl.col("trace_id").cast(pl.String), "name", "start_ns",
                                  end_ns=pl.col("start_ns") + pl.col("duration_ns"))


def series_numbers(names: list[str]) -> dict[str, int] | None:
    """``{name: its number}`` when ``names`` differ only by a trailing number (``step 2``, ``step 3``), else None.

    One name counts as a series only when it ends in a number; the numbers
    must be distinct (two names, one number: not one series).
    """
    parts = [re.match(TRAILING_NUMBER, n) for n in names]
    if not parts or any(p is None for p in parts) or len({p.group(1, 2) for p in parts}) != 1:
        return None
    numbers = {n: int(p.group(3)) for n, p in zip(names, parts)}
    return numbers if len(set(numbers.values())) == len(numbers) else None


def _range_steps(events: pl.DataFrame, by_trace: bool = False) -> pl.DataFrame:
    rows = _host_ranges(events, pl.col("name").str.contains(STEP_RANGE) & ~pl.col("name").str.contains(NOT_STEP_RANGE))
    if rows.height == 0:
        return pl.DataFrame(schema=STEP_SCHEMA)
    parts = pl.col("name").str.extract_groups(TRAILING_NUMBER)
    rows = rows.with_columns(stem=parts.struct.field("1"), sep=parts.struct.field("2"),
                             number=parts.struct.field("3").cast(pl.Int64))
    series = pl.when(pl.col("number").is_not_null()).then(pl.col("stem") + pl.col("sep") + pl.lit("N"))
    rows = rows.with_columns(series=series.otherwise(pl.col("name")))
    key = pl.col("trace_id").fill_null("")
    if by_trace:  # each trace's own series: its one with the most time
        best = (rows.group_by(__k=key, series="series").agg(total=(pl.col("end_ns") - pl.col("start_ns")).sum())
                .sort(["__k", "total", "series"], descending=[False, True, False])
                .group_by("__k", maintain_order=True).first().select("__k", "series"))
        rows = rows.with_columns(__k=key).join(best, on=["__k", "series"], how="semi")
        constant = pl.col("number").is_null().any().over("__k")
        rows = rows.sort("start_ns").with_columns(
            number=pl.when(constant).then(pl.int_range(1, pl.len() + 1).over("__k").cast(pl.Int64))
            .otherwise(pl.col("number")))
        return (rows.group_by("trace_id", "series", step="number")
                .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
                .select("trace_id", "step", "start_ns", "end_ns", source=pl.format("range {}", "series")))
    best = (rows.group_by("series").agg(total=(pl.col("end_ns") - pl.col("start_ns")).sum())
            .sort(["total", "series"], descending=[True, False])["series"][0])
    rows = rows.filter(pl.col("series") == best)
    if rows["number"].is_null().any():  # a constant name: numbered from 1 in order of start, per trace
        rows = rows.sort("start_ns").with_columns(number=pl.int_range(1, pl.len() + 1).over(key).cast(pl.Int64))
    return (rows.group_by("trace_id", step="number")
            .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
            .with_columns(source=pl.lit(f"range {best}")))


def _mark_steps(events: pl.DataFrame, by_trace: bool = False) -> pl.DataFrame:
    key = pl.col("trace_id").fill_null("")
    found = []
    for rank, (pattern, edge) in enumerate(ITERATION_MARKS):
        marks = _host_ranges(events, pl.col("name").str.contains(pattern))
        if marks.height == 0:
            continue
        if by_trace:  # each trace's first pattern it has, and its most frequent name of it
            found.append(marks.with_columns(__k=key, __p=pl.lit(rank)))
            continue
        name = marks.group_by("name").len().sort(["len", "name"], descending=[True, False])["name"][0]
        return _marked(events, marks.filter(pl.col("name") == name).with_columns(__k=key), edge).with_columns(
            source=pl.lit(f"one per {name}"))
    if not found:
        return pl.DataFrame(schema=STEP_SCHEMA)
    marks = pl.concat(found)
    marks = marks.filter(pl.col("__p") == pl.col("__p").min().over("__k"))
    names = (marks.group_by("__k", "__p", "name").len().sort(["__k", "len", "name"], descending=[False, True, False])
             .group_by("__k", maintain_order=True).first().select("__k", "__p", "name"))
    marks = marks.join(names, on=["__k", "__p", "name"], how="semi")
    out = [_marked(events, m, ITERATION_MARKS[m["__p"][0]][1]).with_columns(source=pl.format("one per {}", "name"))
           for m in marks.partition_by("__p")]
    return pl.concat([o.select("trace_id", "step", "start_ns", "end_ns", "source") for o in out])


def _marked(events: pl.DataFrame, marks: pl.DataFrame, edge: str) -> pl.DataFrame:
    """One step per mark of ``marks`` (with ``__k``, the trace key), the iteration's edge at ``edge``."""
    key = pl.col("trace_id").fill_null("")
    bounds = (events.lazy().filter(pl.col("pid").is_not_null() & pl.col("start_ns").is_not_null())
              .group_by(key.cast(pl.String).alias("__k"))
              .agg(first=pl.col("start_ns").min(),
                   last=(pl.col("start_ns") + pl.col("duration_ns").fill_null(0)).max())
              .collect())  # lazy: the four columns used filtered, not every column of the table
    marks = marks.sort("start_ns").join(bounds, on="__k", how="left")
    if edge == "end":
        start = pl.col("end_ns").shift(1).over("__k").fill_null(pl.col("first"))
        marks = marks.with_columns(start_ns=start)
    else:
        end = pl.col("start_ns").shift(-1).over("__k").fill_null(pl.col("last"))
        marks = marks.with_columns(end_ns=end)
    return marks.select("trace_id", "name", step=pl.int_range(1, pl.len() + 1).over("__k").cast(pl.Int64),
                        start_ns="start_ns", end_ns="end_ns")
