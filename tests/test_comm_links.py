"""traceparse.measures.comm_links on hand-written edge cases (the real gloo runs are tests/test_tp_dp_gloo.py)."""

from __future__ import annotations

import polars as pl
import pytest

from traceparse.measures.comm_links import LOOK_AHEAD, carried_out_by, tensor_sizes


@pytest.mark.parametrize(("dims", "sizes"), [
    ("[[4,64,256],[],[]]", {65536}),  # a tensor, then arguments that are none
    ("[[[4,64,256]],[],[],[],[],[]]", {65536}),  # a list of tensors
    ("[[131712],[263424],[],[],[]]", {131712, 263424}),  # an all-gather's input and output
    ("[[[]],[],[]]", {1}),  # a scalar all-reduced
    ("[[]]", {1}),
    ("[[0,8]]", {0}),  # an empty tensor is a size too
    ("[]", set()), ("", set()), (None, set()), ("not json", set()), ('{"a": 1}', set()), ("[[true, 2]]", set()),
])
def test_tensor_sizes(dims, sizes):
    assert tensor_sizes(dims) == frozenset(sizes)


def _frame(rows):
    return pl.DataFrame(rows, schema={"member": pl.Int32, "_row": pl.UInt32, "start_ns": pl.Int64,
                                      "input_dims": pl.String}, orient="row")


def test_each_worker_event_carries_out_one_call_of_its_member_and_data():
    """Two calls of one size on rank 0 take the two workers after them in order; rank 1's worker is not rank
    0's; a worker that starts before the call, or moves other data, is not its."""
    calls = _frame([(0, 1, 100, "[[8]]"), (0, 2, 110, "[[8]]"), (0, 3, 120, "[[16],[32]]"), (1, 4, 100, "[[8]]")])
    workers = _frame([(0, 10, 90, "[[16]]"), (0, 11, 105, "[[8]]"), (0, 12, 106, "[[4]]"), (0, 13, 130, "[[8]]"),
                      (0, 14, 131, "[[32]]"), (1, 15, 101, "[[8]]")])
    got = dict(carried_out_by(calls, workers).iter_rows())
    assert got == {1: 11, 2: 13, 3: 14, 4: 15}


def test_a_call_with_no_worker_in_reach_is_left_out():
    """Past :data:`LOOK_AHEAD` later worker events, or with no size recorded, a call stays unlinked."""
    calls = _frame([(0, 1, 0, "[[8]]"), (0, 2, 0, None)])
    workers = _frame([(0, 100 + i, 1 + i, "[[4]]") for i in range(LOOK_AHEAD)] + [(0, 999, 10_000, "[[8]]")])
    assert carried_out_by(calls, workers).height == 0
