"""A trace: the normalized event table plus what is known about its source."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import polars as pl

from traceparse.schema import SCHEMA_VERSION


@dataclass
class Device:
    """A GPU as the source describes it; unknown fields stay None."""

    id: int | None = None
    name: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    compute_capability: str | None = None
    core_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceMeta:
    """Where a trace came from, what wrote it, and what the reader noticed."""

    id: str | None = None
    source_paths: list[str] = field(default_factory=list)
    sha256: str | None = None
    format: str | None = None
    variant: str | None = None
    tool: str | None = None
    tool_version: str | None = None
    devices: list[Device] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    ingested_at: str | None = None
    event_count: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str | None:
        """The first (usually only) source path."""
        return self.source_paths[0] if self.source_paths else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the metadata."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TraceMeta":
        """Rebuild metadata written by :meth:`to_dict`, ignoring keys it does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["devices"] = [Device(**{k: v for k, v in d.items() if k in _DEVICE_FIELDS})
                             for d in data.get("devices", [])]
        return cls(**values)


_DEVICE_FIELDS = {f.name for f in dataclasses.fields(Device)}


class Trace:
    """The events of one trace (a polars DataFrame of :mod:`traceparse.schema`) and its metadata.

    A reader may hand back ``events`` as an iterator of DataFrame batches
    instead of one DataFrame, so a trace larger than memory can be written
    to the store batch by batch; :attr:`events` then collects them on first
    use.
    """

    def __init__(self, events: pl.DataFrame | Iterable[pl.DataFrame], meta: TraceMeta | None = None):
        self._events = events
        self.meta = meta or TraceMeta()

    @property
    def is_streamed(self) -> bool:
        """True while the events are still an unread iterator of batches."""
        return not isinstance(self._events, pl.DataFrame)

    def batches(self) -> Iterator[pl.DataFrame]:
        """The events as batches; consumes a streamed trace."""
        if isinstance(self._events, pl.DataFrame):
            yield self._events
        else:
            yield from self._events

    @property
    def events(self) -> pl.DataFrame:
        """All events as one DataFrame."""
        if not isinstance(self._events, pl.DataFrame):
            from traceparse.schema import conform, empty_frame

            frames = []
            next_id = 0
            for batch in self._events:
                batch = conform(batch, first_event_id=next_id)
                next_id += batch.height
                frames.append(batch)
            self._events = pl.concat(frames) if frames else empty_frame()
        return self._events

    @events.setter
    def events(self, value: pl.DataFrame) -> None:
        self._events = value

    @property
    def id(self) -> str | None:
        return self.meta.id

    def of_kind(self, *kinds: str) -> pl.DataFrame:
        """Events of the given kinds."""
        return self.events.filter(pl.col("kind").cast(pl.String).is_in(kinds))

    def to_pandas(self):
        """The events as a pandas DataFrame, for notebooks."""
        return self.events.to_pandas()

    def __repr__(self) -> str:
        n = "streamed" if self.is_streamed else f"{self.events.height} events"
        return f"<Trace {self.meta.id or '(not stored)'} {self.meta.format} {n}>"
