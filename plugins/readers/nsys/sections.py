"""Finding the report tables in an ``nsys stats`` output file: CSV, TSV, or the default column text.

``nsys stats --format csv --output PREFIX`` writes one clean CSV per report;
``nsys stats ... > file`` (console output) puts messages before each table
(``Processing [x.sqlite] with [.../cuda_gpu_trace.py]...``, ``NOTICE:``,
``** CUDA GPU Trace (cuda_gpu_trace):``) and may hold several reports, each
ended by a blank line. Every table whose header names nsys columns becomes a
:class:`Section`; the messages around the tables are skipped.

The default console format (``column``) is a header line, a line of dash
groups under it, and rows aligned to the dash groups, numbers with ``,``
thousands separators. Other layouts (``--format table`` boxes) are refused
with a message saying to use ``--format csv``.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

from traceparse.errors import bad_input
from traceparse.sources import open_binary, quoted_records

from traceparse_plugins.readers.nsys.reports import NSYS_ONLY, field_of, parse_file_name
from traceparse_plugins.readers.nsys.units import split_header

#: Lines nsys prints around its tables (console output), never data.
_MESSAGE = re.compile(
    r"^\s*(NOTICE:|WARNING:|SKIPPED:|ERROR:|Processing \[|Generating |Exporting |\*\*|\[\d+/\d+\]|"
    r"It is assumed|Consider using|File is older|Use --force-export|usage: nsys|Try 'nsys)"
)
_DASHES = re.compile(r"^\s*-{2,}(\s+-{2,})+\s*$")
_BOX = re.compile(r"^\s*[+┌├└│╭╰]")


@dataclass
class Section:
    """One report table of a file: its header cells and its rows, with their line numbers.

    A CSV/TSV table keeps its rows as text (``body``) that polars parses
    column by column; a console table keeps the cells it cut (``rows``).
    Row ``i`` is line ``first_line + i`` of the file, unless a quoted field
    holds a line break (``row_lines``).
    """

    path: Path
    header: list[str]
    header_line: int
    layout: str                       # "csv", "tsv" or "column"
    first_line: int
    n_rows: int
    body: str | None = None
    rows: list[list[str]] | None = None
    #: The report nsys's console names before the table (``[4/8] Executing 'osrt_sum' stats report``), canonical.
    announced: str | None = None
    #: Where a quoted field holds a line break (an NVTX range named over two lines): each row's first line, as an
    #: offset from ``first_line``; None where every row is one line.
    row_lines: list[int] | None = None
    _bytes: bytes | None = field(default=None, repr=False)

    def line_of(self, index: int) -> int:
        """The file line of row ``index``."""
        if self.row_lines is not None and 0 <= index < len(self.row_lines):
            return self.first_line + self.row_lines[index]
        return self.first_line + index

    def body_bytes(self) -> bytes:
        """The rows' text as UTF-8 (encoded once)."""
        if self._bytes is None:
            self._bytes = self.body.encode()
        return self._bytes

    def lines(self) -> pl.Series:
        """The rows as lines of text (a polars series, for vectorized checks)."""
        if "\x1f" in self.body:  # the separator below is in the text (a hostile file): split in Python
            text = self.body[:-1] if self.body.endswith("\n") else self.body
            return pl.Series("line", [line or None for line in text.split("\n")], dtype=pl.String)
        frame = pl.read_csv(io.BytesIO(self.body_bytes()), has_header=False, separator="\x1f", quote_char=None,
                            new_columns=["line"], infer_schema=False)
        return frame["line"]

    def columns(self) -> list[pl.Series]:
        """The cells as text, one String series per header column (blank cells are null)."""
        names = [f"c{i}" for i in range(len(self.header))]
        if self.rows is not None:
            return [pl.Series(n, [r[i] or None for r in self.rows], dtype=pl.String) for i, n in enumerate(names)]
        frame = pl.read_csv(io.BytesIO(self.body_bytes()), has_header=False, new_columns=names,
                            separator="\t" if self.layout == "tsv" else ",", quote_char='"', infer_schema=False)
        return [frame[n] for n in names]


class EmptyReport(Exception):
    """The file holds no table: 0 bytes, or only nsys's note that there was no data."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def read_text(path: Path) -> str:
    """The file's text (gzip decompressed); :class:`EmptyReport` when it is empty; an error for binary files."""
    try:
        with open_binary(path, text=True) as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise bad_input(path, None, f"cannot be read: {exc}") from None
    if not data or data.isspace():
        raise EmptyReport(path, "the report file is empty (nsys writes an empty file when it had no data for it)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise bad_input(path, line, "not UTF-8 text: this is not an nsys stats report") from None
    if "\r" in text:  # CR-only line endings (old Mac tools, some editors) read as line breaks too
        text = re.sub(r"\r(?!\n)", "\n", text)
    return text


def header_cells(line: str) -> tuple[list[str], str] | None:
    """The cells of ``line`` and its delimiter name if it is an nsys CSV/TSV header, else None."""
    for delimiter, layout in (("\t", "tsv"), (",", "csv")):
        if delimiter not in line:
            continue
        try:
            cells = next(csv.reader([line], delimiter=delimiter))
        except csv.Error:  # a stray line break inside the line: not a header
            continue
        if _looks_like_header(cells):
            return cells, layout
    return None


def _looks_like_header(cells: list[str]) -> bool:
    fields = [field_of(split_header(c)[0]) for c in cells]
    known = [f for f in fields if f is not None]
    return len(known) >= 3 and len(known) * 2 >= len(cells) and bool(NSYS_ONLY & set(known))


def find_sections(path: Path, text: str, incomplete: Callable[[str], None] | None = None) -> list[Section]:
    """Every report table in ``text``; raises :class:`EmptyReport` or a one-line error when there is none.

    nsys ends every line with a newline, so a file that does not may be
    cut short (a copy interrupted, a disk full, a profiler killed). Its
    last row is left out when it may be cut: it ends in a digit (a number
    cut short), inside a quoted field, or with fewer fields than the
    header. ``incomplete`` is told so (the reader's
    :meth:`~traceparse.reader.ReadOptions.incomplete`: a warning, and every
    analysis says the figures cover what was read); without it that is an
    error naming the line, never a silently wrong figure. A last line that
    ends otherwise (a name, a closing bracket: a console table saved from a
    terminal or an editor that dropped the last newline) is read as written.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    ended = text.endswith("\n")
    cut = not ended and bool(re.search(r"[0-9.,]\s*$", text[text.rfind("\n") + 1:]))
    if not ended:
        last = text.count("\n") + 1
        text += "\n"  # parse what is there; the error below names a line that may be cut
    sections = _delimited_sections(path, text)
    lines = text.split("\n")[:-1] if not sections else []
    if not sections:
        sections = _column_sections(path, lines)
    if sections:
        open_end = not ended
        for index, section in enumerate(sections):
            if section.body is not None:
                _check_fields(section, "\t" if section.layout == "tsv" else ",",
                              open_end and index == len(sections) - 1, incomplete)
            elif cut and index == len(sections) - 1:
                _cut_last_row(section, last, "it ends in a number with no newline after it", incomplete)
        return sections
    messages = [line.strip() for line in lines if line.strip()]
    skipped = [m for m in messages if m.startswith("SKIPPED:")]
    if skipped:
        raise EmptyReport(path, f"nsys had no data for this report ({skipped[0]})")
    if any(_BOX.match(line) for line in lines):
        raise bad_input(path, None, "an nsys stats table in a layout traceparse does not read; "
                                    "write the report with `nsys stats --format csv`")
    if messages and all(_MESSAGE.match(m) or m.startswith(("usage:", "<input-file>")) for m in messages[:3]):
        raise bad_input(path, 1, f"no report table in this file, only nsys messages ({messages[0][:80]!r}); "
                                 "write the report with `nsys stats --report NAME --format csv`")
    raise bad_input(path, 1, "no nsys stats report header found (expected e.g. 'Start (ns),Duration (ns),"
                             "CorrId,...' or 'Time (%),Total Time (ns),...'); "
                             "write the report with `nsys stats --format csv`")


def _delimited_sections(path: Path, text: str) -> list[Section]:
    """CSV/TSV tables: a header line, then rows up to a blank line or the end of the file.

    The rows are sliced out of the text and checked in polars (field
    counts, quotes), not split line by line in Python, so a trace report
    of millions of rows reads in seconds.
    """
    sections: list[Section] = []
    pos, line_no, announced = 0, 1, None
    while pos < len(text):
        stop = text.find("\n", pos)
        stop = len(text) if stop < 0 else stop
        line = text[pos:stop]
        found = header_cells(line) if line.strip() else None
        if found is None:
            announced = _announcement(line) or announced
            pos, line_no = stop + 1, line_no + 1
            continue
        cells, layout = found
        start = stop + 1
        end = text.find("\n\n", start)
        end = len(text) if end < 0 else end + 1
        body = text[start:end].rstrip("\n")
        n_rows = body.count("\n") + 1 if body else 0
        sections.append(Section(path, cells, line_no, layout, line_no + 1, n_rows, body=body, announced=announced))
        announced = None
        line_no += 1 + n_rows
        pos = end
    return sections


_QUOTED = r'"[^"]*"'  # a quoted field; a doubled quote inside splits it in two, both removed


def _check_fields(section: Section, separator: str, open_end: bool = False,
                  incomplete: Callable[[str], None] | None = None) -> None:
    """One-line error at the first row whose field count differs from the header's, or whose quotes do not close.

    A quoted field may hold a line break (RFC 4180; an NVTX range or a kernel name written over two lines):
    the rows are then the lines joined where a quote is open, and ``row_lines`` says where each starts. Where
    the file ends without a newline (``open_end``), a last row that is cut (a quote open to the end, too few
    fields, a number at the very end) is left out and ``incomplete`` told (:func:`find_sections`)."""
    if not section.body:
        return
    lines = section.lines()
    quotes = lines.fill_null("").str.count_matches('"', literal=True)
    if (quotes % 2 == 1).any():
        rows, starts = quoted_records(lines.fill_null("").to_list())
        lines = pl.Series("line", rows, dtype=pl.String)
        section.row_lines = starts
    quoted = lines.str.contains('"', literal=True)
    unquoted = pl.select(pl.when(quoted).then(lines.str.replace_all(_QUOTED, "")).otherwise(lines)).to_series()
    last = lines.len() - 1
    open_quote = unquoted.str.contains('"', literal=True)
    if open_quote.any():
        index = int(open_quote.arg_max())
        if open_end and index == last:
            return _cut_last_row(section, section.line_of(index), "a quoted field does not close", incomplete)
        raise bad_input(section.path, section.line_of(index), "a quote that does not close: not valid "
                                                              f"{section.layout.upper()}")
    fields = unquoted.str.count_matches(separator, literal=True) + 1
    wrong = fields != len(section.header)
    if wrong.any():
        index = int(wrong.arg_max())
        if open_end and index == last and fields[index] < len(section.header):
            return _cut_last_row(section, section.line_of(index), f"{fields[index]} of the header's "
                                 f"{len(section.header)} fields", incomplete)
        raise bad_input(section.path, section.line_of(index), f"{fields[index]} fields where the header "
                                                              f"(line {section.header_line}) has {len(section.header)}")
    if open_end and re.search(r"[0-9.,]\s*$", lines[last] or ""):
        _cut_last_row(section, section.line_of(last), "it ends in a number with no newline after it", incomplete)


def _cut_last_row(section: Section, line: int, why: str, incomplete: Callable[[str], None] | None) -> None:
    """Leave out a section's last row, cut short with the file; an error naming the line without ``incomplete``."""
    if incomplete is None:
        raise bad_input(section.path, line, f"the file ends in the middle of this line (cut short?): {why}, and "
                                            "nsys ends every report line with a newline")
    kept = (len(section.row_lines) if section.row_lines is not None else section.n_rows) - 1
    if section.rows is not None:
        section.rows = section.rows[:-1]
    else:
        offset = (section.row_lines[-1] if section.row_lines is not None else section.n_rows - 1)
        lines = section.body.split("\n")
        section.body = "\n".join(lines[:offset])
        section._bytes = None
        if section.row_lines is not None:
            section.row_lines = section.row_lines[:-1]
    section.n_rows = kept if section.rows is None else len(section.rows)
    incomplete(f"{section.path}:{line}: cut short ({why}); kept the {kept:,} complete row{'s' if kept != 1 else ''} "
               "before it")


def _column_sections(path: Path, lines: list[str]) -> list[Section]:
    """Tables of the default console format: header, dash underline, aligned rows."""
    sections: list[Section] = []
    i = 1
    while i < len(lines):
        if not _DASHES.match(lines[i]):
            i += 1
            continue
        spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[i])]
        header = _cut(lines[i - 1], spans)
        if not _looks_like_header(header):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() and not _MESSAGE.match(lines[end]):
            end += 1
        rows = [_cut(lines[j], spans) for j in range(start, end)]
        sections.append(Section(path, header, i, "column", start + 1, len(rows), rows=rows,
                                announced=_announced(lines, i - 2, sections[-1].first_line + sections[-1].n_rows
                                                     if sections else 0)))
        i = end + 1
    return sections


#: How nsys's console announces each report (``[4/8] Executing 'osrt_sum' stats report``; older versions name the
#: report the same way with its old name, ``'osrtsum'``).
_ANNOUNCE = re.compile(r"Executing '(\w+)' stats report|^\s*\*\*.*\((\w+)\):\s*$")


def _announced(lines: list[str], before: int, stop: int) -> str | None:
    """The report the nearest announcement above line ``before`` (down to line ``stop``) names, canonical
    (:func:`reports.parse_file_name`), else None: a header alone cannot tell cuda_api_sum from osrt_sum."""
    for j in range(before, max(stop, 0) - 1, -1):
        name = _announcement(lines[j])
        if name:
            return name
    return None


#: The titles nsys 2020-2021.1 printed above each ``--stats=true`` table instead of a report name
#: (``CUDA API Statistics:``), lower case, and the report each is.
_OLD_TITLES = {
    "cuda api statistics": "cuda_api_sum",
    "cuda kernel statistics": "cuda_gpu_kern_sum",
    "cuda memory operation statistics (by time)": "cuda_gpu_mem_time_sum",
    "cuda memory operation statistics (by size in kib)": "cuda_gpu_mem_size_sum",
    "cuda memory operation statistics (by size)": "cuda_gpu_mem_size_sum",
    "nvtx push-pop range statistics": "nvtx_sum",
    "operating system runtime api statistics": "osrt_sum",
}
_OLD_TITLE = re.compile(r"^\s*([A-Z][\w /.,+-]*? Statistics(?: \([^)]*\))?):\s*$")


def _announcement(line: str) -> str | None:
    """The report a console line announces (``Executing 'osrt_sum' stats report``, `` ** OS Runtime Summary
    (osrt_sum):``, nsys 2020's ``Operating System Runtime API Statistics:``), canonical; None for any other
    line. An old title traceparse does not know names a report of its own (``openmp_event_statistics``), so
    that its table is skipped rather than taken for a report with the same columns."""
    old = _OLD_TITLE.match(line)
    if old:
        title = old.group(1).lower()
        return _OLD_TITLES.get(title) or re.sub(r"\W+", "_", title).strip("_")
    m = _ANNOUNCE.search(line)
    if not m:
        return None
    written = m.group(1) or m.group(2)
    named = parse_file_name(f"x_{written}.csv")
    return named.report if named else written.lower()


def _cut(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """Cells of an aligned line: column k runs from its dash group's start to the next group's start.

    Right-aligned numbers end at their group's end and left-aligned text
    starts at its group's start, so both fall inside these bounds; the last
    column (a name, which may hold spaces) runs to the end of the line.
    """
    cells = []
    for k, (start, _end) in enumerate(spans):
        stop = spans[k + 1][0] if k + 1 < len(spans) else len(line)
        lo = spans[k - 1][1] if k else 0  # a wide right-aligned number may start left of its dashes
        cells.append(line[lo:stop].strip() if k + 1 < len(spans) else line[start:].strip())
    return cells


def sections_of(path: Path, incomplete: Callable[[str], None] | None = None) -> list[Section]:
    """Read ``path`` and return its report tables (see :func:`find_sections`)."""
    return find_sections(path, read_text(path), incomplete)
