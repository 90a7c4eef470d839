"""The shard's core driven by events alone: no sockets, no processes, no sleeps."""

import itertools

import numpy as np
import pytest

from paramserver.server.core import ShardCore
from paramserver.server.events import (
    ApplyRound, Checkpoint, Heartbeat, Init, Pull, Push, PushSparse, Reply, Restore, SaveShard,
    ShardSettings, Shutdown, Status, Stop, Then, TimePassed, ToCoordinator,
)

N = 4
LR = 0.5


def core(mode="arrival", pull_timeout=10.0, heartbeat_interval=1.0, **kw):
    c = ShardCore(ShardSettings(rank=3, lo=0, hi=N, dtype="float64", apply_mode=mode,
                                optimizer="sgd", lr=LR, pull_timeout=pull_timeout,
                                heartbeat_interval=heartbeat_interval, **kw))
    assert run(c, Init("i", 0, N, np.arange(N, dtype=np.float64))) == [
        Reply("i", "ack", {"version": 0, "staleness": 0})]
    return c


def run(c, event):
    """What the node carries out for `event`: a Then's event is fed back in its place."""
    out = c.handle(event)
    if not any(type(ins) is Then for ins in out):
        return out
    return [x for ins in out for x in (run(c, ins.event) if type(ins) is Then else [ins])]


RIDS = itertools.count(1000)


def push(to, sender, value, step=0, rid=None, round_size=0, batch=1, version=0):
    return Push(to, sender, next(RIDS) if rid is None else rid, 0, N,
                np.full(N, float(value)), step, batch, version, 1.0, round_size)


def values(c):
    return c.store.values.numpy().copy()


def ops(out):
    return [(type(i).__name__, getattr(i, "to", None), getattr(i, "op", None)) for i in out]


# ---- arrival mode --------------------------------------------------------------------------------
def test_an_arrival_push_applies_at_once_and_bumps_the_version():
    c = core()
    out = run(c, push("p1", "w0", 1.0))
    assert out == [Reply("p1", "ack", {"version": 1, "staleness": 0})]
    np.testing.assert_allclose(values(c), np.arange(N) - LR)
    out = run(c, push("p2", "w1", 2.0, version=0))  # computed from version 0: one behind
    assert out == [Reply("p2", "ack", {"version": 2, "staleness": 1})]
    np.testing.assert_allclose(values(c), np.arange(N) - LR * 3)
    assert c.store.updates_applied == 2


def test_a_push_before_init_and_a_range_outside_the_shard_are_refused():
    c = ShardCore(ShardSettings(rank=0, lo=0, hi=N, dtype="float64", apply_mode="arrival",
                                optimizer="sgd", lr=LR))
    [err] = run(c, push("p", "w0", 1.0))
    assert (err.to, err.op, err.fields["code"]) == ("p", "error", "refused")
    assert "not initialized" in err.fields["msg"]
    run(c, Init("i", 0, N, np.zeros(N)))
    [err] = run(c, Pull("q", 0.0, 0, 0, N + 1))
    assert err.op == "error" and "outside this shard" in err.fields["msg"]
    assert len(c.pulls) == 0  # a refused pull does not wait


# ---- exactly once --------------------------------------------------------------------------------
def test_a_retried_push_is_answered_from_the_dedup_table_and_not_applied_twice():
    c = core()
    first = run(c, push("p1", "w0", 1.0, rid=7))
    after = values(c)
    again = run(c, push("p1-retry", "w0", 1.0, rid=7))
    assert again == [Reply("p1-retry", "ack", first[0].fields)]
    np.testing.assert_array_equal(values(c), after)
    assert c.store.version == 1 and c.retries.duplicates == 1
    # The same request id from another sender is another push.
    assert run(c, push("p2", "w1", 1.0, rid=7))[0].fields["version"] == 2
    # The next heartbeat tells the count, the one after says nothing new.
    [beat] = run(c, TimePassed(100.0))
    assert beat == Heartbeat({"late_pushes": 0, "duplicates": 1})
    assert run(c, TimePassed(101.0)) == [Heartbeat(None)]


def test_the_nodes_busy_time_rides_on_the_heartbeat_when_it_changed():
    """The core has no clock: the node's measured busy seconds come in TimePassed, and the
    heartbeat tells them (to the millisecond) beside the loss counters."""
    c = core()
    assert run(c, TimePassed(0.0)) == [Heartbeat(None)]  # nothing measured yet
    [beat] = run(c, TimePassed(10.0, busy=0.25))
    assert beat == Heartbeat({"late_pushes": 0, "duplicates": 0, "busy_s": 0.25})
    assert run(c, TimePassed(20.0, busy=0.2501)) == [Heartbeat(None)]  # the same ms: quiet
    [beat] = run(c, TimePassed(30.0, busy=1.0))
    assert beat.counters["busy_s"] == 1.0


def test_a_retried_sparse_push_is_applied_once_too():
    c = core()
    ev = PushSparse("s", "w0", 5, np.array([1, 3]), np.array([1.0, 1.0]), 0, 1, 0)
    run(c, ev)
    run(c, ev)
    np.testing.assert_allclose(values(c), [0, 1 - LR, 2, 3 - LR])
    assert c.retries.duplicates == 1 and c.store.version == 1


# ---- round mode ----------------------------------------------------------------------------------
def test_round_pushes_aggregate_and_the_round_applies_when_round_size_pushed():
    c = core("round")
    before = values(c)
    out = run(c, push("a", "w0", 1.0, round_size=2, batch=1))
    assert out == [Reply("a", "ack", {"version": 0, "staleness": 0})]
    np.testing.assert_array_equal(values(c), before)  # aggregated, not applied
    out = run(c, push("b", "w1", 4.0, round_size=2, batch=3))
    assert out == [Reply("b", "ack", {"version": 0, "staleness": 0})]
    assert c.store.version == 1 and c.store.last_round == 0
    np.testing.assert_allclose(values(c), before - LR * (1 * 1.0 + 3 * 4.0) / 4)


def test_a_full_round_is_applied_once_when_the_coordinators_apply_round_comes_after():
    c = core("round")
    run(c, push("a", "w0", 1.0, round_size=2))
    run(c, push("b", "w1", 3.0, round_size=2))
    applied = values(c)
    assert c.store.updates_applied == 1
    assert run(c, ApplyRound("coord", 0)) == []  # no reply, nothing applied
    assert c.store.version == 1 and c.store.updates_applied == 1
    np.testing.assert_array_equal(values(c), applied)
    # The next round is untouched by the late word about the last one.
    run(c, push("c", "w0", 1.0, step=1, round_size=2))
    assert run(c, ApplyRound("coord", 0)) == []
    assert c.store.round_step == 1 and c.store.version == 1


def test_the_last_push_of_a_round_is_acked_before_the_round_is_applied():
    c = core("round")
    run(c, push("a", "w0", 1.0, round_size=2))
    ack, then = c.handle(push("b", "w1", 3.0, round_size=2))
    # The ack leaves first: the shard applies while the pusher's clock is on its way.
    assert ack == Reply("b", "ack", {"version": 0, "staleness": 0})
    assert type(then) is Then and then.event.step == 0
    assert c.store.version == 0 and c.store.updates_applied == 0
    assert c.handle(then.event) == [] and c.store.version == 1


def test_without_a_round_size_the_coordinator_applies_the_round():
    c = core("round")
    run(c, push("a", "w0", 1.0))
    run(c, push("b", "w1", 3.0))
    run(c, push("c", "w2", 5.0))
    assert c.store.version == 0 and c.store.round_step == 0
    assert run(c, ApplyRound("coord", 0)) == []
    assert c.store.version == 1
    np.testing.assert_allclose(values(c), np.arange(N) - LR * 3.0)
    # A push for the round just applied comes too late: dropped, counted, told in a beat.
    assert run(c, push("d", "w3", 100.0))[0].fields == {"version": 1, "staleness": 1}
    assert c.store.late_pushes == 1 and c.store.round_step is None
    assert run(c, TimePassed(0.0)) == [Heartbeat({"late_pushes": 1, "duplicates": 0})]


def test_apply_round_for_a_step_other_than_the_open_one_is_refused_to_the_coordinator():
    c = core("round")
    run(c, push("a", "w0", 1.0, step=2))
    [err] = run(c, ApplyRound("coord", 1))
    assert (err.to, err.op, err.fields["code"]) == ("coord", "error", "refused")
    assert c.store.version == 0


# ---- pulls that wait -----------------------------------------------------------------------------
def test_a_pull_ahead_waits_and_is_answered_by_the_round_that_reaches_it():
    c = core("round")
    assert run(c, Pull("q", 5.0, 1, 0, N)) == ()
    assert len(c.pulls) == 1 and c.next_wakeup() == -float("inf")  # the first beat is due
    run(c, push("a", "w0", 2.0, round_size=2))
    assert len(c.pulls) == 1
    out = run(c, push("b", "w1", 2.0, round_size=2))
    # The pusher's ack leaves first, then the values of the round it completed.
    assert ops(out) == [("Reply", "b", "ack"), ("Reply", "q", "values")]
    reply = out[1]
    assert reply.fields == {"version": 1, "range": [0, N]} and reply.lend
    np.testing.assert_allclose(reply.arrays[0], np.arange(N) - LR * 2.0)
    # Zero copy: the reply is a view of the live values, not a copy of them.
    assert np.shares_memory(reply.arrays[0], c.store.values.numpy())
    assert len(c.pulls) == 0


def test_a_pull_ahead_is_answered_by_the_arrival_push_that_reaches_it():
    c = core()
    assert run(c, Pull("q", 0.0, 2, 1, 3)) == ()
    assert ops(run(c, push("a", "w0", 1.0))) == [("Reply", "a", "ack")]
    out = run(c, push("b", "w0", 1.0))
    assert ops(out) == [("Reply", "q", "values"), ("Reply", "b", "ack")]
    assert out[0].fields == {"version": 2, "range": [1, 3]}
    np.testing.assert_allclose(out[0].arrays[0], [1 - 2 * LR, 2 - 2 * LR])


def test_a_pull_ahead_is_answered_by_the_coordinators_apply_round():
    c = core("round")
    run(c, push("a", "w0", 1.0))
    run(c, Pull("q", 0.0, 1, 0, N))
    out = run(c, ApplyRound("coord", 0))
    assert ops(out) == [("Reply", "q", "values")] and out[0].fields["version"] == 1


def test_a_waiting_pull_times_out_at_its_deadline_in_event_time():
    c = core(pull_timeout=10.0)
    run(c, TimePassed(0.0))  # the first heartbeat; the next is due at 1.0
    assert run(c, Pull("q", 3.0, 5, 0, N)) == ()
    assert run(c, Pull("q", 4.0, 5, 0, N)) == ()  # a retry: no second place in the queue
    assert len(c.pulls) == 1
    run(c, TimePassed(12.9))
    assert c.next_wakeup() == 13.0
    assert len(c.pulls) == 1
    out = run(c, TimePassed(13.0))
    assert out == [Reply("q", "error", {"msg": "server s3 waited 10 s for version 5 (at 0)",
                                        "code": "timeout"})]
    assert len(c.pulls) == 0 and c.next_wakeup() == 13.9
    # Expired is gone: reaching the version later answers nobody.
    for i in range(5):
        assert ops(run(c, push(f"p{i}", "w0", 0.0, rid=i))) == [("Reply", f"p{i}", "ack")]


def uninitialized(pull_timeout=1.0):
    return ShardCore(ShardSettings(rank=0, lo=0, hi=N, dtype="float64", apply_mode="arrival",
                                   optimizer="sgd", lr=LR, pull_timeout=pull_timeout))


def test_a_pull_before_init_waits_for_the_initial_values():
    c = uninitialized()
    assert run(c, Pull("q", 0.0, 0, 0, N)) == ()
    assert run(c, TimePassed(0.5)) == [Heartbeat(None)]
    out = run(c, Init("i", 0, N, np.ones(N)))
    assert ops(out) == [("Reply", "q", "values"), ("Reply", "i", "ack")]
    np.testing.assert_array_equal(out[0].arrays[0], np.ones(N))
    c = uninitialized()
    run(c, Pull("q", 0.0, 0, 0, N))
    err, beat = run(c, TimePassed(1.0))
    assert err.fields["msg"] == "server s0 waited 1 s for initial values"
    assert isinstance(beat, Heartbeat)


def test_an_update_while_a_reply_is_out_copies_on_write():
    c = core()
    [reply] = run(c, Pull("q", 0.0, 0, 0, N))
    sent = reply.arrays[0]

    class Loan:
        done = False
    c.lend(Loan())
    run(c, push("p", "w0", 1.0))
    np.testing.assert_array_equal(sent, np.arange(N))  # the reply in flight saw no change
    np.testing.assert_allclose(values(c), np.arange(N) - LR)
    assert c.store.copies_on_write == 1


# ---- sparse --------------------------------------------------------------------------------------
def test_sparse_push_and_pull():
    c = core()
    keys = np.array([3, 0, 3], dtype=np.int64)
    out = run(c, PushSparse("s", "w0", 1, keys, np.array([1.0, 2.0, 4.0]), 0, 1, 0))
    assert out == [Reply("s", "ack", {"version": 1, "staleness": 0})]
    np.testing.assert_allclose(values(c), [0 - 2 * LR, 1, 2, 3 - 5 * LR])
    [reply] = run(c, Pull("k", 0.0, 1, keys=np.array([3, 1], dtype=np.int64)))
    assert reply.fields == {"version": 1} and not reply.lend
    np.testing.assert_allclose(reply.arrays[0], [3 - 5 * LR, 1])
    [err] = run(c, Pull("k2", 0.0, keys=np.array([1.0])))
    assert err.fields["msg"] == "keys must be int64"
    [err] = run(c, PushSparse("s2", "w0", 2, np.array([1.0]), np.array([1.0]), 0, 1, 0))
    assert err.fields["msg"] == "sparse keys must be int64"
    [err] = run(c, Pull("k3", 0.0, keys=np.array([N], dtype=np.int64)))
    assert "outside this shard" in err.fields["msg"]


def test_sparse_pushes_make_a_full_round_and_a_waiting_sparse_pull_gets_it():
    c = core("round")
    keys = np.array([1, 2], dtype=np.int64)
    assert run(c, Pull("k", 0.0, 1, keys=keys)) == ()
    run(c, PushSparse("a", "w0", 1, keys, np.array([1.0, 1.0]), 0, 1, 0, 1.0, 2))
    out = run(c, PushSparse("b", "w1", 1, keys, np.array([3.0, 3.0]), 0, 1, 0, 1.0, 2))
    assert ops(out) == [("Reply", "b", "ack"), ("Reply", "k", "values")]
    np.testing.assert_allclose(out[1].arrays[0], [1 - 2 * LR, 2 - 2 * LR])


# ---- heartbeats, status, checkpoints, the end ----------------------------------------------------
def test_heartbeats_follow_event_time():
    c = core(heartbeat_interval=2.0)
    assert run(c, TimePassed(10.0)) == [Heartbeat(None)]
    assert c.next_wakeup() == 12.0
    assert run(c, TimePassed(11.9)) == ()
    assert run(c, TimePassed(12.0)) == [Heartbeat(None)]


def test_status_tells_the_shards_counters():
    c = core()
    run(c, Pull("q", 0.0, 9, 0, N))
    [reply] = run(c, Status("st"))
    assert reply.op == "state"
    assert reply.fields["state"] == {
        "rank": 3, "range": [0, N], "version": 0, "initialized": True, "updates_applied": 0,
        "lost_updates": 0, "duplicates": 0, "refused_retries": 0, "refused_pushes": 0,
        "refused_pulls": 0, "late_pushes": 0, "copies_on_write": 0, "unclipped_rounds": 0,
        "pending_pulls": 1}


def test_checkpoint_then_restore_keeps_values_version_and_the_dedup_table():
    c = core()
    run(c, push("p", "w0", 1.0, rid=11))
    (save,) = run(c, Checkpoint("coord", "t1", "/ckpt"))
    # The answer goes once the part is on disk (the node writes it, then sends `done`).
    assert save == SaveShard("t1", "/ckpt", save.arrays, save.meta, save.done)
    assert save.done == Reply("coord", "saved", {"tag": "t1", "version": 1})
    assert save.meta["version"] == 1 and save.meta["applied"] == [["w0", [[11, {
        "version": 1, "staleness": 0}]]]]
    arrays = {k: v.copy() for k, v in save.arrays.items()}  # as read back from the files

    fresh = ShardCore(c.settings)
    fresh.handle(Pull("q", 0.0, 3, 0, N))
    out = fresh.handle(Restore("t1", arrays, save.meta, version_floor=3, announce=True))
    assert ops(out) == [("Reply", "q", "values"), ("ToCoordinator", None, "restored")]
    assert out[1] == ToCoordinator("restored", {"tag": "t1", "lost_updates": 2, "version": 3})
    np.testing.assert_allclose(values(fresh), np.arange(N) - LR)
    assert fresh.lost_updates == 2 and fresh.store.initialized
    # A retry of the push saved in the checkpoint is answered, not applied again.
    assert fresh.handle(push("p-retry", "w0", 1.0, rid=11)) == [
        Reply("p-retry", "ack", {"version": 1, "staleness": 0})]
    assert fresh.store.version == 3 and fresh.retries.duplicates == 1
    # Without announce (a planned start from a checkpoint) the coordinator is not told.
    assert ShardCore(c.settings).handle(Restore("t1", arrays, save.meta)) == []



def test_a_fresh_restore_drops_what_the_shard_held_its_retries_included():
    """A backup promoted before it was synced (coordinator/orphans.py) restores the latest
    checkpoint over what it had of its primary: a push it held but the checkpoint does not is
    applied again when retried (it is not answered from a dedup table the restore replaced),
    and the updates since the checkpoint are counted lost."""
    c = core("round")
    run(c, push("p", "w0", 1.0, rid=11, round_size=1))
    (save,) = run(c, Checkpoint("coord", "t1", "/ckpt"))
    arrays = {k: v.copy() for k, v in save.arrays.items()}
    backup = core("round")  # (as a sync would have left it: both pushes, their replies kept)
    run(backup, push("p", "w0", 1.0, rid=11, round_size=1))
    run(backup, push("q", "w0", 2.0, step=1, rid=12, round_size=1))
    run(backup, push("r", "w1", 4.0, step=2, rid=13, round_size=2))  # a round left open
    assert backup.store.round_step is not None
    out = backup.handle(Restore("t1", arrays, save.meta, version_floor=2, announce=True,
                                fresh=True))
    assert out[-1] == ToCoordinator("restored", {"tag": "t1", "lost_updates": 1, "version": 2})
    np.testing.assert_allclose(values(backup), np.arange(N) - LR)
    assert backup.store.round_step is None and not backup.store.round_got  # nothing left over
    assert run(backup, push("q-retry", "w0", 2.0, step=1, rid=12, round_size=1)) == [
        Reply("q-retry", "ack", {"version": 2, "staleness": 2})]  # applied, not answered
    np.testing.assert_allclose(values(backup), np.arange(N) - 3 * LR)

def test_shutdown_stops_the_node():
    c = core()
    assert run(c, Shutdown("coord")) == [Stop()] and c.stopped


@pytest.mark.parametrize("mode", ["arrival", "round"])
def test_a_push_never_copies_its_gradient_on_the_way_in(mode, monkeypatch):
    """The event carries the received array itself down to the update rule / the round sum."""
    c = core(mode)
    grad = np.full(N, 1.0)
    seen = []
    if mode == "arrival":
        apply = c.store.rule.apply

        def spy(values, index, g, *args, **kwargs):
            seen.append(g)
            return apply(values, index, g, *args, **kwargs)
        monkeypatch.setattr(c.store.rule, "apply", spy)
        run(c, Push("p", "w0", 1, 0, N, grad, 0, 1, 0))
        assert np.shares_memory(seen[0].numpy(), grad)
    else:
        run(c, Push("p", "w0", 1, 0, N, grad, 0, 2, 0))
        np.testing.assert_allclose(c.store.round_sum.numpy(), 2 * grad)


def test_a_welcomes_server_job_reaches_the_shards_settings_field_for_field():
    """Every setting the welcome's ServerJob carries arrives in ShardSettings (none left at a
    default on the way): a setting both declare by one name needs no mapping of its own."""
    import dataclasses

    from paramserver.server.events import RestoreFrom, ShardSettings
    from paramserver.server.node import shard_settings
    from paramserver.spec.job import OptimizerSpec, TableSpec
    from paramserver.spec.welcome import ServerJob, ShardRestore
    from paramserver.wire import Message
    job = ServerJob((10, 50), "float64", "round", OptimizerSpec("adam", 0.01, {"eps": 1e-6}),
                    0.25, 7.5, 3, ShardRestore("/ck", "t4", 9, True, True),
                    (TableSpec("emb", 4),), 3, "/ck0", 1 << 20, 17, 23, 5, 4096, 2)
    s = shard_settings(Message("welcome", {"job": job.to_dict(), "rank": 2}), 12.0)
    assert (s.rank, s.lo, s.hi, s.pull_timeout) == (2, 10, 50, 12.0)
    assert (s.optimizer, s.lr, s.optimizer_options) == ("adam", 0.01, {"eps": 1e-6})
    assert s.restore == RestoreFrom("/ck", "t4", 9, True, True)
    for f in dataclasses.fields(ServerJob):
        if f.name in {x.name for x in dataclasses.fields(ShardSettings)} - {"optimizer",
                                                                             "restore"}:
            got, sent = getattr(s, f.name), getattr(job, f.name)
            assert got == sent, f.name
            assert got != f.default, f"{f.name}: the test must send a value off its default"
