"""Two real A100 traces from anupambhatnagar/GPUPuzzlers (fixtures/torch/gpupuzzlers/SOURCE.md): a first matmul
that spends seconds making cuBLAS ready, and a trace published with its first keys lost. Expected figures are
worked out here from the raw JSON."""

from __future__ import annotations

import gzip
import json

from helpers import FIXTURES, refused, run_cli
from traceparse.figures import fmt_count, fmt_ns

HERE = FIXTURES / "torch" / "gpupuzzlers"
ALLOCATION = ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaMallocHost", "cudaFreeHost")
WORK = ("cudaLaunchKernel", "cudaMemcpy", "cudaMemcpyAsync", "cudaGraphLaunch")


def _ns(us) -> int:
    return round(float(us) * 1000)


def test_allocation_before_the_gpu_has_work_is_start_up_not_time_lost(store):
    """api-share headlined "API time in allocation (>99.9%), 8.297 s lost" with "avoid cudaFree in the loop": the
    calls were two cudaFree inside the first ``aten::mm`` (cuBLAS made ready) and the caching allocator's first
    mallocs, all before the process launched its first kernel. Those calls (less the first runtime call, the
    context's) are now start-up, left out of what is at stake: info, no impact, the sentence with their count
    and time."""
    path = HERE / "more_small_kernels.json.gz"
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
              if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"]
    events.sort(key=lambda e: e["ts"])
    first_work = min(e["ts"] for e in events if e["name"] in WORK)
    early = [e for e in events[1:] if e["name"] in ALLOCATION and e["ts"] < first_work]
    early_ns = sum(_ns(e["dur"]) for e in early)
    assert events[0]["name"] not in ALLOCATION  # no context call to tell apart in this trace
    assert len(early) == 6 and early_ns > 8 * 10**9  # the two cudaFree calls and the first mallocs
    code, out, err = run_cli("analyze", str(path), "--rule", "api-share", "--json")
    assert code == 0, err
    (found,) = json.loads(out)["findings"]
    assert (found["severity"], found.get("impact_ns"), found["metrics"]["startup_allocation_ns"]) == ("info", None,
                                                                                                        early_ns)
    assert (f" {fmt_count(len(early), 'allocation call')} ({fmt_ns(early_ns)}) came before the process first gave "
            "the GPU work (a kernel launch or a copy): start-up" in found["message"])
    code, out, err = run_cli("analyze", "--json")  # nothing else holds 1% of the 9.1 s span: no bottleneck
    assert code == 0 and json.loads(out)["summary"][0]["bottleneck"] is None, err


def test_a_trace_published_without_its_first_keys_is_refused_naming_the_line(store):
    """The published file opens ``{`` and then the first device's ``{`` (Kineto's ``"schemaVersion"`` and
    ``"deviceProperties": [`` lost): no JSON. It was read as a plain Chrome trace, its kernels as host ranges.
    Refused now, naming the line of the second ``{``, counted here."""
    path = HERE / "different_priority_streams.json.gz"
    data = gzip.decompress(path.read_bytes())
    first = data.index(b"{")
    line = data[: data.index(b"{", first + 1)].count(b"\n") + 1
    assert data[first + 1: data.index(b"{", first + 1)].strip() == b""  # nothing between the two braces
    refused(["ingest", str(path)], f'{path}:{line}: the keys before "traceEvents" are not valid JSON (JSON is '
            "malformed: object keys must be strings); a Chrome trace is one JSON document", store)


def test_a_gpu_span_that_is_a_sliver_of_the_trace_is_said_beside_its_busy_share(store):
    """The GPU ran its 62 kernels within 3.2 ms of a 9.1 s trace: "GPU busy 57.4% of the GPU's span" alone reads
    as a GPU half busy over the run (a CUDA-graph capture's two kernels read ">99.9%" beside a 33.7 ms step). The
    line says the span and the trace's, both worked out here from the raw events."""
    path = HERE / "more_small_kernels.json.gz"
    events = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if (e.get("cat") or "").lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu = _ns(max(float(e["ts"]) + float(e["dur"]) for e in kernels)) - _ns(min(float(e["ts"]) for e in kernels))
    span = _ns(max(float(e["ts"]) + float(e["dur"]) for e in events)) - _ns(min(float(e["ts"]) for e in events))
    assert 100 * gpu < 10 * span
    code, out, err = run_cli("--width", "200", "analyze", str(path), "--rule", "gpu-idle")
    assert code == 0, err
    assert f"of the GPU's span (first to last activity): {fmt_ns(gpu)} of the {fmt_ns(span)} traced" in out
    code, out, err = run_cli("--width", "200", "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"))
    busy = next(line for line in out.splitlines() if "GPU busy" in line)  # a GPU busy over most of the trace
    assert "first to last activity)" in busy and "traced" not in busy
