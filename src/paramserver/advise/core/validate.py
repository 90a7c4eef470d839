"""The arithmetic of `paramserver calibrate`: measured and predicted time to target per grid
cell, leave-one-out selections, the error of each prediction, per-policy verdicts against the
15% goal, and the seed claims (policy against BSP) live and simulated. Pure: the command runs
the jobs and the simulator and hands the numbers in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramserver.predict.convergence import Band
from paramserver.advise.core.fit_convergence import LiveRun

GOAL = 0.15  # predicted time to target within 15% of the live median


@dataclass(frozen=True)
class Cell:
    """One grid cell: a policy under one straggler scenario on one link, at a worker count
    (None: not told; the runs of one count are one cell)."""
    policy: str
    scenario: str
    link: str
    workers: int | None = None

    @property
    def setting(self) -> str:
        """The cell's settings without the policy (what LiveRun.cell holds)."""
        at = "" if self.workers is None else f"@{self.workers}w"
        return f"{self.scenario}@{self.link}{at}"

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
    samples: float | None = None  # median samples to target of the runs that reached it


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    measured: Measured
    predicted: Band | None  # seconds; None: predicted never to reach
    samples: Band | None  # the convergence model's samples to target (leave-one-out)
    sim_staleness: float
    sim_update_batch: float
    profiles: int  # profile runs the prediction is the median over
    # The simulator's time to the live median samples to target: the prediction had the
    # convergence model been exact, so its error is the throughput's alone.
    sim_time_at_live_samples: float | None = None

    @property
    def samples_error(self) -> float | None:
        """The convergence model's samples to target against the live median's."""
        return error(self.samples.mid if self.samples else None, self.measured.samples)

    @property
    def throughput_error(self) -> float | None:
        """The simulator's time to the live samples against the live time: the part of the
        error the cluster model and simulator make (1 + error = (1 + samples_error) x
        (1 + throughput_error), up to the curve's start-up)."""
        return error(self.sim_time_at_live_samples, self.measured.median_s)

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
    return Measured(len(runs), len(times), float(np.median(times)), times[0], times[-1],
                    float(np.median([r.samples_to_target for r in runs if r.reached])))


def error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def leave_out(runs: list[LiveRun], cell: Cell) -> list[LiveRun]:
    """Every run but the cell's own: what its prediction may see."""
    return [r for r in runs if not (r.policy == cell.policy and r.cell == cell.setting)]


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
