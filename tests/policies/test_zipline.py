"""ZipLine search: every variant against an exhaustive reference, the published fixture, edge cases."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramserver.predict import last_interval
from paramserver.zipline import (
    DEFAULT_VARIANT,
    VARIANTS,
    SyncPlan,
    ZiplineInputError,
    get_variant,
    search,
)
from paramserver.zipline.io import read_times

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "zipline" / "history_w1000.txt"
needs_fixture = pytest.mark.skipif(
    not FIXTURE.is_file(), reason=f"fixture {FIXTURE} missing (CI clones the repo next to shared/)")


def exhaustive(rows) -> SyncPlan:
    """Reference: try every combination; key (spread, barrier, low); the rule for sync_index."""
    best = min((max(c) - min(c), max(c), min(c)) for c in itertools.product(*rows))
    spread, barrier, low = best
    index = tuple(max(k for k, t in enumerate(row) if low <= t <= barrier) for row in rows)
    return SyncPlan(spread=spread, barrier=barrier, low=low, sync_index=index)


def assert_all_variants(rows) -> SyncPlan:
    expected = exhaustive(rows)
    for name in VARIANTS:
        assert search(rows, name) == expected, name
    return expected


# Few distinct values so that many timestamps tie within and across workers.
small_int_rows = st.lists(
    st.lists(st.integers(0, 7), min_size=1, max_size=4).map(sorted), min_size=1, max_size=4)
float_rows = st.lists(
    st.lists(st.sampled_from([0.0, 0.1, 0.3, 1e-9, 2.5, 1e16, -3.75, 7.0]), min_size=1, max_size=4)
    .map(sorted), min_size=1, max_size=4)


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_int_rows)
def test_variants_equal_exhaustive_on_small_int_inputs(rows):
    assert_all_variants(rows)


@settings(max_examples=600, deadline=None)
@given(float_rows)
def test_variants_equal_exhaustive_on_float_inputs(rows):
    # Floats take the sorting path of the default; rounding in max - min must not split variants.
    assert_all_variants(rows)


@settings(max_examples=400, deadline=None)
@given(small_int_rows, st.sampled_from([10**12, 10**15]))
def test_wide_integer_range_takes_the_sorting_path(rows, scale):
    assert_all_variants([[t * scale for t in row] for row in rows])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_matrix_input_equals_list_input(n, r, seed):
    m = np.sort(np.random.default_rng(seed).integers(0, 6, size=(n, r)), axis=1)
    assert search(m) == search(m.tolist()) == exhaustive(m.tolist())


def test_variants_agree_on_medium_random_inputs():
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(2, 60))
        rows = [np.sort(rng.integers(0, 400, size=int(rng.integers(1, 30)))) for _ in range(n)]
        plans = {name: search(rows, name) for name in VARIANTS}
        assert len(set(plans.values())) == 1, plans


def test_tie_rule_examples():
    # Equal spreads 1: windows [0,1] and [5,6]; the earliest barrier wins.
    assert search([[0, 5], [1, 6]]) == SyncPlan(1, 1, 0, (0, 0))
    # A worker with several points inside the window syncs at the last one before the barrier.
    assert search([[3, 3, 3], [3]]) == SyncPlan(0, 3, 3, (2, 0))
    assert search([[0, 10, 20], [4, 12], [11, 30]]) == SyncPlan(2, 12, 10, (1, 1, 0))


def test_edge_one_worker():
    for name in VARIANTS:
        assert search([[5, 7, 9]], name) == SyncPlan(0, 5, 5, (0,))


def test_edge_one_point_per_worker():
    for name in VARIANTS:
        assert search([[4], [1], [9]], name) == SyncPlan(8, 9, 1, (0, 0, 0))


def test_edge_identical_rows():
    rows = [[2, 4, 6]] * 5
    for name in VARIANTS:
        assert search(rows, name) == SyncPlan(0, 2, 2, (0,) * 5)


def test_types_follow_input():
    assert isinstance(search([[1, 2], [3]]).spread, int)
    plan = search([[1.5, 2.0], [3.0]])
    assert isinstance(plan.spread, float) and plan.spread == 1.0


@pytest.mark.parametrize("bad, message", [
    ([], "no workers"),
    ([[1, 2], []], "worker 1 has no push times"),
    ([[1, 3, 2]], "not sorted"),
    ([[1.0, float("nan")]], "non-finite"),
    ([[0.0], [float("inf")]], "non-finite"),
    (np.array([1, 2, 3]), "2-D"),
    ([["a", "b"]], "numbers"),
    ([[True, False]], "numbers"),
    ([[[1, 2]]], "1-D"),
    ("12", "sequence"),
    ([[0, 2**62]], "overflow"),
    (np.array([[2**63]], dtype=np.uint64), "too large"),
])
def test_bad_input_raises_clear_error(bad, message):
    for name in VARIANTS:
        with pytest.raises(ZiplineInputError, match=message):
            search(bad, name)


def test_unknown_variant_lists_known_ones():
    with pytest.raises(ValueError, match="known: .*zipline-opt-bs"):
        get_variant("zipline-fast")
    assert DEFAULT_VARIANT in VARIANTS
    assert {"zipline", "zipline-opt", "zipline-opt-bs"} <= set(VARIANTS)


@needs_fixture
@pytest.mark.parametrize("lookahead, spread", [(15, 1403), (20, 1400), (150, 1382)])
def test_fixture_published_predictor(lookahead, spread):
    data = read_times(FIXTURE)
    assert data.worker_ids == list(range(1000))
    m = last_interval(data.rows, lookahead)
    plans = {name: search(m, name) for name in VARIANTS}
    assert len(set(plans.values())) == 1
    plan = plans[DEFAULT_VARIANT]
    # The authors print min_d = 1403: their run used R = 15 (see the report of issue 4).
    assert plan.spread == spread
    assert plan.barrier - plan.low == spread
    idx = np.array(plan.sync_index)
    chosen = m[np.arange(1000), idx]
    assert chosen.min() == plan.low and chosen.max() == plan.barrier
    # Last point at or before the barrier: the next one (if any) lies after it.
    nxt = idx + 1 < lookahead
    assert np.all(m[np.flatnonzero(nxt), idx[nxt] + 1] > plan.barrier)
