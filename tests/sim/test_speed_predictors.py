"""Speed predictors for LB-BSP: last, EMA, median, and a NARX net that learns patterns."""

from __future__ import annotations

import math
import random

import pytest
import torch

from paramserver.policies import make_policy
from paramserver.predict.speed_factory import SPEED_PREDICTORS, make_speed_predictor
from policy_driver import Driver, VirtualWorker


@pytest.fixture
def one_thread():
    """Tiny nets are slower with two threads fighting on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def one_step_errors(predictor, series, start):
    """Mean |prediction - truth| of one-step-ahead forecasts from `start` on."""
    errors = []
    for i, (speed, cpu, mem) in enumerate(series):
        if i >= start:
            errors.append(abs(predictor.predict() - speed))
        predictor.observe(speed, cpu, mem)
    return sum(errors) / len(errors)


def test_simple_predictors():
    assert all(make_speed_predictor(n).predict() is None for n in ("last", "ema", "median"))
    last, ema, med = (make_speed_predictor(n) for n in ("last", "ema", "median"))
    for s in (10.0, 20.0, 90.0):
        for p in (last, ema, med):
            p.observe(s)
    assert last.predict() == 90.0
    assert ema.predict() == pytest.approx(0.5 * 90 + 0.25 * 20 + 0.25 * 10)
    assert med.predict() == 20.0
    with pytest.raises(ValueError, match="known"):
        make_speed_predictor("oracle")
    with pytest.raises(ValueError):
        last.observe(0.0)
    assert set(SPEED_PREDICTORS) == {"last", "ema", "median", "narx"}


def periodic(n, seed=0):
    rng = random.Random(seed)
    pattern = [100.0, 150.0, 80.0, 120.0, 60.0]
    return [(pattern[i % 5] * (1 + 0.02 * rng.uniform(-1, 1)), 50.0, 0.5) for i in range(n)]


def test_narx_learns_a_periodic_speed_pattern_better_than_last(one_thread):
    series = periodic(200)
    narx = one_step_errors(make_speed_predictor("narx", seed=3), series, 120)
    last = one_step_errors(make_speed_predictor("last"), series, 120)
    assert narx < 0.2 * last, (narx, last)


def test_narx_uses_the_exogenous_load(one_thread):
    # The next step's speed follows the cpu load measured during this one; speeds alone
    # carry no pattern to learn.
    rng = random.Random(1)
    loads = [rng.choice([10.0, 90.0]) for _ in range(181)]
    series = [(100.0 - 0.8 * loads[i], loads[i + 1], None) for i in range(180)]
    narx = one_step_errors(make_speed_predictor("narx", seed=0), series, 120)
    last = one_step_errors(make_speed_predictor("last"), series, 120)
    assert narx < 0.5 * last, (narx, last)


def test_narx_is_deterministic_and_falls_back_until_it_has_history(one_thread):
    a, b = make_speed_predictor("narx", seed=7), make_speed_predictor("narx", seed=7)
    assert a.predict() is None
    ema = make_speed_predictor("ema")
    for i, (speed, cpu, mem) in enumerate(periodic(40)):
        for p in (a, b, ema):
            p.observe(speed, cpu, mem)
        if i < 6 + 8 - 1:  # fewer than min_samples windows: the fallback answers
            assert a.predict() == ema.predict()
        assert a.predict() == b.predict() and a.predict() > 0


def test_lbbsp_with_narx_runs_and_follows_load(one_thread):
    """Worker 1 gets slow under load every third step; its batch shrinks accordingly."""
    def slow_when_loaded(step, batch, now):
        return batch * 1e-3 * (3.0 if step % 3 == 2 else 1.0)

    def load(step, now):
        return (90.0 if step % 3 == 1 else 10.0), 0.5  # measured the step before the slow one

    workers = [VirtualWorker(0, 0.0, 60, None, 1e-3),
               VirtualWorker(1, 0.0, 60, None, slow_when_loaded, load)]
    drv = Driver(make_policy("lbbsp", 16, predictor="narx"), workers)
    trace = drv.run()
    notes = [n.data for _, n in trace.notes if n.kind == "lbbsp_batches"]
    assert all(sum(n["batch"]) == 32 for n in notes)
    late = [n for n in notes if n["round"] >= 40]
    before_slow = [n["batch"][1] for n in late if n["round"] % 3 == 2]
    others = [n["batch"][1] for n in late if n["round"] % 3 != 2]
    assert max(before_slow) < min(others)
    assert not any(math.isnan(s) for n in notes for s in n["speed"])
