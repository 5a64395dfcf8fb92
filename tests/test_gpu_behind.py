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
    steps = sorted((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
                   if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    launch = {e["args"]["correlation"]: us_to_ns(e["ts"]) for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    work = [(launch[e["args"]["correlation"]], us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
            for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
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
