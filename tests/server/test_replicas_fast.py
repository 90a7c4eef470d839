"""A replicated shard's faster promotion, on the pure coordinator core: a backup that saw its
primary's connection drop (`primary_down`) gets it promoted once the primary has also been
silent for 2 heartbeat intervals, not a whole heartbeat timeout; a primary that beats after
the report is alive (the suspicion is cleared), and a report from anyone but the shard's
synced backup is ignored. The live measure is benchmarks/promotion_time.py."""

import pytest

from paramserver.coordinator.events import (
    AppendEvent, Heartbeat, Registered, ReplicaReport, Reply, Started, TimePassed, ToServers,
)
from paramserver.coordinator.membership import Membership
from paramserver.coordinator.replicas import Replicas
from paramserver.coordinator.state import CoordinatorState
from paramserver.spec.job import JobSpec, Limits, SyncSpec
from paramserver.wire import Message
from paramserver.transport import terminate


class Schedule:
    pending_tag = None


def _synced(timeout=5.0, fast=0.5):
    """Shard 0: primary P (link LP), synced backup B (link LB), both seen at 10.0."""
    members = Membership(1, 1, 100, heartbeat_timeout=timeout, start_grace=timeout)
    reps = Replicas(2, 1, timeout=timeout, fast=fast)
    out = []
    primary = members.add_server(Registered("server", "server", 0.0, to="p", link="LP",
                                            addr="P"), 0.0)
    b = Registered("server", "server", 0.0, to="b", link="LB", addr="B", backup=True)
    reps.register(b, members, lambda rank: Reply("b", "welcome", {"rank": rank}), out)
    epoch = reps.backups[0].epoch
    reps.report(ReplicaReport("backup_synced", "s0", 0.1, link="LP",
                              fields={"rank": 0, "epoch": epoch, "version": 0}), members, out)
    primary.last_seen = reps.backups[0].last_seen = 10.0
    return members, reps, epoch


def _down(reps, members, now, epoch, link="LB"):
    out = []
    reps.report(ReplicaReport("primary_down", "b0", now, link=link,
                              fields={"rank": 0, "epoch": epoch}), members, out)
    return out


def test_a_primary_reported_down_is_promoted_after_two_intervals_not_the_timeout():
    members, reps, epoch = _synced()
    assert reps.next_deadline(members) == pytest.approx(15.0, abs=1e-3)
    out = _down(reps, members, 10.1, epoch)  # killed just after its beat at 10.0
    assert [(e.kind, e.data["rank"]) for e in out] == [("primary_suspected", 0)]
    assert reps.next_deadline(members) == pytest.approx(10.5, abs=1e-3)
    assert reps.check(10.4, members, Schedule(), out) == []
    out.clear()
    assert reps.check(10.51, members, Schedule(), out) == [0]
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [("promote", ("LB",))]
    event = next(e for e in out if type(e) is AppendEvent and e.kind == "replica_promoted")
    assert event.data["after"] == "link_down" and event.data["silent_s"] == pytest.approx(0.51)
    assert members.roster.servers["s0"].link == "LB" and not reps.suspected


def test_a_primary_that_beats_after_the_report_is_alive():
    members, reps, epoch = _synced()
    _down(reps, members, 10.1, epoch)
    members.roster.servers["s0"].last_seen = 10.3  # its heartbeat: the link dropped, not it
    reps.backups[0].last_seen = 14.0
    assert reps.check(10.9, members, Schedule(), []) == []
    assert not reps.suspected  # cleared: a death now waits for the timeout (or a new report)
    assert reps.next_deadline(members) == pytest.approx(15.3, abs=1e-3)
    assert reps.check(15.2, members, Schedule(), []) == []
    out = []
    assert reps.check(15.31, members, Schedule(), out) == [0]
    assert next(e for e in out if type(e) is AppendEvent
                and e.kind == "replica_promoted").data["after"] == "silence"


def test_a_report_from_anyone_but_the_synced_backup_is_ignored():
    members, reps, epoch = _synced()
    assert _down(reps, members, 10.1, epoch, link="LX") == []  # not the backup's connection
    assert _down(reps, members, 10.1, epoch + 1) == []  # another attach's
    assert not reps.suspected and reps.check(11.0, members, Schedule(), []) == []
    reps.backups[0].synced = False  # a backup not synced is never promoted
    assert _down(reps, members, 10.2, epoch) == [] and not reps.suspected
    # the primary's own report about its backup still goes its way
    members2, reps2, epoch2 = _synced()
    out = []
    reps2.report(ReplicaReport("backup_lost", "s0", 10.2, link="LP",
                               fields={"rank": 0, "epoch": epoch2, "reason": "x"}), members2,
                 out)
    assert [i.op for i in out if type(i) is ToServers] == ["shutdown", "backup_dropped"]


def test_the_coordinator_core_promotes_on_the_backups_word():
    limits = Limits(heartbeat_timeout=4.0, start_timeout=60.0)
    job = JobSpec(num_keys=10, servers=1, workers=1, sync=SyncSpec("asp"), eval_interval=0.0,
                  replicas=2, limits=limits)
    state = CoordinatorState(job)
    state.handle(Registered("server", "server", 0.0, to="p", link="LP", addr="P"))
    out = state.handle(Registered("server", "server", 0.0, to="b", link="LB", addr="B",
                                  backup=True))
    epoch = next(i for i in out if type(i) is ToServers).fields["epoch"]
    state.handle(Registered("w0", "worker", 0.1, to="w"))
    state.handle(Started("w0", 0.2, to="s"))
    state.handle(ReplicaReport("backup_synced", "s0", 0.3, link="LP",
                               fields={"rank": 0, "epoch": epoch, "version": 0}))
    for src, link in (("s0", "LP"), ("b0", "LB"), ("w0", None)):
        state.handle(Heartbeat(src, 1.0, to="hb", link=link))
    state.handle(ReplicaReport("primary_down", "b0", 1.1, link="LB",
                               fields={"rank": 0, "epoch": epoch}))
    fast = 2 * limits.heartbeat_interval  # 2 s: well inside the 4 s timeout
    assert state.next_wakeup() == pytest.approx(1.0 + fast, abs=1e-3)
    assert not [i for i in state.handle(TimePassed(1.0 + fast - 0.01)) if type(i) is ToServers]
    out = state.handle(TimePassed(1.0 + fast + 0.01))
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [("promote", ("LB",))]
    assert state.members.roster.servers["s0"].addr == "B"
    # the old primary, alive after all, reports its backup lost: it is told to shut down
    out = state.handle(ReplicaReport("backup_lost", "s0", 3.2, link="LP",
                                     fields={"rank": 0, "epoch": epoch, "reason": "refused"}))
    assert [(i.op, i.links) for i in out if type(i) is ToServers] == [("shutdown", ("LP",))]
    state.check_invariants()


# ---- the backup's watch, on real sockets in this process ----------------------------------------
def _watching_backup(ctx, addr):
    from paramserver.server.replica_link import ReplicaLink
    told = []
    from paramserver.server.core import ShardCore
    from paramserver.server.events import ShardSettings
    core = ShardCore(ShardSettings(rank=1, lo=0, hi=4, dtype="float64", apply_mode="arrival",
                                   optimizer="sgd", lr=1.0))
    link = ReplicaLink(ctx, None, True, 1.0, core, None,
                       lambda op, fields: told.append((op, fields)))
    link.primary, link.epoch = b"primary", 3  # as after a sync of attach 3
    link.watch_primary(addr)
    return link, told


def _pump(link, until, limit=15.0):  # (a bound: a loaded machine connects late)
    import time
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if link.monitor is not None and link.monitor.poll(20):
            link.from_monitor()
        if until():
            return True
    return False


def test_a_backup_says_once_that_its_primarys_connection_dropped():
    import zmq
    ctx = zmq.Context()
    primary = ctx.socket(zmq.ROUTER)
    port = primary.bind_to_random_port("tcp://127.0.0.1")
    link, told = _watching_backup(ctx, f"tcp://127.0.0.1:{port}")
    try:
        assert _pump(link, lambda: link.up), "the watch never came up"
        assert told == []
        primary.close(0)  # its process dies: its connections close
        assert _pump(link, lambda: told), "no primary_down"
        _pump(link, lambda: False, limit=0.5)  # the reconnects that follow say nothing more
        assert told == [("primary_down", {"rank": 1, "epoch": 3})]
        # promoted: the watch points at nothing (its sockets stay open until close())
        link.from_coordinator(Message("promote", {"rank": 1, "epoch": 1}))
        assert not link.backup and link.map_epoch == 1
        assert link.watching is None
        _pump(link, lambda: False, limit=0.3)
        assert len(told) == 1
    finally:
        link.close()
        terminate(ctx)  # bounded: a socket left open must not hold the test


def test_a_primary_gone_before_the_watch_came_up_is_told_too():
    import socket

    import zmq
    ctx = zmq.Context()
    # A port bound but never listened on: every connect is refused, and no other process of
    # a busy suite can take the port meanwhile (a closed one could be, and answer).
    hold = socket.socket()
    hold.bind(("127.0.0.1", 0))
    port = hold.getsockname()[1]
    link, told = _watching_backup(ctx, f"tcp://127.0.0.1:{port}")
    try:
        assert _pump(link, lambda: told), "no primary_down"
        _pump(link, lambda: False, limit=0.5)
        assert told == [("primary_down", {"rank": 1, "epoch": 3})] and not link.up
    finally:
        link.close()
        terminate(ctx)  # bounded: a socket left open must not hold the test
        hold.close()
