"""The simulator's membership schedule: workers join and leave in virtual time through the live
coordinator's policy events (Joined(late=True), Left), and every policy follows them.

Pure (the engine and the policy host in one process, no I/O but the small run folders of the
last tests). Expected values are worked out here from the timing by hand: 10 samples x 1 ms
= 10 ms a step, no latency, infinite bandwidth, so BSP's round r runs over [10r, 10r + 10) ms.
"""

import json

import pytest

from paramserver.cli.main import main
from paramserver.policies import SYNC_POLICIES, make_policy
from paramserver.policies.batch_rule import BatchRule
from paramserver.report.collect import load_run
from paramserver.report.core.timeline import membership_timeline
from paramserver.sim import Engine, Network, NullSink, SimConfig, simulate
from paramserver.sim.core.compute import parse_compute
from paramserver.sim.core.membership import Change, MembershipError, Schedule, parse_membership

STEP = 0.010  # seconds a step takes: batch 10 x 1 ms


class Capture(NullSink):
    def __init__(self):
        self.steps, self.events, self.left_at, self.records = [], [], {}, []

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        self.steps.append(dict(t=t, worker=w, step=step, batch=batch, wait_s=wait))

    def left(self, t, w, reason):
        self.left_at.setdefault(w, []).append((t, reason))

    def event(self, t, kind, data):
        self.events.append((t, kind, data))

    def record(self, record):
        self.records.append(record)

    def kinds(self, kind):
        return [(t, d) for t, k, d in self.events if k == kind]


class Watched(Engine):
    """The engine, keeping each release it lets go (the round size the servers are told)."""

    def _release(self, d, t):
        self.released.append(d)
        super()._release(d, t)


def run(sync, workers, membership, *, max_samples=None, steps=None, compute="const:1ms",
        batch=10, rule=None, **options):
    schedule = parse_membership(membership)
    ranks = workers + schedule.joins
    sink = Capture()
    cost = parse_compute(compute).bind(ranks, 100, 0)
    engine = Watched(make_policy(sync, batch, **options), workers, steps, cost, Network(),
                    sink=sink, max_samples=max_samples, membership=schedule,
                    batch_rule=BatchRule.parse(rule or "fixed", batch, workers))
    engine.released = []
    assert engine.run()
    return engine, sink


# ---- the grammar --------------------------------------------------------------------------------
def test_the_schedule_parses_into_typed_changes_in_time_order():
    s = parse_membership("leave@60s:w1, join@30s*2, leave@1.5, join@500ms")
    assert s.changes == (Change("join", 0.5), Change("leave", 1.5), Change("join", 30.0),
                         Change("join", 30.0), Change("leave", 60.0, 1))
    assert s.joins == 3 and bool(s) and not parse_membership("none")
    assert parse_membership(s.text()) == s  # the text it records reads back the same
    for bad in ("join", "join@", "join@soon", "join@3s*0", "leave@3s:x", "stay@3s",
                "join@3s:w1", "leave@-1s"):
        with pytest.raises(MembershipError):
            parse_membership(bad)


def test_a_bad_schedule_fails_at_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--membership", "join@later"])
    assert "argument --membership" in capsys.readouterr().err


# ---- BSP: the round size follows joins and leaves -----------------------------------------------
def test_bsp_rounds_take_joiners_from_the_next_round_and_drop_a_leaver_after_its_step():
    # Joins at 55 ms (round 5 in progress): they start with round 6. Worker 1's notice at
    # 105 ms (round 10 under way): its push of round 10 counts, it is gone from round 11.
    engine, sink = run("bsp", 2, "join@55ms*2,leave@105ms:w1", max_samples=10 * 10 * 16)
    rounds = {}
    for r in sink.steps:
        rounds.setdefault(r["step"], set()).add(r["worker"])
    applied = {d["step"]: set(d["contributors"]) for _, d in sink.kinds("apply_round")}
    # The round the leaver pushed last is applied with its push (a server sums what came), and
    # names it among the round's contributors.
    assert applied == rounds
    for k, who in rounds.items():
        expected = {0, 1} if k < 6 else {0, 1, 2, 3} if k <= 10 else {0, 2, 3}
        assert who == expected, k
    # Each release tells the servers the size of the round it opens: the same head counts.
    sizes = {(d.step, d.round_size) for d in engine.released if not d.stop}
    assert sizes == {(k, len(who)) for k, who in rounds.items()}
    # The rounds' times follow from it: 10 ms each, whoever is there.
    for r in sink.steps:
        assert r["t"] == pytest.approx(STEP * (r["step"] + 1))
    joined = sink.kinds("worker_joined")
    assert [(t, d["worker"], d["round"], d["workers"]) for t, d in joined] == [
        (0.055, 2, 5, 3), (0.055, 3, 5, 4)]
    (t, left), = [(t, d) for t, d in sink.kinds("worker_left") if d["reason"] == "preempted"]
    assert left == {"worker": 1, "reason": "preempted", "workers": 3}
    assert t == pytest.approx(0.110)  # its round-10 clock was its last
    assert sink.left_at[1] == [(pytest.approx(0.110), "preempted")]
    # Every step is counted, a leaver's last too; the budget is spent in the round that
    # reaches it (steps under way finish).
    assert engine.steps_done == len(sink.steps) and engine.samples == 10 * len(sink.steps)
    assert 1600 <= engine.samples < 1600 + 40


def test_a_worker_waiting_for_its_release_leaves_when_it_comes_its_step_unrun():
    # Worker 1 is 3x slower under SSP(0): worker 0 waits for it at every step. Worker 0's
    # notice comes while it waits (at 25 ms, worker 1 ends step 0 at 30 ms): it leaves at the
    # release for step 1 (30 ms), unrun; worker 1 goes on alone to the budget (60 samples).
    engine, sink = run("ssp", 2, "leave@25ms:w0", max_samples=10 * 6,
                       compute="classes:0.5=1,0.5=3+const:1ms", staleness=0)
    steps0 = [r["step"] for r in sink.steps if r["worker"] == 0]
    assert steps0 == [0]
    assert sink.left_at[0] == [(pytest.approx(0.030), "preempted")]
    assert [r["step"] for r in sink.steps if r["worker"] == 1] == [0, 1, 2, 3, 4]


# ---- SSP: the slowest clock ignores a leaver ----------------------------------------------------
def test_ssp_slowest_clock_forgets_a_leaver():
    # SSP(1), worker 2 is 10x slower (100 ms a step): until it leaves, workers 0 and 1 may be
    # at most 2 clocks ahead of it; its notice at 150 ms lets its step 1 finish (200 ms), then
    # the fast ones run freely (10 ms a step, no wait) until the budget.
    engine, sink = run("ssp", 3, "leave@150ms:w2", max_samples=10 * 60,
                       compute="classes:0.67=1,0.33=10+const:1ms", staleness=1)
    slow = [r for r in sink.steps if r["worker"] == 2]
    assert [r["step"] for r in slow] == [0, 1]
    gone = sink.left_at[2][0][0]
    assert gone == pytest.approx(0.200)
    for w in (0, 1):
        mine = sorted((r for r in sink.steps if r["worker"] == w), key=lambda r: r["step"])
        before = [r for r in mine if r["t"] <= gone]
        after = [r for r in mine if r["t"] > gone]
        # paced by the slow worker: never more than staleness + 1 clocks past its own
        assert max(r["step"] for r in before) <= 1 + 1 + 1
        # after it left: one step per 10 ms, no waiting, far past the leaver's clock
        assert after and all(r["wait_s"] == pytest.approx(0.0, abs=1e-12) for r in after[1:])
        assert all(b["t"] - a["t"] == pytest.approx(STEP) for a, b in zip(after, after[1:]))
        assert after[-1]["step"] > 2 + 1 + 5


# ---- the batch rule -----------------------------------------------------------------------------
def split(total, n):
    """keep-global's split, worked out again here: as even as integers allow, low ranks more."""
    return [total // n + (i < total % n) for i in range(n)]


def test_keep_global_holds_the_global_batch_whoever_is_there():
    # 2 workers x 32 = 64 samples a round, whether 2, 4 or 3 workers share it.
    engine, sink = run("bsp", 2, "join@50ms*2,leave@100ms:w0", max_samples=64 * 60, batch=32,
                       rule="keep-global", compute="const:0.1ms")
    rounds = {}
    for r in sink.steps:
        rounds.setdefault(r["step"], []).append(r)
    sizes = set()
    for k, recs in rounds.items():
        assert sum(r["batch"] for r in recs) == 64, k
        ranks = sorted(r["worker"] for r in recs)
        assert [r["batch"] for r in sorted(recs, key=lambda r: r["worker"])] == \
            split(64, len(ranks)), k
        sizes.add(len(ranks))
    assert sizes == {2, 3, 4}
    notes = [d for _, d in sink.kinds("batch_rule")]
    assert [d["workers"] for d in notes][:4] == [2, 3, 4, 3]
    assert {d["global_batch"] for d in notes} == {64}


def test_linear_rule_scales_each_update_by_the_head_count():
    engine, sink = run("bsp", 2, "join@55ms*2", max_samples=10 * 40, rule="linear")
    notes = [d for _, d in sink.kinds("batch_rule")]
    assert [(d["workers"], d["lr_scale"], d["global_batch"]) for d in notes] == [
        (2, 1.0, 20), (3, 1.5, 30), (4, 2.0, 40)]
    assert engine.scale[3] == 2.0 and engine.scale[0] == 2.0


# ---- every policy -------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", SYNC_POLICIES.names())
def test_every_policy_follows_joins_and_leaves(sync):
    engine, sink = run(sync, 3, "join@40ms,join@40ms,leave@90ms:w1,leave@130ms",
                       max_samples=10 * 80, compute="lognormal:1ms:0.3")
    per = {}
    for r in sink.steps:
        per.setdefault(r["worker"], []).append(r)
    assert set(per) == {0, 1, 2, 3, 4}
    for w in (3, 4):  # the joiners: from their join on
        assert min(r["t"] for r in per[w]) > 0.040
    preempted = {d["worker"]: t for t, d in sink.kinds("worker_left")
                 if d["reason"] == "preempted"}
    assert 1 in preempted and len(preempted) == 2
    for w, t in preempted.items():  # nothing of a leaver's after it left
        assert max(r["t"] for r in per[w]) <= t + 1e-12
        steps = [r["step"] for r in per[w]]
        assert steps == sorted(set(steps))  # never stepped back
    assert engine.samples >= 10 * 80 and engine.alive == 0


def test_changes_that_find_no_one_are_skipped_and_do_not_stretch_the_run():
    engine, sink = run("bsp", 2, "leave@5ms:w7,join@10s,leave@20s", max_samples=10 * 20)
    skipped = [d for _, d in sink.kinds("membership_skipped")]
    assert [d["change"] for d in skipped] == ["leave@0.005s:w7", "join@10s", "leave@20s"]
    assert engine.now < 1.0  # ended with the budget, not at the last change's time
    assert [m["change"] for m in engine.membership_log] == [
        "skipped " + d["change"] for d in skipped]


# ---- the run folder and the report's timeline ---------------------------------------------------
def test_a_simulated_runs_folder_shows_the_membership_changes(tmp_path):
    cfg = SimConfig(sync="bsp", workers=2, steps=None, max_samples=10 * 30, batch_size=10,
                    param_bytes="1MB", membership=parse_membership("join@55ms,leave@0.1s:w0"),
                    batch_rule="keep-global")
    summary = simulate(cfg, tmp_path)
    assert [(m["change"], m["worker"]) for m in summary["simulator"]["membership"]] == [
        ("joined", 2), ("left", 0)]
    job = json.loads((tmp_path / "job.json").read_text())
    assert (job["workers"], job["min_workers"], job["batch_rule"]) == (3, 2, "keep-global")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    rows = membership_timeline(events)
    texts = [r.text for r in rows]
    assert any(t.startswith("worker 2 joined at round") for t in texts)
    assert any(t.startswith("worker 0 left: preempted") for t in texts)
    assert any("global batch 20" in t for t in texts)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"kind": "membership", "change": "joined", "worker": 2, "workers": 3} == {
        k: v for k, v in next(r for r in records if r["kind"] == "membership").items()
        if k != "t"}
    run = load_run(tmp_path, "sim", None, 0, [])  # what the report draws its timeline from
    assert [r.text for r in run.timeline] == texts
    config = json.loads((tmp_path / "config.json").read_text())["config"]
    assert config["membership"]["changes"][0] == {"kind": "join", "at": 0.055, "worker": None}


def test_a_batch_rule_without_a_schedule_is_refused():
    with pytest.raises(ValueError, match="--membership"):
        SimConfig(batch_rule="keep-global").validate()
    assert Schedule() == parse_membership("")
