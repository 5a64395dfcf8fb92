"""``traceparse.expr.sort_rows(..., lexsort=True)``: numpy's lexsort where every key is an integer or boolean
column (issue 25: the critical path's sorts), polars' sort otherwise; the same rows in the same order as
polars' stable sort."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traceparse.expr import LEXSORT_ROWS, sort_order, sort_rows

N = LEXSORT_ROWS + 501


def _frame(seed: int) -> pl.DataFrame:
    """Integer keys of several widths with many ties, some with nulls, a boolean, and a unique id last."""
    rng = np.random.default_rng(seed)
    columns = {}
    for j, dtype in enumerate([pl.Int64, pl.Int32, pl.Int8, pl.UInt32, pl.UInt8]):
        low = 0 if dtype in (pl.UInt32, pl.UInt8) else -4
        values = pl.Series(f"k{j}", rng.integers(low, 4, N), dtype=dtype)
        if j % 2 == 0:  # a tenth null
            values = values.scatter(np.flatnonzero(rng.random(N) < 0.1), None)
        columns[f"k{j}"] = values
    columns["flag"] = pl.Series(rng.random(N) < 0.5)
    columns["name"] = pl.Series([f"n{i % 7}" for i in range(N)])
    columns["id"] = pl.Series(np.arange(N, dtype=np.int64)[::-1].copy())
    return pl.DataFrame(columns)


@pytest.mark.parametrize("seed", range(12))
def test_lexsort_gives_polars_order_with_nulls_descending_and_ties(seed):
    frame = _frame(seed)
    rng = np.random.default_rng(100 + seed)
    keys = [c for c in frame.columns if c not in ("name", "id")]
    by = [keys[i] for i in rng.permutation(len(keys))[: rng.integers(1, len(keys) + 1)]] + ["id"]
    descending = [bool(d) for d in rng.random(len(by)) < 0.5]
    nulls_last = bool(seed % 2)
    assert sort_order(frame, by, descending, nulls_last) is not None  # the numpy path is the one tested
    expected = frame.sort(by, descending=descending, nulls_last=nulls_last, maintain_order=True)
    assert sort_rows(frame, by, descending, nulls_last, lexsort=True).equals(expected)


def test_extreme_values_sort_without_overflow():
    """Descending keys are bitwise-negated, not negated: Int64's smallest value does not wrap."""
    values = [-(2 ** 63), 2 ** 63 - 1, 0, -1, 1] * (N // 5 + 1)
    frame = pl.DataFrame({"t": pl.Series(values, dtype=pl.Int64), "i": pl.Series(range(len(values)))})
    for down in (False, True):
        assert sort_rows(frame, ["t", "i"], [down, False], lexsort=True).equals(
            frame.sort(["t", "i"], descending=[down, False], maintain_order=True))


def test_wide_unsigned_keys_sort_in_their_own_type():
    values = [2 ** 64 - 1, 0, 2 ** 63, 5, 2 ** 64 - 2] * (N // 5 + 1)
    small = [1, 2, 2, 1, 0] * (N // 5 + 1)
    frame = pl.DataFrame({"u": pl.Series(values, dtype=pl.UInt64), "s": pl.Series(small, dtype=pl.UInt64),
                          "i": pl.Series(range(len(values)))})
    for by in (["u", "i"], ["s", "u", "i"], ["s", "i"]):
        for down in (False, True):
            expected = frame.sort(by, descending=[down] + [False] * (len(by) - 1), maintain_order=True)
            assert sort_rows(frame, by, [down] + [False] * (len(by) - 1), lexsort=True).equals(expected)


def test_text_keys_and_small_frames_are_left_to_polars():
    frame = _frame(1)
    assert sort_order(frame, ["name", "id"], [False, False]) is None
    assert sort_order(frame.head(LEXSORT_ROWS - 1), ["k1", "id"], [False, False]) is None
    assert sort_rows(frame, ["name", "k1", "id"], lexsort=True).equals(
        frame.sort(["name", "k1", "id"], maintain_order=True))
