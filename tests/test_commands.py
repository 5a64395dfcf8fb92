"""Contract tests over every sub-command in the registry: help, the common options, the JSON envelope.

A new command (built-in or from a plugin) is checked here without a new test:
it needs a help text, a working ``--help``, ``--store``/``--quiet`` after its
name, and, when it has ``--json``, an example below whose output carries the
envelope ``{"schema_version", "command", ...}``.
"""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from helpers import FIXTURES, run_cli
from traceparse.cli import build_parser, main
from traceparse.command import Command, add_common_options, envelope
from traceparse.plugins import hookimpl, registry, reset_registry
from traceparse.schema import SCHEMA_VERSION
from traceparse.session import Session

BS4 = FIXTURES / "torch" / "resnet18_bs4.json.gz"
BS8 = FIXTURES / "torch" / "resnet18_bs8.json.gz"
NCU = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"
CORE_ORDER = ["ingest", "analyze", "list", "show", "tag", "rm", "rules", "formats", "plugins", "export"]


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every runnable command line's words (``("analyze",)``, ``("predict", "fit")``) and its parser."""
    paths = {}
    for name, sub in _subparsers(parser).items():
        nested = command_paths(sub, prefix + (name,))
        paths.update(nested or {prefix + (name,): sub})
    return paths


def has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return any(option in a.option_strings for a in parser._actions)


PATHS = command_paths(build_parser(registry()))
JSON_PATHS = sorted(p for p, sub in PATHS.items() if has_option(sub, "--json"))

# One command line per JSON-capable command, run on a store holding BS4 (batch=4) and BS8 (batch=8).
# {bs4}/{bs8}: their store ids; {tmp}: a scratch directory; {model}: a model fitted on the two.
EXAMPLES = {
    ("ingest",): ["ingest", str(BS4), "--tag", "batch=4"],
    ("analyze",): ["analyze", "{bs4}", "--rule", "kernel-share"],
    ("list",): ["list"],
    ("show",): ["show", "{bs4}"],
    ("tag",): ["tag", "{bs4}", "gpu=H100"],
    ("rm",): ["rm", "{bs8}"],
    ("rules",): ["rules"],
    ("formats",): ["formats"],
    ("plugins",): ["plugins"],
    ("export",): ["export", "{bs4}", "--to", "parquet", "--out", "{tmp}/events.parquet"],
    ("compare",): ["compare", "{bs4}", "{bs8}", "--by", "batch"],
    ("diff",): ["diff", "{bs4}", "{bs8}"],
    ("roofline",): ["roofline", str(NCU)],
    ("flops",): ["flops", "alexnet"],
    ("predict", "fit"): ["predict", "fit", "{bs4}", "{bs8}", "--model-out", "{tmp}/model.json"],
    ("predict", "run"): ["predict", "run", "{bs4}", "--model", "{model}"],
    ("whatif",): ["whatif", "{bs4}", "--scale", "convolution=0.5"],
    ("sql",): ["sql", "SELECT name, SUM(duration_ns) AS ns FROM kernels GROUP BY name ORDER BY ns DESC LIMIT 3"],
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """A store with the two ResNet18 traces and a model fitted on them, built once and copied per test."""
    root = tmp_path_factory.mktemp("commands")
    session = Session(store=root / "store", quiet=True)
    ids = {}
    for key, path, batch in (("bs4", BS4, "4"), ("bs8", BS8, "8")):
        [result] = session.ingest([str(path)], tags={"batch": batch})
        ids[key] = result.meta.id
    model = root / "model.json"
    code, _, err = run_cli("--store", str(root / "store"), "-q", "predict", "fit", ids["bs4"], ids["bs8"],
                           "--model-out", str(model))
    assert code == 0, err
    return {"store": root / "store", "model": str(model), **ids}


def test_core_commands_come_first_in_help_order():
    names = list(registry().commands)
    assert names[:len(CORE_ORDER)] == CORE_ORDER
    assert {"compare", "diff", "roofline", "flops", "predict"} <= set(names[len(CORE_ORDER):])
    code, _, _ = run_cli()  # no command: the help, exit 2
    assert code == 2


def test_every_command_is_a_command_object_of_a_plugin():
    plugins = {info.name: info for info in registry().plugins}
    for name, command in registry().commands.items():
        assert isinstance(command, Command) and command.name == name
    assert not plugins["core_commands"].broken
    code, out, _ = run_cli("plugins", "--json")
    provides = {p["name"]: p["provides"] for p in json.loads(out)["plugins"]}
    assert provides["core_commands"] == [f"command {n}" for n in CORE_ORDER]
    assert provides["compare"] == ["command compare"]


@pytest.mark.parametrize("path", sorted(PATHS), ids=" ".join)
def test_help(path, capsys):
    top = registry().commands[path[0]]
    assert top.help.strip(), f"{path[0]}: a command needs a one-line help text"
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: traceparse {' '.join(path)} ")
    if len(path) == 1:
        assert " ".join(top.help.split()[:3]) in " ".join(out.split())  # the help text is the description


@pytest.mark.parametrize("path", sorted(PATHS), ids=" ".join)
def test_store_and_quiet_after_the_command_name(path):
    sub = PATHS[path]
    assert has_option(sub, "--store") and has_option(sub, "-q") and has_option(sub, "--quiet")


def test_store_before_or_after_the_command_name(tmp_path, store):
    for argv in (["--store", str(tmp_path / "a"), "list", "--json"],
                 ["list", "--json", "--store", str(tmp_path / "a")],
                 ["-q", "list", "--store", str(tmp_path / "a"), "--json"]):
        code, out, err = run_cli(*argv)
        assert code == 0, err
        assert json.loads(out)["store"] == str(tmp_path / "a"), argv
    # after the name wins over before; neither: $TRACEPARSE_STORE
    out = run_cli("--store", str(tmp_path / "a"), "list", "--store", str(tmp_path / "b"), "--json")[1]
    assert json.loads(out)["store"] == str(tmp_path / "b")
    assert json.loads(run_cli("list", "--json")[1])["store"] == str(store)


def test_every_json_command_has_an_example():
    assert JSON_PATHS == sorted(EXAMPLES), "add (or remove) the command's example in EXAMPLES"


@pytest.mark.parametrize("path", JSON_PATHS, ids=" ".join)
def test_json_envelope(path, prepared, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(prepared["store"], store)
    if path == ("flops",):
        pytest.importorskip("torch")  # `flops` counts a model's FLOPs with PyTorch, an optional extra
    values = {"tmp": str(tmp_path), "model": prepared["model"], "bs4": prepared["bs4"], "bs8": prepared["bs8"]}
    argv = [arg.format(**values) for arg in EXAMPLES[path]]
    code, out, err = run_cli("--store", str(store), "-q", *argv, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc)[:2] == ["schema_version", "command"]
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["command"] == " ".join(path)
    assert len(doc) > 2  # the command's own keys follow


def test_json_keeps_each_commands_keys(prepared, tmp_path):
    """The envelope is additive: the keys scripts read are still at the top level."""
    store = tmp_path / "store"
    shutil.copytree(prepared["store"], store)
    out = run_cli("--store", str(store), "rm", prepared["bs8"], "--json")[1]
    assert json.loads(out)["removed"] == [prepared["bs8"]]
    assert [t["id"] for t in json.loads(run_cli("--store", str(store), "list", "--json")[1])["traces"]] == \
        [prepared["bs4"]]
    out = run_cli("--store", str(store), "show", prepared["bs4"], "--json")[1]
    doc = json.loads(out)
    assert doc["id"] == prepared["bs4"] and doc["tags"] == {"batch": "4"} and doc["command"] == "show"



def test_flops_json_keeps_its_keys():
    pytest.importorskip("torch")  # `flops` needs the optional PyTorch extra
    out = run_cli("flops", "alexnet", "--batch", "2", "--json")[1]
    doc = json.loads(out)
    assert (doc["model"], doc["batch"], doc["input"]) == ("alexnet", 2, [3, 224, 224])


def test_rm_resolves_every_id_before_removing_any(prepared, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(prepared["store"], store)
    code, _, err = run_cli("--store", str(store), "rm", prepared["bs4"], "no-such-trace")
    assert code == 2 and "no-such-trace" in err
    assert len(json.loads(run_cli("--store", str(store), "list", "--json")[1])["traces"]) == 2


def test_add_common_options_spellings():
    parser = argparse.ArgumentParser()
    add_common_options(parser, traces="+", fmt=True)
    args = parser.parse_args(["a", "b", "--json", "--format", "torch", "-q"])
    assert (args.traces, args.json, args.format, args.quiet) == (["a", "b"], True, "torch", True)
    assert not hasattr(args, "store")  # not given: the top-level value is kept
    for traces, argv, expected in (("1", ["x"], "x"), ("?", [], None), ("*", [], [])):
        parser = argparse.ArgumentParser()
        add_common_options(parser, traces=traces, json=False)
        args = parser.parse_args(argv)
        assert getattr(args, "trace" if traces in ("1", "?") else "traces") == expected
        assert not hasattr(args, "json") and not hasattr(args, "format")
    add_common_options(parser, json=False)  # --store and --quiet already there: not added twice
    with pytest.raises(ValueError, match="traces='2'"):
        add_common_options(argparse.ArgumentParser(), traces="2")


def test_envelope_refuses_a_command_key():
    assert envelope("list", {"traces": []}) == {"schema_version": SCHEMA_VERSION, "command": "list", "traces": []}
    with pytest.raises(ValueError, match="'command'"):
        envelope("list", {"command": "x"})


class _CountCommand(Command):
    name = "count-events"
    help = "count each trace's events"

    def configure(self, parser):
        self.add_common_options(parser, traces="*", json=True, fmt=True)

    def run(self, args, session):
        counts = {t.id: t.events.height for t in session.resolve_all(args.traces, fmt=args.format)}
        if args.json:
            self.print_json({"counts": counts})
        else:
            session.out.print(counts)
        return 0


class _ListCommand(Command):
    name = "list"
    help = "a plugin's list"

    def run(self, args, session):
        print("the plugin's list")
        return 0


class _CommandPlugin:
    """A throwaway plugin registered in code: one new command, one that takes a core command's name."""

    __name__ = "command_plugin"

    @hookimpl
    def traceparse_commands(self):
        return [_CountCommand(), _ListCommand()]


@pytest.fixture
def with_command_plugin():
    yield reset_registry(extra_plugins=[_CommandPlugin()])
    reset_registry()


def test_a_plugin_command_gets_the_common_options_and_envelope(with_command_plugin, tmp_path):
    code, out, err = run_cli("count-events", str(BS4), "--store", str(tmp_path), "-q", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["command"] == "count-events" and doc["schema_version"] == SCHEMA_VERSION
    [(trace_id, count)] = doc["counts"].items()
    assert count == Session(store=tmp_path).store.load(trace_id).events.height > 0
    # same name as a core command: the warning the registry gives for any name provided twice; the later one wins
    code, out, err = run_cli("--store", str(tmp_path), "list")
    assert code == 0 and out == "the plugin's list\n"
    assert "command 'list' is provided twice; the later one wins" in err
