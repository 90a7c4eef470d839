"""Run summaries from metrics records: one pure function shared by live runs and the simulator."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

from paramserver.spec.run_job import RunJob

DEFAULT_TARGETS = (0.8, 0.9, 0.95, 0.97, 0.98)
AUC_TARGETS = (0.6, 0.65, 0.7, 0.72, 0.75)  # click models (DLRM): chance is 0.5
# The busiest shard's busy time over the shards' mean above which a run's shards are called
# unbalanced (`paramserver train` says so).
UNBALANCED = 1.5


def read_records(path: str | Path) -> list[dict]:
    """All JSON lines of a metrics file; a torn last line (a crash mid-write) is skipped."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def drop_after(path: str | Path, t: float) -> int:
    """Rewrite metrics file `path` without its records timed after `t` s of training (and
    torn lines); returns how many were dropped. A resume continues from a checkpoint taken at
    `t`: the records after it are of work the checkpoint does not hold (a job killed later
    than its last checkpoint), which the resumed job trains again and records anew; kept,
    they would be counted twice (steps, samples, evaluations, each worker's steps)."""
    path = Path(path)
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        at = record.get("t") if isinstance(record, dict) else None
        # (a record's t is rounded to the microsecond: one of the checkpoint's own moment
        # may read up to half of one later)
        if isinstance(at, (int, float)) and not isinstance(at, bool) and at > t + 1e-6:
            continue
        kept.append(line if line.endswith(b"\n") else line + b"\n")
    dropped = len(lines) - len(kept)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return dropped


def tail_records(path: str | Path, tail: int = 1 << 16) -> list[dict]:
    """The whole JSON-object lines in the last `tail` bytes of a JSON-lines file (the first,
    cut by the seek, and a torn last one are skipped); [] when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def last_steps(path: str | Path, tail: int = 1 << 16) -> dict[int, int]:
    """Each worker's newest step record in the last `tail` bytes of metrics file `path`:
    {worker: step}. A coordinator restarted in place of a dead one gets the clock a worker
    held unanswered again; when the dead one had written its record already, that record is
    this one and is not written twice."""
    out: dict[int, int] = {}
    for r in tail_records(path, tail):
        if r.get("kind") == "step" and isinstance(r.get("worker"), int) \
                and isinstance(r.get("step"), int):
            out[r["worker"]] = max(r["step"], out.get(r["worker"], r["step"]))
    return out


# A user script's own test metric sent with `kv.report({...})` (no `kind`) counts as an
# evaluation under these names; DistributedOptimizer.report() sends the `kind: eval` form.
REPORTED_TEST_KEYS = ("test_accuracy", "test_acc")


def evaluations(records: list[dict]) -> list[dict]:
    """The run's evaluation records sorted by time: the evaluator's (`kind: eval`), and a
    script's reported test metric (a record without a kind carrying a REPORTED_TEST_KEYS
    number) as {"kind": "eval", "accuracy": value, ...}."""
    out = []
    for r in records:
        if r.get("kind") == "eval":
            out.append(r)
        elif r.get("kind") is None:
            key = next((k for k in REPORTED_TEST_KEYS if isinstance(r.get(k), (int, float))
                        and not isinstance(r.get(k), bool)), None)
            if key is not None and "t" in r:
                out.append({**r, "kind": "eval", "accuracy": float(r[key])})
    return sorted(out, key=lambda r: r["t"])


def _per_worker(steps: list[dict]) -> dict[int, dict]:
    acc: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for r in steps:
        w = acc[r["worker"]]
        w["steps"] += 1
        w["samples"] += r.get("batch", 0)
        for key in ("compute_s", "real_compute_s", "wait_s", "pull_s", "push_s", "staleness",
                    "push_bytes", "pull_bytes"):
            w[key] += r.get(key, 0) or 0
    out = {}
    for worker, w in sorted(acc.items()):
        busy = w["compute_s"] + w["wait_s"] + w["pull_s"] + w["push_s"]
        out[worker] = {"steps": int(w["steps"]), "samples": int(w["samples"]),
                       "compute_s": w["compute_s"], "wait_s": w["wait_s"],
                       "comm_s": w["pull_s"] + w["push_s"],
                       "wait_fraction": w["wait_s"] / busy if busy else 0.0,
                       "mean_staleness": w["staleness"] / w["steps"],
                       "bytes": int(w["push_bytes"] + w["pull_bytes"])}
    return out


def time_to_accuracy(evals: list[dict], targets=DEFAULT_TARGETS) -> dict[str, float | None]:
    """Seconds until the test accuracy first reached each target; None where it never did."""
    out = {}
    for target in targets:
        hit = next((e["t"] for e in evals if e["accuracy"] >= target), None)
        out[f"{target:g}"] = None if hit is None else round(hit, 4)
    return out


def time_to_auc(evals: list[dict], targets=AUC_TARGETS) -> dict[str, float | None]:
    """Seconds until the test AUC first reached each target; {} when no evaluation scored AUC
    (a model without a click score)."""
    scored = [e for e in evals if e.get("auc") is not None]
    if not scored:
        return {}
    return {f"{t:g}": next((round(e["t"], 4) for e in scored if e["auc"] >= t), None)
            for t in targets}


def diverged_at(evals: list[dict]) -> float | None:
    """When the test loss first stopped being a finite number (the model diverged: its
    accuracy from then on is chance), or None."""
    hit = next((e["t"] for e in evals if isinstance(e.get("test_loss"), float)
                and not math.isfinite(e["test_loss"])), None)
    return None if hit is None else round(hit, 4)


def summarize(records: list[dict], job: dict, targets=DEFAULT_TARGETS) -> dict:
    """The summary.json of one run, from its metrics records and job description."""
    steps = [r for r in records if r.get("kind") == "step"]
    evals = evaluations(records)
    workers = _per_worker(steps)
    run = RunJob.of(job)
    compute = sum(r.get("compute_s", 0) for r in steps)
    real = sum(r.get("real_compute_s", 0) for r in steps)
    wall = max((r["t"] for r in records), default=0.0)
    apply_mode = run.apply_mode
    rounds = max((r["step"] for r in steps), default=-1) + 1
    return {
        "sync": run.sync, "workers": run.workers, "servers": run.servers,
        "model": run.task.model, "dataset": run.task.dataset, "optimizer": run.optimizer,
        "lr": run.lr, "batch_size": run.batch_size, "straggler": run.task.straggler,
        "device_time": run.task.device_time,
        "steps": len(steps), "samples": sum(r.get("batch", 0) for r in steps),
        "wall_time_s": round(wall, 4),
        "final_test_accuracy": evals[-1]["accuracy"] if evals else None,
        "best_test_accuracy": max((e["accuracy"] for e in evals), default=None),
        "time_to_accuracy": time_to_accuracy(evals, targets),
        "final_test_auc": evals[-1].get("auc") if evals else None,
        "best_test_auc": max((e["auc"] for e in evals if e.get("auc") is not None),
                             default=None),
        "time_to_auc": time_to_auc(evals),
        "diverged_at_s": diverged_at(evals),
        "mean_wait_fraction": (sum(w["wait_fraction"] for w in workers.values()) / len(workers)
                               if workers else 0.0),
        "updates_applied": rounds if apply_mode == "round" else len(steps),
        "mean_staleness": (sum(r.get("staleness", 0) for r in steps) / len(steps)
                           if steps else 0.0),
        "real_compute_share": real / compute if compute else None,
        "steps_per_s": len(steps) / wall if wall else 0.0,
        "push_bytes_per_step": (sum(r.get("push_bytes", 0) or 0 for r in steps) / len(steps)
                                if steps else 0.0),
        "pull_bytes_per_step": (sum(r.get("pull_bytes", 0) or 0 for r in steps) / len(steps)
                                if steps else 0.0),
        **codecs_used(steps),
        **bytes_saved(steps),
        "per_worker": {str(k): v for k, v in workers.items()},
        **_restarts(records),
        **_server_counters(records),
        **shard_load(records, run.servers or 0, wall),
    }


def codecs_used(steps: list[dict]) -> dict:
    """The value formats the steps' bytes were in (their `push_codec`/`pull_codec`), each list
    sorted and without repeats; more than one where workers chose differently (`--compress
    auto`); empty where no step named one (older and simulated runs: dense)."""
    return {f"{way}_codecs": sorted({str(r[f"{way}_codec"]) for r in steps
                                     if r.get(f"{way}_codec") is not None})
            for way in ("push", "pull")}


def bytes_saved(steps: list[dict]) -> dict:
    """Bytes per step the push and pull formats saved against float32 (the steps'
    `push_saved_bytes`/`pull_saved_bytes`, over the steps that carry them: a worker with a
    codec or a pruner); {} where none does (dense runs)."""
    out = {}
    for way in ("push", "pull"):
        got = [r[f"{way}_saved_bytes"] for r in steps if r.get(f"{way}_saved_bytes") is not None]
        if got:
            out[f"{way}_saved_bytes_per_step"] = sum(got) / len(got)
    return out


def _restarts(records: list[dict]) -> dict:
    """Servers restarted from a checkpoint, and the updates their shards lost doing so."""
    restarts = [r for r in records if r.get("kind") == "restart" and r.get("role") == "server"]
    return {"server_restarts": len(restarts),
            "lost_updates": sum(int(r.get("lost_updates", 0)) for r in restarts),
            # replicated shards: backups that took over (no checkpoint restore, nothing lost)
            "replica_promotions": sum(1 for r in records if r.get("kind") == "promotion"),
            # coordinators restarted in place of a dead one (--restart-coordinator)
            "coordinator_restarts": sum(1 for r in records if r.get("kind") == "takeback"),
            # workers declared dead (silent past the heartbeat timeout, or their process
            # gone); a replacement (--restart-workers) is a new member, not counted here
            "workers_died": sum(1 for r in records
                                if r.get("kind") == "left" and r.get("reason") == "dead")}


def shard_load(records: list[dict], servers: int, wall: float) -> dict:
    """Each shard's busy seconds (handling messages, as its last heartbeat said), that as a
    share of the run's wall time, and the imbalance: the busiest shard's busy time over the
    shards' mean (1.0: even; None: no shard measured any). A shard that never reported counts
    as idle."""
    busy: dict[int, float] = {}
    for r in records:
        if r.get("kind") == "server" and "busy_s" in r:
            busy[int(r.get("server", 0))] = float(r["busy_s"])
    if not busy:
        return {"per_shard": {}, "shard_imbalance": None}
    for rank in range(servers):
        busy.setdefault(rank, 0.0)
    mean = sum(busy.values()) / len(busy)
    per_shard = {str(rank): {"busy_s": round(b, 4),
                             "busy_fraction": round(min(b / wall, 1.0), 4) if wall else None}
                 for rank, b in sorted(busy.items())}
    return {"per_shard": per_shard,
            "shard_imbalance": round(max(busy.values()) / mean, 4) if mean else None}


def _server_counters(records: list[dict]) -> dict:
    """Pushes the shards dropped as late, retried pushes they answered without applying,
    retries they refused as too old to prove fresh, pushes refused beyond a sender's
    unacknowledged depth and pulls beyond a client's waiting allowance, as each server's last
    report said (summed over servers)."""
    last: dict[int, dict] = {}
    for r in records:
        if r.get("kind") == "server":
            last[r.get("server", 0)] = r
    return {"late_pushes": sum(int(r.get("late_pushes", 0)) for r in last.values()),
            "duplicate_pushes": sum(int(r.get("duplicates", 0)) for r in last.values()),
            "refused_retries": sum(int(r.get("refused_retries", 0)) for r in last.values()),
            "refused_pushes": sum(int(r.get("refused_pushes", 0)) for r in last.values()),
            "refused_pulls": sum(int(r.get("refused_pulls", 0)) for r in last.values())}
