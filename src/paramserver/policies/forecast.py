"""Forecast: how fast each candidate policy would bring the job to its target from now on.

A candidate's progress rate is its throughput (samples/s, from the workers' recent pace) over
the samples it needs to reach the target (predict/convergence.py: the apply mode's live
reference, scaled by the update batch and the staleness the candidate would run at). The
throughput of each candidate is a closed form over N workers with step times t_w(b) =
c_w b + o_w (per-sample compute c_w, per-step overhead o_w), so a decision costs O(N x window)
arithmetic, not a simulation:

- bsp: a round takes the slowest step of the round: E_k[max_w t_w,k] over the recent steps
  (the jitter of a transient straggler counts);
- lbbsp: the batch split that equalises the round: T with sum_w (T - o_w) / c_w = N b (c_w
  from the worker's median step: the speed a predictor follows), times the spikes a split
  cannot follow (E_k[max_w t_w,k / median t_w]);
- ssp: every worker at the pace of the slowest on average (the bound absorbs its jitter):
  N b / max_w mean t_w;
- asp: every worker at its own pace: sum_w b / mean t_w.

Staleness, in pushes applied between a worker's pull and its push: asp N - 1 (the others'
pushes over one of its steps, summed over the pushes); ssp between (N - 1)/2, where the bound
keeps the workers in step behind a chronic straggler, and N - 1 with none; lockstep 0.

The samples a candidate needs come from one curve for every candidate (SamplesCurve), so that
two candidates that run the same algorithm (one worker: every policy is plain SGD) are
predicted alike. The convergence model fits each apply mode apart, each against its own
reference, and across modes those disagree: the shipped fit's arrival-mode curve, taken to
staleness 0 at batch 32, needs 0.56x the samples its round-mode curve needs at that batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from paramserver.policies.pace import Pace
from paramserver.predict.convergence import ConvergenceModel, Reference

# Which candidates update once per round (by the round's samples) and which once per push.
# (Under auto every candidate's pushes are applied on arrival; the lockstep ones scale each push
# by its share of the round, which for a linear rule is the round's average, as round mode
# applies it.)
MODES = {"bsp": "round", "lbbsp": "round", "ssp": "arrival", "asp": "arrival"}
CANDIDATES = tuple(MODES)

# The shipped calibration's apply-mode references (advise/data/default_calibration.json: the
# digits MLP, 4 and 8 workers, batch 32, target 0.95). tests/policies/test_auto_policy.py checks
# that they are the file's: a new calibration must be carried here too.
SHIPPED = ConvergenceModel(
    version=1, target=0.95, b_crit=19.027313840043536,
    alpha={"arrival": 0.4466835921509635, "round": 0.0},
    policies={},
    modes={"round": Reference("round", 10154.666666666662, 128.0, 0.0,
                              0.8319772622544496, 1.093489380271954, 16, 15, failed=0),
           "arrival": Reference("arrival", 11085.68429073213, 32.0, 2.933518005540166,
                                0.5831900673535928, 1.6870571894873734, 40, 30,
                                hazard=0.06433332377597183, failed=8)},
    source={"from": "the shipped calibration's apply-mode references"})


@dataclass(frozen=True)
class SamplesCurve:
    """samples(B, s) = E0 (1 + B/B_crit)/(1 + B0/B_crit) (1 + alpha s): the round-mode
    reference (E0 samples at update batch B0, no staleness) with the critical-batch term,
    and a staleness price alpha that puts the arrival-mode reference on the same curve.
    `never`: the staleness from which the target is never reached (None: no such limit)."""

    samples: float
    update_batch: float
    b_crit: float
    alpha: float
    never: float | None = None

    @classmethod
    def of(cls, model: ConvergenceModel) -> "SamplesCurve":
        lock = model.modes.get("round")
        free = model.modes.get("arrival")
        if lock is None or lock.samples is None:
            raise ValueError("the convergence model has no round-mode runs that reached the "
                             "target to scale from")
        curve = cls(lock.samples, lock.update_batch, model.b_crit,
                    model.alpha.get("arrival", 0.0))
        if free is None or free.samples is None or free.staleness <= 0:
            return curve
        at_zero = curve.needed(free.update_batch, 0.0)
        alpha = max(free.samples / at_zero - 1, 0.0) / free.staleness
        return cls(lock.samples, lock.update_batch, model.b_crit, alpha, free.never_staleness)

    def needed(self, update_batch: float, staleness: float) -> float | None:
        if self.never is not None and staleness >= self.never:
            return None
        return (self.samples * (1 + update_batch / self.b_crit)
                / (1 + self.update_batch / self.b_crit) * (1 + self.alpha * staleness))


@dataclass(frozen=True)
class Outlook:
    """What a candidate would do from now: samples/s, the samples it needs to reach the
    target (None: predicted never to), the staleness it would run at."""

    policy: str
    samples_per_s: float
    samples_needed: float | None
    staleness: float

    @property
    def progress(self) -> float:
        """Share of the way to the target per second (0 for a candidate that never gets there)."""
        if self.samples_needed is None or self.samples_needed <= 0:
            return 0.0
        return self.samples_per_s / self.samples_needed

    def to_dict(self) -> dict:
        return {"samples_per_s": round(self.samples_per_s, 3),
                "samples_needed": None if self.samples_needed is None
                else round(self.samples_needed, 1),
                "staleness": round(self.staleness, 3)}


def outlook(policy: str, paces: list[Pace], batch: int, curve: SamplesCurve) -> Outlook:
    """The candidate `policy` over workers of `paces` (one each, all with steps on record)."""
    if policy not in MODES:
        raise ValueError(f"no forecast for policy {policy!r}; candidates: "
                         f"{', '.join(CANDIDATES)}")
    if not paces:
        raise ValueError("a forecast needs at least one worker's pace")
    n = len(paces)
    means = [p.mean for p in paces]
    slowest = max(means)
    if policy == "bsp":
        rate, staleness = n * batch / _expected_max(paces), 0.0
    elif policy == "lbbsp":
        typical = [median(p.steps) for p in paces]
        rate = n * batch / (_balanced_round(paces, typical, batch) * _spikes(paces, typical))
        staleness = 0.0
    elif policy == "ssp":
        rate = n * batch / slowest
        staleness = (n - 1) * (1 + min(means) / slowest) / 2
    else:
        rate, staleness = sum(batch / m for m in means), float(n - 1)
    update_batch = n * batch if MODES[policy] == "round" else batch
    return Outlook(policy, rate, curve.needed(update_batch, staleness), staleness)


def _expected_max(paces: list[Pace]) -> float:
    """The mean over the recent rounds of the slowest step in each (the k-th newest steps of
    every worker taken as one round)."""
    k = min(len(p.steps) for p in paces)
    return sum(max(p.steps[-i] for p in paces) for i in range(1, k + 1)) / k


def _spikes(paces: list[Pace], typical: list[float]) -> float:
    """How much longer than its typical step the slowest of a round is, on average: what a
    split by typical speeds leaves to wait for (1.0: steady workers)."""
    k = min(len(p.steps) for p in paces)
    return sum(max(p.steps[-i] / t if t > 0 else 1.0 for p, t in zip(paces, typical))
               for i in range(1, k + 1)) / k


def _balanced_round(paces: list[Pace], typical: list[float], batch: int) -> float:
    """The round time T at which every worker finishes together when worker w takes
    (T - o_w) / c_w of the round's samples, c_w from its typical (median) step: the speed a
    predictor can follow, where a transient spike is not."""
    costs = [max(m - p.overhead, 0.0) / batch for p, m in zip(paces, typical)]
    if any(c <= 0 for c in costs):  # all overhead: there is nothing to balance
        return max(typical)
    speed = sum(1 / c for c in costs)
    balanced = (batch * len(paces) + sum(p.overhead / c for p, c in zip(paces, costs))) / speed
    # Every worker keeps at least one sample (LB-BSP's min_batch).
    return max(balanced, max(p.overhead + c for p, c in zip(paces, costs)))
