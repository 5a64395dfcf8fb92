"""``traceparse --version`` answers without loading a plugin, polars, pandas or pyarrow (issue 25: fast start).

Each check is a fresh interpreter (a subprocess): a module imported by another test would hide what this one
imports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from traceparse import __version__

HEAVY = ("polars", "pandas", "pyarrow", "numpy", "rich", "pluggy", "msgspec", "traceparse_plugins")

_CHILD = """
import contextlib, io, json, sys
from traceparse.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "out": out.getvalue(), "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--store", "somewhere", "--version"], ["-q", "--version"]])
def test_version_loads_nothing_heavy(argv):
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == 0 and result["out"] == f"traceparse {__version__}\n"
    assert not set(HEAVY) & set(result["loaded"]), sorted(set(HEAVY) & set(result["loaded"]))


def test_import_traceparse_is_light_and_names_still_there():
    """``import traceparse`` loads no polars; ``traceparse.Trace`` (and the other public names) load it then."""
    code = ("import sys, traceparse; light = 'polars' not in sys.modules; "
            "print(light, traceparse.Trace.__name__, traceparse.Finding.__name__, callable(traceparse.hookimpl))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "Trace", "Finding", "True"], done.stderr


def test_version_after_a_command_is_that_commands_business():
    """``--version`` after a sub-command is not the top-level option: argparse refuses it (exit 2)."""
    done = subprocess.run([sys.executable, "-m", "traceparse", "list", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "unrecognized arguments: --version" in done.stderr
