"""Bulk Synchronous Parallel: every active worker pushes step k, the round is applied, all go on."""

from __future__ import annotations

from paramserver.policies.base import (
    ApplyRound, Decision, Joined, Left, PolicyError, Pushed, Release, SyncPolicy,
)


class BSP(SyncPolicy):
    """Rounds: servers aggregate the pushes of round k and apply them once all active workers are in."""

    name = "bsp"
    apply_mode = "round"

    def __init__(self, batch_size: int):
        super().__init__(batch_size)
        self.round = 0
        self.done: set[int] = set()
        # Late joiners (an elastic job's): active, released only when the round in progress,
        # sized without them, closes; the round never waits for them.
        self.joining: set[int] = set()
        self.gone_pushed: set[int] = set()  # pushed this round, then left

    def batch_for(self, worker: int) -> int:
        """Batch size of `worker` in the next round; LB-BSP overrides this. (Under an elastic
        job's batch rule the PolicyHost sets each release's batch.)"""
        return self.batch_size

    def on_joined(self, event: Joined) -> list[Decision]:
        if event.late and len(self.active - self.joining) > 1:
            # The releases of the round in progress told the servers its size without this
            # worker: it starts with the next round (its push would come after the round was
            # applied and be dropped).
            self.joining.add(event.worker)
            return []
        # A newcomer joins the round in progress; the round now also waits for it.
        return [Release(event.worker, self.round, self.batch_for(event.worker))]

    def on_left(self, event: Left) -> list[Decision]:
        if event.worker in self.done:
            # Its push is in the servers' sum: the round's contributors still name it (its
            # rank may come back this round as a new worker, so it leaves `done`).
            self.done.discard(event.worker)
            self.gone_pushed.add(event.worker)
        self.joining.discard(event.worker)
        if self.joining and self.active == self.joining:
            # Nobody is left in the round in progress: the late joiners start it.
            self.joining = set()
            return [Release(w, self.round, self.batch_for(w)) for w in sorted(self.active)]
        return self._maybe_close_round()

    def on_pushed(self, event: Pushed) -> list[Decision]:
        if event.step != self.round:
            raise PolicyError(
                f"worker {event.worker} pushed step {event.step} during round {self.round}")
        if event.worker in self.done:
            raise PolicyError(f"worker {event.worker} pushed round {self.round} twice")
        self.done.add(event.worker)
        self.observe(event)
        return self._maybe_close_round()

    def round_size(self) -> int:
        # The round closes when every active worker pushed (late joiners wait for the next).
        return len(self.active) - len(self.joining)

    def observe(self, event: Pushed) -> None:
        """Hook for subclasses that learn from each push (LB-BSP's speed predictors)."""

    def _maybe_close_round(self) -> list[Decision]:
        joining = self.joining
        if not self.done or not (self.active <= self.done if not joining
                                 else self.active - joining <= self.done):
            return []
        decisions: list[Decision] = [ApplyRound(self.round,
                                                tuple(sorted(self.done | self.gone_pushed)))]
        self.round += 1
        self.done, self.gone_pushed = set(), set()
        self.joining = set()
        self.before_release()
        decisions += [Release(w, self.round, self.batch_for(w)) for w in sorted(self.active)]
        return decisions

    def resume_state(self) -> dict:
        return {"round": self.round}

    def resume(self, state: dict) -> None:
        self.round = int(state.get("round", 0))

    def before_release(self) -> None:
        """Hook run once per round before the releases are issued."""
