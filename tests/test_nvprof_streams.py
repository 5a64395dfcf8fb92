"""Events on one stream never overlap (issue 21, item 5): nvprof prints Start with few digits (``48.215s``), so
read back a copy can seem to run into the next kernel on its stream. The reader moves such events later, just
enough, and says so once; overlap figures on a single stream are then 0. Expected starts are computed here from
the log's own text by a plain loop."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from traceparse.figures import fmt_ns

from helpers import FIXTURES, exact_int, run_cli
from traceparse.ingest import read_paths

NVPROF = FIXTURES / "nvprof"
ROUNDED = NVPROF / "handwritten" / "gpu_trace_start_rounded.log"
TIME = {"ns": 1, "us": 10 ** 3, "ms": 10 ** 6, "s": 10 ** 9}
LOGS = sorted(p for p in NVPROF.glob("*/*") if p.suffix in (".log", ".csv"))


def time_ns(cell: str) -> int:
    m = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", cell)
    return exact_int(m.group(1), TIME[m.group(2)])


def raw_rows(path: Path) -> list[dict]:
    """GPU trace rows of a text log: start, duration, stream, whether a copy, from whitespace tokens."""
    rows, in_trace = [], False
    for line in path.read_text().splitlines():
        tokens = line.split()
        if tokens[:2] == ["Start", "Duration"]:
            in_trace = True
        elif in_trace and tokens and re.fullmatch(r"[\d.]+(ns|us|ms|s)", tokens[0]):
            name = line.split("  ")[-1].strip()
            stream = int(line[:line.rindex(name)].split()[-1])
            rows.append({"start": time_ns(tokens[0]), "dur": time_ns(tokens[1]), "stream": stream,
                         "copy": name.startswith("[CUDA memcpy")})
        else:
            in_trace = in_trace and bool(tokens)
    return rows


def serialized(rows: list[dict]) -> list[int]:
    """Each row's start once every stream runs one event after another (rows in file order)."""
    out, end_of = [0] * len(rows), {}
    for i in sorted(range(len(rows)), key=lambda i: (rows[i]["stream"], rows[i]["start"], i)):
        start = max(rows[i]["start"], end_of.get(rows[i]["stream"], rows[i]["start"]))
        out[i] = start
        end_of[rows[i]["stream"]] = start + rows[i]["dur"]
    return out


def overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Time of ``a`` intervals covered by ``b`` intervals (pairwise; the intervals of each side are disjoint)."""
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_printed_starts_overlap_on_one_stream_and_are_moved(store):
    rows = raw_rows(ROUNDED)
    assert [r["stream"] for r in rows] == [7, 7, 7, 7]
    spans = [(r["start"], r["start"] + r["dur"]) for r in rows]
    as_printed = overlap([s for s, r in zip(spans, rows) if r["copy"]], [s for s, r in zip(spans, rows) if not r["copy"]])
    assert as_printed > 0  # read literally, a copy runs into the kernel: what this fixture is about
    starts = serialized(rows)
    moved = [(new - r["start"]) for new, r in zip(starts, rows) if new != r["start"]]
    trace = read_paths([ROUNDED])[0]
    events = trace.events.sort("event_id")
    assert events["start_ns"].to_list() == starts
    assert events["duration_ns"].to_list() == [r["dur"] for r in rows]
    assert trace.meta.warnings == [
        f"{ROUNDED}: {len(moved)} GPU events started, as printed, before the previous one on their stream ended "
        f"(nvprof prints Start with few digits); moved later by at most {fmt_ns(max(moved))} so that no two "
        "events of one stream overlap"]

    code, out, err = run_cli("analyze", str(ROUNDED), "--rule", "low-memcpy-overlap", "--json")
    assert code in (0, 1), err
    [finding] = json.loads(out)["findings"]
    copies = sum(r["dur"] for r in rows if r["copy"])
    assert finding["metrics"]["memcpy_time_ns"] == copies
    assert (finding["metrics"]["overlapped_ns"], finding["metrics"]["overlap_pct"]) == (0, 0.0)
    assert err.count("moved later by at most") == 1


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_no_two_events_of_one_stream_overlap(path):
    """Every nvprof text/CSV fixture: on each (process, device, context, stream), each event ends before the next."""
    events = read_paths([path])[0].events
    gpu = events.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"])
                        & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()
                        & pl.col("stream_id").is_not_null())
    for _, part in gpu.group_by(["pid", "device_id", "context_id", "stream_id"]):
        part = part.sort("start_ns", "event_id")
        ends = (part["start_ns"] + part["duration_ns"]).to_list()
        assert all(s >= e for s, e in zip(part["start_ns"].to_list()[1:], ends[:-1])), path


def test_serialize_streams_moves_only_what_overlaps():
    from traceparse_plugins.readers.nvprof.streams import serialize_streams

    frame = pl.DataFrame({
        "kind": ["memcpy", "kernel", "kernel", "memcpy", "api", "kernel"],
        "start_ns": [0, 90, 100, 95, 0, 150],
        "duration_ns": [100, 10, 50, 10, 500, 5],
        "pid": [1] * 6, "device_id": [0] * 6, "context_id": [1] * 6,
        "stream_id": [7, 7, 7, 13, None, 7],
    })
    out, moved, most = serialize_streams(frame)
    # stream 7: [0,100) then 90 -> 100 (ends 110), 100 -> 110 (ends 160), 150 -> 160; stream 13 and the API row stay
    assert out["start_ns"].to_list() == [0, 100, 110, 95, 0, 160]
    assert (moved, most) == (3, 10)
    touching = frame.with_columns(start_ns=pl.Series([0, 100, 110, 95, 0, 160]))
    assert serialize_streams(touching)[1:] == (0, 0)
