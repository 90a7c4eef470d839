"""Server recovery: a server back from a crash, and servers gone silent.

A restarted server registers again at the address it had: it gets its old rank and is told to
restore its shard from the latest committed checkpoint (before any is committed, from checkpoint
0, the initial values each shard saved when its init came; the server falls back to the previous
kept checkpoint when the one named is unusable), its version lifted to the rounds (or
steps) the job has done, so pulls waiting for the job's version are served. The updates it
loses are those applied since that checkpoint; it reports them and they are logged (`restart`
metrics, `server_restored` events). A server that stays silent ends the job with its name
unless servers may be restarted, and then after `restart_timeout` s.
"""

from __future__ import annotations

from paramserver.coordinator.events import AppendEvent, Registered, Reply, ShardRestored
from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.coordinator.membership import Member
from paramserver.spec.welcome import INITIAL_TAG, ServerJob, ShardRestore


class ServerRecovery:
    def __init__(self, restart_servers: bool, silent_limit: float, restart_timeout: float,
                 replicated: bool = False):
        """`replicated`: the job keeps a backup a shard (--replicas 2, which --restart-servers
        cannot join), so a server silent this long is one no backup took over."""
        self.restart_servers = restart_servers
        self.replicated = replicated
        self.silent_limit = silent_limit  # s of silence after which a server is gone
        self.restart_timeout = restart_timeout
        self.lost_updates = 0
        self.server_restarts = 0

    def back(self, event: Registered, member: Member, schedule: CheckpointSchedule,
             version_floor: int, server_job: ServerJob, out: list,
             layout: tuple[int, list] | None = None) -> str | None:
        """Welcome the server back with what to restore; or a failure (nothing to restore).
        `layout`: a resharded job's (epoch, shard map), which the new server refuses requests
        for other keys `moved` by."""
        tag = schedule.latest if schedule.enabled else None
        initial = tag is None and schedule.keeps_initial
        if initial:  # nothing committed yet: its own part of checkpoint 0 (if it saved one)
            tag = INITIAL_TAG
        if tag is None:
            out.append(Reply(event.to, "error", {
                "msg": "no committed checkpoint to restore the shard from", "code": "refused"}))
            return (f"server s{member.rank} at {member.addr} restarted, but the job has no "
                    f"committed checkpoint to restore its shard from")
        now = event.now
        if schedule.pending_tag is not None:
            # The dead server will never confirm it: that checkpoint is abandoned.
            out.append(AppendEvent(now, "checkpoint_aborted",
                                   {"tag": schedule.pending_tag, "server": member.rank}))
            schedule.abort()
        member.link, member.last_seen, member.silent_since = event.link, now, None
        restore = ShardRestore(str(schedule.root), tag, version_floor, restart=True,
                               initial=initial)
        fields = {"rank": member.rank, "job": server_job.with_restore(restore).to_dict()}
        if layout is not None:
            fields["epoch"], fields["layout"] = layout
        out.append(Reply(event.to, "welcome", fields))
        self.server_restarts += 1
        out.append(AppendEvent(now, "server_rejoined",
                               {"rank": member.rank, "addr": member.addr, "checkpoint": tag}))
        return None

    def restored(self, event: ShardRestored, member: Member) -> tuple[AppendEvent, dict]:
        """The event and the metrics record of a server's restored shard."""
        lost = int(event.lost_updates)
        self.lost_updates += lost
        return (AppendEvent(event.now, "server_restored", {
                    "rank": member.rank, "checkpoint": event.tag, "lost_updates": lost,
                    "version": event.version}),
                {"kind": "restart", "role": "server", "server": member.rank,
                 "checkpoint": event.tag, "lost_updates": lost})

    def check(self, now: float, servers: dict[str, Member], out: list) -> str | None:
        """A failure if a server has been silent too long; notes the newly silent ones."""
        for src, m in servers.items():
            quiet = now - m.last_seen
            if quiet <= self.silent_limit:
                continue
            if not self.restart_servers:
                return (f"server {src} at {m.addr} has been silent for {quiet:.0f} s: the "
                        f"job stops ({self._remedy()})")
            if m.silent_since is None:
                m.silent_since = now
                out.append(AppendEvent(now, "server_lost", {"rank": m.rank, "addr": m.addr}))
            if quiet > self.restart_timeout:
                return (f"server {src} at {m.addr} did not come back within "
                        f"{self.restart_timeout:.0f} s: the job stops")
        return None

    def _remedy(self) -> str:
        if self.replicated:
            return ("no backup took its shard over: both copies of it are gone; with "
                    "--checkpoint-dir, --resume starts the job again from its latest checkpoint")
        return "--restart-servers restarts dead servers"

    def next_deadline(self, servers: dict[str, Member]) -> float | None:
        due = None
        for m in servers.values():
            t = m.last_seen + self.silent_limit
            if m.silent_since is not None:
                t = m.last_seen + max(self.silent_limit, self.restart_timeout)
            if due is None or t < due:
                due = t
        return due
