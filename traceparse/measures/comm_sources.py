"""Which rows of communication a collective's instances are read from, and which collectives are transfers.

A rank's collective call is recorded in up to five places (:data:`SOURCES`): the ``record_param_comms`` that
PyTorch wraps round it (with or without a sequence number), the ``c10d::*`` operator, a backend's worker
annotation (``gloo:all_reduce``) and the communication kernel. The measures of :mod:`traceparse.measures.comm`
take each member's best one; the group settlement (:mod:`traceparse.measures.comm_groups`) reads them too.
"""

from __future__ import annotations

import polars as pl

#: Where an arrival comes from, most preferred first: each member's instances are its rows of the first source
#: it has. ``record_param_comms`` with a sequence number carries the instance's identity; a ``c10d::*``
#: operator is the host-side call itself; a host annotation (``gloo:all_reduce`` on a worker thread) starts
#: when the backend takes the collective up; a communication kernel is the device's side, used where only GPU
#: events exist.
SOURCES = ("record_param_comms+seq", "c10d op", "record_param_comms", "host annotation", "kernel")

#: Events that end when a member leaves a collective, most preferred first (see :func:`completions`).
COMPLETION_SOURCES = (("kernel",), ("host annotation",))

#: Point-to-point collectives: one family when a call is matched to its kernel (:func:`completions`).
POINT_TO_POINT = ("send", "recv", "send_recv")


def point_to_point_only(kinds: pl.Series) -> bool:
    """Whether ``kinds`` (``collective`` values) are all point-to-point (:data:`POINT_TO_POINT`): at least one, and
    no collective among them (a pipeline's sends and receives, not an all-reduce)."""
    kinds = kinds.drop_nulls()
    return kinds.len() > 0 and bool(kinds.is_in(list(POINT_TO_POINT)).all())


def is_transfer() -> pl.Expr:
    """A point-to-point row (its ``collective`` one of :data:`POINT_TO_POINT`): a send, a receive or both."""
    return pl.col("collective").is_in(list(POINT_TO_POINT))
