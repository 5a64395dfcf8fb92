"""Hostile files for the torch, chrome and rocprof readers (issue 12.10): a one-line error (exit 2) or a counted warning,
never a traceback; decompression bounded.

Three parts: named cases (deep nesting, non-UTF-8 bytes, a directory or FIFO, a number of the wrong JSON type
in an integer field, out-of-range numbers); a deterministic mutation corpus of three small real fixtures run
through the three readers (seconds, in CI); gzip bombs of whitespace read in a subprocess whose peak RSS is
measured with :func:`resource.getrusage`.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from helpers import FIXTURES, REPO, refused, run_cli
from traceparse.errors import InputError
from traceparse.ingest import read_paths

READERS = ("torch", "chrome", "rocprof")
EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2,
         "args": {"device": 0, "stream": 7, "correlation": 1}}
#: The kernel after it on its stream (two equal kernels would be one recorded twice, kept once).
NEXT = {**EVENT, "ts": 4.5, "args": {**EVENT["args"], "correlation": 2}}


def _doc(events=None, **extra) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [], **extra, "traceEvents": events or [EVENT, NEXT]}


def _text(doc: dict) -> str:
    return json.dumps(doc)


DEEP = "[" * 100_000 + "]" * 100_000
CASES = {
    "deep_in_args": _text(_doc()).replace('"correlation": 1', f'"correlation": 1, "x": {DEEP}', 1),
    "deep_input_dims": _text(_doc()).replace('"correlation": 1', f'"correlation": 1, "Input Dims": {DEEP}', 1),
    "deep_top_level": _text(_doc()).replace('"traceEvents"', f'"zz": {DEEP}, "traceEvents"', 1),
    "deep_event_list": _text(_doc()).replace('"traceEvents": [', '"traceEvents": [' + DEEP + ", ", 1),
    "float_device": _text(_doc()).replace('"device": 0', '"device": 0.5', 1),
    "string_correlation": _text(_doc()).replace('"correlation": 1', '"correlation": "one"', 1),
    "object_stream": _text(_doc()).replace('"stream": 7', '"stream": {"a": 1}', 1),
    "float_pid": _text(_doc()).replace('"pid": 0', '"pid": 0.5', 1),
    "huge_pid": _text(_doc()).replace('"pid": 0', f'"pid": {2 ** 70}', 1),
    "huge_tid": _text(_doc()).replace('"tid": 7', f'"tid": {-(2 ** 65)}', 1),
    "huge_ts": _text(_doc()).replace('"ts": 1.5', '"ts": 1e400', 1),
    "huge_int_ts": _text(_doc()).replace('"ts": 1.5', f'"ts": {2 ** 70}', 1),
    "max_dur": _text(_doc()).replace('"dur": 2', f'"dur": {2 ** 63 - 1}', 1),
    "negative_huge_id": _text(_doc()).replace('"correlation": 1', f'"correlation": -{10 ** 30}', 1),
    "grid_past_int32": _text(_doc()).replace('"correlation": 1', '"correlation": 1, "grid": [4294967296, 1, 1]', 1),
    "grid_of_strings": _text(_doc()).replace('"correlation": 1', '"correlation": 1, "grid": ["a", 1, 1]', 1),
    "ts_object": _text(_doc()).replace('"ts": 1.5', '"ts": {"a": 1}', 1),
    "counter_huge": _text(_doc([{"ph": "C", "name": "c", "pid": 0, "tid": 0, "ts": 1, "args": {"v": 2 ** 70}}])),
    "memory_strings": _text(_doc([EVENT, {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3, "s": "t",
                                          "args": {"Bytes": "x", "Total Allocated": 1e300, "Total Reserved": -1,
                                                   "Device Id": 2 ** 40, "Device Type": 1}}])),
    "args_not_object": _text(_doc()).replace('"args": {"device": 0, "stream": 7, "correlation": 1}', '"args": 7', 1),
}
BYTE_CASES = {
    "non_utf8_name": _text(_doc()).encode().replace(b'"k"', b'"\xff\xfe"', 1),
    "non_utf8_key": _text(_doc()).encode().replace(b'"device"', b'"dev\xc3ice"', 1),
    "latin1_everywhere": _text(_doc()).replace('"k"', '"café"').encode("latin-1"),
    "utf16": _text(_doc()).encode("utf-16"),
    "nul_bytes": _text(_doc()).encode().replace(b'"k"', b'"k\x00\x00"', 1),
    # values the torch reader keeps raw (not decoded as strings) until they become columns; a byte flipped in
    # "Input type" of a real trace stopped the read with an internal error
    "non_utf8_input_type": _text(_doc([{**EVENT, "cat": "cpu_op", "name": "aten::mm", "args": {
        "Input Dims": [[2, 2], [2, 2]], "Input type": ["float", "Scal\udc9arList"]}}, EVENT])).encode().replace(
        b"\\udc9a", b"\x9a", 1),
}


def _assert_clean(code: int, err: str, path: Path) -> None:
    """Exit 0 (perhaps with warnings) or exit 2 with one line naming the file; never an internal error."""
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err.count("\n") == 1 and str(path) in err, err


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name", sorted(CASES) + sorted(BYTE_CASES))
def test_named_hostile_cases(name, reader, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / f"{name}.json"
    if name in CASES:
        path.write_text(CASES[name])
    else:
        path.write_bytes(BYTE_CASES[name])
    code, _, err = run_cli("ingest", "-q", "--format", reader, str(path))
    _assert_clean(code, err, path)
    if code == 0:
        code, _, err = run_cli("analyze", "-q")
        assert "Traceback" not in err and "internal error" not in err, err


def test_what_the_named_cases_give(tmp_path):
    """The outcome each policy promises: refusal in one line, or a counted warning."""
    def read(name: str, reader: str = "torch"):
        path = tmp_path / f"{name}.json"
        if name in CASES:
            path.write_text(CASES[name])
        else:
            path.write_bytes(BYTE_CASES[name])
        return path, read_paths([path], fmt=reader)[0]

    for name in ("deep_in_args", "deep_top_level"):
        with pytest.raises(InputError, match="nested too deeply"):
            read(name)
    path, trace = read("non_utf8_name")
    assert trace.events["name"][0] == "\ufffd\ufffd"
    assert f"{path}: 2 byte sequences not valid UTF-8; read as U+FFFD (the replacement character)" in trace.meta.warnings
    path, trace = read("non_utf8_input_type")
    assert trace.events["input_types"][0] == '["float","Scal\ufffdrList"]'
    assert f"{path}: 1 byte sequence not valid UTF-8; read as U+FFFD (the replacement character)" in trace.meta.warnings
    _, trace = read("float_device")
    assert trace.events["device_id"].to_list() == [0, 0]  # 0.5 is no device: the pid, which Kineto sets to it
    assert any("args.device 1× not an integer, left empty" in w for w in trace.meta.warnings)
    _, trace = read("grid_past_int32")
    assert trace.events["grid_x"].to_list() == [None, None]
    assert any("args.grid 1× out of the column's range" in w for w in trace.meta.warnings)
    with pytest.raises(InputError, match=r"traceEvents\[0\]\.ts: a time in microseconds.*out of range"):
        read("huge_ts")
    _, trace = read("huge_pid", "chrome")
    assert trace.events["pid"].to_list() == [None, 0]  # a pid past Int64 is no process id: left empty
    assert any("pid 1× out of the column's range" in w for w in trace.meta.warnings)


@pytest.mark.parametrize("reader", READERS)
def test_directory_and_fifo(reader, tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    reg_reader = __import__("traceparse.plugins", fromlist=["registry"]).registry().reader(reader)
    from traceparse.reader import ReadOptions

    for path, message in ((folder, "a directory, not a file"), (fifo, "not a regular file")):
        # straight through the reader (no core check first): refused before anything opens it (a FIFO would block)
        with pytest.raises(InputError) as info:
            reg_reader.read([path], ReadOptions()).events
        assert message in str(info.value) and str(path) in str(info.value)
        code, _, err = run_cli("--store", str(tmp_path / "store"), "ingest", "--format", reader, str(path))
        _assert_clean(code, err, path)
        assert code == 2


# -- a mutation corpus ----------------------------------------------------------------------------------------
SEEDS = [FIXTURES / "torch" / "rocm" / "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
         FIXTURES / "chrome" / "handwritten" / "object_form.json",
         FIXTURES / "rocprof" / "rocm_blogs_hip_trace_results.json.gz"]
ODD_VALUES = [b"1e400", b"-1e400", b"18446744073709551616", b"-9223372036854775809", b'"0x1"', b'"abc"', b"1.5",
              b"null", b"true", b"[]", b"{}", b'"\\ud800"', b"-0", b"1E+2", b'"\xff"', b"[[[[[[[[[[[[[[1]]]]]]]]]]]]]]"]


def _mutants(data: bytes, rng: random.Random, n: int) -> list[bytes]:
    """``n`` deterministic mutants: a number replaced by an odd value, bytes flipped, cut, spliced, nested."""
    numbers = [i for i in range(len(data) - 1) if data[i:i + 1] in b":" and data[i + 1:i + 2] in b" 0123456789-"]
    out = []
    for k in range(n):
        d = bytearray(data)
        op = k % 6
        if op == 0 and numbers:  # a value of the wrong type or range in a field
            for _ in range(rng.randint(1, 3)):
                i = rng.choice(numbers) + 1
                j = i
                while j < len(d) and d[j:j + 1] not in b",}]":
                    j += 1
                d[i:j] = b" " + rng.choice(ODD_VALUES)
        elif op == 1:  # random bytes
            for _ in range(rng.randint(1, 8)):
                d[rng.randrange(len(d))] = rng.randrange(256)
        elif op == 2:  # cut short
            d = d[: rng.randrange(1, len(d))]
        elif op == 3:  # a slice duplicated elsewhere
            i, j = sorted(rng.sample(range(len(d)), 2))
            at = rng.randrange(len(d))
            d[at:at] = d[i:min(j, i + 500)]
        elif op == 4:  # deep nesting spliced in after a colon
            at = rng.choice(numbers) + 1 if numbers else 1
            depth = rng.choice([50, 5000, 200_000])
            d[at:at] = b"[" * depth + b"]" * depth + b","
        else:  # invalid UTF-8 inside a string
            at = d.find(b'"name"', rng.randrange(len(d)))
            if at > 0:
                d[at + 9:at + 9] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        out.append(bytes(d))
    return out


def test_mutation_corpus(tmp_path):
    """Every mutant of two small real fixtures: read by both readers, an InputError at worst; under 30 s."""
    started = time.monotonic()
    rng = random.Random(1212)
    outcomes = {"read": 0, "refused": 0}
    for seed in SEEDS:
        raw = seed.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        for i, mutant in enumerate(_mutants(data, rng, 90)):
            path = tmp_path / f"{seed.name.split('.')[0]}_{i}.json"
            path.write_bytes(mutant)
            if i % 10 == 0:  # some gzip-compressed too, cut or whole
                gz = gzip.compress(mutant)
                path = path.with_suffix(".json.gz")
                path.write_bytes(gz[: len(gz) - (i % 20)] if i % 20 else gz)
            for reader in READERS:
                try:
                    trace = read_paths([path], fmt=reader)[0]
                    trace.events  # every batch conformed
                    outcomes["read"] += 1
                except InputError as exc:
                    assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
                    outcomes["refused"] += 1
    assert outcomes["read"] > 50 and outcomes["refused"] > 50, outcomes
    assert time.monotonic() - started < 30


# -- bounded decompression --------------------------------------------------------------------------------------
_CHILD = """
import resource, sys
from traceparse.errors import InputError
from traceparse.ingest import read_paths
try:
    trace = read_paths([sys.argv[1]], fmt=sys.argv[2])[0]
    outcome = f"read {trace.events.height}"
except InputError as exc:
    outcome = f"refused {exc}"
print(outcome)
# peak RSS in KiB. getrusage's ru_maxrss keeps the high-water mark of the process that spawned this one
# (Linux retains it across fork and execve), so where /proc has it, this process's own VmHWM is the figure.
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(peak)
"""


def _bomb(path: Path, where: str, size: int) -> None:
    """A gzip of ``size`` bytes of spaces (about 1/1000 of that on disk) placed ``where`` in a small trace."""
    event = json.dumps(EVENT).encode()
    head = {"array": b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [' + event + b",",
            "header": b'{"schemaVersion": 1, "deviceProperties": [], ',
            "export": b'{"traceparse": '}[where]
    tail = {"array": event + b"]}", "header": b'"traceEvents": [' + event + b"]}", "export": b"{}}"}[where]
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(size >> 20):
            f.write(z.compress(block))
        f.write(z.compress(tail) + z.flush())


@pytest.mark.parametrize("where,reader,expected", [
    # a gzip expanding more than 200 times is refused by the core's decompression budget (traceparse.sources)
    ("array", "torch", "refused"), ("array", "chrome", "refused"),
    ("header", "torch", "refused"), ("export", "chrome", "refused"),  # refused before memory grows
])
def test_gzip_bomb_of_whitespace_is_bounded(where, reader, expected, tmp_path):
    path = tmp_path / f"bomb_{where}.json.gz"
    _bomb(path, where, 384 << 20)
    assert path.stat().st_size < 1 << 20
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", _CHILD, str(path), reader], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome, peak_kib = result.stdout.strip().splitlines()
    assert outcome.startswith(expected), outcome
    assert int(peak_kib) < 500 * 1024, f"peak RSS {int(peak_kib) // 1024} MiB"
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss > 0  # the child ran and was accounted


@pytest.mark.parametrize("reader", ["torch", "chrome"])
def test_plain_whitespace_between_events_is_streamed(reader, tmp_path):
    """96 MiB of spaces between two events of an uncompressed trace: both events read, memory bounded."""
    event = json.dumps(EVENT).encode()
    path = tmp_path / "spaces.json"
    with open(path, "wb") as f:
        f.write(b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [' + event + b",")
        block = b" " * (1 << 20)
        for _ in range(96):
            f.write(block)
        f.write(json.dumps(NEXT).encode() + b"]}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", _CHILD, str(path), reader], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome, peak_kib = result.stdout.strip().splitlines()
    assert outcome.startswith("read 2"), outcome
    assert int(peak_kib) < 500 * 1024, f"peak RSS {int(peak_kib) // 1024} MiB"


def test_bad_utf8_is_counted_once_in_the_events_kept(tmp_path):
    """Hand-written after a fuzz case: one bad byte in a kept event's name, one where the JSON breaks, one past
    it. The whole document does not decode, so its complete events are found by decoding prefixes, and every
    prefix tried counted the bad bytes again: 26 for the 3 of the file, where two decoding workers said 1. The
    events kept hold one, read as U+FFFD: 1, whichever decoder reads it."""
    events = [f'{{"ph": "X", "cat": "cpu_op", "name": "op{i}", "pid": 1, "tid": 1, "ts": {10 * i}, "dur": 5}}'
              for i in range(40)]
    events[3] = events[3].replace('"op3"', '"\\u006fp3 \xfa"')
    text = '{"schemaVersion": 1, "traceEvents": [' + ",\n".join(events[:30]).replace("\xfa", "@") + ",\n"
    data = text.encode().replace(b"@", b"\xfa") + b'{"ph": "X",\xbe "name": "broken"},\n' + \
        ",\n".join(events[30:]).replace('"op35"', '"op35 @"').encode().replace(b"@", b"\xd4") + b"]}"
    path = tmp_path / "bad_utf8.json"
    path.write_bytes(data)
    for workers, chunk in (("0", 8 << 20), ("0", 256), ("2", 256)):  # one chunk (searched in prefixes), or many
        trace = read_paths([path], fmt="torch", params={"workers": workers, "chunk_bytes": chunk, "small_bytes": 0})[0]
        assert trace.events.height == 30
        assert trace.events["name"][3] == "op3 \ufffd"
        said = [w for w in trace.meta.warnings if "not valid UTF-8" in w]
        assert said == [f"{path}: 1 byte sequence not valid UTF-8; read as U+FFFD (the replacement character)"], \
            (workers, trace.meta.warnings)


# -- a header that is not JSON ---------------------------------------------------------------------------------
def _lost_key(tmp_path: Path) -> tuple[Path, int]:
    """A real trace (alexnet_bs4, H100) with its first two keys taken out of its header, as a copy of a trace
    published with them lost was (``{`` then the first device's ``{``: GPUPuzzlers' ``different_priority_streams``),
    and the line of the device's ``{``, counted in the text."""
    data = gzip.decompress((FIXTURES / "torch" / "alexnet_bs4.json.gz").read_bytes())
    cut = re.search(rb'"schemaVersion": 1,\s*"deviceProperties": \[', data)
    data = data[: cut.start()] + data[cut.end():]
    path = tmp_path / "lost_key.json"
    path.write_bytes(data)
    first = data.index(b"{")
    return path, data[: data.index(b"{", first + 1)].count(b"\n") + 1


def test_a_header_that_lost_its_key_is_refused_not_read_as_another_format(store, tmp_path):
    """The keys before ``traceEvents`` are checked as JSON by every reader of the format, whether or not it keeps
    them: with Kineto's first keys gone the file was no longer Kineto's to the torch reader, and the chrome
    reader, which keeps none of them, read it without a word, its kernels as host ranges ("the trace recorded no
    GPU activity" of a trace of 200 kernels). The error names the line of the second ``{``."""
    path, line = _lost_key(tmp_path)
    why = 'the keys before "traceEvents" are not valid JSON (JSON is malformed: object keys must be strings)'
    refused(["ingest", str(path)], f"{path}:{line}: {why}; a Chrome trace is one JSON document", store)
    refused(["ingest", "--format", "torch", str(path)],
            f"{path}:{line}: {why}; a torch.profiler trace is one JSON document", store)


def test_a_header_with_a_trailing_comma_names_its_line(tmp_path):
    """A Kineto header the torch reader claims (its first keys are there) with one comma too many after the
    device's last property: refused, naming the line where the parser met it (the ``}`` that closes the object
    after the comma), as counted in the text."""
    data = gzip.decompress((FIXTURES / "torch" / "alexnet_bs4.json.gz").read_bytes())
    end = data.index(b"\n", data.index(b'"sharedMemPerMultiprocessor": '))
    path = tmp_path / "comma.json"
    path.write_bytes(data[:end] + b"," + data[end:])
    line = data[: data.index(b"}", end)].count(b"\n") + 1
    with pytest.raises(InputError) as caught:
        read_paths([path], fmt="torch")[0].events
    assert str(caught.value) == (f'{path}:{line}: the keys before "traceEvents" are not valid JSON (JSON is '
                                 "malformed: trailing comma in object); a torch.profiler trace is one JSON document")
