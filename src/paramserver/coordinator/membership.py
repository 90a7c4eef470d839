"""Who registered in which role and rank, the key-range map, and who has gone silent."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from paramserver.core.keyspace import KeyRange, split_by_bytes
from paramserver.core.layout import ModelLayout, first_difference
from paramserver.coordinator.events import Registered
from paramserver.policies import Release

INF = float("inf")
SERVER_SRC = re.compile(r"s[0-9]+")  # the names the coordinator gives servers (s<rank>)
# Observers (evaluators) a job admits at once: a job has at most one; the bound keeps a flood
# of registrations under fresh names from growing the roster until their silence is noticed.
MAX_OBSERVERS = 16


@dataclass
class Member:
    """A registered server, worker or observer, keyed by the `src` it chose."""

    rank: int
    addr: str = ""
    last_seen: float = 0.0
    link: Any = None  # a server: the node's handle of its connection
    waiting: Any = None  # the reply token of a start/clock request awaiting its release
    ready: Release | None = None  # a release decided before the worker asked for it
    started: bool = False
    steps: int = 0
    silent_since: float | None = None  # a server: when it was found silent (see recovery)
    # A worker taken back by a restarted coordinator: its step = the policy's step + offset
    # (the rebuilt policy counts from where it joined); `behind` its clock that the release it
    # holds already answers (see takeback.py).
    offset: int = 0
    joining: Any = None  # its WorkerBack, until the policy's join release comes
    behind: int | None = None
    last_release: Any = None  # the SendRelease that answered its last clock (sent again to a
    # repeat of that clock: a worker re-sends one whose answer it did not get)
    epoch: int = 0  # a worker: the shard map's epoch it was told (live resharding)


class UnknownMember(ValueError):
    """A message from a member this coordinator never registered: after a coordinator restart
    the sender re-registers (the reply's code is `unknown`)."""


@dataclass
class Roster:
    servers: dict[str, Member] = field(default_factory=dict)
    workers: dict[str, Member] = field(default_factory=dict)
    observers: dict[str, Member] = field(default_factory=dict)  # evaluators: read, never push
    gone: dict[str, str] = field(default_factory=dict)  # src -> why


# Registrations that wait (for the key space, the servers, a take-back) are answered later: at
# most this many per queue, one per sender, so a flood of registrations before the start
# cannot grow the coordinator without bound.
MAX_WAITING = 1024


def queue_waiting(queue: list, event) -> str | None:
    """Put a registration in a waiting queue, replacing an earlier one of the same sender;
    the reason it is refused when the queue is full, else None. Servers all register under
    one name until they have a rank: a server is its address."""
    for i, queued in enumerate(queue):
        if queued.src == event.src and queued.addr == event.addr:
            queue[i] = event
            return None
    if len(queue) >= MAX_WAITING:
        return (f"{len(queue)} registrations already wait for the job to start; "
                f"register again later")
    queue.append(event)
    return None


class Membership:
    """The roster plus what registration and liveness need around it: the key space (given,
    or learned from the first worker), registrations waiting for it or for the servers, workers
    waiting for a rank, and the silence limits."""

    def __init__(self, servers: int, workers: int, num_keys: int, heartbeat_timeout: float,
                 start_grace: float, layer_edges=(), elastic: bool = False):
        self.servers_expected, self.workers_expected = servers, workers
        # An elastic job's `workers` is its MAX: one more is refused at once, not kept waiting
        # for a rank (a fixed job's extra registration is a replacement for one not yet
        # declared dead).
        self.elastic = elastic
        self.roster = Roster()
        self.num_keys = num_keys
        self.layer_edges = tuple(layer_edges)  # cuts between shards prefer these (layers)
        self.ranges = split_by_bytes(num_keys, servers, self.layer_edges) if num_keys else None
        # The job's model layout, from the first worker that sent one (as the key space), and
        # that worker's rank: every later worker's must be the same.
        self.layout: ModelLayout | None = None
        self.layout_rank: int | None = None
        self.pending_servers: list[Registered] = []  # answered once the key space is known
        self.pending_workers: list[Registered] = []  # answered once every shard is up
        self.rank_waiters: list[tuple[Registered, float]] = []
        self.by_rank: dict[int, Member] = {}  # the workers by rank: a release finds its worker
        self.server_links: tuple = ()  # where ToServers goes
        self.hb_timeout = heartbeat_timeout
        # Before its start a member builds its model: the first torch import can hold the GIL
        # (and so its heartbeat thread) for seconds on a busy host; it gets longer.
        self.before_start = max(heartbeat_timeout, start_grace)

    # ---- lookups --------------------------------------------------------------------------------
    def find(self, src: str) -> tuple[str | None, Member | None]:
        """The role and membership that `src` registered with, if any."""
        roster = self.roster
        m = roster.workers.get(src)
        if m is not None:
            return "worker", m
        m = roster.servers.get(src)
        if m is not None:
            return "server", m
        m = roster.observers.get(src)
        if m is not None:
            return "observer", m
        return None, None

    def touch(self, src: str, now: float) -> None:
        """Any message from a member shows it alive."""
        m = self.find(src)[1]
        if m is not None:
            m.last_seen = now

    def worker(self, src: str) -> Member:
        member = self.roster.workers.get(src)
        if member is None:
            why = self.roster.gone.get(src)
            if why is None:
                raise UnknownMember(f"unknown worker {src!r} (never registered here)")
            raise ValueError(f"unknown worker {src!r} ({why})")
        return member

    def server_at(self, addr: str) -> Member | None:
        return next((m for m in self.roster.servers.values() if m.addr == addr), None)

    @property
    def servers_complete(self) -> bool:
        return len(self.roster.servers) >= self.servers_expected

    def shard_map(self) -> list[list]:
        by_rank = sorted(self.roster.servers.values(), key=lambda m: m.rank)
        return [[m.rank, m.addr, self.ranges[m.rank].lo, self.ranges[m.rank].hi] for m in by_rank]

    # ---- changes --------------------------------------------------------------------------------
    def learn_key_space(self, num_keys: int) -> list[Registered]:
        """Set the key space; returns the server registrations that waited for it."""
        self.num_keys = num_keys
        self.ranges = split_by_bytes(num_keys, self.servers_expected, self.layer_edges)
        pending, self.pending_servers = self.pending_servers, []
        return pending

    def adopt_shard_map(self, layout: list) -> None:
        """A restarted coordinator's: the shard map the dead one committed last (live
        resharding), [[rank, addr, lo, hi], ...]: its servers serve these ranges."""
        self.ranges = [KeyRange(lo, hi) for _, _, lo, hi in layout]
        self.servers_expected = len(layout)
        self.num_keys = self.num_keys or layout[-1][3]

    def add_server(self, event: Registered, now: float) -> Member:
        """The server of `event`, welcomed at `now`: its silence is counted from then. A
        registration that waited (for the key space, which a launched job's first worker
        brings, or for a take-back) was from a server that could not beat while it waited."""
        taken = {m.rank for m in self.roster.servers.values()}
        free = [r for r in range(self.servers_expected) if r not in taken]
        if not free:
            raise ValueError(f"all {self.servers_expected} server ranks are taken")
        member = Member(free[0], event.addr, now, link=event.link)
        self.roster.servers[f"s{member.rank}"] = member
        self.relinked()
        return member

    def rejoin_server(self, event: Registered, rank: int, lo: int, hi: int) -> Member:
        """A live server back to a restarted coordinator, with the rank and range it serves."""
        if not 0 <= rank < self.servers_expected:
            raise ValueError(f"server rank {rank} is not one of this job's "
                             f"{self.servers_expected}")
        shard = self.ranges[rank]
        if (shard.lo, shard.hi) != (lo, hi):
            raise ValueError(f"server rank {rank} serves keys [{lo}, {hi}), the job's shard "
                             f"{rank} is [{shard.lo}, {shard.hi}): not this job's server")
        held = self.roster.servers.get(f"s{rank}")
        if held is not None and held.addr != event.addr:
            raise ValueError(f"server rank {rank} is already back at {held.addr}")
        member = Member(rank, event.addr, event.now, link=event.link)
        self.roster.servers[f"s{rank}"] = member
        self.relinked()
        return member

    def rejoin_worker(self, event: Registered, rank: int) -> tuple[Member, bool]:
        """A live worker or observer back to a restarted coordinator under its rank; (member,
        True) if it was back already (a second re-registration changes nothing)."""
        roster, src = self.roster, event.src
        group = roster.observers if event.role == "observer" else roster.workers
        member = group.get(src)
        if member is not None:
            if member.rank != rank:
                raise ValueError(f"{src!r} is back as rank {member.rank}, not {rank}")
            member.last_seen = event.now
            return member, True
        if src in roster.gone:
            raise ValueError(f"worker {src!r} is gone ({roster.gone[src]})")
        if group is roster.workers:
            if not 0 <= rank < self.workers_expected or rank in self.by_rank:
                raise ValueError(f"worker rank {rank} is taken or not one of this job's "
                                 f"{self.workers_expected}")
        elif any(m.rank == rank for m in group.values()):
            raise ValueError(f"observer rank {rank} is taken")
        member = group[src] = Member(rank, last_seen=event.now)
        if group is roster.workers:
            self.by_rank[rank] = member
        return member, False

    def relinked(self) -> None:
        """A server registered or came back on a new connection."""
        self.server_links = tuple(m.link for m in self.roster.servers.values())

    def add_worker(self, event: Registered) -> Member | None:
        """The new worker or observer; None when every worker rank is taken: it waits (a
        replacement for a worker not yet declared dead gets that rank once the old one is
        dropped; else it is refused after a while)."""
        roster, src = self.roster, event.src
        if event.num_keys and event.num_keys != self.num_keys:
            who = f"rank {event.want_rank}" if event.want_rank is not None else "the worker"
            raise ValueError(f"{who}'s model has {event.num_keys} parameters, the job's "
                             f"{self.num_keys}: every rank must build the same model")
        if (src in roster.workers or src in roster.observers or src in roster.servers
                or SERVER_SRC.fullmatch(src)):
            # A server's name taken by a worker would make the server's own messages look
            # like the worker's (and the worker's like the server's).
            raise ValueError(f"id {src!r} is already registered or is a server's name")
        group = roster.observers if event.role == "observer" else roster.workers
        if group is roster.observers and len(group) >= MAX_OBSERVERS:
            raise ValueError(f"{len(group)} observers are registered already; at most "
                             f"{MAX_OBSERVERS}")
        taken = {m.rank for m in group.values()}
        want = event.want_rank
        if (group is roster.workers and want is not None and 0 <= want < self.workers_expected
                and want not in taken):
            rank = want  # a launched script's $RANK is its job rank, as torchrun users expect
        else:
            rank = next(r for r in range(len(taken) + 1) if r not in taken)
        if group is roster.workers and rank >= self.workers_expected and self.elastic:
            raise ValueError(f"this elastic job takes at most {self.workers_expected} workers "
                             f"(--workers MIN:{self.workers_expected}) and has them all: "
                             f"worker {src!r} refused")
        if group is roster.workers and rank >= self.workers_expected:
            # One wait per sender (a retry replaces it), and at most as many as there are
            # ranks: a flood of registrations must not grow the list for 2 heartbeat timeouts.
            self.rank_waiters = [w for w in self.rank_waiters if w[0].src != src]
            if len(self.rank_waiters) >= self.workers_expected:
                raise ValueError(f"all {self.workers_expected} worker ranks of this job are "
                                 f"taken and {len(self.rank_waiters)} registrations wait")
            self.rank_waiters.append((event, event.now + 2 * self.hb_timeout))
            return None
        if group is roster.workers:
            self._check_layout(event.layout, rank)
        member = group[src] = Member(rank, last_seen=event.now)
        if group is roster.workers:
            self.by_rank[rank] = member
        return member

    def _check_layout(self, layout: ModelLayout | None, rank: int) -> None:
        """The first layout becomes the job's; a later one that differs is refused, naming
        the rank and the first parameter that differs."""
        if layout is None:
            return
        if self.layout is None:
            self.layout, self.layout_rank = layout, rank
            return
        first = self.layout_rank
        diff = first_difference(self.layout, layout, f"on rank {first}", f"on rank {rank}")
        if diff is not None:
            raise ValueError(f"rank {rank}'s model differs from the job's (rank {first}'s, the "
                             f"first to join): {diff}; every rank must build the same model")

    def drop_worker(self, src: str, reason: str) -> Member:
        member = self.roster.workers.pop(src)
        del self.by_rank[member.rank]
        self.roster.gone[src] = reason
        return member

    def expired_waiters(self, now: float) -> list[Registered]:
        if not self.rank_waiters:
            return []
        expired = [e for e, deadline in self.rank_waiters if deadline <= now]
        self.rank_waiters = [w for w in self.rank_waiters if w[1] > now]
        return expired

    # ---- liveness -------------------------------------------------------------------------------
    def limit(self, member: Member) -> float:
        return self.hb_timeout if member.started else self.before_start

    def silent_observers(self, now: float) -> list[str]:
        return [src for src, m in self.roster.observers.items()
                if now - m.last_seen > self.limit(m)]

    def silent_workers(self, now: float) -> list[str]:
        return [src for src, m in self.roster.workers.items()
                if now - m.last_seen > self.limit(m)]

    def next_deadline(self) -> float | None:
        """When the next member turns silent or rank waiter expires (servers: see recovery)."""
        hb, grace, due = self.hb_timeout, self.before_start, INF
        for m in self.roster.workers.values():
            t = m.last_seen + (hb if m.started else grace)
            if t < due:
                due = t
        if self.roster.observers:
            for m in self.roster.observers.values():
                t = m.last_seen + (hb if m.started else grace)
                if t < due:
                    due = t
        for _, t in self.rank_waiters:
            if t < due:
                due = t
        return None if due == INF else due

    def check_invariants(self) -> None:
        workers = self.roster.workers
        assert {m.rank: m for m in workers.values()} == self.by_rank, "by_rank out of step"
        assert len(self.by_rank) == len(workers), "two workers share a rank"
        assert len({m.rank for m in self.roster.observers.values()}) == len(
            self.roster.observers), "two observers share a rank"
        assert len(workers) <= self.workers_expected, "more workers than ranks"
        assert set(self.roster.servers) == {f"s{m.rank}" for m in self.roster.servers.values()}
        assert self.server_links == tuple(m.link for m in self.roster.servers.values())
        if self.ranges is None:
            assert not self.roster.servers, "servers registered before the key space is known"
