"""The job progress line `paramserver launch` shows below the workers' prefixed output.

`summarize` turns the coordinator's step records into one line; `ProgressLine` follows
metrics.jsonl as it grows and shows that line: on a terminal redrawn in place (only when it
changed, at most every `interval` s, and cleared before a worker's line is printed so the two
never mix), elsewhere (a pipe, a CI log) as a plain line every `plain_interval` s."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

# Keys of a test metric a script reports (with its step, or kv.report()), shown on the line.
METRIC_KEYS = ("test_accuracy", "test_acc", "accuracy", "acc", "metric")


def metric_of(record: dict) -> tuple[str, float] | None:
    """The test metric a record carries (a step's, or one the script sent with report())."""
    for key in METRIC_KEYS:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key, float(value)
    return None


def summarize(steps: list[dict], window: float = 10.0,
              metric: tuple[str, float] | None = None) -> str:
    """One line from step records (`t`, `batch`, `wait_s`, optional loss and metric): steps,
    samples/s over the last `window` s of job time, the latest loss and test metric (a step's,
    else `metric`, the latest reported apart), and the share of the workers' step time spent
    waiting for the policy."""
    if not steps:
        return "job: waiting for the first step"
    t_end = max(r.get("t", 0.0) for r in steps)
    recent = [r for r in steps if r.get("t", 0.0) >= t_end - window]
    span = t_end - min(r.get("t", 0.0) for r in recent)
    rate = sum(r.get("batch", 0) for r in recent) / span if span > 0 else 0.0
    parts = [f"steps {len(steps)}", f"{rate:,.0f} samples/s"]
    last = steps[-1]
    if "loss" in last:
        parts.append(f"loss {last['loss']:.4g}")
    found = next((m for r in reversed(steps) if (m := metric_of(r)) is not None), metric)
    if found is not None:
        parts.append(f"{found[0]} {found[1]:.4g}")
    waits = [r["wait_s"] for r in recent if isinstance(r.get("wait_s"), (int, float))]
    if waits and span > 0:
        workers = len({r.get("worker") for r in recent}) or 1
        parts.append(f"wait {min(1.0, sum(waits) / (span * workers)):.0%}")
    return "job: " + " | ".join(parts)


class ProgressLine:
    """Follows a metrics file and shows its summary on `stream`, under the lock the worker
    output pump holds for each of its lines (`wrap` them with `before_line`/`after_line`)."""

    def __init__(self, metrics: Path, stream, lock: threading.Lock, interval: float = 0.5,
                 plain_interval: float = 10.0):
        self.metrics, self.stream, self.lock = metrics, stream, lock
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else plain_interval
        self.steps: list[dict] = []
        self.metric: tuple[str, float] | None = None
        self.waiting: str | None = None  # an elastic job below its minimum of workers
        self._offset = 0
        self._shown = ""
        self._drawn = False  # a line sits on the terminal's last row
        self._last = 0.0

    def _read(self) -> None:
        try:
            with open(self.metrics, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a torn last line waits for the next read
        self._offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "step":
                self.steps.append(record)
            elif record.get("kind") == "membership":
                self.waiting = None if record.get("change") != "waiting" else (
                    f"WAITING for workers: {record.get('workers')} training, fewer than the "
                    f"minimum {record.get('min_workers')}")
            elif metric_of(record) is not None:  # kv.report({"test_accuracy": ...})
                self.metric = metric_of(record)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self._read()
        text = summarize(self.steps, metric=self.metric)
        if self.waiting is not None:
            text = f"{text} | {self.waiting}"
        if text == self._shown and (self.tty or not self.steps):
            return
        with self.lock:
            self._draw(text)

    def _draw(self, text: str) -> None:
        self._shown = text
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Before a worker's line (the caller holds the lock): the line goes, to come back."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self._drawn = False

    def redraw(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\x1b[K" + self._shown)
            self._drawn = True
            self.stream.flush()

    def close(self) -> None:
        """The final summary, on a line of its own."""
        self._last = 0.0
        self._read()
        with self.lock:
            self.clear()
            if self.steps:
                self.stream.write(summarize(self.steps, metric=self.metric) + "\n")
                self.stream.flush()
