"""One normalized Trace: what a reader hands back is the table the store keeps.

For every fixture and shared sample, ``reader.read(paths, ReadOptions()).events``
must equal ``Store.load(id).events`` after an ingest of the same paths, value
for value, and both must have exactly the schema's columns, in order, with the
schema's types. The one documented difference: ``trace_id`` is the store id,
so it is null in a trace read straight from a reader (it has no id yet) and the
id in every row of the stored one.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from helpers import FIXTURES, REPO
from traceparse.errors import InputError
from traceparse.ingest import ingest, plan
from traceparse.reader import ReadOptions
from traceparse.schema import DTYPES, KINDS, Kind
from traceparse.store import Store
from traceparse.trace import Trace, TraceMeta

SAMPLES = Path(os.environ.get("TRACEPARSE_SAMPLES", REPO.parent / "shared" / "samples"))
#: Files under fixtures/ that are notes or scripts, not profiler output.
NOT_INPUT_SUFFIXES = {".py", ".sh", ".md", ".tsv"}
NOT_INPUT_NAMES = {"versions.txt", "nsys_version.txt", "ncu_version.txt", "manifest.json"}
#: Directories a reader takes as one trace (TAU writes one file per node/context/thread or per metric).
TRACE_DIRS = {"cpi-mpi", "multi-cupti"}


def _inputs() -> list[Path]:
    """Every fixture (a file, or a directory holding one trace) and every shared torch, nsys and ncu sample."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if any(part in TRACE_DIRS for part in path.relative_to(FIXTURES).parts[:-1]):
            continue  # read with its directory
        if path.is_dir():
            if path.name in TRACE_DIRS:
                found.append(path)
            continue
        if path.suffix in NOT_INPUT_SUFFIXES or path.name in NOT_INPUT_NAMES:
            continue
        found.append(path)
    for folder in ("torch", "nsys", "ncu"):
        if (SAMPLES / folder).is_dir():
            found.extend(sorted(p for p in (SAMPLES / folder).iterdir() if p.is_file()))
    return found


INPUTS = _inputs()


def _label(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path.relative_to(SAMPLES.parent))


def assert_schema(events: pl.DataFrame) -> None:
    """``events`` has exactly the schema's columns, in order, with the schema's types."""
    assert list(events.schema.items()) == list(DTYPES.items())


def test_the_inputs_cover_every_format():
    """The parametrization below really walks the fixtures and samples (a wrong glob would pass vacuously)."""
    assert len(INPUTS) >= 80
    assert {p.name for p in INPUTS} >= {"resnet18_bs16.json.gz", "resnet18_bs8_cuda_gpu_trace.csv", "gpu_trace.log",
                                        "cpi-mpi", "multi-cupti", "ncu_raw_vgg11_bs16.csv", "array_form_unclosed.json"}


@pytest.mark.parametrize("path", INPUTS, ids=_label)
def test_reader_read_equals_store_load(path, tmp_path):
    """reader.read() and Store.load() after ingest give the same normalized table (trace_id aside: see module doc)."""
    try:
        groups = plan([path])
    except InputError as exc:  # not a format traceparse reads: ingest refuses it the same way
        with pytest.raises(InputError) as refused:
            ingest([path], store=Store(tmp_path / "store"))
        assert str(refused.value) == str(exc)
        return
    for reader, group in groups:
        try:
            read = reader.read(group, ReadOptions())
            direct = read.events
        except InputError as exc:  # bad input: the same refusal on both paths
            with pytest.raises(InputError) as refused:
                ingest(group, store=Store(tmp_path / "store"), fmt=reader.name)
            assert str(refused.value) == str(exc)
            continue
        store = Store(tmp_path / f"store-{reader.name}")
        [result] = ingest(group, store=store, fmt=reader.name)
        loaded = store.load(result.meta.id).events
        assert_schema(direct)
        assert_schema(loaded)
        assert read.meta.id is None and direct["trace_id"].null_count() == direct.height
        assert loaded["trace_id"].to_list() == [result.meta.id] * loaded.height
        assert loaded.height == result.meta.event_count
        assert_frame_equal(direct.with_columns(pl.lit(result.meta.id, dtype=pl.String).alias("trace_id")), loaded,
                           check_exact=True)
        assert direct["event_id"].to_list() == list(range(direct.height))


def _raw_rows() -> list[pl.DataFrame]:
    """Raw reader output in two batches: a subset of columns, kinds as text, no event_id."""
    return [
        pl.DataFrame({"kind": ["kernel", "memcpy"], "name": ["k", "HtoD"], "start_ns": [10, 30],
                      "duration_ns": [5, 7], "copy_kind": [None, "HtoD"]}),
        pl.DataFrame({"kind": ["api"], "name": ["cudaLaunchKernel"], "start_ns": [1], "duration_ns": [2]}),
    ]


def test_a_whole_table_and_streamed_batches_give_the_same_conformed_events():
    """A reader returning one DataFrame and one returning batches of it hand back the same table."""
    whole = Trace(pl.concat(_raw_rows(), how="diagonal"))
    streamed = Trace(iter(_raw_rows()))
    assert streamed.is_streamed and not whole.is_streamed
    for events in (whole.events, streamed.events):
        assert_schema(events)
        assert events["event_id"].to_list() == [0, 1, 2]
        assert events["kind"].dtype == Kind and events["kind"].to_list() == ["kernel", "memcpy", "api"]
        assert events["calls"].to_list() == [1, 1, 1]
        assert events["copy_kind"].to_list() == [None, "HtoD", None]
        assert events["trace_id"].null_count() == 3
    assert_frame_equal(whole.events, streamed.events, check_exact=True)


def test_batches_are_conformed_and_numbered_across_batches():
    """Trace.batches() gives each batch conformed, event_id continuing from the batch before."""
    batches = list(Trace(iter(_raw_rows()), TraceMeta(id="abc")).batches())
    assert [b["event_id"].to_list() for b in batches] == [[0, 1], [2]]
    for batch in batches:
        assert_schema(batch)
        assert batch["trace_id"].to_list() == ["abc"] * batch.height
    [one] = list(Trace(pl.concat(_raw_rows(), how="diagonal")).batches())
    assert_frame_equal(one, pl.concat(batches).with_columns(pl.lit(None, dtype=pl.String).alias("trace_id")),
                       check_exact=True)


def test_trace_id_follows_the_id_given_after_reading():
    """A trace read before it had an id (reader.read, then the core names it) gets the id in every row."""
    trace = Trace(pl.concat(_raw_rows(), how="diagonal"))
    assert trace.events["trace_id"].null_count() == 3
    trace.meta.id = "0123456789abcdef"
    assert trace.events["trace_id"].to_list() == ["0123456789abcdef"] * 3
    assert list(trace.batches())[0]["trace_id"].to_list() == ["0123456789abcdef"] * 3


def test_an_empty_trace_has_the_schema():
    """No batches at all, or one empty batch: an empty table with every column."""
    for trace in (Trace(iter([])), Trace(pl.DataFrame({"kind": pl.Series([], dtype=pl.String)}))):
        assert_schema(trace.events)
        assert trace.events.height == 0


def test_a_kind_outside_the_schema_is_refused():
    """Conforming checks kinds: a reader's typo cannot become a new kind."""
    trace = Trace(pl.DataFrame({"kind": ["kernal"], "name": ["k"]}))
    with pytest.raises(ValueError, match="'kernal' is not one of " + ", ".join(KINDS)):
        trace.events
