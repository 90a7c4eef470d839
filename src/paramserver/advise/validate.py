"""The arithmetic of `paramserver calibrate`: measured and predicted time to target per grid
cell, leave-one-out selections, the error of each prediction, per-policy verdicts against the
15% goal, and the seed claims (policy against BSP) live and simulated. Pure: the command runs
the jobs and the simulator and hands the numbers in."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from paramserver.advise.convergence import Band
from paramserver.advise.fit_convergence import LiveRun

GOAL = 0.15  # predicted time to target within 15% of the live median


@dataclass(frozen=True)
class Cell:
    """One grid cell: a policy under one straggler scenario on one link."""
    policy: str
    scenario: str
    link: str

    @property
    def setting(self) -> str:
        """The cell's settings without the policy (what LiveRun.cell holds)."""
        return f"{self.scenario}@{self.link}"

    @property
    def key(self) -> str:
        return f"{self.policy}/{self.setting}"


@dataclass(frozen=True)
class Measured:
    """A cell's live runs: median time to target over those that reached it when at least
    half did (else None: the median run never reached), and the spread."""
    runs: int
    reached: int
    median_s: float | None
    lo_s: float | None
    hi_s: float | None


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    measured: Measured
    predicted: Band | None  # seconds; None: predicted never to reach
    samples: Band | None  # the convergence model's samples to target (leave-one-out)
    sim_staleness: float
    sim_update_batch: float
    latency_s: float  # the per-message latency fitted on the other cells of the link

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when either side never reached."""
        return error(self.predicted.mid if self.predicted else None, self.measured.median_s)

    @property
    def agrees(self) -> bool:
        """Within the goal, or both sides say never."""
        if self.measured.median_s is None or self.predicted is None:
            return self.measured.median_s is None and self.predicted is None
        return abs(self.error) <= GOAL


def measure(runs: list[LiveRun]) -> Measured:
    times = sorted(r.time_to_target for r in runs if r.reached)
    if not runs or 2 * len(times) < len(runs):
        return Measured(len(runs), len(times), None, times[0] if times else None,
                        times[-1] if times else None)
    return Measured(len(runs), len(times), float(np.median(times)), times[0], times[-1])


def error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def leave_out(runs: list[LiveRun], cell: Cell) -> list[LiveRun]:
    """Every run but the cell's own: what its prediction may see."""
    return [r for r in runs if not (r.policy == cell.policy and r.cell == cell.setting)]


def time_at_samples(times: list[float], samples: list[float], n: float) -> float | None:
    """When a cumulative samples curve (ascending) reaches n, linearly between its points;
    None when it never does."""
    if not samples or n > samples[-1]:
        return None
    i = bisect_left(samples, n)
    if i == 0:
        return times[0] * n / samples[0] if samples[0] > 0 else times[0]
    t0, t1, n0, n1 = times[i - 1], times[i], samples[i - 1], samples[i]
    return t0 + (t1 - t0) * (n - n0) / (n1 - n0) if n1 > n0 else t1


def predict_time(times: list[float], samples: list[float], need: Band | None
                 ) -> Band | None:
    """The simulated curve read at the band of samples needed (None past its end)."""
    if need is None:
        return None
    ts = [time_at_samples(times, samples, n) for n in (need.lo, need.mid, need.hi)]
    if ts[1] is None:
        return None
    hi = ts[2] if ts[2] is not None else math.inf
    return Band(ts[0], ts[1], hi)


def fit_latency(candidates: list[float], sim_wall: dict[str, list[float]],
                live_wall: dict[str, list[float]], exclude: str | None = None) -> float:
    """The per-message latency that makes the simulated wall time of every cell but `exclude`
    match its live runs (least squares in log time).

    sim_wall[cell][i]: the simulated time to spend the budget at candidates[i]; live_wall[cell]:
    the cell's live wall times. Interpolated on a fine grid between the candidates."""
    fine = np.linspace(min(candidates), max(candidates), 401)
    cost = np.zeros_like(fine)
    used = 0
    for cell, walls in sim_wall.items():
        if cell == exclude or not live_wall.get(cell):
            continue
        sim = np.interp(fine, candidates, np.log(walls))
        for w in live_wall[cell]:
            cost += (sim - math.log(w)) ** 2
        used += 1
    if not used:
        raise ValueError("no other cell on this link to fit its latency from")
    return float(fine[int(np.argmin(cost))])


@dataclass(frozen=True)
class PolicyVerdict:
    policy: str
    cells: int
    compared: int  # cells where both sides reached the target
    median_abs_error: float | None
    max_abs_error: float | None
    agree: int  # cells within the goal (or both never)

    @property
    def within_goal(self) -> bool:
        return self.agree == self.cells


def per_policy(results: list[CellResult]) -> list[PolicyVerdict]:
    out = []
    for p in dict.fromkeys(r.cell.policy for r in results):
        mine = [r for r in results if r.cell.policy == p]
        errs = [abs(r.error) for r in mine if r.error is not None]
        out.append(PolicyVerdict(p, len(mine), len(errs),
                                 float(np.median(errs)) if errs else None,
                                 max(errs) if errs else None, sum(r.agrees for r in mine)))
    return out


# The seed claims, each a policy against BSP: (policy, what the seed paper says).
SEED_CLAIMS = [("ebsp", "ElasticBSP vs BSP: 1.77x sooner (seed)"),
               ("r2sp", "R2SP vs BSP: up to 25% sooner (seed)"),
               ("lbbsp", "LB-BSP vs BSP: up to 2x sooner (seed)"),
               ("ssp", "SSP vs BSP with a straggler: sooner (seed)")]


@dataclass(frozen=True)
class Claim:
    policy: str
    claim: str
    setting: str
    live: float | None  # BSP's time to target / the policy's (> 1: the policy is sooner)
    simulated: float | None


def speedup(bsp: float | None, other: float | None) -> float | None:
    if bsp is None or other is None or other <= 0:
        return None
    return bsp / other


def seed_claims(results: list[CellResult]) -> list[Claim]:
    """Each seed claim in every setting where both BSP and the policy ran."""
    by = {(r.cell.policy, r.cell.setting): r for r in results}
    out = []
    for setting in dict.fromkeys(r.cell.setting for r in results):
        bsp = by.get(("bsp", setting))
        if bsp is None:
            continue
        for policy, claim in SEED_CLAIMS:
            r = by.get((policy, setting))
            if r is None:
                continue
            out.append(Claim(policy, claim, setting,
                             speedup(bsp.measured.median_s, r.measured.median_s),
                             speedup(bsp.predicted.mid if bsp.predicted else None,
                                     r.predicted.mid if r.predicted else None)))
    return out
