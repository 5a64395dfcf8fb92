"""Issue 16: bounded time and memory. Each reader gets a long line, a huge field, many spaces in one row and a
gzip bomb; each run is a fresh ``traceparse ingest`` whose time and peak RSS are measured
(``resource.getrusage(RUSAGE_CHILDREN)`` in a wrapper process, so runs do not see each other's peak)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FIXTURES

#: Limits of the contract (the issue: 30 s and 1 GB); these inputs take well under a tenth of it.
MAX_SECONDS = 30
MAX_RSS_MB = 1024

_WRAPPER = """
import json, resource, subprocess, sys, time
t = time.time()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "s": time.time() - t, "err": r.stderr,
                  "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

TEXT = {  # reader -> a fixture of its text form and how many lines are its head
    "nvprof": FIXTURES / "nvprof" / "real" / "rlscope_gpu_trace.csv",
    "nsys": FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv",
    "ncu": FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv",
    "tau": FIXTURES / "tau" / "real" / "pprof" / "taustubs-matmult-pprof-s.txt",
}


def run_measured(tmp_path: Path, *args: str) -> dict:
    cmd = [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "traceparse.cli", "--store", str(tmp_path / "store"),
           "ingest", "-q", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=MAX_SECONDS * 3)
    result = json.loads(out.stdout)
    assert result["rc"] in (0, 2), result["err"][-500:]
    assert result["s"] < MAX_SECONDS, result
    assert result["rss_mb"] < MAX_RSS_MB, result
    return result


def _insert(source: Path, line: bytes, at: int = 5) -> bytes:
    lines = source.read_bytes().splitlines(True)
    return b"".join(lines[:at] + [line] + lines[at:])


@pytest.mark.parametrize("reader", sorted(TEXT))
def test_long_line(reader, tmp_path):
    path = tmp_path / ("long_" + TEXT[reader].name)
    path.write_bytes(_insert(TEXT[reader], b"x" * (40 << 20) + b"\n"))
    result = run_measured(tmp_path, "--format", reader, str(path))
    assert result["rc"] == 2 and "longer than 32 MiB" in result["err"], result["err"]


@pytest.mark.parametrize("reader", sorted(TEXT))
def test_gzip_bomb(reader, tmp_path):
    """1.5 GiB of whitespace lines in a 1.5 MB gzip (24 gzip members of 64 MiB each, after the fixture's head)."""
    member = gzip.compress((b" " * 63 + b"\n") * (1 << 20), 9)
    path = tmp_path / ("bomb_" + TEXT[reader].name + ".gz")
    path.write_bytes(gzip.compress(b"".join(TEXT[reader].read_bytes().splitlines(True)[:6]), 9) + member * 24)
    result = run_measured(tmp_path, "--format", reader, str(path))
    assert result["rc"] == 2 and "compression bomb" in result["err"], result["err"]


def test_sparse_file(tmp_path):
    path = tmp_path / "sparse_cuda_gpu_trace.csv"
    with open(path, "wb") as f:
        f.write(TEXT["nsys"].read_bytes()[:200])
        f.truncate(4 << 30)
    for reader in ("nsys", "tau"):
        result = run_measured(tmp_path, "--format", reader, str(path))
        assert result["rc"] == 2, result
    zero = tmp_path / "zero.csv"
    with open(zero, "wb") as f:
        f.truncate(4 << 30)
    result = run_measured(tmp_path, "--format", "tau", str(zero))
    assert result["rc"] == 2 and "NUL bytes" in result["err"] and result["s"] < 5, result


def test_spaces_in_an_nvprof_summary_row(tmp_path):
    lines = (FIXTURES / "nvprof" / "handwritten" / "summary_cuda10.log").read_text().splitlines(True)
    i = next(k for k, line in enumerate(lines) if "GPU activities:" in line) + 1
    lines[i] = lines[i].rstrip("\n") + " " * 100_000 + "x\n"
    path = tmp_path / "spaces.log"
    path.write_text("".join(lines))
    assert run_measured(tmp_path, str(path))["s"] < 10


def test_spaces_in_an_ncu_rule_line(tmp_path):
    lines = (FIXTURES / "ncu" / "ncu_sol_vgg11_bs16.txt").read_text().splitlines(True)
    i = next(k for k, line in enumerate(lines) if line.startswith(("    OPT", "    WRN", "    INF")))
    lines[i] = lines[i].rstrip("\n") + " " * 100_000 + "x\n"
    path = tmp_path / "rule.txt"
    path.write_text("".join(lines))
    assert run_measured(tmp_path, str(path))["s"] < 10


def test_newlines_in_one_quoted_ncu_field(tmp_path):
    raw = (FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv").read_text().splitlines(True)
    k = next(n for n, line in enumerate(raw) if line.startswith('"ID"'))
    cells = raw[k + 2].split('","')
    cells[4] = "K" + "\n" * 80_000 + "K"
    path = tmp_path / "newlines.csv"
    path.write_text("".join(raw[:k + 3] + ['","'.join(cells)] + raw[k + 3:]))
    assert run_measured(tmp_path, str(path))["s"] < 10
