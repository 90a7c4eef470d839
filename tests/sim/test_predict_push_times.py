"""Push-time predictors: the published last-interval rule, EMA and median, and their input checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver.predict import PREDICTORS, PredictInputError, ema, get_predictor, last_interval, median

histories = st.lists(
    st.lists(st.integers(0, 50), min_size=2, max_size=9).map(lambda r: np.cumsum(r).tolist()),
    min_size=1, max_size=5)


def test_last_interval_is_the_published_rule():
    out = last_interval([[100, 1100, 2300], [0, 7]], 4)
    assert out.tolist() == [[2300, 3500, 4700, 5900], [7, 14, 21, 28]]
    assert out.dtype == np.int64  # integer milliseconds stay exact


def test_lookahead_one_is_the_last_push():
    assert last_interval(np.array([[1, 4, 9]]), 1).tolist() == [[9]]


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 6), st.floats(0.05, 1.0))
def test_ema_matches_the_recurrence(hist, lookahead, alpha):
    expected = []
    for row in hist:
        d = np.diff(row).astype(float)
        e = d[0]
        for x in d[1:]:
            e = alpha * x + (1 - alpha) * e
        expected.append([row[-1] + r * e for r in range(lookahead)])
    np.testing.assert_allclose(ema(hist, lookahead, alpha=alpha), expected, rtol=1e-12, atol=1e-9)


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 6), st.integers(1, 8))
def test_median_matches_numpy_median_of_last_k(hist, lookahead, k):
    expected = [[row[-1] + r * np.median(np.diff(row)[-k:]) for r in range(lookahead)] for row in hist]
    np.testing.assert_allclose(median(hist, lookahead, k=k), expected)


def test_alpha_one_and_k_one_reduce_to_last_interval():
    hist = [[0, 3, 10, 12], [5, 6, 9]]
    li = last_interval(hist, 5).astype(float)
    np.testing.assert_array_equal(ema(hist, 5, alpha=1.0), li)
    np.testing.assert_array_equal(median(hist, 5, k=1), li)


def test_constant_intervals_agree_across_predictors():
    hist = np.arange(0, 50, 5).reshape(2, 5)
    for name in PREDICTORS:
        np.testing.assert_array_equal(get_predictor(name)(hist, 3), last_interval(hist, 3))


def test_output_rows_are_sorted_for_the_search():
    out = ema([[0, 0, 0], [1, 2, 2]], 4)
    assert np.all(np.diff(out, axis=1) >= 0)


@pytest.mark.parametrize("hist, lookahead, message", [
    ([[1]], 3, "at least two"),
    ([], 3, "no workers"),
    ([[1, 3, 2]], 3, "not sorted"),
    ([[1.0, float("nan")]], 3, "non-finite"),
    ([[1, 2]], 0, "positive integer"),
    ([[1, 2]], 2.5, "positive integer"),
    (np.arange(4), 2, "2-D"),
    ([["a", "b"]], 2, "numbers"),
])
def test_bad_histories_fail_clearly(hist, lookahead, message):
    with pytest.raises(PredictInputError, match=message):
        last_interval(hist, lookahead)


def test_registry_lists_known_names():
    assert list(PREDICTORS) == ["last_interval", "ema", "median"]
    with pytest.raises(ValueError, match="known: last_interval, ema, median"):
        get_predictor("arima")
    with pytest.raises(PredictInputError):
        ema([[0, 1]], 2, alpha=0.0)
    with pytest.raises(PredictInputError):
        median([[0, 1]], 2, k=0)
