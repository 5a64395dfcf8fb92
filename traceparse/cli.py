"""The ``traceparse`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from traceparse import __version__
from traceparse.analysis import analyze, parse_settings, worst_severity
from traceparse.errors import InputError, TraceparseError
from traceparse.report import render_findings, trace_summary
from traceparse.rule import SEVERITIES, severity_rank
from traceparse.schema import SCHEMA_VERSION
from traceparse.session import Session


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--store", metavar="DIR", default=default,
                        help="store directory (default: $TRACEPARSE_STORE or ./.traceparse)")
    parser.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="no progress bar")


def _parse_tags(values: list[str]) -> dict[str, str]:
    tags = {}
    for value in values or []:
        key, eq, val = value.partition("=")
        if not eq or not key.strip():
            raise InputError(f"--tag {value!r}: expected KEY=VALUE, e.g. --tag batch=16")
        tags[key.strip()] = val.strip()
    return tags


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


# -- commands ---------------------------------------------------------------
def cmd_ingest(args, session: Session) -> int:
    results = session.ingest(args.paths, fmt=args.format, tags=_parse_tags(args.tag))
    if args.json:
        _print_json({"traces": [dict(r.meta.to_dict(), already_stored=r.already_stored) for r in results]})
        return 0
    for r in results:
        session.out.print(trace_summary(r.meta, r.already_stored))
    return 0


def cmd_analyze(args, session: Session) -> int:
    settings = parse_settings(args.set or [], session.registry)
    for name in args.rule or []:
        session.registry.rule(name)  # unknown rule names fail before any work
    traces = session.resolve_all(args.traces, fmt=args.format)
    findings = []
    for trace in traces:
        findings.extend(analyze(trace, rules=args.rule, settings=settings, gpu=args.gpu, reg=session.registry))
    if args.json:
        _print_json({
            "schema_version": SCHEMA_VERSION,
            "traces": [{"id": t.id, "path": t.meta.path, "format": t.meta.format, "tags": t.meta.tags}
                       for t in traces],
            "findings": [f.to_dict() for f in findings],
        })
    else:
        render_findings(session.out, findings, {t.id: t.meta for t in traces})
    worst = worst_severity(findings)
    if args.fail_on and worst and severity_rank(worst) >= severity_rank(args.fail_on):
        return 1
    return 0


def _meta_row(meta) -> dict:
    return {"id": meta.id, "path": meta.path, "paths": meta.source_paths, "format": meta.format,
            "variant": meta.variant, "tags": meta.tags, "events": meta.event_count,
            "span_ns": (meta.summary or {}).get("span_ns"), "ingested_at": meta.ingested_at,
            "devices": [d.name for d in meta.devices], "warnings": len(meta.warnings)}


def cmd_list(args, session: Session) -> int:
    metas = session.store.all_meta()
    if args.json:
        _print_json({"store": str(session.store.root), "traces": [_meta_row(m) for m in metas]})
        return 0
    if not metas:
        session.out.print(f"The store {session.store.root} is empty.")
        return 0
    table = Table(header_style="bold")
    for column in ("id", "format", "events", "span", "tags", "path"):
        table.add_column(column, overflow="fold")
    from traceparse.report import fmt_ns

    for m in metas:
        table.add_row(m.id, m.format or "", f"{m.event_count:,}" if m.event_count is not None else "-",
                      fmt_ns((m.summary or {}).get("span_ns")), " ".join(f"{k}={v}" for k, v in m.tags.items()),
                      m.path or "")
    session.out.print(table)
    return 0


def cmd_show(args, session: Session) -> int:
    trace = session.resolve(args.trace)[0]
    if args.json:
        _print_json(trace.meta.to_dict())
    else:
        session.out.print(trace_summary(trace.meta, already_stored=True))
    return 0


def cmd_rm(args, session: Session) -> int:
    for ref in args.traces:
        trace_id = session.store.resolve_id(ref)
        session.store.remove(trace_id)
        session.out.print(f"removed {trace_id}")
    return 0


def cmd_rules(args, session: Session) -> int:
    rules = sorted(session.registry.rules.values(), key=lambda r: r.name)
    if args.json:
        _print_json({"rules": [{"name": r.name, "description": r.description, "kinds": list(r.kinds),
                                "thresholds": r.thresholds, "definition": (r.definition or "").strip(),
                                "plugin": _plugin_of(session, r)} for r in rules]})
        return 0
    table = Table(header_style="bold")
    for column in ("rule", "needs", "thresholds (--set RULE.KEY=VALUE)", "description"):
        table.add_column(column, overflow="fold")
    for r in rules:
        table.add_row(r.name, ", ".join(r.kinds), "\n".join(f"{k}={v}" for k, v in r.thresholds.items()),
                      r.description + ("\n\n" + (r.definition or "").strip() if args.verbose else ""))
    session.out.print(table)
    return 0


def cmd_formats(args, session: Session) -> int:
    readers = sorted(session.registry.readers.values(), key=lambda r: r.name)
    if args.json:
        _print_json({"formats": [{"name": r.name, "description": r.description, "variants": list(r.variants),
                                  "patterns": list(r.patterns), "plugin": _plugin_of(session, r)} for r in readers]})
        return 0
    table = Table(header_style="bold")
    for column in ("format", "reads", "variants", "files"):
        table.add_column(column, overflow="fold")
    for r in readers:
        table.add_row(r.name, r.description, "\n".join(r.variants), " ".join(r.patterns))
    session.out.print(table)
    return 0


def _plugin_of(session: Session, obj) -> str:
    module = type(obj).__module__
    for info in session.registry.plugins:
        if info.module == module or module.startswith(info.module + "."):
            return info.name
    return module


def cmd_plugins(args, session: Session) -> int:
    reg = session.registry
    provided: dict[str, list[str]] = {}
    for kind, table in (("format", reg.readers), ("rule", reg.rules), ("exporter", reg.exporters),
                        ("command", reg.commands)):
        for name, obj in table.items():
            provided.setdefault(_plugin_of(session, obj), []).append(f"{kind} {name}")
    for plugin_name, count in reg.gpu_spec_counts.items():
        provided.setdefault(plugin_name, []).append(f"{count} GPU specs")
    rows = [{"name": p.name, "module": p.module, "distribution": p.distribution, "version": p.version,
             "origin": "built-in" if p.builtin else "third-party", "status": "broken" if p.broken else "ok",
             "error": p.error, "provides": provided.get(p.name, [])} for p in reg.plugins]
    if args.json:
        _print_json({"plugins": rows})
        return 0
    table = Table(header_style="bold")
    for column in ("plugin", "origin", "package", "status", "provides"):
        table.add_column(column, overflow="fold")
    for r in rows:
        status = "[green]ok[/green]" if r["status"] == "ok" else f"[red]broken[/red]: {r['error']}"
        table.add_row(r["name"], r["origin"], f"{r['distribution']} {r['version']}", status, ", ".join(r["provides"]))
    session.out.print(table)
    return 0


def cmd_export(args, session: Session) -> int:
    exporters = session.registry.exporters
    if args.to not in exporters:
        raise InputError(f"unknown --to {args.to!r}; known: {', '.join(sorted(exporters))}")
    trace = session.resolve(args.trace)[0]
    out = Path(args.out)
    exporters[args.to].export(trace, out)
    if not args.quiet:
        session.err.print(f"wrote {out} ({args.to}, {trace.events.height:,} events)")
    return 0


# -- parser -----------------------------------------------------------------
def build_parser(session_registry=None) -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(
        prog="traceparse",
        description="Read GPU and deep-learning profiler output into one event table and analyse it.",
    )
    parser.add_argument("--version", action="version", version=f"traceparse {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    _common(common, top=False)

    def add(name, help_text):
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    p = add("ingest", "read profiler output into the store")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--format", default="auto", help="reader to use (default: auto-detect; see `traceparse formats`)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag the trace, e.g. batch=16")
    p.add_argument("--json", action="store_true", help="print the stored metadata as JSON")
    p.set_defaults(func=cmd_ingest)

    p = add("analyze", "run rules on traces (default: the last ingested)")
    p.add_argument("traces", nargs="*", metavar="TRACE", help="store id (or prefix) or path")
    p.add_argument("--rule", action="append", metavar="NAME", help="run only this rule (repeatable)")
    p.add_argument("--set", action="append", metavar="RULE.PARAM=VALUE", help="override a rule threshold")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--fail-on", choices=SEVERITIES, help="exit 1 if a finding at or above this severity exists")
    p.add_argument("--gpu", metavar="NAME", help="GPU to take peak figures from, overriding the trace's")
    p.add_argument("--format", default="auto", help="reader for PATH arguments not yet in the store")
    p.set_defaults(func=cmd_analyze)

    p = add("list", "list the traces in the store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = add("show", "show one trace's metadata")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    p = add("rm", "remove traces from the store")
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.set_defaults(func=cmd_rm)

    p = add("rules", "list the analysis rules")
    p.add_argument("--json", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true", help="include each rule's definition")
    p.set_defaults(func=cmd_rules)

    p = add("formats", "list the input formats")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_formats)

    p = add("plugins", "list installed plugins, their origin and version")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    p = add("export", "write a trace in another format")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--to", required=True, metavar="FORMAT", help="exporter name (see `traceparse plugins`)")
    p.add_argument("--out", required=True, metavar="PATH")
    p.set_defaults(func=cmd_export)

    plugin_commands = {}
    if session_registry is not None:
        for name, command in session_registry.commands.items():
            if name in sub.choices:
                session_registry.warnings.append(f"plugin command {name!r} clashes with a built-in; skipped")
                continue
            p = add(name, command.help)
            command.configure(p)
            p.set_defaults(func=None, plugin_command=command)
            plugin_commands[name] = command
    return parser, plugin_commands


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traceparse`` console script."""
    from traceparse.plugins import registry

    try:
        reg = registry()
        parser, _ = build_parser(reg)
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        session = Session(store=args.store, quiet=args.quiet, reg=reg)
        for warning in reg.warnings:
            session.warn(warning)
        command = getattr(args, "plugin_command", None)
        code = command.run(args, session) if command else args.func(args, session)
        sys.stdout.flush()
        return code
    except TraceparseError as exc:
        print(f"traceparse: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("traceparse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug, not bad input: one line unless debugging
        if os.environ.get("TRACEPARSE_DEBUG"):
            raise
        print(f"traceparse: internal error: {type(exc).__name__}: {exc} "
              "(set TRACEPARSE_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
