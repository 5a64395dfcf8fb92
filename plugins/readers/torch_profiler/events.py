"""From decoded Kineto events to rows of the normalized event table.

The structs are transposed into columns in C (``astuple`` + ``zip``);
filtering and mapping are polars expressions. Times go through
:func:`traceparse_plugins.readers.chrome_json.times_ns` (exact, half to even).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import polars as pl
from msgspec.structs import astuple

from traceparse import expr
from traceparse.schema import COPY_KINDS, MEMORY_KINDS
from traceparse.units import NumberError
from traceparse.validate import fits_int64, wide_ints

from traceparse_plugins.readers.chrome_json.decoder import EventError, raw_times_ns
from traceparse_plugins.readers.torch_profiler.coerce import NOT_DIM3, Coercions, int_column
from traceparse_plugins.readers.torch_profiler.kineto import Args, KinetoEvent

#: Chrome-trace category (lower-cased) -> traceparse kind. Categories not here are skipped.
CATEGORY_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "api",
    "runtime": "api",
    "cuda_driver": "api",
    "driver": "api",
    "cuda_sync": "sync",
    "cpu_op": "op",
    "operator": "op",
    "user_annotation": "marker",
    "gpu_user_annotation": "marker",
    "python_function": "region",
}
#: Categories whose events run on the GPU (pid is the device, tid the stream).
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"}
_COPY_NAME = r"(?i)^memcpy\s+(\w+)\s*\((\w+)\s*->\s*(\w+)\)"


def to_frame(path: Path, events: list[KinetoEvent], offset: int = 0,
             coerced: Coercions | None = None) -> pl.DataFrame:
    """Turn decoded events (``offset``: the index of the first in ``traceEvents``) into a batch of rows.

    Integer arguments written as text or floats are coerced and counted in
    ``coerced`` (:mod:`.coerce`), for the one warning the reader gives per trace.
    """
    try:
        return rows_of(events, coerced)
    except EventError as exc:
        raise exc.at(path, offset) from None


def rows_of(events: list[KinetoEvent], coerced: Coercions | None = None) -> pl.DataFrame:
    """:func:`to_frame` where the caller names the record: a bad event raises :class:`EventError`.

    The structs are transposed into columns in C (``astuple`` + ``zip``), the
    rows kept are chosen by their category (:func:`_category`), and only the kept rows' arguments
    are transposed; Python touches each event a constant, small number of times.
    A batch costs three queries (the times, the collectives, the rows; the communication names of
    :data:`_COMM_NAME` are remembered, :class:`_Matches`), their expressions built once
    (:func:`_row_query`): a small file's few events cost what its queries cost.
    """
    coerced = Coercions() if coerced is None else coerced
    if not events:
        return _EMPTY
    ph, cat, name, pid, tid, ts, dur, args = zip(*map(astuple, events))
    keep, kinds, gpus = [], [], []
    for i, (phase, category) in enumerate(zip(ph, cat)):
        kind, gpu = _category(category)
        if phase == "X" and kind is not None:  # flows, instants and metadata are not kept
            keep.append(i)
            kinds.append(kind)
            gpus.append(gpu)
        elif phase == "X":  # a category no row is made of
            coerced.skipped(category)
    if not keep:
        return _EMPTY
    if len(keep) == len(events):
        pick = lambda values: values  # noqa: E731 - every event is kept
    else:
        pick = lambda values: [values[i] for i in keep]  # noqa: E731
    names = pick(name)
    a = pick(args)
    a_rows = [astuple(x) if x is not None else _NO_ARGS_ROW for x in a]
    columns = tuple(zip(*a_rows))
    (external, external_legacy, correlation, device, context, stream, nbytes, grid, block,
     registers, shared_memory, input_dims, flops, in_device, from_device, to_device) = columns[:16]

    def ints(values, key: str, dtype: pl.DataType = pl.Int64) -> pl.Series:
        return int_column(values, f"args.{key}", dtype, coerced)
    dims = {}
    for label, values in (("grid", grid), ("block", block)):
        if any(v is not None and type(v) is not list for v in values):  # a text or a number: no shape, left empty
            bad = sum(1 for v, gpu in zip(values, gpus) if gpu and v is not None and type(v) is not list)
            if bad:  # on a GPU activity, counted (a host op's text, Inductor's "grid(100,)", is no kernel's shape)
                coerced.add(f"args.{label}", NOT_DIM3, bad)
            values = [v if type(v) is list else None for v in values]
        xyz = zip(*(v if v and len(v) == 3 else _NO_DIM3 for v in values))  # one pass, transposed in C
        for axis, column in zip("xyz", xyz):
            dims[f"{label}_{axis}"] = int_column(column, f"args.{label}", pl.Int32, coerced)
    n = len(keep)
    try:  # both times in one query: the start times first, so the first bad one is named as before
        times = raw_times_ns([*pick(ts), *pick(dur)])
    except NumberError as exc:
        raise EventError(keep[exc.index % n], ".ts" if exc.index < n else ".dur",
                         f"a time in microseconds, got {exc.text!r} ({exc.reason})") from None
    name_column = pl.Series("name", names, dtype=pl.String)
    comm = comm_columns(name_column, a, [i for i, c in enumerate(_COMM_NAMES.matches(names)) if c], given=True)
    raw = pl.DataFrame([
        pl.Series("kind", kinds, dtype=pl.String), name_column, pl.Series("gpu", gpus, dtype=pl.Boolean),
        pl.Series("_event", keep, dtype=pl.UInt32),
        times.slice(0, n).alias("start_ns"), times.slice(n).alias("duration_ns"),
        pl.Series("pid", pick(pid), dtype=pl.Int64, strict=False),  # "Spans" and other labels are not ids
        pl.Series("tid", pick(tid), dtype=pl.Int64, strict=False),
        ints(device, "device", pl.Int32).alias("_device"), ints(in_device, "inDevice", pl.Int32).alias("_in_device"),
        ints(from_device, "fromDevice", pl.Int32).alias("src_device"),
        ints(to_device, "toDevice", pl.Int32).alias("dst_device"),
        ints(context, "context", pl.Int32).alias("context_id"),
        ints(stream, "stream").alias("_stream"),
        ints(correlation, "correlation").alias("correlation_id"),
        ints(external, "External id").alias("_external"), ints(external_legacy, "external id").alias("_legacy"),
        ints(registers, "registers per thread", pl.Int32).alias("registers_per_thread"),
        ints(nbytes, "bytes").alias("_bytes"),
        pl.Series("flops", flops, dtype=pl.Float64),
        _raw_text(input_dims).alias("_input_dims"),
        # dtypes and non-tensor arguments as compact JSON (their strings keep their spaces: "long int", "[4, 4]")
        _compact_json(columns[_FIELD["input_types"]]).alias("input_types"),
        _compact_json(columns[_FIELD["concrete_inputs"]]).alias("concrete_inputs"),
        ints(shared_memory, "shared memory").alias("_smem"),
        *(column.alias(label) for label, column in dims.items()),
        *comm,
    ])
    query = _row_query(raw.schema["_comm_bytes"] == pl.String, "memcpy" in kinds,
                       any(raw for raw in input_dims))
    return raw.lazy().select(query).collect()


_CATEGORIES: dict[str | None, tuple[str | None, bool]] = {}


def _category(category: str | None) -> tuple[str | None, bool]:
    """(kind, whether it runs on a GPU) of a Chrome-trace category, lower-cased (remembered: a trace has a few)."""
    found = _CATEGORIES.get(category)
    if found is None:
        lowered = None if category is None else category.lower()  # the same as polars' for every category kept
        found = (CATEGORY_KIND.get(lowered), lowered in GPU_CATEGORIES)
        if len(_CATEGORIES) < 10_000:
            _CATEGORIES[category] = found
    return found


class _Matches:
    """Whether each name matches a regular expression (polars' engine, as the fast path's), each distinct name
    asked once per process (at most :data:`MEMO_NAMES` remembered): a small file's names cost no query once
    seen."""

    MEMO_NAMES = 50_000

    def __init__(self, pattern: str):
        self.pattern, self.memo = pattern, {}

    def matches(self, names: list) -> list[bool]:
        """For each of ``names`` (a null name: False), whether it matches."""
        memo = self.memo
        new = list(dict.fromkeys(n for n in names if n is not None and n not in memo))
        if new:
            if len(memo) + len(new) > self.MEMO_NAMES:
                memo.clear()
            memo.update(zip(new, pl.Series(new, dtype=pl.String).str.contains(self.pattern).to_list()))
        return [n is not None and memo[n] for n in names]


@lru_cache(maxsize=16)
def _row_query(wide_comm_bytes: bool, copies: bool, dims: bool) -> tuple[pl.Expr, ...]:
    """The expressions that make a batch's rows of its raw columns (built once): the device that runs each event,
    its stream, the copy's direction and memories, the message size; ``wide_comm_bytes`` when a message size
    passed Int64 (text, left to the validation step), ``copies`` when the batch has copies (their names are
    parsed), ``dims`` when it has input shapes."""
    is_gpu = pl.col("gpu")
    memcpy = pl.col("kind") == "memcpy"
    copy = pl.when(memcpy).then(pl.col("name").str.extract_groups(_COPY_NAME))
    nbytes = pl.col("_bytes").cast(pl.String) if wide_comm_bytes else pl.col("_bytes")
    none = pl.lit(None, dtype=pl.String)
    return (
        "kind", "name", "_event", "start_ns", "duration_ns",
        pl.when(~is_gpu).then(pl.col("pid")).alias("pid"),
        pl.when(~is_gpu).then(pl.col("tid")).alias("tid"),
        # the device that runs the event: args.device; a peer-to-peer copy's args.inDevice (it has no
        # args.device); else, for GPU rows, the pid, which Kineto sets to the device (gpu_user_annotation)
        pl.coalesce("_device", "_in_device", pl.when(is_gpu).then(pl.col("pid")).cast(pl.Int32, strict=False))
        .alias("device_id"),
        "src_device", "dst_device", "context_id",
        # a GPU row without args.stream (gpu_user_annotation): its tid, which Kineto sets to the stream
        pl.coalesce("_stream", pl.when(is_gpu).then(pl.col("tid"))).alias("stream_id"),
        "correlation_id",
        pl.col("_external").fill_null(pl.col("_legacy")).alias("external_id"),
        "registers_per_thread",
        "flops",
        # lists of lists of integers: dropping whitespace gives compact JSON however the file was laid out
        (pl.col("_input_dims").str.replace_all(r"\s+", "").replace("", None) if dims else none).alias("input_dims"),
        "input_types", "concrete_inputs",
        *(f"{label}_{axis}" for label in ("grid", "block") for axis in "xyz"),
        (_known(copy.struct.field("1"), COPY_KINDS) if copies else none).alias("copy_kind"),
        # ROCm names a copy "Memcpy HtoD (Host -> Device)": "host" does not say pageable or pinned, so null
        (_known(copy.struct.field("2").str.to_lowercase(), MEMORY_KINDS) if copies else none).alias("src_memory"),
        (_known(copy.struct.field("3").str.to_lowercase(), MEMORY_KINDS) if copies else none).alias("dst_memory"),
        # Kineto reports one "shared memory" figure per kernel (static and dynamic together, not split);
        # it is kept as dynamic_smem_bytes and documented so in docs/schema.md.
        pl.when(pl.col("kind") == "kernel").then(pl.col("_smem")).alias("dynamic_smem_bytes"),
        collective_expr(), "seq", "process_group", peer_expr(),
        pl.coalesce(nbytes, "_comm_bytes").alias("bytes"),
    )


def _raw_text(raws) -> pl.Series:
    """``msgspec.Raw`` values as a String column (an absent value: the empty string), joined in one buffer."""
    if len(raws) <= 256:  # a few values: one Series, no query (a small file's batch)
        try:
            return pl.Series([bytes(raw).decode("utf-8") for raw in raws], dtype=pl.String)
        except UnicodeDecodeError:
            return pl.Series(list(map(bytes, raws)), dtype=pl.Binary).cast(pl.String)
    joined = b"\x00".join(raws)  # NUL cannot appear in JSON text: it separates the values
    if raws and joined.count(b"\x00") == len(raws) - 1:
        try:
            return pl.Series([joined.decode("utf-8")], dtype=pl.String).str.split("\x00").explode()
        except UnicodeDecodeError:
            pass
    return pl.Series(list(map(bytes, raws)), dtype=pl.Binary).cast(pl.String)


def _compact_json(raws) -> pl.Series:
    """``msgspec.Raw`` JSON values as compact JSON text (null when absent), whatever the file's layout.

    Each distinct text is re-encoded once (operators repeat a handful of argument lists), so the cost
    follows the distinct values, not the events.
    """
    return compact_json_text(_raw_text(raws))


def compact_json_text(text: pl.Series) -> pl.Series:
    """JSON texts as compact JSON (the empty text: null), each distinct text re-encoded once."""
    if text.len() <= 256:  # a few values: no query
        compact = {}
        for value in text.to_list():
            if value and value not in compact:
                try:
                    compact[value] = json.dumps(json.loads(value), separators=(",", ":"), ensure_ascii=False)
                except ValueError:
                    compact[value] = value
        return pl.Series(text.name, [compact[v] if v else None for v in text.to_list()], dtype=pl.String)
    text = text.replace("", None)
    compact = {}
    for value in text.drop_nulls().unique().to_list():
        try:
            compact[value] = json.dumps(json.loads(value), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            compact[value] = value
    return text.replace(compact) if compact else text


def _known(value: pl.Expr, allowed: tuple[str, ...]) -> pl.Expr:
    """``value`` where it is one of ``allowed`` (the schema's enum), else null."""
    return pl.when(value.is_in(list(allowed))).then(value)


_EMPTY = pl.DataFrame({"kind": pl.Series([], dtype=pl.String)})
_NO_ARGS_ROW = astuple(Args())
_FIELD = {name: i for i, name in enumerate(Args.__struct_fields__)}  # an argument's column in ``columns``
_NO_DIM3 = (None, None, None)


# -- communication (issue 10) ------------------------------------------------------------------------------
#: Bytes per element of the dtypes Kineto names in ``record_param_comms`` (c10 ScalarType names).
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1, "UInt8": 1, "Int8": 1, "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "UInt32": 4, "ComplexHalf": 4, "Long": 8, "Double": 8, "UInt64": 8,
    "ComplexFloat": 8, "ComplexDouble": 16,
}
_COMM_NAME = r"(?i)^(void\s+)?((nccl|rccl|msccl)\w*kernel|_?c10d(_functional)?::|record_param_comms$|(gloo|nccl|ucc|mpi):)"
_COMM_NAMES = _Matches(_COMM_NAME)


def comm_columns(names: pl.Series, args: list, picked: list[int] | None = None, *,
                 given: bool = False) -> list[pl.Series]:
    """``collective``, ``seq``, ``process_group`` and the message ``bytes`` of communication events.

    The collective comes from Kineto's ``"Collective name"`` argument (``record_param_comms``, and the NCCL
    kernels Kineto copies it onto) where there is one, else from the name
    (:func:`traceparse.expr.collective`); ``seq`` from ``"Seq"``; ``process_group`` from ``"Process Group
    Name"``; ``bytes`` = the larger of ``"In msg nelems"`` and ``"Out msg nelems"`` (``"In/Out msg size"``
    before PyTorch 2.3) × the size of ``dtype`` (nccl-tests' message size: the output of an all_gather, the
    input of a reduce_scatter). Only rows whose name is communication (``picked``, when the caller knows them:
    the names matching :data:`_COMM_NAME`) are looked at (fast on large traces). With ``given`` the first
    column is Kineto's ``"Collective name"`` as written (``_given``), for the caller's query to finish
    (:func:`collective_expr`).
    """
    n, given_column = len(names), given
    if picked is None:
        picked = names.str.contains(_COMM_NAME).fill_null(False).arg_true().to_list()
    given, seq, group, nbytes = [None] * n, [None] * n, [None] * n, [None] * n
    peer = {field: [None] * n for field in PEER_FIELDS}
    for i in picked:
        x = args[i]
        if x is None:
            continue
        given[i] = x.collective_name
        seq[i] = _int_or_none(x.seq)
        group[i] = None if x.pg_name is None else str(x.pg_name)
        peer["dst_rank"][i], peer["src_rank"][i] = _int_or_none(x.dst_rank), _int_or_none(x.src_rank)
        peer["pg_ranks"][i] = str(x.pg_ranks) if isinstance(x.pg_ranks, list) else x.pg_ranks  # as Kineto: "[0, 1]"
        elems = [v for v in (x.in_nelems, x.out_nelems, x.in_nelems_legacy, x.out_nelems_legacy)
                 if isinstance(v, int)]
        size = DTYPE_BYTES.get(x.dtype or "")
        if elems and size:
            nbytes[i] = max(elems) * size
    # a Seq of 2^64 or elements × dtype size past 2^63: text, which the validation step drops with a warning
    given = pl.Series("_given", given, dtype=pl.String) if given_column else collective_of(
        names, pl.Series(given, dtype=pl.String))
    return [given, wide_ints("seq", seq),
            pl.Series("process_group", group, dtype=pl.String), wide_ints("_comm_bytes", nbytes),
            *(_ranks(f"_{field}", peer[field]) for field in ("dst_rank", "src_rank")),
            pl.Series("_pg_ranks", peer["pg_ranks"], dtype=pl.String)]


#: Kineto's arguments that name a point-to-point transfer's other rank (:func:`peer_expr`).
PEER_FIELDS = ("dst_rank", "src_rank", "pg_ranks")
#: The operators whose third argument is the other rank of their transfer (in their group's numbering).
PEER_ARGUMENT_OPS = ("c10d::send", "c10d::recv_")


def _ranks(name: str, values: list) -> pl.Series:
    """Ranks as an Int64 column (one past Int64: null, as Arrow's fast path leaves it to this one)."""
    return pl.Series(name, [v if v is None or fits_int64(v) else None for v in values], dtype=pl.Int64)


def peer_expr() -> pl.Expr:
    """``peer_rank``: the other rank of a point-to-point transfer. ``record_param_comms``' ``Dst Rank`` (a send)
    or ``Src Rank`` (a receive), made a global rank through ``Process Group Ranks`` where that lists it; else a
    ``c10d::send``/``c10d::recv_`` operator's third argument (its group's numbering: the operator names no
    group). Null where neither is a rank from 0 to 2^31 - 1."""
    named = pl.coalesce("_dst_rank", "_src_rank")
    members = pl.col("_pg_ranks").str.extract_all(r"-?\d+").list.eval(pl.element().cast(pl.Int64, strict=False))
    in_group = pl.when(named.is_between(0, 2 ** 31 - 1)).then(members.list.get(named, null_on_oob=True))
    argument = pl.col("concrete_inputs").str.extract(r'^\["[^"]*","[^"]*","(-?\d{1,12})"', 1).cast(pl.Int64)
    peer = (pl.when(named.is_not_null()).then(pl.coalesce(in_group, named))
            .when(pl.col("name").is_in(PEER_ARGUMENT_OPS)).then(argument))
    return pl.when(peer.is_between(0, 2 ** 31 - 1)).then(peer).cast(pl.Int32).alias("peer_rank")


def collective_of(names: pl.Series, given: pl.Series) -> pl.Series:
    """The ``collective`` column: Kineto's ``"Collective name"`` (``given``) where there is one, else what the
    event's name says (:func:`traceparse.expr.collective`).

    Both are worked out once per distinct name (:func:`traceparse.expr.first_match`), in one query.
    """
    found = pl.DataFrame([names.cast(pl.String).alias("name"), given.cast(pl.String).alias("_given")])
    return found.select(collective_expr()).to_series()


def collective_expr() -> pl.Expr:
    """The ``collective`` column of the columns ``name`` and ``_given`` (Kineto's ``"Collective name"``)."""
    return pl.coalesce(expr.normalize_collective(pl.col("_given")),
                       expr.collective(pl.col("name").fill_null(""))).alias("collective")


def _int_or_none(value) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
