"""Damaged compressed input and missing columns (issue 22.2), for the text readers (ncu, TAU, nsys, nvprof).

Three changed bytes in a gzip stream: one line naming the file and what zlib said, exit 2. A gzip stream cut at
two thirds: what was complete before the cut plus a warning, or one line. A CSV without a column the reader needs:
one line naming the file and the column. The expected messages are built here from zlib's own answer on the
same bytes.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli
from traceparse.ingest import read_paths

SOURCES = {
    "ncu": FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv",
    "tau": FIXTURES / "tau" / "real" / "apex-cuda" / "profile.0.0.0",
    "nsys": FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv",
    "nvprof": FIXTURES / "nvprof" / "handwritten" / "gpu_trace.log",
}


def _zlib_says(data: bytes) -> str:
    """What Python's gzip module says of ``data``, independently of traceparse."""
    try:
        gzip.GzipFile(fileobj=io.BytesIO(data)).read()
    except (zlib.error, gzip.BadGzipFile) as exc:
        return str(exc)
    raise AssertionError("the stream is not damaged")


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", SOURCES)
@pytest.mark.parametrize("where", ["middle", "start"])
def test_three_changed_bytes_are_one_line(fmt, where, store, tmp_path):
    packed = bytearray(gzip.compress(SOURCES[fmt].read_bytes(), mtime=0))
    at = len(packed) // 2 if where == "middle" else 10  # 10: the first bytes of the deflate data
    for i in (at, at + 7, at + 13):
        packed[i] ^= 0x55
    path = _write(tmp_path, SOURCES[fmt].name + ".gz", bytes(packed))
    code, out, err = run_cli("ingest", str(path))
    assert code == 2, err
    assert err == (f"traceparse: error: {path}: the gzip stream is damaged ({_zlib_says(bytes(packed))}); "
                   "the file cannot be read\n")


def _cut(fmt: str, tmp_path: Path) -> tuple[Path, str]:
    """The fixture gzip-compressed and cut at two thirds; the text that decompresses before the cut."""
    packed = gzip.compress(SOURCES[fmt].read_bytes(), mtime=0)
    cut = packed[: len(packed) * 2 // 3]
    text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut).decode()
    return _write(tmp_path, SOURCES[fmt].name + ".gz", cut), text


@pytest.mark.parametrize("fmt", SOURCES)
def test_a_cut_stream_keeps_its_complete_lines_and_warns(fmt, store, tmp_path):
    path, text = _cut(fmt, tmp_path)
    lost = len(text) - (text.rfind("\n") + 1)
    code, out, err = run_cli("ingest", str(path))
    assert "internal error" not in err and "Traceback" not in err
    if code == 2:  # a reader that needs the whole file says so in one line
        assert err.count("\n") == 1 and str(path) in err
        return
    assert code == 0, err
    expected = (f"traceparse: warning: {path}: the gzip stream ends early (the file was cut short); kept its "
                f"complete lines" + (f"; the last {lost:,} bytes, a line cut in the middle, were not read"
                                     if lost else "") + "\n")
    assert expected in err


def test_a_cut_nsys_trace_keeps_exactly_its_complete_rows(tmp_path):
    path, text = _cut("nsys", tmp_path)
    complete = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(complete)))[1:]
    trace = read_paths([path])[0]
    assert trace.events.height == len(rows)
    assert trace.events["name"].to_list() == [r[-1] for r in rows]


def test_nsys_trace_without_its_name_column(store, tmp_path):
    source = SOURCES["nsys"]
    records = list(csv.reader(source.open(newline="")))
    drop = records[0].index("Name")
    path = tmp_path / source.name
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(r[:drop] + r[drop + 1:] for r in records)
    code, out, err = run_cli("ingest", str(path))
    assert code == 2
    columns = ", ".join(c for c in records[0] if c != "Name")
    assert err == (f"traceparse: error: {path}:1: the cuda_gpu_trace report has no 'Name' column (its columns: "
                   f"{columns}); traceparse needs it\n")


def test_ncu_details_without_the_rule_name_column(store, tmp_path):
    source = SOURCES["ncu"]
    lines = source.read_text().splitlines(keepends=True)
    header_at = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    drop = next(csv.reader([lines[header_at]])).index("Rule Name")
    out_lines = []
    for i, line in enumerate(lines):
        if i >= header_at and line.startswith('"'):
            record = next(csv.reader([line]))
            record = record[:drop] + record[drop + 1:]
            buf = io.StringIO()
            csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(record)
            line = buf.getvalue()
        out_lines.append(line)
    path = tmp_path / source.name
    path.write_text("".join(out_lines))
    code, out, err = run_cli("ingest", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}: the details page has rule columns but not 'Rule Name': a column "
                   "the reader needs is missing from the header\n")
