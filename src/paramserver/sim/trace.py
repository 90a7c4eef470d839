"""Recorded compute times for replay: a run's metrics.jsonl (or its folder) or a CSV worker,compute_s."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


class TraceError(ValueError):
    """A trace that cannot be replayed (unreadable, empty, or with bad numbers)."""


def _check(worker, compute_s, batch, where: str) -> tuple[int, float, int]:
    try:
        w, c, b = int(worker), float(compute_s), int(batch)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: expected numbers worker, compute_s, batch") from None
    if w < 0 or b < 1 or not (math.isfinite(c) and c >= 0):
        raise TraceError(f"{where}: need worker >= 0, batch >= 1 and a finite compute_s >= 0")
    return w, c, b


def _from_metrics(path: Path) -> dict[int, list[tuple[int, float, int]]]:
    rows: dict[int, list[tuple[int, float, int]]] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a crashed run, as metrics.read_records does
            if r.get("kind") != "step" or "compute_s" not in r:
                continue
            w, c, b = _check(r.get("worker"), r["compute_s"], r.get("batch", 1), f"{path}:{n}")
            rows.setdefault(w, []).append((int(r.get("step", len(rows.get(w, ())))), c, b))
    return rows


def _from_csv(path: Path) -> dict[int, list[tuple[int, float, int]]]:
    rows: dict[int, list[tuple[int, float, int]]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"worker", "compute_s"} - set(reader.fieldnames or ())
        if missing:
            raise TraceError(f"{path}: CSV header needs worker,compute_s[,step][,batch]; "
                             f"missing {', '.join(sorted(missing))}")
        for row in reader:
            w, c, b = _check(row["worker"], row["compute_s"], row.get("batch") or 1,
                             f"{path}:{reader.line_num}")
            step = row.get("step")
            rows.setdefault(w, []).append((int(step) if step else len(rows.get(w, ())), c, b))
    return rows


def load_trace(source: str | Path) -> list[list[tuple[float, int]]]:
    """Per recorded worker (in rank order), its steps' (compute_s, batch) in step order.

    Accepts a metrics.jsonl, a run folder holding one, or a CSV with columns worker,compute_s
    and optional step and batch (batch 1 when absent).
    """
    path = Path(source)
    if path.is_dir():
        path = path / "metrics.jsonl"
    try:
        rows = _from_csv(path) if path.suffix.lower() == ".csv" else _from_metrics(path)
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
    if not rows:
        raise TraceError(f"trace {str(source)!r} has no step records with compute_s")
    # Records arrive in clock order; the stable sort by step restores each worker's own order.
    return [[(c, b) for _, c, b in sorted(rows[w], key=lambda r: r[0])] for w in sorted(rows)]


def _step_records(path: Path) -> dict[int, list[dict]]:
    """A run's step records per worker, in step order."""
    rows: dict[int, list[dict]] = {}
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("kind") == "step":
                rows.setdefault(int(r["worker"]), []).append(r)
    for seq in rows.values():
        seq.sort(key=lambda r: r["step"])
    return rows


class CommReplay:
    """A live run's communication and unrecorded worker time, replayed per worker and step.

    pull(w, s) and push(w, s) are the pull_s and push_s worker w recorded at step s. A live
    step also spends time no field records (the sleep's overshoot, the host-load reading and
    the record's bookkeeping before the clock); overhead(w, s) is that residue, recovered from
    the coordinator's stamps: (t_s - t_{s-1}) - (wait + pull + compute + push of step s), the
    clock's latency cancelling between consecutive steps (for step 0: t_0 - pull - compute -
    push - the round trip). start_wait(w): the part of step 0's wait_s spent before the start
    barrier opened (t < 0), so the replayed step 0 waits as long as the live one did.

    Coordinator messages take `release_latency` (release -> worker) and `clock_latency`
    (clock -> coordinator). Worker w replays recorded worker w mod n; steps past the end of
    its record take the worker's mean. residual=False drops the overheads, start_waits=False
    the pre-barrier waits (both to measure what they contribute).
    """

    def __init__(self, source: str | Path, release_latency: float = 0.0,
                 clock_latency: float = 0.0, residual: bool = True, start_waits: bool = True):
        path = Path(source)
        if path.is_dir():
            path = path / "metrics.jsonl"
        try:
            rows = _step_records(path)
        except OSError as exc:
            raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from None
        if not rows:
            raise TraceError(f"trace {str(source)!r} has no step records")
        missing = [k for k in ("pull_s", "push_s", "wait_s", "compute_s", "t")
                   if any(k not in r for seq in rows.values() for r in seq)]
        if missing:
            raise TraceError(f"trace {str(source)!r}: step records lack {', '.join(missing)}")
        self.release_latency, self.clock_latency = float(release_latency), float(clock_latency)
        rt = self.release_latency + self.clock_latency
        self.pulls, self.pushes, self.overheads, self.reals, self.waits0 = [], [], [], [], []
        for w in sorted(rows):
            seq = rows[w]
            self.pulls.append([float(r["pull_s"]) for r in seq])
            self.pushes.append([float(r["push_s"]) for r in seq])
            self.reals.append([r.get("real_compute_s") for r in seq])
            first = seq[0]
            over = [first["t"] - first["pull_s"] - first["compute_s"] - first["push_s"] - rt]
            over += [(b["t"] - a["t"]) - (b["wait_s"] + b["pull_s"] + b["compute_s"] + b["push_s"])
                     for a, b in zip(seq, seq[1:])]
            self.overheads.append(over if residual else [0.0] * len(seq))
            self.waits0.append(max(0.0, first["wait_s"] - self.release_latency)
                               if start_waits and first["step"] == 0 else 0.0)
        self.n = len(self.pulls)
        self.means = [tuple(sum(x) / len(x) for x in (p, q, o))
                      for p, q, o in zip(self.pulls, self.pushes, self.overheads)]

    def _get(self, table: list[list[float]], k: int, w: int, s: int) -> float:
        seq = table[w % self.n]
        return seq[s] if s < len(seq) else self.means[w % self.n][k]

    def pull(self, w: int, s: int) -> float:
        return self._get(self.pulls, 0, w, s)

    def push(self, w: int, s: int) -> float:
        return self._get(self.pushes, 1, w, s)

    def overhead(self, w: int, s: int) -> float:
        return self._get(self.overheads, 2, w, s)

    def real(self, w: int, s: int) -> float | None:
        seq = self.reals[w % self.n]
        return seq[s] if s < len(seq) else None

    def start_wait(self, w: int) -> float:
        return self.waits0[w] if w < self.n else 0.0
