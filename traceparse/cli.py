"""The ``traceparse`` command line: a parser built from the registry's commands, the top-level options, exit codes.

Every sub-command, built-in or not, is a :class:`traceparse.command.Command`
from a plugin's ``traceparse_commands`` hook; this module knows none of them
by name. Exit codes: what the command returns (0, or 1 for ``analyze
--fail-on``), 2 for bad input or usage, 3 for an internal error, 130 when
interrupted.

This module imports only what ``--version`` needs; the registry is made once a
command is to be run, and only the plugin of that command is imported
(:mod:`traceparse.plugins`: the plugin index). The parser lists every command
(name and help) but configures only the one asked for: ``traceparse list`` and
``traceparse --help`` import no reader, no rule, no polars.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import sys
from typing import TYPE_CHECKING

from traceparse import __version__
from traceparse.errors import TraceparseError, command_line

if TYPE_CHECKING:
    from traceparse.plugins import Registry

#: Top-level options that take a value (``--store DIR``): what :func:`_asks_version` skips over.
_VALUED = ("--store", "--width")


def __getattr__(name: str):
    """``one_line`` (re-exported: the CLI's one-line messages), imported on first use."""
    if name == "one_line":
        from traceparse.text import one_line

        return one_line
    raise AttributeError(f"module 'traceparse.cli' has no attribute {name!r}")


def _command_name(argv: list[str]) -> str | None:
    """The sub-command named in ``argv``: its first argument that is not a top-level option (or its value)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _VALUED:
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg
    return None


def _asks_version(argv: list[str]) -> bool:
    """True when ``--version`` comes before any sub-command: answered without loading a plugin."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--version":
            return True
        elif arg in _VALUED:
            skip = True
        elif not arg.startswith("-") or arg == "--":
            return False
    return False


def build_parser(reg: Registry, only: str | None = None) -> argparse.ArgumentParser:
    """The ``traceparse`` parser: the top-level options and one sub-parser per command of ``reg``.

    Sub-commands are listed in the registry's order (the core commands first).
    Each gets ``--store`` and ``--quiet`` before its own :meth:`configure`, so
    those two work after the sub-command's name for every command, whether or
    not it calls :func:`traceparse.command.add_common_options`. With ``only``
    (the command asked for) only that command is configured (and its plugin
    imported); the others are listed with their help.
    """
    from traceparse.command import WIDE, add_common_options, screen_width

    parser = argparse.ArgumentParser(
        prog="traceparse",
        description="Read GPU and deep-learning profiler output into one event table and analyse it.",
    )
    parser.add_argument("--version", action="version", version=f"traceparse {__version__}")
    parser.add_argument("--store", metavar="DIR", default=None,
                        help="store directory (default: $TRACEPARSE_STORE or ./.traceparse)")
    parser.add_argument("-q", "--quiet", action="store_true", default=False, help="no progress bar")
    parser.add_argument("--width", type=screen_width, metavar="N", default=None,
                        help="render tables for N columns (default: the terminal's width; 80 when piped)")
    parser.add_argument("--wide", action="store_true", default=False,
                        help=f"render for {WIDE} columns: long names whole where they fit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = reg.command_list() if only is not None else [(n, c.help) for n, c in reg.commands.items()]
    for name, help_text in commands:
        command = reg.command(name) if only is None or name == only else None
        p = sub.add_parser(name, help=help_text, description=command.help if command else help_text)
        add_common_options(p, json=False)
        if command is not None:
            command.configure(p)
            p.set_defaults(command_object=command)
    return parser


#: The garbage collector's young generation, in objects allocated, for a process that is one command. Python's
#: 700 made ``analyze`` collect 137 times (rendering and the rules' rows make many short-lived objects, few in
#: cycles): 40 ms of its 2 s, 11 ms at this. And once the command's imports are in (polars, rich, the plugins:
#: modules, classes, functions, which live as long as the process), they are frozen out of the full passes
#: (:func:`gc.freeze`), which went through all of them again (20 ms). A caller's ``main([...])`` (the tests)
#: leaves its process's collector as it is.
_GC_THRESHOLD = 20_000

#: The allocator's setting for a process that is one command (set before polars is imported, unless the user set
#: it): jemalloc (polars' allocator on Linux) keeps the pages a query frees for the next one instead of handing
#: them back to the system after a few seconds, to be faulted in and zeroed again. Every command is a short
#: process, so nothing is held past its end. Measured on the 2-core box, alternating, 3 rounds (2026-12-02):
#: ingest of 8 ranks of the 139 MB trace 9.78 -> 8.93 s, analyze of them 17.8 -> 16.4 s (sys 8.3 -> 7.1 s), at
#: 1.03x and 1.12x the peak memory; one trace's ingest and analyze unchanged. Other allocators ignore it.
ALLOCATOR_SETTING = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traceparse`` console script."""
    if argv is None:  # the process is this command: see ALLOCATOR_SETTING (polars is not imported yet)
        os.environ.setdefault(*ALLOCATOR_SETTING)
    if _asks_version(sys.argv[1:] if argv is None else list(argv)):
        print(f"traceparse {__version__}")
        return 0
    if argv is None:  # the process is this command (not a caller's ``main([...])``, a test's): see _GC_THRESHOLD
        gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
    from traceparse.command import WIDE
    from traceparse.plugins import registry
    from traceparse.session import Session
    from traceparse.text import one_line

    try:
        reg = registry()
        parser = build_parser(reg, only=_command_name(sys.argv[1:] if argv is None else list(argv)) or "")
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        width = args.width or (WIDE if args.wide else None)
        session = Session(store=args.store, quiet=args.quiet, reg=reg, width=width)
        for warning in reg.warnings:
            session.warn(warning)
        if argv is None:  # the process is this command: what the start-up imported lives as long as it does
            gc.freeze()
        with command_line():  # its messages name flags (--store), not Python's keywords (store=)
            code = args.command_object.run(args, session)
        for warning in reg.warnings:  # a plugin's hook that failed while the command ran (once: warn dedups)
            session.warn(warning)
        sys.stdout.flush()
        return code
    except TraceparseError as exc:
        print(f"traceparse: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("traceparse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as exc:  # the file system said no (io.UnsupportedOperation, a bug, is not one)
        if isinstance(exc, io.UnsupportedOperation):
            return _internal(exc)
        # a path, the store, an output: the user can act on it
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"traceparse: error: {one_line(where + (exc.strerror or str(exc)))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: one line unless debugging
        return _internal(exc)


#: The exit status of a program whose output pipe was closed: a shell's for one killed by SIGPIPE (128 + 13).
CLOSED_PIPE = 141


def _closed_pipe() -> int:
    """The reader of stdout went away (``traceparse analyze | head``): nothing more is written (stdout goes to
    the null device, so the interpreter's last flush cannot fail again) and the status says the output was cut:
    not 0, which ``set -o pipefail`` would take for a finished report, nor 1, ``--fail-on``'s verdict."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's buffer): nothing to redirect
        pass
    return CLOSED_PIPE


def _internal(exc: Exception) -> int:
    """A bug, not bad input: one line (exit 3), or the traceback with ``TRACEPARSE_DEBUG`` set."""
    from traceparse.text import one_line

    if os.environ.get("TRACEPARSE_DEBUG"):
        raise exc
    print(f"traceparse: internal error: {type(exc).__name__}: {one_line(str(exc))} "
          "(set TRACEPARSE_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
