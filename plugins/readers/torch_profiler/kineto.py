"""The Kineto form of a Chrome trace: the event arguments and top-level keys kept, and the trace metadata."""

from __future__ import annotations

from typing import Any

import msgspec

from traceparse.meta import HOSTNAMES
from traceparse.trace import Device, TraceMeta

from traceparse_plugins.readers.chrome_json import Event


#: An integer argument as builds write it: an int (CUDA builds), a string (ROCm: ``"stream": "0x0"``,
#: ``"bytes": "128"``) or a float. :func:`.events.int_column` reads each as an integer and counts what it coerced.
Int = int | float | str | None


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields traceparse keeps; the rest are skipped while decoding."""

    external_id: Int = msgspec.field(default=None, name="External id")
    external_id_legacy: Int = msgspec.field(default=None, name="external id")
    correlation: Int = None
    device: Int = None
    context: Int = None
    stream: Int = None
    bytes: Int = None
    # a kernel's three dimensions; a host op may carry a text (Inductor's launch ops of PyTorch 2.5-2.6:
    # "grid": "grid(100,)"), which is no kernel's shape and is left empty (.events.rows_of)
    grid: list[Int] | Int = None
    block: list[Int] | Int = None
    registers: Int = msgspec.field(default=None, name="registers per thread")
    shared_memory: Int = msgspec.field(default=None, name="shared memory")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    flops: float | None = None
    # peer-to-peer copies (several GPUs in one process): the device that runs the copy, its source and destination
    in_device: Int = msgspec.field(default=None, name="inDevice")
    from_device: Int = msgspec.field(default=None, name="fromDevice")
    to_device: Int = msgspec.field(default=None, name="toDevice")
    # [memory] instant events (profile_memory=True): see .memory
    mem_bytes: Int = msgspec.field(default=None, name="Bytes")
    mem_allocated: Int = msgspec.field(default=None, name="Total Allocated")
    mem_reserved: Int = msgspec.field(default=None, name="Total Reserved")
    mem_device_id: Int = msgspec.field(default=None, name="Device Id")
    mem_device_type: Int = msgspec.field(default=None, name="Device Type")
    # communication (issue 10): Kineto's record_param_comms arguments, also copied onto NCCL kernels
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Int = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Int = msgspec.field(default=None, name="Out msg nelems")
    in_nelems_legacy: Int = msgspec.field(default=None, name="In msg size")  # before PyTorch 2.3
    out_nelems_legacy: Int = msgspec.field(default=None, name="Out msg size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    seq: Int = msgspec.field(default=None, name="Seq")
    # a point-to-point transfer's other rank (in its group's numbering) and the group's global ranks ("[0, 1]")
    dst_rank: Int = msgspec.field(default=None, name="Dst Rank")
    src_rank: Int = msgspec.field(default=None, name="Src Rank")
    pg_ranks: str | list | None = msgspec.field(default=None, name="Process Group Ranks")
    # metadata events ("ph": "M"): a thread_name event's name, kept raw (decoded only there; see .threads)
    meta_name: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="name")
    # operator arguments beside "Input Dims" (record_shapes=True), kept as their JSON text: the FLOPs-from-shapes
    # formulas (traceparse.measures.op_flops) need the dtypes and the non-tensor arguments (stride, is_causal)
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")


#: A Kineto trace event: the shared Chrome-JSON event with Kineto's arguments.
KinetoEvent = Event[Args]


class Document(msgspec.Struct):
    """The top-level keys of a Kineto trace other than the events."""

    traceEvents: list[KinetoEvent] = []
    schemaVersion: int | None = None
    deviceProperties: list[dict] | None = None
    distributedInfo: dict | None = None
    traceName: str | None = None
    baseTimeNanoseconds: int | None = None
    cuda_runtime_version: int | None = None
    cuda_driver_version: int | None = None
    cupti_version: int | None = None
    # the machine's name (Kineto of PyTorch 2.13 and later): any JSON value, only text kept (:func:`fill_meta`)
    host_name: Any = None
    # the profiler's options, 1 or 0 as Kineto writes them (true or false as some rewriting tools do)
    record_shapes: int | bool | None = None
    with_flops: int | bool | None = None
    profile_memory: int | bool | None = None
    # ROCm builds (see .backend)
    hip_runtime_version: int | str | None = None
    hip_driver_version: int | str | None = None
    roctracer_version: int | float | str | None = None
    rocprofiler_sdk_version: int | float | str | None = msgspec.field(default=None, name="rocprofiler-sdk_version")


#: The variant of a Kineto trace without ``schemaVersion``: PyTorch 1.x wrote none, and a file rewritten by
#: another tool (TraceLens's merge of a run's ranks) can lose it; which of the two cannot be told from its absence.
NO_SCHEMA = "Kineto (no schemaVersion: PyTorch 1.x, or a file rewritten without it)"


def fill_meta(meta: TraceMeta, doc: Document) -> None:
    """Devices, distributed rank tags, schema version and recorded options from the document's keys."""
    if doc.deviceProperties:
        meta.devices = [
            Device(
                id=d.get("id"),
                name=d.get("name"),
                sm_count=d.get("numSms"),
                memory_bytes=d.get("totalGlobalMem"),
                compute_capability=(f"{d['computeMajor']}.{d['computeMinor']}"
                                    if "computeMajor" in d and "computeMinor" in d else None),
                extra={k: v for k, v in d.items()
                       if k not in ("id", "name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor")},
            )
            for d in doc.deviceProperties
            if isinstance(d, dict)
        ]
    if doc.distributedInfo:
        for key in ("rank", "world_size", "backend"):
            if key in doc.distributedInfo:
                meta.tags.setdefault(key, str(doc.distributedInfo[key]))
    fill_distributed(meta, doc)
    if doc.schemaVersion is not None:
        meta.variant = f"Kineto schema {doc.schemaVersion}"
    elif meta.variant is None:
        meta.variant = NO_SCHEMA
    for key in ("traceName", "baseTimeNanoseconds", "cuda_runtime_version", "cuda_driver_version",
                "cupti_version", "record_shapes", "with_flops", "profile_memory"):
        value = getattr(doc, key)
        if value is not None:
            meta.extra[key] = value
    if isinstance(doc.host_name, str) and doc.host_name.strip():
        meta.extra[HOSTNAMES] = [doc.host_name]
    if doc.cupti_version is not None:
        meta.tool_version = f"CUPTI {doc.cupti_version}"


def fill_distributed(meta: TraceMeta, doc: Document) -> None:
    """``meta.distributed`` from Kineto's ``distributedInfo``: rank, world size, backend, process groups, NCCL version.

    ``pg_config`` entries (``pg_name``, ``pg_desc``, ``pg_size``, ``ranks``) become ``process_groups``
    [{name, desc, size, ranks}]; ``nccl_version`` (written when the backend is nccl; RCCL's on ROCm) is kept
    as text. A trace without ``distributedInfo`` leaves ``{}``.
    """
    info = doc.distributedInfo
    if not isinstance(info, dict) or not info:
        return
    out: dict = {}
    for key in ("rank", "world_size"):
        if isinstance(info.get(key), int):
            out[key] = info[key]
    if info.get("backend") is not None:
        out["backend"] = str(info["backend"])
    groups = info.get("pg_config")
    if isinstance(groups, dict):  # some versions write {name: config}
        groups = [{"pg_name": k, **v} for k, v in groups.items() if isinstance(v, dict)]
    if isinstance(groups, list):
        out["process_groups"] = [
            {"name": None if g.get("pg_name") is None else str(g["pg_name"]), "desc": g.get("pg_desc"),
             "size": g.get("pg_size"), "ranks": g.get("ranks")}
            for g in groups if isinstance(g, dict)]
    if info.get("nccl_version") is not None:
        out["nccl_version"] = str(info["nccl_version"])
    meta.distributed = out
