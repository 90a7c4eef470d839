"""Coordinator recovery: a restarted coordinator takes back the live servers and workers.

A coordinator restarted at the address of the one that died knows the job and the checkpoint
on disk, but not where the job is now: the servers hold the parameters and their versions, the
workers know the release they hold and whether their clock of it is unanswered. They re-register
with that identity (a `rejoin` record: rank, step, clocked, samples; a server its rank, range
and version, with replicas the backup it forwards to; a backup the rank it mirrors and its
attach epoch: paired again in replicas.py) when the new coordinator answers one of their
messages with `unknown`. The live
state wins over the checkpoint: the counters are re-derived from what comes back, the
checkpoint gives only what no live process holds (the policy's own saved state, the samples of
ranks that are gone).

`TakeBack` collects the re-registrations until every server and every expected worker is
back, or `deadline` passes (a live member re-registers within a few heartbeat intervals), then
says how to rebuild: `plan()`. The workers expected are the ranks the caller names, from the
old coordinator's log (worker_history.py): an elastic job's (`--workers MIN:MAX`) the members
at its death, as it runs with any number of them (waiting for MAX would cost every take-back
with fewer its whole deadline); a fixed job's every rank but those that left on their own word.
Pure: times come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.coordinator.events import Clocked, Registered, Started


@dataclass(frozen=True)
class WorkerBack:
    """What a re-registering worker says of itself: the step of the release it holds (-1: none
    yet), whether its clock of that step is unanswered (it sends it again), the samples its rank
    has drawn with their clocks answered."""

    rank: int
    step: int
    clocked: bool
    samples: int

    @classmethod
    def of(cls, record: dict) -> "WorkerBack":
        return cls(_nonneg(record, "rank"), _int(record, "step", -1, -1), bool(
            record.get("clocked", False)), _nonneg(record, "samples", 0))


@dataclass(frozen=True)
class ForwardsTo:
    """A replicated shard's primary back to a restarted coordinator: the backup it still
    forwards to (its address and attach epoch), whether that backup acknowledged the state
    sync (`synced`), and whether the primary reported it lost (`lost`: it waits for the
    coordinator's `backup_dropped`)."""

    addr: str
    epoch: int
    synced: bool
    lost: bool = False

    @classmethod
    def of(cls, record: dict) -> "ForwardsTo | None":
        """From a primary's rejoin record (flat: backup_addr, backup_epoch, backup_synced,
        backup_lost); None without backup_addr."""
        addr = record.get("backup_addr")
        if addr is None:
            return None
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"rejoin field 'backup_addr' must be an address, got {addr!r}")
        return cls(addr, _int(record, "backup_epoch", 1),
                   bool(record.get("backup_synced", False)),
                   bool(record.get("backup_lost", False)))


@dataclass(frozen=True)
class ServerBack:
    """A primary back: its rank, range and version; with replicas, the backup it forwards to
    (None: none) and the shard map's epoch it was promoted at (0: never promoted)."""

    rank: int
    lo: int
    hi: int
    version: int
    backup: ForwardsTo | None = None
    map_epoch: int = 0
    moving: int = 0  # live resharding: the epoch of a move it was told and never committed
    draining: bool = False  # live resharding: its SIGTERM asked for a drain not done yet

    @classmethod
    def of(cls, record: dict) -> "ServerBack":
        return cls(_nonneg(record, "rank"), _nonneg(record, "lo"), _nonneg(record, "hi"),
                   _nonneg(record, "version", 0), ForwardsTo.of(record),
                   _nonneg(record, "map_epoch", 0), _nonneg(record, "moving", 0),
                   bool(record.get("draining", False)))


@dataclass(frozen=True)
class BackupBack:
    """A backup back to a restarted coordinator: the shard rank it mirrors, the attach epoch of
    the state sync it took (0: none yet), whether it took one, and its version."""

    rank: int
    epoch: int
    synced: bool
    version: int

    @classmethod
    def of(cls, record: dict) -> "BackupBack":
        return cls(_nonneg(record, "rank"), _nonneg(record, "epoch", 0),
                   bool(record.get("synced", False)), _nonneg(record, "version", 0))


def _int(record: dict, name: str, low: int, default: int | None = None) -> int:
    value = record.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"rejoin field {name!r} must be an integer >= {low}, got {value!r}")
    return value


def _nonneg(record: dict, name: str, default: int | None = None) -> int:
    return _int(record, name, 0, default)


@dataclass(frozen=True)
class Plan:
    """How the policy is rebuilt: `round` is the round in progress (round mode: every earlier
    one is applied), `samples`/`steps` the job's progress, `worker_samples` by rank."""

    open_barrier: bool
    round: int
    samples: int
    steps: int
    worker_samples: dict


class TakeBack:
    """The re-registrations of one take-back. `saved` is the coordinator's part of the latest
    checkpoint ({} without one). `expected`: the worker ranks waited for. `replacements`: a
    new worker stands for an expected rank not back (a fixed job's: it can only be a dead
    one's replacement, which takes its rank); else (an elastic job's) it is as likely a
    joiner and ends no wait (it would take the lowest free rank, a live member's not back
    yet)."""

    def __init__(self, deadline: float, servers: int, expected: frozenset[int], saved: dict,
                 batch_size: int, replacements: bool = True,
                 server_addrs: frozenset[str] | None = None):
        self.deadline = deadline
        self.servers_expected = servers
        self.expected, self.replacements = frozenset(expected), replacements
        self.left: set[int] = set()  # expected ranks that said bye before the rebuild
        self.saved = saved
        self.batch_size = batch_size
        self.workers: dict[str, WorkerBack] = {}
        self.servers: dict[int, ServerBack] = {}
        self.deferred: list = []  # Clocked/Started of members back before the rebuild
        self.fresh: list[Registered] = []  # new members (a replacement worker): after it
        # Servers started afresh (one that died with the coordinator, restarted): restored
        # from the checkpoint once the rest is taken back.
        self.fresh_servers: list[Registered] = []
        # Live resharding: where the old coordinator's servers were (None: not known, or
        # no server may join), and the servers new to the job, asked to join after it.
        self.server_addrs = server_addrs
        self.joiners: list[Registered] = []

    def worker_back(self, src: str, back: WorkerBack) -> None:
        self.workers[src] = back

    def server_back(self, back: ServerBack) -> None:
        self.servers[back.rank] = back

    def server_queue(self, addr: str) -> list[Registered]:
        """Where a server registering afresh waits. At an address of the old coordinator's
        servers, or when those are not known, it is one of them restarted: it stands for a
        server not back. Elsewhere it is a joiner (its registration sent again when its
        connection came back to this coordinator): taken for a server not back, it would be
        restored from the checkpoint in a live one's place."""
        if self.server_addrs is None or addr in self.server_addrs:
            return self.fresh_servers
        return self.joiners

    def defer(self, event: Clocked | Started) -> None:
        self.deferred.append(event)

    def forget(self, src: str) -> None:
        """A worker that said bye before the rebuild (an expected rank is not waited for)."""
        back = self.workers.pop(src, None)
        if back is not None:
            self.left.add(back.rank)
        self.deferred = [e for e in self.deferred if e.src != src]

    def ready(self, now: float) -> bool:
        """Every server is back, and every worker expected or the deadline has come."""
        if len(self.servers) + len(self.fresh_servers) < self.servers_expected:
            return False
        return self.all_back() or now >= self.deadline

    def all_back(self) -> bool:
        """Every worker expected is back (or said bye since), or stood for by a replacement."""
        stand_ins = sum(e.role == "worker" for e in self.fresh) if self.replacements else 0
        return len(self.missing()) <= stand_ins

    def missing(self) -> list[int]:
        """The expected worker ranks not back."""
        back = {w.rank for w in self.workers.values()}
        return sorted(self.expected - back - self.left)

    def plan(self, round_mode: bool) -> Plan:
        back = list(self.workers.values())
        released = [w.step for w in back if w.step >= 0]
        saved = self.saved
        # Round mode: the furthest release names the round in progress (a worker one behind
        # clocked the round before, which completed: its re-sent clock gets this round's
        # release). With no worker back, the servers' versions count the rounds applied.
        if released:
            rnd = max(released)
        else:
            rnd = max((s.version for s in self.servers.values()),
                      default=int(saved.get("rounds_applied", 0)))
        if not round_mode:
            rnd = int(saved.get("rounds_applied", 0))
        by_rank = {int(k): int(v) for k, v in saved.get("worker_samples", {}).items()}
        for w in back:  # the live count wins: it may be behind the checkpoint's only if reset
            by_rank[w.rank] = max(w.samples, by_rank.get(w.rank, 0))
        samples = sum(by_rank.values())
        steps = int(saved.get("steps_done", 0)) + max(
            0, samples - int(saved.get("samples_done", 0))) // max(1, self.batch_size)
        return Plan(bool(released) or bool(saved.get("samples_done")), rnd, samples, steps,
                    by_rank)
