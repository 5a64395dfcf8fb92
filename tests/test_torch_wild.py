"""Real torch.profiler output from builds and workloads the project's captures lack (HTA's test data, MIT:
fixtures/torch/hta/SOURCE.md), and what each broke: a text ``grid`` refused a whole torch.compile trace, a
folder of ``*.pt.trace.json.gz`` was read as a JAX profile, FBGEMM's kernels were GEMMs, device events of
categories the reader does not know vanished without a word. Each is read both ways (the fast columnar path
and the careful one) where the reader has two.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil

import polars as pl
import pytest

from helpers import FIXTURES, run_cli
from traceparse.ingest import read_paths

HTA = FIXTURES / "torch" / "hta"
TRITON = HTA / "triton_example.json.gz"
CUPTI_RANGES = HTA / "benchmark_result_924719_1679055439_trace.json.gz"


def read(path, **params):
    """(events, warnings) of the torch reader, cut into chunks as a large file is (``fast`` as given)."""
    trace = read_paths([path], fmt="torch", params={"workers": 0, "small_bytes": 0, **params})[0]
    return trace.events, list(trace.meta.warnings)


@pytest.mark.parametrize("fast", [True, False])
def test_a_text_grid_on_inductors_launch_op_is_left_empty(fast):
    """The launch op ``triton_poi_fused_add_cos_sin_0`` carries ``"grid": "grid(100,)"``; its kernel carries
    ``"grid": [1, 1, 1], "block": [128, 1, 1]`` (read with the json module below). The trace is read, the op's
    grid is empty, the kernel's is its own, and nothing is warned of: a host op's text is no kernel's shape."""
    doc = json.load(gzip.open(TRITON))
    raw = {(e["cat"], e["name"]): e["args"] for e in doc["traceEvents"]
           if e.get("name") == "triton_poi_fused_add_cos_sin_0"}
    assert raw[("cpu_op", "triton_poi_fused_add_cos_sin_0")]["grid"] == "grid(100,)"
    kernel_args = raw[("kernel", "triton_poi_fused_add_cos_sin_0")]
    events, warnings = read(TRITON, fast=fast, chunk_bytes=1000)
    rows = events.filter(pl.col("name") == "triton_poi_fused_add_cos_sin_0").sort("kind")
    dims = rows.select("kind", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z").rows()
    assert dims == [("kernel", *kernel_args["grid"], *kernel_args["block"]), ("op", None, None, None, None, None, None)]
    assert warnings == []


def _kineto(events: list[dict]) -> dict:
    """A hand-written Kineto document (edge cases only) around ``events``."""
    return {"schemaVersion": 1, "traceEvents": events}


KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 1.0,
          "args": {"correlation": 1, "device": 0, "stream": 7}}


@pytest.mark.parametrize("fast", [True, False])
def test_a_kernels_grid_that_is_no_list_is_counted(tmp_path, fast):
    """Hand-written: a kernel whose grid is text loses its grid with a warning (a kernel's shape was expected);
    a host op's text grid says nothing."""
    events = [{**KERNEL, "args": {**KERNEL["args"], "grid": "grid(100,)", "block": [128, 1, 1]}},
              {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 9.0, "dur": 3.0,
               "args": {"grid": "grid(100,)"}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_kineto(events)))
    table, warnings = read(path, fast=fast)
    assert table.sort("kind").select("grid_x", "block_x").rows() == [(None, 128), (None, None)]
    assert warnings == [f"{path}: 1 argument value not written as JSON integers (as ROCm and some other PyTorch "
                        "builds write them): args.grid 1× not a list of three numbers, left empty"]


@pytest.mark.parametrize("fast", [True, False])
def test_events_of_unknown_categories_are_said(fast):
    """CUPTI's range profiler writes its ranges as ``cuda_profiler_range`` (77 in this trace, counted with the
    json module); they are no kernel traceparse reads, and the reader says so, once, with the count."""
    doc = json.load(gzip.open(CUPTI_RANGES))
    ranges = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cuda_profiler_range")
    assert ranges == 77
    _, warnings = read(CUPTI_RANGES, fast=fast, chunk_bytes=20_000)
    assert warnings == [f"{CUPTI_RANGES}: skipped 77 complete events of categories traceparse does not read "
                        "(cuda_profiler_range 77): their time is in no figure"]


@pytest.mark.parametrize("fast", [True, False])
def test_the_unread_categories_warning_counts_each_category(tmp_path, fast):
    """Hand-written: two unknown categories, a null one, and the quiet ones (``Trace``, ``overhead``), in
    chunks of 200 bytes: one warning, the larger count first; ``Trace`` and ``overhead`` are not named."""
    events = [KERNEL]
    for cat, n in (("mtia_runtime", 3), ("mtia_ccp_events", 5), (None, 1), ("Trace", 1), ("overhead", 2)):
        events += [{"ph": "X", "cat": cat, "name": "x", "pid": 1, "tid": 1, "ts": 1.0 + i, "dur": 0.5}
                   for i in range(n)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_kineto(events)))
    table, warnings = read(path, fast=fast, chunk_bytes=200)
    assert table.height == 1
    assert warnings == [f"{path}: skipped 9 complete events of categories traceparse does not read "
                        "(mtia_ccp_events 5, mtia_runtime 3, (none) 1): their time is in no figure"]


def test_a_folder_of_pt_trace_files_is_torch_not_jax(tmp_path):
    """``tensorboard_trace_handler`` names files ``*.pt.trace.json.gz``, which end as a JAX profile's do: a
    folder of one such file is that torch trace (format torch, its distributedInfo tags), and a folder of two
    ranks so named is a run of two ranks, not a JAX profile."""
    store = tmp_path / "store"
    code, out, err = run_cli("--store", str(store), "analyze", str(HTA / "cpu_only"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(t["format"], t["tags"]) for t in doc["traces"]] == [
        ("torch", {"backend": "gloo", "rank": "34", "world_size": "300"})]
    run = tmp_path / "named"
    run.mkdir()
    for r in (0, 1):
        shutil.copy(HTA / "trace_filter" / f"sampled_rank-{r}.json.gz", run / f"rank-{r}.Jul_1.{r}.pt.trace.json.gz")
    code, out, err = run_cli("--store", str(store), "analyze", str(run), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [t["format"] for t in doc["traces"]] == ["run"]
    assert doc["summary"][0]["span_ns"] < 1.3e9  # the run's span (1.239 s), not a JAX profile's 3.37 s


def test_a_folder_of_one_trace_without_a_rank_is_that_trace(tmp_path):
    """A folder holding one trace that names no rank was refused as a run without ranks; it is that trace."""
    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(FIXTURES / "torch" / "resnet18_bs16.json.gz", folder)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(folder), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(t["format"], t["path"]) for t in doc["traces"]] == [("torch", str(folder / "resnet18_bs16.json.gz"))]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--format", "torch", str(folder), "--json")
    assert code == 0, err  # the format forced: the same
    assert [t["path"] for t in json.loads(out)["traces"]] == [str(folder / "resnet18_bs16.json.gz")]


def test_a_path_read_as_another_format_before_is_read_again(tmp_path):
    """The store knows content by its hash: the same bytes read before as another format (``--format chrome``,
    or an older traceparse that took a folder for a JAX profile) are read again as what they are now, and that
    reading replaces the old one under the same id."""
    store = tmp_path / "s"
    path = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")
    assert run_cli("--store", str(store), "ingest", "--format", "chrome", path)[0] == 0
    code, out, err = run_cli("--store", str(store), "list", "--json")
    assert [t["format"] for t in json.loads(out)["traces"]] == ["chrome"]
    code, out, err = run_cli("--store", str(store), "analyze", path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [t["format"] for t in doc["traces"]] == ["torch"]
    listed = json.loads(run_cli("--store", str(store), "list", "--json")[1])["traces"]
    assert [(t["id"], t["format"]) for t in listed] == [(doc["traces"][0]["id"], "torch")]
    assert not (store / "tmp").exists() or list((store / "tmp").iterdir()) == []  # the old reading removed


def test_fbgemm_kernels_are_not_gemm(tmp_path):
    """The two sampled ranks as a run: kernel-share's GEMM time is that of the cutlass and cuBLAS GEMMs,
    computed here from the raw JSON by name (``gemm``, ``cublas`` or ``cutlass`` once ``fbgemm`` is taken out):
    137.4 of 1,257.5 ms. Before, ``fbgemm`` anywhere in a name (``fbgemm_gpu::FixedDivisor`` in an embedding
    kernel's arguments) made it a GEMM: 29.8%."""
    total = gemm = 0
    for r in (0, 1):
        for e in json.load(gzip.open(HTA / "trace_filter" / f"sampled_rank-{r}.json.gz"))["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                ns = round(e["dur"] * 1000)
                total += ns
                gemm += ns if re.search("gemm|cublas|cutlass", e["name"].lower().replace("fbgemm", "")) else 0
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(HTA / "trace_filter"),
                             "--rule", "kernel-share", "--json")
    assert code == 0, err
    categories = json.loads(out)["findings"][0]["metrics"]["categories"]
    assert (categories["gemm"]["time_ns"], sum(c["time_ns"] for c in categories.values())) == (gemm, total)
    assert (gemm, total) == (137_386_000, 1_257_545_000)


def test_a_folder_of_traces_without_ranks_says_how_to_read_them(tmp_path):
    """Hand-written: tensorboard_trace_handler's folder of two profiling windows of one process
    (``worker0.MILLISECONDS.pt.trace.json``, no distributedInfo): its milliseconds are no rank. The folder is
    refused in one line saying how to read the two; given as paths, they are two traces."""
    folder = tmp_path / "tb"
    folder.mkdir()
    names = ["worker0.1623143089861.pt.trace.json", "worker0.1623143566756.pt.trace.json"]
    for i, name in enumerate(names):
        (folder / name).write_text(json.dumps(_kineto([{**KERNEL, "ts": 10.0 + i}])))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(folder))
    assert code == 2 and err == (
        f"traceparse: error: {folder / names[0]}: no rank: the trace does not say (no distributedInfo rank) and "
        "the file name has none (rank3, _r3, .3.); a folder of traces is read as the ranks of one run: give the "
        "files as paths to read each as a trace of its own\n")
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", *(str(folder / n) for n in names), "--json")
    assert code == 0, err
    assert [t["format"] for t in json.loads(out)["traces"]] == ["torch", "torch"]


def test_pytorch_1_8_prerelease_bare_array_is_a_torch_trace(tmp_path):
    """Kineto before PyTorch 1.8 wrote a bare array of events (fixtures/torch/kineto/SOURCE.md), which went to
    the generic Chrome reader. It is a torch trace: its kernels are kernels (9,538 and 635,237 us of them,
    counted with the json module), its 6 ProfilerStep#N are the steps, its text thread ids are threads."""
    path = FIXTURES / "torch" / "kineto" / "resnet50_pt18_prerelease.pt.trace.json.gz"
    raw = json.load(gzip.open(path))
    kernels = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "Kernel"]
    steps = sorted((e["ts"], e["dur"]) for e in raw if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    assert (len(kernels), sum(e["dur"] for e in kernels), len(steps)) == (9538, 635_237, 6)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "kernel-share",
                             "--rule", "hotspots", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [t["format"] for t in doc["traces"]] == ["torch"]
    assert doc["summary"][0]["steps"] == 6
    assert doc["summary"][0]["step_time_ns"] == round(1000 * sum(d for _, d in steps) / 6)
    share = next(f for f in doc["findings"] if f["rule"] == "kernel-share")["metrics"]
    assert (share["calls"], share["kernel_time_ns"]) == (9538, 635_237_000)
    assert sum(c["time_ns"] for c in share["categories"].values()) == 635_237_000
    threads = {(i["thread"], i["thread_name"]) for f in doc["findings"] if f["rule"] == "hotspots"
               for i in f["items"] if "thread" in i}
    assert ("67844/4093687616 (python)", "python") in threads, threads  # by "thread 1 (python)", its ids text


def test_the_documents_keys_after_the_events(tmp_path):
    """Hand-written, as TraceLens' generator writes its traces: the profiler's options as JSON booleans after
    the events (``"with_flops": true``; Kineto writes 1) are read, not refused; a key of the wrong type there is
    named as one of the document's keys, not as "a trace event"."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [KERNEL], "with_flops": True,
                                "record_shapes": False}))
    table, warnings = read(path)
    assert table.height == 1 and warnings == []
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [KERNEL], "cupti_version": "x"}))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(path))
    assert (code, err) == (2, f"traceparse: error: {path}: cupti_version: unexpected value in the document's keys: "
                              "Expected `int | null`, got `str`\n")


def test_a_runs_threads_are_each_ranks_own(tmp_path):
    """Hotspots on a run: a thread is a rank's thread, even where ranks' processes share ids (copies of one
    trace, containers): the run has as many threads as its ranks alone have together, and each per-thread row
    names its rank. Before, rank 0's and rank 1's ``467/496`` were one thread of two ranks' time."""
    run = tmp_path / "run"
    run.mkdir()
    doc = json.load(gzip.open(FIXTURES / "torch" / "resnet18_bs16.json.gz"))
    for r in (0, 1):
        (run / f"rank{r}.json").write_text(json.dumps({**doc, "distributedInfo": {"rank": r, "world_size": 2}}))
    alone = json.loads(run_cli("--store", str(tmp_path / "a"), "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"),
                               "--rule", "hotspots", "--json")[1])["findings"]
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(run), "--rule", "hotspots", "--json")
    assert code == 0, err
    both = json.loads(out)["findings"]
    assert both[0]["metrics"]["threads"] == 2 * alone[0]["metrics"]["threads"]
    per_thread = next(f for f in both if f["title"] == "Hotspots per thread")
    assert {i["rank"] for i in per_thread["items"]} == {0, 1}
    assert all(i["thread"].startswith(f"rank {i['rank']}: ") for i in per_thread["items"])
    single = next(f for f in alone if f["title"] == "Hotspots per thread")
    assert all("rank" not in i and not i["thread"].startswith("rank") for i in single["items"])


def test_the_same_content_twice_is_one_trace(tmp_path):
    """A path given twice, a copy of a file, a stored id beside its path: one trace, its findings once (xprof's
    multi-worker demo holds two byte-identical host files: every finding was listed twice, the tally doubled)."""
    path = str(FIXTURES / "torch" / "resnet18_bs16.json.gz")
    copy = tmp_path / "copy.json.gz"
    shutil.copy(path, copy)
    store = str(tmp_path / "s")
    once = json.loads(run_cli("--store", store, "analyze", path, "--json")[1])
    for args, warning in (([path, path], f"{path}: given 2 times: read once"),
                          ([path, str(copy)], f"a file given: the same content as {path}: read once"),
                          ([path, once["traces"][0]["id"]], f"{once['traces'][0]['id']}: the same content as {path}: "
                                                            "read once")):
        code, out, err = run_cli("--store", store, "analyze", *args, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert [t["id"] for t in doc["traces"]] == [once["traces"][0]["id"]]
        assert len(doc["findings"]) == len(once["findings"])
        assert err == f"traceparse: warning: {warning}\n"


def test_launch_calls_without_gpu_activity_are_said(tmp_path):
    """Hand-written, as a public nsys export of an RTX 3060 laptop was (192 cudaLaunchKernel calls, no kernel
    table: the GPU could not be traced): "GPU busy -" alone did not say why; the summary counts the launches."""
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "dur": 5.0,
              "args": {"correlation": 1}}
    events = [{**launch, "ts": 10.0}, {**launch, "ts": 20.0, "args": {"correlation": 2}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaMalloc", "pid": 1, "tid": 1, "ts": 1.0, "dur": 3.0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_kineto(events)))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"][0]
    assert (summary["gpu_busy_pct"], summary["gpu_launches_unseen"]) == (None, 2)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", "120", "analyze", str(path))
    flat = re.sub(r"[│\s]+", " ", out)
    assert ("GPU busy - (2 kernel launch calls, but no GPU activity in this input: the GPU was not traced, or its "
            "activity is in another file)") in flat, out
    code, out, err = run_cli("--store", str(tmp_path / "t"), "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"),
                             "--json")
    assert json.loads(out)["summary"][0]["gpu_launches_unseen"] == 0


def test_gpu_time_given_as_totals_is_no_unseen_activity(tmp_path):
    """An nvprof summary (a real one, fixtures/nvprof/real) lists kernel launch calls and GPU totals without a
    timeline: "GPU busy - (N kernel launch calls, but the trace recorded no GPU activity)" stood one line above
    "GPU time 3.318 s"."""
    path = FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"][0]
    assert summary["gpu_time"]["total_ns"] > 0
    assert (summary["gpu_busy_pct"], summary["gpu_launches_unseen"], summary["gpu_totals_only"]) == (None, 0, True)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", "120", "analyze", str(path))
    assert re.search(r"GPU busy +- \(the trace gives GPU time as totals, with no timeline\)", out), out
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule", "launch-stats")
    (launches,) = json.loads(out)["findings"]
    assert launches["metrics"]["kernels"] == 0
    assert launches["message"] == ("No timed kernel: the trace gives its kernels as totals, without a timeline, so "
                                   "no launch call can be linked to its kernel.")


def _rocm_launches(shared_op_id: bool) -> list[dict]:
    """Hand-written after a PyTorch-on-ROCm Kineto trace (amd-sriram/Frameworks101: MIOpen, hipLaunchKernel):
    no ``correlation`` anywhere; each launch call and its kernel share an ``External id``. With
    ``shared_op_id`` the two launches and kernels carry their operator's one id instead (nothing pairs them)."""
    def launch(name, ts, dur, ext):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"External id": 9 if shared_op_id else ext}}

    def kernel(name, ts, dur, ext):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": dur,
                "args": {"External id": 9 if shared_op_id else ext, "device": 0, "stream": 0}}

    return [{"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 1, "ts": 90, "dur": 7800,
             "args": {"External id": 9}},
            launch("hipExtModuleLaunchKernel", 100, 20, 30), kernel("igemm_fwd_gtcx3_nhwc_fp32", 130, 10, 30),
            launch("hipLaunchKernel", 150, 7700, 32), kernel("elementwise_kernel_add", 7860, 10, 32)]


def test_rocm_launches_pair_by_their_external_id(tmp_path):
    path = tmp_path / "rocm.json"
    path.write_text(json.dumps(_kineto(_rocm_launches(shared_op_id=False))))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule",
                             "launch-stats", "--rule", "gpu-idle")
    assert code == 0, err
    found = {f["rule"]: f for f in json.loads(out)["findings"]}
    assert found["launch-stats"]["metrics"]["linked_kernels"] == 2
    assert found["launch-stats"]["metrics"]["delay_ns_max"] == 7_710_000  # 7860 - 150 us
    idle = found["gpu-idle"]["metrics"]
    assert idle["idle_ns"] == 7_720_000 and idle["host_wait_pct"] == 100.0  # the host was in hipLaunchKernel


def test_an_operators_shared_external_id_pairs_nothing(tmp_path):
    path = tmp_path / "op.json"
    path.write_text(json.dumps(_kineto(_rocm_launches(shared_op_id=True))))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule",
                             "launch-stats")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["metrics"]["kernels"] == 2 and found["metrics"]["linked_kernels"] == 0


def test_external_ids_that_are_correlation_ids_do_not_place_kernels(tmp_path):
    """Hand-written after a real A100 trace of PyTorch ~2.3 (CodingPlatelets/SwitchTransformers): Kineto wrote
    each kernel's and launch call's correlation id as its External id (fixed in pytorch/kineto#1001), so the id
    named an unrelated operator: a GEMM was credited to an aten::dropout 46 ms later that launched nothing.
    The launch call's innermost enclosing operator owns the kernel."""
    from traceparse.measures.op_work import placed_calls

    placed, info = placed_calls(read_paths([_correlation_id_trace(tmp_path)])[0].events)
    assert placed["name"].to_list() == ["aten::addmm", "aten::addmm"]
    assert placed["time_ns"].to_list() == [140_000, 140_000] and info["placed_ns"] == 280_000


def _correlation_id_trace(folder):
    """The hand-written trace above: two aten::addmm each launch a GEMM whose External id is its correlation id
    (7, 8), and 7 is also the External id of an aten::dropout that launched nothing. Its path."""
    def op(name, ts, dur, ext, dims):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"External id": ext, "Input Dims": dims, "Input type": ["float"] * len(dims)}}

    events = [op("aten::addmm", 100, 50, 3, [[4096], [10, 1024], [1024, 4096]]),
              op("aten::addmm", 300, 50, 4, [[4096], [10, 1024], [1024, 4096]]),
              op("aten::dropout", 5000, 1, 7, [[1, 10, 4096]])]
    for corr, ts in ((7, 110), (8, 310)):  # the launches inside the two addmm; their kernels later
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                       "dur": 5, "args": {"correlation": corr, "External id": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x32_tn", "pid": 0, "tid": 7,
                       "ts": ts + 20, "dur": 140, "args": {"correlation": corr, "External id": corr, "device": 0,
                                                          "stream": 7}})
    path = folder / "t.json"
    path.write_text(json.dumps(_kineto(events)))
    return path


def test_a_runs_ranks_are_placed_each_alone_in_one_pass(tmp_path):
    """A run's ranks repeat event ids, External ids and threads: the placed calls of three traces read as one
    frame (a real ResNet18 trace twice, then the hand-written trace whose External ids are correlation ids) are
    each trace's own, in the order the traces come, each trace's by event id, and the figures add up."""
    from traceparse.measures.op_work import placed_calls

    real = read_paths([FIXTURES / "torch" / "resnet18_bs16.json.gz"])[0].events
    hand = read_paths([_correlation_id_trace(tmp_path)])[0].events
    alone = [placed_calls(frame) for frame in (real, real, hand)]
    assert alone[2][0]["time_ns"].to_list() == [140_000, 140_000]  # each GEMM by its launch's enclosing addmm
    together, info = placed_calls(pl.concat([real.with_columns(trace_id=pl.lit("a")),
                                             real.with_columns(trace_id=pl.lit("b")),
                                             hand.with_columns(trace_id=pl.lit("c"))], how="diagonal_relaxed"))
    assert together.equals(pl.concat([placed for placed, _ in alone]))
    assert info == {key: sum(part[key] for _, part in alone) for key in info}


def test_a_recursive_routines_inclusive_time_counts_once(tmp_path):
    """Hand-written after with_stack traces (nn.Module's _call_impl calls itself for every submodule): the
    inclusive time summed the nested calls, 1.238 s for a routine on one thread of a 479.5 ms trace."""
    def frame(ts, dur):
        return {"ph": "X", "cat": "python_function", "name": "torch/nn/modules/module.py(1534): _call_impl",
                "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    events = [frame(0, 100), frame(10, 80), frame(20, 50), frame(200, 30),
              {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 30, "dur": 20, "args": {}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_kineto(events)))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule", "hotspots")
    assert code == 0, err
    routines = json.loads(out)["findings"][0]
    (impl,) = [i for i in routines["items"] if i["name"].endswith("_call_impl")]
    assert impl["calls"] == 4 and impl["inclusive_ns"] == 130_000  # the union: 0-100 and 200-230 us
    assert impl["time_ns"] == 110_000  # self times: 100 + 30 less the 20 us of aten::addmm


def test_a_roofline_of_a_trace_without_kernels_says_so(tmp_path):
    """A CPU-only trace recorded with record_shapes (Cryptheon/CyclicRouter: aten::linear with Input Dims) was
    told "The trace has kernels but no FLOP or DRAM byte counters" and to record shapes."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
               "args": {"Input Dims": [[1, 8], [4, 8], []], "Input type": ["float", "float", ""]}}]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(_kineto(events)))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule",
                             "arithmetic-intensity")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert found["message"] == ("The trace has no GPU kernels (its operators ran on the CPU, or the GPU was not "
                                "traced): there is nothing to place on a GPU roofline.")
    assert found["suggestion"] == ""
    assert found["metrics"]["gpu_source"] == "none: the trace has no GPU kernels"  # not "pass --gpu NAME"


def test_a_cut_trace_says_so_on_every_analysis(tmp_path):
    """A trace cut short (a profiler killed by a timeout) warned once, on the ingest that read it; later
    analyses and every --json stated its figures as facts (66 ms of GPU time in a file that has 244 ms)."""
    import gzip as _gzip
    whole = _gzip.decompress((FIXTURES / "torch" / "resnet18_bs16.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(whole[: len(whole) // 2])
    store = str(tmp_path / "s")
    for attempt in range(2):  # the ingest that reads it, then one that finds it stored
        code, out, err = run_cli("--store", store, "analyze", str(path), "--json")
        assert code == 0, err
        (summary,) = json.loads(out)["summary"]
        (note,) = summary["incomplete"]
        assert note.startswith(f"{path}: the file ends early (truncated JSON); kept the ")
        assert ("ends early" in err) == (attempt == 0)  # the reader's warning comes with the reading
    code, out, err = run_cli("--store", store, "--width", "200", "analyze", str(path))
    said = note.split(": ", 1)[1]
    assert re.search(r"incomplete +" + re.escape(said) + "; every figure here covers only what was read", out), out
    code, out, err = run_cli("--store", str(tmp_path / "t"), "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"),
                             "--json")
    assert json.loads(out)["summary"][0]["incomplete"] == [] and "incomplete" not in run_cli(
        "--store", str(tmp_path / "t"), "show", "--json", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"))[1]


def test_memory_samples_count_allocator_events(tmp_path):
    """Each [memory] event gives an allocated and a reserved total: the rule's samples counted both, 44 where a
    real trace (Windows, CUDA memory events) has 22 events."""
    def memory(ts, device_type, allocated):
        return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "s": "t",
                "args": {"Total Reserved": 4096, "Total Allocated": allocated, "Bytes": 512, "Addr": 1,
                         "Device Type": device_type, "Device Id": 0 if device_type == 1 else -1}}
    events = [memory(1, 1, 512), memory(2, 1, 1024), memory(3, 1, 512), memory(4, 0, 512)]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_kineto(events)))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule", "memory")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert {i["device"]: i["samples"] for i in found["items"]} == {"0": 3, "host": 1}
    assert found["metrics"]["samples"] == 4


def test_a_copy_is_named_by_the_path_given(tmp_path):
    """A byte-identical copy of a stored trace was reported under the path stored first, one the user did not
    name in this command."""
    import shutil as _shutil
    store = str(tmp_path / "s")
    source = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    assert run_cli("--store", store, "ingest", str(source))[0] == 0
    copy = tmp_path / "renamed_copy.json.gz"
    _shutil.copy(source, copy)
    code, out, err = run_cli("--store", store, "analyze", str(copy), "--json", "--rule", "memory")
    assert code == 0, err
    (trace,) = json.loads(out)["traces"]
    assert trace["path"] == str(copy)
    code, out, err = run_cli("--store", store, "--width", "200", "analyze", str(copy), "--rule", "memory")
    assert str(copy) in out.splitlines()[0]


def test_a_kernels_inclusive_time_is_its_time_however_its_streams_overlap(tmp_path):
    """The union that keeps a recursive routine's inclusive time honest is for calls nesting on a thread: one
    kernel running at once on two streams has an inclusive time no smaller than its time."""
    events = [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": s, "ts": 0, "dur": 10,
               "args": {"device": 0, "stream": s, "correlation": s}} for s in (7, 8)]
    path = tmp_path / "k.json"
    path.write_text(json.dumps(_kineto(events)))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--json", "--rule", "hotspots")
    assert code == 0, err
    (gemm,) = [i for i in json.loads(out)["findings"][0]["items"] if i["name"] == "gemm"]
    assert gemm["time_ns"] == gemm["inclusive_ns"] == 20_000


PT19 = FIXTURES / "torch" / "kineto" / "resnet50_pt19_worker0.pt.trace.json.gz"


@pytest.mark.parametrize("fast", [True, False])
def test_pytorch_1_9_memory_events_with_bytes_alone_are_one_counter_each(fast):
    """PyTorch 1.9's ``[memory]`` events carry ``Bytes`` alone (fixtures/torch/kineto/SOURCE.md): one
    ``allocation_bytes`` counter each, not three rows of which two are empty (38,514 counters for 12,838 events);
    the values and times are the raw JSON's."""
    doc = json.load(gzip.open(PT19))
    memory = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert len(memory) == 12_838 and all(set(e["args"]) == {"Device Type", "Device Id", "Bytes"} for e in memory)
    events, _ = read(PT19, fast=fast)
    counters = events.filter(pl.col("kind") == "counter")
    assert counters["name"].value_counts().rows() == [("allocation_bytes", 12_838)]
    assert counters["value"].null_count() == 0
    assert counters["value"].sum() == sum(e["args"]["Bytes"] for e in memory) == 19_267_840
    assert counters["start_ns"].to_list() == [e["ts"] * 1000 for e in memory]
