"""The command line: every form the core issue lists, on a real trace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import run_cli
from traceparse.schema import SCHEMA_VERSION


@pytest.fixture
def bs16(samples_dir, tmp_path):
    path = tmp_path / "torch_resnet18_bs16.json.gz"
    shutil.copy(samples_dir / "torch" / "torch_resnet18_bs16.json.gz", path)
    return path


def test_ingest_list_show_rm(bs16, store):
    code, out, err = run_cli("ingest", str(bs16), "--tag", "batch=16", "--tag", "gpu=h100")
    assert code == 0, err
    assert "ingested" in out and "kernel 744" in out and "NVIDIA H100 80GB HBM3" in out
    code, out, _ = run_cli("list", "--json")
    [entry] = json.loads(out)["traces"]
    assert entry["format"] == "torch" and entry["tags"] == {"batch": "16", "gpu": "h100"}
    assert entry["path"] == str(bs16)
    code, out, _ = run_cli("show", entry["id"][:6], "--json")
    assert json.loads(out)["summary"]["events_per_kind"]["kernel"] == 744
    code, out, _ = run_cli("show", str(bs16), "--json")  # a path works where an id does
    assert json.loads(out)["id"] == entry["id"]
    code, out, _ = run_cli("ingest", str(bs16))
    assert code == 0 and "already in the store" in out
    code, out, _ = run_cli("rm", entry["id"])
    assert code == 0 and entry["id"] in out
    assert json.loads(run_cli("list", "--json")[1])["traces"] == []


def test_analyze_json_document(bs16, store):
    code, out, err = run_cli("analyze", str(bs16), "--json")  # a path not yet stored is ingested first
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert [t["path"] for t in doc["traces"]] == [str(bs16)]
    rules = {f["rule"] for f in doc["findings"]}
    assert {"low-memcpy-overlap", "low-kernel-concurrency", "kernel-share"} <= rules
    for f in doc["findings"]:
        assert set(f) >= {"trace", "rule", "severity", "title", "message", "metrics", "items"}
    # no argument: the last ingested trace
    code, out2, _ = run_cli("analyze", "--json", "--rule", "kernel-share")
    assert [f["rule"] for f in json.loads(out2)["findings"]] == ["kernel-share"]


def test_fail_on_and_set(bs16, store):
    run_cli("ingest", str(bs16))
    # this trace's copies overlap nothing: critical by default, exit 1 with --fail-on warning
    code, out, _ = run_cli("analyze", "--rule", "low-memcpy-overlap", "--fail-on", "warning", "--json")
    assert code == 1 and json.loads(out)["findings"][0]["severity"] == "critical"
    code, out, _ = run_cli("analyze", "--rule", "low-memcpy-overlap", "--fail-on", "warning", "--json",
                           "--set", "low-memcpy-overlap.min_memcpy_to_kernel_ratio=0.99")
    assert code == 0 and json.loads(out)["findings"][0]["severity"] == "info"


def test_rules_formats_plugins_listings(store):
    code, out, _ = run_cli("rules", "--json")
    names = {r["name"] for r in json.loads(out)["rules"]}
    assert {"low-memcpy-overlap", "low-kernel-concurrency", "kernel-share"} <= names
    code, out, _ = run_cli("formats", "--json")
    assert "torch" in {f["name"] for f in json.loads(out)["formats"]}
    code, out, _ = run_cli("plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert plugins["torch_profiler"]["origin"] == "built-in" and plugins["torch_profiler"]["status"] == "ok"
    assert plugins["torch_profiler"]["distribution"] == "traceparse"


def test_terminal_report_shortens_names_json_keeps_them(bs16, store):
    code, out, _ = run_cli("analyze", str(bs16), "--rule", "kernel-share")
    assert "WHERE" not in out and "kernel-share" in out
    assert "(cudnn::engines_precompiled::nchw2nhwc_params_t<float>" not in out  # parameter list dropped
    code, out, _ = run_cli("analyze", str(bs16), "--rule", "kernel-share", "--json")
    names = [i["name"] for i in json.loads(out)["findings"][0]["items"]]
    assert any(n.endswith(")") and "(" in n for n in names)  # whole demangled names in JSON


def test_export_parquet_and_csv(bs16, store, tmp_path):
    import polars as pl

    run_cli("ingest", str(bs16))
    out = tmp_path / "events.parquet"
    code, _, err = run_cli("export", str(bs16), "--to", "parquet", "--out", str(out))
    assert code == 0, err
    assert pl.read_parquet(out).height == 8057  # 4577 events + 3 counters for each of 1160 [memory] events
    out_csv = tmp_path / "events.csv"
    assert run_cli("export", str(bs16), "--to", "csv", "--out", str(out_csv))[0] == 0
    assert pl.read_csv(out_csv).height == 8057


def test_terminal_report_puts_the_most_severe_first_and_tallies(bs16, store):
    code, out, _ = run_cli("analyze", str(bs16), "--rule", "kernel-share", "--rule", "low-memcpy-overlap")
    # this trace's copies overlap nothing: low-memcpy-overlap is critical and comes first although named second
    assert out.index("low-memcpy-overlap") < out.index("kernel-share")
    assert out.rstrip().endswith("2 findings: 1 critical, 1 info")


def test_the_listings_print_plugins_text_literally():
    """What readers and rules say of themselves is text, never markup: every variant of every reader (the ncu
    reader's ``pip install 'traceparse[ncu]'`` lost its ``[ncu]`` to rich), each on its own line."""
    code, out, _ = run_cli("--width", "400", "formats")
    assert code == 0
    lines = out.splitlines()
    for f in json.loads(run_cli("formats", "--json")[1])["formats"]:
        for variant in f["variants"]:
            assert any(variant[:40] in line for line in lines), variant  # (long ones fold after that)
    assert any("traceparse[ncu]" in line for line in lines)
    code, out, _ = run_cli("--width", "400", "rules")
    assert code == 0 and "\\n" not in out  # one threshold a line, not a visible "\n"


_ALLOCATOR_PROBE = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "polars" and not seen:
            seen.append(os.environ.get("_RJEM_MALLOC_CONF"))
sys.meta_path.insert(0, Watch())
import traceparse.cli as cli
sys.argv = ["traceparse", "--store", sys.argv[1], "-q", "ingest", sys.argv[2]]
cli.main()
print("setting when polars loaded:", seen)
"""


@pytest.mark.parametrize("given, expected", [(None, "dirty_decay_ms:-1,muzzy_decay_ms:-1"),
                                             ("narenas:1", "narenas:1")])
def test_a_command_process_keeps_freed_pages_unless_the_user_said_otherwise(given, expected, bs16, tmp_path):
    """The console script sets jemalloc's decay for its own process before polars (whose allocator reads it once,
    as it loads) is imported by a command that uses it; a user's setting stays as it is."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if given is not None:
        env["_RJEM_MALLOC_CONF"] = given
    out = subprocess.run([sys.executable, "-c", _ALLOCATOR_PROBE, str(tmp_path / "s"), str(bs16)], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1] == f"setting when polars loaded: [{expected!r}]"


def test_a_callers_main_leaves_the_allocator_as_it_is(monkeypatch):
    """``main([...])`` (a test, a notebook) is not the process's own command: its environment is not touched."""
    from traceparse.cli import main

    monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    assert main(["--version"]) == 0
    assert "_RJEM_MALLOC_CONF" not in os.environ
