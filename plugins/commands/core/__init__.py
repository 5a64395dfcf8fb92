"""Plugin ``core_commands``: the sub-commands every traceparse has.

``ingest``, ``analyze``, ``list``, ``show``, ``tag``, ``rm``, ``rules``, ``formats``,
``plugins`` and ``export`` are :class:`traceparse.command.Command` plugins
registered through the ``traceparse`` entry-point group, exactly as a
third-party command is; the CLI knows none of them by name. The hook is
``tryfirst`` so that they come first in ``traceparse --help``, in the order
of a session's work (``ingest``, ``analyze``, then the store and the
catalog). A plugin that provides a command of the same name replaces it, with
a warning.
"""

from __future__ import annotations

from traceparse.plugins import hookimpl
from traceparse_plugins.commands.core.analyze import AnalyzeCommand
from traceparse_plugins.commands.core.catalog import FormatsCommand, PluginsCommand, RulesCommand
from traceparse_plugins.commands.core.store import (ExportCommand, IngestCommand, ListCommand, RmCommand,
                                                    ShowCommand, TagCommand)


@hookimpl(tryfirst=True)
def traceparse_commands():
    """The core commands, in the order ``traceparse --help`` lists them."""
    return [IngestCommand(), AnalyzeCommand(), ListCommand(), ShowCommand(), TagCommand(), RmCommand(), RulesCommand(),
            FormatsCommand(), PluginsCommand(), ExportCommand()]
