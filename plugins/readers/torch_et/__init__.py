"""Reader ``torch_et``: a PyTorch execution trace read together with the Kineto trace of the same step.

An execution trace (``torch.profiler.ExecutionTraceObserver``; Chakra's and HTA's input) lists every operator
with the tensors it read and wrote but no times; the Kineto trace (``torch.profiler``) has the times. Given
both (two paths, or a directory holding them), this reader reads the Kineto trace with the ``torch`` reader,
links each node of the execution trace to its operator (:mod:`.link`: by record-function id, as Chakra and
HTA do) and gives every operator the operators whose output tensors it read (:mod:`.events`: the
``data_from`` column), which the critical-path graph turns into ``data`` edges. An execution trace alone is
refused with one line saying what it is and what to give with it.

Layout: :mod:`.sniff` (the execution trace's signature), :mod:`.execution_trace` (the form, two node
layouts), :mod:`.link`, :mod:`.events`. docs/formats/torch_et.md describes the format and the links.
"""

from __future__ import annotations

from pathlib import Path

from traceparse.errors import bad_input
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Trace

from traceparse_plugins.readers.torch_et import sniff as sniffing
from traceparse_plugins.readers.torch_et.events import with_data_from
from traceparse_plugins.readers.torch_et.execution_trace import read_execution_trace
from traceparse_plugins.readers.torch_et.link import link

KINETO_READER = "torch"


class ExecutionTraceReader(Reader):
    name = "torch_et"
    description = "PyTorch execution trace (ExecutionTraceObserver) with the Kineto trace of the same step"
    variants = ("execution trace schema 1.0.1 (PyTorch 2.0-2.1) with a Kineto trace whose External id is the "
                "record-function id", "schema 1.0.2-chakra.0.0.4 to 1.1.1-chakra.0.0.4 (PyTorch 2.2 to 2.11) "
                "with a Kineto trace carrying 'Record function id'", "the two files given together, or a directory "
                "holding one execution trace and its Kineto trace")
    patterns = ("*_et.json", "*_et.json.gz", "*.et.json", "*.et.json.gz")
    companions = (KINETO_READER,)

    def sniff(self, path: Path, head: bytes) -> float:
        return sniffing.sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """Each execution trace with the Kineto trace of its pid among ``paths`` (the one Kineto trace
        offered when there is one execution trace); a directory alone; every other path alone (a Kineto trace
        left over goes back to its reader; a file given with ``--format torch_et`` is refused when read)."""
        heads = {p: read_head(p, 64 * 1024) for p in paths if p.is_file()}
        ets = [p for p in paths if p.is_file() and sniffing.is_execution_trace(heads[p])]
        kinetos = [p for p in paths if p.is_file() and p not in ets]
        groups: list[list[Path]] = [[p] for p in paths if p.is_dir()]
        free = list(kinetos)
        for et in ets:
            _, pid = sniffing.head_facts(heads[et])
            same = [k for k in free if pid is not None and sniffing.kineto_pid(heads[k]) == pid]
            if not same and len(ets) == 1 and len(free) == 1:
                same = free  # the one pair given: its pids are checked when it is read
            groups.append([et, *same])
            free = [k for k in free if k not in same]
        return groups + [[k] for k in free]

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        et_path, kineto = _pair(paths)
        kineto_reader = _kineto_reader()
        et = read_execution_trace(et_path)
        options.progress(et_path.stat().st_size)
        found = link(et, kineto)
        trace = kineto_reader.read([kineto], options)
        events, facts = with_data_from(trace.events, et, found)
        meta = trace.meta
        meta.variant = " / ".join(x for x in (meta.variant, f"with execution trace schema {et.schema}") if x)
        meta.extra["execution_trace"] = {
            "path": str(et_path), "kineto_path": str(kineto), "schema": et.schema, "pid": et.pid, "time": et.time,
            "nodes": found.nodes, "linked": found.linked, "linked_by": found.rule, **facts,
        }
        return Trace(events, meta)


def _kineto_reader() -> Reader:
    from traceparse.plugins import registry

    return registry().reader(KINETO_READER)


def _pair(paths: list[Path]) -> tuple[Path, Path]:
    """The execution trace and its Kineto trace among ``paths`` (a directory: among its JSON files)."""
    files: list[Path] = []
    for path in paths:
        files += sniffing.directory_files(path) if path.is_dir() else [path]
    heads = {p: read_head(p, 64 * 1024) for p in files}
    ets = [p for p in files if sniffing.is_execution_trace(heads[p])]
    where = paths[0]
    if not ets:
        raise bad_input(where, None, "not a PyTorch execution trace (ExecutionTraceObserver writes a JSON object "
                                     'whose first keys are "schema" and "pid", then "nodes")')
    if len(ets) > 1:
        raise bad_input(where, None, f"{len(ets)} execution traces where one was expected")
    et = ets[0]
    schema, pid = sniffing.head_facts(heads[et])
    kineto_reader = _kineto_reader()
    kinetos = [p for p in files if p != et and kineto_reader.sniff(p, heads[p]) > 0]
    if len(kinetos) > 1 and pid is not None:
        kinetos = [p for p in kinetos if sniffing.kineto_pid(heads[p]) == pid] or kinetos
    if not kinetos:
        raise bad_input(et, None, f"a PyTorch execution trace (ExecutionTraceObserver, schema {schema}, pid {pid}): "
                                  "operators and the tensors they read and wrote, without times; give it together "
                                  "with the Kineto trace of the same profiled step (torch.profiler), as two paths "
                                  "or a directory holding both")
    if len(kinetos) > 1:
        raise bad_input(et, None, f"{len(kinetos)} Kineto traces of pid {pid} could be its pair "
                                  f"({', '.join(p.name for p in kinetos[:3])}); give it with the one of its step")
    return et, kinetos[0]


@hookimpl
def traceparse_readers():
    return [ExecutionTraceReader()]
