"""Replicated shards on the pure cores (no sockets): the primary's Forwarder, a backup's core
kept identical by the same requests in the same order (and by a state sync mid-stream), the
takeover's exactly-once, and the coordinator's Replicas (attach, sync, promotion, loss). The
live check is tests/server/test_replicas_live.py (slow)."""

from dataclasses import replace

import numpy as np
import pytest

from paramserver.coordinator.events import (
    AppendEvent, Registered, ReplicaReport, Reply, ToServers,
)
from paramserver.coordinator.membership import Membership
from paramserver.coordinator.replicas import Replicas
from paramserver.server.core import ShardCore
from paramserver.server.events import Init, LayoutKnown, LoadSync, Push, ShardSettings, Then
from paramserver.server.replication import ForwardRing, Forwarder, sync_payload
from ps_helpers import known_gradient

KEYS = 12


# ---- the Forwarder -------------------------------------------------------------------------------
def test_replies_wait_for_the_backups_ack_in_order():
    fw = Forwarder(window=4, timeout=5.0)
    assert fw.forward(0.0) is None and fw.hold(None, ["r"]) == ["r"]  # no backup: nothing waits
    sync = fw.attach("tcp://b", 1, 0.0)
    one, two = fw.forward(0.1), fw.forward(0.2)
    assert (sync, one, two) == (1, 2, 3)
    assert fw.hold(one, ["ack1"]) == [] and fw.hold(two, ["ack2", "err2"]) == []
    assert fw.acked(1, sync) == ([], True)  # the sync made it live
    assert fw.acked(99, two) == ([], False)  # another link's ack: nothing
    assert fw.acked(1, two) == (["ack1", "ack2", "err2"], False)  # in order, up to seq
    assert fw.acked(1, one) == ([], False)  # one already had
    assert fw.hold(one, ["late"]) == ["late"]  # acked before the reply was made


def test_the_window_bounds_forwards_in_flight_and_a_silent_backup_is_reported_once():
    fw = Forwarder(window=2, timeout=1.0)
    fw.attach("tcp://b", 1, 0.0)
    fw.forward(0.5)
    assert fw.full and fw.next_deadline() == 1.0
    assert fw.expired(0.9) is None
    why = fw.expired(1.5)
    assert "tcp://b" in why and "forward 1" in why
    assert fw.expired(2.0) is None  # reported once; the coordinator decides
    fw.hold(2, ["ack"])
    assert fw.dropped() == ["ack"] and not fw.active and not fw.full


def test_a_refusing_backup_is_reported_and_a_new_one_starts_with_the_sync():
    fw = Forwarder()
    fw.attach("tcp://b", 1, 0.0)
    assert "refused forward 1: differs" in fw.refused(1, "differs")
    assert fw.refused(1, "again") is None
    with pytest.raises(ValueError):
        fw.attach("tcp://c", 2, 1.0)  # the old backup's forwards must be dropped first
    fw.dropped()
    assert fw.attach("tcp://c", 2, 1.0) == 1 and fw.epoch == 2



def test_an_inits_ack_waits_for_a_backup_that_holds_it_whatever_backup_that_is():
    """A replicated shard's start is never acknowledged by one copy alone: an init taken with
    no backup waits for the next backup's sync, and one forwarded to a backup dropped before
    its ack waits for the next backup too (a push's reply goes at the drop, as before)."""
    fw = Forwarder(window=4, timeout=5.0)
    assert fw.hold_init(None, ["init-ack"]) == []  # no backup yet: held
    assert fw.hold(None, ["push-ack"]) == ["push-ack"]  # (a push without backup goes)
    sync = fw.attach("tcp://b", 1, 0.0)
    one = fw.forward(0.1)
    assert fw.hold_init(one, ["init-ack-2"]) == [] and fw.hold(one, ["push-ack-2"]) == []
    assert fw.dropped() == ["push-ack-2"]  # the backup died unsynced: the inits stay held
    sync = fw.attach("tcp://c", 2, 1.0)
    assert fw.acked(1, sync) == ([], False)  # the dropped backup's ack: nothing
    assert fw.acked(2, sync) == (["init-ack", "init-ack-2"], True)  # C's sync holds both
    two = fw.forward(1.1)
    assert fw.hold_init(two, ["init-ack-3"]) == []
    assert fw.acked(2, two) == (["init-ack-3"], False)
    assert fw.hold_init(two, ["late"]) == ["late"]  # acknowledged already

def test_the_forward_ring_reuses_a_region_only_after_its_forward_is_acknowledged():
    ring = ForwardRing(1024)
    assert ring.take(1, 400) == 0 and ring.take(2, 400) == 448  # 64-byte aligned
    assert ring.take(3, 400) is None  # 176 bytes left at the end, and the start is in use
    ring.release(1)  # the backup acknowledged forward 1: its region is free again
    assert ring.take(3, 400) == 0  # wraps to the start
    assert ring.take(4, 64) is None  # between 3's end (448) and 2's start (448): nothing
    ring.release(2)
    assert ring.take(4, 500) == 448 and ring.used == 2
    assert ring.take(5, 2048) is None  # larger than the ring: it goes over the socket
    ring.release(4)
    assert ring.used == 0 and ring.take(6, 1024) == 0  # an empty ring starts over
    ring.reset()
    assert ring.used == 0 and ring.take(7, 10) == 0
    with pytest.raises(ValueError):
        ForwardRing(10)

# ---- primary and backup cores --------------------------------------------------------------------
def _core(mode="arrival", optimizer="sgd"):
    return ShardCore(ShardSettings(rank=0, lo=0, hi=KEYS, dtype="float64", apply_mode=mode,
                                   optimizer=optimizer, lr=1.0))


def _run(core, event):
    """Handle `event` as the node does, Then included; the replies."""
    out, todo = [], list(core.handle(event))
    while todo:
        ins = todo.pop(0)
        if type(ins) is Then:
            todo[:0] = core.handle(ins.event)
        else:
            out.append(ins)
    return out


def _push(rank, rid, step, mode="arrival", round_size=0, mark=None):
    grad = known_gradient(rank, step, KEYS, np.float64)
    return Push((f"w{rank}", rid), f"w{rank}", rid, 0, KEYS, grad, step, 1, 0,
                round_size=round_size, mark=mark), grad


class Chain:
    """A primary core that forwards every write to a backup core first (as the node does)."""

    def __init__(self, mode="arrival", optimizer="sgd"):
        self.primary, self.backup = _core(mode, optimizer), _core(mode, optimizer)

    def write(self, event):
        _run(self.backup, event)
        return _run(self.primary, event)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_a_backup_fed_the_same_writes_holds_the_same_shard(optimizer):
    chain = Chain(optimizer=optimizer)
    init = Init(None, 0, KEYS, np.arange(KEYS, dtype=np.float64))
    chain.write(init)
    for step in range(5):
        for rank in range(3):
            chain.write(_push(rank, 1 + step, step)[0])
    p, b = chain.primary.store, chain.backup.store
    assert p.version == b.version == 15
    np.testing.assert_array_equal(p.values.numpy(), b.values.numpy())
    for key in p.state:
        np.testing.assert_array_equal(p.state[key].numpy(), b.state[key].numpy())
    assert chain.primary.retries.dump() == chain.backup.retries.dump()


def test_after_the_takeover_an_acknowledged_push_retried_is_not_applied_twice():
    chain = Chain()
    init = np.zeros(KEYS)
    chain.write(Init(None, 0, KEYS, init.copy()))
    acked = []
    for rid in range(1, 6):
        ev, grad = _push(0, rid, rid, mark=rid)
        replies = chain.write(ev)
        assert [r.op for r in replies] == ["ack"]
        acked.append(grad)
    # The primary dies with the ack of rid 5 on its way: the worker retries it at the backup.
    retry, _ = _push(0, 5, 5, mark=5)
    new_primary = chain.backup
    assert [r.op for r in _run(new_primary, retry)] == ["ack"]
    assert new_primary.retries.duplicates == 1
    np.testing.assert_array_equal(new_primary.store.values.numpy(), init - sum(acked))


def test_a_round_in_progress_survives_the_takeover():
    """Round mode: the backup has every push of the open round its primary acknowledged, so
    the round's remaining pushes complete it there."""
    chain = Chain(mode="round")
    chain.write(Init(None, 0, KEYS, np.zeros(KEYS)))
    grads = []
    for rank in range(2):  # 2 of the round's 3 pushes, on both copies
        ev, g = _push(rank, 1, 0, round_size=3)
        chain.write(ev)
        grads.append(g)
    new_primary = chain.backup
    ev, g = _push(2, 1, 0, round_size=3)
    _run(new_primary, ev)  # the third push, to the backup after the takeover: round applied
    grads.append(g)
    assert new_primary.store.version == 1
    np.testing.assert_array_equal(new_primary.store.values.numpy(), -sum(grads) / 3)


@pytest.mark.parametrize("mode", ["arrival", "round"])
def test_a_backup_synced_mid_stream_is_the_primary_bit_for_bit(mode):
    primary = _core(mode, "momentum")
    _run(primary, Init(None, 0, KEYS, np.arange(KEYS, dtype=np.float64)))
    for step in range(3):
        for rank in range(2):
            _run(primary, _push(rank, 1 + step, step, mode, round_size=2)[0])
    _run(primary, _push(0, 4, 3, mode, round_size=2)[0])  # round mode: round 3 left open
    fields, arrays = sync_payload(primary)
    assert fields == {"arrays_n": len(arrays) - 1}
    backup = _core(mode, "momentum")
    backup.handle(LoadSync([np.array(a) for a in arrays]))  # (as received: copies)
    ev = _push(1, 4, 3, mode, round_size=2)[0]
    _run(primary, ev)
    _run(backup, ev)
    for core in (primary, backup):
        assert core.store.version == (8 if mode == "arrival" else 4)
    np.testing.assert_array_equal(primary.store.values.numpy(), backup.store.values.numpy())
    assert primary.retries.dump() == backup.retries.dump()
    # A retry of a push the primary acknowledged before the sync is answered, not applied.
    retry = _push(0, 1, 0, mode, round_size=2)[0]
    assert [r.op for r in _run(backup, retry)] == ["ack"] and backup.retries.duplicates == 1


def test_a_backup_synced_mid_round_has_the_rounds_sparse_rows_too():
    """Round mode with a sparse table: two of a round's three pushers sent rows, then a new
    backup is synced; the third push completes the round on both alike (the rows of the open
    round went with the sync, so the backup applies the whole round, not a third of it)."""
    from paramserver.server.events import PushRows
    from paramserver.spec.job import TableSpec
    spec = TableSpec("emb", 2, lr=1.0, optimizer="sgd", init_scale=0.0)

    def core():
        return ShardCore(ShardSettings(rank=0, lo=0, hi=KEYS, dtype="float64",
                                       apply_mode="round", optimizer="sgd", lr=1.0,
                                       tables=(spec,)))

    def rows(rank, rid):
        keys = np.array([3, 7, 3, 11], np.int64) + rank
        grads = np.full(8, float(rank + 1), np.float32)
        return PushRows(("w", rank), f"w{rank}", rid, "emb", keys, grads, step=0, batch=1,
                        version=0, round_size=3, parts=1)

    primary = core()
    _run(primary, Init(None, 0, KEYS, np.zeros(KEYS)))
    for rank in range(2):
        _run(primary, rows(rank, 1))
    assert primary.tables.round_rows == 8
    backup = core()
    backup.handle(LoadSync([np.array(a) for a in sync_payload(primary)[1]]))
    assert backup.tables.round_rows == 8
    for c in (primary, backup):
        _run(c, rows(2, 1))
        assert c.store.version == 1
    keys = np.arange(3, 14, dtype=np.int64)
    np.testing.assert_array_equal(backup.tables.pull("emb", keys),
                                  primary.tables.pull("emb", keys))
    assert primary.tables.pull("emb", np.array([3], np.int64))[0, 0] == -2 / 3  # 2 x 1 / 3


def test_a_sync_of_an_uninitialized_shard_keeps_it_uninitialized():
    primary, backup = _core(), _core()
    backup.handle(LoadSync(sync_payload(primary)[1]))
    assert not backup.store.initialized
    with pytest.raises(ValueError):
        backup.handle(LoadSync([]))


# ---- the coordinator's Replicas ------------------------------------------------------------------
def _reg(src, addr, now, backup=False):
    return Registered(src, "server", now, to=("to", src), link=f"link-{addr}", addr=addr,
                      backup=backup)


def _welcome(e):
    return lambda rank: Reply(e.to, "welcome", {"rank": rank, "backup": True})


def _setup(now=0.0):
    members = Membership(2, 1, 100, heartbeat_timeout=1.0, start_grace=1.0)
    reps = Replicas(2, 2, timeout=1.0)
    out = []
    b0 = _reg("server", "B0", now, backup=True)
    reps.register(b0, members, _welcome(b0), out)  # before its primary: attached later
    assert [type(i) for i in out] == [Reply, AppendEvent]
    p0 = members.add_server(_reg("server", "P0", now), now)
    members.add_server(_reg("server", "P1", now), now)
    out.clear()
    reps.primary_up(p0, now, out)
    b1 = _reg("server", "B1", now, backup=True)
    reps.register(b1, members, _welcome(b1), out)
    attaches = [i for i in out if type(i) is ToServers]
    assert [(i.op, i.fields["rank"], i.links) for i in attaches] == [
        ("attach_backup", 0, ("link-P0",)), ("attach_backup", 1, ("link-P1",))]
    assert not reps.complete
    for rank, link in ((0, "link-P0"), (1, "link-P1")):
        epoch = reps.backups[rank].epoch
        reps.report(ReplicaReport("backup_synced", f"s{rank}", now, link=link,
                                  fields={"rank": rank, "epoch": epoch, "version": 0}),
                    members, out)
    assert reps.complete
    return members, reps


def test_a_silent_primary_is_replaced_by_its_synced_backup_and_workers_learn_where():
    members, reps = _setup()
    for name in ("s0", "s1"):
        members.roster.servers[name].last_seen = 2.0
    reps.backups[0].last_seen = reps.backups[1].last_seen = 2.0
    members.roster.servers["s0"].last_seen = 3.0  # s1's primary falls silent at 2.0

    class Schedule:
        pending_tag = None
    out = []
    assert reps.next_deadline(members) == pytest.approx(3.0, abs=1e-3)
    assert reps.check(2.9, members, Schedule(), out) == []
    assert reps.worker_fields() is None
    reps.backups[0].last_seen = reps.backups[1].last_seen = 3.2  # the backups beat on
    promoted = reps.check(3.2, members, Schedule(), out)
    assert promoted == [1]
    s1 = members.roster.servers["s1"]
    assert (s1.addr, s1.link) == ("B1", "link-B1")
    assert "link-B1" in members.server_links and "link-P1" not in members.server_links
    ops = [(i.op, i.links) for i in out if type(i) is ToServers]
    assert ops == [("promote", ("link-B1",))]
    assert [e.kind for e in out if type(e) is AppendEvent] == ["replica_promoted"]
    assert reps.worker_fields() == {"epoch": 1, "shards": [[1, "B1"]],
                                    "replaced": [["P1", "B1"]]}  # by address: across reshards
    # A beat the backup sent before it took its primary's name counts for the primary; a
    # beat under a backup name from another connection is not answered.
    assert reps.heartbeat("b1", "link-B1", 3.3, members) is True
    assert members.roster.servers["s1"].last_seen == 3.3
    assert reps.heartbeat("b1", "link-P1", 3.3, members) is False
    assert reps.heartbeat("w-1", "link-W", 3.3, members) is None
    # The old primary, back from a stall, is no longer the shard's: it is stopped.
    out.clear()
    reps.report(ReplicaReport("backup_lost", "s1", 3.3, link="link-P1",
                              fields={"rank": 1, "epoch": 2, "reason": "x"}), members, out)
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [("shutdown", ("link-P1",))]


def test_a_lost_backup_is_dropped_and_a_waiting_one_rebuilds_the_shard():
    members, reps = _setup()
    out = []
    spare = _reg("server", "B2", 0.5, backup=True)
    reps.register(spare, members, _welcome(spare), out)  # every shard has one: it waits
    assert out == [] and len(reps.waiting_backups) == 1
    epoch = reps.backups[0].epoch
    reps.report(ReplicaReport("backup_lost", "s0", 1.0, link="link-P0",
                              fields={"rank": 0, "epoch": epoch, "reason": "timeout"}),
                members, out)
    ops = [(i.op, i.links) for i in out if type(i) is ToServers]
    assert ops == [("shutdown", ("link-B0",)), ("backup_dropped", ("link-P0",)),
                   ("attach_backup", ("link-P0",))]
    assert reps.backups[0].addr == "B2" and not reps.backups[0].synced
    assert [e.kind for e in out if type(e) is AppendEvent] == ["backup_lost", "backup_joined"]
    out.clear()
    reps.report(ReplicaReport("backup_synced", "s0", 2.0, link="link-P0",
                              fields={"rank": 0, "epoch": reps.backups[0].epoch,
                                      "version": 9}), members, out)
    assert [e.kind for e in out] == ["backup_rebuilt"]


def test_a_job_without_replicas_wants_no_backup():
    members = Membership(1, 1, 10, heartbeat_timeout=1.0, start_grace=1.0)
    reps = Replicas(1, 1, timeout=1.0)
    assert reps.complete
    e = _reg("server", "B", 0.0, backup=True)
    with pytest.raises(ValueError, match="no replicas"):
        reps.register(e, members, _welcome(e), [])


# ---- the whole coordinator core -------------------------------------------------------------------
def test_the_coordinator_waits_for_synced_backups_then_promotes_and_tells_the_workers():
    from paramserver.coordinator.events import Heartbeat, Started, TimePassed
    from paramserver.coordinator.state import CoordinatorState
    from paramserver.server.node import shard_settings
    from paramserver.wire import Message
    from paramserver.spec.job import JobSpec, Limits, SyncSpec

    job = JobSpec(num_keys=10, servers=1, workers=1, sync=SyncSpec("asp"), eval_interval=0.0,
                  replicas=2, limits=Limits(heartbeat_timeout=1.0, start_timeout=60.0))
    state = CoordinatorState(job)
    out = state.handle(Registered("server", "server", 0.0, to="p", link="LP", addr="P"))
    welcome = next(i for i in out if type(i) is Reply and i.op == "welcome")
    # (both copies know the shard is replicated: its init's ack waits for a backup)
    assert shard_settings(Message("welcome", welcome.fields), 60.0).replicas == 2
    out = state.handle(Registered("server", "server", 0.0, to="b", link="LB", addr="B",
                                  backup=True))
    welcome = next(i for i in out if type(i) is Reply)
    assert welcome.fields["backup"] is True and welcome.fields["rank"] == 0
    assert shard_settings(Message("welcome", welcome.fields), 60.0).replicas == 2
    attach = next(i for i in out if type(i) is ToServers)
    assert (attach.op, attach.links, attach.fields["addr"]) == ("attach_backup", ("LP",), "B")
    state.handle(Registered("w0", "worker", 0.1, to="w"))
    out = state.handle(Started("w0", 0.2, to="s"))
    assert not state.barrier.open  # the backup is not synced: no push may be acked alone
    epoch = attach.fields["epoch"]
    out = state.handle(ReplicaReport("backup_synced", "s0", 0.3, link="LP",
                                     fields={"rank": 0, "epoch": epoch, "version": 0}))
    assert state.barrier.open
    assert ("backup_synced" in [i.kind for i in out if type(i) is AppendEvent])
    # The primary falls silent; the backup and the worker beat on.
    for t in (0.8, 1.2):
        state.handle(Heartbeat("b0", t, to="hb", link="LB"))
        state.handle(Heartbeat("w0", t, to="hw"))
    out = state.handle(TimePassed(1.35))
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [("promote", ("LB",))]
    assert state.members.roster.servers["s0"].addr == "B"
    assert "replica_promoted" in [i.kind for i in out if type(i) is AppendEvent]
    assert shutdown_links(state) == ("LB",)
    out = state.handle(Heartbeat("w0", 1.4, to="hw"))
    assert out[0].fields == {"epoch": 1, "shards": [[0, "B"]], "replaced": [["P", "B"]]}
    state.check_invariants()


def shutdown_links(state):
    return state.shutdown("done").links


def _renumber(members, layout, now):
    """What the resharding part's commit does to the roster: ranks in key order."""
    from paramserver.coordinator.membership import Member
    by_addr = {m.addr: m for m in members.roster.servers.values()}
    servers = {}
    for rank, addr, _, _ in layout:
        m = by_addr.get(addr) or Member(rank, addr, now, link=f"link-{addr}")
        m.rank = rank
        servers[f"s{rank}"] = m
    members.roster.servers = servers


def test_backups_follow_their_primaries_through_a_reshard_and_a_drained_ones_takes_the_joiner():
    members, reps = _setup()
    old = [[0, "P0", 0, 50], [1, "P1", 50, 100]]
    joined = [[0, "P0", 0, 30], [1, "PJ", 30, 60], [2, "P1", 60, 100]]
    _renumber(members, joined, 1.0)
    out = []
    reps.resharded(old, joined, members, 1.0, out)
    # P1's backup follows it to rank 2; the joiner (rank 1) has none: unreplicated for now.
    assert {r: b.addr for r, b in reps.backups.items()} == {0: "B0", 2: "B1"}
    assert not reps.complete and reps.servers == 3
    attaches = [(i.op, i.fields["rank"], i.fields["addr"], i.links) for i in out
                if type(i) is ToServers]
    assert attaches == [("attach_backup", 0, "B0", ("link-P0",)),
                        ("attach_backup", 2, "B1", ("link-P1",))]
    assert all(i.fields["epoch"] > 2 for i in out if type(i) is ToServers)  # new attaches
    moved = [i.data for i in out if type(i) is AppendEvent and i.kind == "backup_moved"]
    assert moved == [{"rank": 0, "addr": "B0", "old_rank": 0},
                     {"rank": 2, "addr": "B1", "old_rank": 1}]
    # A beat under its old name (b1) before its new sync renames it counts for it.
    assert reps.heartbeat("b1", "link-B1", 1.5, members) is True
    assert reps.backups[2].last_seen == 1.5
    # P0 is drained: its backup takes the rank without one (the joiner's, rank 0 now).
    drained = [[0, "PJ", 0, 60], [1, "P1", 60, 100]]
    _renumber(members, drained, 2.0)
    out = []
    reps.resharded(joined, drained, members, 2.0, out)
    assert {r: b.addr for r, b in reps.backups.items()} == {0: "B0", 1: "B1"}
    assert [(i.fields["rank"], i.links) for i in out if type(i) is ToServers] == [
        (0, ("link-PJ",)), (1, ("link-P1",))]
    # Once both are synced again every shard is covered.
    for rank, b in reps.backups.items():
        primary = members.roster.servers[f"s{rank}"]
        reps.report(ReplicaReport("backup_synced", f"s{rank}", 2.1, link=primary.link,
                                  fields={"rank": rank, "epoch": b.epoch, "version": 5}),
                    members, out)
    assert reps.complete
    # Drained to one server with both backups: the spare one is shut down.
    out = []
    _renumber(members, [[0, "P1", 0, 100]], 3.0)
    reps.resharded(drained, [[0, "P1", 0, 100]], members, 3.0, out)
    assert {r: b.addr for r, b in reps.backups.items()} == {0: "B1"}
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [
        ("shutdown", ("link-B0",)), ("attach_backup", ("link-P1",))]


def test_a_backup_resynced_for_another_shard_becomes_that_shard_before_loading():
    from paramserver.server.replication import synced_shard
    primary = ShardCore(ShardSettings(rank=2, lo=60, hi=100, dtype="float64",
                                      apply_mode="arrival", optimizer="sgd", lr=1.0,
                                      servers=3))
    primary.handle(Init(None, 60, 100, np.arange(40, dtype=np.float64)))
    primary.handle(LayoutKnown(4, [[0, "a", 0, 30], [1, "b", 30, 60], [2, "c", 60, 100]]))
    arrays = [np.array(a) for a in sync_payload(primary)[1]]
    shard = synced_shard(arrays)
    backup = _core()  # a backup of shard 0, keys [0, KEYS)
    _run(backup, Init(None, 0, KEYS, np.zeros(KEYS)))
    _run(backup, _push(0, 1, 0, "arrival")[0])  # applied: in its dedup table
    assert shard.differs(backup.settings) and (shard.rank, shard.lo, shard.hi) == (2, 60, 100)
    with pytest.raises(Exception):
        backup.handle(LoadSync(arrays))  # its shard cannot hold another shard's values
    mirror = replace(backup.settings, rank=2, lo=60, hi=100, servers=3)
    assert backup.handle(LoadSync(arrays, mirror)) == ()
    assert (backup.settings.rank, backup.store.range.lo, backup.store.range.hi) == (2, 60, 100)
    np.testing.assert_array_equal(backup.store.values.numpy(), np.arange(40))
    assert (backup.epoch, backup.layout) == (4, primary.layout)
    assert backup.retries.dump() == primary.retries.dump()  # shard 0's pushes are not in it


def test_a_primarys_report_from_before_a_renumbering_is_ignored_not_stopped():
    """A report naming the rank a reshard took from its sender (sent before the commit) is
    stale, not a deposed primary's: the server is a primary under its new rank."""
    members, reps = _setup()
    old = [[0, "P0", 0, 50], [1, "P1", 50, 100]]
    joined = [[0, "P0", 0, 30], [1, "PJ", 30, 60], [2, "P1", 60, 100]]
    _renumber(members, joined, 1.0)
    reps.resharded(old, joined, members, 1.0, [])
    out = []
    reps.report(ReplicaReport("backup_synced", "s1", 1.1, link="link-P1",
                              fields={"rank": 1, "epoch": 2, "version": 5}), members, out)
    assert out == []  # no shutdown of P1 (rank 2 now), no event
    reps.report(ReplicaReport("backup_synced", "s1", 1.1, link="link-gone",
                              fields={"rank": 1, "epoch": 2, "version": 5}), members, out)
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [
        ("shutdown", ("link-gone",))]  # a server no shard has: stopped as before
