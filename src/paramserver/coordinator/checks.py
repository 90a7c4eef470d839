"""Coordinator checks run every loop turn: the start barrier, the sample/time budget, the end."""

from __future__ import annotations

import logging
import time

from paramserver.policies import Joined

# The coordinator's own logger: these messages read as they did before this split.
log = logging.getLogger("paramserver.coordinator.node")


class ChecksMixin:
    """Part of the Coordinator: shares its state (job, roster, policy, keeper, counters)."""

    def _check_start_barrier(self) -> None:
        if self.barrier_open:
            return
        started = [m for m in self.roster.workers.values() if m.started]
        expected = self.job["workers"] - self.lost_before_start
        # The evaluator must be ready too, or the first seconds of training go unmeasured.
        evaluator_ready = not self.job.get("eval_interval") or any(
            m.started for m in self.roster.observers.values())
        late = self.now() > self.start_timeout and started
        if self.now() > self.start_timeout and not started:
            waiting = ", ".join(f"rank {m.rank} ({s})" for s, m in self.roster.workers.items())
            self._fail(f"no worker started within {self.start_timeout:.0f} s; expected "
                       f"{self.job['workers']}, registered: {waiting or 'none'}")
            return
        if (len(started) >= expected and evaluator_ready) or late:
            if late and len(started) < expected:
                log.warning("only %d of %d workers started within %.0f s; going on with them",
                            len(started), expected, self.start_timeout)
            self.barrier_open = True
            # A resumed job's clock goes on from where the checkpoint left it.
            self.t_start = time.monotonic() - self.elapsed_before
            self.record("barrier_open", workers=len(started))
            # All join before any release goes out: each release then tells the full round size.
            self._apply([d for m in sorted(started, key=lambda m: m.rank)
                         for d in self.policy.handle(Joined(m.rank, self.now()))])
            if self.job.get("restart_servers") and not self.job.get("resume"):
                # A server that dies before the first scheduled checkpoint restarts from this.
                self._maybe_checkpoint(final=True)

    def _check_budget(self) -> None:
        """Past the sample or time budget, every release tells its worker to stop."""
        if self.stopping or self.t_start is None:
            return
        max_samples, max_seconds = self.job.get("max_samples"), self.job.get("max_seconds")
        if (max_samples and self.samples_done >= max_samples) or (
                max_seconds and time.monotonic() - self.t_start >= max_seconds):
            self.stopping = True
            self.record("budget_reached", samples=self.samples_done)

    def _check_finished(self) -> None:
        if not self.barrier_open or self.roster.workers:
            return
        if self.workers_done_at is None:
            self.workers_done_at = time.monotonic()
        if self.keeper.enabled and not self.final_checkpoint:
            # The last checkpoint holds the final parameters: a resumed job starts from them.
            if self.keeper.pending_tag is None:
                self._maybe_checkpoint(final=True)
                self.final_checkpoint = True
            return
        if self.keeper.pending_tag is not None and time.monotonic() - self.workers_done_at < 60:
            return
        # Observers get a last look at the final parameters, within a bounded grace period.
        grace = float(self.job.get("observer_grace", 30.0))
        if not self.roster.observers or time.monotonic() - self.workers_done_at > grace:
            self.finished = True
