"""The torch reader's fast path (Arrow columns: plugins/readers/torch_profiler/columnar.py) and its careful path
(msgspec structs, then rows) give one answer: the same table, warnings, metadata and errors on every torch
fixture, the shared samples and the hostile corpus (tests/test_hostile_json.py, tests/test_fuzz.py); and times
stay exact to the nanosecond past 2^53 ns, where a float64 no longer holds them.

The careful path is the reader with ``fast=False``. Each file is read whole (one chunk, the default size) and in
chunks of a few kilobytes, so that cuts fall inside names, arguments and the damage; both paths get the same cuts
(the shared decoder makes them), so the comparison is of what each makes of a chunk.
"""

from __future__ import annotations

import gzip
import json
import random
from decimal import Decimal
from pathlib import Path

import pytest

import traceparse_plugins.readers.torch_profiler as torch_reader
from helpers import FIXTURES, us_to_ns
from test_fuzz import _json_cases
from test_hostile_json import BYTE_CASES, CASES, SEEDS, _mutants
from traceparse.errors import InputError
from traceparse.ingest import read_paths

def _kineto(path: Path) -> bool:
    """The torch reader claims it (an execution trace beside a Kineto trace is another reader's)."""
    from traceparse.sources import read_head
    from traceparse_plugins.readers.torch_profiler.sniff import sniff

    return sniff(path, read_head(path)) > 0


TORCH_FIXTURES = sorted(p for p in (FIXTURES / "torch").rglob("*.json*") if _kineto(p))


def _hostile() -> list[tuple[str, bytes]]:
    out = [(f"named:{k}", v.encode()) for k, v in CASES.items()] + [(f"bytes:{k}", v) for k, v in BYTE_CASES.items()]
    rng = random.Random(1212)  # the corpus of test_hostile_json.test_mutation_corpus
    for seed in SEEDS:
        raw = seed.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        out += [(f"mutant:{seed.name}:{i}", m) for i, m in enumerate(_mutants(data, rng, 90))]
    out += [(f"fuzz:{name}", data) for name, _, data in _json_cases()]
    return out


HOSTILE = _hostile()


class _Counting:
    """The reader's fast path, counting the chunks it read and those it left to the careful path."""

    def __init__(self, monkeypatch):
        self.read = self.left = 0
        fast = torch_reader.fast_rows

        def counted(data):
            done = fast(data)
            if done is None:
                self.left += 1
            else:
                self.read += 1
            return done

        monkeypatch.setattr(torch_reader, "fast_rows", counted)


def _outcome(path: Path, **params) -> tuple:
    """(error, None...) or (None, table, warnings, extra, devices) of the torch reader with ``params`` (a small
    file too is cut into chunks, as a large one: ``small_bytes`` 0, unless given)."""
    try:
        trace = read_paths([path], fmt="torch", params={"workers": 0, "small_bytes": 0, **params})[0]
        events = trace.events
    except InputError as exc:
        return str(exc), None, None, None, None
    return None, events, list(trace.meta.warnings), trace.meta.extra, trace.meta.devices


def _assert_same(careful: tuple, fast: tuple, what: str) -> None:
    assert careful[0] == fast[0], what
    if careful[0] is None:
        assert careful[1].equals(fast[1]), what
        assert careful[2:] == fast[2:], what


@pytest.mark.parametrize("path", TORCH_FIXTURES, ids=[str(p.relative_to(FIXTURES)) for p in TORCH_FIXTURES])
def test_fixture_same_table_and_fast(path, monkeypatch):
    """Every torch fixture: the same outcome both ways, whole and cut into 20 KB chunks; and the fast path read
    the chunks, except where an event needs the careful path (ROCm's text ids and streams, coerced and counted)."""
    counting = _Counting(monkeypatch)
    for chunk in (None, 20_000):
        params = {} if chunk is None else {"chunk_bytes": chunk}
        careful = _outcome(path, fast=False, **params)
        assert careful[0] is None, careful[0]
        _assert_same(careful, _outcome(path, **params), f"{path} chunk {chunk}")
    assert counting.read > 0
    coerced = any("not written as JSON integers" in w for w in careful[2])
    if not coerced:
        assert counting.left == 0, (counting.read, counting.left)


def test_samples_same_table(samples_dir, monkeypatch):
    """The shared real traces (several GPUs, memory events, NCCL, compiled graphs, a GPT): one answer, fast."""
    paths = sorted((samples_dir / "torch").glob("*.json.gz")) + sorted((samples_dir / "multirank").rglob("*.json.gz"))
    assert paths
    counting = _Counting(monkeypatch)
    for path in paths:
        _assert_same(_outcome(path, fast=False, chunk_bytes=200_000), _outcome(path, chunk_bytes=200_000), str(path))
    assert counting.read > len(paths) and counting.left == 0, (counting.read, counting.left)


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_same_outcome(case, tmp_path):
    """The hostile corpus: the same error (message and all), or the same table, warnings and metadata."""
    name, data = case
    path = tmp_path / "case.json"
    path.write_bytes(data)
    small = max(2000, len(data) // 40)  # cuts everywhere; the named cases are read whole too
    for chunk in ((None, small) if name.startswith(("named:", "bytes:")) else (small,)):
        params = {} if chunk is None else {"chunk_bytes": chunk}
        _assert_same(_outcome(path, fast=False, **params), _outcome(path, **params), f"{name} chunk {chunk}")


def _event(ts: str, dur: str, **extra) -> str:
    fields = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, **extra}
    body = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in fields.items())
    return (f'{{{body}, "ts": {ts}, "dur": {dur}, "args": {{"device": 0, "stream": 7, "correlation": 1, '
            f'"grid": [1, 2, 3], "block": [4, 5, 6]}}}}')


def test_times_exact_past_2_53_ns(tmp_path, monkeypatch):
    """Times at 2^53 ns and beyond (to 2^63 - 1 ns, the last the column holds) are exact, as in the file: a
    float64 of microseconds would be off there by up to a microsecond."""
    times = ["9007199254740.991", "9007199254740.992", "9007199254740.993", "9007199254740.995",
             "123456789012345.678", "9223372036854775.807", "1790857026000000.001", "0.001", "7"]
    events = [_event(t, "0") for t in times] + [_event("0", "9223372036854775.807")]
    filler = [_event(str(1000 + i), "1.5", name=f"filler {i}") for i in range(200)]
    path = tmp_path / "wide.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(events + filler) + "\n]}")
    counting = _Counting(monkeypatch)
    fast = _outcome(path, chunk_bytes=4_000)
    assert counting.read > 0 and counting.left == 0
    expected = [us_to_ns(Decimal(t)) for t in times]
    assert expected[2] == 2 ** 53 + 1 and expected[5] == 2 ** 63 - 1
    table = fast[1]
    assert table["start_ns"].to_list()[: len(times) + 1] == expected + [0]
    assert table["duration_ns"].to_list()[: len(times) + 1] == [0] * len(times) + [2 ** 63 - 1]
    assert float(Decimal(times[2])) * 1000 != expected[2]  # what a float would have given
    _assert_same(_outcome(path, fast=False, chunk_bytes=4_000), fast, "wide times")


@pytest.mark.parametrize("value,left", [('"0x0"', True), ("7.0", True), ("2147483648", True), ("7", False)])
def test_a_value_the_careful_path_coerces_is_left_to_it(value, left, tmp_path, monkeypatch):
    """A stream written as text (ROCm) or as a float, a device past Int32: that chunk is read by the careful
    path, which coerces and counts it; a plain integer is read by the fast path."""
    events = [_event(str(i), "1") for i in range(50)]
    events[10] = events[10].replace('"stream": 7', f'"stream": {value}').replace('"device": 0', f'"device": {value}')
    path = tmp_path / "coerced.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [' + ",\n".join(events) + "]}")
    counting = _Counting(monkeypatch)
    fast = _outcome(path)
    assert (counting.left > 0) == left
    _assert_same(_outcome(path, fast=False), fast, value)
    if left:
        assert any("not written as JSON integers" in w for w in fast[2])


def test_labels_thread_names_and_text_dims_in_one_chunk(tmp_path, monkeypatch):
    """A pid written as a label (Kineto's "Spans"), found by Arrow's parse (msgspec keeps no pid then) or guessed
    from a chunk's last bytes, a launch op's ``grid`` written as text and ``thread_name`` events (their names
    decoded again) in the same chunks: the fast path reads every chunk, with the careful path's table, warnings
    and thread names. (The whole file: the label 12 events in, more than 64 KiB before the chunk's end.)"""
    events = [_event(str(i), "1") for i in range(600)]
    events[12] = events[12].replace('"pid": 0', '"pid": "Spans"')
    events[20] = ('{"ph": "X", "cat": "cpu_op", "name": "launch", "pid": 3, "tid": 4, "ts": 20, "dur": 1, '
                  '"args": {"grid": "grid(100,)", "block": [1, 2, 3], "Input Dims": [[1, 2], []]}}')
    events[25] = '{"ph": "M", "name": "thread_name", "pid": 3, "tid": 4, "args": {"name": "thread 4 (pt_main)"}}'
    events[40] = '{"ph": "M", "name": "thread_name", "pid": "Spans", "tid": 9, "args": {"name": "thread 9 (x)"}}'
    events[45] = '{"ph": "M", "name": "thread_name", "pid": 5, "tid": 6, "args": {"name": "stream 6"}}'
    events[46] = '{"ph": "M", "name": "thread_name", "pid": 5, "tid": 7}'
    path = tmp_path / "labels.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [' + ",\n".join(events) + "]}")
    for chunk in (None, 3_000):
        params = {} if chunk is None else {"chunk_bytes": chunk}
        counting = _Counting(monkeypatch)
        fast = _outcome(path, **params)
        assert counting.read > 0 and counting.left == 0, (chunk, counting.read, counting.left)
        assert fast[3]["thread_names"] == {"3/4": "pt_main"}
        _assert_same(_outcome(path, fast=False, **params), fast, f"labels chunk {chunk}")


def _batches(path: Path, **params) -> list:
    """The raw batches the torch reader gives for ``path`` (before the core conforms them)."""
    from traceparse.reader import ReadOptions

    trace = torch_reader.TorchProfilerReader().read([path], ReadOptions(params={"workers": 0, **params}))
    return list(trace._source)


@pytest.mark.parametrize("path", TORCH_FIXTURES, ids=[str(p.relative_to(FIXTURES)) for p in TORCH_FIXTURES])
def test_small_file_one_careful_batch(path, monkeypatch):
    """A file under ``small_bytes`` is read whole by the careful path: one batch, the fast path never asked, and
    the same table, warnings and metadata as the fast and the careful path cutting it into chunks."""
    size = torch_reader.content_bytes(path)
    counting = _Counting(monkeypatch)
    small = _outcome(path, small_bytes=size + 1)
    assert counting.read == counting.left == 0
    assert small[0] is None, small[0]
    _assert_same(_outcome(path, fast=False, chunk_bytes=20_000), small, f"{path} careful in chunks")
    _assert_same(_outcome(path), small, f"{path} fast")
    assert counting.read + counting.left > 0  # the fast path was asked when the file was not small
    counting.read = counting.left = 0
    batches = _batches(path, small_bytes=size + 1)
    # one batch, unless the file is larger than a chunk (PyTorch 1.8's ResNet50, 20 MB: a small file is one
    # under 1 MiB unless told otherwise, as here)
    assert len(batches) == -(-size // torch_reader.CHUNK_BYTES) and counting.read == counting.left == 0
    assert len(_batches(path, small_bytes=size)) >= 1 and counting.read + counting.left > 0  # at the limit


def test_small_is_the_default_under_1_mib(tmp_path, monkeypatch):
    """By default a file of less than 1 MiB (content, a gzip file's uncompressed size) is small, one of
    1 MiB or more is not; ``small_bytes`` 0 makes no file small."""
    assert torch_reader.SMALL_FILE_BYTES == 1024 * 1024
    events = [_event(str(i), "1", name=f"kernel {i:06d}") for i in range(6000)]
    text = '{"schemaVersion": 1, "traceEvents": [' + ",\n".join(events) + "]}"
    big = tmp_path / "big.json"
    big.write_text(text)
    assert len(text) >= 1024 * 1024
    small = tmp_path / "small.json.gz"
    small.write_bytes(gzip.compress(('{"schemaVersion": 1, "traceEvents": [' + ",\n".join(events[:100]) + "]}")
                                    .encode()))
    assert torch_reader.is_small(small) and not torch_reader.is_small(big)
    assert not torch_reader.is_small(small, 0)
    counting = _Counting(monkeypatch)
    assert len(_batches(small)) == 1 and counting.read == 0
    _batches(big)
    assert counting.read > 0
