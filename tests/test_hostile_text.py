"""Text from files, paths and the command line is printed literally (issue 22.1).

Markup (``[/x]``, ``[bold]``) is never read as markup and never lost; control characters (ESC, BEL, an OSC
title sequence) never reach the terminal: they are shown as ``\\x1b``. JSON stays exact. Every command that
draws tables or panels is run on one hostile trace: its kernel name, device name, file name and tags hold
markup and escape sequences.
"""

from __future__ import annotations

import gzip
import json
import shlex
from io import StringIO

import pytest
from rich.table import Table

from helpers import FIXTURES, run_cli
from traceparse.cli import one_line
from traceparse.text import SafeConsole, literal, markup_literal, visible

ESC_NAME = "k[/x]\x1b[2J\x1b]0;pwned\x07[bold]z"
DEVICE = "GPU[/d] \x1b[31mred"
FILE = "run[fp16]\x1b[1m.json.gz"
TAGS = {"cfg": "[fp16]", "x": "[/b]", "e": "\x1b]0;t\x07"}


def shown(s: str) -> str:
    """The expected screen text, written out independently: C0/C1 controls and DEL as ``\\xNN``."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F else c for c in s)


def no_escapes(*texts: str) -> None:
    for text in texts:
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, repr(text)


def test_visible_and_literal():
    assert visible(ESC_NAME) == "k[/x]\\x1b[2J\\x1b]0;pwned\\x07[bold]z" == shown(ESC_NAME)
    assert visible("a\u202eb\x9bc\x7f") == "a\\u202eb\\x9bc\\x7f"
    assert visible("tab\there\nline") == "tab\\there\\nline"
    assert literal("[bold]x[/bold]").plain == "[bold]x[/bold]"
    assert markup_literal("launch [/home/a.cu:35]") == "launch \\[/home/a.cu:35]"
    assert one_line("bad name 'k\x1b[2J'\nnext") == "bad name 'k\\x1b[2J'\\nnext"


def test_safe_console_is_the_last_line():
    """A call site that forgot :func:`literal`: the console still writes no control character of the data."""
    out = StringIO()
    console = SafeConsole(file=out, width=80, force_terminal=True, color_system="standard")
    table = Table()
    table.add_column("name")
    table.add_row(literal("a") + "\x1b[2Jb")  # a Text holding a raw ESC (Text never reads markup)
    console.print(table)
    console.print("[red]red[/red] :smile:")
    text = out.getvalue()
    assert "a\\x1b" in text  # shown (rich measured the raw ESC, so the cell is cut: a last line, not the way)
    assert "\x1b[2J" not in text
    assert "\x1b[31mred" in text  # our own styles are still written
    assert ":smile:" in text  # emoji codes are not replaced


def test_real_apex_profile_at_every_width():
    """TAU appends source locations (``launch [/home/...:35]``): rich once read them as a closing tag (exit 3)."""
    path = FIXTURES / "tau" / "real" / "apex-cuda" / "profile.0.0.0"
    lines = path.read_text().splitlines()
    names = [shlex.split(line)[0] for line in lines[2:2 + int(lines[0].split()[0])]]
    bracketed = [n for n in names if "[/" in n]
    assert bracketed  # the fixture is the hostile case
    for width in ("80", "120", "200", "240"):
        code, out, err = run_cli("analyze", str(path), "--all", "--width", width)
        assert code == 0, err
        assert "internal error" not in err
        if width == "240":
            for name in bracketed:
                assert name in out


@pytest.fixture
def hostile(tmp_path, store):
    """A real torch trace with its heaviest kernel renamed, its device renamed, under a hostile file name."""
    doc = json.load(gzip.open(FIXTURES / "torch" / "alexnet_bs4.json.gz"))
    total: dict[str, int] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            total[e["name"]] = total.get(e["name"], 0) + e.get("dur", 0)
    heaviest = max(total, key=total.get)
    for e in doc["traceEvents"]:
        if e.get("name") == heaviest:
            e["name"] = ESC_NAME
    for p in doc["deviceProperties"]:
        p["name"] = DEVICE
    path = tmp_path / FILE
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    code, out, err = run_cli("ingest", str(path), *[f"--tag={k}={v}" for k, v in TAGS.items()], "--width", "240")
    assert code == 0, err
    no_escapes(out, err)
    assert shown(str(path)) in out
    assert shown(DEVICE) in out
    assert "cfg=[fp16] e=" + shown(TAGS["e"]) + " x=[/b]" in out
    code, out, _ = run_cli("list", "--json")
    trace_id = json.loads(out)["traces"][0]["id"]
    return path, trace_id


def test_list_and_show_print_names_and_tags_literally(hostile):
    path, trace_id = hostile
    code, out, err = run_cli("list", "--width", "240")
    assert code == 0, err
    no_escapes(out, err)
    assert shown(path.name) in out and "cfg=[fp16]" in out and "x=[/b]" in out
    code, out, err = run_cli("show", trace_id, "--width", "240")
    assert code == 0, err
    no_escapes(out, err)
    assert shown(DEVICE) in out and shown(str(path)) in out and "x=[/b]" in out


def test_show_json_stays_exact(hostile):
    _, trace_id = hostile
    code, out, _ = run_cli("show", trace_id, "--json")
    doc = json.loads(out)
    assert doc["tags"] == TAGS
    assert [d["name"] for d in doc["devices"]] == [DEVICE]


def test_analyze_prints_the_kernel_name_literally(hostile):
    path, trace_id = hostile
    for extra in ([], ["--step", "all"], ["--all"]):
        code, out, err = run_cli("analyze", trace_id, "--width", "240", *extra)
        assert code == 0, err
        no_escapes(out, err)
        assert shown(ESC_NAME) in out
    code, out, _ = run_cli("analyze", trace_id, "--json")
    assert ESC_NAME in {i.get("name") for f in json.loads(out)["findings"] for i in f["items"]}


def test_diff_compare_tag_print_literally(hostile, tmp_path):
    path, trace_id = hostile
    other = tmp_path / "[bold]b[red].json.gz"
    doc = json.load(gzip.open(path))
    doc["traceEvents"] = doc["traceEvents"][:-1]  # another content: another trace
    with gzip.open(other, "wt") as f:
        json.dump(doc, f)
    code, out, err = run_cli("diff", str(path), str(other), "--width", "240")
    assert code == 0, err
    no_escapes(out, err)
    assert shown(ESC_NAME) in out and shown(path.name) in out and "[bold]b[red].json.gz" in out
    code, out, err = run_cli("compare", str(path), str(other), "--width", "240")
    assert code == 0, err
    no_escapes(out, err)
    assert "[bold]b[red].json.gz" in out
    code, out, err = run_cli("tag", trace_id, "y=[/i]\x1b[5m")
    assert code == 0, err
    no_escapes(out, err)
    assert out == f"trace {trace_id}: cfg=[fp16] x=[/b] e={shown(TAGS['e'])} y=[/i]\\x1b[5m\n"


def test_errors_and_options_print_literally(hostile):
    _, trace_id = hostile
    code, out, err = run_cli("analyze", trace_id, "--nvtx", "[/x]\x1b[2J*")
    assert code == 2
    no_escapes(err)
    assert err.startswith("traceparse: error: --nvtx '[/x]\\x1b[2J*': ")


def test_a_thread_name_in_a_critical_path_lane_is_printed_literally(tmp_path):
    """Lanes carry the trace's thread names (stop 44): a hostile one stays text in analyze, whatif and the page."""
    source = json.loads(gzip.open(FIXTURES / "torch" / "resnet18_bs16.json.gz", "rt").read())
    named = [e for e in source["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"]
    for e in named:
        e["args"]["name"] = ESC_NAME
    path = tmp_path / "hostile_thread.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(source, f)
    store = str(tmp_path / "s")
    for args in (["analyze", str(path), "--rule", "critical-path"], ["whatif", str(path)]):
        code, out, err = run_cli("--store", store, "--width", "240", *args)
        assert code == 0, err
        no_escapes(out, err)
        assert f"({shown(ESC_NAME)})" in out
    page = tmp_path / "p.html"
    code, out, err = run_cli("--store", store, "report", str(path), "--html", str(page))
    assert code == 0, err
    no_escapes(page.read_text())
