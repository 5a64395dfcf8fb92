"""What an exporter is: writes a trace in another format."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from traceparse.trace import Trace


class Exporter:
    """Base class for exporters: set ``name``, ``description``, ``suffixes``; implement :meth:`export`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()

    def export(self, trace: Trace, out: Path) -> None:
        """Write ``trace`` to ``out``; write to a temporary file and rename so no half file is left."""
        raise NotImplementedError
