"""One TAU text profile, ``profile.<node>.<context>.<thread>``, as raw columns.

Layout, as TAU's runtime (``TauProfiler_StoreData``), ParaProf's export and
pprof read it::

    23 templated_functions_MULTI_TIME
    # Name Calls Subrs Excl Incl ProfileCalls # <metadata><attribute>...</attribute></metadata>
    ".TAU application" 1 7 449 51781 0 GROUP="TAU_DEFAULT"
    ".TAU application => MPI_Init()  " 1 0 17983 17983 0 GROUP="TAU_CALLPATH|MPI"
    ...                                   (exactly <n> routine rows)
    0 aggregates
    2 userevents
    # eventname numevents max min mean sumsqr
    "Message size for broadcast" 1 4 4 4 16

Variants accepted: ``<n> templated_functions`` (time only, ParaProf's
export), ``templated_functions_hw_counters`` (old counter profiles), the
column line with ``SumExclSqr`` (PROFILE_STATS builds), the metadata glued
to the column line without ``#``, no column line at all (the oldest
format), no ``GROUP=`` tag, and ``ProfileCalls`` > 0 followed by that many
per-call lines (PROFILE_CALLS builds, skipped). Numbers stay text here; the
caller converts them exactly once it knows the metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceparse.errors import InputError, bad_input
from traceparse.sources import open_binary

from . import safe_xml
from .decimals import is_number, scaled_int

HEADER = re.compile(r"^\s*(\d+)\s+templated_functions(?:_MULTI_(.+?)|_(\S+))?\s*$")
HEADER_EXPECTED = "'<n> templated_functions_MULTI_<METRIC>' or '<n> templated_functions'"
COLUMNS_PREFIX = "# Name Calls Subrs Excl Incl"
AGGREGATES = re.compile(r"^\s*(\d+)\s+aggregates\s*$")
USEREVENTS = re.compile(r"^\s*(\d+)\s+userevents\s*$")
USEREVENT_COLUMNS = "# eventname numevents"
ROW_EXPECTED = '"NAME" Calls Subrs Excl Incl ProfileCalls [GROUP="..."]'
USEREVENT_EXPECTED = '"NAME" numevents max min mean sumsqr'
_GROUP_TAIL = re.compile(r'(?<!\s)\s++GROUP="[^"]*+"\s*+$')  # starts only where a space run starts: linear


def _row_pattern(numbers: int) -> str:
    return r'^"(.*)"' + r"\s+(\S+)" * numbers + r'(?:\s+GROUP="(.*)")?\s*$'


USEREVENT_ROW = r'^"(.*)"' + r"\s+(\S+)" * 5 + r"\s*$"


@dataclass
class ProfileFile:
    """The parsed content of one profile file; numbers as text, lines 1-based."""

    path: Path
    metric: str
    routines: pl.DataFrame     # line, seq, raw, calls, subcalls (Int64), excl, incl (text), group
    user_events: pl.DataFrame  # line, name, numevents, max, min, mean, sumsqr (text)
    metadata: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def read_profile_file(path: Path) -> ProfileFile:
    """Parse ``path``; InputError (one line: file, line, what was expected) on anything not TAU's layout.

    A file cut short (the run was killed) keeps its complete rows and
    records a warning instead.
    """
    try:
        with open_binary(path, text=True) as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise bad_input(path, None, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    if not text.strip():
        raise bad_input(path, None, f"the file is empty; expected a TAU profile starting {HEADER_EXPECTED}")
    lines = text.split("\n")
    warnings: list[str] = []
    if text.endswith("\n"):
        lines.pop()
    else:
        cut = lines.pop()
        warnings.append(f"{path}: the last line ({len(lines) + 1}) is cut short and was not read: {_snippet(cut)}")
    return _parse(path, lines, warnings)


def _parse(path: Path, lines: list[str], warnings: list[str]) -> ProfileFile:
    m = HEADER.match(lines[0]) if lines else None
    if not m:
        found = _snippet(lines[0]) if lines else "nothing"
        raise bad_input(path, 1, f"not a TAU profile: expected {HEADER_EXPECTED}, found {found}")
    n_routines = int(m.group(1))
    metric = (m.group(2) or m.group(3) or "TIME").strip()
    metadata: dict[str, str] = {}
    numbers = 5
    start = 1
    if len(lines) > 1 and lines[1].startswith("#"):
        columns = lines[1]
        if not columns.startswith(COLUMNS_PREFIX):
            raise bad_input(path, 2, f"expected the column line '{COLUMNS_PREFIX} ProfileCalls', "
                                     f"found {_snippet(columns)}")
        if columns[len(COLUMNS_PREFIX):].lstrip().startswith("SumExclSqr"):
            numbers = 6
        metadata = _metadata(path, columns, warnings)
        start = 2
    routines, end = _routines(path, lines, start, n_routines, numbers, warnings)
    user_events = _after_routines(path, lines, end, n_routines, warnings)
    return ProfileFile(path, metric, routines, user_events, metadata, warnings)


def _metadata(path: Path, columns: str, warnings: list[str]) -> dict[str, str]:
    begin = columns.find("<metadata>")
    if begin < 0:
        return {}
    safe_xml.refuse_declarations(path, columns.encode("utf-8"), 2)
    finish = columns.rfind("</metadata>")
    if finish < 0:
        warnings.append(f"{path}:2: the metadata block has no </metadata>; metadata not read")
        return {}
    try:
        root = safe_xml.parse_fragment(path, 2, columns[begin:finish + len("</metadata>")])
    except InputError as exc:
        warnings.append(f"{exc}; metadata not read")
        return {}
    return safe_xml.attributes(root)


def _routines(path: Path, lines: list[str], start: int, n: int, numbers: int,
              warnings: list[str]) -> tuple[pl.DataFrame, int]:
    """The routine rows and the index of the line after them."""
    block = lines[start:start + n]
    parsed = _extract(block, _row_pattern(numbers), start)
    if parsed.height and parsed[f"f{numbers + 1}"].fill_null("0").ne("0").any():
        return _routines_with_calls(path, lines, start, n, numbers, warnings)
    if parsed.height and parsed["f1"].null_count():
        bad = parsed.filter(pl.col("f1").is_null()).row(0, named=True)
        _row_error(path, bad["line"], bad["text"], n, start)
    if len(block) < n:
        warnings.append(f"{path}: the file ends after {len(block)} of the {n} routine rows line 1 announces "
                        "(the run was probably cut short); the complete rows were kept")
    return _routine_frame(path, parsed, numbers, warnings), start + len(block)


def _routines_with_calls(path: Path, lines: list[str], start: int, n: int, numbers: int,
                         warnings: list[str]) -> tuple[pl.DataFrame, int]:
    """Rows of a PROFILE_CALLS build: each row is followed by ProfileCalls lines of per-call data, skipped."""
    pattern = re.compile(_row_pattern(numbers))
    kept: list[tuple[int, str]] = []
    i = start
    while len(kept) < n and i < len(lines):
        if not pattern.match(lines[i]):
            _row_error(path, i + 1, lines[i], n, start)
        kept.append((i + 1, lines[i]))
        per_call = pattern.match(lines[i]).group(numbers + 1)
        i += 1 + (int(per_call) if per_call.isdigit() else 0)
    if len(kept) < n:
        warnings.append(f"{path}: the file ends after {len(kept)} of the {n} routine rows line 1 announces "
                        "(the run was probably cut short); the complete rows were kept")
    parsed = _extract([t for _, t in kept], _row_pattern(numbers), 0)
    parsed = parsed.with_columns(line=pl.Series([ln for ln, _ in kept], dtype=pl.Int64))
    return _routine_frame(path, parsed, numbers, warnings), min(i, len(lines))


def _routine_frame(path: Path, parsed: pl.DataFrame, numbers: int, warnings: list[str]) -> pl.DataFrame:
    if parsed.height == 0:
        return pl.DataFrame(schema={"line": pl.Int64, "seq": pl.Int64, "raw": pl.String, "calls": pl.Int64,
                                    "subcalls": pl.Int64, "excl": pl.String, "incl": pl.String,
                                    "group": pl.String})
    _check_numbers(path, parsed, {"f2": "Calls", "f3": "Subrs", "f4": "Excl", "f5": "Incl"}, "routine row")
    return pl.DataFrame({
        "line": parsed["line"],
        "seq": pl.int_range(0, parsed.height, eager=True).cast(pl.Int64),
        "raw": parsed["f1"],
        "calls": whole_numbers(path, parsed["f2"], parsed["line"], "Calls", warnings),
        "subcalls": whole_numbers(path, parsed["f3"], parsed["line"], "Subrs", warnings),
        "excl": parsed["f4"],
        "incl": parsed["f5"],
        "group": parsed[f"f{numbers + 2}"],
    })


def whole_numbers(path: Path, text: pl.Series, line: pl.Series, what: str, warnings: list[str]) -> pl.Series:
    """Counts (Calls, Subrs, numevents) as Int64; InputError naming the line if one is not a number.

    Fractions (mean profiles hold averages) are rounded half to even, with a warning.
    """
    values = scaled_int(text, 0)
    bad = values.is_null() & text.is_not_null()
    if bad.any():
        i = int(bad.arg_max())
        raise bad_input(path, int(line[i]), f"expected a whole number for {what}, found {text[i]!r}")
    thousandths = scaled_int(text, 3)
    fractional = (thousandths % 1000 != 0).fill_null(False)
    if fractional.any():
        i = int(fractional.arg_max())
        warnings.append(f"{path}:{int(line[i])}: {int(fractional.sum())} fractional {what} values (e.g. "
                        f"{text[i]!r}) were rounded to whole numbers")
    return values


def _after_routines(path: Path, lines: list[str], i: int, n: int, warnings: list[str]) -> pl.DataFrame:
    empty = pl.DataFrame(schema={c: pl.String for c in ("name", "numevents", "max", "min", "mean", "sumsqr")})
    empty = empty.with_columns(line=pl.lit(None, pl.Int64))
    if i >= len(lines):
        if not any("routine rows line 1 announces" in w for w in warnings):
            warnings.append(f"{path}: the file ends after the routine rows, before '<n> aggregates'; "
                            "the run was probably cut short")
        return empty
    line = lines[i]
    if line.startswith('"'):
        raise bad_input(path, i + 1, f"line 1 announces {n} routine rows but there are more: "
                                     f"expected '<n> aggregates' after row {n}")
    m = AGGREGATES.match(line)
    if not m:
        raise bad_input(path, i + 1, f"expected '<n> aggregates' after the {n} routine rows, found {_snippet(line)}")
    if int(m.group(1)):
        warnings.append(f"{path}:{i + 1}: {m.group(1)} aggregates are not read (TAU has not written any since 2.x)")
        for j in range(i + 1, len(lines)):
            if USEREVENTS.match(lines[j]):
                i = j - 1
                break
        else:
            return empty
    if i + 1 >= len(lines):
        return empty
    m = USEREVENTS.match(lines[i + 1])
    if not m:
        raise bad_input(path, i + 2, "expected '<n> userevents' or the end of the file, found "
                                     f"{_snippet(lines[i + 1])}")
    n_events = int(m.group(1))
    if i + 2 >= len(lines):
        if n_events:
            warnings.append(f"{path}: the file ends before its {n_events} user events; the run was probably cut short")
        return empty
    if not lines[i + 2].startswith(USEREVENT_COLUMNS):
        raise bad_input(path, i + 3, f"expected '# eventname numevents max min mean sumsqr', found "
                                     f"{_snippet(lines[i + 2])}")
    start = i + 3
    block = lines[start:start + n_events]
    parsed = _extract(block, USEREVENT_ROW, start)
    if parsed.height and parsed["f1"].null_count():
        bad = parsed.filter(pl.col("f1").is_null()).row(0, named=True)
        if bad["text"].count('"') == 1:
            raise bad_input(path, bad["line"], "the user event name opens a quote that is never closed")
        raise bad_input(path, bad["line"], f"line {i + 2} announces {n_events} user events; expected a user event "
                                           f"row {USEREVENT_EXPECTED}, found {_snippet(bad['text'])}")
    if len(block) < n_events:
        warnings.append(f"{path}: the file ends after {len(block)} of its {n_events} user events; "
                        "the complete rows were kept")
    end = start + len(block)
    if end < len(lines) and lines[end].strip():
        if lines[end].startswith('"'):
            raise bad_input(path, end + 1, f"line {i + 2} announces {n_events} user events but there are more")
        raise bad_input(path, end + 1, f"expected the end of the file after the user events, found "
                                       f"{_snippet(lines[end])}")
    if parsed.height == 0:
        return empty
    _check_numbers(path, parsed, {f"f{k}": c for k, c in zip(range(2, 7), ("numevents", "max", "min", "mean",
                                                                            "sumsqr"))}, "user event row")
    return pl.DataFrame({"name": parsed["f1"], "numevents": parsed["f2"], "max": parsed["f3"], "min": parsed["f4"],
                         "mean": parsed["f5"], "sumsqr": parsed["f6"], "line": parsed["line"]})


def _extract(block: list[str], pattern: str, first_index: int) -> pl.DataFrame:
    """The fields of each row as columns f1 (name), f2..fk (numbers), f(k+1) (group, if the pattern has one),
    plus ``line`` (1-based) and ``text``; a row that does not parse has f1 null.

    Rows are split on the name's closing quote and single spaces, as TAU writes them; only the rows that
    do not split cleanly (a quote inside a name, odd spacing) go through the slower regular expression.
    """
    df = pl.DataFrame({"text": pl.Series(block, dtype=pl.String)})
    df = df.with_columns(line=pl.int_range(first_index + 1, first_index + 1 + df.height, dtype=pl.Int64))
    numbers = pattern.count(r"(\S+)")
    with_group = "GROUP" in pattern
    fast = _split(df, numbers, with_group)
    if fast["ok"].all():
        return fast.drop("ok")
    slow = fast.filter(~pl.col("ok")).select("text", "line")
    groups = slow.select(pl.col("text").str.extract_groups(pattern).alias("g")).unnest("g")
    groups.columns = [f"f{k}" for k in range(1, groups.width + 1)]
    slow = pl.concat([slow, groups], how="horizontal")
    return pl.concat([fast.filter(pl.col("ok")).drop("ok"), slow], how="vertical_relaxed").sort("line")


def _split(df: pl.DataFrame, numbers: int, with_group: bool) -> pl.DataFrame:
    text = pl.col("text")
    end = text.str.slice(1).str.find('" ', literal=True)
    df = df.with_columns(_end=end).with_columns(
        f1=pl.when(text.str.starts_with('"') & pl.col("_end").is_not_null()).then(text.str.slice(1, pl.col("_end"))),
        _rest=text.str.slice(pl.col("_end") + 3),
    )
    if with_group:
        df = df.with_columns(_parts=pl.col("_rest").str.splitn(' GROUP="', 2)).with_columns(
            _nums=pl.col("_parts").struct.field("field_0"),
            _group=pl.col("_parts").struct.field("field_1").str.strip_chars_end(),
        ).with_columns(_bad_group=pl.col("_group").is_not_null() & ~pl.col("_group").str.ends_with('"'))
    else:
        df = df.with_columns(_nums=pl.col("_rest"), _bad_group=pl.lit(False))
    df = df.with_columns(_list=pl.col("_nums").str.strip_chars(" ").str.split(" "))
    fields = [pl.col("_list").list.get(i, null_on_oob=True).alias(f"f{i + 2}") for i in range(numbers)]
    if with_group:
        fields.append(pl.col("_group").str.strip_suffix('"').alias(f"f{numbers + 2}"))
    ok = (pl.col("f1").is_not_null() & (pl.col("_list").list.len() == numbers) & ~pl.col("_bad_group")
          & pl.col("_list").list.eval(pl.element().str.len_chars() > 0).list.all()
          & ~pl.col("_nums").str.contains('"', literal=True))
    return df.with_columns(*fields, ok=ok).select("text", "line", "f1", *[f"f{k}" for k in range(
        2, numbers + 2 + (1 if with_group else 0))], "ok")


def _row_error(path: Path, line: int, text: str, n: int, start: int) -> None:
    if AGGREGATES.match(text):
        found = line - 1 - start
        raise bad_input(path, line, f"line 1 announces {n} routine rows but only {found} come before "
                                    "'<n> aggregates'")
    if text.startswith('"') and _GROUP_TAIL.sub("", text).count('"') == 1:
        raise bad_input(path, line, "the routine name opens a quote that is never closed")
    raise bad_input(path, line, f"expected a routine row {ROW_EXPECTED} (line 1 announces {n}), "
                                f"found {_snippet(text)}")


def _check_numbers(path: Path, parsed: pl.DataFrame, columns: dict[str, str], what: str) -> None:
    for col, label in columns.items():
        bad = ~is_number(pl.col(col))
        rows = parsed.filter(bad)
        if rows.height:
            row = rows.row(0, named=True)
            raise bad_input(path, row["line"], f"expected a number for {label} in this {what}, found {row[col]!r}")


def _snippet(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")
