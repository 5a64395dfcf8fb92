"""What a plugin-provided CLI sub-command is."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from traceparse.session import Session


class Command:
    """Base class for sub-commands added by plugins.

    Set ``name`` and ``help``; :meth:`configure` adds arguments to the
    sub-command's parser; :meth:`run` does the work and returns the exit
    status. Raise :class:`traceparse.errors.InputError` for bad input.
    """

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add this command's arguments to ``parser``."""

    def run(self, args: argparse.Namespace, session: "Session") -> int:
        """Carry out the command; ``session`` gives the store, trace resolution and the console."""
        raise NotImplementedError
