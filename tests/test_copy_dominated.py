"""Rule copy-dominated and the summary's GPU time split, on summary-only traces (no timeline).

Oracles parse the raw files here: nvprof's "GPU activities" rows (the Time
column with its unit, exact decimals) and nsys's ``cuda_gpu_kern_sum`` /
``cuda_gpu_mem_time_sum`` CSVs (Total Time (ns)).
"""

from __future__ import annotations

import csv
import json
import re
from decimal import Decimal

import pytest

from traceparse.figures import fmt_ns

from helpers import FIXTURES, run_cli

REAL = FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log"
COPY_BOUND = FIXTURES / "nvprof" / "handwritten" / "copy_dominated_summary.log"
NSYS = FIXTURES / "nsys"
UNIT_NS = {"ns": 1, "us": 1000, "ms": 10**6, "s": 10**9}
ROW = re.compile(r"^\s*(?:GPU activities:)?\s+[\d.]+%\s+(?P<time>[\d.]+)(?P<unit>[mun]?s)\s+\d+\s+\S+\s+\S+\s+\S+\s+"
                 r"(?P<name>\S.*)$")


def nvprof_gpu_parts(path) -> dict[str, int]:
    """GPU time (ns) per part from the 'GPU activities' rows: kernels, or the copy direction / memset."""
    parts: dict[str, int] = {}
    in_gpu = False
    for line in path.read_text().splitlines():
        if "GPU activities:" in line:
            in_gpu = True
        elif "API calls:" in line or not line.strip():
            in_gpu = False
        if not in_gpu:
            continue
        m = ROW.match(line)
        assert m, line
        ns = int(Decimal(m["time"]) * UNIT_NS[m["unit"]])
        name = m["name"]
        copy = re.match(r"\[CUDA memcpy (\w+)\]", name)
        part = copy.group(1) if copy else "memset" if name == "[CUDA memset]" else "kernels"
        parts[part] = parts.get(part, 0) + ns
    return parts


def analyze(store, path, *args) -> dict:
    code, out, err = run_cli("--store", str(store), "analyze", str(path), "--json", *args)
    assert code == 0, err
    return json.loads(out)


def finding(doc: dict, rule: str) -> dict:
    (found,) = [f for f in doc["findings"] if f["rule"] == rule]
    return found


def test_a_copy_bound_summary_names_copies_as_the_bottleneck(tmp_path):
    raw = nvprof_gpu_parts(COPY_BOUND)
    total = sum(raw.values())
    copies = raw["HtoD"] + raw["DtoH"]
    assert 66 < 100 * copies / total < 68  # the case of issue 21: host-device copies 67% of GPU time
    doc = analyze(tmp_path, COPY_BOUND)
    (summary,) = doc["summary"]
    assert summary["gpu_time"]["total_ns"] == total
    assert {p["part"]: p["time_ns"] for p in summary["gpu_time"]["parts"]} == raw
    assert sum(p["share_pct"] for p in summary["gpu_time"]["parts"]) == pytest.approx(100, abs=1e-3)
    assert summary["bottleneck"]["rule"] == "copy-dominated"
    # summary rows cannot say which copies ran at once: named the bottleneck, with no time lost claimed
    assert summary["bottleneck"]["impact_ns"] is None and summary["bottleneck"]["share_pct"] is None
    f = finding(doc, "copy-dominated")
    assert f["metrics"]["exposed_copy_ns"] is None and f.get("impact_ns") is None
    assert f["severity"] == "warning"
    assert f["metrics"]["copy_time_ns"] == copies and f["metrics"]["gpu_time_ns"] == total
    assert f["metrics"]["copy_pct"] == round(100 * copies / total, 4)
    assert f["metrics"]["aggregated"] is True


def test_the_real_nvprof_summary_splits_gpu_time_and_the_threshold_is_settable(tmp_path):
    raw = nvprof_gpu_parts(REAL)
    assert set(raw) == {"kernels", "HtoD"}
    total = sum(raw.values())
    doc = analyze(tmp_path, REAL)
    (summary,) = doc["summary"]
    assert {p["part"]: p["time_ns"] for p in summary["gpu_time"]["parts"]} == raw
    f = finding(doc, "copy-dominated")
    share = round(100 * raw["HtoD"] / total, 4)
    assert f["metrics"]["copy_pct"] == share and share < 50
    assert f["severity"] == "info" and f.get("impact_ns") is None  # under the default 50%: nothing at stake
    lowered = analyze(tmp_path, REAL, "--set", "copy-dominated.warning_pct=20")
    f = finding(lowered, "copy-dominated")
    assert f["severity"] == "warning" and f.get("impact_ns") is None  # summary rows: what was hidden is unknown
    # api-share's 5.5 s of cudaMalloc is one call, the CUDA context's creation: no warning, nothing at stake; the
    # copies are named the bottleneck, with no time lost claimed
    api = finding(lowered, "api-share")
    assert api["severity"] == "info" and api.get("impact_ns") is None and api["metrics"]["context_creation_ns"] > 0
    assert lowered["summary"][0]["bottleneck"]["rule"] == "copy-dominated"
    assert lowered["summary"][0]["bottleneck"]["impact_ns"] is None


def test_nsys_summary_reports_split_gpu_time_by_copy_direction(tmp_path):
    kern = NSYS / "resnet18_bs8_cuda_gpu_kern_sum.csv"
    mem = NSYS / "resnet18_bs8_cuda_gpu_mem_time_sum.csv"
    with kern.open() as f:
        kernels = sum(int(r["Total Time (ns)"]) for r in csv.DictReader(f))
    direction = {"Host-to-Device": "HtoD", "Device-to-Host": "DtoH", "Device-to-Device": "DtoD"}
    raw = {"kernels": kernels}
    with mem.open() as f:
        for r in csv.DictReader(f):
            m = re.match(r"\[CUDA memcpy (.+)\]", r["Operation"])
            part = direction[m.group(1)] if m else "memset" if r["Operation"] == "[CUDA memset]" else None
            assert part, r["Operation"]
            raw[part] = raw.get(part, 0) + int(r["Total Time (ns)"])
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(kern), str(mem), "--json")
    assert code == 0, err
    (summary,) = json.loads(out)["summary"]
    assert {p["part"]: p["time_ns"] for p in summary["gpu_time"]["parts"]} == raw
    copies = sum(v for k, v in raw.items() if k not in ("kernels", "memset"))
    f = finding(json.loads(out), "copy-dominated")
    assert f["metrics"]["copy_time_ns"] == copies


def test_the_panel_shows_the_split_and_says_kernel_shares_are_of_kernel_time(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(COPY_BOUND))
    assert code == 0, err
    code, doc, err = run_cli("--store", str(tmp_path), "analyze", str(COPY_BOUND), "--json")
    (summary,) = json.loads(doc)["summary"]
    split = ", ".join(f"{p['part']} {p['share_pct']:.1f}%" for p in summary["gpu_time"]["parts"])
    assert split == "HtoD 44.8%, kernels 33.0%, DtoH 22.2%"
    flat = " ".join(out.replace("│", " ").split())  # the panel may wrap the row at 80 columns
    assert f"GPU time {fmt_ns(summary['gpu_time']['total_ns'])} summed over activities: {split}" in flat
    assert "of kernel time" in out
    b = summary["bottleneck"]
    assert summary["span_ns"] is None  # a summary has no timeline: no share of a span to give
    assert b["impact_ns"] is None
    assert (f"bottleneck {b['title']}, time lost unknown (the trace gives totals only) (copy-dominated, "
            f"{b['severity']})") in " ".join(out.replace("│", " ").split())


def test_copies_summed_over_streams_are_no_time_lost(tmp_path):
    """A real `nsys profile --stats=true` console report (H200, 64 MiB copies on four streams at once:
    fixtures/make_nsys_stats_streams.sh): its HtoD and DtoH copies sum to more than the whole profiled loop (its
    NVTX range), as in a user's vector-add tutorial where the summary called 3.303 s of a 2.119 s loop lost.
    Nothing in the file says which copies ran at once: copies are named the bottleneck, with no time lost."""
    path = NSYS / "streams" / "streams_stats_console.txt"
    text = path.read_text()
    loop = int(re.search(r"^\s*100\.0\s+([\d,]+)\s+1\s.*:streamed_loop", text, re.M).group(1).replace(",", ""))
    copies = sum(int(m.group(1).replace(",", "")) for m in re.finditer(
        r"^\s*[\d.]+\s+([\d,]+)\s+\d[\d,]*\s.*\[CUDA memcpy (?:Host-to-Device|Device-to-Host)\]", text, re.M))
    assert copies > loop  # the summed copy time is longer than the whole loop
    doc = analyze(tmp_path, path)
    (summary,) = doc["summary"]
    assert summary["bottleneck"]["rule"] == "copy-dominated" and summary["bottleneck"]["impact_ns"] is None
    f = finding(doc, "copy-dominated")
    assert f["metrics"]["copy_time_ns"] == copies and f["metrics"]["exposed_copy_ns"] is None
    assert not [x["rule"] for x in doc["findings"] if x["rule"] != "api-share" and (x.get("impact_ns") or 0) > loop]


def test_copies_at_once_on_two_streams_are_lost_once(tmp_path):
    """Hand-written after pytorch/benchmark's pinned copy benchmark (an A100, HtoD on one stream while DtoH runs
    on another): the exposed copy time summed both streams, 483.3 ms "lost, 100.0% of the span" of a 307.8 ms
    trace. The time the GPU copies while no kernel runs is the union of the copies, less the kernels."""
    def copy(name, ts, dur, stream, kind):
        return {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": ts, "bytes": 1 << 26,
                         "memory bandwidth (GB/s)": 10.0}}
    events = [copy("Memcpy HtoD (Pinned -> Device)", 0, 30_000, 22, 1),
              copy("Memcpy DtoH (Device -> Pinned)", 5_000, 20_000, 20, 2),
              copy("Memcpy HtoD (Pinned -> Device)", 40_000, 30_000, 22, 1),
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 60_000, "dur": 20_000,
               "args": {"device": 0, "stream": 7, "correlation": 9}}]
    path = tmp_path / "copies.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    doc = analyze(tmp_path / "store", path)
    found = finding(doc, "copy-dominated")
    span_ns = doc["summary"][0]["span_ns"]
    assert span_ns == 80_000_000
    assert found["metrics"]["copy_time_ns"] == 80_000_000            # summed: 30 + 20 + 30 ms
    assert found["metrics"]["exposed_copy_ns"] == 50_000_000         # union 0-30, 40-70 ms, less the kernel's 60-70
    assert found["impact_ns"] == 50_000_000 <= span_ns
    overlap = finding(doc, "low-memcpy-overlap")
    assert overlap["metrics"]["memcpy_time_ns"] == 80_000_000 and overlap["metrics"]["overlapped_ns"] == 10_000_000
    assert overlap["impact_ns"] == 50_000_000  # graded (copies 4× the kernel time), lost once


def test_copies_with_no_kernel_have_nothing_to_overlap_with(tmp_path):
    """A copy benchmark (no kernel at all) was told to overlap its copies with compute it does not have."""
    events = [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": s,
               "ts": ts, "dur": 10_000, "args": {"device": 0, "stream": s, "correlation": ts, "bytes": 1 << 26}}
              for ts, s in ((0, 22), (5_000, 20))]
    path = tmp_path / "copies.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    overlap = finding(analyze(tmp_path / "store", path, "--all"), "low-memcpy-overlap")
    assert overlap["severity"] == "info" and overlap["impact_ns"] is None and not overlap["suggestion"]  # none lost
    assert overlap["message"].endswith("no kernel runs, so there is nothing for the copies to overlap with.")


@pytest.mark.parametrize("source", ["Pinned", "Pageable", "Host"])
def test_slow_copies_from_pinned_memory_are_not_told_to_pin(tmp_path, source):
    """pytorch/benchmark's copy benchmark copies from pinned memory on streams of their own: low-memcpy-throughput
    still advised pinning them. Copies whose host memory the trace does not name (ROCm's "Host", as nsys's summary
    tables and rocprofv3's rows name none) are not said to be pinned already: they were."""
    events = [{"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy HtoD ({source} -> Device)", "pid": 0, "tid": 7,
               "ts": ts, "dur": 1000, "args": {"device": 0, "stream": 7, "correlation": ts, "bytes": 1_000_000}}
              for ts in (0, 2000)]
    path = tmp_path / "copies.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    found = finding(analyze(tmp_path / "store", path, "--all"), "low-memcpy-throughput")
    assert found["severity"] != "info"  # 1 GB/s of a 15.75 GB/s link
    pinned = found["suggestion"].startswith("The copies are from and to pinned memory already: merge small copies")
    assert pinned == (source == "Pinned")
    assert found["suggestion"].endswith("set low-memcpy-throughput.host_link_gbps.")
