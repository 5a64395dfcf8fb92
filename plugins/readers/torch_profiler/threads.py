"""Thread names from Kineto's ``thread_name`` metadata events, for ``meta.extra["thread_names"]``.

Kineto writes ``{"ph": "M", "name": "thread_name", "pid": P, "tid": T,
"args": {"name": "thread T (pt_autograd_0)"}}`` for every host thread (and
``"stream 7 "`` for GPU streams, which are not host threads and are left
out). A thread named twice keeps its last name (Kineto first names the
autograd thread after the process, then ``pt_autograd_0``).
"""

from __future__ import annotations

import re

import msgspec

from traceparse.validate import ascii_int

_LABEL = re.compile(r"^thread\s+\d+\s+\((.*)\)\s*$")


def thread_key(pid, tid) -> str | None:
    """``"pid/tid"`` of a thread whose ids are integers, or digits as text (PyTorch 1.8's ``"tid": "4093687616"``,
    which the events' column reads as that integer); None for a label (``"Spans"``)."""
    ids = [ascii_int(pid), ascii_int(tid)]
    return None if None in ids else f"{ids[0]}/{ids[1]}"


def collect_thread_names(events, into: dict[str, str]) -> None:
    """Add the ``pid/tid -> name`` of the ``thread_name`` events among ``events`` to ``into``."""
    for e in [e for e in events if e.ph == "M" and e.name == "thread_name"]:
        key = thread_key(e.pid, e.tid)
        if e.args is None or key is None:
            continue
        name = thread_name(e.args.meta_name)
        if name:
            into[key] = name


def thread_name(raw: msgspec.Raw) -> str | None:
    """The host thread's name in a ``thread_name`` event's raw ``args.name`` (None: none, or a GPU stream)."""
    try:
        label = msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None
    if not isinstance(label, str) or label.lower().startswith("stream"):
        return None
    m = _LABEL.match(label)
    return (m.group(1) if m else label).strip() or None
