"""Issue 16: a fuzz test of every reader, bounded to about a minute.

A deterministic corpus of mutants of the fixtures (byte flips, cuts, a huge or negative value in one cell,
duplicated lines), each ingested and analyzed as a user would; plus property-based tests (hypothesis) of the
readers' Python API. The contract: exit 0 or 2 (never 3, an internal error), one line on stderr when refused,
no negative or non-finite figure in ``analyze --json``. Peak RSS and time of the worst inputs are checked in
tests/test_bounded_work.py (a subprocess each).
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import FIXTURES, json_numbers, run_cli
from traceparse.errors import InputError
from traceparse.ingest import read_paths

SEED = 16
#: Fixtures the corpus mutates: small, and every reader and form.
SOURCES = sorted(
    p for p in FIXTURES.rglob("*")
    if p.is_file() and p.suffix in (".csv", ".log", ".txt", ".tsv", ".json", ".nvvp", ".xml")
    and p.name not in ("versions.txt", "nsys_version.txt") and "malicious" not in p.parts
    and p.stat().st_size < 600_000
) + [FIXTURES / "torch" / "resnet18_bs4.json.gz"]
HUGE = ["9223372036854775807", "-4222", "1180591620717411303424", "1e308", "-1e308", "١٢", "nan", "", "4294967296"]

#: (mutant id) -> why it fails today: torch and chrome readers are being fixed under issue 12 (another change).
XFAIL: dict[str, str] = {}


def _mutants() -> list[tuple[str, Path, str, bytes]]:
    rng = random.Random(SEED)
    out = []
    for path in SOURCES:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        rel = str(path.relative_to(FIXTURES))
        lines = data.splitlines(True)
        body = max(1, len(lines) // 3)
        kinds = ["flip", "cut", "cell", "dup"]
        for kind in rng.sample(kinds, 2):
            b = bytearray(data)
            if kind == "flip":
                for _ in range(4):
                    i = rng.randrange(len(b))
                    b[i] = rng.randrange(256)
            elif kind == "cut":
                b = b[: rng.randrange(len(b) // 4, len(b))]
            elif kind == "dup":
                if len(lines) <= body:  # one line: nothing after the head to repeat
                    continue
                i = rng.randrange(body, len(lines))
                b = bytearray(b"".join(lines[:i + 1] + [lines[i]] * 3 + lines[i + 1:]))
            else:  # one number in a data line becomes a huge, negative or odd value
                text = data.decode("utf-8", "replace")
                numbers = [m for m in __import__("re").finditer(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", text)]
                numbers = [m for m in numbers if m.start() > len(text) // 4] or numbers
                if not numbers:
                    continue
                m = rng.choice(numbers)
                b = bytearray((text[: m.start()] + rng.choice(HUGE) + text[m.end():]).encode())
            out.append((f"{rel}:{kind}", path, kind, bytes(b)))
    return out


MUTANTS = _mutants()


def _bad_figures(obj, where: str = ""):
    """Figures no output may hold: a non-finite float, or a negative number that is not a difference."""
    for where, v in json_numbers(obj, where):
        if isinstance(v, float) and not math.isfinite(v):
            yield where, v
        elif v < 0 and not where.endswith(("delta", "delta_pct", "change_pct", "diff")):
            yield where, v


@pytest.mark.parametrize("case", [pytest.param(m, id=m[0], marks=[pytest.mark.xfail(reason=XFAIL[m[0]])]
                                               if m[0] in XFAIL else []) for m in MUTANTS])
def test_mutant(case, tmp_path, monkeypatch):
    name, source, kind, data = case
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / source.name.removesuffix(".gz")
    if source.parent.name == "multi-cupti":
        pytest.skip("directories are mutated in test_directory_mutants")
    path.write_bytes(data)
    _analyzed(path, name)


def test_directory_mutants(tmp_path, monkeypatch):
    """A TAU MULTI__ directory missing one thread's file, and a profile directory with a cut file."""
    import shutil

    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    multi = tmp_path / "multi"
    shutil.copytree(FIXTURES / "tau" / "handwritten" / "multi-cupti", multi)
    sorted(multi.glob("MULTI__CUDA*/profile.0.0.1"))[0].unlink()
    cpi = tmp_path / "cpi"
    shutil.copytree(FIXTURES / "tau" / "real" / "cpi-mpi", cpi)
    p = cpi / "profile.1.0.0"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    for path in (multi, cpi):
        code, out, err = run_cli("analyze", "--json", str(path))
        assert code in (0, 2), err


# -- property-based: the readers' Python API ---------------------------------------------------------------
CELL = st.one_of(st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n\r\x00"), max_size=12),
                 st.sampled_from(["", "-", "1.5E+300", "٣", "1,234", "0x10"]))
ROW = st.lists(CELL, min_size=1, max_size=8)


def _check(path: Path) -> None:
    try:
        [trace] = read_paths([path])
        events = trace.events
    except InputError:
        return
    for column in ("duration_ns", "calls", "bytes", "min_ns", "max_ns", "exclusive_ns"):
        assert (events[column].drop_nulls() >= 0).all(), column
    assert events["value"].drop_nulls().is_finite().all()


def _with_rows(source: Path, header_lines: int, rows: list[list[str]], sep: str = ",") -> bytes:
    head = source.read_text().splitlines(True)[:header_lines]
    return ("".join(head) + "".join(sep.join(r) + "\n" for r in rows)).encode()


PROPS = {
    "nsys": (FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv", 1, "x_cuda_gpu_trace.csv"),
    "nsys-sum": (FIXTURES / "nsys" / "handwritten" / "r18w2021_cudaapisum.csv", 1, "x_cudaapisum.csv"),
    "nvprof": (FIXTURES / "nvprof" / "real" / "rlscope_gpu_trace.csv", 3, "x.csv"),
    "ncu": (FIXTURES / "ncu" / "handwritten" / "details_2022_metrics.csv", 2, "x.csv"),
}


@pytest.mark.parametrize("form", sorted(PROPS))
def test_property_rows(form, tmp_path_factory):
    source, header, name = PROPS[form]
    folder = tmp_path_factory.mktemp(form)

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.lists(ROW, min_size=1, max_size=4))
    def run(rows):
        path = folder / name
        path.write_bytes(_with_rows(source, header, rows))
        _check(path)

    run()


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(-1e20, 1e300) | st.integers(-2**66, 2**66), st.integers(-2**40, 2**70),
                          st.text(max_size=20)), min_size=1, max_size=5))
def test_property_tau_pprof_rows(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("pprof")
    source = (FIXTURES / "tau" / "real" / "pprof" / "taustubs-matmult-pprof-s.txt").read_text().splitlines(True)
    body = "".join(f"{a!s:>6} {a!s:>12} {a!s:>12} {b:>11} {b:>11} {b:>10} {name or 'x'}\n" for a, b, name in rows)
    path = folder / "pprof.txt"
    path.write_text("".join(source[:7]) + body)
    _check(path)


# -- issue 22: names with markup and escapes, device properties, damaged gzip streams, rank directories, CLI
# options, and one decoding process against several ----------------------------------------------------------
RANK0 = FIXTURES / "torch" / "multirank" / "nccl2_balanced" / "rank0.json.gz"
#: Text that was markup, an escape sequence, a fake event boundary or a line break when printed.
HOSTILE_NAMES = ["[/x]", "[bold red]x[/]", "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", '},{"ph": "X", "name": "',
                 "\\\\\\\"", "\u202eevil", "a\nb\rc", "[link=file:///etc/passwd]x", "\x00\x7f\x9b"]
HOSTILE_DEVICE = {"name": [42, "", "[/x]\x1b[2J", None], "numSms": ["many", -132, 0, 2**64, 1.5],
                  "totalGlobalMem": ["80GB", -1, 2**70, 1e308], "computeMajor": ["x", -9], "id": ["0", 2**40, -3]}


def _words(text: str) -> list[re.Match]:
    return [m for m in re.finditer(r"(?<![\w\\])[A-Za-z_][A-Za-z_0-9]{5,}", text)]


def _new_mutants() -> list[tuple[str, str, bytes]]:
    """(id, file name, content) of names with markup and escapes, device properties and damaged gzip streams."""
    rng = random.Random(SEED + 22)
    out = []
    for path in rng.sample(SOURCES, 10) + [RANK0]:
        data = path.read_bytes()
        data = gzip.decompress(data) if path.suffix == ".gz" else data
        name = path.name.removesuffix(".gz")
        rel = str(path.relative_to(FIXTURES))
        text = data.decode("utf-8", "replace")
        words = _words(text[len(text) // 4:])
        if words:  # one word of the data becomes hostile text (JSON-escaped in JSON, raw elsewhere)
            m = rng.choice(words)
            at = len(text) // 4
            hostile = rng.choice(HOSTILE_NAMES)
            put = json.dumps(hostile)[1:-1] if name.endswith(".json") else hostile
            out.append((f"{rel}:names", name, (text[: at + m.start()] + put + text[at + m.end():]).encode()))
        cut = gzip.compress(data, 6, mtime=0)
        flipped = bytearray(cut)
        for _ in range(3):  # three changed bytes in the deflate stream (past its 10-byte header)
            i = rng.randrange(10, max(11, len(flipped) - 8))
            flipped[i] ^= 1 + rng.randrange(255)
        out.append((f"{rel}:gzip-flip", name + ".gz", bytes(flipped)))
        out.append((f"{rel}:gzip-cut", name + ".gz", cut[: len(cut) * 2 // 3]))
    doc = json.loads(gzip.decompress(RANK0.read_bytes()))
    for key, values in HOSTILE_DEVICE.items():
        for value in rng.sample(values, 2):
            mutant = json.loads(json.dumps(doc))
            mutant["deviceProperties"][rng.randrange(len(mutant["deviceProperties"]))][key] = value
            out.append((f"devices:{key}={value!r}", "rank0.json", json.dumps(mutant).encode()))
    return out


NEW_MUTANTS = _new_mutants()


def _analyzed(path, name: str) -> dict | None:
    """``analyze --json PATH`` holds the contract (:func:`_contract`) and, when it succeeds, no figure is
    impossible (:func:`_bad_figures`): the JSON document, or None when the input was refused."""
    code, out, err = run_cli("analyze", "--json", str(path))
    _contract(code, out, err, name)
    if code == 2:
        return None
    doc = json.loads(out)
    bad = [b for f in doc["findings"] for b in _bad_figures(f.get("metrics", {}), f["rule"])]
    assert not bad, (name, bad[:5])
    return doc


def _contract(code: int, out: str, err: str, name: str) -> None:
    assert code in (0, 2), (name, err[-600:])
    assert "Traceback" not in err and "\x1b" not in out and "\x1b" not in err, name
    if code == 2:
        assert err.startswith("traceparse: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("case", NEW_MUTANTS, ids=[m[0] for m in NEW_MUTANTS])
def test_new_mutant(case, tmp_path, monkeypatch):
    """Ingested and analyzed as a user would, on a terminal 120 columns wide and with --json."""
    name, file_name, data = case
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / file_name
    path.write_bytes(data)
    code, out, err = run_cli("analyze", "--width", "120", "--all", str(path))
    _contract(code, out, err, name)
    if code == 0:
        code, out, err = run_cli("analyze", "--json", str(path))
        _contract(code, out, err, name)
        bad = [b for f in json.loads(out)["findings"] for b in _bad_figures(f.get("metrics", {}), f["rule"])]
        assert not bad, (name, bad[:5])


def _rank_edits():
    def dist(**values):
        return lambda i, doc: doc["distributedInfo"].update(values) if i == 0 else None

    def clock(i, doc):
        if i == 1:
            for e in doc["traceEvents"]:
                if "ts" in e:
                    e["ts"] += 9.2e15

    def late_half(i, doc):
        events = [e for e in doc["traceEvents"] if "ts" in e]
        middle = sorted(e["ts"] for e in events)[len(events) // 2]
        for e in events:
            if e["ts"] >= middle:
                e["ts"] += 9.2e15

    return {"world_size=1e9": dist(world_size=10**9), "rank=2^40": dist(rank=2**40), "rank=²": dist(rank="²"),
            "world_size=٤": dist(world_size="٤"), "rank=-1": dist(rank=-1), "both rank 1": dist(rank=1),
            "clock 9.2e15 us off": clock, "clocks jump": late_half,
            "no distributedInfo": lambda i, doc: doc.pop("distributedInfo")}


RANK_EDITS = _rank_edits()


@pytest.mark.parametrize("edit", sorted(RANK_EDITS) + ["cut rank file", "same file twice", "rank99999999"])
def test_rank_directory_mutant(edit, tmp_path, monkeypatch):
    """The two-rank NCCL run with one thing wrong: exit 0 or one line, never an impossible figure."""
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    run = tmp_path / "run"
    run.mkdir()
    sources = sorted((FIXTURES / "torch" / "multirank" / "nccl2_balanced").iterdir())
    for i, source in enumerate(sources):
        doc = json.loads(gzip.decompress(source.read_bytes()))
        if edit in RANK_EDITS:
            RANK_EDITS[edit](i, doc)
        data = json.dumps(doc).encode()
        target = run / source.name.removesuffix(".gz")
        if edit == "cut rank file" and i == 1:
            data = data[: len(data) // 2]
        if edit == "rank99999999" and i == 0:
            doc.pop("distributedInfo")
            data, target = json.dumps(doc).encode(), run / "rank99999999.json"
        target.write_bytes(data)
        if edit == "same file twice" and i == 0:
            (run / "rank0_copy.json").write_bytes(data)
    doc = _analyzed(run, edit)
    if doc is None:
        return
    for f in doc["findings"]:
        for key, value in f.get("metrics", {}).items():
            if key.endswith("_pct") and isinstance(value, (int, float)):
                assert value <= 100.0001, (edit, f["rule"], key, value)


HOSTILE_VALUES = ["99999999999999999999", "-1", "nan", "1e400", "[/x]", "\x1b[2J", "", "0", "٣", "9223372036854:",
                  ":0", "1:1", "all", "-9223372036854775808"]
OPTIONS = ["--set gpu-idle.top=", "--set gpu-idle.warning_idle_pct=", "--set stragglers.align_clocks=",
           "--window ", "--step ", "--nvtx ", "--rows ", "--digits ", "--width ", "--critical-floor ", "--top ",
           "--min-severity ", "--rule "]


def _option_cases() -> list[list[str]]:
    rng = random.Random(SEED + 2)
    cases = []
    for option in OPTIONS:
        for value in rng.sample(HOSTILE_VALUES, 2):
            flag, _, prefix = option.partition(" ")
            cases.append([flag, prefix + value])
    return cases


def _main(args: list[str]) -> tuple[int, str, str]:
    """The CLI in-process, with argparse's own refusals (SystemExit 2, a usage line first) counted as exits."""
    import contextlib
    import io

    from traceparse.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("option", _option_cases(), ids=lambda o: repr(" ".join(o)))
def test_hostile_cli_option(option, tmp_path, monkeypatch):
    """A hostile value of an analyze option on a real trace: exit 0 or one error line (argparse's after its
    usage), no traceback, no escape sequence echoed."""
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    code, out, err = _main(["analyze", *option, str(RANK0)])
    assert code in (0, 2), (option, err[-600:])
    assert "Traceback" not in err and "internal error" not in err and "\x1b" not in out + err, (option, err)
    if code == 2:
        assert err.splitlines()[-1].startswith(("traceparse: error: ", "traceparse analyze: error: ")), err
    tagged = _main(["--store", str(tmp_path / "tags"), "ingest", "-q", "--tag", f"k={option[1]}", str(RANK0)])
    assert tagged[0] in (0, 2) and "Traceback" not in tagged[2]
    for command in (["list"], ["show"]):
        code, out, err = _main(["--store", str(tmp_path / "tags"), *command])
        assert code in (0, 2) and "\x1b" not in out + err, (command, err)


# -- one decoding process and several give one answer (the parallel decoder cuts chunks of 2,000+ bytes) ------
def _json_cases() -> list[tuple[str, str, bytes]]:
    cases = [(m[0], m[1].name.removesuffix(".gz"), m[3]) for m in MUTANTS if m[1].name.endswith((".json", ".json.gz"))]
    new = [m for m in NEW_MUTANTS if m[1].endswith((".json", ".json.gz"))]
    return cases + [m for m in new if not m[0].startswith("devices:")] + [m for m in new if m[0].startswith("devices:")][:2]


def _ingest_with(path: Path, store: Path, workers: int, chunk: int, monkeypatch) -> tuple[int, str, object]:
    import traceparse_plugins.readers.torch_profiler as torch_reader
    from traceparse.store import Store

    monkeypatch.setenv("TRACEPARSE_DECODE_WORKERS", str(workers))
    monkeypatch.setattr(torch_reader, "CHUNK_BYTES", chunk)
    code, out, err = run_cli("--store", str(store), "ingest", "-q", "--json", str(path))
    table = Store(store).load(json.loads(out)["traces"][0]["id"]).events if code == 0 else None
    return code, err.replace(str(store), "STORE"), table


@pytest.mark.parametrize("case", _json_cases(), ids=[c[0] for c in _json_cases()])
def test_one_decoding_process_and_several_agree(case, tmp_path, monkeypatch):
    """The same exit status, warnings and stored table from the decoder in this process and from two decoding
    workers with small chunks (so that cuts fall inside names, nested arguments and the damage)."""
    name, file_name, data = case
    path = tmp_path / file_name
    path.write_bytes(data)
    serial = _ingest_with(path, tmp_path / "one", 0, 8 << 20, monkeypatch)
    parallel = _ingest_with(path, tmp_path / "two", 2, max(2000, len(data) // 40), monkeypatch)
    assert serial[:2] == parallel[:2], name
    assert (serial[2] is None) == (parallel[2] is None) and (serial[2] is None or serial[2].equals(parallel[2])), name


def test_a_damaged_gzip_stream_is_reported_before_what_its_garbage_breaks(tmp_path, monkeypatch):
    """A gzip stream whose CRC fails at its end, and whose content breaks early (a time past Int64 nanoseconds,
    as bytes a damaged stream decompresses into can): read in one chunk the damage showed first; read in small
    chunks by two workers the broken event's chunk failed first, and that was reported instead
    ("traceEvents[70].ts: ... out of range"). Both say the stream is damaged: the cause, not a symptom."""
    data = gzip.decompress((FIXTURES / "torch" / "resnet18_bs4.json.gz").read_bytes())
    at = data.index(b'"ts":', len(data) // 10)
    end = at + 5 + re.match(rb"\s*[-0-9.]+", data[at + 5:]).end()
    broken = data[:at] + b'"ts": 4576538110691209560.016' + data[end:]
    packed = bytearray(gzip.compress(broken, 6, mtime=0))
    packed[-8] ^= 0xFF  # the CRC-32 of the trailer: the deflate data is whole, the check at the end fails
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(packed))
    serial = _ingest_with(path, tmp_path / "one", 0, 8 << 20, monkeypatch)
    parallel = _ingest_with(path, tmp_path / "two", 2, max(2000, len(broken) // 40), monkeypatch)
    for code, err, table in (serial, parallel):
        assert code == 2 and table is None and "the gzip stream is damaged (CRC check failed" in err, err
