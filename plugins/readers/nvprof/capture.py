"""The logs of two runs of one program read as one trace: a timeline log and the metrics or events log.

nvprof collects ``--metrics`` and ``--events`` by replaying each kernel, which slows the program and distorts
its timeline, so a study runs the program twice: once with ``--print-gpu-trace`` (or for the summary) and
once with ``--metrics ...``. NVIDIA's Visual Profiler reads such runs together (File > Import > nvprof: one
"timeline data file" and any number of "event/metric data files" of the same program); this module does the
same for the logs:

- :func:`group` puts each log that holds only metric or event results with the one timeline log (GPU or API
  trace, summary) of the same program among the paths given together: the same ``Profiling application:``
  command line, or, where a log does not name its command, the only timeline log given;
- :func:`attach` ties the metrics log's counters (per kernel name and device, nvprof's mean per invocation)
  to the timeline's kernels: each name's timed launches are summed into one aggregated kernel row (``calls``
  the launches, ``duration_ns`` their total; the measures prefer the timed rows, so nothing is counted
  twice), which the counters hang on, so a counter stands for every launch of its kernel (``value`` ×
  ``calls``) and a roofline gets each kernel's FLOPs, bytes and time.

A kernel of the metrics log that the timeline does not have keeps an aggregated row without a duration (as
a metrics log read alone does), and a warning names how many; so does a kernel launched a different number
of times in the two runs (the metrics' mean per launch is used for each launch of the timeline).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import polars as pl

from traceparse.sources import open_binary

_COMMAND = re.compile(r"==\d+== (?:Profiling application: |NVPROF is profiling process \d+, command: )(.*?)\s*$")
_COUNTER_HEADER = re.compile(r"Metric Name|Event Name|==\d+== (?:Metric|Event) result:")
_TIMELINE_HEADER = re.compile(r'\bStart"?\s*,?\s*"?Duration\b|Time\(%\)|\bAvg Size\b|==\d+== API calls:')


def _profile(path: Path) -> tuple[set[str], bool, bool]:
    """(the commands a log names, whether it has a timeline table, whether it has counter results), read up to
    its first timeline table header (a timeline log is never read to its end here)."""
    commands: set[str] = set()
    counters = False
    try:
        with open_binary(path, text=True) as raw:
            for line in io.TextIOWrapper(raw, encoding="utf-8", errors="replace"):
                m = _COMMAND.search(line)
                if m:
                    commands.add(m.group(1))
                if _TIMELINE_HEADER.search(line):
                    return commands, True, counters
                counters = counters or bool(_COUNTER_HEADER.search(line))
    except OSError:
        return commands, False, False  # the read itself says what is wrong with the file
    return commands, False, counters


def group(paths: list[Path], is_log) -> list[list[Path]]:
    """Traces of ``paths``: each metrics-only log with the timeline log of the same program (module docstring),
    every other path alone; in the order the paths were given. ``is_log(path)``: a text or CSV log (not an
    SQLite profile)."""
    profiles = {p: _profile(p) for p in paths if is_log(p)}
    timelines = [p for p, (_, timeline, _) in profiles.items() if timeline]
    attached: dict[Path, list[Path]] = {}
    for path, (commands, timeline, counters) in profiles.items():
        if timeline or not counters:
            continue
        same = [t for t in timelines if commands & profiles[t][0]]
        if not same and len(timelines) == 1 and not (commands and profiles[timelines[0]][0]):
            same = timelines  # one of the two does not say its command: the only timeline given
        if len(same) == 1:
            attached.setdefault(same[0], []).append(path)
    inside = {p for extra in attached.values() for p in extra}
    return [[p, *attached.get(p, [])] for p in paths if p not in inside]


def _key(name: pl.Expr) -> pl.Expr:
    """A kernel name as both logs may print it: spaces collapsed, without a leading ``void``."""
    return name.str.strip_chars().str.replace_all(r"\s+", " ").str.replace(r"^void ", "")


def attach(timeline: pl.DataFrame, counters: pl.DataFrame, source: Path, timeline_path: Path,
           warn) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The timeline's rows with an aggregated kernel row per kernel name the counters measured (and had
    launched in the timeline), and the counter rows made to link to it (its name, process and device).

    ``timeline`` and ``counters`` are rows as :func:`.events.table_frame` builds them (counter rows carry
    their kernel's name in ``_kernel``); :func:`.counters.link_counters` then links them.
    """
    if counters.height == 0 or "start_ns" not in timeline.columns:
        return timeline, counters
    kernels = timeline.filter(pl.col("kind") == "kernel").with_columns(_key=_key(pl.col("name")))
    # a kernel the timeline's summary has already: its aggregated row takes the counters
    summary = kernels.filter(pl.col("start_ns").is_null()).unique("_key", keep="first", maintain_order=True)
    kernels = kernels.filter(pl.col("start_ns").is_not_null() & ~pl.col("_key").is_in(summary["_key"].implode()))
    summed = (kernels
              .group_by("_key", "device_id", maintain_order=True)
              .agg(name=pl.col("name").first(), pid=pl.col("pid").first(), calls=pl.len().cast(pl.Int64),
                   duration_ns=pl.col("duration_ns").sum(), min_ns=pl.col("duration_ns").min(),
                   max_ns=pl.col("duration_ns").max()))
    wanted = counters.with_columns(_key=_key(pl.col("_kernel")))
    kept = [c for c in ("_key", "device_id", "name", "pid", "calls") if c in summary.columns]
    summed = pl.concat([summed, summary.select(*kept, _summary=pl.lit(True))], how="diagonal_relaxed")
    # each counter's kernel: on its own device, else on the device the timeline has it on (a cut Device column)
    own = summed.select("_key", "device_id", k_name="name", k_pid="pid", k_calls="calls")
    other = summed.unique("_key", keep="first", maintain_order=True).select(
        "_key", a_name="name", a_pid="pid", a_calls="calls", a_device="device_id")
    found = (wanted.join(own, on=["_key", "device_id"], how="left", nulls_equal=True)
             .join(other, on="_key", how="left"))
    on_own = pl.col("k_name").is_not_null()
    found = found.with_columns(
        _matched=on_own | pl.col("a_name").is_not_null(),
        device_id=pl.when(on_own).then(pl.col("device_id")).otherwise(pl.coalesce("a_device", "device_id")),
        pid=pl.when(on_own).then(pl.col("k_pid")).otherwise(pl.coalesce("a_pid", "pid")),
        _kernel=pl.when(on_own).then(pl.col("k_name")).otherwise(pl.coalesce("a_name", "_kernel")),
        _launches=pl.when(on_own).then(pl.col("k_calls")).otherwise(pl.col("a_calls")))
    missing = found.filter(~pl.col("_matched"))["_key"].unique()
    if missing.len():
        warn(f"{source}: {missing.len()} kernel{'s' * (missing.len() != 1)} measured here never ran in "
             f"{timeline_path}: {'their' if missing.len() != 1 else 'its'} counters have no time")
    differ = (found.filter(pl.col("_matched") & (pl.col("calls") != pl.col("_launches")))
              .select("_kernel", "calls", "_launches").unique(maintain_order=True))
    for name, invocations, launches in differ.iter_rows():
        warn(f"{source}: {name}: {invocations} invocations measured, {launches} launches in {timeline_path}: "
             "the mean per invocation is taken for each launch")
    used = found.filter(pl.col("_matched")).select(name="_kernel", device_id="device_id").unique()
    rows = (summed.filter(pl.col("_summary").is_null())
            .join(used, on=["name", "device_id"], how="semi", nulls_equal=True)
            .select(kind=pl.lit("kernel"), name="name", calls="calls", pid="pid", device_id="device_id",
                    duration_ns="duration_ns", min_ns="min_ns", max_ns="max_ns"))
    out = found.drop("_key", "k_name", "k_pid", "k_calls", "a_name", "a_pid", "a_calls", "a_device", "_matched",
                     "_launches")
    return pl.concat([timeline, rows], how="diagonal_relaxed"), out
