"""Kernel and function names for the screen: demangled, shortened, and never two different names alike.

Every table and page shows names through :func:`short_names` (a column's
worth at once, so that it can keep apart what shortening would merge) or
:func:`short_name` (one name alone); JSON always keeps the whole name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

from rich.cells import cell_len


@lru_cache(maxsize=4096)  # a report asks for a kernel's name in several tables and keys; the demangler is Python
def demangle(name: str) -> str:
    """A mangled C++ name (``_Z...``) as its declaration, or the name unchanged when it is not one we can read.

    ``itanium_demangler`` (pure Python) writes template arguments as nsys does
    (``(int)64``), so a torch trace's ``_ZN17cutlass__5x_cudnn6KernelI...`` reads
    ``void cutlass__5x_cudnn::Kernel<...>(T1::Params)`` like its twin in an
    nsys capture.
    """
    if not name.startswith("_Z"):
        return name
    try:
        from itanium_demangler import parse

        node = parse(name)
    except Exception:  # an unusual mangling is not an error: the name is shown as written
        return name
    return str(node) if node is not None else name


def short_name(name: str | None, width: int = 70, cut: bool = True) -> str:
    """A demangled C++ kernel name shortened for the screen; JSON output always keeps the whole name.

    Steps, each taken only while the name is still longer than ``width``:
    set a TAU source location (``[{/src/f.cpp} {12,0}]``) aside, its file
    named without its folder, and shorten the routine before it; drop the
    return type and parameter list; replace template arguments
    nested two deep with ``…``; drop casts such as ``(bool)1`` -> ``1``;
    keep only the last component of the qualified name; replace all
    template arguments with ``…``; cut in the middle.
    """
    if not name:
        return ""
    if _wrapped(name.strip()):  # "<built-in method append of list object at 0x7f…>": Python's, not a template
        inner = short_name(name.strip()[1:-1], max(width - 2, 1), cut)
        return f"<{inner}>"
    where = _SOURCE_LOCATION.search(name) if len(name) > width else None
    if where and where.start() > 0:  # TAU's "f(int) [{/src/f.cpp} {12,0}]": the routine, then its file's name
        location = re.sub(r"\{[^{}]*[/\\]([^{}/\\]*)\}", r"{\1}", where.group(0).strip(), count=1)
        file = re.match(r"\[(\{[^{}]*\})[^\[\]]*\]", location)
        tail = location[file.end():].strip() if file else ""  # " [THROTTLED]", a dynamic timer's " [3]": kept
        # where the location does not fit, its lines go, then the file: the routine is what a cell must show
        # ("do_nonbo…{517,1}]" told nothing at 20 columns)
        shown = [location] + ([f"[{file.group(1)}] {tail}".strip(), tail] if file else [])
        fits = []
        for suffix in shown:
            head = short_name(name[:where.start()], max(width - len(suffix) - 1 if suffix else width, 8), cut=False)
            fits.append(f"{head} {suffix}" if suffix else head)
            if text_width(fits[-1]) <= width:
                return fits[-1]
        return fits[-1] if not cut else middle_cut(fits[-1], width)
    s = _declaration(name)
    for step in _STEPS:
        if text_width(s) <= width:
            break
        s = re.sub(r"\s+", " ", step(s))
    return s if text_width(s) <= width or not cut else middle_cut(s, width)


#: The source location TAU writes after a routine's name: `` [{/path/file.cpp} {307,0}]`` or ``{307,0}-{320,5}]``.
#: TAU marks a routine it stopped measuring `` [THROTTLED]`` after that, and numbers the timers of
#: ``TAU_PROFILE_CREATE_DYNAMIC_AUTO`` `` [1]``, `` [2]``, ...
_SOURCE_LOCATION = re.compile(r"\s+\[\{[^{}\[\]]*\}\s*\{[^{}\[\]]*\}(?:\s*-\s*\{[^{}\[\]]*\})?\]"
                              r"(?:\s*\[THROTTLED\])?(?:\s*\[\d+\])?\s*$")

#: The language TAU's source instrumentor (PDT) writes after a C routine's parameter list: ``int main(int, char **)
#: C [{foo.c} {32,1}-{43,1}]``.
_TAU_LANGUAGE = re.compile(r"(?<=\))\s+C$")


def short_names(names: Iterable[str | None], width: int = 70, compact: bool = False) -> list[str]:
    """``names`` shortened as by :func:`short_name` (never cut), two different names never alike.

    Names that shorten alike get back, in place of their collapsed template
    arguments, the arguments that tell them apart (``Kernel<…,fprop_64x64,…>``
    and ``Kernel<…,wgrad_128x64,…>``); when even that leaves two alike, the
    less shortened spelling; when the declarations themselves read alike
    (two spellings of one symbol), a number ``#2``, ``#3``. ``compact``
    writes template arguments without the space after each comma.
    """
    out = _short_names([n or "" for n in names], width, 0)
    return [s.replace(", ", ",") for s in out] if compact else out


def _short_names(names: list[str], width: int, depth: int) -> list[str]:
    out = [short_name(n, width, cut=False) for n in names]
    clashes: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(out):
        clashes[s].append(i)
    for same in clashes.values():
        if len({names[i] for i in same}) < 2:
            continue
        fulls = sorted({names[i] for i in same})
        better = _told_apart(fulls, width, depth)
        for i in same:
            out[i] = better[names[i]]
    for _ in range(3):  # a number could make a name read like another's: number again until none do
        out = _numbered(names, out)
        if len(set(out)) == len(set(names)):
            break
    return out


def _wrapped(s: str) -> bool:
    """True when ``s`` is one ``<…>`` from its first character to its last (Python's ``<built-in function len>``,
    ``<lambda>``, ``<module>``), so its brackets are no template argument list."""
    if len(s) < 3 or s[0] != "<" or s[-1] != ">":
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "<") - (ch == ">")
        if depth == 0:
            return i == len(s) - 1
    return False


def text_width(s: str) -> int:
    """The terminal cells ``s`` takes: a CJK character or an emoji two, a zero-width one none (rich's measure, the
    one the tables are drawn with), so that a name is cut to its column, not to its number of characters."""
    return cell_len(s)


def _head(s: str, width: int) -> str:
    """The longest start of ``s`` that takes at most ``width`` cells."""
    if s.isascii():
        return s[:width]
    used = 0
    for i, ch in enumerate(s):
        used += cell_len(ch)
        if used > width:
            return s[:i]
    return s


def _tail(s: str, width: int) -> str:
    """The longest end of ``s`` that takes at most ``width`` cells."""
    return _head(s[::-1], width)[::-1]


def middle_cut(s: str, width: int) -> str:
    """``s`` shortened to ``width`` cells (:func:`text_width`) by replacing its middle with ``…``."""
    if text_width(s) <= width:
        return s
    if width <= 1:
        return "…"[:max(width, 0)]
    head = width // 2
    tail = width - 1 - head
    return _head(s, head) + "…" + (_tail(s, tail) if tail else "")


def key_entry(name: str, width: int, lines: int = 3) -> str:
    """The whole (demangled) name for the key below a table: at most ``lines`` lines of ``width``, a longer one
    cut in the middle, so one 1,800-character symbol does not fill the screen."""
    return middle_cut(_declaration(name, keep_parameters=True), max(width * lines - 4, 8))


def key_entries(names: list[str], width: int, lines: int = 3) -> list[str]:
    """:func:`key_entry` of each of ``names``, except where two different ones would read alike (two kernels whose
    1,000-character names differ only in the middle that the cut leaves out): those keep the stretch where they
    differ (:func:`cut_apart`)."""
    return cut_apart([_declaration(n, keep_parameters=True) for n in names], max(width * lines - 4, 8))


def _declaration(name: str, keep_parameters: bool = False) -> str:
    s = re.sub(r"^(void|__global__ void)\s+", "", demangle(name.strip()))
    if keep_parameters:
        return s
    return _drop_parameters(re.sub(r"(?:<unnamed>|\(anonymous namespace\))::", "", s))  # namespaces without a name


#: What makes a bracket after a name a C++ parameter list: a type word, a pointer or reference, a template.
_PARAMETER_TYPES = re.compile(r"[*&<:]|\b(?:int|long|short|char|float|double|bool|void|const|unsigned|signed|"
                              r"size_t|u?int\d+_t|half|T\d*)\b")


def _drop_parameters(s: str) -> str:
    """``f(int, float*)`` -> ``f``: a C++ signature's parameter list; a plain name's empty one (``MPI_Init()``)
    stays. A bracket right after the name that holds one short word and no parameter type (an annotation's
    ``dispatch(F)`` beside ``dispatch(B)``, ``attn(fwd)``) is part of the name and stays; ``kernel(ncclColl)``'s
    is a parameter."""
    s = _TAU_LANGUAGE.sub("", s)
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                head, inside = s[:i].rstrip(), s[i + 1:-1]
                if not inside.strip() and re.fullmatch(r"[A-Za-z_][\w.$]*", head):  # "MPI_File_open()": a plain
                    return s  # function's name as the file writes it (a C++ declaration's "f<1>()" still drops it)
                one_word = re.fullmatch(r"\w{1,4}", inside) and not s[i - 1:i].isspace()
                if one_word and "::" not in head and "<" not in head and not _PARAMETER_TYPES.search(inside):
                    return s
                return head if head and head[-1] not in "<,(" else s
    return s


def _collapse_templates(s: str, keep_depth: int) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == keep_depth + 1:
                out.append("<…>")
            elif depth <= keep_depth:
                out.append(ch)
            continue
        if ch == ">":
            depth -= 1
            if depth < keep_depth:
                out.append(ch)
            continue
        if depth <= keep_depth:
            out.append(ch)
    return "".join(out)


def _drop_casts(s: str) -> str:
    return re.sub(r"\((?:bool|int|unsigned int|unsigned long|long|\w+_t|\w+)\)(?=[-\w])", "", s)


def _drop_scope_parameters(s: str) -> str:
    """``f(at::TensorIteratorBase&)::{lambda(int)#1}`` -> ``f(…)::{lambda(int)#1}``: the parameters of an
    enclosing function, which say where a lambda was written, not what it is."""
    return re.sub(r"\((?:[^()]|\([^()]*\))+\)(?=\s*(?:const\s*)?::)", "(…)", s)


def _last_components(s: str) -> str:
    head, sep, rest = s.partition("<")
    return head.split("::")[-1] + sep + rest


def _drop_return_type(s: str) -> str:
    """``std::vector<int> KDTree::neighbors`` -> ``KDTree::neighbors``: a return type before the name (TAU's
    routine names keep it), the text after the last space outside brackets; ``operator new`` stays whole. A name
    whose brackets do not pair stays whole: ncu's text report prints a lambda kernel with parts of its scopes cut
    out (``kernel<4, unnamed>::silu_kernel(...)::[lambda() (instance 1)]::operator ()() lambda() (instance 2)]
    ...``), and its "last space outside brackets" was inside the lambdas, leaving ``1)], std::array<...>>``."""
    depth, cut = 0, -1
    for i, ch in enumerate(s):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
            if depth < 0:  # brackets that do not pair (a name a tool cut parts out of): no top level to tell
                return s
        elif ch == " " and depth == 0 and i + 1 < len(s) and s[i + 1] not in "<([{&*" \
                and not s[:i].endswith(("operator", "const", ",", ":")):
            cut = i
    if cut < 0 or "::" not in s:  # no C++ (Python's "built-in method f of X object at 0x…" is prose)
        return s
    return s[cut + 1:]


_STEPS = (
    _drop_return_type,
    _drop_scope_parameters,
    lambda x: _collapse_templates(x, keep_depth=1),
    _drop_casts,
    _last_components,
    lambda x: _collapse_templates(x, keep_depth=0),
)


def _template_arguments(s: str) -> tuple[str, list[str]] | None:
    """``head`` and the top-level template arguments of a declaration ``head<a, b<c>, d>``, or None."""
    start = s.find("<")
    if start < 0 or not s.rstrip().endswith(">"):
        return None
    args, depth, current = [], 0, []
    for ch in s[start + 1:s.rstrip().rfind(">")]:
        if ch in "<({":
            depth += 1
        elif ch in ">)}":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    args.append("".join(current).strip())
    return s[:start], args


def _told_apart(fulls: list[str], width: int, depth: int) -> dict[str, str]:
    """For names that shorten alike: the template arguments that differ, each told apart the same way; failing
    that, the declaration without casts, then with its parameters."""
    decls = {f: _drop_casts(_declaration(f)) for f in fulls}
    parts = {f: _template_arguments(d) for f, d in decls.items()}
    if depth < MAX_DEPTH and all(p is not None for p in parts.values()):
        heads = {p[0] for p in parts.values()}
        count = max(len(p[1]) for p in parts.values())

        def argument(f: str, k: int) -> str:
            return parts[f][1][k] if k < len(parts[f][1]) else ""

        differ = [k for k in range(count) if len({argument(f, k) for f in fulls}) > 1]
        if differ:
            told = {}
            for k in differ:
                values = sorted({argument(f, k) for f in fulls})
                told[k] = dict(zip(values, _short_names(values, max(width // 2, 12), depth + 1)))
            spelled = {}
            for f in fulls:
                shown, skipped = [], False
                for k in range(count):
                    if k in told:
                        shown.append(told[k][argument(f, k)])
                        skipped = False
                    elif not skipped:
                        shown.append("…")
                        skipped = True
                head = parts[f][0]
                spelled[f] = f"{head.split('::')[-1] if len(heads) == 1 else head}<{', '.join(shown)}>"
            if len(set(spelled.values())) == len(fulls) and max(map(len, spelled.values())) <= 2 * width:
                return spelled
    else:
        differ, spelled = [], {}
    fragments = _differing_tokens(fulls, decls)
    if fragments:
        return {f: f"{short_name(f, width, cut=False)} ⟨{fragments[f]}⟩" for f in fulls}
    if differ and len(set(spelled.values())) == len(fulls):
        return spelled
    for spell in (lambda f: decls[f], lambda f: _declaration(f, keep_parameters=True)):
        spelled = {f: re.sub(r"\s+", " ", spell(f)) for f in fulls}
        if len(set(spelled.values())) == len(fulls):
            return spelled
    return {f: short_name(f, width, cut=False) for f in fulls}  # spellings of one declaration: numbered


def _differing_tokens(fulls: list[str], decls: dict[str, str], most: int = 4) -> dict[str, str] | None:
    """Where names of the same shape differ only in some words or numbers (tile sizes, say): those, at most
    ``most`` of them per name, or None when that does not tell the names apart."""
    tokens = {f: re.findall(r"\w+", decls[f]) for f in fulls}
    if len({len(t) for t in tokens.values()}) == 1:  # the same shape: the words in which they differ, in place
        count = len(next(iter(tokens.values())))
        differ = [k for k in range(count) if len({tokens[f][k] for f in fulls}) > 1]
        for shown in (differ[:most], differ[:3 * most]):
            fragments = {f: ",".join(tokens[f][k] for k in shown) for f in fulls}
            if shown and len(set(fragments.values())) == len(fulls):
                return fragments
    common = set.intersection(*(set(t) for t in tokens.values()))
    own = {f: list(dict.fromkeys(t for t in tokens[f] if t not in common)) for f in fulls}
    for n in (most, 3 * most):  # another shape: the words each has that not all of them have
        fragments = {f: ",".join(own[f][:n]) for f in fulls}
        if all(fragments.values()) and len(set(fragments.values())) == len(fulls):
            return fragments
    return None


#: How deep :func:`short_names` looks into template arguments to tell names apart.
MAX_DEPTH = 6


def _numbered(names: list[str], out: list[str]) -> list[str]:
    """Where different names still read alike, ``#2``, ``#3``… after all but the first (in order of the names)."""
    owners: dict[str, list[str]] = defaultdict(list)
    for name, s in zip(names, out):
        if name not in owners[s]:
            owners[s].append(name)
    return [s if owners[s].index(name) == 0 else f"{s} #{owners[s].index(name) + 1}" for name, s in zip(names, out)]


def fitted_names(names: list[str], width: int, compact: bool = False) -> list[str]:
    """``names`` shortened to at most ``width`` cells each, two different names never alike: folded as a table's
    names are (:func:`short_names`), then those still too wide cut together (:func:`cut_apart`). For names listed
    one per line, side by side, where one shortened alone could read like another (diff's new and vanished names
    both read ``Kernel<…>``). Where two names differ in two places too far apart for one cut to show both (a
    torch kernel and its nsys spelling differ at the end, each from a sibling near the start), the later of those
    that read alike are numbered ``#2``, ``#3`` (--json has every name whole). ``compact``: as
    :func:`short_names`'s."""
    out = short_names(names, width, compact=compact)
    long = [i for i, s in enumerate(out) if text_width(s) > width]
    for i, cut in zip(long, cut_apart([out[i] for i in long], width)):
        out[i] = cut
    owners: dict[str, list[str]] = defaultdict(list)
    for name, s in zip(names, out):
        if name not in owners[s]:
            owners[s].append(name)
    for i, (name, s) in enumerate(zip(names, out)):
        n = owners[s].index(name) + 1
        if n > 1:
            room = width - len(f" #{n}")  # the end goes: a cut shows what tells it apart in its middle
            out[i] = f"{s if text_width(s) <= room else _head(s, room - 1) + '…'} #{n}"
    return out


def cut_apart(texts: list[str], width: int) -> list[str]:
    """``texts`` cut to ``width`` from the middle (:func:`middle_cut`), except where two different ones would read
    alike: those keep their head and, in place of their middle, the stretch where they start to differ."""
    out = [middle_cut(t, width) for t in texts]
    groups: dict[str, set[str]] = defaultdict(set)
    for t, s in zip(texts, out):
        groups[s].add(t)
    for same in (g for g in groups.values() if len(g) > 1):
        others = sorted(same)
        for i, t in enumerate(texts):
            if t in same:
                out[i] = _cut_at_difference(t, [o for o in others if o != t], width)
    return out


def _cut_at_difference(text: str, others: list[str], width: int) -> str:
    """``text`` in ``width`` characters: its head, ``…``, then the stretch from where it first differs from every
    one of ``others`` (six characters before it, for context), ``…`` if that is not its end."""
    if text_width(text) <= width or width < 8:
        return middle_cut(text, width)
    differs = max(_common_prefix(text, o) for o in others)
    word = max(text.rfind(sep, 0, differs + 1) for sep in SEPARATORS) + 1  # the word in which it differs
    if 0 < word and text_width(text[word:]) + 1 <= width:  # a path's file name, a name's last words
        return "…" + text[word:]
    head = max(width // 3, 4)
    start = max(head, differs - 6)
    if start <= head:
        return middle_cut(text, width)
    room = width - text_width(_head(text, head)) - 1
    middle = _head(text[start:], room)
    if start + len(middle) < len(text):
        middle = _head(middle, room - 1) + "…"
    return _head(text, head) + "…" + middle


#: Where a word of a name or path ends, for :func:`cut_apart`.
SEPARATORS = "/\\:._<>, "


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
