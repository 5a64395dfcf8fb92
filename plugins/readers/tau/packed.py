"""ParaProf's packed profile (``.ppk``): every thread, metric, routine and user event of a TAU run in one file.

The layout is that of TAU's writer ``DataSourceExport.writePacked`` and reader
``PackedProfileDataSource.load`` (tools/src/perfdmf/src in UO-OACISS/tau2; docs/formats/tau.md lists each
field): gzip around Java's ``DataOutputStream`` (big-endian ``int``/``double``, strings as ``writeUTF``: a
2-byte length, then modified UTF-8), in this order: ``PPK`` (3 UTF-16 characters), version, lowest compatible
version, a length-prefixed header (version >= 2: a skipped block, the trial's metadata, each thread's metadata),
the metric names, the group names, the routines (name and group ids), the user-event names, then per thread
its routine records (id, calls, subrs, exclusive and inclusive value of each metric) and user-event records
(id, numevents, min, max, mean, sumsqr).

A thread's routine records are fixed-size, so each thread's are read as one numpy array, not value by value.
The values become the same tables a ``paraprof --dump`` of the file gives when read as ``profile.N.C.T``
files (:func:`.profiles.assemble`): times as the shortest decimal of the double, converted exactly to ns.
A file cut short keeps its complete threads, with a warning; a file cut before any thread is a one-line error
saying what was expected where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from traceparse.errors import bad_input
from traceparse.sources import GZIP_DAMAGE, damaged_gzip, open_binary
from traceparse.validate import excerpt

from . import events
from .profiles import ProfileSet, assemble, gpu_facts
from .sniff import PACKED_HEAD
from .whole import WholeNumbers

#: The newest layout this reader knows: PackedProfileDataSource refuses a file whose lowest compatible version is
#: above 2 ("This packed profile is not compatible, please upgrade").
COMPATIBLE = 2
_CHUNK = 1 << 20


class _Short(Exception):
    """The data ends before the field being read; ``what`` names that field."""

    def __init__(self, what: str, offset: int):
        super().__init__(what)
        self.what, self.offset = what, offset


class _Cursor:
    """Reads Java ``DataOutputStream`` fields (big-endian) from ``data``, raising :class:`_Short` at its end."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.at, self.path = data, 0, path

    def take(self, size: int, what: str) -> int:
        """The offset of the next ``size`` bytes (``what``), which are skipped."""
        start = self.at
        if size < 0 or start + size > len(self.data):
            raise _Short(what, start)
        self.at = start + size
        return start

    def int(self, what: str) -> int:
        """A Java ``int``."""
        return int.from_bytes(self.data[self.take(4, what):self.at], "big", signed=True)

    def count(self, what: str) -> int:
        """A Java ``int`` that counts what follows: a negative one is no count (the file is damaged)."""
        start = self.at
        n = self.int(what)
        if n < 0:
            raise bad_input(self.path, None, f"expected {what} at byte {start:,} (decompressed), found {n}: "
                                             "the file is damaged")
        return n

    def utf(self, what: str) -> str:
        """A Java ``writeUTF`` string: 2-byte length, then modified UTF-8 (NUL as C0 80, surrogates as 3 bytes)."""
        n = int.from_bytes(self.data[self.take(2, what):self.at], "big")
        raw = self.data[self.take(n, what):self.at]
        return java_utf(raw)


def java_utf(raw: bytes) -> str:
    """Java's modified UTF-8 as text: a NUL is written C0 80 and a character outside the BMP as two 3-byte
    surrogates; names are kept literally (undecodable bytes become U+FFFD rather than refusing the file)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", errors="surrogatepass")
        return text.encode("utf-16-be", errors="surrogatepass").decode("utf-16-be", errors="replace")


def load(path: Path) -> tuple[bytes, str | None]:
    """The decompressed bytes of ``path`` (gzip, or not: ParaProf reads an unzipped ``.ppk`` too) and, if the gzip
    stream is cut short, why; a damaged stream is a one-line InputError."""
    try:
        f = open_binary(path)
    except OSError as exc:
        raise bad_input(path, None, f"cannot be read: {exc.strerror or exc}") from None
    parts: list[bytes] = []
    cut = None
    with f:
        try:
            while piece := f.read1(_CHUNK):  # in pieces: a stream cut short keeps what came before the cut
                parts.append(piece)
        except EOFError as exc:
            cut = str(exc) or "the gzip stream ends early"
        except GZIP_DAMAGE as exc:
            raise damaged_gzip(path, exc) from None
    return b"".join(parts), cut


def read_packed(path: Path, warn: Callable[[str], None],
                progress: Callable[[int], None] = lambda n: None) -> ProfileSet:
    """Read a ``.ppk`` into the tables :func:`events.build_events` takes (see the module docstring)."""
    data, cut = load(path)
    progress(path.stat().st_size)
    if not data.startswith(PACKED_HEAD):
        raise bad_input(path, None, "not a ParaProf packed profile: expected gzip data starting with 'PPK' as Java "
                                    f"writes characters (00 50 00 50 00 4B), found "
                                    f"{data[:6].hex(' ') if data else 'no data'}")
    cursor = _Cursor(data, path)
    cursor.at = len(PACKED_HEAD)
    try:
        head = _Head.read(cursor, path)
    except _Short as short:
        raise bad_input(path, None, f"the file ends early{f' ({cut})' if cut else ''} (byte {short.offset:,} of "
                                    f"{len(data):,} decompressed) while reading {short.what}, before any thread's "
                                    "data") from None
    threads, stopped = _threads(cursor, head, path)
    if stopped is not None:
        why = f" ({cut})" if cut else ""
        if not threads:
            raise bad_input(path, None, f"the file ends early{why} (byte {stopped.offset:,} of {len(data):,} "
                                        f"decompressed) while reading {stopped.what}, before any thread's data")
        one = len(threads) == 1
        warn(f"{path}: the file ends early{why} while reading {stopped.what}; {len(threads)} complete "
             f"thread{'' if one else 's'} of {head.thread_count} {'was' if one else 'were'} kept")
    elif not threads:
        raise bad_input(path, None, f"no thread's data: the file announces {head.thread_count} threads")
    elif cursor.at < len(data):
        warn(f"{path}: {len(data) - cursor.at:,} bytes after the last thread's data were not read")
    return _tables(path, head, threads, warn)


class _Head:
    """Everything before the threads' data: metadata, metric, group, routine and user-event names."""

    version: int
    trial_metadata: dict[str, str]
    thread_metadata: dict[tuple[int, int, int], dict[str, str]]
    metrics: list[str]
    groups: list[str]
    routines: list[str]
    routine_groups: list[str | None]
    user_events: list[str]
    thread_count: int

    @classmethod
    def read(cls, c: _Cursor, path: Path) -> "_Head":
        """The fields from the version to the count of threads, in the order ``writePacked`` writes them."""
        head = cls()
        head.version = c.int("the file version")
        compatible = c.int("the lowest compatible version")
        if compatible > COMPATIBLE:
            raise bad_input(path, None, f"a packed profile of version {head.version} that needs a reader of version "
                                        f"{compatible}; this one reads up to version {COMPATIBLE}")
        head.trial_metadata, head.thread_metadata = {}, {}
        size = c.count("the header's size")
        end = c.at + size
        if end > len(c.data):
            raise _Short(f"a header of {size:,} bytes", c.at)
        if head.version >= 2:
            c.take(c.count("the size of the reserved block"), "the reserved block")
            for _ in range(c.count("the count of trial metadata")):
                name = c.utf("a trial metadata name")
                head.trial_metadata[name] = c.utf("a trial metadata value")
            for _ in range(c.count("the count of threads with metadata")):
                key = (c.int("a thread's node"), c.int("a thread's context"), c.int("a thread's thread id"))
                attrs = head.thread_metadata.setdefault(key, {})
                for _ in range(c.count("the count of a thread's metadata")):
                    name = c.utf("a thread metadata name")
                    attrs[name] = c.utf("a thread metadata value")
            c.at = max(c.at, end)  # what a later version adds to the header is skipped, as TAU's reader would
        else:  # version 1: a header this reader skips, as PackedProfileDataSource does
            c.at = end
        head.metrics = [c.utf("a metric name") for _ in range(c.count("the count of metrics"))]
        head.groups = [c.utf("a group name") for _ in range(c.count("the count of groups"))]
        head.routines, head.routine_groups = [], []
        for _ in range(c.count("the count of routines")):
            head.routines.append(c.utf("a routine name"))
            ids = [c.int("a routine's group id") for _ in range(c.count("the count of a routine's groups"))]
            bad = [g for g in ids if not 0 <= g < len(head.groups)]
            if bad:
                raise bad_input(path, None, f"routine {excerpt(head.routines[-1])} names group id {bad[0]}, but "
                                            f"the file has {len(head.groups)} groups")
            # as ParaProf's export writes GROUP="..." (Function.getGroupString: the groups joined by |)
            head.routine_groups.append("|".join(head.groups[g] for g in ids) if ids else None)
        head.user_events = [c.utf("a user event name") for _ in range(c.count("the count of user events"))]
        head.thread_count = c.count("the count of threads")
        return head


def _record(metrics: int) -> np.dtype:
    """One routine record of a thread: id, calls, subrs, then exclusive and inclusive value per metric."""
    fields = [("id", ">i4"), ("calls", ">f8"), ("subrs", ">f8")]
    for k in range(metrics):
        fields += [(f"excl{k}", ">f8"), (f"incl{k}", ">f8")]
    return np.dtype(fields)


#: One user-event record of a thread (``writeInt(i); writeInt(numSamples)``; min, max, mean, sumsqr).
_USER_EVENT = np.dtype([("id", ">i4"), ("numevents", ">i4"), ("min", ">f8"), ("max", ">f8"), ("mean", ">f8"),
                        ("sumsqr", ">f8")])


def _threads(c: _Cursor, head: _Head, path: Path) -> tuple[list, _Short | None]:
    """Each complete thread as ((node, context, thread), routine records, user-event records), and where the data
    stopped if it ended early. Ids that name no routine or user event are a one-line InputError."""
    record = _record(len(head.metrics))
    out = []
    for i in range(head.thread_count):
        try:
            key = (c.int(f"thread {i + 1}'s node"), c.int(f"thread {i + 1}'s context"),
                   c.int(f"thread {i + 1}'s thread id"))
            where = f"routine records of thread {'.'.join(map(str, key))}"
            n = c.count(f"the count of {where}")
            routines = np.frombuffer(c.data, record, n, c.take(n * record.itemsize, f"the {n:,} {where}"))
            where = f"user-event records of thread {'.'.join(map(str, key))}"
            m = c.count(f"the count of {where}")
            user_events = np.frombuffer(c.data, _USER_EVENT, m,
                                        c.take(m * _USER_EVENT.itemsize, f"the {m:,} {where}"))
        except _Short as short:
            return out, short
        for ids, names, what in ((routines["id"], head.routines, "routine"),
                                 (user_events["id"], head.user_events, "user event")):
            bad = (ids < 0) | (ids >= len(names))
            if bad.any():
                raise bad_input(path, None, f"thread {'.'.join(map(str, key))} refers to {what} id "
                                            f"{int(ids[bad][0])}, but the file names {len(names)} {what}s")
        out.append((key, routines, user_events))
    return out, None


def _tables(path: Path, head: _Head, threads: list, warn: Callable[[str], None]) -> ProfileSet:
    """The threads' records as the columns :func:`.profiles.assemble` takes from text profiles (one frame per
    metric: thread, seq, raw name, group, calls, subcalls, excl and incl as decimal text), built once over all
    threads from the concatenated arrays."""
    seen: set = set()
    kept = []
    for key, routines, user_events in threads:
        if key in seen:  # ParaProf would merge them into one thread, the later values overwriting
            warn(f"{path}: thread {'.'.join(map(str, key))} appears twice; the second was left out")
            continue
        seen.add(key)
        kept.append((key, routines, user_events))
    metrics = _metric_names(head.metrics, path, warn)
    sizes = np.array([len(r) for _, r, _ in kept], dtype=np.int64)
    keys = np.array([k for k, _, _ in kept], dtype=np.int64).reshape(-1, 3)
    routines = np.concatenate([r for _, r, _ in kept]) if kept else np.empty(0, _record(len(head.metrics)))
    ids = routines["id"].astype(np.int64)
    base = pl.DataFrame({
        "node": np.repeat(keys[:, 0], sizes), "context": np.repeat(keys[:, 1], sizes),
        "thread": np.repeat(keys[:, 2], sizes),
        "seq": np.arange(len(routines), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes),
        "raw": pl.Series(head.routines, dtype=pl.String).gather(ids),
        "group": pl.Series(head.routine_groups, dtype=pl.String).gather(ids),
        "calls": _whole(routines["calls"], "calls", path, warn),
        "subcalls": _whole(routines["subrs"], "subrs", path, warn),
    }).with_columns(path=pl.lit(str(path)), line=pl.lit(None, pl.Int64))
    frames = []
    for k, metric in enumerate(metrics):
        if metric is None:
            continue
        frames.append(base.with_columns(metric=pl.lit(metric), excl=_decimal(routines[f"excl{k}"], metric, path, warn),
                                        incl=_decimal(routines[f"incl{k}"], metric, path, warn)))
    if not frames:
        raise bad_input(path, None, "no metric: the file names none, so its routines have no values")
    numbers = WholeNumbers()
    metadata, thread_rows = [], []
    for key, _, _ in kept:
        attrs = {**head.trial_metadata, **head.thread_metadata.get(key, {})}  # as the export writes both
        metadata.append((key, attrs))
        thread_rows.append({"node": key[0], "context": key[1], "thread": key[2],
                            **gpu_facts(attrs, numbers, f"{path} (thread {'.'.join(map(str, key))} metadata)")})
    numbers.flush(warn)
    return assemble(pl.concat(frames), _user_events(path, head, kept), pl.DataFrame(
        thread_rows, schema=events.THREADS, strict=False), metadata, 1, warn)


def _metric_names(names: list[str], path: Path, warn: Callable[[str], None]) -> list[str | None]:
    """The metric names as the export of the file names them: ParaProf calls TAU's one time metric ``Time`` and
    exports it as plain ``templated_functions``, read as TIME. A name written twice is left out the second time
    (None), with a warning."""
    if len(names) == 1 and names[0] == "Time":
        return ["TIME"]
    out: list[str | None] = []
    for name in names:
        if name in out:
            warn(f"{path}: metric {excerpt(name)} is named twice; the second was left out")
            out.append(None)
        else:
            out.append(name)
    return out


def _decimal(values: np.ndarray, metric: str, path: Path, warn: Callable[[str], None]) -> pl.Series:
    """Doubles as the shortest decimal text that reads back as them (what ParaProf's export writes, as Java's
    ``Double.toString``), for :func:`.profiles.assemble` to convert exactly; NaN and infinity left unknown with a
    warning."""
    series = pl.Series(values.astype(np.float64))
    finite = series.is_finite()
    if not finite.all():
        warn(f"{path}: {int((~finite).sum()):,} {metric} values are not finite numbers "
             f"(e.g. {series.filter(~finite)[0]}); left unknown")
        series = series.set(~finite, None)
    return series.cast(pl.String)


def _whole(values: np.ndarray, what: str, path: Path, warn: Callable[[str], None]) -> pl.Series:
    """Calls or Subrs (doubles in the file) as Int64: fractions (averaged profiles) rounded half to even with a
    warning, as the text reader does; NaN, infinity or a value beyond Int64 left unknown with a warning."""
    values = values.astype(np.float64)
    fit = np.isfinite(values) & (np.abs(values) < 2.0 ** 63)
    if not fit.all():
        warn(f"{path}: {int((~fit).sum()):,} {what} values are not whole numbers that fit (e.g. "
             f"{float(values[~fit][0])!r}); left unknown")
    rounded = np.rint(np.where(fit, values, 0.0))
    fractional = fit & (rounded != values)
    if fractional.any():
        warn(f"{path}: {int(fractional.sum()):,} fractional {what} values (e.g. {float(values[fractional][0])!r}) were "
             "rounded to whole numbers")
    return pl.Series(rounded.astype(np.int64)).set(pl.Series(~fit), None)


def _user_events(path: Path, head: _Head, kept: list) -> pl.DataFrame:
    """Every thread's user-event records as the user-event table (calls = numevents, value = mean)."""
    sizes = np.array([len(u) for _, _, u in kept], dtype=np.int64)
    if not sizes.sum():
        return events.empty(events.USER_EVENTS)
    keys = np.array([k for k, _, _ in kept], dtype=np.int64).reshape(-1, 3)
    records = np.concatenate([u for _, _, u in kept])
    return pl.DataFrame({
        "node": np.repeat(keys[:, 0], sizes), "context": np.repeat(keys[:, 1], sizes),
        "thread": np.repeat(keys[:, 2], sizes),
        "name": pl.Series(head.user_events, dtype=pl.String).gather(records["id"].astype(np.int64)),
        "calls": records["numevents"].astype(np.int64),
        "value": records["mean"].astype(np.float64), "value_min": records["min"].astype(np.float64),
        "value_max": records["max"].astype(np.float64), "value_sumsq": records["sumsqr"].astype(np.float64),
    })

