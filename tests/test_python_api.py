"""The Python (notebook) API as a notebook uses it (sweep 11): ``to_pandas`` keeps integers exact and dtypes
stable, ``analyze(settings=...)`` checks its dict as ``--set`` does, a finding shows in one short line, and the
store is read by id, prefix or run name, or refused in one line (a missing store too)."""

from __future__ import annotations

import html

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from traceparse.errors import InputError, StoreError

TORCH = FIXTURES / "torch" / "resnet18_bs16.json.gz"
JAX = next((FIXTURES / "jax" / "jax_mlp").rglob("vm.xplane.pb"))
RANKS = FIXTURES / "torch" / "multirank" / "gloo4_balanced"


def _read(path):
    """The trace of ``path``, read without a store."""
    from traceparse.ingest import read_paths

    return read_paths([path])[0]


# -- the store: ids, prefixes, run names, a missing store --------------------------------------------------------

@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A store of the torch trace and a run of four ranks named gloo4_resnet18_bs16: (store, trace id, run id)."""
    from traceparse.store import Store

    root = tmp_path_factory.mktemp("api") / "s"
    for args in (["ingest", "-q", str(TORCH)], ["ingest", "-q", str(RANKS), "--run", "gloo4_resnet18_bs16"]):
        code, _, err = run_cli("--store", str(root), *args)
        assert code == 0, err
    store = Store(root)
    (trace_id,), (run_id,) = store.ids(), store.run_ids()
    return store, trace_id, run_id


def test_store_load_takes_an_id_or_a_unique_prefix(stored):
    store, trace_id, _ = stored
    assert store.load(trace_id).id == store.load(trace_id[:4]).id == trace_id
    assert store.load(trace_id[:4]).events.height == 4573


def test_store_load_run_takes_a_run_name_or_a_prefix(stored):
    store, _, run_id = stored
    for ref in ("gloo4_resnet18_bs16", run_id, run_id[:5]):
        run = store.load_run(ref)
        assert (run.id, run.events.height) == (run_id, 7185)
    assert store.load_run("gloo4_resnet18_bs16", lazy=True).id == run_id


@pytest.mark.parametrize("method, ref, expected", [
    ("load", "deadbeef", "deadbeef: no trace with this id in the store {root}"),
    ("load_run", "deadbeef", "deadbeef: no run with this id or name in the store {root}"),
    ("load", "gloo4_resnet18_bs16",
     "gloo4_resnet18_bs16: names a stored run, not a trace; Store.load_run('{run}') loads it"),
    ("load_run", "{trace}", "{trace}: names a stored trace, not a run; Store.load('{trace}') loads it"),
], ids=["no-trace", "no-run", "run-as-trace", "trace-as-run"])
def test_store_load_of_nothing_stored_is_one_line(stored, method, ref, expected):
    """Was polars' FileNotFoundError from deep inside polars (or on run.json)."""
    store, trace_id, run_id = stored
    names = {"root": store.root, "run": run_id, "trace": trace_id}
    with pytest.raises(StoreError) as caught:
        getattr(store, method)(ref.format(**names))
    assert str(caught.value) == expected.format(**names)


def test_sql_of_a_run_not_stored_names_the_run(stored):
    from traceparse.views import sql

    store, _, _ = stored
    with pytest.raises(StoreError) as caught:
        sql("SELECT COUNT(*) AS n FROM events", store=store.root, runs=["zzzz"])
    assert str(caught.value) == f"zzzz: no run with this id or name in the store {store.root}"
    with pytest.raises(StoreError) as caught:
        sql("SELECT COUNT(*) AS n FROM events", store=store.root, traces=["zzzz"])
    assert str(caught.value) == f"zzzz: no trace with this id in the store {store.root}"
    assert sql("SELECT COUNT(*) AS n FROM events", store=store.root, runs=["gloo4_resnet18_bs16"])["n"].to_list() \
        == [7185]


def test_a_missing_store_answers_no_query(tmp_path):
    from traceparse.store import Store
    from traceparse.views import sql

    missing = tmp_path / "nostore"
    said = f"no store at {missing}: ingest a trace first, or give --store"
    with pytest.raises(StoreError) as caught:
        sql("SELECT COUNT(*) AS n FROM events", store=missing)
    assert str(caught.value) == said
    with pytest.raises(StoreError) as caught:
        Store(missing).load("abc")
    assert str(caught.value) == f"abc: {said}"
    assert run_cli("--store", str(missing), "sql", "SELECT COUNT(*) AS n FROM events") == \
        (2, "", f"traceparse: error: {said}\n")
    assert run_cli("--store", str(missing), "show", "abc") == \
        (2, "", f"traceparse: error: abc: no such file, and {said}\n")
    assert run_cli("--store", str(missing), "analyze") == (2, "", f"traceparse: error: {said}\n")
    assert not missing.exists()  # reading made nothing


def test_list_of_a_missing_store_says_so(tmp_path):
    missing = tmp_path / "nostore"
    code, out, err = run_cli("--store", str(missing), "--width", "200", "list")
    assert (code, err) == (0, "")
    assert out == f"No store at {missing}: ingest a trace first, or give --store.\n"
    code, out, err = run_cli("--store", str(missing), "list", "--json")
    assert code == 0 and '"traces": []' in out and not missing.exists()
