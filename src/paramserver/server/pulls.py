"""Pulls that wait for a version: kept until the shard reaches it or their deadline passes."""

from __future__ import annotations

from paramserver.server.events import Pull


class PendingPulls:
    """Waiting pulls, each with the time (event time) at which it gives up."""

    def __init__(self):
        self._waiting: list[tuple[float, Pull]] = []
        self.next_deadline = float("inf")

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, pull: Pull, deadline: float) -> bool:
        """Keep `pull` until `deadline`. A retry of a pull already waiting (an equal reply
        token) needs no second place: False, and the first one keeps its deadline."""
        if any(p.to == pull.to for _, p in self._waiting):
            return False
        self._waiting.append((deadline, pull))
        self.next_deadline = min(self.next_deadline, deadline)
        return True

    def reached(self, version: int) -> list[Pull]:
        """Remove and return, in arrival order, the pulls that `version` satisfies."""
        if not self._waiting:
            return []
        ready = [p for _, p in self._waiting if p.min_version <= version]
        if ready:
            self._keep([w for w in self._waiting if w[1].min_version > version])
        return ready

    def expire(self, now: float) -> list[Pull]:
        """Remove and return the pulls whose deadline is `now` or earlier."""
        if now < self.next_deadline:
            return []
        expired = [p for d, p in self._waiting if d <= now]
        self._keep([w for w in self._waiting if w[0] > now])
        return expired

    def _keep(self, waiting: list) -> None:
        self._waiting = waiting
        self.next_deadline = min((d for d, _ in waiting), default=float("inf"))
