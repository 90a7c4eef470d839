"""Coordinator membership: who registered in which role and rank, the key-range map, liveness."""

from __future__ import annotations

import heapq
import logging
import re
import time
from dataclasses import dataclass, field

from paramserver.core.keyspace import split_balanced
from paramserver.policies import Left, Release
from paramserver.wire import Message

log = logging.getLogger(__name__)
SERVER_SRC = re.compile(r"s[0-9]+")  # the names the coordinator gives servers (s<rank>)


@dataclass
class Member:
    """A registered server or worker, keyed by the `src` it chose."""

    rank: int
    ident: bytes
    addr: str = ""
    last_seen: float = 0.0
    waiting_rid: int | None = None  # a start/clock request awaiting its release
    ready: Release | None = None  # a release decided before the worker asked for it
    started: bool = False
    steps: int = 0
    silent_since: float | None = None  # a server: when it was found silent (see recovery)


@dataclass
class Roster:
    servers: dict[str, Member] = field(default_factory=dict)
    workers: dict[str, Member] = field(default_factory=dict)
    observers: dict[str, Member] = field(default_factory=dict)  # evaluators: read, never push
    gone: dict[str, str] = field(default_factory=dict)  # src -> why


class MembershipMixin:
    """Registration of servers, workers and observers, and dropping the silent ones.

    Part of the Coordinator: it shares the coordinator's state (roster, job, policy, socket).
    """

    # ---- registration ---------------------------------------------------------------------------
    def _on_register(self, ident: bytes, msg: Message) -> None:
        role = msg["role"]
        if role == "worker" and self.ranges is None and msg.get("num_keys"):
            self._set_key_space(msg["num_keys"])
        if role == "server":
            if self.ranges is None:
                self.pending_servers.append((ident, msg))  # answered once the key space is known
            else:
                self._register_server(ident, msg)
        elif role in ("worker", "observer"):
            if len(self.roster.servers) < self.job["servers"]:
                self.pending_workers.append((ident, msg))  # answered once every shard is up
            else:
                self._register_worker(ident, msg)
        else:
            raise ValueError(f"unknown role {role!r}; known: server, worker, observer")

    def _set_key_space(self, num_keys: int) -> None:
        self.job["num_keys"] = num_keys
        self.ranges = split_balanced(num_keys, self.job["servers"])
        self.record("key_space", num_keys=num_keys)
        pending, self.pending_servers = self.pending_servers, []
        for server in pending:
            self._register_server(*server)

    def _register_server(self, ident: bytes, msg: Message) -> None:
        if "addr" not in msg.fields:
            raise ValueError("a server must register with its address")
        back = next((m for m in self.roster.servers.values() if m.addr == msg["addr"]), None)
        if back is not None:  # only one process can listen there: the old one is dead
            self._server_back(ident, msg, back)
            return
        taken = {m.rank for m in self.roster.servers.values()}
        free = [r for r in range(self.job["servers"]) if r not in taken]
        if not free:
            raise ValueError(f"all {self.job['servers']} server ranks are taken")
        rank = free[0]
        src = f"s{rank}"
        self.roster.servers[src] = Member(rank, ident, msg["addr"], time.monotonic())
        job = self._server_job(rank)
        if self.job.get("resume"):
            job["restore"] = dict(self.job["resume"], version_floor=self._progress())
        self._reply(ident, msg, Message("welcome", {"rank": rank, "job": job}))
        self.record("server_joined", rank=rank, addr=msg["addr"])
        if len(self.roster.servers) == self.job["servers"]:
            for pending in self.pending_workers:
                self._register_worker(*pending)
            self.pending_workers = []

    def _server_job(self, rank: int) -> dict:
        shard = self.ranges[rank]
        return {"shard_range": [shard.lo, shard.hi], "dtype": self.job["dtype"],
                "apply_mode": self.policy.apply_mode, "optimizer": self.job["optimizer"],
                "heartbeat_interval": self.job.get("heartbeat_interval", 1.0),
                "coordinator_timeout": self.job.get("coordinator_timeout", 60.0)}

    def shard_map(self) -> list[list]:
        by_rank = sorted(self.roster.servers.values(), key=lambda m: m.rank)
        return [[m.rank, m.addr, self.ranges[m.rank].lo, self.ranges[m.rank].hi] for m in by_rank]

    def _register_worker(self, ident: bytes, msg: Message) -> None:
        if msg.get("num_keys") and msg["num_keys"] != self.job["num_keys"]:
            raise ValueError(f"worker has {msg['num_keys']} parameters, the job "
                             f"{self.job['num_keys']}: not the same model")
        group = self.roster.observers if msg["role"] == "observer" else self.roster.workers
        if (msg.src in self.roster.workers or msg.src in self.roster.observers
                or msg.src in self.roster.servers or SERVER_SRC.fullmatch(msg.src)):
            # A server's name taken by a worker would make the server's own messages look
            # like the worker's (and the worker's like the server's).
            raise ValueError(f"id {msg.src!r} is already registered or is a server's name")
        taken = {m.rank for m in group.values()}
        rank = next(r for r in range(len(taken) + 1) if r not in taken)
        if group is self.roster.workers and rank >= self.job["workers"]:
            # Maybe a replacement for a worker not yet declared dead: it gets that rank (and
            # its data shard) once the old one is dropped; else it is refused after a while.
            deadline = time.monotonic() + 2 * self.hb_timeout
            self.rank_waiters.append((ident, msg, deadline))
            return
        group[msg.src] = Member(rank, ident, last_seen=time.monotonic())
        job = {k: v for k, v in self.job.items() if k not in ("sync",)}
        job.update(shards=self.shard_map(), apply_mode=self.policy.apply_mode,
                   sync=self.policy.name, resume_samples=self.worker_samples.get(rank, 0))
        self._reply(ident, msg, Message("welcome", {"rank": rank, "job": job}))
        self.record(f"{msg['role']}_registered", rank=rank, src=msg.src)

    def _expire_rank_waiters(self, now: float) -> None:
        for ident, msg, deadline in [w for w in self.rank_waiters if w[2] <= now]:
            self._reply(ident, msg, Message("error", {
                "msg": f"all {self.job['workers']} worker ranks of this job are taken",
                "code": "refused"}))
        self.rank_waiters = [w for w in self.rank_waiters if w[2] > now]

    def _worker(self, src: str) -> Member:
        member = self.roster.workers.get(src)
        if member is None:
            why = self.roster.gone.get(src, "never registered")
            raise ValueError(f"unknown worker {src!r} ({why})")
        return member

    # ---- liveness -------------------------------------------------------------------------------
    def _check_liveness(self) -> None:
        now = time.monotonic()
        self._expire_rank_waiters(now)
        self._check_servers(now)
        # Before its start a member builds its model: the first torch import can hold the GIL
        # (and so its heartbeat thread) for seconds on a busy host; it gets longer.
        before_start = max(self.hb_timeout, float(self.job.get("start_grace", 30.0)))
        for src, member in list(self.roster.observers.items()):
            if now - member.last_seen > (self.hb_timeout if member.started else before_start):
                log.warning("observer %s silent for %.1f s: dropped", src, now - member.last_seen)
                del self.roster.observers[src]
        for src, member in list(self.roster.workers.items()):
            limit = self.hb_timeout if member.started else before_start
            if now - member.last_seen > limit:
                log.warning("worker %s (rank %d) silent for %.1f s: declared dead", src,
                            member.rank, now - member.last_seen)
                self._drop_worker(src, member, "dead")

    def _drop_worker(self, src: str, member: Member, reason: str) -> None:
        del self.roster.workers[src]
        self.roster.gone[src] = reason
        self.record("worker_left", worker=member.rank, reason=reason)
        # A release still held for not_before must not reach a newcomer that takes this rank.
        self.timers = [t for t in self.timers if t[2].worker != member.rank]
        heapq.heapify(self.timers)
        self.metric({"kind": "left", "worker": member.rank, "reason": reason})
        if member.started and self.barrier_open:
            self._apply(self.policy.handle(Left(member.rank, self.now(), reason)))
        elif not self.barrier_open:
            self.lost_before_start += 1
        if self.rank_waiters:
            self._register_worker(*self.rank_waiters.pop(0)[:2])
