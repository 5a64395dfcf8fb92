"""The ``tau`` reader: which TAU form a path is, and the trace metadata.

Forms (see the module of each): a directory of ``profile.N.C.T`` text
profiles or of ``MULTI__<METRIC>/`` directories (:mod:`.profiles`), loose
profile files (grouped by directory into one trace), merged
``tauprofile.xml`` / ``snapshot.N.C.T`` XML (:mod:`.xml_profile`), and
pprof's text report (:mod:`.pprof`). All become the same rows
(:mod:`.build`).
"""

from __future__ import annotations

import re
from pathlib import Path

from traceparse.errors import InputError, bad_input
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Device, Trace, TraceMeta

from . import build
from .profiles import MULTI_PREFIX, NO_PROFILES, PROFILE_NAME, ProfileSet, discover, read_sources, source_for
from .pprof import looks_like_pprof, read_pprof
from .xml_profile import read_xml

_HEADER = re.compile(rb"^\s*\d+\s+templated_functions")
_SNAPSHOT_NAME = re.compile(r"^snapshot\.\d+\.\d+\.\d+(?:\.gz)?$")
_XML_HEAD = re.compile(rb"^\s*(?:\xef\xbb\xbf)?\s*(?:<\?xml[^>]*\?>\s*)?<profile_xml>")


class TauReader(Reader):
    name = "tau"
    description = "TAU profiles: profile.N.C.T directories, MULTI__ metric directories, merged XML, pprof text"
    variants = (
        "profile.<node>.<context>.<thread> text (templated_functions[_MULTI_<METRIC>]), TAU 2.x, ParaProf export",
        "MULTI__<METRIC>/ directories (TIME, PAPI, CUPTI counters) merged into one trace",
        "merged XML (tauprofile.xml, TAU_PROFILE_FORMAT=merged) and snapshot.N.C.T XML",
        "pprof text report (per thread, or FUNCTION SUMMARY total/mean)",
    )
    patterns = ("profile.*.*.*", "MULTI__*", "tauprofile.xml", "snapshot.*.*.*", "*.pprof")

    def sniff(self, path: Path, head: bytes) -> float:
        if path.is_dir():
            return _sniff_directory(path)
        if _HEADER.match(head):
            return 0.95
        if _XML_HEAD.match(head):
            return 0.95
        if looks_like_pprof(head.decode("utf-8", errors="replace")):
            return 0.9
        if PROFILE_NAME.match(path.name) or _SNAPSHOT_NAME.match(path.name) or path.name == "tauprofile.xml":
            return 0.3  # named like TAU's output: read it, to say precisely what is wrong
        return 0.0

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Loose profile.N.C.T files of one directory (or of sibling MULTI__ directories) are one trace."""
        groups: dict[Path, list[Path]] = {}
        out: list[list[Path]] = []
        for p in paths:
            if p.is_file() and PROFILE_NAME.match(p.name) and _HEADER.match(read_head(p, 256)):
                root = p.parent.parent if p.parent.name.startswith(MULTI_PREFIX) else p.parent
                if root not in groups:
                    groups[root] = []
                    out.append(groups[root])
                groups[root].append(p)
            else:
                out.append([p])
        return out

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        extra: dict = {}
        if len(paths) == 1 and path.is_dir():
            xml = path / "tauprofile.xml"
            try:
                sources = discover(path, options.warn)
            except InputError:
                if not xml.is_file():
                    raise
                sources = None
            if sources is None:
                profile, variant = read_xml(xml, options.warn, options.progress), "merged XML (tauprofile.xml)"
            else:
                profile = read_sources(sources, options.warn, options.progress)
                variant = _text_variant(profile)
        else:
            head = read_head(path)
            if len(paths) > 1 or _HEADER.match(head) or PROFILE_NAME.match(path.name):
                profile = read_sources([source_for(p) for p in paths], options.warn, options.progress)
                variant = _text_variant(profile)
            elif _XML_HEAD.match(head) or b"<profile_xml" in head or path.suffix == ".xml" \
                    or _SNAPSHOT_NAME.match(path.name):
                profile = read_xml(path, options.warn, options.progress)
                variant = "merged XML" if path.name == "tauprofile.xml" else "snapshot XML"
            elif looks_like_pprof(head.decode("utf-8", errors="replace")):
                profile, sections = read_pprof(path, options.warn, options.progress)
                table = "per-thread tables" if sections["read"] == "thread" else sections["read"] + " summary"
                variant = f"pprof text ({table})"
                extra["pprof_tables"] = sections["tables"]
            else:
                raise bad_input(path, None, NO_PROFILES)
        events, notes = build.build_events(profile.routines, profile.counters, profile.user_events, profile.threads)
        if notes.get("counters_without_routine"):
            options.warn(f"{notes['counters_without_routine']} counter values had no routine to attach to")
        meta = _meta(profile, variant, extra)
        meta.warnings = options.warnings  # what was noticed while reading
        return Trace(events, meta)


def _sniff_directory(path: Path) -> float:
    try:
        entries = list(path.iterdir())
    except OSError:
        return 0.0
    if any(PROFILE_NAME.match(p.name) for p in entries):
        return 0.9
    for sub in entries:
        if sub.name.startswith(MULTI_PREFIX) and sub.is_dir():
            try:
                if any(PROFILE_NAME.match(p.name) for p in sub.iterdir()):
                    return 0.9
            except OSError:
                continue
    if (path / "tauprofile.xml").is_file():
        return 0.8
    return 0.0


def _text_variant(profile: ProfileSet) -> str:
    threads = profile.routines.select(build.THREAD).unique().height
    metrics = ", ".join(profile.metrics)
    where = "MULTI__ directories" if len(profile.metrics) > 1 else "profile.N.C.T text"
    return f"{where}: {threads} threads, metrics {metrics}"


def _meta(profile: ProfileSet, variant: str, extra: dict) -> TraceMeta:
    meta = TraceMeta(tool="TAU", variant=variant)
    first = profile.metadata[0][1] if profile.metadata else {}
    meta.tool_version = first.get("TAU Version")
    meta.devices = _devices(profile.metadata)
    threads = profile.routines.select(build.THREAD).unique().height
    meta.extra = {"metrics": profile.metrics, "time_metric": profile.time_metric, "threads": threads,
                  "files_read": profile.files_read, **extra}
    if first:
        meta.extra["metadata"] = first
    return meta


def _devices(metadata: list) -> list[Device]:
    """GPUs named in TAU's metadata (``GPU Name``, ``GPU numMultiprocessors``, ...), one per CUDA device."""
    devices: dict[int, Device] = {}
    for _, attrs in metadata:
        if "GPU Name" not in attrs:
            continue
        ident = _int(attrs.get("CUDA Device")) or 0
        if ident in devices:
            continue
        major, minor = attrs.get("GPU computeCapabilityMajor"), attrs.get("GPU computeCapabilityMinor")
        clock = _int(attrs.get("GPU coreClockRate"))
        memory_clock = _int(attrs.get("GPU memoryClockRate"))
        devices[ident] = Device(
            id=ident, name=attrs["GPU Name"], sm_count=_int(attrs.get("GPU numMultiprocessors")),
            memory_bytes=_int(attrs.get("GPU globalMemorySize")),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            core_clock_mhz=clock / 1000 if clock is not None else None,  # CUDA reports kHz
            memory_clock_mhz=memory_clock / 1000 if memory_clock is not None else None,
            extra={k: v for k, v in attrs.items() if k.startswith("GPU ")},
        )
    return [devices[k] for k in sorted(devices)]


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
