"""SwitchController: when the auto policy changes the policy in force, and to which.

Every `interval` seconds of event time (sooner while the workers' windows fill: as soon as the
slowest can have filled its own) it forecasts each candidate from the workers' recent
pace (policies/forecast.py) and proposes the one that reaches the target soonest, when

- its predicted progress beats the policy in force by more than `margin` (hysteresis: two
  candidates within the margin of each other never trade places back and forth; wider while
  the workers have fewer steps on record than a full window),
- of the candidates that do and come within the margin of the best forecast, it runs at the
  least staleness (a tie in the forecast is no reason to take on more staleness, whose price
  the forecast's curve understates for an unbounded one), and
- the time it saves over `horizon` seconds beats what the switch costs: the drain, in which
  the workers that finish first wait for the slowest one's step in flight.

After a proposal nothing is proposed again for `interval` seconds from when the new policy took
over, so a policy holds at least that long; a switch back to the policy in force before doubles
that hold (the forecasts of two candidates close to each other, swapped by noise, do not make
the job flap), and a decision that keeps a policy in force for twice its hold halves it again. Pure: the time comes
in with each call.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import sqrt

from paramserver.policies.forecast import Outlook, SamplesCurve, outlook
from paramserver.policies.pace import Pace


@dataclass(frozen=True)
class Proposal:
    """Switch to `to`: `gain` is its predicted progress over the policy in force's, less 1."""

    to: str
    gain: float
    reason: str
    outlooks: dict[str, Outlook]


class SwitchController:
    def __init__(self, candidates: tuple[str, ...], interval: float, margin: float,
                 horizon: float, curve: SamplesCurve, least: int = 1, full: int = 1):
        """`least`: steps on record each worker needs before a forecast counts it; `full`:
        the steps of a full window, at which the margin is as given (on fewer steps it is
        wider by sqrt(full / steps): a forecast's noise falls as the root of its samples)."""
        self.candidates = candidates
        self.interval = interval
        self.margin = margin
        self.horizon = horizon
        self.curve = curve
        self.least = least
        self.full = max(full, least)
        self.next_at = 0.0  # the first look: as soon as every worker has steps on record
        self.hold = interval  # the least time a policy holds (longer after back-and-forth)
        self._before: str | None = None  # the policy in force before the one in force now
        self._since = 0.0  # when the policy in force took over
        self.decisions = 0  # forecasts made (each over every candidate)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def took_over(self, now: float, was: str, to: str) -> None:
        """`to` is in force from `now`, after `was`. It holds at least `interval`, twice as long
        for each switch in a row that went back to the policy before (a forecast that
        flips between two candidates on noise settles), down again once a policy has held
        twice as long."""
        if to == self._before:
            self.hold = min(self.hold * 2, self.interval * 64)
        self._before = was
        self._since = now
        self.next_at = now + self.hold

    def decide(self, now: float, current: str, paces: dict[int, Pace | None],
               batch: int) -> Proposal | None:
        """A proposal, or None (not due, a worker without a step on record, nothing better)."""
        if now < self.next_at:
            return None
        known = [p for p in paces.values() if p is not None and len(p.steps) >= self.least]
        if not known or len(known) < len(paces):
            return None  # a newcomer's pace is not known well enough yet: look again later
        seen = min(len(p.steps) for p in known)
        slowest = max(p.mean for p in known)
        # While the windows fill, the next look comes as the slowest worker fills its window
        # (sooner than `interval` on fast steps): a forecast on thin evidence faces a wider
        # margin, and waiting a whole interval to see it again leaves the job in the first
        # candidate for that long.
        fill = (self.full - seen) * slowest
        self.next_at = now + (min(self.interval, fill) if fill > 0 else self.interval)
        self.decisions += 1
        looks = {c: outlook(c, known, batch, self.curve) for c in self.candidates}
        best = max(self.candidates, key=lambda c: (looks[c].progress, c == current))
        here = looks[current]
        if best == current or looks[best].progress <= 0:
            if now - self._since >= 2 * self.hold:  # settled: the hold relaxes
                self.hold = max(self.hold / 2, self.interval)
            return None
        need = self.margin * sqrt(self.full / seen)
        top = looks[best].progress

        def gain_of(c: str) -> float:
            return looks[c].progress / here.progress - 1 if here.progress > 0 else float("inf")

        # Of the candidates that beat the one in force by the margin and come within it of the
        # best, the least stale: the curve prices staleness by its mean alone, which live runs
        # show understates what an unbounded one costs (ASP needed 1.4-2.7x BSP's samples
        # where SSP at the same mean needed 0.9-1.2x), so a forecast that ties is no reason
        # to take more of it on.
        fit = [c for c in self.candidates if c != current and looks[c].progress > 0
               and looks[c].progress * (1 + self.margin) >= top and gain_of(c) > need]
        if not fit:
            return None
        best = min(fit, key=lambda c: (looks[c].staleness, -looks[c].progress))
        there, gain = looks[best], gain_of(best)
        saved = self.horizon * (1 - here.progress / there.progress)
        if saved <= slowest:  # the drain waits about one slowest step
            return None
        return Proposal(best, gain, _situation(known, here, there), looks)


def _situation(paces: list[Pace], here: Outlook, there: Outlook) -> str:
    """Why, in a user's words: the spread of the workers' steps and the two forecasts."""
    means = sorted(p.mean for p in paces)
    mid = means[len(means) // 2]
    spread = means[-1] / mid if mid > 0 else 1.0
    jitter = max(max(p.steps) / p.mean for p in paces)
    never = "never reaches the target" if here.samples_needed is None else (
        f"{here.samples_per_s:.0f} samples/s, {here.samples_needed:.0f} to target")
    return (f"slowest worker {spread:.2f}x the median step, steps up to {jitter:.2f}x their "
            f"mean; {here.policy}: {never}; {there.policy}: {there.samples_per_s:.0f} "
            f"samples/s, {there.samples_needed:.0f} to target")
