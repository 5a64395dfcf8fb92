"""The store: atomic writes, recognising content by hash, concurrent ingests, id resolution."""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import shutil

import polars as pl
import pytest

from helpers import FIXTURES
from traceparse.errors import StoreError
from traceparse.ingest import ingest
from traceparse.sources import sha256_of
from traceparse.store import Store, trace_id_for


@pytest.fixture
def sample(samples_dir, tmp_path):
    path = tmp_path / "resnet18_bs4.json.gz"
    shutil.copy(samples_dir / "torch" / "torch_resnet18_bs4.json.gz", path)
    return path


def test_ingest_writes_parquet_and_meta(sample, tmp_path):
    store = Store(tmp_path / "s")
    [result] = ingest([sample], store=store, tags={"batch": "4"})
    trace_id = result.meta.id
    assert trace_id == trace_id_for(sha256_of([sample]))
    assert store.ids() == [trace_id]
    entry = store.traces_dir / trace_id
    assert sorted(p.name for p in entry.iterdir()) == ["events.parquet", "meta.json"]
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["tags"] == {"batch": "4"} and meta["format"] == "torch"
    events = pl.read_parquet(entry / "events.parquet")
    assert events.height == meta["event_count"] > 0
    assert events["trace_id"].unique().to_list() == [trace_id]
    assert events["event_id"].to_list() == list(range(events.height))
    assert list(store.tmp_dir.iterdir()) == []


def test_same_content_is_recognised_by_hash(sample, tmp_path):
    store = Store(tmp_path / "s")
    first = ingest([sample], store=store)[0]
    copy = tmp_path / "renamed.json.gz"
    shutil.copy(sample, copy)
    second = ingest([copy], store=store, tags={"gpu": "h100"})[0]
    assert second.already_stored and second.meta.id == first.meta.id
    assert store.ids() == [first.meta.id]
    assert store.meta(first.meta.id).tags == {"gpu": "h100"}  # tags merge into the existing entry


def test_progress_counts_every_byte_read_before_the_bar(sample, tmp_path):
    """The first batch is read while the content is hashed, before the progress bar starts: its bytes still reach
    the bar, which ends at the file's size (the gzip file's own bytes); a stored trace shows no bar at all."""
    from contextlib import contextmanager

    bars: list[tuple[str, int, list[int]]] = []

    @contextmanager
    def factory(description, total):
        steps: list[int] = []
        bars.append((description, total, steps))
        yield steps.append

    store = Store(tmp_path / "s")
    ingest([sample], store=store, params={"chunk_bytes": 50_000}, progress_factory=factory)
    [(description, total, steps)] = bars
    assert description == f"reading {sample.name}" and total == sample.stat().st_size
    assert sum(steps) == sample.stat().st_size and len(steps) > 3
    again = ingest([sample], store=store, progress_factory=factory)[0]
    assert again.already_stored and len(bars) == 1


def test_crash_while_writing_leaves_no_entry(sample, tmp_path, monkeypatch):
    store = Store(tmp_path / "s")
    import traceparse.store as store_module

    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing the metadata

    monkeypatch.setattr(store_module, "_write_json", boom)
    with pytest.raises(KeyboardInterrupt):
        ingest([sample], store=store)
    assert store.ids() == []
    assert list(store.tmp_dir.iterdir()) == []
    assert not any(store.traces_dir.iterdir())


def _ingest_in_process(args):
    path, root = args
    from traceparse.ingest import ingest as run
    from traceparse.store import Store as S

    return run([path], store=S(root))[0].meta.id


def test_concurrent_ingests_do_not_corrupt(sample, tmp_path):
    root = tmp_path / "s"
    other = tmp_path / "other.json"
    other.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", '
                     '"pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"device": 0, "stream": 7}}]}')
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        ids = pool.map(_ingest_in_process, [(str(sample), str(root)), (str(sample), str(root)),
                                            (str(other), str(root)), (str(sample), str(root))])
    store = Store(root)
    assert sorted(set(ids)) == store.ids()
    assert len(store.ids()) == 2
    for trace_id in store.ids():  # every entry complete and readable
        assert store.load(trace_id).events.height == store.meta(trace_id).event_count
    assert list(store.tmp_dir.iterdir()) == []


def test_resolve_id_prefix_and_errors(sample, tmp_path):
    store = Store(tmp_path / "s")
    trace_id = ingest([sample], store=store)[0].meta.id
    assert store.resolve_id(trace_id[:5]) == trace_id
    with pytest.raises(StoreError, match="^zzz: no such file, and no trace with this id"):
        store.resolve_id("zzz")
    assert store.last_id() == trace_id
    store.remove(trace_id)
    assert store.ids() == []
    with pytest.raises(StoreError, match="is empty: ingest a trace first"):
        store.last_id()


def test_summary_of_small_batches_is_that_of_the_whole(tmp_path):
    """The stored summary (events per kind, first start, last end) is the same whether a trace comes in one
    batch (one polars query) or in batches of a few hundred rows (read in Python, as a small rank's), and is
    the one computed from the events themselves."""
    from traceparse.ingest import read_paths
    from traceparse.store import _Summary

    events = read_paths([FIXTURES / "torch" / "alexnet_bs16.json.gz"])[0].events
    assert events.height > 1024  # 1,433 rows: the whole in one query
    whole, parts = _Summary(), _Summary()
    whole.add(events)
    for i in range(0, events.height, 300):
        parts.add(events.slice(i, 300))
    rows = events.to_dicts()
    timed = [r for r in rows if r["start_ns"] is not None]
    expected = {
        "events_per_kind": dict(sorted(collections.Counter(str(r["kind"]) for r in rows).items())),
        "start_ns": min(r["start_ns"] for r in timed),
        "end_ns": max(r["start_ns"] + r["duration_ns"] for r in timed if r["duration_ns"] is not None),
    }
    expected["span_ns"] = expected["end_ns"] - expected["start_ns"]
    assert whole.result() == parts.result() == expected


def test_a_tiny_trace_is_written_plain_a_larger_one_compressed(tmp_path):
    """A trace of at most TINY_TRACE_ROWS rows (a small rank of a run of thousands) is written without
    compression or column statistics, which cost more than they save on a few rows; a larger one with zstd and
    statistics. Both read back to the rows written."""
    import pyarrow.parquet as pq

    from traceparse.store import TINY_TRACE_ROWS

    store = Store(tmp_path / "s")
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
         "args": {"device": 0, "stream": 7}}]}))
    for path, rows, codec in ((tiny, 1, "UNCOMPRESSED"), (FIXTURES / "torch" / "alexnet_bs4.json.gz", None, "ZSTD")):
        (result,) = ingest([path], store=store)
        events = store.entry_dir(result.meta.id) / "events.parquet"
        meta = pq.ParquetFile(events).metadata
        height = pl.read_parquet(events).height
        assert height == result.meta.event_count == (rows or height)
        assert (height <= TINY_TRACE_ROWS) == (codec == "UNCOMPRESSED")
        column = meta.row_group(0).column(meta.schema.names.index("start_ns"))
        assert column.compression == codec
        assert column.is_stats_set == (codec == "ZSTD")


def _watched(hash_function, outcome: list):
    """``hash_function`` noting in ``outcome`` whether each call finished or was told to stop."""
    from traceparse.sources import HashStopped

    def hashing(*args):
        try:
            digest = hash_function(*args)
        except HashStopped:
            outcome.append("stopped")
            raise
        outcome.append("finished")
        return digest

    return hashing


def _sparse_csv(tmp_path):
    """A 1 GiB sparse file whose first 200 bytes are an nsys CSV report's, then NUL bytes."""
    path = tmp_path / "sparse_cuda_gpu_trace.csv"
    with open(path, "wb") as f:
        f.write((FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv").read_bytes()[:200])
        f.truncate(1 << 30)
    return path


def test_a_refused_file_stops_its_hash(tmp_path, monkeypatch):
    """The content hash runs beside the reader; a reader that refuses the file (here: a NUL byte at byte 200 of a
    1 GiB sparse file read as an nsys CSV) stops it, and the one-line error comes without hashing the rest: the
    hash ends by being told to stop, not by finishing, and nothing is stored."""
    import traceparse.ingest as ingest_module
    import traceparse.sources as sources

    outcome = []
    monkeypatch.setattr(ingest_module, "sha256_of", _watched(ingest_module.sha256_of, outcome))
    monkeypatch.setattr(sources, "_HASH_PIECE", 4096)  # 262,144 pieces: the refusal comes long before the end
    path = _sparse_csv(tmp_path)
    store = Store(tmp_path / "s")
    with pytest.raises(Exception) as e:
        ingest([path], store=store, fmt="nsys")
    assert str(e.value) == f"{path}: binary data (a NUL byte at byte 200): not a text file (a sparse or damaged file?)"
    assert outcome == ["stopped"]
    assert store.ids() == []


def test_hashes_worked_out_ahead_read_each_file_once(tmp_path, monkeypatch):
    """``traceparse ingest`` hashes its files while it starts (:class:`FileHashes`): the trace gets the same id as
    a hash worked out on the spot, each file is read for its hash once, and a file it was not given (one under
    a directory) is hashed when asked for."""
    import traceparse.sources as sources

    read = collections.Counter()
    real = sources._file_sha256

    def counted(path, stop=None):
        read[path.name] += 1
        return real(path, stop)

    monkeypatch.setattr(sources, "_file_sha256", counted)
    a = tmp_path / "a.json"
    a.write_bytes((FIXTURES / "torch" / "alexnet_bs4.json.gz").read_bytes())
    b = tmp_path / "b.json"
    b.write_bytes(b"x" * 100_000)
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "c.txt").write_bytes(b"c")
    ahead = sources.FileHashes([a, b, folder, a])
    try:
        assert sha256_of([b], ahead=ahead) == hashlib.sha256(b"x" * 100_000).hexdigest()
        assert sha256_of([a, folder], ahead=ahead) == sha256_of([a, folder])
        store = Store(tmp_path / "s")
        [result] = ingest([a], store=store, ahead=ahead)
    finally:
        ahead.close()
    assert result.meta.id == trace_id_for(hashlib.sha256(a.read_bytes()).hexdigest())
    # a and b by the thread ahead; a and c again by the plain sha256_of([a, folder]) of the check above
    assert read == {"a.json": 2, "b.json": 1, "c.txt": 2}


def test_hashing_ahead_stops_when_closed(tmp_path, monkeypatch):
    """A file refused before its hash is done (a 1 GiB sparse file) is not hashed to its end: ``close`` stops the
    thread, and a caller told to stop gets :class:`HashStopped` at once instead of waiting."""
    import threading
    import time

    import traceparse.sources as sources

    monkeypatch.setattr(sources, "_HASH_PIECE", 4096)  # 262,144 pieces: closing comes long before the end
    path = tmp_path / "sparse.json"
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    ahead = sources.FileHashes([path])
    stop = threading.Event()
    stop.set()
    with pytest.raises(sources.HashStopped):
        ahead.file_sha256(path, stop)
    ahead.close()
    deadline = time.monotonic() + 10
    while path not in ahead._results and time.monotonic() < deadline:  # the thread notes how its hash ended
        time.sleep(0.01)
    assert isinstance(ahead._results[path], sources.HashStopped)


def test_the_cli_refuses_a_file_without_hashing_it_to_the_end(tmp_path, monkeypatch, capsys):
    """The same through ``traceparse ingest``: the refusal is the one-line error, nothing is stored, and the
    hash started ahead of the reader is stopped (it would take seconds on 1 GiB)."""
    import traceparse.sources as sources
    from traceparse.cli import main

    outcome = []
    monkeypatch.setattr(sources, "_file_sha256", _watched(sources._file_sha256, outcome))
    monkeypatch.setattr(sources, "_HASH_PIECE", 4096)
    path = _sparse_csv(tmp_path)
    code = main(["ingest", str(path), "--format", "nsys", "--store", str(tmp_path / "s"), "--quiet"])
    assert code != 0
    err = capsys.readouterr().err
    assert f"{path}: binary data (a NUL byte at byte 200)" in err.replace("\n", "")
    import threading
    for t in threading.enumerate():
        if t.name == "traceparse-hash-ahead":
            t.join(timeout=5)
    assert outcome == ["stopped"]
    assert not list((tmp_path / "s").glob("traces/*/meta.json"))
