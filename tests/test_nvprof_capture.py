"""An nvprof GPU trace log and the metrics log of another run of the same program, read as one trace and put on
one roofline (issue 23): the figures recomputed here from the two raw logs with regular expressions."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli

HAND = FIXTURES / "nvprof" / "handwritten"
TRACE = HAND / "sgemm_gpu_trace.log"
METRICS = HAND / "sgemm_metrics.log"
UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def _ns(text: str) -> int:
    number, unit = re.fullmatch(r"([\d.]+)(ns|us|ms|s)", text).groups()
    return int(Decimal(number) * UNITS[unit])


def raw_launches(path: Path) -> dict[str, list[int]]:
    """Kernel name -> the durations (ns) of its launches, from the GPU trace's rows (``... [corr]`` names)."""
    out: dict[str, list[int]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*[\d.]+m?s\s+([\d.]+(?:ns|us|ms|s))\s+\(.*?\)\s+\(.*?\)\s+.*?\s\s\d+\s+\d+\s\s(.*) \[\d+\]$",
                     line)
        if m:
            out.setdefault(m.group(2), []).append(_ns(m.group(1)))
    return out


def raw_metrics(path: Path) -> dict[str, dict[str, float]]:
    """Kernel name -> {metric: Avg}, from the metrics log."""
    out: dict[str, dict[str, float]] = {}
    kernel = None
    for line in path.read_text().splitlines():
        m = re.match(r"^\s+Kernel: (.*)$", line)
        if m:
            kernel = m.group(1)
            continue
        m = re.match(r"^\s+\d+\s+(\w+)\s+.*\s(\S+)$", line)
        if m and kernel:
            out.setdefault(kernel, {})[m.group(1)] = float(m.group(2))
    return out


def test_the_two_logs_are_one_trace(store):
    code, out, err = run_cli("ingest", str(TRACE), str(METRICS), "--json")
    assert code == 0, err
    (trace,) = json.loads(out)["traces"]
    assert [Path(p).name for p in trace["source_paths"]] == [TRACE.name, METRICS.name]
    # the GPU trace cuts its Device column to 15 characters; the metrics log's full name resolves it
    assert [d["name"] for d in trace["devices"]] == ["Tesla V100-SXM2-16GB"]


def test_one_roofline_from_the_trace_and_the_metrics(store):
    code, out, err = run_cli("roofline", str(TRACE), str(METRICS), "--json", "--group", "name")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["gpu"] == "V100 SXM2"
    launches, metrics = raw_launches(TRACE), raw_metrics(METRICS)
    assert sorted(launches) == sorted(metrics) and len(launches) == 2
    items = {i["name"]: i for i in doc["items"]}
    assert sorted(items) == sorted(launches)
    for name, durations in launches.items():
        m = metrics[name]
        flops = m["flop_count_sp"] * len(durations)
        dram = 32 * (m["dram_read_transactions"] + m["dram_write_transactions"]) * len(durations)
        item = items[name]
        assert item["time_ns"] == sum(durations)
        assert item["flops"] == flops and item["dram_bytes"] == dram
        assert item["arithmetic_intensity"] == pytest.approx(flops / dram, rel=1e-4)
        assert item["achieved_gflops"] == pytest.approx(flops / sum(durations), rel=1e-4)
        assert item["launches"] == len(durations)
    assert doc["kernels_without_counts"] == 0  # the timed launches are the rows the counters stand for
    total_time = sum(sum(d) for d in launches.values())
    assert doc["total"]["time_ns"] == total_time


def test_each_log_alone_says_what_it_lacks(store):
    code, _, err = run_cli("roofline", str(TRACE))
    assert code == 2 and "no FLOP or DRAM byte counts to put on a roofline" in err
    code, out, err = run_cli("roofline", str(METRICS), "--json")
    assert code == 0, err
    assert {i["time_ns"] for i in json.loads(out)["items"]} == {None}  # counters without the launches' times


def test_logs_of_other_programs_stay_apart(store):
    code, out, err = run_cli("ingest", str(TRACE), str(HAND / "metrics_events.log"), "--json")
    assert code == 0, err
    assert len(json.loads(out)["traces"]) == 2  # ./sgemm_bench 3 and ./train_step 2
    code, _, err = run_cli("roofline", str(TRACE), str(HAND / "metrics_events.log"))
    assert (code, err) == (2, "traceparse: error: roofline takes one trace; these 2 arguments make 2 traces: give "
                              "one, or the files of one capture\n")


def test_a_metrics_run_that_differs_is_said(store, tmp_path):
    """Invocations that differ from the trace's launches, and a kernel the trace never ran: one warning each."""
    text = METRICS.read_text().replace("          3   ", "          5   ", 3)  # sgemm's three metrics: 5 invocations
    text += ("    Kernel: unused_kernel(int)\n"
             "          1             flop_count_sp  Floating Point Operations(Single Precision)  10  10  10\n")
    metrics = tmp_path / "sgemm_metrics.log"
    metrics.write_text(text)
    code, out, err = run_cli("roofline", str(TRACE), str(metrics), "--json", "--group", "name")
    assert code == 0, err
    sgemm = "void sgemm_nn_kernel<float, int=128>(int, int, int, float const *, float const *, float*)"
    assert (f"traceparse: warning: {metrics}: {sgemm}: 5 invocations measured, 3 launches in {TRACE}: the mean "
            "per invocation is taken for each launch\n") in err
    assert f"traceparse: warning: {metrics}: 1 kernel measured here never ran in {TRACE}: its counters have no time\n" \
        in err
    items = {i["name"]: i for i in json.loads(out)["items"]}
    assert items[sgemm]["flops"] == raw_metrics(TRACE.parent / METRICS.name)[sgemm]["flop_count_sp"] * 3
