"""Whether a user script's worker ended the job, and what `launch` says about each rank at the
end: one decision for the local and the Ray launcher. Pure: the launchers bring the exit codes,
whether the start barrier opened, and what metrics.jsonl said about each rank."""

from __future__ import annotations

from dataclasses import dataclass

# The reason DistributedOptimizer.close() gives when its rank never stepped (client/api.py).
from paramserver.core.leaving import NO_STEP_REASON


def ends_job_before_start(code: int | None, barrier_open: bool, restartable: bool) -> bool:
    """A worker that exited while the start barrier is shut ends the job, unless a failed one
    is restarted: the barrier would wait for it until its timeout. A script that failed (a
    crash on import, a model the coordinator refused) and one that exited 0 without joining
    (it never built a DistributedOptimizer, which returns only once the barrier opens) alike.
    Once the barrier is open a dead worker is the sync policy's business."""
    if code is None or barrier_open:
        return False
    return code == 0 or not restartable


def before_start_message(rank: int, code: int) -> str:
    if code == 0:
        return (f"rank {rank} exited with code 0 before the job started, without joining it "
                f"(did the script construct paramserver.DistributedOptimizer?); the start "
                f"barrier waits for every rank")
    return (f"worker {rank} died with exit code {code} before the job started (the start "
            f"barrier waits for every worker)")


@dataclass(frozen=True)
class RankRecord:
    """What the job's metrics said about one rank: steps it clocked, why it left (if it did)."""

    steps: int = 0
    left: str | None = None


def worker_failures(exits: dict[int, int | None],
                    records: dict[int, RankRecord]) -> list[tuple[int, str]]:
    """(rank, what went wrong) per rank that failed, by rank: a non-zero exit, or an exit 0
    without a single step (a script that joined and closed, or returned, before calling
    opt.step()) unless the job had stopped before its first step (it left saying "done")."""
    out = []
    for rank in sorted(exits):
        code, seen = exits[rank], records.get(rank, RankRecord())
        if code not in (0, None):
            out.append((rank, f"rank {rank} exited with code {code}"))
        elif code == 0 and seen.steps == 0 and seen.left != "done":
            how = ("it closed its DistributedOptimizer first" if seen.left == NO_STEP_REASON
                   else "it never joined the job" if seen.left is None
                   else f"it left the job: {seen.left}")
            out.append((rank, f"rank {rank} finished without calling opt.step() once ({how})"))
    return out


def rank_records(records) -> dict[int, RankRecord]:
    """Per rank, from metrics.jsonl's records: its step count and its last `left` reason."""
    steps: dict[int, int] = {}
    left: dict[int, str] = {}
    for r in records:
        kind, worker = r.get("kind"), r.get("worker")
        if not isinstance(worker, int):
            continue
        if kind == "step":
            steps[worker] = steps.get(worker, 0) + 1
        elif kind == "left":
            left[worker] = str(r.get("reason"))
    return {w: RankRecord(steps.get(w, 0), left.get(w)) for w in set(steps) | set(left)}
