"""A store's events file (``events.parquet``): which of its columns are null in every row, and reading it.

The store's writer lists those columns in the file's own metadata (:data:`NULL_COLUMNS_KEY`); a reader of the
store (:meth:`traceparse.store.Store.load`, a run's ranks read one at a time) reads the others and adds those as
polars scalar columns, which take no memory per row. Below the store and the measures, which both read the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

#: The key of a store's events file's own metadata that lists its columns null in every row (a JSON list).
NULL_COLUMNS_KEY = "traceparse.null_columns"


def read_events(path: Path | str) -> pl.DataFrame:
    """The events of one of the store's Parquet files, as ``read_parquet`` gives them, but a column null in every
    row (a torch trace has no TAU, ncu or collective columns: 23 of 52) is a polars scalar column, which takes no
    memory per row, nor do the copies the rules filter from the table: the 1 GB benchmark trace loads in 0.93 GB
    instead of 1.65 (docs/scale.md).

    Which columns are null is written in the file itself, by the store's writer (:data:`NULL_COLUMNS_KEY`): a file
    rewritten without it, or written before it, is read whole. Reading that costs about 3 ms."""
    import polars as pl

    try:
        listed = pl.read_parquet_metadata(path).get(NULL_COLUMNS_KEY)
        nulls = set(json.loads(listed)) if listed else set()
    except (OSError, ValueError, TypeError, pl.exceptions.PolarsError):
        nulls = set()  # read_parquet says what is wrong with the file, if anything
    if not nulls:
        return pl.read_parquet(path)
    schema = pl.read_parquet_schema(path)
    kept = [c for c in schema if c not in nulls]
    if not kept or not nulls <= set(schema):
        return pl.read_parquet(path)
    frame = pl.read_parquet(path, columns=kept)
    return frame.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in schema if c in nulls).select(
        list(schema))
