"""The trace store: one directory per trace holding its events (Parquet) and metadata (JSON).

Layout::

    STORE/traces/<id>/events.parquet
    STORE/traces/<id>/meta.json
    STORE/runs/<id>/run.json                       a run of many ranks (traceparse.run)
    STORE/runs/<id>/rank=<N>/events.parquet        rank N's events (every row's ``rank`` is N)
    STORE/runs/<id>/rank=<N>/meta.json             rank N's metadata (its own trace id)
    STORE/traces/<id>/findings.parquet             the findings of its last ``analyze`` (also in runs/<id>/)
    STORE/tmp/               entries being written
    STORE/last               id of the last trace (or run) ingested

An entry is written under ``tmp/`` and renamed into ``traces/`` in one
``rename``: a crash or Ctrl-C leaves no half entry, and when two ingests of
the same content race, one rename wins and the other finds the entry there.
The id is the start of the content's sha256, so the same content is
recognised however it is named. A run is written the same way: every rank's
partition and ``run.json`` under one ``tmp/`` directory, renamed into
``runs/`` at once, so a run is stored whole or not at all.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import queue
import shutil
import sys
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from traceparse.errors import StoreError, spelled
from traceparse.events_file import NULL_COLUMNS_KEY, read_events
from traceparse.meta import (HOSTNAMES, INCOMPLETE, INCOMPLETE_RANKS, RANK_HOSTS, TraceMeta, incomplete_notes,
                             rank_hosts)
from traceparse.threads import THREAD_NAMES

if TYPE_CHECKING:
    import polars as pl

    from traceparse.trace import Trace

# polars (and the event table) are imported where events are read or written: listing the store's metadata
# (``traceparse list``) needs neither.

DEFAULT_STORE = ".traceparse"
ID_LENGTH = 16
#: The findings of the last ``traceparse analyze`` of a trace or run, beside its events (the ``findings`` SQL view).
FINDINGS_FILE = "findings.parquet"


def default_store_path() -> Path:
    """``$TRACEPARSE_STORE`` if set, else ``.traceparse`` in the working directory."""
    return Path(os.environ.get("TRACEPARSE_STORE") or DEFAULT_STORE)


def trace_id_for(sha256: str) -> str:
    """The store id of content with this sha256."""
    return sha256[:ID_LENGTH]


def _rank_notes(run: dict, metas: list[TraceMeta]) -> list[str]:
    """Why each rank's input is incomplete (:func:`traceparse.meta.incomplete_notes`), each note naming its rank:
    on a run, "the file ends early" alone did not say which of the ranks' files did."""
    ranks = sorted(map(int, run.get("ranks") or {}))
    named = len(ranks) == len(metas)
    return [f"rank {rank}: {note}" if named else note
            for rank, meta in zip(ranks if named else [None] * len(metas), metas) for note in incomplete_notes(meta)]


def _cut_ranks(run: dict, metas: list[TraceMeta]) -> list[int]:
    """The ranks whose input ends early (:data:`traceparse.meta.INCOMPLETE_RANKS`)."""
    ranks = sorted(map(int, run.get("ranks") or {}))
    return [rank for rank, meta in zip(ranks, metas) if incomplete_notes(meta)] if len(ranks) == len(metas) else []


class Store:
    """A directory of normalized traces."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_store_path()
        self.traces_dir = self.root / "traces"
        self.runs_dir = self.root / "runs"
        self.tmp_dir = self.root / "tmp"

    # -- reading -----------------------------------------------------------
    def ids(self) -> list[str]:
        """Ids of every complete entry."""
        if not self.traces_dir.is_dir():
            return []
        return sorted(p.name for p in self.traces_dir.iterdir() if (p / "meta.json").is_file())

    def has(self, trace_id: str) -> bool:
        """True when an entry with exactly this id exists."""
        return (self.traces_dir / trace_id / "meta.json").is_file()

    def meta(self, trace_id: str) -> TraceMeta:
        """The metadata of an entry; a :class:`DamagedEntry` (one line, exit 2) when it cannot be read."""
        path = self.traces_dir / trace_id / "meta.json"
        return _read_meta(path, trace_id, lambda doc: TraceMeta.from_dict(doc))

    def all_meta(self) -> list[TraceMeta]:
        """Metadata of every entry, oldest ingest first; an entry whose metadata cannot be read is left out
        (:meth:`damaged` lists it), so one damaged entry never stops the others."""
        return sorted(_readable(self.ids(), self.meta), key=lambda m: (m.ingested_at or "", m.id or ""))

    def damaged(self) -> list[DamagedEntry]:
        """The traces and runs whose metadata cannot be read (cut short, not JSON, not the layout), each with why
        and how to remove it."""
        out = []
        for ids, read in ((self.ids(), self.meta), (self.run_ids(), self.run_meta)):
            for i in ids:
                try:
                    read(i)
                except DamagedEntry as exc:
                    out.append(exc)
        return out

    def events_path(self, trace_id: str) -> Path:
        return self.traces_dir / trace_id / "events.parquet"

    def load(self, ref: str) -> Trace:
        """A stored trace, named by its id or a unique prefix of it, as a :class:`Trace` (its events as stored: not
        validated again, see :meth:`Trace.from_store`); a one-line :class:`StoreError` for any other name."""
        from traceparse.trace import Trace

        trace_id = self.stored_id(ref, "trace")
        return Trace.from_store(read_events(self.events_path(trace_id)), self.meta(trace_id))

    def resolve_id(self, ref: str) -> str:
        """The id of the one entry whose id starts with ``ref``."""
        ids = self.ids()
        if ref in ids:
            return ref
        matches = [i for i in ids if i.startswith(ref)]
        if not matches:
            raise StoreError(f"{ref}: no such file, and {self.no_entry('trace')}")
        if len(matches) > 1:
            raise StoreError(f"{ref}: ambiguous trace id, matches {', '.join(matches[:5])}")
        return matches[0]

    def resolve(self, ref: str) -> tuple[str, str]:
        """``("trace", id)`` or ``("run", id)``: the one trace or run whose id starts with ``ref``, or a run's name."""
        matches = self.matches(ref)
        if not matches:
            raise StoreError(f"{ref}: no such file, and {self.no_entry('trace')}")
        if len(matches) > 1:
            raise StoreError(f"{ref}: ambiguous id, matches {', '.join(i for _, i in matches[:5])}")
        return matches[0]

    def stored_id(self, ref: str, want: str) -> str:
        """The id of the stored trace or run (``want``: "trace" or "run") that ``ref`` names: its id, a unique
        prefix of it, or a run's name, as :meth:`resolve` takes them; a one-line :class:`StoreError` naming ``ref``
        and the store otherwise. What :meth:`load` and :meth:`load_run` take, so that ``Store().load_run(NAME)``
        works as ``traceparse.load(NAME)`` does."""
        if Path(ref).name == ref and (self.has if want == "trace" else self.has_run)(ref):
            return ref  # an exact id: no listing of the store
        matches = self.matches(ref)
        found = [i for kind, i in matches if kind == want]
        if len(found) > 1:
            raise StoreError(f"{ref}: ambiguous {want} id, matches {', '.join(found[:5])}")
        if found:
            return found[0]
        if matches:
            kind, entry_id = matches[0]
            method = "load_run" if kind == "run" else "load"
            raise StoreError(f"{ref}: names a stored {kind}, not a {want}; Store.{method}({entry_id!r}) loads it")
        raise StoreError(f"{ref}: {self.no_entry(want)}")

    def matches(self, ref: str) -> list[tuple[str, str]]:
        """Every ``("trace" or "run", id)`` that ``ref`` may name: the entry of exactly that id, else every entry
        whose id starts with it, else the runs of that name."""
        traces, runs = self.ids(), self.run_ids()
        if ref in traces:
            return [("trace", ref)]
        if ref in runs:
            return [("run", ref)]
        matches = [("trace", i) for i in traces if i.startswith(ref)] + [("run", i) for i in runs if i.startswith(ref)]
        return matches or [("run", r["id"]) for r in self.all_runs() if r.get("name") == ref]

    def no_entry(self, want: str) -> str:
        """Why nothing stored has a name: no such entry in the store, or no store there at all."""
        if not self.root.is_dir():
            return self.missing()
        return f"no {want} with this id{' or name' if want == 'run' else ''} in the store {self.root}"

    def missing(self) -> str:
        """What to say where the store's directory does not exist (a mistyped ``--store``, ``store=`` or
        $TRACEPARSE_STORE), in the interface in use."""
        return f"no store at {self.root}: " + spelled("ingest a trace first, or give --store",
                                                      "traceparse.add(PATH) stores a trace first, or pass store= the "
                                                      "folder of an existing store")

    def require(self) -> None:
        """A one-line :class:`StoreError` when the store's directory does not exist: what reads the whole store (a
        query) says so, rather than answer from nothing as from an empty store."""
        if not self.root.is_dir():
            raise StoreError(self.missing())

    def entry_dir(self, entry_id: str) -> Path | None:
        """The directory of the stored trace or run with exactly this id (None when there is none)."""
        if self.has(entry_id):
            return self.traces_dir / entry_id
        if self.has_run(entry_id):
            return self.runs_dir / entry_id
        return None

    def save_findings(self, entry_id: str, findings: pl.DataFrame) -> bool:
        """Keep ``findings`` (:func:`traceparse.analysis.findings_frame`) as the last analysis of a stored trace or
        run: ``findings.parquet`` beside its events, replaced in one rename. False when no such entry is stored
        (a trace read from a file and never ingested)."""
        directory = self.entry_dir(entry_id)
        if directory is None:
            return False
        tmp = directory / f".findings.{uuid.uuid4().hex}.parquet"
        try:
            findings.write_parquet(tmp)
            os.replace(tmp, directory / FINDINGS_FILE)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self.error(exc, "cannot write to the store") from None
        return True

    # -- runs --------------------------------------------------------------
    def run_ids(self) -> list[str]:
        """Ids of every complete run."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if (p / "run.json").is_file())

    def has_run(self, run_id: str) -> bool:
        """True when a run with exactly this id exists."""
        return (self.runs_dir / run_id / "run.json").is_file()

    def run_meta(self, run_id: str) -> dict:
        """A run's metadata (``run.json``): id, name, format, world_size, ranks {rank: trace id}, ...; a
        :class:`DamagedEntry` when it cannot be read."""
        return _read_meta(self.runs_dir / run_id / "run.json", run_id, _run_doc, kind="run")

    def all_runs(self) -> list[dict]:
        """Metadata of every run, oldest ingest first; a run whose metadata cannot be read is left out
        (:meth:`damaged` lists it)."""
        return sorted(_readable(self.run_ids(), self.run_meta), key=lambda r: (r.get("ingested_at") or "", r.get("id") or ""))

    def rank_dir(self, run_id: str, rank: int | str) -> Path:
        """The directory of one rank's partition: ``runs/<id>/rank=<N>``."""
        return self.runs_dir / run_id / f"rank={int(rank)}"

    def rank_meta(self, run_id: str, rank: int | str) -> TraceMeta:
        """One rank's metadata (its own trace id, source path, devices ...); a :class:`DamagedEntry` (naming the
        run, which ``rm`` removes whole) when it cannot be read."""
        return _read_meta(self.rank_dir(run_id, rank) / "meta.json", run_id, lambda doc: TraceMeta.from_dict(doc),
                          kind="run")

    def load_rank(self, run_id: str, rank: int | str) -> Trace:
        """One rank of a run as a :class:`Trace` (its own trace id; ``rank`` set on every row)."""
        from traceparse.trace import Trace

        return Trace(read_events(self.rank_dir(run_id, rank) / "events.parquet"), self.rank_meta(run_id, rank))

    def rank_of_trace(self, ref: str) -> tuple[str, str] | None:
        """(run id, rank) of the one stored rank whose trace id is ``ref`` or starts with it (the ``traces`` view
        lists ranks by those ids), else None. A damaged run is passed over."""
        found = [(r["id"], rank) for r in self.all_runs() for rank, trace_id in (r.get("ranks") or {}).items()
                 if str(trace_id).startswith(ref)]
        return found[0] if len(found) == 1 else None

    def load_run(self, run_id: str, lazy: bool = False) -> Trace:
        """A run as one :class:`Trace`: every rank's events concatenated in rank order. ``run_id`` is the run's
        id, a unique prefix of it or the run's name (:meth:`stored_id`).

        Each row keeps its rank's ``trace_id`` and has ``rank`` set, so every
        measure (keyed by trace_id and device_id) and rule runs on it
        unchanged. ``meta.id`` is the run id, ``meta.format`` is ``"run"``,
        ``meta.extra["run"]`` the run metadata, ``meta.distributed`` the run's
        world size, backend and process groups.

        With ``lazy`` (what ``analyze`` uses) the events stay in the store:
        ``trace.events`` is a :class:`traceparse.measures.base.PartitionedEvents`
        over the ranks' Parquet files, which measures read one rank at a time,
        so memory does not grow with the number of ranks.
        """
        import polars as pl

        from traceparse.schema import empty_frame
        from traceparse.trace import RunTrace, Trace

        run_id = self.stored_id(run_id, "run")
        run = self.run_meta(run_id)
        ranks = sorted(run["ranks"], key=int)
        metas = [self.rank_meta(run_id, r) for r in ranks]
        paths = [self.rank_dir(run_id, r) / "events.parquet" for r in ranks]
        if lazy:
            from traceparse.measures.base import PartitionedEvents

            kinds: dict[str, int] = {}
            for m in metas:
                for kind, n in (m.summary or {}).get("events_per_kind", {}).items():
                    kinds[kind] = kinds.get(kind, 0) + n
            sizes = [m.event_count for m in metas]
            table = PartitionedEvents(paths, [m.id or "" for m in metas], kind_counts=kinds,
                                      sizes=sizes if all(isinstance(n, int) for n in sizes) else None)
            count = sum(m.event_count or 0 for m in metas)
            return RunTrace(table, self._run_trace_meta(run_id, run, metas, count))
        frames = [read_events(p) for p in paths]
        events = pl.concat(frames) if frames else empty_frame()
        return Trace(events, self._run_trace_meta(run_id, run, metas, events.height), stamp_trace_id=False)

    @staticmethod
    def _run_trace_meta(run_id: str, run: dict, metas: list[TraceMeta], count: int) -> TraceMeta:
        """The metadata of a run's combined trace (see :meth:`load_run`)."""
        devices, seen = [], set()
        for m in metas:
            for d in m.devices:
                if (d.id, d.name) not in seen:
                    seen.add((d.id, d.name))
                    devices.append(d)
        return TraceMeta(
            id=run_id, source_paths=[p for m in metas for p in m.source_paths], sha256=run.get("sha256"),
            format="run", variant=run.get("format"), tool=metas[0].tool if metas else None,
            tool_version=metas[0].tool_version if metas else None, devices=devices,
            tags={"run": run.get("name", ""), **(run.get("tags") or {})},  # the run's own tags (`traceparse tag RUN`)
            warnings=list(run.get("warnings", [])), ingested_at=run.get("ingested_at"), event_count=count,
            summary={"events_per_kind": {}, "ranks": len(metas)},
            extra={"run": run, **({INCOMPLETE: cut} if (cut := [*(run.get("incomplete") or []),
                                                                *_rank_notes(run, metas)]) else {}),
                   **({INCOMPLETE_RANKS: short} if (short := _cut_ranks(run, metas)) else {}),
                   **({THREAD_NAMES: names} if (names := _thread_names_of(metas)) else {}),
                   **({RANK_HOSTS: on, HOSTNAMES: list(dict.fromkeys(on.values()))}
                      if (on := rank_hosts(dict(zip(sorted(map(int, run.get("ranks") or {})), metas)))) else {})},
            distributed={k: run.get(k) for k in ("world_size", "backend", "process_groups")},
        )

    def commit_run(self, tmp: Path, run: dict, flushed: set[str] | None = None, replace: bool = False) -> dict:
        """Make the run written under ``tmp`` (its ``rank=N`` partitions) a stored run, in one rename.

        ``run`` is its metadata (``run["id"]`` set); every file under ``tmp``
        is flushed to disk first (the ranks write theirs without a flush each; the paths in ``flushed``
        were flushed already, :class:`EarlyFlush`, and are not flushed again), ``run.json`` is written
        last. If the same run
        appeared meanwhile it is kept and ``tmp`` is discarded; with ``replace``, a stored run of that id (the
        same ranks as another release of their reader read them) is replaced once the new one is complete.
        Returns the stored metadata.
        """
        try:
            _fsync_tree(tmp, flushed)  # the ranks' files, written without a flush each
            run["ingested_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
            _write_json(tmp / "run.json", run)
            _fsync_dir(tmp)
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            if replace and self.has_run(run["id"]):
                self.remove_run(run["id"])
            try:
                os.rename(tmp, self.runs_dir / run["id"])
            except OSError:
                if not self.has_run(run["id"]):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                run = self.run_meta(run["id"])
            _fsync_dir(self.runs_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.set_last(run["id"])
        return run

    def fresh_tmp(self) -> Path:
        """A new empty directory under ``tmp/`` for an entry being written (removed on failure by its writer)."""
        return self._fresh_tmp()

    def remove_run(self, run_id: str) -> None:
        """Delete a run (moved out of ``runs/`` in one rename first)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        gone = self.tmp_dir / f"{uuid.uuid4().hex}.removed"
        os.rename(self.runs_dir / run_id, gone)
        shutil.rmtree(gone, ignore_errors=True)

    def last_id(self) -> str:
        """The id of the trace ingested last."""
        try:
            trace_id = (self.root / "last").read_text().strip()
        except FileNotFoundError:
            trace_id = ""
        if trace_id and (self.has(trace_id) or self.has_run(trace_id)):
            return trace_id
        metas = self.all_meta()
        if not metas:
            self.require()
            raise StoreError(f"the store {self.root} is empty: ingest a trace first")
        return metas[-1].id

    # -- writing -----------------------------------------------------------
    def _fresh_tmp(self) -> Path:
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self.traces_dir.mkdir(parents=True, exist_ok=True)
            self.clean_tmp()
            path = self.tmp_dir / f"{os.getpid()}-{uuid.uuid4().hex}"
            path.mkdir()
        except OSError as exc:
            raise self.error(exc, "cannot write to the store") from None
        return path

    def error(self, exc: OSError, doing: str) -> StoreError:
        """A one-line :class:`StoreError` for an OSError met in the store: what failed, where, and why."""
        where = exc.filename or self.root
        return StoreError(f"{doing} {self.root}: {where}: {exc.strerror or exc}")

    def clean_tmp(self) -> list[str]:
        """Remove what ingests killed mid-write (SIGTERM, power loss) left under ``tmp/``; return their names.

        An entry is named ``<pid>-<uuid>`` by the process writing it; it is left alone while that
        process lives (a concurrent ingest). Entries of another form (older traceparse, a removal
        cut short) are removed once an hour old.
        """
        removed = []
        try:
            entries = list(self.tmp_dir.iterdir())
        except OSError:
            return removed
        for entry in entries:
            pid, dash, _ = entry.name.partition("-")
            if dash and pid.isdigit():
                if int(pid) == os.getpid() or _alive(int(pid)):
                    continue
            else:
                try:
                    if _dt.datetime.now().timestamp() - entry.stat().st_mtime < 3600:
                        continue
                except OSError:
                    continue
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry.name)
        return removed

    def write(self, trace: Trace, replace: bool = False) -> TraceMeta:
        """Write a trace (streamed or not) as a new entry; return its final metadata.

        ``trace.meta.id`` must be set. If an entry with that id appears
        meanwhile (a concurrent ingest of the same content), it is kept and
        this write is discarded. With ``replace``, an entry with that id (the
        same bytes as another reader read them) is replaced once the new one
        is complete: moved aside in one rename, the new one renamed in.
        """
        meta = trace.meta
        assert meta.id, "a trace needs its id before it is stored"
        tmp = self._fresh_tmp()
        try:
            return self._write(trace, tmp, replace)
        except OSError as exc:  # one the store met, not one of the reader's (those keep their own words)
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.filename and str(exc.filename).startswith(str(self.root)) or getattr(exc, "in_store", False):
                raise self.error(exc, "cannot write to the store") from None
            raise

    def _write(self, trace: Trace, tmp: Path, replace: bool = False) -> TraceMeta:
        meta = trace.meta
        try:
            _store_events(meta, trace.batches(), tmp / "events.parquet")
            meta.ingested_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
            if not meta.extra.get(INCOMPLETE):
                meta.extra.pop(INCOMPLETE, None)  # a whole input says nothing
            _write_json(tmp / "meta.json", meta.to_dict())
            _fsync_dir(tmp)
            if replace and self.has(meta.id):
                self.remove(meta.id)
            try:
                os.rename(tmp, self.traces_dir / meta.id)
            except OSError:
                if not self.has(meta.id):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # a concurrent ingest won
                meta = self.meta(meta.id)
            _fsync_dir(self.traces_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.set_last(meta.id)
        return meta

    def set_last(self, trace_id: str) -> None:
        """Remember ``trace_id`` as the last ingested trace."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".last.{uuid.uuid4().hex}"
            tmp.write_text(trace_id + "\n")
            os.replace(tmp, self.root / "last")
        except OSError as exc:
            raise self.error(exc, "cannot write to the store") from None

    def update_tags(self, trace_id: str, tags: dict[str, str], remove: Iterable[str] = ()) -> TraceMeta:
        """Merge ``tags`` into an entry's tags and drop the keys in ``remove`` (atomically replacing its
        meta.json; nothing is written when nothing changes)."""
        meta = self.meta(trace_id)
        remove = [k for k in remove if k in meta.tags]
        if remove or (tags and any(meta.tags.get(k) != v for k, v in tags.items())):
            meta.tags.update(tags)
            for key in remove:
                del meta.tags[key]
            target = self.traces_dir / trace_id / "meta.json"
            tmp = target.with_name(f".meta.{uuid.uuid4().hex}.json")
            _write_json(tmp, meta.to_dict())
            os.replace(tmp, target)
        return meta

    def update_run_tags(self, run_id: str, tags: dict[str, str], remove: Iterable[str] = ()) -> dict:
        """Merge ``tags`` into a run's tags and drop the keys in ``remove`` (atomically replacing its run.json)."""
        run = self.run_meta(run_id)
        current = dict(run.get("tags") or {})
        changed = dict(current, **tags)
        for key in remove:
            changed.pop(key, None)
        if changed != current:
            run["tags"] = changed
            target = self.runs_dir / run_id / "run.json"
            tmp = target.with_name(f".run.{uuid.uuid4().hex}.json")
            _write_json(tmp, run)
            os.replace(tmp, target)
        return run

    def remove(self, trace_id: str) -> None:
        """Delete an entry (moved out of ``traces/`` in one rename first)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        gone = self.tmp_dir / f"{uuid.uuid4().hex}.removed"
        os.rename(self.traces_dir / trace_id, gone)
        shutil.rmtree(gone, ignore_errors=True)


class DamagedEntry(StoreError):
    """A stored trace or run whose metadata cannot be read: one line naming it, why, and how to remove it."""

    def __init__(self, kind: str, entry_id: str, path: Path, reason: str):
        self.kind, self.id, self.path, self.reason = kind, entry_id, path, reason
        super().__init__(f"{kind} {entry_id}: damaged in the store: {path} cannot be read ({reason}); "
                         f"`traceparse rm {entry_id}` removes it")


def _thread_names_of(metas: list[TraceMeta]) -> dict[str, str]:
    """The ranks' thread names, for the run's combined trace: a run's hotspots compared every unnamed thread with
    every other (pt_autograd beside pt_gloo_runloop: "imbalance 11.59×" where the autograd threads' is 3.86×).
    A ``pid/tid`` two ranks name apart (processes in containers can share ids) keeps the first rank's name."""
    names: dict[str, str] = {}
    for m in metas:
        for key, name in ((m.extra or {}).get(THREAD_NAMES) or {}).items():
            names.setdefault(str(key), name)
    return names


def _readable(ids, read) -> list:
    """``read(i)`` of every id whose metadata can be read; the damaged ones are left out (``Store.damaged``)."""
    out = []
    for i in ids:
        try:
            out.append(read(i))
        except DamagedEntry:
            continue
    return out


def _read_meta(path: Path, entry_id: str, build, kind: str = "trace"):
    """``build(document)`` of the JSON file ``path``; a :class:`DamagedEntry` when the file is cut short, not
    JSON, not UTF-8, or not the layout ``build`` expects."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        if not isinstance(doc, dict):
            raise TypeError(f"a JSON {type(doc).__name__}, not an object")
        return build(doc)
    except FileNotFoundError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, json.JSONDecodeError) else f"not JSON: {exc}"
        raise DamagedEntry(kind, entry_id, path, reason) from None


def _run_doc(doc: dict) -> dict:
    """A run's metadata as stored; its ``id`` and ``ranks`` are what every command relies on."""
    if not isinstance(doc.get("id"), str) or not isinstance(doc.get("ranks", {}), dict):
        raise TypeError("no id, or ranks not an object")
    return doc


def write_partition(trace: Trace, directory: Path, batches: Iterable[pl.DataFrame] | None = None) -> TraceMeta:
    """Write a trace's events and metadata into ``directory`` (a part of an entry being written under
    ``tmp/``, e.g. one rank of a run); return the metadata. The caller renames it into place.
    ``batches``: the trace's conformed batches (:meth:`Trace.batches`) as the caller changed them (a run's
    ``rank`` set), written instead of ``trace.batches()`` and not conformed or validated again.

    Nothing is flushed to disk here: :meth:`Store.commit_run` flushes every file of the entry at once before
    the rename (a rank of a run of a thousand paid 2 to 13 ms for its own ``fsync``)."""
    meta = trace.meta
    directory.mkdir(parents=True, exist_ok=True)
    _store_events(meta, trace.batches() if batches is None else batches, directory / "events.parquet")
    meta.ingested_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
    _write_json(directory / "meta.json", meta.to_dict(), sync=False)
    return meta


def _alive(pid: int) -> bool:
    """True when a process with this id exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _store_events(meta: TraceMeta, batches: Iterable[pl.DataFrame], path: Path) -> None:
    """Write a trace's conformed batches to ``path`` and set its count and summary in ``meta``; GPU work recorded
    more than once (:mod:`traceparse.repeats`) is kept once, with a warning."""
    meta.event_count, meta.summary = _write_events(batches, path)
    import polars as pl

    from traceparse.expr import GPU_KINDS
    from traceparse.repeats import find_repeats

    if not meta.event_count or not meta.summary.get("events_per_kind", {}).keys() & set(GPU_KINDS):
        return
    repeats = find_repeats(pl.scan_parquet(path))
    if repeats is None:
        return
    _drop_rows(path, repeats.event_ids)
    meta.event_count -= len(repeats.event_ids)
    kinds = meta.summary["events_per_kind"]
    for kind, count in repeats.per_kind.items():
        kinds[kind] -= count
    meta.summary["events_per_kind"] = {k: n for k, n in kinds.items() if n}
    meta.warnings.append(repeats.warning(meta.path or "the trace"))


def _drop_rows(path: Path, event_ids: list[int]) -> None:
    """Rewrite the events file at ``path`` without the rows of ``event_ids``, streaming (a rare path: GPU work a
    tool recorded twice), its own metadata kept."""
    import polars as pl

    metadata = {k: v for k, v in (pl.read_parquet_metadata(path) or {}).items() if k == NULL_COLUMNS_KEY}
    kept = path.with_name(path.name + ".kept")
    try:
        (pl.scan_parquet(path).filter(~pl.col("event_id").is_in(event_ids))
         .sink_parquet(kept, compression="zstd", compression_level=1, row_group_size=256 * 1024,
                       metadata=metadata or None))
        os.replace(kept, path)
    except OSError as exc:
        exc.in_store = True
        raise
    finally:
        if kept.exists():
            kept.unlink()


def _write_events(batches: Iterable[pl.DataFrame], path: Path) -> tuple[int, dict]:
    """Write conformed batches (:meth:`Trace.batches`, which set ``trace_id`` and ``event_id``) to one
    Parquet file; the writing runs in a thread, overlapping the reader's parsing."""
    from traceparse.schema import empty_frame

    count = 0
    summary = _Summary()
    with _ParquetSink(path) as sink:
        for batch in batches:
            if batch.height == 0:
                continue
            sink.put(batch)
            count += batch.height
            summary.add(batch)
        if count == 0:  # no events at all: an empty table with the schema
            sink.put(empty_frame())
    return count, summary.result()


#: Rows a :class:`_ParquetSink` holds before it starts its writer thread: a trace smaller than this (a small rank
#: of a run of a thousand, whatever number of batches its reader gives) is written at once, in the caller.
SMALL_TRACE_ROWS = 65_536
#: Rows under which a trace's one Parquet file is written without compression or column statistics.
TINY_TRACE_ROWS = 1_024


class _ParquetSink:
    """Appends DataFrames to a Parquet file from a background thread (pyarrow releases the GIL).

    The thread starts once the batches put exceed :data:`SMALL_TRACE_ROWS` rows: a small trace (a small rank
    of a run of a thousand, in one batch or several) is written in the caller, in one write and without a
    thread's start and join (10 ms a rank).
    """

    def __init__(self, path: Path):
        self.path = path
        self.queue: queue.Queue = queue.Queue(maxsize=2)  # bounded: memory stays bounded too
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="traceparse-parquet-writer", daemon=True)
        self.held: list[pl.DataFrame] = []  # the batches put before the thread starts (at most the rows above)
        self.held_rows = 0
        self.null_columns: set[str] | None = None  # the columns null in every row put so far (None: no row yet)

    def __enter__(self) -> "_ParquetSink":
        return self

    def put(self, batch: pl.DataFrame) -> None:
        if self.error is not None:
            raise self.error
        if batch.height:  # null counts are kept with the columns: no pass over the rows
            nulls = {c for c, n in zip(batch.columns, batch.null_count().row(0)) if n == batch.height}
            self.null_columns = nulls if self.null_columns is None else self.null_columns & nulls
        if not self.thread.is_alive() and self.thread.ident is None:  # not started yet
            self.held.append(batch)
            self.held_rows += batch.height
            if self.held_rows <= SMALL_TRACE_ROWS:
                return
            self.thread.start()
            for held in self.held:
                self.queue.put(held)
            self.held = []
            return
        self.queue.put(batch)

    def _write_one(self, batch: pl.DataFrame) -> None:
        # polars itself: a small rank's one batch in 1.4 ms, against 3.6 ms through pyarrow (same file schema);
        # a tiny one (a rank of a few events) without compression or statistics, which cost more than they
        # save on a few rows: 1.2 ms against 1.7 (a four-row rank, measured 300 times)
        tiny = batch.height <= TINY_TRACE_ROWS
        try:
            batch.write_parquet(self.path, compression="uncompressed" if tiny else "zstd",
                                compression_level=None if tiny else 1, statistics=not tiny,
                                row_group_size=256 * 1024, metadata=self._file_metadata())
        except OSError as exc:
            exc.in_store = True  # disk full, quota: the store's, whatever the writer names
            raise

    def _run(self) -> None:
        writer = None
        try:
            while (batch := self.queue.get()) is not None:
                table = batch.to_arrow()
                if writer is None:
                    writer = parquet_writer(self.path, table.schema)
                writer.write_table(table, row_group_size=256 * 1024)
        except BaseException as exc:  # reported to the caller on its next put() or at exit
            if isinstance(exc, OSError):
                exc.in_store = True  # disk full, quota: the store's, whatever pyarrow names
            self.error = exc
            while self.queue.get() is not None:
                pass
        finally:
            if writer is not None:
                if self.error is None:  # every batch is in: the caller's last put came before the end marker
                    writer.add_key_value_metadata(self._file_metadata())
                writer.close()

    def _file_metadata(self) -> dict[str, str]:
        """The file's own key-value metadata: the columns null in every row (:func:`read_events`)."""
        return {NULL_COLUMNS_KEY: json.dumps(sorted(self.null_columns))} if self.null_columns else {}

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.thread.ident is None:  # a small trace (or nothing): written here, at once
            import polars as pl

            if exc is None and self.held:
                self._write_one(self.held[0] if len(self.held) == 1 else pl.concat(self.held))
            self.held = []
            return
        self.queue.put(None)
        self.thread.join()
        if exc is None and self.error is not None:
            raise self.error


def parquet_writer(path: Path, schema):
    """The pyarrow ParquetWriter of a store's events file: zstd level 1, dictionary encoding on the text
    columns only (:func:`_text_columns`)."""
    import pyarrow.parquet as pq  # only writing needs pyarrow: reading and analysing start faster without it

    return pq.ParquetWriter(path, schema, compression="zstd", compression_level=1,
                            use_dictionary=_text_columns(schema))


def _text_columns(schema) -> list[str]:
    """The columns Parquet's dictionary encoding pays for: text and enums (names, kinds repeat). On the integer
    and float columns (times, ids) it was dearer and larger: the 139 MB benchmark trace's events took 4.4 MB
    and 0.24 CPU s with every column dictionary-encoded, 2.5 MB and 0.18 s with the text ones only."""
    import pyarrow as pa

    return [field.name for field in schema
            if pa.types.is_dictionary(field.type) or pa.types.is_string(field.type)
            or pa.types.is_large_string(field.type) or pa.types.is_string_view(field.type)]


class _Summary:
    """Events per kind and time span, accumulated batch by batch."""

    def __init__(self):
        self.kinds: dict[str, int] = {}
        self.start: int | None = None
        self.end: int | None = None

    def add(self, batch: pl.DataFrame) -> None:
        """Count ``batch``'s rows per kind and widen the span, in one query (a batch of a few rows: none)."""
        import polars as pl

        if batch.height <= 1024:  # a small rank's batch: its few rows read here
            kinds = self.kinds
            for kind, start, duration in zip(batch["kind"].cast(pl.String).to_list(), batch["start_ns"].to_list(),
                                             batch["duration_ns"].to_list()):
                kinds[str(kind)] = kinds.get(str(kind), 0) + 1
                if start is not None:
                    self.start = start if self.start is None else min(self.start, start)
                    end = start + (duration or 0)  # an instant (a counter sample, a marker) ends where it starts
                    self.end = end if self.end is None else max(self.end, end)
            return
        per_kind = batch.group_by("kind").agg(pl.len().alias("n"), pl.col("start_ns").min().alias("s"),
                                              (pl.col("start_ns") + pl.col("duration_ns").fill_null(0)).max().alias("e"))
        for kind, n, start, end in per_kind.iter_rows():
            self.kinds[str(kind)] = self.kinds.get(str(kind), 0) + n
            if start is not None:
                self.start = start if self.start is None else min(self.start, start)
            if end is not None:
                self.end = end if self.end is None else max(self.end, end)

    def result(self) -> dict:
        return {
            "events_per_kind": dict(sorted(self.kinds.items())),
            "start_ns": self.start,
            "end_ns": self.end,
            "span_ns": None if self.start is None or self.end is None else self.end - self.start,
        }


def _write_json(path: Path, data: dict, sync: bool = True) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
        if sync:
            f.flush()
            os.fsync(f.fileno())


#: Files under which an entry is flushed file by file; above, with one ``syncfs`` of its file system (Linux).
SYNCFS_FILES = 64


@functools.cache
def _syncfs_call():
    """libc's ``syncfs`` (Linux), or None where there is none."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int
    return call


def _syncfs(path: Path) -> bool:
    """Flush the whole file system holding ``path`` in one call (``syncfs``, which reports write-back errors
    since Linux 5.8); False where it cannot (no ``syncfs``, or it failed): then flush file by file."""
    call = _syncfs_call()
    if call is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return call(fd) == 0
    finally:
        os.close(fd)


def _fsync_tree(root: Path, flushed: set[str] | None = None) -> None:
    """Flush every file and directory under ``root`` to disk, many at once (the file system commits them
    together: a thousand ranks' files in a fraction of a second, where one after the other took seconds).
    The files in ``flushed`` (paths) were flushed already and not written since: they are not flushed again.
    An entry of many files (a run of many ranks) is flushed with one ``syncfs`` of its file system where the
    system has it: 10,000 small ranks' 30,000 files and directories cost 3 s of flushes one by one."""
    from concurrent.futures import ThreadPoolExecutor

    files, dirs = [], [root]
    for base, subdirs, names in os.walk(root):
        files += [os.path.join(base, n) for n in names]
        dirs += [Path(base) / d for d in subdirs]
    if flushed:
        files = [f for f in files if f not in flushed]
    if len(files) > SYNCFS_FILES and _syncfs(root):
        return

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(files) + len(dirs)))) as pool:
        list(pool.map(_fsync_file, files))  # an error (disk full, I/O) reaches the caller
        list(pool.map(_fsync_dir, dirs))  # a thousand ranks' directories: 2.5 s one after the other


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EarlyFlush:
    """Flushes the files of finished parts of an entry being written (a run's ranks) in background threads, while
    the other parts are still being read: :meth:`Store.commit_run` then flushes only the rest (10,000 ranks'
    files took 3 s after the last rank was read)."""

    def __init__(self, threads: int = 8):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="traceparse-flush")
        self.futures: dict[Path, object] = {}

    def add(self, directory: Path) -> None:
        """Flush the files of ``directory`` (and the directory itself) soon; nothing where the commit will
        flush the whole file system in one call (:func:`_syncfs`)."""
        if _syncfs_call() is not None:
            return
        self.futures[directory] = self.pool.submit(self._flush, directory)

    @staticmethod
    def _flush(directory: Path) -> list[str]:
        names = []
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False):
                _fsync_file(entry.path)
                names.append(entry.name)
        _fsync_dir(directory)
        return names

    def finish(self) -> dict[Path, list[str]]:
        """Wait for the flushes (before the parts are renamed or rewritten): {directory: names of the files
        flushed} (an error: raised)."""
        try:
            return {directory: future.result() for directory, future in self.futures.items()}
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def abandon(self) -> None:
        """Stop flushing (the entry is being thrown away)."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
