"""A replicated shard whose primary is gone before its backup was synced (coordinator/orphans.py),
on the coordinator's core alone: before training the backup is promoted as it is (a primary
silent, or one that never registered), once training began it is promoted from the latest
checkpoint with the lost updates counted, or the job stops at once naming the shard; a synced
backup is still promoted as before. The live check is tests/server/test_orphaned_shards_live.py."""

from __future__ import annotations

import pytest

from paramserver.coordinator.events import (
    AppendEvent, Clocked, Finish, Heartbeat, Registered, ReplicaReport, Reply, ShardRestored,
    Started, TimePassed, ToServers,
)
from ps_helpers import match, only

HB = 1.0  # the heartbeat timeout of these jobs (server_timeout: 30 s)


@pytest.fixture
def make(make):
    """The coordinator tests' `make` (conftest.py), these jobs' settings by default."""
    def build(latest=None, **options):
        return make(latest=latest, **dict(dict(sync="asp", workers=1, replicas=2,
                                               heartbeat_timeout=HB), **options))
    return build


def server(state, name, addr, now, backup=False):
    return state.handle(Registered(name, "server", now, to=f"r-{addr}", link=f"L{addr}",
                                   addr=addr, backup=backup))


def beat(state, now, *who):
    """Heartbeats of the members named ((src, link) or a worker's src)."""
    for w in who:
        src, link = w if isinstance(w, tuple) else (w, None)
        state.handle(Heartbeat(src, now, to="hb", link=link))


def attach_of(out):
    return next(i for i in only(out, ToServers) if i.op == "attach_backup")


def synced(state, link, epoch, now, version=0):
    return state.handle(ReplicaReport("backup_synced", "s0", now, link=link,
                                      fields={"rank": 0, "epoch": epoch, "version": version}))


def promotes(out) -> list:
    return [i for i in only(out, ToServers) if i.op == "promote"]


def kinds(out) -> list:
    return [i.kind for i in only(out, AppendEvent)]


# ---- before training ------------------------------------------------------------------------------
def test_a_primary_dead_before_its_backup_synced_is_replaced_by_it_before_training(make):
    state = make()
    server(state, "p", "P", 0.0)
    out = server(state, "b", "B", 0.1, backup=True)
    assert attach_of(out).links == ("LP",)  # the primary never answers it: it died
    state.handle(Registered("w0", "worker", 0.2, to="rw"))
    state.handle(Started("w0", 0.3, to="sw"))
    for t in (0.5, 0.9):
        beat(state, t, ("b0", "LB"), "w0")
    assert state.next_wakeup() == pytest.approx(1.0, abs=1e-3)  # the primary's silence
    assert not promotes(state.handle(TimePassed(0.95)))
    out = state.handle(TimePassed(1.05))
    [promote] = promotes(out)
    assert promote.links == ("LB",) and promote.fields == {"rank": 0, "epoch": 1}  # as it is
    assert match(next(i for i in only(out, ToServers) if i.op == "shutdown"), ToServers,
                 links=("LP",))  # should it be alive after all
    assert match(only(out, AppendEvent)[-1], AppendEvent, kind="replica_promoted", rank=0,
                 addr="B", old_addr="P")
    assert not only(out, Finish) and state.failure is None
    assert state.members.roster.servers["s0"].addr == "B"
    assert not state.barrier.open  # the successor has no backup yet
    # The launcher's replacement registers as a backup: attached to the successor; once it
    # is synced the barrier opens and training starts, nothing lost.
    out = server(state, "c", "C", 1.2, backup=True)
    assert match(only(out, Reply)[0], Reply, op="welcome", rank=0, backup=True)
    attach = attach_of(out)
    assert attach.links == ("LB",) and attach.fields["addr"] == "C"
    out = synced(state, "LB", attach.fields["epoch"], 1.3)
    assert "barrier_open" in kinds(out) and state.barrier.open


def test_a_primary_that_never_registered_is_replaced_by_its_waiting_backup(make):
    """The Ray case: the primary's node died before it registered; its backup waits for it,
    and the restarted server comes back as a backup."""
    state = make()
    out = server(state, "b", "B", 0.0, backup=True)
    assert match(only(out, Reply)[0], Reply, op="welcome", rank=0, backup=True)
    assert not only(out, ToServers)  # no primary to attach it to
    assert state.handle(Registered("w0", "worker", 0.1, to="rw")) == []  # waits for servers
    out = server(state, "c", "C", 3.0, backup=True)
    [promote] = promotes(out)
    assert promote.links == ("LB",) and "restore" not in promote.fields
    assert match(next(i for i in only(out, AppendEvent) if i.kind == "replica_promoted"),
                 AppendEvent, addr="B", old_addr=None)
    welcomes = [(i.to, i.fields["rank"], i.fields.get("backup")) for i in only(out, Reply)]
    assert welcomes == [("r-C", 0, True), ("rw", 0, None)]  # the worker waited: now welcomed
    assert attach_of(out).links == ("LB",)
    assert state.members.shard_map()[0][1] == "B"
    # A slow primary arriving now finds its rank taken: refused, nothing was written.
    out = server(state, "p", "P", 3.5)
    assert match(only(out, Reply)[0], Reply, op="error", code="refused")


def test_a_resumed_job_s_backup_loads_the_resume_checkpoint_before_it_serves(make):
    state = make(checkpoint_dir="/ck", checkpoint_every=10,
                 resume={"dir": "/ck", "tag": "000000007"})
    server(state, "p", "P", 0.0)
    server(state, "b", "B", 0.1, backup=True)
    beat(state, 0.9, ("b0", "LB"))
    [promote] = promotes(state.handle(TimePassed(1.05)))
    assert promote.fields["restore"] == {"dir": "/ck", "tag": "000000007",
                                         "version_floor": 0}


# ---- once training began ----------------------------------------------------------------------------
def _training(state):
    """Primary P and synced backup B, one worker trained a step; then B is lost and its
    replacement C attached to P, not synced yet. Returns C's attach epoch."""
    server(state, "p", "P", 0.0)
    out = server(state, "b", "B", 0.0, backup=True)
    state.handle(Registered("w0", "worker", 0.1, to="rw"))
    state.handle(Started("w0", 0.2, to="sw"))
    synced(state, "LP", attach_of(out).fields["epoch"], 0.3)
    assert state.barrier.open
    state.handle(Clocked("w0", 0, 32, 0.1, 0.4, to="c0"))
    assert state.progress == 1
    state.handle(ReplicaReport("backup_lost", "s0", 0.5, link="LP",
                               fields={"rank": 0, "epoch": 1, "reason": "x"}))
    out = server(state, "c", "C", 0.6, backup=True)
    return attach_of(out).fields["epoch"]


def test_mid_job_the_unsynced_backup_takes_over_from_the_latest_checkpoint(make):
    state = make(checkpoint_dir="/ck", checkpoint_every=100, latest="000000000")
    _training(state)
    beat(state, 1.2, ("b0", "LC"), "w0")  # P last heard at 0.5
    out = state.handle(TimePassed(1.55))
    [promote] = promotes(out)
    assert promote.links == ("LC",)
    assert promote.fields["restore"] == {"dir": "/ck", "tag": "000000000", "version_floor": 1,
                                         "restart": True}
    assert match(next(i for i in only(out, AppendEvent) if i.kind == "replica_promoted"),
                 AppendEvent, checkpoint="000000000")
    out = state.handle(ShardRestored("s0", "000000000", 1, 1, 1.6))
    assert match(only(out, AppendEvent)[0], AppendEvent, kind="server_restored",
                 lost_updates=1)
    assert state.recovery.lost_updates == 1 and state.failure is None


def test_mid_job_with_no_checkpoint_the_job_stops_at_once_naming_the_shard(make):
    state = make()
    _training(state)
    beat(state, 1.2, ("b0", "LC"), "w0")
    assert state.handle(TimePassed(1.45)) == []
    out = state.handle(TimePassed(1.55))  # the heartbeat timeout, not the 30 s server timeout
    [finish] = only(out, Finish)
    assert "shard 0's primary died before its backup was synced" in finish.failure
    assert "--checkpoint-dir" in finish.failure and "at P" in finish.failure
    assert not promotes(out)


def test_a_synced_backup_is_still_promoted_as_it_is(make):
    state = make(checkpoint_dir="/ck", checkpoint_every=100, latest="000000000")
    server(state, "p", "P", 0.0)
    out = server(state, "b", "B", 0.0, backup=True)
    synced(state, "LP", attach_of(out).fields["epoch"], 0.1)
    beat(state, 0.9, ("b0", "LB"))
    out = state.handle(TimePassed(1.15))  # (its report at 0.1 was P's last word)
    [promote] = promotes(out)
    assert promote.fields == {"rank": 0, "epoch": 1}  # no restore: it holds everything
    assert [i.op for i in only(out, ToServers)] == ["promote"]  # and no shutdown added


def test_a_backup_that_waited_for_the_key_space_is_not_lost_for_that_wait(make):
    """A launched job learns its key space from its first worker (num_keys 0): servers and
    backups that register before it wait. A backup's silence counts from its welcome, not
    from its registration: it used to be declared lost ("silent for 5.6 s") the moment it was
    welcomed after a worker's slow start, and the start barrier then waited for a backup that
    never came (the launcher replaces only a dead server) until the job failed."""
    state = make(num_keys=0)
    server(state, "b0", "tcp://h:2", 0.0, backup=True)
    server(state, "s0", "tcp://h:1", 0.1)
    out = state.handle(Registered("w0", "worker", 5.0, to="rw0", num_keys=10))  # 5 s later
    assert attach_of(out).fields["addr"] == "tcp://h:2"
    out = state.handle(TimePassed(5.5))
    assert "backup_lost" not in kinds(out)
    out = synced(state, "Ltcp://h:1", attach_of_epoch(state), 5.6)
    assert "backup_synced" in kinds(out) and "backup_lost" not in kinds(out)


def attach_of_epoch(state) -> int:
    return state.replicas.backups[0].epoch
