"""Live view of a running job: follows metrics.jsonl and shows steps, accuracy and wait share."""

from __future__ import annotations

import json
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class MetricsTail:
    """Reads the lines appended to a metrics file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, ""
        self.samples = self.steps = 0
        self.wait = self.busy = 0.0
        self.t = 0.0  # the latest record's time: seconds of training
        self.accuracy: float | None = None
        # An elastic job's membership: workers training, whether it waits below its minimum,
        # and the changes not yet printed.
        self.workers: int | None = None
        self.waiting: str | None = None
        self.notices: list[str] = []

    def poll(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()  # an unfinished last line waits for the next poll
        for line in lines:
            if line:
                self._take(json.loads(line))

    def _take(self, r: dict) -> None:
        t = r.get("t")
        if isinstance(t, (int, float)) and t > self.t:
            self.t = t
        if r.get("kind") == "step":
            self.steps += 1
            self.samples += r.get("batch", 0)
            self.wait += r.get("wait_s", 0.0)
            self.busy += (r.get("wait_s", 0.0) + r.get("compute_s", 0.0) + r.get("pull_s", 0.0)
                          + r.get("push_s", 0.0))
        elif r.get("kind") == "eval":
            self.accuracy = r["accuracy"]
        elif r.get("kind") == "membership":
            self._membership(r)

    def _membership(self, r: dict) -> None:
        change, n = r.get("change"), r.get("workers")
        self.workers = n
        if change == "joined":
            self.notices.append(f"worker {r.get('worker')} joined: {n} training")
        elif change == "waiting":
            self.waiting = (f"WAITING for workers: {n} training, fewer than the minimum "
                            f"{r.get('min_workers')}")
            self.notices.append(f"{self.waiting} (start one: PARAMSERVER_KEYS=RUN/keys "
                                f"paramserver worker --join $(cat RUN/coordinator.addr))")
        elif change == "back":
            self.waiting = None
            self.notices.append(f"training again with {n} workers")

    def describe(self) -> str:
        acc = "-" if self.accuracy is None else f"{self.accuracy:.3f}"
        share = self.wait / self.busy if self.busy else 0.0
        text = f"steps {self.steps:6d}  test acc {acc}  wait {share:5.1%}"
        if self.waiting is not None:
            return f"{text}  {self.waiting}"
        return text if self.workers is None else f"{text}  workers {self.workers}"


class JobProgress:
    """A rich progress bar over the job's sample budget; silent when `quiet`."""

    def __init__(self, metrics_path: Path, total_samples: int, label: str, quiet: bool = False):
        self.tail = MetricsTail(metrics_path)
        self.quiet = quiet
        self.progress = None if quiet else Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), transient=False)
        self.total = total_samples
        self.label = label
        self.task = None

    def __enter__(self):
        if self.progress is not None:
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=self.total, info="starting")
        return self

    def tick(self) -> None:
        if self.progress is None:
            return
        self.tail.poll()
        for notice in self.tail.notices:
            self.progress.console.print(f"[bold]{notice}")
        self.tail.notices.clear()
        self.progress.update(self.task, completed=self.tail.samples if self.total is None
                             else min(self.tail.samples, self.total),
                             info=self.tail.describe())

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.tick()
            self.progress.stop()
