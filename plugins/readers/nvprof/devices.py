"""Device names as nvprof prints them, and the device index they carry.

nvprof writes a device as ``Tesla P100-PCIE-16GB (0)``: the name, then the
index in parentheses. The text GPU trace cuts its Device column to a fixed
width (15 characters), so a cell may read ``Tesla P100-PCIE`` or
``GeForce GTX 107``: both the end of the name and the index are lost. Such a
cell is resolved to a full ``NAME (N)`` seen elsewhere in the same log when it
is the start of exactly one of them; otherwise its index stays unknown (null).
"""

from __future__ import annotations

import re

_WITH_INDEX = re.compile(r"^(.*\S)\s*\((\d+)\)$")


def parse_device(text: str | None) -> tuple[str | None, int | None]:
    """(name, index) of a device cell; the index is None when the cell does not end in ``(N)``."""
    if text is None:
        return None, None
    text = text.strip().strip('"')
    if not text or text == "-":
        return None, None
    m = _WITH_INDEX.match(text)
    if m and len(m.group(2)) <= 9:  # a GPU index, not a number past Int32 (issue 16: 2**70)
        return m.group(1), int(m.group(2))
    return text, None


class DeviceBook:
    """The devices a log names, by index; resolves cut-off Device cells to them."""

    def __init__(self) -> None:
        self.by_index: dict[int, str] = {}
        self.seen_without_index: set[str] = set()

    def note(self, text: str | None) -> tuple[str | None, int | None]:
        """Record a device cell and return its (name, index)."""
        name, index = parse_device(text)
        if name is not None and index is not None:
            self.by_index.setdefault(index, name)
        elif name is not None:
            self.seen_without_index.add(name)
        return name, index

    def resolve(self, text: str | None) -> int | None:
        """The index of a device cell: its own ``(N)``, else the one full name it is the start of, else None."""
        name, index = parse_device(text)
        if index is not None or name is None:
            return index
        matches = [i for i, full in self.by_index.items() if f"{full} ({i})".startswith(name)]
        return matches[0] if len(matches) == 1 else None
