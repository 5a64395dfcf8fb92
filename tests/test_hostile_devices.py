"""Device properties of the wrong type or range (issue 22 item 4), checked in one place for every reader
(traceparse.validate.validate_devices) and for the traceparse Chrome export's own header; and SQLite type
confusion in an nsys export. Every input is a hand-made mutant of a real fixture: the NCCL rank trace's
``deviceProperties``, the resnet18 nsys SQLite export, and a Chrome export written by traceparse from the rank
trace. The expected counts and values are read from the mutated files here."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli
from traceparse.store import Store

RANK0 = FIXTURES / "torch" / "multirank" / "nccl2_balanced" / "rank0.json.gz"
NSYS = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"


def _ingest(path: Path):
    code, out, err = run_cli("ingest", "-q", "--json", str(path))
    assert code == 0, err
    return err, Store().meta(json.loads(out)["traces"][0]["id"])


def _analyze_ok(path: Path) -> str:
    code, out, err = run_cli("analyze", "--all", "--width", "200", str(path))
    assert code == 0, err
    return out


@pytest.mark.parametrize("key, value, field, reason", [
    ("name", 42, "name", "is not a text name"),
    ("totalGlobalMem", "80GB", "memory_bytes", "is not a whole number of bytes above 0"),
    ("numSms", "many", "sm_count", "is not a whole number of SMs above 0"),
    ("numSms", -132, "sm_count", "is not a whole number of SMs above 0"),
    ("numSms", 0, "sm_count", "is not a whole number of SMs above 0"),
])
def test_torch_device_properties(store, tmp_path, key, value, field, reason):
    doc = json.load(gzip.open(RANK0))
    devices = doc["deviceProperties"]
    original = [dict(d) for d in devices]
    for d in devices:
        d[key] = value
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    err, meta = _ingest(path)
    count = "1 device value" if len(devices) == 1 else f"{len(devices)} device values"
    assert err == (f"traceparse: warning: {path}: dropped {count} whose {field} {reason} "
                   f"(first: device 0, {field}={value!r})\n")
    assert [getattr(d, field) for d in meta.devices] == [None] * len(devices)
    assert [(d.id, d.sm_count if field != "sm_count" else o["numSms"]) for d, o in zip(meta.devices, original)] == \
        [(o["id"], o["numSms"]) for o in original]
    out = _analyze_ok(path)
    assert "-132" not in out and "many" not in out


def _nsys(tmp_path: Path, sql: str) -> Path:
    path = tmp_path / "resnet18_bs8.sqlite"
    with gzip.open(NSYS) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(path)
    db.executescript(sql)
    db.commit()
    db.close()
    return path


def test_nsys_target_info_gpu(store, tmp_path):
    path = _nsys(tmp_path, "UPDATE TARGET_INFO_GPU SET smCount = 'many', totalMemory = '80GB', clockRate = 1e308;")
    gpus = sqlite3.connect(path).execute("SELECT count(*) FROM TARGET_INFO_GPU").fetchone()[0]
    err, meta = _ingest(path)
    n = "1 device value" if gpus == 1 else f"{gpus} device values"
    assert err == (f"traceparse: warning: {path}: dropped {n} whose sm_count is not a whole number of SMs above 0 "
                   "(first: device 0, sm_count='many')\n"
                   f"traceparse: warning: {path}: dropped {n} whose memory_bytes is not a whole number of bytes "
                   "above 0 (first: device 0, memory_bytes='80GB')\n"
                   f"traceparse: warning: {path}: dropped {n} whose core_clock_mhz is not a finite number of MHz "
                   "above 0 (first: device 0, core_clock_mhz=1e+302)\n")
    assert all(d.sm_count is None and d.memory_bytes is None and d.core_clock_mhz is None for d in meta.devices)
    _analyze_ok(path)


@pytest.mark.parametrize("table, column, value, shown", [
    ("CUPTI_ACTIVITY_KIND_KERNEL", "start", "1e308", "1e+308"),
    ("CUPTI_ACTIVITY_KIND_KERNEL", "streamId", "'abc'", "'abc'"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "bytes", "'lots'", "'lots'"),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId", "1e308", "1e+308"),
])
def test_nsys_sqlite_type_confusion(store, tmp_path, table, column, value, shown):
    """SQLite columns take any type: a REAL or a text value in an INTEGER column was a multi-line polars
    ComputeError (exit 3). The row is dropped with one warning; the rest of the table is kept."""
    path = _nsys(tmp_path, f'UPDATE {table} SET "{column}" = {value} WHERE rowid IN (3, 7);')
    db = sqlite3.connect(path)
    rows = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    rowids = [r[0] for r in db.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
    changed = [i + 1 for i, r in enumerate(rowids) if r in (3, 7)]  # positions in the table, from 1
    n = "1 row" if len(changed) == 1 else f"{len(changed)} rows"
    kinds = {"CUPTI_ACTIVITY_KIND_KERNEL": "kernel", "CUPTI_ACTIVITY_KIND_MEMCPY": "memcpy",
             "CUPTI_ACTIVITY_KIND_RUNTIME": "api"}
    err, meta = _ingest(path)
    assert (f"traceparse: warning: {path}: {table}: dropped {n} whose {column} is not of the column's type "
            f"(first: row {changed[0]}, {column}={shown})\n") in err
    assert "Traceback" not in err and "ComputeError" not in err
    assert meta.summary["events_per_kind"][kinds[table]] == rows - len(changed) + (
        0 if table != "CUPTI_ACTIVITY_KIND_RUNTIME" else
        db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_DRIVER").fetchone()[0]
        if "CUPTI_ACTIVITY_KIND_DRIVER" in {r[0] for r in db.execute("SELECT name FROM sqlite_master")} else 0)
    _analyze_ok(path)


@pytest.fixture
def export(store, tmp_path) -> dict:
    out = tmp_path / "export.json"
    code, _, err = run_cli("export", "--to", "chrome", "--out", str(out), str(RANK0))
    assert code == 0, err
    return json.loads(out.read_text())


@pytest.mark.parametrize("edit, where, expected", [
    (lambda t: t["trace"].update(tags=["a"]), "traceparse.trace.tags", "expected an object, got list ['a']"),
    (lambda t: t["trace"].update(devices=5), "traceparse.trace.devices", "expected a list, got int 5"),
    (lambda t: t.update(trace=["x"]), "traceparse.trace", "expected an object, got list ['x']"),
    (lambda t: t["trace"].update(devices=[3]), "traceparse.trace.devices[0]",
     "expected an object of device properties, got int"),
])
def test_chrome_export_header_of_the_wrong_shape_is_one_line(store, tmp_path, export, edit, where, expected):
    edit(export["traceparse"])
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(export))
    code, out, err = run_cli("ingest", str(path))
    assert code == 2
    assert err == f"traceparse: error: {path}: {where}: {expected}\n"


def test_chrome_export_device_values_go_through_the_same_check(store, tmp_path, export):
    devices = export["traceparse"]["trace"]["devices"]
    devices[0]["sm_count"] = "many"
    devices[-1]["memory_bytes"] = -1
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(export))
    err, meta = _ingest(path)
    assert err == (f"traceparse: warning: {path}: dropped 1 device value whose sm_count is not a whole number of "
                   "SMs above 0 (first: device 0, sm_count='many')\n"
                   f"traceparse: warning: {path}: dropped 1 device value whose memory_bytes is not a whole number "
                   f"of bytes above 0 (first: device {len(devices) - 1}, memory_bytes=-1)\n")
    assert meta.devices[0].sm_count is None and meta.devices[-1].memory_bytes is None
    assert [d.name for d in meta.devices] == [d["name"] for d in devices]


def test_an_empty_device_name_is_no_name_and_no_warning(store, tmp_path):
    """A real ROCm vLLM trace (TraceLens) names its devices "": the warning "dropped 8 device values whose name is
    not a text name (name='')" said something was wrong with data that only says nothing. Hand-made here from the
    NCCL rank trace's deviceProperties."""
    doc = json.load(gzip.open(RANK0))
    for d in doc["deviceProperties"]:
        d["name"] = "  " if d["id"] else ""
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    err, meta = _ingest(path)
    assert err == ""
    assert [d.name for d in meta.devices] == [None] * len(doc["deviceProperties"])
    assert [d.sm_count for d in meta.devices] == [d["numSms"] for d in doc["deviceProperties"]]


def test_a_device_kind_that_is_no_word_is_dropped():
    """A device's kind becomes its label on screen (``TPU 2``): one that is markup, an escape or too long is
    dropped (the device is then a GPU, as every reader's device is without a kind), with the one warning."""
    from traceparse.meta import Device, device_nouns
    from traceparse.validate import validate_devices

    devices = [Device(id=0, kind="TPU"), Device(id=1, kind="[bold]x"), Device(id=2, kind="\x1b[2J"),
               Device(id=3, kind="A" * 17)]
    warnings = validate_devices(devices, "t.json")
    assert warnings == ["t.json: dropped 3 device values whose kind is not a device word of 1 to 16 letters (TPU) "
                        "(first: device 1, kind='[bold]x')"]
    assert [d.kind for d in devices] == ["TPU", None, None, None]
    assert device_nouns(type("M", (), {"devices": devices})()) == {0: "TPU"}
