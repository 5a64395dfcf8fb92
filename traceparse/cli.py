"""The ``traceparse`` command line: a parser built from the registry's commands, the top-level options, exit codes.

Every sub-command, built-in or not, is a :class:`traceparse.command.Command`
from a plugin's ``traceparse_commands`` hook; this module knows none of them
by name. Exit codes: what the command returns (0, or 1 for ``analyze
--fail-on``), 2 for bad input or usage, 3 for an internal error, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from traceparse import __version__
from traceparse.command import WIDE, add_common_options, screen_width
from traceparse.errors import TraceparseError
from traceparse.plugins import Registry, registry
from traceparse.session import Session
from traceparse.text import one_line  # noqa: F401 - re-exported: the CLI's one-line messages


def build_parser(reg: Registry) -> argparse.ArgumentParser:
    """The ``traceparse`` parser: the top-level options and one sub-parser per command of ``reg``.

    Sub-commands are listed in the registry's order (the core commands first).
    Each gets ``--store`` and ``--quiet`` before its own :meth:`configure`, so
    those two work after the sub-command's name for every command, whether or
    not it calls :func:`traceparse.command.add_common_options`.
    """
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
    for name, command in reg.commands.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        add_common_options(p, json=False)
        command.configure(p)
        p.set_defaults(command_object=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traceparse`` console script."""
    try:
        reg = registry()
        parser = build_parser(reg)
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        width = args.width or (WIDE if args.wide else None)
        session = Session(store=args.store, quiet=args.quiet, reg=reg, width=width)
        for warning in reg.warnings:
            session.warn(warning)
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
        return 0
    except OSError as exc:  # the file system said no (io.UnsupportedOperation, a bug, is not one)
        if isinstance(exc, io.UnsupportedOperation):
            return _internal(exc)
        # a path, the store, an output: the user can act on it
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"traceparse: error: {one_line(where + (exc.strerror or str(exc)))}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: one line unless debugging
        return _internal(exc)


def _internal(exc: Exception) -> int:
    """A bug, not bad input: one line (exit 3), or the traceback with ``TRACEPARSE_DEBUG`` set."""
    if os.environ.get("TRACEPARSE_DEBUG"):
        raise exc
    print(f"traceparse: internal error: {type(exc).__name__}: {one_line(str(exc))} "
          "(set TRACEPARSE_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
