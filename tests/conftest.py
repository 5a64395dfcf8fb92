"""Shared test fixtures: paths to the repo's fixtures and to the optional shared samples, an empty store.

Only fixtures live here; helpers that tests import are in tests/helpers.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from helpers import FIXTURES, REPO

# the plugin index (traceparse.plugins) of this test session, not the user's cache; subprocesses inherit it
os.environ.setdefault("TRACEPARSE_CACHE_DIR", tempfile.mkdtemp(prefix="traceparse-test-cache-"))


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
