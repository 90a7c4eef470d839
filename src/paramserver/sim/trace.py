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
        raise TraceError(f"cannot read trace {str(source)!r}: {exc.strerror or exc}") from None
    if not rows:
        raise TraceError(f"trace {str(source)!r} has no step records with compute_s")
    # Records arrive in clock order; the stable sort by step restores each worker's own order.
    return [[(c, b) for _, c, b in sorted(rows[w], key=lambda r: r[0])] for w in sorted(rows)]
