"""A stored table's columns that are null in every row are read as polars scalar columns: no memory per row.

A torch trace has none of the TAU, ncu, collective or JAX columns (23 of 52 in the 1 GB benchmark trace): read as
they are, they were half of its table in memory. The store's writer lists them in the events file's own metadata
(``traceparse.null_columns``); :func:`traceparse.events_file.read_events` reads the other columns and adds those as nulls.
The table must be the very one ``read_parquet`` gives, and a file rewritten without the list is read whole.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from helpers import FIXTURES
from traceparse import store as store_module
from traceparse.ingest import ingest
from traceparse.schema import DTYPES, conform
from traceparse.events_file import NULL_COLUMNS_KEY, read_events
from traceparse.store import Store, _write_events


def _listed(path) -> list[str] | None:
    found = pl.read_parquet_metadata(path).get(NULL_COLUMNS_KEY)
    return None if found is None else json.loads(found)


def _all_null(frame: pl.DataFrame) -> list[str]:
    """The oracle: the columns whose every value is null, counted row by row."""
    return sorted(c for c in frame.columns if frame[c].to_list().count(None) == frame.height)


@pytest.mark.parametrize("fixture, collectives", [("torch/resnet18_bs8.json.gz", False),
                                                  ("torch/multirank/fsdp4_slow_hook/rank2.json.gz", True)])
@pytest.mark.parametrize("small_rows", [store_module.SMALL_TRACE_ROWS, 10])  # written at once, or by the thread
def test_a_stored_trace_lists_its_null_columns_and_reads_as_read_parquet(fixture, collectives, small_rows, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(store_module, "SMALL_TRACE_ROWS", small_rows)
    store = Store(tmp_path / "store")
    [result] = ingest([FIXTURES / fixture], store=store, params={"chunk_bytes": 200_000})  # batch after batch
    trace_id = result.meta.id
    path = store.events_path(trace_id)
    whole = pl.read_parquet(path)
    listed = _listed(path)
    assert listed == _all_null(whole) and "name" not in listed and ("collective" in listed) != collectives
    read_columns = []
    real = pl.read_parquet
    monkeypatch.setattr(pl, "read_parquet", lambda *a, **k: read_columns.append(k.get("columns")) or real(*a, **k))
    events = read_events(path)
    assert read_columns == [[c for c in DTYPES if c not in listed]]  # the null ones are not read
    assert events.equals(whole) and events.schema == whole.schema == pl.Schema(DTYPES)
    assert store.load(trace_id).events.equals(whole)


def _batch(rows: int, first_id: int, **columns) -> pl.DataFrame:
    frame = pl.DataFrame({"kind": ["kernel"] * rows, "name": [f"k{i}" for i in range(rows)],
                          "start_ns": list(range(first_id, first_id + rows)), "duration_ns": [5] * rows, **columns})
    return conform(frame, trace_id="t", first_event_id=first_id)


@pytest.mark.parametrize("small_rows", [store_module.SMALL_TRACE_ROWS, 10])  # written at once, or by the thread
def test_a_column_null_in_one_batch_only_is_not_listed(small_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "SMALL_TRACE_ROWS", small_rows)
    batches = [_batch(40, 0, bytes=[None] * 40, flops=[None] * 40),
               _batch(30, 40, bytes=[None] * 29 + [7], flops=[None] * 30)]
    path = tmp_path / "events.parquet"
    count, _ = _write_events(iter(batches), path)
    assert count == 70
    listed = _listed(path)
    assert "bytes" not in listed and "flops" in listed and listed == _all_null(pl.concat(batches))
    assert read_events(path).equals(pl.read_parquet(path))
    assert read_events(path)["bytes"].to_list() == [None] * 69 + [7]


def test_a_file_rewritten_without_the_list_is_read_whole(tmp_path):
    path = tmp_path / "events.parquet"
    _write_events(iter([_batch(5, 0)]), path)
    assert "rank" in _listed(path)
    rewritten = pl.read_parquet(path).with_columns(pl.lit(3, dtype=pl.Int32).alias("rank"))
    rewritten.write_parquet(path)  # as a run's rank learnt late is set (traceparse.run): no list any more
    assert _listed(path) is None
    assert read_events(path)["rank"].to_list() == [3] * 5


def test_an_empty_trace_lists_nothing(tmp_path):
    path = tmp_path / "events.parquet"
    assert _write_events(iter([]), path)[0] == 0
    assert _listed(path) is None and read_events(path).height == 0


def test_several_files_read_as_one_with_the_columns_null_in_all_of_them_as_scalars(tmp_path, monkeypatch):
    """A group of a run's ranks: one frame, in the files' order, equal to ``read_parquet`` of them all; a column
    null in every file is not read, one null in some files only is (the ranks of an FSDP run: one has collectives,
    a torch rank without them beside it)."""
    store = Store(tmp_path / "store")
    paths = []
    for fixture in ("torch/resnet18_bs8.json.gz", "torch/multirank/fsdp4_slow_hook/rank2.json.gz",
                    "torch/alexnet_bs4.json.gz"):
        [result] = ingest([FIXTURES / fixture], store=store)
        paths.append(store.events_path(result.meta.id))
    listed = [set(_listed(p)) for p in paths]
    in_all = set.intersection(*listed)
    assert "collective" in listed[0] and "collective" not in in_all  # null in one file, not in all
    whole = pl.read_parquet(paths)
    read_columns = []
    real = pl.read_parquet
    monkeypatch.setattr(pl, "read_parquet", lambda *a, **k: read_columns.append(k.get("columns")) or real(*a, **k))
    events = read_events(paths)
    assert read_columns == [[c for c in DTYPES if c not in in_all]]
    assert events.equals(whole) and events.schema == whole.schema
    assert read_events(paths[:1]).equals(pl.read_parquet(paths[0]))


@pytest.mark.parametrize("listed", [True, False])
def test_a_store_written_before_a_column_joined_the_schema_reads_it_null(tmp_path, listed):
    """``peer_rank`` joined the schema after stores were written: a stored file without it (with and without its
    list of null columns) reads with the column null, in the schema's order, so queries that select it run."""
    from traceparse.measures.base import PartitionedEvents

    store = Store(tmp_path / "s")
    [result] = ingest([FIXTURES / "torch" / "resnet18_bs16.json.gz"], store=store)
    path = store.events_path(result.meta.id)
    old = read_events(path).drop("peer_rank")
    nulls = _all_null(old)
    old_path = tmp_path / "old.parquet"
    old.write_parquet(old_path, metadata={NULL_COLUMNS_KEY: json.dumps(nulls)} if listed else None)
    assert "peer_rank" not in pl.read_parquet_schema(old_path)
    back = read_events(old_path)
    assert back.columns == list(DTYPES) and back["peer_rank"].null_count() == back.height == old.height
    assert back.drop("peer_rank").equals(old)
    lazy = PartitionedEvents([old_path, old_path], ["a", "b"]).lazy().select("peer_rank", "name").collect()
    assert lazy.height == 2 * old.height and lazy["peer_rank"].null_count() == lazy.height
