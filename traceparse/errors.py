"""Errors a user can act on.

:class:`InputError` is raised for bad input (a file that is not what it
claims, a bad option): the CLI prints its message as one line and exits
with status 2. Its message names the file, the line or record, and what was
expected.
"""

from __future__ import annotations

#: Longest excerpt of a bad value quoted in a message (:func:`traceparse.validate.excerpt`, and the quotes a
#: one-line message keeps: :func:`traceparse.text.one_line`).
EXCERPT = 80


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
