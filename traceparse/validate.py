"""The one validation step every event takes before it is stored: types and ranges per schema column.

:meth:`traceparse.trace.Trace._conformed_batches` runs :class:`Validator` on
each raw batch a reader yields, just before :func:`traceparse.schema.conform`.
The rules are data (:data:`traceparse.schema.RANGES` and
:data:`traceparse.schema.ADDITIVE`, beside the columns they judge), so a new
column needs at most one line there:

- every value must fit its column's type (Int64 times and ids, Int32
  grid/block/devices, ...); a float column holds finite numbers only;
- a column with a range in :data:`~traceparse.schema.RANGES` must lie in it
  (durations, counts and bytes are never negative);
- ``start_ns + duration_ns`` must fit Int64 (an end time never wraps);
- a number a measure reads from a name (:data:`~traceparse.schema.NAME_NUMBERS`: the step number of
  ``ProfilerStep#N``) must fit Int64;
- the running total of each additive column (:data:`~traceparse.schema.ADDITIVE`:
  durations, calls, bytes) over the whole trace must fit Int64, so that no sum a
  rule or a measure takes over a subset of the rows can wrap.

One policy: a row that breaks a rule is dropped, and the trace's metadata gets
one warning per field, with the count, the first record (the event's position
in the reader's output) and a short excerpt of its value. When rows were given
and none is valid, the file is refused (:class:`~traceparse.errors.InputError`,
exit 2). docs/validation.md lists the rules and the warnings.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

import polars as pl

from traceparse.errors import EXCERPT, InputError  # noqa: F401 - EXCERPT: the longest excerpt quoted, re-exported
from traceparse.schema import ADDITIVE, DTYPES, NAME_NUMBERS, RANGES

INT64_MAX = 2**63 - 1
_ASCII_INT = re.compile(r"\s*(-?[0-9]{1,19})\s*", re.ASCII)


def ascii_int(value) -> int | None:
    """``value`` as an integer when it is one (not a bool) or ASCII digits with an optional sign (at most 19
    digits); else None: a rank, or a process or thread id a tool wrote as text (``"tid": "4093687616"``).
    ``"²".isdigit()`` is True in Python, and ``int("٣")`` is 3: neither is an id."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _ASCII_INT.fullmatch(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


def fits_int64(value: int) -> bool:
    """Whether the integer ``value`` fits an Int64 column."""
    return -(2**63) <= value <= INT64_MAX


def ascii_id(value) -> int | None:
    """:func:`ascii_int` within Int64: an id (a pid, tid, flow id or rank) a tool wrote bare or as text; None
    where it is none, or past Int64 (no id: a reader that counts those asks :func:`fits_int64` itself)."""
    number = ascii_int(value)
    return number if number is not None and fits_int64(number) else None


_INT_BOUNDS = {pl.Int8: (-2**7, 2**7 - 1), pl.Int16: (-2**15, 2**15 - 1), pl.Int32: (-2**31, 2**31 - 1),
               pl.Int64: (-2**63, 2**63 - 1), pl.UInt8: (0, 2**8 - 1), pl.UInt16: (0, 2**16 - 1),
               pl.UInt32: (0, 2**32 - 1), pl.UInt64: (0, 2**64 - 1)}


def excerpt(value: object, limit: int = EXCERPT) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (an ellipsis marks the cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def wide_ints(name: str, values: list, dtype: pl.DataType = pl.Int64) -> pl.Series:
    """Integers a reader worked out (Python ints of any size, or None) as a raw column for this step.

    ``dtype`` when every value fits it; else the values as decimal text, so that :class:`Validator` drops each
    row whose value does not fit its column, with the one counted warning naming the file, the first record
    and the field, instead of a polars error (exit 3) or a number wrapped past 2^63 (a ``Seq`` of 2^64, a
    message of 2^62 elements × 4 bytes).
    """
    try:
        return pl.Series(name, values, dtype=dtype)
    except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
        return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)


def type_name(dtype: pl.DataType) -> str:
    return str(dtype.base_type() if hasattr(dtype, "base_type") else dtype)


@dataclass
class _Dropped:
    count: int = 0
    first: int | None = None
    value: object = None


def _counted(name: str) -> pl.Expr:
    """What an additive column adds to the trace's total: its value as Int128 (a bad or negative one as 0)."""
    return pl.col(name).cast(pl.Int64, strict=False).fill_null(0).clip(0, None).cast(pl.Int128)


def _always_fits(source: pl.DataType, dtype: pl.DataType) -> bool:
    """True when every value of a ``source`` column casts to ``dtype`` (the same type, or integers within its
    range): no row can break the rule "does not fit", so it is not asked."""
    if source == dtype:
        return True
    if source.is_integer() and dtype.is_integer():
        given, wanted = _INT_BOUNDS.get(source.base_type()), _INT_BOUNDS.get(dtype.base_type())
        return given is not None and wanted is not None and wanted[0] <= given[0] and given[1] <= wanted[1]
    return False


@lru_cache(maxsize=64)
def _rules(schema: tuple[tuple[str, pl.DataType], ...]) -> tuple[list[tuple[str, str, pl.Expr]], list[str], list]:
    """The rules a batch of this schema (``(column, dtype)`` pairs) is checked against: ``(field, reason,
    bad-row mask)`` in the order a dropped row is counted under, the additive columns present, and the one
    query :meth:`Validator.check` runs (column ``i``: rule i's bad rows; then each additive column's total)."""
    reasons: list[tuple[str, str, pl.Expr]] = []
    casted: dict[str, pl.Expr] = {}
    types = dict(schema)
    for name, source in schema:
        dtype = DTYPES.get(name)
        if dtype is None or not (dtype.is_numeric()) or source == pl.Null:
            continue
        col = pl.col(name)
        if source.is_numeric() or source == pl.Boolean:
            value = col.cast(dtype, strict=False)
            if source.is_float() and dtype.is_integer():
                # a float column headed for integers: non-finite values and values past the type
                lo, hi = _INT_BOUNDS.get(dtype.base_type(), (-2**63, 2**63 - 1))
                value = pl.when(col.is_finite() & (col >= float(lo)) & (col < float(hi))).then(value)
        else:
            value = col.cast(pl.String).cast(dtype, strict=False)
        if not _always_fits(source, dtype):
            reasons.append((name, f"does not fit {type_name(dtype)}", col.is_not_null() & value.is_null()))
        if dtype.is_float():
            reasons.append((name, "is not a finite number", value.is_not_null() & ~value.is_finite()))
        casted[name] = value
        lo, hi = RANGES.get(name, (None, None))
        if lo is not None:
            reasons.append((name, f"is below {lo}", value < lo))
        if hi is not None:
            reasons.append((name, f"is above {hi}", value > hi))
    if types.get("name") == pl.String:
        for pattern, what in NAME_NUMBERS:  # a number in a name that a measure reads as an integer
            number = pl.col("name").str.extract(pattern, 1)
            reasons.append(("name", f"has a {what} that does not fit Int64",
                            number.is_not_null() & number.cast(pl.Int64, strict=False).is_null()))
    if "start_ns" in casted and "duration_ns" in casted:
        reasons.append(("duration_ns", "makes start_ns + duration_ns pass Int64",
                        casted["duration_ns"].cast(pl.Int128) + casted["start_ns"].cast(pl.Int128) > INT64_MAX))
    additive = [n for n in ADDITIVE if n in types and types[n] != pl.Null]
    query = [mask.fill_null(False).alias(f"{i}") for i, (_, _, mask) in enumerate(reasons)]
    query += [_counted(name).sum().alias(f"total {name}") for name in additive]
    return reasons, additive, query


@dataclass
class Validator:
    """Checks raw batches one after the other; keeps the counts for :meth:`warnings` and :meth:`finish`."""

    where: str = "the trace"
    seen: int = 0
    kept: int = 0
    dropped: dict[tuple[str, str], _Dropped] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)

    def check(self, batch: pl.DataFrame) -> pl.DataFrame:
        """``batch`` without its invalid rows (a raw batch: any subset of the schema's columns).

        One query answers the usual case, a batch with no invalid row: every rule's bad rows and the additive
        columns' totals; only a batch with a bad row (or a total past Int64) is examined rule by rule. The
        rules' expressions are built once per batch schema (:func:`_rules`), not once per batch: a run of a
        thousand small ranks validates a thousand batches of a few rows.
        """
        n = batch.height
        offset, self.seen = self.seen, self.seen + n
        if n == 0:
            return batch
        reasons, additive, query = _rules(tuple(batch.schema.items()))
        if not reasons:
            self.kept += n
            return batch
        masks = batch.select(query)
        columns = masks.get_columns()
        totals = {name: self.totals.get(name, 0) + int(column[0] or 0)
                  for name, column in zip(additive, columns[len(reasons):])}
        if not any(column.any() for column in columns[:len(reasons)]) and all(t <= INT64_MAX for t in totals.values()):
            self.totals.update(totals)  # the usual case: every row valid, every total within Int64
            self.kept += n
            return batch
        bad = pl.Series("bad", [False] * n)
        for i, (name, reason, _) in enumerate(reasons):
            column = masks[f"{i}"]
            column = column & ~bad  # a row is counted under its first broken rule only
            hits = int(column.sum())
            if hits:
                self._note(name, reason, batch[name], column, offset, hits)
                bad = bad | column
        batch = batch.filter(~bad) if bad.any() else batch
        batch = self._within_totals(batch, offset, bad)
        self.kept += batch.height
        return batch

    def _within_totals(self, batch: pl.DataFrame, offset: int, dropped_before: pl.Series) -> pl.DataFrame:
        """Drop the rows that would carry the trace's total of an additive column past Int64."""
        positions = None  # positions in the reader's output of the rows still here, built when needed
        schema = batch.schema
        names = [n for n in ADDITIVE if n in schema and schema[n] != pl.Null]
        if not names:
            return batch

        totals = batch.select(_counted(n).sum() for n in names).row(0)  # one query for every column
        for name, total in zip(names, totals):
            running = self.totals.get(name, 0)
            total = int(total or 0)
            if running + total <= INT64_MAX:
                self.totals[name] = running + total
                continue
            values = batch.select(_counted(name)).to_series()
            if positions is None:
                positions = pl.Series(range(offset, offset + len(dropped_before))).filter(~dropped_before)
            over = pl.select((values.cum_sum() + pl.lit(running, dtype=pl.Int128)) > INT64_MAX).to_series()
            self._note(name, "would carry the trace's total past Int64 (its sums would wrap)", batch[name],
                       over, 0, int(over.sum()), positions)
            batch, positions = batch.filter(~over), positions.filter(~over)
            self.totals[name] = running + int(values.filter(~over).sum() or 0)
        return batch

    def _note(self, name: str, reason: str, column: pl.Series, mask: pl.Series, offset: int, hits: int,
              positions: pl.Series | None = None) -> None:
        entry = self.dropped.setdefault((name, reason), _Dropped())
        if entry.first is None:
            index = int(mask.arg_true()[0])
            entry.first = int(positions[index]) if positions is not None else offset + index
            entry.value = column[index]
        entry.count += hits

    def warnings(self) -> list[str]:
        """One warning per (field, reason): how many rows were dropped, the first record and its value."""
        out = []
        for (name, reason), d in self.dropped.items():
            value = d.value
            if isinstance(value, float) and not math.isfinite(value):
                shown = str(value)
            else:
                shown = excerpt(value)
            rows = "1 event" if d.count == 1 else f"{d.count} events"
            out.append(f"{self.where}: dropped {rows} whose {name} {reason} "
                       f"(first: event {d.first}, {name}={shown})")
        return out

    def finish(self, *, refuse_empty: bool = False, said: list[str] | None = None) -> None:
        """Refuse the file when rows were given and none was valid, or (``refuse_empty``) when none was given
        (then the reader's warnings, ``said``, say why: "4 B events have no matching E")."""
        if self.seen and not self.kept:
            (name, reason), d = next(iter(self.dropped.items()))
            raise InputError(f"{self.where}: no valid event: all {self.seen} break the validation rules "
                             f"(first: event {d.first}, {name} {reason})")
        if refuse_empty and not self.seen:
            why = "; ".join(w.removeprefix(f"{self.where}: ") for w in said or [])
            raise InputError(f"{self.where}: the trace has no events (nothing to store)"
                             + (f"; the reader: {why}" if why else ""))


# -- device properties ---------------------------------------------------------------------------------------
_CC = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}", re.ASCII)
_KIND = re.compile(r"[A-Za-z]{1,16}", re.ASCII)


def _whole(lo: int, hi: int):
    def check(value: object) -> bool:
        return type(value) is int and lo <= value <= hi
    return check


def _finite_above_zero(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 < value < 1e15


#: Device field -> (the check a value passes, what a failing one is said to be). One table for every reader
#: (Kineto ``deviceProperties``, nsys ``TARGET_INFO_GPU``, TAU metadata, ncu, nvprof) and the traceparse
#: Chrome export's own header: a name that is a number, ``totalGlobalMem`` "80GB", ``numSms`` "many", -132 or
#: 0 are dropped here, so no rule says "fewer blocks than the -132 SMs".
DEVICE_RULES: dict[str, tuple] = {
    "id": (_whole(0, 2**31 - 1), "is not a whole number from 0 to 2,147,483,647"),
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "is not a text name"),
    "kind": (lambda v: isinstance(v, str) and _KIND.fullmatch(v) is not None,
             "is not a device word of 1 to 16 letters (TPU)"),
    "sm_count": (_whole(1, 2**31 - 1), "is not a whole number of SMs above 0"),
    "memory_bytes": (_whole(1, INT64_MAX), "is not a whole number of bytes above 0"),
    "compute_capability": (lambda v: isinstance(v, str) and _CC.fullmatch(v) is not None,
                           "is not a compute capability MAJOR.MINOR"),
    "core_clock_mhz": (_finite_above_zero, "is not a finite number of MHz above 0"),
    "memory_clock_mhz": (_finite_above_zero, "is not a finite number of MHz above 0"),
}


def validate_devices(devices: list, where: str = "the trace") -> list[str]:
    """Check every device's properties (:data:`DEVICE_RULES`) in place: a bad value becomes None (unknown).

    One policy with the events': one warning per field and reason, with the count, the first device (its
    position in the trace's device list) and a short excerpt of its value. Returns the warnings.
    """
    dropped: dict[tuple[str, str], _Dropped] = {}
    for index, device in enumerate(devices):
        if isinstance(device.name, str) and not device.name.strip():
            device.name = None  # an empty name is no name (ROCm's Kineto traces of some devices): nothing to warn of
        for name, (ok, reason) in DEVICE_RULES.items():
            value = getattr(device, name, None)
            if value is None or ok(value):
                continue
            entry = dropped.setdefault((name, reason), _Dropped())
            if entry.first is None:
                entry.first, entry.value = index, value
            entry.count += 1
            setattr(device, name, None)
        if not isinstance(device.extra, dict):
            device.extra = {}
    out = []
    for (name, reason), d in dropped.items():
        values = "1 device value" if d.count == 1 else f"{d.count} device values"
        out.append(f"{where}: dropped {values} whose {name} {reason} (first: device {d.first}, "
                   f"{name}={excerpt(d.value)})")
    return out
