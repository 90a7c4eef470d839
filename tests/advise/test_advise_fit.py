"""The convergence fit recovers known parameters from synthetic runs, reads samples to target
off eval records, and marks where runs never reach the target."""

import math

import numpy as np
import pytest

from paramserver.advise.core.fit_convergence import LiveRun, crossing, fit, live_run

TRUE_E = {"bsp": 6000.0, "lbbsp": 5000.0, "asp": 9000.0, "ssp": 7000.0}
MODE = {"bsp": "round", "lbbsp": "round", "asp": "arrival", "ssp": "arrival"}
B_CRIT, ALPHA = {"value": 200.0}, {"arrival": 0.15, "round": 0.05}


def truth(policy, b, s):
    """Samples to target at update batch b and staleness s, relative to (b, s) = (1, 0)."""
    return (TRUE_E[policy] * (1 + b / B_CRIT["value"]) / (1 + 1 / B_CRIT["value"])
            * (1 + ALPHA[MODE[policy]] * s))


def synthetic(seed=0, sigma=0.03, never_beyond=None):
    rng = np.random.default_rng(seed)
    runs = []
    for p in TRUE_E:
        for b in (16, 64, 256, 1024):
            for s in (0.0, 1.0, 3.0, 8.0):
                for rep in range(2):
                    n = truth(p, b, s) * math.exp(rng.normal(0, sigma))
                    if never_beyond is not None and s >= never_beyond:
                        n = None
                    runs.append(LiveRun(p, MODE[p], f"b{b}-s{s}", rep, b, s, n,
                                        None if n is None else n / 1000))
    return runs


def test_fit_recovers_known_parameters():
    m = fit(synthetic(), target=0.9)
    assert m.b_crit == pytest.approx(200.0, rel=0.25)
    assert m.alpha["arrival"] == pytest.approx(0.15, abs=0.03)
    assert m.alpha["round"] == pytest.approx(0.05, abs=0.02)
    for p in TRUE_E:  # a point no run sat at
        band = m.samples_needed(p, apply_mode=MODE[p], update_batch=128, staleness=5)
        assert band.mid == pytest.approx(truth(p, 128, 5), rel=0.06)
        assert band.lo <= truth(p, 128, 5) <= band.hi
    # An unseen policy scales from its apply mode's pooled runs.
    unseen = m.samples_needed("r2sp", apply_mode="arrival", update_batch=64, staleness=1)
    assert truth("ssp", 64, 1) * 0.8 < unseen.mid < truth("asp", 64, 1) * 1.2


def test_fit_finds_the_staleness_beyond_which_runs_never_reach():
    m = fit(synthetic(never_beyond=8.0), target=0.9)
    assert m.policies["asp"].never_staleness == 8.0
    assert m.samples_needed("asp", apply_mode="arrival", update_batch=16, staleness=9) is None
    assert m.samples_needed("asp", apply_mode="arrival", update_batch=16, staleness=2) is not None
    # A policy most of whose runs never reached: never, at its staleness and beyond.
    runs = [LiveRun("dssp", "arrival", "c", i, 32, 4.0, None, None) for i in range(3)]
    runs += [LiveRun("asp", "arrival", "c", i, 32, 2.0, 5000.0, 5.0) for i in range(3)]
    m = fit(runs, target=0.95)
    assert m.policies["dssp"].samples is None
    assert m.samples_needed("dssp", apply_mode="arrival", update_batch=32, staleness=4) is None


def test_flat_data_keep_the_priors():
    # Every run at one batch size: B_crit is not identified and stays at its prior.
    runs = [LiveRun("bsp", "round", "c", i, 128, 0.0, 6000.0 + 100 * i, 3.0) for i in range(3)]
    m = fit(runs, target=0.95)
    assert m.b_crit == pytest.approx(256.0, rel=0.1)
    assert m.policies["bsp"].samples == pytest.approx(6100.0)
    assert m.policies["bsp"].lo_ratio == pytest.approx(6000 / 6100)


def test_crossing_interpolates_between_evaluations():
    evals = [(0.0, 0, 0.1), (1.0, 1000, 0.8), (2.0, 2000, 1.0)]
    assert crossing(evals, 0.9) == pytest.approx((1500.0, 1.5))
    assert crossing(evals, 0.05) == (0.0, 0.0)
    assert crossing(evals, 1.01) is None
    summary = {"updates_applied": 135, "samples": 17280, "batch_size": 32,
               "mean_staleness": 0.0, "final_test_accuracy": 0.96, "diverged_at_s": None}
    r = live_run("bsp", "round", "one-slow", 0, summary, evals, 0.9)
    assert (r.update_batch, r.samples_to_target, r.time_to_target) == (128.0, 1500.0, 1.5)


def test_policies_the_repeats_cannot_tell_apart_are_pooled():
    # Same truth (6500), repeats 15% apart: the policies' medians differ by noise alone, so
    # both are pulled to the apply mode's; clearly different ones keep their own.
    runs = [LiveRun(p, "round", "c", i, 128, 0.0, n, n / 1000)
            for p, ns in (("bsp", (5500, 7200)), ("lbbsp", (7400, 6000))) for i, n in enumerate(ns)]
    m = fit(runs, target=0.95)
    assert m.policies["bsp"].samples == pytest.approx(m.modes["round"].samples)
    assert m.policies["lbbsp"].samples == pytest.approx(m.modes["round"].samples)
    apart = [LiveRun(p, "round", "c", i, 128, 0.0, n, n / 1000)
             for p, ns in (("bsp", (6000, 6100)), ("lbbsp", (12000, 12200)))
             for i, n in enumerate(ns)]
    m = fit(apart, target=0.95)
    assert m.policies["bsp"].samples == pytest.approx(6050, rel=0.02)
    assert m.policies["lbbsp"].samples == pytest.approx(12100, rel=0.02)


def test_one_failed_run_sets_no_staleness_limit():
    runs = [LiveRun("r2sp", "arrival", "a", i, 32, 1.4, 9000.0, 4.0) for i in range(2)]
    runs.append(LiveRun("r2sp", "arrival", "b", 0, 32, 1.9, None, None))
    assert fit(runs, 0.95).policies["r2sp"].never_staleness is None
    runs.append(LiveRun("r2sp", "arrival", "b", 1, 32, 2.1, None, None))
    assert fit(runs, 0.95).policies["r2sp"].never_staleness == 1.9


def _log_likelihood(h, runs):
    return sum(-h * r.staleness if r.reached else math.log(-math.expm1(-h * r.staleness))
               for r in runs if r.staleness > 0)


def test_the_hazard_is_the_maximum_likelihood_of_which_runs_reached_at_which_staleness():
    from paramserver.advise.core.fit_convergence import hazard
    rng = np.random.default_rng(3)
    true_h = 0.15
    runs = []
    for i, s in enumerate(rng.uniform(0.5, 8.0, size=400)):
        ok = rng.random() < math.exp(-true_h * s)
        runs.append(LiveRun("asp", "arrival", "c", i, 32, float(s), 9000.0 if ok else None,
                            4.0 if ok else None, 0.96 if ok else 0.1, diverged=not ok))
    h = hazard(runs, 0.95)
    # the likelihood's maximum, found by brute force on a fine grid
    grid = np.linspace(0.01, 1.0, 9901)
    best = grid[int(np.argmax([_log_likelihood(g, runs) for g in grid]))]
    assert h == pytest.approx(best, abs=2e-4)
    assert h == pytest.approx(true_h, rel=0.25)
    # the fit stores it with the policy, and the model's reach follows it
    m = fit(runs, 0.95)
    assert m.policies["asp"].hazard == pytest.approx(h)
    assert m.policies["asp"].failed == sum(not r.reached for r in runs)
    assert m.reach("asp", apply_mode="arrival", staleness=4.0) == pytest.approx(
        math.exp(-4.0 * h))


def test_the_hazard_at_its_edges():
    from paramserver.advise.core.fit_convergence import HAZARD_MAX, hazard

    def run(s, ok, final=0.1):
        return LiveRun("asp", "arrival", "c", 0, 32, s, 9000.0 if ok else None, None,
                       0.96 if ok else final)
    assert hazard([run(2.0, True), run(3.0, True)], 0.95) == 0.0  # every run reached
    assert hazard([run(2.0, False), run(3.0, False)], 0.95) == HAZARD_MAX  # none did
    assert hazard([run(2.0, False)], 0.95) is None  # one run says too little
    # lockstep runs (no staleness) say nothing of it, whatever happened to them
    assert hazard([run(0.0, False), run(0.0, True), run(0.0, False)], 0.95) is None
    # reaching at high staleness and failing at low: a small hazard
    assert hazard([run(8.0, True), run(8.0, True), run(1.0, False)], 0.95) < 0.2
    # a run that ended near the target ran out of budget: left out, as if it never ran
    assert hazard([run(2.0, True), run(3.0, True), run(3.0, False, final=0.9)], 0.95) == 0.0
    assert hazard([run(2.0, True), run(3.0, False, final=0.9)], 0.95) is None
    # one that diverged failed, whatever its last accuracy
    diverged = LiveRun("asp", "arrival", "c", 0, 32, 3.0, None, None, 0.93, diverged=True)
    assert hazard([run(2.0, True), diverged], 0.95) > 0
