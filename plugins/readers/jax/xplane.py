"""The XPlane protobuf (``<host>.xplane.pb``): an XSpace decoded with ``protobuf`` (schema: :mod:`.xspace_schema`).

An XSpace holds planes (``/device:GPU:0``, ``/host:CPU``, ``/host:metadata``, ``Task Environment``), each of
lines of events; an event names its metadata (name, display name, stats shared by its instances) and has
its own stats; a stat names its metadata (the stat's name) and holds a number, a text, or a reference to
another stat metadata whose name is the value (``ref_value``: XLA stores ``hlo_op`` and ``kernel_details``
so). A line's events start at ``line.timestamp_ns`` + ``offset_ps`` and last ``duration_ps``: both in
picoseconds, converted to integer ns (half to even, as the JSON converters round them). An event's name is
its metadata's display name where it has one (``GetEventForComputeStreamSyncPoint``), else its name, as in
the JSON timelines, so both forms give one intermediate table (:mod:`.events`).

Read only from the plane, beside the events:

* **devices**: each ``/device:GPU:N`` plane's stats: ``gpu_device_name`` (CUDA; ROCm writes none),
  ``core_count`` (SMs, or compute units), ``clock_rate`` (kHz), ``memory_size`` (bytes),
  ``compute_cap_major``/``_minor``, and in ``Device.extra`` ``memory_bandwidth`` (bytes/s) and
  ``device_vendor``: the trace's devices table, so the GPU catalog finds the peaks;
* ``/host:metadata`` stats (``jax_version``, ``jaxlib_version``, ``cuda_version``, ...) in ``meta.extra``;
  ``tool_version`` the JAX version; the XSpace's ``hostnames``, ``errors`` and ``warnings`` (the latter two
  as warnings);
* ``/host:metadata``'s compiled modules (each event metadata's ``Hlo Proto`` stat, an ``xla.HloProto``:
  :mod:`.hlo_schema`), returned beside the events for :mod:`.hlo_kernels`; a module that does not decode is
  left out with one warning.

A file cut short keeps its complete planes: the XSpace's top level (a sequence of length-prefixed fields)
is walked here and each plane decoded alone, so a plane the cut falls in is left out with one warning; a
plane that does not decode, or bytes that are not an XSpace, are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceparse.errors import bad_input
from traceparse.meta import PEAK_MEMORY_GBPS, PEAK_TFLOPS
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary
from traceparse.trace import Device, TraceMeta

from traceparse_plugins.readers.jax.events import RAW_SCHEMA, STATS, empty_raw

_KEPT = frozenset(STATS)
#: /host:metadata stats kept in meta.extra.
_METADATA = ("jax_version", "jaxlib_version", "cuda_version", "cuda_runtime_version", "cuda_driver_version",
             "gpu_version", "cpu_version", "rocm_version", "process_id")


def _protobuf():
    """The ``XPlane`` message class, or None when the protobuf package is missing."""
    try:
        from traceparse_plugins.readers.jax.xspace_schema import message_class
        return message_class("XPlane")
    except ImportError:
        return None


def read_xspace(path: Path, options: ReadOptions, meta: TraceMeta) -> tuple[pl.DataFrame, list]:
    """The intermediate table (:data:`.events.RAW_SCHEMA`) of an XSpace and its compiled modules
    (:class:`.hlo_cost.Module`); fills ``meta`` (devices, versions)."""
    plane_class = _protobuf()
    if plane_class is None:
        raise bad_input(path, None, "reading an XPlane needs the protobuf package (pip install protobuf), or give "
                                    "the profile's JSON timeline (*.trace.json.gz, perfetto_trace.json.gz)")
    with open_binary(path) as f:
        data = f.read()
    options.progress(len(data))
    planes, strings, cut = _top_level(path, data)
    for field, text in strings:
        if field == 2:
            options.warn(f"{path}: the profiler says: error: {text}")
        elif field == 3:
            options.warn(f"{path}: the profiler says: {text}")
    hostnames = [t for f, t in strings if f == 4]
    if hostnames:
        meta.extra["hostnames"] = hostnames
    if cut is not None:
        options.incomplete(f"{path}: cut short at byte {len(data)}: the plane starting at byte {cut} is incomplete "
                           f"and left out ({len(planes)} complete plane{'s' if len(planes) != 1 else ''} read)")
    parts, modules = [], []
    for offset, blob in planes:
        plane = plane_class()
        try:
            plane.ParseFromString(blob)
        except Exception as exc:  # protobuf's DecodeError, or a field of the wrong wire type
            raise bad_input(path, f"byte {offset}", f"an XPlane (a plane of the XSpace) that does not decode: "
                                                    f"{str(exc)[:80]}") from None
        _plane_facts(plane, meta)
        if plane.name == "/host:metadata":
            modules.extend(_modules(plane, path, options))
        frame = _events(plane)
        if frame is not None:
            parts.append(frame)
    meta.devices.sort(key=lambda d: (d.id is None, d.id))
    return (pl.concat(parts) if parts else empty_raw()), modules


def _modules(plane, path: Path, options: ReadOptions) -> list:
    """The compiled modules of the ``/host:metadata`` plane (its event metadata's ``Hlo Proto`` stats)."""
    from traceparse_plugins.readers.jax.hlo_cost import Module
    from traceparse_plugins.readers.jax.hlo_schema import hlo_proto_class

    names = {k: v.name for k, v in plane.stat_metadata.items()}
    proto_class, out, bad = hlo_proto_class(), [], []
    for md in plane.event_metadata.values():
        for st in md.stats:
            if names.get(st.metadata_id) != "Hlo Proto" or st.WhichOneof("value") != "bytes_value":
                continue
            proto = proto_class()
            try:
                proto.ParseFromString(st.bytes_value)
            except Exception:  # protobuf's DecodeError, or a field of the wrong wire type
                bad.append(md.name)
                continue
            out.append(Module(proto.hlo_module))
    if bad:
        one = len(bad) == 1
        options.warn(f"{path}: {len(bad)} compiled module{'' if one else 's'} (Hlo Proto) that do{'es' if one else ''} "
                     f"not decode, left out (their kernels get no FLOPs): {', '.join(sorted(bad)[:3])}")
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at ``data[i]``: (value, next index); IndexError past the end, ValueError when too long."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


#: The most bytes a serialized protobuf message (and so any field of one) can hold: 2 GiB − 1.
MAX_PROTOBUF_BYTES = 2**31 - 1


def _top_level(path: Path, data: bytes) -> tuple[list[tuple[int, bytes]], list[tuple[int, str]], int | None]:
    """The XSpace's planes (byte offset, bytes), its string fields (field number, text), and where a plane cut
    short starts (None when the file is whole)."""
    planes, strings, i, n = [], [], 0, len(data)
    while i < n:
        start = i
        try:
            key, i = _varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 2:
                length, i = _varint(data, i)
                if length > MAX_PROTOBUF_BYTES:  # no length a protobuf writer can write: not a cut file, not an XSpace
                    saved = data.count(b"\xef\xbf\xbd")
                    raise bad_input(path, f"byte {start}", f"not an XSpace protobuf (.xplane.pb): a field {length:,} "
                                    "bytes long, past protobuf's 2 GiB limit" + (
                                        f"; {saved:,} U+FFFD replacement characters in it: binary bytes saved as text?"
                                        if saved else ""))
                if i + length > n:
                    if number == 1 and planes:
                        return planes, strings, start
                    if number == 1:  # the file ends inside its first plane: an XSpace, but nothing whole in it
                        raise bad_input(path, f"byte {n}", f"an XSpace protobuf (.xplane.pb) cut short: the "
                                        f"file ends inside its first plane (from byte {start:,}, {length:,} bytes "
                                        "long), so no plane is complete to read")
                    raise IndexError
                value = data[i: i + length]
                i += length
            elif wire == 0:
                _, i = _varint(data, i)
                value = None
            elif wire in (1, 5):
                i += 8 if wire == 1 else 4
                value = None
            else:
                raise ValueError(f"wire type {wire}")
        except (IndexError, ValueError) as exc:
            what = "cut short" if isinstance(exc, IndexError) else f"bad field ({exc})"
            raise bad_input(path, f"byte {start}", f"not an XSpace protobuf (.xplane.pb): {what}") from None
        if number == 1 and wire == 2:
            planes.append((start, value))
        elif number in (2, 3, 4) and wire == 2:
            strings.append((number, value.decode("utf-8", errors="replace")))
        elif number not in (1, 2, 3, 4):
            raise bad_input(path, f"byte {start}", f"not an XSpace protobuf (.xplane.pb): field {number} at the "
                                                   "top level (an XSpace has fields 1 to 4)")
    if not planes:
        raise bad_input(path, None, "not an XSpace protobuf (.xplane.pb): no plane")
    return planes, strings, None


def _values(stats, names: dict[int, str]) -> dict[str, object]:
    """{stat name: value} of a list of XStat (a ``ref_value`` resolved to the name it refers to)."""
    out = {}
    for st in stats:
        which = st.WhichOneof("value")
        if which is None:
            continue
        value = names.get(st.ref_value) if which == "ref_value" else getattr(st, which)
        out[names.get(st.metadata_id, "")] = value
    return out


def _text(value) -> str | None:
    """A stat's value as the JSON timelines write it: text (a number as its decimal); bytes are not kept."""
    if value is None or isinstance(value, bytes):
        return None
    return repr(value) if isinstance(value, float) else str(value)


#: The peak figures XLA gives a TPU plane (``device_type_string`` names the model), kept in the device's extra
#: under the keys every reader uses (:data:`traceparse.meta.PEAK_TFLOPS`).
_ACCELERATOR_PEAKS = {"peak_teraflops_per_second": PEAK_TFLOPS, "peak_hbm_bw_gigabytes_per_second": PEAK_MEMORY_GBPS}


def _plane_facts(plane, meta: TraceMeta) -> None:
    """Devices from a device plane's stats, versions from /host:metadata."""
    names = {k: v.name for k, v in plane.stat_metadata.items()}
    stats = _values(plane.stats, names)
    if plane.name == "/host:metadata":
        for key in _METADATA:
            if key in stats and not isinstance(stats[key], bytes):
                meta.extra[key] = stats[key]
        if isinstance(stats.get("jax_version"), str):
            meta.tool_version = stats["jax_version"]
        return
    if not plane.name.startswith("/device:"):
        return
    try:
        device_id = int(plane.name.rsplit(":", 1)[1])
    except ValueError:
        return
    kind = plane.name.split(":")[1].upper()
    if kind != "GPU":  # a TPU core: its model and XLA's peak figures, kept for show
        name = stats.get("device_type_string")
        extra = {ours: stats[xla] for xla, ours in _ACCELERATOR_PEAKS.items()
                 if isinstance(stats.get(xla), (int, float)) and stats[xla] > 0}
        meta.devices.append(Device(id=device_id, name=name if isinstance(name, str) and name.strip() else None,
                                   kind=kind, extra=extra))
        return

    def number(key):
        v = stats.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None

    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    clock = number("clock_rate")
    extra = {k: stats[k] for k in ("memory_bandwidth", "device_vendor") if stats.get(k) is not None}
    if "amd" in str(extra.get("device_vendor", "")).lower():  # the word the Kineto reader gives: CUs, gfx
        extra["vendor"] = "AMD"
    if not (stats.get("gpu_device_name") or number("core_count") or number("memory_size") or extra):
        return
    meta.devices.append(Device(
        id=device_id, name=stats.get("gpu_device_name") or None,
        sm_count=int(number("core_count")) if number("core_count") else None,
        memory_bytes=int(number("memory_size")) if number("memory_size") else None,
        compute_capability=f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) and major > 0
        else None,
        core_clock_mhz=clock / 1000 if clock else None, extra=extra))


def _ns(ps: int) -> int:
    """Picoseconds -> integer ns, half to even."""
    q, r = divmod(ps, 1000)
    return q + (1 if r > 500 or (r == 500 and q % 2) else 0)


def _events(plane) -> pl.DataFrame | None:
    """One plane's events as the intermediate table (None when it has none)."""
    if not plane.lines:
        return None
    names = {k: v.name for k, v in plane.stat_metadata.items()}
    metas = {}
    for key, md in plane.event_metadata.items():
        shared = {k: _text(v) for k, v in _values(md.stats, names).items() if k in _KEPT}
        metas[key] = (md.display_name or md.name, shared)
    stats = _values(plane.stats, names)
    pid = stats.get("process_id") if isinstance(stats.get("process_id"), int) else plane.id
    rows: dict[str, list] = {c: [] for c in RAW_SCHEMA}
    kept = list(STATS)
    for line in plane.lines:
        line_name = line.display_name or line.name
        base_ps = line.timestamp_ns * 1000
        for e in line.events:
            if e.WhichOneof("data") == "num_occurrences":
                continue  # an aggregated event (no time of its own): not written by JAX's GPU profiler
            name, shared = metas.get(e.metadata_id, ("", {}))
            own = {k: _text(v) for k, v in _values(e.stats, names).items() if k in _KEPT} if e.stats else {}
            rows["plane"].append(plane.name)
            rows["line"].append(line_name)
            rows["line_id"].append(line.id)
            rows["pid"].append(pid)
            rows["name"].append(name)
            rows["start_ns"].append(_ns(base_ps + e.offset_ps))
            rows["duration_ns"].append(_ns(e.duration_ps))
            for s in kept:
                rows[s].append(own.get(s, shared.get(s)))
    return pl.DataFrame(rows, schema=RAW_SCHEMA)
