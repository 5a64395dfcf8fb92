"""The Python (notebook) API, sweep 11: ``to_pandas`` keeps integers exact and dtypes
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


# -- to_pandas -------------------------------------------------------------------------------------------------

def _pandas_values(column) -> list:
    """A pandas column's values as Python objects, a null as None."""
    import pandas as pd

    return [None if pd.isna(value) else value for value in column.astype(object).tolist()]


@pytest.mark.parametrize("path", [TORCH, JAX], ids=["torch", "jax"])
def test_to_pandas_keeps_every_integer_exact(path):
    """Every integer column equals the polars column value for value, nulls where polars has them: the JAX
    trace's 64-bit thread ids too, which float64 rounded (-2237485431753280891 read -2237485431753280768)."""
    events = _read(path).events
    frame = _read(path).to_pandas()
    ints = [name for name, dtype in events.schema.items() if dtype.is_integer()]
    assert len(ints) == 31  # the schema's integer columns (peer_rank the last to join)
    for name in ints:
        assert str(frame[name].dtype) == str(events[name].dtype), name  # Int64 / Int32, as in polars
        assert _pandas_values(frame[name]) == events[name].to_list(), name


def test_jax_thread_ids_past_2_53_are_exact():
    frame = _read(JAX).to_pandas()
    tids = set(frame["tid"].dropna().tolist())
    assert -2237485431753280891 in tids and -5335141061055365543 in tids
    assert str(frame["tid"].dtype) == "Int64"


def test_to_pandas_dtypes_are_the_same_on_every_trace():
    """duration_ns has no null in the torch trace and 164 in the JAX one: both are Int64 (was int64 and float64)."""
    torch, jax = _read(TORCH).to_pandas(), _read(JAX).to_pandas()
    assert _read(JAX).events["duration_ns"].null_count() == 164 and _read(TORCH).events["duration_ns"].null_count() == 0
    assert dict(torch.dtypes.astype(str)) == dict(jax.dtypes.astype(str))
    dtypes = dict(torch.dtypes.astype(str))
    assert (dtypes["duration_ns"], dtypes["tid"], dtypes["device_id"], dtypes["value"], dtypes["kind"]) == \
        ("Int64", "Int64", "Int32", "float64", "category")
    assert list(torch["kind"].cat.categories) == ["kernel", "memcpy", "memset", "api", "op", "marker", "counter",
                                                  "region", "sync"]


def test_to_pandas_groups_by_name_with_exact_sums():
    trace = _read(TORCH)
    by_name = trace.to_pandas().groupby("name")["duration_ns"].sum()
    expected = trace.events.group_by("name").agg(pl.col("duration_ns").sum())
    assert str(by_name.dtype) == "Int64"
    assert {k: int(v) for k, v in by_name.items()} == dict(expected.iter_rows())


def test_a_run_read_lazily_gives_pandas_too(tmp_path):
    from traceparse.store import Store

    code, _, err = run_cli("--store", str(tmp_path / "s"), "ingest", "-q", str(RANKS), "--run", "r4")
    assert code == 0, err
    store = Store(tmp_path / "s")
    lazy, whole = store.load_run("r4", lazy=True).to_pandas(), store.load_run("r4").events
    assert len(lazy) == whole.height == 7185
    assert _pandas_values(lazy["start_ns"]) == whole["start_ns"].to_list()


# -- analyze(settings=...) ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_trace():
    return _read(TORCH)


@pytest.mark.parametrize("settings, expected", [
    ({"low-memcpy-overlap": {"warning_below_pcnt": -1}},
     "settings low-memcpy-overlap.warning_below_pcnt: rule low-memcpy-overlap has no parameter 'warning_below_pcnt' "
     "(it has: critical_below_pct, min_memcpy_to_kernel_ratio, warning_below_pct)"),
    ({"low-memcpy-overlap": {"critical_below_pct": "5"}},
     "settings low-memcpy-overlap.critical_below_pct: expected a finite number (the default is 10.0), got '5'"),
    ({"low-memcpy-overlap": {"critical_below_pct": True}},
     "settings low-memcpy-overlap.critical_below_pct: expected a finite number (the default is 10.0), got True"),
    ({"low-memcpy-overlap": {"critical_below_pct": float("nan")}},
     "settings low-memcpy-overlap.critical_below_pct: expected a finite number (the default is 10.0), got nan"),
    ({"stragglers": {"align_clocks": 1}},
     "settings stragglers.align_clocks: expected True or False (the default is False), got 1"),
    ({"hotspots": {"kinds": "kernel"}},
     "settings hotspots.kinds: expected a list (the default is ['region', 'kernel', 'op', 'api', 'marker', 'memcpy', "
     "'memset', 'sync']), got 'kernel'"),
    ({"low-memcpy-overlap": 30}, "settings 'low-memcpy-overlap': expected a dict {parameter: value}, got 30"),
], ids=["misspelled", "text", "bool", "nan", "int-for-bool", "text-for-list", "not-a-dict"])
def test_settings_are_checked_as_set_checks_them(torch_trace, settings, expected):
    from traceparse.analysis import analyze

    with pytest.raises(InputError) as caught:
        analyze(torch_trace, rules=["low-memcpy-overlap"], settings=settings)
    assert str(caught.value) == expected


def test_a_misspelled_rule_in_settings_is_refused(torch_trace):
    from traceparse.analysis import analyze, default_registry

    with pytest.raises(InputError) as caught:
        analyze(torch_trace, rules=["low-memcpy-overlap"], settings={"low_memcpy_overlap": {"warning_below_pct": 1}})
    known = ", ".join(sorted(default_registry().rules))
    assert str(caught.value) == f"settings: unknown rule 'low_memcpy_overlap'; known rules: {known}"


def test_an_int_for_a_float_threshold_is_taken(torch_trace):
    """critical_below_pct=5 (an int) acts as 5.0 does, and as ``--set low-memcpy-overlap.critical_below_pct=5``."""
    from traceparse.analysis import analyze, check_settings, parse_settings

    as_int = {"low-memcpy-overlap": {"critical_below_pct": 5}}
    as_float = {"low-memcpy-overlap": {"critical_below_pct": 5.0}}
    assert check_settings(as_int) == parse_settings(["low-memcpy-overlap.critical_below_pct=5"]) == as_float
    assert isinstance(check_settings(as_int)["low-memcpy-overlap"]["critical_below_pct"], float)
    as_int = analyze(torch_trace, rules=["low-memcpy-overlap"], settings=as_int)
    as_float = analyze(torch_trace, rules=["low-memcpy-overlap"], settings=as_float)
    assert [f.to_dict() for f in as_int] == [f.to_dict() for f in as_float]


def test_the_cli_set_still_says_what_it_said(store):
    code, out, err = run_cli("analyze", str(TORCH), "--set", "low-memcpy-overlap.warning_below_pcnt=1")
    assert (code, out) == (2, "")
    assert err == ("traceparse: error: --set 'low-memcpy-overlap.warning_below_pcnt=1': rule low-memcpy-overlap has "
                   "no parameter 'warning_below_pcnt' (it has: critical_below_pct, min_memcpy_to_kernel_ratio, "
                   "warning_below_pct)\n")


# -- Finding's repr ---------------------------------------------------------------------------------------------

def _finding(**more):
    from traceparse.rule import Finding

    return Finding(**{"rule": "gpu-idle", "severity": "critical", "title": "GPU idle", "message": "m",
                      "metrics": {"gaps": list(range(5000))}, "items": [{"name": "k" * 100}] * 200, **more})


def test_a_finding_reads_in_one_short_line():
    assert repr(_finding(impact_ns=129_600_000)) == "<Finding gpu-idle critical 'GPU idle' 129.6 ms at stake>"
    assert repr(_finding()) == "<Finding gpu-idle critical 'GPU idle'>"
    gain = _finding(impact_ns=2_500_000, impact_said="to gain")  # ncu's estimate of what a fix gains
    assert repr(gain) == "<Finding gpu-idle critical 'GPU idle' 2.5 ms to gain>"
    assert "(2.5 ms to gain)" in gain._repr_html_()
    assert repr(_finding(title="a\x1b[31m" + "x" * 200, impact_ns=0)) == \
        "<Finding gpu-idle critical " + repr("a\x1b[31m" + "x" * 200)[:79] + "… 0 ns at stake>"


def test_findings_of_a_real_trace_print_short(torch_trace):
    """The list a notebook cell shows: was 79-117 KB on one line."""
    from traceparse.analysis import analyze

    findings = analyze(torch_trace)
    assert repr(findings[0]) == "<Finding gpu-idle critical 'GPU idle' 23.59 ms at stake>"
    assert len(repr(findings)) < 100 * len(findings)
    assert findings[0].to_dict()["metrics"] == findings[0].metrics  # the full form is still there


def test_a_finding_in_html_escapes_text_from_the_trace():
    finding = _finding(title="<script>alert(1)</script>", message="kernel <b>&", suggestion="use \"x\"",
                       impact_ns=1500)
    page = finding._repr_html_()
    assert page == ("<div><b>critical</b> <code>gpu-idle</code>: &lt;script&gt;alert(1)&lt;/script&gt; (1.5 us at "
                    "stake)<p>kernel &lt;b&gt;&amp;</p><p><i>use &quot;x&quot;</i></p></div>")
    assert html.unescape(page).count("<script>") == 1 and "<script>" not in page


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
    in_python = f"no store at {missing}: traceparse.add(PATH) stores a trace first, or pass store= the folder of " \
                "an existing store"
    with pytest.raises(StoreError) as caught:
        sql("SELECT COUNT(*) AS n FROM events", store=missing)
    assert str(caught.value) == in_python
    with pytest.raises(StoreError) as caught:
        Store(missing).load("abc")
    assert str(caught.value) == f"abc: {in_python}"
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
