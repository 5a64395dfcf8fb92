"""Runs of absurd size (issue 22.4): a claimed world size of 10^9, a rank of 10^9 or a file named
``rank99999999.json`` once built a set of every expected rank (MemoryError after 4.5 GB). The world size is
checked against the rank files given, ranks are ASCII integers of the rank column's range, and the missing
ranks are counted, never enumerated."""

from __future__ import annotations

import gzip
import json
import resource
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli
from traceparse.run import ascii_int, rank_from_name

RUN = FIXTURES / "torch" / "multirank" / "gloo4_balanced"


def _run(tmp_path: Path, edit, names: list[str] | None = None) -> Path:
    """The four-rank gloo run, each rank's document passed through ``edit(index, doc)``, maybe renamed."""
    out = tmp_path / "run"
    out.mkdir()
    for i, path in enumerate(sorted(RUN.iterdir())):
        doc = json.load(gzip.open(path))
        edit(i, doc)
        with gzip.open(out / (names[i] if names else path.name), "wt") as f:
            json.dump(doc, f)
    return out


def _ingest(directory: Path) -> tuple[int, str, str]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_cli("ingest", "-q", "--jobs", "1", "--json", str(directory))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 1024 * 1024, f"the peak memory grew by {grown_kib} KiB"
    return result


def test_ascii_integers_only():
    assert "²".isdigit() and "٣".isdigit()  # why str.isdigit is not the test
    assert [ascii_int(v) for v in (3, " 12 ", "-1", "²", "٣", "1e9", True, 2.0, None, "9" * 20)] == \
        [3, 12, -1, None, None, None, None, None, None, None]
    assert rank_from_name("rank٣.json") is None and rank_from_name("rank3.json") == 3


def test_a_claimed_world_size_of_a_billion_is_a_warning(store, tmp_path):
    code, out, err = _ingest(_run(tmp_path, lambda i, d: d["distributedInfo"].update(world_size=10**9)))
    assert code == 0, err
    assert err == ("traceparse: warning: the ranks claim a world size of 1,000,000,000 for 4 rank files (more than "
                   "1000 times as many); the world size is taken from the ranks present\n")
    run = json.loads(out)["runs"][0]
    assert run["world_size"] == 4 and sorted(run["ranks"]) == ["0", "1", "2", "3"]


def test_a_rank_of_a_billion_is_counted_not_enumerated(store, tmp_path):
    def edit(i, doc):
        doc["distributedInfo"].pop("world_size")
        doc["distributedInfo"]["rank"] = 10**9 if i == 0 else i

    code, out, err = _ingest(_run(tmp_path, edit))
    assert code == 0, err
    assert ("traceparse: warning: 999,999,997 of 1,000,000,001 ranks missing from the run: 0, 4, 5, 6, 7, 8, 9, 10, "
            "11, 12 and 999,999,987 more\n") in err
    assert sorted(json.loads(out)["runs"][0]["ranks"], key=int) == ["1", "2", "3", str(10**9)]


def test_a_file_named_rank99999999(store, tmp_path):
    names = ["rank99999999.json.gz", "rank1.json.gz", "rank2.json.gz", "rank3.json.gz"]
    code, out, err = _ingest(_run(tmp_path, lambda i, d: d.pop("distributedInfo"), names))
    assert code == 0, err
    assert err == ("traceparse: warning: 99,999,996 of 100,000,000 ranks missing from the run: 0, 4, 5, 6, 7, 8, 9, "
                   "10, 11, 12 and 99,999,986 more\n")


def test_a_rank_past_the_rank_column_is_one_line(store, tmp_path):
    def edit(i, doc):
        doc["distributedInfo"].pop("world_size")
        doc["distributedInfo"]["rank"] = 2**40 if i == 0 else i

    directory = _run(tmp_path, edit)
    code, out, err = _ingest(directory)
    assert code == 2
    assert err == (f"traceparse: error: {directory / 'rank0.json.gz'}: rank 1099511627776 (from the trace) is outside "
                   "0 to 2,147,483,647, the ranks a run can hold\n")


@pytest.mark.parametrize("value", ["²", "٣", "1e9"])
def test_a_rank_that_is_not_ascii_digits_is_not_a_rank(store, tmp_path, value):
    """distributedInfo's rank as text that Python's isdigit/int accept: the file name gives the rank instead."""
    code, out, err = _ingest(_run(tmp_path, lambda i, d: d["distributedInfo"].update(rank=value, world_size="٤")))
    assert code == 0, err
    run = json.loads(out)["runs"][0]
    assert sorted(run["ranks"]) == ["0", "1", "2", "3"] and run["world_size"] == 4
    assert set(run["rank_from"].values()) == {"file name"}
