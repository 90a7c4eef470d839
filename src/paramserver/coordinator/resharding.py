"""Live resharding's part of the coordinator: the events of servers joining and leaving a
running job (`drain`, `resharded`, the joiner's registration, time passing), and the drained
servers told to shut down once their keys are gone. Pure: events in, instructions out.

The plan of one reshard (the asks queued, the fence, who must still report) is Resharder's
(reshard.py); this part turns it into messages and owns what the coordinator keeps beside it:
each shard's apply time since the last reshard (where keys go) and the drained servers' grace.
It reads the rest of the coordinator through a `Situation` taken at the event; what it cannot
do itself (the releases held at the fence, a failure, metrics lines) it returns in an
`Outcome` for the coordinator to carry out in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from paramserver.coordinator.events import AppendEvent, Reply, ToServers, Warn
from paramserver.coordinator.membership import Member, Membership
from paramserver.coordinator.reshard import Ask, Resharder
from paramserver.core.keyspace import KeyRange

_OK: dict = {}


@dataclass(frozen=True)
class Situation:
    """What the part reads of the rest of the coordinator at one event."""

    stopping: bool  # the budget is spent: no fence would be reached
    may_begin: bool  # the start barrier is open and no checkpoint is being written
    version: int  # the round the servers are at (0 outside round mode)
    shard_job: Callable[[int, int], Any]  # the ServerJob of keys [lo, hi)


@dataclass
class Outcome:
    """What the coordinator carries out after the part: metrics records, then the job's
    failure (if any) or the releases held at the fence."""

    held: list = field(default_factory=list)
    failure: str | None = None
    metrics: list = field(default_factory=list)
    # A reshard committed: its layouts, [[rank, addr, lo, hi], ...] (replicas follow them).
    old: list | None = None
    new: list | None = None


class Resharding:
    def __init__(self, plan: Resharder, grace: float):
        self.plan = plan
        self.grace = grace  # how long a drained server may still answer before its shutdown
        self.shard_busy: dict[int, float] = {}  # rank -> apply seconds since the last reshard
        self.draining: list = []  # (link, when it is told to shut down) of drained servers
        self.restart = False  # the move under way lost a server to its backup: move again

    @property
    def enabled(self) -> bool:
        return self.plan.enabled

    def draining_link(self, link) -> bool:
        """Whether `link` is a drained server's in its grace (answered until its shutdown)."""
        return link is not None and any(held == link for held, _ in self.draining)

    def busy(self, rank: int, seconds: float) -> None:
        """A shard's heartbeat: its apply time, where the next reshard's cuts weigh."""
        self.shard_busy[rank] = self.shard_busy.get(rank, 0.0) + seconds

    # ---- events ---------------------------------------------------------------------------------
    def drain(self, rank: int, by: str, now: float, to, members: Membership, out: list) -> None:
        member = members.roster.servers.get(f"s{rank}")
        if member is None:
            raise ValueError(f"no server of rank {rank}: ranks are 0.."
                             f"{len(members.roster.servers) - 1}")
        self.plan.ask_drain(member.addr, len(members.roster.servers), now, by)
        out.append(Reply(to, "ok", _OK))
        out.append(AppendEvent(now, "server_drain_asked", {"rank": rank, "addr": member.addr,
                                                           "by": by}))

    def drain_again(self, addr: str, by: str, now: float, members: Membership,
                    out: list) -> None:
        """A drain asked of a coordinator that died before it was done (its log, or the
        server's SIGTERM in its `rejoin`), asked again of this one, which took the job back:
        nobody waits for an answer, so a refusal is only written down."""
        member = members.server_at(addr)
        if member is None or self.plan.asked(addr):
            return  # (no longer one of the job's servers; asked of this one already)
        try:
            self.plan.ask_drain(addr, members.servers_expected, now, by)
        except ValueError as exc:  # (a ReshardError: too few servers would be left)
            self._refuse(Ask("drain", addr, now, why=by), str(exc), now, out)
            return
        out.append(AppendEvent(now, "server_drain_asked", {"rank": member.rank, "addr": addr,
                                                           "by": by, "again": True}))

    def join(self, e, members: Membership, now: float, out: list) -> None:
        """A server beyond the ranks taken: it joins the running job at the next reshard,
        welcomed then with the range it gets (`again`: its registration sent again, on a
        connection that came back)."""
        if self.plan.ask_join(e.addr, len(members.roster.servers), now, e.to, e.link, e.src):
            out.append(AppendEvent(now, "server_join_asked", {"addr": e.addr}))
        else:
            out.append(AppendEvent(now, "server_join_asked", {"addr": e.addr, "again": True}))

    def resharded(self, e, members: Membership, out: list) -> Outcome:
        plan, run = self.plan, self.plan.running
        if run is None or run.moving_since is None or e.epoch != plan.epoch + 1:
            return Outcome()  # a report of a reshard given up, or a stale one
        addr = next((m.addr for m in members.roster.servers.values() if m.link == e.link),
                    run.ask.addr if run.ask.kind == "join" and run.ask.link == e.link else None)
        if addr is None:
            raise ValueError(f"resharded from {e.src!r}, which is no server of this reshard")
        if not plan.reported(addr, e.version):
            return Outcome()
        return self._commit(e.now, members, out)

    def overdue(self, now: float, stopping: bool, members: Membership, out: list) -> Outcome:
        """Deadlines: drained servers past their grace, a fence or a move that took too
        long; with the budget spent, the asks still queued are refused."""
        plan = self.plan
        for link, due in list(self.draining):
            if now >= due:
                self.draining.remove((link, due))
                out.append(ToServers("shutdown", {"reason": "drained"}, (link,)))
        done = Outcome()
        over = plan.overdue(now)
        if over == "fence":
            ask, done.held = plan.cancel()
            self._refuse(ask, f"no quiet point came within {plan.fence_timeout:.0f} s (a worker "
                              f"that never clocks holds the fence)", now, out)
        elif over == "move":
            # Every server kept its old core until the commit: give the move up and they
            # serve their old ranges again. (A server that died with keys nobody else has
            # ends the job by its own silence, as always.)
            waiting = sorted(plan.running.waiting)
            epoch = plan.epoch + 1
            ask, done.held = plan.cancel()
            plan.epoch = epoch  # (the given-up move's: its late pieces and reports are stale)
            out.append(ToServers("reshard_abort", {"epoch": epoch}, members.server_links))
            if ask.kind == "join":  # welcomed at the move's start: told to go
                out.append(ToServers("shutdown", {"reason": "its join was given up"},
                                     (ask.link,)))
            self._refuse(replace(ask, to=None), f"the move did not finish within "
                         f"{plan.move_timeout:.0f} s (no 'resharded' from {waiting}): given "
                         f"up, every server serves its old range", now, out)
        if plan.running is None and plan.asks and stopping:
            # No step will come to fence at; a joiner hears it now rather than waiting out
            # its registration.
            while plan.asks:
                self._refuse(plan.asks.popleft(), "the job is ending (its budget is spent)",
                             now, out)
        return done

    def advance(self, now: float, members: Membership, at: Situation, out: list) -> None:
        """Begin the next ask's fence when the job may; start moving once it holds."""
        plan = self.plan
        if plan.running is None and plan.asks and at.may_begin and not at.stopping:
            run = plan.begin(members.shard_map(), now)
            out.append(AppendEvent(now, "reshard_fence", {"kind": run.ask.kind,
                                                          "addr": run.ask.addr}))
        run = plan.running
        if run is not None and run.moving_since is None and _fenced(members):
            self._start_moving(now, members, at, out)
        elif run is not None and self.restart:
            self._move_again(now, members, at, out)

    def _move_again(self, now: float, members: Membership, at: Situation, out: list) -> None:
        """The same move (layouts naming the promoted backup) under the next epoch: servers
        drop the one under way and start from their old cores."""
        plan, run = self.plan, self.plan.running
        self.restart = False
        plan.epoch += 1  # (the given-up move's: its late pieces and reports are stale)
        run.moving_since, run.version = now, 0
        run.waiting = {a for _, a, _, _ in run.old} | {a for _, a, _, _ in run.new}
        self._tell_move(now, members, at, out, again=True)

    def next_deadline(self) -> float | None:
        t = self.plan.next_deadline()
        for _, due in self.draining:
            t = due if t is None or due < t else t
        if self.plan.asks and self.plan.running is None:
            return None  # begins at the next look (the node looks after every event)
        return t

    # ---- the phases -----------------------------------------------------------------------------
    def _refuse(self, ask, why: str, now: float, out: list) -> None:
        out.append(Warn(f"server {ask.kind} of {ask.addr} given up: {why}"))
        out.append(AppendEvent(now, "reshard_refused", {"kind": ask.kind, "addr": ask.addr,
                                                        "reason": why}))
        if ask.to is not None:
            out.append(Reply(ask.to, "error", {"msg": why, "code": "refused"}))

    def _start_moving(self, now: float, members: Membership, at: Situation,
                      out: list) -> None:
        busy = [self.shard_busy.get(r, 0.0) for r in range(len(members.roster.servers))]
        self.plan.move(busy, members.layer_edges, now)
        self._tell_move(now, members, at, out)

    def _tell_move(self, now: float, members: Membership, at: Situation, out: list,
                   again: bool = False) -> None:
        """`reshard` to every server of the move (a joiner welcomed first, the first time:
        the range it fills), and the event."""
        plan, run = self.plan, self.plan.running
        ask = run.ask
        fields = {"epoch": plan.epoch + 1, "layout": run.new, "old": run.old,
                  "version": at.version}
        out.append(ToServers("reshard", fields, members.server_links))
        if ask.kind == "join":
            if not again:
                rank, _, lo, hi = next(x for x in run.new if x[1] == ask.addr)
                out.append(Reply(ask.to, "welcome", {
                    "rank": rank, "job": at.shard_job(lo, hi).to_dict(),
                    "epoch": plan.epoch + 1, "handoff": True}))
            out.append(ToServers("reshard", fields, (ask.link,)))
        event = {"kind": ask.kind, "addr": ask.addr, "epoch": plan.epoch + 1, "old": run.old,
                 "layout": run.new, "moved_keys": run.plan.moved_keys,
                 "fence_s": round(now - run.started, 6)}
        if again:
            event["again"] = True
        out.append(AppendEvent(now, "reshard_moving", event))

    def promoted(self, old: str, new: str) -> None:
        """Shard server `old` was replaced by its backup at `new` (ranks and ranges do not
        change outside a reshard): asks and the reshard in progress name the backup now. A
        move under way starts again (`advance`): the backup holds the old shard, the pieces
        the dead server had or would have sent are lost, and every server kept its old core
        until the commit."""
        plan = self.plan
        run = plan.running
        for ask in [*plan.asks, *([run.ask] if run is not None else [])]:
            if ask.addr == old:
                ask.addr = new
        if run is None:
            return
        for entry in (*run.old, *run.new):
            if entry[1] == old:
                entry[1] = new
                self.restart = self.restart or run.moving_since is not None

    def _commit(self, now: float, members: Membership, out: list) -> Outcome:
        plan = self.plan
        run, held = plan.commit()
        roster = members.roster
        by_addr = {m.addr: m for m in roster.servers.values()}
        # Every server of both layouts serves its new range (or none) from this word on;
        # until it, each kept its old core, so a move given up could start again.
        links = tuple(m.link for m in by_addr.values())
        if run.ask.kind == "join":
            links += (run.ask.link,)
        out.append(ToServers("reshard_commit", {"epoch": plan.epoch}, links))
        kept = {addr for _, addr, _, _ in run.new}
        servers = {}
        for rank, addr, lo, hi in run.new:
            m = by_addr.get(addr)
            if m is None:  # the joiner
                m = Member(rank, addr, now, link=run.ask.link)
            m.rank, m.last_seen = rank, now
            servers[f"s{rank}"] = m
        roster.servers = servers
        members.ranges = [KeyRange(lo, hi) for _, _, lo, hi in run.new]
        members.servers_expected = len(run.new)
        members.relinked()
        self.shard_busy = {}
        for addr, m in by_addr.items():
            if addr not in kept:
                self.draining.append((m.link, now + self.grace))
        ask = run.ask
        rank = next((x[0] for x in run.new if x[1] == ask.addr), None)
        info = {"addr": ask.addr, "epoch": plan.epoch, "servers": len(run.new),
                "moved_keys": run.plan.moved_keys, "pause_s": round(now - run.started, 6),
                "move_s": round(now - run.moving_since, 6), "layout": run.new}
        if rank is not None:
            info["rank"] = rank
        out.append(AppendEvent(now, "server_joined" if ask.kind == "join" else "server_drained",
                               info))
        change = "server_joined" if ask.kind == "join" else "server_left"
        return Outcome(held=held, metrics=[{
            "kind": "membership", "change": change, "servers": len(run.new),
            "epoch": plan.epoch, "moved_keys": run.plan.moved_keys,
            "pause_s": info["pause_s"]}], old=run.old, new=run.new)


def _fenced(members: Membership) -> bool:
    """Every started worker waits for a release: none has a request in flight."""
    return all(m.waiting is not None for m in members.roster.workers.values() if m.started)
