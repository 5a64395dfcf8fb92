"""TAU's XML profiles: merged ``tauprofile.xml`` (TAU_PROFILE_FORMAT=merged) and ``snapshot.N.C.T`` files.

Both are the snapshot format of TAU's ``TauSnapshot.cpp`` (also written by
Score-P's TAU snapshot writer): a sequence of ``<profile_xml>`` blocks (the
merged file is the blocks of every rank concatenated, so it has several
top-level elements), each holding

- ``<thread id="N.C.T.PID" node= context= thread=>`` with the thread's
  ``<metadata><attribute><name/><value/></attribute>...``;
- ``<definitions thread="N.C.T.PID">`` (or ``thread="*"``, shared) with
  ``<metric id><name>``, ``<event id><name>NAME TYPE</name><group>``,
  ``<userevent id><name>``;
- ``<profile thread=...>`` with ``<interval_data metrics="0 1 ">`` lines
  ``id calls subrs excl0 incl0 excl1 incl1 ...`` and ``<atomic_data>``
  lines ``id numevents max min mean sumsqr``. A snapshot file holds one
  ``<profile>`` per snapshot, each cumulative: the last one of a thread is
  read.

TAU's merger (``TauProfileMerge.cpp``) ends each rank's block with a NUL byte
(it writes the C string with its terminator); NUL bytes are no XML characters
and are dropped. The file is streamed through one hardened lxml pull parser (no entities, no
DTD, no network, libxml2 size limits on) inside a synthetic root, elements
are dropped once read, depth is capped, and any DOCTYPE or ENTITY
declaration is refused before anything is parsed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import polars as pl
from lxml import etree

from traceparse.errors import bad_input
from traceparse.sources import open_binary

from . import events, safe_xml
from .profiles import ProfileSet, assemble, gpu_facts
from .profile_text import whole_numbers
from .decimals import is_number, to_float
from .whole import WholeNumbers

CHUNK = 1 << 20
_DECLARATION = re.compile(rb'^\s*+(?:\xef\xbb\xbf)?+\s*+<\?xml[^>]*?\?>', re.DOTALL)
_ENCODING = re.compile(rb'encoding\s*=\s*["\']([A-Za-z0-9._-]+)["\']')
_THREAD_ID = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def read_xml(path: Path, warn: Callable[[str], None], progress: Callable[[int], None] = lambda n: None) -> ProfileSet:
    """Read a merged or snapshot XML profile into the tables :func:`events.build_events` takes."""
    state = _State(path)
    _stream(path, state, progress)
    if not state.profiles:
        cut = " before the file ends early (cut short?)" if state.truncated else ""
        raise bad_input(path, None, f"no <profile> with <interval_data> in this TAU XML file{cut}")
    if state.snapshots > len(state.profiles):
        warn(f"{path}: {state.snapshots} snapshots of {len(state.profiles)} threads; read the last of each thread "
             "(snapshots are cumulative)")
    return state.tables(warn)


def _stream(path: Path, state: "_State", progress: Callable[[int], None]) -> None:
    try:
        f = open_binary(path)
    except OSError as exc:
        raise bad_input(path, None, f"cannot be read: {exc.strerror or exc}") from None
    with f:
        first = b""
        try:  # in pieces: a stream cut short (a gzip file cut) keeps what came before the cut
            while len(first) < CHUNK and (piece := f.read1(CHUNK - len(first))):
                first += piece
        except (OSError, EOFError) as exc:
            if not first:
                raise bad_input(path, None, f"the file ends early ({exc}) before any profile") from None
            state.cut(exc)
        safe_xml.refuse_declarations(path, first)
        kwargs = safe_xml.parser_kwargs()
        declaration = _DECLARATION.match(first)
        if declaration:
            encoding = _ENCODING.search(declaration.group(0))
            if encoding and encoding.group(1).lower() not in (b"utf-8", b"utf8", b"us-ascii", b"ascii"):
                kwargs["encoding"] = encoding.group(1).decode("ascii")
            # keep the line count: replace the declaration with as many newlines as it spans
            first = b"\n" * declaration.group(0).count(b"\n") + first[declaration.end():]
        parser = etree.XMLPullParser(events=("start", "end"), **kwargs)
        lines_before = 0
        chunk, tail = first, b""
        try:
            parser.feed(b"<tau_xml_profiles>")
            while chunk:
                safe_xml.refuse_declarations(path, tail + chunk, lines_before + 1 - tail.count(b"\n"))
                # TauProfileMerge writes each rank's block with its C string's closing NUL: no XML character
                parser.feed(chunk.replace(b"\x00", b"") if b"\x00" in chunk else chunk)
                state.consume(parser.read_events())
                progress(len(chunk))
                lines_before += chunk.count(b"\n")
                tail = chunk[-16:]
                chunk = f.read(CHUNK)
            if state.truncated:  # cut before the end: the profiles complete so far are kept, no closing tag
                return
            parser.feed(b"</tau_xml_profiles>")
            parser.close()
            state.consume(parser.read_events())
        except etree.XMLSyntaxError as exc:
            message = " ".join(str(exc.msg).split())  # libxml2 ends some messages with a line break
            raise bad_input(path, exc.lineno or None, f"not well-formed TAU XML: {message}") from None
        except (OSError, EOFError) as exc:
            state.cut(exc)


class _State:
    """What the stream has delivered so far: threads, definitions, the last profile of each thread."""

    def __init__(self, path: Path):
        self.path = path
        self.depth = 0
        self.threads: dict[str, dict] = {}
        self.events: dict[str, dict[int, tuple[str, str | None]]] = {}
        self.user_events: dict[str, dict[int, str]] = {}
        self.metrics: dict[str, dict[int, str]] = {}
        self.profiles: dict[str, dict] = {}
        self.snapshots = 0
        self.truncated: str | None = None
        self.numbers = WholeNumbers()  # attributes that are not whole numbers, warned about in tables()

    def cut(self, exc: BaseException) -> None:
        """The stream ended before the file did (a gzip file cut short): the profiles complete so far are kept."""
        self.truncated = f"{self.path}: the file ends early ({exc}); the complete profiles were kept"

    def consume(self, pulled) -> None:
        for action, element in pulled:
            if action == "start":
                self.depth += 1
                if self.depth > safe_xml.MAX_DEPTH:
                    raise bad_input(self.path, element.sourceline,
                                    f"XML nested deeper than {safe_xml.MAX_DEPTH} elements; TAU's needs 5")
                continue
            self.depth -= 1
            tag = element.tag
            if tag == "thread":
                self._thread(element)
            elif tag == "definitions":
                self._definitions(element)
            elif tag == "profile":
                self._profile(element)
            else:
                continue
            element.clear()
            parent = element.getparent()
            while parent is not None and element.getprevious() is not None:
                del parent[0]

    def _thread(self, element) -> None:
        ident = element.get("id") or ""
        where = str(self.path)
        self.threads[ident] = {
            "node": self.numbers(element.get("node"), "<thread> node", where),
            "context": self.numbers(element.get("context"), "<thread> context", where),
            "thread": self.numbers(element.get("thread"), "<thread> thread", where),
            "metadata": safe_xml.attributes(element),
        }

    def _definitions(self, element) -> None:
        scope = element.get("thread") or "*"
        for child in element:
            ident = self.numbers(child.get("id"), f"<{child.tag}> id", str(self.path))
            if ident is None:  # nothing can refer to it
                continue
            name = (child.findtext("name") or "").strip()
            if child.tag == "event":
                group = child.findtext("group")
                group = None if group is None or group.strip() in ("", ":)") else group.strip()
                self.events.setdefault(scope, {})[ident] = (name, group)
            elif child.tag == "userevent":
                self.user_events.setdefault(scope, {})[ident] = name
            elif child.tag == "metric":
                self.metrics.setdefault(scope, {})[ident] = name

    def _profile(self, element) -> None:
        scope = element.get("thread") or ""
        interval = element.find("interval_data")
        if interval is None:
            return
        atomic = element.find("atomic_data")
        self.snapshots += 1
        self.profiles[scope] = {
            "metrics": [int(m) for m in (interval.get("metrics") or "0").split() if m.isdigit()],
            "interval": (interval.sourceline or 0, interval.text or ""),
            "atomic": (atomic.sourceline or 0, atomic.text or "") if atomic is not None else None,
        }

    def tables(self, warn: Callable[[str], None]) -> ProfileSet:
        if self.truncated:
            warn(self.truncated)
        frames, event_frames, threads, metadata = [], [], [], []
        for scope, profile in self.profiles.items():
            key = self._thread_key(scope)
            info = self.threads.get(scope, {})
            metadata.append((key, info.get("metadata", {})))
            threads.append({"node": key[0], "context": key[1], "thread": key[2],
                            **gpu_facts(info.get("metadata", {}), self.numbers, f"{self.path} (metadata)")})
            frames.append(self._intervals(scope, key, profile))
            if profile["atomic"] is not None:
                event_frames.append(self._atomics(scope, key, profile["atomic"], warn))
        self.numbers.flush(warn)
        table = pl.concat(frames, how="vertical_relaxed")
        user_events = (pl.concat(event_frames, how="vertical_relaxed") if event_frames
                       else events.empty(events.USER_EVENTS))
        return assemble(table, user_events, pl.DataFrame(threads, schema=events.THREADS, strict=False), metadata, 1,
                        warn)

    def _thread_key(self, scope: str) -> tuple[int, int, int]:
        info = self.threads.get(scope, {})
        m = _THREAD_ID.match(scope)
        parsed = tuple(int(x) for x in m.groups()) if m else (None, None, None)
        node, context, thread = (info.get(k) for k in ("node", "context", "thread"))
        key = (node if node is not None else parsed[0], context if context is not None else parsed[1],
               thread if thread is not None else parsed[2])
        if None in key:
            raise bad_input(self.path, None, f"<profile thread={scope!r}>: expected a thread id 'node.context.thread'")
        return key

    def _metric_name(self, scope: str, ident: int, count: int) -> str:
        name = {**self.metrics.get("*", {}), **self.metrics.get(scope, {})}.get(ident)
        if name is None:
            name = next((names[ident] for names in self.metrics.values() if ident in names), None)
        return name or ("TIME" if count == 1 else f"metric {ident}")

    def _lines(self, start_line: int, text: str) -> pl.DataFrame:
        lines = pl.Series(text.split("\n"), dtype=pl.String)
        df = pl.DataFrame({"text": lines, "line": pl.int_range(start_line, start_line + len(lines), eager=True)})
        df = df.filter(pl.col("text").str.strip_chars() != "")
        return df.with_columns(fields=pl.col("text").str.strip_chars().str.split(by=" ")
                               .list.eval(pl.element().filter(pl.element() != "")))

    def _intervals(self, scope: str, key: tuple[int, int, int], profile: dict) -> pl.DataFrame:
        metric_ids = profile["metrics"]
        width = 3 + 2 * len(metric_ids)
        line0, text = profile["interval"]
        df = self._lines(line0, text)
        self._check_width(df, width, f"'id calls subrs' and an exclusive and inclusive value for each of the "
                                     f"{len(metric_ids)} metrics ({width} numbers)")
        ids = df["fields"].list.get(0)
        names = {**self.events.get("*", {}), **self.events.get(scope, {})}
        ident = ids.cast(pl.Int64, strict=False)
        unknown = ident.is_null() | ~ident.is_in(list(names))
        if unknown.any():
            i = int(unknown.arg_max())
            raise bad_input(self.path, int(df["line"][i]),
                            f"interval_data refers to event id {ids[i]!r} that no <definitions> declares")
        lookup = pl.DataFrame({"id": list(names), "raw": [v[0] for v in names.values()],
                               "group": [v[1] for v in names.values()]},
                              schema={"id": pl.Int64, "raw": pl.String, "group": pl.String})
        base = pl.DataFrame({"id": ident, "line": df["line"], "seq": pl.int_range(0, df.height, eager=True)})
        base = base.join(lookup, on="id", how="left", maintain_order="left")
        calls = whole_numbers(self.path, df["fields"].list.get(1), df["line"], "calls", [])
        subcalls = whole_numbers(self.path, df["fields"].list.get(2), df["line"], "subrs", [])
        frames = []
        for position, metric_id in enumerate(metric_ids):
            excl = df["fields"].list.get(3 + 2 * position)
            incl = df["fields"].list.get(4 + 2 * position)
            for values, label in ((excl, "exclusive"), (incl, "inclusive")):
                bad = ~pl.DataFrame({"v": values}).select(is_number(pl.col("v"))).to_series()
                if bad.any():
                    i = int(bad.arg_max())
                    raise bad_input(self.path, int(df["line"][i]), f"expected a number for the {label} value, "
                                                                   f"found {values[i]!r}")
            frames.append(base.with_columns(
                metric=pl.lit(self._metric_name(scope, metric_id, len(metric_ids))), calls=calls, subcalls=subcalls,
                excl=excl, incl=incl, path=pl.lit(str(self.path)), node=pl.lit(key[0], pl.Int64),
                context=pl.lit(key[1], pl.Int64), thread=pl.lit(key[2], pl.Int64)))
        return pl.concat(frames).drop("id")

    def _atomics(self, scope: str, key: tuple[int, int, int], atomic: tuple[int, str],
                 warn: Callable[[str], None]) -> pl.DataFrame:
        line0, text = atomic
        df = self._lines(line0, text)
        self._check_width(df, 6, "'id numevents max min mean sumsqr'")
        names = {**self.user_events.get("*", {}), **self.user_events.get(scope, {})}
        ident = df["fields"].list.get(0).cast(pl.Int64, strict=False)
        unknown = ident.is_null() | ~ident.is_in(list(names))
        if unknown.any():
            i = int(unknown.arg_max())
            raise bad_input(self.path, int(df["line"][i]),
                            f"atomic_data refers to user event id {df['fields'][i][0]!r} that no <definitions> "
                            "declares")
        fields = df["fields"]
        notes: list[str] = []
        out = pl.DataFrame({
            "node": key[0], "context": key[1], "thread": key[2],
            "name": ident.replace_strict(names, return_dtype=pl.String),
            "calls": whole_numbers(self.path, fields.list.get(1), df["line"], "numevents", notes),
            "value_max": pl.DataFrame({"v": fields.list.get(2)}).select(to_float(pl.col("v"))).to_series(),
            "value_min": pl.DataFrame({"v": fields.list.get(3)}).select(to_float(pl.col("v"))).to_series(),
            "value": pl.DataFrame({"v": fields.list.get(4)}).select(to_float(pl.col("v"))).to_series(),
            "value_sumsq": pl.DataFrame({"v": fields.list.get(5)}).select(to_float(pl.col("v"))).to_series(),
        }, schema_overrides={"node": pl.Int64, "context": pl.Int64, "thread": pl.Int64})
        for note in notes:
            warn(note)
        return out

    def _check_width(self, df: pl.DataFrame, width: int, expected: str) -> None:
        wrong = df["fields"].list.len() != width
        if wrong.any():
            i = int(wrong.arg_max())
            raise bad_input(self.path, int(df["line"][i]), f"expected {expected}, found {df['text'][i].strip()!r}")
