"""Asynchronous Parallel: every push is applied on arrival and its worker goes on at once."""

from __future__ import annotations

from paramserver.policies.base import (
    Decision, Joined, Left, PolicyError, Pushed, Release, SyncPolicy,
)


class ASP(SyncPolicy):
    """No waiting at all: maximal throughput, unbounded staleness."""

    name = "asp"
    apply_mode = "arrival"

    def __init__(self, batch_size: int):
        super().__init__(batch_size)
        self.released: dict[int, int] = {}  # worker -> the step it may push next

    def on_joined(self, event: Joined) -> list[Decision]:
        self.released[event.worker] = 0
        return [Release(event.worker, 0, self.batch_size)]

    def on_left(self, event: Left) -> list[Decision]:
        self.released.pop(event.worker, None)
        return []

    def on_pushed(self, event: Pushed) -> list[Decision]:
        if self.released.get(event.worker) != event.step:
            raise PolicyError(f"worker {event.worker} pushed step {event.step}, released "
                              f"{self.released.get(event.worker)}")
        self.released[event.worker] = event.step + 1
        return [Release(event.worker, event.step + 1, self.batch_size)]
