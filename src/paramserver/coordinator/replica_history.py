"""What a coordinator that died said of its shards' backups, read back by the one restarted in
its place: which backup of each shard held every acknowledged update when it died, the
shard map the last reshard committed (live resharding: the servers serve its ranges, not the
job's first split) and the drains it was asked for and neither did nor refused (a `drain`
is answered once queued: nobody else remembers it). Pure: the node reads events.jsonl and
hands the records over.

A primary acknowledges an update only once the backup it forwards to holds it, and stops
waiting for that backup only when the coordinator says `backup_dropped`, which the
coordinator writes down (`backup_lost`) before it sends it (events.jsonl is line-buffered:
a written line survives the process). So a backup whose attach is the last one written synced
for its shard, with no loss or promotion of that shard after it, holds every update its
primary acknowledged. Such a backup may take over a primary that did not come back to the
restarted coordinator; any other is refused as before.

It also says where the shards' servers were (first registrations, committed layouts,
promotions): with live resharding a server new to the restarted coordinator is a dead one
restarted at its address, or else a joiner.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.coordinator.log_fold import LogFold

# The events that say where a shard's trusted copy is; the rest of the log is skipped.
KINDS = frozenset({"start", "backup_synced", "backup_rebuilt", "backup_taken_back",
                   "backup_lost", "replica_promoted", "server_joined", "server_drained",
                   "server_drain_asked", "reshard_refused"})


@dataclass(frozen=True)
class Link:
    addr: str
    epoch: int


class ReplicaHistory(LogFold):
    """Per shard rank, the synced backup link no later event undid; the highest attach and
    shard-map epochs written (a restarted coordinator numbers on from them); the shard map
    of the last committed reshard, (epoch, [[rank, addr, lo, hi], ...]), None without one;
    the drains still to do, {server address: who asked}, in the order asked; each shard's
    server's address, {rank: addr}."""

    kinds = KINDS

    def __init__(self):
        self.trusted: dict[int, Link] = {}
        self.attaches = 0
        self.map_epoch = 0
        self.layout: tuple[int, list] | None = None
        self.drains: dict[str, str] = {}
        self.servers: dict[int, str] = {}

    def _take(self, r: dict) -> None:
        kind, rank = r["event"], r.get("rank")
        if kind == "start":  # a new job in this run folder (a resume): its links start over
            self.trusted.clear()
            self.layout = None
            self.drains.clear()
            self.servers.clear()
            return
        if kind == "server_drain_asked" or kind == "reshard_refused":
            addr = r.get("addr")
            if not isinstance(addr, str):
                return
            if kind == "server_drain_asked":
                self.drains.setdefault(addr, str(r.get("by", "")))
            elif r.get("kind") == "drain":  # (a move refused is no answer to a drain)
                self.drains.pop(addr, None)
            return
        if kind in ("server_joined", "server_drained"):  # a reshard committed
            if kind == "server_drained" and isinstance(r.get("addr"), str):
                self.drains.pop(r["addr"], None)
            epoch, layout = r.get("epoch"), _shard_map(r.get("layout"))
            if _count(epoch) and layout is not None:
                self.layout = (epoch, layout)
                self.map_epoch = max(self.map_epoch, epoch)
                self.servers = {rank: addr for rank, addr, _, _ in layout}
            elif kind == "server_joined" and _rank(rank) and isinstance(r.get("addr"), str):
                self.servers[rank] = r["addr"]  # (a first registration: no reshard)
            return
        if not isinstance(rank, int) or isinstance(rank, bool):
            return
        addr, epoch = r.get("addr"), r.get("epoch")
        if kind == "replica_promoted":  # the backup became the primary: no backup now
            self.trusted.pop(rank, None)
            if isinstance(addr, str):
                self.servers[rank] = addr
            if _count(epoch):
                self.map_epoch = max(self.map_epoch, epoch)
            return
        if kind == "backup_lost":
            if self.trusted.get(rank) is not None and self.trusted[rank].addr == addr:
                del self.trusted[rank]
            return
        if not isinstance(addr, str) or not _count(epoch):
            return  # (an event of an older version, without the attach: never trusted)
        self.attaches = max(self.attaches, epoch)
        if kind == "backup_taken_back" and not r.get("synced"):
            self.trusted.pop(rank, None)
        else:
            self.trusted[rank] = Link(addr, epoch)

    def trusts(self, rank: int, addr: str, epoch: int, synced: bool) -> str | None:
        """None when the backup of shard `rank` at `addr`, attach `epoch`, holds every update
        its primary acknowledged; else why it cannot be said."""
        if not synced:
            return "it took no state sync"
        link = self.trusted.get(rank)
        if link is None:
            return f"the log names no synced backup of shard {rank} that was not lost since"
        if link != Link(addr, epoch):
            return (f"the log's synced backup of shard {rank} is {link.addr} (attach "
                    f"{link.epoch}), not {addr} (attach {epoch})")
        return None


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _rank(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _shard_map(v) -> list | None:
    """A logged layout's [[rank, addr, lo, hi], ...] when well formed: ranks 0.. in order,
    ranges tiling from 0; else None (not trusted)."""
    if not isinstance(v, list) or not v:
        return None
    out, edge = [], 0
    for rank, entry in enumerate(v):
        if not (isinstance(entry, list) and len(entry) == 4 and entry[0] == rank
                and isinstance(entry[1], str) and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in entry[2:])
                and entry[2] == edge and entry[3] > edge):
            return None
        out.append(list(entry))
        edge = entry[3]
    return out
