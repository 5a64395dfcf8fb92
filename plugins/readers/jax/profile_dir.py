"""The files of a JAX profile directory: what ``jax.profiler.trace(log_dir)`` writes, one file per host chosen.

JAX writes ``log_dir/plugins/profile/<run>/`` (``<run>`` the start time, ``2026_11_25_00_53_35``) holding
``<host>.xplane.pb`` (the XSpace, one per host), ``perfetto_trace.json.gz`` (with
``create_perfetto_trace=True``: every host of the run), and, once xprof or TensorBoard has opened it,
``<host>.trace.json.gz``. A directory given is that ``log_dir``, its ``plugins/profile`` directory, or one
run directory. Of several runs the latest (the greatest name: the names are times) is read. Per host the
richest file is read: the XPlane when the ``protobuf`` package is importable, else the host's trace-viewer
JSON, else the run's ``perfetto_trace.json.gz``.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

XPLANE = ".xplane.pb"
TRACE_JSON = (".trace.json.gz", ".trace.json")
PERFETTO = ("perfetto_trace.json.gz", "perfetto_trace.json")


def _host_files(run: Path) -> dict[str, dict[str, Path]]:
    """{host: {"xplane" | "json": path}} of one run directory."""
    hosts: dict[str, dict[str, Path]] = {}
    try:
        entries = sorted(p for p in run.iterdir() if p.is_file())
    except OSError:
        return {}
    for p in entries:
        name = p.name
        if name.endswith(XPLANE):
            hosts.setdefault(name[: -len(XPLANE)], {})["xplane"] = p
        for suffix in TRACE_JSON:
            if name.endswith(suffix) and name not in PERFETTO:
                hosts.setdefault(name[: -len(suffix)], {}).setdefault("json", p)
    return hosts


def _perfetto(run: Path) -> Path | None:
    for name in PERFETTO:
        if (run / name).is_file():
            return run / name
    return None


def _is_run(path: Path) -> bool:
    return bool(_host_files(path)) or _perfetto(path) is not None


def run_directory(path: Path) -> Path | None:
    """The run directory a directory holds (itself, the latest under ``plugins/profile``, or the latest child)."""
    if _is_run(path):
        return path
    for parent in (path / "plugins" / "profile", path / "profile", path):
        try:
            runs = sorted((p for p in parent.iterdir() if p.is_dir() and _is_run(p)), key=lambda p: p.name)
        except OSError:
            continue
        if runs:
            return runs[-1]
    return None


def profile_files(path: Path, *, xplane: bool | None = None) -> list[Path]:
    """The files to read from a JAX profile directory, one per host (empty when it is not one).

    ``xplane``: read XPlanes (default: when the ``protobuf`` package is installed).
    """
    run = run_directory(path)
    if run is None:
        return []
    if xplane is None:
        xplane = find_spec("google.protobuf") is not None
    hosts = _host_files(run)
    chosen = []
    for host in sorted(hosts):
        files = hosts[host]
        pick = files.get("xplane") if xplane else None
        pick = pick or files.get("json") or (None if _perfetto(run) else files.get("xplane"))
        if pick is not None:
            chosen.append(pick)
    perfetto = _perfetto(run)
    if perfetto is not None and not any(p.name.endswith(XPLANE) or p.name.endswith(TRACE_JSON) for p in chosen):
        chosen = [perfetto]  # every host of the run in one file
    return chosen
