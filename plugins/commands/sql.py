"""Command ``traceparse sql "SELECT ..."``: one read-only SQL query over the store's views.

The views (``events``, ``kernels``, ``copies``, ``api``, ``ops``, ``markers``,
``counters``, ``traces``, ``runs``, ``tags``, ``steps``, ``findings``) are the
core's (:mod:`traceparse.views`, docs/sql.md); this command picks the engine,
narrows the store (``--trace``, ``--run``) and prints the result: a table that
fits the screen, or ``--csv``, ``--json``, ``--parquet FILE`` for all of it,
exactly. A query that fails is one line with the engine's message (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.plugins import hookimpl
from traceparse.report import fitted_table
from traceparse.text import literal
from traceparse.verdict import Column
from traceparse.views import ENGINES, pick_engine, run_query, select

#: Rows of the result drawn as a table (``--rows``); ``--csv``, ``--json`` and ``--parquet`` give every row.
SHOWN_ROWS = 40


class SqlCommand(Command):
    name = "sql"
    help = "run one read-only SQL query over the store's views (docs/sql.md)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """QUERY, ``--trace``, ``--run``, ``--engine``, ``--csv``, ``--parquet``, ``--rows`` and the common options."""
        parser.add_argument("query", metavar="QUERY",
                            help='one SELECT (or WITH ...) statement, e.g. "SELECT name, SUM(duration_ns) AS ns '
                                 'FROM kernels GROUP BY name ORDER BY ns DESC LIMIT 10"')
        parser.add_argument("--trace", action="append", metavar="ID", default=[],
                            help="only this stored trace (id or unique prefix; repeatable)")
        parser.add_argument("--run", action="append", metavar="ID", default=[],
                            help="only this stored run (id, prefix or name; repeatable)")
        parser.add_argument("--engine", choices=ENGINES,
                            help="duckdb (default when installed: pip install 'traceparse[sql]') or polars")
        parser.add_argument("--csv", action="store_true", help="print every row as CSV on stdout")
        parser.add_argument("--parquet", metavar="FILE", help="write every row to FILE as Parquet")
        parser.add_argument("--rows", type=_positive, default=SHOWN_ROWS, metavar="N",
                            help=f"rows drawn in the table (default {SHOWN_ROWS})")
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """Run the query; print its result as asked."""
        chosen = [flag for flag, on in (("--csv", args.csv), ("--json", args.json), ("--parquet", args.parquet))
                  if on]
        if len(chosen) > 1:
            raise InputError(f"{' and '.join(chosen)}: choose one output")
        if args.parquet:
            _check_out(Path(args.parquet), session.store.root)
        engine = pick_engine(args.engine)
        result = run_query(args.query, select(session.store, args.trace, args.run), engine)
        if args.csv:
            sys.stdout.write(_flat(result).write_csv())
        elif args.json:
            self.print_json({"engine": engine, "query": args.query,
                             "columns": [{"name": n, "type": str(t)} for n, t in result.schema.items()],
                             "rows": result.to_dicts()})
        elif args.parquet:
            result.write_parquet(args.parquet)
            session.out.print(literal(f"{result.height:,} rows, {result.width} columns written to {args.parquet}"))
        else:
            _print_table(session.out, result, args.rows)
        return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _check_out(path: Path, store: Path) -> None:
    """``--parquet FILE``: a file in an existing directory, outside the store (which SQL never changes)."""
    if path.is_dir():
        raise InputError(f"--parquet {path}: is a directory; give a file name")
    if not path.parent.resolve().is_dir():
        raise InputError(f"--parquet {path}: no such directory {path.parent}")
    root = store.resolve()
    if root == path.resolve() or root in path.resolve().parents:
        raise InputError(f"--parquet {path}: inside the store {store}, which SQL never changes; write it elsewhere")


def _flat(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with nested values (lists, structs) as JSON text, which CSV can hold."""
    nested = [n for n, t in frame.schema.items() if t.is_nested()]
    if not nested:
        return frame
    return frame.with_columns(pl.Series(n, [None if v is None else json.dumps(v, default=str)
                                            for v in frame[n].to_list()], dtype=pl.String) for n in nested)


def _print_table(console, result: pl.DataFrame, rows: int) -> None:
    """The first ``rows`` rows as a table that fits the screen (numbers never cut, text shown literally), then
    how many rows there are."""
    columns = [Column(n, n, "number" if t.is_numeric() else "text") for n, t in result.schema.items()]
    shown = result.head(rows)
    for part in fitted_table(columns, shown.to_dicts(), console.width, as_written=True):
        console.print(part)
    if result.height == 0:
        console.print(literal("(no rows)", style="dim"))
    elif result.height > shown.height:
        console.print(literal(f"({shown.height} of {result.height:,} rows shown: --rows N for more; --csv, --json "
                              "or --parquet FILE give every row)", style="dim"))
    else:
        console.print(literal(f"({result.height:,} row{'s' if result.height != 1 else ''})", style="dim"))


@hookimpl
def traceparse_commands():
    return [SqlCommand()]
