"""A device without a name is identified from its own attributes (issue 12, item 7): an ncu details page gives
compute capability 9.0 and 132 SMs ("# SMs" in Launch Statistics, the CC column) and no name; that is an H100 SXM,
or one of the other catalog entries with the same cc and SM count, which the reason must name.

The expected entries are found here from plugins/catalog/gpus.toml with tomllib and the page's figures from the
CSV with the csv module, not by traceparse.
"""

from __future__ import annotations

import csv
import json
import tomllib

import pytest

from helpers import FIXTURES, REPO, run_cli
from traceparse.catalog import gpu_for_trace, identify_gpu
from traceparse.ingest import read_paths
from traceparse.trace import Device, Trace, TraceMeta

CATALOG = tomllib.loads((REPO / "plugins" / "catalog" / "gpus.toml").read_text())["gpu"]
VGG11 = FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv"


def page_attributes(path) -> tuple[str, int]:
    """(CC, # SMs) of a details page, each the one value every kernel's rows give."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    ccs = {r["CC"] for r in rows}
    sms = {r["Metric Value"] for r in rows if r["Metric Name"] == "# SMs"}
    assert len(ccs) == 1 and len(sms) == 1
    return ccs.pop(), int(sms.pop().replace(",", ""))


def same_properties(cc: str, sms: int, gib: float | None = None) -> list[str]:
    """Catalog entries (without an identify table) of that cc and SM count, and memory within 5%, in file order."""
    return [g["name"] for g in CATALOG if "identify" not in g and g.get("compute_capability") == cc
            and g.get("sm_count") == sms and (gib is None or abs(gib - g["memory_gb"]) <= 0.05 * g["memory_gb"])]


def pages(samples_dir=None):
    return [VGG11] + ([samples_dir / "ncu" / "ncu_details_alexnet_bs16.csv"] if samples_dir else [])


def test_cc_9_0_with_132_sms_is_an_h100_sxm_and_the_look_alikes_are_named(samples_dir):
    for path in pages(samples_dir):
        cc, sms = page_attributes(path)
        assert (cc, sms) == ("9.0", 132)
        alike = same_properties(cc, sms)
        assert alike[0] == "H100 SXM" and set(alike) == {"H100 SXM", "H100 NVL", "H200", "H200 NVL", "GH200"}
        trace = read_paths([path])[0]
        (device,) = trace.meta.devices
        assert device.name is None and device.memory_bytes is None  # the page names no GPU and gives no memory
        spec, how = gpu_for_trace(trace)
        assert spec["name"] == "H100 SXM"
        assert how.startswith("H100 SXM (identified from the trace's device 0 (unnamed) by its properties: "
                              "132 SMs, compute capability 9.0; ambiguous: ")
        assert "H100 NVL, H200, H200 NVL and GH200 have these properties too, with other peak figures" in how
        assert "; gpu= to choose)" in how  # called from Python
        spec, how = gpu_for_trace(trace, "H200")  # --gpu still wins
        assert spec["name"] == "H200" and how == "H200 (from gpu=)"


def test_analyze_and_show_name_the_h100(tmp_path):
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "analyze", "--json", str(VGG11))
    assert code == 0, err
    (finding,) = [f for f in json.loads(out)["findings"] if f["rule"] == "arithmetic-intensity"]
    assert finding["metrics"]["gpu"] == "H100 SXM"
    assert "ambiguous" in finding["metrics"]["gpu_source"]
    trace_id = json.loads(out)["traces"][0]["id"]
    code, out, err = run_cli("--store", store, "show", trace_id)
    assert code == 0, err
    flat = " ".join(out.replace("│", " ").split())
    assert "device 0 ? (H100 SXM by its properties; also fits H100 NVL, H200, H200 NVL, GH200)" in flat


@pytest.mark.parametrize("memory_bytes, expected", [
    (85_029_158_912, ["H100 SXM"]),          # what an H100 80GB HBM3 reports (81,089 MiB)
    (150_754_820_096, ["H200", "H200 NVL"]),  # an H200: 143,771 MiB
    (102_005_473_280, ["H100 NVL", "GH200"]),  # 95 GiB: an H100 NVL (94 GB) and a GH200 (96 GB) both fit
])
def test_memory_narrows_the_match(memory_bytes, expected):
    gib = memory_bytes / 2**30
    assert same_properties("9.0", 132, gib) == expected  # the independent lookup agrees with the table here
    device = Device(id=0, name=None, sm_count=132, compute_capability="9.0", memory_bytes=memory_bytes)
    spec, fits = identify_gpu(device)
    assert spec["name"] == expected[0] and fits == expected
    _, how = gpu_for_trace(Trace(None, TraceMeta(devices=[device])))
    if len(expected) == 1:
        assert "ambiguous" not in how and f"132 SMs, {gib:.0f} GiB, compute capability 9.0;" in how
    else:
        assert f"ambiguous: {expected[1]} has these properties too, with other peak figures" in how


def test_what_is_not_identified():
    # a named GPU the catalog does not know is not guessed from its SM count (an RTX 6000 Ada has an L40's 142)
    named = Device(id=0, name="NVIDIA RTX 6000 Ada Generation", sm_count=142, compute_capability="8.9")
    assert identify_gpu(named) == (None, [])
    # both the compute capability and the SM count are needed
    assert identify_gpu(Device(id=0, sm_count=132)) == (None, [])
    assert identify_gpu(Device(id=0, compute_capability="9.0")) == (None, [])
    # properties no entry has
    assert identify_gpu(Device(id=0, sm_count=133, compute_capability="9.0")) == (None, [])
    # memory that fits no entry of that cc and SM count
    assert identify_gpu(Device(id=0, sm_count=132, compute_capability="9.0", memory_bytes=40 * 2**30)) == (None, [])
    _, how = gpu_for_trace(Trace(None, TraceMeta(devices=[Device(id=0, sm_count=133, compute_capability="9.0")])))
    assert how == "the trace does not name its GPU; pass gpu=NAME"
