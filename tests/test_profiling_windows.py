"""A folder of several profiling windows per rank (torch.profiler's ``schedule(..., repeat=2)`` with
``tensorboard_trace_handler``: a file per window and rank) is stored as a run per window.

The fixture (fixtures/torch/multirank/windows2_gloo, made by fixtures/make_profiling_windows.py on an H200) is
two DDP ranks over gloo, two windows of two steps each; in the second window only, rank 1 sleeps 20 ms a step in
a gradient hook. The folder used to be refused after every rank was read ("rank 0 again"). The edge cases (a
rank with fewer windows, two traces of one rank at once) are made here from the real files, and say so.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli

FOLDER = FIXTURES / "torch" / "multirank" / "windows2_gloo"
SLEEP_MS = 20.0  # fixtures/make_profiling_windows.py: rank 1's sleep per step in the second window


def _steps(path: Path) -> list[int]:
    """The ProfilerStep numbers in a raw trace file."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return sorted({int(m.group(1)) for e in doc["traceEvents"]
                   if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", ""))))})


def _rank(path: Path) -> int:
    return json.loads(gzip.decompress(path.read_bytes()))["distributedInfo"]["rank"]


def _ingested(store: Path, folder: Path) -> dict:
    code, out, err = run_cli("--store", str(store), "ingest", "--json", str(folder))
    assert code == 0, err
    return json.loads(out)


def test_each_window_is_a_run_of_its_own(tmp_path):
    """Two runs, in time order, each holding every rank's trace of that window (the raw files' steps say which)."""
    files = sorted(FOLDER.iterdir())
    assert len(files) == 4
    by_window: dict[tuple, list[Path]] = {}
    for path in files:
        by_window.setdefault(tuple(_steps(path)), []).append(path)
    assert sorted(by_window) == [(2, 3), (6, 7)]  # the schedule: wait 1, warm-up 1, active 2, repeat 2
    doc = _ingested(tmp_path / "store", FOLDER)
    runs = doc["runs"]
    assert [r["name"] for r in runs] == ["windows2_gloo window 1 of 2", "windows2_gloo window 2 of 2"]
    assert [r["window"]["index"] for r in runs] == [1, 2] and {r["window"]["of"] for r in runs} == {2}
    assert runs[0]["window"]["folder_run"] == runs[1]["window"]["folder_run"]
    for run, steps in zip(runs, [(2, 3), (6, 7)]):
        assert run["world_size"] == 2 and run["already_stored"] is False
        sources = sorted(Path(p).name for paths in run["source_paths"].values() for p in paths)
        assert sources == sorted(p.name for p in by_window[steps])
        assert {str(_rank(FOLDER / name)) for name in sources} == {"0", "1"}


def test_the_windows_are_analysed_apart(tmp_path):
    """Window 1 is balanced; in window 2 rank 1 is the straggler, the others waiting about its 20 ms sleep a step
    (a run of both windows mixed would show neither)."""
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", "--rule", "stragglers",
                             str(FOLDER))
    assert code == 0, err
    findings = json.loads(out)["findings"]
    assert len(findings) == 2 and findings[0]["trace"] != findings[1]["trace"]
    first, second = findings
    assert (first["severity"], first["metrics"]["straggler_rank"]) == ("info", None)
    assert (second["severity"], second["metrics"]["straggler_rank"]) == ("critical", 1)
    per_step_ms = second["metrics"]["wait_caused_per_step_ns"] / 1e6
    assert 0.9 * SLEEP_MS <= per_step_ms <= 1.25 * SLEEP_MS, per_step_ms
    assert "AccumulateGrad" in second["message"]


def test_the_folder_again_is_recognised_without_reading(tmp_path):
    """Ingested again, both windows are found in the store (as a folder of one run is), none read again."""
    store = tmp_path / "store"
    first = _ingested(store, FOLDER)["runs"]
    again = _ingested(store, FOLDER)["runs"]
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert [r["already_stored"] for r in again] == [True, True]
    code, out, err = run_cli("--store", str(store), "ingest", str(FOLDER))
    assert code == 0 and out.count("already in the store") == 2 and err == ""


def test_the_screen_says_how_the_folder_was_split(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path / "store"), "ingest", str(FOLDER))
    assert code == 0
    ids = re.findall(r"run\s+([0-9a-f]{16})\s+windows2_gloo window (\d) of 2", out)
    assert [w for _, w in ids] == ["1", "2"]
    assert err == (f"traceparse: warning: windows2_gloo: every rank has 2 traces one after another (profiling "
                   f"windows: a schedule with repeat > 1 writes one per window), stored as 2 runs: window 1 "
                   f"{ids[0][0]}, window 2 {ids[1][0]}\n")


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(FOLDER, out)
    return out


def _refused(tmp_path: Path, folder: Path, expected: str) -> None:
    """Refused in one line, and nothing stored (no run, no trace, no partial entry)."""
    from traceparse.store import Store

    store = tmp_path / "store"
    code, out, err = run_cli("--store", str(store), "ingest", str(folder))
    assert code == 2 and "Traceback" not in err
    assert err == f"traceparse: error: {expected}\n"
    assert Store(store).run_ids() == [] and Store(store).ids() == []
    assert not (store / "tmp").exists() or not any((store / "tmp").iterdir())


def test_a_rank_with_fewer_windows_is_refused_by_name(tmp_path):
    """Hand-made from the fixture: rank 1's second window taken out. Rank 0's two traces are no windows of every
    rank, and the message says which files and what to do."""
    folder = _copy(tmp_path, "short")
    by_rank = sorted(folder.iterdir(), key=lambda p: (_rank(p), _steps(p)))
    (by_rank[3]).unlink()  # rank 1, steps 6-7
    _refused(tmp_path, folder, f"{by_rank[1]}: rank 0 again (also {by_rank[0]}): rank 0 has 2 traces and rank 1 1, "
                               "so they are no profiling windows of every rank; give each window's files as a run of "
                               "its own (traceparse ingest --run NAME FILE ...)")


def test_two_traces_of_one_rank_at_once_are_refused(tmp_path):
    """Hand-made: each rank's first window copied under another stamp with one key added (other bytes, the same
    times): two traces of a rank that overlap in time are no windows."""
    folder = tmp_path / "twice"
    folder.mkdir()
    made = []
    for path in sorted(FOLDER.iterdir()):
        if _steps(path) != [2, 3]:
            continue
        (folder / path.name).write_bytes(path.read_bytes())
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["copied"] = True
        twin = folder / path.name.replace(".pt.trace", "9.pt.trace")
        twin.write_bytes(gzip.compress(json.dumps(doc).encode()))
        made.append((path.name, twin.name))
    first, twin = sorted(made)[0]
    _refused(tmp_path, folder, f"{folder / twin}: rank 0 again (also {folder / first}), and the two overlap in time: "
                               "two traces of one rank at once are no profiling windows (two jobs, or one trace "
                               "copied and edited?); give each job's files as a run of its own (traceparse ingest "
                               "--run NAME FILE ...)")


def test_the_python_api_names_every_window(tmp_path):
    """``traceparse.add`` and ``load`` give one id or trace: for a folder of windows they say it holds several and
    name their runs (stored, and each loadable by id)."""
    import traceparse

    store = tmp_path / "store"
    with pytest.raises(traceparse.InputError) as err, pytest.warns(traceparse.TraceparseWarning,
                                                                  match="stored as 2 runs"):
        traceparse.add(FOLDER, store=store)
    ids = re.findall(r"[0-9a-f]{16}", str(err.value))
    assert str(err.value) == (f"{FOLDER}: holds 2 profiling windows of its ranks, stored as runs {ids[0]}, {ids[1]}; "
                              "load them one by one by id")
    assert [traceparse.load(i, store=store).meta.distributed["world_size"] for i in ids] == [2, 2]


@pytest.mark.parametrize("command", [["diff", str(FOLDER), str(FOLDER)], ["show", str(FOLDER)],
                                     ["whatif", str(FOLDER)], ["report", "--html", "PAGE", str(FOLDER)]])
def test_a_command_of_one_trace_names_the_windows_instead_of_taking_the_first(tmp_path, command):
    """diff, show, whatif and report take one trace or run: given the folder, they say it makes two runs and name
    them (the first window was taken without a word before: report's page was of window 1 alone)."""
    store = tmp_path / "store"
    runs = _ingested(store, FOLDER)["runs"]
    args = [str(tmp_path / "page.html") if a == "PAGE" else a for a in command]
    code, out, err = run_cli("--store", str(store), *args)
    assert code == 2 and out == ""
    assert err == (f"traceparse: error: {FOLDER}: {command[0]} takes one trace or run; this makes 2 "
                   f"({runs[0]['id']}, {runs[1]['id']}): name one by its id\n")
    assert not (tmp_path / "page.html").exists()
