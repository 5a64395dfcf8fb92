"""The nsys Parquet and Arrow exports (``nsys export --type parquetdir|arrowdir``): one capture of
fixtures/nsys/export exported three ways reads to the same events, devices and metadata as its SQLite
export; the counts are also checked against the raw files, read here with pyarrow and sqlite3."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pyarrow.ipc
import pyarrow.parquet
import pytest

from helpers import refused, run_cli
from traceparse.ingest import detect_reader, read_group
from traceparse.plugins import registry

EXPORT = Path(__file__).resolve().parent.parent / "fixtures" / "nsys" / "export"
STEM = "resnet18_bs8_export"
SQLITE, PARQUET, ARROW = (EXPORT / f"{STEM}.sqlite.gz", EXPORT / f"{STEM}.parquetdir", EXPORT / f"{STEM}.arrowdir")
TABLES = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
          "memset": "CUPTI_ACTIVITY_KIND_MEMSET", "api": "CUPTI_ACTIVITY_KIND_RUNTIME"}


def read(path: Path):
    trace = read_group(registry().reader("nsys"), [path])
    trace.events  # a streamed trace: consume it (fills the warnings)
    return trace


def sorted_events(trace) -> pl.DataFrame:
    """Every column but the ids (``event_id`` is an order, ``trace_id`` a hash of the input's bytes), sorted."""
    events = trace.events.drop("event_id", "trace_id")
    return events.sort(events.columns, nulls_last=True)


@pytest.fixture(scope="module")
def forms():
    return {"sqlite": read(SQLITE), "parquet": read(PARQUET), "arrow": read(ARROW)}


def test_each_form_is_detected_as_nsys():
    for path in (SQLITE, PARQUET, ARROW):
        assert detect_reader(path, registry()).name == "nsys"


@pytest.mark.parametrize("form", ["parquet", "arrow"])
def test_same_events_devices_and_meta_as_the_sqlite_export(forms, form):
    base, other = forms["sqlite"], forms[form]
    assert other.events.height == base.events.height > 1000
    assert sorted_events(other).equals(sorted_events(base))
    assert other.events.drop("trace_id").equals(base.events.drop("trace_id"))  # the same order, too
    assert other.meta.devices == base.meta.devices and base.meta.devices[0].name.startswith("NVIDIA H100")
    assert other.meta.extra == base.meta.extra and base.meta.extra["processes"]
    assert other.meta.tool_version == base.meta.tool_version is not None
    assert other.meta.variant == base.meta.variant.replace("SQLite", form.capitalize())
    assert other.meta.warnings == base.meta.warnings == []


def _raw_parquet(table: str) -> pl.DataFrame:
    return pl.from_arrow(pyarrow.parquet.read_table(PARQUET / f"{table}.parquet"))


def _raw_arrow(table: str) -> pl.DataFrame:
    with pyarrow.ipc.open_stream(ARROW / f"{table}.arrow") as stream:
        return pl.from_arrow(stream.read_all())


@pytest.mark.parametrize("form", ["parquet", "arrow"])
def test_counts_and_times_match_the_raw_files(forms, form, tmp_path):
    raw = _raw_parquet if form == "parquet" else _raw_arrow
    plain = tmp_path / "export.sqlite"
    with gzip.open(SQLITE) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
    events = forms[form].events
    for kind, table in TABLES.items():
        rows = raw(table)
        want = (rows.height, int((rows["end"] - rows["start"]).sum()))
        assert want == db.execute(f'SELECT count(*), sum("end" - start) FROM {table}').fetchone()
        got = events.filter(pl.col("kind") == kind)
        assert (got.height, int(got["duration_ns"].sum())) == want, kind
    strings = dict(raw("StringIds").select("id", "value").iter_rows())
    names = sorted(strings[i] for i in raw(TABLES["kernel"])["demangledName"])
    assert sorted(events.filter(pl.col("kind") == "kernel")["name"]) == names
    nvtx = raw("NVTX_EVENTS")
    assert sorted(events.filter(pl.col("kind") == "marker")["name"]) == sorted(nvtx["text"])
    pids = {(g >> 24) & 0xFFFFFF for g in raw(TABLES["kernel"])["globalPid"]}
    assert set(events.filter(pl.col("kind") == "kernel")["pid"]) == pids and len(pids) == 1
    db.close()


def test_cli_analyze_on_the_parquet_directory(store):
    code, out, err = run_cli("analyze", str(PARQUET))
    assert code == 0, err
    assert "gpu-idle" in out


# ---------------------------------------------------------------- bad input

def _copy(form: Path, tmp_path: Path) -> Path:
    target = tmp_path / form.name
    shutil.copytree(form, target)
    return target


@pytest.mark.parametrize("form", [PARQUET, ARROW], ids=["parquet", "arrow"])
def test_directory_without_string_ids(store, tmp_path, form):
    path = _copy(form, tmp_path)
    next(path.glob("StringIds.*")).unlink()
    refused(["ingest", str(path)], f"{path}: StringIds.parquet (or StringIds.arrow) is missing from the directory "
                                   "(the names of CUPTI_ACTIVITY_KIND_KERNEL are ids into it)", store)


def _one_line_naming(args: list[str], file: Path, form: str) -> None:
    code, out, err = run_cli(*args)
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"traceparse: error: {file}: not a readable {form} file of an nsys export ("), err


def test_corrupt_parquet_file(store, tmp_path):
    path = _copy(PARQUET, tmp_path)
    damaged = path / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    data = bytearray(damaged.read_bytes())
    data[200:8000] = bytes(b ^ 0x5A for b in data[200:8000])  # the column chunks, not the footer
    damaged.write_bytes(bytes(data))
    _one_line_naming(["ingest", str(path)], damaged, "Parquet")


def test_cut_parquet_file(store, tmp_path):
    path = _copy(PARQUET, tmp_path)
    damaged = path / "StringIds.parquet"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    _one_line_naming(["ingest", str(path)], damaged, "Parquet")


def test_cut_arrow_file(store, tmp_path):
    path = _copy(ARROW, tmp_path)
    damaged = path / "CUPTI_ACTIVITY_KIND_RUNTIME.arrow"
    damaged.write_bytes(damaged.read_bytes()[:5000])
    _one_line_naming(["ingest", str(path)], damaged, "Arrow")


def test_value_past_int64_is_dropped_with_one_warning(tmp_path):
    path = _copy(PARQUET, tmp_path)
    table = pyarrow.parquet.read_table(pyarrow.BufferReader(pyarrow.py_buffer(
        (path / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").read_bytes())))
    frame = pl.from_arrow(table).with_row_index().with_columns(
        streamId=pl.when(pl.col("index") == 4).then(pl.lit(2**64 - 1, pl.UInt64)).otherwise("streamId")).drop("index")
    frame.write_parquet(path / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    trace = read(path)
    assert trace.events.filter(pl.col("kind") == "kernel").height == table.num_rows - 1
    assert trace.meta.warnings == [f"{path}: CUPTI_ACTIVITY_KIND_KERNEL: dropped 1 row whose streamId is not of "
                                   f"the column's type (first: row 5, streamId={2**64 - 1})"]


def test_other_directories_are_not_claimed(tmp_path):
    nsys = registry().reader("nsys")
    only_enums = tmp_path / "enums"
    only_enums.mkdir()
    for p in PARQUET.glob("ENUM_*.parquet"):
        shutil.copy(p, only_enums)
    assert nsys.sniff(only_enums, b"") == 0.0
    store_like = tmp_path / "store"
    store_like.mkdir()
    pl.DataFrame({"x": [1]}).write_parquet(store_like / "events.parquet")
    assert nsys.sniff(store_like, b"") == 0.0
