"""A run: the traces of the ranks of one distributed job, stored together.

``traceparse ingest DIR`` (a directory of per-rank files that no reader
claims as one trace) or ``traceparse ingest FILES... --run NAME`` stores a
run (:func:`ingest_run`):

1. **Plan.** The files are sniffed and grouped as for any ingest
   (:func:`traceparse.ingest.plan`); each group is one rank. Every rank must
   be of one format ("mixed formats" is an error naming two files), and no
   two ranks may have the same content.
2. **Read, in parallel, bounded.** Each rank is read and written to its own
   partition under ``STORE/tmp/`` by :func:`ingest_rank`: by this process and a
   process pool (by default), in this process alone (``jobs=1``), or on a Dask cluster
   (``scheduler``, see :mod:`traceparse.distributed`). Workers are bounded
   by the cores and by the memory one rank needs (:func:`choose_workers`),
   so only that many ranks are in memory at once, whatever the run's size.
3. **Name the ranks.** A rank's number comes from the trace itself where it
   says (:func:`rank_from_trace`: ``meta.distributed["rank"]``, which readers
   fill, or the torch reader's ``rank`` tag), else from the file
   name (:func:`rank_from_name`: ``rank3``, ``_r3``, ``.3.``), else it is an
   error naming the file. Duplicate ranks are an error naming both files;
   ranks missing from the world size, or world sizes that disagree, are
   warnings.
4. **Store, atomically.** :meth:`traceparse.store.Store.commit_run` renames
   the whole run into place at once: a failure anywhere leaves nothing.

:meth:`traceparse.store.Store.load_run` gives the run as one trace (every
rank's rows, each with its ``rank`` and its own ``trace_id``), so every rule
and measure runs on a run unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from bisect import bisect_left, bisect_right
from collections import deque
from contextlib import contextmanager, nullcontext
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import polars as pl

from traceparse.cores import usable_cores as _cores
from traceparse.errors import InputError, TraceparseError, enter_command_line, on_command_line, spelled
from traceparse.figures import SAME_NS, fmt_ns, listed, same_figure
from traceparse.ingest import plan, read_group
from traceparse.meta import incomplete_ranks
from traceparse.plugins import Registry, registry as default_registry
from traceparse.sources import sha256_of
from traceparse.validate import ascii_int
from traceparse.store import EarlyFlush, Store, _write_json, trace_id_for, write_partition
from traceparse.trace import Trace, TraceMeta

if TYPE_CHECKING:  # the process pool and multiprocessing are imported where a run's ranks are read by workers,
    # not by every command that imports this module (``analyze``: the summary asks a trace's ranks)
    from concurrent.futures import ProcessPoolExecutor

#: File-name patterns that give a rank, tried in order on the file (or directory) name.
RANK_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("rank3", re.compile(r"rank[_-]?([0-9]+)", re.IGNORECASE)),  # ASCII digits: \d takes "٣" and "³" too
    ("_r3", re.compile(r"(?:^|[_.-])r([0-9]+)(?=[_.-]|$)", re.IGNORECASE)),
    # (not a longer number: tensorboard_trace_handler's files are HOST_PID.MILLISECONDS.pt.trace.json)
    (".3.", re.compile(r"\.([0-9]{1,7})\.")),
)
#: The largest rank a run holds (the ``rank`` column is a 32-bit integer).
MAX_RANK = 2**31 - 1
#: A world size (or a rank) more than this many times the rank files given is not believed: a warning, and the
#: missing ranks are counted, never listed one by one.
PLAUSIBLE_RANKS_PER_FILE = 1000
#: A rank whose events are further than this from the reference rank's, and than CLOCK_GAP_SPANS times the
#: longest rank, is on another clock (:func:`clock_shifts`): a minute, and 100 profiling windows.
CLOCK_GAP_NS = 60 * 10**9
CLOCK_GAP_SPANS = 100
#: Most ranks a worker process reads before it is replaced (returns its memory to the system).
TASKS_PER_WORKER = 16
#: Memory one rank needs, as a multiple of its uncompressed size, plus a worker's own base.
BYTES_PER_INPUT_BYTE = 4
WORKER_BASE_BYTES = 300 * 2**20
#: A run whose inputs are smaller than this in all (uncompressed) is read in-process.
SMALL_RUN_BYTES = 64 * 2**20
#: Share of the available memory the workers may plan to use.
MEMORY_SHARE = 0.5
#: A run of at least this many ranks is read by worker processes however small: each rank costs a fixed
#: 40 to 90 ms of reading, validating and writing, which the workers share (1,000 one-kernel ranks).
MANY_RANKS = 64
#: A worker whose ranks are all smaller than this is never replaced (a small rank leaves little memory behind;
#: starting a worker costs a second).
SMALL_RANK_BYTES = 8 * 2**20


@dataclass
class RunResult:
    """What one run ingest did: the run's metadata and whether it was already stored; ``replaced``: the readers
    of the stored reading this one replaced (another release of the reader had read it)."""

    run: dict[str, Any]
    already_stored: bool
    warnings: list[str] = field(default_factory=list)
    replaced: str | None = None
    #: Where the folder held several profiling windows of its ranks (:func:`profiling_windows`): every window's
    #: run, in order (this result is the first's); empty for a folder of one window.
    windows: list["RunResult"] = field(default_factory=list)
    #: What this ingest itself must say, stored or not (the run's own ``warnings`` are said when it is stored):
    #: a name given to a run stored already under another.
    said: list[str] = field(default_factory=list)


# -- ranks ------------------------------------------------------------------
def rank_from_name(path: Path | str) -> int | None:
    """The rank a file name gives (``rank3``, ``rank_3``, ``_r3``, ``.3.``), or None.

    >>> [rank_from_name(p) for p in ("rank3.json.gz", "trace_r12.json", "profile.5.0.0", "gpu.json")]
    [3, 12, 5, None]
    """
    name = Path(path).name
    for _, pattern in RANK_PATTERNS:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def rank_from_trace(meta: TraceMeta) -> int | None:
    """The rank the trace itself gives, or None.

    ``meta.distributed["rank"]``, which a reader fills where its format says
    (Kineto ``distributedInfo``; a TAU profile of exactly one node), else the
    ``rank`` tag (the torch reader sets it from the same place). An nsys
    report names a process, not a rank: its rank comes from the file name.
    """
    for value in (meta.distributed.get("rank"), meta.tags.get("rank")):
        rank = ascii_int(value)
        if rank is not None:
            return rank
    return None


def world_size_of(meta: TraceMeta) -> int | None:
    """The world size the trace gives (``meta.distributed`` or the ``world_size`` tag), or None."""
    for value in (meta.distributed.get("world_size"), meta.tags.get("world_size")):
        size = ascii_int(value)
        if size is not None and size >= 1:
            return size
    return None


def rank_labels(trace: Trace) -> dict[str, int]:
    """{trace_id: rank} of a run's combined trace; {} for a trace that is not a run."""
    run = (trace.meta.extra or {}).get("run") if trace.meta.format == "run" else None
    if not run:
        return {}
    return {trace_id: int(rank) for rank, trace_id in run.get("ranks", {}).items()}


def cut_rank_traces(trace: Trace) -> dict[str, int]:
    """{trace_id: rank} of a run's ranks whose input ends early (:func:`traceparse.meta.incomplete_ranks`), where
    another rank's is whole; {} for a trace that is not a run, or a run whose every rank was cut.

    Why: a rank cut mid-write kept part of its GPU work from all through the run, not its first part (a profiler
    writes each stream's activities as its buffers fill: a balanced FSDP rank kept 10 of its 63 collectives'
    kernels, and its GPU read 67% idle where it was 5%), so figures over the ranks' GPUs are of the whole ranks.
    """
    ranks = rank_labels(trace)
    cut = set(incomplete_ranks(trace.meta))
    left = {trace_id: rank for trace_id, rank in ranks.items() if rank in cut}
    return left if len(left) < len(ranks) else {}


def whole_ranks_only(trace: Trace, rows: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """``rows`` (a measure's, by ``trace_id``: each device's busy time) without the run's ranks cut short
    (:func:`cut_rank_traces`), and those left out; ``rows`` whole and {} where no whole rank has a row (the cut
    ranks are all there is). gpu-idle and the summary's "GPU busy" take it alike, so that one is 100 minus the
    other."""
    left = cut_rank_traces(trace)
    if left and (whole := rows.filter(~pl.col("trace_id").is_in(list(left)))).height:
        return whole, left
    return rows, {}


def device_label(ranks: dict[str, int], trace_id: str | None, device_id: int | None) -> str:
    """How a device is named in a rule's device table: ``"0"`` in one trace, ``"rank 2:0"`` in a run.

    ``ranks`` is :func:`rank_labels` of the trace; a device with no id is ``?``.
    """
    device = "?" if device_id is None else str(device_id)
    if not ranks or trace_id not in ranks:
        return device
    return f"rank {ranks[trace_id]}:{device}"


def rank_of(ranks: dict[str, int]) -> pl.Expr:
    """Each row's rank from its ``trace_id`` (``ranks``: :func:`rank_labels`); null outside a run."""
    if not ranks:
        return pl.lit(None, dtype=pl.Int64)
    return pl.col("trace_id").replace_strict(ranks, default=None, return_dtype=pl.Int64)


def in_rank_order(frame: pl.DataFrame, ranks: dict[str, int]) -> pl.DataFrame:
    """A measure's per-device frame (``trace_id``, ``device_id``) in rank then device order; unchanged outside a run."""
    if not ranks:
        return frame
    return (frame.with_columns(rank_of(ranks).alias("__rank")).sort(["__rank", "device_id"], nulls_last=False)
            .drop("__rank"))


def mean_range(per_device: pl.DataFrame, column: str, ranks: dict[str, int], noun: str = "GPU") -> dict | None:
    """:attr:`traceparse.rule.Finding.impact_range` of a time at stake that is the mean of ``column`` over the
    devices of ``per_device`` (``trace_id``, ``device_id``, in rank order): how many, what one is (``per``:
    ``rank`` where every rank has one device, else ``noun``), the least and the most, each with its device's
    label (``rank 2``, ``rank 2 GPU 1``, or ``GPU 1`` outside a run; the first of equals); None for one device,
    unless it is one of a run's ranks: the others recorded none, and the figure is that rank's alone."""
    if per_device.height == 1 and len(set(ranks.values())) > 1 and per_device["trace_id"][0] in ranks:
        ns, label = int(per_device[column][0]), f"rank {ranks[per_device['trace_id'][0]]}"
        return {"parts": 1, "per": "rank", "least_ns": ns, "least": label, "most_ns": ns, "most": label,
                "least_like": 1, "most_like": 1}
    if per_device.height < 2:
        return None
    rows = per_device.select("trace_id", "device_id", column).rows()
    one_each = bool(ranks) and per_device["trace_id"].n_unique() == per_device.height

    def label(trace_id, device_id) -> str:
        device = f"{noun} {'?' if device_id is None else device_id}"
        if not ranks or trace_id not in ranks:
            return device
        return f"rank {ranks[trace_id]}" + ("" if one_each else f" {device}")

    return impact_range([(int(ns), label(t, d)) for t, d, ns in rows], "rank" if one_each else noun)


def impact_range(parts: list[tuple[int, str]], per: str) -> dict | None:
    """:attr:`traceparse.rule.Finding.impact_range` of a mean over ``parts`` ((ns, label), in the order ties are
    broken: the first of equals), each one a ``per`` (``rank``, ``GPU``); None for fewer than two.
    ``least_like`` and ``most_like`` count the parts as low as the least and as high as the most but for noise
    (:func:`~traceparse.figures.same_figure`): where 63 ranks of 64 wait 150.4 ms, none of them is "the most"."""
    if len(parts) < 2:
        return None
    least = min(parts, key=lambda p: p[0])
    most = max(parts, key=lambda p: p[0])
    return {"parts": len(parts), "per": per, "least_ns": least[0], "least": least[1],
            "most_ns": most[0], "most": most[1],
            "least_like": sum(same_figure(ns, least[0], SAME_NS) for ns, _ in parts),
            "most_like": sum(same_figure(ns, most[0], SAME_NS) for ns, _ in parts)}


# -- planning ---------------------------------------------------------------
def rank_inputs(paths: list[Path]) -> list[Path]:
    """The inputs of a run: a directory's entries (sorted, hidden ones left out), or the files given."""
    if len(paths) == 1 and paths[0].is_dir():
        entries = sorted(p for p in paths[0].iterdir() if not p.name.startswith("."))
        if not entries:
            raise InputError(f"{paths[0]}: the directory is empty")
        return entries
    return paths


def plan_run(paths: list[Path], fmt: str = "auto", reg: Registry | None = None,
             skipped: list[Path] | None = None) -> list[tuple[str, list[Path]]]:
    """The ranks of a run: (reader name, paths) per rank, every rank of one format.

    With ``skipped`` (a list), the entries of a run folder that are no trace (:func:`not_traces`: a README, a
    script, a TensorBoard event file beside the ranks' traces) are left out and added to it, where some other
    entry is one; without, every entry must be read. Raises a one-line :class:`InputError` naming the files for
    mixed formats.
    """
    reg = reg or default_registry()
    inputs = rank_inputs(paths)
    if skipped is not None and len(paths) == 1 and paths[0].is_dir() and fmt == "auto":
        others = not_traces(inputs, reg)
        if others and len(others) < len(inputs):
            skipped.extend(others)
            inputs = [p for p in inputs if p not in others]
    try:
        groups = plan(inputs, fmt, reg)
    except InputError as exc:
        if len(paths) == 1 and paths[0].is_dir() and fmt == "auto" and not any(_recognised(p, reg) for p in inputs):
            # no member is a trace either: say so of the folder the user named, not of its first file
            tried = ", ".join(sorted(reg.readers)) or "none installed"
            raise InputError(f"{paths[0]}: a folder no reader reads, and none of its {len(inputs)} entries is a "
                             f"trace traceparse recognises (tried: {tried}); a run is a folder of one trace per "
                             "rank") from exc
        if skipped is not None and len(paths) == 1 and paths[0].is_dir():  # one entry of a run folder
            raise InputError(f"{exc}; in a run folder every file named like a trace must be one: move it out of "
                             f"{paths[0].name}, or give the ranks' files themselves with --run NAME") from exc
        raise
    formats: dict[str, Path] = {}
    for reader, group in groups:
        formats.setdefault(reader.name, group[0])
    if len(formats) > 1:
        (a, pa), (b, pb) = list(formats.items())[:2]
        raise InputError(f"{pb}: mixed formats in one run: {pa.name} is {a}, {pb.name} is {b}")
    # a format that keeps a job's processes in one trace's files splits them into ranks (TAU: a file per node)
    return [(reader.name, part) for reader, group in groups for part in reader.ranks(group)]


def not_traces(entries: list[Path], reg: Registry) -> list[Path]:
    """The files among ``entries`` that are no trace: recognised by no reader, and named like none of the files of
    the run's format (the ``patterns`` of the reader of its first trace, and of the format it refines: an nsys
    run's ``*.nsys-rep``, ``*.sqlite``, ...), or of any format where no entry is a trace. A file named like the
    run's traces that no reader recognises stays, to be refused in one line: a rank left out would change every
    figure of the run. Why the run's format: the steps a job script wrote beside its nsys ranks
    (``steps_rank0.json``) are named like torch traces, and stopped the run."""
    files = [p for p in entries if p.is_file()]
    first = next((reader for p in files if (reader := _reader_of(p, reg)) is not None), None)
    readers = reg.readers.values() if first is None else [
        r for r in reg.readers.values() if r.name in (first.name, getattr(first, "refines", None))]
    patterns = [pattern.lower() for reader in readers for pattern in getattr(reader, "patterns", ())]
    return [p for p in files if not any(fnmatch(p.name.lower(), pattern) for pattern in patterns)
            and not _recognised(p, reg)]


def _reader_of(path: Path, reg: Registry):
    """The reader that claims ``path``, or None."""
    try:
        groups = plan([path], "auto", reg)
    except InputError:
        return None
    return groups[0][0] if groups else None


def _recognised(path: Path, reg: Registry) -> bool:
    """Whether some reader claims ``path``."""
    return _reader_of(path, reg) is not None


def is_rank_directory(path: Path, fmt: str = "auto", reg: Registry | None = None) -> bool:
    """True when ``path`` is a directory no reader reads as one trace, and its entries are several traces."""
    if not path.is_dir():
        return False
    reg = reg or default_registry()
    try:
        groups = plan([path], fmt, reg)
    except InputError:
        groups = []
    if groups:
        return False  # a reader reads the directory itself (a TAU profile, an nsys CSV capture)
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    return len(entries) >= 1


# -- memory and workers -----------------------------------------------------
def input_bytes(paths: list[Path]) -> int:
    """The uncompressed size of a rank's input (gzip: its trailer's size field; else the file size)."""
    total = 0
    for path in paths:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for f in files:
            size = f.stat().st_size
            try:
                with open(f, "rb") as fh:
                    if fh.read(2) == b"\x1f\x8b" and size >= 18:
                        fh.seek(-4, os.SEEK_END)
                        isize = int.from_bytes(fh.read(4), "little")  # modulo 4 GiB
                        size = isize if isize >= size else size * 10
            except OSError:
                pass
            total += size
    return total


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; a cgroup limit when lower)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
            if text.isdigit():
                avail = min(avail, int(text))
        except OSError:
            pass
    return avail


def rank_memory(paths: list[Path]) -> int:
    """The memory reading one rank takes, estimated from its input size (see :data:`BYTES_PER_INPUT_BYTE`)."""
    return WORKER_BASE_BYTES + BYTES_PER_INPUT_BYTE * input_bytes(paths)


def choose_workers(ranks: list[list[Path]], jobs: int | None = None, sizes: list[int] | None = None) -> int:
    """How many ranks to read at once: ``jobs`` if given, else bounded by the cores and by memory.

    A run smaller than :data:`SMALL_RUN_BYTES` in all is read in this
    process. Otherwise at most the cores, the number of ranks, and the number of the largest
    rank's memory (:func:`rank_memory`) that fits in :data:`MEMORY_SHARE` of
    the available memory; at least 1. ``sizes``: each rank's :func:`input_bytes`, when the caller has them.
    """
    if jobs:
        return max(1, min(jobs, len(ranks)))
    sizes = [input_bytes(r) for r in ranks] if sizes is None else sizes
    if sum(sizes) < SMALL_RUN_BYTES and len(ranks) < MANY_RANKS:
        return 1  # starting worker processes would cost more than reading a few small ranks here
    cores = _cores()
    need = WORKER_BASE_BYTES + BYTES_PER_INPUT_BYTE * max(sizes, default=0)  # rank_memory of the largest
    by_memory = int(available_memory() * MEMORY_SHARE // need)
    return max(1, min(cores, len(ranks), by_memory))


# -- one rank ---------------------------------------------------------------
def ingest_rank(tmp: str, index: int, reader_name: str, paths: list[str], params: dict | None = None,
                sha256: str | None = None) -> dict[str, Any]:
    """Read one rank and write it to ``tmp/part-<index>``; return {index, rank, rank_from, world_size, meta}.

    Runs in a worker (process pool or Dask): everything it takes and gives is
    plain data. The ``rank`` column is set on every row as the batches are
    written, from what the trace says by then (for torch, the header before
    the events); if the trace says otherwise by its end, the column is
    rewritten. A rank no source gives is an :class:`InputError` naming the file.
    """
    reg = default_registry()
    files = [Path(p) for p in paths]
    try:
        reader = reg.readers[reader_name]
        trace = read_group(reader, files, params=params, sha256=sha256)
        trace.meta.reader = reg.reading_of(reader)
        from_name = rank_from_name(files[0])
        used: set = set()

        def current() -> int | None:
            rank = rank_from_trace(trace.meta)
            rank = rank if rank is not None else from_name
            return rank if rank is not None and 0 <= rank <= MAX_RANK else None  # checked below, in one line

        def stamped():
            for batch in trace.batches():
                rank = current()
                used.add(rank)
                yield with_rank(batch, rank)

        part = Path(tmp) / f"part-{index}"
        meta = write_partition(trace, part, batches=stamped())  # conformed and validated once, by trace.batches
        rank = rank_from_trace(meta)
        rank_from = "trace"
        if rank is None:
            rank, rank_from = from_name, "file name"
        if rank is None:
            raise InputError(f"{files[0]}: no rank: the trace does not say (no distributedInfo rank) and the file "
                             "name has none (rank3, _r3, .3.); a folder of traces is read as the ranks of one run: "
                             "give the files as paths to read each as a trace of its own")
        if not 0 <= rank <= MAX_RANK:
            raise InputError(f"{files[0]}: rank {rank} (from the {rank_from}) is outside 0 to {MAX_RANK:,}, the "
                             "ranks a run can hold")
        if used != {rank}:  # the trace said its rank only after some rows were written
            _set_rank(part / "events.parquet", rank)
        if from_name is not None and rank_from == "trace" and from_name != rank:
            meta.warnings.append(f"{files[0].name}: the trace says rank {rank}, the file name {from_name}; "
                                 f"rank {rank} is used")
        # the file name's number is the process id its rows carry (a profiler's output named by %p): no rank
        name_is_pid = rank_from == "file name" and rank in _process_ids(part / "events.parquet")
    except TraceparseError as exc:
        message = str(exc)
        raise InputError(message if str(files[0]) in message else f"{files[0]}: {message}") from None
    except Exception as exc:  # a reader's crash on one rank names that rank's file
        raise InputError(f"{files[0]}: cannot read this rank: {type(exc).__name__}: {exc}") from None
    return {"index": index, "rank": rank, "rank_from": rank_from, "world_size": world_size_of(meta),
            "meta": meta.to_dict(), "name_is_pid": name_is_pid}


def _set_rank(events_path: Path, rank: int) -> None:
    """Rewrite a written partition with every row's ``rank`` set to ``rank`` (known only after it was written)."""
    frame = pl.read_parquet(events_path).with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
    frame.write_parquet(events_path, compression="zstd", compression_level=1)


def _process_ids(events_path: Path) -> set[int]:
    """The process ids (``pid``) of a written partition's rows."""
    pids = pl.read_parquet(events_path, columns=["pid"])["pid"].drop_nulls().unique()
    return set(pids.to_list())


def _ranks_for_process_ids(results: list[dict], ranks: list[tuple[str, list[Path]]], tmp: Path,
                           warnings: list[str]) -> None:
    """Where every rank's number came from its file's name and is the process id its rows carry, and the
    numbers are not 0 to N-1 already (``out.21002.txt``, ``out.21003.txt``: ``nvprof --log-file out.%p.txt``
    under mpirun), the ranks are numbered 0 to N-1 in order of process id, with a warning. Read as ranks,
    such names made a run of "world size 21004" with "21,002 of 21,004 ranks missing". The partitions' ``rank``
    column is rewritten; ``rank_from`` is ``process id order``."""
    if not results or not all(r["rank_from"] == "file name" and r.get("name_is_pid") for r in results):
        return
    pids = sorted(r["rank"] for r in results)
    if pids == list(range(len(pids))) or len(set(pids)) != len(pids):  # ranks already, or duplicates (said later)
        return
    order = {pid: i for i, pid in enumerate(pids)}
    first = min(results, key=lambda r: r["rank"])
    for result in results:
        result["rank"], result["rank_from"] = order[result["rank"]], "process id order"
        _set_rank(tmp / f"part-{result['index']}" / "events.parquet", result["rank"])
    count = len(pids)
    warnings.append(f"the file names give process ids, not ranks ({ranks[first['index']][1][0].name} holds process "
                    f"{pids[0]}): the {count} rank{'s are' if count != 1 else ' is'} numbered "
                    f"{'0' if count == 1 else f'0–{count - 1}'} in order of process id, which need not be their "
                    "MPI ranks; name each file by its rank (e.g. %q{OMPI_COMM_WORLD_RANK} in the profiler's output "
                    "file name) to have them")


def with_rank(batch: pl.DataFrame, rank: int | None) -> pl.DataFrame:
    """``batch`` (conformed) with ``rank`` on every row; a small batch's column is replaced without a query."""
    if batch.height > 65_536:
        return batch.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
    out = batch.clone()
    out.replace_column(out.get_column_index("rank"), pl.Series("rank", [rank] * batch.height, dtype=pl.Int32))
    return out


# -- the run ----------------------------------------------------------------
def _first_missing(present: dict[int, Any] | set[int], world_size: int, count: int) -> list[int]:
    """The ``count`` lowest ranks below ``world_size`` not in ``present``: at most len(present) + count steps."""
    out, rank = [], 0
    while len(out) < count and rank < world_size and rank <= len(present) + count:
        if rank not in present:
            out.append(rank)
        rank += 1
    return out


def run_id_for(shas: list[str]) -> str:
    """The id of a run: from its ranks' content hashes, whatever their order or file names."""
    outer = hashlib.sha256(b"traceparse run\n")
    for sha in sorted(shas):
        outer.update(f"{sha}\n".encode())
    return trace_id_for(outer.hexdigest())


def ingest_run(paths: list[Path | str], *, store: Store, name: str | None = None, fmt: str = "auto",
               params: dict | None = None, jobs: int | None = None, scheduler: str | None = None,
               tags: dict[str, str] | None = None, progress_factory=None, reg: Registry | None = None) -> RunResult:
    """Store the ranks in ``paths`` (a rank directory, or one file or capture per rank) as one run.

    ``jobs`` fixes the number of worker processes (1: read in this
    process); by default :func:`choose_workers` picks it. ``scheduler`` sends
    each rank to a Dask cluster instead (an address, or ``"local"``).
    ``progress_factory(description, total_ranks)`` may return a context
    manager yielding an ``advance(n)`` callable, called once per rank read.
    ``tags`` label the run (``run["tags"]``). Nothing is stored unless every rank is read and the ranks are consistent.
    """
    reg = reg or default_registry()
    paths = [Path(p) for p in paths]
    skipped: list[Path] = []
    ranks = plan_run(paths, fmt, reg, skipped)
    pool = None if scheduler else _RankPool.for_ranks([group for _, group in ranks], jobs)
    notes = [_skipped_warning(paths[0], skipped)] if skipped else []
    try:
        return _ingest_planned(ranks, pool, store=store, paths=paths, name=name, params=params, scheduler=scheduler,
                               tags=tags, progress_factory=progress_factory, reg=reg, notes=notes)
    finally:
        if pool is not None:
            pool.close(wait=False)  # (a run already stored: the worker started ahead exits by itself)


#: The files left out of a run folder (:func:`not_traces`) named in its warning; the rest are counted.
SKIPPED_NAMED = 5


def _skipped_warning(folder: Path, skipped: list[Path]) -> str:
    """The warning that files of ``folder`` were left out of its run as no trace, naming them."""
    shown = ", ".join(p.name for p in skipped[:SKIPPED_NAMED])
    more = f" and {len(skipped) - SKIPPED_NAMED} more" if len(skipped) > SKIPPED_NAMED else ""
    one = len(skipped) == 1
    return (f"{folder}: {len(skipped)} {'file is' if one else 'files are'} no trace and {'was' if one else 'were'} "
            f"left out: {shown}{more}")


def _ingest_planned(ranks: list[tuple[str, list[Path]]], pool: "_RankPool | None", *, store: Store,
                    paths: list[Path], name: str | None, params: dict | None, scheduler: str | None,
                    tags: dict[str, str] | None, progress_factory, reg: Registry,
                    notes: list[str] = ()) -> RunResult:
    """:func:`ingest_run` of the planned ``ranks``, read by ``pool`` (None: on the Dask ``scheduler``); ``notes``:
    warnings of the run's own, said before the ranks'.

    The pool's worker processes are started before the ranks are hashed, unless the store seems to hold the
    run already (:func:`_maybe_stored`): their imports (0.5 CPU s each) overlap the hashing, and every process
    then starts its first rank at once; started after the hashing, the worker began its first rank only after
    its imports (0.4 to 0.5 s on 2 cores), while this process read, and ended its last rank that much later.
    """
    if pool is not None and not _maybe_stored(store, ranks):
        pool.start()
    shas = _hashes([group for _, group in ranks])
    seen: dict[str, Path] = {}
    for sha, (_, group) in zip(shas, ranks):
        if sha in seen:
            raise InputError(f"{group[0]}: the same content as {seen[sha]}: one rank given twice")
        seen[sha] = group[0]
    run_id = run_id_for(shas)
    given = name
    if name is None:
        name = paths[0].name if len(paths) == 1 and paths[0].is_dir() else run_id
    readings = sorted({reg.reading_of(reg.readers[reader_name]) for reader_name, _ in ranks})
    stored = store.run_meta(run_id) if store.has_run(run_id) else None
    if stored is not None and stored.get("readers") == readings:
        store.set_last(run_id)
        # a name asked for, not had: `--run dup` of a run stored as `nccl2` said "already in the store" alone, and
        # the next command's "dup: no such file, and no trace with this id" named the wrong cause
        said = ([f"--run {given}: these files are the run already stored as {stored.get('name')!r} ({run_id}); it "
                 f"keeps that name: refer to it as {stored.get('name')!r} or by its id"]
                if given is not None and given != stored.get("name") else [])
        return RunResult(stored, already_stored=True, warnings=list(notes), said=said)
    if stored is None and (windows := _stored_windows(store, run_id, readings)):
        store.set_last(windows[0].run["id"])
        windows[0].warnings[:0] = notes
        windows[0].windows = windows
        return windows[0]
    # stored by another release of its reader (or before runs said which): read again, replacing that reading
    replaced = (", ".join(stored.get("readers") or []) or "an earlier traceparse") if stored is not None else None
    tmp = store.fresh_tmp()
    flush = EarlyFlush()  # each rank's files flushed as it is done, while the others are read
    try:
        tasks = [(str(tmp), i, reader_name, [str(p) for p in group], params, sha)
                 for i, ((reader_name, group), sha) in enumerate(zip(ranks, shas))]
        bar = progress_factory(f"ranks of {name}", len(tasks)) if progress_factory else nullcontext(None)

        def done(n: int, finished: list[dict] = ()) -> None:
            for result in finished:
                flush.add(tmp / f"part-{result['index']}")
            if advance:
                advance(n)

        with bar as advance:
            if scheduler:
                from traceparse.distributed import map_ingest

                results = map_ingest(scheduler, ingest_rank, tasks, advance)
            else:
                results = _map_local(_share_cores(tasks, pool.workers), pool, done,
                                     per_task=_ranks_per_task(len(tasks), pool.workers) if pool.small else 1)
        flushed = flush.finish()  # before the parts are renamed
        windows = profiling_windows(results, ranks)
        if windows:
            return _commit_windows(windows, run_id, name, ranks, shas, tmp, store=store, tags=tags, notes=notes,
                                   readings=readings)
        run, warnings = _assemble(run_id, name, ranks, results, tmp)
        warnings[:0] = notes
        run["tags"] = {**((stored or {}).get("tags") or {}), **(tags or {})}
        run["readers"] = readings
        run = store.commit_run(tmp, run, _still_flushed(tmp, flushed, results, run), replace=stored is not None)
    except BaseException:
        flush.abandon()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RunResult(run, already_stored=False, warnings=warnings, replaced=replaced)


def profiling_windows(results: list[dict], ranks: list[tuple[str, list[Path]]]) -> list[list[dict]] | None:
    """The ranks' results split into profiling windows, where every rank of the folder has k >= 2 traces one
    after another in time: torch.profiler's schedule with ``repeat`` > 1 writes a trace per window and rank into
    one folder (``host_pid.<ms>.pt.trace.json``), as does a capture per NVTX range. Window j holds the j-th trace
    in time of every rank, and is a run of its own. None where no rank repeats. A rank that repeats otherwise
    (as many traces on every rank, but two of one rank at once; or more on some ranks than others) is a
    one-line :class:`InputError` naming the two files and why they are no windows."""
    by_rank: dict[int, list[dict]] = {}
    for result in sorted(results, key=lambda r: r["index"]):
        by_rank.setdefault(result["rank"], []).append(result)
    if all(len(found) == 1 for found in by_rank.values()):
        return None

    def span(result: dict) -> tuple[int, int]:
        summary = result["meta"].get("summary") or {}
        return summary.get("start_ns") or 0, summary.get("end_ns") or 0

    def path(result: dict) -> Path:
        return ranks[result["index"]][1][0]

    again = next(rank for rank, found in by_rank.items() if len(found) > 1)
    first, second = by_rank[again][:2]
    said = f"{path(second)}: rank {again} again (also {path(first)})"
    counts = {rank: len(found) for rank, found in by_rank.items()}
    if len(set(counts.values())) > 1:
        few = min(counts, key=lambda r: (counts[r], r))
        raise InputError(f"{said}: rank {again} has {counts[again]} traces and rank {few} {counts[few]}, so they "
                         "are no profiling windows of every rank; give each window's files as a run of its own "
                         "(traceparse ingest --run NAME FILE ...)")
    for rank, found in by_rank.items():
        found.sort(key=lambda r: (span(r), r["index"]))
        for before, after in zip(found, found[1:]):
            if span(before)[1] > span(after)[0]:
                raise InputError(f"{path(after)}: rank {rank} again (also {path(before)}), and the two overlap in "
                                 "time: two traces of one rank at once are no profiling windows (two jobs, or one "
                                 "trace copied and edited?); give each job's files as a run of its own "
                                 "(traceparse ingest --run NAME FILE ...)")
    return [[by_rank[rank][j] for rank in sorted(by_rank)] for j in range(counts[again])]


#: ``run.json`` key of a run that is one profiling window of a folder's ranks (:func:`profiling_windows`):
#: {"index": j (from 1), "of": k, "folder_run": the id of all the folder's ranks together}.
WINDOW_KEY = "window"


def _commit_windows(windows: list[list[dict]], folder_run: str, name: str, ranks: list[tuple[str, list[Path]]],
                    shas: list[str], tmp: Path, *, store: Store, tags: dict[str, str] | None, notes: list[str],
                    readings: list[str]) -> RunResult:
    """Store each of ``windows`` (the ranks' results read into ``tmp``) as a run of its own, named ``NAME window j
    of k``; the first window's :class:`RunResult`, with every window's in ``windows``."""
    done: list[RunResult] = []
    count = len(windows)
    try:
        for j, window in enumerate(windows, start=1):
            own = store.fresh_tmp()
            for result in window:
                os.rename(tmp / f"part-{result['index']}", own / f"part-{result['index']}")
            run_id = run_id_for([shas[r["index"]] for r in window])
            stored = store.run_meta(run_id) if store.has_run(run_id) else None
            run, warnings = _assemble(run_id, f"{name} window {j} of {count}", ranks, window, own)
            run["tags"] = {**((stored or {}).get("tags") or {}), **(tags or {})}
            run["readers"] = readings
            run[WINDOW_KEY] = {"index": j, "of": count, "folder_run": folder_run}
            run = store.commit_run(own, run, set(), replace=stored is not None)
            done.append(RunResult(run, already_stored=False, warnings=list(warnings)))  # the note below: not stored
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    done[0].warnings[:0] = [*notes, f"{name}: every rank has {count} traces one after another (profiling windows: "
                            f"a schedule with repeat > 1 writes one per window), stored as {count} runs: "
                            + ", ".join(f"window {r.run[WINDOW_KEY]['index']} {r.run['id']}" for r in done)]
    store.set_last(done[0].run["id"])
    done[0].windows = done
    return done[0]


def _stored_windows(store: Store, folder_run: str, readings: list[str]) -> list[RunResult]:
    """The stored runs that are the profiling windows of the folder whose ranks together are ``folder_run``
    (:data:`WINDOW_KEY`), in order, where every window is stored by these readers; else []."""
    found = sorted((r for r in store.all_runs() if (r.get(WINDOW_KEY) or {}).get("folder_run") == folder_run),
                   key=lambda r: r[WINDOW_KEY]["index"])
    if not found or len(found) != found[0][WINDOW_KEY]["of"] or any(r.get("readers") != readings for r in found):
        return []
    return [RunResult(r, already_stored=True) for r in found]


def _still_flushed(tmp: Path, flushed: dict[Path, list[str]], results: list[dict], run: dict) -> set[str]:
    """The paths of the files flushed as their rank was done (:class:`traceparse.store.EarlyFlush`) under their
    names now (``part-i`` renamed ``rank=N``), less those of ranks rewritten since (moved onto the run's clock)."""
    rank_of = {str(tmp / f"part-{r['index']}"): r["rank"] for r in results}
    shifted = {int(rank) for rank in run.get("clock_shifts_ns", {})}
    return {str(tmp / f"rank={rank}" / name) for directory, names in flushed.items()
            if (rank := rank_of.get(str(directory))) is not None and rank not in shifted for name in names}


@contextmanager
def _polars_threads(threads: int):
    """Worker processes started inside get ``threads`` polars threads (at least 1; ``POLARS_MAX_THREADS`` when
    set is kept): the workers share the cores, not each all of them. A rank of a few rows runs a handful of
    tiny queries, each handed to polars' threads: with a pool per core, a worker was switched out 260 times a
    rank on a busy machine, and used 10% more CPU."""
    if "POLARS_MAX_THREADS" in os.environ:
        yield
        return
    os.environ["POLARS_MAX_THREADS"] = str(max(1, threads))  # read by each worker as it imports polars
    try:
        yield
    finally:
        os.environ.pop("POLARS_MAX_THREADS", None)


def _hashes(groups: list[list[Path]]) -> list[str]:
    """The content hash of each rank (:func:`traceparse.sources.sha256_of`), several at once: hashlib lets go of
    the interpreter while it hashes, so on 2 cores 8 ranks of 140 MB take 0.4 s instead of 0.8 s."""
    if len(groups) <= 1:
        return [sha256_of(group) for group in groups]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(groups), _cores()), thread_name_prefix="traceparse-hash") as pool:
        return list(pool.map(sha256_of, groups))


def _share_cores(tasks: list[tuple], workers: int) -> list[tuple]:
    """The tasks with the reader parameters ``workers`` (decoding processes per rank) and ``threads`` (decoding
    threads, where a rank has no decoding process) set so that the ranks read at once and their decoding
    together use the cores, not more: one pool, one budget. A rank read without decoding processes keeps one
    decoding thread beside its main thread (decoding overlaps writing); two would only share the rank's core
    (8 ranks of 140 MB on 2 cores: 0.8 CPU s more).

    With one rank at a time the reader chooses for itself; a ``workers`` or ``threads`` the caller gave is kept.
    """
    if workers <= 1:
        return tasks
    cores = _cores()
    per_rank = max(0, cores // workers - 1)
    share = {"workers": per_rank} if per_rank else {"workers": 0, "threads": max(1, cores // workers)}
    return [(*task[:4], {**share, **(task[4] or {})}, *task[5:]) for task in tasks]


#: Most small ranks a worker process reads in one task (:func:`ingest_ranks`).
MAX_RANKS_PER_TASK = 32


def _ranks_per_task(ranks: int, workers: int) -> int:
    """How many small ranks each task of the pool reads: enough that a rank's result is not a round trip to this
    process (which, on a busy machine, may wait its turn while the workers idle), few enough that every worker
    gets several tasks (at most :data:`MAX_RANKS_PER_TASK`)."""
    return max(1, min(MAX_RANKS_PER_TASK, ranks // (4 * workers)))


def ingest_ranks(tasks: list[tuple]) -> list[dict]:
    """:func:`ingest_rank` of each task in turn, in one worker: the results in order (the first error stops it)."""
    return [ingest_rank(*task) for task in tasks]


def _map_local(tasks: list[tuple], pool: "_RankPool", advance: Callable | None, per_task: int = 1) -> list[dict]:
    """Run :func:`ingest_rank` over ``tasks``, each task ``per_task`` ranks: inline for one worker, else by this
    process and ``pool``'s ``workers - 1`` processes (perhaps started ahead, :meth:`_RankPool.start`).
    ``advance(n, results)`` is called with each task's ranks as they are done.

    This process reads ranks too, taking the next task from the same queue as the pool's feeder
    (:class:`_PoolFeeder`): one process fewer to start (its imports cost 0.5 CPU s, which on 2 cores is 0.25 s
    of the run), and its first rank is read while the pool's worker is still starting. At most ``workers``
    tasks are in flight; the first error stops the rest.
    """
    workers = pool.workers
    if workers <= 1:
        results = []
        for task in tasks:
            results.append(ingest_rank(*task))
            if advance:
                advance(1, results[-1:])
        return results
    queue = _TaskQueue([tasks[i:i + per_task] for i in range(0, len(tasks), per_task)])
    done = _Done(advance)
    read = False
    with _polars_threads(_cores() // workers):  # (the workers that replace those done with their tasks)
        try:
            feeder = _PoolFeeder(pool.start(), workers - 1, queue, done)
            feeder.start()
            try:
                while (task := queue.take()) is not None:
                    done(ingest_ranks(task))
            finally:
                queue.stop()  # an error here: the pool takes no more
                feeder.join()
            read = feeder.error is None
        finally:
            # every rank read: the workers exit while the run is assembled (a worker's exit took 0.1 to 0.3 s);
            # else they are waited for, as they stop, before the error is raised
            pool.close(wait=not read)
    from concurrent.futures.process import BrokenProcessPool

    if isinstance(feeder.error, BrokenProcessPool):
        one_at_a_time = spelled("--jobs 1", "traceparse.run.ingest_run(paths, store=Store(), jobs=1)")
        raise TraceparseError("a worker process died while reading the ranks (out of memory?); "
                              f"{one_at_a_time} reads one rank at a time in this process") from None
    if feeder.error is not None:
        raise feeder.error
    return done.results


class _RankPool:
    """The worker processes of a run read here: ``workers - 1`` of them (this process reads ranks too), made when
    first needed (:meth:`start`). ``small``: every rank is small (:data:`SMALL_RANK_BYTES`), so a worker is never
    replaced; else after :data:`TASKS_PER_WORKER` tasks."""

    def __init__(self, workers: int, small: bool = False):
        self.workers, self.small = workers, small
        self._executor: ProcessPoolExecutor | None = None

    @classmethod
    def for_ranks(cls, ranks: list[list[Path]], jobs: int | None) -> "_RankPool":
        """The pool for ``ranks`` (:func:`choose_workers`; started only where it has a process)."""
        sizes = [input_bytes(group) for group in ranks]
        workers = choose_workers(ranks, jobs, sizes)
        return cls(workers, small=workers > 1 and max(sizes) < SMALL_RANK_BYTES)

    def start(self) -> ProcessPoolExecutor | None:
        """The executor, its processes started now (a process pool starts them at its first task); None for one
        worker (this process alone)."""
        if self._executor is None and self.workers > 1:
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context

            with _polars_threads(_cores() // self.workers):
                self._executor = ProcessPoolExecutor(
                    max_workers=self.workers - 1, mp_context=get_context("spawn"),
                    max_tasks_per_child=None if self.small else TASKS_PER_WORKER, initializer=enter_command_line,
                    initargs=(on_command_line(),))  # a reader's message as here
                self._executor.submit(int)  # no work: the processes start, and import, while this one goes on
        return self._executor

    def close(self, wait: bool) -> None:
        """Stop the processes (``wait``: until they have exited); tasks not started are cancelled."""
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)


def _maybe_stored(store: Store, ranks: list[tuple[str, list[Path]]]) -> bool:
    """Whether the store holds a run of exactly these files (by path): then its content is likely stored, and no
    worker is started ahead of the hashing that tells (a worker started for nothing delays the exit by its
    start-up)."""
    wanted = sorted(str(p) for _, group in ranks for p in group)
    for run in store.all_runs():
        given = run.get("source_paths") or {}
        if sorted(p for paths in given.values() for p in paths) == wanted:
            return True
    return False


class _TaskQueue:
    """A run's tasks in order, taken one at a time by this process and by the pool's feeder thread."""

    def __init__(self, tasks: list):
        self._tasks = deque(tasks)
        self._lock = threading.Lock()
        self._stopped = False

    def take(self):
        """The next task, or None when there is none left or the run stopped (an error)."""
        with self._lock:
            return None if self._stopped or not self._tasks else self._tasks.popleft()

    def stop(self) -> None:
        """Give out no more tasks."""
        with self._lock:
            self._stopped = True


class _Done:
    """The ranks read so far, from either thread, each batch handed to ``advance(n, results)`` once."""

    def __init__(self, advance: Callable | None):
        self.results: list[dict] = []
        self._advance = advance
        self._lock = threading.Lock()

    def __call__(self, ranks: list[dict]) -> None:
        with self._lock:
            self.results.extend(ranks)
            if self._advance:
                self._advance(len(ranks), ranks)


class _PoolFeeder(threading.Thread):
    """Keeps ``slots`` tasks of ``queue`` in flight in ``pool`` while this process reads ranks itself: a worker
    that finishes gets its next task at once, not when this process is done with its own rank. ``error``: the
    first error of a task (the queue is then stopped and the tasks not started are cancelled)."""

    def __init__(self, pool: ProcessPoolExecutor, slots: int, queue: _TaskQueue, done: _Done):
        super().__init__(name="traceparse-pool-feeder", daemon=True)
        self.pool, self.slots, self.queue, self.done = pool, slots, queue, done
        self.error: BaseException | None = None

    def run(self) -> None:
        pending: set[Future] = set()
        try:
            while True:
                while len(pending) < self.slots and (task := self.queue.take()) is not None:
                    pending.add(self.pool.submit(ingest_ranks, task))
                if not pending:
                    return
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    self.done(future.result())
        except BaseException as exc:
            self.error = exc
            self.queue.stop()
            for future in pending:
                future.cancel()


def _assemble(run_id: str, name: str, ranks: list[tuple[str, list[Path]]], results: list[dict],
              tmp: Path) -> tuple[dict, list[str]]:
    """Check the ranks' numbers, move each partition to ``rank=N`` and build the run metadata."""
    results = sorted(results, key=lambda r: r["index"])
    warnings: list[str] = []
    _ranks_for_process_ids(results, ranks, tmp, warnings)
    by_rank: dict[int, dict] = {}
    for result in results:
        path = ranks[result["index"]][1][0]
        if result["rank"] in by_rank:
            other = ranks[by_rank[result["rank"]]["index"]][1][0]
            raise InputError(f"{path}: rank {result['rank']} again (also {other})")
        by_rank[result["rank"]] = result
        warnings.extend(result["meta"].get("warnings", []))
    _refuse_other_jobs(by_rank, ranks)
    _refuse_repeated_captures(by_rank, ranks, tmp)
    sizes = {r["world_size"] for r in results if r["world_size"] is not None}
    if len(sizes) > 1:  # the size most ranks say (of equals, the larger), never below the ranks present
        said: dict[int, list[int]] = {}
        for result in sorted(results, key=lambda r: r["rank"]):
            if result["world_size"] is not None:
                said.setdefault(result["world_size"], []).append(result["rank"])
        most = max(said, key=lambda size: (len(said[size]), size))
        used = max(most, max(by_rank) + 1)
        each = "; ".join(f"{listed('rank', said[size], shown=4)} {'says' if len(said[size]) == 1 else 'say'} {size:,}"
                         for size in sorted(said, key=lambda size: (-len(said[size]), size)))
        warnings.append(f"the ranks disagree on the world size ({each}); {used:,} is used"
                        + (" (most ranks')" if used == most else " (the ranks present)"))
        sizes = {used}
    plausible = PLAUSIBLE_RANKS_PER_FILE * len(results)
    if sizes and max(sizes) > plausible:  # never believed: a world size is not an allocation
        claimed = max(sizes)
        sizes = set()
        warnings.append(f"the ranks claim a world size of {claimed:,} for {len(results)} rank file"
                        f"{'s' if len(results) != 1 else ''} (more than {PLAUSIBLE_RANKS_PER_FILE} times as many); "
                        "the world size is taken from the ranks present")
    world_size = max(sizes) if sizes else max(by_rank) + 1
    beyond = sorted(r for r in by_rank if r < 0 or r >= world_size)
    if beyond:
        path = ranks[by_rank[beyond[0]]["index"]][1][0]
        raise InputError(f"{path}: rank {beyond[0]} is outside the world size {world_size}")
    if len(by_rank) < world_size:
        missing = world_size - len(by_rank)
        first = _first_missing(by_rank, world_size, 10)  # never a set of every expected rank: a rank may be 2^31 - 1
        shown = ", ".join(map(str, first)) + (f" and {missing - len(first):,} more" if missing > len(first) else "")
        missing_note = f"{missing:,} of {world_size:,} ranks missing from the run: {shown}"
        warnings.append(missing_note)
    else:
        missing_note = None
    for rank, result in by_rank.items():
        os.rename(tmp / f"part-{result['index']}", tmp / f"rank={rank}")
    shifts = align_rank_clocks(tmp, by_rank, ranks, warnings)
    metas = {rank: TraceMeta.from_dict(by_rank[rank]["meta"]) for rank in sorted(by_rank)}
    backends = {m.distributed.get("backend") or m.tags.get("backend") for m in metas.values()} - {None}
    groups: dict[str, dict] = {}
    for m in metas.values():
        for group in m.distributed.get("process_groups") or []:
            groups.setdefault(str(group.get("name")), group)
    formats = {m.format for m in metas.values()}
    run = {
        "id": run_id, "name": name, "format": formats.pop() if len(formats) == 1 else None,
        "world_size": world_size, "ranks": {str(rank): m.id for rank, m in metas.items()},
        "rank_from": {str(rank): by_rank[rank]["rank_from"] for rank in metas},
        "process_groups": list(groups.values()), "backend": ", ".join(sorted(backends)) or None,
        "source_paths": {str(rank): m.source_paths for rank, m in metas.items()},
        "event_count": sum(m.event_count or 0 for m in metas.values()),
        "warnings": warnings,
    }
    if missing_note:  # every analysis of the run says it, not only its ingest (store.Store._run_trace_meta)
        run["incomplete"] = [missing_note]
    if shifts:
        run["clock_shifts_ns"] = {str(rank): shift for rank, shift in sorted(shifts.items())}
    from traceparse.schema import SCHEMA_VERSION

    run["schema_version"] = SCHEMA_VERSION
    return run, warnings


def _backend_of(result: dict) -> str | None:
    meta = result["meta"]
    backend = (meta.get("distributed") or {}).get("backend") or (meta.get("tags") or {}).get("backend")
    return None if backend is None else str(backend)


def _refuse_other_jobs(by_rank: dict[int, dict], ranks: list[tuple[str, list[Path]]]) -> None:
    """Refuse a run whose ranks name different communication backends: they are traces of different jobs.

    Every rank of one job joins the same default process group, so every rank's trace names the same backend
    (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``). A rank copied in from another job (a glob over two jobs'
    folders) used to be moved onto the run's clock and graded: ddp4 with fsdp4's rank 3 read "Ranks unevenly
    busy, critical, 3.436×". The rank named is the first whose backend is not the one most ranks name (of equal
    counts, the lowest rank's).
    """
    said: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        if (backend := _backend_of(by_rank[rank])) is not None:
            said.setdefault(backend, []).append(rank)
    if len(said) < 2:
        return
    run_backend = max(said, key=lambda b: (len(said[b]), -said[b][0]))
    odd = min(r for b, rs in said.items() if b != run_backend for r in rs)
    path = ranks[by_rank[odd]["index"]][1][0]
    others = said[run_backend]
    apart = ""
    if (mine := _time_range(by_rank[odd])) is not None:
        theirs = [r for rank in others if (r := _time_range(by_rank[rank])) is not None]
        if theirs:
            start, end = min(s for s, _ in theirs), max(e for _, e in theirs)
            gap = max(mine[0] - end, start - mine[1])
            if gap > CLOCK_GAP_NS:
                apart = f"; its events are also {fmt_ns(gap)} from theirs"
    raise InputError(f"{path}: rank {odd} is from another job: its trace names the backend "
                     f"{_backend_of(by_rank[odd])!r}, where {listed('rank', others, shown=4)} "
                     f"{'names' if len(others) == 1 else 'name'} {run_backend!r} (the ranks of one job share one "
                     f"backend){apart}; give the ranks of one run together")


def _refuse_repeated_captures(by_rank: dict[int, dict], ranks: list[tuple[str, list[Path]]], tmp: Path) -> None:
    """Refuse two ranks that hold the same events at the same times: one capture given twice in two forms.

    Files with the same bytes are refused before they are read; a capture given as ``.json`` and ``.json.gz``,
    recompressed, or as ``.sqlite`` beside ``.sqlite.gz``, has other bytes and was read as two ranks whose every
    collective then "waited" 0 ns. Two ranks of one job never start and end every event on the same nanosecond:
    ranks whose first start, last end and counts per kind agree have their events' kinds, starts and durations
    compared (in time order) from their written partitions; if they are the same, the second rank's file is
    refused, naming the first. Only ranks told by their file names (or process ids) are compared: a trace that
    says its own rank is never the copy of another's (a copy says the same rank, and is refused for that), and
    copies of one capture that each say another rank were made so on purpose (benchmarks/make_ranks.py).
    """
    by_key: dict[tuple, list[int]] = {}
    for rank in sorted(by_rank):
        summary = by_rank[rank]["meta"].get("summary") or {}
        if summary.get("start_ns") is None or by_rank[rank]["rank_from"] == "trace":
            continue
        key = (summary.get("start_ns"), summary.get("end_ns"),
               tuple(sorted((summary.get("events_per_kind") or {}).items())))
        by_key.setdefault(key, []).append(rank)
    for same in by_key.values():
        if len(same) < 2:
            continue
        tables: dict[int, pl.DataFrame] = {}
        for rank in same:
            part = tmp / f"part-{by_rank[rank]['index']}" / "events.parquet"
            table = pl.read_parquet(part, columns=["kind", "start_ns", "duration_ns"])
            table = table.with_columns(pl.col("kind").cast(pl.String)).sort(["start_ns", "duration_ns", "kind"],
                                                                             nulls_last=True)
            for first, earlier in tables.items():
                if table.equals(earlier):
                    path, other = (ranks[by_rank[r]["index"]][1][0] for r in (rank, first))
                    raise InputError(f"{path}: the same capture as {other} (rank {first}): its {table.height:,} "
                                     f"events start and end on the same nanoseconds; one rank given twice in two "
                                     f"forms (give each rank's trace once)")
            tables[rank] = table


# -- clocks -----------------------------------------------------------------
def _time_range(result: dict) -> tuple[int, int] | None:
    summary = result["meta"].get("summary") or {}
    start, end = summary.get("start_ns"), summary.get("end_ns")
    return None if start is None or end is None else (int(start), int(end))


def clock_shifts(ranges: dict[int, tuple[int, int]]) -> tuple[int | None, dict[int, int]]:
    """The reference rank and, for each rank whose clock is not the reference's, the shift that aligns it.

    The ranks of one job run at the same time, so on a shared clock their time ranges (first start, last end)
    overlap or nearly. The reference is the rank whose range overlaps the most others (the lowest of a tie); a
    rank whose range is further from the reference's than :data:`CLOCK_GAP_NS` and :data:`CLOCK_GAP_SPANS`
    times the longest rank is on another clock (another host's boot time, a damaged clock field): its shift
    moves its first event onto the reference's first event. Python integers: nothing can wrap.
    """
    if len(ranges) < 2:
        return None, {}
    starts = sorted(start for start, _ in ranges.values())
    ends = sorted(end for _, end in ranges.values())

    def meets(span: tuple[int, int]) -> int:
        """How many ranges overlap ``span`` (itself included): all but those starting after it ends and those
        ending before it starts (two bisections, not a pass over every rank: 10,000 ranks)."""
        return len(starts) - (len(starts) - bisect_right(starts, span[1])) - bisect_left(ends, span[0])

    ref = min(ranges, key=lambda r: (-meets(ranges[r]), r))
    longest = max(end - start for start, end in ranges.values())
    far = max(CLOCK_GAP_NS, CLOCK_GAP_SPANS * longest)  # ranks that merely profiled apart are left alone

    def gap(span: tuple[int, int]) -> int:
        return max(span[0] - ranges[ref][1], ranges[ref][0] - span[1])

    return ref, {r: ranges[ref][0] - span[0] for r, span in sorted(ranges.items()) if gap(span) > far}


def clock_origin_shifts(by_rank: dict[int, dict]) -> tuple[int | None, dict[int, int]]:
    """The reference rank (the lowest) and, for each rank whose trace counts time from another zero, the shift
    that puts it on the reference's clock, from the UTC time of each trace's zero its reader gives
    (:data:`traceparse.meta.CLOCK_ORIGIN_UTC_NS`): a time t of rank r is t + (origin r - origin ref) on the
    reference's clock. Only where every rank gives one; ({} otherwise, and where they are all the same)."""
    from traceparse.meta import CLOCK_ORIGIN_UTC_NS

    origins = {}
    for rank, result in by_rank.items():
        value = ((result["meta"].get("extra") or {}).get(CLOCK_ORIGIN_UTC_NS))
        if type(value) is not int:  # a stored value of another type says nothing
            return None, {}
        origins[rank] = value
    if len(origins) < 2:
        return None, {}
    ref = min(origins)
    return ref, {r: origins[r] - origins[ref] for r in sorted(origins) if origins[r] != origins[ref]}


def align_rank_clocks(tmp: Path, by_rank: dict[int, dict], ranks: list[tuple[str, list[Path]]],
                      warnings: list[str]) -> dict[int, int]:
    """Move the events of ranks on another clock so the run shares one; one warning for each way they moved.

    Two ways, in turn. Ranks whose traces count time from their own zero, and say when it was in UTC
    (:func:`clock_origin_shifts`: an Nsight Systems report per rank, each from its own session's start), are
    moved onto the lowest rank's clock by the difference of their zeros. Then ranks still on another clock
    (:func:`clock_shifts`: time ranges far apart) are moved to start with the reference rank's first event.

    Cross-rank figures (collective waits, the run's span, the critical floor) compare times across ranks: a rank
    whose clock is 9.2e18 ns off would make the run span 292 years and its waits that long; two per-rank nsys
    reports whose sessions started 6.2 ms apart made every collective's ranks seem to leave it 6.2 ms apart.
    Each moved rank's ``events.parquet`` (under ``tmp/rank=N``) and its metadata summary are rewritten. A rank
    that cannot be moved without passing Int64 (its own events span nearly 2^63 ns) is refused in one line.
    Returns {rank: shift_ns}.
    """
    from traceparse.validate import INT64_MAX

    ranges = {rank: r for rank, result in by_rank.items() if (r := _time_range(result)) is not None}
    origin_ref, by_origin = clock_origin_shifts(by_rank)
    by_origin = {r: shift for r, shift in by_origin.items() if r in ranges}
    moved = {r: (start + by_origin.get(r, 0), end + by_origin.get(r, 0)) for r, (start, end) in ranges.items()}
    ref, far = clock_shifts(moved)
    shifts = {r: by_origin.get(r, 0) + far.get(r, 0) for r in sorted({*by_origin, *far})}
    shifts = {r: shift for r, shift in shifts.items() if shift}
    for rank, shift in shifts.items():
        start, end = ranges[rank]
        if end + shift > INT64_MAX or start + shift < -INT64_MAX - 1:
            path = ranks[by_rank[rank]["index"]][1][0]
            onto = ref if ref is not None else origin_ref
            raise InputError(f"{path}: rank {rank} is on another clock (its events never overlap those of rank "
                             f"{onto} in time) and its span of {fmt_ns(end - start)} cannot be moved onto the clock "
                             f"of rank {onto} within Int64 nanoseconds")
        directory = tmp / f"rank={rank}"
        events = pl.read_parquet(directory / "events.parquet")
        events.with_columns(pl.col("start_ns") + shift).write_parquet(directory / "events.parquet",
                                                                      compression="zstd", compression_level=1)
        meta = by_rank[rank]["meta"]
        meta["summary"] = {**meta["summary"], "start_ns": start + shift, "end_ns": end + shift}
        meta.setdefault("extra", {})["clock_shift_ns"] = shift
        _write_json(directory / "meta.json", meta, sync=False)  # flushed at the commit, with the rest
    if by_origin:
        first, shift = next(iter(by_origin.items()))
        others = f" and {len(by_origin) - 1:,} more rank{'s' if len(by_origin) > 2 else ''}" if len(by_origin) > 1 \
            else ""
        warnings.append(f"each rank's trace counts time from its own capture's start: rank {first}{others} moved "
                        f"onto the clock of rank {origin_ref} by the UTC times of their starts (rank {first} by "
                        f"{'-' if shift < 0 else '+'}{fmt_ns(abs(shift))})")
    if far:
        first, shift = next(iter(far.items()))
        ahead = "ahead of" if shift < 0 else "behind"
        others = f" and {len(far) - 1:,} more rank{'s' if len(far) > 2 else ''}" if len(far) > 1 else ""
        warnings.append(f"ranks on another clock: rank {first}{others} (its events never overlap those of rank "
                        f"{ref} in time; rank {first} is {fmt_ns(abs(shift))} {ahead} rank {ref}); their times are "
                        f"moved to start with the first event of rank {ref} ("
                        + spelled("--set stragglers.align_clocks=true",
                                  'analyze(..., settings={"stragglers": {"align_clocks": True}})')
                        + " aligns the ranks on collective ends)")
    return shifts


def trace_ranks(trace: Trace) -> int:
    """How many ranks a run's combined trace holds (1 for a trace that is not a run)."""
    return max(1, len(rank_labels(trace)))
