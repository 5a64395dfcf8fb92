"""The same input gives the same output, byte for byte: `analyze --json` in fresh processes and fresh stores.

Fresh processes matter: polars' hash-based group_by/unique order changes between processes, and a rule
that lets it reach its JSON (a dict built from an unsorted group_by) differs from run to run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import FIXTURES

INPUTS = [FIXTURES / "torch" / "resnet18_bs16.json.gz", FIXTURES / "nvprof" / "handwritten" / "gpu_api_trace.log",
          FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz", FIXTURES / "tau" / "real" / "cpi-mpi"]


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_analyze_json_is_identical_in_fresh_processes(path, tmp_path):
    outputs = set()
    for run in range(3):
        result = subprocess.run([sys.executable, "-m", "traceparse.cli", "--store", str(tmp_path / f"s{run}"),
                                 "analyze", "--json", str(path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout.replace(str(tmp_path / f"s{run}"), "STORE"))
    assert len(outputs) == 1
