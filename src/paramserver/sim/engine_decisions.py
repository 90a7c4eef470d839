"""The sim Engine's side of the policy: events in, releases / rounds / notes out."""

from __future__ import annotations

from paramserver.policies.base import ApplyRound, Note, Release
from paramserver.sim.engine_events import (
    DELIVER, LEAVE, READ, RELEASED, TICK, WAITING, SimError,
)


class EngineDecisionsMixin:
    """Part of the Engine: shares its state (policy, queue, statuses, version, sink)."""

    # ---- decisions ------------------------------------------------------------------------------
    def _handle(self, event) -> None:
        for d in self.policy.handle(event):
            kind = type(d)
            if kind is Release:
                self._release(d)
            elif kind is ApplyRound:
                self._apply_round(d)
            elif kind is Note:
                self.sink.event(self.now, d.kind, d.data)
            else:
                raise SimError(f"unknown decision {d!r}")
        deadline = self.policy.next_deadline()
        if deadline is not None and (self.tick_at is None or deadline < self.tick_at):
            self.tick_at = max(deadline, self.now)
            self._at(self.tick_at, TICK, -1)

    def _release(self, d: Release) -> None:
        w = d.worker
        if not 0 <= w < self.n or self.status[w] != WAITING:
            state = "unknown" if not 0 <= w < self.n else ("waiting", "released", "busy",
                                                           "gone")[self.status[w]]
            raise SimError(f"t={self.now}: release {d} for a worker that is {state}")
        if d.step != self.done[w] or d.batch_size < 1 or not d.scale > 0:
            raise SimError(f"t={self.now}: bad release {d}: worker {w} has done "
                           f"{self.done[w]} steps")
        self.status[w] = RELEASED
        self.step[w], self.batch[w], self.scale[w] = d.step, d.batch_size, d.scale
        self.min_version[w] = self.version if self.round_mode else 0
        nb = d.not_before
        if nb is not None and nb > self.now:
            self._at(nb, DELIVER, w)  # held by the coordinator until not_before
        else:
            self._deliver(self.now, w)

    def _deliver(self, t: float, w: int) -> None:
        """The release leaves the coordinator; it says stop past the budget or the last step."""
        if self.stopping or self.done[w] >= self.steps:
            self._at(t + self.to_leave, LEAVE, w)  # the release says stop; the bye goes back
        else:
            self._at(t + self.to_read, READ, w)

    def _apply_round(self, d: ApplyRound) -> None:
        if not self.round_mode:
            raise SimError(f"ApplyRound from the arrival-mode policy {self.policy.name}: {d}")
        self.version += 1
        self.rounds += 1
        if self.trainer is not None:
            self.trainer.apply_round(d.step, self)
        self.sink.event(self.now, "apply_round", {"step": d.step,
                                                  "contributors": list(d.contributors)})
