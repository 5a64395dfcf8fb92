"""The Kineto form of a Chrome trace: the event arguments and top-level keys kept, and the trace metadata."""

from __future__ import annotations

import msgspec

from traceparse.trace import Device, TraceMeta

from traceparse_plugins.readers.chrome_json import Event


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields traceparse keeps; the rest are skipped while decoding."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_legacy: int | None = msgspec.field(default=None, name="external id")
    correlation: int | None = None
    device: int | None = None
    context: int | None = None
    stream: int | None = None
    bytes: int | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    registers: int | None = msgspec.field(default=None, name="registers per thread")
    shared_memory: int | None = msgspec.field(default=None, name="shared memory")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    flops: float | None = None


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
    record_shapes: int | None = None
    with_flops: int | None = None
    profile_memory: int | None = None


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
    if doc.schemaVersion is not None:
        meta.variant = f"Kineto schema {doc.schemaVersion}"
    elif meta.variant is None:
        meta.variant = "Kineto (no schemaVersion: PyTorch 1.x)"
    for key in ("traceName", "baseTimeNanoseconds", "cuda_runtime_version", "cuda_driver_version",
                "cupti_version", "record_shapes", "with_flops", "profile_memory"):
        value = getattr(doc, key)
        if value is not None:
            meta.extra[key] = value
    if doc.cupti_version is not None:
        meta.tool_version = f"CUPTI {doc.cupti_version}"
