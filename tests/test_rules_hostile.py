"""Issue 16: rules never crash on what a reader may store.

Parametrized over every registered rule: each runs on an empty table, on a table of nulls (one row per kind,
every nullable column null), and on one plausible row of each kind, and gives findings whose figures are
finite and not negative. A new rule is checked without a new test.
"""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from traceparse.analysis import analyze
from traceparse.plugins import registry
from traceparse.schema import KINDS
from traceparse.trace import Device, Trace, TraceMeta

RULES = sorted(registry().rules)


def _meta(fmt="torch"):
    return TraceMeta(id="0123456789abcdef", format=fmt, devices=[Device(id=0, name="NVIDIA H100 80GB HBM3")])


def empty():
    return Trace(pl.DataFrame({"kind": pl.Series([], dtype=pl.String)}), _meta())


def nulls():
    """One row per kind, every column but ``kind`` null (``calls`` too)."""
    return Trace(pl.DataFrame({"kind": list(KINDS), "calls": pl.Series([None] * len(KINDS), dtype=pl.Int64)}),
                 _meta())


def one_of_each():
    n = len(KINDS)
    return Trace(pl.DataFrame({
        "kind": list(KINDS), "name": [f"{k}_0" for k in KINDS],
        "start_ns": [1000 * i for i in range(n)], "duration_ns": [500] * n,
        "device_id": pl.Series([0] * n, dtype=pl.Int32), "stream_id": [7] * n, "pid": [1] * n, "tid": [1] * n,
        "correlation_id": [1] * n, "external_id": [1] * n, "bytes": [1 << 20] * n,
        "copy_kind": ["HtoD" if k == "memcpy" else None for k in KINDS],
        "src_memory": ["pageable" if k == "memcpy" else None for k in KINDS],
        "dst_memory": ["device" if k == "memcpy" else None for k in KINDS],
        "value": [1.0] * n, "unit": ["1"] * n, "flops": [1e6] * n,
        "grid_x": pl.Series([1] * n, dtype=pl.Int32), "block_x": pl.Series([32] * n, dtype=pl.Int32),
    }), _meta())


def aggregated_nulls():
    """An aggregated profile's rows (no start) with their figures null: a TAU or nvprof summary cut short."""
    return Trace(pl.DataFrame({"kind": ["kernel", "api", "region", "counter"], "name": ["k", "cudaMalloc", "main", "c"],
                               "calls": [3, None, 2, None]}), _meta("tau"))


TABLES = {"empty": empty, "nulls": nulls, "one_of_each": one_of_each, "aggregated_nulls": aggregated_nulls}


def _figures(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _figures(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _figures(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("rule", RULES)
def test_rule_accepts_what_a_reader_may_store(rule, table):
    findings = analyze(TABLES[table](), rules=[rule])
    for finding in findings:
        doc = json.loads(json.dumps(finding.to_dict(), default=str))
        for x in _figures(doc.get("metrics", {})):
            assert math.isfinite(x), (rule, table, doc)
