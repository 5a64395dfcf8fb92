"""TAU profiles written by APEX (issue 12.8): ``GPU: `` timers are GPU activities, against the files themselves.

The real profile (APEX's CUDA unit test, copied from APEX's documentation) and its pprof output use older
APEX names (``GPU: Kernel(DataElement*)``, ``GPU: Unified Memcpy HTOD``); the handwritten profile uses
current APEX's ``GPU: [CUDA] ...`` / ``GPU: [HIP] ...`` names and byte counters.
"""

from __future__ import annotations

import re
import shlex
from decimal import Decimal

import polars as pl
import pytest

from helpers import FIXTURES, exact_int, run_rule
from traceparse.ingest import read_paths

REAL = FIXTURES / "tau" / "real" / "apex-cuda" / "profile.0.0.0"
PPROF = FIXTURES / "tau" / "real" / "pprof" / "apex-cuda-pprof.txt"
CURRENT = FIXTURES / "tau" / "handwritten" / "apex-cuda-current" / "profile.0.0.0"


def timers(path) -> list[dict]:
    """The timer lines of a TAU text profile: name, calls, exclusive and inclusive µs (as Decimal)."""
    lines = path.read_text().splitlines()
    count = int(lines[0].split()[0])
    out = []
    for line in lines[2:2 + count]:
        name, calls, _subrs, excl, incl, *_ = shlex.split(line)
        out.append({"name": name, "calls": int(calls), "excl": Decimal(excl), "incl": Decimal(incl)})
    return out


def expected_kind(name: str) -> str:
    """The classification, written out independently for these files."""
    if not name.startswith("GPU: "):
        return "api" if re.match(r"cuda[A-Z]", name) else "region"
    rest = re.sub(r"^\[\w+\] ", "", name[5:])
    if re.match(r"(Unified )?(Memcpy|Memory copy) [HD]to[HD]", rest, re.I):
        return "memcpy"
    if rest.startswith("Memset"):
        return "memset"
    if rest.startswith("Unified Memory CPU Page Fault"):
        return "region"
    return "kernel"


@pytest.mark.parametrize("path", [REAL, CURRENT], ids=["real", "current"])
def test_gpu_timers_are_gpu_activities(path):
    raw = timers(path)
    ev = read_paths([path])[0].events
    rows = ev.filter(pl.col("kind") != "counter")
    assert dict(zip(rows["name"], rows["kind"].cast(str))) == {t["name"]: expected_kind(t["name"]) for t in raw}
    assert dict(zip(rows["name"], rows["duration_ns"])) == {t["name"]: exact_int(t["incl"], 1000) for t in raw}
    copies = rows.filter(pl.col("kind") == "memcpy")
    assert {n: k for n, k in zip(copies["name"], copies["copy_kind"].cast(str))} == {
        t["name"]: ("HtoD" if re.search("(?i)htod", t["name"]) else "DtoH")
        for t in raw if expected_kind(t["name"]) == "memcpy"}


def test_kernel_share_on_the_real_apex_profile():
    raw = timers(REAL)
    kernels = [t for t in raw if expected_kind(t["name"]) == "kernel"]
    assert [t["name"] for t in kernels] == ["GPU: Kernel(DataElement*)"]
    finding = run_rule(read_paths([REAL])[0], "kernel-share")
    assert finding.metrics["kernel_time_ns"] == sum(exact_int(t["excl"], 1000) for t in kernels) == 355293
    assert finding.metrics["calls"] == 4
    gpu = sum(exact_int(t["incl"], 1000) for t in raw if expected_kind(t["name"]) in ("kernel", "memcpy", "memset"))
    assert finding.metrics["gpu_time_ns"] == gpu
    assert finding.items[0]["name"] == "GPU: Kernel(DataElement*)"
    assert "no kernel" not in finding.message.lower()


def test_pprof_of_the_same_profile_agrees():
    """pprof rounds to its printed digits: the same kinds, times within them."""
    profile = read_paths([REAL])[0].events.filter(pl.col("kind") != "counter")
    pprof = read_paths([PPROF])[0].events.filter(pl.col("kind") != "counter")
    assert dict(zip(pprof["name"], pprof["kind"].cast(str))) == dict(zip(profile["name"], profile["kind"].cast(str)))
    finding = run_rule(read_paths([PPROF])[0], "kernel-share")
    assert finding.metrics["kernel_time_ns"] == 355000  # "0.355" msec, as pprof prints it


def test_current_apex_byte_counters_give_the_copies_bytes():
    lines = CURRENT.read_text().splitlines()
    events = {shlex.split(line)[0]: shlex.split(line)[1:] for line in lines if line.startswith('"GPU: [CUDA] Bytes')}
    expected = {name.split(": ", 2)[2]: round(int(v[0]) * Decimal(v[3])) for name, v in events.items()}
    ev = read_paths([CURRENT])[0].events
    copies = ev.filter(pl.col("kind") == "memcpy")
    assert {n.removeprefix("GPU: [CUDA] "): b for n, b in zip(copies["name"], copies["bytes"])} == expected
    assert expected == {"Memcpy HtoD 0->0": 8388608, "Memcpy DtoH 0->0": 4096}
    byte_counters = ev.filter(pl.col("name").str.starts_with("GPU: [CUDA] Bytes"))
    assert set(byte_counters["unit"]) == {"byte"}
    assert ev.filter(pl.col("name") == "GPU: [CUDA] Registers Per Thread")["unit"].to_list() == [None]
    finding = run_rule(read_paths([CURRENT])[0], "kernel-share")
    assert finding.metrics["kernels"] == 2 and finding.metrics["kernel_time_ns"] == 2_600_000
