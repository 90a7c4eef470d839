"""From each candidate's simulated outcome and the convergence model, a ranked answer. Pure.

A candidate is a policy with its main options. Its predicted time to target is the virtual time
its simulation takes to process the samples the convergence model says it needs (a band: the
samples' band read off the same curve). A run that changes policy on the way (auto) is a series
of stretches: each moves it toward the target by its samples over what its policy needs at its
staleness and update batch, and the run goes on under the last one.

Not every run reaches the target: the convergence model says what share would (exp(-hazard x
staleness), the hazard fitted to which calibration runs diverged at which staleness; see
predict.convergence). A candidate under NEVER of its runs
predicted to reach is predicted never; the others rank by their expected time, the band over
that share (a run that diverges is time lost, and the job is run again). The pick is the
first, and it is "too close to call" when its band overlaps the runner-up's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from paramserver.predict.convergence import Band, ConvergenceModel
from paramserver.policies import SYNC_POLICIES

ADVICE_VERSION = 1
NEVER = 0.5  # under this share of runs predicted to reach the target: predicted never
RELIABLE = 0.8  # under this share a candidate's risk is named in the reasons


class Stretch(Protocol):
    """What is read of advise.outcome.Stretch: a stretch of the run under one policy."""

    policy: str
    apply_mode: str
    samples: float
    staleness: float
    update_batch: float

    def to_json(self) -> dict: ...


class SimOutcome(Protocol):
    """What is read of advise.outcome.SimOutcome (that module runs the simulator)."""

    apply_mode: str
    samples_per_s: float
    mean_staleness: float
    update_batch: float
    wait_share: float
    stretches: tuple[Stretch, ...]

    def time_to(self, samples: float) -> float: ...


@dataclass(frozen=True)
class Candidate:
    """A policy and the options it runs with; `label` names it in tables."""

    policy: str
    options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        if not self.options:
            return self.policy
        return self.policy + "(" + ",".join(f"{k}={v}" for k, v in self.options) + ")"

    def options_dict(self) -> dict:
        return dict(self.options)


def default_candidates(policies: list[str] | None = None) -> list[Candidate]:
    """Every registered policy at each of its `advise_options` (its defaults; the bounded-
    staleness policies at a few bounds), in the registry's order."""
    grid = [Candidate(name, options) for name in SYNC_POLICIES.names()
            for options in SYNC_POLICIES.get(name).advise_options]
    if policies is None:
        return grid
    return [c for c in grid if c.policy in policies] + [
        Candidate(p) for p in policies if not any(c.policy == p for c in grid)]


@dataclass(frozen=True)
class Prediction:
    """One candidate's prediction; `time_s` None: predicted never to reach the target.
    `reach`: the share of its runs predicted to reach it at all."""

    candidate: Candidate
    outcome: SimOutcome
    samples: Band | None
    time_s: Band | None
    reach: float = 1.0

    @property
    def expected_s(self) -> Band | None:
        """The time band over the share that reaches: what ranks the candidates."""
        if self.time_s is None or self.reach <= 0:
            return None
        return self.time_s.scaled(1.0 / self.reach)

    def to_json(self) -> dict:
        band = (lambda b: None if b is None else {"lo": b.lo, "mid": b.mid, "hi": b.hi})
        return {"label": self.candidate.label, "policy": self.candidate.policy,
                "options": self.candidate.options_dict(),
                "time_to_target_s": band(self.time_s), "samples_needed": band(self.samples),
                "reach": self.reach, "expected_time_s": band(self.expected_s),
                "samples_per_s": self.outcome.samples_per_s,
                "wait_share": self.outcome.wait_share,
                "mean_staleness": self.outcome.mean_staleness,
                "update_batch": self.outcome.update_batch,
                "apply_mode": self.outcome.apply_mode,
                "stretches": [x.to_json() for x in self.outcome.stretches]}


@dataclass(frozen=True)
class Recommendation:
    """The ranked predictions (fastest first, never-reaching last) and the pick."""

    target: float
    ranked: tuple[Prediction, ...]
    pick: Prediction | None
    confidence: str  # "clear", "too close to call" or "none reaches the target"
    margin: float | None  # the runner-up's mid time over the pick's
    reasons: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"target": self.target, "confidence": self.confidence, "margin": self.margin,
                "pick": None if self.pick is None else self.pick.candidate.label,
                "reasons": list(self.reasons),
                "ranked": [p.to_json() for p in self.ranked]}


def predict(candidate: Candidate, outcome: SimOutcome,
            model: ConvergenceModel) -> Prediction:
    """The candidate's samples to target and the time its simulated run takes to do them (see
    the module doc); never when the policy the run ends under is predicted never to reach,
    or under NEVER of its runs would. A run's share that reaches is each stretch's, weighted by
    the share of the way that stretch made."""
    stretches = outcome.stretches
    needs = [model.samples_needed(x.reference, apply_mode=x.apply_mode,
                                  update_batch=x.update_batch, staleness=x.staleness)
             for x in stretches]
    if not needs or needs[-1] is None:
        return Prediction(candidate, outcome, None, None, 0.0)
    walks = {edge: _through(stretches, [None if n is None else getattr(n, edge)
                                        for n in needs])
             for edge in ("lo", "mid", "hi")}
    samples = Band(*(walks[edge][0] for edge in ("lo", "mid", "hi")))
    reach = 1.0
    for x, share in zip(stretches, walks["mid"][1]):
        if share > 0:
            reach *= model.reach(x.reference, apply_mode=x.apply_mode,
                                 staleness=x.staleness) ** share
    if reach < NEVER:
        return Prediction(candidate, outcome, samples, None, reach)
    t = Band(outcome.time_to(samples.lo), outcome.time_to(samples.mid),
             outcome.time_to(samples.hi))
    return Prediction(candidate, outcome, samples, t, reach)


def _through(stretches: tuple[Stretch, ...], needs: list[float | None]
             ) -> tuple[float, list[float]]:
    """(samples until the stretches' shares of the way, samples / needed (None: no way made),
    add up to the whole, each stretch's share of it); past the last stretch the run goes on
    under its policy."""
    done = start = 0.0
    shares = [0.0] * len(stretches)
    for i, (x, need) in enumerate(zip(stretches, needs)):
        if need is not None:
            if done + x.samples / need >= 1:
                shares[i] = 1 - done
                return start + (1 - done) * need, shares
            shares[i] = x.samples / need
            done += shares[i]
        start += x.samples
    shares[-1] += 1 - done
    return start + (1 - done) * needs[-1], shares


def recommend(predictions: list[Prediction], target: float) -> Recommendation:
    """Rank by the middle of the expected time; pick the first (see the module doc)."""
    reaching = sorted((p for p in predictions if p.time_s is not None),
                      key=lambda p: p.expected_s.mid)
    never = [p for p in predictions if p.time_s is None]
    ranked = tuple(reaching + never)
    reasons = [f"{p.candidate.label}: predicted never to reach {target:g} at staleness "
               f"{p.outcome.mean_staleness:.2g}, update batch {p.outcome.update_batch:.3g}"
               + ("" if p.samples is None else
                  f": about {p.reach:.0%} of runs would not diverge, from its calibration "
                  f"runs")
               for p in never]
    reasons += [f"{p.candidate.label}: about {p.reach:.0%} of runs predicted to reach "
                f"{target:g} at staleness {p.outcome.mean_staleness:.2g}; ranked by "
                f"{p.time_s.mid:.3g} s / {p.reach:.2f} = {p.expected_s.mid:.3g} s"
                for p in reaching if p.reach < RELIABLE]
    if not reaching:
        return Recommendation(target, ranked, None, "none reaches the target", None,
                              tuple(reasons))
    pick = reaching[0]
    if len(reaching) == 1:
        return Recommendation(target, ranked, pick, "clear", None, tuple(reasons))
    second = reaching[1]
    first, other = pick.expected_s, second.expected_s
    margin = other.mid / first.mid if first.mid > 0 else None
    overlap = other.lo <= first.hi
    if overlap:
        reasons.insert(0, f"{pick.candidate.label} and {second.candidate.label}: their bands "
                          f"overlap ({_band(first)} against {_band(other)})")
    return Recommendation(target, ranked, pick, "too close to call" if overlap else "clear",
                          margin, tuple(reasons))


def _band(b: Band) -> str:
    return f"{b.lo:.3g}-{b.hi:.3g} s"
