"""Exporters ``parquet`` and ``csv``: the normalized event table as a file."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import polars as pl

from traceparse.exporter import Exporter
from traceparse.plugins import hookimpl
from traceparse.trace import Trace


def _atomic(out: Path, write) -> None:
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


class ParquetExporter(Exporter):
    name = "parquet"
    description = "the normalized event table as Parquet (column types kept)"
    suffixes = (".parquet",)

    def export(self, trace: Trace, out: Path) -> None:
        _atomic(out, lambda p: trace.events.write_parquet(p))


class CsvExporter(Exporter):
    name = "csv"
    description = "the normalized event table as CSV (one header row, empty cells for nulls)"
    suffixes = (".csv",)

    def export(self, trace: Trace, out: Path) -> None:
        _atomic(out, lambda p: trace.events.with_columns(pl.col(pl.Enum).cast(pl.String)).write_csv(p))


@hookimpl
def traceparse_exporters():
    return [ParquetExporter(), CsvExporter()]
