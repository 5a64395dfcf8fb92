"""Dask, for runs that outgrow one machine: per-rank ingest and per-rank measures on a cluster.

``--scheduler ADDRESS`` (or ``$TRACEPARSE_SCHEDULER``) on ``ingest`` and
``analyze`` connects to a running Dask scheduler
(``dask.distributed.Client(ADDRESS)``); ``--scheduler local`` starts a
``LocalCluster`` of worker processes on this machine (``local:N`` for N of
them). Dask is optional (``pip install "traceparse[dask]"``): without
``--scheduler`` nothing here is imported.

What is mapped and what is reduced:

- **ingest**: each rank is one task, :func:`traceparse.run.ingest_rank`, run
  on a worker: it reads the rank's file and writes its partition under the
  store's ``tmp/``; the client gathers only the small metadata and renames
  the run into place. Workers must see the store and the input files at the
  same paths as the client (a shared filesystem).
- **analyze**: each measure a rule calls on a run (a
  :class:`traceparse.measures.Measure`, valid by ``trace_id``) runs its
  per-rank step on the workers (:func:`rank_task`: the rank's ``part``,
  finished by ``combine`` when the measure never merges two ranks) and the
  client concatenates the small per-rank results (or combines the parts of a
  measure that matches collectives across ranks). It is the in-process
  path of :class:`traceparse.measures.base.PartitionedEvents` with the loop
  over ranks sent to the cluster, not a second implementation, so the
  figures are the same. What a rule reads outside the measures (a filter,
  an aggregate) the client answers by a lazy scan of the ranks' Parquet
  files; see docs/scale.md.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import polars as pl

from traceparse.cores import usable_cores
from traceparse.errors import InputError
from traceparse.events_file import read_events
from traceparse.store import Store
from traceparse.trace import Trace

#: Environment variable giving the default ``--scheduler``.
SCHEDULER_ENV = "TRACEPARSE_SCHEDULER"


def scheduler_from(option: str | None) -> str | None:
    """The scheduler to use: the option if given, else ``$TRACEPARSE_SCHEDULER``, else None (in-process)."""
    return option or os.environ.get(SCHEDULER_ENV) or None


@contextmanager
def connected(address: str) -> Iterator[Any]:
    """A ``dask.distributed.Client`` for ``address``: a scheduler address, ``local`` or ``local:N``.

    ``local`` starts a LocalCluster of worker processes (one thread each; as
    many as the cores, or N), closed when the block ends.
    """
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError('--scheduler needs Dask: pip install "traceparse[dask]"') from None
    if address == "local" or address.startswith("local:"):
        count = address.partition(":")[2]
        if count and not count.isdigit():
            raise InputError(f"--scheduler {address!r}: expected local or local:N (N worker processes)")
        n = int(count) if count else usable_cores()
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            yield client
        return
    try:
        client = Client(address, timeout="20s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(f"--scheduler {address}: cannot connect to a Dask scheduler: {exc}") from None
    with client:
        yield client


# -- ingest -----------------------------------------------------------------
def map_ingest(address: str, work: Callable[..., dict], tasks: list[tuple],
               advance: Callable[[int], Any] | None = None) -> list[dict]:
    """Run ``work(*task)`` (the run's :func:`traceparse.run.ingest_rank`, given by its caller so that this module
    stays below :mod:`traceparse.run`) for every task on the cluster; the results, in any order.

    The first failing rank cancels the others and its error is raised here.
    """
    from dask.distributed import as_completed

    with connected(address) as client:
        futures = [client.submit(work, *task, pure=False) for task in tasks]
        results = []
        try:
            for future in as_completed(futures):
                results.append(future.result())
                if advance:
                    advance(1)
        except BaseException:
            client.cancel(futures)
            raise
    return results


# -- measures ---------------------------------------------------------------
@lru_cache(maxsize=2)
def _partition(path: str) -> pl.DataFrame:
    """A rank's events, read on a worker (the last two kept: a worker often gets the same rank twice in a row; its
    all-null columns take no memory, :func:`traceparse.events_file.read_events`)."""
    return read_events(path)


def rank_task(fn: Callable, path: str, args: tuple) -> Any:
    """``fn(events of the rank at path, *args)`` on a worker: :func:`traceparse.measures.base.rank_result`."""
    return fn(_partition(path), *args)


@contextmanager
def measures_on(client: Any, store: Store, run: Trace) -> Iterator[None]:
    """Within the block, the measures called on ``run``'s events run per rank on the cluster.

    ``run`` is :meth:`traceparse.store.Store.load_run`'s lazy trace: its
    events are a :class:`traceparse.measures.base.PartitionedEvents`, whose
    per-rank step (:func:`traceparse.measures.base.rank_result`) is sent to
    the workers instead of run here; the client concatenates the small
    per-rank results, or combines the parts of a measure that matches rows
    across ranks. The same code as in-process, so the same figures. Workers
    read the ranks' Parquet files at the client's (resolved) paths.
    """
    from traceparse.measures.base import PartitionedEvents  # the measures (numpy): not for `ingest`'s start

    table = run.events
    if not isinstance(table, PartitionedEvents):
        raise TypeError("measures_on needs a run loaded with Store.load_run(run_id, lazy=True)")
    paths = [str(Path(p).resolve()) for p in table.paths]

    def executor(fn: Callable, args: tuple) -> list[Any]:
        futures = [client.submit(rank_task, fn, path, args, pure=False) for path in paths]
        return client.gather(futures)

    previous, table.executor = table.executor, executor
    try:
        yield
    finally:
        table.executor = previous
