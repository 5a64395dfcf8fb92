"""``analyze`` shows which rule it is on when its stderr is a terminal, and nothing when piped or quiet
(issue 23, item 2)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from helpers import FIXTURES

TRACE = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")


def _run(args: list[str], store, terminal: bool) -> tuple[int, str]:
    """Exit status and stderr of ``traceparse ARGS``, stderr on a pseudo-terminal when ``terminal``."""
    env = {**os.environ, "TRACEPARSE_STORE": str(store), "COLUMNS": "100", "TERM": "xterm"}
    command = [sys.executable, "-m", "traceparse", *args]
    if not terminal:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stderr
    leader, follower = pty.openpty()
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=follower) as proc:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        status = proc.wait(timeout=300)
    os.close(leader)
    return status, b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_sees_the_rules_go_by(store):
    status, err = _run(["analyze", TRACE], store, terminal=True)
    assert status == 0
    from traceparse.plugins import registry

    steps = len(registry().rules) + 1  # each rule, then the summary
    assert "analyze " in err and f"/{steps}" in err and " rules" in err
    assert "summary" in err  # the step under way is named


def test_piped_or_quiet_there_is_no_bar(store):
    for args, terminal in ((["analyze", TRACE], False), (["-q", "analyze", TRACE], True)):
        status, err = _run(args, store, terminal)
        assert status == 0
        assert " rules" not in err and "summary" not in err, args
