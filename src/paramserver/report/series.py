"""The numbers each figure plots, computed from the runs: pure, so tests can check them."""

from __future__ import annotations

from collections import Counter
from statistics import median

import numpy as np

from paramserver.policies import SYNC_POLICIES
from paramserver.report.collect import SINGLE, Collection, Run
from paramserver.report.table import Row

# Fixed colours, so a policy looks the same in every figure and every report: the registered
# policies take the palette in the registry's order (a new policy takes the next colour).
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
            "#e377c2", "#bcbd22", "#7f7f7f"]
_SPARE = ["#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2"]
_SINGLE_COLOR = "#555555"


def policy_color(policy: str) -> str:
    if policy == SINGLE:
        return _SINGLE_COLOR
    names = SYNC_POLICIES.names()
    if policy in names and names.index(policy) < len(_PALETTE):
        return _PALETTE[names.index(policy)]
    return _SPARE[sum(map(ord, policy)) % len(_SPARE)]  # stable across runs, unlike hash()


def run_curve(run: Run, x: str) -> tuple[list[float], list[float]]:
    """Test accuracy (AUC for a click model) of one run against wall time ("time") or global
    steps ("steps")."""
    if x == "time":
        xs = [e["t"] for e in run.evals]
    else:
        xs = [e.get("samples", 0) / run.global_batch for e in run.evals]
    return xs, [e[run.score] for e in run.evals]


def median_curve(curves: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise median of step curves (each holds its last value) where every curve exists,
    evaluated at every curve's points: exact, and few points when evaluations were few."""
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not curves:
        return np.array([]), np.array([])
    if len(curves) == 1:
        return curves[0]
    start = max(x[0] for x, _ in curves)
    grid = np.unique(np.concatenate([x[x >= start] for x, _ in curves]))
    values = [y[np.searchsorted(x, grid, side="right") - 1] for x, y in curves]
    return grid, np.median(values, axis=0)


def accuracy_series(collection: Collection, scenario: str, x: str) -> dict[str, dict]:
    """policy -> {"repeats": [(xs, ys)], "median": (xs, ys)} for the accuracy figures."""
    out = {}
    for policy in collection.policies(scenario):
        curves = [run_curve(r, x) for r in collection.select(scenario, policy)]
        out[policy] = {"repeats": curves, "median": median_curve(curves)}
    return out


# Past this many workers the breakdown draws quantile groups of workers, not a bar per worker.
MAX_WORKER_BARS = 24
GROUPS = 10


def breakdown_series(collection: Collection, scenario: str) -> dict[str, dict[str, tuple]]:
    """policy -> worker -> (compute_s, comm_s, wait_s), mean over repeats, from the summaries.

    With more than MAX_WORKER_BARS workers, the workers ordered by their total time are cut
    into GROUPS groups of equal size, each the mean of its workers: "p90-100" is the slowest
    tenth (the keys are then group labels, not worker ids)."""
    out = {}
    for policy in collection.policies(scenario):
        if policy == SINGLE:
            continue
        sums: dict[str, list] = {}
        runs = collection.select(scenario, policy)
        for run in runs:
            for worker, w in (run.summary.get("per_worker") or {}).items():
                acc = sums.setdefault(worker, [0.0, 0.0, 0.0])
                for i, key in enumerate(("compute_s", "comm_s", "wait_s")):
                    acc[i] += (w.get(key) or 0.0) / len(runs)
        ordered = {w: tuple(v) for w, v in sorted(sums.items(), key=lambda kv: int(kv[0]))}
        out[policy] = ordered if len(ordered) <= MAX_WORKER_BARS else worker_groups(ordered)
    return out


def worker_groups(workers: dict[str, tuple], groups: int = GROUPS) -> dict[str, tuple]:
    """Mean (compute, comm, wait) of each of `groups` equal groups of workers by total time."""
    parts = np.array(list(workers.values()), dtype=float)
    order = np.argsort(parts.sum(axis=1), kind="stable")
    out = {}
    for k, idx in enumerate(np.array_split(order, groups)):
        if len(idx):
            lo, hi = 100 * k // groups, 100 * (k + 1) // groups
            out[f"p{lo}-{hi}"] = tuple(float(x) for x in parts[idx].mean(axis=0))
    return out


def wait_bands(collection: Collection, scenario: str) -> dict[str, dict]:
    """policy -> {"step", "q" (quantile levels), "wait_s" (steps x quantiles)} across workers
    at each step, for the simulations that wrote steps.npz (first repeat); others are left out."""
    out = {}
    for policy in collection.policies(scenario):
        runs = [r for r in collection.select(scenario, policy) if r.step_stats is not None]
        if policy == SINGLE or not runs:
            continue
        st = runs[0].step_stats
        if len(st["band_step"]):
            out[policy] = {"step": st["band_step"], "q": st["quantiles"],
                           "wait_s": st["band_wait_s"], "staleness": st["band_staleness"]}
    return out


def staleness_series(collection: Collection, scenario: str) -> dict[str, tuple[list, list]]:
    """policy -> (staleness values, fraction of steps with that staleness), repeats pooled."""
    out = {}
    for policy in collection.policies(scenario):
        if policy == SINGLE:
            continue
        counts: Counter = Counter()
        for r in collection.select(scenario, policy):
            counts.update(r.staleness)
        total = sum(counts.values()) or 1
        values = sorted(counts)
        out[policy] = (values, [counts[v] / total for v in values])
    return out


def throughput_series(collection: Collection, scenario: str) -> dict[str, dict]:
    """policy -> {"repeats": samples/s of each repeat, "median": their median}."""
    out = {}
    for policy in collection.policies(scenario):
        values = [r.samples_per_s for r in collection.select(scenario, policy)]
        out[policy] = {"repeats": values, "median": median(values)}
    return out


def tta_series(rows: list[Row], scenario: str) -> list[dict]:
    """The time-to-target bars: straight from the table rows, so the two cannot disagree."""
    return [{"policy": r.policy, "median": r.tta_median, "min": r.tta_min, "max": r.tta_max,
             "speedup": r.speedup, "reached": r.reached, "repeats": r.repeats}
            for r in rows if r.scenario == scenario]
