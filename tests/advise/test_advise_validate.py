"""The arithmetic of calibrate: live medians (never when most runs never reached), errors,
leave-one-out selection, per-policy verdicts against the 15% goal and the seed claims."""

import pytest

from paramserver.predict.convergence import Band
from paramserver.advise.core.fit_convergence import LiveRun
from paramserver.advise.core.validate import (Cell, CellResult, error, leave_out, measure,
                                         per_policy, seed_claims, speedup)


def run(policy, cell, rep, t):
    mode = "round" if policy in ("bsp", "lbbsp") else "arrival"
    return LiveRun(policy, mode, cell, rep, 32.0, 1.0, None if t is None else t * 1000, t)


def test_measure_takes_the_median_and_says_never_when_most_never_reached():
    m = measure([run("bsp", "c", i, t) for i, t in enumerate([5.0, 3.0, 4.0])])
    assert (m.median_s, m.lo_s, m.hi_s, m.reached, m.runs) == (4.0, 3.0, 5.0, 3, 3)
    m = measure([run("ssp", "c", 0, None), run("ssp", "c", 1, None), run("ssp", "c", 2, 2.0)])
    assert m.median_s is None and m.reached == 1 and m.lo_s == 2.0
    # Half reached: the median of those that did.
    assert measure([run("asp", "c", 0, None), run("asp", "c", 1, 2.0)]).median_s == 2.0


def test_error_and_leave_one_out():
    assert error(11.5, 10.0) == pytest.approx(0.15)
    assert error(None, 10.0) is None and error(3.0, None) is None
    runs = [run("bsp", "a@x", 0, 1.0), run("bsp", "b@x", 0, 1.0), run("ssp", "a@x", 0, 1.0)]
    left = leave_out(runs, Cell("bsp", "a", "x"))
    assert [(r.policy, r.cell) for r in left] == [("bsp", "b@x"), ("ssp", "a@x")]


def result(policy, setting, measured, predicted):
    scenario, link = setting.split("@")
    runs = [run(policy, setting, 0, measured)]
    band = None if predicted is None else Band(predicted * 0.9, predicted, predicted * 1.1)
    return CellResult(Cell(policy, scenario, link), measure(runs), band, None, 0.0, 32.0, 1)


def test_verdicts_hold_every_cell_to_the_goal():
    results = [result("bsp", "a@x", 10.0, 11.0), result("bsp", "b@x", 10.0, 8.0),
               result("ssp", "a@x", None, None), result("ssp", "b@x", 4.0, 4.4),
               result("asp", "a@x", None, 3.0)]
    v = {p.policy: p for p in per_policy(results)}
    assert (v["bsp"].agree, v["bsp"].cells, v["bsp"].within_goal) == (1, 2, False)
    assert v["bsp"].median_abs_error == pytest.approx(0.15)
    assert v["bsp"].max_abs_error == pytest.approx(0.2)
    # Both sides never count as agreeing; never on one side only does not.
    assert v["ssp"].within_goal and v["ssp"].compared == 1
    assert not v["asp"].within_goal and v["asp"].median_abs_error is None


def test_seed_claims_compare_each_policy_with_bsp_live_and_simulated():
    results = [result("bsp", "one-slow@x", 10.0, 12.0), result("ebsp", "one-slow@x", 5.0, 6.0),
               result("ssp", "one-slow@x", None, 8.0), result("lbbsp", "homog@x", 3.0, 3.0)]
    claims = {(c.policy, c.setting): c for c in seed_claims(results)}
    assert set(claims) == {("ebsp", "one-slow@x"), ("ssp", "one-slow@x")}
    assert claims["ebsp", "one-slow@x"].live == pytest.approx(2.0)
    assert claims["ebsp", "one-slow@x"].simulated == pytest.approx(2.0)
    assert claims["ssp", "one-slow@x"].live is None
    assert claims["ssp", "one-slow@x"].simulated == pytest.approx(1.5)
    assert speedup(None, 1.0) is None and speedup(2.0, 0.0) is None


def test_the_error_splits_into_samples_and_throughput():
    runs = [run("bsp", "a@x", i, t) for i, t in enumerate([4.0, 5.0, 6.0])]
    m = measure(runs)
    assert m.samples == 5000.0  # the median samples to target of the runs that reached
    # predicted 12% more samples, and the simulator takes 6 s to the live 5,000 (20% slow)
    r = CellResult(Cell("bsp", "a", "x"), m, Band(6.0, 6.72, 7.0), Band(5000, 5600, 6000),
                   0.0, 128.0, 1, sim_time_at_live_samples=6.0)
    assert r.samples_error == pytest.approx(0.12)
    assert r.throughput_error == pytest.approx(0.20)
    assert 1 + r.error == pytest.approx((1 + r.samples_error) * (1 + r.throughput_error))
    assert result("bsp", "a@x", 10.0, 11.0).throughput_error is None  # nothing simulated
