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
  ``part`` per rank on the workers (:func:`measure_rank`, which reads that
  rank's partition from the store) and its ``combine`` on the client, over
  the small partial frames. It is the measures' own part/combine split, not a
  second implementation, so the figures are the same as in-process.

The client still loads the run's table for what rules compute outside the
measures (applicability, top items, roofline); see docs/scale.md.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import polars as pl

from traceparse.errors import InputError
from traceparse.measures.base import Measure, parts_by
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
        n = int(count) if count else max(1, len(os.sched_getaffinity(0)))
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
def map_ingest(address: str, tasks: list[tuple], advance: Callable[[int], Any] | None = None) -> list[dict]:
    """Run :func:`traceparse.run.ingest_rank` for every task on the cluster; the results, in any order.

    The first failing rank cancels the others and its error is raised here.
    """
    from dask.distributed import as_completed

    from traceparse.run import ingest_rank

    with connected(address) as client:
        futures = [client.submit(ingest_rank, *task, pure=False) for task in tasks]
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
def _rank_events(root: str, run_id: str, rank: str) -> pl.DataFrame:
    """A rank's events, read once per worker for the several measures of one analyze (two ranks kept)."""
    return Store(root).load_rank(run_id, rank).events


def measure_rank(measure: Measure, root: str, run_id: str, rank: str, params: dict) -> pl.DataFrame:
    """``measure.part`` of one rank of a stored run, on a worker."""
    return measure.part(_rank_events(root, run_id, rank), **params)


@contextmanager
def measures_on(client: Any, store: Store, run: Trace) -> Iterator[None]:
    """Within the block, measures called on ``run``'s table run their parts per rank on the cluster.

    ``run`` is :meth:`traceparse.store.Store.load_run`'s trace. A measure
    called on any other table (a rule's own subset) runs here as usual.
    """
    info = run.meta.extra["run"]
    ranks = sorted(info["ranks"], key=int)
    table = run.events
    root = str(Path(store.root).resolve())

    def runner(measure: Measure, events: pl.DataFrame, params: dict) -> list[pl.DataFrame] | None:
        if events is not table:
            return None
        futures = [client.submit(measure_rank, measure, root, run.id, rank, params, pure=False) for rank in ranks]
        return client.gather(futures)

    with parts_by(runner):
        yield
