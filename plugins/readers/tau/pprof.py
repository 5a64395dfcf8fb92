"""pprof's text report of TAU profiles, read back as aggregated rows.

pprof (TAU's ``utils/pprof.cpp``) prints, per thread::

    NODE 0;CONTEXT 0;THREAD 0:
    ---------------------------------------------------------------------------------------
    %Time    Exclusive    Inclusive       #Call      #Subrs  Inclusive Name
                  msec   total msec                          usec/call
    ---------------------------------------------------------------------------------------
    100.0        0.593       11,900           4           4    2975091 .TAU application

then ``USER EVENTS Profile :NODE n, CONTEXT c, THREAD t`` tables
(``NumSamples MaxValue MinValue MeanValue Std. Dev. Event Name``), and
``FUNCTION SUMMARY (total):`` / ``(mean):`` tables over all threads
(``pprof -s`` prints only those). Times are milliseconds in pprof's
``ToTimeStr`` forms: ``h:mm:ss.mmm``, ``m:ss.mmm``, ``s,mmm`` (seconds and
milliseconds), whole milliseconds, or ``%9.3G`` below one millisecond; they
are read exactly as printed (pprof truncates to the millisecond above
1 ms). A table headed ``Count/Call`` holds counts of a hardware counter
(pprof does not say which): its exclusive and inclusive values become
counter rows named ``Count``. A ``Standard deviation`` column
(PROFILE_STATS builds) is skipped.

Rows: the per-thread tables when there are any (the summaries repeat them),
else the ``total`` table (pid, tid null: all threads together), else the
``mean`` table (per-thread means, with a warning). User events become
counter rows (NumSamples, min, max, mean; pprof prints the standard
deviation, not the sum of squares, so value_sumsq stays null).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import polars as pl

from traceparse.errors import bad_input
from traceparse.sources import open_binary

from . import events
from .decimals import is_number, scaled_int, to_float
from .profile_text import whole_numbers
from .profiles import ProfileSet
from .sniff import COLUMN_HEADER, SUMMARY_HEADER, THREAD_HEADER

USER_HEADER = r"^\s*USER EVENTS Profile\s*:\s*NODE ([0-9]+),\s*CONTEXT ([0-9]+),\s*THREAD ([0-9]+)"
USER_COLUMNS = r"^\s*NumSamples\s+MaxValue"
ROW_EXPECTED = "'%Time Exclusive Inclusive #Call #Subrs Inclusive-per-call Name'"
USER_ROW_EXPECTED = "'NumSamples MaxValue MinValue MeanValue Std.Dev. Name'"
COUNTER_NAME = "Count"


def read_pprof(path: Path, warn: Callable[[str], None],
               progress: Callable[[int], None] = lambda n: None) -> tuple[ProfileSet, dict]:
    """Parse pprof output into the tables :func:`events.build_events` takes, plus what sections there were."""
    try:
        with open_binary(path, text=True) as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise bad_input(path, None, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    progress(len(data))
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    kept, _, tail = text.rpartition("\n")
    if tail.strip():  # pprof ends every line with a break: the last one was cut (issue 16), never half a row
        warn(f"{path}:{kept.count(chr(10)) + 2 if kept else 1}: the file ends in the middle of this line "
             "(cut short?); the line was left out")
        text = kept
    lines = pl.Series(text.split("\n"), dtype=pl.String)
    sections = _sections(lines)
    for s in sections:  # the node becomes the pid column (Int64); context and thread are Int64 too
        if any(k is not None and k > events.ID_MAX for k in s["key"]):
            raise bad_input(path, s["start"] + 1, f"{lines[s['start']].strip()[:80]!r}: a node, context or thread "
                                                  "number that does not fit Int64")
    functions = [s for s in sections if s["type"] in ("thread", "total", "mean")]
    if not functions:
        raise bad_input(path, None, "not pprof output: expected 'NODE n;CONTEXT c;THREAD t:' or "
                                    f"'FUNCTION SUMMARY (total):' followed by a {ROW_EXPECTED} table")
    kinds = {t: sum(s["type"] == t for s in sections) for t in ("thread", "total", "mean", "user")}
    if kinds["thread"]:
        chosen = "thread"
    elif kinds["total"]:
        chosen = "total"
    else:
        chosen = "mean"
        warn(f"{path}: only the FUNCTION SUMMARY (mean) table is present: rows are means over threads")
    routine_frames, counter_frames = [], []
    chosen_sections = _first_of_each_thread(path, [s for s in sections if s["type"] == chosen], warn)
    for section in chosen_sections:
        routines, counters = _function_table(path, lines, section, warn)
        routine_frames.append(routines)
        if counters is not None:
            counter_frames.append(counters)
    users = _first_of_each_thread(path, [s for s in sections if s["type"] == "user"], lambda message: None)
    event_frames = [_user_table(path, lines, s, warn) for s in users]
    if chosen != "thread":
        event_frames = []
    routines = pl.concat(routine_frames, how="diagonal_relaxed")  # by name: a cut table may order columns apart
    counters = pl.concat(counter_frames, how="vertical_relaxed") if counter_frames else events.empty(events.COUNTERS)
    user_events = pl.concat(event_frames, how="vertical_relaxed") if event_frames else events.empty(events.USER_EVENTS)
    has_time = bool(routines["duration_ns"].is_not_null().any())
    result = ProfileSet(routines, counters, user_events, events.empty(events.THREADS),
                        ["TIME"] if has_time else [COUNTER_NAME], "TIME" if has_time else None, [], 1)
    summed = None
    if chosen == "total" and kinds["mean"] and has_time:
        mean, _ = _function_table(path, lines, next(s for s in sections if s["type"] == "mean"), lambda m: None)
        summed = _summed_threads(routines, mean)
    return result, {"tables": kinds, "read": chosen, "summed_threads": summed}


def _summed_threads(total: pl.DataFrame, mean: pl.DataFrame) -> int | None:
    """How many threads the total table sums: pprof's mean table is the total over the threads divided by their
    number, so the routine with the most inclusive time gives it (its total over its mean, a whole number to 1%);
    None where the two tables disagree or say nothing."""
    both = (total.select("raw", total_ns="duration_ns")
            .join(mean.select("raw", mean_ns="duration_ns"), on="raw", how="inner")
            .filter(pl.col("mean_ns") > 0).sort(["total_ns", "raw"], descending=[True, False]))
    if both.height == 0:
        return None
    total_ns, mean_ns = both.row(0)[1:]
    threads = round(total_ns / mean_ns)
    return threads if threads >= 1 and abs(threads * mean_ns - total_ns) <= 0.01 * total_ns else None


def _first_of_each_thread(path: Path, sections: list[dict], warn: Callable[[str], None]) -> list[dict]:
    """The first table of each thread: pprof writes a thread once, so a thread seen again is another report
    pasted into the same file (three runs' reports summed into one thread of three times the time)."""
    seen: dict[tuple, int] = {}
    kept = []
    for s in sections:
        seen[s["key"]] = seen.get(s["key"], 0) + 1
        if seen[s["key"]] == 1:
            kept.append(s)
    repeated = {k: n for k, n in seen.items() if n > 1}
    if repeated:
        key, n = next(iter(repeated.items()))
        which = "the total summary" if key == (None, None, None) else "thread " + ".".join(map(str, key))
        warn(f"{path}: {which} appears {n} times (several pprof reports in one file?); the first of each was read"
             + (f", {len(repeated) - 1} more repeated" if len(repeated) > 1 else ""))
    return kept


def _sections(lines: pl.Series) -> list[dict]:
    df = pl.DataFrame({"text": lines}).with_row_index("i")
    thread = df.select(pl.col("i"), pl.col("text").str.extract_groups(THREAD_HEADER).alias("g")).unnest("g")
    summary = lines.str.extract(SUMMARY_HEADER, 1)
    user = df.select(pl.col("text").str.extract_groups(USER_HEADER).alias("g")).unnest("g")
    marks = []
    for i in (thread["1"].is_not_null() | summary.is_not_null() | user["1"].is_not_null()).arg_true().to_list():
        if thread["1"][i] is not None:
            marks.append({"type": "thread", "start": i, "key": tuple(int(thread[c][i]) for c in ("1", "2", "3"))})
        elif summary[i] is not None:
            marks.append({"type": summary[i], "start": i, "key": (None, None, None)})
        else:
            marks.append({"type": "user", "start": i, "key": tuple(int(user[c][i]) for c in ("1", "2", "3"))})
    for mark, after in zip(marks, marks[1:] + [{"start": len(lines)}]):
        mark["end"] = after["start"]
    return marks


def _table_rows(lines: pl.Series, start: int, end: int, header: str) -> tuple[int, int, str] | None:
    """(first row, end of rows, header line) of the table of a section, or None when it has none."""
    block = lines.slice(start, end - start)
    found = block.str.contains(header).arg_true()
    if not len(found):
        return None
    at = start + int(found[0])
    head = lines[at]
    first = at + 1
    # skip the units line and the dashes under the header
    while first < end and (lines[first].strip().startswith("-") or not _has_number(lines[first])):
        if lines[first].strip() == "" and first > at + 1:
            break
        first += 1
    rest = lines.slice(first, end - first)
    stop = (rest.str.strip_chars().eq("") | rest.str.strip_chars().str.starts_with("---")).arg_true()
    last = first + (int(stop[0]) if len(stop) else len(rest))
    return first, last, head


def _has_number(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


def _extract(lines: pl.Series, first: int, last: int, numbers: int) -> pl.DataFrame:
    pattern = r"^\s*" + r"(\S+)\s+" * numbers + r"(.*?)\s*$"
    df = pl.DataFrame({"text": lines.slice(first, last - first)})
    df = df.with_columns(line=pl.int_range(first + 1, first + 1 + df.height, dtype=pl.Int64))
    groups = df.select(pl.col("text").str.extract_groups(pattern).alias("g")).unnest("g")
    groups.columns = [f"f{k}" for k in range(1, groups.width + 1)]
    return pl.concat([df, groups], how="horizontal")


def _function_table(path: Path, lines: pl.Series, section: dict, warn: Callable[[str], None]):
    found = _table_rows(lines, section["start"], section["end"], COLUMN_HEADER)
    node, context, thread = section["key"]
    if found is None:
        return events.empty(events.ROUTINES), None
    first, last, head = found
    counts = "Count/Call" in head or "counts" in head.lower()
    numbers = 7 if "Standard" in head else 6
    rows = _extract(lines, first, last, numbers)
    numeric = [f"f{k}" for k in range(1, numbers + 1)]
    bad = rows.filter(pl.col(f"f{numbers + 1}").is_null() | (pl.col(f"f{numbers + 1}") == "")
                      | ~pl.all_horizontal(is_number(pl.col(c)) | pl.col(c).str.contains(r"^[0-9:.,]+$")
                                           for c in numeric))
    if bad.height:
        row = bad.row(0, named=True)
        raise bad_input(path, row["line"], f"expected a pprof row {ROW_EXPECTED}, found {row['text'].strip()!r}")
    notes: list[str] = []
    calls = whole_numbers(path, rows["f4"], rows["line"], "#Call", notes)
    subcalls = whole_numbers(path, rows["f5"], rows["line"], "#Subrs", notes)
    for note in notes:
        warn(note)
    raw = rows[f"f{numbers + 1}"]
    key = {"node": pl.lit(node, pl.Int64), "context": pl.lit(context, pl.Int64), "thread": pl.lit(thread, pl.Int64)}
    base = pl.DataFrame({"seq": pl.int_range(0, rows.height, eager=True).cast(pl.Int64), "raw": raw,
                         "calls": calls, "subcalls": subcalls}).with_columns(**key, group=pl.lit(None, pl.String))
    if counts:
        routines = base.with_columns(exclusive_ns=pl.lit(None, pl.Int64), duration_ns=pl.lit(None, pl.Int64))
        counters = events.with_dup(base.with_columns(
            exclusive=rows.select(to_float(pl.col("f2"))).to_series(),
            inclusive=rows.select(to_float(pl.col("f3"))).to_series(),
            metric=pl.lit(COUNTER_NAME), unit=pl.lit(None, pl.String)), ["raw"])
        return routines, counters
    routines = base.with_columns(exclusive_ns=_ms_to_ns(path, rows, "f2"), duration_ns=_ms_to_ns(path, rows, "f3"))
    return routines, None


def _ms_to_ns(path: Path, rows: pl.DataFrame, column: str) -> pl.Series:
    """pprof's ToTimeStr text (milliseconds) to exact integer ns."""
    text = rows[column]
    df = pl.DataFrame({"t": text})
    hms = df.select(pl.col("t").str.extract_groups(r"^([0-9]+):([0-9][0-9]):([0-9][0-9])\.([0-9]{3})$").alias("g")).unnest("g")
    ms = df.select(pl.col("t").str.extract_groups(r"^([0-9]+):([0-9][0-9])\.([0-9]{3})$").alias("g")).unnest("g")
    sec = df.select(pl.col("t").str.extract_groups(r"^(\d+),(\d{3})$").alias("g")).unnest("g")
    plain = scaled_int(text, 6)

    def i(s: pl.Series) -> pl.Series:
        return s.cast(pl.Int64)
    millis = pl.select(
        pl.when(hms["1"].is_not_null()).then(((i(hms["1"]) * 60 + i(hms["2"])) * 60 + i(hms["3"])) * 1000
                                             + i(hms["4"]))
        .when(ms["1"].is_not_null()).then((i(ms["1"]) * 60 + i(ms["2"])) * 1000 + i(ms["3"]))
        .when(sec["1"].is_not_null()).then(i(sec["1"]) * 1000 + i(sec["2"]))
        .otherwise(None).alias("ms")).to_series()
    out = pl.select(pl.when(millis.is_not_null()).then(millis * 1_000_000).otherwise(plain).alias(column)).to_series()
    bad = out.is_null()
    if bad.any():
        k = int(bad.arg_max())
        raise bad_input(path, int(rows["line"][k]), f"expected a pprof time (msec, m:ss.mmm or h:mm:ss.mmm), "
                                                    f"found {text[k]!r}")
    return out


def _user_table(path: Path, lines: pl.Series, section: dict, warn: Callable[[str], None]) -> pl.DataFrame:
    found = _table_rows(lines, section["start"], section["end"], USER_COLUMNS)
    if found is None:
        return events.empty(events.USER_EVENTS)
    first, last, _ = found
    rows = _extract(lines, first, last, 5)
    bad = rows.filter(pl.col("f6").is_null() | (pl.col("f6") == "")
                      | ~pl.all_horizontal(is_number(pl.col(f"f{k}")) for k in range(1, 6)))
    if bad.height:
        row = bad.row(0, named=True)
        raise bad_input(path, row["line"], f"expected a user event row {USER_ROW_EXPECTED}, "
                                           f"found {row['text'].strip()!r}")
    notes: list[str] = []
    calls = whole_numbers(path, rows["f1"], rows["line"], "NumSamples", notes)
    for note in notes:
        warn(note)
    node, context, thread = section["key"]
    return pl.DataFrame({
        "node": node, "context": context, "thread": thread, "name": rows["f6"], "calls": calls,
        "value_max": rows.select(to_float(pl.col("f2"))).to_series(),
        "value_min": rows.select(to_float(pl.col("f3"))).to_series(),
        "value": rows.select(to_float(pl.col("f4"))).to_series(),
        "value_sumsq": pl.Series([None] * rows.height, dtype=pl.Float64),
    }, schema_overrides={"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64})
