"""Host threads as people read them: ``pid/tid (name)``, and the role that makes two threads comparable.

Readers that know thread names (torch.profiler's ``thread_name`` metadata,
nsys's ``ThreadNames`` table) put them in ``meta.extra["thread_names"]`` as
``{"pid/tid": name}``. Rules show threads with :func:`thread_label` and
compare threads only with their peers (:func:`thread_role`): the main thread
and the autograd thread of one process do different work by design.
"""

from __future__ import annotations

import re

#: ``meta.extra`` key of the thread names a reader found: ``{"pid/tid": name}``.
THREAD_NAMES = "thread_names"

_NUMBERED = re.compile(r"[\s_\-#:.]*\d+$")


def thread_names(meta) -> dict[tuple[int, int], str]:
    """The trace's thread names as ``{(pid, tid): name}``; empty when its reader found none."""
    raw = (getattr(meta, "extra", None) or {}).get(THREAD_NAMES) or {}
    out: dict[tuple[int | None, int], str] = {}
    for key, name in raw.items():
        pid, _, tid = str(key).partition("/")
        try:  # "-/tid": a device's lane that is no stream (XLA's "XLA Ops" line), no process's thread
            out[(None if pid == "-" else int(pid), int(tid))] = str(name)
        except ValueError:
            continue
    return out


def thread_label(pid, device, tid, names: dict[tuple[int, int], str] | None = None,
                 nouns: dict[int, str] | None = None) -> str:
    """``pid/tid (name)`` for a host thread, ``GPU d`` for device rows; ``-`` for an unknown part.

    ``nouns`` (:func:`traceparse.meta.device_nouns`) names the devices that are not GPUs: ``TPU 2``.

    A thread that also has a device (TAU's node, context, thread) is
    ``pid.device.tid`` as TAU writes it (``0.1.0``: a context is no GPU);
    the name is shown only where the trace gives one.
    """
    noun = (nouns or {}).get(device, "GPU")
    if tid is None and device is not None:
        return f"{noun} {device}" + (f" (pid {pid})" if pid is not None else "")
    if pid is None and device is not None:  # a device's lane that is no stream (XLA's "XLA Ops" line)
        return f"{noun} {device}: {(names or {}).get((None, tid)) or f'line {tid}'}"
    name = (names or {}).get((pid, tid)) if pid is not None and tid is not None else None
    if device is not None and pid is not None and tid is not None:
        return f"{pid}.{device}.{tid}" + (f" ({name})" if name else "")
    base = f"{'-' if pid is None else pid}/{'-' if tid is None else tid}"
    extras = [name] if name else []
    if device is not None:
        extras.append(f"device {device}")
    return base + (f" ({', '.join(extras)})" if extras else "")


def thread_role(pid, tid, names: dict[tuple[int, int], str] | None = None) -> str:
    """What a thread is for, so that only peers are compared: ``main``, its name without a trailing number, or ``""``.

    A thread whose id is its process id (and not 0) is the process's main
    thread (Linux numbers it so): ``main``. Otherwise ``pt_autograd_0`` and
    ``pt_autograd_1`` are both ``pt_autograd``. Threads the trace does not
    name share the role ``""`` (as pprof compares all threads of a TAU
    profile, whose node and thread numbers are not process ids), and so do
    device rows.
    """
    if pid is not None and tid is not None and pid == tid and pid != 0:
        return "main"
    name = (names or {}).get((pid, tid)) if pid is not None and tid is not None else None
    if not name:
        return ""
    return _NUMBERED.sub("", name.strip()) or name.strip()
