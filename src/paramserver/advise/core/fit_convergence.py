"""Fit a ConvergenceModel from live runs: samples to target per policy, the staleness cost, the
batch effect, the spread across repeats, and where runs never reach the target.

The fit sees runs as `LiveRun` values (what calibration_io reads from run folders); it does no
I/O. Model, per run i of policy p (apply mode m):

    log S_i = c_p + log(1 + B_i/B_crit) + log(1 + alpha_m s_i) + noise

S the samples processed when test accuracy first reached the target, B the update batch
(samples per applied update), s the mean staleness. For each B_crit on a grid, the policy
intercepts c_p are least squares (the mean residual of p's runs) and alpha_m is picked per
apply mode on its own grid (each policy has one mode, so the modes separate). A small pull
towards the priors settles what the data leave open: with every run of a policy at one batch
size, B_crit is not identified and stays at its prior.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from paramserver.predict.convergence import (APPLY_MODES, VERSION, ConvergenceModel,
                                            Reference)

PRIOR_B_CRIT = 256.0  # samples; the critical batch of small image classifiers is O(100-1000)
PRIOR_ALPHA = 0.0
RIDGE = 1e-3
# The spread (std of log samples to target) of repeats of one policy when the runs cannot
# tell (no policy with two runs): digits at lr 0.3 and 95% showed 0.1-0.3.
PRIOR_WITHIN_SIGMA = 0.2  # weight of the priors against the sum of squared log residuals
B_CRIT_GRID = np.geomspace(4.0, 65536.0, 57)
ALPHA_GRID = np.concatenate([[0.0], np.geomspace(1e-3, 10.0, 81)])


@dataclass(frozen=True)
class LiveRun:
    """One live run as the fit sees it.

    samples/time_to_target: where test accuracy first reached the target (interpolated between
    the evaluations either side), None when it never did within the budget.
    """
    policy: str
    apply_mode: str
    cell: str  # the grid cell (scenario and link) the run belongs to
    repeat: int
    update_batch: float
    staleness: float
    samples_to_target: float | None
    time_to_target: float | None
    final_accuracy: float = math.nan
    diverged: bool = False

    @property
    def reached(self) -> bool:
        return self.samples_to_target is not None


def crossing(evals: list[tuple[float, float, float]], target: float
             ) -> tuple[float, float] | None:
    """(samples, seconds) where accuracy first reaches `target`, linearly between the last
    evaluation below and the first at or above it; None when none reaches it.

    evals: (seconds, samples, accuracy), in time order. Interpolating takes the evaluation
    interval's quantisation (up to one interval late) out of both numbers alike."""
    prev = None
    for t, n, acc in evals:
        if acc >= target:
            if prev is None or prev[2] >= acc:
                return float(n), float(t)
            w = (target - prev[2]) / (acc - prev[2])
            return prev[1] + w * (n - prev[1]), prev[0] + w * (t - prev[0])
        prev = (t, n, acc)
    return None


def live_run(policy: str, apply_mode: str, cell: str, repeat: int, summary: dict,
             evals: list[tuple[float, float, float]], target: float) -> LiveRun:
    """A LiveRun from a run's summary.json and its eval records (seconds, samples, accuracy)."""
    updates = summary.get("updates_applied") or 0
    samples = summary.get("samples") or 0
    batch = summary.get("batch_size") or 1
    update_batch = samples / updates if updates and samples else float(batch)
    cross = crossing(evals, target)
    return LiveRun(policy, apply_mode, cell, repeat, float(update_batch),
                   float(summary.get("mean_staleness") or 0.0),
                   None if cross is None else cross[0], None if cross is None else cross[1],
                   float(summary.get("final_test_accuracy") or math.nan),
                   summary.get("diverged_at_s") is not None)


def _scale(b: float, s: float, b_crit: float, alpha: float) -> float:
    return math.log1p(b / b_crit) + math.log1p(alpha * s)


def _sse_rows(y: np.ndarray, onehot: np.ndarray) -> np.ndarray:
    """Per row of y (candidates x runs): the sum of squared deviations from group means."""
    sums = y @ onehot
    return (y ** 2).sum(axis=1) - (sums ** 2 / onehot.sum(axis=0)).sum(axis=1)


def fit_parameters(runs: list[LiveRun], prior_b_crit: float = PRIOR_B_CRIT,
                   prior_alpha: float = PRIOR_ALPHA) -> tuple[float, dict[str, float]]:
    """(B_crit, {apply mode: alpha}) by least squares on log samples with policy intercepts."""
    reached = [r for r in runs if r.reached]
    best = (math.inf, prior_b_crit, {m: prior_alpha for m in APPLY_MODES})
    if not reached:
        return best[1], best[2]
    by_mode = {}
    for mode in APPLY_MODES:
        mine = [r for r in reached if r.apply_mode == mode]
        if mine:
            names = sorted({r.policy for r in mine})
            onehot = np.array([[r.policy == n for n in names] for r in mine], dtype=float)
            stale = np.log1p(ALPHA_GRID[:, None] * np.array([r.staleness for r in mine]))
            by_mode[mode] = (np.log([r.samples_to_target for r in mine]),
                             np.array([r.update_batch for r in mine]), stale, onehot)
    alpha_cost = RIDGE * (np.log1p(ALPHA_GRID) - math.log1p(prior_alpha)) ** 2
    for bc in B_CRIT_GRID:
        cost = RIDGE * math.log(bc / prior_b_crit) ** 2
        alphas = {m: prior_alpha for m in APPLY_MODES}
        for mode, (logs, batch, stale, onehot) in by_mode.items():
            y = (logs - np.log1p(batch / bc))[None, :] - stale
            total = _sse_rows(y, onehot) + alpha_cost
            i = int(np.argmin(total))
            cost += float(total[i])
            alphas[mode] = float(ALPHA_GRID[i])
        if cost < best[0]:
            best = (cost, float(bc), alphas)
    return best[1], best[2]


HAZARD_MAX = 50.0  # per step of staleness: every run fails (reach exp(-50 s) ~ 0)
COLLAPSED = 0.1  # a run that ended this far below the target or more failed; nearer, it ran out


def failed(run: LiveRun, target: float) -> bool:
    """The run did not reach the target and diverged, or ended COLLAPSED or more below it."""
    return not run.reached and (run.diverged or run.final_accuracy < target - COLLAPSED)


def hazard(runs: list[LiveRun], target: float) -> float | None:
    """The hazard h per step of staleness that makes exp(-h s) the chance a run at mean
    staleness s does not fail, by maximum likelihood over `runs` (which reached the target,
    which failed, at which staleness); None when fewer than two runs had any staleness (a run
    at none says nothing of it: lockstep runs that failed did so for other reasons). 0 when
    none failed. A failed run diverged or ended COLLAPSED or more below the target; one that
    ended nearer ran out of its budget, not of luck, and is left out."""
    seen = [(r.staleness, r.reached) for r in runs
            if r.staleness > 0 and (r.reached or failed(r, target))]
    if len(seen) < 2:
        return None
    lost = [s for s, ok in seen if not ok]
    if not lost:
        return 0.0
    reached_sum = sum(s for s, ok in seen if ok)

    def slope(h: float) -> float:  # d/dh of the log-likelihood: falls as h grows
        return -reached_sum + sum(s / math.expm1(h * s) for s in lost)

    lo, hi = 1e-9, HAZARD_MAX
    if slope(hi) > 0:
        return HAZARD_MAX
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if slope(mid) > 0 else (lo, mid)
    return math.sqrt(lo * hi)


def _reference(runs: list[LiveRun], mode: str, b_crit: float, alpha: float, target: float,
               pooled: bool = False) -> Reference:
    """The runs' median samples to target at their median batch and staleness, the spread
    of the runs (each scaled to that point) around it, and where they stop reaching.

    pooled: the runs of several policies (an apply mode's): a policy that never reaches may
    fail for its own reasons (SSP's same-version sums), not its staleness, so a pooled
    reference scales from the runs that reached and sets no staleness limit."""
    reached = [r for r in runs if r.reached]
    b_ref = float(np.median([r.update_batch for r in (reached or runs)]))
    s_ref = float(np.median([r.staleness for r in (reached or runs)]))
    top = max((r.staleness for r in reached), default=-math.inf)
    beyond = [r.staleness for r in runs if not r.reached and r.staleness > top]
    # One failed run is as likely a dip at lr 0.3 as a staleness limit: it takes two.
    never = min(beyond) if len(beyond) >= 2 and reached and not pooled else None
    if not reached or (not pooled and 2 * len(reached) < len(runs)):
        # most runs never reached: the median run never does
        return Reference(mode, None, b_ref, min(r.staleness for r in runs), runs=len(runs),
                         reached=len(reached), hazard=hazard(runs, target),
                         failed=sum(failed(r, target) for r in runs))
    at_ref = _scale(b_ref, s_ref, b_crit, alpha)
    scaled = np.array([r.samples_to_target * math.exp(at_ref - _scale(r.update_batch,
                                                                       r.staleness, b_crit,
                                                                       alpha))
                       for r in reached])
    mid = float(np.median(scaled))
    return Reference(mode, mid, b_ref, s_ref, min(1.0, float(scaled.min()) / mid),
                     max(1.0, float(scaled.max()) / mid), len(runs), len(reached), never,
                     hazard(runs, target), sum(failed(r, target) for r in runs))


def _shrink(policies: dict[str, Reference], modes: dict[str, Reference], runs: list[LiveRun],
            b_crit: float, alpha: dict[str, float]) -> dict[str, Reference]:
    """Each policy's samples to target pulled towards its apply mode's, as far as the runs
    cannot tell the policy apart from the mode (partial pooling in log space).

    With one or two runs a policy's median is mostly the noise of its repeats (at a target
    near the plateau a repeat can take 50% more samples); the weight of its own median is
    tau^2 / (tau^2 + sigma^2 / n): sigma^2 the spread of repeats within a policy, tau^2 how
    far policies' medians differ beyond what that spread explains."""
    out = dict(policies)
    for mode, pooled in modes.items():
        if pooled.samples is None:
            continue
        a = alpha.get(mode, 0.0)
        at_mode = _scale(pooled.update_batch, pooled.staleness, b_crit, a)
        devs, n, sq, dof = {}, {}, 0.0, 0
        for p, ref in policies.items():
            if ref.apply_mode != mode or ref.samples is None:
                continue
            mine = [r for r in runs if r.policy == p and r.reached]
            at_p = _scale(ref.update_batch, ref.staleness, b_crit, a)
            logs = [math.log(r.samples_to_target) + at_p
                    - _scale(r.update_batch, r.staleness, b_crit, a) for r in mine]
            centre = float(np.mean(logs))
            sq += sum((x - centre) ** 2 for x in logs)
            dof += len(logs) - 1
            devs[p] = math.log(ref.samples) - (math.log(pooled.samples) + at_p - at_mode)
            n[p] = len(logs)
        if len(devs) < 2:
            continue  # one policy is its mode: nothing to pool towards
        sigma2 = sq / dof if dof >= 2 else PRIOR_WITHIN_SIGMA ** 2
        tau2 = max(0.0, float(np.var(list(devs.values()), ddof=1))
                   - float(np.mean([sigma2 / k for k in n.values()])))
        for p, d in devs.items():
            w = tau2 / (tau2 + sigma2 / n[p]) if tau2 > 0 else 0.0
            ref = out[p]
            out[p] = dataclasses.replace(ref, samples=ref.samples * math.exp((w - 1) * d))
    return out


def fit(runs: list[LiveRun], target: float, source: dict | None = None,
        prior_b_crit: float = PRIOR_B_CRIT, prior_alpha: float = PRIOR_ALPHA
        ) -> ConvergenceModel:
    """The convergence model of `runs` (all scored against `target`)."""
    if not runs:
        raise ValueError("no live runs to fit a convergence model from")
    b_crit, alpha = fit_parameters(runs, prior_b_crit, prior_alpha)
    policies: dict[str, Reference] = {}
    for p in sorted({r.policy for r in runs}):
        mine = [r for r in runs if r.policy == p]
        modes = {r.apply_mode for r in mine}
        if len(modes) != 1:
            raise ValueError(f"policy {p!r} ran in several apply modes: {sorted(modes)}")
        mode = modes.pop()
        policies[p] = _reference(mine, mode, b_crit, alpha[mode], target)
    modes = {m: _reference([r for r in runs if r.apply_mode == m], m, b_crit, alpha[m], target,
                           pooled=True)
             for m in APPLY_MODES if any(r.apply_mode == m for r in runs)}
    policies = _shrink(policies, modes, runs, b_crit, alpha)
    # A single run has no spread of its own: it borrows its apply mode's.
    for p, ref in policies.items():
        pooled = modes[ref.apply_mode]
        if ref.samples is not None and ref.reached < 2 and pooled.reached >= 2:
            policies[p] = dataclasses.replace(ref, lo_ratio=pooled.lo_ratio,
                                              hi_ratio=pooled.hi_ratio)
    return ConvergenceModel(VERSION, target, b_crit, alpha, policies, modes, dict(source or {}))
