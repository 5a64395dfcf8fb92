"""Looking up GPU specifications (peak FLOP/s, bandwidths) in the catalog the plugins provide.

The data lives in plugins (hook ``traceparse_gpu_specs``); this module only
matches device names against it. A spec is a dict: ``name``, ``match`` (a
list of lower-case substrings that must all occur in the device name) and
the figures documented in docs/gpu_catalog.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traceparse.errors import InputError, spelled
from traceparse.meta import device_noun
from traceparse.plugins import Registry, registry as default_registry
from traceparse.trace import Trace


def find_gpu(name: str | None, reg: Registry | None = None) -> dict | None:
    """The catalog entry for a device name as a tool writes it, or None.

    Every substring of an entry's ``match`` list must occur in the
    lower-cased name and none of its ``exclude`` list (a GeForce board's
    Laptop GPU, its Ti sibling); among matching entries the most specific
    (longest total match) wins, so "A100-SXM4-80GB" prefers the 80 GB entry.
    """
    if not name:
        return None
    lowered = name.lower()
    best, best_len = None, 0
    for spec in (reg or default_registry()).gpu_specs:
        patterns = [p.lower() for p in spec.get("match", [])]
        if any(x.lower() in lowered for x in spec.get("exclude", [])):
            continue
        if patterns and all(p in lowered for p in patterns):
            length = sum(len(p) for p in patterns)
            if length > best_len:
                best, best_len = spec, length
    return best


#: How far a device's memory may be from an entry's ``identify.memory_gib`` (a share of it): drivers reserve
#: some, and a virtual function reports a little less (MI300X VF: 191.45 GiB of 192).
MEMORY_TOLERANCE = 0.03


def identify_gpu(device, reg: Registry | None = None) -> tuple[dict | None, list[str]]:
    """The catalog entry whose properties a device has, for devices with a generic name or none.

    ROCm builds of PyTorch name every AMD GPU "AMD Radeon Graphics"; the
    device's properties then tell: ``warp_size`` (``extra["warpSize"]``),
    ``sm_count`` (numSms: compute units on AMD), ``memory_gib`` (memory in
    GiB, within :data:`MEMORY_TOLERANCE`) and ``compute_capability``. Every
    property an entry's ``identify`` table lists and the device has must agree,
    and the device must have at least the compute units and the memory.

    A device with **no name** (an ncu details page gives only its compute
    capability and SM count) is also matched against entries without an
    ``identify`` table by their own ``compute_capability`` and ``sm_count``
    (both needed), and by ``memory_gb`` (within :data:`NAMELESS_MEMORY_TOLERANCE`
    of the device's memory in GiB) when the device gives its memory: "sm 9.0
    with 132 SMs" is an H100 SXM, or an H100 NVL, H200, H200 NVL or GH200.

    Returns the first entry that fits (catalog order) and the names of all that
    do, or ``(None, [])``; callers say so when several fit.
    """
    fits = []
    extra = getattr(device, "extra", None) or {}
    for spec in (reg or default_registry()).gpu_specs:
        want = spec.get("identify")
        if not want:
            if _fits_by_own_figures(device, spec):
                fits.append(spec)
            continue
        if device.sm_count is None or device.memory_bytes is None:
            continue
        if "warp_size" in want and extra.get("warpSize") is not None and int(extra["warpSize"]) != want["warp_size"]:
            continue
        if "sm_count" in want and int(device.sm_count) != int(want["sm_count"]):
            continue
        if "memory_gib" in want:
            gib = device.memory_bytes / 2**30
            if abs(gib - want["memory_gib"]) > MEMORY_TOLERANCE * want["memory_gib"]:
                continue
        if ("compute_capability" in want and device.compute_capability
                and str(device.compute_capability) != str(want["compute_capability"])):
            continue
        fits.append(spec)
    return (fits[0] if fits else None), [f["name"] for f in fits]


def candidates_by_cc(device, reg: Registry | None = None) -> list[str]:
    """Names of the catalog entries of a nameless device's compute capability, when that is all it says.

    An ncu text report (``--section SpeedOfLight``) gives each kernel's
    ``CC 9.0`` but no SM count, memory or name: not enough for
    :func:`identify_gpu`, but it narrows the GPU to a family ("sm 9.0: H100
    SXM, H100 PCIe, ..., GH200"). Empty for a named device, one with an SM
    count (:func:`identify_gpu` decides those) or one without a compute
    capability.
    """
    if getattr(device, "name", None) or device.sm_count is not None or not device.compute_capability:
        return []
    return [s["name"] for s in (reg or default_registry()).gpu_specs
            if "identify" not in s and str(s.get("compute_capability")) == str(device.compute_capability)]


#: How far a nameless device's memory (GiB) may be from an entry's ``memory_gb`` (a share of it): NVIDIA
#: sells "80GB" boards that report 79.2 GiB, "141GB" ones that report 139.8 GiB.
NAMELESS_MEMORY_TOLERANCE = 0.05


def _fits_by_own_figures(device, spec: dict) -> bool:
    """Whether a device without a name has an entry's compute capability, SM count (and memory, if it says)."""
    if getattr(device, "name", None) or device.sm_count is None or not device.compute_capability:
        return False
    if spec.get("sm_count") is None or spec.get("compute_capability") is None:
        return False
    if int(device.sm_count) != int(spec["sm_count"]):
        return False
    if str(device.compute_capability) != str(spec["compute_capability"]):
        return False
    if device.memory_bytes is not None and spec.get("memory_gb"):
        gib = device.memory_bytes / 2**30
        if abs(gib - spec["memory_gb"]) > NAMELESS_MEMORY_TOLERANCE * spec["memory_gb"]:
            return False
    return True


def _same_figures(specs: list[dict]) -> bool:
    """Whether entries have the same peaks and bandwidths, within 1% (sources round them differently: an MI210's
    181 TFLOP/s is one MI250 GCD's 181.05)."""
    def close(a, b) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return abs(a - b) <= 0.01 * max(abs(a), abs(b))
        return a == b
    keys = ("peak_tflops", "dram_gbps", "host_link")
    return all(all(close(s.get(k), specs[0].get(k)) for k in keys) for s in specs[1:])


def _properties(device) -> str:
    extra = getattr(device, "extra", None) or {}
    warp = extra.get("warpSize")
    parts = [f"{device.sm_count} {'compute units' if warp == 64 else 'SMs'}" if device.sm_count is not None else None,
             f"{device.memory_bytes / 2**30:.0f} GiB" if device.memory_bytes is not None else None,
             f"warp size {warp}" if warp else None,
             f"compute capability {device.compute_capability}" if device.compute_capability else None]
    return ", ".join(p for p in parts if p)


#: The precisions a peak may be given for (``peak_tflops`` keys of a catalog entry, ``--peak-flops``): on the
#: CUDA cores, then on the tensor (AMD: matrix) cores. TFLOP/s, TOP/s for int8.
PRECISIONS = ("fp64", "fp32", "fp16", "bf16", "fp64_tensor", "fp32_tensor", "tf32_tensor", "fp16_tensor",
              "bf16_tensor", "fp8_tensor", "int8_tensor")


@dataclass(frozen=True)
class GpuChoice:
    """What the user chose of a GPU's figures: a catalog entry by name (``--gpu``) and peaks given by hand
    (``--peak-flops PRECISION=GFLOPS``, ``--peak-bw GBPS``), which replace the entry's or stand alone."""

    name: str | None = None
    peak_gflops: tuple[tuple[str, float], ...] = ()
    dram_gbps: float | None = None

    def __bool__(self) -> bool:
        return bool(self.name or self.peak_gflops or self.dram_gbps)


def parse_peak_flops(text: str) -> tuple[str, float]:
    """``PRECISION=GFLOPS`` (``fp32=19500``) as (precision, GFLOP/s); ValueError with what was expected."""
    precision, sep, value = text.partition("=")
    precision = precision.strip().lower()
    if not sep or precision not in PRECISIONS:
        raise ValueError(f"expected PRECISION=GFLOPS with PRECISION one of {', '.join(PRECISIONS)}, got {text!r}")
    return precision, _positive(value, "GFLOPS", text)


def parse_peak_bw(text: str) -> float:
    """A DRAM bandwidth in GB/s (``900``); ValueError with what was expected."""
    return _positive(text, "GB/s", text)


def _positive(value: str, unit: str, text: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"expected a positive number of {unit}, got {text!r}")
    return number


def _by_hand(spec: dict | None, how: str, choice: GpuChoice) -> tuple[dict | None, str]:
    """``spec`` with the peaks ``choice`` gives by hand in place of its own (or a spec of those alone)."""
    if not choice.peak_gflops and choice.dram_gbps is None:
        return spec, how
    out = {key: (dict(value) if isinstance(value, dict) else value) for key, value in (spec or {}).items()}
    out.setdefault("name", "peaks given by hand")
    if spec is not None:
        out["name"] = f"{spec['name']}, peaks by hand"
    out["peak_tflops"] = dict(out.get("peak_tflops") or {})
    out["sources"] = dict(out.get("sources") or {})
    given = []
    for precision, gflops in choice.peak_gflops:
        out["peak_tflops"][precision] = gflops / 1000.0
        out["sources"][f"peak_tflops.{precision}"] = f"given by hand ({spelled('--peak-flops', 'peak_gflops')})"
        given.append(f"{precision} {gflops:,g} GFLOP/s")
    if choice.dram_gbps is not None:
        out["dram_gbps"] = choice.dram_gbps
        out["sources"]["dram_gbps"] = f"given by hand ({spelled('--peak-bw', 'dram_gbps')})"
        given.append(f"DRAM {choice.dram_gbps:,g} GB/s")
    said = "peaks given by hand: " + ", ".join(given)
    return out, f"{said}; the rest from {how}" if spec is not None else f"{said} ({how})"


def _gpu_named() -> str:
    """How the user names a GPU: ``--gpu NAME`` on the command line, ``gpu=NAME`` in Python."""
    return spelled("--gpu NAME", "gpu=NAME")


def gpu_for_trace(trace: Trace, override: str | GpuChoice | None = None,
                  reg: Registry | None = None) -> tuple[dict | None, str]:
    """The catalog entry for a trace's GPU and a sentence saying how it was chosen.

    ``override`` (the user's ``--gpu``, or a :class:`GpuChoice` that may also
    give peaks by hand) wins and must be known; otherwise the first device the
    trace describes is matched by name. Returns ``(None, reason)`` when
    nothing matches. A device whose name matches no entry (ROCm's "AMD Radeon
    Graphics") is identified by its properties (:func:`identify_gpu`). Peaks
    given by hand replace the entry's (or, with no entry, are the whole spec).
    """
    if isinstance(override, GpuChoice):
        spec, how = gpu_for_trace(trace, override.name, reg)
        return _by_hand(spec, how, override)
    reg = reg or default_registry()
    if override:
        spec = find_gpu(override, reg)
        if spec is None:
            known = ", ".join(sorted(s["name"] for s in reg.gpu_specs))
            raise InputError(f"{spelled(f'--gpu {override!r}', f'gpu={override!r}')}: not in the GPU catalog "
                             f"(known: {known})")
        return spec, f"{spec['name']} (from {spelled('--gpu', 'gpu=')})"
    gpus = [d for d in trace.meta.devices if device_noun(d) == "GPU"]  # a TPU is in no GPU catalog
    names = [d.name for d in gpus if d.name]
    for device_name in names:
        spec = find_gpu(device_name, reg)
        if spec is not None:
            return spec, f"{spec['name']} (matched the trace's device {device_name!r})"
    for device in gpus:
        spec, fits = identify_gpu(device, reg)
        if spec is not None:
            others = [f for f in fits if f != spec["name"]]
            alike = ""
            if others:
                specs = [s for s in reg.gpu_specs if s["name"] in fits]
                listed = ", ".join(others[:-1]) + (" and " if len(others) > 1 else "") + others[-1]
                if _same_figures(specs):
                    alike = f"; {' and '.join(fits)} have these properties and the same figures"
                else:
                    alike = (f"; ambiguous: {listed} {'has' if len(others) == 1 else 'have'} these properties too, "
                             f"with other peak figures; the first catalog entry is used")
            which = repr(device.name) if device.name else f"{device.id if device.id is not None else ''} (unnamed)"
            return spec, (f"{spec['name']} (identified from the trace's device {which} by its "
                          f"properties: {_properties(device)}{alike}; {spelled('--gpu', 'gpu=')} to choose)")
    if names:
        return None, f"the trace's GPU {names[0]!r} is not in the catalog; pass {_gpu_named()}"
    if trace.meta.devices and not gpus:  # TPUs alone
        kinds = sorted({device_noun(d) for d in trace.meta.devices})
        return None, f"the trace's devices are {', '.join(kinds)}s, not GPUs; pass {_gpu_named()} for a GPU's roofs"
    return None, f"the trace does not name its GPU; pass {_gpu_named()}"
