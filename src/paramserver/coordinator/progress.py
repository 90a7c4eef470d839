"""The job's course: the start barrier, the sample/time budget, and when the job is over."""

from __future__ import annotations

from collections import Counter

from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.coordinator.membership import Member, Roster
from paramserver.core.leaving import FINISHED

# With every worker gone, how long a checkpoint being written may hold the end of the job.
CHECKPOINT_GRACE = 60.0
# While the start barrier is shut, how often the coordinator says whom it waits for.
WAIT_NOTE_EVERY = 5.0


def _ranks(members) -> str:
    return ", ".join(str(m.rank) for m in sorted(members, key=lambda m: m.rank)) or "none"


def waiting_for(roster: Roster, workers: int, servers: int, pending_workers: int,
                evaluator: bool) -> str:
    """Whom the start barrier waits for, by rank: a user whose job hangs at its start reads
    which peers never came (and which came but never called start())."""
    started = [m for m in roster.workers.values() if m.started]
    up = {m.rank for m in roster.servers.values()}
    missing = [r for r in range(servers) if r not in up]  # a primary that never came, say
    idle = [m for m in roster.workers.values() if not m.started]
    parts = [f"{len(started)} of {workers} workers started (ranks {_ranks(started)})",
             f"registered, not started: {_ranks(idle)}" if idle else
             f"not registered: {max(0, workers - len(roster.workers) - pending_workers)}",
             f"servers: {len(roster.servers)}/{servers} registered"
             + (f" (not yet: shards {', '.join(map(str, missing))})" if missing else "")]
    if pending_workers:
        parts.append(f"{pending_workers} worker(s) wait for the servers")
    if evaluator and not any(m.started for m in roster.observers.values()):
        parts.append("the evaluator has not started")
    return "; ".join(parts)


class StartBarrier:
    """Training starts when every expected worker (and the evaluator, if any) is ready, or,
    past `start_timeout`, with the workers that are; with none by then the job fails."""

    def __init__(self, workers: int, evaluator: bool, start_timeout: float,
                 elapsed_before: float = 0.0):
        self.workers_expected = workers
        self.evaluator = evaluator
        self.start_timeout = start_timeout
        self.elapsed_before = elapsed_before  # a resumed job's clock goes on from there
        self.open = False
        self.t_start: float | None = None  # when it opened, less elapsed_before: metrics' t = 0
        self.lost_before_start = 0  # workers that died before training began: not waited for
        self.noted_at = 0.0  # when it last said whom it waits for

    def check(self, now: float, roster: Roster) -> tuple[str | None, list[Member], str | None]:
        """(failure, the started workers in rank order if it opens now, a warning)."""
        started = [m for m in roster.workers.values() if m.started]
        late = now > self.start_timeout
        if late and not started:
            waiting = ", ".join(f"rank {m.rank} ({s})" for s, m in roster.workers.items())
            return (f"no worker started within {self.start_timeout:.0f} s; expected "
                    f"{self.workers_expected}, registered: {waiting or 'none'}"), [], None
        expected = self.workers_expected - self.lost_before_start
        # The evaluator must be ready too, or the first seconds of training go unmeasured.
        evaluator_ready = not self.evaluator or any(m.started for m in roster.observers.values())
        if not ((len(started) >= expected and evaluator_ready) or late):
            return None, [], None
        warning = None
        if late and len(started) < expected:
            warning = (f"only {len(started)} of {expected} workers started within "
                       f"{self.start_timeout:.0f} s; going on with them")
        self.open = True
        self.t_start = now - self.elapsed_before
        started.sort(key=lambda m: m.rank)
        return None, started, warning

    def reopen(self, now: float) -> None:
        """Open at once: a restarted coordinator took back a job that was training."""
        self.open, self.t_start = True, now - self.elapsed_before

    def next_deadline(self) -> float | None:
        return None if self.open else min(self.start_timeout, self.noted_at + WAIT_NOTE_EVERY)

    def note_due(self, now: float) -> bool:
        """True every WAIT_NOTE_EVERY s while shut (then the caller says whom it waits for)."""
        if self.open or now < self.noted_at + WAIT_NOTE_EVERY:
            return False
        self.noted_at = now
        return True


class Budget:
    """The time budget, and the end of the budget announced once. The sample budget is the
    PolicyHost's (it flips `stopping` before the policy hears of the last step); a resumed job
    whose samples are spent, or time that runs out, is found here."""

    def __init__(self, max_seconds: float | None):
        self.max_seconds = max_seconds
        self.closed = False  # budget_reached was recorded, or the job failed
        self.worker_samples: dict[int, int] = {}  # a resumed worker skips what its rank did

    def count(self, rank: int, batch: int) -> None:
        self.worker_samples[rank] = self.worker_samples.get(rank, 0) + batch

    def reached(self, now: float, t_start: float | None, stopping: bool) -> bool:
        """True once, when the budget is first found spent (only after the start)."""
        if self.closed or t_start is None:
            return False
        if stopping or (self.max_seconds and now - t_start >= self.max_seconds):
            self.closed = True
            return True
        return False

    def next_deadline(self, t_start: float | None) -> float | None:
        if self.closed or t_start is None or not self.max_seconds:
            return None
        return t_start + self.max_seconds


class EndOfJob:
    """With every worker gone: a last checkpoint (it holds the final parameters), then the
    observers' last look within a grace period, then the end: finished once a worker left
    having finished (its bye said "done": the budget spent or its script done), else lost,
    for a job whose every worker died or was preempted did not finish, and an orchestrator
    should run it again (from that checkpoint), not count it done."""

    CHECKPOINT, FINISH, LOST = "checkpoint", "finish", "lost"

    def __init__(self, observer_grace: float):
        self.observer_grace = observer_grace
        self.workers_done_at: float | None = None
        self.final_checkpoint = False

    def check(self, now: float, barrier_open: bool, roster: Roster,
              schedule: CheckpointSchedule) -> str | None:
        if not barrier_open or roster.workers:
            return None
        if self.workers_done_at is None:
            self.workers_done_at = now
        if schedule.enabled and not self.final_checkpoint:
            if schedule.pending_tag is None:
                self.final_checkpoint = True
                return self.CHECKPOINT
            return None
        done_for = now - self.workers_done_at
        if schedule.pending_tag is not None and done_for < CHECKPOINT_GRACE:
            return None
        if not roster.observers or done_for > self.observer_grace:
            return self.FINISH if FINISHED in roster.gone.values() else self.LOST
        return None

    @staticmethod
    def lost(roster: Roster) -> str:
        """Why a LOST job failed, naming how its workers left."""
        reasons = Counter(roster.gone.values())
        return ("every worker left the job and none finished it (" + ", ".join(
            f"{n} {why}" for why, n in sorted(reasons.items())) + ")")

    def next_deadline(self, roster: Roster, schedule: CheckpointSchedule) -> float | None:
        """When waiting may end the job; None while only an event can (a worker leaving, the
        final checkpoint's confirmations)."""
        if self.workers_done_at is None or roster.workers or (
                schedule.enabled and not self.final_checkpoint):
            return None
        due = self.workers_done_at
        if schedule.pending_tag is not None:
            due += CHECKPOINT_GRACE
        if roster.observers:
            due = max(due, self.workers_done_at + self.observer_grace)
        return due
