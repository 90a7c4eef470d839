"""Asynchronous Parallel: every push is applied on arrival and its worker goes on at once."""

from __future__ import annotations

from paramserver.policies.base import Decision, Joined, Left, Pushed, Release, SyncPolicy


class ASP(SyncPolicy):
    """No waiting at all: maximal throughput, unbounded staleness."""

    name = "asp"
    apply_mode = "arrival"

    def on_joined(self, event: Joined) -> list[Decision]:
        return [Release(event.worker, 0, self.batch_size)]

    def on_left(self, event: Left) -> list[Decision]:
        return []

    def on_pushed(self, event: Pushed) -> list[Decision]:
        return [Release(event.worker, event.step + 1, self.batch_size)]
