"""JAX's own profiler start and stop are not the program's work: the Python tracer records
``jax.profiler.start_trace`` and ``stop_trace`` (and the context manager's frames around them) as frames of the
program, which made a 4-step capture's span 61 ms for 21 ms of steps and its top routine ``stop_trace``.

Real captures: ``jax_gpt`` (JAX 0.11.2 on an H100, ``jax.profiler.trace`` as a context manager) and
``jax_cpu_mlp`` (JAX 0.10.2 on the CPU, fixtures/make_jax_cpu_profile.py, ``start_trace``/``stop_trace`` called
directly), each as its XSpace and its trace viewer JSON. The oracle reads the JSON timeline with gzip + json.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli

CAPTURES = {name: next((FIXTURES / "jax" / name / "plugins" / "profile").iterdir())
            for name in ("jax_gpt", "jax_cpu_mlp")}
OWN = re.compile(r"^\$profiler\.py:\d+ (start_trace|stop_trace)$")


def oracle(folder: Path) -> tuple[int, int, int]:
    """(events left out, span of the rest in ns, host events left) from the JSON timeline: the profiler's own
    frames, what nests in them on their thread, and the frames around one that are at most 50 us longer."""
    with gzip.open(folder / "vm.trace.json.gz", "rt") as f:
        doc = json.load(f)
    planes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ns = [(e, round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000)) for e in events]
    own = [(e["pid"], e["tid"], a, b) for e, a, b in ns
           if not planes[e["pid"]].startswith("/device:") and OWN.match(e["name"])]
    assert own, "the capture has the profiler's frames"

    def gone(e, a, b) -> bool:
        for pid, tid, s, t in own:
            if (e["pid"], e["tid"]) != (pid, tid):
                continue
            if s <= a and b <= t or (a <= s and t <= b and (b - a) - (t - s) <= max(50_000, (t - s) // 100)):
                return True
        return False

    kept = [(a, b) for e, a, b in ns if not gone(e, a, b)]
    return len(ns) - len(kept), max(b for _, b in kept) - min(a for a, _ in kept), len(kept)


@pytest.mark.parametrize("name", sorted(CAPTURES))
@pytest.mark.parametrize("form", ["vm.xplane.pb", "vm.trace.json.gz"])
def test_profiler_frames_are_left_out(store, name, form):
    folder = CAPTURES[name]
    left_out, span, _ = oracle(folder)
    code, out, err = run_cli("ingest", str(folder / form), "--json")
    assert code == 0, err
    [meta] = json.loads(out)["traces"]
    assert meta["extra"]["profiler_frames_left_out"] == left_out
    assert meta["summary"]["span_ns"] == span
    code, out, err = run_cli("analyze", "--rule", "hotspots", "--json")
    assert code == 0, err
    [main] = [f for f in json.loads(out)["findings"] if f["title"] == "Hotspots: routines by exclusive time"]
    assert not any(OWN.match(item["name"]) or item["name"].endswith(" trace") for item in main["items"])
