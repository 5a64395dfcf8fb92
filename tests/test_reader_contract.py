"""Contract of every registered reader, checked without a test per reader.

Every reader refuses an empty file with one line naming the file (exit code
2 through the CLI), and every sniff stays on the documented scale [0, 1]
on every fixture and shared sample (files and directories).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from traceparse.errors import InputError
from traceparse.ingest import read_paths
from traceparse.plugins import registry
from traceparse.sources import read_head

REPO = Path(__file__).resolve().parent.parent
SAMPLES = Path(os.environ.get("TRACEPARSE_SAMPLES", REPO.parent / "shared" / "samples"))
READERS = sorted(registry().readers)


def _cli(*args: str) -> tuple[int, str]:
    from traceparse.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, err.getvalue()


def _inputs() -> list[Path]:
    paths = [p for p in (REPO / "fixtures").rglob("*") if p.suffix not in (".py", ".sh")]
    if SAMPLES.is_dir():
        paths += list(SAMPLES.rglob("*"))
    return sorted(paths)


def test_the_registry_has_the_built_in_readers():
    assert {"torch", "chrome", "nsys", "nvprof", "ncu", "tau"} <= set(READERS)


@pytest.mark.parametrize("name", READERS)
def test_an_empty_file_is_refused_in_one_line(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / "empty.out"
    path.write_bytes(b"")
    with pytest.raises(InputError) as info:
        read_paths([path], fmt=name)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    code, err = _cli("ingest", "--format", name, str(path))
    assert code == 2 and err.count("\n") == 1 and str(path) in err and "Traceback" not in err, err


def test_auto_detection_refuses_an_empty_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEPARSE_STORE", str(tmp_path / "store"))
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    assert _cli("ingest", str(path)) == (2, f"traceparse: error: {path}: the file is empty\n")


@pytest.mark.parametrize("name", READERS)
def test_every_sniff_is_on_the_scale(name):
    reader = registry().readers[name]
    inputs = _inputs()
    assert len(inputs) > 100
    for path in inputs:
        score = reader.sniff(path, b"" if path.is_dir() else read_head(path))
        assert isinstance(score, float | int) and 0.0 <= score <= 1.0, (name, path, score)


def test_a_refining_reader_wins_over_its_container(tmp_path):
    """The core breaks the tie: a reader that refines another beats it whenever both claim the file."""
    from traceparse.ingest import detect_reader
    from traceparse.plugins import Registry
    from traceparse.reader import Reader

    class Container(Reader):
        name = "box"

        def sniff(self, path, head):
            return 1.0 if head else 0.0

    class Refined(Reader):
        name = "fine"
        refines = "box"

        def sniff(self, path, head):
            return 0.2 if head.startswith(b"fine") else 0.0

    class Readers(Registry):
        def __init__(self, *readers):
            self._readers = {r.name: r for r in readers}

        @property
        def readers(self):
            return self._readers

    fine, plain = tmp_path / "a", tmp_path / "b"
    fine.write_bytes(b"fine print")
    plain.write_bytes(b"plain")
    for order in ((Container(), Refined()), (Refined(), Container())):
        assert detect_reader(fine, Readers(*order)).name == "fine"  # 0.2 beats 1.0: it refines the box
        assert detect_reader(plain, Readers(*order)).name == "box"  # the refining reader does not claim it
