"""summary.json of a simulated run through metrics.summarize, in worker groups when the log is huge."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from paramserver.runlog.metrics import read_records as _read, summarize
from paramserver.spec.run_job import RunJob

# summarize() holds every record as a dict (~1.5 KB each); past this many step records the
# log is split by worker group in one pass, each group summarized alone and the parts merged.
MAX_RECORDS_IN_MEMORY = 250_000
_WORKER = re.compile(r'"worker": (\d+)')


def _split(path: Path, folder: Path, per_group: int, groups: int) -> list[Path]:
    """Copy each line into its worker group's file; worker-less lines (evals) into all of them."""
    paths = [folder / f"group-{g}.jsonl" for g in range(groups)]
    files = [open(p, "w") for p in paths]
    try:
        with open(path) as f:
            for line in f:
                m = _WORKER.search(line)
                for out in files if m is None else (files[int(m[1]) // per_group],):
                    out.write(line)
    finally:
        for out in files:
            out.close()
    return paths


def summarize_run(metrics_path: str | Path, job: dict, workers: int, steps: int,
                  max_records: int = MAX_RECORDS_IN_MEMORY) -> dict:
    """summarize() of the whole log; `workers` x `steps` bounds the step records to expect."""
    path = Path(metrics_path)
    if workers * steps <= max_records:
        return summarize(_read(path), job)
    per_group = max(1, max_records // steps)
    parts, wall = [], 0.0
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        for group in _split(path, Path(tmp), per_group, -(-workers // per_group)):
            records = _read(group)
            wall = max([wall] + [r["t"] for r in records])
            parts.append(summarize(records, job))
            del records
    return merge(parts, job, wall)


def merge(parts: list[dict], job: dict, wall: float) -> dict:
    """One summary from summaries of disjoint worker groups that saw the same evaluations.

    `wall` is the largest `t` of all records (the parts only keep it rounded).
    """
    out = dict(parts[0])
    per_worker = {}
    for p in parts:
        per_worker.update(p["per_worker"])
    steps = sum(p["steps"] for p in parts)
    compute = sum(w["compute_s"] for w in per_worker.values())
    real = sum((p["real_compute_share"] or 0)
               * sum(w["compute_s"] for w in p["per_worker"].values()) for p in parts)
    ordered = sorted(per_worker.items(), key=lambda kv: int(kv[0]))
    out.update(
        steps=steps, samples=sum(p["samples"] for p in parts), wall_time_s=round(wall, 4),
        mean_wait_fraction=(sum(w["wait_fraction"] for _, w in ordered) / len(ordered)
                            if ordered else 0.0),
        updates_applied=(max(p["updates_applied"] for p in parts)
                         if RunJob.of(job).apply_mode == "round" else steps),
        mean_staleness=(sum(p["mean_staleness"] * p["steps"] for p in parts) / steps
                        if steps else 0.0),
        real_compute_share=real / compute if compute else None,
        steps_per_s=steps / wall if wall else 0.0,
        per_worker=dict(ordered))
    return out
