"""Shared test helpers: paths, running the CLI in-process, reading a trace, the independent unit oracle.

Test modules import from here (``from helpers import ...``; pyproject puts
tests/ on pytest's ``pythonpath``), never from conftest.py, which holds only
fixtures.
"""

from __future__ import annotations

import contextlib
import io
import json
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the traceparse CLI in-process; return (exit code, stdout, stderr)."""
    from traceparse.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def refused(args: list[str], expected: str, store: Path) -> None:
    """The CLI run with ``args`` fails with status 2, the one stderr line ``traceparse: error: EXPECTED``
    (no traceback), and leaves nothing in the store directory ``store``."""
    from traceparse.store import Store

    code, out, err = run_cli(*args)
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err == f"traceparse: error: {expected}\n"
    traces = store / "traces"
    assert not traces.exists() or not any(traces.iterdir())
    assert Store(store).ids() == []


def exact_int(number, factor: int = 1, rounding: str = ROUND_HALF_EVEN) -> int:
    """The independent unit oracle: decimal ``number`` × integer ``factor``, rounded once to an integer.

    ``number`` is decimal text, a :class:`~decimal.Decimal` (JSON parsed with
    ``parse_float=Decimal``) or an int; a float is taken by its shortest text
    (``str``), never its binary value. Invalid text raises
    :class:`decimal.InvalidOperation`. ``rounding`` is a :mod:`decimal`
    rounding mode: half to even, the one rule of :mod:`traceparse.units`.
    """
    value = Decimal(str(number)) if isinstance(number, float) else Decimal(number)
    return int((value * factor).to_integral_value(rounding=rounding))


def us_to_ns(value, rounding: str = ROUND_HALF_EVEN) -> int:
    """A microsecond value (Chrome-trace ``ts``/``dur``, TAU's usec) as exact integer ns (see :func:`exact_int`)."""
    return exact_int(value, 1000, rounding)


def read_torch(path: Path):
    """A torch trace read directly (no store), all batches collected."""
    from traceparse import plugins
    from traceparse.reader import ReadOptions

    trace = plugins.registry().reader("torch").read([path], ReadOptions())
    trace.events  # read all batches (fills the metadata too)
    return trace


def run_rule(trace, rule: str, *settings: str):
    """The one finding ``rule`` gives on ``trace`` with ``--set`` style settings."""
    from traceparse.analysis import analyze, parse_settings

    findings = analyze(trace, rules=[rule], settings=parse_settings(list(settings)))
    assert len(findings) == 1
    return findings[0]


def json_numbers(doc, path: str = ""):
    """Every (path, number) in a JSON document (``.key`` and ``[index]`` steps; booleans are not numbers)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from json_numbers(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from json_numbers(v, f"{path}[{i}]")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield path, doc


# -- handwritten events (edge cases written by hand, in the schema's units) --------------------------------------
def table(*rows: dict, trace_id: str = "t"):
    """Handwritten event rows as a conformed event table of one trace."""
    import polars as pl
    from traceparse.schema import conform

    return conform(pl.DataFrame(list(rows), infer_schema_length=None), trace_id=trace_id)


def host(kind, name, start, end, tid=1, **more) -> dict:
    """A handwritten host event (op, marker, api, ...) on process 10, thread ``tid``, from ``start`` to ``end`` ns."""
    return {"kind": kind, "name": name, "start_ns": start, "duration_ns": end - start, "pid": 10, "tid": tid, **more}


def gpu(name, start, end, stream=7, kind="kernel", **more) -> dict:
    """A handwritten GPU activity on device 0, ``stream``, from ``start`` to ``end`` ns."""
    return {"kind": kind, "name": name, "start_ns": start, "duration_ns": end - start, "device_id": 0,
            "stream_id": stream, **more}


# -- an independent protobuf wire decoder (for XSpace files; no generated code, no traceparse code) --------------
def wire_varint(b: bytes, i: int) -> tuple[int, int]:
    """The varint at ``b[i:]`` and the offset after it."""
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def wire_fields(b: bytes):
    """(field number, value) of each field of a message: an int for varints, bytes for the others."""
    i = 0
    while i < len(b):
        key, i = wire_varint(b, i)
        f, t = key >> 3, key & 7
        if t == 0:
            v, i = wire_varint(b, i)
        elif t == 1:
            v, i = b[i:i + 8], i + 8
        elif t == 5:
            v, i = b[i:i + 4], i + 4
        else:
            n, i = wire_varint(b, i)
            v, i = b[i:i + n], i + n
        yield f, v


# -- oracles over a raw torch.profiler JSON (gzip + json, plain Python: no traceparse code) ----------------------
def raw_events(path: Path) -> list[dict]:
    """The complete events (``ph`` X) of a gzipped Chrome/Kineto JSON trace."""
    import gzip
    import json

    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def raw_steps(path: Path) -> dict[int, tuple[int, int]]:
    """{N: (start, end)} of the host-side ProfilerStep#N annotations, in ns."""
    return {int(e["name"].split("#")[1]): (us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
            for e in raw_events(path) if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}


def self_time(events: list[dict], target: dict) -> int:
    """``target``'s duration minus its direct children's on its thread (ns), from the raw events."""
    s, e = us_to_ns(target["ts"]), us_to_ns(target["ts"]) + us_to_ns(target["dur"])
    inside = sorted((us_to_ns(x["ts"]), us_to_ns(x["ts"]) + us_to_ns(x["dur"])) for x in events
                    if x is not target and x.get("tid") == target["tid"]
                    and x.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")
                    and s <= us_to_ns(x["ts"]) and us_to_ns(x["ts"]) + us_to_ns(x["dur"]) <= e)
    covered, end = 0, s
    for a, b in inside:  # the union of everything inside is the children's time
        if b > end:
            covered += b - max(a, end)
            end = b
    return (e - s) - covered


def union(intervals) -> list[tuple[int, int]]:
    """The raw-JSON oracle's union of ``(start, end)`` intervals: overlapping or touching ones merged, sorted."""
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersect(s: int, e: int, merged) -> int:
    """Length of ``[s, e)`` inside the merged intervals ``merged`` (:func:`union`)."""
    return sum(max(0, min(e, b) - max(s, a)) for a, b in merged)


def waited_first(waits, windows, busy=()) -> dict:
    """The raw-JSON oracle of a rank's time waited put down to who it waited for: ``waits`` are ``(arrival, until,
    whom)``; each moment goes to the wait that began first (by arrival, then end), and counts inside the merged
    step ``windows`` where the merged ``busy`` intervals (compute kernels, on the device) are not: {whom: ns}."""
    out: dict = {}
    reached = None
    for arrival, until, whom in sorted(waits, key=lambda w: (w[0], w[1])):
        if until <= arrival:
            continue
        start = arrival if reached is None else max(arrival, reached)
        reached = until if reached is None else max(reached, until)
        if until <= start:
            continue
        inside = [(max(start, a), min(until, b)) for a, b in windows if min(until, b) > max(start, a)]
        out[whom] = out.get(whom, 0) + sum(e - s - intersect(s, e, busy) for s, e in inside)
    return out


def whatif_json(store: str, folder: Path, *edits: str) -> dict:
    """``traceparse whatif FOLDER --json EDITS`` (the run ingested into ``store`` on the way): its document."""
    code, out, err = run_cli("--store", store, "whatif", str(folder), "--json", *edits)
    assert code == 0, err
    return json.loads(out)


def run_of(folder: Path):
    """The ranks of ``folder`` (``rank*.json.gz``) as one run's combined trace: each rank's events with its
    ``rank`` and its own ``trace_id``, read without the store."""
    import polars as pl

    from traceparse.trace import Trace, TraceMeta

    frames = []
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        frames.append(read_torch(path).events.with_columns(rank=pl.lit(rank, dtype=pl.Int32),
                                                           trace_id=pl.lit(f"rank{rank}")))
    return Trace(pl.concat(frames), TraceMeta(format="run"))


def matched_waits(trace) -> dict:
    """traceparse's collective instances of ``trace``, as an oracle of raw arrivals is written:
    ``{frozenset of (rank, arrival): {rank: wait}}``."""
    from traceparse import measures

    waits = measures.collective_waits(trace.events)
    got = {}
    for _, rows in waits.group_by("process_group", "instance"):
        got[frozenset(zip(rows["member"].to_list(), rows["arrival_ns"].to_list()))] = dict(
            zip(rows["member"].to_list(), rows["wait_ns"].to_list()))
    return got


def as_shown(value: int) -> int:
    """An integer to 4 significant figures, halves away from zero: :func:`traceparse.expr.as_shown` (polars'
    ``round_sig_figs``) worked out with decimals, for oracles that order rows as they read."""
    from decimal import ROUND_HALF_UP, Decimal

    if value == 0:
        return 0
    exponent = len(str(abs(int(value)))) - 4
    if exponent <= 0:
        return int(value)
    return int(Decimal(int(value)).scaleb(-exponent).quantize(Decimal(1), rounding=ROUND_HALF_UP).scaleb(exponent))


def cut_file(path: Path, out: Path, keep: float) -> Path:
    """``path`` (a gzipped JSON trace) written to ``out`` with its JSON cut at ``keep`` of its bytes, gzipped whole
    again: a trace whose profiler was killed mid-write."""
    import gzip

    data = gzip.decompress(path.read_bytes())
    out.write_bytes(gzip.compress(data[: int(len(data) * keep)], compresslevel=1))
    return out


def cut_run(source: Path, out: Path, rank: int | None, keep: float) -> Path:
    """``source``'s rank files (``rank<N>.json.gz``) copied into ``out``, rank ``rank``'s (None: every rank's) cut
    by :func:`cut_file`: a run whose profiler was killed mid-write on that rank."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("rank*.json.gz")):
        if rank is None or int(path.name[4:].split(".")[0]) == rank:
            cut_file(path, out / path.name, keep)
        else:
            (out / path.name).write_bytes(path.read_bytes())
    return out


def hamilton(shares: list[float]) -> list[float]:
    """Shares of one whole (adding up to 100) to 0.1 by the largest-remainder method, independently of
    traceparse.figures: each rounded down, then the largest remainders up until they add up to 100. For shares
    of 0.05 or more (a smaller one reads "<0.1%", a case this oracle does not take)."""
    assert all(s >= 0.05 for s in shares) and abs(sum(shares) - 100) < 1e-3
    tenths = [int(s * 10) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: -(shares[i] * 10 - tenths[i]))[:1000 - sum(tenths)]:
        tenths[i] += 1
    return [t / 10 for t in tenths]
