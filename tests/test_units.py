"""traceparse.units: one exact decimal-to-integer rule (half to even) and one unit registry, used by every reader.

The oracle is Python's Decimal at a precision that holds every digit, with
ROUND_HALF_EVEN, and hand-computed figures for the ties; the same decimal
strings go through each reader's own conversion path (a file for torch and
chrome, the reader's column converter for the others) and must give the
same integers.
"""

from __future__ import annotations

import gzip
import json
from decimal import ROUND_HALF_EVEN, Context, Decimal
from pathlib import Path

import polars as pl
import pytest

from traceparse import units
from traceparse.errors import InputError
from traceparse.ingest import read_paths

#: Decimal microseconds, with ties below the ns, negatives and an exponent.
US = ["1.0005", "1.0015", "1.0025", "-1.0005", "-1.0015", "0.0005", "0.0015", "2.0025", "0.0004999",
      "123456789.1235", "9007199254740.9935", "1.6E+07", "7", "-0.5", "0.0000015"]
#: The same in ns, worked out by hand: x.5 goes to the even neighbour.
US_NS = [1000, 1002, 1002, -1000, -1002, 0, 2, 2002, 0,
         123456789124, 9007199254740994, 16_000_000_000, 7000, -500, 0]
#: Decimal seconds.
S = ["0.0000015", "0.0000000015", "0.0000000025", "-0.0000000025", "16.673290", "1.0000000005", "2E-9"]
S_NS = [1500, 2, 2, -2, 16_673_290_000, 1_000_000_000, 2]


def oracle(text: str, factor: int) -> int:
    return int((Context(prec=200).multiply(Decimal(text), factor)).to_integral_value(ROUND_HALF_EVEN))


def test_hand_figures_agree_with_the_decimal_oracle():
    assert [oracle(t, 1000) for t in US] == US_NS
    assert [oracle(t, 10**9) for t in S] == S_NS


def test_to_int_rounds_half_to_even():
    assert [units.to_int(t, "us") for t in US] == US_NS
    assert [units.to_int(t, "s") for t in S] == S_NS
    assert [units.to_int(t, "ns") for t in ["0.5", "1.5", "2.5", "-0.5", "-1.5", "-2.5"]] == [0, 2, 2, 0, -2, -2]
    assert units.ROUNDING == ROUND_HALF_EVEN


def test_column_equals_scalar_on_random_decimals():
    import random

    rng = random.Random(9)
    texts = ["%.16G" % (rng.random() * 10 ** rng.randint(-12, 12)) for _ in range(3000)]
    texts += ["%d.%d5" % (rng.randint(-10**6, 10**6), rng.randint(0, 999)) for _ in range(3000)]
    texts += ["1" * 40 + "e-30", "0." + "0" * 50 + "5", "9223372036854775807", "9223372036854775808", "1e400"]
    for unit, factor in (("us", 1000), ("ms", 10**6), ("s", 10**9), ("MiB", 2**20), ("kB", 1000)):
        column = units.column_to_int(pl.Series(texts), unit, strict=False).to_list()
        for text, got in zip(texts, column):
            want = oracle(text, factor)
            assert got == (want if abs(want) < 2**63 else None), (unit, text)


def test_every_reader_converts_the_same_decimals_the_same_way(tmp_path):
    got = {
        "torch": _torch_durations(tmp_path, US),
        "chrome": _chrome_durations(tmp_path, US),
        "nsys": _nsys(US, "us"),
        "nvprof": _nvprof(US, "us"),
        "ncu": _ncu(US, "usecond"),
        "tau": _tau(US, 3),
    }
    for reader, values in got.items():
        # torch and chrome are read through the core, whose validation drops negative durations (issue 16)
        expected = [v for v in US_NS if v >= 0] if reader in ("torch", "chrome") else US_NS
        assert values == expected, reader
    seconds = {"nsys": _nsys(S, "s"), "nvprof": _nvprof(S, "s"), "ncu": _ncu(S, "second"), "tau": _tau(S, 9)}
    for reader, values in seconds.items():
        assert values == S_NS, reader


def _torch_durations(tmp_path: Path, texts: list[str]) -> list[int]:
    events = ",".join(f'{{"ph": "X", "cat": "kernel", "name": "k{i}", "pid": 0, "tid": 7, "ts": {i}, "dur": {t},'
                      f' "args": {{"device": 0, "stream": 7}}}}' for i, t in enumerate(texts))
    path = tmp_path / "kineto.json.gz"
    path.write_bytes(gzip.compress(f'{{"schemaVersion": 1, "traceEvents": [{events}]}}'.encode()))
    trace = read_paths([path])[0]
    assert trace.meta.format == "torch"
    return trace.events.sort("start_ns")["duration_ns"].to_list()


def _chrome_durations(tmp_path: Path, texts: list[str]) -> list[int]:
    events = ",".join(f'{{"ph": "X", "name": "r{i}", "pid": 1, "tid": 1, "ts": {i}, "dur": {t}}}'
                      for i, t in enumerate(texts))
    path = tmp_path / "plain.json"
    path.write_text(f"[{events}]")
    trace = read_paths([path])[0]
    assert trace.meta.format == "chrome"
    return trace.events.sort("start_ns")["duration_ns"].to_list()


def _nsys(texts: list[str], unit: str) -> list[int]:
    from traceparse_plugins.readers.nsys.units import decimals_to_int

    return decimals_to_int(pl.Series(texts), unit).to_list()


def _nvprof(texts: list[str], unit: str) -> list[int]:
    from traceparse_plugins.readers.nvprof.units import TIME_UNITS, split_number, to_ints

    parts = pl.DataFrame({"cell": [t + unit for t in texts]}).select(*split_number(pl.col("cell")))
    return to_ints(parts[:, 0], parts[:, 1], TIME_UNITS).to_list()


def _ncu(texts: list[str], unit: str) -> list[int]:
    from traceparse_plugins.readers.ncu.events import _duration_ns

    return [_duration_ns(t, unit) for t in texts]


def _tau(texts: list[str], power: int) -> list[int]:
    from traceparse_plugins.readers.tau.decimals import scaled_int

    return scaled_int(pl.Series(texts), power).to_list()


# -- the registry ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("unit,factor,dimension", [
    ("B", 1, "bytes"), ("kB", 10**3, "bytes"), ("MB", 10**6, "bytes"), ("GB", 10**9, "bytes"),
    ("TB", 10**12, "bytes"), ("KiB", 2**10, "bytes"), ("MiB", 2**20, "bytes"), ("GiB", 2**30, "bytes"),
    ("TiB", 2**40, "bytes"), ("MB/s", 10**6, "rate"), ("GB/s", 10**9, "rate"), ("GiB/s", 2**30, "rate"),
    ("ns", 1, "time"), ("us", 10**3, "time"), ("ms", 10**6, "time"), ("s", 10**9, "time"),
    ("GHz", 10**9, "frequency"), ("1", 1, "count"),
])
def test_registry_factors(unit, factor, dimension):
    assert units.factor(unit) == factor and units.dimension(unit) == dimension


def test_si_and_binary_differ_and_convert_exactly():
    assert units.factor("MB", to="MiB") == Decimal("0.95367431640625")  # 10**6 / 2**20, exact
    assert units.factor("ms", to="us") == 1000 and units.factor("ps") == Decimal("0.001")
    # a spelling map says which a tool means: nvprof's MB is binary, nsys's SI
    assert units.to_int("38.147", "MB", spellings={"MB": "MiB"}) == 40_000_029
    assert units.to_int("9.634", "MB", spellings={"MB": "MB"}) == 9_634_000
    with pytest.raises(ValueError, match="cannot convert"):
        units.factor("MB", to="s")
    with pytest.raises(ValueError, match="unknown unit 'furlong'"):
        units.to_int("1", "furlong")


# -- refused numbers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["١٢٣", "１２", "1_000", "NaN", "Infinity", "1,5", "", "1e", "--1", "0x10"])
def test_not_plain_ascii_decimals_are_refused(text):
    with pytest.raises(ValueError) as info:
        units.to_int(text, "us")
    assert "\n" not in str(info.value) and len(str(info.value)) < 80
    with pytest.raises(units.NumberError) as column:
        units.column_to_int(pl.Series(["1", text]), "us")
    assert column.value.index == 1


def test_out_of_range_is_refused():
    with pytest.raises(ValueError, match="out of range"):
        units.to_int("9223372036854775.808", "us")
    assert units.to_int("9223372036854775.807", "us") == 2**63 - 1


def test_a_reader_turns_a_refused_number_into_its_one_line_error(tmp_path):
    path = tmp_path / "arabic.json"
    path.write_text(json.dumps([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "١٢", "dur": 1}], ensure_ascii=False),
                    encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_paths([path])
    message = str(info.value)
    assert message.startswith(f"{path}: traceEvents[0].ts: a time in microseconds") and "\n" not in message
    assert "non-ASCII" in message
