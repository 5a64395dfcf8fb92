"""What a CLI sub-command is, the options every command shares, and the JSON envelope.

Every sub-command of ``traceparse`` — the built-in ``ingest``, ``analyze``,
``list`` ... as much as a third-party plugin's — is a :class:`Command`
returned by a ``traceparse_commands`` hook. The CLI builds one sub-parser per
command, adds ``--store`` and ``--quiet`` to it, calls
:meth:`Command.configure`, and on the command line's turn calls
:meth:`Command.run`. A command declares its usual options with
:func:`add_common_options` and prints JSON with :func:`print_json` (both
reachable as methods of the command)::

    class CountCommand(Command):
        name = "count"
        help = "count the events of traces"

        def configure(self, parser):
            self.add_common_options(parser, traces="*", json=True, fmt=True)

        def run(self, args, session):
            traces = session.resolve_all(args.traces, fmt=args.format)
            counts = {t.id: t.events.height for t in traces}
            if args.json:
                self.print_json({"counts": counts})
            else:
                session.out.print(counts)
            return 0
"""

from __future__ import annotations

import argparse
import json as _json
import sys
from typing import TYPE_CHECKING, Any, ClassVar

from traceparse.meta import SCHEMA_VERSION

if TYPE_CHECKING:
    from traceparse.session import Session

#: ``traces=`` values of :func:`add_common_options` and the argparse ``nargs`` each stands for.
TRACE_NARGS = {"1": None, "?": "?", "*": "*", "+": "+"}


#: The title of the ``--help`` section that holds the common options, after the command's own.
COMMON_OPTIONS_TITLE = "common options"


def _has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return any(option in action.option_strings for action in parser._actions)


def _common_group(parser: argparse.ArgumentParser):
    for group in parser._action_groups:
        if group.title == COMMON_OPTIONS_TITLE:
            return group
    return parser.add_argument_group(COMMON_OPTIONS_TITLE)


def add_common_options(parser: argparse.ArgumentParser, traces: str | None = None, *, json: bool = True,
                       fmt: bool = False, trace_help: str | None = None) -> None:
    """Add the options commands share to ``parser``, so that every command spells them the same way.

    - ``traces``: the TRACE positional argument(s), each a store id (or a
      unique prefix) or a path: ``"1"`` exactly one (``args.trace``), ``"?"``
      at most one (``args.trace``, None when absent), ``"*"`` any number
      (``args.traces``; commands treat none as the last ingested trace), ``"+"``
      at least one (``args.traces``), None for no TRACE argument.
      ``trace_help`` replaces the default help text.
    - ``json``: ``--json`` (``args.json``): print one JSON document on stdout,
      written with :func:`print_json`.
    - ``fmt``: ``--format NAME`` (``args.format``, default ``auto``): the reader
      for path arguments not yet in the store.
    - always ``--store DIR``, ``-q/--quiet``, ``--width N`` and ``--wide``
      (the screen width tables are laid out for), unless the parser has them
      already. Their default is "not given" (``argparse.SUPPRESS``), so a value
      given before the sub-command's name (``traceparse --store DIR list``)
      is kept and one given after it (``traceparse list --store DIR``) wins.

    The options go in a "common options" section of ``--help``, after the
    command's own; the TRACE arguments with the other positional ones.
    """
    if traces is not None:
        if traces not in TRACE_NARGS:
            raise ValueError(f"traces={traces!r}: expected one of {', '.join(map(repr, TRACE_NARGS))} or None")
        single = traces in ("1", "?")
        default_help = ("store id (or prefix) or path" if single else "store ids (or prefixes) or paths")
        if traces in ("?", "*"):
            default_help += " (default: the last ingested trace)"
        parser.add_argument("trace" if single else "traces", nargs=TRACE_NARGS[traces], metavar="TRACE",
                           help=trace_help or default_help)
    group = _common_group(parser)
    if json:
        group.add_argument("--json", action="store_true",
                           help='print one JSON document on stdout ({"schema_version", "command", ...})')
    if fmt:
        group.add_argument("--format", default="auto", metavar="NAME",
                           help="reader for paths not yet in the store (default: auto-detect; "
                                 "see `traceparse formats`)")
    if not _has_option(parser, "--store"):
        group.add_argument("--store", metavar="DIR", default=argparse.SUPPRESS,
                           help="store directory (default: $TRACEPARSE_STORE or ./.traceparse)")
    if not _has_option(parser, "--quiet"):
        group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                           help="no progress bar or progress messages")
    if not _has_option(parser, "--width"):
        group.add_argument("--width", type=screen_width, metavar="N", default=argparse.SUPPRESS,
                           help="render tables for N columns (default: the terminal's width; 80 when piped)")
    if not _has_option(parser, "--wide"):
        group.add_argument("--wide", action="store_true", default=argparse.SUPPRESS,
                           help=f"render for {WIDE} columns: long names whole where they fit")


#: The width ``--wide`` renders for.
WIDE = 240
#: The narrowest width tables are laid out for.
MIN_WIDTH = 40


#: The widest width tables are laid out for (rich keeps a line of this many cells in memory).
MAX_WIDTH = 10_000


def screen_width(text: str) -> int:
    """``--width N``: a whole number of columns from :data:`MIN_WIDTH` (narrower, no table keeps its names) to
    :data:`MAX_WIDTH`."""
    if not (text.isascii() and text.isdigit()) or not MIN_WIDTH <= int(text) <= MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"expected a whole number of columns from {MIN_WIDTH} to {MAX_WIDTH:,}, "
                                         f"got {text[:40]!r}")
    return int(text)


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """``--gpu NAME``, ``--peak-flops PRECISION=GFLOPS`` (repeatable) and ``--peak-bw GBPS``: the GPU whose peak
    figures a command uses, and peaks given by hand in place of the catalog's (a GPU it lacks, a clock
    locked lower); :func:`gpu_choice` reads them back."""
    parser.add_argument("--gpu", metavar="NAME", help="GPU to take peak figures from, overriding the trace's")
    parser.add_argument("--peak-flops", action="append", type=peak_flops, metavar="PRECISION=GFLOPS",
                        help="a peak by hand, e.g. fp32=19500 or fp16_tensor=312000 (repeatable); replaces the "
                             "catalog's for that precision")
    parser.add_argument("--peak-bw", type=peak_bw, metavar="GBPS",
                        help="the peak DRAM bandwidth by hand, GB/s; replaces the catalog's")


def peak_flops(text: str) -> tuple[str, float]:
    """``--peak-flops PRECISION=GFLOPS`` (:func:`traceparse.catalog.parse_peak_flops`)."""
    from traceparse.catalog import parse_peak_flops

    try:
        return parse_peak_flops(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def peak_bw(text: str) -> float:
    """``--peak-bw GBPS`` (:func:`traceparse.catalog.parse_peak_bw`)."""
    from traceparse.catalog import parse_peak_bw

    try:
        return parse_peak_bw(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def gpu_choice(args: argparse.Namespace):
    """The :class:`traceparse.catalog.GpuChoice` of ``--gpu``, ``--peak-flops`` and ``--peak-bw``; None when
    none is given (the trace's own GPU and the catalog's figures)."""
    from traceparse.catalog import GpuChoice

    choice = GpuChoice(getattr(args, "gpu", None), tuple(getattr(args, "peak_flops", None) or ()),
                       getattr(args, "peak_bw", None))
    return choice if choice else None


def envelope(command: str, data: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of ``command``: ``{"schema_version", "command", **data}``.

    ``schema_version`` (:data:`traceparse.meta.SCHEMA_VERSION`) and
    ``command`` (the sub-command's words, e.g. ``"analyze"`` or ``"predict
    fit"``) come first, so a script can check what it reads; ``data``'s keys
    follow unchanged. ``data`` may carry its own ``schema_version`` (``show``:
    the stored trace's), never its own ``command``.
    """
    if "command" in data:
        raise ValueError(f"{command}: the JSON data has its own 'command' key; that key is the envelope's")
    return {"schema_version": SCHEMA_VERSION, "command": command, **data}


def print_json(command: str, data: dict[str, Any]) -> None:
    """Print ``command``'s result on stdout as one JSON document in the common envelope (see :func:`envelope`).

    Every command's ``--json`` goes through here, so all of them share one
    envelope and one layout (indented by 2; values JSON cannot hold, such as
    dates, are written as strings).
    """
    sys.stdout.write(_json.dumps(envelope(command, data), indent=2, default=str) + "\n")


class Command:
    """Base class of every ``traceparse`` sub-command, built-in or from a plugin.

    Set ``name`` (the sub-command word, unique across plugins) and ``help``
    (one line, shown in ``traceparse --help`` and as the sub-command's
    description); :meth:`configure` adds arguments to the sub-command's
    parser; :meth:`run` does the work and returns the exit status. Raise
    :class:`traceparse.errors.InputError` for bad input: the CLI prints it
    in one line and exits 2. Inside a command, ``self.add_common_options``
    and ``self.print_json`` are the module's functions of those names (the
    latter fills in the command's name).
    """

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add this command's arguments to ``parser``, the usual ones through :func:`add_common_options`.

        ``--store`` and ``--quiet`` are already there: the CLI adds them to every
        sub-command so they work before and after the sub-command's name.
        """

    def run(self, args: argparse.Namespace, session: "Session") -> int:
        """Carry out the command; ``session`` gives the store, trace resolution and the console."""
        raise NotImplementedError

    #: :func:`add_common_options`, reachable as ``self.add_common_options(parser, ...)``.
    add_common_options = staticmethod(add_common_options)
    add_gpu_options = staticmethod(add_gpu_options)

    def print_json(self, data: dict[str, Any], *, command: str | None = None) -> None:
        """:func:`print_json` named after this command (or ``command``, e.g. ``"predict fit"``)."""
        print_json(command or self.name, data)
