"""The three core rules on real traces, checked against a plain-Python computation from the JSON file."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import us_to_ns as ns
from traceparse.analysis import analyze
from traceparse.ingest import read_paths

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "torch"
TRACES = sorted(FIXTURES.glob("*_bs*.json.gz"))


def load(path: Path):
    doc = json.load(gzip.open(path), parse_float=Decimal)
    kernels, copies = defaultdict(list), defaultdict(list)
    names = defaultdict(lambda: [0, 0])
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        iv = (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        if e.get("cat") == "kernel":
            kernels[e["args"]["device"]].append(iv)
            names[e["name"]][0] += 1
            names[e["name"]][1] += iv[1] - iv[0]
        elif e.get("cat") == "gpu_memcpy":
            copies[e["args"]["device"]].append(iv)
    return kernels, copies, names


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def concurrent_time(intervals):
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    depth, total, last = 0, 0, None
    for t, d in edges:
        if last is not None and depth >= 2:
            total += t - last
        depth += d
        last = t
    return total


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_core_rules_match_plain_python(path):
    kernels, copies, names = load(path)
    trace = read_paths([path])[0]
    findings = {f.rule: f for f in analyze(trace, rules=["low-memcpy-overlap", "low-kernel-concurrency",
                                                          "kernel-share"])}
    overlapped = memcpy = 0
    for device, ivs in copies.items():
        union = merged(kernels[device])
        for s, e in ivs:
            memcpy += e - s
            overlapped += sum(max(0, min(e, ue) - max(s, us)) for us, ue in union)
    m = findings["low-memcpy-overlap"].metrics
    assert (m["memcpy_time_ns"], m["overlapped_ns"]) == (memcpy, overlapped)
    assert m["overlap_pct"] == round(100 * overlapped / memcpy, 4)

    busy = sum(e - s for ivs in kernels.values() for s, e in merged(ivs))
    concurrent = sum(concurrent_time(ivs) for ivs in kernels.values())
    m = findings["low-kernel-concurrency"].metrics
    assert (m["kernel_busy_ns"], m["concurrent_ns"]) == (busy, concurrent)

    total = sum(t for _, t in names.values())
    share = findings["kernel-share"]
    assert share.metrics["kernel_time_ns"] == total
    top = sorted(names.items(), key=lambda kv: (-kv[1][1], kv[0]))[:len(share.items)]
    assert [(i["name"], i["calls"], i["time_ns"]) for i in share.items] == [(n, c, t) for n, (c, t) in top]
    assert share.items[0]["share_pct"] == round(100 * top[0][1][1] / total, 4)


@pytest.mark.parametrize("name,pageable", [("torch/alexnet_bs16.json.gz", False), ("nsys/resnet18_bs8.sqlite.gz", True)])
def test_pinned_memory_is_advised_only_where_a_copy_is_not_pinned(name, pageable):
    """low-memcpy-overlap told a trace whose exposed copies were all ``pinned -> device`` and ``device -> pinned``
    to "use pinned host memory" (a sweep of public files, stop 53). Whether a copy is pinned is read here from
    the raw file: Kineto's ``memcpy`` kernels name their memory kinds (``Memcpy HtoD (Pinned -> Device)``), the
    nsys export's CUPTI memory kinds are numbers (0: unknown, 1: pageable, 2: pinned, 3: device)."""
    import sqlite3
    import tempfile

    from traceparse.ingest import read_paths

    path = FIXTURES.parent / name
    if name.endswith(".json.gz"):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        copies = {e["name"] for e in events if e.get("cat") == "gpu_memcpy"}
        raw_pageable = any("Pageable" in c for c in copies)
    else:
        with tempfile.NamedTemporaryFile(suffix=".sqlite") as db:
            db.write(gzip.decompress(path.read_bytes()))
            db.flush()
            kinds = sqlite3.connect(db.name).execute(
                "select distinct srcKind, dstKind from CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
        raw_pageable = any(1 in pair for pair in kinds)
    assert raw_pageable == pageable
    (found,) = analyze(read_paths([path])[0], ["low-memcpy-overlap"])
    assert found.severity != "info"
    assert ("Use pinned host memory" in found.suggestion) == pageable
    assert ("from and to pinned or device memory already" in found.suggestion) == (not pageable)
