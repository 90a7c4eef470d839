"""Dynamic SSP: SSP whose bound a fast worker may exceed by r* extra steps, r* in [0, r_max]."""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.core.options import check_int, opt
from paramserver.policies.base import Decision, Joined, Left, Pushed, Release
from paramserver.policies.ssp import SSP


@dataclass(frozen=True)
class DSSPOptions:
    staleness: int = opt(3, "s: the bound every worker may always run ahead of the slowest")
    r_max: int = opt(4, "most extra steps beyond s a fast worker may be granted")

    def __post_init__(self):
        check_int("staleness", self.staleness, 0)
        check_int("r_max", self.r_max, 0)


class DSSP(SSP):
    """DSSP(s, r_max): when a worker reaches the SSP bound s, it may go on for r* more steps.

    r* is chosen once per position of the slowest clock, from predicted push times (a step
    lasts what the worker's last one took from release to push): the slowest workers (those
    at the lowest clock) will let the window move at t_slow = the latest of their next
    predicted pushes; the fast worker, run r more steps, would push at now + r * its step
    time; r* in [0, r_max] puts that closest to t_slow (ties to fewer steps), so it waits
    least without drifting further than needed. Workers with no completed step yet give
    r* = 0 (plain SSP). So a release for step c still promises that every worker completed
    step c - s - r_max - 1. Finding the slowest costs O(N) once per window move (t_slow is
    then kept for that window); the clock table stays a window of s + r_max + 2 counters.
    """

    name = "dssp"
    Options = DSSPOptions
    advise_options = ((("staleness", 1),), (("staleness", 3),))  # (paired with dynsgd, as SSP)

    def __init__(self, batch_size: int, *, staleness: int = 3, r_max: int = 4):
        options = DSSPOptions(staleness, r_max)
        self.r_max = options.r_max  # read by max_ahead() while SSP sizes its window
        super().__init__(batch_size, staleness=staleness)
        self.options = options
        self.released_at: dict[int, float] = {}
        self.step_time: dict[int, float] = {}  # release -> push: a step without the waiting
        self.grant: dict[int, tuple[int, int]] = {}  # worker -> (low when granted, r*)
        self.slow_eta: tuple[int, float | None] = (-1, None)  # (low, t_slow) for that low

    def max_ahead(self) -> int:
        return self.s + self.r_max

    def may_run(self, worker: int, clock: int, now: float) -> bool:
        ahead = clock - self.window.low
        if ahead <= self.s:
            return True
        if ahead > self.s + self.r_max:
            return False
        low, extra = self.grant.get(worker, (None, 0))
        if low != self.window.low:
            extra = self._extra(worker, now)
            self.grant[worker] = (self.window.low, extra)
        return ahead <= self.s + extra

    def _t_slow(self) -> float | None:
        """When the slowest should all have pushed: found in O(N), once per window move."""
        if self.slow_eta[0] != self.window.low:
            slowest = [j for j, c in self.clock.items() if c == self.window.low]
            eta = None
            if all(j in self.step_time for j in slowest):
                eta = max(self.released_at[j] + self.step_time[j] for j in slowest)
            self.slow_eta = (self.window.low, eta)
        return self.slow_eta[1]

    def _extra(self, worker: int, now: float) -> int:
        t_slow = self._t_slow()
        if worker not in self.step_time or t_slow is None:
            return 0
        step = self.step_time[worker]
        return min(range(self.r_max + 1), key=lambda r: (abs(now + r * step - t_slow), r))

    def on_joined(self, event: Joined) -> list[Decision]:
        return self._stamp(super().on_joined(event), event.now)

    def on_left(self, event: Left) -> list[Decision]:
        for table in (self.released_at, self.step_time, self.grant):
            table.pop(event.worker, None)
        return self._stamp(super().on_left(event), event.now)

    def on_pushed(self, event: Pushed) -> list[Decision]:
        w = event.worker
        if w in self.released_at:
            self.step_time[w] = event.now - self.released_at[w]
        # Tentatively: if w is the slowest it goes on at once, and the grants decided while
        # handling this push must see that; if it is held instead, its release restamps it.
        self.released_at[w] = event.now
        return self._stamp(super().on_pushed(event), event.now)

    def _stamp(self, out: list[Decision], now: float) -> list[Decision]:
        for d in out:
            if isinstance(d, Release):
                self.released_at[d.worker] = now
        return out
