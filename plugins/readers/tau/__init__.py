"""TAU Performance System profiles as traceparse rows (reader ``tau``).

Reads ``profile.<node>.<context>.<thread>`` text profiles (a directory of
them, ``MULTI__<METRIC>/`` directories with one metric each, or loose
files), merged ``tauprofile.xml`` and snapshot XML, ParaProf's packed
profile (``.ppk``) and pprof's text report. Routines become aggregated rows (region; kernel, memcpy, sync or
api where TAU's CUDA support marks them), with calls, Subrs, exclusive and
inclusive time, TAU group, node/context/thread as pid/device_id/tid and
call paths as ``call_path`` + ``parent_id``; other metrics and user events
become counter rows. docs/formats/tau.md has the details.

Layout: :mod:`.sniff` recognises each form; the forms are
:mod:`.profiles` (directories and loose ``profile.N.C.T`` files, parsed by
:mod:`.profile_text`), :mod:`.xml_profile` (merged ``tauprofile.xml`` and
``snapshot.N.C.T`` XML), :mod:`.packed` (ParaProf's ``.ppk``) and
:mod:`.pprof` (pprof's text report); all become
the same rows in :mod:`.events`. decimal text becomes integers only through
:mod:`traceparse.units` (:mod:`.decimals`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from traceparse.errors import InputError, bad_input
from traceparse.meta import HOSTNAMES, OUTSIDE_ROUTINES, SUMMED_THREADS
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Device, Trace, TraceMeta

# what reads a profile (polars, lxml) is imported by read(): every command that sniffs its paths loads this module
from .sniff import (HEADER, MULTI_PREFIX, PACKED_HEAD, PPROF_DUMP, PROFILE_NAME, SNAPSHOT_NAME, XML_HEAD,
                    looks_like_pprof, sniff)

if TYPE_CHECKING:
    from .profiles import ProfileSet
    from .whole import WholeNumbers


class TauReader(Reader):
    name = "tau"
    description = ("TAU profiles: profile.N.C.T directories, MULTI__ metric directories, merged XML, ParaProf .ppk, "
                   "pprof text")
    variants = (
        "profile.<node>.<context>.<thread> text (templated_functions[_MULTI_<METRIC>]), TAU 2.x, ParaProf export",
        "MULTI__<METRIC>/ directories (TIME, PAPI, CUPTI counters) merged into one trace",
        "merged XML (tauprofile.xml, TAU_PROFILE_FORMAT=merged) and snapshot.N.C.T XML",
        "ParaProf packed profile (.ppk, every thread and metric of a run in one file), versions 1 and 2",
        "pprof text report (per thread, or FUNCTION SUMMARY total/mean)",
    )
    patterns = ("profile.*.*.*", "MULTI__*", "tauprofile.xml", "snapshot.*.*.*", "*.ppk", "*.pprof")

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Loose profile.N.C.T files of one directory (or of sibling MULTI__ directories) are one trace."""
        groups: dict[Path, list[Path]] = {}
        out: list[list[Path]] = []
        for p in paths:
            if p.is_file() and PROFILE_NAME.match(p.name) and HEADER.match(read_head(p, 256)):
                root = p.parent.parent if p.parent.name.startswith(MULTI_PREFIX) else p.parent
                if root not in groups:
                    groups[root] = []
                    out.append(groups[root])
                groups[root].append(p)
            else:
                out.append([p])
        return out

    def ranks(self, group: list[Path]) -> list[list[Path]]:
        """A run of one folder's profiles (``ingest DIR --run NAME``): a rank per node, ``N`` of
        ``profile.N.C.T`` (MPI writes one node per rank), each with its contexts, threads and metric folders."""
        nodes: dict[int, list[Path]] = {}
        for path in group:
            match = PROFILE_NAME.match(path.name)
            if match is None:  # a merged XML, a packed profile: one file of every node, not split
                return [group]
            nodes.setdefault(int(match.group(1)), []).append(path)
        return [nodes[n] for n in sorted(nodes)] if len(nodes) > 1 else [group]

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        from . import events
        from .packed import read_packed
        from .pprof import read_pprof
        from .profiles import NO_PROFILES, discover, read_sources, source_for
        from .whole import WholeNumbers
        from .xml_profile import read_xml

        path = paths[0]
        extra: dict = {}
        warn = _noting_cuts(options)
        if len(paths) == 1 and path.is_dir():
            xml = path / "tauprofile.xml"
            try:
                sources = discover(path, warn)
            except InputError:
                if not xml.is_file():
                    raise
                sources = None
            if sources is None:
                profile, variant = read_xml(xml, warn, options.progress), "merged XML (tauprofile.xml)"
            else:
                profile = read_sources(sources, warn, options.progress)
                variant = _text_variant(profile)
        else:
            head = read_head(path)
            if len(paths) == 1:
                _refuse_unread_forms(path, head)
            if len(paths) > 1 or HEADER.match(head) or PROFILE_NAME.match(path.name):
                profile = read_sources([source_for(p) for p in paths], warn, options.progress)
                variant = _text_variant(profile)
            elif head.startswith(PACKED_HEAD) or path.suffix.lower() == ".ppk":
                profile = read_packed(path, warn, options.progress)
                variant = _text_variant(profile, "ParaProf packed profile (.ppk)")
            elif XML_HEAD.match(head) or b"<profile_xml" in head or path.suffix == ".xml" \
                    or SNAPSHOT_NAME.match(path.name):
                profile = read_xml(path, warn, options.progress)
                # merged (TAU_PROFILE_FORMAT=merged) holds every thread; a snapshot file one thread's snapshots
                merged = path.name == "tauprofile.xml" or profile.threads.height > 1
                variant = "merged XML" if merged else "snapshot XML"
            elif looks_like_pprof(head.decode("utf-8", errors="replace")):
                profile, sections = read_pprof(path, warn, options.progress)
                table = "per-thread tables" if sections["read"] == "thread" else sections["read"] + " summary"
                variant = f"pprof text ({table})"
                extra["pprof_tables"] = sections["tables"]
                if sections["summed_threads"]:
                    extra[SUMMED_THREADS] = sections["summed_threads"]
            else:
                raise bad_input(path, None, NO_PROFILES)
        rows, notes = events.build_events(profile.routines, profile.counters, profile.user_events, profile.threads)
        if notes.get("counters_without_routine"):
            options.warn(f"{notes['counters_without_routine']} counter values had no routine to attach to")
        numbers = WholeNumbers()
        meta = _meta(profile, variant, extra, numbers, path)
        numbers.flush(options.warn)
        meta.warnings = options.warnings  # what was noticed while reading
        return Trace(rows, meta)


def _refuse_unread_forms(path: Path, head: bytes) -> None:
    """A one-line refusal, saying how to get what this reader reads, of TAU's forms it recognises but does not
    read: ``pprof -d``'s dump."""
    name = shlex.quote(path.name)
    if PPROF_DUMP.match(head):
        raise InputError(f"{path}: a `pprof -d` dump, which traceparse does not read: give the profile.N.C.T "
                         f"files (or their folder) that pprof read, or let `paraprof -f pprof --dump {name}` "
                         "write them")


def _text_variant(profile: ProfileSet, where: str | None = None) -> str:
    from . import events

    threads = profile.routines.select(events.THREAD).unique()
    nodes = threads.select(events.THREAD[0]).n_unique() if threads.height else 0
    metrics = ", ".join(profile.metrics)
    if where is None:
        where = "MULTI__ directories" if len(profile.metrics) > 1 else "profile.N.C.T text"
    # TAU's node is an MPI rank (a process): "8 nodes" says what "8 threads" of one thread each did not
    said = (f"{nodes} nodes, {threads.height} threads" if nodes > 1
            else f"{threads.height} thread{'s' if threads.height != 1 else ''}")
    return f"{where}: {said}, metrics {metrics}"


#: TAU's timer around the whole program: its exclusive time is the time in no other instrumented routine.
TOP_TIMER = ".TAU application"


def _meta(profile: ProfileSet, variant: str, extra: dict, numbers: WholeNumbers, path: Path) -> TraceMeta:
    from . import events

    meta = TraceMeta(tool="TAU", variant=variant)
    first = profile.metadata[0][1] if profile.metadata else {}
    meta.tool_version = first.get("TAU Version")
    meta.devices = _devices(profile.metadata, numbers, path)
    threads = profile.routines.select(events.THREAD).unique().height
    meta.extra = {"metrics": profile.metrics, "time_metric": profile.time_metric, "threads": threads,
                  "files_read": profile.files_read, **extra}
    if (profile.routines["raw"].str.strip_chars() == TOP_TIMER).any():
        meta.extra[OUTSIDE_ROUTINES] = TOP_TIMER
    if first:
        meta.extra["metadata"] = first
    names = [attrs.get("Hostname") for _, attrs in profile.metadata]  # one per thread, in node order
    if any(isinstance(n, str) and n.strip() for n in names):
        meta.extra[HOSTNAMES] = list(dict.fromkeys(n for n in names if isinstance(n, str) and n.strip()))
    nodes = profile.routines["node"].drop_nulls().unique().to_list() if "node" in profile.routines.columns else []
    if len(nodes) == 1:  # one node's profile: TAU's node is the MPI rank, so this file is one rank of a run
        meta.distributed = {"rank": int(nodes[0])}
    return meta


def _devices(metadata: list, numbers: WholeNumbers, path: Path) -> list[Device]:
    """GPUs named in TAU's metadata (``GPU Name``, ``GPU numMultiprocessors``, ...), one per CUDA device; a
    property that is not a whole number is left unknown with a warning naming ``path``, the thread and the field."""
    from .whole import quiet_int

    devices: dict[int, Device] = {}
    for key, attrs in metadata:
        if "GPU Name" not in attrs:
            continue
        ident = quiet_int(attrs.get("CUDA Device")) or 0  # the thread's reading warned about a bad one
        if ident in devices:
            continue
        thread = ".".join(map(str, key))
        own = path / f"profile.{thread}" if path.is_dir() else None  # a directory of profiles: the thread's file
        where = f"{own} (metadata)" if own is not None and own.is_file() else f"{path} (thread {thread} metadata)"

        def whole(field: str) -> int | None:
            return numbers(attrs.get(field), field, where)

        major, minor = attrs.get("GPU computeCapabilityMajor"), attrs.get("GPU computeCapabilityMinor")
        clock = whole("GPU coreClockRate")
        memory_clock = whole("GPU memoryClockRate")
        devices[ident] = Device(
            id=ident, name=attrs["GPU Name"], sm_count=whole("GPU numMultiprocessors"),
            memory_bytes=whole("GPU globalMemorySize"),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            core_clock_mhz=clock / 1000 if clock is not None else None,  # CUDA reports kHz
            memory_clock_mhz=memory_clock / 1000 if memory_clock is not None else None,
            extra={k: v for k, v in attrs.items() if k.startswith("GPU ")},
        )
    return [devices[k] for k in sorted(devices)]


@hookimpl
def traceparse_readers():
    return [TauReader()]


#: This reader's own words for an input that ends before its end (a run killed, a copy cut short).
_CUT = re.compile(r"cut short|the file ends (?:early|after|before|in the middle)")


def _noting_cuts(options: ReadOptions):
    """``options.warn``, but a warning that the input was cut short is ``options.incomplete``: every analysis of
    the trace repeats it."""
    def warn(message: str) -> None:
        (options.incomplete if _CUT.search(message) else options.warn)(message)
    return warn
