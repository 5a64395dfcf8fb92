"""A set of TAU text profiles: one directory, its ``MULTI__<METRIC>`` subdirectories, or loose files.

TAU writes one ``profile.<node>.<context>.<thread>`` file per thread; with
several metrics (``TAU_METRICS=TIME:PAPI_TOT_CYC``) one
``MULTI__<METRIC>`` directory per metric, each holding the same threads
and routines. The files of one thread are merged: the wall-clock time
metric (``TIME``, or the first of :data:`TIME_PREFERENCE`) gives
``exclusive_ns``/``duration_ns`` (microseconds to integer ns, exactly);
every other metric becomes counter rows of the routine (see :mod:`.events`).
A file that cannot be read is skipped with a warning as long as one can.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import polars as pl

from traceparse.errors import InputError, bad_input

from . import events
from .classify import GPU_THREAD_KEYS
from .decimals import scaled_int, to_float
from .profile_text import ProfileFile, read_profile_file, whole_numbers
from .sniff import MULTI_PREFIX, PROFILE_NAME
from .whole import WholeNumbers

#: wall-clock metrics, most preferred first, for exclusive_ns/duration_ns
TIME_PREFERENCE = ("TIME", "P_WALL_CLOCK_TIME", "LINUX_TIMERS", "GET_TIME_OF_DAY", "TAUGPU_TIME",
                   "CPU_TIME", "P_VIRTUAL_TIME")
NO_PROFILES = ("no TAU profile files here: expected profile.<node>.<context>.<thread> files, "
               "MULTI__<METRIC>/ directories of them, or tauprofile.xml")


@dataclass
class Source:
    """One profile file and where it sits: its thread and the metric directory it came from."""

    path: Path
    node: int
    context: int
    thread: int
    metric_dir: str | None = None


def is_time_metric(metric: str) -> bool:
    """TAU's time metrics (microseconds), as opposed to counts: ParaProf's rule, "TIME" in the name."""
    upper = metric.upper()
    return "TIME" in upper or upper in TIME_PREFERENCE


def discover(directory: Path, warn: Callable[[str], None]) -> list[Source]:
    """The profile files of a TAU output directory; InputError when there are none."""
    top = _profiles_in(directory, warn=warn)
    multi = sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(MULTI_PREFIX))
    _note_others(directory, warn)
    if top:
        if multi:
            warn(f"{directory}: has both profile.* files and MULTI__ directories; read the profile.* files "
                 "(as ParaProf does)")
        _note_missing_nodes(directory, top, warn)
        return top
    sources = []
    for sub in multi:
        sources.extend(_profiles_in(sub, sub.name[len(MULTI_PREFIX):], warn))
    if not sources:
        raise bad_input(directory, None, NO_PROFILES)
    _note_missing_nodes(directory, sources, warn)
    return sources


def _note_missing_nodes(directory: Path, sources: list[Source], warn: Callable[[str], None]) -> None:
    """Warn of the node numbers missing among a directory's profiles: TAU's node is the MPI rank, one
    ``profile.N.C.T`` per rank from 0, so nodes 0, 1 and 3 are a 4-rank run whose rank 2 wrote no file (killed
    before it did) or whose file was not copied; read as they were, the figures over ranks were those of 3
    processes, and nothing said one was missing. One node alone (a rank's file on its own) says nothing."""
    nodes = {s.node for s in sources}
    if len(nodes) < 2:
        return
    missing = [n for n in range(max(nodes)) if n not in nodes]
    if not missing:
        return
    shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    one = len(missing) == 1
    warn(f"{directory}: no profile of node{'' if one else 's'} {shown} among nodes 0–{max(nodes)}: TAU writes "
         f"profile.N.C.T files for every MPI rank N from 0, so {'that rank' if one else 'those ranks'} wrote none "
         f"(killed before the end?) or {'its files were' if one else 'their files were'} not copied; every figure "
         f"over ranks leaves {'it' if one else 'them'} out")


def _note_others(directory: Path, warn: Callable[[str], None]) -> None:
    """Warn of the files of a TAU directory that are no TAU profile (another profiler's trace put beside them, a
    job script): they are not read, and would otherwise be left out in silence."""
    others = sorted(p.name for p in directory.iterdir()
                    if p.is_file() and not p.name.startswith(".") and not PROFILE_NAME.match(p.name))
    if others:
        shown = ", ".join(n[:60] + ("…" if len(n) > 60 else "") for n in others[:3])
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        warn(f"{directory}: read its TAU profiles only; left out {len(others)} other file"
             f"{'s' if len(others) != 1 else ''} ({shown}{more}): give another profiler's files on their own")


def _profiles_in(directory: Path, metric_dir: str | None = None,
                 warn: Callable[[str], None] | None = None) -> list[Source]:
    """The ``profile.N.C.T`` files of ``directory``; one whose numbers do not fit Int64 (the node is the pid
    column) is left out, counted in one warning naming the first."""
    out, unfit = [], []
    for p in directory.iterdir():
        m = PROFILE_NAME.match(p.name)
        if m and p.is_file():
            node, context, thread = (int(m.group(k)) for k in (1, 2, 3))
            if max(node, context, thread) > events.ID_MAX:
                unfit.append(p.name)
                continue
            out.append(Source(p, node, context, thread, metric_dir))
    if unfit and not out:
        raise bad_input(directory / min(unfit), None, _UNFIT)
    if unfit and warn is not None:
        first = min(unfit)
        warn(f"{directory}: left out {len(unfit)} profile file{'s' if len(unfit) != 1 else ''} whose node, "
             f"context or thread number does not fit Int64 (first: {first[:80] + ('…' if len(first) > 80 else '')})")
    return sorted(out, key=lambda s: (s.node, s.context, s.thread, s.metric_dir or "", s.path.name))


def source_for(path: Path) -> Source:
    """A loose profile file given on the command line; its thread from its name (0.0.0 if it has none)."""
    m = PROFILE_NAME.match(path.name)
    metric_dir = path.parent.name[len(MULTI_PREFIX):] if path.parent.name.startswith(MULTI_PREFIX) else None
    if not m:
        return Source(path, 0, 0, 0, metric_dir)
    numbers = [int(m.group(k)) for k in (1, 2, 3)]
    if max(numbers) > events.ID_MAX:
        raise bad_input(path, None, _UNFIT)
    return Source(path, *numbers, metric_dir)


_UNFIT = "its node, context or thread number (profile.NODE.CONTEXT.THREAD) does not fit Int64"


@dataclass
class ProfileSet:
    """What the files of one trace hold, as the tables :func:`events.build_events` takes."""

    routines: pl.DataFrame
    counters: pl.DataFrame
    user_events: pl.DataFrame
    threads: pl.DataFrame
    metrics: list[str]
    time_metric: str | None
    metadata: list[tuple[tuple[int, int, int], dict[str, str]]]
    files_read: int


def read_sources(sources: list[Source], warn: Callable[[str], None],
                 progress: Callable[[int], None] = lambda n: None) -> ProfileSet:
    """Parse every file (skipping, with a warning, those that fail while others succeed) and merge metrics."""
    parsed: list[tuple[Source, ProfileFile]] = []
    failures: list[InputError] = []
    for source in sources:
        try:
            profile = read_profile_file(source.path)
        except InputError as exc:
            failures.append(exc)
            continue
        finally:
            try:
                progress(source.path.stat().st_size)
            except OSError:
                pass
        parsed.append((source, profile))
        for w in profile.warnings:
            warn(w)
    if not parsed:
        raise failures[0]
    for exc in failures:
        warn(f"skipped: {exc}")
    return _merge(parsed, warn)


def _metric_of(source: Source, profile: ProfileFile) -> str:
    return profile.metric or source.metric_dir or "TIME"


def _one_per_thread_and_metric(parsed: list[tuple[Source, ProfileFile]],
                               warn: Callable[[str], None]) -> list[tuple[Source, ProfileFile]]:
    """The files with at most one per thread and metric: a second profile of a thread's metric (a TIME profile
    copied into ``MULTI__PAPI_TOT_CYC/``, whose first line still says TIME) was read beside the first, every
    routine of that thread counted twice. The one in its own metric's directory is kept (else the first), with a
    warning naming both; a file whose first line names another metric than its ``MULTI__`` directory is warned
    of too."""
    def misplaced(source: Source, profile: ProfileFile) -> bool:
        return source.metric_dir is not None and profile.metric != source.metric_dir

    kept: dict[tuple, Path] = {}
    out = []
    # of two files of a thread's metric, the one in its own metric's directory is kept
    for source, profile in sorted(parsed, key=lambda sp: misplaced(*sp)):
        metric = _metric_of(source, profile)
        if misplaced(source, profile):
            warn(f"{profile.path}: its first line names metric {profile.metric}, not {source.metric_dir} as its "
                 f"directory {MULTI_PREFIX}{source.metric_dir} does; read as {profile.metric}")
        key = (source.node, source.context, source.thread, metric)
        if key in kept:
            warn(f"{profile.path}: a second {metric} profile of thread {'.'.join(map(str, key[:3]))} (the first: "
                 f"{kept[key]}); left out, so that the thread's routines are not counted twice")
            continue
        kept[key] = profile.path
        out.append((source, profile))
    order = {id(sp[1]): i for i, sp in enumerate(parsed)}
    return sorted(out, key=lambda sp: order[id(sp[1])])


def _merge(parsed: list[tuple[Source, ProfileFile]], warn: Callable[[str], None]) -> ProfileSet:
    frames, with_user_events, threads, metadata = [], {}, [], []
    numbers = WholeNumbers()
    parsed = _one_per_thread_and_metric(parsed, warn)
    for source, profile in parsed:
        key = (source.node, source.context, source.thread)
        frames.append(profile.routines.with_columns(
            metric=pl.lit(_metric_of(source, profile)), path=pl.lit(str(profile.path)),
            node=pl.lit(source.node, pl.Int64), context=pl.lit(source.context, pl.Int64),
            thread=pl.lit(source.thread, pl.Int64)))
        if profile.user_events.height and key not in with_user_events:  # every metric's file repeats them
            with_user_events[key] = profile
        metadata.append((key, profile.metadata))
        threads.append({"node": key[0], "context": key[1], "thread": key[2],
                        **gpu_facts(profile.metadata, numbers, f"{profile.path} (metadata)")})
    numbers.flush(warn)
    return assemble(pl.concat(frames, how="vertical_relaxed"), _user_events(with_user_events, warn),
                    pl.DataFrame(threads, schema=events.THREADS, strict=False), metadata, len(parsed), warn)


def assemble(table: pl.DataFrame, user_events: pl.DataFrame, threads: pl.DataFrame,
             metadata: list[tuple[tuple[int, int, int], dict[str, str]]], files_read: int,
             warn: Callable[[str], None]) -> ProfileSet:
    """Merge the routine rows of every metric (columns node, context, thread, metric, seq, raw, calls,
    subcalls, group, excl, incl as text, path, line) into routines with times and counters."""
    metrics = sorted(set(table["metric"].to_list()), key=_metric_rank)
    time_metric = next((m for m in metrics if is_time_metric(m)), None)
    table = table.sort(["node", "context", "thread", "metric", "seq"])
    table = events.with_dup(table, ["metric", "raw"])
    reference = _reference_rows(table, metrics)
    missing = table.join(reference.select(*events.THREAD, "raw", "dup"), on=[*events.THREAD, "raw", "dup"],
                         how="anti", nulls_equal=True)
    if missing.height:
        warn(f"{missing.height} routine rows of other metrics have no row in the {reference['metric'][0]} "
             f"profile of their thread (e.g. {missing['raw'][0].strip()!r}); their values were not kept")
    routines = _sampled_out_of_timers(_with_times(reference, table, time_metric), warn)
    counters = _counters(table, time_metric)
    _note_wrapped(table, metrics, time_metric, warn)
    _note_threads_without(table, metrics, time_metric, warn)
    return ProfileSet(routines, counters, user_events, threads, metrics, time_metric, _dedupe_metadata(metadata),
                      files_read)


def _metric_rank(metric: str) -> tuple[int, str]:
    upper = metric.upper()
    if upper in TIME_PREFERENCE:
        return TIME_PREFERENCE.index(upper), metric
    return (len(TIME_PREFERENCE), metric) if is_time_metric(metric) else (len(TIME_PREFERENCE) + 1, metric)


def _reference_rows(table: pl.DataFrame, metrics: list[str]) -> pl.DataFrame:
    """Per thread, the routine rows of its most preferred metric (calls, subrs and groups come from there)."""
    rank = {m: i for i, m in enumerate(metrics)}
    ranked = table.with_columns(rank=pl.col("metric").replace_strict(rank, return_dtype=pl.Int64))
    best = ranked.group_by(events.THREAD).agg(pl.col("rank").min().alias("best"))
    return ranked.join(best, on=events.THREAD).filter(pl.col("rank") == pl.col("best")).drop("rank", "best")


def _with_times(reference: pl.DataFrame, table: pl.DataFrame, time_metric: str | None) -> pl.DataFrame:
    keys = [*events.THREAD, "raw", "dup"]
    out = reference.select(*events.THREAD, "seq", "raw", "dup", "calls", "subcalls", "group")
    if time_metric is None:
        return out.with_columns(exclusive_ns=pl.lit(None, pl.Int64), duration_ns=pl.lit(None, pl.Int64))
    if (reference["metric"] == time_metric).all():
        # every thread's reference rows are its time rows (the usual case): a join of each row with itself, on
        # string keys, cost 4 of 9 s for a 3,000-routine x 1,000-thread .ppk
        return out.with_columns(exclusive_ns=_ns(reference, "excl"), duration_ns=_ns(reference, "incl"))
    times = table.filter(pl.col("metric") == time_metric)
    times = times.with_columns(exclusive_ns=_ns(times, "excl"), duration_ns=_ns(times, "incl"))
    return out.join(times.select(*keys, "exclusive_ns", "duration_ns"), on=keys, how="left", nulls_equal=True,
                    maintain_order="left")


#: 2^32: a 32-bit counter (PAPI's or TAU's own) that wrapped leaves its values near this many units.
_WRAP = 2 ** 32


def _note_wrapped(table: pl.DataFrame, metrics: list[str], time_metric: str | None,
                  warn: Callable[[str], None]) -> None:
    """Warn of a second time metric whose every thread ran about 2^32 us where the time metric's ran under 1% of
    that (``P_WALL_CLOCK_TIME`` at 4,295 s a thread of a 0.09 s run): a 32-bit counter that wrapped. Its values
    are kept as written (the figures use the time metric), but not in silence."""
    if time_metric is None:
        return
    incl = pl.col("incl").cast(pl.Float64, strict=False)
    longest = table.group_by("metric", *events.THREAD).agg(incl.max().alias("us"))
    reference = longest.filter(pl.col("metric") == time_metric)["us"].max()
    if reference is None or reference >= 0.01 * _WRAP:
        return
    for metric in metrics:
        if metric == time_metric or not is_time_metric(metric):
            continue
        mine = longest.filter(pl.col("metric") == metric)["us"]
        if mine.len() and mine.min() >= 0.99 * _WRAP and mine.max() < 1.01 * _WRAP:
            warn(f"metric {metric}: every thread ran {mine.min() / 1e6:,.0f}–{mine.max() / 1e6:,.0f} s, about "
                 f"2^32 us, where {time_metric} gives at most {reference / 1e6:.3g} s: a 32-bit counter that "
                 "wrapped; its values are kept as written, and the figures use " + time_metric)


def _note_threads_without(table: pl.DataFrame, metrics: list[str], time_metric: str | None,
                          warn: Callable[[str], None]) -> None:
    """Warn, per metric, of the threads that have profiles of other metrics but none of this one (a rank's
    ``MULTI__TIME/profile.2.0.0`` lost, or not copied): without its time that rank dropped out of every figure
    of time ("on 3 threads of 3 processes" of a 4-rank run), without a counter out of the derived metrics, and
    nothing said so."""
    if len(metrics) < 2:
        return
    have = table.select("metric", *events.THREAD).unique()
    everyone = have.select(events.THREAD).unique().sort(events.THREAD)
    for metric in metrics:
        lacking = everyone.join(have.filter(pl.col("metric") == metric), on=events.THREAD, how="anti",
                                nulls_equal=True).sort(events.THREAD)
        if not lacking.height:
            continue
        names = [".".join(map(str, r)) for r in lacking.iter_rows()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        one = len(names) == 1
        its, them = ("its", "it") if one else ("their", "them")
        what = (f"{its} routines have no time, and every figure of time leaves {them} out" if metric == time_metric
                else f"{its} routines have no {metric} values, and what is derived from {metric} leaves {them} out")
        warn(f"{len(names)} of {everyone.height} threads {'has' if one else 'have'} no {metric} profile ({shown}) "
             f"but profiles of other metrics: {what}")


#: TAU's sampling (EBS, ``TAU_SAMPLING``) writes ``[CONTEXT] X``: the samples taken while timer ``X`` ran, broken
#: down by the ``[SAMPLE] f [{file} {line}]`` rows under it.
CONTEXT_PREFIX = "[CONTEXT] "
SAMPLE_PREFIX = "[SAMPLE] "


def _sampled_out_of_timers(routines: pl.DataFrame, warn: Callable[[str], None] = lambda _: None) -> pl.DataFrame:
    """Each timer's exclusive time less what its samples attribute elsewhere: TAU writes ``.TAU application``
    Excl 1.861 s beside ``[CONTEXT] .TAU application`` (Incl 1.860 s, the 186 samples taken in it) and the
    ``[SAMPLE]`` rows that split those 1.860 s among the functions sampled. Summed as written, the thread ran
    3.721 s and every share was half its value; the timer keeps the time no sample covers (0.7 ms), the samples
    the rest. Flat rows only (call paths are another view of the same time).

    Where a timer's samples add up to more than its exclusive time (a sample's period counted whole at the
    timer's edge), the timer keeps nothing and the thread's samples are scaled down by what they exceed, so the
    thread's exclusive times add up to its time, not more (a sampled OpenMP profile of tau2's came to 0.436 s more
    than its 12 threads ran); ``warn`` says so."""
    flat = ~pl.col("raw").str.contains(" => ", literal=True)
    contexts = routines.filter(flat & pl.col("raw").str.starts_with(CONTEXT_PREFIX))
    if not contexts.height or routines["exclusive_ns"].null_count() == routines.height:
        return routines
    sampled = (contexts.group_by(*events.THREAD, pl.col("raw").str.strip_prefix(CONTEXT_PREFIX).alias("timer"))
               .agg(_sampled=pl.col("duration_ns").sum()))
    routines = routines.join(sampled, left_on=[*events.THREAD, "raw"], right_on=[*events.THREAD, "timer"],
                             how="left", nulls_equal=True, maintain_order="left")
    less = pl.max_horizontal(pl.col("exclusive_ns") - pl.col("_sampled").fill_null(0), pl.lit(0))
    over = (pl.col("_sampled") - pl.col("exclusive_ns")).clip(lower_bound=0)
    excess = routines.filter(flat).group_by(*events.THREAD).agg(_excess=over.sum(), _timers=(over > 0).sum())
    routines = routines.with_columns(exclusive_ns=pl.when(flat & pl.col("_sampled").is_not_null()).then(less)
                                     .otherwise(pl.col("exclusive_ns"))).drop("_sampled")
    return _samples_within(routines, excess.filter(pl.col("_excess") > 0), flat, warn)


def _samples_within(routines: pl.DataFrame, excess: pl.DataFrame, flat: pl.Expr,
                    warn: Callable[[str], None]) -> pl.DataFrame:
    """The flat ``[SAMPLE]`` rows of each thread in ``excess`` (its samples' time beyond their timers',
    ``_excess``) scaled down by that much, in proportion; one warning for all threads."""
    if not excess.height:
        return routines
    sample = flat & pl.col("raw").str.starts_with(SAMPLE_PREFIX)
    totals = (routines.filter(sample).group_by(*events.THREAD).agg(_samples=pl.col("exclusive_ns").sum())
              .join(excess, on=events.THREAD, how="inner", nulls_equal=True)
              .with_columns(_factor=(1 - pl.col("_excess") / pl.col("_samples")).clip(lower_bound=0)))
    if not totals.height:
        return routines
    scaled = routines.join(totals.select(*events.THREAD, "_factor"), on=events.THREAD, how="left",
                           nulls_equal=True, maintain_order="left")
    by = pl.when(sample & pl.col("_factor").is_not_null())
    scaled = scaled.with_columns(**{c: by.then((pl.col(c) * pl.col("_factor")).round().cast(pl.Int64))
                                    .otherwise(pl.col(c)) for c in ("exclusive_ns", "duration_ns")})
    ms = int(excess["_excess"].sum()) / 1e6
    warn(f"the samples of {int(excess['_timers'].sum()):,} timers on {totals.height:,} threads add up to "
         f"{ms:,.3f} ms more than those timers' own time (a sample's period counted whole at a timer's edge): "
         "each such thread's samples were scaled down by that much, so its routines add up to its time")
    return scaled.drop("_factor")


def _ns(times: pl.DataFrame, column: str) -> pl.Series:
    """Microsecond text to exact integer ns; InputError naming the file and line of a value out of range."""
    values = scaled_int(times[column], 3)
    bad = values.is_null() & times[column].is_not_null()
    if bad.any():
        row = times.filter(bad).row(0, named=True)
        label = "Excl" if column == "excl" else "Incl"
        raise bad_input(row["path"], row["line"], f"{label} {row[column]!r} is out of range for nanoseconds")
    return values


def _counters(table: pl.DataFrame, time_metric: str | None) -> pl.DataFrame:
    others = table.filter(pl.col("metric") != (time_metric or ""))
    if not others.height:
        return events.empty(events.COUNTERS)
    upper = pl.col("metric").str.to_uppercase()
    is_time = upper.str.contains("TIME") | upper.is_in(list(TIME_PREFERENCE))
    factor = pl.when(is_time).then(pl.lit(1000.0)).otherwise(pl.lit(1.0))
    return others.select(
        *events.THREAD, "raw", "dup", "metric",
        (to_float(pl.col("excl")) * factor).alias("exclusive"),
        (to_float(pl.col("incl")) * factor).alias("inclusive"),
        pl.when(is_time).then(pl.lit("ns")).otherwise(pl.lit(None, pl.String)).alias("unit"),
    )


def _user_events(sources: dict, warn: Callable[[str], None]) -> pl.DataFrame:
    frames = []
    for (node, context, thread), profile in sources.items():
        ue = profile.user_events
        notes: list[str] = []
        calls = whole_numbers(profile.path, ue["numevents"], ue["line"], "numevents", notes)
        for note in notes:
            warn(note)
        frames.append(pl.DataFrame({
            "node": node, "context": context, "thread": thread, "name": ue["name"],
            "calls": calls,
            "value": ue.select(to_float(pl.col("mean"))).to_series(),
            "value_min": ue.select(to_float(pl.col("min"))).to_series(),
            "value_max": ue.select(to_float(pl.col("max"))).to_series(),
            "value_sumsq": ue.select(to_float(pl.col("sumsqr"))).to_series(),
        }, schema_overrides={"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64}))
    if not frames:
        return events.empty(events.USER_EVENTS)
    return pl.concat(frames, how="vertical_relaxed")


def gpu_facts(metadata: dict[str, str], numbers: WholeNumbers, where: str) -> dict:
    """CUDA device, context and stream of a GPU thread, from its metadata (None where not said; a value that is
    not a whole number is None too, and noted in ``numbers`` against ``where``, the file)."""
    def as_int(key: str) -> int | None:
        return numbers(metadata.get(key), key, where)
    return {"cuda_device": as_int("CUDA Device"), "cuda_context": as_int("CUDA Context"),
            "cuda_stream": as_int("CUDA Stream"), "gpu_thread": any(k in metadata for k in GPU_THREAD_KEYS)}


def _dedupe_metadata(metadata: list) -> list:
    seen, out = set(), []
    for key, attrs in metadata:
        if key not in seen:
            seen.add(key)
            out.append((key, attrs))
    return out
