"""Per-worker and per-shard statistics of a job, from its metrics records (pure: no clock, no I/O).

`JobStats.add(record)` takes the metrics.jsonl lines one by one (live, replayed or read whole)
and `snapshot()` says where the job stands: per worker its latest step, samples/s, batch,
staleness and the split of its recent steps into data, compute, push, wait and pull; the
min/median/max of each across workers; which workers are slow, chronic or transient
(`SlowClassifier`); and the time the others lost waiting for each worker (`WaitLedger`).

Definitions (docs/observability.md, "Watching a job: top and straggler attribution"):

- A step's *work* is everything but the wait for the release: data + compute + push + pull
  (data is part of compute_s: see docs/metrics.md). Its *cost* is work per sample, so that a
  worker the policy gives smaller batches (LB-BSP) is still compared fairly.
- A worker is *slow* at a step when that step's cost exceeds `slow_factor` x the median of the
  other workers' latest costs (with no other worker, nobody is slow).
- It is *chronic* when at least `chronic_min` of its last `window` steps were slow, and stays
  chronic while at least `chronic_keep` of them are; *transient* when it is not chronic, had at
  least `transient_min` slow steps in the window and one of its last `clear_after` steps was
  slow; it is *cleared* (back to ok) once its last `clear_after` steps were all normal.
- Time lost waiting for worker w: in round mode (BSP, LB-BSP), for each round, the sum over the
  other workers of (w's step end - their step end) when w ended last; in arrival mode (ASP,
  SSP, ...), every wait a worker reports (the policy held its release) is charged to the
  worker furthest behind at that moment (the one a bound such as SSP's waits for).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from paramserver.policies import SYNC_POLICIES

OK, TRANSIENT, CHRONIC = "ok", "transient", "chronic"
PHASES = ("data", "compute", "push", "wait", "pull")


def round_mode_of(policy: str | None) -> bool:
    """Whether policy `policy` applies by rounds (True) or on arrival; unknown names: arrival."""
    if policy and policy in SYNC_POLICIES:
        return SYNC_POLICIES.get(policy).apply_mode == "round"
    return False


def _num(record: dict, name: str) -> float:
    value = record.get(name, 0.0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One `kind: step` metrics line, typed. Absent phases are 0 (older runs lack data_s)."""

    worker: int
    step: int
    t: float
    batch: int
    data: float
    compute: float  # compute_s - data_s: the model's forward and backward (modelled)
    push: float
    wait: float
    pull: float
    staleness: int = 0

    @classmethod
    def from_dict(cls, r: dict) -> StepRecord | None:
        """The record as a StepRecord; None when it is no step record or lacks who/when."""
        if r.get("kind") != "step":
            return None
        try:
            worker, step, t = int(r["worker"]), int(r["step"]), float(r["t"])
        except (KeyError, TypeError, ValueError):
            return None
        data = _num(r, "data_s")
        return cls(worker, step, t, int(_num(r, "batch")), data,
                   max(0.0, _num(r, "compute_s") - data), _num(r, "push_s"), _num(r, "wait_s"),
                   _num(r, "pull_s"), int(_num(r, "staleness")))

    @property
    def work(self) -> float:
        return self.data + self.compute + self.push + self.pull

    @property
    def total(self) -> float:
        return self.work + self.wait

    @property
    def cost(self) -> float:
        """Work seconds per sample (per step when the batch is unknown)."""
        return self.work / self.batch if self.batch > 0 else self.work


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One `kind: shard` metrics line (the shard's node, per heartbeat interval)."""

    server: int
    t: float
    apply_s: float  # seconds the shard spent handling pushes (adding, applying) since the last
    applies: int  # updates applied since the last
    queue: int  # pulls held waiting for a version at the beat
    backlog: int  # the most messages one read of its sockets found waiting since the last

    @classmethod
    def from_dict(cls, r: dict) -> ShardRecord | None:
        if r.get("kind") != "shard":
            return None
        try:
            server, t = int(r["server"]), float(r["t"])
        except (KeyError, TypeError, ValueError):
            return None
        return cls(server, t, _num(r, "apply_s"), int(_num(r, "applies")),
                   int(_num(r, "queue")), int(_num(r, "backlog")))


# ---- slow workers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlowSettings:
    window: int = 16
    slow_factor: float = 1.5
    chronic_min: int = 12
    chronic_keep: int = 8
    transient_min: int = 2
    clear_after: int = 6

    def __post_init__(self):
        if not (1 <= self.clear_after <= self.window and 1 <= self.transient_min <= self.window
                and 1 <= self.chronic_keep <= self.chronic_min <= self.window):
            raise ValueError(f"inconsistent slow-worker settings {self}: need 1 <= clear_after, "
                             f"transient_min <= window and chronic_keep <= chronic_min <= window")
        if self.slow_factor <= 1.0:
            raise ValueError("slow_factor must be above 1")


@dataclass(frozen=True, slots=True)
class Flagged:
    """A worker's state changed: at step `step` (time `t`) it became `state`."""

    worker: int
    step: int
    t: float
    state: str


class SlowClassifier:
    """Which workers are slow, chronic or transient (definitions in the module docstring)."""

    def __init__(self, settings: SlowSettings | None = None):
        self.settings = settings or SlowSettings()
        self.latest: dict[int, float] = {}  # worker -> cost of its latest step
        self.flags: dict[int, deque] = {}  # worker -> slow (bool) of its last `window` steps
        self.state: dict[int, str] = {}
        self.changes: list[Flagged] = []  # every transition, in order

    def ratio(self, worker: int) -> float | None:
        """The worker's latest cost over the median of the others' (None without others)."""
        med = self._others_median(worker)
        if med is None or worker not in self.latest:
            return None
        return self.latest[worker] / med if med > 0 else None

    def _others_median(self, worker: int) -> float | None:
        others = [c for w, c in self.latest.items() if w != worker]
        return statistics.median(others) if others else None

    def observe(self, rec: StepRecord) -> str:
        """Take one step of `rec.worker`; returns the worker's state after it."""
        s, w = self.settings, rec.worker
        med = self._others_median(w)
        cost = rec.cost
        self.latest[w] = cost
        slow = med is not None and med > 0 and cost > s.slow_factor * med
        flags = self.flags.setdefault(w, deque(maxlen=s.window))
        flags.append(slow)
        before = self.state.get(w, OK)
        after = self._classify(flags, before)
        if after != before:
            self.state[w] = after
            self.changes.append(Flagged(w, rec.step, rec.t, after))
        elif w not in self.state:
            self.state[w] = after
        return after

    def _classify(self, flags: deque, before: str) -> str:
        s = self.settings
        slow = sum(flags)
        if slow >= s.chronic_min or (before == CHRONIC and slow >= s.chronic_keep):
            return CHRONIC
        recent = list(flags)[-s.clear_after:]
        if len(recent) == s.clear_after and not any(recent):
            return OK
        if before == CHRONIC:  # fell below the keep mark but still slow lately
            return TRANSIENT
        if slow >= s.transient_min and any(recent):
            return TRANSIENT
        return before if before == TRANSIENT else OK

    def forget(self, worker: int) -> None:
        """A worker left: it no longer counts among the others."""
        self.latest.pop(worker, None)


# ---- time lost waiting -------------------------------------------------------------------------

class WaitLedger:
    """Seconds the other workers lost waiting for each worker (definitions in the docstring),
    split by the classifier's state of the culprit when the wait happened."""

    def __init__(self, round_mode: bool, keep_rounds: int = 4):
        self.round_mode = round_mode
        self.keep_rounds = keep_rounds
        self.lost: dict[int, float] = {}
        self.lost_by_state: dict[int, dict[str, float]] = {}
        self._rounds: dict[int, dict[int, float]] = {}  # step -> worker -> step end (t)
        self._states: dict[int, dict[int, str]] = {}  # step -> worker -> its state then
        self._progress: dict[int, int] = {}  # arrival mode: worker -> steps done

    def add(self, rec: StepRecord, states: Mapping[int, str]) -> None:
        """Take one step; `states`: each worker's slow state now (the classifier's)."""
        if self.round_mode:
            self._rounds.setdefault(rec.step, {})[rec.worker] = rec.t
            self._states.setdefault(rec.step, {})[rec.worker] = states.get(rec.worker, OK)
            # Round k is over once a step beyond it shows up; a few are kept for late lines.
            done = [k for k in self._rounds if k < rec.step - self.keep_rounds + 1]
            for k in sorted(done):
                self._close(k)
            return
        self._progress[rec.worker] = rec.step + 1
        if rec.wait > 0:
            others = {w: n for w, n in self._progress.items() if w != rec.worker}
            if others:
                culprit = min(others, key=lambda w: (others[w], w))
                self._charge(culprit, rec.wait, states.get(culprit, OK))

    def _charge(self, worker: int, seconds: float, state: str) -> None:
        self.lost[worker] = self.lost.get(worker, 0.0) + seconds
        by = self.lost_by_state.setdefault(worker, {})
        by[state] = by.get(state, 0.0) + seconds

    def _close(self, k: int) -> None:
        ends = self._rounds.pop(k)
        states = self._states.pop(k, {})
        if len(ends) < 2:
            return
        last = max(ends, key=lambda w: (ends[w], w))
        lost = sum(ends[last] - t for w, t in ends.items() if w != last)
        if lost > 0:
            self._charge(last, lost, states.get(last, OK))

    def close_all(self) -> None:
        """A finished run: the rounds still open are over too."""
        for k in sorted(self._rounds):
            self._close(k)

    def pending(self) -> dict[int, float]:
        """The lost time `lost` plus what the rounds still open would add (for a live view)."""
        out = dict(self.lost)
        for ends in self._rounds.values():
            if len(ends) >= 2:
                last = max(ends, key=lambda w: (ends[w], w))
                out[last] = out.get(last, 0.0) + sum(ends[last] - t for t in ends.values())
        return out


# ---- the whole job -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """min / median / max of one column across workers."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        return cls(min(values), statistics.median(values), max(values)) if values else None


@dataclass(frozen=True)
class WorkerRow:
    worker: int
    step: int
    t: float  # its latest step's end
    samples_per_s: float
    batch: int
    staleness: float  # mean over the window
    phases: dict  # phase -> mean seconds per step over the window
    step_s: float  # mean step seconds (sum of phases)
    ratio: float | None  # latest cost over the others' median
    state: str
    slow_steps: int  # slow steps in the window
    lost_s: float  # seconds others lost waiting for it
    left: bool


@dataclass(frozen=True)
class ShardRow:
    server: int
    t: float
    apply_ms: float  # mean milliseconds of push handling per applied update, recent
    applies_per_s: float
    queue: int
    backlog: int


@dataclass(frozen=True)
class Snapshot:
    t: float  # the latest record's time
    steps: int
    samples: int
    round_mode: bool
    workers: list[WorkerRow]
    spreads: dict  # column -> Spread
    shards: list[ShardRow]
    changes: list[Flagged]  # the classifier's transitions, oldest first (the last 32)


@dataclass
class _Worker:
    recent: deque
    steps: int = 0
    samples: int = 0
    left: bool = False


@dataclass
class _Shard:
    recent: deque = field(default_factory=lambda: deque(maxlen=8))


class JobStats:
    """Folds metrics records into rolling statistics; `snapshot()` for a view or a report."""

    def __init__(self, round_mode: bool, settings: SlowSettings | None = None):
        self.settings = settings or SlowSettings()
        self.round_mode = round_mode
        self.classifier = SlowClassifier(self.settings)
        self.ledger = WaitLedger(round_mode)
        self.workers: dict[int, _Worker] = {}
        self.shards: dict[int, _Shard] = {}
        self.t = 0.0
        self.steps = 0
        self.samples = 0

    def add(self, record: dict) -> None:
        """Take one metrics.jsonl record (any kind; those it does not use are ignored)."""
        kind = record.get("kind")
        t = record.get("t")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            self.t = max(self.t, float(t))
        if kind == "step":
            rec = StepRecord.from_dict(record)
            if rec is not None:
                self.add_step(rec)
        elif kind == "shard":
            shard = ShardRecord.from_dict(record)
            if shard is not None:
                self.shards.setdefault(shard.server, _Shard()).recent.append(shard)
        elif kind == "left":
            try:
                w = self.workers.get(int(record.get("worker", -1)))
            except (TypeError, ValueError):
                w = None
            if w is not None:
                w.left = True
                self.classifier.forget(int(record["worker"]))

    def add_step(self, rec: StepRecord) -> None:
        w = self.workers.get(rec.worker)
        if w is None:
            w = self.workers[rec.worker] = _Worker(deque(maxlen=self.settings.window))
        w.recent.append(rec)
        w.steps += 1
        w.samples += rec.batch
        self.steps += 1
        self.samples += rec.batch
        self.classifier.observe(rec)
        self.ledger.add(rec, self.classifier.state)

    def finish(self) -> None:
        """The run is over (a replay's end, a report): open rounds are charged too."""
        self.ledger.close_all()

    def snapshot(self) -> Snapshot:
        lost = self.ledger.pending()
        rows = [self._row(k, w, lost.get(k, 0.0)) for k, w in sorted(self.workers.items())]
        live = [r for r in rows if not r.left] or rows
        spreads = {
            "samples_per_s": Spread.of([r.samples_per_s for r in live]),
            "step_s": Spread.of([r.step_s for r in live]),
            "staleness": Spread.of([r.staleness for r in live]),
            **{p: Spread.of([r.phases[p] for r in live]) for p in PHASES},
        }
        shards = [self._shard_row(k, s) for k, s in sorted(self.shards.items()) if s.recent]
        return Snapshot(self.t, self.steps, self.samples, self.round_mode, rows,
                        {k: v for k, v in spreads.items() if v is not None}, shards,
                        self.classifier.changes[-32:])

    def _row(self, k: int, w: _Worker, lost: float) -> WorkerRow:
        recent = list(w.recent)
        n = len(recent)
        phases = {p: sum(getattr(r, p) for r in recent) / n for p in PHASES}
        step_s = sum(phases.values())
        # samples/s over the window's wall time when it spans one; else from its own phases
        span = recent[-1].t - recent[0].t
        if n >= 2 and span > 0:
            rate = sum(r.batch for r in recent[1:]) / span
        else:
            rate = recent[-1].batch / step_s if step_s > 0 else 0.0
        last = recent[-1]
        flags = self.classifier.flags.get(k, ())
        return WorkerRow(k, last.step, last.t, rate, last.batch,
                         sum(r.staleness for r in recent) / n, phases, step_s,
                         self.classifier.ratio(k), self.classifier.state.get(k, OK),
                         sum(flags), lost, w.left)

    @staticmethod
    def _shard_row(k: int, s: _Shard) -> ShardRow:
        recent = list(s.recent)
        applies = sum(r.applies for r in recent)
        apply_s = sum(r.apply_s for r in recent)
        span = recent[-1].t - recent[0].t
        rate = sum(r.applies for r in recent[1:]) / span if span > 0 else 0.0
        last = recent[-1]
        return ShardRow(k, last.t, 1e3 * apply_s / applies if applies else 0.0, rate,
                        last.queue, max(r.backlog for r in recent))
