"""The auto policy (issue 39): the candidate in force follows the stragglers, switched at drained
points; the forecast behind each switch; the lockstep candidates' rounds, named for the servers.

The policy runs through the deterministic driver (virtual time), which checks the protocol as
the host sees it: every release names the step its worker is at, none goes to a worker still
computing, nobody waits forever.
"""

from __future__ import annotations

import random

import pytest

from paramserver.advise.calibration_io import default_convergence
from paramserver.policies import AutoSync, PolicyHost, make_policy
from paramserver.policies.forecast import SHIPPED, SamplesCurve, outlook
from paramserver.policies.pace import Pace, PaceBook
from policy_driver import VirtualWorker, run

BATCH = 16


def switches(trace) -> list[tuple[float, dict]]:
    return [(t, n.data) for t, n in trace.notes if n.kind == "sync_switch"]


def slow_worker(worker: int, factor: float, until: float = float("inf"), steps: int = 300):
    def cost(step, batch, now):
        return 0.001 * batch * (factor if now < until else 1.0)
    return VirtualWorker(worker, steps=steps, cost=cost)


def test_shipped_references_are_the_calibration_files():
    shipped = default_convergence()
    assert SHIPPED.b_crit == shipped.b_crit and SHIPPED.target == shipped.target
    assert SHIPPED.alpha == shipped.alpha
    assert SHIPPED.modes == shipped.modes


@pytest.mark.parametrize("candidates,first", [(None, "lbbsp"), ("bsp,lbbsp,ssp", "bsp")])
def test_homogeneous_workers_keep_the_first_candidate(candidates, first):
    options = {"candidates": candidates} if candidates else {}
    trace = run(make_policy("auto", BATCH, interval=0.05, **options),
                [VirtualWorker(w, steps=200, cost=0.001) for w in range(4)])
    assert [d["to"] for _, d in switches(trace)] == [first]


def test_a_chronic_straggler_moves_bsp_to_lbbsp_and_its_batch_shrinks():
    policy = make_policy("auto", BATCH, interval=0.05, candidates="bsp,lbbsp,ssp")
    workers = [VirtualWorker(w, steps=200, cost=0.001) for w in range(3)]
    trace = run(policy, workers + [slow_worker(3, 4.0)])
    moves = switches(trace)
    assert [d["to"] for _, d in moves] == ["bsp", "lbbsp"]
    t, why = moves[1]
    assert why["from"] == "bsp" and why["gain"] > 0.15
    assert why["forecast"]["lbbsp"]["samples_per_s"] > 2 * why["forecast"]["bsp"]["samples_per_s"]
    assert "4.00x the median step" in why["reason"]
    together = max(p.time for p in trace.pushes if p.worker == 0)  # then the fast ones leave
    after = [r for r in trace.releases if t + 0.5 < r.decided < together]
    slow = [r.batch_size for r in after if r.worker == 3]
    fast = [r.batch_size for r in after if r.worker == 0]
    assert slow and max(slow) * 3 <= min(fast)  # about a quarter of a fast worker's
    # From the first LB-BSP round on: its predictors start from the speeds auto measured.
    first = {r.worker: r.batch_size for r in trace.releases if r.decided == t}
    assert sorted(first) == [0, 1, 2, 3] and first[3] * 3 <= first[0]


@pytest.mark.parametrize("margin,moves", [(0.05, ["bsp", "lbbsp"]), (0.5, ["bsp"])])
def test_the_margin_holds_off_a_small_gain(margin, moves):
    """A 1.25x straggler: LB-BSP's forecast is about 1.2x BSP's, under a 0.5 margin."""
    workers = [VirtualWorker(w, steps=200, cost=0.001) for w in range(3)]
    trace = run(make_policy("auto", BATCH, interval=0.05, margin=margin,
                            candidates="bsp,lbbsp"), workers + [slow_worker(3, 1.25)])
    assert [d["to"] for _, d in switches(trace)] == moves


@pytest.mark.parametrize("candidates,to", [("bsp,lbbsp,ssp,asp", "asp"),
                                           ("bsp,lbbsp,ssp", "ssp")])
def test_transient_slowdowns_leave_lockstep(candidates, to):
    """Each step of each worker is 5x slow one time in four, at random: a round waits for
    its slowest step and LB-BSP cannot predict it; SSP and ASP absorb it. (With the workers
    alike on average they forecast the same staleness, and ASP the higher throughput.)"""
    def jitter(w):
        def cost(step, batch, now):
            slow = random.Random(w * 7919 + step).random() < 0.25
            return 0.001 * batch * (5.0 if slow else 1.0)
        return VirtualWorker(w, steps=300, cost=cost)
    trace = run(make_policy("auto", BATCH, interval=0.1, candidates=candidates),
                [jitter(w) for w in range(4)])
    moves = switches(trace)
    assert [d["to"] for _, d in moves][:2] == ["bsp", to]
    assert moves[1][1]["forecast"]["lbbsp"]["samples_per_s"] < \
        moves[1][1]["forecast"][to]["samples_per_s"]


@pytest.mark.parametrize("candidates,to", [(None, "asp"), ("lbbsp,bsp,ssp", None)])
def test_a_worker_whose_every_step_waits_on_its_link_moves_lockstep_to_asp(candidates, to):
    """Worker 3 computes as fast as the others but each of its steps waits 0.3 s more on its
    own link (outside its compute time): no batch split shortens that, so every lockstep round
    and SSP's bound wait on it. Only ASP runs the others at their own pace, and it is a
    default candidate; without it auto stays where it started."""
    workers = [VirtualWorker(w, steps=150, cost=0.001) for w in range(3)]
    slow_link = VirtualWorker(3, steps=40, cost=0.001, overhead=0.3)
    options = {} if candidates is None else {"candidates": candidates}
    trace = run(make_policy("auto", BATCH, interval=0.5, **options), workers + [slow_link])
    moves = [d["to"] for _, d in switches(trace)]
    assert moves == ["lbbsp"] + ([to] if to else [])
    if to:
        why = switches(trace)[1][1]
        assert why["forecast"]["asp"]["samples_per_s"] > 2 * why["forecast"]["lbbsp"][
            "samples_per_s"]


def test_no_step_starts_during_the_drain_and_steps_go_on():
    """A switch asked while workers are mid-step: nobody is released until the last of them
    pushed, then everyone at once, each at the step it is at (the driver checks the steps)."""
    policy = make_policy("auto", BATCH, interval=0.05, candidates="asp,bsp,lbbsp")
    workers = [VirtualWorker(w, steps=150, cost=0.001 * (1 + w)) for w in range(4)]
    trace = run(policy, workers)
    moves = switches(trace)
    assert len(moves) >= 2 and moves[1][1]["from"] == "asp"
    t, why = moves[1]
    asked = why["asked_at"]
    assert why["drain_s"] > 0  # asp had steps in flight when it was asked
    assert not [r for r in trace.releases if asked < r.started < t]
    together = [r for r in trace.releases if r.started == t]
    assert sorted(r.worker for r in together) == [0, 1, 2, 3]
    for w in range(4):
        steps = [p.step for p in trace.pushes if p.worker == w]
        assert steps == list(range(len(steps)))  # no step lost, none twice


@pytest.mark.parametrize("slow", [1.0, 3.0])
def test_a_lockstep_round_is_named_for_the_servers_to_sum_it(slow):
    """Under bsp or lbbsp a round's releases name one round id, new for each round; its
    pushes go unscaled (the shards weight them by batch, as round mode does) and each round
    closed comes out as an ApplyRound of that id, so a stateful rule takes one step a round."""
    policy = make_policy("auto", BATCH, interval=0.05, candidates="bsp,lbbsp")
    workers = [VirtualWorker(w, steps=120, cost=0.001) for w in range(3)]
    trace = run(policy, workers + [slow_worker(3, slow, steps=120)])
    rounds: dict[int, list] = {}
    for r in trace.releases:
        rounds.setdefault(r.round_id, []).append(r)
    assert 0 not in rounds and len(rounds) > 100
    assert sorted(rounds) == list(range(1, len(rounds) + 1))  # one id a round, in order
    full = [rs for rs in rounds.values() if len(rs) == 4]
    assert len(full) > 100  # (the driver joins the workers one by one: the first waits alone)
    for rs in full:
        assert {r.scale for r in rs} == {1.0}
        assert len({r.decided for r in rs}) == 1  # released together
    applied = [d.step for _, d in trace.rounds]
    assert applied == sorted(set(applied)) and set(applied) >= {min(rounds), max(rounds) - 1}
    if slow > 1:
        assert any(len({r.batch_size for r in rs}) > 1 for rs in full)
    # a round's pushes move no version (the servers sum them): no lockstep push is stale
    assert {p.staleness for p in trace.pushes} == {0}


def test_round_ids_go_on_across_switches_and_the_drained_round_is_applied():
    """A switch away from lockstep applies the round it drained; a later lockstep stretch
    numbers its rounds after every id used before, so no shard takes a new round's pushes
    for an old one."""
    policy = make_policy("auto", BATCH, interval=0.05, margin=0.0, candidates="bsp,asp")
    workers = [VirtualWorker(w, steps=200, cost=0.001) for w in range(3)]
    trace = run(policy, workers + [slow_worker(3, 5.0, until=0.6, steps=200)])
    moves = [(t, why["from"], why["to"]) for t, why in switches(trace)][1:]
    assert [m[1:] for m in moves[:2]] == [("bsp", "asp"), ("asp", "bsp")]
    ids = [r.round_id for r in trace.releases if r.round_id]
    assert ids == sorted(ids)  # never numbered again
    to_asp = moves[0][0]
    before = max(r.round_id for r in trace.releases if r.round_id and r.decided <= to_asp)
    after = min(r.round_id for r in trace.releases if r.round_id and r.decided > to_asp)
    assert after > before
    # the round drained at the switch is applied then, before the asp releases go out
    assert any(t == to_asp and d.step == before for t, d in trace.rounds)
    assert not [r for r in trace.releases if r.round_id and moves[0][0] < r.decided
                < moves[1][0]]


@pytest.mark.parametrize("candidates", ["asp", "ssp"])
def test_free_running_pushes_are_scaled_to_one_workers_share(candidates):
    """Under ssp and asp each push counts 1/N, so N pushes move the parameters as far as one
    lockstep round: the learning rate means the same whichever candidate is in force."""
    trace = run(make_policy("auto", BATCH, candidates=candidates),
                [VirtualWorker(w, steps=20, cost=0.001 * (1 + w)) for w in range(4)])
    first_leave = min(t for t, _, _ in trace.left)
    scales = [r.scale for r in trace.releases if 0 < r.decided < first_leave]
    assert len(scales) > 20 and scales == pytest.approx([0.25] * len(scales))
    # with fewer workers a push's share grows: still one round's worth per N pushes (under
    # asp the fast workers finish well before the slow one)
    assert candidates == "ssp" or any(r.scale == pytest.approx(1 / 3) for r in trace.releases
                                      if r.decided > first_leave)


@pytest.mark.parametrize("candidates", ["asp", "ssp"])
def test_beside_a_staleness_aware_rule_free_running_pushes_go_as_they_come(candidates):
    """discount=rule: the servers' rule (dynsgd) discounts each push by its staleness, as it
    does for fixed SSP; auto scaling them too would discount them twice."""
    trace = run(make_policy("auto", BATCH, candidates=candidates, discount="rule"),
                [VirtualWorker(w, steps=20, cost=0.001 * (1 + w)) for w in range(4)])
    assert trace.releases and {r.scale for r in trace.releases} == {1.0}


def test_auto_beside_a_staleness_aware_rule_leaves_the_discount_to_it():
    from paramserver.spec.config import TrainConfig
    from paramserver.spec.job import JobSpec

    def options(**kw):
        return dict(JobSpec.from_config(TrainConfig(**kw), 100, 1000).sync.options)

    assert options(sync="auto", optimizer="dynsgd") == {"discount": "rule"}
    assert options(sync="auto", optimizer="sgd") == {}
    assert options(sync="auto", optimizer="dynsgd", sync_options={"discount": "share"}) == {
        "discount": "share"}  # said outright: kept
    assert options(sync="ssp", optimizer="dynsgd") == {}
    with pytest.raises(ValueError, match="discount must be one of share, rule"):
        make_policy("auto", BATCH, discount="half")


def test_resume_goes_on_with_the_candidate_in_force():
    policy = make_policy("auto", BATCH, interval=0.05, candidates="bsp,lbbsp")
    run(policy, [VirtualWorker(w, steps=100, cost=0.001) for w in range(3)]
        + [slow_worker(3, 4.0, steps=100)])
    state = policy.resume_state()
    assert state["current"] == "lbbsp" and state["switches"] == 1
    again = make_policy("auto", BATCH, candidates="bsp,lbbsp")
    again.resume(state)
    assert again.current == "lbbsp" and again.inner.round == state["inner"]["round"]
    with pytest.raises(ValueError, match="not among the candidates"):
        make_policy("auto", BATCH, candidates="bsp,asp").resume(state)


def test_a_switch_waits_for_every_worker_to_have_a_pace():
    """A newcomer with no step on record yet: no forecast counts it at the mean of the others
    (LB-BSP would hand it a batch on a guess); the decision waits for its first push."""
    book = PaceBook(window=4)
    book.released(0, 0.0)
    book.pushed(0, 1.0, 10, 0.8)
    assert book.pace(0, 10) == Pace(0.08, pytest.approx(0.2), (pytest.approx(1.0),))
    assert book.pace(1, 10) is None
    policy = AutoSync(BATCH, interval=0.01)
    proposal = policy.controller.decide(1.0, "bsp", {0: book.pace(0, 10), 1: None}, 10)
    assert proposal is None and policy.controller.decisions == 0


def test_one_samples_curve_for_every_candidate():
    """Both apply modes' references lie on the curve, and one worker needs the same samples
    whatever the policy (they all run plain SGD then)."""
    curve = SamplesCurve.of(SHIPPED)
    for ref in SHIPPED.modes.values():
        assert curve.needed(ref.update_batch, ref.staleness) == pytest.approx(ref.samples)
    one = [Pace(0.01, 0.001, (0.2,) * 4)]
    needed = {outlook(c, one, 16, curve).samples_needed for c in ("bsp", "lbbsp", "ssp", "asp")}
    assert len(needed) == 1


def test_forecast_closed_forms():
    """Two workers, steps of 1 s and 3 s at batch 10 (no overhead, no jitter)."""
    paces = [Pace(0.1, 0.0, (1.0,) * 4), Pace(0.3, 0.0, (3.0,) * 4)]
    curve = SamplesCurve.of(SHIPPED)
    look = {c: outlook(c, paces, 10, curve) for c in ("bsp", "lbbsp", "ssp", "asp")}
    assert look["bsp"].samples_per_s == pytest.approx(20 / 3)
    # LB-BSP: 20 samples split 15:5 finish together in 1.5 s
    assert look["lbbsp"].samples_per_s == pytest.approx(20 / 1.5)
    assert look["ssp"].samples_per_s == pytest.approx(20 / 3)
    assert look["asp"].samples_per_s == pytest.approx(10 + 10 / 3)
    assert look["asp"].staleness == 1 and look["bsp"].staleness == 0
    assert look["asp"].samples_needed > look["ssp"].samples_needed  # staler
    with pytest.raises(ValueError, match="candidates"):
        outlook("ebsp", paces, 10, curve)


def test_back_and_forth_on_noise_settles():
    """Forecasts that flip at every look (spikes that a round waits for, then none): each
    switch back to the policy before doubles the hold, so 200 looks make a few switches."""
    spiky = {0: Pace(0.001, 0.0, (0.016, 0.08) * 4), 1: Pace(0.001, 0.0, (0.08, 0.016) * 4)}
    steady = {0: Pace(0.001, 0.0, (0.016,) * 8), 1: Pace(0.001, 0.0, (0.016,) * 8)}
    ctl = AutoSync(BATCH, candidates="bsp,asp", interval=0.1, margin=0.0,
                   horizon=1e3).controller
    current, made = "bsp", []
    for look in range(200):
        now = 0.1 * (look + 1)
        proposal = ctl.decide(now, current, spiky if look % 2 == 0 else steady, BATCH)
        if proposal is not None:
            made.append(now)
            ctl.took_over(now, current, proposal.to)
            current = proposal.to
    gaps = [b - a for a, b in zip(made, made[1:])]
    assert 3 <= len(made) <= 10  # (without the doubling: 100)
    assert gaps[:5] == sorted(gaps[:5]) and gaps[4] >= 0.1 * 8  # the hold grew


def test_the_reports_timeline_reads_each_switch():
    from paramserver.report.core.timeline import membership_timeline
    rows = membership_timeline([
        {"t": 1.0, "event": "barrier_open"},
        {"t": 1.0, "event": "sync_switch", "from": None, "to": "bsp"},
        {"t": 4.0, "event": "sync_switch", "from": "bsp", "to": "lbbsp", "gain": 1.5,
         "drain_s": 0.02, "reason": "slowest worker 4.00x the median step"}])
    assert [(r.t, r.text) for r in rows] == [
        (0.0, "policy bsp starts"),
        (3.0, "policy lbbsp (was bsp), predicted 2.50x as fast to target after a drain of "
              "0.02 s: slowest worker 4.00x the median step")]



def test_while_the_windows_fill_the_next_look_comes_as_they_fill():
    """A 1.3x straggler: LB-BSP's forecast beats BSP's by about 0.22, past the margin (0.15)
    but not past its widening on 4 steps of 16 (0.30). The next look comes when the slowest
    worker can have filled its window (12 more of its steps), not a whole interval (2 s)
    later, and then the switch is made; with full windows the looks are `interval` apart."""
    ctl = AutoSync(BATCH, candidates="bsp,lbbsp").controller

    def paces(n):
        fast = {w: Pace(0.001, 0.0, (0.016,) * n) for w in range(3)}
        return {**fast, 3: Pace(0.0013, 0.0, (0.0208,) * n)}

    assert ctl.decide(0.1, "bsp", paces(4), BATCH) is None
    assert ctl.next_at == pytest.approx(0.1 + 12 * 0.0208)
    assert not ctl.due(0.3) and ctl.due(ctl.next_at)
    proposal = ctl.decide(ctl.next_at, "bsp", paces(16), BATCH)
    assert proposal is not None and proposal.to == "lbbsp"
    assert 0.15 < proposal.gain < 0.3
    ctl.took_over(0.4, "bsp", "lbbsp")
    assert ctl.decide(2.4, "lbbsp", paces(16), BATCH) is None
    assert ctl.next_at == pytest.approx(4.4)


def test_of_forecasts_within_the_margin_of_each_other_the_least_stale_is_taken():
    """Spikes a round waits for (one 5x step per worker, in different rounds) and speeds
    1.0-1.2x apart: SSP and ASP both beat LB-BSP past the margin and come within it of each
    other; ASP forecasts a little more progress, SSP less staleness. SSP it is; ASP when it
    is the only one that beats LB-BSP by the margin."""
    def paces():
        out = {}
        for w, base in enumerate([0.016, 0.017, 0.018, 0.019]):
            steps = [base] * 16
            steps[w * 3] = base * 5
            out[w] = Pace(base / BATCH, 0.0, tuple(steps))
        return out

    proposal = AutoSync(BATCH).controller.decide(1.0, "lbbsp", paces(), BATCH)
    looks = proposal.outlooks
    assert looks["asp"].progress > looks["ssp"].progress > looks["lbbsp"].progress * 1.15
    assert looks["asp"].progress < looks["ssp"].progress * 1.15
    assert proposal.to == "ssp" and looks["ssp"].staleness < looks["asp"].staleness
    assert proposal.gain == pytest.approx(looks["ssp"].progress / looks["lbbsp"].progress - 1)
    only = AutoSync(BATCH, candidates="lbbsp,bsp,asp").controller
    assert only.decide(1.0, "lbbsp", paces(), BATCH).to == "asp"


def test_the_versions_a_switching_run_makes_are_its_free_steps_and_its_rounds():
    """What the coordinator counts as progress under auto (checkpoint tags, the version a
    restored shard is lifted to) must be what the shards' versions count: a step of ssp or
    asp once, a lockstep round once, whatever its size (summed_steps are the steps in such
    rounds). The driver counts versions as the shards do."""
    from policy_driver import Driver
    policy = make_policy("auto", BATCH, interval=0.05, margin=0.0, candidates="bsp,asp")
    workers = [VirtualWorker(w, steps=200, cost=0.001) for w in range(3)]
    driver = Driver(policy, workers + [slow_worker(3, 5.0, until=0.6, steps=200)])
    trace = driver.run()
    assert {m["to"] for _, m in switches(trace)} == {"bsp", "asp"}
    host = driver.host
    lockstep = sum(1 for r in trace.releases if r.round_id)
    free = host.steps_done - policy.summed_steps()
    assert 0 < free < host.steps_done and policy.summed_steps() <= lockstep
    assert free + host.rounds_applied == host.versions() == driver.version
    # A take-back resumes the policy from a checkpoint older than the live shards: the
    # rounds since are counted from the shards' version, so progress is theirs again.
    again = PolicyHost(make_policy("auto", BATCH, candidates="bsp,asp"))
    again.resume({**host.resume_state(), "rounds_applied": 3})
    again.align_versions(driver.version)
    assert again.versions() == driver.version
