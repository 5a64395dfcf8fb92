"""One label, one figure: on one trace's screen no two figures of different values share a label, and a zero count
of rows a rule could not use is not shown (JSON keeps it).

The README's main example once said "span 33.13 ms" (gpu-idle: first to last GPU activity) under a summary saying
"span 33.39 ms" (the trace). Both spans are computed here from the raw JSON; then every figure label of the summary
and of every finding's figure grid is collected from ``analyze --json --all`` on traces of every format and on a
run, and each label must carry one value.
"""

from __future__ import annotations

import io
import json
import re
from collections import defaultdict

import pytest
from rich.console import Console

from helpers import FIXTURES, REPO, raw_events, run_cli, us_to_ns
from traceparse.report import fmt_ns, shown_figures, summary_panel
from traceparse.rule import Finding
from traceparse.verdict import Column

README_TRACE = FIXTURES / "torch" / "resnet18_bs16.json.gz"
SHARED = REPO.parent / "shared" / "samples"
ET = FIXTURES / "torch" / "execution_trace"
#: Traces of every format and runs: (paths of one analyze); a missing shared sample is left out.
CASES = [c for c in [(README_TRACE,), (FIXTURES / "torch" / "vgg16_bs16.json.gz",),
                     (FIXTURES / "torch" / "multigpu" / "dp2_resnet18_bs16.json.gz",),
                     (FIXTURES / "torch" / "rocm" / "tracelens_mi300x_vf_bert_small.json.gz",),
                     (ET / "et_resnet18_bs16_et.json.gz", ET / "et_resnet18_bs16_kineto.json.gz"),
                     (FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz",),
                     (FIXTURES / "nsys" / "export" / "resnet18_bs8_export.parquetdir",),
                     (FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv",), (FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv",),
                     (FIXTURES / "nvprof" / "real" / "cudajl_gpu_trace.log",),
                     (FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log",),
                     (FIXTURES / "tau" / "real" / "cpi-mpi",), (FIXTURES / "tau" / "real" / "apex-cuda",),
                     (FIXTURES / "torch" / "multirank" / "ddp4_slow_loader",),
                     (FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1",),
                     (FIXTURES / "jax" / "jax_mlp",), (FIXTURES / "jax" / "jax_gpt",),
                     (SHARED / "torch" / "resnet50_bs32_memory.json.gz",),
                     (SHARED / "torch" / "resnet18_bs32_compiled_cudagraphs.json.gz",)] if all(p.exists() for p in c)]


def analyzed(paths, tmp_path) -> dict:
    code, out, err = run_cli("--store", str(tmp_path), "analyze", *map(str, paths), "--json", "--all")
    assert code == 0, err
    return json.loads(out)


def finding(d: dict) -> Finding:
    """A finding of ``analyze --json`` as the object the renderer draws."""
    return Finding(d["rule"], d["severity"], d["title"], d["message"], d["suggestion"], d["metrics"], d["items"],
                   d["trace"], [Column(**c) for c in d["columns"]], d["figures"], {}, d["labels"], d["impact_ns"])


def summary_rows(summary: dict, findings: list[Finding]) -> list[tuple[str, str]]:
    """The summary panel's rows as drawn (label, the figure its text opens with: "2" of "2 (ProfilerStep#N), …")."""
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(summary_panel(summary, findings))
    rows = []
    for line in console.export_text().splitlines():
        m = re.fullmatch(r"│ (\S+(?: \S+)*?) {2,}(.*?) *│", line)
        if m:
            rows.append((m[1], re.split(r",|: | \(", m[2])[0]))
    return rows


def raw_spans(path) -> tuple[int, int]:
    """(the trace's span over its timed events, the GPU's first to last activity), ns, from the raw JSON: the
    profiler's own ``Trace`` span is not an event of the trace."""
    events = [e for e in raw_events(path) if e.get("cat") != "Trace"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def span(es):
        return max(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in es) - min(us_to_ns(e["ts"]) for e in es)

    return span(events), span(gpu)


def test_the_readme_example_names_the_trace_span_and_the_gpu_span_apart(tmp_path, monkeypatch):
    trace_span, gpu_span = raw_spans(README_TRACE)
    assert fmt_ns(trace_span) != fmt_ns(gpu_span)  # 33.39 ms and 33.13 ms: two spans, so two names
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(README_TRACE))
    assert code == 0, err
    labels = {m[1]: m[2] for m in re.finditer(r"(?:│ |  )(span|GPU span) +(\d[\d.]* m?s)", out)}
    # the GPU's span in gpu-idle's sentence (its figure is not shown a second time), never labelled "span"
    assert labels == {"span": fmt_ns(trace_span)}
    assert f"of {fmt_ns(gpu_span)} between first and last" in out
    assert "untimed rows" not in out  # zero rows left out: nothing to say
    doc = analyzed([README_TRACE], tmp_path)
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")
    assert idle["metrics"]["span_ns"] == gpu_span and doc["summary"][0]["span_ns"] == trace_span
    assert idle["metrics"]["untimed_rows"] == 0 and idle["figures"]["untimed_rows"] == "problem_count"  # JSON keeps it


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].parent.name}/{c[0].name}")
def test_no_two_figures_of_one_screen_share_a_label(tmp_path, case):
    doc = analyzed(case, tmp_path)
    findings = [finding(d) for d in doc["findings"]]
    for summary in doc["summary"]:
        mine = [f for f in findings if f.trace == summary["trace"]]
        seen = defaultdict(set)
        for label, value in summary_rows(summary, mine):
            seen[label].add((value, "summary"))
        for f in mine:
            for label, value in shown_figures(f):
                seen[label].add((value, f.rule))
        clashes = {label: sorted(v) for label, v in seen.items() if len({value for value, _ in v}) > 1}
        assert clashes == {}


def test_a_zero_problem_count_is_left_off_the_screen_and_a_non_zero_one_shown():
    f = Finding("r", "info", "t", "m", metrics={"skipped_rows": 0, "copies": 0, "span_ns": 5},
                figures={"skipped_rows": "problem_count", "copies": "count", "span_ns": "ns"},
                labels={"span_ns": "GPU span"})
    assert shown_figures(f) == [("copies", "0"), ("GPU span", "5 ns")]
    f.metrics["skipped_rows"] = 1234
    assert shown_figures(f)[0] == ("skipped rows", "1,234")


@pytest.mark.parametrize("paths, whole", [((README_TRACE,), "the GPU's span"),
                                          ((FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1",),
                                           "the mean GPU's span")])
def test_gpu_busy_and_gpu_idle_name_one_whole_alike(tmp_path, paths, whole):
    """GPU busy (100 × Σ busy / Σ span over devices) and gpu-idle's idle share add up to 100 of one whole: the
    summary says it in gpu-idle's words ("the devices' span" beside "the GPU's span" read as two wholes)."""
    doc = analyzed(paths, tmp_path)
    summary = doc["summary"][0]
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")
    assert summary["gpu_devices"] == (1 if whole == "the GPU's span" else 2)
    assert round(summary["gpu_busy_pct"] + idle["metrics"]["idle_pct"], 6) == 100
    findings = [finding(d) for d in doc["findings"]]
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(summary_panel(summary, findings))
    assert f"{summary['gpu_busy_pct']:.1f}% of {whole} (first to last activity)" in console.export_text()
    if summary.get("bottleneck", {}).get("rule") == "gpu-idle":
        assert summary["bottleneck"]["whole"] == whole


def test_the_summary_says_its_gpu_time_is_a_sum_beside_gpu_idles_busy_union(tmp_path):
    """The summary's "GPU time" adds the activities' durations (overlapping kernels count twice); gpu-idle's
    "GPU busy time" is their union. Side by side on one screen (9.553 ms against 9.541 ms on the README's trace) the two
    read as one figure given twice, unless the first says it is a sum: it does, and it is never the smaller."""
    doc = analyzed((README_TRACE,), tmp_path)
    summary = doc["summary"][0]
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")
    summed, busy = summary["gpu_time"]["total_ns"], idle["metrics"]["busy_ns"]
    assert summed > busy  # the README's trace has overlapping activities
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(summary_panel(summary, [finding(d) for d in doc["findings"]]))
    assert f"GPU time     {fmt_ns(summed)} summed over activities: kernels" in console.export_text()

