"""Elastic workers on the pure cores: the sample ledger, the batch rule, each policy's joins and
leaves, and the coordinator core of a `--workers MIN:MAX` job. No sockets, no processes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver.coordinator.events import (
    AppendEvent, Bye, Clocked, Registered, Reply, SendRelease, Started, TimePassed, Warn,
)
from paramserver.coordinator.ledger import SampleLedger
from paramserver.core.pieces import Piece
from paramserver.coordinator.state import CoordinatorState
from paramserver.policies import (
    ApplyRound, Joined, Left, Note, PolicyHost, Pushed, Release, make_policy,
)
from paramserver.policies.batch_rule import BatchRule
from paramserver.spec.job import JobSpec, JobSpecError, Limits, SyncSpec, WorkerCount

# ---- the ledger: exactly-once per epoch whatever the joins, leaves and draws ----------------

OPS = st.lists(st.tuples(st.sampled_from(["lend", "consume", "give_back"]),
                         st.integers(0, 5), st.integers(0, 40)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 50), ops=OPS)
def test_ledger_hands_out_each_epoch_exactly_once(size, ops):
    ledger = SampleLedger(size)
    lent: dict[int, tuple[Piece, ...]] = {}
    seen: dict[int, list[int]] = {}  # epoch -> positions consumed
    for op, worker, n in ops:
        if op == "lend":
            if worker in lent:  # lending again gives the unused pieces back first
                lent.pop(worker)
            pieces = ledger.lend(worker, n)
            assert sum(p.size for p in pieces) == n
            lent[worker] = pieces
        elif op == "consume":
            ledger.consume(worker)
            for p in lent.pop(worker, ()):
                seen.setdefault(p.epoch, []).extend(range(p.lo, p.hi))
        else:
            back = ledger.give_back(worker)
            assert back == sum(p.size for p in lent.pop(worker, ()))
        ledger.check_invariants()
        # Nothing lent twice: the pieces held now are disjoint from each other and from
        # what was consumed.
        held = [(p.epoch, i) for ps in lent.values() for p in ps for i in range(p.lo, p.hi)]
        assert len(held) == len(set(held))
        assert not set(held) & {(e, i) for e, ix in seen.items() for i in ix}
    for epoch, positions in seen.items():
        assert len(positions) == len(set(positions)), f"epoch {epoch}: a sample seen twice"
        assert ledger.consumed(epoch) == len(positions)
        if ledger.epochs[epoch].completed:
            assert sorted(positions) == list(range(size))


def test_ledger_gives_a_leavers_pieces_to_the_next_draw_first():
    ledger = SampleLedger(10)
    assert ledger.lend(0, 4) == (Piece(0, 0, 4),)
    assert ledger.lend(1, 4) == (Piece(0, 4, 8),)
    assert ledger.give_back(0) == 4
    # the oldest epoch's returned positions first, then the cursor, then a new epoch
    assert ledger.lend(2, 8) == (Piece(0, 0, 4), Piece(0, 8, 10), Piece(1, 0, 2))
    assert ledger.consume(1) == [] and ledger.consume(2) == [0]
    assert ledger.consumed(0) == 10 and ledger.consumed(1) == 2
    ledger.check_invariants()


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 30), ops=OPS)
def test_ledger_state_survives_a_checkpoint(size, ops):
    ledger = SampleLedger(size)
    for op, worker, n in ops:
        getattr(ledger, op)(*((worker, n) if op == "lend" else (worker,)))
    lent = sum(p.size for ps in ledger.lent.values() for p in ps)
    back = SampleLedger.from_state(ledger.to_state())
    back.check_invariants()  # what was lent is free again: redone after a resume
    assert not back.lent and sum(hi - lo for r in back.free.values() for lo, hi in r) == (
        lent + sum(hi - lo for r in ledger.free.values() for lo, hi in r))
    assert {e: c.consumed for e, c in back.epochs.items()} == {
        e: c.consumed for e, c in ledger.epochs.items()}
    with pytest.raises(ValueError, match="does not add up"):
        SampleLedger.from_state({**ledger.to_state(), "free": [], "cursor": 0, "epoch": 0,
                                 "consumed": {"0": size + 1}})


def test_piece_from_wire_refuses_bad_input():
    assert Piece.from_wire([1, 2, 3]) == Piece(1, 2, 3)
    for bad in ([1, 3, 2], [1, 2], "x", [-1, 0, 1], [0, 0, 1.5]):
        with pytest.raises(ValueError):
            Piece.from_wire(bad)


# ---- the batch rule --------------------------------------------------------------------------

@given(n=st.integers(1, 64), b=st.integers(1, 512), ref=st.integers(1, 16))
def test_keep_global_keeps_the_global_batch(n, b, ref):
    terms = BatchRule("keep-global", b, ref).terms(n)
    assert len(terms.batches) == n and min(terms.batches) >= 1
    assert max(terms.batches) - min(terms.batches) <= 1
    assert terms.global_batch == sum(terms.batches) == max(b * ref, n)
    assert terms.lr_scale == 1.0


def test_target_linear_and_fixed_rules():
    t = BatchRule.parse("target:100", 32, 2).terms(3)
    assert t.batches == (34, 34, 34) and t.global_batch == 102 >= 100
    lin = BatchRule.parse("linear", 32, 2)
    assert lin.terms(4).lr_scale == 2.0 and lin.terms(4).batches == (32,) * 4
    assert lin.terms(1).lr_scale == 0.5
    fixed = BatchRule.parse("fixed", 32, 2)
    assert fixed.changes_nothing and fixed.terms(3).global_batch == 96
    for bad in ("target", "target:x", "linear:3", "bigger"):
        with pytest.raises(ValueError):
            BatchRule.parse(bad, 32, 2)


def test_the_host_applies_the_rule_and_notes_it():
    host = PolicyHost(make_policy("bsp", 32), batch_rule=BatchRule("keep-global", 32, 2))
    out = host.joined_all([0, 1], 0.0)
    assert out[0] == Note("batch_rule", {"rule": "keep-global", "ranks": [0, 1], "workers": 2,
                                         "batches": [32, 32], "global_batch": 64,
                                         "lr_scale": 1.0})
    assert [d.batch_size for d in out if isinstance(d, Release)] == [32, 32]
    out = host.joined(2, 0.1, late=True)  # waits for the next round
    assert [type(d) for d in out] == [Note] and out[0].data["batches"] == [22, 21, 21]
    out = host.pushed(Pushed(0, 0, 1.0, 32, 0.1)) + host.pushed(Pushed(1, 0, 1.1, 32, 0.1))
    releases = [d for d in out if isinstance(d, Release)]
    assert [(d.worker, d.batch_size, d.round_size) for d in releases] == [
        (0, 22, 3), (1, 21, 3), (2, 21, 3)]
    out = host.left(1, 2.0)
    assert out[0].data["batches"] == [32, 32]

    linear = PolicyHost(make_policy("ssp", 16), batch_rule=BatchRule("linear", 16, 1))
    out = linear.joined_all([0, 1], 0.0)
    assert {d.scale for d in out if isinstance(d, Release)} == {2.0}


# ---- each policy's joins and leaves ----------------------------------------------------------

def releases(out):
    return [(d.worker, d.step) for d in out if isinstance(d, Release)]


def test_bsp_starts_a_late_joiner_at_the_next_round():
    p = make_policy("bsp", 8)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    assert p.handle(Joined(2, 0.1, late=True)) == []
    assert p.round_size() == 2  # the round in progress was sized without it
    assert p.handle(Pushed(0, 0, 1.0, 8, 0.1)) == []
    out = p.handle(Pushed(1, 0, 1.0, 8, 0.1))
    assert out[0] == ApplyRound(0, (0, 1))
    assert releases(out) == [(0, 1), (1, 1), (2, 1)] and p.round_size() == 3


def test_bsp_late_joiners_start_at_once_when_the_round_empties():
    p = make_policy("bsp", 8)
    p.handle(Joined(0, 0.0))
    p.handle(Joined(1, 0.1, late=True))
    assert releases(p.handle(Left(0, 0.2, "preempted"))) == [(1, 0)]
    lone = make_policy("bsp", 8)
    assert releases(lone.handle(Joined(5, 0.0, late=True))) == [(5, 0)]  # nobody to wait for


def test_bsp_leave_closes_the_round_without_the_leaver():
    p = make_policy("bsp", 8)
    for w in (0, 1, 2):
        p.handle(Joined(w, 0.0))
    p.handle(Pushed(0, 0, 1.0, 8, 0.1))
    p.handle(Pushed(1, 0, 1.0, 8, 0.1))
    out = p.handle(Left(2, 1.1, "preempted"))
    assert out[0] == ApplyRound(0, (0, 1)) and releases(out) == [(0, 1), (1, 1)]


def test_lbbsp_splits_the_rules_global_batch_over_the_newcomers_too():
    p = make_policy("lbbsp", 32)
    p.global_batch = 64
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    p.handle(Joined(2, 0.1, late=True))
    p.handle(Pushed(0, 0, 1.0, 32, 0.1))
    out = p.handle(Pushed(1, 0, 1.0, 32, 0.2))
    sizes = {d.worker: d.batch_size for d in out if isinstance(d, Release)}
    assert set(sizes) == {0, 1, 2} and sum(sizes.values()) == 64
    assert sizes[0] > sizes[1]  # worker 0 is the faster one
    note = next(d for d in out if isinstance(d, Note))
    assert note.data["global_batch"] == 64 and note.data["workers"] == [0, 1, 2]


def test_ssp_newcomer_starts_at_the_slowest_clock_and_a_leaver_frees_the_blocked():
    p = make_policy("ssp", 8, staleness=1)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    for step in (0, 1):
        p.handle(Pushed(0, step, 1.0 + step, 8, 0.1))
    assert 0 in p.blocked  # two ahead of worker 1
    assert releases(p.handle(Joined(2, 3.0, late=True))) == [(2, 0)]
    p.handle(Pushed(2, 0, 3.5, 8, 0.1))
    out = p.handle(Left(1, 4.0, "preempted"))
    assert releases(out) == [(0, 2)]  # the slowest is now worker 2, at clock 1


def test_ebsp_newcomer_is_monitored_or_waits_for_the_barrier():
    p = make_policy("ebsp", 8, lookahead=3)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    assert releases(p.handle(Joined(2, 0.1, late=True))) == [(2, 0)]  # monitoring: runs
    t = 0.0
    while not p.planned:
        t += 1.0
        for w in (0, 1, 2):
            if w not in p.held:
                p.handle(Pushed(w, p.last_step[w] + 1, t + 0.1 * w, 8, 0.1))
    assert p.handle(Joined(3, t, late=True)) == []  # planned: waits for the barrier
    out = p.handle(Left(0, t + 0.5, "preempted"))
    for _ in range(10):
        if releases(out):
            break
        t += 1.0
        out = []
        for w in (1, 2):
            if w not in p.held:
                out += p.handle(Pushed(w, p.last_step[w] + 1, t, 8, 0.1))
    assert (3, 0) in releases(out) and not p.planned  # the barrier let it in, a new plan


def test_r2sp_newcomer_waits_for_its_turn_in_the_rotation():
    p = make_policy("r2sp", 8, warmup=1)
    for w in (0, 1):
        p.handle(Joined(w, 0.0))
    p.handle(Pushed(0, 0, 1.0, 8, 0.1))  # the rotation starts
    assert p.throttling
    out = p.handle(Joined(2, 1.1, late=True))
    assert releases(out) == [] and 2 in p.waiting and p.rotation.turn == 1
    out = p.handle(Left(1, 1.2, "preempted"))  # the turn passes on to the newcomer
    assert p.rotation.ids == [0, 2] and releases(out) == [(2, 0)]


# ---- the coordinator core of an elastic job --------------------------------------------------

def elastic_job(sync="bsp", lo=2, hi=4, rule="fixed", start_timeout=60.0) -> JobSpec:
    return JobSpec(workers=hi, min_workers=lo, servers=1, batch_size=8, num_keys=10,
                   sync=SyncSpec(sync), eval_interval=0.0, batch_rule=rule,
                   limits=Limits(heartbeat_timeout=5.0, start_timeout=start_timeout))


def boot(state, n):
    state.handle(Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1"))
    for w in range(n):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"r-w{w}"))
    out = []
    for w in range(n):
        out += state.handle(Started(f"w{w}", 0.5, to=f"s-w{w}", data_len=20))
    return out


def kinds(out):
    return [i.kind for i in out if isinstance(i, AppendEvent)]


def test_elastic_job_opens_at_min_takes_joiners_refuses_past_max():
    state = CoordinatorState(elastic_job())
    out = boot(state, 2)
    assert "barrier_open" in kinds(out)
    sent = [i for i in out if isinstance(i, SendRelease)]
    assert [i.samples for i in sent] == [[[0, 0, 8]], [[0, 8, 16]]]
    state.handle(Registered("w2", "worker", 1.0, to="r-w2"))
    out = state.handle(Started("w2", 1.1, to="s-w2", data_len=20))
    assert kinds(out) == ["batch_rule", "worker_joined"] or "worker_joined" in kinds(out)
    assert not [i for i in out if isinstance(i, SendRelease)]  # next round
    state.handle(Registered("w3", "worker", 1.2, to="r-w3"))
    out = state.handle(Registered("w4", "worker", 1.3, to="r-w4"))
    assert any(isinstance(i, Reply) and i.op == "error" and "at most 4" in i.fields["msg"]
               for i in out)
    state.handle(Clocked("w0", 0, 8, 0.1, 2.0, to="c0"))
    out = state.handle(Clocked("w1", 0, 8, 0.1, 2.1, to="c1"))
    sent = {i.to: i for i in out if isinstance(i, SendRelease)}
    assert set(sent) == {"c0", "c1", "s-w2"} and sent["s-w2"].step == 1
    assert {i.round_size for i in sent.values()} == {3}
    # every position once: 16 consumed by round 0, the next 24 lent across the epoch's end
    lent = sorted((e, lo, hi) for i in sent.values() for e, lo, hi in i.samples)
    assert lent == [(0, 16, 20), (1, 0, 4), (1, 4, 12), (1, 12, 20)]
    assert "epoch_samples" not in kinds(out)
    state.check_invariants()


def test_elastic_job_waits_below_min_and_goes_on_when_a_worker_joins():
    state = CoordinatorState(elastic_job(sync="ssp", lo=2, hi=3, start_timeout=10.0))
    boot(state, 2)
    out = state.handle(Clocked("w0", 0, 8, 0.1, 1.0, to="c0", leave="preempted"))
    assert any(isinstance(i, Reply) and i.to == "c0" and i.op == "ok" for i in out)
    assert not [i for i in out if isinstance(i, SendRelease)]
    assert "worker_left" in kinds(out) and "waiting_for_workers" in kinds(out)
    assert any(isinstance(i, Warn) and "fewer than the minimum 2" in i.message for i in out)
    out = state.handle(Clocked("w1", 0, 8, 0.1, 1.5, to="c1"))
    assert not [i for i in out if isinstance(i, SendRelease)]  # held: below MIN
    state.handle(Registered("w9", "worker", 2.0, to="r-w9"))
    out = state.handle(Started("w9", 2.5, to="s-w9", data_len=20))
    assert "workers_back" in kinds(out)
    assert {i.to for i in out if isinstance(i, SendRelease)} == {"c1", "s-w9"}
    state.check_invariants()
    # a job left below MIN past the limit fails, naming why
    state.handle(Bye("w9", 3.0, to="b9", reason="preempted"))
    assert state.next_wakeup() <= 3.0 + 10.0
    out = state.handle(TimePassed(3.0 + 11.0))
    assert any(isinstance(i, AppendEvent) and i.kind == "job_failed"
               and "fewer than 2 workers" in i.data["reason"] for i in out)


def test_a_worker_that_leaves_gives_its_samples_back():
    state = CoordinatorState(elastic_job(lo=3, hi=4))
    boot(state, 3)
    out = state.handle(Bye("w2", 1.0, to="b2", reason="preempted"))
    left = next(i for i in out if isinstance(i, AppendEvent) and i.kind == "worker_left")
    assert left.data["samples_returned"] == 8 and left.data["reason"] == "preempted"
    assert "waiting_for_workers" in kinds(out)  # 2 left of MIN 3
    state.handle(Clocked("w0", 0, 8, 0.1, 2.0, to="c0"))
    state.handle(Clocked("w1", 0, 8, 0.1, 2.1, to="c1"))
    state.handle(Registered("w3", "worker", 2.2, to="r-w3"))
    out = state.handle(Started("w3", 2.3, to="s-w3", data_len=20))
    assert "workers_back" in kinds(out)
    # the leaver's positions [16, 20) come first, then the next epoch
    lent = sorted(tuple(p) for i in out if isinstance(i, SendRelease) for p in i.samples)
    assert lent[0] == (0, 16, 20) and state.elastic.ledger.consumed(0) == 16


def test_an_elastic_jobs_checkpoint_keeps_its_ledger(tmp_path):
    from paramserver.coordinator.events import SaveCoordinatorState, ShardSaved
    from paramserver.spec.job import CheckpointSpec
    import dataclasses
    job = dataclasses.replace(elastic_job(), checkpoint=CheckpointSpec(str(tmp_path), 1))
    state = CoordinatorState(job)
    boot(state, 2)
    state.handle(Clocked("w0", 0, 8, 0.1, 2.0, to="c0"))
    state.handle(Clocked("w1", 0, 8, 0.1, 2.1, to="c1"))
    out = state.handle(ShardSaved("s0", "000000001", 2.2))
    saved = next(i for i in out if isinstance(i, SaveCoordinatorState)).state
    resumed = CoordinatorState(job, resume=saved)
    ledger = resumed.elastic.ledger
    assert ledger.consumed(0) == 16 and ledger.cursor == 16 + 16 - 20 and ledger.epoch == 1
    # round 1's releases were lent when the checkpoint was asked for: free again on a resume
    assert ledger.free[0] == [(16, 20)] and sorted(ledger.free[1]) == [(0, 4), (4, 12)]


def test_elastic_start_needs_the_training_set_size():
    state = CoordinatorState(elastic_job())
    state.handle(Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1"))
    state.handle(Registered("w0", "worker", 0.1, to="r-w0"))
    out = state.handle(Started("w0", 0.5, to="s-w0"))
    assert any(isinstance(i, Reply) and i.op == "error" and "data_len" in i.fields["msg"]
               for i in out)
    state.handle(Registered("w1", "worker", 0.1, to="r-w1"))
    state.handle(Started("w1", 0.5, to="s-w1", data_len=20))
    state.handle(Registered("w2", "worker", 0.1, to="r-w2"))
    out = state.handle(Started("w2", 0.5, to="s-w2", data_len=21))
    assert any(isinstance(i, Reply) and i.op == "error" and "same data" in i.fields["msg"]
               for i in out)


def test_worker_count_and_the_job_fields():
    assert WorkerCount.parse("3") == WorkerCount(3, 3)
    assert WorkerCount.parse("2:5") == WorkerCount(2, 5, True)
    for bad in ("5:2", "0:3", "a:b", "2:"):
        with pytest.raises(JobSpecError):
            WorkerCount.parse(bad)
    job = elastic_job(rule="keep-global")
    assert JobSpec.from_dict(job.to_dict()) == job
    fixed = JobSpec(workers=3)
    assert (fixed.to_dict()["min_workers"], fixed.to_dict()["batch_rule"]) == (0, "fixed")
    with pytest.raises(JobSpecError, match="batch_rule"):
        JobSpec(workers=3, batch_rule="linear")
    with pytest.raises(JobSpecError, match="min_workers"):
        JobSpec(workers=3, min_workers=4)


# ---- the report's timeline and the console -----------------------------------------------------

def test_membership_timeline_reads_the_changes_in_training_seconds():
    from paramserver.report.core.timeline import membership_timeline
    events = [{"t": 1.0, "event": "start"}, {"t": 3.0, "event": "barrier_open", "workers": 2},
              {"t": 4.0, "event": "apply_round", "step": 0},
              {"t": 5.5, "event": "worker_joined", "worker": 2, "round": 9, "workers": 3},
              {"t": 6.0, "event": "worker_left", "worker": 0, "reason": "preempted",
               "samples_returned": 0, "workers": 2},
              {"t": 6.0, "event": "waiting_for_workers", "workers": 2, "min_workers": 3},
              {"t": 7.0, "event": "worker_left", "worker": 1, "reason": "done"},
              "not a record", {"t": 0.5, "event": "restart"},
              {"t": 1.0, "event": "taken_back", "servers": 1, "workers": 2, "round": 12}]
    rows = membership_timeline(events)
    assert [(r.t, r.kind) for r in rows] == [
        (2.5, "worker_joined"), (3.0, "worker_left"), (3.0, "waiting_for_workers"),
        (5.0, "taken_back")]  # the restarted coordinator's clock goes on from the last event
    assert rows[1].text == "worker 0 left: preempted (2 training)"


def test_the_progress_line_says_when_the_job_waits(tmp_path):
    from paramserver.runlog.progress import MetricsTail
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "membership", "change": "joined", "worker": 2, "workers": 3}\n'
                    '{"kind": "membership", "change": "waiting", "workers": 1, '
                    '"min_workers": 2}\n')
    tail = MetricsTail(path)
    tail.poll()
    assert "WAITING for workers: 1 training, fewer than the minimum 2" in tail.describe()
    assert tail.notices[0] == "worker 2 joined: 3 training"
    with open(path, "a") as f:
        f.write('{"kind": "membership", "change": "back", "workers": 2}\n')
    tail.poll()
    assert tail.describe().endswith("workers 2") and tail.notices[-1].startswith("training again")


def test_the_ledger_sampler_draws_the_pieces_it_is_fed():
    import torch
    from paramserver.data.ledger_sampler import LedgerSampler, epoch_order
    X, y = torch.arange(20, dtype=torch.float32).reshape(10, 2), torch.arange(10)
    sampler = LedgerSampler(X, y, seed=3)
    sampler.feed([[0, 2, 5], [1, 0, 1]])
    xb, yb = sampler.next_batch(4)
    want = list(epoch_order(10, 3, 0)[2:5]) + [epoch_order(10, 3, 1)[0]]
    assert yb.tolist() == want and sampler.samples_drawn == 4 and sampler.epoch == 1.1
    sampler.feed([[0, 0, 2]])
    with pytest.raises(ValueError, match="hold 2 samples, its batch is 3"):
        sampler.next_indices(3)
    sampler.feed(None)  # a release without pieces: the worker's own stream
    assert len(sampler.next_indices(3)) == 3
