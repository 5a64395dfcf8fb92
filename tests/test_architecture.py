"""The floors' import rules (docs/architecture.md), checked on the source: a rule that could be broken."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("traceparse_plugins",) + path.relative_to(ROOT / "plugins").parent.parts) \
        if path.is_relative_to(ROOT / "plugins") else "traceparse"
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.add(node.module)
    return names


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", sources("traceparse"), ids=lambda p: p.name)
def test_the_core_and_middle_floor_import_no_plugin(path):
    assert not [m for m in imported_modules(path) if m.startswith("traceparse_plugins")]


@pytest.mark.parametrize("path", sources("plugins/commands") + sources("plugins/predict"), ids=lambda p: p.name)
def test_commands_import_no_rule(path):
    assert not [m for m in imported_modules(path) if m.startswith("traceparse_plugins.rules")]


@pytest.mark.parametrize("path", sources("plugins/rules"), ids=lambda p: p.name)
def test_a_rule_imports_no_other_rule(path):
    own = f"traceparse_plugins.rules.{path.stem}"
    assert not [m for m in imported_modules(path) if m.startswith("traceparse_plugins.rules") and m != own]


@pytest.mark.parametrize("path", sources("plugins/readers"), ids=lambda p: p.name)
def test_readers_convert_decimals_only_through_traceparse_units(path):
    text = path.read_text(encoding="utf-8")
    assert "ROUND_" not in text and "quantize(" not in text, f"{path}: a private decimal rounding"


@pytest.mark.parametrize("path", sources("traceparse"), ids=lambda p: p.name)
def test_the_core_never_branches_on_a_format_name(path):
    """Format knowledge lives in readers: the core may test for a run, never for "tau", "torch", "nsys"..."""
    from traceparse.plugins import registry

    names = set(registry().readers)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            literals = {c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)}
            assert not literals & names, f"{path.name}:{node.lineno} compares with a format name"
