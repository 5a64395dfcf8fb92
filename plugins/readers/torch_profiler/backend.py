"""Which PyTorch build wrote a Kineto trace (CUDA or ROCm), from the trace's own keys.

ROCm builds write the same Kineto format as CUDA builds with their own
spellings (HIP runtime names under ``cuda_runtime``, ``"stream": "0x0"`` on
runtime events, see :mod:`.coerce`) and their own top-level keys:
``hip_runtime_version``, ``hip_driver_version`` and ``roctracer_version``
(``rocprofiler-sdk_version`` in current Kineto) instead of
``cupti_version`` / ``cuda_*_version``; their ``deviceProperties`` have
``warpSize`` 64 and ``numSms`` counts compute units (the name may be only
"AMD Radeon Graphics"). ``meta.extra["backend"]`` records ``"rocm"`` or
``"cuda"`` where the trace says, and the version keys go to ``meta.extra``.
Devices keep the ids the trace writes: a ROCm job whose visible devices start
at 2 has kernels on device 2 while ``deviceProperties`` numbers from 0.
"""

from __future__ import annotations

from traceparse.trace import TraceMeta

ROCM_KEYS = ("hip_runtime_version", "hip_driver_version", "roctracer_version", "rocprofiler_sdk_version")
#: the JSON spelling of each key, as kept in meta.extra
JSON_NAME = {"rocprofiler_sdk_version": "rocprofiler-sdk_version"}


def fill_backend(meta: TraceMeta, doc) -> None:
    """``meta.extra``: the ROCm version keys and ``backend`` (rocm / cuda) where the document says."""
    for key in ROCM_KEYS:
        value = getattr(doc, key, None)
        if value is not None:
            meta.extra[JSON_NAME.get(key, key)] = value
    rocm = any(getattr(doc, key, None) is not None for key in ROCM_KEYS) or any(
        isinstance(d, dict) and d.get("warpSize") == 64 for d in (doc.deviceProperties or []))
    if rocm:
        meta.extra["backend"] = "rocm"
        for device in meta.devices:  # HIP's numSms counts compute units; major.minor is the gfx architecture
            device.extra.setdefault("vendor", "AMD")
        if meta.tool_version is None:
            for key, label in (("roctracer_version", "roctracer"), ("rocprofiler_sdk_version", "rocprofiler-sdk")):
                if getattr(doc, key, None) is not None:
                    meta.tool_version = f"{label} {getattr(doc, key)}"
                    break
    elif doc.cupti_version is not None or doc.cuda_runtime_version is not None:
        meta.extra["backend"] = "cuda"
