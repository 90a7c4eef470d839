"""Discrete-event engine: one sync policy, N virtual workers and the servers' links, in virtual time.

Each worker step is the live protocol, message by message (L = one-way latency):

    release decided at t  -> held until not_before (R2SP) -> reaches the worker L later
    pull request reaches the server L later: the version is read there, the reply queues on the
        server's outbound link (FIFO, model_bytes / servers / bandwidth per reply), lands L after
    compute (the compute model x the straggler factor at the compute's start)
    push queues on the server's inbound link; applied when its transfer ends (staleness then);
        the ack lands L later; the clock reaches the coordinator L after that -> Pushed

Symmetric shards see the same requests in the same order, so one queue per direction stands
for all S servers. Versions count applied pushes (arrival mode) or applied rounds (round mode),
exactly as the servers count them. No clocks, threads or I/O: records go to a sink.

Replayed communication (`comm`, see sim.trace.CommReplay) replaces the links: each step's pull
and push take the times a live run recorded for that worker and step, the worker's unrecorded
time per step (sleep overshoot, bookkeeping) follows its compute, and the coordinator's messages
take comm.release_latency (release -> worker) and comm.clock_latency (clock -> coordinator).

The end: `steps` per worker, or a sample budget shared by all workers (`max_samples`), checked
as the live coordinator does: when a clock brings the count to the budget, before the policy
hears of that push; every release delivered from then on tells its worker to stop.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from paramserver.policies.base import Joined, Left, Pushed, SyncPolicy, Tick
from paramserver.sim.engine_decisions import EngineDecisionsMixin
# SimError lives in engine_events; sim/__init__ and callers import it from here too.
from paramserver.sim.engine_events import APPLIED, BUSY, CLOCK, COMPUTED, GONE, WAITING, SimError
from paramserver.sim.engine_replay import ReplayStepsMixin


@dataclass(frozen=True)
class Network:
    """Per server link and direction: bandwidth in bytes/s; latency one-way, per message."""

    model_bytes: float = 0.0
    bandwidth: float = math.inf
    latency: float = 0.0
    servers: int = 1

    @property
    def transfer_time(self) -> float:
        """Seconds one worker's pull or push holds a server link."""
        if self.bandwidth == math.inf or self.model_bytes == 0:
            return 0.0
        return self.model_bytes / self.servers / self.bandwidth


class NullSink:
    """Drops every record (for benchmarks of the engine alone)."""

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        pass

    def left(self, t, w, reason):
        pass

    def event(self, t, kind, data):
        pass

    def record(self, record):
        pass


class Engine(ReplayStepsMixin, EngineDecisionsMixin):
    """Runs `policy` with `workers` workers of `steps` steps each; `run()` until nothing is left.

    cost(worker, step, batch) -> seconds; straggler: an object with factor(worker, step, t) or
    None; trainer: optional, gets pull / push / apply_round / advance calls (see sim.train).
    max_samples: a budget shared by all workers (steps may then be None: no per-worker cap).
    comm: replayed communication times instead of `network` (see the module doc).
    """

    def __init__(self, policy: SyncPolicy, workers: int, steps: int | None, cost,
                 network: Network, sink=None, straggler=None, trainer=None,
                 max_samples: int | None = None, comm=None):
        if steps is None and not max_samples:
            raise ValueError("need steps per worker or a sample budget (max_samples)")
        if workers < 1 or (steps is not None and steps < 1) or (max_samples or 1) < 1:
            raise ValueError(f"need workers >= 1, steps >= 1 and max_samples >= 1, got "
                             f"{workers}, {steps}, {max_samples}")
        self.policy, self.n, self.cost = policy, workers, cost
        self.steps = math.inf if steps is None else steps
        self.max_samples = max_samples or math.inf
        self.stopping = False
        self.comm = comm
        self.net, self.sink = network, sink or NullSink()
        self.straggler, self.trainer = straggler, trainer
        self.round_mode = policy.apply_mode == "round"
        self.L, self.tx = network.latency, network.transfer_time
        self.now, self.version = 0.0, 0
        self._seq = itertools.count()  # ties in time go in the order they were scheduled
        self.events = self.steps_done = self.samples = self.rounds = 0
        self.out_free = self.in_free = 0.0  # when each link direction is next idle
        self.queue: list[tuple[float, int, int, int]] = []
        self.tick_at: float | None = None
        z = [0] * workers
        self.status, self.done, self.step, self.batch = [WAITING] * workers, z[:], z[:], z[:]
        self.scale, self.pulled, self.min_version = [1.0] * workers, z[:], z[:]
        self.wait_from, self.wait_s, self.pull_s = [0.0] * workers, [0.0] * workers, [0.0] * workers
        self.push_from, self.push_s = [0.0] * workers, [0.0] * workers
        self.compute_s, self.factor, self.stale = [0.0] * workers, [1.0] * workers, z[:]
        self.handlers = (self._read, self._computed, self._applied, self._clock, self._leave,
                         self._tick, self._deliver)
        # Delays from a release's delivery to the pull reaching the server (READ), and to the
        # worker's goodbye reaching the coordinator (LEAVE).
        self.to_read = self.to_leave = 2 * self.L
        if comm is not None:
            self.handlers = (self._read_replay, self._computed_replay, self._applied_replay,
                             self._clock, self._leave, self._tick, self._deliver)
            self.to_read = comm.release_latency
            self.to_leave = comm.release_latency + comm.clock_latency
            self.wait_from = [-comm.start_wait(w) for w in range(workers)]
        self.started = False

    # ---- driving --------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the start barrier: every worker joins at t = 0, in rank order."""
        self.started = True
        self.sink.event(0.0, "barrier_open", {"workers": self.n})
        for w in range(self.n):
            self._handle(Joined(w, 0.0))

    def run(self, max_events: int | None = None) -> bool:
        """Process events (at most `max_events`); True once the simulation has ended."""
        if not self.started:
            self.start()
        q, pop, handlers, tr = self.queue, heapq.heappop, self.handlers, self.trainer
        budget = math.inf if max_events is None else max_events
        n = 0
        while q and n < budget:
            t, _, kind, w = pop(q)
            if tr is not None and t > tr.next_eval:
                tr.advance(t, self)
            self.now = t
            handlers[kind](t, w)
            n += 1
        self.events += n
        if q:
            return False
        self._check_everyone_left()
        if tr is not None:
            tr.finish(self.now, self)
        return True

    @property
    def total_steps(self) -> int | None:
        """Steps of the whole run when fixed (steps per worker), None under a sample budget."""
        return None if self.steps == math.inf else self.n * self.steps

    def _at(self, t: float, kind: int, w: int, push=heapq.heappush) -> None:
        push(self.queue, (t, next(self._seq), kind, w))

    # ---- the worker's step ----------------------------------------------------------------------
    def _read(self, t: float, w: int) -> None:
        """The pull request is at the server: read the version, queue the reply, then compute."""
        L, arrived = self.L, t - self.L  # the release reached the worker L ago
        self.wait_s[w] = arrived - self.wait_from[w]
        if self.version < self.min_version[w]:
            raise SimError(f"t={t}: worker {w} pulls version {self.version} < min_version "
                           f"{self.min_version[w]}")
        self.pulled[w] = self.version
        if self.trainer is not None:
            self.trainer.pull(w, self.version)
        start = t if t > self.out_free else self.out_free
        self.out_free = end = start + self.tx
        got = end + L
        self.pull_s[w] = got - arrived
        step, batch = self.step[w], self.batch[w]
        f = 1.0 if self.straggler is None else self.straggler.factor(w, step, got)
        self.factor[w] = f
        self.compute_s[w] = c = self.cost(w, step, batch) * f
        self.status[w] = BUSY
        self._at(got + c, COMPUTED, w)

    def _computed(self, t: float, w: int) -> None:
        """Compute ended: the push queues on the inbound link (FIFO by send time)."""
        self.push_from[w] = t
        start = t + self.L
        if self.in_free > start:
            start = self.in_free
        self.in_free = end = start + self.tx
        self._at(end, APPLIED, w)

    def _applied(self, t: float, w: int) -> None:
        """The push is in the server: staleness as the server computes it, then the ack."""
        v = self.version
        self.stale[w] = v - self.pulled[w] if v > self.pulled[w] else 0
        if self.trainer is not None:
            self.trainer.push(w, self)
        if not self.round_mode:
            self.version = v + 1
        acked = t + self.L
        self.push_s[w] = acked - self.push_from[w]
        self.wait_from[w] = acked
        if self.L:
            self._at(acked + self.L, CLOCK, w)
        else:
            self._clock(t, w)

    def _clock(self, t: float, w: int) -> None:
        """The clock reaches the coordinator: the record is written and the policy told."""
        step, batch, c = self.step[w], self.batch[w], self.compute_s[w]
        extra = None if self.trainer is None else self.trainer.record(w)
        if self.comm is not None:
            real = self.comm.real(w, step)
            if real is not None:
                extra = {"real_compute_s": round(min(real, c), 6), **(extra or {})}
        self.sink.step(t, w, step, batch, c, self.wait_s[w], self.pull_s[w], self.push_s[w],
                       self.stale[w], self.factor[w], extra)
        self.done[w] += 1
        self.steps_done += 1
        self.samples += batch
        self.status[w] = WAITING
        if self.samples >= self.max_samples and not self.stopping:
            self.stopping = True  # before the policy hears of it: this was the last step
            self.sink.event(t, "budget_reached", {"samples": self.samples})
        self._handle(Pushed(w, step, t, batch, c))

    def _leave(self, t: float, w: int) -> None:
        self.status[w] = GONE
        self.sink.left(t, w, "done")
        self.sink.event(t, "worker_left", {"worker": w, "reason": "done"})
        self._handle(Left(w, t, "done"))

    def _tick(self, t: float, _: int) -> None:
        if self.tick_at is not None and self.tick_at <= t:
            self.tick_at = None
            self._handle(Tick(t))

    def _check_everyone_left(self) -> None:
        stuck = [w for w in range(self.n) if self.status[w] != GONE]
        if stuck:
            raise SimError(f"deadlock at t={self.now}: {len(stuck)} workers never finished "
                           f"(first: {stuck[:10]}); steps done: "
                           f"{[self.done[w] for w in stuck[:10]]}")
