"""The form: a PyTorch execution trace (``torch.profiler.ExecutionTraceObserver``), decoded with msgspec.

Two node layouts are read, as Chakra's and PARAM's readers read them:

* schema ``1.0.1`` (PyTorch 2.0-2.1): ``rf_id`` on the node, ``inputs`` / ``outputs`` lists of values with
  ``input_types`` / ``output_types`` beside them;
* schema ``1.0.2-chakra.0.0.4`` and later (PyTorch 2.2 on): ``inputs`` / ``outputs`` objects
  ``{"values": [...], "types": [...], "shapes": ..., "strides": ...}`` and the node's scalars in
  ``attrs`` (``[{"name": "rf_id", "type": "uint64", "value": 14}, ...]``).

A tensor value is ``[tensor_id, storage_id, offset, numel, itemsize, device]`` (type ``Tensor(...)``), a list
of tensors one of those per element (type ``GenericList[Tensor(...),...]``); the six values together are the
tensor's identity here (a tensor id alone can come back for new storage). ``rf_id`` is the record-function
id that Kineto writes as ``Record function id`` (PyTorch 2.1 on) and, before, as the op's ``External id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from traceparse.errors import bad_input
from traceparse.sources import open_binary
from traceparse.text import one_line

#: The ExecutionTraceObserver's own nodes (process and thread roots): no Kineto event has them.
ROOT_NAMES = ("[pytorch|profiler|execution_trace|", "[pytorch|profiler|execution_graph|")

TensorKey = tuple


class _Attr(msgspec.Struct, gc=False):
    name: str = ""
    value: Any = None


class _Node(msgspec.Struct, gc=False):
    id: int
    name: str = ""
    rf_id: int | None = None
    inputs: Any = None
    outputs: Any = None
    input_types: list[Any] | None = None
    output_types: list[Any] | None = None
    attrs: list[_Attr] | None = None


class _Document(msgspec.Struct):
    nodes: list[_Node]
    schema: str | None = None
    pid: int | None = None
    time: str | None = None


@dataclass
class Node:
    """One operator of the execution trace: its record-function id and the tensors it read and wrote."""

    id: int
    name: str
    rf_id: int | None
    inputs: set[TensorKey]
    outputs: set[TensorKey]


@dataclass
class ExecutionTrace:
    """What traceparse keeps of an execution trace: its header and its operator nodes (roots left out)."""

    path: Path
    schema: str | None
    pid: int | None
    time: str | None
    nodes: list[Node]


def read_execution_trace(path: Path) -> ExecutionTrace:
    """Decode ``path`` (plain or gzip); a one-line error naming the file for anything that is not an
    execution trace traceparse reads."""
    try:
        with open_binary(path) as f:
            data = f.read()
    except EOFError:
        raise bad_input(path, None, "the gzip stream ends early (cut short?); an execution trace is one JSON "
                                    "document and cannot be read from part of it") from None
    try:
        doc = msgspec.json.decode(data, type=_Document)
    except msgspec.ValidationError as exc:
        raise bad_input(path, None, f"not an execution trace traceparse reads: {one_line(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise bad_input(path, None, f"not valid JSON: {one_line(str(exc))}") from None
    nodes = [Node(n.id, n.name, _rf_id(n), _tensors(n.inputs, n.input_types), _tensors(n.outputs, n.output_types))
             for n in doc.nodes if not n.name.startswith(ROOT_NAMES)]
    return ExecutionTrace(path, doc.schema, doc.pid, doc.time, nodes)


def _rf_id(node: _Node) -> int | None:
    if node.rf_id is not None:
        return node.rf_id
    for attr in node.attrs or ():
        if attr.name == "rf_id":
            return attr.value if type(attr.value) is int else None
    return None


def _tensors(values: Any, types: list[Any] | None) -> set[TensorKey]:
    """The tensors among a node's inputs or outputs (either layout), as identity tuples."""
    if isinstance(values, dict):  # {"values": [...], "types": [...], ...}
        values, types = values.get("values"), values.get("types")
    if not isinstance(values, list) or not isinstance(types, list):
        return set()
    out: set[TensorKey] = set()
    for value, kind in zip(values, types):
        if not isinstance(kind, str):
            continue
        if kind.startswith("Tensor"):
            _add(out, value)
        elif kind.startswith("GenericList[Tensor") and isinstance(value, list):
            for item in value:
                _add(out, item)
    return out


def _add(out: set[TensorKey], value: Any) -> None:
    if (isinstance(value, list) and len(value) >= 6 and all(type(v) is int for v in value[:5])
            and isinstance(value[5], str)):
        out.add(tuple(value[:6]))
