"""The GPU behind the host's steps: real traces of training steps the host does not wait for
(fixtures/make_async_step_traces.py, an H200: eager VGG16 and CUDA-graph ResNet18 at batch 32, no ``.item()``).

The critical path of a host-measured step, and whatif's replay of it, say what holds the host; there the GPU
work each step launches ends after the step, and kernels 100x faster gained nothing in whatif. Both now say
that the GPU runs behind the steps, with figures computed here from the raw JSON.
"""

from __future__ import annotations

import gzip
import json

import pytest

from traceparse.figures import fmt_ns
from helpers import FIXTURES, run_cli, union, us_to_ns
from traceparse.ingest import read_paths
from traceparse.measures.gpu_behind import gpu_behind

ASYNC = FIXTURES / "torch" / "async"
TRACES = {"vgg16": ASYNC / "vgg16_bs32_nosync.json.gz", "resnet18": ASYNC / "resnet18_bs32_cudagraphs_nosync.json.gz"}


def raw_behind(path) -> dict:
    """Per host ProfilerStep#N: its window and the GPU work (kernels, copies, memsets) whose launch call (same
    correlation id, cuda_runtime or cuda_driver) starts inside it: the last end and the union of their time."""
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    # the categories of Kineto since PyTorch 1.10, and of PyTorch 1.9's (Operator, Runtime, Kernel, Memcpy, Memset)
    steps = sorted((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
                   if e["name"].startswith("ProfilerStep#") and e.get("cat") in ("user_annotation", "Operator"))
    launch = {e["args"]["correlation"]: us_to_ns(e["ts"]) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and "correlation" in e.get("args", {})}
    work = [(launch[e["args"]["correlation"]], us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
            for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
            and e.get("args", {}).get("correlation") in launch]
    out = []
    for start, end in steps:
        mine = [(s, t) for at, s, t in work if start <= at < end]
        if mine:
            out.append({"step_ns": end - start, "tail_ns": max(t for _, t in mine) - end,
                        "gpu_ns": sum(b - a for a, b in union(mine))})
    return out


@pytest.mark.parametrize("name", sorted(TRACES))
def test_gpu_behind_equals_the_raw_json(name):
    per = raw_behind(TRACES[name])
    behind = [p for p in per if p["tail_ns"] > 0.05 * p["step_ns"]]
    assert len(per) == 3 and len(behind) == 2  # the last step drains the backlog (torch.cuda.synchronize)
    got = gpu_behind(read_paths([TRACES[name]])[0].events)
    assert got is not None
    assert (got.steps, got.behind) == (3, 2)
    assert (got.tail_min_ns, got.tail_max_ns) == (min(p["tail_ns"] for p in behind),
                                                  max(p["tail_ns"] for p in behind))
    assert got.step_ns == round(sum(p["step_ns"] for p in behind) / 2)
    assert got.gpu_ns == round(sum(p["gpu_ns"] for p in behind) / 2)


def test_vggs_gpu_work_outruns_its_host_steps():
    """The figures that make the point: VGG16's GPU work takes more than twice the host's step, and its backlog
    doubles from the first step to the second."""
    got = gpu_behind(read_paths([TRACES["vgg16"]])[0].events)
    assert got.gpu_ns > 2 * got.step_ns and got.tail_max_ns > 1.9 * got.tail_min_ns


def test_a_step_that_waits_for_its_gpu_is_not_behind():
    """The sweep's traces read the loss every step (``loss.item()``): the host waits for each step's work."""
    assert gpu_behind(read_paths([FIXTURES / "torch" / "resnet18_bs16.json.gz"])[0].events) is None


@pytest.mark.parametrize("name", sorted(TRACES))
def test_the_critical_path_and_whatif_say_the_gpu_is_behind(name, tmp_path):
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", str(TRACES[name]), "--rule", "critical-path", "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    got = gpu_behind(read_paths([TRACES[name]])[0].events)
    assert f["metrics"]["gpu_behind"] == got.as_dict()
    assert f["message"].endswith(got.sentence())
    assert "The GPU work each step launches ends after the step in 2 of 3 steps" in got.sentence()
    # the summary says it beside its step time, which is the host's (an MI300 trace: 16.21 ms steps, the GPU's
    # work ending 32 to 38 ms after them, said only deep in the critical path's box)
    (line,) = [h for h in json.loads(out)["summary"][0]["highlights"] if h["rule"] == "critical-path"]
    assert line["label"] == "GPU behind" and line["text"] == (
        f"the steps are the host's: the GPU's work of {got.behind} of {got.steps} steps ends "
        f"{fmt_ns(got.tail_min_ns)} to {fmt_ns(got.tail_max_ns)} after them, {fmt_ns(got.gpu_ns)} of GPU work a "
        f"step against the host's {fmt_ns(got.step_ns)}")
    code, out, err = run_cli("--store", store, "whatif", str(TRACES[name]), "--scale", "kernel=0.5", "--json")
    assert code == 0, err
    (note,) = json.loads(out)["notes"]
    assert note.startswith(got.sentence()) and " With the edits the GPU's activities take " in note
    code, out, err = run_cli("--store", store, "whatif", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"), "--json")
    assert code == 0 and json.loads(out)["notes"] == []


def test_a_gpu_busy_for_part_of_each_step_does_not_set_the_pace(tmp_path):
    """The PyTorch 1.9 ResNet50 of the TensorBoard plugin (fixtures/torch/kineto): 5 of its 6 steps' GPU work ends
    9 to 16 ms after them, but keeps the GPU busy 58% of the host's step, and the backlog stays level: the host
    launches late in each step (after its DataLoader wait) and sets the pace. The critical path said "the GPU behind
    them sets the pace once its queue is full", beside gpu-idle's GPU idle for the host."""
    path = FIXTURES / "torch" / "kineto" / "resnet50_pt19_worker0.pt.trace.json.gz"
    per = raw_behind(path)
    behind = [p for p in per if p["tail_ns"] > 0.05 * p["step_ns"]]
    gpu = sum(p["gpu_ns"] for p in behind) / len(behind)
    step = sum(p["step_ns"] for p in behind) / len(behind)
    assert len(behind) == 5 and 0.5 < gpu / step < 0.6
    got = gpu_behind(read_paths([path])[0].events)
    assert (got.behind, got.gpu_ns, got.step_ns, got.paces) == (5, round(gpu), round(step), False)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    doc = json.loads(out)
    message = doc["findings"][0]["message"]
    assert message.endswith(f"but keeps the GPU busy only {fmt_ns(got.gpu_ns)} a step against the host's "
                            f"{fmt_ns(got.step_ns)}: the host launches it late in the step, the GPU waits for it the "
                            "rest of the time, and the host's steps set the pace.")
    assert "sets the pace once its queue is full" not in message
    assert doc["findings"][0]["metrics"]["gpu_behind"]["gpu_paces"] is False
    assert not [h for h in doc["summary"][0]["highlights"] if h["label"] == "GPU behind"]
