"""Store.load keeps what the store wrote as it is (no second validation); an older layout is conformed again."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

from traceparse.ingest import ingest, read_paths
from traceparse.run import _hashes, _share_cores
from traceparse.schema import DTYPES
from traceparse.store import Store


def test_stored_trace_is_loaded_as_written(samples_dir, tmp_path):
    path = samples_dir / "torch" / "torch_resnet18_bs4.json.gz"
    store = Store(tmp_path / "store")
    meta = ingest([path], store=store)[0].meta
    trace = store.load(meta.id)
    assert not trace.is_streamed
    written = pl.read_parquet(store.events_path(meta.id))
    assert trace.events is not None and trace.events.equals(written)
    direct = read_paths([path])[0].events.with_columns(pl.lit(meta.id, dtype=pl.String).alias("trace_id"))
    assert_frame_equal(direct, trace.events)


def test_an_older_layout_is_conformed_on_load(samples_dir, tmp_path):
    path = samples_dir / "torch" / "torch_resnet18_bs4.json.gz"
    store = Store(tmp_path / "store")
    meta = ingest([path], store=store)[0].meta
    events_path = store.events_path(meta.id)
    stored = pl.read_parquet(events_path)
    stored.drop("process_group", "seq").with_columns(pl.col("kind").cast(pl.String)).write_parquet(events_path)
    loaded = store.load(meta.id).events
    assert list(loaded.schema.items()) == list(DTYPES.items())
    assert loaded.drop("process_group", "seq").equals(stored.drop("process_group", "seq"))
    assert loaded["seq"].null_count() == loaded.height


def test_ranks_read_at_once_share_the_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    tasks = [("tmp", i, "torch", [f"rank{i}.json"], None, "sha") for i in range(8)]
    shared = _share_cores(tasks, 4)
    assert [t[4] for t in shared] == [{"workers": 3}] * 8  # 4 ranks at once, each 1 + 3 decoding processes
    assert [t[:4] + t[5:] for t in shared] == [t[:4] + t[5:] for t in tasks]
    assert _share_cores(tasks, 16)[0][4] == {"workers": 0, "threads": 1}  # a rank a core: one decoding thread
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert [t[4] for t in _share_cores(tasks, 2)] == [{"workers": 0, "threads": 1}] * 8  # the 2-core box
    assert _share_cores([tasks[0][:4] + ({"threads": 2},) + tasks[0][5:]], 2)[0][4] == {"workers": 0, "threads": 2}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    given = [("tmp", 0, "torch", ["r.json"], {"workers": 1, "chunk_bytes": 5}, "sha")]
    assert _share_cores(given, 4)[0][4] == {"workers": 1, "chunk_bytes": 5}
    assert _share_cores(tasks, 1) == tasks


def test_rank_hashes_are_each_files_sha256(tmp_path):
    """The ranks' hashes, worked out several at once, are each file's own sha256, in the ranks' order."""
    import hashlib

    groups = []
    for i in range(5):
        path = tmp_path / f"rank{i}.json"
        path.write_bytes(b'{"traceEvents": []}' + bytes([i]) * (i * 300_000))
        groups.append([path])
    expected = [hashlib.sha256(group[0].read_bytes()).hexdigest() for group in groups]
    assert _hashes(groups) == expected
    assert _hashes(groups[:1]) == expected[:1] and _hashes([]) == []
