"""Test helper: one sync policy against scripted workers, in virtual time, deterministically.

The driver plays the coordinator and the servers around a PolicyHost: it tells the host of
joins, pushes and departures in time order, calls advance() when next_wakeup() comes (held
releases, the policy's timers), counts server versions (one per push in arrival mode, one per
ApplyRound for a round the servers sum) and checks the protocol as it goes. A worker that
stops after its last step does what a real one does: it reports the step, waits for the
release, then says goodbye. Nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from paramserver.policies import ApplyRound, Decision, Note, PolicyHost, Pushed, Release, SyncPolicy

StepCost = Callable[[int, int, float], float]  # (step, batch, now) -> seconds
LoadReading = Callable[[int, float], tuple]  # (step, now) -> (cpu_load, free_mem)


class DriverError(AssertionError):
    """The policy broke the protocol (a release for the wrong step, a deadlock...)."""


@dataclass(frozen=True)
class VirtualWorker:
    """A scripted worker: when it joins, how long a step takes, when it stops or dies."""

    worker: int
    join: float = 0.0
    steps: int = 10  # pushes before it leaves (reason "done") at its next release
    die_at: float | None = None  # killed then (reason "dead"), whatever it is doing
    cost: float | StepCost = 0.001  # seconds per sample, or a function of (step, batch, now)
    load: LoadReading | None = None
    # Seconds each step spends outside its compute (its own link, say): in the step's time,
    # not in the push's compute_time, whatever its batch.
    overhead: float = 0.0

    def duration(self, step: int, batch: int, now: float) -> float:
        d = self.cost(step, batch, now) if callable(self.cost) else self.cost * batch
        if not d >= 0 or math.isinf(d):
            raise DriverError(f"worker {self.worker}: step cost must be finite and >= 0, got {d}")
        return float(d) + self.overhead


@dataclass
class ReleaseRecord:
    """A release that went out (one held for a worker that died first never does)."""

    worker: int
    step: int
    batch_size: int
    scale: float
    not_before: float | None
    decided: float  # when the policy decided it (earlier than started if it was held)
    started: float | None = None  # when the worker got it (None: it died first)
    round_id: int = 0  # the lockstep round the servers sum its push into (auto's)


@dataclass
class PushRecord:
    worker: int
    step: int
    time: float
    batch_size: int
    compute_time: float
    base_version: int  # server version the worker read at its release
    staleness: int  # versions applied between its read and this push (arrival mode)


@dataclass
class Trace:
    releases: list[ReleaseRecord] = field(default_factory=list)
    pushes: list[PushRecord] = field(default_factory=list)
    rounds: list[tuple[float, ApplyRound]] = field(default_factory=list)
    notes: list[tuple[float, Note]] = field(default_factory=list)
    joined: list[tuple[float, int]] = field(default_factory=list)
    left: list[tuple[float, int, str]] = field(default_factory=list)
    end: float = 0.0

    def steps_done(self, worker: int) -> int:
        return sum(1 for p in self.pushes if p.worker == worker)


@dataclass
class _State:
    """One incarnation of a worker id, as the driver sees it."""

    spec: VirtualWorker
    status: str = "pending"  # pending -> waiting <-> computing -> gone
    expected: int | None = None  # the step its next release must name (None: any, at start)
    done_step: int | None = None  # last completed step; start - 1 once first released
    scheduled: ReleaseRecord | None = None  # a release the host let go, on its way
    current: ReleaseRecord | None = None
    base_version: int = 0
    steps_done: int = 0
    left_reason: str | None = None


class Driver:
    """Runs `policy` against `workers` until nothing is left to happen.

    Hooks, for tests that model parameters: on_pull(worker, release), on_push(worker, record),
    on_apply(apply_round), on_decision(driver, decision) as the policy makes each decision,
    before it takes effect (a held release when it is decided, not when it goes out).
    """

    def __init__(self, policy: SyncPolicy, workers: Sequence[VirtualWorker], *,
                 max_events: int = 1_000_000, on_pull=None, on_push=None, on_apply=None,
                 on_decision=None):
        self.policy = policy
        self.host = PolicyHost(policy, on_decision=self._decided)
        self.states = [_State(w) for w in workers]
        self.by_id: dict[int, int] = {}  # worker id -> index of its live incarnation
        self.max_events = max_events
        self.hooks = (on_pull, on_push, on_apply, on_decision)
        self.trace = Trace()
        self.now = 0.0
        self.version = 0
        self.queue: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.wake_at: float | None = None  # when the host next has something to do
        self.decided_at: dict[int, float] = {}  # worker -> when its next release was decided

    # ---- public ---------------------------------------------------------------------------------
    def run(self) -> Trace:
        for i, st in enumerate(self.states):
            self._at(st.spec.join, "join", i)
            if st.spec.die_at is not None:
                self._at(max(st.spec.die_at, st.spec.join), "die", i)
        handlers = {"join": self._join, "die": self._die, "deliver": self._deliver,
                    "push": self._push_done, "wake": self._wake}
        for _ in range(self.max_events):
            if not self.queue:
                break
            self.now, _, kind, i = heapq.heappop(self.queue)
            handlers[kind](i)
        else:
            raise DriverError(f"more than {self.max_events} events by t={self.now}: livelock?")
        self._check_nobody_waits()
        self.trace.end = self.now
        return self.trace

    def position(self, worker: int) -> int | None:
        """Steps `worker` has completed (its clock); None if unknown or gone."""
        i = self.by_id.get(worker)
        if i is None or self.states[i].done_step is None:
            return None
        return self.states[i].done_step + 1

    def live_workers(self) -> list[int]:
        return sorted(self.by_id)

    def incarnation(self, worker: int) -> int | None:
        """Which scripted incarnation currently holds the id `worker` (ids may be reused)."""
        return self.by_id.get(worker)

    # ---- events ---------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, kind, i))

    def _take(self, outs: list) -> None:
        """What the host let go of takes effect; then wake up when it next has work."""
        for d in outs:
            self._decide(d)
        wake = self.host.next_wakeup()
        if wake is not None and (self.wake_at is None or wake < self.wake_at):
            self.wake_at = max(wake, self.now)
            self._at(self.wake_at, "wake", -1)

    def _decided(self, d: Decision, now: float) -> None:
        """The host's watcher: the on_decision hook sees the policy's own order and time."""
        if self.hooks[3]:
            self.hooks[3](self, d)
        if isinstance(d, Release):
            st = self._check_release(d)  # a held one too, though it may never go out
            self.decided_at[d.worker] = now
            if st.done_step is None:
                # A newcomer is placed where its first release says once it is decided, so
                # the hook sees it there at the policy's next decision.
                st.done_step = d.step - 1

    def _join(self, i: int) -> None:
        st = self.states[i]
        if st.status != "pending":
            return  # died before joining
        w = st.spec.worker
        if w in self.by_id:
            raise DriverError(f"script error: worker id {w} joins while still live")
        self.by_id[w] = i
        st.status = "waiting"
        self.trace.joined.append((self.now, w))
        self._take(self.host.joined(w, self.now))

    def _die(self, i: int) -> None:
        st = self.states[i]
        if st.status == "gone":
            return
        was_live, st.status = st.status != "pending", "gone"
        if was_live:
            self._leave(st, "dead")

    def _leave(self, st: _State, reason: str) -> None:
        st.status, st.left_reason = "gone", reason
        del self.by_id[st.spec.worker]
        self.trace.left.append((self.now, st.spec.worker, reason))
        self.decided_at.pop(st.spec.worker, None)
        self._take(self.host.left(st.spec.worker, self.now, reason))

    def _wake(self, _: int) -> None:
        if self.wake_at is not None and self.wake_at <= self.now:
            self.wake_at = None
            self._take(self.host.advance(self.now))

    def _deliver(self, i: int) -> None:
        st = self.states[i]
        if st.status == "gone":
            return
        rec, st.scheduled = st.scheduled, None
        rec.started = self.now
        if st.steps_done >= st.spec.steps:
            self._leave(st, "done")
            return
        st.status, st.current, st.base_version = "computing", rec, self.version
        if self.hooks[0]:
            self.hooks[0](st.spec.worker, rec)
        self._at(self.now + st.spec.duration(rec.step, rec.batch_size, self.now), "push", i)

    def _push_done(self, i: int) -> None:
        st = self.states[i]
        if st.status != "computing":
            return  # it died mid-step: the push never happened
        rec, w = st.current, st.spec.worker
        own = self.policy.apply_mode == "arrival" and not rec.round_id  # applied now
        self.version += own
        push = PushRecord(w, rec.step, self.now, rec.batch_size,
                          self.now - rec.started - st.spec.overhead,
                          st.base_version, max(self.version - own - st.base_version, 0))
        self.trace.pushes.append(push)
        if self.hooks[1]:
            self.hooks[1](w, push)
        st.status, st.expected, st.done_step = "waiting", rec.step + 1, rec.step
        st.steps_done += 1
        cpu, mem = st.spec.load(rec.step, self.now) if st.spec.load else (None, None)
        self._take(self.host.pushed(Pushed(w, rec.step, self.now, rec.batch_size,
                                           push.compute_time, cpu, mem)))

    # ---- decisions ------------------------------------------------------------------------------
    def _decide(self, d: Decision) -> None:
        if isinstance(d, Release):
            self._release(d)
        elif isinstance(d, ApplyRound):  # (round mode, or a policy that sums_rounds)
            self.version += 1
            self.trace.rounds.append((self.now, d))
            if self.hooks[2]:
                self.hooks[2](d)
        elif isinstance(d, Note):
            self.trace.notes.append((self.now, d))
        else:
            raise DriverError(f"unknown decision {d!r}")

    def _release(self, d: Release) -> None:
        """The host let `d` go: the worker gets it now."""
        st = self._check_release(d)
        if d.not_before is not None and d.not_before > self.now:
            raise DriverError(f"t={self.now}: the host let {d} go before its not_before")
        rec = ReleaseRecord(d.worker, d.step, d.batch_size, d.scale, d.not_before,
                            self.decided_at.pop(d.worker, self.now), round_id=d.round_id)
        st.scheduled = rec
        self.trace.releases.append(rec)
        self._at(self.now, "deliver", self.by_id[d.worker])

    def _check_release(self, d: Release) -> _State:
        i = self.by_id.get(d.worker)
        if i is None:
            raise DriverError(f"t={self.now}: release for worker {d.worker}, which is not live")
        st = self.states[i]
        if st.status != "waiting" or st.scheduled is not None:
            raise DriverError(f"t={self.now}: worker {d.worker} released for step {d.step} "
                              f"while {'already released' if st.scheduled else st.status}")
        if (st.expected is None and d.step < 0) or st.expected not in (None, d.step):
            raise DriverError(f"t={self.now}: worker {d.worker} released for step {d.step}, "
                              f"but it is at step {st.expected}")
        if d.batch_size < 1 or not d.scale > 0:
            raise DriverError(f"t={self.now}: bad batch size or scale in {d}")
        return st

    def _check_nobody_waits(self) -> None:
        stuck = [st.spec.worker for st in self.states if st.status == "waiting"]
        if stuck:
            raise DriverError(f"deadlock at t={self.now}: workers {stuck} wait for a release "
                              "that never comes")


def run(policy: SyncPolicy, workers: Sequence[VirtualWorker], **kw) -> Trace:
    """Drive `policy` with `workers` to the end; raise DriverError on any protocol breach."""
    return Driver(policy, workers, **kw).run()
