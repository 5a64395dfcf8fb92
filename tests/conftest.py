"""Shared test fixtures: paths to the repo's fixtures and to the optional shared samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    """The repo's fixtures/ directory (always present)."""
    return FIXTURES


@pytest.fixture
def samples_dir() -> Path:
    """Real tool output shipped beside the repo (../shared/samples, or $TRACEPARSE_SAMPLES); skips when absent."""
    path = Path(os.environ.get("TRACEPARSE_SAMPLES", REPO.parent / "shared" / "samples"))
    if not path.is_dir():
        pytest.skip(f"shared samples not available at {path}")
    return path


@pytest.fixture
def formats_dir() -> Path:
    """Public example files of older formats (../shared/formats); skips when absent."""
    path = Path(os.environ.get("TRACEPARSE_FORMATS", REPO.parent / "shared" / "formats"))
    if not path.is_dir():
        pytest.skip(f"shared formats not available at {path}")
    return path


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """An empty store directory, also set as $TRACEPARSE_STORE."""
    path = tmp_path / "store"
    monkeypatch.setenv("TRACEPARSE_STORE", str(path))
    return path


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the traceparse CLI in-process; return (exit code, stdout, stderr)."""
    import contextlib
    import io

    from traceparse.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


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


def us_to_ns(value) -> int:
    """A Chrome-trace microsecond value (parsed as Decimal) to integer ns, half up."""
    from decimal import ROUND_HALF_UP, Decimal

    return int((Decimal(value) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))
