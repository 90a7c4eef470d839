"""Replicated shards (`--replicas 2`): each shard's backup, whether it is synced, and the
membership changes around it: a backup attached to its primary, a primary that died replaced
by its backup (promotion, no checkpoint restore), a backup lost, a new one rebuilt.

A server that registers with `backup` becomes the backup of the lowest shard rank that has
none; its primary is told to attach it (`attach_backup`), sends it the shard's state and then
forwards every update (server/replication.py). Once the primary reports it `backup_synced`,
the shard is replicated. A primary silent for `timeout` s (the heartbeat timeout) whose backup
is synced and alive is replaced by it: the roster's server of that rank becomes the backup
(its address and connection), the backup is told to `promote`, and workers learn the new
address from the answers to their heartbeats (`epoch` and `shards`, the moved shards). A
backup silent that long, or reported lost by its primary, is dropped: the primary is told
(`backup_dropped`) and runs unreplicated until a new backup registers. A report from a
primary that is no longer the shard's (it was replaced while cut off) is answered with
`shutdown`: two primaries of one shard never both acknowledge pushes.

Sooner than the timeout: a backup whose primary's connection dropped says so (`primary_down`,
server/replica_link.py); the primary is then promoted away once it has also been silent for
`fast` s (2 heartbeat intervals), unless it beat after the report (a dropped connection of a
live primary: the suspicion is cleared). A false alarm costs a promotion, never an update:
the old primary acknowledges nothing alone (its held replies wait for the backup's ack, and a
promoted backup refuses its forwards), and its next report is answered with shutdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paramserver.coordinator.events import AppendEvent, Registered, ReplicaReport, ToServers
from paramserver.coordinator.membership import Member, Membership


@dataclass
class Backup:
    rank: int
    addr: str
    link: Any
    last_seen: float
    epoch: int  # the attach it was told about: reports of an older one are stale
    synced: bool = False


class Replicas:
    """The backups of a job's shards, by rank, and the shard addresses that moved."""

    def __init__(self, replicas: int, servers: int, timeout: float,
                 fast: float | None = None):
        self.enabled = replicas > 1
        self.servers = servers
        self.timeout = timeout
        # A primary whose backup saw its connection drop: promoted away after this silence.
        self.fast = timeout if fast is None else min(fast, timeout)
        self.suspected: dict[int, float] = {}  # rank -> when its backup said primary_down
        self.backups: dict[int, Backup] = {}
        self.attaches = 0  # numbers each attach (the primary's link epoch)
        self.epoch = 0  # the shard map's: bumped by every promotion
        self.moved: dict[int, str] = {}  # rank -> address, of shards whose primary changed
        self.promotions = 0
        self.lost = 0
        self.synced_ranks: set[int] = set()  # ranks that have had a synced backup
        # Backups registered while every shard had one (a replacement started as soon as a
        # server died, before its shard's backup took over): welcomed when a rank frees up.
        self.waiting_backups: list = []  # (Registered, welcome)

    @staticmethod
    def src_of(rank: int) -> str:
        return f"b{rank}"

    @staticmethod
    def rank_of(src: str) -> int | None:
        """The shard rank of a backup's name (b<rank>), else None."""
        return int(src[1:]) if len(src) > 1 and src[0] == "b" and src[1:].isdigit() else None

    def find(self, src: str) -> Backup | None:
        rank = self.rank_of(src)
        return None if rank is None else self.backups.get(rank)

    @property
    def links(self) -> tuple:
        return tuple(b.link for b in self.backups.values())

    @property
    def complete(self) -> bool:
        """Every shard has a synced backup (the start barrier waits for that)."""
        return not self.enabled or (
            len(self.backups) == self.servers and all(b.synced for b in self.backups.values()))

    def waiting(self) -> str:
        missing = [r for r in range(self.servers) if r not in self.backups]
        unsynced = sorted(r for r, b in self.backups.items() if not b.synced)
        return f"backups of shards {missing} not registered, {unsynced} not synced"

    # ---- registration ---------------------------------------------------------------------------
    def register(self, e: Registered, members: Membership, welcome, out: list) -> None:
        """A backup: the lowest rank without one; welcomed with that shard's job, and attached
        to its primary when that is registered (else when it registers: primary_up)."""
        if not self.enabled:
            raise ValueError("this job has no replicas (--replicas 2): no backup is wanted")
        free = [r for r in range(self.servers) if r not in self.backups]
        if not free:
            if len(self.waiting_backups) >= self.servers:
                raise ValueError(f"every one of the {self.servers} shards has its backup and "
                                 f"{len(self.waiting_backups)} more wait")
            self.waiting_backups.append((e, welcome))
            return
        rank = free[0]
        b = self.backups[rank] = Backup(rank, e.addr, e.link, e.now, 0)
        out.append(welcome(rank))
        out.append(AppendEvent(e.now, "backup_joined", {"rank": rank, "addr": e.addr}))
        primary = members.roster.servers.get(f"s{rank}")
        if primary is not None:
            self._attach(b, primary, e.now, out)

    def _next_waiting(self, members: Membership, now: float, out: list) -> None:
        """A rank lost its backup: the oldest waiting registration takes it."""
        if self.waiting_backups:
            e, welcome = self.waiting_backups.pop(0)
            e.now = now
            self.register(e, members, welcome, out)

    def primary_up(self, member: Member, now: float, out: list) -> None:
        """Shard `member.rank`'s primary registered: attach its waiting backup."""
        b = self.backups.get(member.rank)
        if b is not None and not b.epoch:
            self._attach(b, member, now, out)

    def _attach(self, b: Backup, primary: Member, now: float, out: list) -> None:
        self.attaches += 1
        b.epoch = self.attaches
        out.append(ToServers("attach_backup", {"rank": b.rank, "addr": b.addr,
                                               "epoch": b.epoch}, (primary.link,)))

    # ---- what members say -----------------------------------------------------------------------
    def heartbeat(self, src: str, link, now: float, members: Membership) -> bool | None:
        """A backup's heartbeat: True to answer it; None when `src` is no backup's name. A
        beat of a backup just promoted (sent before it took its primary's name) counts for
        the primary it is now; one of a dropped backup is not answered (it was told to shut
        down), never answered `unknown`, which would make it register again."""
        rank = self.rank_of(src)
        if rank is None:
            return None
        b = self.backups.get(rank)
        if b is not None and b.link == link:
            b.last_seen = now
            return True
        primary = members.roster.servers.get(f"s{rank}")
        if primary is not None and primary.link == link:
            primary.last_seen = now
            return True
        return False

    def report(self, e: ReplicaReport, members: Membership, out: list) -> bool:
        """A primary's `backup_synced` or `backup_lost`; True if it was answered (a stale
        primary's report is answered with shutdown)."""
        rank = int(e.fields.get("rank", -1))
        if e.op == "primary_down":
            self._suspect(e, rank, members, out)
            return False
        primary = members.roster.servers.get(f"s{rank}")
        if primary is None or primary.link != e.link:
            out.append(ToServers("shutdown", {
                "reason": f"this server is no longer shard {rank}'s primary"}, (e.link,)))
            out.append(AppendEvent(e.now, "stale_primary_stopped", {"rank": rank}))
            return True
        primary.last_seen = e.now
        b = self.backups.get(rank)
        epoch = int(e.fields.get("epoch", 0))
        if b is None or b.epoch != epoch:
            return False
        if e.op == "backup_synced":
            b.synced = True
            kind = "backup_rebuilt" if rank in self.synced_ranks else "backup_synced"
            self.synced_ranks.add(rank)
            out.append(AppendEvent(e.now, kind, {"rank": rank, "addr": b.addr,
                                                 "version": e.fields.get("version")}))
        elif e.op == "backup_lost":
            self._drop(b, primary, str(e.fields.get("reason", "")), e.now, out, members)
        return False

    def _suspect(self, e: ReplicaReport, rank: int, members: Membership, out: list) -> None:
        """A synced backup's word that its primary's connection dropped (from its own
        connection, of its current attach): the primary is promoted away once silent `fast`."""
        b = self.backups.get(rank)
        primary = members.roster.servers.get(f"s{rank}")
        if (b is None or b.link != e.link or not b.synced or primary is None
                or b.epoch != int(e.fields.get("epoch", -1))):
            return
        b.last_seen = e.now
        if rank not in self.suspected:
            out.append(AppendEvent(e.now, "primary_suspected", {
                "rank": rank, "addr": primary.addr,
                "silent_s": round(e.now - primary.last_seen, 3)}))
        self.suspected[rank] = e.now

    def _gone(self, rank: int, primary: Member, now: float) -> str | None:
        """Why shard `rank`'s primary is judged dead now: silent past the timeout, or reported
        down by its backup and silent past `fast` since; None while it is not."""
        silent = now - primary.last_seen
        if silent > self.timeout:
            return "silence"
        since = self.suspected.get(rank)
        if since is None:
            return None
        if primary.last_seen > since:  # it beat after its connection dropped: alive
            del self.suspected[rank]
            return None
        return "link_down" if silent > self.fast else None

    def _drop(self, b: Backup, primary: Member | None, why: str, now: float, out: list,
              members: Membership) -> None:
        self.suspected.pop(b.rank, None)
        del self.backups[b.rank]
        self.lost += 1
        out.append(AppendEvent(now, "backup_lost", {"rank": b.rank, "addr": b.addr,
                                                    "reason": why}))
        out.append(ToServers("shutdown", {"reason": f"dropped as shard {b.rank}'s backup: "
                                                    f"{why}"}, (b.link,)))
        if primary is not None:
            out.append(ToServers("backup_dropped", {"rank": b.rank, "epoch": b.epoch},
                                 (primary.link,)))
        self._next_waiting(members, now, out)

    # ---- time -----------------------------------------------------------------------------------
    def check(self, now: float, members: Membership, schedule, out: list) -> list[int]:
        """Promote the synced backup of a primary silent past the timeout; drop a backup
        silent that long. Returns the ranks promoted."""
        roster, promoted = members.roster, []
        for rank, b in list(self.backups.items()):
            primary = roster.servers.get(f"s{rank}")
            if now - b.last_seen > self.timeout:
                self._drop(b, primary, f"silent for {now - b.last_seen:.1f} s", now, out,
                           members)
                continue
            if primary is not None and b.synced:
                why = self._gone(rank, primary, now)
                if why is not None:
                    self._promote(b, primary, now, members, schedule, out, why)
                    promoted.append(rank)
        return promoted

    def _promote(self, b: Backup, old: Member, now: float, members: Membership, schedule,
                 out: list, why: str = "silence") -> None:
        rank = b.rank
        self.suspected.pop(rank, None)
        del self.backups[rank]
        new = Member(rank, b.addr, now, link=b.link)
        members.roster.servers[f"s{rank}"] = new
        members.relinked()
        self.epoch += 1
        self.promotions += 1
        self.moved[rank] = b.addr
        out.append(ToServers("promote", {"rank": rank, "epoch": self.epoch}, (b.link,)))
        out.append(AppendEvent(now, "replica_promoted", {
            "rank": rank, "addr": b.addr, "old_addr": old.addr, "epoch": self.epoch,
            "silent_s": round(now - old.last_seen, 3), "after": why}))
        if schedule.pending_tag is not None:  # the dead primary will never confirm it
            out.append(AppendEvent(now, "checkpoint_aborted",
                                   {"tag": schedule.pending_tag, "server": rank}))
            schedule.abort()
        self._next_waiting(members, now, out)

    def next_deadline(self, members: Membership) -> float | None:
        due = None
        for rank, b in self.backups.items():
            t = b.last_seen + self.timeout
            primary = members.roster.servers.get(f"s{rank}")
            if b.synced and primary is not None:
                limit = self.fast if rank in self.suspected else self.timeout
                t = min(t, primary.last_seen + limit)
            if due is None or t < due:
                due = t
        return None if due is None else due + 1e-6

    def worker_fields(self) -> dict | None:
        """What a worker's heartbeat answer carries once a shard moved: the map's epoch and
        the moved shards' addresses, [[rank, addr], ...]; None before any promotion."""
        if not self.moved:
            return None
        return {"epoch": self.epoch, "shards": [[r, a] for r, a in sorted(self.moved.items())]}
