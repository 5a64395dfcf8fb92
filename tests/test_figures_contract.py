"""No figure larger than the whole it is part of, on every shared run and trace (issue: figures a user can trust).

Every rule's findings of ``analyze --json --all`` on the shared runs (gloo, real NCCL), the fixtures' runs (the
DDP twins among them) and single traces of every reader (the shared ones; JAX, execution-trace pairs, nsys
export directories, an .ncu-rep, ROCm, nvprof, TAU from the fixtures) are checked against bounds that hold by
definition: a share is 0–100 and the shares of one
table add up to 100; a rank waits no longer than its step time; the time at stake is never longer than the
trace (per rank on a run); a time summed over a trace's devices or threads is never longer than the span
times their number. Then the figures of a run are checked against the raw rank files: the kernel
categories' shares of the run's kernel time, the same in the summary, the message and the table, each name
listed once.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import FIXTURES, REPO, cut_run, hamilton, run_cli, us_to_ns
from traceparse import expr

SHARED = REPO.parent / "shared" / "samples"
#: Runs: the shared gloo runs and the fixtures' (gloo, NCCL, the DDP twins of a slow loader and a slow hook).
RUNS = [p for p in [*(SHARED / "multirank").glob("*"), *(FIXTURES / "torch" / "multirank").glob("*"),
                    FIXTURES / "torch" / "hta" / "trace_filter"] if p.is_dir()]
ET = FIXTURES / "torch" / "execution_trace"
NCU_REP = FIXTURES / "ncu" / "ncu_vgg11_bs16.ncu-rep.xz"
#: Single traces of every reader, the newer forms included: JAX (xplane), PyTorch execution traces with their
#: Kineto traces (one case, two files), nsys export directories (Parquet, Arrow), an .ncu-rep report (xz here,
#: unpacked for the reader; it needs NVIDIA's ncu_report), ROCm, nvprof, TAU.
TRACES = [p for p in [*(SHARED / "torch").glob("*.json.gz"), SHARED / "nsys" / "resnet18_bs16.sqlite.gz",
                      *(SHARED / "ncu").glob("*.csv"), FIXTURES / "torch" / "rocm" /
                      "hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                      *sorted((FIXTURES / "torch" / "rocm").glob("tracelens_*.json.gz")),
                      FIXTURES / "jax" / "jax_mlp", FIXTURES / "jax" / "jax_gpt",
                      *sorted(p for p in (FIXTURES / "jax" / "public").glob("*") if p.is_dir()),
                      (ET / "et_resnet18_bs16_et.json.gz", ET / "et_resnet18_bs16_kineto.json.gz"),
                      (ET / "et_gpt_bs8_et.json.gz", ET / "et_gpt_bs8_kineto.json.gz"),
                      *sorted((FIXTURES / "nsys" / "export").glob("*dir")), FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz",
                      NCU_REP, FIXTURES / "nvprof" / "real" / "rlscope_gpu_trace.csv", FIXTURES / "tau" / "real" / "cpi-mpi",
                      FIXTURES / "tau" / "real" / "apex-cuda",
                      # real traces of other builds: PyTorch 1.8's bare array, a torch.compile trace with text
                      # grids, CUPTI range-profiler events
                      FIXTURES / "torch" / "kineto" / "resnet50_pt18_prerelease.pt.trace.json.gz",
                      *sorted((FIXTURES / "torch" / "hta").glob("*.json.gz")),
                      FIXTURES / "jax" / "tpu" / "xprof_tpu_inference_2" / "tpu_inference_2.xplane.pb"]
          if all(q.exists() for q in (p if isinstance(p, tuple) else (p,)))]


class Cut(NamedTuple):
    """A run with a rank's file cut short (a profiler killed mid-write): ``rank`` (None: every rank) cut at ``keep``
    of its bytes. Made from the real run ``source`` when the case is analyzed."""

    source: Path
    rank: int | None
    keep: float


#: Every multi-rank fixture with rank 0 cut at 60% of its bytes, and every rank cut at 70%: what was read is
#: bound by the same wholes (a cut rank's partial GPU record read as a GPU 67% idle, its collectives as another
#: rank's critical straggler).
CUTS = [Cut(p, rank, keep) for p in RUNS if sorted(p.glob("rank*.json.gz")) for rank, keep in ((0, 0.6), (None, 0.7))]
CASES = RUNS + TRACES + CUTS


def analyzed(case: Path | tuple[Path, ...], store: Path) -> dict:
    """``analyze --json --all`` of one case (a path, or the files of one trace); None for an .ncu-rep report where
    NVIDIA's ncu_report is not installed."""
    if isinstance(case, Cut):
        case = cut_run(case.source, store.parent / f"{case.source.name}_cut{'all' if case.rank is None else case.rank}",
                       case.rank, case.keep)
    paths = list(case) if isinstance(case, tuple) else [case]
    if paths == [NCU_REP]:
        try:
            import ncu_report  # noqa: F401 - NVIDIA's module, an extra: traceparse[ncu]
        except ImportError:
            return None
        paths = [store.parent / NCU_REP.name.removesuffix(".xz")]
        with lzma.open(NCU_REP) as src, open(paths[0], "wb") as dst:
            shutil.copyfileobj(src, dst)
    code, out, err = run_cli("--store", str(store), "analyze", *map(str, paths), "--json", "--all")
    assert code == 0, err
    return json.loads(out)


def _name(case: Path | tuple[Path, ...] | Cut) -> str:
    if isinstance(case, Cut):
        return f"{case.source.name} cut {'every rank' if case.rank is None else f'rank {case.rank}'}"
    path = case[0] if isinstance(case, tuple) else case
    return f"{path.parent.name}/{path.name}"


def _walk(x, path, visit):
    visit(x, path)
    if isinstance(x, dict):
        for k, v in x.items():
            _walk(v, f"{path}.{k}", visit)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _walk(v, f"{path}[{i}]", visit)


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    return {case: analyzed(case, tmp_path_factory.mktemp("store")) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_no_share_outside_0_100_and_the_shares_of_a_table_add_up_to_100(documents, case):
    doc = documents[case] or pytest.skip("ncu_report is not installed: pip install 'traceparse[ncu]'")
    bad = []

    def visit(x, path):
        if isinstance(x, dict):
            shares = [v["share_pct"] for v in x.values() if isinstance(v, dict) and isinstance(v.get("share_pct"), float)]
            if len(shares) >= 2 and abs(sum(shares) - 100) > 0.001 * len(shares):
                bad.append(f"{path}: shares add up to {sum(shares)}")
            for k, v in x.items():
                if re.search(r"(share|pct)$", k) and isinstance(v, (int, float)) and not -1e-9 <= v <= 100 + 1e-9:
                    bad.append(f"{path}.{k} = {v}")

    for f in doc["findings"]:
        _walk(f["metrics"], f["rule"], visit)
        _walk(f["items"], f["rule"] + ".items", visit)
    assert bad == []


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_no_wait_longer_than_the_step_and_no_time_longer_than_its_whole(documents, case):
    doc = documents[case] or pytest.skip("ncu_report is not installed: pip install 'traceparse[ncu]'")
    if all(summary["span_ns"] is None for summary in doc["summary"]):
        pytest.skip("nothing timed (an ncu report)")
    for summary in doc["summary"]:  # a folder of several profiling windows: a run each, with its own findings
        _within_wholes(summary, [f for f in doc["findings"] if f["trace"] == summary["trace"]])


def _within_wholes(summary: dict, findings: list[dict]) -> None:
    """No figure of one trace's (or run's) findings longer than the whole it is part of."""
    span = summary["span_ns"]
    # a time summed over the trace's timelines (devices, ranks, threads) is at most span × their number
    timelines = max([summary["ranks"], 1] + [len(f["metrics"]["devices"]) for f in findings
                                              if isinstance(f["metrics"].get("devices"), dict)]
                    + [f["metrics"]["threads"] for f in findings if isinstance(f["metrics"].get("threads"), int)])
    bad = []
    for f in findings:
        if f["impact_ns"] is not None and f["impact_ns"] > span:  # per rank on a run: never longer than the run
            bad.append(f"{f['rule']}: at stake {f['impact_ns']} > span {span}")
        whole = f["impact_whole"]  # the whole the time at stake is part of: made per rank with it on a run
        if whole and not (f["impact_ns"] or 0) <= whole["ns"] <= span:
            bad.append(f"{f['rule']}: at stake {f['impact_ns']} of {whole}, span {span}")
        if whole and f["rule"] == "gpu-idle" and f["impact_ns"]:  # its share of that whole is the idle share
            if abs(100 * f["impact_ns"] / whole["ns"] - f["metrics"]["idle_pct"]) > 0.01:
                bad.append(f"gpu-idle: {f['impact_ns']} of {whole} is not {f['metrics']['idle_pct']}%")
        for rank, row in (f["metrics"].get("ranks") or {}).items():
            if isinstance(row, dict) and "waited_ns" in row and row["waited_ns"] > row["step_ns"]:
                bad.append(f"{f['rule']}: rank {rank} waited {row['waited_ns']} > its step {row['step_ns']}")

        def visit(x, path):
            if isinstance(x, dict):
                for k, v in x.items():
                    if k.endswith("_ns") and isinstance(v, int) and v > span * timelines:
                        bad.append(f"{path}.{k} = {v} > {timelines} × span {span}")

        _walk(f["metrics"], f["rule"], visit)
        if f["title"] == "Hotspots per thread":  # one thread's time is at most the span (a TPU's async copies,
            for item in f["items"]:             # overlapping on their lane, summed to twice the span)
                if item["time_ns"] > span:
                    bad.append(f"hotspots per thread: {item['thread']} {item['name']} {item['time_ns']} > span {span}")
    worst = summary["bottleneck"]
    if worst and not 0 <= worst["share_pct"] <= 100:
        bad.append(f"bottleneck: {worst}")
    assert bad == []


# -- a run's figures against the raw rank files -------------------------------------------------------------------
SLOW = [p for p in RUNS if p.name.endswith("slow_rank2")]


def raw_kernels(folder: Path) -> list[tuple[int, str, int]]:
    """(rank, kernel name, duration ns) of every kernel of every rank file."""
    out = []
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        for e in json.load(gzip.open(path))["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                out.append((rank, e["name"], us_to_ns(e["dur"])))
    return out


@pytest.mark.parametrize("folder", SLOW, ids=_name)
def test_a_runs_kernel_shares_are_of_the_runs_kernel_time_everywhere(documents, folder):
    kernels = raw_kernels(folder)
    total = sum(d for _, _, d in kernels)
    by_category: dict[str, int] = {}
    for _, name, d in kernels:
        category = next((label for label, pattern in expr.kernel_categories() if re.search(pattern, name.lower())),
                        expr.OTHER_CATEGORY)
        by_category[category] = by_category.get(category, 0) + d
    want = {c: round(100.0 * t / total, 4) for c, t in by_category.items()}
    doc = documents[folder]
    (share,) = [f for f in doc["findings"] if f["rule"] == "kernel-share"]
    got = {c: row["share_pct"] for c, row in share["metrics"]["categories"].items()}
    assert got == want and abs(sum(got.values()) - 100) < 0.001
    assert share["metrics"]["kernel_time_ns"] == total
    assert all(row["ranks"] == 4 for row in share["metrics"]["categories"].values())
    # one figure per quantity: the summary, the message and the table agree
    top = doc["summary"][0]["top_categories"]
    assert [(c["category"], c["share_pct"]) for c in top] == sorted(want.items(), key=lambda kv: -kv[1])[:3]
    shown = hamilton(list(want.values()))  # as every place shows them: rounded together, adding up to 100
    assert [c["shown_pct"] for c in top] == [shown[list(want).index(c["category"])] for c in top]
    lead = top[0]
    named = "kernels of no known category" if lead["category"] == "other" else f"{lead['category']} kernels"
    assert f"{named} take {lead['shown_pct']:.1f}%" in share["message"]
    # each kernel once, with the ranks it ran on and its time summed over them
    names = [i["name"] for i in share["items"]]
    assert len(names) == len(set(names))
    for item in share["items"]:
        per_rank = {}
        for rank, name, d in kernels:
            if name == item["name"]:
                per_rank[rank] = per_rank.get(rank, 0) + d
        assert item["time_ns"] == sum(per_rank.values()) and item["ranks"] == len(per_rank)
        mean = sum(per_rank.values()) / len(per_rank)
        assert item["rank_imbalance"] == round(max(per_rank.values()) / mean, 4)


@pytest.mark.parametrize("folder", SLOW, ids=_name)
def test_the_summary_of_a_slow_run_names_the_straggler(documents, folder):
    doc = documents[folder]
    (summary,) = doc["summary"]
    (straggler,) = [f for f in doc["findings"] if f["rule"] == "stragglers"]
    assert straggler["metrics"]["straggler_rank"] == 2
    (line,) = [h for h in summary["highlights"] if h["rule"] == "stragglers"]
    per_step = straggler["metrics"]["wait_caused_per_step_ns"]
    assert line["label"] == "straggler" and line["text"].startswith("rank 2: the others wait ")
    # 3 other ranks, 3 steps
    assert per_step == round(straggler["metrics"]["wait_caused_ns"] / 3 / 3)
    assert summary["bottleneck"]["impact_ns"] <= summary["span_ns"]


def test_the_run_report_lists_the_worst_rows_and_one_for_the_rest(tmp_path):
    folder = SLOW[0] if SLOW else pytest.skip("no slow-rank run")
    code, out, err = run_cli("--store", str(tmp_path), "--width", "120", "analyze", str(folder),
                             "--rule", "gpu-idle", "--rows", "3")
    assert code == 0, err
    doc = analyzed(folder, tmp_path)
    (idle,) = [f for f in doc["findings"] if f["rule"] == "gpu-idle"]
    streams = idle["metrics"]["streams"]
    shown = [line for line in out.splitlines() if re.search(r"│\s+rank \d:\d+:\d+\s", line)]
    assert len(shown) == 3 and f"({len(streams) - 3} more, max)" in out
    worst = sorted(streams.values(), key=lambda r: -r["idle_ns"])[:3]
    assert [r["idle_ns"] for r in list(streams.values())[:3]] == [r["idle_ns"] for r in worst]
