"""The sim Engine's worker step with replayed communication times (sim.trace.CommReplay)."""

from __future__ import annotations

from paramserver.sim.engine_events import APPLIED, BUSY, CLOCK, COMPUTED, SimError


class ReplayStepsMixin:
    """Part of the Engine: the READ / COMPUTED / APPLIED handlers when `comm` is given."""

    # ---- the worker's step with replayed communication ----------------------------------------
    def _read_replay(self, t: float, w: int) -> None:
        """The release reached the worker: the pull (its recorded time), then the compute."""
        self.wait_s[w] = t - self.wait_from[w]
        if self.version < self.min_version[w]:
            raise SimError(f"t={t}: worker {w} pulls version {self.version} < min_version "
                           f"{self.min_version[w]}")
        self.pulled[w] = self.version
        if self.trainer is not None:
            self.trainer.pull(w, self.version)
        step, batch, comm = self.step[w], self.batch[w], self.comm
        self.pull_s[w] = p = comm.pull(w, step)
        got = t + p
        f = 1.0 if self.straggler is None else self.straggler.factor(w, step, got)
        self.factor[w] = f
        self.compute_s[w] = c = self.cost(w, step, batch) * f
        self.status[w] = BUSY
        busy = c + comm.overhead(w, step)
        self._at(got + (busy if busy > 0 else 0.0), COMPUTED, w)

    def _computed_replay(self, t: float, w: int) -> None:
        self.push_from[w] = t
        self._at(t + self.comm.push(w, self.step[w]), APPLIED, w)

    def _applied_replay(self, t: float, w: int) -> None:
        """Pushed and acknowledged; the clock takes comm.clock_latency to the coordinator."""
        v = self.version
        self.stale[w] = v - self.pulled[w] if v > self.pulled[w] else 0
        if self.trainer is not None:
            self.trainer.push(w, self)
        if not self.round_mode:
            self.version = v + 1
        self.push_s[w] = t - self.push_from[w]
        self.wait_from[w] = t
        lat = self.comm.clock_latency
        if lat:
            self._at(t + lat, CLOCK, w)
        else:
            self._clock(t, w)
