"""Nsight Compute metric units and their conversion to base units.

ncu scales units by SI factors: "byte-based units are scaled using a factor
of 1000 and the prefixes K, M, G, etc. Time-based units are also scaled using
a factor of 1000, with the prefixes n, u and m" (Nsight Compute CLI manual,
"Metrics and Units"); ``--print-units base`` (implied by ``--csv`` since
2023-era versions) turns the scaling off. Older versions spell units out
(``nsecond``, ``usecond``, ``Kbyte``, ``cycle/nsecond``, ``Gbyte/second``),
newer ones abbreviate (``ns``, ``us``, ``Ghz``, ``hz``).

A prefix on the *denominator* (``%/Kbyte``) is ncu's display scaling too: the
value shown is the stored one divided by 1000, the ``K`` put on the byte
wherever it stands. ``derived__pct_occupancy_per_shared_mem_size`` is stored
as 1164 ``%/byte`` (NVIDIA's ``ncu_report`` on the committed H100 report) and
the CSV export of the same report prints ``1.164 %/Kbyte``; the H200 report
likewise (1591 and 1.591). So ``%/Kbyte`` is × 1000 to ``%/byte``, as a
numerator's prefix is, not ÷ 1000.

Base units here: time in ``ns``, frequency in ``hz``, counts in their own
unit (``byte``, ``inst``, ``cycle``, ...), rates in ``<count>/s``, ``%``
unchanged. Factors are exact fractions from the unit registry
(:mod:`traceparse.units`); :data:`TIME_SPELLINGS` and :data:`FREQ_SPELLINGS`
are ncu's spellings of registry units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from traceparse import units

ONE = Fraction(1)
#: Multipliers of the prefixes ncu puts on count units (SI, factor 1000).
COUNT_PREFIXES = {prefix: Fraction(value) for prefix, value in units.SI_PREFIXES.items()}
#: Count units ncu prints (the part after an optional SI prefix).
COUNT_UNITS = {"byte", "bytes", "inst", "cycle", "warp", "thread", "block", "sector", "request", "register",
               "transaction", "wavefront", "pass", "cluster", "SM", "flop", "op", "sample", "msg", "packet",
               "instance", "lane", "bank", "tpc", "unit", "branch"}
#: Plural spellings ncu 2025 prints for some count units (``branches``, ``sectors``): the same count.
PLURALS = {"bytes": "byte", "branches": "branch", "sectors": "sector", "requests": "request", "warps": "warp",
           "threads": "thread", "blocks": "block", "cycles": "cycle", "registers": "register",
           "transactions": "transaction", "wavefronts": "wavefront", "passes": "pass", "instances": "instance"}
#: ncu's time spellings -> registry unit.
TIME_SPELLINGS = {"psecond": "ps", "ps": "ps", "nsecond": "ns", "ns": "ns", "usecond": "us", "us": "us",
                  "msecond": "ms", "ms": "ms", "second": "s", "s": "s"}
#: ncu's frequency spellings (lower-cased) -> registry unit.
FREQ_SPELLINGS = {"hz": "Hz", "khz": "kHz", "mhz": "MHz", "ghz": "GHz", "thz": "THz"}
#: Time units -> nanoseconds per unit.
TIME_NS = {spelling: units.ratio(spelling, "ns", TIME_SPELLINGS) for spelling in TIME_SPELLINGS}
#: Frequency units (lower-cased) -> hertz per unit.
FREQ_HZ = {spelling: units.ratio(spelling, "Hz", FREQ_SPELLINGS) for spelling in FREQ_SPELLINGS}
_PREFIXED = re.compile(r"^([KMGTP]?)(.+)$")
_NS_PER_SECOND = units.ratio("s", "ns")


@dataclass(frozen=True)
class UnitConversion:
    """How to bring a value in ``unit`` to base units: value × ``factor``, written in ``base``.

    ``known`` is False for a unit this table does not recognise: the value
    is then kept as written (factor 1, the unit unchanged).
    """

    unit: str
    factor: Fraction
    base: str | None
    known: bool = True


def conversion(unit: str | None) -> UnitConversion:
    """The conversion of one ncu unit string (``""`` or None: a plain number)."""
    text = (unit or "").strip()
    if not text:
        return UnitConversion(text, ONE, None)
    if text == "%":
        return UnitConversion(text, ONE, "%")
    numerator, slash, denominator = text.partition("/")
    if not slash:
        simple = _simple(numerator)
        return UnitConversion(text, *simple) if simple else UnitConversion(text, ONE, text, known=False)
    num = _simple(numerator)
    if num is None or "/" in denominator:
        return UnitConversion(text, ONE, text, known=False)
    factor, base = num
    if denominator in TIME_NS:
        per_second = factor * _NS_PER_SECOND / TIME_NS[denominator]
        if base == "cycle":  # cycle/nsecond and friends are clock frequencies
            return UnitConversion(text, per_second, "hz")
        if base == "ns":  # a time per time is a ratio
            return UnitConversion(text, factor / TIME_NS[denominator], "ns/ns")
        return UnitConversion(text, per_second, f"{base}/s")
    den = _simple(denominator)
    if den is None:
        return UnitConversion(text, ONE, text, known=False)
    return UnitConversion(text, factor * den[0], f"{base}/{den[1]}")  # ncu's scaling: see the module's docstring


def _simple(unit: str) -> tuple[Fraction, str] | None:
    """(factor, base) of a unit without ``/``; None when unknown."""
    if unit == "%":
        return ONE, "%"
    if unit in TIME_NS:
        return TIME_NS[unit], "ns"
    if unit.lower() in FREQ_HZ:
        return FREQ_HZ[unit.lower()], "hz"
    if unit in COUNT_UNITS or unit in PLURALS:
        return ONE, _singular(unit)
    m = _PREFIXED.match(unit)
    if m and m.group(1) and (m.group(2) in COUNT_UNITS or m.group(2) in PLURALS):
        return COUNT_PREFIXES[m.group(1)], _singular(m.group(2))
    return None


def _singular(unit: str) -> str:
    return PLURALS.get(unit, unit)
