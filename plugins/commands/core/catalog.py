"""The commands that say what is installed: ``rules``, ``formats`` and ``plugins``."""

from __future__ import annotations

import argparse
import re
import textwrap

from rich.table import Table
from rich.text import Text

from traceparse.command import Command
from traceparse.text import literal, markup_literal


def plugin_of(registry, obj) -> str:
    """The name of the plugin (entry point) whose module defines ``obj``'s class; the module when none does."""
    module = type(obj).__module__
    for info in registry.plugins:
        if info.module == module or module.startswith(info.module + "."):
            return info.name
    return module


def rest_to_markdown(text: str) -> str:
    """A rule's definition, written as a docstring (reStructuredText), as Markdown: ````x```` and Sphinx roles
    (``:func:`x```) become code spans, ``x::`` a colon before a literal block, hyperlink references their text."""
    text = re.sub(r":[\w:]+:`~?([^`]+)`", r"`\1`", text)      # :func:`traceparse.measures.x` -> `...`
    text = re.sub(r"``([^`]+)``", r"`\1`", text)                # ``x`` -> `x`
    text = re.sub(r"`([^`<]+?)(?:\s*<[^>]+>)?`_{1,2}", r"\1", text)  # `text <url>`_ -> text
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)
    return text


def rule_markdown(rule) -> str:
    """One rule as a Markdown section: its name, description, the kinds it needs, its thresholds (settable with
    ``--set``) and its definition."""
    thresholds = ", ".join(f"`{k}={v}`" for k, v in rule.thresholds.items()) or "none"
    return (f"## {rule.name}\n\n{rule.description}\n\n"
            f"**Needs:** {', '.join(rule.kinds) or 'any events'}. "
            f"**Thresholds** (`--set {rule.name}.KEY=VALUE`): {thresholds}\n\n"
            + rest_to_markdown(textwrap.dedent(rule.definition or "").strip()) + "\n")


class RulesCommand(Command):
    name = "rules"
    help = "list the analysis rules"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """``--verbose`` and the common options."""
        self.add_common_options(parser, json=True)
        parser.add_argument("-v", "--verbose", action="store_true",
                            help="each rule in full: description, thresholds and definition (as Markdown)")

    def run(self, args: argparse.Namespace, session) -> int:
        """A table of the rules and their thresholds, or ``{"rules": [...]}`` with ``--json``."""
        rules = sorted(session.registry.rules.values(), key=lambda r: r.name)
        if args.json:
            self.print_json({"rules": [
                {"name": r.name, "description": r.description, "kinds": list(r.kinds), "thresholds": r.thresholds,
                 "definition": (r.definition or "").strip(), "plugin": plugin_of(session.registry, r)}
                for r in rules]})
            return 0
        if args.verbose:
            for r in rules:
                from rich.markdown import Markdown  # markdown-it and pygments: only for --full

                session.out.print(Markdown(rule_markdown(r)))
                session.out.print()
            return 0
        table = Table(header_style="bold")
        for column in ("rule", "needs", "thresholds (--set RULE.KEY=VALUE)", "description"):
            table.add_column(column, overflow="fold")
        for r in rules:
            table.add_row(literal(r.name), literal(", ".join(r.kinds)),
                          _lines(f"{k}={v}" for k, v in r.thresholds.items()), literal(r.description))
        session.out.print(table)
        return 0


def _lines(texts) -> Text:
    """Lines of text from plugins (variants, thresholds), each shown literally, one under the other."""
    return Text("\n").join(literal(t) for t in texts)


class FormatsCommand(Command):
    name = "formats"
    help = "list the input formats"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Only the common options."""
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """A table of the readers, or ``{"formats": [...]}`` with ``--json``."""
        readers = sorted(session.registry.readers.values(), key=lambda r: r.name)
        if args.json:
            self.print_json({"formats": [
                {"name": r.name, "description": r.description, "variants": list(r.variants),
                 "patterns": list(r.patterns), "plugin": plugin_of(session.registry, r)} for r in readers]})
            return 0
        table = Table(header_style="bold")
        for column in ("format", "reads", "variants", "files"):
            table.add_column(column, overflow="fold")
        for r in readers:
            table.add_row(literal(r.name), literal(r.description), _lines(r.variants),
                          literal(" ".join(r.patterns)))
        session.out.print(table)
        return 0


class PluginsCommand(Command):
    name = "plugins"
    help = "list installed plugins, their origin and version"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Only the common options."""
        self.add_common_options(parser, json=True)

    def run(self, args: argparse.Namespace, session) -> int:
        """Every plugin with its package, status and what it provides (the table to paste into a bug report)."""
        reg = session.registry
        provided: dict[str, list[str]] = {}
        for kind, table in (("format", reg.readers), ("rule", reg.rules), ("exporter", reg.exporters),
                            ("command", reg.commands)):
            for name, obj in table.items():
                provided.setdefault(plugin_of(reg, obj), []).append(f"{kind} {name}")
        for plugin_name, count in reg.gpu_spec_counts.items():
            provided.setdefault(plugin_name, []).append(f"{count} GPU specs")
        rows = [{"name": p.name, "module": p.module, "distribution": p.distribution, "version": p.version,
                 "origin": "built-in" if p.builtin else "third-party", "status": "broken" if p.broken else "ok",
                 "error": p.error, "provides": provided.get(p.name, [])} for p in reg.plugins]
        if args.json:
            self.print_json({"plugins": rows})
            return 0
        table = Table(header_style="bold")
        for column in ("plugin", "origin", "package", "status", "provides"):
            table.add_column(column, overflow="fold")
        for r in rows:
            status = "[green]ok[/green]" if r["status"] == "ok" else f"[red]broken[/red]: {markup_literal(r['error'])}"
            table.add_row(literal(r["name"]), literal(r["origin"]), literal(f"{r['distribution']} {r['version']}"),
                          status, literal(", ".join(r["provides"])))
        session.out.print(table)
        return 0
