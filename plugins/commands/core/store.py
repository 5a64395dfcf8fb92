"""The commands over the store: ``ingest`` traces into it, ``list`` and ``show`` them, ``tag`` and ``rm`` them,
``export`` one.

A run of many ranks (:mod:`traceparse.run`) is stored by ``ingest DIR`` (a
directory of per-rank files) or ``ingest FILES... --run NAME``; ``list``
shows runs beside traces, ``show RUN`` lists its ranks, ``rm RUN`` removes it.
``rm`` and ``tag`` take a stored trace's files as well as its id: the files are
grouped into traces as ``ingest`` groups them and found by their content hash
(else by the paths they were ingested from); nothing is read into the store.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.panel import Panel
from rich.table import Table

from traceparse.command import Command
from traceparse.errors import InputError, StoreError
from traceparse.figures import SAME_NS, SAME_SAID, rank_ranges, same_figure
from traceparse.meta import rank_hosts
from traceparse.report import fitted_table, fmt_ns, hosts_line, shown_path, tags_text, trace_summary, warning_count
from traceparse.verdict import Column
from traceparse.text import literal, markup_literal


def parse_tags(values: list[str]) -> dict[str, str]:
    """``--tag KEY=VALUE`` arguments as a dict; a one-line error for one without ``=`` or a key."""
    tags = {}
    for value in values or []:
        key, eq, val = value.partition("=")
        if not eq or not key.strip():
            raise InputError(f"--tag {value!r}: expected KEY=VALUE, e.g. --tag batch=16")
        tags[key.strip()] = val.strip()
    return tags


def parse_tag_edits(values: list[str]) -> tuple[dict[str, str], list[str]]:
    """``KEY=VALUE`` arguments of ``tag`` as (tags to set, keys to remove: ``KEY=`` with no value)."""
    tags, remove = {}, []
    for value in values:
        key, eq, val = value.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or not key:
            raise InputError(f"{value!r}: expected KEY=VALUE (or KEY= to remove a tag), e.g. batch=16")
        if val:
            tags[key] = val
            remove = [k for k in remove if k != key]
        else:
            remove.append(key)
            tags.pop(key, None)
    return tags, remove


def stored_refs(session, refs: list[str], fmt: str = "auto") -> list[tuple[str, str]]:
    """``("trace", id)`` or ``("run", id)`` for each TRACE argument of ``rm`` and ``tag``, without ingesting:
    store ids (or prefixes, or run names) as :meth:`Store.resolve` gives them; existing paths grouped into
    traces as ``ingest`` groups them (the reports of one nsys capture are one trace) and found by content
    hash, else by the paths their trace was ingested from; a rank directory as the run read from it. A path
    that no stored trace came from is a one-line error."""
    from traceparse.ingest import plan
    from traceparse.sources import sha256_of
    from traceparse.store import trace_id_for

    out: list[tuple[str, str]] = []
    paths = [Path(r) for r in refs if Path(r).exists()]
    for ref in refs:
        if not Path(ref).exists():
            out.append(session.store.resolve(ref))
    files = []
    for path in paths:
        if session.is_run_path(path, fmt):
            out.append(("run", _run_from(session.store, path)))
        else:
            files.append(path)
    if files:
        for _, group in plan(files, fmt, session.registry):
            trace_id = trace_id_for(sha256_of(group))
            if not session.store.has(trace_id):
                trace_id = _trace_from(session.store, group)
            out.append(("trace", trace_id))
    return out


def _same_file(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _trace_from(store, group: list[Path]) -> str:
    """The stored trace ingested from exactly the files of ``group`` (their content has changed since)."""
    partial = None
    for meta in store.all_meta():
        found = [g for g in group if any(_same_file(p, g) for p in meta.source_paths)]
        if len(found) == len(group) == len(meta.source_paths):
            return meta.id
        if found and partial is None:
            partial = meta
    label = str(group[0]) + (f" (+{len(group) - 1} files)" if len(group) > 1 else "")
    if partial is not None:
        raise StoreError(f"{label}: part of the stored trace {partial.id}, which was read from "
                         f"{len(partial.source_paths)} files together; name all of them, or the id")
    raise StoreError(f"{label}: not in the store {store.root} (no stored trace was read from it); "
                     "`traceparse list` shows what is stored")


def _run_from(store, directory: Path) -> str:
    """The stored run read from the rank directory ``directory``."""
    for run in store.all_runs():
        paths = [p for ps in (run.get("source_paths") or {}).values() for p in ps]
        if paths and all(directory.resolve() in Path(p).resolve().parents for p in paths):
            return run["id"]
    raise StoreError(f"{directory}: not in the store {store.root} (no stored run was read from it); "
                     "`traceparse list` shows what is stored")


def _read_again(result) -> str | None:
    """The title of an ingest whose content was stored as another reader, or another release of its reader, read
    it (:attr:`traceparse.ingest.IngestResult.replaced`): that reading was replaced."""
    return f"ingested again: the store had it as read by {result.replaced}" if result.replaced else None


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


def run_summary(store, run: dict, already_stored: bool = False, title: str | None = None,
                warnings: bool = True) -> Panel:
    """The panel ``ingest`` and ``show`` print for a run: its name, world size and one line per rank (a run of
    more than :data:`RANKS_LISTED` ranks: their number, the spread of their events and spans, and the notable
    ranks, :func:`notable_ranks`); titled ``title``, else "ingested" or "already in the store"; the warnings in
    full, or (``warnings`` false: they were just printed on stderr) their number."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", literal(f"{run['id']}  {run.get('name') or ''}"))
    table.add_row("format", literal(run.get("format") or ""))
    table.add_row("world size", literal(f"{run.get('world_size')} ({len(run.get('ranks', {}))} ranks stored)"))
    if run.get("backend"):
        table.add_row("backend", literal(run["backend"]))
    for group in run.get("process_groups") or []:
        table.add_row("process group",
                      literal(f"{group.get('name')} {group.get('desc') or ''} size {group.get('size')}"))
    table.add_row("events", f"{run.get('event_count', 0):,}")
    paths = [p for ps in (run.get("source_paths") or {}).values() for p in ps]
    if paths:
        table.add_row("source", literal(os.path.commonpath([str(Path(p).parent) for p in paths])))
    if run.get("tags"):
        table.add_row("tags", tags_text(run["tags"]))
    metas = {int(rank): store.rank_meta(run["id"], rank) for rank in run.get("ranks", {})}
    on = rank_hosts(metas)
    if on:
        table.add_row("hosts", literal(hosts_line(on, len(metas))))
    if len(metas) <= RANKS_LISTED:
        table.add_row("ranks", _rank_table({rank: "" for rank in sorted(metas)}, metas))
    else:
        table.add_row("ranks", literal(f"{len(metas):,} ({rank_ranges(list(metas))})"))
        events = [m.event_count for m in metas.values() if m.event_count is not None]
        spans = [s for m in metas.values() if (s := (m.summary or {}).get("span_ns")) is not None]
        spread = ([f"events {_spread(events, lambda n: f'{n:,}')}"] if events else []) + (
            [f"span {_spread(spans, fmt_ns, SAME_NS)}"] if spans else [])
        if spread:
            table.add_row("per rank", literal("; ".join(spread)))
        notable = notable_ranks(metas)
        if notable:
            table.add_row("notable", _rank_table(notable, metas))
        else:
            table.add_row("notable", literal(_none_notable(events, spans)))
        table.add_row("", literal(f"`traceparse show {run['id']} --json` lists all {len(metas):,} ranks"))
    if warnings or not run.get("warnings"):
        for w in run.get("warnings", []):
            table.add_row("[yellow]warning[/yellow]", literal(w))
    else:
        table.add_row("[yellow]warnings[/yellow]", warning_count(len(run["warnings"])))
    title = title or ("already in the store" if already_stored else "ingested")
    return Panel(table, title=f"[bold]{markup_literal(title)}[/bold]", expand=False)


#: A run of at most this many ranks has one line per rank in its panel; a larger one a summary and its notable ranks.
RANKS_LISTED = 20
#: How many ranks each reason picks for the panel of a large run (:func:`notable_ranks`).
NOTABLE_EACH = 3


def notable_ranks(metas: dict) -> dict[int, str]:
    """The ranks a large run's panel shows, each with why: the longest spans (the slowest ranks), the most and
    the fewest events, and ranks with warnings; at most :data:`NOTABLE_EACH` for each reason, in rank order.

    Only ranks beyond the median by more than noise are picked for a reason (:func:`same_figure`: a span 1 ns
    over the median, or within 0.1% of it, is no longer; ranks that all agree: nothing stands out).
    """
    why: dict[int, list[str]] = {}

    def pick(value, reason: str, reverse: bool, floor: float = 0) -> None:
        known = {r: v for r, m in metas.items() if (v := value(m)) is not None}
        if not known:
            return
        median = sorted(known.values())[(len(known) - 1) // 2]
        beyond = [r for r, v in known.items()
                  if (v > median if reverse else v < median) and not same_figure(v, median, floor)]
        for rank in sorted(beyond, key=lambda r: ((-known[r] if reverse else known[r]), r))[:NOTABLE_EACH]:
            why.setdefault(rank, []).append(reason)

    pick(lambda m: (m.summary or {}).get("span_ns"), "longest span", True, SAME_NS)
    pick(lambda m: m.event_count, "most events", True)
    pick(lambda m: m.event_count, "fewest events", False)
    for rank in [r for r in sorted(metas) if metas[r].warnings][:NOTABLE_EACH]:
        n = len(metas[rank].warnings)
        why.setdefault(rank, []).append(f"{n} warning{'s' if n != 1 else ''}")
    return {rank: ", ".join(why[rank]) for rank in sorted(why)}


def _none_notable(events: list[int], spans: list[int]) -> str:
    """Why a large run's panel names no rank (:func:`notable_ranks` picked none): all alike, or none far enough
    beyond the median."""
    alike = all(same_figure(min(v), max(v), floor) for v, floor in ((events, 0), (spans, SAME_NS)) if v)
    if alike:
        return f"none: every rank's span and event count alike ({SAME_SAID})"
    return "none: no rank's span longer, nor its event count further from the median, by over 0.1%"


def _spread(values: list[int], fmt, floor: float = 0) -> str:
    """``4 each`` when the values agree, ``151.7 ms each (within 0.1%)`` when they differ by noise only
    (:func:`same_figure`), else ``3 to 10, median 4`` (the lower median)."""
    low, high = min(values), max(values)
    if low == high:
        return f"{fmt(low)} each"
    if same_figure(low, high, floor):
        return f"{fmt(low)} each ({SAME_SAID})" if fmt(low) == fmt(high) else f"{fmt(low)} to {fmt(high)} ({SAME_SAID})"
    return f"{fmt(low)} to {fmt(high)}, median {fmt(sorted(values)[(len(values) - 1) // 2])}"


def _rank_table(ranks: dict[int, str], metas: dict) -> Table:
    """One line per rank of ``ranks`` (rank -> why it is shown; a column only when one says)."""
    table = Table(header_style="bold", box=None, padding=(0, 1))
    on = rank_hosts({rank: metas[rank] for rank in ranks})
    several = len(set(rank_hosts(metas).values())) > 1  # one host for all: the panel's hosts line says it once
    columns = (("rank", "trace", "events", "span") + (("host",) if several and on else ()) + ("source",)
               + (("why",) if any(ranks.values()) else ()))
    for column in columns:
        table.add_column(column)
    for rank, why in ranks.items():
        meta = metas[rank]
        row = [literal(str(rank)), literal(meta.id or ""),
               f"{meta.event_count:,}" if meta.event_count is not None else "-",
               fmt_ns((meta.summary or {}).get("span_ns"))]
        if "host" in columns:
            row.append(literal(on.get(str(rank), "-")))
        row.append(literal(Path(meta.path).name if meta.path else ""))
        table.add_row(*row, *((literal(why),) if "why" in columns else ()))
    return table


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
        from traceparse.sources import FileHashes

        if args.jobs is not None and args.jobs < 1:
            raise InputError(f"--jobs {args.jobs}: expected a number of processes, at least 1")
        tags = parse_tags(args.tag)
        # the files' hashes are worked out while the readers and their libraries are imported
        ahead = FileHashes([] if args.run else [Path(p) for p in args.paths])
        try:
            runs, results = self._ingest(args, session, tags, ahead)
        finally:
            ahead.close()
        if args.json:
            doc = {"traces": [dict(r.meta.to_dict(), already_stored=r.already_stored, replaced=r.replaced)
                              for r in results]}
            if runs:
                doc["runs"] = [dict(r.run, already_stored=r.already_stored, replaced=r.replaced) for r in runs]
            self.print_json(doc)
            return 0
        # the warnings were printed on stderr as the traces were read: the panels count them, not say them again
        for r in results:
            session.out.print(trace_summary(r.meta, r.already_stored, title=_read_again(r), warnings=r.already_stored,
                                            width=session.out.width))
        for r in runs:
            session.out.print(run_summary(session.store, r.run, r.already_stored, title=_read_again(r),
                                          warnings=r.already_stored))
        return 0

    @staticmethod
    def _ingest(args: argparse.Namespace, session, tags: dict[str, str], ahead) -> tuple[list, list]:
        """The runs and the single traces of the paths, ingested."""
        from traceparse.distributed import scheduler_from

        scheduler = scheduler_from(args.scheduler)
        runs, results = [], []
        if args.run:
            result = session.ingest_run(args.paths, name=args.run, fmt=args.format, tags=tags, jobs=args.jobs,
                                        scheduler=scheduler)
            runs.extend(result.windows or [result])  # a run per profiling window, where the ranks have several
            return runs, results
        singles = []
        for path in args.paths:
            if session.is_run_path(path, args.format):
                result = session.ingest_run([path], fmt=args.format, tags=tags, jobs=args.jobs, scheduler=scheduler)
                runs.extend(result.windows or [result])
            else:
                singles.append(path)
        if singles:
            results = session.ingest(singles, fmt=args.format, tags=tags, ahead=ahead)
        return runs, results


#: ``list``'s tables: ids and counts never cut; a long name or path cut in the middle, with a key below.
RUN_COLUMNS = [Column("id", "id", "id"), Column("name", "name", "name"), Column("format", "format", "id"),
               Column("world_size", "world size", "count"), Column("ranks", "ranks", "text"),
               Column("events", "events", "count"), Column("tags", "tags", "text")]
TRACE_COLUMNS = [Column("id", "id", "id"), Column("format", "format", "id"), Column("events", "events", "count"),
                 Column("span_ns", "span", "ns"), Column("path", "path", "name"), Column("tags", "tags", "text")]


def _filled(columns: list[Column], rows: list[dict]) -> list[Column]:
    """The columns with something to show (no tags column where nothing is tagged: its room goes to the paths)."""
    return [c for c in columns if c.key != "tags" or any(r.get("tags") for r in rows)]


class ListCommand(Command):
    name = "list"
    help = "list the traces and runs in the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Only the common options: ``list`` takes no TRACE."""
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """A table of the stored traces and runs, or ``{"store", "traces", "runs", "damaged"}`` with ``--json``;
        entries whose metadata cannot be read are listed as damaged, each with the ``rm`` that removes it."""
        metas = session.store.all_meta()
        runs = session.store.all_runs()
        damaged = session.store.damaged()
        if args.json:
            self.print_json({"store": str(session.store.root), "traces": [meta_row(m) for m in metas],
                             "runs": [run_row(r) for r in runs],
                             "damaged": [{"id": d.id, "kind": d.kind, "path": str(d.path), "error": d.reason}
                                         for d in damaged]})
            return 0
        self._damaged(session, damaged)
        width = session.out.width
        if runs:
            rows = [{**r, "ranks": rank_ranges(r["ranks"]),
                     "tags": " ".join(f"{k}={v}" for k, v in r["tags"].items())} for r in map(run_row, runs)]
            for part in fitted_table(_filled(RUN_COLUMNS, rows), rows, width, title="runs"):
                session.out.print(part)
            if not metas:
                return 0
        if not metas:
            empty = f"The store {session.store.root} is empty." if session.store.root.is_dir() else \
                f"No store at {session.store.root}: ingest a trace first, or give --store."
            session.out.print(literal(empty))
            return 0
        rows = [{"id": m.id, "format": m.format or "", "events": m.event_count,
                 "span_ns": (m.summary or {}).get("span_ns"), "tags": " ".join(f"{k}={v}" for k, v in m.tags.items()),
                 "path": shown_path(m.path)} for m in metas]
        for part in fitted_table(_filled(TRACE_COLUMNS, rows), rows, width, title="traces" if runs else None):
            session.out.print(part)
        return 0

    @staticmethod
    def _damaged(session, damaged: list) -> None:
        """One line per damaged entry on stdout (it is part of what is stored), with how to remove it."""
        for d in damaged:
            session.out.print(literal(f"damaged {d.kind} {d.id}: {d.path} cannot be read ({d.reason}); "
                                      f"`traceparse rm {d.id}` removes it"), style="yellow", soft_wrap=True)


class ShowCommand(Command):
    name = "show"
    help = "show one trace's (or run's) metadata"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One TRACE (or RUN; default: the last ingested) and the common options."""
        self.add_common_options(parser, traces="?", json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """The trace's summary, or its whole stored metadata with ``--json``; for a run, its ranks
        (``--json``: ``{"run": run metadata, "ranks": [{"rank", "trace", ...rank metadata}]}``)."""
        run_id = None
        if args.trace is None:  # as analyze: the trace (or run) ingested last
            args.trace = session.store.last_id()
        if not Path(args.trace).exists() and session.store.matches(args.trace):
            kind, ref_id = session.store.resolve(args.trace)
            run_id = ref_id if kind == "run" else None  # else a trace, or one rank of a run (resolve_one, below)
        elif session.is_run_path(args.trace, args.format):
            result = session.ingest_run([args.trace], fmt=args.format)
            if result.windows:  # a run per profiling window: which one is the user's to say
                raise InputError(f"{args.trace}: show takes one trace or run; this makes {len(result.windows):,} "
                                 f"({', '.join(r.run['id'] for r in result.windows)}): name one by its id")
            run_id = result.run["id"]
        if run_id is not None:
            run = session.store.run_meta(run_id)
            if args.json:
                ranks = [dict(rank=int(r), trace=run["ranks"][r], **session.store.rank_meta(run_id, r).to_dict())
                         for r in sorted(run["ranks"], key=int)]
                self.print_json({"run": run, "ranks": ranks})
            else:
                session.out.print(run_summary(session.store, run, title="stored run"))
            return 0
        trace = session.resolve_one(args.trace, args.format, "show")
        if args.json:
            self.print_json(trace.meta.to_dict())
        else:
            session.out.print(trace_summary(trace.meta, title="stored trace", width=session.out.width))
        return 0


class RmCommand(Command):
    name = "rm"
    help = "remove traces (or runs) from the store"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """One or more TRACE or RUN ids (or prefixes, or the files a trace was ingested from), ``--format`` and
        the common options."""
        self.add_common_options(parser, traces="+", json=True, fmt=True,
                                trace_help="store ids (or unique prefixes) of traces or runs, or the files they "
                                           "were ingested from")

    def run(self, args: argparse.Namespace, session) -> int:
        """Remove each trace or run; every argument is resolved first, so one unknown removes nothing."""
        ids = stored_refs(session, args.traces, args.format)
        removed = []
        for kind, trace_id in dict.fromkeys(ids):
            if kind == "run":
                session.store.remove_run(trace_id)
            else:
                session.store.remove(trace_id)
            removed.append(trace_id)
            if not args.json:
                session.out.print(literal(f"removed {trace_id}"))
        if args.json:
            self.print_json({"removed": removed})
        return 0


class TagCommand(Command):
    name = "tag"
    help = "set or remove tags of a stored trace (or run) without reading it again"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """TRACE... KEY=VALUE... (``KEY=`` removes a tag), ``--format`` and the common options."""
        parser.usage = "%(prog)s [options] TRACE... KEY=VALUE..."
        parser.add_argument("items", nargs="+", metavar="TRACE... KEY=VALUE...",
                            help="the trace: a store id (or unique prefix) of a trace or run, or the file(s) it was "
                                 "ingested from; then the tags: KEY=VALUE sets KEY, KEY= removes it")
        self.add_common_options(parser, json=True, fmt=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """Update the tags in place; print the trace's tags after the change (``--json``: id, kind, tags)."""
        split = len(args.items)
        while split > 0 and "=" in args.items[split - 1] and not Path(args.items[split - 1]).exists():
            split -= 1
        refs, edits = args.items[:split], args.items[split:]
        if not refs or not edits:
            raise InputError("tag: expected TRACE then KEY=VALUE (or KEY= to remove a tag), "
                             "e.g. traceparse tag resnet18_bs16.json.gz batch=16")
        tags, remove = parse_tag_edits(edits)
        found = list(dict.fromkeys(stored_refs(session, refs, args.format)))
        if len(found) != 1:
            raise InputError(f"{' '.join(refs)}: names {len(found)} stored traces or runs; tag one at a time")
        kind, ref_id = found[0]
        if kind == "run":
            now = session.store.update_run_tags(ref_id, tags, remove).get("tags", {})
        else:
            now = session.store.update_tags(ref_id, tags, remove).tags
        if args.json:
            self.print_json({"id": ref_id, "kind": kind, "tags": now})
        else:
            shown = " ".join(f"{k}={v}" for k, v in now.items()) or "(no tags)"
            session.out.print(literal(f"{kind} {ref_id}: {shown}"))
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
        trace = session.resolve_one(args.trace, args.format, "export")
        exporters[args.to].export(trace, out)
        if args.json:
            self.print_json({"trace": trace.id, "to": args.to, "out": str(out), "events": trace.events.height})
        elif not args.quiet:
            session.err.print(literal(f"wrote {out} ({args.to}, {trace.events.height:,} events)"))
        return 0
