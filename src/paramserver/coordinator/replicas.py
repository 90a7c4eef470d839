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

A restarted coordinator (`--take-back`) takes back the live backups as well: it answers a
backup's beat with `unknown`, and the backup registers again (`rejoin`: the rank it mirrors,
the attach epoch of the sync it took). Its primary's own rejoin says which backup it forwards to
(address, epoch, whether synced). The two are paired only when they agree, within the take-back
window (the heartbeat timeout from the restart); a backup that disagrees, or comes back late,
is refused (it exits and the launcher rebuilds a new one), and a primary whose backup does not
come back is told `backup_dropped`, so neither the take-back nor the start barrier waits on a
backup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paramserver.coordinator.events import (
    AppendEvent, Registered, ReplicaReport, Reply, ToServers,
)
from paramserver.coordinator.membership import Member, Membership, UnknownMember
from paramserver.coordinator.replica_history import ReplicaHistory
from paramserver.coordinator.takeback import BackupBack, ForwardsTo, ServerBack


def backup_rank(src: str) -> int | None:
    """The shard rank of a backup's name (b<rank>), else None."""
    return int(src[1:]) if len(src) > 1 and src[0] == "b" and src[1:].isdigit() else None


# Dead primaries' successors kept for clients' heartbeat answers (a client needs only those
# of the shards it sent to since its last beat).
MAX_REPLACED = 64


@dataclass
class Backup:
    rank: int
    addr: str
    link: Any
    last_seen: float
    epoch: int  # the attach it was told about: reports of an older one are stale
    synced: bool = False


@dataclass
class Returning:
    """A backup back to a restarted coordinator, waiting for its primary's word."""

    e: Registered
    back: BackupBack
    welcome: Any


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
        # Coordinator recovery: backups come back until `returning_until` (take_back()).
        self.restarted = False
        self.returning_until: float | None = None
        self.claims: dict[int, ForwardsTo | None] = {}  # rank -> its primary's word, once back
        self.returning: dict[int, Returning] = {}  # rank -> its backup, back before the word
        self.dropped_links: set = set()  # backups dropped or refused: their beats unanswered
        self.history: ReplicaHistory | None = None  # the dead coordinator's word (take_back)
        self.took_over: list[ServerBack] = []  # shards a backup took over at the take-back
        self.replaced: dict[str, str] = {}  # a dead primary's address -> its successor's
        self.settled: set[tuple[int, int]] = set()  # (rank, attach epoch) of claims decided

    def find(self, src: str) -> Backup | None:
        rank = backup_rank(src)
        return None if rank is None else self.backups.get(rank)

    @property
    def links(self) -> tuple:
        return (*(b.link for b in self.backups.values()),
                *(r.e.link for r in self.returning.values()))

    @property
    def watching(self) -> bool:
        """Something for check() to judge in time: a backup, or a take-back window open."""
        return bool(self.backups) or self.returning_until is not None

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
        # (While backups may still come back, no rank is free: the new one waits for the end
        # of the take-back window.)
        free = [] if self.returning_until is not None else [
            r for r in range(self.servers) if r not in self.backups]
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

    # ---- coordinator recovery -------------------------------------------------------------------
    def take_back(self, until: float, history: ReplicaHistory | None = None) -> None:
        """This coordinator replaces one that died: the live backups come back until `until`
        (their beats are answered `unknown` until then, and after it too: a late one is
        refused). `history`, the dead coordinator's word on its backups, lets a backup the
        log trusts take over a primary that does not come back."""
        if self.enabled:
            self.restarted = True
            self.returning_until = until
            self.history = history
            if history is not None:  # attach and map epochs number on from the log's
                self.attaches = max(self.attaches, history.attaches)
                self.epoch = max(self.epoch, history.map_epoch)

    def primary_back(self, member: Member, back: ServerBack, now: float, members: Membership,
                     out: list) -> None:
        """Shard `back.rank`'s primary re-registered, saying which backup it forwards to."""
        rank = member.rank
        if back.map_epoch:  # promoted under the old coordinator: the map's epoch goes on
            self.epoch = max(self.epoch, back.map_epoch)
            self.moved[rank] = member.addr
        claim = back.backup
        if claim is not None:
            self.attaches = max(self.attaches, claim.epoch)
            if (rank, claim.epoch) in self.settled:  # a repeated rejoin: decided already
                return
        b = self.backups.get(rank)
        if b is not None:  # already paired (a repeated rejoin), or a new one waits to attach
            if not b.epoch:
                self._attach(b, member, now, out)
            return
        if claim is not None and claim.lost:  # reported to the old coordinator: drop it
            self.settled.add((rank, claim.epoch))
            out.append(AppendEvent(now, "backup_lost", {
                "rank": rank, "addr": claim.addr, "epoch": claim.epoch,
                "reason": "reported lost before the coordinator restart"}))
            out.append(ToServers("backup_dropped", {"rank": rank, "epoch": claim.epoch},
                                 (member.link,)))
            self.lost += 1
            claim = None
        if self.returning_until is None:  # past the window: its backup is not taken back
            if claim is not None:
                self._unclaimed(rank, claim, member, "the take-back window had closed", now,
                                out)
            return
        self.claims[rank] = claim
        self._pair(rank, members, now, out)

    def backup_back(self, e: Registered, back: BackupBack, members: Membership, welcome,
                    out: list) -> None:
        """A live backup re-registered with a restarted coordinator: paired with its primary
        when both agree, refused otherwise (it exits; a new backup is rebuilt)."""
        if not self.enabled:
            raise ValueError("this job has no replicas (--replicas 2): no backup is wanted")
        rank = back.rank
        if not 0 <= rank < self.servers:
            raise ValueError(f"backup of shard {rank}: this job has {self.servers} shards")
        b = self.backups.get(rank)
        if b is not None and b.link == e.link:  # taken back already: a repeat
            out.append(welcome(rank))
            return
        ret = Returning(e, back, welcome)
        if b is not None or self.returning_until is None:
            why = (f"shard {rank} has its backup at {b.addr}" if b is not None else
                   "it came back after the take-back window")
            self._refuse(ret, why, e.now, out)
            return
        old = self.returning.get(rank)
        if old is not None and old.e.link != e.link:
            # Two backups of one shard (one dropped before the restart, its shutdown lost):
            # attach epochs only grow, so the later attach is the primary's.
            if old.back.epoch > back.epoch:
                old, ret = ret, old
            self._refuse(old, f"a backup of shard {rank} of a later attach came back", e.now,
                         out)
        self.returning[rank] = ret
        self._pair(rank, members, e.now, out)

    def _pair(self, rank: int, members: Membership, now: float, out: list) -> None:
        """Both the primary and the backup of `rank` are back: take the backup back as its
        primary's, or refuse it."""
        ret = self.returning.get(rank)
        if rank not in self.claims or ret is None:
            return
        del self.returning[rank]
        claim = self.claims.pop(rank)
        if claim is not None:
            self.settled.add((rank, claim.epoch))
        addr, back = ret.e.addr, ret.back
        if claim is None:
            why = f"shard {rank}'s primary forwards to no backup"
        elif (claim.addr, claim.epoch) != (addr, back.epoch):
            why = (f"shard {rank}'s primary forwards to {claim.addr} (attach {claim.epoch}), "
                   f"not to {addr} (attach {back.epoch})")
        elif claim.synced and not back.synced:
            why = f"shard {rank}'s primary counts it synced, it took no sync"
        else:
            b = self.backups[rank] = Backup(rank, addr, ret.e.link, now, claim.epoch,
                                            claim.synced)
            if b.synced:
                self.synced_ranks.add(rank)
            out.append(ret.welcome(rank))
            out.append(AppendEvent(now, "backup_taken_back", {
                "rank": rank, "addr": addr, "epoch": claim.epoch, "synced": claim.synced,
                "version": back.version}))
            return
        self._refuse(ret, why, now, out)
        if claim is not None:
            primary = members.roster.servers.get(f"s{rank}")
            self._unclaimed(rank, claim, primary, why, now, out)

    def _refuse(self, ret: Returning, why: str, now: float, out: list) -> None:
        self.dropped_links.add(ret.e.link)
        out.append(Reply(ret.e.to, "error", {"msg": f"backup not taken back: {why}",
                                             "code": "refused"}))
        out.append(AppendEvent(now, "backup_not_taken_back", {
            "rank": ret.back.rank, "addr": ret.e.addr, "reason": why}))

    def _unclaimed(self, rank: int, claim: ForwardsTo, primary: Member | None, why: str,
                   now: float, out: list) -> None:
        """The backup a primary forwards to is not taken back: the primary drops it (its held
        replies go) and serves unreplicated until a new backup is attached."""
        self.settled.add((rank, claim.epoch))
        self.lost += 1
        out.append(AppendEvent(now, "backup_lost", {"rank": rank, "addr": claim.addr,
                                                    "epoch": claim.epoch,
                                                    "reason": f"not taken back: {why}"}))
        if primary is not None:
            out.append(ToServers("backup_dropped", {"rank": rank, "epoch": claim.epoch},
                                 (primary.link,)))

    def _close_window(self, now: float, members: Membership, out: list) -> None:
        """The take-back window is over: a primary's backup that did not come back is
        dropped, a backup whose primary did not is refused; waiting new backups take the
        free ranks."""
        self.returning_until = None
        for rank, claim in sorted(self.claims.items()):
            if claim is not None:
                self._unclaimed(rank, claim, members.roster.servers.get(f"s{rank}"),
                                "it did not come back within the take-back window", now, out)
        for ret in self.returning.values():
            why = f"shard {ret.back.rank}'s primary did not come back within the take-back window"
            doubt = ("its primary is back" if f"s{ret.back.rank}" in members.roster.servers
                     else None)
            if doubt is None:
                doubt = ("the dead coordinator's log was not read" if self.history is None
                         else self.history.trusts(ret.back.rank, ret.e.addr, ret.back.epoch,
                                                  ret.back.synced))
            if doubt is None and members.ranges is not None:
                self._take_over(ret, members, now, out)
            else:
                self._refuse(ret, f"{why} and {doubt}", now, out)
        self.claims.clear()
        self.returning.clear()
        for _ in range(self.servers):
            if not self.waiting_backups or len(self.backups) >= self.servers:
                break
            self._next_waiting(members, now, out)

    def _take_over(self, ret: Returning, members: Membership, now: float, out: list) -> None:
        """A backup the log trusts, whose primary did not come back: promoted in its place
        (welcomed as the backup it is, then told `promote`), its shard back to the take-back
        (`took_over`)."""
        rank, shard = ret.back.rank, members.ranges[ret.back.rank]
        members.rejoin_server(ret.e, rank, shard.lo, shard.hi)
        self.epoch += 1
        self.promotions += 1
        self.moved[rank] = ret.e.addr
        self.took_over.append(ServerBack(rank, shard.lo, shard.hi, ret.back.version))
        out.append(ret.welcome(rank))
        out.append(ToServers("promote", {"rank": rank, "epoch": self.epoch}, (ret.e.link,)))
        out.append(AppendEvent(now, "replica_promoted", {
            "rank": rank, "addr": ret.e.addr, "old_addr": None, "epoch": self.epoch,
            "silent_s": None, "after": "its primary did not come back to the restarted "
                                       "coordinator"}))

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

    # ---- live resharding -----------------------------------------------------------------------
    def resharded(self, old: list, new: list, members: Membership, now: float,
                  out: list) -> None:
        """Keys moved between primaries (layouts [[rank, addr, lo, hi], ...]): each backup
        follows its primary to the primary's new rank and is attached anew (its next sync is
        of the new shard); a drained primary's backup goes to a shard without one (a joiner),
        or is shut down. Until each is synced again its shard runs unreplicated."""
        if not self.enabled:
            return
        addr_of = {rank: addr for rank, addr, _, _ in old}
        new_rank = {addr: rank for rank, addr, _, _ in new}
        kept, spare = {}, []
        for rank, b in sorted(self.backups.items()):
            r = new_rank.get(addr_of.get(rank))
            if r is None:
                spare.append(b)
            else:
                kept[r] = b
        self.servers = len(new)
        self.backups, self.suspected = {}, {}
        self.moved.clear()  # (the layout the workers get names every primary's address)
        free = [r for r in range(len(new)) if r not in kept]
        for b in spare:
            if free:
                kept[free.pop(0)] = b
                continue
            why = "its primary was drained and every shard has a backup"
            self.dropped_links.add(b.link)
            out.append(AppendEvent(now, "backup_lost", {"rank": b.rank, "addr": b.addr,
                                                        "epoch": b.epoch, "reason": why}))
            out.append(ToServers("shutdown", {"reason": f"dropped: {why}"}, (b.link,)))
        for rank, b in sorted(kept.items()):
            out.append(AppendEvent(now, "backup_moved", {"rank": rank, "addr": b.addr,
                                                         "old_rank": b.rank}))
            b.rank, b.synced, b.epoch, b.last_seen = rank, False, 0, now
            self.backups[rank] = b
            primary = members.roster.servers.get(f"s{rank}")
            if primary is not None:
                self._attach(b, primary, now, out)

    # ---- what members say -----------------------------------------------------------------------
    def heartbeat(self, src: str, link, now: float, members: Membership) -> bool | None:
        """A backup's heartbeat: True to answer it; None when `src` is no backup's name. A
        beat of a backup just promoted (sent before it took its primary's name) counts for
        the primary it is now; one of a dropped backup is not answered (it was told to shut
        down), never answered `unknown`, which would make it register again."""
        rank = backup_rank(src)
        if rank is None:
            return None
        # By its connection: after a reshard a backup beats under its old name until its
        # primary's new sync renames it.
        b = self.backups.get(rank)
        if b is None or b.link != link:
            b = next((b for b in self.backups.values() if b.link == link), None)
        if b is not None:
            b.last_seen = now
            return True
        primary = members.roster.servers.get(f"s{rank}")
        if primary is not None and primary.link == link:
            primary.last_seen = now
            return True
        ret = self.returning.get(rank)
        if ret is not None and ret.e.link == link:  # back, waiting for its primary's word
            return True
        if self.restarted and link not in self.dropped_links:
            raise UnknownMember(f"unknown backup {src!r}")  # it registers again (backup_back)
        return False

    def report(self, e: ReplicaReport, members: Membership, out: list) -> bool:
        """A primary's `backup_synced` or `backup_lost`; True if it was answered (a stale
        primary's report is answered with shutdown)."""
        rank = int(e.fields.get("rank", -1))
        if e.op == "primary_down":
            self._suspect(e, rank, members, out)
            return False
        primary = members.roster.servers.get(f"s{rank}")
        if primary is None and self.restarted and 0 <= rank < self.servers:
            raise UnknownMember(f"unknown primary {e.src!r}")  # not back yet: it registers
        if primary is None or primary.link != e.link:
            if any(m.link == e.link for m in members.roster.servers.values()):
                return False  # a primary's word from before a reshard renumbered it: stale
            out.append(ToServers("shutdown", {
                "reason": f"this server is no longer shard {rank}'s primary"}, (e.link,)))
            out.append(AppendEvent(e.now, "stale_primary_stopped", {"rank": rank}))
            return True
        primary.last_seen = e.now
        b = self.backups.get(rank)
        epoch = int(e.fields.get("epoch", 0))
        claim = self.claims.get(rank)
        if b is None and claim is not None and claim.epoch == epoch:  # its backup not back yet
            if e.op == "backup_synced":
                self.claims[rank] = ForwardsTo(claim.addr, claim.epoch, True)
            elif e.op == "backup_lost":
                self.claims[rank] = None
                self._unclaimed(rank, claim, primary, str(e.fields.get("reason", "")), e.now,
                                out)
            return False
        if b is None or b.epoch != epoch:
            return False
        if e.op == "backup_synced":
            b.synced = True
            kind = "backup_rebuilt" if rank in self.synced_ranks else "backup_synced"
            self.synced_ranks.add(rank)
            out.append(AppendEvent(e.now, kind, {"rank": rank, "addr": b.addr,
                                                 "epoch": b.epoch,
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
        self.dropped_links.add(b.link)
        self.lost += 1
        out.append(AppendEvent(now, "backup_lost", {"rank": b.rank, "addr": b.addr,
                                                    "epoch": b.epoch, "reason": why}))
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
        if self.returning_until is not None and now >= self.returning_until:
            self._close_window(now, members, out)
        for rank, b in list(self.backups.items()):
            primary = roster.servers.get(f"s{rank}")
            if now - b.last_seen > self.timeout:
                self._drop(b, primary, f"silent for {now - b.last_seen:.1f} s", now, out,
                           members)
                continue
            if primary is not None and b.synced:
                why = self._gone(rank, primary, now)
                if why is not None:
                    self.promote(b, primary, now, members, schedule, out, why)
                    promoted.append(rank)
        # (A backup not synced yet whose primary is gone: coordinator/orphans.py decides.)
        return promoted

    def promote(self, b: Backup, old: Member | None, now: float, members: Membership, schedule,
                out: list, why: str = "silence", restore: dict | None = None) -> None:
        """Backup `b` becomes its shard's primary in place of `old` (None: a primary that
        never registered). `restore`: a ShardRestore's dict the promoted server loads first
        (a backup not synced: coordinator/orphans.py); None: it serves what it holds."""
        rank = b.rank
        self.suspected.pop(rank, None)
        del self.backups[rank]
        new = Member(rank, b.addr, now, link=b.link)
        members.roster.servers[f"s{rank}"] = new
        members.relinked()
        self.epoch += 1
        self.promotions += 1
        self.moved[rank] = b.addr
        if old is not None:
            self._replaced(old.addr, b.addr)
        fields = {"rank": rank, "epoch": self.epoch}
        if restore is not None:
            fields["restore"] = restore
        out.append(ToServers("promote", fields, (b.link,)))
        out.append(AppendEvent(now, "replica_promoted", {
            "rank": rank, "addr": b.addr, "old_addr": None if old is None else old.addr,
            "epoch": self.epoch,
            "silent_s": None if old is None else round(now - old.last_seen, 3), "after": why,
            **({} if restore is None else {"checkpoint": restore["tag"]})}))
        if schedule.pending_tag is not None:  # the dead primary will never confirm it
            out.append(AppendEvent(now, "checkpoint_aborted",
                                   {"tag": schedule.pending_tag, "server": rank}))
            schedule.abort()
        self._next_waiting(members, now, out)

    def next_deadline(self, members: Membership) -> float | None:
        due = self.returning_until
        for rank, b in self.backups.items():
            t = b.last_seen + self.timeout
            primary = members.roster.servers.get(f"s{rank}")
            if primary is not None:  # (not synced: orphans.py judges it by the same silence)
                limit = self.fast if rank in self.suspected else self.timeout
                t = min(t, primary.last_seen + limit)
            if due is None or t < due:
                due = t
        return None if due is None else due + 1e-6

    def _replaced(self, old: str, new: str) -> None:
        """Primary `old` is gone for good, `new` serves its shard: said to clients by
        address, which holds across reshards that renumber the ranks (the newest few)."""
        self.replaced[old] = new
        while len(self.replaced) > MAX_REPLACED:
            del self.replaced[next(iter(self.replaced))]

    def predecessor(self, addr: str) -> str | None:
        """The dead primary's address that `addr` serves in place of (None: none known)."""
        return next((old for old, new in self.replaced.items() if new == addr), None)

    def worker_fields(self) -> dict | None:
        """What a worker's heartbeat answer carries once a shard moved: the map's epoch, the
        moved shards' addresses, [[rank, addr], ...], and the dead primaries' successors by
        address, [[old, new], ...]; None before any promotion."""
        if not self.moved and not self.replaced:
            return None
        return {"epoch": self.epoch, "shards": [[r, a] for r, a in sorted(self.moved.items())],
                "replaced": [[o, n] for o, n in self.replaced.items()]}
