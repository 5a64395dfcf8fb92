"""``analyze`` shows which rule it is on when its stderr is a terminal, and nothing when piped or quiet
(issue 23, item 2); only once it has run a second (``TRACEPARSE_PROGRESS_AFTER``, issue 25), so a quick
analysis leaves the terminal as it was."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import time

import pytest

from helpers import FIXTURES, run_cli

TRACE = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")


def _run(args: list[str], store, terminal: bool, after: str = "0") -> tuple[int, str]:
    """Exit status and stderr of ``traceparse ARGS``, stderr on a pseudo-terminal when ``terminal``; the bar shows
    after ``after`` seconds (``TRACEPARSE_PROGRESS_AFTER``)."""
    env = {**os.environ, "TRACEPARSE_STORE": str(store), "COLUMNS": "100", "TERM": "xterm",
           "TRACEPARSE_PROGRESS_AFTER": after}
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


def test_a_quick_analysis_shows_no_bar_on_a_terminal(store):
    status, err = _run(["analyze", TRACE], store, terminal=True, after="600")
    assert status == 0
    assert " rules" not in err and "summary" not in err and "analyze " not in err


def _session_on_a_terminal():
    from traceparse.session import Session
    from traceparse.text import SafeConsole

    session = Session(quiet=False)
    buffer = io.StringIO()
    session.err = SafeConsole(file=buffer, force_terminal=True, width=100)
    return session, buffer


def test_the_bar_shows_once_the_work_has_run_its_delay():
    session, buffer = _session_on_a_terminal()
    with session.steps("analyze slow-one", 3, "rules", after=0.2) as advance:
        advance("first-rule")
        assert buffer.getvalue() == ""  # not yet
        deadline = time.monotonic() + 30
        while "first-rule" not in buffer.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "analyze slow-one" in buffer.getvalue() and "first-rule" in buffer.getvalue()
        advance("second-rule")
    session, buffer = _session_on_a_terminal()
    with session.steps("analyze quick-one", 3, "rules", after=5) as advance:
        advance("first-rule")
    time.sleep(0.3)
    assert buffer.getvalue() == ""  # done before its delay: nothing was drawn, nothing is drawn later


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_bad_delay_is_refused(value, store, monkeypatch):
    monkeypatch.setenv("TRACEPARSE_PROGRESS_AFTER", value)
    monkeypatch.setenv("TRACEPARSE_STORE", str(store))
    code, out, err = run_cli("analyze", TRACE)
    assert code == 2 and out == ""
    assert err == ("traceparse: error: TRACEPARSE_PROGRESS_AFTER: expected a number of seconds (0 or more), "
                   f"got {value!r}\n")
