"""The commands over the store: ``ingest`` traces into it, ``list`` and ``show`` them, ``rm`` them, ``export`` one.

A run of many ranks (:mod:`traceparse.run`) is stored by ``ingest DIR`` (a
directory of per-rank files) or ``ingest FILES... --run NAME``; ``list``
shows runs beside traces, ``show RUN`` lists its ranks, ``rm RUN`` removes it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.panel import Panel
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


def run_row(run: dict) -> dict:
    """One run of ``list --json``: its id, name, world size, ranks and their trace ids (in rank order)."""
    ranks = sorted(run.get("ranks", {}), key=int)
    return {"id": run["id"], "name": run.get("name"), "world_size": run.get("world_size"),
            "ranks": [int(r) for r in ranks], "traces": [run["ranks"][r] for r in ranks],
            "format": run.get("format"), "backend": run.get("backend"), "events": run.get("event_count"),
            "tags": run.get("tags", {}), "ingested_at": run.get("ingested_at"), "warnings": len(run.get("warnings", []))}


def run_summary(store, run: dict, already_stored: bool = False) -> Panel:
    """The panel ``ingest`` and ``show`` print for a run: its name, world size and one line per rank."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", f"{run['id']}  {run.get('name') or ''}")
    table.add_row("format", run.get("format") or "")
    table.add_row("world size", f"{run.get('world_size')} ({len(run.get('ranks', {}))} ranks stored)")
    if run.get("backend"):
        table.add_row("backend", run["backend"])
    for group in run.get("process_groups") or []:
        table.add_row("process group", f"{group.get('name')} {group.get('desc') or ''} size {group.get('size')}")
    table.add_row("events", f"{run.get('event_count', 0):,}")
    paths = [p for ps in (run.get("source_paths") or {}).values() for p in ps]
    if paths:
        table.add_row("source", os.path.commonpath([str(Path(p).parent) for p in paths]))
    if run.get("tags"):
        table.add_row("tags", " ".join(f"{k}={v}" for k, v in sorted(run["tags"].items())))
    ranks = Table(header_style="bold", box=None, padding=(0, 1))
    for column in ("rank", "trace", "events", "span", "source"):
        ranks.add_column(column)
    for rank in sorted(run.get("ranks", {}), key=int):
        meta = store.rank_meta(run["id"], rank)
        ranks.add_row(rank, meta.id or "", f"{meta.event_count:,}" if meta.event_count is not None else "-",
                      fmt_ns((meta.summary or {}).get("span_ns")), Path(meta.path).name if meta.path else "")
    table.add_row("ranks", ranks)
    for w in run.get("warnings", []):
        table.add_row("[yellow]warning[/yellow]", w)
    title = "already in the store" if already_stored else "ingested"
    return Panel(table, title=f"[bold]{title}[/bold]", expand=False)


class IngestCommand(Command):
    name = "ingest"
    help = "read profiler output into the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """PATH... (files, not store ids), ``--tag`` and the common options."""
        parser.add_argument("paths", nargs="+", metavar="PATH", help="profiler output: a file or a directory")
        self.add_common_options(parser, json=True, fmt=True)
        parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                            help="tag the trace, e.g. batch=16")
        parser.add_argument("--run", metavar="NAME",
                            help="store the paths as one run of many ranks, named NAME (a directory of "
                                 "per-rank files is a run without it, named after the directory)")
        parser.add_argument("--jobs", type=int, metavar="N",
                            help="ranks read at once (default: bounded by the cores and the memory a rank needs; "
                                 "1 reads in this process)")
        parser.add_argument("--scheduler", metavar="ADDRESS",
                            help="read each rank on a Dask cluster: a scheduler address, or local[:N] for a "
                                 "LocalCluster (default: $TRACEPARSE_SCHEDULER, else in-process)")

    def run(self, args: argparse.Namespace, session) -> int:
        """Ingest each path (a rank directory, or all paths with ``--run``, as a run); print each summary or,
        with ``--json``, ``{"traces": [...], "runs": [...]}`` (runs only when there are some)."""
        from traceparse.distributed import scheduler_from

        if args.jobs is not None and args.jobs < 1:
            raise InputError(f"--jobs {args.jobs}: expected a number of processes, at least 1")
        tags = parse_tags(args.tag)
        scheduler = scheduler_from(args.scheduler)
        runs, results = [], []
        if args.run:
            runs.append(session.ingest_run(args.paths, name=args.run, fmt=args.format, tags=tags, jobs=args.jobs,
                                           scheduler=scheduler))
        else:
            singles = []
            for path in args.paths:
                if session.is_run_path(path, args.format):
                    runs.append(session.ingest_run([path], fmt=args.format, tags=tags, jobs=args.jobs,
                                                   scheduler=scheduler))
                else:
                    singles.append(path)
            if singles:
                results = session.ingest(singles, fmt=args.format, tags=tags)
        if args.json:
            doc = {"traces": [dict(r.meta.to_dict(), already_stored=r.already_stored) for r in results]}
            if runs:
                doc["runs"] = [dict(r.run, already_stored=r.already_stored) for r in runs]
            self.print_json(doc)
            return 0
        for r in results:
            session.out.print(trace_summary(r.meta, r.already_stored))
        for r in runs:
            session.out.print(run_summary(session.store, r.run, r.already_stored))
        return 0


class ListCommand(Command):
    name = "list"
    help = "list the traces and runs in the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Only the common options: ``list`` takes no TRACE."""
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """A table of the stored traces and runs, or ``{"store", "traces", "runs"}`` with ``--json``."""
        metas = session.store.all_meta()
        runs = session.store.all_runs()
        if args.json:
            self.print_json({"store": str(session.store.root), "traces": [meta_row(m) for m in metas],
                             "runs": [run_row(r) for r in runs]})
            return 0
        if runs:
            table = Table(header_style="bold", title="runs")
            for column in ("id", "name", "format", "world size", "ranks", "events", "tags"):
                table.add_column(column, overflow="fold")
            for r in map(run_row, runs):
                shown = ", ".join(map(str, r["ranks"][:8])) + (" ..." if len(r["ranks"]) > 8 else "")
                table.add_row(r["id"], r["name"] or "", r["format"] or "", str(r["world_size"]), shown,
                              f"{r['events']:,}" if r["events"] is not None else "-",
                              " ".join(f"{k}={v}" for k, v in r["tags"].items()))
            session.out.print(table)
            if not metas:
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
    help = "show one trace's (or run's) metadata"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One TRACE (or RUN) and the common options."""
        self.add_common_options(parser, traces="1", json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """The trace's summary, or its whole stored metadata with ``--json``; for a run, its ranks
        (``--json``: ``{"run": run metadata, "ranks": [{"rank", "trace", ...rank metadata}]}``)."""
        run_id = None
        if not Path(args.trace).exists():
            kind, ref_id = session.store.resolve(args.trace)
            run_id = ref_id if kind == "run" else None
        elif session.is_run_path(args.trace, args.format):
            run_id = session.ingest_run([args.trace], fmt=args.format).run["id"]
        if run_id is not None:
            run = session.store.run_meta(run_id)
            if args.json:
                ranks = [dict(rank=int(r), trace=run["ranks"][r], **session.store.rank_meta(run_id, r).to_dict())
                         for r in sorted(run["ranks"], key=int)]
                self.print_json({"run": run, "ranks": ranks})
            else:
                session.out.print(run_summary(session.store, run, already_stored=True))
            return 0
        trace = session.resolve(args.trace, fmt=args.format)[0]
        if args.json:
            self.print_json(trace.meta.to_dict())
        else:
            session.out.print(trace_summary(trace.meta, already_stored=True))
        return 0


class RmCommand(Command):
    name = "rm"
    help = "remove traces (or runs) from the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One or more TRACE or RUN ids (or prefixes) and the common options."""
        self.add_common_options(parser, traces="+", json=True,
                                trace_help="store ids (or unique prefixes) of traces or runs")

    def run(self, args: argparse.Namespace, session) -> int:
        """Remove each trace or run; every id is resolved first, so one unknown id removes nothing."""
        ids = [session.store.resolve(ref) for ref in args.traces]
        removed = []
        for kind, trace_id in dict.fromkeys(ids):
            if kind == "run":
                session.store.remove_run(trace_id)
            else:
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
