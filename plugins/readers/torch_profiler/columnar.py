"""The torch reader's fast path: a chunk of ``traceEvents`` decoded straight into columns, no Python per event.

Arrow's JSON reader (pyarrow, already a dependency) parses the chunk with an explicit schema into columnar
arrays: every field the careful path (:mod:`.events`: msgspec structs, then rows) types, typed alike and
derived from the same structs (:class:`.kineto.Args`), so the two cannot drift apart. Times are read as
``decimal128(20, 3)``: microseconds with three decimals, whose unscaled integer *is* the time in
nanoseconds, exact at any size (no float on the way). polars expressions then make the same rows as
:func:`.events.rows_of`, :func:`.memory.memory_rows` and :mod:`.threads`.

Nothing is guessed where the two readers could differ. The chunk is first decoded by msgspec as a list of
tiny structs (:func:`_checker`), which checks what the careful path's decoder checks (JSON syntax, UTF-8,
nesting depth, every event an object), keeps the raw text Arrow cannot give (``Input Dims``, a thread's
name) and the pids written as text (``"Spans"``), and finds which rare arguments (:data:`RARE`) the chunk
has, so that Arrow's schema holds only those. Then anything the fast path cannot give exactly as the careful path would gives ``None``, and the
careful path reads that chunk, with its coercions, warnings and errors: a value of another JSON type than
the careful struct's first choice (ROCm's ``"stream": "0x0"``, a float id), a duplicate key, a number past
its column, a time with more than three decimals, ``"args": null``. ``tests/test_columnar.py`` checks that
both paths give the same table, warnings and errors on every torch fixture and the hostile corpus.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, get_args

import msgspec
import polars as pl

from traceparse.schema import COPY_KINDS, MEMORY_KINDS
from traceparse.validate import INT64_MAX

from traceparse_plugins.readers.chrome_json.decoder import gc_paused
from traceparse_plugins.readers.torch_profiler.coerce import Coercions
from traceparse_plugins.readers.torch_profiler.events import (
    _COMM_NAME, _COPY_NAME, _EMPTY, _known, _raw_text, CATEGORY_KIND, DTYPE_BYTES, GPU_CATEGORIES, collective_of,
    compact_json_text,
)
from traceparse_plugins.readers.torch_profiler.kineto import Args
from traceparse_plugins.readers.torch_profiler.memory import KEYS, MEMORY_EVENT, counter_rows, with_counters
from traceparse_plugins.readers.torch_profiler.threads import thread_name

#: Chunks larger than this (a chunk merged after a cut inside a string) are left to the careful path.
MAX_FAST_BYTES = 1 << 30
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_TIME_RANGE = (-INT64_MAX, INT64_MAX)  # what traceparse.units accepts as nanoseconds
#: Args fields that are Int32 columns: a value outside Int32 is coerced (left empty) by the careful path.
_INT32_ARGS = ("device", "in_device", "from_device", "to_device", "context", "registers")
_MEMORY_INT32 = ("mem_device_id", "mem_device_type")
#: Arguments most events never have, by group: a chunk's Arrow schema has a group's fields only when one of
#: its events has one (Arrow's cost grows with the schema's fields, present or not).
RARE = {
    "legacy": ("external_id_legacy",),
    "flops": ("flops",),
    "peer": ("in_device", "from_device", "to_device"),
    "memory": ("mem_bytes", "mem_allocated", "mem_reserved", "mem_device_id", "mem_device_type"),
    "comm": ("collective_name", "in_nelems", "out_nelems", "in_nelems_legacy", "out_nelems_legacy", "dtype",
             "pg_name", "seq"),
}


def _first_choice(annotation: Any) -> str:
    """What msgspec reads first for a field typed ``annotation``: ``int``, ``float``, ``str`` or ``[int]``;
    Arrow reads only that (a value of another type: the careful path, which coerces it)."""
    first = ([a for a in get_args(annotation) if a is not type(None)] or [annotation])[0]
    if first in (int, float, str):
        return first.__name__
    if getattr(first, "__origin__", None) is list and get_args(first) == (int,):
        return "[int]"
    raise TypeError(f"no column type for {annotation!r}")


#: (JSON key, Args attribute, first choice) of every typed Args field; raw ones (``msgspec.Raw``) are not read.
ARGS = [(f.encode_name, f.name, _first_choice(f.type)) for f in msgspec.structs.fields(Args) if f.type is not msgspec.Raw]
_POLARS = {"int": pl.Int64, "float": pl.Float64, "str": pl.String, "[int]": pl.List(pl.Int64)}
_DTYPES = {name: _POLARS[kind] for _, name, kind in ARGS}
_KEYS = {name: key for key, name, _ in ARGS}
_NAME_OF_KEY = {key: name for key, name, _ in ARGS}
_GROUP_OF_KEY = {_KEYS[name]: group for group, names in RARE.items() for name in names}
_RARE_NAMES = {name for names in RARE.values() for name in names}


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "[int]": pa.list_(pa.int64())}[kind]


class _CheckedArgs(msgspec.Struct, gc=False):
    """The raw texts of an event's arguments that Arrow cannot give."""

    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    meta_name: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="name")


_CHECKERS: dict[tuple[frozenset, bool], msgspec.json.Decoder] = {}


def _checker(groups: frozenset, labels: bool) -> msgspec.json.Decoder:
    """A decoder of the chunk as a list of tiny structs. The rare arguments of the groups not in ``groups``
    must be absent (or null), and without ``labels`` every pid and tid an integer (or null), else a
    ValidationError names the first one found; with ``labels`` the pids and tids are kept (int or str)."""
    key = (groups, labels)
    if key not in _CHECKERS:
        absent = [(name, None, msgspec.field(default=None, name=_KEYS[name]))
                  for group, names in RARE.items() if group not in groups for name in names]
        args = msgspec.defstruct("CheckedArgs", absent, bases=(_CheckedArgs,), gc=False)
        ids = int | str | None if labels else int | None
        event = msgspec.defstruct("CheckedEvent", [("args", args, msgspec.field(default_factory=args)),
                                                   ("pid", ids, None), ("tid", ids, None)], gc=False)
        _CHECKERS[key] = msgspec.json.Decoder(list[event])
    return _CHECKERS[key]


_RARE_AT = re.compile(r" - at `\$\[\d+\]\.args\.(.+)`$")
_LABEL_AT = re.compile(r"^Expected `int \| null`, got `str` - at `\$\[\d+\]\.[pt]id`$")
#: The raw arguments kept as text: Args attribute -> how the careful path makes its column of the raw texts.
_RAW = {"input_dims": lambda text: text.str.replace_all(r"\s+", "").replace("", None),
        "input_types": compact_json_text, "concrete_inputs": compact_json_text}
_SCHEMAS: dict[tuple[frozenset, bool], Any] = {}
_ARGS = attrgetter("args")


def _per_distinct(text: pl.Series, make) -> pl.Series:
    """``make(text)``, worked out once per distinct text: operators repeat a few argument lists, so the cost
    follows the distinct texts (a few hundred a chunk), not the events."""
    distinct = text.unique()
    return text.replace_strict(distinct, make(distinct), return_dtype=pl.String)


def _schema(groups: frozenset, labels: bool):
    """The Arrow schema of ``{"e": [events]}``: the event's fields, the common arguments and those of ``groups``;
    with ``labels`` no pid and tid (some are text: msgspec keeps them)."""
    key = (groups, labels)
    if key not in _SCHEMAS:
        import pyarrow as pa

        wanted = {name for group in groups for name in RARE[group]}
        args = [(k, _arrow_type(kind)) for k, name, kind in ARGS if name not in _RARE_NAMES or name in wanted]
        time = pa.decimal128(20, 3)
        ids = [] if labels else [("pid", pa.int64()), ("tid", pa.int64())]
        fields = [("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), *ids, ("ts", time),
                  ("dur", time), ("args", pa.struct(args))]
        _SCHEMAS[key] = pa.schema([("e", pa.list_(pa.struct(fields)))])
    return _SCHEMAS[key]


#: The groups of rare arguments the last chunk had, and whether it had labels for pids (this process): the
#: next chunk is checked with those first.
_last: list[tuple[frozenset, bool]] = [(frozenset(), False)]


def _read(wrapped: bytearray, groups: frozenset, labels: bool):
    """The events of ``{"e": [events]}`` as one Arrow struct array (Arrow's exceptions pass through)."""
    import pyarrow as pa
    import pyarrow.json as pajson

    table = pajson.read_json(
        pa.BufferReader(wrapped),
        read_options=pajson.ReadOptions(block_size=len(wrapped) + 1, use_threads=False),
        parse_options=pajson.ParseOptions(explicit_schema=_schema(groups, labels),
                                          unexpected_field_behavior="ignore", newlines_in_values=True),
        memory_pool=pa.system_memory_pool())
    return table.column(0).chunk(0).values


def fast_rows(data: bytes) -> tuple[tuple[pl.DataFrame, Coercions, dict[str, str]], int] | None:
    """What :func:`traceparse_plugins.readers.torch_profiler.chunk_rows` gives for the events in ``data``
    (the bytes of whole events, commas between) and their number, or None where only the careful path can say.

    ``data`` is a chunk cut by the shared decoder (:func:`~traceparse_plugins.readers.chrome_json.map_chunks`):
    a cut that was no event boundary fails the check and gives None too.
    """
    if len(data) > MAX_FAST_BYTES:
        return None
    if not data.isascii():  # msgspec skips what it does not keep unread and Arrow keeps bytes as they are:
        try:                # bytes that are not UTF-8 are the careful path's (it replaces and counts them)
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    groups, labels = _last[0]
    wrapped = b"".join((b'{"e":[', data, b"]}"))  # Arrow's document; msgspec's list is inside it: one copy
    del data
    # the raw texts msgspec keeps point into the buffer: the view goes when they go
    checked = _check(memoryview(wrapped)[len(b'{"e":'):-1], groups, labels)
    if checked is None:
        return None
    groups, labels, checked = checked
    import pyarrow as pa

    try:
        events = _read(wrapped, groups, labels)
    except (pa.ArrowException, ValueError, OverflowError):
        return None
    del wrapped
    if len(events) != len(checked):
        return None
    frame = _frame(events)
    if frame is None:
        return None
    if labels:  # as the careful path reads them: polars' non-strict Int64 (a label is no id)
        frame = frame.with_columns(pl.Series(key, list(map(attrgetter(key), checked)), dtype=pl.Int64, strict=False)
                                   for key in ("pid", "tid"))
    rows = _rows(frame, checked)
    return None if rows is None else (rows, len(checked))


def _check(events_list, groups: frozenset, labels: bool) -> tuple[frozenset, bool, list] | None:
    """The chunk decoded by msgspec as :func:`_checker` structs, the groups of rare arguments it has and whether
    it has labels for pids; None when it does not decode (the careful path will say why)."""
    while True:
        try:
            with gc_paused():
                checked = _checker(groups, labels).decode(events_list)
            break
        except msgspec.ValidationError as exc:  # a rare argument: its group joins the schema, or the careful path
            message = str(exc)
            m = _RARE_AT.search(message)
            group = _GROUP_OF_KEY.get(m.group(1)) if m else None
            if group is not None and group not in groups:
                groups = groups | {group}
            elif not labels and _LABEL_AT.match(message):  # a pid written as a label (Kineto's "Spans")
                labels = True
            else:
                return None
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return None
    _last[0] = (groups, labels)
    return (groups, labels, checked) if checked else None


def _frame(events) -> pl.DataFrame | None:
    """The struct array as a flat DataFrame: the event's fields, ``_args`` (whether it has ``args``) and every
    Args field by its attribute name (null where the schema had not the field); None where a list of ints
    holds a null (which msgspec refuses)."""
    import pyarrow as pa

    columns, names = [], []
    for field, child in zip(events.type, events.flatten()):
        if field.name != "args":
            columns.append(child)
            names.append(field.name)
            continue
        columns.append(child.is_valid())
        names.append("_args")
        for arg, value in zip(child.type, child.flatten()):
            if pa.types.is_list(arg.type) and value.flatten().null_count:
                return None
            columns.append(value)
            names.append(_NAME_OF_KEY[arg.name])
    frame = pl.from_arrow(pa.Table.from_arrays(columns, names=names))
    missing = {name: pl.lit(None, dtype=dtype) for name, dtype in _DTYPES.items() if name not in frame.columns}
    return frame.with_columns(**missing) if missing else frame


def _rows(df: pl.DataFrame, checked: list) -> tuple[pl.DataFrame, Coercions, dict] | None:
    """The rows of the decoded columns, or None where they differ from the careful path's."""
    category = pl.col("cat").str.to_lowercase()
    df = df.with_columns(
        _row=pl.int_range(pl.len(), dtype=pl.UInt32),
        kind=category.replace_strict(CATEGORY_KIND, default=None, return_dtype=pl.String),
        gpu=category.is_in(list(GPU_CATEGORIES)),
    )
    kept = df.filter((pl.col("ph") == "X").fill_null(False) & pl.col("kind").is_not_null())
    args = list(map(_ARGS, checked))
    raws = {name: _raw_text(list(map(attrgetter(name), args))) for name in _RAW}
    rows = _event_rows(kept, raws)
    if rows is None:
        return None
    memory = df.filter((pl.col("name") == MEMORY_EVENT) & pl.col("ph").is_in(["i", "I"]) & pl.col("_args"))
    counters = None
    if memory.height:
        counters = _counter_rows(memory)
        if counters is None:
            return None
    return with_counters(rows, counters), Coercions(), _thread_names(df, checked)


def _out_of(column: str, lo: int, hi: int) -> pl.Expr:
    return (pl.col(column).is_not_null() & ~pl.col(column).is_between(lo, hi)).any()


def _event_rows(kept: pl.DataFrame, raws: dict[str, pl.Series]) -> pl.DataFrame | None:
    """:func:`.events.rows_of` of the kept rows; None where the careful path would coerce, warn or refuse."""
    if kept.height == 0:
        return _EMPTY
    dim3 = {}
    for label in ("grid", "block"):
        whole = pl.col(label).list.len() == 3
        for i, axis in enumerate("xyz"):
            dim3[f"{label}_{axis}"] = pl.when(whole).then(pl.col(label).list.get(i, null_on_oob=True))
    kept = kept.with_columns(_ts=pl.col("ts").to_physical(), _dur=pl.col("dur").to_physical(), **dim3)
    checks = ([_out_of(c, *_INT32) for c in (*_INT32_ARGS, *dim3)]
              + [_out_of(c, *_TIME_RANGE) for c in ("_ts", "_dur")])
    if kept.select(pl.any_horizontal(checks)).item():
        return None
    gpu = pl.col("gpu")
    df = kept.select(
        "kind", "name",
        start_ns=pl.col("_ts").cast(pl.Int64),
        duration_ns=pl.col("_dur").cast(pl.Int64),
        pid=pl.when(~gpu).then(pl.col("pid")),
        tid=pl.when(~gpu).then(pl.col("tid")),
        device_id=pl.coalesce(pl.col("device").cast(pl.Int32), pl.col("in_device").cast(pl.Int32),
                              pl.when(gpu).then(pl.col("pid")).cast(pl.Int32, strict=False)),
        src_device=pl.col("from_device").cast(pl.Int32),
        dst_device=pl.col("to_device").cast(pl.Int32),
        context_id=pl.col("context").cast(pl.Int32),
        stream_id=pl.coalesce(pl.col("stream"), pl.when(gpu).then(pl.col("tid"))),
        correlation_id=pl.col("correlation"),
        external_id=pl.col("external_id").fill_null(pl.col("external_id_legacy")),
        registers_per_thread=pl.col("registers").cast(pl.Int32),
        bytes=pl.col("bytes"),
        flops=pl.col("flops"),
        **{name: _per_distinct(raws[name].gather(kept["_row"]), make) for name, make in _RAW.items()},
        **{c: pl.col(c).cast(pl.Int32) for c in dim3},
        _smem=pl.col("shared_memory"),
        _args=pl.col("_args"),
        _event=pl.col("_row"),
        **{c: pl.col(c) for c in ("collective_name", "seq", "pg_name", "dtype", "in_nelems", "out_nelems",
                                  "in_nelems_legacy", "out_nelems_legacy")},
    )
    copy = pl.col("name").str.extract_groups(_COPY_NAME)
    df = df.with_columns(copy=pl.when(pl.col("kind") == "memcpy").then(copy)).with_columns(
        copy_kind=_known(pl.col("copy").struct.field("1"), COPY_KINDS),
        src_memory=_known(pl.col("copy").struct.field("2").str.to_lowercase(), MEMORY_KINDS),
        dst_memory=_known(pl.col("copy").struct.field("3").str.to_lowercase(), MEMORY_KINDS),
        dynamic_smem_bytes=pl.when(pl.col("kind") == "kernel").then(pl.col("_smem")),
    ).drop("copy", "_smem")
    comm = _comm(df)
    if comm is None:
        return None
    return df.drop("_args", "collective_name", "seq", "pg_name", "dtype", "in_nelems", "out_nelems",
                   "in_nelems_legacy", "out_nelems_legacy").with_columns(comm).with_columns(
        bytes=pl.coalesce("bytes", "_comm_bytes")).drop("_comm_bytes")


def _comm(df: pl.DataFrame) -> list[pl.Series] | None:
    """:func:`.events.comm_columns` over columns; None when a message size passes Int64 (the careful path's text)."""
    picked = pl.col("name").str.contains(_COMM_NAME).fill_null(False) & pl.col("_args")
    elems = pl.max_horizontal("in_nelems", "out_nelems", "in_nelems_legacy", "out_nelems_legacy")
    size = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    parts = df.select(
        given=pl.when(picked).then(pl.col("collective_name")),
        seq=pl.when(picked).then(pl.col("seq")),
        process_group=pl.when(picked).then(pl.col("pg_name")),
        _elems=pl.when(picked & (size > 0)).then(elems),
        _size=size,
    )
    big = parts.select((pl.col("_elems").cast(pl.Int128) * pl.col("_size") > INT64_MAX).any()).item()
    if big:
        return None
    return [collective_of(df["name"], parts["given"]), parts["seq"],
            parts["process_group"], (parts["_elems"] * parts["_size"]).alias("_comm_bytes")]


def _counter_rows(memory: pl.DataFrame) -> pl.DataFrame | None:
    """:func:`.memory.memory_rows` over columns; None where the careful path would coerce or refuse."""
    memory = memory.with_columns(_ts=pl.col("ts").to_physical())
    checks = [_out_of(c, *_INT32) for c in _MEMORY_INT32] + [_out_of("_ts", *_TIME_RANGE)]
    if memory.select(pl.any_horizontal(checks)).item():
        return None
    m = memory.select(_ts=pl.col("_ts").cast(pl.Int64), _pid=pl.col("pid"), _tid=pl.col("tid"))
    return counter_rows(memory["_row"], m["_ts"].alias("ts"), memory["mem_device_id"].cast(pl.Int32),
                        memory["mem_device_type"].cast(pl.Int32), m["_pid"], m["_tid"],
                        {field: memory[field] for field in KEYS})


def _thread_names(df: pl.DataFrame, checked: list) -> dict[str, str]:
    """The chunk's ``thread_name`` events (a few): as :func:`.threads.collect_thread_names` reads them."""
    named = df.filter((pl.col("ph") == "M") & (pl.col("name") == "thread_name") & pl.col("_args"))
    names: dict[str, str] = {}
    for row in named["_row"]:
        event = checked[row]
        if isinstance(event.pid, int) and isinstance(event.tid, int):
            name = thread_name(event.args.meta_name)
            if name:
                names[f"{event.pid}/{event.tid}"] = name
    return names
