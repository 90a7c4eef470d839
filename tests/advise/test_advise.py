"""`paramserver advise`: the cluster fit recovers known stragglers and links from synthetic
records, the simulated outcome matches what the cluster implies, the recommendation ranks and
says how sure it is, and the command answers bad input clearly. No sockets except the one live
test (marked slow)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from paramserver.advise.core.cluster import (
    ClusterFitError, ClusterModel, Profile, StepSample, TargetLink, fit,
)
from paramserver.predict.convergence import ConvergenceModel, Reference
from paramserver.advise.core.outcome import simulate_policy
from paramserver.advise.core.recommend import Candidate, Prediction, predict, recommend
from paramserver.cli.main import main

BYTES = 2_000_000


def synthetic(workers=8, steps=400, cost=0.5e-3, batch=32, slow=None, p=0.0, factor=1.0,
              sigma=0.05, rate=None, latency=0.0, fixed=0.002, seed=1,
              own_rate=None) -> Profile:
    """Step records of a known cluster: `slow` {worker: k}, transient p x factor, a shared
    link, and `own_rate` {worker: bytes/s} for workers on a slower link of their own."""
    rng = np.random.default_rng(seed)
    slow, own_rate = slow or {}, own_rate or {}
    rows = []
    for w in range(workers):
        for s in range(steps):
            c = batch * cost * slow.get(w, 1.0) * rng.lognormal(-sigma ** 2 / 2, sigma)
            if rng.random() < p:
                c *= factor
            tx = BYTES / own_rate[w] if w in own_rate else BYTES / rate if rate else 0.0
            rows.append(StepSample(w, s, batch, c, pull_s=fixed + tx + 2 * latency,
                                   push_s=fixed + tx + 2 * latency, pull_bytes=BYTES,
                                   push_bytes=BYTES, wait_s=0.001))
    return Profile(tuple(rows), "synthetic", workers, batch_size=batch, link_rate=rate,
                   link_latency=latency, model_bytes=BYTES)


def test_fit_recovers_a_persistent_straggler_and_transient_ones():
    m = fit(synthetic(slow={3: 3.0}, p=0.10, factor=4.0))
    assert len(m.classes) == 1
    assert m.classes[0].fraction == pytest.approx(1 / 8)
    assert m.classes[0].slowdown == pytest.approx(3.0, rel=0.05)
    assert m.transient_p == pytest.approx(0.10, abs=0.02)
    assert m.transient_factor == pytest.approx(4.0, rel=0.1)
    assert m.cost_per_sample == pytest.approx(0.5e-3, rel=0.05)
    assert m.sigma == pytest.approx(0.05, rel=0.25)


def test_fit_sees_no_straggler_in_a_noisy_even_cluster():
    m = fit(synthetic(sigma=0.2))
    assert m.classes == ()
    assert m.transient_p < 0.01
    assert m.sigma == pytest.approx(0.2, rel=0.2)


def test_two_slow_workers_are_one_class_and_the_base_stays_the_fast_workers():
    m = fit(synthetic(workers=4, slow={1: 3.0, 2: 3.0}))
    assert [(c.fraction, round(c.slowdown)) for c in m.classes] == [(0.5, 3)]
    assert m.cost_per_sample == pytest.approx(0.5e-3, rel=0.05)


def test_fit_takes_the_link_from_the_run_and_keeps_what_is_left_fixed():
    m = fit(synthetic(rate=12.5e6, latency=0.005, fixed=0.003))  # 100 Mbit/s, 5 ms
    assert m.link_rate == 12.5e6
    assert m.pull_fixed_s == pytest.approx(0.003, rel=0.01)
    assert m.push_fixed_s == pytest.approx(0.003, rel=0.01)
    # each step: pull and push, each a transfer and two latencies, plus the fixed costs
    assert m.link_comm() == pytest.approx(0.006 + 2 * BYTES / 12.5e6 + 0.02, rel=0.01)
    faster = m.link_comm(TargetLink(125e6, 0.0))  # 1 Gbit/s, no latency
    assert faster == pytest.approx(0.006 + 2 * BYTES / 125e6, rel=0.01)


def test_a_worker_on_a_slow_link_of_its_own_is_a_class_and_the_others_keep_their_link():
    # worker 5 on 80 Mbit/s (25 ms a transfer), the others on 1 Gbit/s; steps compute 16 ms
    m = fit(synthetic(rate=125e6, fixed=0.001, own_rate={5: 10e6}))
    own = 2 * (BYTES / 10e6 - BYTES / 125e6)
    assert len(m.classes) == 1
    c = m.classes[0]
    assert (c.fraction, c.slowdown) == (1 / 8, 1.0)
    assert c.comm_extra_s == pytest.approx(own, rel=0.02)
    # the shared link's fixed costs come from the workers on it, not the slow one
    assert m.pull_fixed_s == pytest.approx(0.001, rel=0.01)
    assert m.link_comm() == pytest.approx(0.002 + 2 * BYTES / 125e6, rel=0.01)
    p = m.at(8)
    assert p.comm_extras() == [0.0] * 7 + [c.comm_extra_s]
    assert p.multipliers() == [1.0] * 8
    assert "its link +" in " ".join(m.notes)
    # at 1,000 workers the share is kept, and the model file keeps the class
    assert sum(1 for x in m.at(1000).comm_extras() if x > 0) == 125
    assert ClusterModel.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_a_link_a_little_slower_or_a_small_share_of_the_step_is_not_a_class():
    # 1.2x the others' comm: noise, not a link of its own
    m = fit(synthetic(rate=125e6, fixed=0.001, own_rate={2: 125e6 / 1.2}))
    assert m.classes == ()
    # 10x the others' comm, but 0.3 ms against a 16 ms step: not worth a class
    m = fit(synthetic(fixed=0.0, rate=None, own_rate={2: 2 * BYTES / 3e-4}))
    assert m.classes == ()


def test_a_slow_worker_on_a_slow_link_is_one_class_with_both():
    m = fit(synthetic(slow={3: 3.0, 6: 2.0}, rate=125e6, own_rate={3: 10e6}))
    by_slowdown = {round(c.slowdown): c for c in m.classes}
    assert set(by_slowdown) == {2, 3}
    assert by_slowdown[3].comm_extra_s > 0.04 and by_slowdown[2].comm_extra_s == 0.0
    p = m.at(8)
    assert sorted(zip(p.multipliers(), p.comm_extras()))[-1] == (
        by_slowdown[3].slowdown, by_slowdown[3].comm_extra_s)
    assert m.to_sim(8)["compute"].startswith("classes:0.75=1,")


def test_one_slow_link_slows_bsp_but_not_the_other_workers_under_asp():
    m = fit(synthetic(workers=4, rate=125e6, fixed=0.0, sigma=0.0, own_rate={3: 10e6}))
    p = m.at(4)
    asp = simulate_policy(p, "asp", samples=32 * 4 * 200)
    bsp = simulate_policy(p, "bsp", samples=32 * 4 * 200)
    extra = m.classes[0].comm_extra_s
    shared = 32 * 0.5e-3 + 6 * p.coord_latency + 2 * p.server_s + p.comm_s
    # ASP: three workers at the shared link's pace and one at its own
    assert asp.samples_per_s == pytest.approx(32 * (3 / shared + 1 / (shared + extra)),
                                              rel=0.05)
    # BSP: every round waits for the slow link
    assert bsp.samples_per_s == pytest.approx(4 * 32 / (shared + extra), rel=0.05)


def test_a_slow_links_time_is_on_its_pull_and_push_not_in_its_compute():
    """As live: the time a worker's own slow link adds shows in its pull and push, so what a
    policy reads as the push's compute time (LB-BSP's split, auto's pace book) is its compute,
    and a fixed cost no smaller batch shortens looks like one. The slow push does not hold the
    shared queue for the pushes that reach it first."""
    from paramserver.advise.core.outcome import EarlyPullLinks
    from paramserver.sim.core.engine import Network
    links = EarlyPullLinks(Network(model_bytes=1e-3, bandwidth=1.0, latency=0.001),
                           [0.0, 0.4])
    got, pull_s = links.pull(1.0, 1, 0)
    assert (got, pull_s) == pytest.approx((1.201, 0.202))
    assert links.pull(1.0, 0, 0) == pytest.approx((1.001, 0.002))
    assert links.push(2.0, 1, 0) == pytest.approx(2.0 + 0.001 + 0.001 + 0.2)
    # the fast worker's push waits for one handling slot at most, not for the slow link
    assert links.push(2.0005, 0, 0) <= 2.0005 + 0.001 + 2 * 0.001 + 1e-9


def test_auto_simulated_on_a_profiles_slow_link_leaves_lockstep_at_its_first_look():
    """The cluster of a profile with one worker on a slow link of its own: the simulated auto
    leaves LB-BSP for ASP after its first rounds, as the live job does (its pace book sees the
    link's fixed cost), and runs about as fast as ASP."""
    m = fit(synthetic(workers=4, rate=125e6, fixed=0.0, sigma=0.0, own_rate={3: 10e6}))
    p = m.at(4)
    auto = simulate_policy(p, "auto", samples=32 * 4 * 200)
    asp = simulate_policy(p, "asp", samples=32 * 4 * 200)
    assert [x.policy for x in auto.stretches] == ["lbbsp", "asp"]
    assert auto.stretches[0].samples <= 4 * 32 * 4  # the first look: 4 steps a worker
    assert auto.samples_per_s == pytest.approx(asp.samples_per_s, rel=0.1)


def test_fit_regresses_a_rate_when_the_bytes_vary():
    rng = np.random.default_rng(0)
    rows = []
    for w in range(4):
        for s in range(100):
            b = float(rng.integers(100_000, 4_000_000))
            rows.append(StepSample(w, s, 32, 0.016, pull_s=0.001 + b / 25e6,
                                   push_s=0.001 + b / 25e6, pull_bytes=b, push_bytes=b))
    m = fit(Profile(tuple(rows), "varying", 4))
    assert m.link_rate == pytest.approx(25e6, rel=0.02)
    assert m.pull_fixed_s == pytest.approx(0.001, abs=2e-4)


def test_fit_refuses_a_profile_too_short_and_a_bad_record():
    with pytest.raises(ClusterFitError, match="usable step records"):
        fit(Profile((StepSample(0, 0, 32, 0.01), StepSample(0, 1, 32, 0.01)), "short", 1))
    with pytest.raises(ClusterFitError, match="bad batch or compute_s"):
        fit(Profile((StepSample(0, 0, 0, 0.01),), "bad", 1))


def test_a_larger_scale_keeps_the_fractions_and_the_model_round_trips_json():
    m = fit(synthetic(slow={3: 3.0, 7: 3.0}, p=0.1, factor=4.0))
    p = m.at(1000, servers=4)
    mult = p.multipliers()
    assert len(mult) == 1000 and sum(1 for x in mult if x > 2) == 250
    assert p.transient_p == m.transient_p and p.servers == 4
    assert ClusterModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    sim = m.to_sim(1000)
    assert sim["compute"].startswith("classes:0.75=1,0.25=3") and sim["workers"] == 1000
    kind, prob, factor = sim["straggler"].split(":")
    assert kind == "random" and float(prob) == pytest.approx(0.1, abs=0.02)
    with pytest.raises(ClusterFitError, match="version"):
        ClusterModel.from_json({**m.to_json(), "version": 99})


def test_bsp_is_paced_by_the_persistent_straggler_and_asp_by_the_sum_of_speeds():
    m = fit(synthetic(workers=4, slow={3: 3.0}, sigma=0.0, fixed=0.0))
    p = m.at(4)
    step = 32 * 0.5e-3
    bsp = simulate_policy(p, "bsp", samples=32 * 4 * 200)
    asp = simulate_policy(p, "asp", samples=32 * 4 * 200)
    overhead = 6 * p.coord_latency + 2 * p.server_s + p.comm_s
    assert bsp.samples_per_s == pytest.approx(4 * 32 / (3 * step + overhead), rel=0.05)
    speeds = 3 / (step + overhead) + 1 / (3 * step + overhead)
    assert asp.samples_per_s == pytest.approx(32 * speeds, rel=0.05)
    # BSP's fast workers wait for the straggler: 3 of 4 wait about 2/3 of each round
    assert bsp.wait_share == pytest.approx(0.75 * 2 / 3, abs=0.05)
    assert asp.wait_share < 0.1 and bsp.mean_staleness == 0 and asp.mean_staleness > 1
    assert bsp.update_batch == pytest.approx(128) and asp.update_batch == 32
    assert bsp.apply_mode == "round" and asp.apply_mode == "arrival"
    # the curve: time to half the samples is about half the run
    assert bsp.time_to(bsp.samples / 2) == pytest.approx(bsp.virtual_s / 2, rel=0.1)
    assert bsp.time_to(2 * bsp.samples) == pytest.approx(
        bsp.virtual_s + bsp.samples / bsp.samples_per_s, rel=0.01)


def test_transient_stragglers_slow_a_round_more_than_arrival():
    even = fit(synthetic(workers=8, sigma=0.0)).at(8)
    bumpy = fit(synthetic(workers=8, sigma=0.0, p=0.1, factor=4.0)).at(8)
    assert bumpy.transient_p > 0.05
    slowdown = {pol: simulate_policy(even, pol, samples=32 * 8 * 150).samples_per_s
                / simulate_policy(bumpy, pol, samples=32 * 8 * 150).samples_per_s
                for pol in ("bsp", "asp")}
    assert slowdown["bsp"] > slowdown["asp"] > 1.1


def _conv(**policies) -> ConvergenceModel:
    ref = Reference("arrival", 10_000.0, 32.0, 1.0, 0.9, 1.1, runs=3, reached=3)
    rnd = Reference("round", 10_000.0, 128.0, 0.0, 0.9, 1.1, runs=3, reached=3)
    return ConvergenceModel(1, 0.9, 256.0, {"arrival": 0.1, "round": 0.0}, dict(policies),
                            {"arrival": ref, "round": rnd})


def test_recommend_ranks_by_time_and_says_when_it_is_too_close_to_call():
    p = fit(synthetic(workers=4, slow={3: 3.0}, sigma=0.0)).at(4)
    outs = {pol: simulate_policy(p, pol, samples=20_000) for pol in ("bsp", "asp", "ssp")}
    preds = [predict(Candidate(pol), o, _conv()) for pol, o in outs.items()]
    rec = recommend(preds, 0.9)
    assert rec.pick.candidate.policy == "asp"
    mids = [x.time_s.mid for x in rec.ranked]
    assert mids == sorted(mids) and rec.ranked[0].time_s.mid < outs["bsp"].time_to(10_000)
    assert rec.confidence == "clear" and rec.margin > 1.2
    # the same prediction twice: bands overlap
    same = recommend([preds[1], Prediction(Candidate("asp2"), preds[1].outcome,
                                           preds[1].samples, preds[1].time_s)], 0.9)
    assert same.confidence == "too close to call"
    # a policy that never reached where it ran at this staleness: never, ranked last
    never = _conv(asp=Reference("arrival", None, 32.0, 0.5, runs=2))
    rec = recommend([predict(Candidate(pol), o, never) for pol, o in outs.items()], 0.9)
    assert rec.ranked[-1].candidate.policy == "asp" and rec.ranked[-1].time_s is None
    assert any("never" in r for r in rec.reasons)
    json.dumps(rec.to_json())


def test_a_candidate_that_may_not_reach_ranks_by_its_expected_time_or_is_never():
    p = fit(synthetic(workers=4, slow={3: 3.0}, sigma=0.0)).at(4)
    outs = {pol: simulate_policy(p, pol, samples=20_000) for pol in ("bsp", "asp")}
    stale = outs["asp"].mean_staleness

    def conv(reached, staleness):  # asp's own runs: `reached` of 8 at `staleness`
        return _conv(asp=Reference("arrival", 10_000.0, 32.0, staleness, 0.9, 1.1, runs=8,
                                   reached=reached))

    # every run reached: asp is faster (the straggler paces bsp) and picked
    sure = recommend([predict(Candidate(pol), o, conv(8, stale)) for pol, o in outs.items()],
                     0.9)
    assert sure.pick.candidate.policy == "asp" and sure.pick.reach == 1.0
    # 5 of 8 at twice the staleness the simulation shows: 62.5%, ranked by time / 0.625
    risky = [predict(Candidate(pol), o, conv(5, 2 * stale)) for pol, o in outs.items()]
    asp = next(x for x in risky if x.candidate.policy == "asp")
    assert asp.reach == pytest.approx(5 / 8)
    assert asp.expected_s.mid == pytest.approx(asp.time_s.mid / 0.625)
    rec = recommend(risky, 0.9)
    assert any("about 62% of runs" in r for r in rec.reasons)
    bsp = next(x for x in risky if x.candidate.policy == "bsp")
    assert (rec.pick is bsp) == (bsp.time_s.mid < asp.time_s.mid / 0.625)
    # 5 of 8 at a third of the staleness: 0.625 ** 3 = 24% reach, under half: never
    never = predict(Candidate("asp"), outs["asp"], conv(5, stale / 3))
    assert never.time_s is None and never.reach == pytest.approx(0.625 ** 3, rel=0.01)
    rec = recommend([never, bsp], 0.9)
    assert rec.pick is bsp and rec.ranked[-1] is never
    assert any("predicted never" in r and "about 24% of runs" in r for r in rec.reasons)
    assert json.loads(json.dumps(rec.to_json()))["ranked"][-1]["reach"] == pytest.approx(
        0.625 ** 3, rel=0.01)


def test_a_fixed_policys_prediction_is_its_samples_needed_read_off_its_curve():
    p = fit(synthetic(workers=4, slow={3: 3.0}, sigma=0.0)).at(4)
    conv = _conv()
    for pol in ("bsp", "asp"):
        o = simulate_policy(p, pol, samples=20_000)
        assert [x.policy for x in o.stretches] == [pol]
        assert o.stretches[0].samples == o.samples
        need = conv.samples_needed(pol, apply_mode=o.apply_mode, update_batch=o.update_batch,
                                   staleness=o.mean_staleness)
        pred = predict(Candidate(pol), o, conv)
        assert pred.samples == need
        assert pred.time_s.mid == pytest.approx(o.time_to(need.mid))


def test_a_run_that_changes_policy_moves_by_each_stretchs_share_of_the_way():
    from paramserver.advise.core.outcome import SimOutcome, Stretch
    # ssp needs 4,000 samples there, bsp 2,000 (the model's references, no staleness price)
    conv = ConvergenceModel(1, 0.9, 1e12, {"arrival": 0.0, "round": 0.0}, {}, {
        "arrival": Reference("arrival", 4_000.0, 32.0, 0.0, 0.9, 1.1, runs=3, reached=3),
        "round": Reference("round", 2_000.0, 128.0, 0.0, 0.8, 1.25, runs=3, reached=3)})

    def run(*stretches):
        total = sum(x.samples for x in stretches)
        return SimOutcome("auto", {}, "arrival", 4, int(total), 1, 10.0, total / 10.0, 0.0,
                          32.0, 0.0, (10.0,), (total,), 1, tuple(stretches))

    ssp = Stretch("ssp", "arrival", 1_000.0, 0.0, 32.0)
    bsp = Stretch("bsp", "round", 5_000.0, 0.0, 128.0)
    # a quarter of the way under ssp, the rest (0.75 x 2,000) under bsp
    pred = predict(Candidate("auto"), run(ssp, bsp), conv)
    assert pred.samples.mid == pytest.approx(2_500.0)
    # each edge of the band walks the stretches with its own needs
    assert pred.samples.lo == pytest.approx(1_000 + (1 - 1_000 / 3_600) * 1_600)
    assert pred.samples.hi == pytest.approx(1_000 + (1 - 1_000 / 4_400) * 2_500)
    assert pred.time_s.mid == pytest.approx(10.0 * 2_500 / 6_000)  # read off its curve
    # the run ends before the target: it goes on under its last policy
    short = predict(Candidate("auto"), run(Stretch("bsp", "round", 500.0, 0.0, 128.0),
                                           Stretch("ssp", "arrival", 1_000.0, 0.0, 32.0)), conv)
    assert short.samples.mid == pytest.approx(1_500 + (1 - 0.25 - 0.25) * 4_000)
    # a run that ends under a policy predicted never to reach: never
    never = ConvergenceModel(1, 0.9, 1e12, {"arrival": 0.0, "round": 0.0},
                             {"ssp": Reference("arrival", None, 32.0, 0.0, runs=2)},
                             dict(conv.modes))
    assert predict(Candidate("auto"), run(bsp, ssp), never).time_s is None
    # the share that reaches: each stretch's, to the power of the share of the way it made
    # (ssp's runs reached in 1 of 2, bsp's in all: a quarter of the way under ssp)
    risky = ConvergenceModel(1, 0.9, 1e12, {"arrival": 0.0, "round": 0.0}, {}, {
        "arrival": Reference("arrival", 4_000.0, 32.0, 0.0, 0.9, 1.1, runs=2, reached=1),
        "round": conv.modes["round"]})
    assert predict(Candidate("auto"), run(ssp, bsp), risky).reach == pytest.approx(0.5 ** 0.25)


def test_auto_is_simulated_as_the_candidates_it_puts_in_force():
    # one chronic straggler: auto starting with BSP moves to LB-BSP
    p = fit(synthetic(workers=4, slow={3: 3.0}, sigma=0.02, fixed=0.0)).at(4)
    o = simulate_policy(p, "auto", {"candidates": "bsp,lbbsp", "interval": 0.5},
                        samples=32 * 4 * 400)
    assert [x.policy for x in o.stretches] == ["bsp", "lbbsp"]
    assert sum(x.samples for x in o.stretches) == o.samples
    assert all(x.apply_mode == "round" and x.update_batch == pytest.approx(128, rel=0.05)
               for x in o.stretches)
    pred = predict(Candidate("auto"), o, _conv())
    bsp = predict(Candidate("bsp"), simulate_policy(p, "bsp", samples=32 * 4 * 400), _conv())
    assert pred.time_s.mid < 0.8 * bsp.time_s.mid


def _csv(tmp_path, profile: Profile):
    path = tmp_path / "trace.csv"
    lines = ["worker,step,compute_s,batch,pull_s,push_s,bytes"]
    lines += [f"{s.worker},{s.step},{s.compute_s},{s.batch},{s.pull_s},{s.push_s},"
              f"{s.pull_bytes}" for s in profile.steps]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_advise_on_a_trace_writes_a_typed_versioned_advice(tmp_path, capsys):
    trace = _csv(tmp_path, synthetic(workers=4, steps=60, slow={2: 3.0}))
    rc = main(["advise", "--profile", str(trace), "--workers", "16", "--link", "1gbit/1ms",
               "--policies", "bsp,asp,ssp", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads((tmp_path / "advise.json").read_text())
    assert doc["kind"] == "paramserver advise" and doc["version"] == 1
    assert doc["scale"]["workers"] == 16
    ranked = doc["recommendation"]["ranked"]
    assert {r["policy"] for r in ranked} == {"bsp", "asp", "ssp"} and len(ranked) == 5
    assert doc["recommendation"]["pick"] in out and "time to target" in out
    assert doc["cluster"]["classes"] == [{"fraction": 0.25, "slowdown": 3.0, "comm_extra_s": 0.0}]


def test_advise_ranks_auto_beside_the_fixed_policies(tmp_path, capsys):
    trace = _csv(tmp_path, synthetic(workers=4, steps=60, slow={2: 3.0}))
    rc = main(["advise", "--profile", str(trace), "--policies", "bsp,auto", "--out",
               str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    ranked = {r["policy"]: r for r in json.loads(
        (tmp_path / "advise.json").read_text())["recommendation"]["ranked"]}
    assert set(ranked) == {"bsp", "auto"}
    stretches = ranked["auto"]["stretches"]
    assert stretches[0]["policy"] == "lbbsp" and ranked["auto"]["time_to_target_s"]["mid"] > 0
    assert [x["policy"] for x in ranked["bsp"]["stretches"]] == ["bsp"]
    assert "auto" in out


@pytest.mark.parametrize("argv, message", [
    (["--profile", "/nonexistent/run"], "does not exist"),
    (["--profile", "{tmp}/bad.csv"], "CSV header needs"),
    (["--profile", "{tmp}/bad.txt"], "neither a run folder nor a .csv"),
    (["--profile", "{tmp}", "--policies", "nope"], "nope"),
    (["--profile", "{tmp}"], "no metrics.jsonl"),
    (["--profile", "{tmp}/trace.csv", "--target", "0.5"], "not 0.5"),
    (["--profile", "{tmp}/trace.csv", "--calibration", "{tmp}/bad.csv"], "not JSON"),
])
def test_advise_answers_bad_input_with_a_clear_error(tmp_path, capsys, argv, message):
    (tmp_path / "bad.csv").write_text("who,what\n1,2\n")
    (tmp_path / "bad.txt").write_text("x")
    _csv(tmp_path, synthetic(workers=2, steps=10))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = main(["advise", *argv, "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_the_target_link_reads_rate_slash_latency():
    from paramserver.advise.core.cluster import TargetLink
    from paramserver.cli.advise_cmd import target_link
    assert target_link("100mbit/5ms") == TargetLink(12.5e6, 0.005)
    assert target_link("10Gbit/s/1ms") == TargetLink(1.25e9, 0.001)
    assert target_link("1gbit,2ms") == TargetLink(125e6, 0.002)
    assert target_link("unlimited") == TargetLink(None, 0.0)


def test_advise_help_is_true():
    run = subprocess.run([sys.executable, "-m", "paramserver", "advise", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    for flag in ("--profile", "--live", "--script", "--workers", "--link", "--target",
                 "--calibration", "too close to call", "advise.json"):
        assert flag in run.stdout


@pytest.mark.slow
def test_advise_profiles_a_live_run_folder_end_to_end(tmp_path):
    """A real `paramserver train` run with a 3x straggler: the fit finds it, and the simulated
    BSP run at the same scale keeps the live run's pace."""
    run = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "-m", "paramserver", "train", "--sync", "bsp", "--workers", "3",
         "--straggler", "1:3", "--device-time", "0.5ms", "--epochs", "2", "--eval-interval",
         "0", "--quiet", "--out", str(run)], capture_output=True, text=True, timeout=240)
    assert train.returncode == 0, train.stderr
    out = tmp_path / "advice"
    adv = subprocess.run([sys.executable, "-m", "paramserver", "advise", "--profile", str(run),
                          "--policies", "bsp,asp", "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=240)
    assert adv.returncode == 0, adv.stderr
    doc = json.loads((out / "advise.json").read_text())
    assert [(c["fraction"], round(c["slowdown"])) for c in doc["cluster"]["classes"]] == \
        [(pytest.approx(1 / 3), 3)]
    live = json.loads((run / "summary.json").read_text())
    bsp = next(r for r in doc["recommendation"]["ranked"] if r["policy"] == "bsp")
    live_rate = live["samples"] / live["wall_time_s"]
    assert bsp["samples_per_s"] == pytest.approx(live_rate, rel=0.3)
    assert math.isfinite(bsp["wait_share"])


def test_fit_reads_the_warm_up_and_the_unrecorded_time_off_the_records_clock():
    rows = []
    for w in range(3):
        t = 0.2  # warm-up before the first step
        for s in range(50):
            t += 0.016 + 0.002 + 0.002 + 0.001 + 0.003  # parts, then 3 ms no field records
            rows.append(StepSample(w, s, 32, 0.016, pull_s=0.002, push_s=0.002,
                                   pull_bytes=BYTES, push_bytes=BYTES, wait_s=0.001, t=t))
    m = fit(Profile(tuple(rows), "paced", 3, model_bytes=BYTES))
    assert m.startup_s == pytest.approx(0.2, abs=1e-6)
    assert m.unrecorded_s == pytest.approx(0.003, abs=1e-6)
    p = m.at(3)
    asp = simulate_policy(p, "asp", samples=32 * 3 * 50)
    assert asp.virtual_s == pytest.approx(rows[-1].t, rel=0.03)


def test_a_run_of_a_users_script_without_compute_s_is_timed_by_its_records_clock(tmp_path):
    from paramserver.advise.profile import load_profile
    (tmp_path / "config.json").write_text(json.dumps(
        {"config": {}, "job": {"workers": 2, "servers": 1, "batch_size": 16,
                               "sync": {"name": "asp"}}}))
    lines = []
    for w, compute in ((0, 0.02), (1, 0.06)):
        t = 0.0
        for s in range(20):
            t += compute + 0.001 + 0.004
            lines.append(json.dumps({"t": t, "kind": "step", "worker": w, "step": s,
                                     "batch": 16, "wait_s": 0.001, "push_s": 0.004}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    profile = load_profile(tmp_path)
    assert len(profile.steps) == 38  # each worker's first record has no previous one
    m = fit(profile)
    assert m.cost_per_sample == pytest.approx(0.02 / 16, rel=1e-3)
    assert [(c.fraction, round(c.slowdown, 2)) for c in m.classes] == [(0.5, 3.0)]


def test_advise_link_takes_trains_grammar_and_the_old_slash_form():
    from paramserver.cli.advise_cmd import _link
    assert _link("100mbit,5ms") == _link("100mbit/5ms")
    assert _link("100mbit,5ms").rate == pytest.approx(12.5e6)
    assert _link("100mbit,5ms").latency == pytest.approx(0.005)
    assert _link("10Gbit/s").rate == pytest.approx(1.25e9) and _link("10Gbit/s").latency == 0
    assert _link("unlimited").rate is None
    with pytest.raises(ValueError):
        _link("fast")


def device_profile(workers=4, steps=300, device=0.5e-3, batch=32, slow=None, seed=2,
                   overrun=0.05, over=(1.2, 2.0)):
    """Records of emulated device time as the runtime writes them: compute_s = max(device x
    batch x factor, real compute), real compute per sample heavy-tailed around a fifth of the
    device time (a share `overrun` of the steps overruns it, by `over` x)."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    rows = []
    for w in range(workers):
        for s in range(steps):
            real = batch * device * (0.2 if rng.random() > overrun else rng.uniform(*over))
            c = max(batch * device * slow.get(w, 1.0), real)
            rows.append(StepSample(w, s, batch, c, pull_s=0.001, push_s=0.001,
                                   pull_bytes=BYTES, push_bytes=BYTES, wait_s=0.001,
                                   real_compute_s=real))
    return Profile(tuple(rows), "synthetic", workers, batch_size=batch, model_bytes=BYTES,
                   device_s_per_sample=device)


def test_fit_of_emulated_device_time_keeps_real_compute_apart_from_the_stragglers():
    m = fit(device_profile(slow={1: 3.0}))
    # the device-bound steps are exact: no noise, no transient stragglers from the overruns
    assert m.cost_per_sample == pytest.approx(0.5e-3, rel=1e-6)
    assert m.sigma == pytest.approx(0.0, abs=1e-6) and m.transient_p == 0.0
    assert [(c.fraction, c.slowdown) for c in m.classes] == [(0.25, 3.0)]
    # the overruns are real compute: 5% of the draws above the device time
    q = np.array(m.real_per_sample)
    assert np.mean(q > 0.5e-3) == pytest.approx(0.05, abs=0.04)
    assert ClusterModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    # without the device time the same records read as noise and transient stragglers
    plain = fit(Profile(device_profile().steps, "synthetic", 4, batch_size=32,
                        model_bytes=BYTES))
    assert plain.real_per_sample == () and plain.transient_p > 0.01


def test_simulated_step_is_the_max_of_device_time_and_real_compute():
    p = fit(device_profile(slow={1: 3.0}, overrun=0.3, over=(1.5, 2.5))).at(4)
    every = simulate_policy(p, "asp", samples=4 * 32 * 300, seed=3)
    # asp: each worker at its own pace; the slow worker's 3x device time is never overrun
    # and never multiplied by an overrun, the fast workers pay theirs (30% of steps, 2x)
    comm = p.comm_s + 6 * p.coord_latency + 2 * p.server_s
    fast = 32 * 0.5e-3 * (1 + 0.3 * 1.0) + comm
    slow = 32 * 1.5e-3 + comm
    want = 3 * 32 / fast + 32 / slow
    assert every.samples_per_s == pytest.approx(want, rel=0.05)
    # bsp: a round waits for the slow worker, whose 48 ms the fast ones' overruns (32 ms at
    # most) never pass
    rounds = simulate_policy(p, "bsp", samples=4 * 32 * 100, seed=3)
    assert 4 * 32 / rounds.samples_per_s == pytest.approx(slow, rel=0.03)


def test_round_mode_pulls_queue_behind_no_other_pull():
    # Four workers released at once: the live train task's early pull was answered when the
    # round applied, so only their pushes queue on the server (1 ms each).
    from paramserver.advise.core.cluster import SimParams
    p = SimParams(workers=4, servers=1, batch_size=1, cost_per_sample=0.010, sigma=0.0,
                  classes=(), transient_p=0.0, transient_factor=1.0, comm_s=0.0,
                  coord_latency=0.0, server_s=0.001)
    out = simulate_policy(p, "bsp", steps=50)
    # a round: compute 10 ms + its own pull's handling 1 ms + four pushes queued 4 ms
    assert 4 / out.samples_per_s == pytest.approx(0.015, rel=0.01)


def test_communication_jitter_keeps_even_workers_out_of_step():
    import dataclasses
    rng = np.random.default_rng(5)
    rows = [StepSample(w, s, 32, 0.016, pull_s=0.001 * rng.lognormal(0, 0.4),
                       push_s=0.002 * rng.lognormal(0, 0.4), pull_bytes=BYTES,
                       push_bytes=BYTES, wait_s=0.001)
            for w in range(4) for s in range(200)]
    m = fit(Profile(tuple(rows), "synthetic", 4, batch_size=32, model_bytes=BYTES))
    assert m.comm_scale == pytest.approx(0.003, rel=0.15)
    assert 0.2 < m.comm_sigma < 0.5
    p = m.at(4)
    # four workers of one speed under ASP: live each push sees nearly all the others (2.8-2.9
    # at compare's defaults); in lockstep the simulator would say half of them
    jittery = simulate_policy(p, "asp", samples=4 * 32 * 300, seed=1).mean_staleness
    lockstep = simulate_policy(dataclasses.replace(p, comm_sigma=0.0), "asp",
                               samples=4 * 32 * 300, seed=1).mean_staleness
    assert lockstep < 1.8 < 2.2 < jittery


@pytest.mark.parametrize("script,says", [
    ("", "--script '': no command: give the worker command"),
    ("no_such_program_here x", "no program 'no_such_program_here' on PATH"),
    ("python 'unclosed", "--script \"python 'unclosed\": No closing quotation"),
])
def test_a_script_that_cannot_start_is_refused_before_the_profiling_run(script, says,
                                                                       tmp_path, capsys):
    """(An empty --script started a 15 s profiling job that failed with 'Permission denied',
    leaving its folder; a missing program did the same with 'No such file or directory'.)"""
    out = tmp_path / "adv"
    assert main(["advise", "--script", script, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_profiling_run_takes_the_data_dir_and_runs_a_bare_python_as_launch_does(
        tmp_path, monkeypatch, capsys):
    """A bare `python` in --script ran whatever python PATH found first (one without torch
    unless the venv was activated), where launch runs this interpreter; --data-dir was not
    taken, so a live profile of --dataset mnist could not find its files."""
    import sys

    from paramserver.advise import profile
    seen = []

    def stop_here(spec, quiet=True):
        seen.append(spec)
        raise profile.ProfileError("stopped by the test")
    monkeypatch.setattr(profile, "profile_live", stop_here)
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["advise", "--script", f"python {script} --epochs 1", "--out",
                 str(tmp_path / "a"), "--quiet"]) == 2
    assert seen[-1].command == (sys.executable, str(script), "--epochs", "1")
    assert main(["advise", "--live", "--dataset", "mnist", "--data-dir", str(tmp_path),
                 "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert seen[-1].data_dir == str(tmp_path) and seen[-1].dataset == "mnist"
    assert "stopped by the test" in capsys.readouterr().err


def test_a_live_profile_of_mnist_without_its_files_says_which_are_missing(tmp_path, capsys):
    assert main(["advise", "--live", "--dataset", "mnist", "--data-dir",
                 str(tmp_path / "nowhere"), "--profile-seconds", "1", "--out",
                 str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paramserver advise: MNIST files missing from") and "Traceback" \
        not in err, err


def test_autos_arrival_stretches_converge_as_the_arrival_mode_runs_not_as_fixed_asp():
    """auto scales its asp pushes to a round's step; fixed ASP's calibrated runs (full-size
    stale pushes) diverge at this staleness, the arrival-mode runs as a whole do not. A fixed
    ASP run is read by ASP's own runs, auto's ASP stretch by the mode's."""
    from paramserver.advise.core.outcome import SimOutcome, _stretches
    conv = ConvergenceModel(1, 0.9, 1e12, {"arrival": 0.0, "round": 0.0},
                            {"asp": Reference("arrival", 6_000.0, 32.0, 3.0, 0.9, 1.1, runs=4,
                                              reached=1, hazard=0.5)},
                            {"arrival": Reference("arrival", 4_000.0, 32.0, 3.0, 0.9, 1.1,
                                                  runs=9, reached=9, hazard=0.0),
                             "round": Reference("round", 2_000.0, 128.0, 0.0, 0.8, 1.25,
                                                runs=3, reached=3)})

    def run(policy, stretches):
        total = sum(x.samples for x in stretches)
        return SimOutcome(policy, {}, "arrival", 4, int(total), 1, 10.0, total / 10.0, 0.0,
                          32.0, 0.0, (10.0,), (total,), 1, tuple(stretches))

    fixed = _stretches([["asp", 8_000.0, 250, 750]], "asp", "arrival", 32.0, 4)
    assert fixed[0].reference == "asp"
    assert predict(Candidate("asp"), run("asp", fixed), conv).time_s is None  # e^-1.5 < 0.5
    auto = _stretches([["lbbsp", 1_000.0, 8, 0], ["asp", 7_000.0, 219, 657]], "auto",
                      "arrival", 32.0, 4)
    assert [x.reference for x in auto] == ["lbbsp", ""]
    pred = predict(Candidate("auto"), run("auto", auto), conv)
    assert pred.reach == 1.0 and pred.samples.mid < 6_000
