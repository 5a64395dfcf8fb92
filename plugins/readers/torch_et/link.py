"""Linking an execution trace's nodes to the operators of its Kineto trace, as Chakra and HTA link them.

Both traces name an operator by its record-function id: the execution trace as ``rf_id``, Kineto (PyTorch 2.1
on) as the ``Record function id`` argument of ``cpu_op`` and ``user_annotation`` events; that is Chakra's link
(``trace_link``). Older Kineto traces have no such argument, and the op's ``External id`` was its
record-function id: that is HTA's link (``correlate_execution_trace``). The rule is chosen from the Kineto trace
(``Record function id`` where any operator has one), and the link is checked: the execution trace's ``pid`` must
be the operators' process, and nearly every node (:data:`MIN_LINKED`) must find an operator of its own name.
Where ``External id`` and ``rf_id`` differ by one constant (two counts of the same operators from different
starts), the link takes it, if nearly every node then finds its own-named operator (:func:`_shifted`). Files
that fail (an execution trace of another step than the profiled one, whose ids only overlap) are refused with a
one-line error, not linked by guesswork.

The events of the Kineto trace are decoded a second time here, for these two ids only (the normalized table
keeps ``External id`` as ``external_id`` but not the record-function id): each linked node then lands on the
row of its operator by ``(external_id, name)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions

from traceparse_plugins.readers.chrome_json import Event, stream_events
from traceparse_plugins.readers.torch_et.execution_trace import ExecutionTrace

#: Share of the execution trace's operator nodes that must find their Kineto operator (same id, same name).
MIN_LINKED = 0.95
RF_ARG, EXTERNAL_ARG = "Record function id", "External id"
_HOST_CATEGORIES = ("cpu_op", "user_annotation")


class _Args(msgspec.Struct, gc=False):
    external_id: int | str | None = msgspec.field(default=None, name="External id")
    rf_id: int | str | None = msgspec.field(default=None, name="Record function id")


class _Document(msgspec.Struct):
    traceEvents: list[Event[_Args]] = []


@dataclass
class Link:
    """Execution-trace node id -> (external_id, name) of its Kineto operator, and how it was found."""

    operators: pl.DataFrame  # node_id, external_id, name
    rule: str
    nodes: int
    linked: int


def _int(value: int | str | None) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def kineto_operators(path: Path) -> pl.DataFrame:
    """The host operators of a Kineto trace: ``name``, ``pid``, ``external_id``, ``rf_id`` (null where absent)."""
    rows = []
    for _, events in stream_events(path, ReadOptions(), Event[_Args], _Document, label="torch.profiler trace",
                                   array_form=False):
        for e in events:
            if e.cat in _HOST_CATEGORIES and e.ph == "X" and e.args is not None:
                rows.append((e.name, _int(e.pid), _int(e.args.external_id), _int(e.args.rf_id)))
    return pl.DataFrame(rows, schema={"name": pl.String, "pid": pl.Int64, "external_id": pl.Int64,
                                      "rf_id": pl.Int64}, orient="row")


def link(et: ExecutionTrace, kineto: Path) -> Link:
    """Each node of ``et`` with its operator in ``kineto``; a one-line error where the two are not one step."""
    ops = kineto_operators(kineto)
    pids = sorted(set(ops["pid"].drop_nulls().to_list()))
    if et.pid is not None and pids and et.pid not in pids:
        shown = ", ".join(map(str, pids[:4])) + (", ..." if len(pids) > 4 else "")
        raise bad_input(et.path, None, f"its pid {et.pid} is not the process of the operators of {kineto} "
                                       f"(pid {shown}): the two files are not of one run")
    if et.pid is not None:
        ops = ops.filter(pl.col("pid") == et.pid)
    rule = RF_ARG if ops["rf_id"].drop_nulls().len() else EXTERNAL_ARG
    key = "rf_id" if rule == RF_ARG else "external_id"
    ops = ops.filter(pl.col(key).is_not_null() & pl.col("external_id").is_not_null())
    ops = ops.filter(pl.len().over(key) == 1)  # an id two operators share links neither
    nodes = pl.DataFrame([(n.id, n.rf_id, n.name) for n in et.nodes],
                         schema={"node_id": pl.Int64, "_key": pl.Int64, "name": pl.String}, orient="row")
    keyed = ops.select(pl.col(key).alias("_key"), "external_id", "name")
    linked = nodes.join(keyed, on=["_key", "name"], how="inner")
    if key == "external_id" and nodes.height and linked.height < MIN_LINKED * nodes.height:
        linked, shift = _shifted(nodes, keyed, linked)
        if shift:
            rule = f"{EXTERNAL_ARG} = rf_id {'+' if shift > 0 else '-'} {abs(shift)}"
    if nodes.height == 0 or linked.height < MIN_LINKED * nodes.height:
        raise bad_input(et.path, None, f"only {linked.height:,} of its {nodes.height:,} operators are in {kineto} "
                                       f"under the same {'rf_id' if key == 'rf_id' else 'External id'} and name "
                                       f"(linked by Kineto's {rule!r}, as {'Chakra' if key == 'rf_id' else 'HTA'} "
                                       "does): the two are not of one profiled step, or their ids do not "
                                       "link them (before PyTorch 2.1 Kineto wrote no record-function id; record "
                                       "both in one step: ExecutionTraceObserver started with torch.profiler)")
    return Link(linked.select("node_id", "external_id", "name"), rule, nodes.height, linked.height)


#: Most a Kineto trace's ``External id`` may differ from the execution trace's ``rf_id``, one constant for all
#: (:func:`_shifted`).
MAX_SHIFT = 8


def _shifted(nodes: pl.DataFrame, keyed: pl.DataFrame, linked: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Where ``External id`` is not the nodes' ``rf_id``, the link under the constant difference (at most
    :data:`MAX_SHIFT`) that links the most nodes to an operator of their own name, and that difference (0: none
    links more than the ids as they are). Why: ASTRA-sim's Megatron traces (PyTorch 2.x without ``Record function
    id``) count the same operators from two different starts: all 5,422 operator nodes have their own-named operator
    at ``External id == rf_id + 2``, 333 at equal ids. The name must match too, and :data:`MIN_LINKED` of the nodes
    must link, so a difference that only lines up a few names links nothing."""
    best, shift = linked, 0
    for d in (d for k in range(1, MAX_SHIFT + 1) for d in (k, -k)):
        moved = nodes.with_columns(pl.col("_key") + d).join(keyed, on=["_key", "name"], how="inner")
        if moved.height > best.height:
            best, shift = moved, d
    return best, shift
