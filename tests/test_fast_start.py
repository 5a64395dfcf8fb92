"""``traceparse --version`` answers without loading a plugin, polars, pandas or pyarrow (issue 25: fast start).

Each check is a fresh interpreter (a subprocess): a module imported by another test would hide what this one
imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceparse import __version__

HEAVY = ("polars", "pandas", "pyarrow", "numpy", "rich", "pluggy", "msgspec", "traceparse_plugins")

_CHILD = """
import contextlib, io, json, sys
from traceparse.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "out": out.getvalue(), "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--store", "somewhere", "--version"], ["-q", "--version"]])
def test_version_loads_nothing_heavy(argv):
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == 0 and result["out"] == f"traceparse {__version__}\n"
    assert not set(HEAVY) & set(result["loaded"]), sorted(set(HEAVY) & set(result["loaded"]))


def test_import_traceparse_is_light_and_names_still_there():
    """``import traceparse`` loads no polars; ``traceparse.Trace`` (and the other public names) load it then."""
    code = ("import sys, traceparse; light = 'polars' not in sys.modules; "
            "print(light, traceparse.Trace.__name__, traceparse.Finding.__name__, callable(traceparse.hookimpl))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "Trace", "Finding", "True"], done.stderr


def test_version_after_a_command_is_that_commands_business():
    """``--version`` after a sub-command is not the top-level option: argparse refuses it (exit 2)."""
    done = subprocess.run([sys.executable, "-m", "traceparse", "list", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "unrecognized arguments: --version" in done.stderr


# -- the plugin index: ``list`` and ``--help`` import only what they use (issue 25 item 3) ----------------------
_CHILD_EXITING = """
import contextlib, io, json, sys
from traceparse.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # argparse's --help
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(), "loaded": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _child(argv: list[str], env: dict) -> dict:
    """``main(argv)`` in a fresh interpreter: its exit code, stdout and stderr, and the top-level modules loaded."""
    done = subprocess.run([sys.executable, "-c", _CHILD_EXITING, *argv], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    result["err"] = done.stderr
    return result


def _env(tmp_path, **extra) -> dict:
    import os

    return {**os.environ, "TRACEPARSE_CACHE_DIR": str(tmp_path / "cache"),
            "TRACEPARSE_STORE": str(tmp_path / "store"), **extra}


def _loaded_all(tmp_path, env: dict) -> None:
    """The first start (no index yet) loads every plugin (and polars with them) and writes the index."""
    assert not list((tmp_path / "cache").glob("plugin-index-*.json"))
    first = _child(["list"], env)
    assert first["code"] == 0 and {"polars", "traceparse_plugins"} <= set(first["loaded"])
    assert list((tmp_path / "cache").glob("plugin-index-*.json"))


def test_list_with_the_index_loads_no_polars_and_no_reader(tmp_path):
    """With the plugin index written, ``traceparse list`` (a store of three traces) imports neither polars nor
    numpy, pyarrow or msgspec, and no reader or rule plugin: only the plugin of its command; and it lists the
    store as the full load does."""
    from helpers import FIXTURES

    env = _env(tmp_path)
    _loaded_all(tmp_path, env)
    files = sorted((FIXTURES / "torch").glob("alexnet_bs*.json.gz"))[:3]
    done = subprocess.run([sys.executable, "-m", "traceparse", "ingest", "-q", *map(str, files)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    code = ("import json, sys\nfrom traceparse.cli import main\nmain(['list', '--json'])\n"
            "print(json.dumps(sorted(m for m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    *listing, modules = done.stdout.strip().splitlines()
    modules = set(json.loads(modules))
    assert not {"polars", "numpy", "pyarrow", "msgspec", "pandas"} & {m.split(".")[0] for m in modules}
    plugins = {m for m in modules if m.startswith("traceparse_plugins.")}
    assert plugins and all(m.startswith("traceparse_plugins.commands.core") or m == "traceparse_plugins.commands"
                           for m in plugins), sorted(plugins)
    listed = json.loads("\n".join(listing))
    assert sorted(t["path"] for t in listed["traces"]) == sorted(map(str, files))


def test_help_with_the_index_lists_every_command_in_order(tmp_path):
    """``traceparse --help`` from the index lists every command, in the full load's order and with its help,
    and imports no polars and no command's own module."""
    from traceparse.plugins import load_registry

    env = _env(tmp_path)
    _loaded_all(tmp_path, env)
    result = _child(["--help"], env)
    assert result["code"] == 0
    assert not {"polars", "numpy", "pyarrow"} & set(result["loaded"])
    full = load_registry()
    names = [line.split()[0] for line in result["out"].split("COMMAND")[-1].splitlines()
             if line.startswith("    ") and not line.startswith("     ")]  # a command's line, not its help's rest
    assert names == list(full.commands)
    for name, command in full.commands.items():
        assert command.help.split()[0] in result["out"]


def test_the_lazy_registry_gives_what_the_full_load_gives(tmp_path, monkeypatch):
    """A registry made from the index loads plugins as asked and then gives the same readers, rules, exporters,
    commands (same names, same order, same classes), GPU specs and kernel categories as loading everything."""
    from traceparse import plugins

    monkeypatch.setenv("TRACEPARSE_CACHE_DIR", str(tmp_path / "cache"))
    full = plugins.load_registry()
    assert plugins.indexed_registry()._pending == {}  # the first: loaded all, wrote the index
    lazy = plugins.indexed_registry()
    assert set(lazy._pending) == {p.name for p in full.plugins}  # nothing imported yet
    assert lazy.command_list() == [(n, c.help) for n, c in full.commands.items()]
    assert type(lazy.command("list")).__name__ == "ListCommand"
    assert "torch_profiler" in lazy._pending  # the list command did not load a reader
    for key in ("readers", "rules", "exporters", "commands"):
        got, want = getattr(lazy, key), getattr(full, key)
        assert [(n, type(o).__qualname__) for n, o in got.items()] == [(n, type(o).__qualname__) for n, o in want.items()]
    assert [s["name"] for s in lazy.gpu_specs] == [s["name"] for s in full.gpu_specs]
    assert lazy.kernel_categories == full.kernel_categories
    assert [(p.name, p.error) for p in lazy.plugins] == [(p.name, p.error) for p in full.plugins]


def _plugin_distribution(site: Path, body: str) -> Path:
    """A distribution 'extra-tp' 0.1 on ``site`` whose entry point is the module ``extra_tp_module`` (``body``)."""
    info = site / "extra_tp-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-tp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[traceparse]\nextra_tp = extra_tp_module\n")
    module = site / "extra_tp_module.py"
    module.write_text(body)
    return module


_COMMAND = '''
from traceparse.command import Command
from traceparse.plugins import hookimpl

class Hello(Command):
    name = "{name}"
    help = "say hello"

    def configure(self, parser):
        pass

    def run(self, args, session):
        print("{name} from the plugin")
        return 0

@hookimpl
def traceparse_commands():
    return [Hello()]
'''


def test_an_edited_plugin_rebuilds_the_index(tmp_path):
    """A third-party plugin's command runs through the index; once its module changes (a command renamed), the
    index is rebuilt: the new name works and the old one is gone. A plugin that breaks is said on the next
    command, once."""
    import os

    site = tmp_path / "site"
    module = _plugin_distribution(site, _COMMAND.format(name="hello"))
    env = _env(tmp_path, PYTHONPATH=str(site))
    _loaded_all(tmp_path, env)
    assert _child(["hello"], env)["out"] == "hello from the plugin\n"
    module.write_text(_COMMAND.format(name="howdy"))
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a second later, whatever the clock
    assert _child(["howdy"], env)["out"] == "howdy from the plugin\n"
    done = subprocess.run([sys.executable, "-m", "traceparse", "hello"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 2 and "invalid choice: 'hello'" in done.stderr
    module.write_text("import no_such_module_for_the_index_test\n")
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))
    for _ in range(2):  # the rebuild, then from the index: the broken plugin is tried again, and said once
        result = _child(["list"], env)
        assert result["code"] == 0
        assert result["err"].count("plugin 'extra_tp' is left out") == 1, result["err"]


def test_choosing_a_reader_imports_only_what_sniffing_needs():
    """Every command that takes a path loads every reader to sniff it; a reader's plugin module brings only what
    its sniffer needs, and what reading needs comes when its reader reads (lxml for TAU's XML, the compiled table
    of nsys report names). A torch trace is sniffed and planned without either; reading a TAU profile then works."""
    from helpers import FIXTURES

    code = ("import json, sys\nfrom pathlib import Path\nfrom traceparse.ingest import plan\n"
            f"[(reader, group)] = plan([Path({str(FIXTURES / 'torch' / 'alexnet_bs4.json.gz')!r})])\n"
            "from traceparse_plugins.readers.nsys import reports\n"
            "print(json.dumps([reader.name, 'lxml' in sys.modules, reports._file_name.cache_info().currsize,"
            " sorted(m for m in sys.modules if m.startswith('traceparse_plugins.readers.tau'))]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["torch", False, 0, ["traceparse_plugins.readers.tau",
                                                           "traceparse_plugins.readers.tau.sniff"]]
    from traceparse.ingest import read_paths

    [trace] = read_paths([FIXTURES / "tau" / "real" / "cpi-mpi"])
    assert trace.meta.format == "tau" and trace.events.height > 0


def test_ingest_imports_no_measure(tmp_path):
    """The measures (numpy, every analysis module) are analyze's business: ``ingest`` of a single trace reads,
    checks and stores without them (they once came with the Dask helpers' module, 20 ms of its start)."""
    from helpers import FIXTURES

    env = _env(tmp_path)
    _loaded_all(tmp_path, env)  # the plugin index written: a command loads only its own plugin
    code = _CHILD.replace('sorted({m.split(".")[0] for m in sys.modules})',
                          'sorted(m for m in sys.modules if m.startswith("traceparse."))')
    argv = ["-q", "ingest", str(FIXTURES / "torch" / "alexnet_bs4.json.gz"), "--json"]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0 and json.loads(result["out"])["traces"][0]["format"] == "torch"
    assert "traceparse.distributed" in result["loaded"]  # the Dask helpers' module is loaded: the point of the test
    assert [m for m in result["loaded"] if m.startswith("traceparse.measures")] == []
