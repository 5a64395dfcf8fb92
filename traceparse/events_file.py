"""A store's events file (``events.parquet``): which of its columns are null in every row, and reading it.

The store's writer lists those columns in the file's own metadata (:data:`NULL_COLUMNS_KEY`); a reader of the
store (:meth:`traceparse.store.Store.load`, a run's ranks read one at a time) reads the others and adds those as
polars scalar columns, which take no memory per row. Below the store and the measures, which both read the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import polars as pl

#: The key of a store's events file's own metadata that lists its columns null in every row (a JSON list).
NULL_COLUMNS_KEY = "traceparse.null_columns"


def read_events(path: Path | str | Sequence[Path | str]) -> pl.DataFrame:
    """The events of one of the store's Parquet files, as ``read_parquet`` gives them, but a column null in every
    row (a torch trace has no TAU, ncu or collective columns: 23 of 52) is a polars scalar column, which takes no
    memory per row, nor do the copies the rules filter from the table: the 1 GB benchmark trace loads in 0.93 GB
    instead of 1.65 (docs/scale.md). Several files (a group of a run's small ranks) are read as one frame, in
    their order, a column a scalar where it is null in every one of them: 23 ranks of 10,000 rows in 56 MB
    instead of 81, and 54 ms instead of 124.

    Which columns are null is written in the file itself, by the store's writer (:data:`NULL_COLUMNS_KEY`): a file
    rewritten without it, or written before it, is read whole. Reading that costs about 3 ms a file."""
    import polars as pl

    paths = [path] if isinstance(path, (str, Path)) else list(path)
    nulls: set[str] | None = None
    for one in paths:
        try:
            listed = pl.read_parquet_metadata(one).get(NULL_COLUMNS_KEY)
            mine = set(json.loads(listed)) if listed else set()
        except (OSError, ValueError, TypeError, pl.exceptions.PolarsError):
            mine = set()  # read_parquet says what is wrong with the file, if anything
        nulls = mine if nulls is None else nulls & mine
        if not nulls:
            break
    source = paths[0] if len(paths) == 1 else paths
    if not nulls:
        return with_new_columns(pl.read_parquet(source))
    schema = pl.read_parquet_schema(paths[0])
    kept = [c for c in schema if c not in nulls]
    if not kept or not nulls <= set(schema):
        return with_new_columns(pl.read_parquet(source))
    frame = pl.read_parquet(source, columns=kept)
    return with_new_columns(frame.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in schema
                                               if c in nulls).select(list(schema)))


def with_new_columns(frame):
    """``frame`` with the schema's columns a store written by an older traceparse lacks (``peer_rank``), null: a
    store stays readable when the schema grows."""
    import polars as pl

    from traceparse.schema import DTYPES

    missing = [c for c in DTYPES if c not in frame.columns]
    if not missing or "event_id" not in frame.columns:  # not an event table: as it is
        return frame
    extra = [c for c in frame.columns if c not in DTYPES]
    return frame.with_columns(pl.lit(None, dtype=DTYPES[c]).alias(c) for c in missing).select(*DTYPES, *extra)
