"""Live resharding (`--servers MIN:MAX`): servers that join and leave a running job.

A part of CoordinatorState, pure. Asks (a server registering beyond the ranks taken, a `drain`)
queue here; one runs at a time, in three phases:

- fencing: the coordinator holds every release (`hold`), so each worker stops at its next
  clock. Once every started worker waits (all its pushes acknowledged: a worker waits for its
  push before it clocks; in round mode every round then applied), no worker has a request in
  flight and ranges may change under it.
- moving: every server of the old and the new layout is told `reshard` (the joiner through
  its welcome as well); each sends the keys it gives away straight to their new owner
  (`handoff`), and says `resharded` once its new range is whole (a drained one: once sent).
- commit: when all have said so, the caller renumbers its roster by the new layout, the
  shard map's epoch goes up and the held releases go out, each carrying the new layout.

Observers and bare KV clients are not fenced; a server answers their requests for keys it no
longer holds with a `moved` error carrying the layout, and they follow it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from paramserver.core.keyspace import KeyRange
from paramserver.core.reshard_plan import ReshardPlan, plan_drain, plan_join


@dataclass
class Ask:
    """A join (a server registered at `addr`, its registration answered at the commit) or a
    drain (the server at `addr` leaves)."""

    kind: str  # "join" | "drain"
    addr: str
    now: float
    to: Any = None  # a joiner's registration, answered with its welcome
    link: Any = None  # a joiner's connection
    src: str = ""
    why: str = ""  # a drain: who asked


@dataclass
class Running:
    """The reshard in progress: its ask, plan, the layouts by address, who has yet to say
    `resharded`."""

    ask: Ask
    plan: ReshardPlan | None = None
    started: float = 0.0  # when the fence began
    moving_since: float | None = None
    old: list = field(default_factory=list)  # [[rank, addr, lo, hi], ...]
    new: list = field(default_factory=list)
    waiting: set = field(default_factory=set)  # addresses still to report
    version: int = 0  # the highest version a server reported


class ReshardError(ValueError):
    """An ask refused: the message says why."""


class Resharder:
    """The job's server count between `min_servers` and `max_servers`; asks, the reshard in
    progress, the releases held for it and the shard map's epoch."""

    def __init__(self, min_servers: int, max_servers: int, fence_timeout: float,
                 move_timeout: float):
        self.min, self.max = min_servers, max_servers
        self.fence_timeout, self.move_timeout = fence_timeout, move_timeout
        self.epoch = 0  # the shard map's: every commit adds one
        self.asks: deque[Ask] = deque()
        self.running: Running | None = None
        self.held: list = []  # releases decided while fencing, delivered at the commit
        self.done = 0  # reshards committed

    @property
    def enabled(self) -> bool:
        return self.max > 0

    @property
    def holding(self) -> bool:
        """Releases wait: a reshard is asked for or in progress."""
        return bool(self.asks) or self.running is not None

    def hold(self, release) -> None:
        self.held.append(release)

    # ---- asks -----------------------------------------------------------------------------------
    def _count_after(self, servers: int) -> int:
        """The server count once every queued ask and the running one are done."""
        n = servers
        for a in ([self.running.ask] if self.running else []) + list(self.asks):
            n += 1 if a.kind == "join" else -1
        return n

    def ask_join(self, addr: str, servers: int, now: float, to=None, link=None,
                 src: str = "") -> bool:
        """A server at `addr` asks to join; True when the ask is new. A joiner not welcomed
        yet (its ask queued or fencing) sends its registration again when its connection
        comes back: the welcome goes to that one (False), the old reply token and
        connection being dead. Once keys move it was welcomed: a repeat is refused."""
        if not self.enabled:
            raise ReshardError(f"this job has a fixed {servers} servers (start it with "
                               f"--servers MIN:MAX to let servers join)")
        ask = self._ask_of(addr)
        if ask is not None:
            run = self.running
            if ask.kind != "join" or (run is not None and run.ask is ask
                                      and run.moving_since is not None):
                raise ReshardError(f"a server at {addr} already asked to join or leave")
            ask.to, ask.link, ask.src = to, link, src
            return False
        if self._count_after(servers) + 1 > self.max:
            raise ReshardError(f"the job has its most servers ({self.max}, --servers "
                               f"{self.min}:{self.max}) once the changes asked are done")
        self.asks.append(Ask("join", addr, now, to, link, src))
        return True

    def ask_drain(self, addr: str, servers: int, now: float, why: str = "") -> None:
        if not self.enabled:
            raise ReshardError(f"this job has a fixed {servers} servers (start it with "
                               f"--servers MIN:MAX to drain servers)")
        if self._pending(addr):
            raise ReshardError(f"the server at {addr} already asked to join or leave")
        if self._count_after(servers) - 1 < self.min:
            raise ReshardError(f"draining it would leave fewer than the job's {self.min} "
                               f"servers (--servers {self.min}:{self.max})")
        self.asks.append(Ask("drain", addr, now, why=why))

    def asked(self, addr: str) -> bool:
        """Whether the server at `addr` asked to join or leave and is not done yet."""
        return self._pending(addr)

    def _pending(self, addr: str) -> bool:
        return self._ask_of(addr) is not None

    def _ask_of(self, addr: str) -> Ask | None:
        running = [self.running.ask] if self.running else []
        return next((a for a in running + list(self.asks) if a.addr == addr), None)

    def forget(self, addr: str) -> Ask | None:
        """A queued ask of a server that is gone before its turn: dropped and returned."""
        for a in list(self.asks):
            if a.addr == addr:
                self.asks.remove(a)
                return a
        return None

    # ---- the reshard ----------------------------------------------------------------------------
    def begin(self, layout: list, now: float) -> Running:
        """Start fencing for the next ask. `layout`: [[rank, addr, lo, hi], ...] now."""
        ask = self.asks.popleft()
        self.running = Running(ask, started=now, old=[list(x) for x in layout])
        return self.running

    def move(self, busy, edges, now: float) -> Running:
        """The fence holds: plan the new layout (the old servers keep their order; a joiner
        goes where it moves the fewest keys) and wait for every server's report."""
        run = self.running
        old = [KeyRange(lo, hi) for _, _, lo, hi in run.old]
        addrs = [addr for _, addr, _, _ in run.old]
        busy = None if busy is None else [float(b) for b in busy]
        if run.ask.kind == "join":
            plan = plan_join(old, busy, edges)
        else:
            plan = plan_drain(old, addrs.index(run.ask.addr), busy, edges)
        run.plan, run.moving_since = plan, now
        run.new = [[j, run.ask.addr if o is None else addrs[o], r.lo, r.hi]
                   for j, (r, o) in enumerate(zip(plan.new, plan.owners))]
        run.waiting = {addr for _, addr, _, _ in run.old} | {a for _, a, _, _ in run.new}
        return run

    def reported(self, addr: str, version: int) -> bool:
        """A server's `resharded`; True once every one has reported (the caller commits)."""
        run = self.running
        if run is None or run.moving_since is None:
            return False
        run.waiting.discard(addr)
        run.version = max(run.version, version)
        return not run.waiting

    def follow(self, epoch: int) -> None:
        """The shard map changed outside a reshard (a backup took over, under map `epoch`):
        the layout's epoch goes up to it, so readers fetch the map anew. Not while keys move:
        the servers report the move under the epoch they were told."""
        if self.enabled and epoch > self.epoch and (self.running is None
                                                    or self.running.moving_since is None):
            self.epoch = epoch

    def commit(self) -> tuple[Running, list]:
        """The reshard is done: the new epoch; returns it and the releases to deliver."""
        run, self.running = self.running, None
        self.epoch += 1
        self.done += 1
        held, self.held = self.held, []
        return run, held

    def cancel(self) -> tuple[Ask, list]:
        """Give up the reshard while fencing (the fence never came): its ask and the held
        releases, to deliver now."""
        run, self.running = self.running, None
        held, self.held = self.held, []
        return run.ask, held

    def overdue(self, now: float) -> str | None:
        """'fence' or 'move' when the running reshard is past its limit, else None."""
        run = self.running
        if run is None:
            return None
        if run.moving_since is None:
            return "fence" if now - run.started > self.fence_timeout else None
        return "move" if now - run.moving_since > self.move_timeout else None

    def next_deadline(self) -> float | None:
        run = self.running
        if run is None:
            return None
        if run.moving_since is None:
            return run.started + self.fence_timeout
        return run.moving_since + self.move_timeout
