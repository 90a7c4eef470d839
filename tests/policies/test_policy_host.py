"""PolicyHost: events in, exactly the releases, rounds and notes that must go out, and when."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from paramserver.policies import (
    ASP, BSP, ApplyRound, Note, PolicyError, PolicyHost, Pushed, Release, make_policy,
)
from paramserver.sim.replay import check_log, decision_log, load_run
from paramserver.sim.run import SimConfig, Simulation

B = 8


class Delayed(ASP):
    """ASP whose every release after the first is held `delay` seconds after the push."""

    def __init__(self, batch_size: int, delay: float = 0.05):
        super().__init__(batch_size)
        self.delay = delay

    def on_pushed(self, event):
        return [Release(d.worker, d.step, d.batch_size, event.now + self.delay)
                for d in super().on_pushed(event)]


class Timed(ASP):
    """ASP with a timer: a Tick at `deadline` releases nobody but is recorded."""

    def __init__(self, batch_size: int, deadline: float | None):
        super().__init__(batch_size)
        self.deadline, self.ticks = deadline, []

    def next_deadline(self):
        return self.deadline

    def on_tick(self, event):
        self.ticks.append(event.now)
        self.deadline = None
        return [Note("ticked", {"now": event.now})]


def push(w, step, now, batch=B):
    return Pushed(w, step, now, batch, 0.01)


# ---- rounds -------------------------------------------------------------------------------------
def test_bsp_round_of_two_applies_then_releases_with_the_new_version_and_round_size():
    host = PolicyHost(BSP(B))
    assert host.joined_all([0, 1], 0.0) == [Release(0, 0, B, round_size=2),
                                            Release(1, 0, B, round_size=2)]
    assert host.pushed(push(0, 0, 1.0)) == []
    assert host.pushed(push(1, 0, 2.0)) == [
        ApplyRound(0, (0, 1)), Release(0, 1, B, min_version=1, round_size=2),
        Release(1, 1, B, min_version=1, round_size=2)]
    assert (host.version, host.rounds_applied, host.samples_done, host.steps_done) == (1, 1, 16, 2)
    assert host.next_wakeup() is None


def test_joins_one_by_one_release_with_the_round_size_known_then():
    host = PolicyHost(BSP(B))
    assert host.joined(0, 0.0) == [Release(0, 0, B, round_size=1)]
    assert host.joined(1, 0.0) == [Release(1, 0, B, round_size=2)]


def test_arrival_mode_releases_carry_no_version_and_refuse_apply_round():
    host = PolicyHost(ASP(B))
    host.joined_all([0], 0.0)
    assert host.pushed(push(0, 0, 1.0)) == [Release(0, 1, B)]
    assert host.version == 0

    class Rounding(ASP):
        def on_pushed(self, event):
            return [ApplyRound(event.step)] + super().on_pushed(event)

    bad = PolicyHost(Rounding(B))
    bad.joined(0, 0.0)
    with pytest.raises(PolicyError, match="arrival-mode"):
        bad.pushed(push(0, 0, 1.0))


# ---- held releases ------------------------------------------------------------------------------
def test_a_held_release_comes_out_only_when_advance_reaches_its_not_before():
    host = PolicyHost(Delayed(B))
    assert host.joined_all([0, 1], 0.0) == [Release(0, 0, B), Release(1, 0, B)]
    assert host.pushed(push(0, 0, 1.0)) == []
    assert host.next_wakeup() == pytest.approx(1.05)
    assert host.pushed(push(1, 0, 1.01)) == []
    assert host.advance(1.04) == []
    assert host.advance(1.05) == [Release(0, 1, B, 1.0 + 0.05)]
    assert host.next_wakeup() == 1.01 + 0.05
    assert host.advance(5.0) == [Release(1, 1, B, 1.01 + 0.05)]
    assert host.next_wakeup() is None and host.advance(9.0) == []


def test_r2sp_spacing_is_held_until_not_before():
    host = PolicyHost(make_policy("r2sp", B, warmup=1, gap_ratio=0.5, ema=1.0))
    host.joined_all(range(3), 0.0)
    assert host.pushed(push(1, 0, 1.0))[1] == Release(1, 1, B)  # the rotation starts
    assert host.pushed(push(0, 0, 1.2)) == []
    assert host.pushed(push(2, 0, 1.3)) == [Release(2, 1, B), Release(0, 1, B)]
    assert host.pushed(push(1, 1, 3.0)) == [Release(1, 2, B)]
    assert host.pushed(push(2, 1, 3.0)) == []  # T = 1.7: held r*T/N after the last one
    (held,) = host.held()
    assert (held.worker, held.step, held.not_before) == (2, 2, pytest.approx(3.0 + 0.5 * 1.7 / 3))
    assert host.next_wakeup() == held.not_before
    assert host.advance(held.not_before - 1e-9) == []
    assert host.advance(held.not_before) == [held]
    assert host.held() == [] and host.next_wakeup() is None


def test_left_drops_the_release_held_for_that_worker():
    host = PolicyHost(Delayed(B))
    host.joined_all([0, 1], 0.0)
    host.pushed(push(0, 0, 1.0))
    host.pushed(push(1, 0, 1.02))
    assert host.left(0, 1.03, "dead") == []
    assert host.next_wakeup() == pytest.approx(1.07)  # only worker 1's is left
    assert host.joined(0, 1.04) == [Release(0, 0, B)]  # the id comes back: a fresh start
    assert host.advance(2.0) == [Release(1, 1, B, 1.02 + 0.05)]
    assert host.next_wakeup() is None


def test_protocol_breaches_the_host_sees_are_refused():
    host = PolicyHost(Delayed(B))
    host.joined(0, 0.0)
    host.pushed(push(0, 0, 1.0))
    with pytest.raises(PolicyError, match="still held"):
        host.pushed(push(0, 1, 1.01))  # its release has not gone out yet

    class Twice(Delayed):
        def on_pushed(self, event):
            return super().on_pushed(event) * 2

    twice = PolicyHost(Twice(B))
    twice.joined(0, 0.0)
    with pytest.raises(PolicyError, match="still held"):
        twice.pushed(push(0, 0, 1.0))

    class Stranger(ASP):
        def on_pushed(self, event):
            return [Release(9, 0, self.batch_size)]

    stranger = PolicyHost(Stranger(B))
    stranger.joined(0, 0.0)
    with pytest.raises(PolicyError, match="not joined"):
        stranger.pushed(push(0, 0, 1.0))


def test_a_refused_push_is_not_counted():
    host = PolicyHost(ASP(B), max_samples=B)
    host.joined(0, 0.0)
    with pytest.raises(PolicyError):
        host.pushed(push(0, 3, 1.0))
    assert (host.samples_done, host.steps_done, host.stopping) == (0, 0, False)


# ---- the budget ---------------------------------------------------------------------------------
def test_the_budget_stops_before_the_policy_hears_of_the_last_push():
    seen = []

    class Spy(ASP):
        def on_pushed(self, event):
            seen.append((event.worker, event.step, host.stopping))
            return super().on_pushed(event)

    host = PolicyHost(Spy(B), max_samples=20)
    host.joined_all([0, 1], 0.0)
    assert host.pushed(push(0, 0, 1.0)) == [Release(0, 1, B)]
    assert host.pushed(push(1, 0, 1.1)) == [Release(1, 1, B)]
    assert host.pushed(push(0, 1, 2.0)) == [Note("budget_reached", {"samples": 24}),
                                            Release(0, 2, B, stop=True)]
    assert host.pushed(push(1, 1, 2.1)) == [Release(1, 2, B, stop=True)]  # no second note
    assert seen == [(0, 0, False), (1, 0, False), (0, 1, True), (1, 1, True)]


def test_a_release_held_while_the_budget_runs_out_says_stop_when_it_goes_out():
    host = PolicyHost(Delayed(B), max_samples=2 * B)
    host.joined_all([0, 1], 0.0)
    assert host.pushed(push(0, 0, 0.01)) == []
    assert host.pushed(push(1, 0, 0.03)) == [Note("budget_reached", {"samples": 16})]
    assert host.advance(0.07) == [Release(0, 1, B, 0.01 + 0.05, stop=True)]


def test_stop_from_outside_stops_every_later_release():
    host = PolicyHost(ASP(B))
    host.joined(0, 0.0)
    host.stop()
    assert host.stopping and host.pushed(push(0, 0, 1.0)) == [Release(0, 1, B, stop=True)]


# ---- timers -------------------------------------------------------------------------------------
def test_next_wakeup_is_the_earlier_of_held_releases_and_the_policy_deadline():
    policy = Timed(B, deadline=5.0)
    host = PolicyHost(policy)
    host.joined(0, 0.0)
    assert host.next_wakeup() == 5.0
    assert host.advance(4.9) == [] and policy.ticks == []
    assert host.advance(5.0) == [Note("ticked", {"now": 5.0})] and policy.ticks == [5.0]
    assert host.next_wakeup() is None

    class Both(Delayed):
        deadline = 1.02

        def next_deadline(self):
            return self.deadline

    both = PolicyHost(Both(B))
    both.joined(0, 0.0)
    both.pushed(push(0, 0, 1.0))  # held until 1.05
    assert both.next_wakeup() == 1.02
    both.policy.deadline = 2.0
    assert both.next_wakeup() == pytest.approx(1.05)


def test_advance_fires_held_releases_before_the_tick():
    class HeldAndTimed(Delayed):
        def next_deadline(self):
            return 1.05

        def on_tick(self, event):
            return [Note("tick", {})]

    host = PolicyHost(HeldAndTimed(B))
    host.joined(0, 0.0)
    host.pushed(push(0, 0, 1.0))
    assert host.advance(1.05) == [Release(0, 1, B, 1.05), Note("tick", {})]


# ---- watching and resuming ----------------------------------------------------------------------
def test_on_decision_sees_held_releases_when_they_are_decided():
    seen = []
    host = PolicyHost(Delayed(B), on_decision=lambda d, now: seen.append((now, d)))
    host.joined(0, 0.0)
    host.pushed(push(0, 0, 1.0))
    assert seen == [(0.0, Release(0, 0, B)), (1.0, Release(0, 1, B, 1.05))]


def test_resume_goes_on_counting_where_the_checkpoint_stopped():
    host = PolicyHost(BSP(B), max_samples=100)
    host.joined_all([0, 1], 0.0)
    host.pushed(push(0, 0, 1.0))
    host.pushed(push(1, 0, 1.0))
    state = host.resume_state()
    assert state == {"rounds_applied": 1, "samples_done": 16, "steps_done": 2,
                     "policy": {"round": 1}}
    again = PolicyHost(BSP(B), max_samples=100)
    again.resume(state)
    assert again.joined_all([0, 1], 0.0) == [Release(0, 1, B, min_version=1, round_size=2),
                                             Release(1, 1, B, min_version=1, round_size=2)]
    spent = PolicyHost(BSP(B), max_samples=16)
    spent.resume(state)
    assert spent.stopping
    with pytest.raises(PolicyError):
        again.resume(state)  # workers joined already


# ---- held releases, at random -------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["push", "left", "advance"]), st.integers(0, 3),
                              st.floats(0.0, 0.1)), max_size=60))
def test_each_held_release_goes_out_once_not_before_its_time_and_never_after_a_left(ops):
    host = PolicyHost(Delayed(B, delay=0.03))
    now, out = 0.0, []
    host.joined_all(range(4), now)
    outstanding = {w: 0 for w in range(4)}  # worker -> step released to it (None: held)
    decided = {}  # worker -> the release held for it
    for op, w, dt in ops:
        now += dt
        if op == "push" and outstanding.get(w) is not None:
            assert host.pushed(push(w, outstanding[w], now)) == []
            outstanding[w] = None
            decided[w] = Release(w, host.policy.released[w], B, now + 0.03)
        elif op == "left" and w in outstanding:
            host.left(w, now)
            del outstanding[w]
            decided.pop(w, None)
        elif op == "advance":
            out = host.advance(now)
            due = sorted((r for r in decided.values() if r.not_before <= now),
                         key=lambda r: r.not_before)
            assert [(r.worker, r.step) for r in out] == [(r.worker, r.step) for r in due]
            for r in out:
                assert r.not_before <= now
                outstanding[r.worker] = r.step
                del decided[r.worker]
        pending = [r.not_before for r in decided.values()]
        assert host.next_wakeup() == (min(pending) if pending else None)


# ---- the per-step types -------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Release, Pushed])
def test_hand_written_inits_take_exactly_the_fields_with_their_defaults(cls):
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]
    one = cls(*range(len(fields)))
    assert [getattr(one, f.name) for f in fields] == list(range(len(fields)))
    assert dataclasses.replace(one, worker=9).worker == 9
    assert hash(one) == hash(cls(*range(len(fields))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.worker = 1


def test_the_host_is_pure():
    import paramserver.policies.host as host
    tree = ast.parse(Path(host.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert {n.split(".")[0] for n in names} <= {"__future__", "heapq", "math", "collections",
                                                "typing", "paramserver"}
    # (batch_rule: an elastic job's global-batch rule, itself importing nothing of ours)
    assert [n for n in names if n.startswith("paramserver")] == [
        "paramserver.policies.base", "paramserver.policies.batch_rule"]


# ---- one interpreter: the simulator and the replay agree ----------------------------------------
@pytest.mark.parametrize("sync,options,budget", [
    ("bsp", {}, None), ("asp", {}, 2000), ("ssp", {"staleness": 1}, None),
    ("r2sp", {"warmup": 2}, 2500), ("r2sp", {"warmup": 0, "heterogeneous": True}, None),
    ("lbbsp", {"predictor": "last"}, None), ("ebsp", {"lookahead": 4}, None),
    ("dssp", {}, 3000),
])
def test_the_engine_and_the_replay_of_its_records_make_the_same_decisions(
        tmp_path, sync, options, budget):
    """The sim Engine hosts the policy over its events; decision_log re-runs it over the
    records those events wrote. Same events, same host: the same releases and rounds."""
    cfg = SimConfig(sync=sync, sync_options=options, workers=5, steps=None if budget else 12,
                    max_samples=budget, batch_size=16, compute="classes:0.4=1,0.6=2.5",
                    param_bytes="64KB", latency="20us")
    sim = Simulation(cfg, tmp_path)
    releases, rounds = {}, []

    def watch(d, now):
        if isinstance(d, Release):
            releases[(d.worker, d.step)] = {"batch": d.batch_size, "scale": round(d.scale, 9),
                                            "delayed": d.not_before is not None
                                            and d.not_before > now}
        elif isinstance(d, ApplyRound):
            rounds.append((d.step, tuple(d.contributors)))

    sim.engine.host.on_decision = watch
    sim.advance()
    sim.close(complete=True)
    run = load_run(tmp_path)
    log = decision_log(run)
    assert check_log(run, log) == [] and not log.problems
    assert {k: {f: r[f] for f in ("batch", "scale", "delayed")}
            for k, r in log.releases.items()} == releases
    assert log.rounds == rounds and (rounds or sim.policy.apply_mode == "arrival")
    if sync == "r2sp":  # held releases are compared too
        assert any(r["delayed"] for r in releases.values())


def test_r2sp_a_dead_workers_silence_is_not_measured_as_an_iteration():
    """A worker dies holding the rotation's turn: the others wait for it until it is declared
    dead (a heartbeat timeout, seconds). Their next push comes seconds after their last one;
    measured as an iteration it inflated T, and the gap r*T/N with it, so the job crawled
    for many rotations after the death (a 3-worker job took 2.6x as long after two deaths).
    The intervals that span a membership change are not measured."""
    policy = make_policy("r2sp", B, warmup=1, gap_ratio=0.5, ema=0.5)
    host = PolicyHost(policy)
    host.joined_all(range(3), 0.0)
    for w, step, t in [(1, 0, 1.0), (0, 0, 1.1), (2, 0, 1.2), (1, 1, 2.05), (0, 1, 2.1),
                       (2, 1, 2.2)]:
        host.pushed(push(w, step, t))
    assert host.advance(3.0)  # 2 and 0 go on; the turn is worker 1's, which dies
    assert host.pushed(push(2, 2, 3.1)) == [] and host.pushed(push(0, 2, 3.2)) == []
    t_before = policy.iter_time
    assert t_before == pytest.approx(1.0, abs=0.1) and policy.rotation.turn == 1
    released = host.left(1, 8.2, "dead") + host.advance(9.0)  # declared dead 5 s on
    assert sorted(r.worker for r in released) == [0, 2]
    host.pushed(push(2, 3, 9.1))
    host.pushed(push(0, 3, 9.2))
    assert policy.iter_time == pytest.approx(t_before)  # the 5 s wait measured nothing
    assert policy.gap() == pytest.approx(0.5 * t_before / 2)
