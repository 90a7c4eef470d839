"""A restarted coordinator takes back the live backups of a replicated job (--replicas 2,
--restart-coordinator), on the pure cores: Replicas pairs a backup that comes back with its
primary only when both agree on the link (address and attach epoch), refuses it otherwise, and
never lets the take-back or the start barrier wait on a backup. The live check is in
tests/server/test_replicas_live.py (slow)."""

import pytest

from paramserver.coordinator.events import (
    AppendEvent, Heartbeat, Registered, ReplicaReport, Reply, TimePassed, ToServers,
)
from paramserver.coordinator.membership import Membership, UnknownMember
from paramserver.coordinator.replicas import Replicas
from paramserver.coordinator.takeback import BackupBack, ForwardsTo, ServerBack

WINDOW = 1.0  # the take-back window: the heartbeat timeout from the restart


class Schedule:
    pending_tag = None


def _restarted(servers=2):
    members = Membership(servers, 1, 100, heartbeat_timeout=1.0, start_grace=1.0)
    reps = Replicas(2, servers, timeout=1.0)
    reps.take_back(WINDOW)
    return members, reps


def _primary_back(members, reps, rank, now, claim=None, map_epoch=0, out=None):
    """Shard `rank`'s primary re-registers, forwarding to `claim` = (addr, epoch, synced)."""
    out = [] if out is None else out
    lo, hi = members.ranges[rank].lo, members.ranges[rank].hi
    record = {"rank": rank, "lo": lo, "hi": hi, "version": 7, "map_epoch": map_epoch}
    if claim is not None:
        record.update(backup_addr=claim[0], backup_epoch=claim[1], backup_synced=claim[2])
    e = Registered(f"s{rank}", "server", now, to=f"rp{rank}", link=f"LP{rank}",
                   addr=f"P{rank}", rejoin=record)
    back = ServerBack.of(record)
    member = members.rejoin_server(e, rank, lo, hi)
    reps.primary_back(member, back, now, members, out)
    return out


def _backup_back(members, reps, rank, now, addr, epoch, synced=True, link=None, out=None):
    out = [] if out is None else out
    link = link or f"L{addr}"
    e = Registered(f"b{rank}", "server", now, to=f"r{addr}", link=link, addr=addr, backup=True,
                   rejoin={"rank": rank, "epoch": epoch, "synced": synced, "version": 7})
    reps.backup_back(e, BackupBack.of(e.rejoin), members,
                     lambda r: Reply(e.to, "welcome", {"rank": r, "backup": True}), out)
    return out


def _kinds(out):
    return [i.kind for i in out if type(i) is AppendEvent]


def _sends(out):
    return [(i.op, i.links) for i in out if type(i) is ToServers]


def test_rejoin_records_parse_and_bad_ones_are_refused_clearly():
    back = ServerBack.of({"rank": 1, "lo": 0, "hi": 5, "version": 3, "backup_addr": "B",
                          "backup_epoch": 4, "backup_synced": True})
    assert back.backup == ForwardsTo("B", 4, True) and back.map_epoch == 0
    assert ServerBack.of({"rank": 1, "lo": 0, "hi": 5, "version": 3}).backup is None
    assert BackupBack.of({"rank": 0, "epoch": 2, "synced": True}) == BackupBack(0, 2, True, 0)
    with pytest.raises(ValueError, match="backup_epoch"):
        ServerBack.of({"rank": 1, "lo": 0, "hi": 5, "backup_addr": "B", "backup_epoch": 0})
    with pytest.raises(ValueError, match="backup_addr"):
        ServerBack.of({"rank": 1, "lo": 0, "hi": 5, "backup_addr": 3})
    with pytest.raises(ValueError, match="'epoch'"):
        BackupBack.of({"rank": 0, "epoch": -1})


@pytest.mark.parametrize("primary_first", [True, False])
def test_a_backup_both_sides_agree_on_is_taken_back_synced_and_can_take_over(primary_first):
    members, reps = _restarted(servers=1)
    out = []
    if primary_first:
        _primary_back(members, reps, 0, 0.1, claim=("B0", 3, True), out=out)
        assert out == [] and not reps.complete
    _backup_back(members, reps, 0, 0.2, "B0", 3, out=out)
    if not primary_first:
        assert out == [] and reps.returning  # waits for its primary's word
        # its beats are answered meanwhile, and shutdown reaches it
        assert reps.heartbeat("b0", "LB0", 0.25, members) is True
        assert reps.links == ("LB0",)
        _primary_back(members, reps, 0, 0.3, claim=("B0", 3, True), out=out)
    assert [i.fields for i in out if type(i) is Reply] == [{"rank": 0, "backup": True}]
    assert _kinds(out) == ["backup_taken_back"] and _sends(out) == []
    b = reps.backups[0]
    assert (b.addr, b.link, b.epoch, b.synced) == ("B0", "LB0", 3, True)
    assert reps.complete and reps.attaches == 3  # a new attach gets a later epoch
    # The window closes with nothing left to drop.
    out = []
    reps.check(WINDOW + 0.01, members, Schedule(), out)
    assert out == [] and reps.returning_until is None
    # The primary then falls silent: its taken-back backup takes over.
    b.last_seen = 1.6
    promoted = reps.check(1.6, members, Schedule(), out)
    assert promoted == [0] and members.roster.servers["s0"].addr == "B0"
    assert _sends(out) == [("promote", ("LB0",))]


@pytest.mark.parametrize("claim, backup, why", [
    (("B0", 2, True), ("B0", 3, True), "not to B0 \\(attach 3\\)"),
    (("B9", 3, True), ("B0", 3, True), "forwards to B9"),
    (None, ("B0", 3, True), "forwards to no backup"),
    (("B0", 3, True), ("B0", 3, False), "took no sync"),
])
def test_a_backup_its_primary_disagrees_with_is_refused_and_the_primary_drops_its_link(
        claim, backup, why):
    members, reps = _restarted(servers=1)
    out = _primary_back(members, reps, 0, 0.1, claim=claim)
    _backup_back(members, reps, 0, 0.2, backup[0], backup[1], synced=backup[2], out=out)
    refusal = next(i for i in out if type(i) is Reply)
    assert refusal.op == "error" and refusal.fields["code"] == "refused"
    assert refusal.fields["msg"].startswith("backup not taken back")
    assert "backup_not_taken_back" in _kinds(out)
    assert not reps.backups and not reps.returning and not reps.complete
    if claim is not None:  # the primary stops forwarding to (and holding for) that link
        assert _sends(out) == [("backup_dropped", ("LP0",))]
        assert next(i for i in out if type(i) is ToServers).fields == {"rank": 0,
                                                                       "epoch": claim[1]}
        assert "backup_lost" in _kinds(out)
    # Its beats go unanswered from now on (it was told to exit), never `unknown`.
    assert reps.heartbeat("b0", f"L{backup[0]}", 0.3, members) is False


def test_a_new_backup_waits_for_the_window_then_is_attached_after_the_old_epochs():
    members, reps = _restarted(servers=2)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 4, True))
    _primary_back(members, reps, 1, 0.1, claim=("B1", 5, True), out=out)
    _backup_back(members, reps, 0, 0.2, "B0", 4, out=out)  # shard 1's never comes back
    fresh = Registered("server", "server", 0.3, to="rN", link="LN", addr="BN", backup=True)
    reps.register(fresh, members, lambda r: Reply("rN", "welcome", {"rank": r}), out)
    assert len(reps.waiting_backups) == 1  # no rank is free while backups may come back
    assert reps.next_deadline(members) == pytest.approx(WINDOW, abs=1e-3)
    out = []
    reps.backups[0].last_seen = WINDOW
    reps.check(WINDOW + 0.001, members, Schedule(), out)
    # Shard 1's primary drops the link to its lost backup; the waiting one is attached.
    assert _sends(out) == [("backup_dropped", ("LP1",)), ("attach_backup", ("LP1",))]
    attach = [i for i in out if type(i) is ToServers][1]
    assert attach.fields["addr"] == "BN" and attach.fields["epoch"] == 6
    assert _kinds(out) == ["backup_lost", "backup_joined"]
    # A backup back after the window is refused (and rebuilt by the launcher).
    late = _backup_back(members, reps, 1, 1.5, "B1", 5)
    assert late[0].op == "error" and "has its backup at BN" in late[0].fields["msg"]
    late = _backup_back(members, reps, 0, 1.5, "B0", 4, link="LB0-again")
    assert late[0].op == "error" and "has its backup at B0" in late[0].fields["msg"]
    out = []
    reps.report(ReplicaReport("backup_synced", "s1", 1.6, link="LP1",
                              fields={"rank": 1, "epoch": 6, "version": 7}), members, out)
    assert _kinds(out) == ["backup_synced"]
    assert reps.complete


def test_a_primarys_repeated_rejoin_changes_nothing_once_its_claim_is_decided():
    members, reps = _restarted(servers=1)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 3, True))
    _backup_back(members, reps, 0, 0.2, "B0", 4, out=out)  # disagrees: refused, link dropped
    assert _kinds(out).count("backup_lost") == 1
    again = _primary_back(members, reps, 0, 0.3, claim=("B0", 3, True))  # sent before it knew
    assert again == [] and not reps.claims
    reps.check(WINDOW + 0.01, members, Schedule(), again)
    assert again == [] and reps.lost == 1
    # Paired, then the same rejoin again: still paired, nothing said.
    members, reps = _restarted(servers=1)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 3, True))
    _backup_back(members, reps, 0, 0.2, "B0", 3, out=out)
    assert _primary_back(members, reps, 0, 0.3, claim=("B0", 3, True)) == []
    assert reps.backups[0].epoch == 3 and reps.complete


def test_of_two_backups_back_for_one_shard_the_later_attach_waits_for_the_primary():
    members, reps = _restarted(servers=1)
    out = _backup_back(members, reps, 0, 0.1, "B0", 5)
    _backup_back(members, reps, 0, 0.2, "Bstale", 2, out=out)  # dropped, its shutdown lost
    assert [i.to for i in out if type(i) is Reply] == ["rBstale"]
    assert reps.returning[0].e.addr == "B0"
    _primary_back(members, reps, 0, 0.3, claim=("B0", 5, True), out=out)
    assert reps.backups[0].addr == "B0" and reps.complete


def test_backups_hear_unknown_only_from_a_restarted_coordinator():
    members = Membership(1, 1, 100, heartbeat_timeout=1.0, start_grace=1.0)
    fresh = Replicas(2, 1, timeout=1.0)
    assert fresh.heartbeat("b0", "LX", 0.1, members) is False  # never `unknown`: no rejoin
    members, reps = _restarted(servers=1)
    with pytest.raises(UnknownMember):
        reps.heartbeat("b0", "LX", 0.1, members)
    # A primary's report before its own rejoin: told to come back, not shut down.
    with pytest.raises(UnknownMember):
        reps.report(ReplicaReport("backup_synced", "s0", 0.1, link="LP0",
                                  fields={"rank": 0, "epoch": 3, "version": 1}), members, [])


def test_reports_on_a_claimed_link_before_its_backup_is_back():
    members, reps = _restarted(servers=1)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 3, False))  # still syncing
    reps.report(ReplicaReport("backup_synced", "s0", 0.15, link="LP0",
                              fields={"rank": 0, "epoch": 3, "version": 1}), members, out)
    _backup_back(members, reps, 0, 0.2, "B0", 3, out=out)
    assert reps.backups[0].synced and reps.complete
    # A link the primary reports lost while its backup is away is dropped at once.
    members, reps = _restarted(servers=1)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 3, True))
    reps.report(ReplicaReport("backup_lost", "s0", 0.15, link="LP0",
                              fields={"rank": 0, "epoch": 3, "reason": "silent"}), members, out)
    assert _sends(out) == [("backup_dropped", ("LP0",))]
    out = _backup_back(members, reps, 0, 0.2, "B0", 3)
    assert out[0].op == "error" and "forwards to no backup" in out[0].fields["msg"]
    # A primary that had reported its backup lost to the old coordinator is answered now.
    members, reps = _restarted(servers=1)
    record = {"rank": 0, "lo": 0, "hi": 100, "backup_addr": "B0", "backup_epoch": 3,
              "backup_synced": True, "backup_lost": True}
    e = Registered("s0", "server", 0.1, to="rp", link="LP0", addr="P0", rejoin=record)
    out = []
    reps.primary_back(members.rejoin_server(e, 0, 0, 100), ServerBack.of(record), 0.1,
                      members, out)
    assert _sends(out) == [("backup_dropped", ("LP0",))] and _kinds(out) == ["backup_lost"]


def test_the_shard_maps_epoch_goes_on_from_a_promoted_primarys_rejoin():
    members, reps = _restarted(servers=2)
    out = _primary_back(members, reps, 0, 0.1, claim=("B0", 3, True), map_epoch=2)
    _primary_back(members, reps, 1, 0.1, claim=("B1", 1, True), out=out)
    _backup_back(members, reps, 0, 0.2, "B0", 3, out=out)
    _backup_back(members, reps, 1, 0.2, "B1", 1, out=out)
    # A worker that missed the move before the restart learns it; one that had it ignores it.
    assert reps.worker_fields() == {"epoch": 2, "shards": [[0, "P0"]], "replaced": []}
    reps.backups[0].last_seen = reps.backups[1].last_seen = 2.0
    members.roster.servers["s0"].last_seen = 2.0
    assert reps.check(2.0, members, Schedule(), []) == [1]
    assert reps.worker_fields() == {"epoch": 3, "shards": [[0, "P0"], [1, "B1"]],
                                    "replaced": [["P1", "B1"]]}


# ---- the whole coordinator core ------------------------------------------------------------------
def test_a_restarted_coordinator_takes_back_the_backup_and_does_not_wait_for_a_lost_one():
    from paramserver.coordinator.state import CoordinatorState
    from paramserver.spec.job import JobSpec, Limits, SyncSpec

    job = JobSpec(num_keys=10, servers=2, workers=1, sync=SyncSpec("asp"), eval_interval=0.0,
                  replicas=2, limits=Limits(heartbeat_timeout=1.0, start_timeout=60.0,
                                            server_timeout=30.0))
    state = CoordinatorState(job, take_back={"num_keys": 10, "samples_done": 64}, now=0.0)
    # A backup's beat: unknown, so it registers again.
    out = state.handle(Heartbeat("b0", 0.05, to="hb0", link="LB0"))
    assert out == [Reply("hb0", "error", {"msg": "unknown backup 'b0'", "code": "unknown"})]
    ranges = state.members.ranges
    for rank in (0, 1):
        state.handle(Registered(f"s{rank}", "server", 0.1, to=f"rp{rank}", link=f"LP{rank}",
                                addr=f"P{rank}", rejoin={
                                    "rank": rank, "lo": ranges[rank].lo, "hi": ranges[rank].hi,
                                    "version": 9, "backup_addr": f"B{rank}",
                                    "backup_epoch": rank + 1, "backup_synced": True}))
    out = state.handle(Registered("b0", "server", 0.2, to="rb0", link="LB0", addr="B0",
                                  backup=True, rejoin={"rank": 0, "epoch": 1, "synced": True,
                                                       "version": 9}))
    welcome = next(i for i in out if type(i) is Reply)
    assert welcome.op == "welcome" and welcome.fields["backup"] is True
    assert welcome.fields["job"]["shard_range"] == [ranges[0].lo, ranges[0].hi]
    assert "backup_taken_back" in _kinds(out)
    out = state.handle(Registered("w0", "worker", 0.3, to="rw0", num_keys=10,
                                  rejoin={"rank": 0, "step": 4, "clocked": False,
                                          "samples": 64}))
    assert state.rejoins.pending is None and state.barrier.open  # shard 1's backup not waited for
    assert state.next_wakeup() <= WINDOW + 1e-3
    out = state.handle(TimePassed(WINDOW + 0.01))
    assert ("backup_dropped", ("LP1",)) in _sends(out)
    assert set(state.replicas.backups) == {0}
    out = state.handle(Registered("b1", "server", 1.2, to="rb1", link="LB1", addr="B1",
                                  backup=True, rejoin={"rank": 1, "epoch": 2, "synced": True}))
    assert out[0].op == "error" and "after the take-back window" in out[0].fields["msg"]
    assert set(state.shutdown("x").links) == {"LP0", "LP1", "LB0"}
    state.check_invariants()


# ---- a primary lost together with the coordinator ------------------------------------------------
def _history(*records):
    from paramserver.coordinator.replica_history import ReplicaHistory
    return ReplicaHistory.of([{"t": i, **r} if isinstance(r, dict) else r
                              for i, r in enumerate(records)])


def test_the_log_trusts_the_last_synced_backup_of_a_shard_that_nothing_undid():
    synced = {"event": "backup_synced", "rank": 0, "addr": "B0", "epoch": 3}
    h = _history(synced, {"event": "backup_synced", "rank": 1, "addr": "B1", "epoch": 4})
    assert h.trusts(0, "B0", 3, True) is None and h.attaches == 4
    assert "took no state sync" in h.trusts(0, "B0", 3, False)
    assert "not B0 (attach 2)" in h.trusts(0, "B0", 2, True)  # an older attach of it
    assert "not B9" in h.trusts(0, "B9", 3, True)
    # Dropped (the primary acknowledged alone after that), promoted, or of an earlier job:
    for undo in ({"event": "backup_lost", "rank": 0, "addr": "B0", "epoch": 3},
                 {"event": "replica_promoted", "rank": 0, "addr": "B0", "epoch": 5},
                 {"event": "start"}):
        assert "names no synced backup" in _history(synced, undo).trusts(0, "B0", 3, True)
    assert _history(synced, {"event": "replica_promoted", "rank": 0, "epoch": 5}).map_epoch == 5
    # A rebuild after a promotion, and a take-back that kept it, are trusted again.
    h = _history(synced, {"event": "replica_promoted", "rank": 0, "addr": "B0", "epoch": 1},
                 {"event": "backup_rebuilt", "rank": 0, "addr": "B7", "epoch": 6},
                 {"event": "restart"},
                 {"event": "backup_taken_back", "rank": 0, "addr": "B7", "epoch": 6,
                  "synced": True})
    assert h.trusts(0, "B7", 6, True) is None
    assert "names no synced backup" in _history(
        {"event": "backup_taken_back", "rank": 0, "addr": "B0", "epoch": 3, "synced": False}
    ).trusts(0, "B0", 3, True)
    # Lines of an older version (no attach epoch) and junk are never trusted, never fatal.
    assert _history({"event": "backup_synced", "rank": 0, "addr": "B0"}, "junk",
                    {"event": "backup_synced", "rank": "0", "addr": "B0", "epoch": 1}
                    ).trusts(0, "B0", 1, True) is not None


def test_a_backup_the_log_trusts_takes_over_a_primary_lost_with_the_coordinator():
    from paramserver.coordinator.state import CoordinatorState
    from paramserver.spec.job import JobSpec, Limits, SyncSpec

    job = JobSpec(num_keys=10, servers=2, workers=1, sync=SyncSpec("asp"), eval_interval=0.0,
                  replicas=2, limits=Limits(heartbeat_timeout=1.0, start_timeout=60.0,
                                            server_timeout=30.0))
    log = _history(*({"event": "backup_synced", "rank": r, "addr": f"B{r}", "epoch": r + 1}
                     for r in (0, 1)), {"event": "replica_promoted", "rank": 0, "epoch": 4})
    state = CoordinatorState(job, take_back={"num_keys": 10, "samples_done": 64}, now=0.0,
                             replica_history=log)
    ranges = state.members.ranges
    # Shard 0's primary and backup come back; shard 1's primary died with the coordinator.
    state.handle(Registered("s0", "server", 0.1, to="rp0", link="LP0", addr="P0", rejoin={
        "rank": 0, "lo": ranges[0].lo, "hi": ranges[0].hi, "version": 9, "map_epoch": 4,
        "backup_addr": "B0", "backup_epoch": 1, "backup_synced": True}))
    state.handle(Registered("b0", "server", 0.2, to="rb0", link="LB0", addr="B0", backup=True,
                            rejoin={"rank": 0, "epoch": 1, "synced": True, "version": 9}))
    out = state.handle(Registered("b1", "server", 0.2, to="rb1", link="LB1", addr="B1",
                                  backup=True, rejoin={"rank": 1, "epoch": 2, "synced": True,
                                                       "version": 8}))
    assert not [i for i in out if type(i) is Reply]  # waits for its primary's word
    state.handle(Registered("w0", "worker", 0.3, to="rw0", num_keys=10,
                            rejoin={"rank": 0, "step": 4, "clocked": False, "samples": 64}))
    assert state.rejoins.pending is not None  # shard 1 is not back
    out = state.handle(TimePassed(WINDOW + 0.01))  # the window closes: B1 takes over
    welcome = next(i for i in out if type(i) is Reply and i.to == "rb1")
    assert welcome.op == "welcome" and welcome.fields["rank"] == 1
    promote = next(i for i in out if type(i) is ToServers and i.op == "promote")
    assert promote.links == ("LB1",) and promote.fields == {"rank": 1, "epoch": 5}
    assert "replica_promoted" in _kinds(out)
    assert state.members.roster.servers["s1"].addr == "B1"
    out += state.handle(TimePassed(WINDOW + 0.02))
    assert state.rejoins.pending is None and "taken_back" in _kinds(out) and state.barrier.open
    assert state.replicas.worker_fields() == {"epoch": 5, "shards": [[0, "P0"], [1, "B1"]],
                                              "replaced": []}
    assert not any(k == "job_failed" for k in _kinds(out))
    state.check_invariants()


def test_without_the_logs_word_a_backup_of_a_lost_primary_is_refused_and_the_job_fails():
    from paramserver.coordinator.state import CoordinatorState
    from paramserver.spec.job import JobSpec, Limits, SyncSpec

    job = JobSpec(num_keys=10, servers=1, workers=1, sync=SyncSpec("asp"), eval_interval=0.0,
                  replicas=2, limits=Limits(heartbeat_timeout=1.0, start_timeout=60.0,
                                            server_timeout=5.0))
    # The log's last word on shard 0's backup: dropped (its primary went on alone).
    log = _history({"event": "backup_synced", "rank": 0, "addr": "B0", "epoch": 1},
                   {"event": "backup_lost", "rank": 0, "addr": "B0", "epoch": 1})
    state = CoordinatorState(job, take_back={"num_keys": 10}, now=0.0, replica_history=log)
    state.handle(Registered("b0", "server", 0.2, to="rb0", link="LB0", addr="B0", backup=True,
                            rejoin={"rank": 0, "epoch": 1, "synced": True, "version": 8}))
    out = state.handle(TimePassed(WINDOW + 0.01))
    refusal = next(i for i in out if type(i) is Reply and i.to == "rb0")
    assert refusal.op == "error" and "names no synced backup" in refusal.fields["msg"]
    assert not [i for i in out if type(i) is ToServers and i.op == "promote"]
    out = state.handle(TimePassed(5.01))
    assert "job_failed" in _kinds(out)
