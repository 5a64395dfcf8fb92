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
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import FIXTURES, run_cli
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


def _bad_figures(obj, where=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _bad_figures(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _bad_figures(v, f"{where}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        yield where, obj
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and obj < 0 and not where.endswith(
            ("delta", "delta_pct", "change_pct", "diff")):
        yield where, obj


@pytest.mark.parametrize("case", [pytest.param(m, id=m[0], marks=[pytest.mark.xfail(reason=XFAIL[m[0]])]
                                               if m[0] in XFAIL else []) for m in MUTANTS])
def test_mutant(case, tmp_path, monkeypatch):
    name, source, kind, data = case
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / source.name.removesuffix(".gz")
    if source.parent.name == "multi-cupti":
        pytest.skip("directories are mutated in test_directory_mutants")
    path.write_bytes(data)
    code, out, err = run_cli("analyze", "--json", str(path))
    assert code in (0, 2), (name, err[-600:])
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("traceparse: error: ") and err.count("\n") == 1, err
        return
    doc = json.loads(out)
    bad = [b for f in doc["findings"] for b in _bad_figures(f.get("metrics", {}), f["rule"])]
    assert not bad, (name, bad[:5])


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
