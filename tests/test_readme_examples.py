"""The README's console examples are what the commands print today (issue 23, item 6): regenerated from the
real commands on the bundled fixtures by docs/make_readme_examples.py, which fails with a diff when stale."""

from __future__ import annotations

import importlib.util

from helpers import REPO


def _tool():
    spec = importlib.util.spec_from_file_location("make_readme_examples", REPO / "docs" / "make_readme_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_examples_are_current(capsys):
    status = _tool().main(["--check"])
    diff = capsys.readouterr().out
    assert status == 0, "README.md is stale; run python docs/make_readme_examples.py\n" + diff


def test_the_check_sees_a_stale_example():
    tool = _tool()
    text = (REPO / "README.md").read_text()
    assert text.count("<!-- example") >= 8
    stale = text.replace("│ events     4,573 (api 1,791", "│ events     4,574 (api 1,791", 1)
    assert stale != text
    assert tool.regenerate(stale) == text


def test_kept_lines_mark_what_was_left_out():
    tool = _tool()
    lines = [f"l{i}" for i in range(10)]
    assert tool.kept_lines(lines, ":2,-2:", None) == ["l0", "l1", "...", "l8", "l9"]
    assert tool.kept_lines(lines, "3:5", None) == ["...", "l3", "l4", "..."]
    assert tool.kept_lines(lines, None, "l[13]") == ["l1", "l3"]


def test_a_block_whose_data_is_absent_is_kept_as_written():
    tool = _tool()
    text = ("<!-- example requires=no/such/dir -->\n```console\n$ traceparse list\nwhatever was written\n```\n")
    assert tool.regenerate(text) == text


def test_the_readme_names_the_schema_version_json_carries():
    """The README said the envelope's schema_version was 2 while every command printed 4."""
    import re

    from traceparse.meta import SCHEMA_VERSION

    text = (REPO / "README.md").read_text()
    stated = re.findall(r"the event schema's version, (\d+)", text) + re.findall(r'"schema_version": (\d+)', text)
    assert stated and set(stated) == {str(SCHEMA_VERSION)}


def test_the_readme_quotes_the_stragglers_finding_as_it_reads(tmp_path):
    """The README quoted "61.14 ms a step against 753.3 us" where the finding said 713.4 us: its quotation of the
    slow-rank run's stragglers message is the message's own words."""
    import json
    import re

    import pytest
    from helpers import run_cli

    run = REPO.parent / "shared" / "samples" / "multirank" / "gloo4_resnet18_bs16_slow_rank2"
    if not run.is_dir():
        pytest.skip("shared multirank samples not present")
    quoted = re.search(r'"(Longer on rank 2 than on the median rank.*?there\.)"',
                       " ".join((REPO / "README.md").read_text().split()), re.S).group(1)
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(run), "--rule", "stragglers", "--json")
    assert code == 0, err
    assert quoted in json.loads(out)["findings"][0]["message"]
