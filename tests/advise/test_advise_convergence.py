"""The convergence model: samples to target scaled by update batch and staleness, its band,
never-reached, and its JSON round trip with clear errors on bad files."""

import json
import math

import pytest

from paramserver.advise.calibration_io import default_convergence
from paramserver.predict.convergence import (ConvergenceError, ConvergenceModel,
                                            Reference, VERSION)


def model(**kw):
    base = dict(
        version=VERSION, target=0.9, b_crit=100.0, alpha={"arrival": 0.1, "round": 0.0},
        policies={"bsp": Reference("round", 8000.0, 128.0, 0.0, 0.9, 1.2, 3, 3),
                  "ssp": Reference("arrival", None, 32.0, 6.0, runs=3, reached=0)},
        modes={"arrival": Reference("arrival", 5000.0, 32.0, 2.0, 0.8, 1.1, 6, 6,
                                    never_staleness=10.0),
               "round": Reference("round", 8000.0, 128.0, 0.0, 0.9, 1.2, 3, 3)})
    base.update(kw)
    return ConvergenceModel(**base)


def test_own_runs_give_back_their_median_and_spread():
    b = model().samples_needed("bsp", apply_mode="round", update_batch=128, staleness=0)
    assert (b.lo, b.mid, b.hi) == pytest.approx((7200.0, 8000.0, 9600.0))


def test_batch_and_staleness_scale_the_reference():
    m = model()
    # Critical batch 100: from 128 to 356 samples per update is (1+3.56)/(1+1.28) = 2x.
    b = m.samples_needed("bsp", apply_mode="round", update_batch=356, staleness=0)
    assert b.mid == pytest.approx(16000.0)
    # An unseen arrival-mode policy scales from the mode: staleness 2 -> 7 is 1.7/1.2.
    a = m.samples_needed("asp", apply_mode="arrival", update_batch=32, staleness=7)
    assert a.mid == pytest.approx(5000.0 * 1.7 / 1.2)
    assert a.lo < a.mid < a.hi


def test_never_reached_is_none():
    m = model()
    assert m.samples_needed("asp", apply_mode="arrival", update_batch=32, staleness=10) is None
    # SSP never reached at staleness 6: none at 6 or more, the mode's scaling below it.
    assert m.samples_needed("ssp", apply_mode="arrival", update_batch=32, staleness=6) is None
    low = m.samples_needed("ssp", apply_mode="arrival", update_batch=32, staleness=1)
    assert low is not None and low.mid == pytest.approx(5000.0 * 1.1 / 1.2)


def test_the_share_of_runs_that_reach_falls_with_staleness_beyond_the_references():
    m = model(policies={"asp": Reference("arrival", 9000.0, 32.0, 2.0, 0.5, 1.1, 8, 5)})
    # at or under the reference's staleness: its runs' share
    assert m.reach("asp", apply_mode="arrival", staleness=1.0) == pytest.approx(5 / 8)
    assert m.reach("asp", apply_mode="arrival", staleness=2.0) == pytest.approx(5 / 8)
    # twice its staleness: two like chances to diverge
    assert m.reach("asp", apply_mode="arrival", staleness=4.0) == pytest.approx((5 / 8) ** 2)
    # the mode's runs all reached: every run does, at any staleness
    assert m.reach("ssp", apply_mode="arrival", staleness=9.0) == 1.0
    # a reference without a run count says nothing
    bare = model(modes={"round": Reference("round", 8000.0, 128.0, 0.0)}, policies={})
    assert bare.reach("bsp", apply_mode="round", staleness=0.0) == 1.0
    # a fitted hazard decides, at any staleness
    fitted = model(policies={"asp": Reference("arrival", 9000.0, 32.0, 2.0, 0.5, 1.1, 8, 5,
                                              hazard=0.1)})
    assert fitted.reach("asp", apply_mode="arrival", staleness=1.0) == pytest.approx(
        math.exp(-0.1))
    assert fitted.reach("asp", apply_mode="arrival", staleness=6.0) == pytest.approx(
        math.exp(-0.6))
    doc = json.loads(json.dumps(fitted.to_json()))
    assert ConvergenceModel.from_json(doc).policies["asp"].hazard == 0.1
    # a file from before the hazard reads as not fitted
    del doc["policies"]["asp"]["hazard"]
    assert ConvergenceModel.from_json(doc).policies["asp"].hazard is None
    with pytest.raises(ConvergenceError, match="hazard"):
        Reference("arrival", 9000.0, 32.0, 2.0, hazard=-1.0)
    # lockstep runs: the share that did not fail, whatever ran out of budget
    counted = model(policies={"bsp": Reference("round", 8000.0, 128.0, 0.0, 0.9, 1.2, 8, 6,
                                               failed=1)})
    assert counted.reach("bsp", apply_mode="round", staleness=0.0) == pytest.approx(6 / 7)
    assert ConvergenceModel.from_json(json.loads(json.dumps(
        counted.to_json()))).policies["bsp"].failed == 1


def test_json_round_trip_and_errors():
    m = model(source={"command": "paramserver calibrate", "date": "2026-11-24"})
    back = ConvergenceModel.from_json(json.loads(json.dumps(m.to_json())))
    assert back == m
    wrapped = ConvergenceModel.from_json({"kind": "calibration", "convergence": m.to_json()})
    assert wrapped == m
    old = dict(m.to_json(), version=0)
    with pytest.raises(ConvergenceError, match="version 0"):
        ConvergenceModel.from_json(old)
    with pytest.raises(ConvergenceError, match="missing field 'b_crit'"):
        ConvergenceModel.from_json({k: v for k, v in m.to_json().items() if k != "b_crit"})
    bad = m.to_json()
    bad["modes"]["round"]["apply_mode"] = "sometimes"
    with pytest.raises(ConvergenceError, match="apply_mode"):
        ConvergenceModel.from_json(bad)
    with pytest.raises(ConvergenceError, match="unknown fields"):
        ConvergenceModel.from_json(dict(m.to_json(), extra=1))
    for key in ("alpha", "policies", "modes"):  # a list where name: value pairs belong
        with pytest.raises(ConvergenceError, match=f"'{key}' must be an object of name: value "
                                                   f"pairs, got list"):
            ConvergenceModel.from_json(dict(m.to_json(), **{key: []}))


def test_default_ships_and_predicts():
    m = default_convergence()
    for mode, b in (("round", 128), ("arrival", 32)):
        band = m.samples_needed("bsp" if mode == "round" else "asp", apply_mode=mode,
                                update_batch=b, staleness=1)
        assert band is not None and band.mid > 0
