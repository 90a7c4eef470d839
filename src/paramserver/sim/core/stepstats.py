"""A simulation's step records as columns, and what the summary and the report need of them.

A 10,000-worker x 100-step simulation makes a million step records: as JSON lines (metrics.jsonl)
they are 240 MB that the summary and the report must parse again, line by line. StepColumns
keeps each record's numbers in arrays instead (about 70 bytes a step), and at the end
`step_stats` reduces them with numpy to what is read later: per-worker totals, the staleness
histogram and per-step (or per-bucket of steps) quantiles across workers; `summary` gives the
summary.json fields that metrics.summarize computes from the step records, from the same numbers.

Pure: no I/O, no clock. The run folder's steps.npz holds `step_stats`'s arrays (sim.records).
"""

from __future__ import annotations

from array import array

import numpy as np

# Quantiles across workers at each step (or bucket of steps): the report's bands.
QUANTILES = (0.1, 0.5, 0.9)
# At most this many step buckets: a run of a few workers and a million steps still gives a
# small file and a readable band.
MAX_BUCKETS = 200


# The numbers of a step record, in the order StepColumns keeps them.
FIELDS = ("t", "worker", "step", "batch", "compute_s", "wait_s", "pull_s", "push_s", "staleness")


class StepColumns:
    """One float64 array of every step record's FIELDS, interleaved: `extend` with a tuple of
    them is one C call per step, the simulator's cost per step (72 bytes each). Integers stay
    exact in a float64 up to 2**53."""

    def __init__(self):
        self.values = array("d")
        self.extend = self.values.extend
        self.real: dict[int, float] = {}  # replayed runs only: measured compute per worker

    def __len__(self) -> int:
        return len(self.values) // len(FIELDS)

    def arrays(self) -> dict[str, np.ndarray]:
        """Each field as a numpy array (strided views; the integer fields converted)."""
        table = np.frombuffer(self.values, dtype=np.float64).reshape(-1, len(FIELDS))
        return {name: table[:, i].astype(np.int64) if name in _INTS else table[:, i]
                for i, name in enumerate(FIELDS)}


_INTS = {"worker", "step", "batch", "staleness"}


def step_stats(cols: StepColumns, model_bytes: int) -> dict[str, np.ndarray]:
    """The arrays of steps.npz: per-worker totals (workers with at least one step), the
    staleness histogram, and quantiles across workers per bucket of step indexes."""
    a = cols.arrays()
    w = a["worker"]
    n = int(w.max()) + 1 if len(w) else 0
    steps = np.bincount(w, minlength=n)
    seen = np.nonzero(steps)[0]

    def per_worker(x):
        # bincount adds in record order, as summarize's loop does
        return np.bincount(w, weights=x, minlength=n)[seen]

    real = np.array([cols.real.get(int(k), 0.0) for k in seen], dtype=np.float64)
    stale_values, stale_counts = np.unique(a["staleness"], return_counts=True)
    out = {
        "worker": seen.astype(np.int64), "steps": steps[seen].astype(np.int64),
        "samples": np.bincount(w, weights=a["batch"], minlength=n)[seen].astype(np.int64),
        "compute_s": per_worker(a["compute_s"]), "wait_s": per_worker(a["wait_s"]),
        "pull_s": per_worker(a["pull_s"]), "push_s": per_worker(a["push_s"]),
        "staleness_sum": per_worker(a["staleness"].astype(np.float64)),
        "real_compute_s": real,
        "staleness_values": stale_values.astype(np.int64),
        "staleness_counts": stale_counts.astype(np.int64),
        "train_time": np.float64(a["t"].max() if len(w) else 0.0),
        "rounds": np.int64(a["step"].max() + 1 if len(w) else 0),  # highest step index + 1
        "model_bytes": np.int64(model_bytes),
        "quantiles": np.array(QUANTILES),
    }
    out.update(_bands(a))
    return out


def _bands(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per bucket of step indexes: first step, records, last t, and quantiles of wait, compute
    and staleness across the records in it."""
    step = a["step"]
    if not len(step):
        empty = np.zeros((0, len(QUANTILES)))
        return {"band_step": np.zeros(0, np.int64), "band_count": np.zeros(0, np.int64),
                "band_t": np.zeros(0), "band_wait_s": empty, "band_compute_s": empty,
                "band_staleness": empty}
    last = int(step.max()) + 1
    buckets = min(last, MAX_BUCKETS)
    bucket = step.astype(np.int64) * buckets // last
    order = np.argsort(bucket, kind="stable")
    counts = np.bincount(bucket, minlength=buckets)
    keep = np.nonzero(counts)[0]
    bounds = np.cumsum(counts)[:-1]
    out = {"band_step": keep * last // buckets, "band_count": counts[keep]}
    out["band_t"] = np.array([g.max() for g in np.split(a["t"][order], bounds) if len(g)])
    for name in ("wait_s", "compute_s", "staleness"):
        groups = [g for g in np.split(a[name][order].astype(np.float64), bounds) if len(g)]
        out[f"band_{name}"] = np.array([np.quantile(g, QUANTILES) for g in groups])
    return out


def summary(stats: dict[str, np.ndarray], base: dict, wall: float, round_mode: bool) -> dict:
    """summary.json from `stats`: `base` is metrics.summarize of the run's other records
    (evaluations: the fields that do not come from steps), `wall` the largest t of all records."""
    steps_w = stats["steps"]
    steps = int(steps_w.sum())
    compute, wait = stats["compute_s"].tolist(), stats["wait_s"].tolist()
    pull, push = stats["pull_s"].tolist(), stats["push_s"].tolist()
    stale, nbytes = stats["staleness_sum"].tolist(), int(stats["model_bytes"])
    per_worker = {}
    for i, (worker, k, samples) in enumerate(zip(stats["worker"].tolist(), steps_w.tolist(),
                                                 stats["samples"].tolist())):
        busy = compute[i] + wait[i] + pull[i] + push[i]
        per_worker[str(worker)] = {
            "steps": k, "samples": samples, "compute_s": compute[i], "wait_s": wait[i],
            "comm_s": pull[i] + push[i], "wait_fraction": wait[i] / busy if busy else 0.0,
            "mean_staleness": stale[i] / k, "bytes": 2 * nbytes * k}
    total_compute = float(stats["compute_s"].sum())
    real = float(stats["real_compute_s"].sum())
    stale_total = int((stats["staleness_values"] * stats["staleness_counts"]).sum())
    out = dict(base)
    out.update(
        steps=steps, samples=int(stats["samples"].sum()), wall_time_s=round(wall, 4),
        mean_wait_fraction=(sum(w["wait_fraction"] for w in per_worker.values()) / len(per_worker)
                            if per_worker else 0.0),
        updates_applied=int(stats["rounds"]) if round_mode else steps,
        mean_staleness=stale_total / steps if steps else 0.0,
        real_compute_share=real / total_compute if total_compute else None,
        steps_per_s=steps / wall if wall else 0.0,
        push_bytes_per_step=float(nbytes) if steps else 0.0,
        pull_bytes_per_step=float(nbytes) if steps else 0.0,
        push_codecs=[], pull_codecs=[],  # a simulated step names no codec: dense
        per_worker=per_worker)
    return out
