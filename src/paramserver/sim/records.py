"""The simulator's sink: the run folder's logs in the live run's schema (docs/metrics.md).

Every step record goes into typed columns (sim.core.stepstats), written as steps.npz at the
end; with `detail` it is also a metrics.jsonl line, as a live run writes it. Without detail
metrics.jsonl holds the other records only (workers leaving, evaluations): a large
simulation's folder stays small and its summary and report come from the columns instead of a re-read log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paramserver.sim.core.stepstats import StepColumns, step_stats

# One format string per step record: json.dumps per line would cost more than the engine does.
_STEP = ('{"t": %.6f, "kind": "step", "worker": %d, "step": %d, "batch": %d, '
         '"compute_s": %.6f, "wait_s": %.6f, "pull_s": %.6f, "push_s": %.6f, '
         '"pull_bytes": %d, "push_bytes": %d, "staleness": %d, "factor": %.4f')
STATS_FILE = "steps.npz"


class RunWriter:
    """Appends records to `run_dir`/metrics.jsonl and events.jsonl; close() flushes them and
    writes steps.npz. detail=False: step records only into the columns, not metrics.jsonl."""

    def __init__(self, run_dir: str | Path, model_bytes: int, detail: bool = True):
        self.run_dir = run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(run_dir / "metrics.jsonl", "w", buffering=1 << 20)
        self.events = open(run_dir / "events.jsonl", "w", buffering=1 << 16)
        self.nbytes = int(model_bytes)
        self.detail = detail
        self.columns = StepColumns()
        self._extend = self.columns.extend
        if not detail:  # the common large-run case: one call, no branch
            self.step = self._step_columns
        self.evals: list[dict] = []  # what summarize needs besides the steps
        self.last_t = 0.0  # of the records that are not steps
        self.stats: dict | None = None  # step_stats, once closed
        self.closed = False

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        self._step_columns(t, w, step, batch, compute, wait, pull, push, staleness, factor, extra)
        line = _STEP % (t, w, step, batch, compute, wait, pull, push, self.nbytes,
                        self.nbytes, staleness, factor)
        if extra:
            line += "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items())
        self.metrics.write(line + "}\n")

    def _step_columns(self, t, w, step, batch, compute, wait, pull, push, staleness, factor,
                      extra):
        self._extend((t, w, step, batch, compute, wait, pull, push, staleness))
        if extra and "real_compute_s" in extra:
            real = self.columns.real
            real[w] = real.get(w, 0.0) + extra["real_compute_s"]

    def left(self, t, w, reason):
        self.last_t = max(self.last_t, t)
        self.metrics.write(f'{{"t": {t:.6f}, "kind": "left", "worker": {w}, '
                           f'"reason": "{reason}"}}\n')

    def record(self, record: dict) -> None:
        """Any other metrics record (evaluations), `t` first."""
        self.last_t = max(self.last_t, float(record.get("t", 0.0)))
        if record.get("kind") == "eval":
            self.evals.append(record)
        self.metrics.write(json.dumps(record) + "\n")

    def event(self, t, kind, data):
        self.events.write(json.dumps({"t": round(t, 6), "event": kind, **data}) + "\n")

    @property
    def wall(self) -> float:
        """The largest t of all records, as summarize takes it (lines keep 6 decimals)."""
        return max(self.last_t, float(self.stats["train_time"]) if self.stats else 0.0)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.metrics.close()
            self.events.close()
            self.stats = step_stats(self.columns, self.nbytes)
            self.columns = self._extend = None  # the arrays are the largest thing a run holds
            np.savez(self.run_dir / STATS_FILE, **self.stats)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
