"""``traceparse compare`` on the real ResNet18 batch sweep (fixtures/torch), checked against sums made here
with the json module straight from the trace files."""

from __future__ import annotations

import gzip
import json
import re
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli, us_to_ns as _ns

BATCHES = (4, 8, 16, 32, 64)
SWEEP = {b: FIXTURES / "torch" / f"resnet18_bs{b}.json.gz" for b in BATCHES}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]


def _independent(path: Path, kernel_pattern: str, api_pattern: str) -> dict:
    """The figures compare reports, computed here from the raw JSON (exact decimals)."""
    events = _events(path)
    time = {c: sum(_ns(e["dur"]) for e in events if e.get("cat") == c) for c in (*GPU_CATS, *API_CATS)}
    gpu = time["kernel"] + time["gpu_memcpy"] + time["gpu_memset"]
    api = time["cuda_runtime"] + time["cuda_driver"]
    matched_kernels = sum(_ns(e["dur"]) for e in events
                          if e.get("cat") == "kernel" and re.search(kernel_pattern, e["name"], re.I))
    matched_api = sum(_ns(e["dur"]) for e in events
                      if e.get("cat") in API_CATS and re.search(api_pattern, e["name"], re.I))
    span = idle = 0
    devices = {e["args"].get("device") for e in events if e.get("cat") in GPU_CATS}
    for device in devices:  # union of half-open intervals per device, by a plain sweep
        spans = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events
                       if e.get("cat") in GPU_CATS and e["args"].get("device") == device)
        busy, cur_start, cur_end = 0, spans[0][0], spans[0][1]
        for s, t in spans[1:]:
            if s > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = s, t
            else:
                cur_end = max(cur_end, t)
        busy += cur_end - cur_start
        first, last = spans[0][0], max(t for _, t in spans)
        span += last - first
        idle += last - first - busy
    return {"kernel_ns": time["kernel"], "memcpy_ns": time["gpu_memcpy"], "memset_ns": time["gpu_memset"],
            "api_ns": api, "gpu_ns": gpu, "span_ns": span, "idle_ns": idle, "idle_pct": 100.0 * idle / span,
            "kernel_share": 100.0 * matched_kernels / gpu, "api_share": 100.0 * matched_api / api}


def _ingest(path: Path, **tags) -> str:
    args = ["ingest", str(path), "-q", "--json"]
    for key, value in tags.items():
        args += ["--tag", f"{key}={value}"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    return json.loads(out)["traces"][0]["id"]


@pytest.fixture
def sweep_ids(store) -> dict[int, str]:
    return {b: _ingest(p, batch=b, model="resnet18") for b, p in SWEEP.items()}


def test_rows_follow_the_tag_numerically_and_match_independent_sums(sweep_ids):
    shuffled = [sweep_ids[b] for b in (64, 4, 32, 8, 16)]
    code, out, err = run_cli("compare", *shuffled, "--by", "batch", "--kernel", "max_pool_backward",
                             "--api", "cudaLaunchKernel", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["tags"]["batch"] for r in rows] == ["4", "8", "16", "32", "64"]  # not "16" < "4"
    assert [r["trace"] for r in rows] == [sweep_ids[b] for b in BATCHES]
    for batch, row in zip(BATCHES, rows):
        m = row["metrics"]
        ref = _independent(SWEEP[batch], "max_pool_backward", "cudaLaunchKernel")
        for key in ("kernel_ns", "memcpy_ns", "memset_ns", "api_ns", "gpu_ns", "span_ns", "idle_ns"):
            assert m[key] == ref[key], (batch, key)
        assert m["idle_pct"] == pytest.approx(ref["idle_pct"], abs=1e-3)
        assert m["kernel_pattern_pct"]["max_pool_backward"] == pytest.approx(ref["kernel_share"], abs=1e-3)
        assert m["api_pattern_pct"]["cudaLaunchKernel"] == pytest.approx(ref["api_share"], abs=1e-3)
        assert 0 < m["kernel_pattern_pct"]["max_pool_backward"] < 10
        assert sum(m["category_pct"].values()) == pytest.approx(100.0, abs=1e-2)


def test_figures_are_the_rules_figures(sweep_ids):
    """compare reuses the rules: its figures are exactly what `analyze --json` reports for each trace."""
    code, out, err = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--json")
    assert code == 0, err
    for row in json.loads(out)["rows"]:
        code, out2, err = run_cli("analyze", row["trace"], "--json", "--rule", "gpu-idle", "--rule",
                                  "low-memcpy-overlap", "--rule", "low-kernel-concurrency", "--rule", "kernel-share")
        assert code == 0, err
        found = {f["rule"]: f["metrics"] for f in json.loads(out2)["findings"]}
        m = row["metrics"]
        assert m["overlap_pct"] == found["low-memcpy-overlap"]["overlap_pct"]
        assert m["concurrency_pct"] == found["low-kernel-concurrency"]["concurrency_pct"]
        assert m["idle_pct"] == found["gpu-idle"]["idle_pct"]
        assert m["category_pct"] == {c: v["share_pct"] for c, v in found["kernel-share"]["categories"].items()}


def test_idle_share_falls_as_the_batch_grows(sweep_ids):
    """The seed study's trend on this GPU: the larger the batch, the less the GPU waits for the host."""
    code, out, _ = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--json")
    idle = [r["metrics"]["idle_pct"] for r in json.loads(out)["rows"]]
    assert idle == sorted(idle, reverse=True)
    assert idle[0] > 80 and idle[-1] < 40


def test_terminal_tables_have_one_row_per_trace_and_cut_no_column(sweep_ids):
    """At the 80 columns of a non-terminal, bar columns that do not fit go to a second table, never off the edge."""
    code, out, err = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--kernel", "max_pool_backward")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    for header in ("GPU idle", "kernel concurrency", "memcpy overlap", "kernel /max_pool_backward/",
                   "normalization", "convolution", "gemm", "elementwise", "pooling", "reduction/softmax",
                   "layout/copy", "optimizer"):
        assert header in out
    assert "█" in out
    for batch in BATCHES:  # one row per trace in each of the 5 tables (categories need two at 80 columns)
        assert len(re.findall(rf"^ {batch}\s", out, flags=re.M)) == 5


def test_a_trace_without_the_tag_is_an_error(store):
    tagged = _ingest(SWEEP[4], batch=4)
    untagged = _ingest(SWEEP[8])
    code, out, err = run_cli("compare", tagged, untagged, "--by", "batch")
    assert code == 2
    assert err == (f"traceparse: error: trace {untagged} ({SWEEP[8]}) has no tag 'batch' (its tags: none); "
                   f"ingest it with --tag batch=VALUE, or add it with traceparse tag {untagged} batch=VALUE\n")
    assert out == ""


def test_traces_of_different_devices_warn(store, tmp_path):
    """A trace re-exported with another GPU's name (a real trace, device renamed) is compared with a warning."""
    a = _ingest(SWEEP[16], batch=16)
    exported = tmp_path / "r16.json"
    assert run_cli("export", a, "--to", "chrome", "--out", str(exported), "-q")[0] == 0
    text = exported.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", 1)
    (tmp_path / "a100.json").write_text(text)
    b = _ingest(tmp_path / "a100.json", batch=32)
    code, out, err = run_cli("compare", a, b, "--by", "batch", "--json")
    assert code == 0
    assert (f"traceparse: warning: the traces come from 2 devices (NVIDIA H100 80GB HBM3: resnet18_bs16.json.gz "
            f"({a}); NVIDIA A100-SXM4-80GB: a100.json ({b})); their figures are not like for like\n") in err
    assert json.loads(out)["warnings"]
    # comparing the devices is the point: one line per device, no warning
    code, out, err = run_cli("compare", a, b, "--by", "batch", "--series", "device", "--json")
    assert code == 0 and "not like for like" not in err and json.loads(out)["warnings"] == []
    # a tag that does not separate the devices keeps the warning
    assert run_cli("tag", a, "run=x")[0] == 0 and run_cli("tag", b, "run=x")[0] == 0
    code, out, err = run_cli("compare", a, b, "--by", "batch", "--series", "run", "--json")
    assert code == 0 and "not like for like" in err


def test_bad_pattern_and_bad_out_suffix_are_one_line_errors(sweep_ids):
    code, _, err = run_cli("compare", sweep_ids[4], "--kernel", "max_pool(")
    assert code == 2 and err.startswith("traceparse: error: --kernel 'max_pool(': not a valid regular expression")
    assert err.count("\n") == 1
    code, _, err = run_cli("compare", sweep_ids[4], "--out", "plot.pdf")
    assert code == 2 and err == "traceparse: error: --out plot.pdf: expected a file name ending in .png, .svg, .html\n"


def test_plot_without_matplotlib_names_the_extra(sweep_ids, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--out", str(tmp_path / "p.png"))
    assert code == 2
    assert err == ("traceparse: error: --out needs matplotlib, which is in the optional 'plot' extra: "
                   "pip install 'traceparse[plot]'\n")
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".html", b"<!DOCTYPE html>")])
def test_plot_files(sweep_ids, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"sweep{suffix}"
    code, _, err = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--kernel", "max_pool_backward",
                           "--out", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(magic)
    if suffix != ".png":
        assert "max_pool_backward" in out.read_text()


def test_compare_on_the_shared_samples(samples_dir, store):
    """The shared samples (another run of the same workload) give the same shape of result."""
    ids = [_ingest(samples_dir / "torch" / f"torch_resnet18_bs{b}.json.gz", batch=b) for b in (64, 4, 16)]
    code, out, err = run_cli("compare", *ids, "--by", "batch", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["tags"]["batch"] for r in rows] == ["4", "16", "64"]
    for row in rows:
        path = samples_dir / "torch" / f"torch_resnet18_bs{row['tags']['batch']}.json.gz"
        ref = _independent(path, "nchwToNhwc", "cudaLaunchKernel")
        assert row["metrics"]["gpu_ns"] == ref["gpu_ns"] and row["metrics"]["idle_ns"] == ref["idle_ns"]


def _host_steps(path: Path) -> list[int]:
    """The durations of the host-side ProfilerStep#N annotations (events with a pid), from the raw JSON."""
    return [_ns(e["dur"]) for e in _events(path)
            if re.fullmatch(r"ProfilerStep#\d+", e["name"]) and e.get("cat") == "user_annotation"]


def test_step_time_and_throughput_from_the_raw_steps(sweep_ids):
    code, out, err = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--json")
    assert code == 0, err
    for row in json.loads(out)["rows"]:
        batch = int(row["tags"]["batch"])
        steps = _host_steps(SWEEP[batch])
        assert len(steps) == 2  # fixtures/README.md: two active steps per trace
        m = row["metrics"]
        assert m["steps"] == 2 and m["step_time_ns"] == round(sum(steps) / 2)
        assert m["samples_per_s"] == round(batch * 1e9 / m["step_time_ns"], 4)
    # a trace without a batch tag has a step time and no throughput
    code, out, err = run_cli("compare", str(FIXTURES / "torch" / "vgg16_bs8.json.gz"), "--json")
    m = json.loads(out)["rows"][0]["metrics"]
    assert m["step_time_ns"] == round(sum(_host_steps(FIXTURES / "torch" / "vgg16_bs8.json.gz")) / 2)
    assert m["samples_per_s"] is None


def test_rows_named_by_file_with_tags_as_columns_at_80_columns(sweep_ids, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_cli("compare", *sweep_ids.values(), "--by", "batch")
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("trace "))
    assert re.search(r"trace +┃ batch ┃ model +┃ step \(ms\) ┃ samples/s", header)
    code, doc, _ = run_cli("compare", *sweep_ids.values(), "--by", "batch", "--json")
    rows = json.loads(doc)["rows"]
    peak = max(r["metrics"]["step_time_ns"] for r in rows) / 1e6
    decimals = max(0, 4 - len(str(int(peak))))  # four significant figures of the column's largest value
    for r in rows:
        name = f"resnet18_bs{r['tags']['batch']}.json.gz"
        assert r["label"] == name
        step = f"{r['metrics']['step_time_ns'] / 1e6:.{decimals}f}"
        assert re.search(rf"^ {re.escape(name)} +│ {r['tags']['batch']} +│ resnet18 │ +{step} │ +[\d,]+ *$",
                         out, flags=re.M), name
    assert not any(id_[:8] in out for id_ in sweep_ids.values())  # no hashes for names
    table = [line for line in lines if "│" in line]
    assert not [line for line in table if "…" in line]


@pytest.fixture
def two_sweeps(store) -> dict[tuple[str, int], str]:
    """The same ResNet18 sweep made twice (fixtures/torch and fixtures/torch_sweep2), tagged run=a and run=b."""
    ids = {}
    for b in (4, 16, 64):
        ids[("b", b)] = _ingest(FIXTURES / "torch_sweep2" / f"resnet18_bs{b}.json.gz", batch=b, run="b")
        ids[("a", b)] = _ingest(SWEEP[b], batch=b, run="a")
    return ids


def test_series_groups_rows_and_draws_one_line_per_value(two_sweeps):
    from traceparse_plugins.commands.compare import plot_lines

    code, out, err = run_cli("compare", *two_sweeps.values(), "--by", "batch", "--series", "run", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["rows"]
    assert doc["series"] == "run"
    assert [(r["tags"]["run"], r["tags"]["batch"]) for r in rows] == [
        ("a", "4"), ("a", "16"), ("a", "64"), ("b", "4"), ("b", "16"), ("b", "64")]
    lines = plot_lines(rows, "batch", "run")
    idle = lines["rule figures (%)"]
    assert set(idle) >= {"GPU idle · run=a", "GPU idle · run=b"} and "GPU idle" not in idle
    for run in ("a", "b"):
        assert idle[f"GPU idle · run={run}"] == [(float(r["tags"]["batch"]), r["metrics"]["idle_pct"])
                                                 for r in rows if r["tags"]["run"] == run]
        steps = lines["time (ms)"][f"step · run={run}"]
        for (x, y), b in zip(steps, (4, 16, 64)):
            path = SWEEP[b] if run == "a" else FIXTURES / "torch_sweep2" / f"resnet18_bs{b}.json.gz"
            raw = _host_steps(path)
            assert x == b and y == round(sum(raw) / len(raw)) / 1e6
    # without --series: one line through every row, in --by order
    assert len(plot_lines(rows, "batch")["rule figures (%)"]["GPU idle"]) == 6


def test_series_tag_missing_is_an_error(two_sweeps):
    some = list(two_sweeps.values())[:2]
    code, out, err = run_cli("compare", *some, "--by", "batch", "--series", "gpu")
    assert code == 2 and out == ""
    assert err.startswith(f"traceparse: error: --series gpu: trace {some[0]} (") and "has no tag 'gpu'" in err


def test_series_plot_file(two_sweeps, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "series.svg"
    code, _, err = run_cli("compare", *two_sweeps.values(), "--by", "batch", "--series", "run", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "GPU idle · run=a" in text and "GPU idle · run=b" in text and "samples/s" in text


def test_traces_of_two_gpus_are_two_plot_lines(store, tmp_path):
    """The same sweep under two GPU names (a real trace re-exported with its device renamed): --series device
    groups by the GPU each trace names, and a plot of traces from several GPUs has one line per GPU anyway."""
    from traceparse_plugins.commands.compare import plot_lines

    ids = []
    for b in (8, 16):
        a = _ingest(SWEEP[b], batch=b)
        exported = tmp_path / f"r{b}.json"
        assert run_cli("export", a, "--to", "chrome", "--out", str(exported), "-q")[0] == 0
        renamed = tmp_path / f"a100_bs{b}.json"
        renamed.write_text(exported.read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"))
        ids += [a, _ingest(renamed, batch=b)]
    code, out, err = run_cli("compare", *ids, "--by", "batch", "--series", "device", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [(r["device"], r["tags"]["batch"]) for r in rows] == [
        ("NVIDIA A100-SXM4-80GB", "8"), ("NVIDIA A100-SXM4-80GB", "16"),
        ("NVIDIA H100 80GB HBM3", "8"), ("NVIDIA H100 80GB HBM3", "16")]
    idle = plot_lines(rows, "batch", "device")["rule figures (%)"]
    for gpu in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"):
        assert [x for x, _ in idle[f"GPU idle · device={gpu}"]] == [8.0, 16.0]
    pytest.importorskip("matplotlib")
    svg = tmp_path / "two.svg"
    code, _, err = run_cli("compare", *ids, "--by", "batch", "--out", str(svg))
    assert code == 0 and err.count("; the plot has one line per device") == 1
    text = svg.read_text()
    assert "GPU idle · device=NVIDIA A100-SXM4-80GB" in text and "GPU idle · device=NVIDIA H100 80GB HBM3" in text


def test_traces_of_the_same_file_name_are_told_apart_by_their_folder(two_sweeps):
    code, out, err = run_cli("compare", *two_sweeps.values(), "--by", "batch", "--series", "run", "--json")
    labels = [r["label"] for r in json.loads(out)["rows"]]
    assert labels == [f"{folder}/resnet18_bs{b}.json.gz" for folder in ("torch", "torch_sweep2") for b in (4, 16, 64)]


def test_runs_compare_with_their_kernel_categories_over_every_rank(store, tmp_path):
    """A run's rows are per rank: each category's share was one rank's time over every rank's kernel time (the
    shares of the DDP run added up to 25.8%). They are analyze's kernel-share figures now, adding up to 100; and a
    run of four ranks on one GPU model is that model, not "2 devices" beside a trace of it."""
    run = FIXTURES / "torch" / "multirank" / "ddp4_balanced"
    code, out, err = run_cli("compare", str(run), str(FIXTURES / "torch" / "multirank" / "ddp4_slow_hook"), "--json")
    assert code == 0, err
    assert "not like for like" not in err
    rows = json.loads(out)["rows"]
    code, out, err = run_cli("analyze", str(run), "--rule", "kernel-share", "--json")
    assert code == 0, err
    categories = json.loads(out)["findings"][0]["metrics"]["categories"]
    got = rows[0]["metrics"]["category_pct"]
    assert got == {k: c["share_pct"] for k, c in categories.items()}
    assert sum(got.values()) == pytest.approx(100, abs=0.01)


def test_figures_a_trace_does_not_have_are_unknown_and_steps_are_analyzes(tmp_path):
    """A kernel summary (nsys cuda_gpu_kern_sum CSV) compared beside the same capture's SQLite export showed a
    GPU span of 0.00 "holding" 2.977 ms of kernels and 0 API time; the SQLite showed no step where analyze finds
    its NVTX train_step range. Figures a trace does not have are null ("-"), and the steps are analyze's."""
    store = str(tmp_path / "s")
    nsys = FIXTURES / "nsys"
    paths = [nsys / "resnet18_bs8.sqlite.gz", nsys / "resnet18_bs8_cuda_gpu_kern_sum.csv"]
    code, out, err = run_cli("--store", store, "compare", "--json", *map(str, paths))
    assert code == 0, err
    doc = json.loads(out)
    rows = {Path(r["path"]).name: r["metrics"] for r in doc["rows"]}
    assert doc["warnings"] == ["resnet18_bs8_cuda_gpu_kern_sum.csv: GPU work as totals, with no timeline: its span, "
                               "idle and overlap are unknown (-)",
                               "not recorded, so their time is unknown (-) rather than 0: copies, API calls and "
                               "memsets in resnet18_bs8_cuda_gpu_kern_sum.csv"]
    summary_only = next(m for k, m in rows.items() if "kern_sum" in k)
    assert (summary_only["span_ns"], summary_only["api_ns"], summary_only["memcpy_ns"]) == (None, None, None)
    assert summary_only["kernel_ns"] > 0
    sqlite = next(m for k, m in rows.items() if "sqlite" in k)
    code, out, err = run_cli("--store", store, "analyze", "--json", str(paths[0]))
    (summary,) = json.loads(out)["summary"]
    assert summary["steps"] > 0
    assert (sqlite["steps"], sqlite["step_time_ns"]) == (summary["steps"], summary["step_time_ns"])


def test_the_docs_compare_example_is_what_compare_prints(store):
    """docs/compare.md's example output of the ResNet18 sweep: every line it shows (those between its "..."
    cuts) is a line of the command's own output at 80 columns, in order, so the page cannot drift from the tool."""
    text = (FIXTURES.parent / "docs" / "compare.md").read_text()
    block = text[text.index("$ traceparse compare fixtures/torch/resnet18_bs*"):]
    block = block[:block.index("```")]
    shown = [line.rstrip() for line in block.splitlines()[2:] if line.strip() and line.strip() != "..."]
    ids = [_ingest(p, batch=b) for b, p in SWEEP.items()]
    code, out, err = run_cli("compare", *ids, "--by", "batch", "--kernel", "max_pool_backward",
                             "--api", "cudaLaunchKernel")
    assert code == 0, err
    printed = [line.rstrip() for line in out.splitlines()]
    at = 0
    for line in shown:
        assert line in printed[at:], line
        at = printed.index(line, at) + 1


def test_a_kind_no_trace_recorded_is_said_not_recorded(tmp_path):
    """The trimmed NCCL runs hold no runtime call: their API column is "-" and a note says that is not recorded
    rather than 0; a trace of API calls alone has no GPU time (null), not a GPU time of 0."""
    store = str(tmp_path / "s")
    runs = [FIXTURES / "torch" / "multirank" / name for name in ("nccl2_balanced", "nccl2_slow_rank1")]
    code, out, err = run_cli("--store", store, "compare", "--json", *map(str, runs))
    assert code == 0, err
    doc = json.loads(out)
    assert [r["metrics"]["api_ns"] for r in doc["rows"]] == [None, None]
    assert doc["warnings"] == ["not recorded, so their time is unknown (-) rather than 0: API calls in every trace"]
    api_only = FIXTURES / "nsys" / "resnet18_bs8_cuda_api_sum.csv"
    code, out, err = run_cli("--store", store, "compare", "--json", str(api_only), str(runs[0]))
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert (rows[0]["metrics"]["gpu_ns"], rows[0]["metrics"]["api_ns"] > 0) == (None, True)


def test_a_runs_kernel_categories_read_as_analyze_shows_them(tmp_path):
    """The nsys NCCL run's communication is 87.96% of its kernel time: analyze's summary and kernel-share show
    87.9% (rounded with the other categories so that they add up to 100), compare showed 88.0%. Both now show the
    figure the categories' largest-remainder rounding gives (helpers.hamilton, from compare's exact shares)."""
    from helpers import hamilton

    store = str(tmp_path / "s")
    code, _, err = run_cli("--store", store, "-q", "ingest", str(FIXTURES / "nsys" / "nccl_run" / "ranks"),
                           "--run", "nsysr")
    assert code == 0, err
    code, out, err = run_cli("--store", store, "compare", "nsysr", "--json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    exact = row["metrics"]["category_pct"]
    shown = dict(zip(exact, hamilton([exact[c] for c in exact])))
    assert round(exact["communication"], 2) == 87.96 and shown["communication"] == 87.9
    code, screen, err = run_cli("--store", store, "--width", "200", "compare", "nsysr")
    assert code == 0, err
    lines = screen.splitlines()
    at = next(i for i, line in enumerate(lines) if "communication" in line and "gemm" in line)
    header, values = lines[at], next(line for line in lines[at:] if line.strip().startswith("rank*"))
    cells = dict(zip(header.split()[1:], re.findall(r"<0\.1|\d+\.\d", values)))  # after "trace"
    assert float(cells["communication"]) == shown["communication"] and float(cells["gemm"]) == shown["gemm"]
    code, out, err = run_cli("--store", store, "analyze", "nsysr", "--json", "--rule", "kernel-share")
    top = {c["category"]: c["shown_pct"] for c in json.loads(out)["summary"][0]["top_categories"]}
    assert top["communication"] == shown["communication"]
