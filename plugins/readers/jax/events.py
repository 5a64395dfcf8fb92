"""From XLA profiler events (planes, lines, events and their stats) to rows of the normalized event table.

Both forms the reader reads give the same intermediate table, :data:`RAW_SCHEMA`: one row per event with
its plane (the Chrome JSON's process name: ``/device:GPU:0``, ``/host:CPU``), its line (the thread name:
``Stream #14(Compute,MemcpyD2D)``, ``python3``, ``XLA Ops``), the line's id, the host process id, name,
start and duration in ns, and the stats the reader keeps as text (:data:`STATS`). :func:`to_rows` turns it
into event rows, the same way for both, so the JSON timeline and the XPlane of one capture give one table:

* **device planes** (``/device:GPU:N``: ``device_id`` N): on a ``Stream #S(...)`` line (``stream_id`` S) a
  copy (name ``Memcpy*`` or a ``memcpy_details`` stat: ``memcpy``, with direction, bytes and memory kinds),
  a memset (``Memset*`` or ``Memset_details``: ``memset``) or else a ``kernel``, with its launch
  configuration from ``kernel_details`` (:mod:`.details`); ``XLA Ops`` / ``TensorFlow Ops`` lines: ``op``;
  ``Steps``: step ``region`` rows (``group`` ``"step"``); ``Launch Stats`` (xprof's per-step launch
  summary, which launch-stats computes from the events themselves): left out; any other line: ``region``.
  Each such line (no stream) is a lane of its own: ``tid`` its line id, named by the line (``GPU 0: XLA
  Ops``), so that a module's, an op's and a name scope's time are not summed on one timeline; the ``Async XLA
  Ops`` line's spans (an async copy from start to done) overlap one another and are ``group``
  :data:`traceparse.schema.ASYNC_GROUP`.
* **host planes** (``/host:CPU``): an event with a ``correlation_id`` is a CUDA/HIP API call (``api``); an
  event with a ``step_num`` (``jax.profiler.StepTraceAnnotation``) a step ``region`` named ``NAME N``
  (``group`` ``"step"``, the name xprof's trace viewer gives it); an event of no duration a ``marker``;
  any other (Python frames ``$file.py:12 f``, XLA's TraceMe ranges) a ``region``. ``pid`` is the host
  process, ``tid`` the line's id. The profiler's own start and stop (``jax.profiler.start_trace`` and
  ``stop_trace`` as the Python tracer records them) are left out (:func:`without_profiler_frames`).
* ``hlo_op`` and ``hlo_module`` are kept in their columns on every row that has them (and the module's
  ``program_id`` in ``_program_id``, which the reader drops once :mod:`.hlo_kernels` has used it); ``correlation_id``
  links a kernel to its launch. A kernel replayed by a CUDA graph (XLA's command buffers: a
  ``cuda_graph_id`` stat) carries the correlation id of the ``cuGraphLaunch`` that replayed it, so it is
  attributed to that launch as every graph kernel is (measure ``launches``).
* XLA's CUDA profiler writes the API call that launched a kernel (or a copy, a memset) under the name of
  that GPU work, not of the call: such a host event (same correlation id and the same name as its GPU
  work) is named after the driver call family with the tool's name after it: ``cuLaunchKernel
  (loop_add_fusion)``, ``cuMemcpyAsync (MemcpyH2D)``, ``cuMemsetAsync (Memset)`` (the trace does not say
  whether it was ``cuLaunchKernel`` or ``cuLaunchKernelEx``). ROCm captures name the call itself
  (``hipModuleLaunchKernel``) and keep their names.
* The theoretical occupancy XLA computes for each kernel (``theoretical_occupancy_pct``, else the
  ``occ_pct`` of ``kernel_details``; 0 on ROCm: not computed, left out) becomes one ``counter`` row named
  ``theoretical_occupancy`` (unit ``%``, ``parent_id`` the kernel's row, ``group`` ``"kernel_details"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceparse import expr
from traceparse.meta import Device
from traceparse.schema import ASYNC_GROUP
from traceparse_plugins.readers.jax import details

#: The stats kept from each event (as text), by the name XLA gives them; JSON ``args`` keys are the same.
STATS = ("correlation_id", "hlo_op", "hlo_module", "kernel_details", "memcpy_details", "Memset_details",
         "theoretical_occupancy_pct", "cuda_graph_id", "step_num", "program_id")
RAW_SCHEMA = pl.Schema({"plane": pl.String, "line": pl.String, "line_id": pl.Int64, "pid": pl.Int64,
                        "name": pl.String, "start_ns": pl.Int64, "duration_ns": pl.Int64,
                        **{s: pl.String for s in STATS}})
_DEVICE_PLANE = r"^/device:[A-Za-z_]+:([0-9]{1,9})$"
_DEVICE_KIND = r"^/device:([A-Za-z_]+):[0-9]{1,9}$"
_STREAM_LINE = r"^Stream #([0-9]{1,18})\b"
STEP_GROUP = "step"
#: A CUDA API call XLA names after its GPU work: the driver call family it is, by the kind of that work.
CALL_FAMILY = {"kernel": "cuLaunchKernel", "memcpy": "cuMemcpyAsync", "memset": "cuMemsetAsync"}
OCCUPANCY = "theoretical_occupancy"


#: JAX's own profiler entry points as its Python tracer names them (``$profiler.py:271 stop_trace``): starting the
#: profiler session and collecting it (14 and 25 ms of a 61 ms capture of 4 steps on an H100).
PROFILER_FRAME = r"^\$profiler\.py:[0-9]+ (start_trace|stop_trace)$"
#: A frame around one of them that holds nothing else (``jax.profiler.trace``'s generator, contextlib's
#: ``__exit__``): at most this much longer, in ns, or this fraction of it.
WRAPPER_SLACK_NS, WRAPPER_SLACK = 50_000, 0.01


def without_profiler_frames(raw: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """``raw`` without the profiler's own start and stop (:data:`PROFILER_FRAME`) on the host lines: each such
    frame, what nests inside it on its line, and the frames around it that hold nothing else (the ``trace``
    context manager's, contextlib's ``__exit__``: :data:`WRAPPER_SLACK_NS`). They are the profiler's work, not the
    program's, as Kineto's own ``overhead`` events are: left in, a capture's span was two thirds profiler and its
    top routine ``stop_trace``. Returns the table and how many events were left out."""
    host = ~pl.col("plane").str.starts_with("/device:")
    own = raw.filter(host & pl.col("name").str.contains(PROFILER_FRAME))
    if own.height == 0:
        return raw, 0
    spans = own.select("plane", "line_id", a="start_ns", b=pl.col("start_ns") + pl.col("duration_ns"))
    end = pl.col("start_ns") + pl.col("duration_ns")
    slack = pl.max_horizontal(pl.lit(WRAPPER_SLACK_NS), (WRAPPER_SLACK * (pl.col("b") - pl.col("a"))).cast(pl.Int64))
    near = (raw.with_row_index("_row").filter(host)
            .join(spans, on=["plane", "line_id"], how="inner", nulls_equal=True))
    inside = (pl.col("start_ns") >= pl.col("a")) & (end <= pl.col("b"))
    around = ((pl.col("start_ns") <= pl.col("a")) & (end >= pl.col("b"))
              & (pl.col("duration_ns") - (pl.col("b") - pl.col("a")) <= slack))
    gone = near.filter(inside | around)["_row"].unique()
    kept = raw.with_row_index("_row").filter(~pl.col("_row").is_in(gone.implode())).drop("_row")
    return kept, raw.height - kept.height


def empty_raw() -> pl.DataFrame:
    """An intermediate table with no event."""
    return pl.DataFrame(schema=RAW_SCHEMA)


@dataclass
class Notes:
    """What :func:`to_rows` noticed, for the reader's warnings."""

    #: launch-configuration values left out as impossible (:func:`.details.checked`), by what was wrong
    impossible: dict[str, int] = field(default_factory=dict)
    #: GPU work on a device line that names no stream: how many, and the first one's plane and line id
    unplaced: int = 0
    unplaced_at: tuple[str, int | None] | None = None


def to_rows(raw: pl.DataFrame) -> tuple[pl.DataFrame, Notes]:
    """Event rows (``event_id`` numbered from 0) of an intermediate table, and what was noticed (:class:`Notes`).

    An event of a device plane on a line that names no stream (a Chrome thread without its ``thread_name``,
    an XLine without a name) that carries a GPU-work stat (``kernel_details``, ``memcpy_details``,
    ``Memset_details``, or on an unnamed line a ``correlation_id``) is still GPU work: read with no stream
    (``stream_id`` null) and counted in :class:`Notes`.
    """
    notes = Notes()
    raw = raw.with_columns(
        device=pl.col("plane").str.extract(_DEVICE_PLANE, 1).cast(pl.Int32, strict=False),
        on_device=pl.col("plane").str.starts_with("/device:"),
        stream=pl.col("line").str.extract(_STREAM_LINE, 1).cast(pl.Int64, strict=False),
        corr=_int(pl.col("correlation_id")))
    raw = raw.filter(~(pl.col("on_device") & pl.col("line").str.starts_with("Launch Stats")))
    work_stat = (pl.col("kernel_details").is_not_null() | pl.col("memcpy_details").is_not_null()
                 | pl.col("Memset_details").is_not_null() | ((pl.col("line") == "") & pl.col("corr").is_not_null()))
    unplaced = pl.col("on_device") & pl.col("stream").is_null() & work_stat
    lost = raw.filter(unplaced)
    if lost.height:
        notes.unplaced, notes.unplaced_at = lost.height, (lost["plane"][0], lost["line_id"][0])
    raw = raw.with_columns(work=(pl.col("on_device") & pl.col("stream").is_not_null()) | unplaced)
    on_stream = pl.col("work")
    name = pl.col("name")
    memcpy = name.str.starts_with("Memcpy") | pl.col("memcpy_details").is_not_null()
    memset = name.str.starts_with("Memset") | pl.col("Memset_details").is_not_null()
    step = pl.col("step_num").is_not_null() | (pl.col("on_device") & (pl.col("line") == "Steps"))
    kind = (pl.when(on_stream & memcpy).then(pl.lit("memcpy"))
            .when(on_stream & memset).then(pl.lit("memset"))
            .when(on_stream).then(pl.lit("kernel"))
            .when(pl.col("on_device") & pl.col("line").str.contains(r"\bOps\b")).then(pl.lit("op"))
            .when(step).then(pl.lit("region"))
            .when(~pl.col("on_device") & pl.col("corr").is_not_null()).then(pl.lit("api"))
            .when(pl.col("duration_ns") == 0).then(pl.lit("marker"))
            .otherwise(pl.lit("region")))
    host = ~pl.col("on_device")
    lane = pl.col("on_device") & ~on_stream  # a device line that is no stream: a lane of its own
    step_name = pl.when(pl.col("step_num").is_not_null() & ~name.str.ends_with(" " + pl.col("step_num").fill_null("")))
    rows = raw.with_columns(kind=kind).select(
        "kind",
        name=step_name.then(name + " " + pl.col("step_num")).otherwise(name),
        start_ns="start_ns", duration_ns="duration_ns",
        device_id=pl.col("device"),
        stream_id=pl.col("stream"),
        pid=pl.when(host).then(pl.col("pid")),
        tid=pl.when(host | lane).then(pl.col("line_id")),
        correlation_id=pl.col("corr"),
        hlo_op="hlo_op", hlo_module="hlo_module",
        group=pl.when(step).then(pl.lit(STEP_GROUP))
        .when(lane & pl.col("line").str.starts_with("Async"))
        .then(pl.lit(ASYNC_GROUP)),
        _details=pl.when(on_stream).then(pl.col("kernel_details")),
        _memcpy="memcpy_details", _memset="Memset_details",
        _occupancy=_float(pl.col("theoretical_occupancy_pct")),
        _program_id=_int(pl.col("program_id")),
    )
    is_kernel = pl.col("kind") == "kernel"
    config = details.kernel_columns(pl.col("_details"))
    copies = details.copy_columns(pl.col("_memcpy"), pl.col("name"), pl.col("device_id"))
    rows = rows.with_columns(
        **{k: pl.when(is_kernel).then(v) for k, v in config.items()},
        **{k: pl.when(pl.col("kind") == "memcpy").then(v) for k, v in copies.items() if k != "bytes"},
        bytes=pl.when(pl.col("kind") == "memcpy").then(copies["bytes"])
        .when(pl.col("kind") == "memset").then(details.memset_bytes(pl.col("_memset"))))
    rows = rows.with_columns(collective=pl.when(is_kernel).then(kernel_collective()))
    rows, notes.impossible = details.checked(rows)
    rows = _name_api_calls(rows).with_columns(event_id=pl.int_range(0, pl.len(), dtype=pl.Int64))
    occupancy = pl.coalesce("_occupancy", "_occ_pct")
    counters = rows.filter(is_kernel & (occupancy > 0)).select(
        kind=pl.lit("counter"), name=pl.lit(OCCUPANCY), value=occupancy, unit=pl.lit("%"),
        group=pl.lit("kernel_details"), parent_id="event_id", device_id="device_id", stream_id="stream_id",
        correlation_id="correlation_id", hlo_op="hlo_op", hlo_module="hlo_module")
    rows = rows.drop("_details", "_memcpy", "_memset", "_occupancy", "_occ_pct")
    if counters.height:
        counters = counters.with_columns(event_id=pl.int_range(rows.height, rows.height + counters.height,
                                                               dtype=pl.Int64))
        rows = pl.concat([rows, counters], how="diagonal_relaxed")
    return rows, notes


#: XLA's collective instructions (``hlo_op`` ``all-reduce.17``, ``all-gather-start.2``) -> the schema's collectives.
XLA_COLLECTIVES = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
                   "all-to-all": "all_to_all", "collective-permute": "send_recv", "collective-broadcast": "broadcast"}


def kernel_collective() -> pl.Expr:
    """The collective a kernel runs: from its name (NCCL/RCCL kernels, :func:`traceparse.expr.collective`), and
    where the name does not say (RCCL's ``ncclDevKernel_Generic``: ``unknown``) from the XLA instruction it
    computes; null for a kernel that is no communication."""
    named = expr.collective(pl.col("name").fill_null(""))
    instruction = (pl.col("hlo_op").str.extract(r"^([a-z-]+?)(?:-start|-done)?\.", 1)
                   .replace_strict(XLA_COLLECTIVES, default=None, return_dtype=pl.String))
    return pl.when(named == expr.UNKNOWN_COLLECTIVE).then(pl.coalesce(instruction, named)).otherwise(named)


def accelerators(raw: pl.DataFrame, devices: list[Device]) -> None:
    """The devices of the planes that are no GPU (``/device:TPU:0``: kind ``TPU``, id 0) appended to ``devices``
    where not listed yet, so that their rows are called TPU rows, not GPU rows (a JSON timeline has no device
    properties; an XPlane's were read before)."""
    planes = (raw.select(kind=pl.col("plane").str.extract(_DEVICE_KIND, 1),
                         id=pl.col("plane").str.extract(_DEVICE_PLANE, 1).cast(pl.Int32, strict=False))
              .drop_nulls().unique().sort("id", "kind"))
    listed = {d.id for d in devices}
    for kind, device_id in planes.iter_rows():
        if kind.upper() != "GPU" and device_id not in listed:
            devices.append(Device(id=device_id, kind=kind.upper()))
            listed.add(device_id)
    devices.sort(key=lambda d: (d.id is None, d.id))


def thread_names(raw: pl.DataFrame) -> dict[str, str]:
    """``{"pid/tid": line name}`` of the host lines (``meta.extra["thread_names"]``, as the other readers give),
    and ``{"-/tid": line name}`` of the device lines that are no stream (``XLA Ops``: each its own lane)."""
    host = raw.filter(~pl.col("plane").str.starts_with("/device:") & (pl.col("line") != "")
                      & pl.col("pid").is_not_null() & pl.col("line_id").is_not_null())
    names = {f"{p}/{t}": n for p, t, n in host.select("pid", "line_id", "line").unique(maintain_order=True).iter_rows()}
    lanes = raw.filter(pl.col("plane").str.starts_with("/device:") & (pl.col("line") != "")
                       & ~pl.col("line").str.contains(_STREAM_LINE) & pl.col("line_id").is_not_null())
    names.update({f"-/{t}": n for t, n in lanes.select("line_id", "line").unique(maintain_order=True).iter_rows()})
    return names


def _name_api_calls(rows: pl.DataFrame) -> pl.DataFrame:
    """Host API rows named after their GPU work (same correlation id, same name) renamed to the call family."""
    work = (rows.filter(pl.col("kind").is_in(list(CALL_FAMILY)) & pl.col("correlation_id").is_not_null())
            .group_by("correlation_id", "name").agg(_work=pl.col("kind").first()))
    if work.height == 0:
        return rows
    rows = rows.join(work, on=["correlation_id", "name"], how="left", maintain_order="left", nulls_equal=False)
    family = pl.col("_work").replace_strict(CALL_FAMILY, default=None, return_dtype=pl.String)
    renamed = (pl.col("kind") == "api") & family.is_not_null()
    return rows.with_columns(name=pl.when(renamed).then(family + " (" + pl.col("name") + ")")
                             .otherwise(pl.col("name"))).drop("_work")


def _int(text: pl.Expr) -> pl.Expr:
    """A stat's decimal text as Int64 (null when it is not one)."""
    return pl.when(text.str.contains(r"^-?[0-9]{1,18}$")).then(text).cast(pl.Int64, strict=False)


def _float(text: pl.Expr) -> pl.Expr:
    return text.cast(pl.Float64, strict=False)
