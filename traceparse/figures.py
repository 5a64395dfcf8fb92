"""How a figure is written for a person: at most four significant figures, one unit, no exponent.

The one place that turns a duration, a percentage, a ratio or a plain
number into the text a message, a panel or a table shows, so that the same
quantity reads the same everywhere. JSON keeps the exact values; only the
screen rounds. ``--digits N`` (:func:`set_digits`) asks for more.
"""

from __future__ import annotations

import math
from typing import Any

#: Significant figures shown by default.
DEFAULT_DIGITS = 4
_digits = DEFAULT_DIGITS

#: Durations: the largest unit whose scale the value reaches.
NS_SCALES = (("s", 1e9), ("ms", 1e6), ("us", 1e3), ("ns", 1.0))


def set_digits(n: int | None) -> None:
    """Show ``n`` significant figures from now on (None: the default, 4)."""
    global _digits
    _digits = DEFAULT_DIGITS if n is None else max(1, int(n))


def digits() -> int:
    """The significant figures shown now (4, or ``--digits``): what a list sorted as it reads rounds to."""
    return _digits


def decimals_for(peak: float, sig: int | None = None) -> int:
    """Decimals that give ``peak`` ``sig`` significant figures (0 for values of ``sig`` digits or more)."""
    sig = _digits if sig is None else sig
    if not peak or not math.isfinite(peak):
        return min(sig - 1, 3)
    whole = int(math.floor(math.log10(abs(peak)))) + 1
    return max(0, sig - whole)


def fmt_number(value: float | int) -> str:
    """A plain number: integers with thousands separators, others to the significant figures in force."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) >= 10 ** (_digits - 1):
        return f"{int(value):,}"
    return f"{value:,.{decimals_for(value)}f}"


def fmt_ns(ns: Any) -> str:
    """A duration in the most readable unit, to the significant figures in force: ``388.7 ms``, ``1.563 s``; 1,000 s
    and more with thousands separators, as counts have them (``6,122 s``)."""
    if ns is None:
        return "-"
    ns = float(ns)
    for i, (unit, scale) in enumerate(NS_SCALES):
        if abs(ns) >= scale or unit == "ns":
            v = ns / scale
            if unit == "ns":
                return f"{v:.0f} ns"
            text = f"{v:.{decimals_for(v)}f}"
            if abs(float(text)) >= 1000 and i > 0:  # rounded up into the next unit: 999.96 ms is 1 s
                unit, scale = NS_SCALES[i - 1]
                v = ns / scale
            return f"{_trimmed(f'{v:,.{decimals_for(v)}f}')} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float) -> str:
    """A byte count in SI units (1 kB = 1000 B), scaled to its size: ``102.4 GB``, not ``102400.000 MB``; past
    a thousand TB with thousands separators, as counts."""
    return _scaled(n, (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)))


def fmt_bytes_binary(n: float) -> str:
    """A byte count in binary units (1 KiB = 1024 B)."""
    return _scaled(n, (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)))


def _scaled(n: float, units: tuple) -> str:
    """``n`` bytes in the largest of ``units`` (largest first) it reaches, to the significant figures in force;
    rounded up into the next unit where it reaches it (999.96 MB is 1 GB), thousands separated past the largest."""
    for i, (unit, scale) in enumerate(units):
        if abs(n) >= scale:
            value = n / scale
            if abs(float(f"{value:.{decimals_for(value)}f}")) >= 1000 and i > 0:
                unit, scale = units[i - 1]
                value = n / scale
            return f"{value:,.{decimals_for(max(abs(value), 1.0))}f} {unit}"
    return f"{n:.0f} B"


def _trimmed(text: str) -> str:
    """``30.00`` as ``30``, ``1.500`` as ``1.5``: zeros after the point say nothing in prose."""
    return text.rstrip("0").rstrip(".") if "." in text else text


class Bound(float):
    """A share whose rounding would say what is not so, as :func:`shares_shown` gives it: the value it is rounded
    to (0.0 or 100.0: it counts as that where the shown shares are added up) with the bound :func:`fmt_pct` writes
    instead (``<0.1``: more than none, ``>99.9``: less than the whole)."""

    said: str

    def __new__(cls, value: float, said: str) -> "Bound":
        bound = super().__new__(cls, value)
        bound.said = said
        return bound

    def __reduce__(self):
        """Pickled and copied with its bound (a worker process's result, a deep copy of a table's cells)."""
        return Bound, (float(self), self.said)


def shares_shown(values: list[Any], decimals: int = 1) -> list[Any]:
    """``values`` (percentages; None and non-numbers kept as they are) as shown to ``decimals``: where they add up to
    100 (the shares of one whole) they are rounded so that the shown ones add up to 100 as well (the largest
    remainders rounded up: 97.74, 2.17, 0.09 read 97.7, 2.2, 0.1, not 97.7, 2.2, 0.1 of 100.0 by luck, or six parts
    of 99.8); a part that reads "<0.1" stands for up to 0.1, so the others may add up to that much less than 100,
    each to its nearest (api-share's synchronize class of 43.33% read 43.4%, and an "other" of 0.037% read 0.1%, to
    make up for parts shown as "<0.1"); any other list each rounded alone. A part more than none rounded to 0 and a
    part less than the whole rounded to 100 come back as a :class:`Bound`, which :func:`fmt_pct` writes ``<0.1%``
    and ``>99.9%`` (a DtoH copy of 3 us of 3.7 ms of GPU time does not read 0.0%)."""
    at = [i for i, v in enumerate(values) if isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v)]
    numbers = [float(values[i]) for i in at]
    out = list(values)
    if all(_as_shown(v, decimals) for v in numbers):  # shown already (a table's shares rounded within a whole of
        return out  # their own, :func:`shares_within`): rounding them again would move one by a unit of float noise
    if len(numbers) < 2 or any(v < 0 for v in numbers) or abs(sum(numbers) - 100.0) > 1e-3 * len(numbers):
        for i in at:  # a Bound was rounded already: it keeps what it says
            value = values[i]
            out[i] = value if isinstance(value, Bound) else _bounded(float(value), round(float(value), decimals),
                                                                     decimals)
        return out
    unit = 10 ** decimals
    scaled = [v * unit for v in numbers]
    # each part to its nearest; a part too small to show reads "<0.1", which stands for up to 0.1 (one unit): the
    # shown parts add up to 100 less at most that many units, and only where they do not are the parts nearest a
    # half rounded the other way (none rounded up for a part it is not)
    floors = [math.floor(v + 1e-9) for v in scaled]
    tiny = [0 < v < 0.5 for v in scaled]
    shown = [f if t else math.floor(v + 0.5) for v, f, t in zip(scaled, floors, tiny)]
    total, high = sum(shown), 100 * unit
    low = high - sum(tiny)
    if total < low:  # up: those rounded down with the largest remainders
        down = [k for k in range(len(scaled)) if not tiny[k] and shown[k] == floors[k] and scaled[k] > floors[k]]
        for k in sorted(down, key=lambda k: (-(scaled[k] - floors[k]), k))[:low - total]:
            shown[k] += 1
    elif total > high:  # down: those rounded up with the smallest remainders
        up = [k for k in range(len(scaled)) if not tiny[k] and shown[k] > scaled[k] + 1e-9]
        for k in sorted(up, key=lambda k: (scaled[k] - floors[k], k))[:total - high]:
            shown[k] -= 1
    for i, exact, units in zip(at, numbers, shown):
        out[i] = _bounded(exact, units / unit, decimals)
    return out


def shares_within(values: list[Any], groups: list[Any], group_shown: dict[Any, Any], decimals: int = 1) -> list[Any]:
    """``values`` (the shares of one whole, each of a part of ``groups``' whole, e.g. API calls and their
    classes) as shown to ``decimals`` where each group's parts add up to the group's share as shown
    (``group_shown``: :func:`shares_shown` of the groups): a class that is one call and that call read the same
    (memcpy 7.6% beside its only call, cudaMemcpyAsync, at 7.7% when each table was rounded alone), and all the
    parts add up to 100 as the groups do. Within a group the largest remainders are rounded up; a part of a group
    with no shown share, or not a number, is rounded alone (:func:`shares_shown` of that one value)."""
    unit = 10 ** decimals
    out = list(values)
    members: dict[Any, list[int]] = {}
    for i, (value, group) in enumerate(zip(values, groups)):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            members.setdefault(group, []).append(i)
    for group, at in members.items():
        target = group_shown.get(group)
        if not isinstance(target, (int, float)) or not math.isfinite(target):
            for i in at:
                out[i] = shares_shown([values[i]], decimals)[0]
            continue
        scaled = [float(values[i]) * unit for i in at]
        shown = [math.floor(v + 1e-9) for v in scaled]
        need = max(0, min(len(at), round(float(target) * unit) - sum(shown)))
        for k in sorted(range(len(at)), key=lambda k: (-(scaled[k] - shown[k]), k))[:need]:
            shown[k] += 1
        for i, units in zip(at, shown):
            out[i] = _bounded(float(values[i]), units / unit, decimals)
    return out


def _as_shown(value: float, decimals: int) -> bool:
    """Whether ``value`` is a whole number of ``10 ** -decimals`` (a share already rounded to be shown)."""
    scaled = value * 10 ** decimals
    return abs(scaled - round(scaled)) < 1e-6


def share_as_shown(exact: Any, shown: Any, decimals: int = 1) -> Any:
    """``shown`` (a share as :func:`shares_shown` rounded it among its whole's other parts, kept as a plain number:
    a JSON document's) as :func:`fmt_pct` should write it: a :class:`Bound` again where it reads 0 of a part more
    than none or 100 of a part less than the whole. None where either is unknown."""
    if not isinstance(exact, (int, float)) or not isinstance(shown, (int, float)):
        return None
    return _bounded(float(exact), float(shown), decimals)


def _bounded(exact: float, shown: float, decimals: int) -> float:
    """``shown`` (``exact`` rounded), or a :class:`Bound` where it reads 0 of a part more than none (or of a change
    less than none: a whatif gain of -0.03%) or 100 of a part less than the whole."""
    if shown == 0 and exact != 0:
        return Bound(0.0, f"{'-' if exact < 0 else ''}<{10 ** -decimals:.{decimals}f}")
    if shown == 100 and exact < 100:
        return Bound(100.0, f">{100 - 10 ** -decimals:.{decimals}f}")
    return shown


def fmt_pct(value: Any) -> str:
    """A percentage with one decimal (``53.9%``); ``-`` when unknown. A share more than none that rounds to 0.0
    reads ``<0.1%`` (a change under 0.1% below none ``-<0.1%``) and one less than the whole that rounds to 100.0
    reads ``>99.9%`` (a :class:`Bound` of :func:`shares_shown` as it says); a truly zero one ``0.0%``, never
    ``-0.0%``; ``-`` for nan and inf."""
    if value is None:
        return "-"
    if isinstance(value, Bound):
        return f"{value.said}%"
    value = float(value)
    if not math.isfinite(value):
        return "-"
    if value == 0:
        return "0.0%"  # -0.0 as well
    text = f"{value:.1f}"
    if float(text) == 0:
        return "<0.1%" if value > 0 else "-<0.1%"  # a loss under 0.1%: less than 0.1% below none
    if text == "100.0" and value < 100:
        return ">99.9%"
    return f"{text}%"


def fmt_ratio(value: Any) -> str:
    """A dimensionless ratio to the significant figures in force, marked as a ratio: ``1.099×``."""
    if value is None:
        return "-"
    return f"{fmt_number(float(value))}×"


def fmt_count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` in the number it takes: "1 gap", "6,642 gaps"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


#: Two figures within this share of the larger are the same when one is picked out of many (the slowest rank, a
#: notable one): a difference of 0.1% is clock noise or rounding, and does not show at four significant figures.
SAME_SHARE = 0.001
#: Two durations within this many ns (1 us) are the same however short they are (:func:`same_figure`).
SAME_NS = 1_000
#: How the tolerance of :func:`same_figure` reads in a message.
SAME_SAID = "within 0.1%"


def same_figure(a: float, b: float, floor: float = 0) -> bool:
    """True when ``a`` and ``b`` differ by at most :data:`SAME_SHARE` of the larger (or by at most ``floor``:
    :data:`SAME_NS` for durations): too little for either to stand out, so that no rank is named slowest, longest
    or notable on a nanosecond of noise (a span of 151,734,364 ns against a median of 151,734,363)."""
    return abs(a - b) <= max(SAME_SHARE * max(abs(a), abs(b)), floor)


def rank_ranges(ranks: list[int]) -> str:
    """Ranks as ranges: ``0–3``, ``0–2, 5, 7–9``."""
    parts: list[list[int]] = []
    for r in sorted(ranks):
        if parts and r == parts[-1][1] + 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in parts)


def ends_early(ranks: list) -> str:
    """``rank 2's trace ends early (cut short)``, ``the traces of ranks 0 and 2 end early (cut short)``: what a
    finding says of the ranks of a run whose input was cut (a profiler killed mid-write)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s trace ends early (cut short)"
    return f"the traces of {listed('rank', list(ranks), shown=8)} end early (cut short)"


def listed(noun: str, keys: list, shown: int = 4) -> str:
    """``rank 7``, ``ranks 7 and 3``, ``ranks 7, 3, 9 and 2 more``: ``keys`` in the order given, at most ``shown``
    of them named, the rest counted."""
    keys = [str(k) for k in keys]
    if len(keys) == 1:
        return f"{noun} {keys[0]}"
    if len(keys) <= shown:
        return f"{noun}s {', '.join(keys[:-1])} and {keys[-1]}"
    return f"{noun}s {', '.join(keys[:shown - 1])} and {len(keys) - shown + 1:,} more"
