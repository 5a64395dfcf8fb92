"""A store read by another release of a reader is read again: a path gives what this traceparse reads.

The store knows content by its hash. Before, bytes stored once were never read again unless another format
claimed them, so a store filled by a release with a reader's bug kept that bug's figures after an upgrade that
fixed it. Each reading now names its reader and the reader's release (``meta.reader``, ``run.json``'s
``readers``); one by another names is read again and replaces it, keeping its tags. The older release is
simulated by editing what the store says of the reading.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli
from test_runs import kineto, write
from traceparse import __version__
from traceparse.plugins import load_registry, registry

TRACE = FIXTURES / "torch" / "resnet18_bs16.json.gz"


def ingest_json(store: Path, *paths: str) -> dict:
    code, out, err = run_cli("--store", str(store), "ingest", "--json", *paths)
    assert code == 0, err
    return json.loads(out)


def edit(path: Path, **changes) -> None:
    """Change (a value None: remove) keys of a stored JSON document, as an older release would have written it."""
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    path.write_text(json.dumps(doc))


def test_a_reading_names_its_reader_and_release():
    reg = registry()
    assert reg.reading_of(reg.readers["torch"]) == f"torch (traceparse {__version__})"
    assert reg.reading_of(reg.readers["nsys"]) == f"nsys (traceparse {__version__})"


def test_a_reader_registered_in_code_is_named_so():
    class Plugin:
        class Reader:
            name = "mine"

        from traceparse.plugins import hookimpl

        @staticmethod
        @hookimpl
        def traceparse_readers():
            return [Plugin.Reader()]

    reg = load_registry([Plugin])
    assert reg.reading_of(reg.readers["mine"]) == "mine ((registered in code))"


@pytest.mark.parametrize("older", ["torch (traceparse 0.0.9)", None])
def test_a_trace_stored_by_another_release_is_read_again_keeping_its_tags(tmp_path, older):
    """``None``: a reading stored before readings named their reader, read again once."""
    store = tmp_path / "s"
    first = ingest_json(store, str(TRACE))["traces"][0]
    assert (first["reader"], first["already_stored"], first["replaced"]) == (
        f"torch (traceparse {__version__})", False, None)
    trace_id = first["id"]
    assert run_cli("--store", str(store), "tag", trace_id, "owner=me")[0] == 0
    meta_path = store / "traces" / trace_id / "meta.json"
    edit(meta_path, reader=older, event_count=1)  # the older release's figures
    again = ingest_json(store, str(TRACE))["traces"][0]
    assert (again["id"], again["already_stored"]) == (trace_id, False)
    assert again["replaced"] == (older or "torch (an earlier traceparse)")
    assert again["reader"] == first["reader"]
    assert again["event_count"] == first["event_count"] > 1
    assert again["tags"] == {"owner": "me"}
    stored = json.loads(meta_path.read_text())
    assert (stored["reader"], stored["event_count"], stored["tags"]) == (first["reader"], first["event_count"],
                                                                        {"owner": "me"})
    assert [p.name for p in (store / "traces").iterdir()] == [trace_id]
    assert not (store / "tmp").exists() or list((store / "tmp").iterdir()) == []  # the old reading removed
    third = ingest_json(store, str(TRACE))["traces"][0]
    assert (third["already_stored"], third["replaced"]) == (True, None)


def test_the_screen_says_the_trace_was_read_again(tmp_path):
    store = tmp_path / "s"
    trace_id = ingest_json(store, str(TRACE))["traces"][0]["id"]
    edit(store / "traces" / trace_id / "meta.json", reader="torch (traceparse 0.0.9)")
    code, out, err = run_cli("--store", str(store), "--width", "100", "ingest", str(TRACE))
    assert code == 0, err
    assert "ingested again: the store had it as read by torch (traceparse 0.0.9)" in out.splitlines()[0]


def test_analyze_of_a_path_uses_this_releases_reading(tmp_path):
    store = tmp_path / "s"
    first = ingest_json(store, str(TRACE))["traces"][0]
    trace_id = first["id"]
    edit(store / "traces" / trace_id / "meta.json", reader="torch (traceparse 0.0.9)", event_count=1)
    code, out, err = run_cli("--store", str(store), "analyze", str(TRACE), "--json", "--rule", "kernel-share")
    assert code == 0, err
    assert json.loads(out)["traces"][0]["id"] == trace_id
    listed = json.loads(run_cli("--store", str(store), "list", "--json")[1])["traces"]
    assert [(t["id"], t["events"]) for t in listed] == [(trace_id, first["event_count"])]


def test_a_run_stored_by_another_release_is_read_again_keeping_its_tags(tmp_path):
    ranks = tmp_path / "ranks"
    for r in range(2):
        write(ranks / f"rank{r}.json", kineto(r, 2, start_us=1 + r))
    store = tmp_path / "s"
    first = ingest_json(store, str(ranks))["runs"][0]
    assert (first["readers"], first["already_stored"], first["replaced"]) == (
        [f"torch (traceparse {__version__})"], False, None)
    run_id = first["id"]
    assert run_cli("--store", str(store), "tag", run_id, "owner=me")[0] == 0
    edit(store / "runs" / run_id / "run.json", readers=["torch (traceparse 0.0.9)"])
    again = ingest_json(store, str(ranks))["runs"][0]
    assert (again["id"], again["already_stored"], again["replaced"]) == (run_id, False, "torch (traceparse 0.0.9)")
    assert (again["readers"], again["tags"]) == (first["readers"], {"owner": "me"})
    assert sorted(p.name for p in (store / "runs").iterdir()) == [run_id]
    stored = json.loads((store / "runs" / run_id / "run.json").read_text())
    assert stored["readers"] == first["readers"]
    rank_meta = json.loads((store / "runs" / run_id / "rank=1" / "meta.json").read_text())
    assert rank_meta["reader"] == f"torch (traceparse {__version__})"
    edit(store / "runs" / run_id / "run.json", readers=None)  # stored before runs named their readers
    assert ingest_json(store, str(ranks))["runs"][0]["replaced"] == "an earlier traceparse"
    third = ingest_json(store, str(ranks))["runs"][0]
    assert (third["already_stored"], third["replaced"]) == (True, None)


def test_sql_gives_each_readings_reader(tmp_path):
    store = tmp_path / "s"
    ingest_json(store, str(TRACE))
    code, out, err = run_cli("--store", str(store), "sql", "select reader from traces", "--csv")
    assert code == 0, err
    assert out.splitlines() == ["reader", f"torch (traceparse {__version__})"]
