"""Store papercuts (issue 11): ``rm PATH``, ``tag``, ``show``'s title, ``list`` at 80 columns, ``analyze`` of a
capture's files, ``rules -v`` as Markdown, each warning once. Ids are computed here from the files' bytes."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from helpers import FIXTURES, run_cli

TORCH = FIXTURES / "torch" / "resnet18_bs8.json.gz"
CAPTURE = sorted((FIXTURES / "nsys").glob("resnet18_bs8_*.csv"))
RUN = FIXTURES / "torch" / "multirank" / "gloo4_balanced"
ROUNDED = "nsys rounded 'Bytes (MB)' to 1000 bytes"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _capture_id() -> str:
    """The id of the capture's seven files read together: sha256 of their sorted (name, sha256) lines."""
    outer = hashlib.sha256()
    for p in sorted(CAPTURE, key=lambda p: p.name):
        outer.update(f"{p.name}\0{_sha(p)}\n".encode())
    return outer.hexdigest()[:16]


def _stored(*extra) -> dict:
    code, out, err = run_cli("list", "--json", *extra)
    assert code == 0, err
    doc = json.loads(out)
    return {t["id"]: t for t in doc["traces"]} | {r["id"]: r for r in doc["runs"]}


def _ingest(*paths) -> None:
    code, _, err = run_cli("ingest", *map(str, paths), "-q", "--json")
    assert code == 0, err


def test_rm_a_stored_file_and_a_capture_by_their_paths(store):
    _ingest(TORCH)
    _ingest(*CAPTURE)
    torch_id, capture_id = _sha(TORCH)[:16], _capture_id()
    assert set(_stored()) == {torch_id, capture_id}
    # one file of the capture names nothing stored on its own: an error, and nothing removed
    code, out, err = run_cli("rm", str(CAPTURE[0]))
    assert code == 2 and out == ""
    assert err == (f"traceparse: error: {CAPTURE[0]}: part of the stored trace {capture_id}, which was read from "
                   f"{len(CAPTURE)} files together; name all of them, or the id\n")
    assert set(_stored()) == {torch_id, capture_id}
    code, out, err = run_cli("rm", *map(str, CAPTURE), "--json")
    assert code == 0, err
    assert json.loads(out)["removed"] == [capture_id]
    code, out, err = run_cli("rm", str(TORCH))
    assert code == 0 and out == f"removed {torch_id}\n"
    assert _stored() == {}
    code, out, err = run_cli("rm", str(TORCH))
    assert code == 2
    assert err.startswith(f"traceparse: error: {TORCH}: not in the store ") and "no stored trace was read" in err


def test_rm_a_run_by_its_directory(store):
    _ingest(RUN)
    (run_id,) = [i for i, r in _stored().items() if r.get("name") == RUN.name]
    code, out, err = run_cli("rm", str(RUN))
    assert code == 0 and out == f"removed {run_id}\n", err
    assert run_id not in _stored()


def test_tag_sets_and_removes_tags_without_reading_again(store):
    _ingest(TORCH)
    trace_id = _sha(TORCH)[:16]
    before = _stored()[trace_id]
    code, out, err = run_cli("tag", str(TORCH), "batch=8", "gpu=H100", "model=resnet18")
    assert code == 0, err
    assert out == f"trace {trace_id}: batch=8 gpu=H100 model=resnet18\n"
    code, out, err = run_cli("tag", trace_id[:6], "gpu=", "batch=16", "--json")
    assert json.loads(out)["tags"] == {"batch": "16", "model": "resnet18"}
    after = _stored()[trace_id]
    assert after["tags"] == {"batch": "16", "model": "resnet18"}
    assert after["ingested_at"] == before["ingested_at"] and after["events"] == before["events"]  # not re-read
    # a capture by its files; a run by its name
    _ingest(*CAPTURE)
    assert run_cli("tag", *map(str, CAPTURE), "batch=8")[0] == 0
    assert _stored()[_capture_id()]["tags"] == {"batch": "8"}
    _ingest(RUN)
    code, out, err = run_cli("tag", RUN.name, "world=4", "--json")
    assert code == 0 and json.loads(out)["kind"] == "run", err
    assert [r["tags"] for r in _stored().values() if r.get("name") == RUN.name] == [{"world": "4"}]
    code, out, err = run_cli("analyze", RUN.name, "--rule", "kernel-share", "--json")
    assert code == 0 and json.loads(out)["traces"][0]["tags"] == {"run": RUN.name, "world": "4"}, err


@pytest.mark.parametrize("args,message", [
    (["TRACE"], "tag: expected TRACE then KEY=VALUE (or KEY= to remove a tag), "
                "e.g. traceparse tag resnet18_bs16.json.gz batch=16"),
    (["TRACE", "=8"], "'=8': expected KEY=VALUE (or KEY= to remove a tag), e.g. batch=16"),
])
def test_tag_bad_arguments_are_one_line_errors(store, args, message):
    _ingest(TORCH)
    args = [_sha(TORCH)[:16] if a == "TRACE" else a for a in args]
    code, out, err = run_cli("tag", *args)
    assert (code, out, err) == (2, "", f"traceparse: error: {message}\n")


def test_show_titles_its_panel_as_a_stored_trace(store):
    _ingest(TORCH)
    code, out, _ = run_cli("show", _sha(TORCH)[:16])
    assert code == 0
    assert out.splitlines()[0].strip("╭─╮ ") == "stored trace"
    assert "already in the store" not in out


def test_list_at_80_columns_keeps_each_id_on_one_line(store, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    _ingest(TORCH)
    _ingest(*CAPTURE)
    code, out, _ = run_cli("list")
    assert code == 0 and max(map(len, out.splitlines())) <= 80
    for trace_id in (_sha(TORCH)[:16], _capture_id()):
        assert re.search(rf"^ {trace_id} │", out, re.M)


def test_analyze_groups_a_captures_files_as_ingest_does(store):
    code, out, err = run_cli("analyze", *map(str, CAPTURE), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [t["id"] for t in doc["traces"]] == [_capture_id()]
    code, again, _ = run_cli("analyze", _capture_id(), "--json")
    assert len(doc["findings"]) == len(json.loads(again)["findings"]) > 0
    # two traces of different captures stay two traces, in the order given
    code, out, err = run_cli("analyze", str(TORCH), *map(str, CAPTURE), "--json")
    assert [t["id"] for t in json.loads(out)["traces"]] == [_sha(TORCH)[:16], _capture_id()]


def test_each_warning_once(store, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the warning on one line of show's panel
    code, out, err = run_cli("ingest", *map(str, CAPTURE))
    assert code == 0
    assert (out + err).count(ROUNDED) == 1 and err.count(ROUNDED) == 1  # on stderr, not again in the panel
    assert re.search(r"warnings +1, printed on stderr \(`traceparse show` lists it\)", out)
    code, out, _ = run_cli("show", _capture_id())
    assert out.count(ROUNDED) == 1
    code, out, err = run_cli("rm", _capture_id())
    code, out, err = run_cli("ingest", *map(str, CAPTURE), "--json")
    assert err.count(ROUNDED) == 1 and json.loads(out)["traces"][0]["warnings"]
    run_cli("rm", _capture_id())
    code, out, err = run_cli("analyze", *map(str, CAPTURE), "-q")
    assert code == 0 and (out + err).count(ROUNDED) == 1


def test_rules_verbose_is_markdown_not_rest(store, monkeypatch):
    from traceparse.plugins import registry

    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli("rules", "-v")
    assert code == 0, err
    assert "``" not in out and not re.search(r":(func|data|class|meth|mod|attr):`", out)
    flat = " ".join(out.split())
    for rule in registry().rules.values():
        assert rule.description in flat
        first = rule.definition.strip().split("\n\n")[0]
        text = re.sub(r":\w+:`~?([^`]+)`", r"\1", first).replace("``", "")
        assert " ".join(text.split()) in flat, rule.name
