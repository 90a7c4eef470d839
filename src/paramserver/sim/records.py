"""The simulator's sink: metrics.jsonl and events.jsonl in the live run's schema (docs/metrics.md)."""

from __future__ import annotations

import json
from pathlib import Path

# One format string per step record: json.dumps per line would cost more than the engine does.
_STEP = ('{"t": %.6f, "kind": "step", "worker": %d, "step": %d, "batch": %d, '
         '"compute_s": %.6f, "wait_s": %.6f, "pull_s": %.6f, "push_s": %.6f, '
         '"pull_bytes": %d, "push_bytes": %d, "staleness": %d, "factor": %.4f')


class RunWriter:
    """Appends records to `run_dir`/metrics.jsonl and events.jsonl; close() flushes them."""

    def __init__(self, run_dir: str | Path, model_bytes: int):
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(run_dir / "metrics.jsonl", "w", buffering=1 << 20)
        self.events = open(run_dir / "events.jsonl", "w", buffering=1 << 16)
        self.nbytes = int(model_bytes)
        self.closed = False

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        line = _STEP % (t, w, step, batch, compute, wait, pull, push, self.nbytes, self.nbytes,
                        staleness, factor)
        if extra:
            line += "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items())
        self.metrics.write(line + "}\n")

    def left(self, t, w, reason):
        self.metrics.write(f'{{"t": {t:.6f}, "kind": "left", "worker": {w}, '
                           f'"reason": "{reason}"}}\n')

    def record(self, record: dict) -> None:
        """Any other metrics record (evaluations), `t` first."""
        self.metrics.write(json.dumps(record) + "\n")

    def event(self, t, kind, data):
        self.events.write(json.dumps({"t": round(t, 6), "event": kind, **data}) + "\n")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.metrics.close()
            self.events.close()

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
