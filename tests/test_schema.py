"""The schema module and its documentation agree; conform() refuses what it must."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from traceparse.schema import COLUMNS, conform

DOC = Path(__file__).resolve().parent.parent / "docs" / "schema.md"


def test_every_column_is_documented():
    documented = re.findall(r"^\| `([a-z_]+)` \|", DOC.read_text(), flags=re.M)
    assert [c for c in documented if c in COLUMNS] == list(COLUMNS)


def test_conform_adds_nulls_numbers_rows_and_refuses_unknowns():
    df = conform(pl.DataFrame({"kind": ["kernel", "api"], "name": ["k", "cudaLaunchKernel"]}), trace_id="t",
                 first_event_id=10)
    assert df.columns == list(COLUMNS)
    assert df["event_id"].to_list() == [10, 11] and df["calls"].to_list() == [1, 1]
    assert df["trace_id"].to_list() == ["t", "t"] and df["start_ns"].null_count() == 2
    with pytest.raises(ValueError, match="columns not in the traceparse schema: colour"):
        conform(pl.DataFrame({"kind": ["kernel"], "colour": ["red"]}))
    with pytest.raises(ValueError, match="column kind: 'gadget' is not one of kernel, memcpy"):
        conform(pl.DataFrame({"kind": ["gadget"]}))
    with pytest.raises(ValueError, match="column copy_kind: 'sideways' is not one of HtoD"):
        conform(pl.DataFrame({"kind": ["memcpy"], "copy_kind": ["sideways"]}))
