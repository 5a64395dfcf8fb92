"""A trace's metadata: where it came from, what wrote it, what the reader noticed (no event, no polars).

:class:`TraceMeta` is what the store keeps beside each trace (``meta.json``) and what listing the store reads:
this module imports nothing heavy, so ``traceparse list`` does not load polars. :mod:`traceparse.trace`
re-exports both classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Bumped whenever a column of the event table is added, removed or changes meaning (:mod:`traceparse.schema`).
SCHEMA_VERSION = 4


#: ``TraceMeta.extra`` key of what said the input ends before its end (``ReadOptions.incomplete``): a list of
#: messages, absent when the input was whole.
INCOMPLETE = "incomplete"


#: ``TraceMeta.extra`` key of the events a reader skipped as of a kind it does not read: ``{category: count}``
#: (an MTIA device's ``mtia_ccp_events``), absent when it read every event. Their time is in no figure, so the
#: summary says so where it would otherwise say "no GPU work".
UNREAD = "unread_events"


#: ``TraceMeta.extra`` key of how many threads the rows with no thread (no pid, device or tid) are totals over,
#: where the source says (``pprof -s``: its total table over its mean table), absent where it does not: hotspots
#: says so of its total instead of calling it one thread's.
SUMMED_THREADS = "summed_threads"

#: ``TraceMeta.extra`` key of the routine whose exclusive time is the time in no instrumented routine (TAU's
#: top-level timer ``.TAU application``), where the source has one: hotspots says what that time is when it leads
#: (an HPX run's idle worker threads made it 85.5% of the time), rather than offer it as a routine to speed up.
OUTSIDE_ROUTINES = "outside_routines"


#: ``TraceMeta.extra`` key of a run's ranks whose input ends before its end (each said in :data:`INCOMPLETE`):
#: rules that compare the ranks leave them out of the comparison, as a rank cut short did less of everything.
INCOMPLETE_RANKS = "incomplete_ranks"


def incomplete_notes(meta) -> list[str]:
    """Why the trace is incomplete (the file ended early), as the reader said; empty for a whole input."""
    return list(((getattr(meta, "extra", None) or {}).get(INCOMPLETE)) or [])


def incomplete_ranks(meta) -> list[int]:
    """The ranks of a run whose input ends early (their figures cover what was read); empty for a whole run or a
    single trace."""
    return [int(r) for r in ((getattr(meta, "extra", None) or {}).get(INCOMPLETE_RANKS)) or []]


@dataclass
class Device:
    """A GPU (or another accelerator: :attr:`kind`) as the source describes it; unknown fields stay None."""

    id: int | None = None
    name: str | None = None
    #: What the device is, in the word a reader puts before its number: None for a GPU (every reader's device
    #: until another accelerator came), ``"TPU"`` for a TPU core. :func:`device_noun` reads it.
    kind: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    compute_capability: str | None = None
    core_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceMeta:
    """Where a trace came from, what wrote it, and what the reader noticed."""

    id: str | None = None
    source_paths: list[str] = field(default_factory=list)
    sha256: str | None = None
    format: str | None = None
    #: The reader that made this reading and its plugin's release (``"torch (traceparse 0.1.0)"``,
    #: :meth:`traceparse.plugins.Registry.reading_of`); None for a reading stored before readers were named.
    reader: str | None = None
    variant: str | None = None
    tool: str | None = None
    tool_version: str | None = None
    devices: list[Device] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    ingested_at: str | None = None
    event_count: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: What the trace says of the distributed job it belongs to: {"rank", "world_size", "backend",
    #: "process_groups": [{"name", "desc", "size", "ranks"}], "nccl_version"?}; {} when it says nothing.
    distributed: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str | None:
        """The first (usually only) source path."""
        return self.source_paths[0] if self.source_paths else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the metadata."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TraceMeta":
        """Rebuild metadata written by :meth:`to_dict`, ignoring keys it does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["devices"] = [Device(**{k: v for k, v in d.items() if k in _DEVICE_FIELDS})
                             for d in data.get("devices", [])]
        return cls(**values)


_DEVICE_FIELDS = {f.name for f in dataclasses.fields(Device)}


#: ``Device.extra`` keys any reader may set with a device's peak figures as its source gives them (XLA's for a
#: TPU), shown by ``show``: TFLOP/s and GB/s of its main memory.
PEAK_TFLOPS = "peak_tflops"
PEAK_MEMORY_GBPS = "peak_memory_gbps"


#: ``TraceMeta.extra`` key any reader may set: the names of the hosts the trace was recorded on, as the profiler
#: wrote them (a list of text; one for a process's trace). ``ingest`` and ``show`` print them, a run's panel groups
#: its ranks by host, and the straggler finding says where a run's slow ranks ran (:func:`hosts`).
HOSTNAMES = "hostnames"
#: Characters kept of one host name: a name is a label, not a document.
HOSTNAME_CHARS = 255


def hosts(meta) -> list[str]:
    """The host names a reader recorded for a trace (:data:`HOSTNAMES`), each once, in order; [] where the
    trace names none. Only non-empty text is a name (a stored value of another type says nothing)."""
    values = ((getattr(meta, "extra", None) or {}).get(HOSTNAMES)) or []
    if isinstance(values, str):
        values = [values]
    out = [v.strip()[:HOSTNAME_CHARS] for v in values if isinstance(v, str) and v.strip()] if isinstance(
        values, list) else []
    return list(dict.fromkeys(out))


#: ``TraceMeta.extra`` key any reader may set where its source says when its clock's zero was: the UTC time, in ns
#: since the Unix epoch, of the trace's time 0 (an integer). Traces that count time from their own capture's start
#: (an Nsight Systems report per rank: each session has its own zero) are put on one clock by it when stored
#: as a run (:func:`traceparse.run.align_rank_clocks`); absent where the source does not say.
CLOCK_ORIGIN_UTC_NS = "clock_origin_utc_ns"


#: ``TraceMeta.extra`` key a reader may set where one trace can hold the GPU work of several processes (one Nsight
#: Systems report of a whole ``torchrun`` job): {pid (text): [device ids]} of the processes that ran GPU work. Where
#: it names two or more, the trace is one trace, not a run of ranks: its rows have no rank, and its steps are the
#: processes' step ranges taken together; the summary says so (:func:`gpu_processes`).
GPU_PROCESSES = "gpu_processes"


def gpu_processes(meta) -> dict[str, list[int]]:
    """{pid (text): [device ids]} of a trace's processes that ran GPU work, as its reader recorded them
    (:data:`GPU_PROCESSES`); {} where it did not. Only a mapping of text to integer lists is read."""
    value = (getattr(meta, "extra", None) or {}).get(GPU_PROCESSES)
    if not isinstance(value, dict):
        return {}
    return {str(pid): [d for d in devices if type(d) is int] for pid, devices in value.items()
            if isinstance(devices, list)}


#: ``TraceMeta.extra`` key of a run's combined trace: {rank (text): host name} of the ranks whose trace names one
#: host (:data:`HOSTNAMES`), set by the store as it loads the run (:func:`ranks_by_host`).
RANK_HOSTS = "rank_hosts"


def rank_hosts(metas: dict[int, Any]) -> dict[str, str]:
    """{rank (text): host} of the ranks (rank -> their trace's metadata) whose trace names exactly one host."""
    out = {}
    for rank, meta in sorted(metas.items()):
        names = hosts(meta)
        if len(names) == 1:
            out[str(rank)] = names[0]
    return out


def ranks_by_host(meta) -> dict[str, list[int]]:
    """{host: its ranks, in order} of a run's combined trace (:data:`RANK_HOSTS`), hosts in the order of their
    first rank; {} where no rank's host is known."""
    return grouped_by_host((getattr(meta, "extra", None) or {}).get(RANK_HOSTS) or {})


def grouped_by_host(on: dict) -> dict[str, list[int]]:
    """{rank (text): host} as {host: its ranks, in order}, hosts in the order of their first rank."""
    pairs = sorted((int(r), h) for r, h in on.items() if isinstance(h, str) and str(r).lstrip("-").isdigit())
    out: dict[str, list[int]] = {}
    for rank, host in pairs:
        out.setdefault(host, []).append(rank)
    return out


def device_noun(device: Device | None) -> str:
    """The word a device is called by on screen: its :attr:`Device.kind` (``TPU``), ``GPU`` when it has none."""
    return (device.kind if device is not None and device.kind else "GPU")


def device_nouns(meta) -> dict[int, str]:
    """Device id -> :func:`device_noun` of the devices a trace lists that are not GPUs (TPUs), so that a device
    row is labelled ``TPU 2``, not ``GPU 2``; empty for a trace of GPUs (or of no listed devices)."""
    return {d.id: device_noun(d) for d in (getattr(meta, "devices", None) or [])
            if d.id is not None and d.kind and d.kind != "GPU"}
