"""Unit strings ncu writes, brought to base units with exact factors (ncu scales by 1000, see the CLI manual)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from traceparse_plugins.readers.ncu.units import conversion


@pytest.mark.parametrize("unit, factor, base", [
    ("", "1", None),
    ("%", "1", "%"),
    ("ns", "1", "ns"), ("nsecond", "1", "ns"), ("us", "1000", "ns"), ("usecond", "1000", "ns"),
    ("msecond", "1000000", "ns"), ("second", "1000000000", "ns"),
    ("byte", "1", "byte"), ("Kbyte", "1000", "byte"), ("Mbyte", "1000000", "byte"), ("Gbyte", "1000000000", "byte"),
    ("hz", "1", "hz"), ("Khz", "1000", "hz"), ("Mhz", "1000000", "hz"), ("Ghz", "1000000000", "hz"),
    ("cycle/second", "1", "hz"), ("cycle/usecond", "1000000", "hz"), ("cycle/nsecond", "1000000000", "hz"),
    ("byte/second", "1", "byte/s"), ("Gbyte/second", "1000000000", "byte/s"), ("Tbyte/second", "1000000000000", "byte/s"),
    ("inst", "1", "inst"), ("Kinst", "1000", "inst"), ("cycle", "1", "cycle"),
    ("inst/cycle", "1", "inst/cycle"), ("register/thread", "1", "register/thread"),
    ("Kbyte/block", "1000", "byte/block"), ("sector/request", "1", "sector/request"),
    # ncu scales the shown value, not the unit: 1164 %/byte stored is printed 1.164 %/Kbyte (both real reports)
    ("%/Kbyte", "1000", "%/byte"),
])
def test_conversion(unit, factor, base):
    c = conversion(unit)
    assert c.known and c.factor == Decimal(factor) and c.base == base


def test_unknown_unit_is_kept_as_written():
    c = conversion("furlong/fortnight")
    assert not c.known and c.factor == 1 and c.base == "furlong/fortnight"
