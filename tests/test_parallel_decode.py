"""The torch reader decoding a trace in worker processes (chrome_json.map_chunks) gives what one process gives.

Every test reads the same file serially (``workers`` 0) and in worker processes with a chunk size far smaller
than the file, so that cuts fall everywhere, and checks the parallel table against an independent parse too.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import pytest

from helpers import us_to_ns
from test_torch_reader import KIND_OF, independent_prefix
from traceparse.errors import InputError
from traceparse.ingest import read_paths
from traceparse_plugins.readers.chrome_json.decoder import _last_candidate

SERIAL = {"workers": 0, "chunk_bytes": 2_000}
PARALLEL = {"workers": 2, "chunk_bytes": 2_000}


def read(path, params):
    trace = read_paths([path], params=params)[0]
    return trace.events, trace.meta


def kept(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in KIND_OF]


def test_real_trace_same_table_with_workers(samples_dir):
    path = samples_dir / "torch" / "torch_resnet18_bs4.json.gz"
    serial, serial_meta = read(path, {"workers": 0, "chunk_bytes": 20_000})
    parallel, parallel_meta = read(path, {"workers": 2, "chunk_bytes": 20_000})
    whole, _ = read(path, {"workers": 0})
    assert parallel.equals(serial) and parallel.equals(whole)
    assert parallel_meta.devices == serial_meta.devices and parallel_meta.extra == serial_meta.extra
    assert "pt_autograd_0" in parallel_meta.extra["thread_names"].values()  # collected in the workers too
    with gzip.open(path, "rt") as f:
        assert parallel.height == len(kept(json.load(f)["traceEvents"]))


def tricky_trace(n: int = 300) -> dict:
    """Events whose names and arguments hold what looks like an event boundary: '},{' in strings (with escaped
    quotes and backslashes), and arrays of objects nested in args."""
    names = ['op},{"ph": "X"}', 'a"},{"b', "back\\\\slash},{", "[[1, 2]], {x}", 'quote \\"}, {\\" end', "plain"]
    events = []
    for i in range(n):
        events.append({"ph": "X", "cat": "cpu_op", "name": names[i % len(names)] + f" #{i}", "pid": 1, "tid": 2,
                       "ts": round(1000 + i + (i % 1000) / 1000, 3), "dur": 1.5,
                       "args": {"External id": i, "nested": [{"a": 1}, {"b": "},{"}], "Input Dims": [[i, 2], []]}})
        if i % 7 == 0:
            events.append({"ph": "f", "id": i, "pid": 1, "tid": 2, "ts": 1000 + i, "cat": "ac2g", "name": "flow"})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], "traceEvents": events,
            "traceName": "tricky"}


@pytest.mark.parametrize("indent", [None, 2])
def test_cuts_only_at_event_boundaries(tmp_path, indent):
    text = json.dumps(tricky_trace(), indent=indent)
    path = tmp_path / "tricky.json"
    path.write_text(text)
    truth = kept(json.loads(text, parse_float=Decimal)["traceEvents"])
    serial, _ = read(path, SERIAL)
    parallel, meta = read(path, PARALLEL)
    assert parallel.equals(serial)
    assert parallel["name"].to_list() == [e["name"] for e in truth]
    assert parallel["external_id"].to_list() == [e["args"]["External id"] for e in truth]
    assert parallel["start_ns"].to_list() == [us_to_ns(e["ts"]) for e in truth]
    assert parallel["input_dims"].to_list() == [json.dumps(e["args"]["Input Dims"], separators=(",", ":"))
                                                for e in truth]
    assert meta.extra["traceName"] == "tricky"


def test_last_candidate_is_any_brace_comma_brace():
    buf = bytearray(b'{"a": 1}, {"name": "x},{y"}  ,\n {"b": 2}')
    end, start = _last_candidate(buf)
    assert buf[end - 1:end] == b"}" and buf[start:start + 1] == b"{" and buf[start:] == b'{"b": 2}'
    assert _last_candidate(bytearray(b'{"a": 1}')) is None


def test_truncated_array_keeps_complete_events_with_workers(samples_dir, tmp_path):
    raw = gzip.open(samples_dir / "torch" / "torch_resnet18_bs4.json.gz").read()
    cut = raw[: len(raw) * 2 // 3]
    path = tmp_path / "cut.json"
    path.write_bytes(cut)
    complete = independent_prefix(cut)
    serial, serial_meta = read(path, {"workers": 0, "chunk_bytes": 20_000})
    parallel, parallel_meta = read(path, {"workers": 2, "chunk_bytes": 20_000})
    assert parallel.height == len(complete) > 0
    assert parallel.equals(serial)
    warnings = [w for w in parallel_meta.warnings if "ends early" in w]
    assert warnings == [w for w in serial_meta.warnings if "ends early" in w]
    assert len(warnings) == 1 and warnings[0].endswith("complete events")


def test_truncated_gzip_stream_with_workers(samples_dir, tmp_path):
    data = (samples_dir / "torch" / "torch_resnet18_bs4.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    serial, serial_meta = read(path, {"workers": 0, "chunk_bytes": 20_000})
    parallel, parallel_meta = read(path, {"workers": 2, "chunk_bytes": 20_000})
    assert parallel.equals(serial) and parallel.height > 0
    assert [w for w in parallel_meta.warnings if "gzip" in w] == [w for w in serial_meta.warnings if "gzip" in w]
    assert any("truncated gzip stream" in w for w in parallel_meta.warnings)


def test_bad_time_names_the_same_record(tmp_path):
    doc = tricky_trace(200)
    bad = 150
    doc["traceEvents"][bad]["ts"] = "12abc"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    messages = []
    for params in (SERIAL, PARALLEL):
        with pytest.raises(InputError) as err:
            read(path, params)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert f"traceEvents[{bad}].ts: a time in microseconds, got '12abc'" in messages[1]


def test_bad_type_names_the_same_record(tmp_path):
    doc = tricky_trace(200)
    doc["traceEvents"][120]["pid"] = [1]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    messages = []
    for params in (SERIAL, PARALLEL):
        with pytest.raises(InputError) as err:
            read(path, params)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "traceEvents[120].pid" in messages[1]


# -- issue 22 item 7: cutting is linear whatever the names hold ------------------------------------------------
HOSTILE = ['},{', '"},{"', "\\", '\\"},{\\"', "{[", "]}", "},\n{", 'x"', "\\\\}, {"]


def _events(n: int) -> list[bytes]:
    return [json.dumps({"ph": "X", "cat": "cpu_op", "name": HOSTILE[i % len(HOSTILE)] * (1 + i % 5) + f"#{i}",
                        "pid": 1, "tid": 1, "ts": i, "dur": 1,
                        "args": {"nested": [{"a": "},{"}, {"b": [1, {"c": "]"}]}]}}).encode() for i in range(n)]


def test_event_ends_are_the_real_boundaries():
    """Against json.dumps's own event texts: every real boundary and no fake one, strings and nesting skipped."""
    from traceparse_plugins.readers.chrome_json.decoder import event_ends

    events = _events(60)
    buf = b"[" + b", ".join(events) + b', {"ph": "X", "name": "},{ unclosed'
    expected, pos = [], 1
    for text in events:
        pos += len(text)
        expected.append((pos, pos + 2))
        pos += 2
    assert event_ends(buf) == expected


def test_split_events_decodes_a_bounded_number_of_times():
    """Every event name holds fake boundaries: the whole events before the last real one come out after at most
    2 + log2(n) + 1 decodes (trying fake candidates one by one decoded the buffer up to 1,000 times)."""
    from pathlib import Path

    import msgspec

    from traceparse_plugins.readers.chrome_json.decoder import _Guarded, _split_events
    from traceparse_plugins.readers.torch_profiler.kineto import KinetoEvent

    class Counting(_Guarded):
        calls = 0

        def decode(self, data, count=True):
            Counting.calls += 1
            return super().decode(data, count)

    events = _events(2000)
    buf = bytearray(b"[" + b",".join(events) + b',{"ph": "X", "name": "},{},{},{')
    decoder = Counting(msgspec.json.Decoder(list[KinetoEvent]), Path("x.json"), [0])
    decoded, end = _split_events(Path("x.json"), decoder, buf, 0)
    assert len(decoded) == 2000 and [e.name for e in decoded] == [json.loads(t)["name"] for t in events]
    assert buf[end - 1:end] == b"}" and buf[end:end + 2] == b',{'
    assert Counting.calls <= 2 + 11 + 1


def test_names_full_of_boundaries_read_the_same_with_workers(tmp_path):
    """Names of `},{`, quotes and backslashes; small chunks, so almost every cut a worker gets is fake."""
    doc = b'{"schemaVersion": 1, "traceEvents": [' + b",".join(_events(400)) + b"]}"
    path = tmp_path / "hostile.json"
    path.write_bytes(doc)
    serial, _ = read(path, SERIAL)
    parallel, _ = read(path, PARALLEL)
    truth = kept(json.loads(doc)["traceEvents"])
    assert parallel.equals(serial) and parallel["name"].to_list() == [e["name"] for e in truth]


def test_a_wrongly_typed_key_after_the_events_is_refused_by_both(tmp_path):
    """One process refused it; the parallel decoder (msgspec's ValidationError is a DecodeError too) took it for
    a cut file and stored the trace with a false "truncated" warning."""
    doc = tricky_trace(200)
    events = doc.pop("traceEvents")
    path = tmp_path / "key_after.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "deviceProperties": 5}))
    messages = []
    for params in (SERIAL, PARALLEL):
        with pytest.raises(InputError) as err:
            read(path, params)
        messages.append(str(err.value))
    assert messages[0] == messages[1] == (f"{path}: deviceProperties: unexpected value in the document's keys: Expected "
                                          "`array | null`, got `int`")


def test_no_cut_before_an_empty_object():
    """A string full of "},{}" offers a candidate cut every three bytes: none is taken (the next event must
    have a key), so no worker decodes millions of empty objects that a merge throws away."""
    assert _last_candidate(bytearray(b'{"name": "},{},{},{}')) is None
    buf = bytearray(b'{"a": 1},\n  {"name": "},{},{}')
    end, start = _last_candidate(buf)
    assert (end, start) == (8, 12)


def test_two_decoding_threads_same_table(samples_dir):
    """Two decoding threads (the default on 2 cores) and many small chunks in flight: the table of one thread,
    in file order, every kept event and three counter rows per ``[memory]`` event of the raw file."""
    path = samples_dir / "torch" / "torch_resnet18_bs4.json.gz"
    one, one_meta = read(path, {"workers": 0, "threads": 0, "chunk_bytes": 20_000})
    two, two_meta = read(path, {"workers": 0, "threads": 2, "chunk_bytes": 20_000})
    assert two.equals(one) and two_meta.extra == one_meta.extra
    raw = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
    memory = [e for e in raw if e.get("name") == "[memory]" and e.get("ph") in ("i", "I") and e.get("args") is not None]
    assert two.height == len(kept(raw)) + 3 * len(memory)
    starts = [int(us_to_ns(Decimal(e["ts"]))) for e in kept(raw)]
    assert two.filter(two["kind"] != "counter")["start_ns"].to_list() == starts


def test_decoding_threads_default(monkeypatch):
    """Two decoding threads from 2 cores up (none on one core, none beside decoding processes); the parameter and
    TRACEPARSE_DECODE_THREADS say otherwise."""
    from traceparse_plugins.readers.chrome_json import decoder

    monkeypatch.delenv("TRACEPARSE_DECODE_THREADS", raising=False)
    monkeypatch.setattr(decoder, "_cores", lambda: 2)
    assert decoder.decode_threads(0) == 2 and decoder.decode_threads(3) == 0 and decoder.decode_threads(0, 1) == 1
    monkeypatch.setattr(decoder, "_cores", lambda: 1)
    assert decoder.decode_threads(0) == 0
    monkeypatch.setenv("TRACEPARSE_DECODE_THREADS", "3")
    assert decoder.decode_threads(0) == 3
