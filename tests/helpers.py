"""Shared test helpers: paths, running the CLI in-process, reading a trace, the independent unit oracles.

Test modules import from here (``from helpers import ...``; pyproject puts
tests/ on ``pythonpath``), never from conftest.py, which holds only fixtures.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
