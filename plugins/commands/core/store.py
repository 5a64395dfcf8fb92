"""The commands over the store: ``ingest`` traces into it, ``list`` and ``show`` them, ``rm`` them, ``export`` one."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.report import fmt_ns, trace_summary


def parse_tags(values: list[str]) -> dict[str, str]:
    """``--tag KEY=VALUE`` arguments as a dict; a one-line error for one without ``=`` or a key."""
    tags = {}
    for value in values or []:
        key, eq, val = value.partition("=")
        if not eq or not key.strip():
            raise InputError(f"--tag {value!r}: expected KEY=VALUE, e.g. --tag batch=16")
        tags[key.strip()] = val.strip()
    return tags


def meta_row(meta) -> dict:
    """One trace of ``list --json``: its id, where it came from, its tags and a few counts."""
    return {"id": meta.id, "path": meta.path, "paths": meta.source_paths, "format": meta.format,
            "variant": meta.variant, "tags": meta.tags, "events": meta.event_count,
            "span_ns": (meta.summary or {}).get("span_ns"), "ingested_at": meta.ingested_at,
            "devices": [d.name for d in meta.devices], "warnings": len(meta.warnings)}


class IngestCommand(Command):
    name = "ingest"
    help = "read profiler output into the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """PATH... (files, not store ids), ``--tag`` and the common options."""
        parser.add_argument("paths", nargs="+", metavar="PATH", help="profiler output: a file or a directory")
        self.add_common_options(parser, json=True, fmt=True)
        parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                            help="tag the trace, e.g. batch=16")

    def run(self, args: argparse.Namespace, session) -> int:
        """Ingest each path; print each trace's summary or, with ``--json``, its stored metadata."""
        results = session.ingest(args.paths, fmt=args.format, tags=parse_tags(args.tag))
        if args.json:
            self.print_json({"traces": [dict(r.meta.to_dict(), already_stored=r.already_stored)
                                              for r in results]})
            return 0
        for r in results:
            session.out.print(trace_summary(r.meta, r.already_stored))
        return 0


class ListCommand(Command):
    name = "list"
    help = "list the traces in the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Only the common options: ``list`` takes no TRACE."""
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """A table of the stored traces, or ``{"store", "traces"}`` with ``--json``."""
        metas = session.store.all_meta()
        if args.json:
            self.print_json({"store": str(session.store.root), "traces": [meta_row(m) for m in metas]})
            return 0
        if not metas:
            session.out.print(f"The store {session.store.root} is empty.")
            return 0
        table = Table(header_style="bold")
        for column in ("id", "format", "events", "span", "tags", "path"):
            table.add_column(column, overflow="fold")
        for m in metas:
            table.add_row(m.id, m.format or "", f"{m.event_count:,}" if m.event_count is not None else "-",
                          fmt_ns((m.summary or {}).get("span_ns")), " ".join(f"{k}={v}" for k, v in m.tags.items()),
                          m.path or "")
        session.out.print(table)
        return 0


class ShowCommand(Command):
    name = "show"
    help = "show one trace's metadata"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One TRACE and the common options."""
        self.add_common_options(parser, traces="1", json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """The trace's summary, or its whole stored metadata with ``--json``."""
        trace = session.resolve(args.trace, fmt=args.format)[0]
        if args.json:
            self.print_json(trace.meta.to_dict())
        else:
            session.out.print(trace_summary(trace.meta, already_stored=True))
        return 0


class RmCommand(Command):
    name = "rm"
    help = "remove traces from the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One or more TRACE ids (or prefixes) and the common options."""
        self.add_common_options(parser, traces="+", json=True, trace_help="store ids (or unique prefixes)")

    def run(self, args: argparse.Namespace, session) -> int:
        """Remove each trace; every id is resolved first, so one unknown id removes nothing."""
        ids = [session.store.resolve_id(ref) for ref in args.traces]
        removed = []
        for trace_id in dict.fromkeys(ids):
            session.store.remove(trace_id)
            removed.append(trace_id)
            if not args.json:
                session.out.print(f"removed {trace_id}")
        if args.json:
            self.print_json({"removed": removed})
        return 0


class ExportCommand(Command):
    name = "export"
    help = "write a trace in another format"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One TRACE, ``--to`` (an exporter), ``--out`` and the common options."""
        self.add_common_options(parser, traces="1", json=True, fmt=True)
        parser.add_argument("--to", required=True, metavar="FORMAT", help="exporter name (see `traceparse plugins`)")
        parser.add_argument("--out", required=True, metavar="PATH", help="file to write")

    def run(self, args: argparse.Namespace, session) -> int:
        """Write the trace with the exporter ``--to`` names; say what was written (on stderr, or as JSON)."""
        exporters = session.registry.exporters
        if args.to not in exporters:
            raise InputError(f"unknown --to {args.to!r}; known: {', '.join(sorted(exporters))}")
        out = Path(args.out)
        if out.is_dir():
            raise InputError(f"--out {out}: is a directory; expected the path of a file to write")
        if not out.parent.is_dir():
            raise InputError(f"--out {out}: the directory {out.parent} does not exist")
        trace = session.resolve(args.trace, fmt=args.format)[0]
        exporters[args.to].export(trace, out)
        if args.json:
            self.print_json({"trace": trace.id, "to": args.to, "out": str(out), "events": trace.events.height})
        elif not args.quiet:
            session.err.print(f"wrote {out} ({args.to}, {trace.events.height:,} events)")
        return 0
