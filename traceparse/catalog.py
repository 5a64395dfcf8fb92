"""Looking up GPU specifications (peak FLOP/s, bandwidths) in the catalog the plugins provide.

The data lives in plugins (hook ``traceparse_gpu_specs``); this module only
matches device names against it. A spec is a dict: ``name``, ``match`` (a
list of lower-case substrings that must all occur in the device name) and
the figures documented in docs/gpu_catalog.md.
"""

from __future__ import annotations

from traceparse.errors import InputError
from traceparse.plugins import Registry, registry as default_registry
from traceparse.trace import Trace


def find_gpu(name: str | None, reg: Registry | None = None) -> dict | None:
    """The catalog entry for a device name as a tool writes it, or None.

    Every substring of an entry's ``match`` list must occur in the
    lower-cased name; among matching entries the most specific (longest
    total match) wins, so "A100-SXM4-80GB" prefers the 80 GB entry.
    """
    if not name:
        return None
    lowered = name.lower()
    best, best_len = None, 0
    for spec in (reg or default_registry()).gpu_specs:
        patterns = [p.lower() for p in spec.get("match", [])]
        if patterns and all(p in lowered for p in patterns):
            length = sum(len(p) for p in patterns)
            if length > best_len:
                best, best_len = spec, length
    return best


def gpu_for_trace(trace: Trace, override: str | None = None, reg: Registry | None = None) -> tuple[dict | None, str]:
    """The catalog entry for a trace's GPU and a sentence saying how it was chosen.

    ``override`` (the user's ``--gpu``) wins and must be known; otherwise the
    first device the trace describes is matched by name. Returns
    ``(None, reason)`` when nothing matches.
    """
    reg = reg or default_registry()
    if override:
        spec = find_gpu(override, reg)
        if spec is None:
            known = ", ".join(sorted(s["name"] for s in reg.gpu_specs))
            raise InputError(f"--gpu {override!r}: not in the GPU catalog (known: {known})")
        return spec, f"{spec['name']} (from --gpu)"
    names = [d.name for d in trace.meta.devices if d.name]
    for device_name in names:
        spec = find_gpu(device_name, reg)
        if spec is not None:
            return spec, f"{spec['name']} (matched the trace's device {device_name!r})"
    if names:
        return None, f"the trace's GPU {names[0]!r} is not in the catalog; pass --gpu NAME"
    return None, "the trace does not name its GPU; pass --gpu NAME"
