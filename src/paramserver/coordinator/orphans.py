"""Replicated shards whose primary is gone before their backup was synced (`--replicas 2`).

Replicas promotes a *synced* backup: it holds every update its primary acknowledged. A backup
still waiting for its sync (attached during the start, or rebuilt after a loss) may hold
less, so what it may become depends on what the job has done:

- **Before training** (the start barrier never opened, no take-back), the
  dead primary acknowledged nothing alone: no push is released before every shard's backup
  is synced, and a replicated primary holds the ack of the init that gave it its values until
  a backup is synced (server/replication.py `Forwarder.hold_init`), so an init it took is
  still unanswered and the worker sends it again to the successor. The backup is promoted as
  it is, nothing lost; in a resumed job it first loads the checkpoint the job resumes from,
  as its primary did.
- **Once training began** the primary may have acknowledged updates alone (it runs on alone
  after its backup is dropped, until the rebuilt one is synced), so the backup is promoted
  from the latest committed checkpoint, as a restarted server is (`--restart-servers`): its
  version lifted to the job's progress, the updates since that checkpoint counted lost
  (`server_restored`, `lost_updates`). With no checkpoint to restore the job stops at once,
  naming the shard, instead of waiting for the server timeout.

A primary is gone when it has been silent for the heartbeat timeout after it registered
(`check`), or when it never registered: its backup waits, and another backup registers with
no shard free for it (a launcher replaces a dead server by a backup; Ray restarts it as one).
That waiting backup then steps up and the newcomer becomes its backup (`step_up`). A slow
primary that registers after that finds its rank taken and is refused; nothing was written.

Either way the successor has no backup: the next one registering is attached to it and the
start barrier (or the rebuild) waits for its sync as usual. The old primary's connection, in
case it is alive after all, is told to shut down.
"""

from __future__ import annotations

from paramserver.coordinator.events import Registered, ToServers
from paramserver.spec.welcome import ShardRestore


class OrphanedShards:
    """The part of `coord` (a CoordinatorState) that gives a shard whose primary is gone to its
    backup not synced yet. It holds no state: what it reads is the replicas', the roster's,
    the checkpoint schedule's and the job's progress."""

    def __init__(self, coord):
        self.coord = coord

    def before_training(self) -> bool:
        """Nothing was applied yet, so no update can have been acknowledged by one copy."""
        coord = self.coord
        return not coord.barrier.open and not coord.replicas.restarted

    def plan(self, rank: int) -> tuple[ShardRestore | None, str | None]:
        """(what the backup of shard `rank` restores before it serves, None: nothing; a
        failure when it cannot take over)."""
        coord = self.coord
        resume = coord.job.resume
        if self.before_training():
            return (None if resume is None
                    else ShardRestore.of_resume(resume, coord.progress)), None
        schedule = coord.schedule
        if schedule.enabled and schedule.latest is not None:
            return ShardRestore(str(schedule.root), schedule.latest, coord.progress,
                                restart=True), None
        if resume is not None:  # no checkpoint committed since the one it resumed from
            return ShardRestore(resume.dir, resume.tag, coord.progress, restart=True), None
        return None, (f"shard {rank}'s primary died before its backup was synced, and the job "
                      f"has no committed checkpoint to restore the shard from: updates only "
                      f"the primary held are lost, so the job stops. Run it again, with "
                      f"--checkpoint-dir and --checkpoint-every (or --checkpoint-seconds) so "
                      f"that such a shard is restored from the latest checkpoint")

    # ---- a primary silent past the timeout --------------------------------------------------
    def check(self, now: float, out: list) -> list[int]:
        """Promote the backup, not synced, of each primary silent past the heartbeat timeout
        (after Replicas.check, which dropped the silent backups); the ranks promoted. A shard
        that cannot be taken over fails the job."""
        coord = self.coord
        replicas, members = coord.replicas, coord.members
        promoted = []
        for rank, b in sorted(replicas.backups.items()):
            primary = members.roster.servers.get(f"s{rank}")
            if b.synced or primary is None or now - primary.last_seen <= replicas.timeout:
                continue
            restore, failure = self.plan(rank)
            if failure is not None:
                coord.fail(f"{failure} (primary s{rank} at {primary.addr} silent for "
                           f"{now - primary.last_seen:.1f} s, backup at {b.addr})", now, out)
                return promoted
            out.append(ToServers("shutdown", {
                "reason": f"shard {rank}'s backup took over: this server was judged dead"},
                (primary.link,)))
            replicas.promote(b, primary, now, members, coord.schedule, out,
                             self._why(restore), None if restore is None else restore.to_dict())
            promoted.append(rank)
        return promoted

    # ---- a primary that never registered ----------------------------------------------------
    def step_up(self, e: Registered, welcome, out: list) -> bool:
        """Backup `e` registers and every shard has one: if a shard's primary never registered,
        that shard's backup becomes its primary and `e` its backup. True if so (else Replicas
        queues or refuses `e`)."""
        coord = self.coord
        replicas, members = coord.replicas, coord.members
        if (not replicas.enabled or e.rejoin is not None or replicas.returning_until is not None
                or len(replicas.backups) < replicas.servers):
            return False
        orphan = next((b for rank, b in sorted(replicas.backups.items())
                       if f"s{rank}" not in members.roster.servers and not b.epoch), None)
        if orphan is None:
            return False
        restore, failure = self.plan(orphan.rank)
        if failure is not None:  # (not expected: no server registered means no training)
            return False
        replicas.promote(orphan, None, e.now, members, coord.schedule, out,
                         "its primary never registered, and another backup came",
                         None if restore is None else restore.to_dict())
        replicas.register(e, members, welcome, out)
        return True

    def _why(self, restore: ShardRestore | None) -> str:
        if restore is None:
            return "its primary died before the backup was synced, before training: nothing lost"
        if not restore.restart:
            return "its primary died before the backup was synced; restored the resume checkpoint"
        return "its primary died before the backup was synced; restored from checkpoint"
