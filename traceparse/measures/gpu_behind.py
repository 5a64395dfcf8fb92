"""Whether the GPU runs behind the host's steps: the GPU work a step launches ending after the step does.

A step is measured on the host (``ProfilerStep#N``, a step range: :func:`traceparse.measures.steps.step_series`).
Where the host queues a step's kernels and goes on without waiting for them (CUDA graphs, no synchronisation in
the step), the GPU work of each step ends after the step, and once the queue is full the GPU, not the host's
path, sets the pace. The critical path of a host-measured step and whatif's replay of it then say what holds
the host, not what holds throughput: kernel speed-ups show nowhere in them. This measure says when that is so,
so that they can say it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceparse import intervals
from traceparse.measures.launches import launches
from traceparse.measures.steps import step_series

#: A step's GPU work counts as running behind it when it ends this share of the step's time after the step.
BEHIND_SHARE = 0.05
#: The GPU sets the pace of steps it runs behind only where its work a step is at least this share of the host's
#: step: busy less, it idles in every step, waiting for work the host launches late in the step (a DataLoader
#: wait first, then the launches in a burst), and the host's steps set the pace. Not 1: the gaps between a step's
#: kernels (a CUDA graph's own) are GPU time its busy time leaves out. Measured: VGG16 without syncs is busy 2.2×
#: the host's step, its backlog doubling step to step; ResNet18 in CUDA graphs 86.5%, within its gaps of keeping
#: the pace; param's ResNet (30 steps) 47% and a PyTorch 1.9 ResNet50 58%, whose backlogs (87 to 134 ms, 9 to
#: 16 ms) stay level: the host's pace, the GPU idle for part of each step.
PACE_SHARE = 0.8


@dataclass(frozen=True)
class GpuBehind:
    """Steps whose launched GPU work ends after them: how many of how many, by how much (the least and the most),
    and per step (the mean over those steps) the host step and the time the step's GPU work keeps the GPU busy
    (the union of its activities)."""

    steps: int
    behind: int
    tail_min_ns: int
    tail_max_ns: int
    step_ns: int
    gpu_ns: int

    @property
    def paces(self) -> bool:
        """Whether the GPU, behind the steps, sets their pace: its work a step is about the host's step or more
        (:data:`PACE_SHARE`); busy less, it waits for the host in every step."""
        return self.gpu_ns >= PACE_SHARE * self.step_ns

    def sentence(self) -> str:
        """What it means for a path or a replay of host-measured steps, in words."""
        from traceparse.figures import fmt_ns

        if not self.paces:  # param's ResNet: 157 ms of GPU work a step against the host's 332.8 ms
            return (f"The GPU work each step launches ends after the step in {self.behind} of {self.steps} steps "
                    f"({fmt_ns(self.tail_min_ns)} to {fmt_ns(self.tail_max_ns)} after it), but keeps the GPU busy "
                    f"only {fmt_ns(self.gpu_ns)} a step against the host's {fmt_ns(self.step_ns)}: the host "
                    "launches it late in the step, the GPU waits for it the rest of the time, and the host's steps "
                    "set the pace.")
        return (f"The GPU work each step launches ends after the step in {self.behind} of {self.steps} steps "
                f"({fmt_ns(self.tail_min_ns)} to {fmt_ns(self.tail_max_ns)} after it), keeping the GPU busy "
                f"{fmt_ns(self.gpu_ns)} a step against the host's {fmt_ns(self.step_ns)}: the steps are the "
                "host's, and the GPU behind them sets the pace once its queue is full, so its work matters more "
                "than a path or a replay of the host's steps shows.")

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "behind": self.behind, "tail_min_ns": self.tail_min_ns,
                "tail_max_ns": self.tail_max_ns, "step_ns": self.step_ns, "gpu_ns": self.gpu_ns,
                "gpu_paces": self.paces}


def gpu_behind(events: Any) -> GpuBehind | None:
    """The steps whose launched GPU work (activities linked to a launch call made inside the step,
    :data:`traceparse.measures.launches`) ends more than :data:`BEHIND_SHARE` of the step after it, when that is
    at least half of the steps that launched any; else None (no steps, no linked GPU work, the GPU keeping up)."""
    steps = step_series(events)
    if steps.height == 0:
        return None
    linked = launches(events).filter(pl.col("launch_start_ns").is_not_null() & pl.col("start_ns").is_not_null()
                                     & pl.col("duration_ns").is_not_null())
    if linked.height == 0:
        return None
    windows = (steps.select(pl.col("trace_id").cast(pl.String), "step", "start_ns", "end_ns")
               .rename({"start_ns": "step_start", "end_ns": "step_end"}).sort("step_start"))
    work = (linked.select(pl.col("trace_id").cast(pl.String), "start_ns", "duration_ns", "launch_start_ns")
            .sort("launch_start_ns")
            .join_asof(windows, left_on="launch_start_ns", right_on="step_start", by="trace_id",
                       strategy="backward", check_sortedness=False)  # both sorted by time, as the join needs
            .filter(pl.col("step_end").is_not_null() & (pl.col("launch_start_ns") < pl.col("step_end"))))
    if work.height == 0:
        return None
    key = ["trace_id", "step"]
    per = work.group_by(key).agg(gpu_end=(pl.col("start_ns") + pl.col("duration_ns")).max(),
                                 step_start=pl.col("step_start").first(), step_end=pl.col("step_end").first()
                                 ).with_columns(step_ns=pl.col("step_end") - pl.col("step_start"),
                                                tail_ns=pl.col("gpu_end") - pl.col("step_end"))
    behind = per.filter(pl.col("tail_ns") > BEHIND_SHARE * pl.col("step_ns"))
    if behind.height == 0 or 2 * behind.height < per.height:
        return None
    # the GPU's busy time of the steps behind only, once they are known to be most (a union of every kernel of
    # a trace whose GPU keeps up was most of this function's time)
    mine = work.join(behind.select(key), on=key, how="semi", nulls_equal=True)
    busy = (intervals.union(mine.select(*key, "start_ns", "duration_ns"), key)
            .group_by(key).agg(gpu_ns=(pl.col("end") - pl.col("start")).sum()))
    behind = behind.join(busy, on=key, how="left", nulls_equal=True, maintain_order="left")
    return GpuBehind(steps=per.height, behind=behind.height, tail_min_ns=int(behind["tail_ns"].min()),
                     tail_max_ns=int(behind["tail_ns"].max()), step_ns=round(float(behind["step_ns"].mean())),
                     gpu_ns=round(float(behind["gpu_ns"].mean())))
