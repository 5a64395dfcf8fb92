"""The normalized event table: the single source of truth for its columns.

Every reader produces a polars DataFrame with (a subset of) these columns;
:func:`conform` adds the missing ones as nulls, casts every column to its
declared type and puts them in this order. docs/schema.md explains each
column and how each reader fills it.
"""

from __future__ import annotations

from functools import lru_cache

import polars as pl

from traceparse.meta import SCHEMA_VERSION  # noqa: F401 - bumped whenever a column is added, removed or changes meaning

#: What an event is.
KINDS = ("kernel", "memcpy", "memset", "api", "op", "marker", "counter", "region", "sync")
#: Direction of a copy.
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")
#: Where the source or destination of a copy lives.
MEMORY_KINDS = ("pageable", "pinned", "device", "managed", "array")

Kind = pl.Enum(KINDS)
CopyKind = pl.Enum(COPY_KINDS)
MemoryKind = pl.Enum(MEMORY_KINDS)

#: Column name -> (polars type, one-line meaning). Order is the table's order.
COLUMNS: dict[str, tuple[pl.DataType, str]] = {
    "trace_id": (pl.String, "store id of the trace the row belongs to"),
    "event_id": (pl.Int64, "row number within the trace, from 0"),
    "kind": (Kind, "kernel, memcpy, memset, api, op, marker, counter, region or sync"),
    "name": (pl.String, "kernel / API / operator / routine / metric name, as the tool wrote it"),
    "start_ns": (pl.Int64, "start time in ns on the source's clock; null for aggregated rows"),
    "duration_ns": (pl.Int64, "duration in ns; for aggregated rows the total (inclusive) time"),
    "calls": (pl.Int64, "1 for a trace event; the number of calls for an aggregated row"),
    "min_ns": (pl.Int64, "shortest call, for aggregated rows that say"),
    "max_ns": (pl.Int64, "longest call, for aggregated rows that say"),
    "exclusive_ns": (pl.Int64, "time not spent in children (profiles with call trees)"),
    "subcalls": (pl.Int64, "calls made to children (TAU's Subrs)"),
    "device_id": (pl.Int32, "GPU index"),
    "context_id": (pl.Int32, "CUDA context"),
    "stream_id": (pl.Int64, "CUDA stream"),
    "pid": (pl.Int64, "host process (or TAU node)"),
    "tid": (pl.Int64, "host thread"),
    "correlation_id": (pl.Int64, "links an API call to the GPU work it launched"),
    "external_id": (pl.Int64, "links a framework operator to the API calls and kernels it caused"),
    "grid_x": (pl.Int32, "grid size, x"),
    "grid_y": (pl.Int32, "grid size, y"),
    "grid_z": (pl.Int32, "grid size, z"),
    "block_x": (pl.Int32, "block size, x"),
    "block_y": (pl.Int32, "block size, y"),
    "block_z": (pl.Int32, "block size, z"),
    "registers_per_thread": (pl.Int32, "registers per thread"),
    "static_smem_bytes": (pl.Int64, "static shared memory per block, bytes"),
    "dynamic_smem_bytes": (pl.Int64, "dynamic shared memory per block, bytes"),
    "bytes": (pl.Int64, "bytes copied or set (memcpy, memset); total bytes for aggregated rows"),
    "copy_kind": (CopyKind, "HtoD, DtoH, DtoD, HtoH or PtoP"),
    "src_memory": (MemoryKind, "pageable, pinned, device, managed or array"),
    "dst_memory": (MemoryKind, "pageable, pinned, device, managed or array"),
    "value": (pl.Float64, "a counter's value (the mean, for aggregated counters), in `unit`"),
    "value_min": (pl.Float64, "smallest value of an aggregated counter"),
    "value_max": (pl.Float64, "largest value of an aggregated counter"),
    "value_sumsq": (pl.Float64, "sum of squares of an aggregated counter's values"),
    "unit": (pl.String, "unit of `value`, in base units (byte, ns, ...)"),
    "flops": (pl.Float64, "floating-point operations the source attributes to the event"),
    "input_dims": (pl.String, "operator input shapes, as JSON text"),
    "input_types": (pl.String, "operator input dtypes, as JSON text (one per input, as input_dims)"),
    "concrete_inputs": (pl.String, "operator non-tensor input values (stride, flags ...), as JSON text"),
    "group": (pl.String, "source grouping: TAU group, NVTX domain, ncu section, ...; 'async' (ASYNC_GROUP): "
                         "spans of asynchronous operations, which may overlap on their lane"),
    "parent_id": (pl.Int64, "event_id of the parent: a counter's kernel, a region's caller"),
    "data_from": (pl.String, "event_ids of the operators that produced the tensors this operator consumes, "
                             "as a JSON list (a PyTorch execution trace read with its Kineto trace)"),
    "call_path": (pl.String, "a profile routine's call path, callers first, joined by ' => ' (TAU); name is its last part"),
    "src_device": (pl.Int32, "source GPU of a copy between GPUs (peer-to-peer); device_id is the GPU that runs it"),
    "dst_device": (pl.Int32, "destination GPU of a copy between GPUs (peer-to-peer)"),
    "rank": (pl.Int32, "rank of the process in a distributed run (null outside one)"),
    "collective": (pl.String, "collective of a communication event (all_reduce, broadcast, all_gather, ...), lower-case"),
    "seq": (pl.Int64, "collective sequence number within its process group, where the trace has it"),
    "process_group": (pl.String, "process-group name (Kineto 'Process Group Name'; nsys/NVTX domain)"),
    "peer_rank": (pl.Int32, "the other rank of a point-to-point transfer: a send's destination, a receive's source"),
    "peer_rank_choices": (pl.String, "the ranks the other rank of a point-to-point transfer may be, as a JSON "
                                     "list, where the trace does not say which (peer_rank null): settled across a "
                                     "run's ranks"),
    "process_group_choices": (pl.String, "the process groups a collective that names none may be of (its rank's "
                                         "groups, a JSON list of names): settled across a run's ranks"),
    "hlo_module": (pl.String, "compiled XLA program the event belongs to (XLA's hlo_module: jit_train_step)"),
    "hlo_op": (pl.String, "XLA instruction the GPU work computes (XLA's hlo_op: gemm_fusion_dot.17, copy.1)"),
}

DTYPES: dict[str, pl.DataType] = {name: dtype for name, (dtype, _) in COLUMNS.items()}


def empty_frame() -> pl.DataFrame:
    """An empty event table with every column, for traces with no events."""
    return pl.DataFrame(schema=DTYPES)


def conform(df: pl.DataFrame, *, trace_id: str | None = None, first_event_id: int = 0) -> pl.DataFrame:
    """Return ``df`` as a table of the normalized schema.

    Readers may leave out columns they have no data for; they become nulls.
    Columns not in the schema are refused, so a typo cannot silently drop
    data. ``event_id`` is numbered from ``first_event_id`` when the reader
    did not number rows itself, and ``calls`` defaults to 1.

    The expressions are built once per input schema (:func:`_conform_query`): a run of a thousand small
    ranks conforms a thousand batches of a few rows. A value that does not convert (a ``kind`` that is no
    kind) takes the checked path, which names it.
    """
    unknown = [c for c in df.columns if c not in DTYPES]
    if unknown:
        raise ValueError(f"columns not in the traceparse schema: {', '.join(unknown)}")
    n = df.height
    query = list(_conform_query(tuple(df.schema.items())))
    if "event_id" not in df.columns:
        at = list(DTYPES).index("event_id")
        query[at] = pl.int_range(first_event_id, first_event_id + n, dtype=pl.Int64).alias("event_id")
    if trace_id is not None:
        query[list(DTYPES).index("trace_id")] = pl.lit(trace_id, dtype=pl.String).alias("trace_id")
    try:
        out = df.select(query)
    except pl.exceptions.PolarsError:
        return _conform_checked(df, trace_id=trace_id, first_event_id=first_event_id)
    if out["kind"].null_count():
        raise ValueError("every event needs a kind")
    return out


@lru_cache(maxsize=64)
def _conform_query(schema: tuple[tuple[str, pl.DataType], ...]) -> tuple[pl.Expr, ...]:
    """:func:`conform`'s expressions for an input of this schema (``event_id`` and ``trace_id`` are set per call
    where the input lacks them); an enum column is cast strictly, so a value that is not one of its
    categories fails the query."""
    given = dict(schema)
    exprs = []
    for name, dtype in DTYPES.items():
        if name in given:
            if given[name] == dtype:
                exprs.append(pl.col(name))
            elif isinstance(dtype, pl.Enum):
                exprs.append(pl.col(name).cast(pl.String).cast(dtype, strict=True))
            else:
                exprs.append(pl.col(name).cast(dtype, strict=True))
        elif name == "calls":
            exprs.append(pl.lit(1, dtype=pl.Int64).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return tuple(exprs)


def _conform_checked(df: pl.DataFrame, *, trace_id: str | None = None, first_event_id: int = 0) -> pl.DataFrame:
    """:func:`conform` column by column, checking each enum column's values first (its error names the value)."""
    n = df.height
    exprs = []
    for name, dtype in DTYPES.items():
        if name in df.columns:
            exprs.append(_cast(df, name, dtype))
        elif name == "event_id":
            exprs.append(pl.int_range(first_event_id, first_event_id + n, dtype=pl.Int64).alias(name))
        elif name == "calls":
            exprs.append(pl.lit(1, dtype=pl.Int64).alias(name))
        elif name == "trace_id" and trace_id is not None:
            exprs.append(pl.lit(trace_id, dtype=pl.String).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    out = df.select(exprs)
    if trace_id is not None and "trace_id" in df.columns:
        out = out.with_columns(pl.lit(trace_id, dtype=pl.String).alias("trace_id"))
    if out["kind"].null_count():
        raise ValueError("every event needs a kind")
    return out


def _cast(df: pl.DataFrame, name: str, dtype: pl.DataType) -> pl.Expr:
    column = df[name]
    if column.dtype == dtype:
        return pl.col(name)
    if isinstance(dtype, pl.Enum):
        bad = column.cast(pl.String).drop_nulls().unique()
        bad = [v for v in bad.to_list() if v not in dtype.categories.to_list()]
        if bad:
            raise ValueError(f"column {name}: {bad[0]!r} is not one of {', '.join(dtype.categories.to_list())}")
        return pl.col(name).cast(pl.String).cast(dtype)
    return pl.col(name).cast(dtype, strict=True)


# -- validation (traceparse.validate): the ranges beside the columns ---------------------------------------
#: Column -> (lowest, highest) allowed value (None: no bound beyond the column's type). Every numeric column
#: must also fit its type, and a float column must be finite. A new column needs a line only for a range.
RANGES: dict[str, tuple[int | float | None, int | float | None]] = {
    "start_ns": (0, None),
    "duration_ns": (0, None),
    "calls": (0, None),
    "min_ns": (0, None),
    "max_ns": (0, None),
    "exclusive_ns": (0, None),
    "subcalls": (0, None),
    "grid_x": (0, None), "grid_y": (0, None), "grid_z": (0, None),
    "block_x": (0, None), "block_y": (0, None), "block_z": (0, None),
    "registers_per_thread": (0, None),
    "static_smem_bytes": (0, None),
    "dynamic_smem_bytes": (0, None),
    "bytes": (0, None),
    "value_sumsq": (0, None),
    "flops": (0, None),
}
#: Columns rules and measures add up: their total over a trace must fit Int64, so no sum can wrap.
ADDITIVE: tuple[str, ...] = ("duration_ns", "exclusive_ns", "calls", "subcalls", "bytes")
#: The name of a step annotation (torch.profiler's ``ProfilerStep#N``); the group is the step number.
STEP_NAME = r"^ProfilerStep#([0-9]+)$"
#: Names whose number a measure reads (pattern with one group, what the number is): the number must fit Int64,
#: like a column's value (``ProfilerStep#`` with 20 digits is dropped with a warning, not a polars error).
NAME_NUMBERS: tuple[tuple[str, str], ...] = ((STEP_NAME, "step number"),)


#: The ``group`` of rows that are spans of asynchronous operations (XLA's ``Async XLA Ops`` line: a copy from its
#: start to its done): they overlap one another on their lane, so no exclusive time is made of them (hotspots
#: leaves them out) and their sum is no part of any whole.
ASYNC_GROUP = "async"
