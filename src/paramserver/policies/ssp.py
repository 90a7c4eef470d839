"""Stale Synchronous Parallel: a worker may run at most `staleness` steps ahead of the slowest."""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.core.options import Configurable, check_int, opt
from paramserver.policies.base import (
    Decision, Joined, Left, PolicyError, Pushed, Release, SyncPolicy,
)


@dataclass(frozen=True)
class SSPOptions:
    staleness: int = opt(3, "steps a worker may run ahead of the slowest (0 = lockstep, like BSP)")

    def __post_init__(self):
        check_int("staleness", self.staleness, 0)


class ClockWindow:
    """How many active workers sit at each clock value, for clocks in [low, low + size).

    A worker's clock is the number of steps it has completed. Under SSP(s) no clock exceeds
    low + s + 1, so a ring of s + 2 counters is the whole clock table: O(1) per push and
    O(s) space whatever the number of workers (the seed's sliding window of valid steps).
    """

    def __init__(self, size: int, low: int = 0):
        self.size = size
        self.low = low
        self.counts = [0] * size
        self.total = 0

    def add(self, clock: int, delta: int) -> None:
        if not self.low <= clock < self.low + self.size:
            raise PolicyError(f"clock {clock} outside the window [{self.low}, "
                              f"{self.low + self.size})")
        self.counts[clock % self.size] += delta
        self.total += delta

    def advance(self) -> int:
        """Slide `low` up to the slowest worker's clock; return how far it moved."""
        moved = 0
        # The loop ends within `size` turns whenever some worker is counted.
        while self.total and self.counts[self.low % self.size] == 0:
            self.low += 1
            moved += 1
        return moved


class SSP(SyncPolicy, Configurable):
    """SSP(s): released for step c only if c - min_j c_j <= s (c_j = steps worker j completed).

    So a worker at step c reads every update of steps <= c - s - 1 (plus its own writes);
    s = 0 is lockstep. A newcomer starts at the slowest clock, so it never drags the window
    back; a worker that leaves stops counting, which may release those waiting on it.
    """

    name = "ssp"
    apply_mode = "arrival"
    Options = SSPOptions
    bounded = True
    # Under a persistent straggler SSP's bound releases the waiting workers together; they
    # compute from one server version and arrival mode applies each gradient at the full lr,
    # the straggler's a round stale: N full steps per round where BSP takes one averaged step,
    # which diverged or fell to chance in most seeds at lr 0.3 (compare's notes). dynsgd
    # applies the k-th push of such a round at lr / (k + 1); a fresh push is plain sgd.
    paired_rule = "dynsgd"
    advise_options = ((("staleness", 1),), (("staleness", 3),), (("staleness", 8),))

    def __init__(self, batch_size: int, *, staleness: int = 3):
        super().__init__(batch_size)
        self.options = SSPOptions(staleness=staleness)
        self.s = staleness
        self.window = ClockWindow(self.max_ahead() + 2)
        self.clock: dict[int, int] = {}  # each member's own position (the coordinator has it too)
        self.blocked: set[int] = set()

    def max_ahead(self) -> int:
        """The most steps any worker may ever be ahead of the slowest (sizes the window)."""
        return self.s

    def may_run(self, worker: int, clock: int, now: float) -> bool:
        """May `worker`, having completed `clock` steps, start its next one? (DSSP overrides.)"""
        return clock - self.window.low <= self.s

    def on_joined(self, event: Joined) -> list[Decision]:
        start = self.window.low
        self.clock[event.worker] = start
        self.window.add(start, 1)
        return [Release(event.worker, start, self.batch_size)]

    def on_left(self, event: Left) -> list[Decision]:
        self.window.add(self.clock.pop(event.worker), -1)
        self.blocked.discard(event.worker)
        return self._unblock(self.window.advance(), event.now)

    def on_pushed(self, event: Pushed) -> list[Decision]:
        w, c = event.worker, self.clock[event.worker]
        if event.step != c or w in self.blocked:
            raise PolicyError(f"worker {w} pushed step {event.step} but is at step {c}"
                              + (" (and waiting)" if w in self.blocked else ""))
        self.window.add(c, -1)
        self.window.add(c + 1, 1)
        self.clock[w] = c + 1
        out = self._unblock(self.window.advance(), event.now)
        if self.may_run(w, c + 1, event.now):
            out.append(Release(w, c + 1, self.batch_size))
        else:
            self.blocked.add(w)
        return out

    def _unblock(self, moved: int, now: float) -> list[Decision]:
        # Only a move of the slowest can change anyone's answer. Under plain SSP the blocked
        # all wait at clock low + s + 1 (old low), so any move frees every one of them.
        if not moved or not self.blocked:
            return []
        freed = [w for w in sorted(self.blocked) if self.may_run(w, self.clock[w], now)]
        self.blocked.difference_update(freed)
        return [Release(w, self.clock[w], self.batch_size) for w in freed]
