"""The plugin path: a third-party package installed into a venv, a broken plugin, a plugin registered in code."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sysconfig
import textwrap
import venv
from decimal import Decimal
from pathlib import Path

import polars as pl

from traceparse.analysis import analyze
from traceparse.plugins import hookimpl, load_registry
from traceparse.rule import Finding, Rule
from traceparse.trace import Trace, TraceMeta

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "traceparse-example-plugin"


def make_venv(path: Path) -> Path:
    """A venv that sees this environment's packages (traceparse included) and installs into its own site-packages."""
    venv.create(path, with_pip=False, system_site_packages=False)
    python = path / "bin" / "python"
    purelib = subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      text=True).strip()
    parents = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if os.path.isdir(p)]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in parents)
    Path(purelib, "zz_parent_env.pth").write_text(lines)
    return python


def pip_install(python: Path, package: Path) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(package)], check=True, capture_output=True, text=True)


def cli(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "traceparse.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_third_party_plugin_in_a_venv(tmp_path, samples_dir):
    python = make_venv(tmp_path / "venv")
    before = cli(python, "rules", "--json", cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert "short-kernels" not in {r["name"] for r in json.loads(before.stdout)["rules"]}

    example = tmp_path / "example-plugin"  # built from a copy: the build must not write into the repo
    shutil.copytree(EXAMPLE, example)
    pip_install(python, example)
    # a second, broken third-party plugin: it must show as broken and the rest keep working
    broken = tmp_path / "broken-plugin"
    (broken / "broken_plugin").mkdir(parents=True)
    (broken / "broken_plugin" / "__init__.py").write_text("import no_such_module_anywhere\n")
    (broken / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "broken-plugin"
        version = "1.0"
        [project.entry-points.traceparse]
        broken = "broken_plugin"
        [tool.setuptools]
        packages = ["broken_plugin"]
    """))
    pip_install(python, broken)

    rules = cli(python, "rules", "--json", cwd=tmp_path)
    assert rules.returncode == 0, rules.stderr
    listed = {r["name"]: r for r in json.loads(rules.stdout)["rules"]}
    assert listed["short-kernels"]["plugin"] == "short_kernels"
    assert listed["short-kernels"]["thresholds"] == {"max_duration_us": 10.0, "warning_above_pct": 50.0}

    plugins = {p["name"]: p for p in json.loads(cli(python, "plugins", "--json", cwd=tmp_path).stdout)["plugins"]}
    assert plugins["short_kernels"]["origin"] == "third-party"
    assert (plugins["short_kernels"]["distribution"], plugins["short_kernels"]["version"]) == \
        ("traceparse-example-plugin", "0.2.0")
    assert plugins["broken"]["status"] == "broken"
    assert plugins["broken"]["error"] == "ModuleNotFoundError: No module named 'no_such_module_anywhere'"
    assert plugins["torch_profiler"]["status"] == "ok"

    trace = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    result = cli(python, "analyze", str(trace), "--rule", "short-kernels", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [finding] = json.loads(result.stdout)["findings"]
    # independent count from the trace file
    import gzip

    doc = json.load(gzip.open(trace))
    durations = [e["dur"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert finding["metrics"]["calls"] == len(durations)
    assert finding["metrics"]["short_calls"] == sum(1 for d in durations if d * 1000 < 10_000)

    # the second rule, written on the public gaps measure: gaps of >= 100 us between GPU activities
    assert listed["long-gaps"]["plugin"] == "short_kernels"
    result = cli(python, "analyze", str(trace), "--rule", "long-gaps", "--set", "long-gaps.min_gap_us=50", "--json",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [finding] = json.loads(result.stdout)["findings"]
    intervals = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = Decimal(str(e["ts"])) * 1000
            intervals.setdefault(e["args"].get("device"), []).append((start, start + Decimal(str(e["dur"])) * 1000))
    gaps = []
    for ivs in intervals.values():
        end = None
        for s, e in sorted(ivs):
            if end is not None and s > end:
                gaps.append(s - end)
            end = e if end is None else max(end, e)
    long = [g for g in gaps if g >= 50_000]
    assert finding["metrics"]["long_gaps"] == len(long) > 0
    assert abs(finding["metrics"]["long_gap_ns"] - sum(long)) <= len(long)  # ns rounding of the ends only
    assert finding["severity"] == ("warning" if len(long) >= 10 else "info")


class _TinyRule(Rule):
    name = "tiny"
    description = "counts events"
    thresholds = {"factor": 2}
    kinds = ("kernel",)

    def check(self, trace, options):
        return [Finding(self.name, "info", "count", "", metrics={"n": trace.events.height * options.thresholds["factor"]})]


class _RulesPlugin:
    """A throwaway plugin registered in code, as the tests of pytest and datasette do: it provides ``rules``."""

    def __init__(self, name: str, *rules: Rule):
        self.__name__, self.rules = name, list(rules)

    @hookimpl
    def traceparse_rules(self):
        return self.rules


def test_plugin_registered_in_code_runs_with_settings():
    reg = load_registry(extra_plugins=[_RulesPlugin("tiny_plugin", _TinyRule())])
    events = pl.DataFrame({"kind": ["kernel", "kernel", "api"]})
    from traceparse.schema import conform

    trace = Trace(conform(events), TraceMeta(id="t1"))
    [finding] = analyze(trace, rules=["tiny"], settings={"tiny": {"factor": 5}}, reg=reg)
    assert finding.metrics == {"n": 15} and finding.trace == "t1"
    assert "tiny" in reg.rules and "kernel-share" in reg.rules


class _CountingCatalog:
    """A plugin whose GPU catalog hook counts how often it runs."""

    __name__ = "counting_catalog"

    def __init__(self):
        self.runs = 0

    @hookimpl
    def traceparse_gpu_specs(self):
        self.runs += 1
        return [{"name": "Counting GPU 1"}, {"name": "Counting GPU 2"}]


def test_gpu_spec_counts_runs_each_catalog_hook_once():
    plugin = _CountingCatalog()
    reg = load_registry(extra_plugins=[plugin])
    assert reg.gpu_spec_counts["counting_catalog"] == 2
    assert {"Counting GPU 1", "Counting GPU 2"} <= {s["name"] for s in reg.gpu_specs}
    assert plugin.runs == 1


def _broken_distribution(site_dir: Path) -> None:
    """A distribution 'broken-tp' 0.1 on ``site_dir`` whose ``traceparse`` entry point imports a missing module."""
    info = site_dir / "broken_tp-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-tp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[traceparse]\nbroken_tp = broken_tp_module\n")
    (site_dir / "broken_tp_module.py").write_text("import no_such_module_for_the_traceparse_test\n")


BROKEN_WARNING = ("plugin 'broken_tp' is left out: its entry point broken_tp = broken_tp_module (from broken-tp 0.1) "
                  "failed: ModuleNotFoundError: No module named 'no_such_module_for_the_traceparse_test'")


def test_a_plugin_that_fails_to_import_is_a_warning_naming_it(tmp_path, monkeypatch):
    """A broken entry point does not vanish: the registry says which plugin, which entry point, which error; the
    built-in plugins still load."""
    _broken_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    reg = load_registry()
    assert reg.warnings == [BROKEN_WARNING]
    [info] = [p for p in reg.plugins if p.name == "broken_tp"]
    assert info.broken and info.module == "broken_tp_module"
    assert "torch" in reg.readers and "critical-path" in reg.rules


def test_every_command_prints_the_broken_plugin_once(tmp_path, monkeypatch):
    from helpers import run_cli
    from traceparse.plugins import reset_registry

    _broken_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    reset_registry()
    try:
        for command in (["rules"], ["formats"], ["list"]):
            code, out, err = run_cli(*command)
            assert code == 0, err
            assert err == f"traceparse: warning: {BROKEN_WARNING}\n"  # one line, once
    finally:
        monkeypatch.undo()
        reset_registry()


def test_a_plugin_whose_hook_fails_is_a_warning_too():
    class Faulty:
        __name__ = "faulty_plugin"

        @hookimpl
        def traceparse_rules(self):
            raise RuntimeError("rules table missing")

    reg = load_registry([Faulty()])
    assert "kernel-share" in reg.rules  # the others keep working
    assert reg.warnings[-1] == ("plugin 'faulty_plugin' is left out: its entry point faulty_plugin = faulty_plugin "
                                "(registered in code) failed: traceparse_rules failed: rules table missing")


class _WholeRule(Rule):
    name = "whole"
    description = "30 ns at stake of a 40 ns whole, over every rank"
    kinds = ("kernel",)

    def check(self, trace, options):
        return [Finding(self.name, "warning", "part of a whole", "", impact_ns=30, impact_whole=("the whole", 40))]


def test_a_runs_time_at_stake_and_its_whole_are_made_per_rank_together():
    """On a run the core divides a rule's time at stake by the ranks, and the whole it is part of with it: the
    summary's share of that whole stays the share the rule measured (75%), not 25% of an undivided whole."""
    from traceparse.schema import conform
    from traceparse.summary import bottleneck

    reg = load_registry(extra_plugins=[_RulesPlugin("whole_plugin", _WholeRule())])
    events = conform(pl.DataFrame({"kind": ["kernel"] * 3, "start_ns": [0, 10, 20], "duration_ns": [5, 5, 5]}))
    run = TraceMeta(id="r", format="run", extra={"run": {"ranks": {"0": "a", "1": "b", "2": "c"}}})
    [finding] = analyze(Trace(events, run), rules=["whole"], reg=reg)
    assert (finding.impact_ns, finding.impact_whole) == (10, ("the whole", 13))
    assert bottleneck([finding], span_ns=25)["share_pct"] == round(100 * 10 / 13, 4)
    [single] = analyze(Trace(events, TraceMeta(id="t")), rules=["whole"], reg=reg)
    assert (single.impact_ns, single.impact_whole) == (30, ("the whole", 40))
