"""Recognising TAU's output by its own content (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* 1.0: a text profile's first line, ``N templated_functions[_MULTI_<METRIC>]``; ParaProf's packed profile
  (``.ppk``: gzip, then ``PPK`` as Java writes characters), read by :mod:`.packed`.
* 0.8: merged or snapshot XML (``<profile_xml>``), a pprof report, a
  directory of ``profile.N.C.T`` files, of ``MULTI__*`` directories of them,
  or holding a ``tauprofile.xml``.
* 0.8 too: a ``pprof -d`` dump (a ``.dep`` line, then ``N templated_functions -stddev``), refused likewise.
* 0.2: only the name (``profile.N.C.T``, ``snapshot.N.C.T``,
  ``tauprofile.xml``, ``*.ppk``): claimed so the reader says precisely what is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A text profile's file name: ``profile.<node>.<context>.<thread>``.
PROFILE_NAME = re.compile(r"^profile\.(\d+)\.(\d+)\.(\d+)(?:\.gz)?$")
#: The directories of one metric each: ``MULTI__<METRIC>``.
MULTI_PREFIX = "MULTI__"
#: pprof's headers: a thread's table, the summary over threads, the table's columns.
THREAD_HEADER = r"^[ \t]*NODE ([0-9]+);\s*CONTEXT ([0-9]+);\s*THREAD ([0-9]+):"
SUMMARY_HEADER = r"^[ \t]*FUNCTION SUMMARY \((total|mean)\):"
COLUMN_HEADER = r"^[ \t]*%Time\s+Exclusive\s+Inclusive"
HEADER = re.compile(rb"^\s*\d+\s+templated_functions")
SNAPSHOT_NAME = re.compile(r"^snapshot\.\d+\.\d+\.\d+(?:\.gz)?$")
#: ParaProf's packed profile (``.ppk``), once ungzipped: "PPK" written by Java's ``writeChars``.
PACKED_HEAD = b"\x00P\x00P\x00K"
#: ``pprof -d``'s dump: the dependency file's name, then the count of functions and pprof's column header.
PPROF_DUMP = re.compile(rb"^[^\n]*\.dep\r?\n\s*\d+\s+templated_functions\b[^\n]*\n\s*%time\s")
# possessive spaces: two runs side by side would retry each other's split (quadratic in a head of spaces)
XML_HEAD = re.compile(rb"^\s*+(?:\xef\xbb\xbf)?+\s*+(?:<\?xml[^>]*\?>\s*)?<profile_xml>")


def sniff(path: Path, head: bytes) -> float:
    """Confidence that ``path`` is TAU output (see the module docstring)."""
    if path.is_dir():
        return _sniff_directory(path)
    if HEADER.match(head) or head.startswith(PACKED_HEAD):
        return 1.0
    if PPROF_DUMP.match(head):
        return 0.8
    if XML_HEAD.match(head):
        return 0.8
    if looks_like_pprof(head.decode("utf-8", errors="replace")):
        return 0.8
    if PROFILE_NAME.match(path.name) or SNAPSHOT_NAME.match(path.name) or path.name == "tauprofile.xml" \
            or path.suffix.lower() == ".ppk":
        return 0.2
    return 0.0


def _sniff_directory(path: Path) -> float:
    try:
        entries = list(path.iterdir())
    except OSError:
        return 0.0
    if any(PROFILE_NAME.match(p.name) for p in entries):
        return 0.8
    for sub in entries:
        if sub.name.startswith(MULTI_PREFIX) and sub.is_dir():
            try:
                if any(PROFILE_NAME.match(p.name) for p in sub.iterdir()):
                    return 0.8
            except OSError:
                continue
    if (path / "tauprofile.xml").is_file():
        return 0.8
    return 0.0


def looks_like_pprof(head: str) -> bool:
    """True when ``head`` has a pprof table header under a NODE or FUNCTION SUMMARY line."""
    return bool(re.search(COLUMN_HEADER, head, re.M)) and bool(
        re.search(THREAD_HEADER, head, re.M) or re.search(SUMMARY_HEADER, head, re.M))
