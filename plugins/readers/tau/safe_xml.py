"""XML from untrusted TAU files: one hardened lxml parser, and DOCTYPE refusal.

TAU's XML (the metadata block on a profile's header line, merged
``tauprofile.xml`` and snapshot files) never has a DOCTYPE, so any
``<!DOCTYPE`` or ``<!ENTITY`` is refused outright with a one-line error
before parsing: entity bombs ("billion laughs") and external entities are
never expanded, not even partly. The parser itself also has entity
resolution, DTD loading and network access off and libxml2's size limits on
(``huge_tree=False``), and callers bound the element depth.
"""

from __future__ import annotations

import re
from pathlib import Path

from lxml import etree

from traceparse.errors import bad_input

#: deepest element nesting accepted; TAU's own files need 5
MAX_DEPTH = 32

_DECLARATION = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
REFUSED = "XML with a DOCTYPE or ENTITY declaration is refused (entities are never expanded)"


def parser_kwargs() -> dict:
    """Keyword arguments for every lxml parser this reader makes."""
    return dict(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                dtd_validation=False, remove_comments=True, remove_pis=True)


def find_declaration(data: bytes) -> int | None:
    """Offset of the first ``<!DOCTYPE`` / ``<!ENTITY`` in ``data``, or None."""
    m = _DECLARATION.search(data)
    return m.start() if m else None


def refuse_declarations(path: Path, data: bytes, first_line: int = 1) -> None:
    """Raise the one-line refusal if ``data`` (starting at line ``first_line``) declares a DOCTYPE or entity."""
    at = find_declaration(data)
    if at is not None:
        raise bad_input(path, first_line + data.count(b"\n", 0, at), REFUSED)


def parse_fragment(path: Path, line: int, text: str) -> etree._Element:
    """Parse a small XML fragment (a profile's ``<metadata>`` block) safely; InputError when malformed."""
    data = text.encode("utf-8")
    refuse_declarations(path, data, line)
    parser = etree.XMLParser(**parser_kwargs())
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        raise bad_input(path, line, f"malformed metadata XML: {exc.msg}") from None
    if _depth(root) > MAX_DEPTH:
        raise bad_input(path, line, f"metadata XML nested deeper than {MAX_DEPTH} elements")
    return root


def _depth(element: etree._Element) -> int:
    deepest, stack = 1, [(element, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in node)
    return deepest


def attributes(root: etree._Element) -> dict[str, str]:
    """TAU metadata ``<attribute><name>N</name><value>V</value></attribute>`` pairs under ``root``."""
    out: dict[str, str] = {}
    for attribute in root.iter("attribute"):
        name = attribute.findtext("name")
        if name is not None:
            out[name] = attribute.findtext("value") or ""
    return out

