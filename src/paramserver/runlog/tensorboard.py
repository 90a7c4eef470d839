"""A run's metrics.jsonl as TensorBoard scalars: one TensorBoard run per worker, one for tests.

`scalars` is the pure conversion (records in, typed points out); `write_events` hands them to
torch.utils.tensorboard's SummaryWriter, which needs the optional `tensorboard` package
(`pip install paramserver[tensorboard]`). Each worker is its own TensorBoard run
(worker-0, worker-1, ...) under the same tags, so TensorBoard draws the workers of one chart
side by side: a straggler's wait, staleness or shrinking batch shows against the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

# step record field -> tag: what a user watches per worker over the worker's steps
STEP_TAGS = {"loss": "train/loss", "batch": "train/batch", "wait_s": "time/wait_s",
             "compute_s": "time/compute_s", "staleness": "train/staleness"}
# eval record field -> tag, over the samples the job had trained on
EVAL_TAGS = {"accuracy": "test/accuracy", "test_loss": "test/loss", "auc": "test/auc"}
EVAL_RUN = "eval"
BANDS_RUN = "bands"  # a simulated run's steps.npz: quantiles across workers per step bucket
BAND_TAGS = {"band_wait_s": "time/wait_s", "band_compute_s": "time/compute_s",
             "band_staleness": "train/staleness"}


class TensorBoardMissing(RuntimeError):
    """The optional tensorboard package is not installed."""


@dataclass(frozen=True)
class Scalar:
    """One point: TensorBoard run (sub-folder), tag, step, seconds since the job began."""
    run: str
    tag: str
    step: int
    t: float
    value: float


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def scalars(records: Iterable[Mapping]) -> list[Scalar]:
    """The TensorBoard points of a run's metric records (other kinds are left out)."""
    out = []
    for r in records:
        t = float(r.get("t", 0.0))
        if r.get("kind") == "step" and _number(r.get("worker")) and _number(r.get("step")):
            run = f"worker-{int(r['worker'])}"
            out += [Scalar(run, tag, int(r["step"]), t, float(r[k]))
                    for k, tag in STEP_TAGS.items() if _number(r.get(k))]
        elif r.get("kind") == "eval" and _number(r.get("samples")):
            out += [Scalar(EVAL_RUN, tag, int(r["samples"]), t, float(r[k]))
                    for k, tag in EVAL_TAGS.items() if _number(r.get(k))]
    return out


def band_scalars(arrays: Mapping) -> list[Scalar]:
    """The quantile bands of a simulated run's steps.npz (sim.core.stepstats) as points of run
    `bands`, one tag per quantile (`time/wait_s/q50`), over each bucket's first step index: a
    run of thousands of workers keeps no step lines, only these (docs/metrics.md)."""
    if "band_step" not in arrays or "quantiles" not in arrays:
        return []
    steps, times = arrays["band_step"], arrays["band_t"]
    out = []
    for key, tag in BAND_TAGS.items():
        if key not in arrays:
            continue
        for j, q in enumerate(arrays["quantiles"]):
            name = f"{tag}/q{round(float(q) * 100):02d}"
            out += [Scalar(BANDS_RUN, name, int(steps[i]), float(times[i]),
                           float(arrays[key][i, j])) for i in range(len(steps))]
    return out


def write_events(points: list[Scalar], out: str | Path, start_time: float) -> list[Path]:
    """Write `points` as event files under out/RUN/; wall times are start_time + t. Returns
    the run folders written."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TensorBoardMissing("TensorBoard event files need the tensorboard package: "
                                 "pip install 'paramserver[tensorboard]'") from None
    out = Path(out)
    writers = {}
    try:
        for p in points:
            if p.run not in writers:
                writers[p.run] = SummaryWriter(log_dir=str(out / p.run))
            writers[p.run].add_scalar(p.tag, p.value, p.step, walltime=start_time + p.t)
    finally:
        for w in writers.values():
            w.close()
    return [out / run for run in writers]
