"""Measures: public functions from events to polars frames, each a per-partition part and a combine step.

=================  ==========================================================
measure            what it gives
=================  ==========================================================
device_busy        per device: span, busy (union) and idle time, gap count
gaps               every idle gap of every device, with its neighbours' names
overlap            per device: time of side a running while side b runs
concurrency        per device: time with ≥ 1 and ≥ N intervals running
grid_fill          per device: kernel time on grids smaller than the GPU, SM time left empty
time_by_name       calls and time per (kind, name)
time_by_category   calls and time per category of names (kernel categories)
api_classes        calls and time per CUDA API class
copy_stats         copies, bytes, time per direction, memory kinds and size
gpu_time_parts     GPU time by part: kernels, each copy direction, memset (a function on two measures)
steps              ProfilerStep#N windows
self_time          self (exclusive) time of nested host events per thread
step_time_by_name  per trace: each name's time inside the steps (host self time, GPU durations)
launches           GPU work with the host call that launched it (correlation)
launch_summary     per trace: launch counts, sorted launch/delay times, top delays
stream_idle        per stream: idle gaps as host wait, kernel wait, other
gap_activity       per trace: host-wait gap time by what the launching thread was doing
memory_samples     the allocator's allocated/reserved totals over time
memory_peaks       per device: peak allocated and reserved, and when
comm_overlap       per rank/device: communication-kernel time overlapped by compute
collectives        collective instances per rank (device): arrival, end, bytes
collective_waits   per instance and rank: wait for the last to arrive
rank_time          per rank/device: compute, exposed comm, memcpy, idle time
merge_ranks        a per-trace frame summed over a run's ranks (``ranks``, spread)
dependency_graph   the dependency graph of a trace or run; ``critical_path.critical_paths`` walks it per step
=================  ==========================================================

``m(events, **params)`` measures a whole table; ``partitioned(m, events,
by="device_id")`` (or ``by="trace_id"``, or ``chunks=N``) runs ``m.part`` per
partition and ``m.combine`` over them, with the same result. The roofline
figures (:mod:`traceparse.measures.roofline`) are a whole-trace computation.
"""

from traceparse.measures.base import DEVICE, PARTITIONS, Measure, partitioned
from traceparse.measures.busy import device_busy, gaps
from traceparse.measures.comm import collective_waits, collectives, comm_overlap, rank_time
from traceparse.measures.concurrency import concurrency
from traceparse.measures.copies import copy_stats, gpu_time_parts
from traceparse.measures.grid import grid_fill
from traceparse.measures.overlap import overlap
from traceparse.measures.launches import launch_summary, launches, stream_idle
from traceparse.measures.memory import memory_peaks, memory_samples
from traceparse.measures.nesting import self_time
from traceparse.measures.steps import steps
from traceparse.measures.time import api_classes, time_by_category, time_by_name

#: Every measure, by name.
MEASURES: dict[str, Measure] = {m.name: m for m in (device_busy, gaps, overlap, concurrency, time_by_name,
                                                    time_by_category, api_classes, copy_stats, steps, self_time,
                                                    launches, stream_idle, memory_samples, memory_peaks)}

__all__ = ["DEVICE", "MEASURES", "PARTITIONS", "Measure", "api_classes", "concurrency", "copy_stats", "device_busy",
           "gaps", "launches", "memory_peaks", "memory_samples", "overlap", "partitioned", "self_time", "steps",
           "stream_idle", "time_by_category", "time_by_name"]
MEASURES.update({m.name: m for m in (comm_overlap, collectives, collective_waits, rank_time)})
__all__ += ["comm_overlap", "collectives", "collective_waits", "rank_time"]
MEASURES[grid_fill.name] = grid_fill
__all__ += ["grid_fill"]
MEASURES[launch_summary.name] = launch_summary
__all__ += ["launch_summary", "gpu_time_parts"]
from traceparse.measures.ranks import merge_ranks  # noqa: E402
__all__ += ["merge_ranks"]
from traceparse.measures.critical_path import dependency_graph  # noqa: E402
MEASURES[dependency_graph.name] = dependency_graph
__all__ += ["dependency_graph"]
from traceparse.measures.nesting import step_time_by_name  # noqa: E402
MEASURES[step_time_by_name.name] = step_time_by_name
__all__ += ["step_time_by_name"]
from traceparse.measures.gap_activity import gap_activity  # noqa: E402
MEASURES[gap_activity.name] = gap_activity
__all__ += ["gap_activity"]
