"""An elastic job's part of the coordinator (`--workers MIN:MAX`): the wait while fewer than
MIN workers are training, and the sample ledger that keeps each epoch exactly-once.

Joins and leaves themselves go through Membership (ranks: the lowest free; more than MAX
refused) and the PolicyHost (the policy's Joined/Left, the batch rule); this object owns what
is new: while fewer than MIN are left every release is held here (the job waits, saying so in
events.jsonl and on the console) and goes out once enough are back; a job left below MIN for
`wait_limit` seconds fails naming why. Pure, like the rest of the core.
"""

from __future__ import annotations

from paramserver.coordinator.events import AppendEvent, Warn
from paramserver.coordinator.ledger import SampleLedger
from paramserver.policies import Release


class Elastic:
    """The wait below MIN and the ledger (made once the first worker says the training set's
    size; every worker must say the same)."""

    def __init__(self, min_workers: int, max_workers: int, wait_limit: float):
        self.min_workers, self.max_workers = min_workers, max_workers
        self.wait_limit = wait_limit
        self.ledger: SampleLedger | None = None
        self.paused_since: float | None = None
        self._held: list[Release] = []

    def resume_state(self) -> dict:
        """What a checkpoint keeps: the ledger (none before any worker started)."""
        return {} if self.ledger is None else {"ledger": self.ledger.to_state()}

    def resume(self, state: dict) -> None:
        if state.get("ledger"):
            self.ledger = SampleLedger.from_state(state["ledger"])

    @property
    def paused(self) -> bool:
        return self.paused_since is not None

    # ---- the training set -----------------------------------------------------------------------
    def check_data(self, data_len: int | None) -> None:
        """A worker's registration: its training set's size makes (or must match) the
        ledger's."""
        if data_len is None:
            raise ValueError("an elastic job's worker must say its training set's size with "
                             "its start (data_len; a script: DistributedOptimizer(model, "
                             "data_len=len(dataset))), so that each epoch is drawn once")
        if self.ledger is None:
            self.ledger = SampleLedger(int(data_len))
        elif data_len != self.ledger.size:
            raise ValueError(f"this worker's training set has {data_len} samples, the job's "
                             f"{self.ledger.size}: every worker must load the same data")

    def lend(self, worker: int, n: int, step: int | None = None) -> list | None:
        """The positions of `worker`'s release of `n` samples for `step`, in wire form."""
        if self.ledger is None:
            return None
        return [p.to_wire() for p in self.ledger.lend(worker, n, step)]

    def clocked(self, worker: int, now: float, out: list, step: int | None = None) -> None:
        """`worker`'s clock of `step` came: the samples lent for that step are seen."""
        if self.ledger is None:
            return
        for epoch in self.ledger.consume(worker, step):
            out.append(AppendEvent(now, "epoch_samples", {
                "epoch": epoch, "samples": self.ledger.consumed(epoch),
                "data_len": self.ledger.size}))

    def left(self, worker: int) -> int:
        """A worker left: its unconsumed positions go back; returns how many."""
        self._held = [d for d in self._held if d.worker != worker]
        return 0 if self.ledger is None else self.ledger.give_back(worker)

    # ---- the wait below MIN ---------------------------------------------------------------------
    def below_min(self, started: int, now: float, out: list) -> bool:
        """After a leave: with fewer than MIN training, the job waits (True if it starts to)."""
        if started >= self.min_workers or self.paused:
            return False
        self.paused_since = now
        out.append(AppendEvent(now, "waiting_for_workers", {
            "workers": started, "min_workers": self.min_workers}))
        out.append(Warn(f"elastic job: {started} worker(s) left, fewer than the minimum "
                        f"{self.min_workers}; training waits up to {self.wait_limit:.0f} s for "
                        f"workers to join (PARAMSERVER_KEYS=RUN/keys paramserver worker --join "
                        f"ADDR, the address in RUN/coordinator.addr)"))
        return True

    def hold(self, release: Release) -> None:
        self._held.append(release)

    def enough(self, started: int, now: float, out: list) -> list[Release]:
        """After a join: at MIN again, the wait ends; returns the releases held meanwhile."""
        if not self.paused or started < self.min_workers:
            return []
        out.append(AppendEvent(now, "workers_back", {
            "workers": started, "waited_s": round(now - self.paused_since, 3)}))
        self.paused_since = None
        held, self._held = self._held, []
        return held

    def check(self, now: float, out: list) -> str | None:
        """The job's failure if it has waited below MIN for too long."""
        if self.paused and now - self.paused_since > self.wait_limit:
            return (f"elastic job: fewer than {self.min_workers} workers for "
                    f"{now - self.paused_since:.0f} s (the limit is start_timeout, "
                    f"{self.wait_limit:.0f} s)")
        return None

    def next_deadline(self) -> float | None:
        return None if not self.paused else self.paused_since + self.wait_limit
