"""The copy rules: inefficient-memcpy-size, low-memcpy-throughput, pageable-memcpy.

Figures are checked against independent computations: plain Python over the
trace JSON (fixtures/torch, made on an H100 with pinned host batches, and the
shared samples, made with pageable ones), and small synthetic tables with
hand-computed answers for the edge cases (aggregated rows, unknown sizes and
memory kinds, device-to-device copies, a catalog entry).
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import read_torch, run_rule, us_to_ns

from traceparse import plugins
from traceparse.analysis import analyze
from traceparse.catalog import find_gpu
from traceparse.figures import fmt_number
from traceparse.plugins import hookimpl
from traceparse.schema import conform
from traceparse.trace import Device, Trace, TraceMeta

# the CNN sweep made on the H100 (the 60-step MLP of the step-mark fixtures copies a few bytes, not a workload)
FIXTURE_TRACES = sorted(p for p in (Path(__file__).resolve().parent.parent / "fixtures" / "torch").glob("*.json.gz")
                        if not p.name.startswith("mlp_"))


# ---------------------------------------------------------------- helpers

def synthetic(rows: list[dict], device: str | None = None) -> Trace:
    """A trace from hand-written rows (missing columns are null; calls default to 1)."""
    df = pl.DataFrame(rows, infer_schema_length=None)
    if "calls" in df.columns:
        df = df.with_columns(pl.col("calls").fill_null(1))
    meta = TraceMeta(id="synthetic", devices=[Device(id=0, name=device)] if device else [])
    return Trace(conform(df, trace_id="synthetic"), meta)








def json_copies(path: Path) -> list[dict]:
    """The gpu_memcpy events of a Kineto trace, read with the json module: kind, memory kinds, bytes, ns."""
    with gzip.open(path, "rb") as f:
        doc = json.loads(f.read(), parse_float=Decimal)
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy":
            # "Memcpy HtoD (Pinned -> Device)"
            words = e["name"].split()
            src, dst = e["name"][e["name"].index("(") + 1: -1].split(" -> ")
            out.append({"kind": words[1], "src": src.lower(), "dst": dst.lower(),
                        "bytes": e["args"]["bytes"], "ns": us_to_ns(e["dur"])})
    return out


class FakeCatalog:
    """A GPU catalog plugin with one made-up GPU, so the tests do not depend on the real catalog's figures."""

    @hookimpl
    def traceparse_gpu_specs(self):
        return [{"name": "Testcard X1", "match": ["testcard x1"], "dram_gbps": 1000.0,
                 "host_link": {"name": "PCIe 9.0 x16", "gbps": 40.0}}]


@pytest.fixture
def fake_catalog():
    plugins.reset_registry([FakeCatalog()])
    yield
    plugins.reset_registry()


# ---------------------------------------------------------------- inefficient-memcpy-size

@pytest.mark.parametrize("path", FIXTURE_TRACES, ids=lambda p: p.name)
def test_small_copies_match_the_json(path):
    copies = [c for c in json_copies(path) if c["kind"] in ("HtoD", "DtoH", "PtoP")]
    small = [c for c in copies if c["bytes"] < 131072]
    f = run_rule(read_torch(path), "inefficient-memcpy-size")
    m = f.metrics
    assert m["copies"] == len(copies)
    assert m["copy_time_ns"] == sum(c["ns"] for c in copies)
    assert m["small_copies"] == len(small)
    assert m["small_copy_time_ns"] == sum(c["ns"] for c in small)
    assert m["small_bytes"] == sum(c["bytes"] for c in small)
    assert m["small_copy_share_pct"] == round(100 * sum(c["ns"] for c in small) / sum(c["ns"] for c in copies), 4)
    expected = {}
    for c in small:
        key = (c["kind"], c["bytes"])
        n, ns = expected.get(key, (0, 0))
        expected[key] = (n + 1, ns + c["ns"])
    assert {(i["copy_kind"], i["size_bytes"]): (i["copies"], i["time_ns"]) for i in f.items} == expected
    assert f.severity == "info"  # 4 small copies out of 6, a fraction of a percent of the copy time


def test_small_copy_threshold_is_settable():
    path = FIXTURE_TRACES[0]
    copies = json_copies(path)
    # Every copy is small under 1 GB; the big batch copies dominate the time: critical once 1 copy is enough.
    f = run_rule(read_torch(path), "inefficient-memcpy-size",
            "inefficient-memcpy-size.small_below_bytes=1000000000", "inefficient-memcpy-size.min_small_copies=1")
    assert f.metrics["small_copies"] == len(copies)
    assert f.metrics["small_copy_share_pct"] == 100.0
    assert f.severity == "critical"
    assert f.suggestion
    # Only the 4-byte copies are under 5 bytes.
    f = run_rule(read_torch(path), "inefficient-memcpy-size", "inefficient-memcpy-size.small_below_bytes=5")
    assert f.metrics["small_copies"] == sum(1 for c in copies if c["bytes"] < 5)
    assert {i["size_bytes"] for i in f.items} == {4}


def test_copy_kinds_are_settable():
    path = FIXTURE_TRACES[0]
    dtoh = [c for c in json_copies(path) if c["kind"] == "DtoH"]
    f = run_rule(read_torch(path), "inefficient-memcpy-size", 'inefficient-memcpy-size.copy_kinds=["DtoH"]')
    assert f.metrics["copies"] == len(dtoh)
    assert f.metrics["copy_time_ns"] == sum(c["ns"] for c in dtoh)


def test_small_copies_from_aggregated_rows_use_the_mean_size():
    # nvprof/nsys-like summary rows: totals only. Hand-computed:
    # HtoD: 1000 calls, 4_000_000 bytes -> mean 4000 B: small; 100_000 ns.
    # DtoH: 10 calls, 10 MiB -> mean 1 MiB: not small; 900_000 ns.
    # DtoD: out of scope by default. An HtoD row without bytes (nvprof summary): skipped, 5 calls.
    trace = synthetic([
        {"kind": "memcpy", "name": "[CUDA memcpy HtoD]", "copy_kind": "HtoD", "calls": 1000,
         "bytes": 4_000_000, "duration_ns": 100_000},
        {"kind": "memcpy", "name": "[CUDA memcpy DtoH]", "copy_kind": "DtoH", "calls": 10,
         "bytes": 10 * 2**20, "duration_ns": 900_000},
        {"kind": "memcpy", "name": "[CUDA memcpy DtoD]", "copy_kind": "DtoD", "calls": 50,
         "bytes": 50, "duration_ns": 5_000},
        {"kind": "memcpy", "name": "[CUDA memcpy HtoD]", "copy_kind": "HtoD", "calls": 5, "duration_ns": 7},
    ])
    f = run_rule(trace, "inefficient-memcpy-size")
    assert f.metrics == {"copies": 1010, "copy_time_ns": 1_000_000, "small_copies": 1000,
                         "small_copy_time_ns": 100_000, "small_bytes": 4_000_000, "small_copy_share_pct": 10.0,
                         "skipped_copies": 5}
    assert f.items == [{"copy_kind": "HtoD", "size_bytes": 4000, "copies": 1000, "time_ns": 100_000,
                        "avg_ns": 100.0, "share_pct": 10.0, "achieved_gbps": 40.0, "aggregated": True}]
    assert f.severity == "info"  # 10% < 25%
    # a summary gives each row's mean, not each copy's size: said, never "0 of N copies are smaller"
    assert f.message.startswith("1,010 HtoD/DtoH/PtoP copies in summary rows, which give a mean size per row, not "
                                "each copy's: 1,000 are in rows whose mean is under 128 KiB, taking 100 us, 10.0% of "
                                "the 1 ms of copy time. How many single copies are under 128 KiB a summary cannot "
                                "say")
    f = run_rule(trace, "inefficient-memcpy-size", "inefficient-memcpy-size.warning_share_pct=10")
    assert f.severity == "warning"
    f = run_rule(trace, "inefficient-memcpy-size", "inefficient-memcpy-size.warning_share_pct=10",
            "inefficient-memcpy-size.min_small_copies=1001")
    assert f.severity == "info"


def test_timed_copies_win_over_summary_rows_of_the_same_trace():
    # A GPU trace and its summary in one log: the summary must not count the copies twice.
    trace = synthetic([
        {"kind": "memcpy", "copy_kind": "HtoD", "start_ns": 0, "duration_ns": 10, "bytes": 100},
        {"kind": "memcpy", "copy_kind": "HtoD", "start_ns": 50, "duration_ns": 30, "bytes": 300},
        {"kind": "memcpy", "copy_kind": "HtoD", "calls": 2, "duration_ns": 40, "bytes": 400},
    ])
    f = run_rule(trace, "inefficient-memcpy-size")
    assert (f.metrics["copies"], f.metrics["copy_time_ns"]) == (2, 40)
    assert "1 aggregated memcpy rows ignored" in f.message


# ---------------------------------------------------------------- low-memcpy-throughput

@pytest.mark.parametrize("path", FIXTURE_TRACES, ids=lambda p: p.name)
def test_throughput_matches_the_json(path):
    copies = json_copies(path)
    host = [c for c in copies if c["kind"] in ("HtoD", "DtoH")]
    nbytes, ns = sum(c["bytes"] for c in host), sum(c["ns"] for c in host)
    f = run_rule(read_torch(path), "low-memcpy-throughput", "low-memcpy-throughput.host_link_gbps=64")
    assert f.metrics["bytes"] == nbytes
    assert f.metrics["copy_time_ns"] == ns
    assert f.metrics["achieved_gbps"] == round(nbytes / ns, 4)
    assert f.metrics["peak_gbps"] == 64.0
    assert f.metrics["pct_of_peak"] == round(100 * nbytes / ns / 64, 4)
    for item in f.items:
        mine = [c for c in copies if c["kind"] == item["copy_kind"]]
        assert item["copies"] == len(mine)
        assert item["bytes"] == sum(c["bytes"] for c in mine)
        assert item["time_ns"] == sum(c["ns"] for c in mine)
    assert {i["copy_kind"] for i in f.items} == {c["kind"] for c in copies}
    # Pinned copies on the H100 fixtures reach over 50 GB/s: healthy against PCIe 5.0 x16's 64 GB/s.
    assert f.metrics["pct_of_peak"] > 50
    assert f.severity == "info"


def test_throughput_peak_from_the_catalog_for_the_traces_gpu():
    path = FIXTURE_TRACES[0]
    trace = read_torch(path)
    (device,) = trace.meta.devices
    spec = find_gpu(device.name)
    if spec is None:
        pytest.skip(f"{device.name} not in the catalog")
    f = run_rule(trace, "low-memcpy-throughput")
    assert f.metrics["peak_gbps"] == spec["host_link"]["gbps"]
    assert spec["name"] in f.metrics["peak_source"] and device.name in f.metrics["peak_source"]
    # pinned batch copies on an H100 (PCIe 5.0 x16, 63 GB/s per direction) reach over 80% of it
    achieved = f.metrics["bytes"] / f.metrics["copy_time_ns"]
    assert f.metrics["pct_of_peak"] == round(100 * achieved / spec["host_link"]["gbps"], 4)
    assert f.metrics["pct_of_peak"] > 80
    assert f.severity == "info"


def test_one_direction_above_the_assumed_peak_disproves_it():
    """Host-to-device copies faster than the peak assumed per direction, device-to-host ones slower, and both
    together under it: the peak is disproven by one direction, so no share of it is given and no time is at stake
    (a real nsys capture said "96.1% of the host link's 15.75 GB/s" and "156.6 ms lost" while its HtoD copies ran
    at 17.14 GB/s)."""
    trace = read_torch(FIXTURE_TRACES[0])
    trace.meta.devices = [Device(id=0, name="Unheard-of GPU 9000")]
    items = {i["copy_kind"]: i for i in run_rule(trace, "low-memcpy-throughput").items}
    htod, dtoh = items["HtoD"], items["DtoH"]
    rates = {k: i["bytes"] / i["time_ns"] for k, i in items.items() if k in ("HtoD", "DtoH")}
    together = (htod["bytes"] + dtoh["bytes"]) / (htod["time_ns"] + dtoh["time_ns"])
    fast, slow = max(rates, key=rates.get), min(rates, key=rates.get)
    peak = (together + rates[fast]) / 2  # under the fast direction, over both together
    assert rates[slow] < together < peak < rates[fast]
    f = run_rule(trace, "low-memcpy-throughput", f"low-memcpy-throughput.default_host_link_gbps={peak}")
    assert f.metrics["pct_of_peak"] is None and f.impact_ns is None
    shown = {i["copy_kind"]: i for i in f.items}
    assert shown[fast]["above_peak"] and not shown[slow]["above_peak"]
    assert f"{fast} alone {fmt_number(shown[fast]['achieved_gbps'])} GB/s, above the {peak:,g} GB/s" in f.message
    assert "faster than assumed" in f.message and f.severity == "info"


def test_throughput_default_peak_is_stated_and_settable():
    path = FIXTURE_TRACES[0]
    trace = read_torch(path)
    trace.meta.devices = [Device(id=0, name="Unheard-of GPU 9000")]
    f = run_rule(trace, "low-memcpy-throughput")
    assert f.metrics["peak_gbps"] == 15.75
    assert "assumed: PCIe 3.0 x16 by default" in f.message
    # 50+ GB/s on a link assumed to give 15.75: no share of that peak, and the message says why
    assert "above the 15.75 GB/s per direction assumed for the host link" in f.message
    assert f.metrics["pct_of_peak"] is None
    assert all(i["pct_of_peak"] is None and i["above_peak"] for i in f.items if i["copy_kind"] == "HtoD")
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.default_host_link_gbps=1000")
    assert f.metrics["peak_gbps"] == 1000.0
    assert f.metrics["pct_of_peak"] < 10
    assert f.severity == "critical"  # about 5% of 1000 GB/s
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.default_host_link_gbps=1000",
            "low-memcpy-throughput.critical_below_pct=1")
    assert f.severity == "warning"
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.default_host_link_gbps=1000",
            "low-memcpy-throughput.critical_below_pct=1", "low-memcpy-throughput.min_copy_time_us=1e9")
    assert f.severity == "info"  # copies shorter than the minimum time never warn


def test_throughput_uses_the_catalog_host_link_and_dram(fake_catalog):
    # HtoD: 2 copies, 3_000 B in 150 ns = 20 GB/s = 50% of the 40 GB/s link; DtoH 1_000 B in 100 ns = 10 GB/s.
    # Host-device together: 4_000 B / 250 ns = 16 GB/s = 40%.
    # DtoD: 50_000 B in 200 ns = 250 GB/s, DRAM traffic 2 x 250 = 500 GB/s = 50% of 1000.
    # PtoP: no peak. A copy of unknown direction is skipped.
    trace = synthetic([
        {"kind": "memcpy", "copy_kind": "HtoD", "start_ns": 0, "duration_ns": 100, "bytes": 2_000},
        {"kind": "memcpy", "copy_kind": "HtoD", "start_ns": 500, "duration_ns": 50, "bytes": 1_000},
        {"kind": "memcpy", "copy_kind": "DtoH", "start_ns": 1000, "duration_ns": 100, "bytes": 1_000},
        {"kind": "memcpy", "copy_kind": "DtoD", "start_ns": 2000, "duration_ns": 200, "bytes": 50_000},
        {"kind": "memcpy", "copy_kind": "PtoP", "start_ns": 3000, "duration_ns": 10, "bytes": 100},
        {"kind": "memcpy", "start_ns": 4000, "duration_ns": 10, "bytes": 100},
    ], device="Testcard X1")
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.min_copy_time_us=0")
    assert f.metrics["achieved_gbps"] == 16.0
    assert f.metrics["peak_gbps"] == 40.0
    assert f.metrics["pct_of_peak"] == 40.0
    assert f.metrics["skipped_copies"] == 1
    assert "PCIe 9.0 x16 of Testcard X1" in f.metrics["peak_source"]
    items = {i["copy_kind"]: i for i in f.items}
    assert (items["HtoD"]["achieved_gbps"], items["HtoD"]["pct_of_peak"]) == (20.0, 50.0)
    assert (items["DtoH"]["achieved_gbps"], items["DtoH"]["pct_of_peak"]) == (10.0, 25.0)
    assert (items["DtoD"]["achieved_gbps"], items["DtoD"]["peak_gbps"], items["DtoD"]["pct_of_peak"]) == \
        (250.0, 1000.0, 50.0)
    assert (items["PtoP"]["peak_gbps"], items["PtoP"]["pct_of_peak"]) == (None, None)
    assert f.severity == "warning"  # 40% < 50%
    # --set overrides the catalog
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.min_copy_time_us=0",
            "low-memcpy-throughput.host_link_gbps=20", "low-memcpy-throughput.dram_gbps=500")
    assert (f.metrics["peak_gbps"], f.metrics["pct_of_peak"]) == (20.0, 80.0)
    assert {i["copy_kind"]: i["pct_of_peak"] for i in f.items}["DtoD"] == 100.0
    assert f.severity == "info"


def test_throughput_from_aggregated_totals():
    # An nvprof summary with sizes: 8_000 B in 1_000 ns over 4 calls = 8 GB/s; a row without bytes is skipped.
    trace = synthetic([
        {"kind": "memcpy", "copy_kind": "HtoD", "calls": 4, "bytes": 8_000, "duration_ns": 1_000},
        {"kind": "memcpy", "copy_kind": "DtoH", "calls": 3, "duration_ns": 1_000},
    ])
    f = run_rule(trace, "low-memcpy-throughput", "low-memcpy-throughput.host_link_gbps=16")
    assert (f.metrics["achieved_gbps"], f.metrics["pct_of_peak"], f.metrics["skipped_copies"]) == (8.0, 50.0, 3)


# ---------------------------------------------------------------- pageable-memcpy

@pytest.mark.parametrize("path", FIXTURE_TRACES, ids=lambda p: p.name)
def test_pinned_fixtures_have_no_pageable_copies(path):
    host = [c for c in json_copies(path) if c["kind"] in ("HtoD", "DtoH")]
    assert all("pageable" not in (c["src"], c["dst"]) for c in host)  # the fixtures pin their batches
    f = run_rule(read_torch(path), "pageable-memcpy")
    assert f.metrics["pageable_copies"] == 0
    assert f.metrics["pageable_time_ns"] == 0
    assert f.metrics["host_device_time_ns"] == sum(c["ns"] for c in host)
    assert f.metrics["pageable_share_pct"] == 0.0
    assert f.severity == "info"
    assert f.items == []


def test_pageable_copies_in_the_shared_samples(samples_dir):
    # the ResNet18 batch sweep, whose batches are copied from pageable memory (the transformer sample
    # makes its data on the GPU and copies nothing pageable, so the premise holds only for these)
    for path in sorted((samples_dir / "torch").glob("torch_resnet18_bs*.json.gz")):
        host = [c for c in json_copies(path) if c["kind"] in ("HtoD", "DtoH")]
        pageable = [c for c in host if (c["src"] if c["kind"] == "HtoD" else c["dst"]) == "pageable"]
        assert pageable, path  # these samples copy their batches from pageable memory
        f = run_rule(read_torch(path), "pageable-memcpy")
        m = f.metrics
        assert m["pageable_copies"] == len(pageable)
        assert m["pageable_bytes"] == sum(c["bytes"] for c in pageable)
        assert m["pageable_time_ns"] == sum(c["ns"] for c in pageable)
        assert m["host_device_time_ns"] == sum(c["ns"] for c in host)
        assert m["pageable_share_pct"] == round(100 * m["pageable_time_ns"] / m["host_device_time_ns"], 4)
        assert f.severity == "warning"
        assert "pin_memory" in f.suggestion
        f = run_rule(read_torch(path), "pageable-memcpy", "pageable-memcpy.warning_share_pct=100")
        assert f.severity == "info"
        # and the same batch copied from pinned memory runs several times faster (fixtures vs samples)
        low = run_rule(read_torch(path), "low-memcpy-throughput", "low-memcpy-throughput.host_link_gbps=64")
        assert low.metrics["achieved_gbps"] == round(
            sum(c["bytes"] for c in host) / sum(c["ns"] for c in host), 4)
        assert low.severity in ("warning", "critical")


def test_pageable_share_by_hand():
    # HtoD pageable 600 ns (2 calls, 3000 B), DtoH pageable 100 ns, HtoD pinned 300 ns,
    # DtoD (not host-device) 1000 ns, HtoD with unknown memory 50 ns (left out, 1 call).
    # share = 700 / (700 + 300) = 70%.
    trace = synthetic([
        {"kind": "memcpy", "copy_kind": "HtoD", "src_memory": "pageable", "dst_memory": "device",
         "start_ns": 0, "duration_ns": 400, "bytes": 2000},
        {"kind": "memcpy", "copy_kind": "HtoD", "src_memory": "pageable", "dst_memory": "device",
         "start_ns": 1000, "duration_ns": 200, "bytes": 1000},
        {"kind": "memcpy", "copy_kind": "DtoH", "src_memory": "device", "dst_memory": "pageable",
         "start_ns": 2000, "duration_ns": 100, "bytes": 10},
        {"kind": "memcpy", "copy_kind": "HtoD", "src_memory": "pinned", "dst_memory": "device",
         "start_ns": 3000, "duration_ns": 300, "bytes": 9000},
        {"kind": "memcpy", "copy_kind": "DtoD", "src_memory": "device", "dst_memory": "device",
         "start_ns": 4000, "duration_ns": 1000, "bytes": 1},
        {"kind": "memcpy", "copy_kind": "HtoD", "start_ns": 6000, "duration_ns": 50, "bytes": 1},
    ])
    f = run_rule(trace, "pageable-memcpy")
    assert f.metrics == {"pageable_copies": 3, "pageable_bytes": 3010, "pageable_time_ns": 700,
                         "host_device_time_ns": 1000, "pageable_share_pct": 70.0,
                         "pageable_gbps": 4.3, "pinned_gbps": 30.0, "unknown_memory_copies": 1,
                         "staged_htod_time_ns": 600}
    assert [(i["copy_kind"], i["copies"], i["bytes"], i["time_ns"], i["share_pct"]) for i in f.items] == \
        [("HtoD", 2, 3000, 600, 60.0), ("DtoH", 1, 10, 100, 10.0)]
    assert f.severity == "info"  # 700 ns < the default 10 us minimum
    # the two pageable HtoD copies (1000 and 2000 B) are at most 64 KiB: staged, they return at once and count
    # nothing toward the warning, which is left with the DtoH copy's 100 ns (10%)
    f = run_rule(trace, "pageable-memcpy", "pageable-memcpy.min_pageable_time_us=0.5")
    assert f.severity == "info"
    f = run_rule(trace, "pageable-memcpy", "pageable-memcpy.min_pageable_time_us=0.1")
    assert f.severity == "warning"
    f = run_rule(trace, "pageable-memcpy", "pageable-memcpy.min_pageable_time_us=0.1",
                 "pageable-memcpy.warning_share_pct=10.1")
    assert f.severity == "info"
    # with no size exempt, all 700 ns (70%) count
    exempt_none = "pageable-memcpy.async_htod_max_bytes=0"
    f = run_rule(trace, "pageable-memcpy", "pageable-memcpy.min_pageable_time_us=0.5", exempt_none)
    assert f.severity == "warning" and f.metrics["staged_htod_time_ns"] == 0
    f = run_rule(trace, "pageable-memcpy", "pageable-memcpy.min_pageable_time_us=0.5",
                 "pageable-memcpy.warning_share_pct=70.1", exempt_none)
    assert f.severity == "info"


def test_pageable_unknown_memory_kinds_only():
    # nvprof summary rows say nothing of memory kinds: nothing to measure, said so.
    trace = synthetic([{"kind": "memcpy", "copy_kind": "HtoD", "calls": 7, "duration_ns": 70, "bytes": 7}])
    f = run_rule(trace, "pageable-memcpy")
    assert f.metrics["pageable_share_pct"] is None
    assert f.metrics["unknown_memory_copies"] == 7
    assert f.severity == "info"
    assert "7 host-device copies left out" in f.message


# ---------------------------------------------------------------- applicability

@pytest.mark.parametrize("rule", ["inefficient-memcpy-size", "low-memcpy-throughput", "pageable-memcpy"])
def test_copy_rules_do_not_apply_without_copies(rule):
    trace = synthetic([{"kind": "kernel", "name": "k", "start_ns": 0, "duration_ns": 10, "device_id": 0},
                       {"kind": "api", "name": "cudaLaunchKernel", "start_ns": 0, "duration_ns": 5}])
    assert not plugins.registry().rule(rule).applies_to(trace)
    assert analyze(trace) and all(f.rule != rule for f in analyze(trace))
    (f,) = analyze(trace, rules=[rule])
    assert f.title == f"{rule}: not applicable"


def test_device_to_device_copies_without_a_dram_figure():
    # No GPU named: DtoD copies are listed with their throughput but no peak, and the message says why.
    trace = synthetic([{"kind": "memcpy", "copy_kind": "DtoD", "start_ns": 0, "duration_ns": 100, "bytes": 5_000}])
    f = run_rule(trace, "low-memcpy-throughput")
    assert f.items == [{"copy_kind": "DtoD", "copies": 1, "bytes": 5_000, "time_ns": 100, "achieved_gbps": 50.0,
                        "peak_gbps": None, "pct_of_peak": None, "link": "DRAM, read + write", "above_peak": False}]
    assert (f.metrics["achieved_gbps"], f.metrics["pct_of_peak"]) == (None, None)  # no host-device copies
    assert "no DRAM peak: the trace does not name its GPU" in f.message
    assert f.severity == "info"


ACCEPTANCE = Path(__file__).resolve().parent.parent / "fixtures" / "torch" / "acceptance"


def test_device_to_device_copies_faster_than_dram_have_no_share_of_it():
    # Real H100 capture (fixtures/make_acceptance_captures.py, side_stream_copies): each step copies its 8 MiB
    # batch device-to-device just after it arrived, so the bytes are still in the 50 MB L2 cache and the copy
    # beats what DRAM allows (2 x bytes / time > 3,350 GB/s). A share of the DRAM peak would be over 100%.
    path = ACCEPTANCE / "side_stream_copies.json.gz"
    dtod = [c for c in json_copies(path) if c["kind"] == "DtoD"]
    nbytes, ns = sum(c["bytes"] for c in dtod), sum(c["ns"] for c in dtod)
    assert len(dtod) == 3 and 2 * nbytes / ns > 3350  # what makes this case: faster than DRAM
    f = run_rule(read_torch(path), "low-memcpy-throughput")
    item = next(i for i in f.items if i["copy_kind"] == "DtoD")
    assert (item["copies"], item["bytes"], item["time_ns"]) == (3, nbytes, ns)
    assert item["achieved_gbps"] == round(nbytes / ns, 4)
    assert (item["peak_gbps"], item["pct_of_peak"], item["above_peak"]) == (3350.0, None, True)
    assert f"Device-to-device copies: {nbytes / ns:,.0f} GB/s, faster than the DRAM bandwidth allows" in f.message
    assert "came partly from the L2 cache" in f.message
    # the host-device copies of the same trace stay under their link's peak, with their share
    host = next(i for i in f.items if i["copy_kind"] == "HtoD")
    assert host["above_peak"] is False and 0 < host["pct_of_peak"] <= 100


def test_bytes_in_the_messages_are_scaled():
    """An nsys capture of OpenMP offload (SC23 tutorial, a T4) copied 2 x 51.2 GB: both messages said
    "102400.000 MB" where their own tables said 102.4 GB. Hand-written copies of those sizes."""
    trace = synthetic([
        {"kind": "memcpy", "copy_kind": "HtoD", "src_memory": "pageable", "dst_memory": "device",
         "start_ns": 0, "duration_ns": 13_000_000_000, "bytes": 51_200_000_000},
        {"kind": "memcpy", "copy_kind": "DtoH", "src_memory": "device", "dst_memory": "pageable",
         "start_ns": 14_000_000_000, "duration_ns": 12_000_000_000, "bytes": 51_200_000_000},
    ])
    pageable = run_rule(trace, "pageable-memcpy")
    assert "use pageable host memory: 102.4 GB in " in pageable.message
    low = run_rule(trace, "low-memcpy-throughput")
    assert low.message.startswith("Host-device copies moved 102.4 GB in ")
    assert "MB" not in pageable.message + low.message


def test_a_device_copys_share_of_dram_says_it_counts_the_read_and_the_write():
    """"DtoD 1,158 GB/s, peak 3,350 GB/s, 69.1%": the share counts each byte read and written (2 × 1,158), which
    the row did not say. Hand-written: 1,000 bytes in 2 ns on an H100 SXM (3,350 GB/s)."""
    trace = synthetic([{"kind": "memcpy", "copy_kind": "DtoD", "start_ns": 0, "duration_ns": 2, "bytes": 1_000}],
                      device="NVIDIA H100 80GB HBM3")
    [item] = run_rule(trace, "low-memcpy-throughput").items
    assert item["link"] == "DRAM, read + write"
    assert item["pct_of_peak"] == round(100 * 2 * 500 / 3350, 4)
