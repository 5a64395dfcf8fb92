"""Errors a user can act on.

:class:`InputError` is raised for bad input (a file that is not what it
claims, a bad option): the CLI prints its message as one line and exits
with status 2. Its message names the file, the line or record, and what was
expected.

A message that tells the user what to do names it in the interface they use:
``--store DIR`` where the command line runs (:func:`command_line`), ``store=``
in Python (:func:`spelled`).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

#: Longest excerpt of a bad value quoted in a message (:func:`traceparse.validate.excerpt`, and the quotes a
#: one-line message keeps: :func:`traceparse.text.one_line`).
EXCERPT = 80


#: True while the command line runs a command (:func:`command_line`); False in Python (a notebook, a script).
_COMMAND_LINE: ContextVar[bool] = ContextVar("traceparse_command_line", default=False)


@contextmanager
def command_line(on: bool = True):
    """Within: messages name what to do on the command line (``--store``), not in Python (``store=``). The CLI runs
    its commands inside it; a worker process it starts enters it again with the parent's :func:`on_command_line`."""
    token = _COMMAND_LINE.set(on)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def on_command_line() -> bool:
    """Whether the command line is running (:func:`command_line`), rather than Python calling traceparse."""
    return _COMMAND_LINE.get()


def enter_command_line(on: bool) -> None:
    """Set :func:`on_command_line` for the rest of this process: a worker process's initializer, taking its
    parent's."""
    _COMMAND_LINE.set(on)


def spelled(cli: str, api: str) -> str:
    """``cli`` on the command line, ``api`` in Python: a message that tells the user what to do says it in the
    interface they use (``spelled("give --store", "pass store=")``); "give --store" would not help a caller of
    ``traceparse.load``."""
    return cli if _COMMAND_LINE.get() else api


class TraceparseError(Exception):
    """Base class of every error traceparse reports without a traceback."""

    exit_code = 2


class InputError(TraceparseError):
    """A file, argument or option is not what it must be."""


class StoreError(TraceparseError):
    """The store cannot do what was asked (no such trace, ambiguous id)."""


class ResourceError(TraceparseError):
    """This machine cannot do what was asked: it has not the memory for it (said before it is tried, not after
    the system has killed the process)."""


def bad_input(path: object, where: str | int | None, expected: str) -> InputError:
    """Build the one-line error for ``path`` at ``where`` (a line number or record)."""
    if where is None or where == "":
        return InputError(f"{path}: {expected}")
    if isinstance(where, int):
        return InputError(f"{path}:{where}: {expected}")
    return InputError(f"{path}: {where}: {expected}")
