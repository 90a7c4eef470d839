"""`paramserver top`'s statistics on synthetic records (observe/core/stats.py), the coordinator's
ring of recent records and its `observe` op, driven on the core: no sockets, no sleeps."""

from __future__ import annotations

import pytest

from paramserver.coordinator.events import (
    AppendMetric, Clocked, Heartbeat, ObserveAsked, Registered, Reply, Started,
)
from paramserver.coordinator.recent import RecentRecords
from paramserver.coordinator.state import CoordinatorState
from paramserver.observe.core.stats import (
    CHRONIC, OK, TRANSIENT, JobStats, SlowClassifier, SlowSettings, StepRecord, WaitLedger,
    round_mode_of,
)
from paramserver.spec.job import JobSpec, SyncSpec
from ps_helpers import bsp_run


def feed(stats: JobStats, records: list[dict]) -> JobStats:
    for r in records:
        stats.add(r)
    return stats


def test_a_3x_straggler_is_chronic_within_20_steps_and_the_others_stay_ok():
    stats = feed(JobStats(round_mode=True), bsp_run(30, {1: lambda k: 3.0}))
    became = [c for c in stats.classifier.changes if c.worker == 1 and c.state == CHRONIC]
    assert became and became[0].step < 20
    assert {w for c in stats.classifier.changes for w in [c.worker]} == {1}
    snap = stats.snapshot()
    assert [r.state for r in snap.workers] == [OK, CHRONIC, OK, OK]
    assert snap.workers[1].ratio == pytest.approx(3.0, rel=0.1)


def test_a_short_burst_is_transient_and_then_cleared():
    # worker 2 is 3x slower for steps 20..22 (a few seconds at 0.5 s steps), then normal
    stats = feed(JobStats(round_mode=True),
                 bsp_run(40, {2: lambda k: 3.0 if 20 <= k < 23 else 1.0}))
    states = [(c.step, c.state) for c in stats.classifier.changes if c.worker == 2]
    assert states[0][1] == TRANSIENT and 20 <= states[0][0] <= 22
    assert CHRONIC not in [s for _, s in states]
    assert states[-1][1] == OK and states[-1][0] <= 22 + 6
    assert stats.snapshot().workers[2].state == OK


def test_both_at_once_chronic_straggler_and_transient_other():
    stats = feed(JobStats(round_mode=True),
                 bsp_run(45, {1: lambda k: 3.0, 3: lambda k: 3.0 if 25 <= k < 28 else 1.0}))
    by = {}
    for c in stats.classifier.changes:
        by.setdefault(c.worker, []).append(c.state)
    assert by[1][-1] == CHRONIC and CHRONIC not in by[3]
    assert by[3] == [TRANSIENT, OK]


def test_noise_and_single_hiccups_are_not_flagged():
    stats = feed(JobStats(round_mode=True),
                 bsp_run(60, {0: lambda k: 2.5 if k in (10, 30, 50) else 1.0}, jitter=0.3))
    assert stats.classifier.changes == []


def test_a_chronic_worker_that_recovers_is_cleared():
    stats = feed(JobStats(round_mode=True), bsp_run(60, {1: lambda k: 3.0 if k < 25 else 1.0}))
    states = [c.state for c in stats.classifier.changes if c.worker == 1]
    assert CHRONIC in states and states[-1] == OK


def test_cost_is_per_sample_so_a_smaller_batch_is_not_fast():
    # LB-BSP gives the slow worker a third of the batch: same step time, 3x the cost a sample
    c = SlowClassifier()
    for k in range(20):
        for w in range(3):
            batch = 10 if w == 0 else 30
            c.observe(StepRecord(w, k, float(k), batch, 0.0, 1.0, 0.0, 0.0, 0.0))
    assert c.state[0] == CHRONIC and c.state[1] == OK


def test_one_worker_alone_is_never_slow():
    c = SlowClassifier()
    for k in range(30):
        c.observe(StepRecord(0, k, float(k), 32, 0.0, 1.0 + k, 0.0, 0.0, 0.0))
    assert c.state[0] == OK and c.ratio(0) is None


def test_settings_are_checked():
    with pytest.raises(ValueError, match="chronic_keep"):
        SlowSettings(window=8, chronic_min=10)
    with pytest.raises(ValueError, match="slow_factor"):
        SlowSettings(slow_factor=1.0)


def test_round_mode_time_lost_is_charged_to_the_last_worker_of_each_round():
    ledger = WaitLedger(round_mode=True)
    ends = [{0: 1.0, 1: 3.0, 2: 1.5}, {0: 4.0, 1: 4.5, 2: 6.0}, {0: 7.0, 1: 8.0, 2: 7.5}]
    for k, round_ends in enumerate(ends):
        for w, t in sorted(round_ends.items(), key=lambda x: x[1]):
            ledger.add(StepRecord(w, k, t, 32, 0, 0, 0, 0, 0), {1: CHRONIC})
    ledger.close_all()
    # round 0: worker 1 last, others lost 2.0 + 1.5; round 1: worker 2, 2.0 + 1.5;
    # round 2: worker 1, 1.0 + 0.5
    assert ledger.lost == pytest.approx({1: 5.0, 2: 3.5})
    assert ledger.lost_by_state[1] == pytest.approx({CHRONIC: 5.0})
    assert ledger.lost_by_state[2] == pytest.approx({OK: 3.5})


def test_arrival_mode_waits_are_charged_to_the_worker_furthest_behind():
    ledger = WaitLedger(round_mode=False)
    add = lambda w, k, wait: ledger.add(StepRecord(w, k, 0.0, 32, 0, 0, 0, wait, 0), {})
    add(0, 0, 0.0)
    add(1, 0, 0.0)
    add(2, 0, 0.0)
    add(0, 1, 0.0)
    add(0, 2, 0.7)  # worker 0 ran ahead and was held: workers 1 and 2 are at 1 step, 1 first
    add(1, 1, 0.0)
    add(0, 3, 0.4)  # now worker 2 alone is furthest behind
    assert ledger.lost == pytest.approx({1: 0.7, 2: 0.4})


def test_the_live_view_counts_the_round_still_open():
    stats = JobStats(round_mode=True)
    for r in bsp_run(3, {1: lambda k: 3.0}, jitter=0.0):
        stats.add(r)
    live = stats.snapshot().workers[1].lost_s
    stats.finish()
    assert stats.snapshot().workers[1].lost_s == pytest.approx(live)
    assert live == pytest.approx(3 * 3 * 1.0, rel=0.01)  # 3 rounds x 3 others x 1 s


def test_snapshot_phases_spreads_shards_and_left_workers():
    stats = feed(JobStats(round_mode=True), bsp_run(10, {1: lambda k: 2.0}, jitter=0.0))
    for i, t in enumerate((1.0, 2.0, 3.0)):
        stats.add({"t": t, "kind": "shard", "server": 0, "apply_s": 0.02, "applies": 10,
                   "queue": i, "backlog": 3})
    stats.add({"t": 9.0, "kind": "left", "worker": 3, "reason": "done"})
    stats.add({"t": 9.0, "kind": "step", "worker": "x"})  # malformed: ignored
    snap = stats.snapshot()
    w0 = snap.workers[0]
    assert w0.phases["data"] == pytest.approx(0.001)
    assert w0.phases["compute"] == pytest.approx(0.499)  # compute_s less data_s
    assert w0.phases["wait"] == pytest.approx(0.5)
    assert w0.step_s == pytest.approx(sum(w0.phases.values()))
    assert w0.samples_per_s == pytest.approx(32 / 1.01, rel=0.01)
    assert snap.workers[3].left and not snap.workers[0].left
    assert snap.spreads["compute"].high == pytest.approx(0.999)
    assert snap.spreads["compute"].low == pytest.approx(0.499)
    shard = snap.shards[0]
    assert shard.apply_ms == pytest.approx(2.0) and shard.queue == 2 and shard.backlog == 3
    assert shard.applies_per_s == pytest.approx(10.0)
    assert snap.steps == 40 and snap.samples == 40 * 32


def test_round_mode_follows_the_policy():
    assert round_mode_of("bsp") and round_mode_of("lbbsp")
    assert not round_mode_of("asp") and not round_mode_of("ssp")
    assert not round_mode_of(None) and not round_mode_of("nonsense")


# ---- the coordinator's ring and observe op ----------------------------------------------------

def test_recent_records_are_bounded_numbered_and_paged():
    ring = RecentRecords(capacity=5)
    for i in range(8):
        ring.add(float(i), {"kind": "step", "i": i})
    seq, records, more = ring.since(0)
    assert seq == 8 and [r["i"] for r in records] == [3, 4, 5, 6, 7] and not more
    assert records[0]["t"] == 3.0
    seq, records, more = ring.since(6)
    assert seq == 8 and [r["i"] for r in records] == [6, 7]
    assert ring.since(8) == (8, [], False)
    assert ring.since(99)[1][0]["i"] == 3  # a newer number than the ring: from the oldest kept
    seq, records, more = ring.since(0, limit=2)
    assert (seq, [r["i"] for r in records], more) == (5, [3, 4], True)


def test_recent_records_fit_one_reply_header():
    from paramserver.wire import Message, decode, encode

    ring = RecentRecords()
    wide = {f"staleness_layer_{i}": 123456.789 for i in range(60)}
    for i in range(600):
        ring.add(float(i), {"kind": "step", "worker": i % 8, **wide})
    seq, records, more = ring.since(0)
    assert more and 0 < len(records) < 600
    msg = Message("observed", {"seq": seq, "records": records, "more": more,
                               "members": {"workers": {str(i): 10 ** 6 for i in range(256)}}})
    assert decode(encode(msg))["seq"] == seq  # within the 64 KB header bound
    long = RecentRecords()
    for i in range(200):  # records of long strings, the largest a RECORD may hold
        long.add(float(i), {f"k{j}": "é" * 256 for j in range(63)})
    seq, records, more = long.since(0)
    assert more and records
    msg = Message("observed", {"seq": seq, "records": records, "more": more, "members": {}})
    assert decode(encode(msg))["seq"] == seq


def bsp_core() -> CoordinatorState:
    state = CoordinatorState(JobSpec(sync=SyncSpec("bsp"), workers=2, servers=1, batch_size=32,
                                     num_keys=10, eval_interval=0.0))
    state.handle(Registered("srv", "server", 0.0, to="r", link="L", addr="tcp://h:1"))
    for w in ("w0", "w1"):
        state.handle(Registered(w, "worker", 0.1, to=f"r-{w}"))
    state.handle(Started("w0", 0.5, to="s0"))
    state.handle(Started("w1", 0.6, to="s1"))
    return state


def observed(state, since: int, now: float = 5.0) -> dict:
    out = state.handle(ObserveAsked("top-1", since, now, to="o"))
    replies = [i for i in out if type(i) is Reply]
    assert len(replies) == 1 and replies[0].to == "o" and replies[0].op == "observed"
    return replies[0].fields


def test_observe_op_returns_what_metrics_jsonl_got_and_registers_nobody():
    state = bsp_core()
    metrics = []
    for step in range(3):
        for w, t in (("w0", 1.0 + step), ("w1", 1.2 + step)):
            out = state.handle(Clocked(w, step, 32, 0.1, t, to=f"c-{w}-{step}",
                                       record={"loss": 1.0, "wait_s": 0.1}))
            metrics += [{"t": round(i.t, 6), **i.record} for i in out
                        if type(i) is AppendMetric]
    out = state.handle(Heartbeat("s0", 4.0, to="hb", link="L", counters=None,
                                 shard={"apply_s": 0.01, "applies": 3, "queue": 1,
                                        "backlog": 2}))
    metrics += [{"t": round(i.t, 6), **i.record} for i in out if type(i) is AppendMetric]
    assert metrics[-1]["kind"] == "shard" and metrics[-1]["server"] == 0
    fields = observed(state, 0)
    assert fields["records"] == metrics and fields["seq"] == len(metrics)
    assert not fields["more"]
    members = fields["members"]
    assert members["policy"] == "bsp" and members["round_mode"] and members["started"]
    assert members["workers"] == {"0": 3, "1": 3} and members["servers"] == 1
    assert observed(state, fields["seq"])["records"] == []
    # an observer is no member: nothing about it is kept, the job goes on as before
    assert state.role_of("top-1") is None
    assert "top-1" not in state.members.roster.observers
    state.check_invariants()


def test_observe_before_the_start_has_no_records():
    state = CoordinatorState(JobSpec(sync=SyncSpec("asp"), workers=2, servers=1,
                                     batch_size=32, num_keys=10))
    fields = observed(state, 0, now=0.1)
    assert fields["records"] == [] and fields["seq"] == 0
    assert not fields["members"]["started"] and not fields["members"]["round_mode"]
