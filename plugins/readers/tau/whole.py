"""Whole numbers TAU writes as text in metadata and XML attributes (device properties, thread and event ids).

A value that is not one (``GPU globalMemorySize`` = ``80GB``) stays unknown, as before, but no longer silently:
:class:`WholeNumbers` remembers the first bad value of each field in each file and :meth:`WholeNumbers.flush`
gives one warning per file and field, naming both and quoting the value.
"""

from __future__ import annotations

from typing import Callable

from traceparse.validate import excerpt


class WholeNumbers:
    """``numbers(text, field, where)``: ``int(text)``, or None (noted) for text that is not a whole number."""

    def __init__(self) -> None:
        self.bad: dict[tuple[str, str], list] = {}  # (where, field) -> [count, first value]

    def __call__(self, text: str | None, field: str, where: str) -> int | None:
        if text is None:
            return None
        try:
            return int(text)
        except (TypeError, ValueError):
            entry = self.bad.setdefault((str(where), field), [0, text])
            entry[0] += 1
            return None

    def flush(self, warn: Callable[[str], None]) -> None:
        """One warning per file and field with a bad value (the first quoted, the others counted), to ``warn``."""
        for (where, field), (count, first) in self.bad.items():
            others = f" (and {count - 1} more value{'s' if count > 2 else ''} of it)" if count > 1 else ""
            warn(f"{where}: {field} {excerpt(first)} is not a whole number{others}; left unknown")
        self.bad.clear()


def quiet_int(text: str | None) -> int | None:
    """``int(text)``, or None: for a value another reading of the same file already warned about."""
    try:
        return int(text) if text is not None else None
    except (TypeError, ValueError):
        return None
