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

import functools
import re
from operator import attrgetter
from typing import Any, get_args

import msgspec
import polars as pl

from traceparse.schema import COPY_KINDS, MEMORY_KINDS
from traceparse.validate import INT64_MAX

from traceparse_plugins.readers.chrome_json.decoder import chunk_list, gc_paused
from traceparse_plugins.readers.torch_profiler.coerce import Coercions
from traceparse_plugins.readers.torch_profiler.events import (
    _COMM_NAME, _COPY_NAME, _EMPTY, _known, _raw_text, CATEGORY_KIND, DTYPE_BYTES, GPU_CATEGORIES, PEER_FIELDS,
    collective_of, compact_json_text, peer_expr,
)
from traceparse_plugins.readers.torch_profiler.kineto import Args
from traceparse_plugins.readers.torch_profiler.memory import KEYS, MEMORY_EVENT, counter_rows, with_counters
from traceparse_plugins.readers.torch_profiler.threads import thread_key, thread_name

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
             "pg_name", "seq", "dst_rank", "src_rank", "pg_ranks"),
}


def _first_choice(annotation: Any) -> str:
    """What msgspec reads first for a field typed ``annotation``: ``int``, ``float``, ``str`` or ``[int]``;
    Arrow reads only that (a value of another type: the careful path, which coerces it)."""
    first = ([a for a in get_args(annotation) if a is not type(None)] or [annotation])[0]
    if first in (int, float, str):
        return first.__name__
    if getattr(first, "__origin__", None) is list:  # list[int] or list[Int]: Arrow reads ints only
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


class _NameArgs(msgspec.Struct, gc=False):
    """A ``thread_name`` event's raw name (:func:`_thread_names`)."""

    meta_name: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="name")


class _NamedEvent(msgspec.Struct, gc=False):
    args: _NameArgs = None  # type: ignore[assignment]  (absent: None; an "args": null was refused by the check)


#: The events' raw ``args.name``, decoded again only for a chunk that has ``thread_name`` events (a few chunks
#: of a trace: Kineto writes them at its end). Not in :class:`_CheckedArgs`: one field fewer in the struct that
#: every event with arguments makes (24 fields, not 25) halved the time to free a chunk's structs here (CPython
#: 3.11's allocator; 35 against 75 ms for 14 chunks of 8 MiB).
_NAMES = msgspec.json.Decoder(list[_NamedEvent])


#: A pseudo-group of :func:`_checker` and :func:`_schema`: the chunk has a ``grid`` or ``block`` written as text
#: (Inductor's launch ops of PyTorch 2.5-2.6: ``"grid": "grid(100,)"``), which Arrow's list column cannot take:
#: msgspec reads the two (a list of ints, or a text, left empty as the careful path leaves it), Arrow not.
TEXT_DIMS = "text dims"
_DIMS = ("grid", "block")
#: Arrow's message for a ``grid``/``block`` that is text where the schema has a list.
_DIMS_CHANGED = re.compile(r"/args/(grid|block)\) changed from array to string")

_CHECKERS: dict[tuple[frozenset, bool], tuple[msgspec.json.Decoder, Any]] = {}


def _checker(groups: frozenset, labels: bool) -> msgspec.json.Decoder:
    """A decoder of the chunk as a list of tiny structs. The rare arguments of the groups not in ``groups``
    must be absent (or null), else a ValidationError names the first one found. With ``labels`` the pids and
    tids are kept (int or str); without, msgspec skips them and Arrow reads them, an integer or null (Arrow's
    int64 takes no value that msgspec's ``int | None`` refuses, and a text is Arrow's error: :data:`_LABEL_CHANGED`).
    With :data:`TEXT_DIMS` in ``groups``, ``grid`` and ``block`` are kept (a list of ints, or a text). An event
    without ``args`` has None (not an empty struct: fewer objects to make and free), an ``"args": null`` is
    refused as before."""
    key = (groups, labels)
    if key not in _CHECKERS:
        absent = [(name, None, msgspec.field(default=None, name=_KEYS[name]))
                  for group, names in RARE.items() if group not in groups for name in names]
        dims = [(name, list[int] | str | None, None) for name in _DIMS] if TEXT_DIMS in groups else []
        args = msgspec.defstruct("CheckedArgs", absent + dims, bases=(_CheckedArgs,), gc=False)
        ids = [("pid", int | str | None, None), ("tid", int | str | None, None)] if labels else []
        event = msgspec.defstruct("CheckedEvent", [("args", args, None), *ids], gc=False)
        _CHECKERS[key] = (msgspec.json.Decoder(list[event]), args())
    return _CHECKERS[key][0]


def _args_of(checked: list, groups: frozenset, labels: bool) -> list:
    """The events' ``args`` structs, an empty one where an event has none."""
    empty = _CHECKERS[(groups, labels)][1]
    return [empty if a is None else a for a in map(_ARGS, checked)]


_RARE_AT = re.compile(r" - at `\$\[\d+\]\.args\.(.+)`$")
#: Arrow's message for a pid or tid written as text (a label) where the schema has int64.
_LABEL_CHANGED = re.compile(r"Column\(/e/\[\]/[pt]id\) changed from number to string")
#: A pid or tid written as text near the end of a chunk: Kineto writes its labelled events (``"pid": "Spans"``)
#: last, so the chunk that has them has them in its last bytes; it is checked with labels from the start
#: rather than parsed by Arrow to the end first (a guess: a label elsewhere is found by Arrow, as above). The
#: guess is not carried to the next chunk (:data:`_last`): the next file's chunks, in a run's worker, would all
#: be checked with labels (0.07 CPU s a rank), where only its last few events have them.
_LABEL_NEAR = re.compile(rb'"[pt]id"\s*:\s*"')
_LABEL_TAIL = 1 << 16
#: The raw arguments kept as text: Args attribute -> how the careful path makes its column of the raw texts.
_RAW = {"input_dims": lambda text: text.str.replace_all(r"\s+", "").replace("", None),
        "input_types": compact_json_text, "concrete_inputs": compact_json_text}
_SCHEMAS: dict[tuple[frozenset, bool], Any] = {}
_ARGS = attrgetter("args")


def _schema(groups: frozenset, labels: bool):
    """The Arrow schema of ``{"e": [events]}``: the event's fields, the common arguments and those of ``groups``;
    with ``labels`` no pid and tid (some are text: msgspec keeps them)."""
    key = (groups, labels)
    if key not in _SCHEMAS:
        import pyarrow as pa

        wanted = {name for group in groups if group in RARE for name in RARE[group]}
        unread = _DIMS if TEXT_DIMS in groups else ()
        args = [(k, _arrow_type(kind)) for k, name, kind in ARGS
                if (name not in _RARE_NAMES or name in wanted) and name not in unread]
        time = pa.decimal128(20, 3)
        ids = [] if labels else [("pid", pa.int64()), ("tid", pa.int64())]
        fields = [("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), *ids, ("ts", time),
                  ("dur", time), ("args", pa.struct(args))]
        _SCHEMAS[key] = pa.schema([("e", pa.list_(pa.struct(fields)))])
    return _SCHEMAS[key]


#: The groups of rare arguments the last chunk had, and whether it had labels for pids (this process) where
#: Arrow found them (not only in the chunk's last bytes, :data:`_LABEL_NEAR`): the next chunk is checked with
#: those first.
_last: list[tuple[frozenset, bool]] = [(frozenset(), False)]


def _read(document: bytes, groups: frozenset, labels: bool):
    """The events of ``{"e": [events]}`` as one Arrow struct array (Arrow's exceptions pass through)."""
    import pyarrow as pa
    import pyarrow.json as pajson

    table = pajson.read_json(
        pa.BufferReader(document),
        read_options=pajson.ReadOptions(block_size=len(document) + 1, use_threads=False),
        parse_options=pajson.ParseOptions(explicit_schema=_schema(groups, labels),
                                          unexpected_field_behavior="ignore", newlines_in_values=True),
        memory_pool=pa.system_memory_pool())
    return table.column(0).chunk(0).values


def fast_rows(document: bytes) -> tuple[tuple[pl.DataFrame, Coercions, dict[str, str]], int] | None:
    """What :func:`traceparse_plugins.readers.torch_profiler.chunk_rows` gives for the events in ``document``
    (``{"e":[`` + the bytes of whole events, commas between + ``]}``) and their number, or None where only the
    careful path can say.

    ``document`` is a chunk cut by the shared decoder (:func:`~traceparse_plugins.readers.chrome_json.map_chunks`),
    which Arrow reads as it is and msgspec the list inside it: no copy. A cut that was no event boundary fails
    the check and gives None too.
    """
    if len(document) > MAX_FAST_BYTES:
        return None
    if not document.isascii():  # msgspec skips what it does not keep unread and Arrow keeps bytes as they are:
        try:                    # bytes that are not UTF-8 are the careful path's (it replaces and counts them)
            document.decode("utf-8")
        except UnicodeDecodeError:
            return None
    groups, labels = _last[0]
    guessed = not labels and _LABEL_NEAR.search(document, max(0, len(document) - _LABEL_TAIL)) is not None
    labels = labels or guessed
    import pyarrow as pa

    while True:
        # the raw texts msgspec keeps point into the document: the view goes when they go
        checked = _check(chunk_list(document), groups, labels)
        if checked is None:
            return None
        groups, labels, checked = checked
        try:
            events = _read(document, groups, labels)
            break
        except (pa.ArrowException, ValueError, OverflowError) as exc:  # again, msgspec reading what Arrow cannot
            message = str(exc)
            if TEXT_DIMS not in groups and _DIMS_CHANGED.search(message):
                groups = groups | {TEXT_DIMS}
            elif not labels and _LABEL_CHANGED.search(message):  # a pid written as a label (Kineto's "Spans")
                labels, guessed = True, False
            else:
                return None
    _last[0] = (groups, labels and not guessed)
    if len(events) != len(checked):
        return None
    frame = _frame(events)
    if frame is None:
        return None
    args = _args_of(checked, groups, labels)
    if TEXT_DIMS in groups:
        frame = _with_dims(frame, args)
        if frame is None:
            return None
    if labels:  # as the careful path reads them: polars' non-strict Int64 (a label is no id)
        frame = frame.with_columns(pl.Series(key, list(map(attrgetter(key), checked)), dtype=pl.Int64, strict=False)
                                   for key in ("pid", "tid"))
    rows = _rows(frame, checked, args, labels, document)
    return None if rows is None else (rows, len(checked))


def _check(events_list, groups: frozenset, labels: bool) -> tuple[frozenset, bool, list] | None:
    """The chunk decoded by msgspec as :func:`_checker` structs, the groups of rare arguments it has and whether
    it has labels for pids (as given: Arrow finds them); None when it does not decode (the careful path will say
    why)."""
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
            else:
                return None
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return None
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
        columns.append(_valid(child))
        names.append("_args")
        for arg, value in zip(child.type, child.flatten()):
            if pa.types.is_list(arg.type) and value.values.null_count:  # (every value, a conservative test)
                return None
            columns.append(value)
            names.append(_NAME_OF_KEY[arg.name])
    frame = pl.from_arrow(pa.Table.from_arrays(columns, names=names))
    missing = {name: pl.lit(None, dtype=dtype) for name, dtype in _DTYPES.items() if name not in frame.columns}
    return frame.with_columns(**missing) if missing else frame


def _with_dims(frame: pl.DataFrame, args: list) -> pl.DataFrame | None:
    """``frame`` with ``grid`` and ``block`` from msgspec's structs (``args``: :func:`_args_of`; a text: empty)
    and ``_text_dims``: whether the event's were text; None where a number is past Int64 (the careful path will
    say)."""
    columns, text = [], [False] * len(args)
    for name in _DIMS:
        values = list(map(attrgetter(name), args))
        for i, v in enumerate(values):
            if type(v) is str:
                values[i], text[i] = None, True
        try:
            columns.append(pl.Series(name, values, dtype=pl.List(pl.Int64)))
        except (OverflowError, TypeError, pl.exceptions.PolarsError):
            return None
    return frame.with_columns(*columns, pl.Series("_text_dims", text, dtype=pl.Boolean))


def _valid(array):
    """Whether each value of ``array`` is not null, as a boolean array over its validity bitmap (no copy).

    ``Array.is_valid()`` would do, but it (like ``ListArray.flatten()``) imports ``pyarrow.compute``, 0.1 s of
    start-up for this one call."""
    import pyarrow as pa

    bitmap = array.buffers()[0]
    if bitmap is None:
        bitmap = pa.py_buffer(b"\xff" * ((len(array) + array.offset + 7) // 8))
    return pa.BooleanArray.from_buffers(pa.bool_(), len(array), [None, bitmap], 0, array.offset)


def _rows(df: pl.DataFrame, checked: list, args: list, labels: bool,
          document: bytes) -> tuple[pl.DataFrame, Coercions, dict] | None:
    """The rows of the decoded columns, or None where they differ from the careful path's. ``args``: the events'
    argument structs (:func:`_args_of`); ``labels``: whether the pids and tids are msgspec's (else Arrow's);
    ``document``: the chunk (its thread names are decoded from it again, :func:`_thread_names`).

    One query per part (the checks, the event rows, the ``[memory]`` counters, the thread names) on the kinds and
    raw texts added once, with expressions built once (:func:`_queries`): a chunk costs a few queries, not one per
    step. (``collect_all`` of the four, lazily, was no faster: without the optimizer each query redid the head,
    with it the planning cost as much.)
    """
    texts = {name: _raw_text(list(map(attrgetter(name), args))) for name in _RAW}
    q = _queries()
    made = []
    for name, make in _RAW.items():  # once per distinct text: a few hundred a chunk
        distinct = texts[name].unique()
        made.append(pl.col(f"_text_{name}").replace_strict(distinct, make(distinct), return_dtype=pl.String)
                    .alias(name))
    frame = df.with_columns(*q["head"], *(text.alias(f"_text_{name}") for name, text in texts.items()))
    kept = frame.filter(q["keep"])
    if kept.select(q["checks"]).item():
        return None
    if "_text_dims" in kept.columns and (kept["gpu"] & kept["_text_dims"]).any():  # the careful path counts it
        return None
    rows = kept.select(*q["columns"], *made)
    counters = frame.filter(q["memory"]).select(q["counters"])
    named = frame.filter(q["named"]).select("_row", "pid", "tid")
    rows = _with_collectives(rows)
    coerced = Coercions()
    loose = frame.filter(q["loose"])  # complete events of a category no row is made of (a few: Trace, overhead)
    for cat, n in loose.group_by("cat").len().iter_rows() if loose.height else ():
        coerced.skipped(cat, n)
    if counters.height:
        if counters["_bad"].any():
            return None
        counters = counter_rows(counters["_row"], counters["_ts"].alias("ts"), counters["_device"],
                                counters["_device_type"], counters["pid"], counters["tid"],
                                {field: counters[field] for field in KEYS})
    else:
        counters = None
    names = _thread_names(named, document, checked if labels else None) if named.height else {}
    if names is None:
        return None
    return with_counters(rows, counters), coerced, names


@functools.cache
def _queries() -> dict:
    """The expressions of :func:`_rows`, built once (building them per chunk cost more than running them)."""
    category = pl.col("cat").str.to_lowercase()
    return {
        "head": [pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"),
                 category.replace_strict(CATEGORY_KIND, default=None, return_dtype=pl.String).alias("kind"),
                 category.is_in(list(GPU_CATEGORIES)).alias("gpu")],
        "keep": (pl.col("ph") == "X").fill_null(False) & pl.col("kind").is_not_null(),
        "loose": (pl.col("ph") == "X").fill_null(False) & pl.col("kind").is_null(),
        "memory": (pl.col("name") == MEMORY_EVENT) & pl.col("ph").is_in(["i", "I"]) & pl.col("_args"),
        "named": (pl.col("ph") == "M") & (pl.col("name") == "thread_name") & pl.col("_args"),
        "checks": pl.any_horizontal(_event_checks()).alias("_bad"),
        "columns": _event_columns(),
        "counters": _counter_columns(),
    }


def _out_of(column: pl.Expr | str, lo: int, hi: int) -> pl.Expr:
    column = pl.col(column) if isinstance(column, str) else column
    return (column.is_not_null() & ~column.is_between(lo, hi)).any()


def _dim3() -> dict[str, pl.Expr]:
    """``grid_x`` ... ``block_z``: the three numbers of a ``grid``/``block`` list of three (else null)."""
    dim3 = {}
    for label in ("grid", "block"):
        whole = pl.col(label).list.len() == 3
        for i, axis in enumerate("xyz"):
            dim3[f"{label}_{axis}"] = pl.when(whole).then(pl.col(label).list.get(i, null_on_oob=True))
    return dim3


_PICKED = pl.col("name").str.contains(_COMM_NAME).fill_null(False) & pl.col("_args")  # a communication event's
_ELEMS = pl.max_horizontal("in_nelems", "out_nelems", "in_nelems_legacy", "out_nelems_legacy")
_DTYPE_SIZE = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)


def _event_checks() -> list[pl.Expr]:
    """What makes the careful path coerce, warn or refuse where the kept rows are concerned: an Int32 argument out
    of range, a time past Int64 nanoseconds, a message size past Int64 (the careful path keeps it as text)."""
    elems = pl.when(_PICKED & (_DTYPE_SIZE > 0)).then(_ELEMS)
    # a dim3 (a list of three) with a number out of Int32: its numbers exploded (half the time of the six
    # ``list.get`` of :func:`_dim3`; a list of ints holding a null never gets here, :func:`_frame`)
    dim3 = [pl.col(label).filter(pl.col(label).list.len() == 3).explode() for label in ("grid", "block")]
    return ([_out_of(c, *_INT32) for c in _INT32_ARGS] + [_out_of(e, *_INT32) for e in dim3]
            + [_out_of(pl.col(c).to_physical(), *_TIME_RANGE) for c in ("ts", "dur")]
            + [(elems.cast(pl.Int128) * _DTYPE_SIZE > INT64_MAX).any()])


def _event_columns() -> list[pl.Expr]:
    """:func:`.events.rows_of`'s columns of the kept rows, but for the raw argument texts (made per chunk) and the
    collective (worked out after: :func:`_with_collectives`). No cast fails: a value out of its column is a
    ``_bad`` row (:func:`_event_checks`, collected at once), and the chunk goes to the careful path."""
    gpu = pl.col("gpu")
    kind = pl.col("kind")
    copy = pl.when(kind == "memcpy").then(pl.col("name").str.extract_groups(_COPY_NAME))
    return [
        kind, pl.col("name"),
        pl.col("ts").to_physical().cast(pl.Int64, strict=False).alias("start_ns"),
        pl.col("dur").to_physical().cast(pl.Int64, strict=False).alias("duration_ns"),
        pl.when(~gpu).then(pl.col("pid")).alias("pid"),
        pl.when(~gpu).then(pl.col("tid")).alias("tid"),
        pl.coalesce(pl.col("device").cast(pl.Int32, strict=False), pl.col("in_device").cast(pl.Int32, strict=False),
                    pl.when(gpu).then(pl.col("pid")).cast(pl.Int32, strict=False)).alias("device_id"),
        pl.col("from_device").cast(pl.Int32, strict=False).alias("src_device"),
        pl.col("to_device").cast(pl.Int32, strict=False).alias("dst_device"),
        pl.col("context").cast(pl.Int32, strict=False).alias("context_id"),
        pl.coalesce(pl.col("stream"), pl.when(gpu).then(pl.col("tid"))).alias("stream_id"),
        pl.col("correlation").alias("correlation_id"),
        pl.col("external_id").fill_null(pl.col("external_id_legacy")).alias("external_id"),
        pl.col("registers").cast(pl.Int32, strict=False).alias("registers_per_thread"),
        pl.coalesce(pl.col("bytes"), pl.when(_PICKED & (_DTYPE_SIZE > 0)).then(_ELEMS) * _DTYPE_SIZE).alias("bytes"),
        pl.col("flops"),
        *(e.cast(pl.Int32, strict=False).alias(c) for c, e in _dim3().items()),
        _known(copy.struct.field("1"), COPY_KINDS).alias("copy_kind"),
        _known(copy.struct.field("2").str.to_lowercase(), MEMORY_KINDS).alias("src_memory"),
        _known(copy.struct.field("3").str.to_lowercase(), MEMORY_KINDS).alias("dst_memory"),
        pl.when(kind == "kernel").then(pl.col("shared_memory")).alias("dynamic_smem_bytes"),
        pl.col("_row").alias("_event"),
        pl.when(_PICKED).then(pl.col("collective_name")).alias("_given"),
        pl.when(_PICKED).then(pl.col("seq")).alias("seq"),
        pl.when(_PICKED).then(pl.col("pg_name")).alias("process_group"),
        *(pl.when(_PICKED).then(pl.col(field)).alias(f"_{field}") for field in PEER_FIELDS),
    ]


def _with_collectives(rows: pl.DataFrame) -> pl.DataFrame:
    """The rows with their ``collective`` (:func:`.events.collective_of`), in place of Kineto's ``_given`` name."""
    if rows.height == 0:
        return _EMPTY
    return (rows.with_columns(collective=collective_of(rows["name"], rows["_given"]), peer_rank=peer_expr())
            .drop("_given", *(f"_{field}" for field in PEER_FIELDS)))


def _counter_columns() -> list[pl.Expr]:
    """The ``[memory]`` events' columns for :func:`.memory.counter_rows`, and ``_bad``: whether the careful path
    would coerce or refuse one of them."""
    ts = pl.col("ts").to_physical()
    return [
        "_row", "pid", "tid", *KEYS,
        ts.cast(pl.Int64, strict=False).alias("_ts"),
        pl.col("mem_device_id").cast(pl.Int32, strict=False).alias("_device"),
        pl.col("mem_device_type").cast(pl.Int32, strict=False).alias("_device_type"),
        pl.any_horizontal([_out_of(c, *_INT32) for c in _MEMORY_INT32] + [_out_of(ts, *_TIME_RANGE)]).alias("_bad"),
    ]


def _thread_names(named: pl.DataFrame, document: bytes, checked: list | None) -> dict[str, str] | None:
    """The chunk's ``thread_name`` events (a few; ``named``: their indices, pids and tids as Arrow read them): as
    :func:`.threads.collect_thread_names` reads them; with ``checked`` (labels) the pids and tids are msgspec's.
    Their raw names come from a second decoding of ``document`` (:data:`_NAMES`), which cannot fail where the
    check passed (every event an object, every ``args`` an object or absent; else None, to be safe)."""
    names: dict[str, str] = {}
    try:
        with gc_paused():
            args = list(map(_ARGS, _NAMES.decode(chunk_list(document))))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    if len(args) != len(checked if checked is not None else args):
        return None
    for row, pid, tid in named.iter_rows():
        if checked is not None:
            pid, tid = checked[row].pid, checked[row].tid
        key = thread_key(pid, tid)
        if key is not None:
            name = thread_name(args[row].meta_name)
            if name:
                names[key] = name
    return names
