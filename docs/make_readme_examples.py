"""Regenerate the README's console examples from the real commands on the bundled fixtures.

    python docs/make_readme_examples.py           # rewrite README.md in place
    python docs/make_readme_examples.py --check   # exit 1 and print a diff when README.md is stale

An example is a ```console block right after a marker comment::

    <!-- example width=80 keep=1:12,-3: -->
    ```console
    $ traceparse analyze fixtures/torch/resnet18_bs16.json.gz
    (output, rewritten)
    ```

Every ``$ `` line of the block is run with bash from the repository root, in README order, all against
one fresh store (so "the last ingested trace" means what the README says it means); what it prints,
stdout and stderr together, replaces the lines after it. Options of the marker, each for every command of
the block or, suffixed ``.N``, for its Nth command only:

- ``width=N``: the terminal width the commands lay out for (``COLUMNS``; 80 when not given);
- ``keep=A:B,C:D``: the output lines kept, as Python slices (``-3:`` the last three), a ``...`` line
  where lines were left out;
- ``grep=REGEX``: only the output lines matching REGEX;
- ``requires=PATH`` (the block only): the block runs only where PATH (from the repository's root) exists, such
  as the shared samples beside the repository (``../shared/samples/...``); elsewhere it is left as written.

Files the commands leave in the repository's root (``> report.json``) are removed afterwards.
tests/test_readme_examples.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MARKER = re.compile(r"^<!-- example(?P<options>(?:\s+\S+=\S+)*)\s*-->$")
GAP = "..."


def options_of(marker: str) -> dict[str, str]:
    """The ``key=value`` options of a marker line (separated by spaces: a value has none; write ``\\s``)."""
    match = MARKER.match(marker.strip())
    return dict(item.split("=", 1) for item in match.group("options").split()) if match else {}


def option(options: dict[str, str], key: str, n: int) -> str | None:
    """An option for the ``n``th command (1-based): its own ``key.n`` first, else the block's ``key``."""
    return options.get(f"{key}.{n}", options.get(key))


def kept_lines(lines: list[str], keep: str | None, grep: str | None) -> list[str]:
    """The output lines an example shows: those matching ``grep``, then the ``keep`` slices, ``...`` in gaps."""
    if grep:
        lines = [line for line in lines if re.search(grep, line)]
    if not keep:
        return lines
    chosen: list[int] = []
    for part in keep.split(","):
        start, _, stop = part.partition(":")
        chosen += range(len(lines))[slice(int(start) if start else None, int(stop) if stop else None)]
    chosen = sorted(set(chosen))
    out, previous = [], -1
    for i in chosen:
        if i != previous + 1 and (out or i > 0):
            out.append(GAP)
        out.append(lines[i])
        previous = i
    if chosen and chosen[-1] != len(lines) - 1:
        out.append(GAP)
    return out


def run(command: str, width: int, env: dict[str, str]) -> list[str]:
    """What ``command`` prints (stdout and stderr), as lines without trailing spaces."""
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env={**env, "COLUMNS": str(width)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return [line.rstrip() for line in done.stdout.splitlines()]


def regenerate(text: str) -> str:
    """README text with every marked example's output rewritten from its commands."""
    lines = text.splitlines()
    before = set(os.listdir(REPO))
    with tempfile.TemporaryDirectory(prefix="traceparse-readme-") as store:
        env = {**os.environ, "TRACEPARSE_STORE": store,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("TRACEPARSE_DEBUG", None)
        out: list[str] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            out.append(line)
            if MARKER.match(line.strip()) and i + 1 < len(lines) and lines[i + 1].startswith("```console"):
                options = options_of(line)
                if options.get("requires") and not (REPO / options["requires"]).exists():
                    i += 1  # kept as written: the block's data is not here
                    continue
                out.append(lines[i + 1])
                i += 2
                n = 0
                while i < len(lines) and not lines[i].startswith("```"):
                    if lines[i].startswith("$ "):
                        n += 1
                        out.append(lines[i])
                        width = int(option(options, "width", n) or 80)
                        printed = run(lines[i][2:], width, env)
                        out += kept_lines(printed, option(options, "keep", n), option(options, "grep", n))
                    i += 1
                continue
            i += 1
    for name in set(os.listdir(REPO)) - before:  # what the examples wrote (report.json)
        (REPO / name).unlink(missing_ok=True)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when README.md is stale")
    args = parser.parse_args(argv)
    current = README.read_text()
    fresh = regenerate(current)
    if args.check:
        if fresh != current:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), fresh.splitlines(True),
                                                       "README.md", "README.md (regenerated)"))
            return 1
        return 0
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
