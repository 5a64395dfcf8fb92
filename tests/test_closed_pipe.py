"""A report whose reader goes away (``traceparse analyze | head``) ends quietly with status 141, what a shell
reports for a program killed by the closed pipe: not 1, which is ``--fail-on``'s verdict, nor 0, which
``set -o pipefail`` would take for a whole report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import FIXTURES, run_cli
from traceparse.cli import CLOSED_PIPE

TRACE = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store")
    code, _, err = run_cli("--store", str(path), "ingest", TRACE)
    assert code == 0, err
    return path


@pytest.mark.parametrize("args", [["analyze"], ["analyze", "--json"], ["analyze", "--fail-on", "info"], ["list"]])
def test_a_closed_pipe_ends_the_command_quietly_with_141(store, args):
    command = [sys.executable, "-m", "traceparse", "--store", str(store), *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "COLUMNS": "100"}) as proc:
        proc.stdout.close()  # before the command writes anything: its first write finds no reader
        err = proc.stderr.read()
        code = proc.wait(timeout=300)
    assert (code, err) == (CLOSED_PIPE, b"")


def test_the_same_commands_read_whole_exit_as_before(store):
    """The status of the whole report is the command's own: 1 for a finding at ``--fail-on info``, 0 else."""
    command = [sys.executable, "-m", "traceparse", "--store", str(store)]
    assert subprocess.run([*command, "analyze", "--fail-on", "info"], capture_output=True).returncode == 1
    assert subprocess.run([*command, "analyze"], capture_output=True).returncode == 0
