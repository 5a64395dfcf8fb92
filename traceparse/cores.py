"""What this machine lends the process: the cores it may run on (what decoding threads, rank workers and rules at
once are bounded by) and the memory still free (what a whole run's critical-path graph is checked against)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """The bytes of memory this process could still take: the system's available memory (``MemAvailable``: free
    and reclaimable), less where a control group (a container's limit) leaves less; None where the system does
    not say."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        free = None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            used = int(f.read().strip())
        if limit != "max":
            left = max(0, int(limit) - used)
            free = left if free is None else min(free, left)
    except (OSError, ValueError):
        pass
    return free
