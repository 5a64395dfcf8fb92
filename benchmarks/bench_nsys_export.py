"""Benchmark: reading one nsys capture from its SQLite, Parquet and Arrow exports.

The fixture ``fixtures/nsys/export/resnet18_bs8_export.*`` (one capture exported three ways), and a synthetic
capture made from it with the kernel and runtime tables repeated ``--copies`` times (in all three forms, the
same rows). Each form is read by the nsys reader in this process (imports and a first read done beforehand)
and every event collected; the table gives the median and range of ``--repeat`` reads. Usage::

    python benchmarks/bench_nsys_export.py [--copies 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet

from traceparse.ingest import read_group
from traceparse.plugins import registry

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "nsys" / "export"
STEM = "resnet18_bs8_export"
REPEATED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")


def synthetic(work: Path, copies: int) -> dict[str, Path]:
    """The fixture with its kernel and runtime tables repeated ``copies`` times, as SQLite, Parquet and Arrow."""
    out = {"sqlite": work / "big.sqlite", "parquetdir": work / "big.parquetdir", "arrowdir": work / "big.arrowdir"}
    with gzip.open(FIX / f"{STEM}.sqlite.gz") as src, open(out["sqlite"], "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(out["sqlite"])
    for table in REPEATED:
        db.execute(f"CREATE TEMP TABLE one AS SELECT * FROM {table}")
        for _ in range(copies - 1):
            db.execute(f"INSERT INTO {table} SELECT * FROM one")
        db.execute("DROP TABLE one")
    db.commit()
    db.close()
    for form, suffix in (("parquetdir", "parquet"), ("arrowdir", "arrow")):
        shutil.copytree(FIX / f"{STEM}.{form}", out[form])
        for table in REPEATED:
            path = out[form] / f"{table}.{suffix}"
            data = pa.py_buffer(path.read_bytes())  # in memory: the file is rewritten below
            one = (pyarrow.parquet.read_table(pa.BufferReader(data)) if suffix == "parquet"
                   else pyarrow.ipc.open_stream(data).read_all())
            big = pa.concat_tables([one] * copies)
            if suffix == "parquet":
                pyarrow.parquet.write_table(big, path)
            else:
                with pyarrow.ipc.new_stream(path, big.schema) as writer:
                    writer.write_table(big)
    return out


def timed(path: Path, repeat: int) -> tuple[int, list[float]]:
    """Rows read and the seconds of each of ``repeat`` reads (after one untimed read)."""
    reader = registry().reader("nsys")
    rows = read_group(reader, [path]).events.height
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        read_group(reader, [path]).events
        times.append(time.perf_counter() - start)
    return rows, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = work / f"{STEM}.sqlite"
        with gzip.open(FIX / f"{STEM}.sqlite.gz") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        cases = [("fixture", "sqlite.gz", FIX / f"{STEM}.sqlite.gz"), ("fixture", "sqlite", plain),
                 ("fixture", "parquetdir", FIX / f"{STEM}.parquetdir"), ("fixture", "arrowdir", FIX / f"{STEM}.arrowdir")]
        if args.copies > 1:
            cases += [(f"x{args.copies}", form, path) for form, path in synthetic(work, args.copies).items()]
        print(f"| capture | form | events | median s | min-max s |\n|---|---|---:|---:|---:|")
        for label, form, path in cases:
            rows, times = timed(path, args.repeat)
            print(f"| {label} | {form} | {rows:,} | {statistics.median(times):.3f} | "
                  f"{min(times):.3f}-{max(times):.3f} |", flush=True)


if __name__ == "__main__":
    main()
