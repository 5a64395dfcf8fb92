"""Text from files, paths and the command line, shown literally on a terminal.

A kernel name, a device name, a tag, a file name or a warning that quotes a
record is data. Two things go wrong when data is handed to a terminal
renderer as it is:

- rich reads ``[...]`` as markup: TAU's ``launch [/home/x/a.cu:35]`` is a
  closing tag (MarkupError), ``cfg=[fp16]`` loses ``[fp16]``;
- control characters reach the terminal: ``ESC[2J`` clears it, an OSC
  sequence sets its title, a carriage return hides what came before.

Every renderer (tables, panels, rules, progress descriptions, warnings and
errors on stderr) passes such text through this module: :func:`literal` for
a rich renderable, :func:`markup_literal` where it is embedded in a markup
string of our own, :func:`visible` for plain ``print``. JSON output is not
passed through here: it stays exact. :class:`SafeConsole` is the consoles'
last line: no control character of a text segment reaches the terminal,
whatever a call site forgot.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.errors import NotRenderableError
from rich.protocol import rich_cast
from rich.markup import escape
from rich.segment import Segment
from rich.text import Text

from traceparse.errors import EXCERPT

#: Characters never written as they are: C0 controls, DEL, C1 controls (``\x9b`` is a one-byte CSI), the
#: Unicode direction overrides and isolates that reorder what a terminal shows, and the invisible ones
#: (zero-width space, joiners, word joiner, invisible operators, byte-order mark, soft hyphen) that make two
#: different names look alike (``zw\u200bx`` and ``zwx``).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\xad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
#: The same, but line breaks and tabs are kept (rich lays those out itself; used on rendered segments).
_CONTROL_IN_LAYOUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                                "\u2066-\u2069\ufeff]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(match: re.Match) -> str:
    char = match.group(0)
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(value: Any) -> str:
    """``value`` as a string whose control characters are made visible: ESC is ``\\x1b``, a line break
    ``\\n``, U+202E ``\\u202e``; everything else unchanged. What plain ``print`` and every renderer
    show of text from a file, a path or the command line."""
    s = value if isinstance(value, str) else str(value)
    return CONTROL.sub(_shown, s) if CONTROL.search(s) else s


def visible_keeping_lines(value: Any) -> str:
    """:func:`visible`, but line breaks and tabs kept as they are (text laid out by something else: an HTML page)."""
    s = value if isinstance(value, str) else str(value)
    return _CONTROL_IN_LAYOUT.sub(_shown, s) if _CONTROL_IN_LAYOUT.search(s) else s


def literal(value: Any, style: str = "") -> Text:
    """``value`` as a rich :class:`~rich.text.Text` shown exactly as it is: never read as markup (``[/x]``
    stays ``[/x]``), no emoji codes, control characters made visible (:func:`visible`)."""
    return Text(visible(value), style=style)


def markup_literal(value: Any) -> str:
    """``value`` for a markup string of our own (a panel title ``f"[bold]{...}[/bold]"``): markup escaped and
    control characters made visible, so that rich shows it literally."""
    return escape(visible(value))


def visible_segments(segments):
    """Rendered segments with every control character of their text made visible (line breaks and tabs kept;
    rich's own control segments, such as cursor moves, untouched)."""
    for segment in segments:
        text = segment.text
        if not segment.control and text and _CONTROL_IN_LAYOUT.search(text):
            yield Segment(_CONTROL_IN_LAYOUT.sub(_shown, text), segment.style, segment.control)
        else:
            yield segment


class SafeConsole(Console):
    """A rich console that writes no control character from data: each rendered text segment goes through
    :func:`visible_segments`. Emoji codes (``:smile:``) are off: a name holding one is shown as written."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def render(self, renderable, options=None):
        """:meth:`rich.console.Console.render`, with control characters made visible.

        rich's own loop, but only the segments this renderable yields itself go through the filter of
        :func:`visible_segments`: those of a renderable inside it come from this method called on that one, seen
        already (the filter changes nothing on a second pass). Wrapping rich's method instead filtered each
        segment once per level it is nested in (a table in a group in a panel: four times, 15% of ``analyze``'s
        rendering)."""
        options = options or self.options
        if options.max_width < 1:  # no room: nothing (rich's guard against endless nesting)
            return
        renderable = rich_cast(renderable)
        if hasattr(renderable, "__rich_console__") and not isinstance(renderable, type):
            outputs = renderable.__rich_console__(self, options)
        elif isinstance(renderable, str):
            outputs = self.render_str(renderable, highlight=options.highlight,
                                      markup=options.markup).__rich_console__(self, options)
        else:
            raise NotRenderableError(f"Unable to render {renderable!r}; "
                                     "A str, Segment or object with __rich_console__ method is required")
        try:
            outputs = iter(outputs)
        except TypeError:
            raise NotRenderableError(f"object {outputs!r} is not renderable") from None
        options = options.reset_height()
        search = _CONTROL_IN_LAYOUT.search
        for output in outputs:
            if isinstance(output, Segment):
                text = output.text
                if not output.control and text and search(text):
                    output = Segment(_CONTROL_IN_LAYOUT.sub(_shown, text), output.style, output.control)
                yield output
            else:
                yield from self.render(output, options)

    def on_broken_pipe(self) -> None:
        """The reader of the output went away (``traceparse analyze | head``): raised for the command line to end
        as a program killed by the closed pipe would, instead of rich's exit status 1 (``--fail-on``'s verdict)."""
        raise BrokenPipeError


#: A quoted value: paired left to right ('a' then 'b', never a' ... 'b), a quote inside or at the end of a word an
#: apostrophe, not a quote (the GPU's roofline ... its operators' time is prose, not a value to cut).
_QUOTED = re.compile("(?<!\\w)'[^'\\n]*'(?!\\w)|\"[^\"\\n]*\"")


def one_line(message: str, limit: int = 1000) -> str:
    """``message`` as one line: line breaks shown as ``\\n`` and every other control character made visible
    (:func:`traceparse.text.visible`: no escape sequence from a file reaches the terminal), each quoted value
    cut to an excerpt of at most :data:`~traceparse.errors.EXCERPT` characters, the whole cut to ``limit``
    characters."""
    message = _QUOTED.sub(lambda m: m.group(0) if len(m.group(0)) <= EXCERPT + 2
                          else m.group(0)[: EXCERPT] + "…" + m.group(0)[-1], message)
    message = visible(message)
    return message if len(message) <= limit else message[: limit - 1] + "…"
