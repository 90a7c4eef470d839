"""Interleaved A/B of paramserver's BSP rounds per second: two source trees, or job settings.

Runs `bsp_rounds.py`'s paramserver job (4 workers, 1 shard, digits MLP, batch 32) alternately
with tree A and tree B (each a `src` folder put first on the children's PYTHONPATH, such as a
`git worktree` of another commit), and reports both medians and the median of the pair ratios
B/A. A pair runs back to back, so a slow spell of this shared machine weighs on both of its
sides, and the side that runs first alternates from pair to pair; single runs here swing by
about 15%, so a 5% effect needs tens of pairs.

  python benchmarks/bsp_ab.py --a /tmp/wt-old/src --b src --pairs 10 --rounds 300
  python benchmarks/bsp_ab.py --b-task '{"borrow": false}' --pairs 6    # one tree, two settings

`--a-task`/`--b-task` update the job's task (the worker's settings), `--a-job`/`--b-job` the
job itself (JSON objects).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bsp_rounds import paramserver_job, rounds_per_second

HERE = Path(__file__).resolve().parent.parent / "src"


def run(src: str, task: dict, job_extra: dict, workers: int, rounds: int) -> float:
    job = paramserver_job(workers, rounds)
    job["task"].update(task)
    job.update(job_extra)
    return rounds_per_second(job, dict(os.environ, PYTHONPATH=str(src)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default=str(HERE), help="src folder of tree A (default: this one)")
    parser.add_argument("--b", default=str(HERE), help="src folder of tree B (default: this one)")
    for side in ("a", "b"):
        parser.add_argument(f"--{side}-task", type=json.loads, default={},
                            help=f"JSON object merged into the job's task for {side.upper()}")
        parser.add_argument(f"--{side}-job", type=json.loads, default={},
                            help=f"JSON object merged into the job for {side.upper()}")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    a, b = [], []
    for i in range(args.pairs):
        # Alternate which side runs first: the second run of a pair is ~1% slower on its own
        # here (an A/A of 10 pairs gave 0.988), which would otherwise count against B.
        sides = [("a", args.a, args.a_task, args.a_job), ("b", args.b, args.b_task, args.b_job)]
        for side, src, task, job in sides if i % 2 == 0 else sides[::-1]:
            (a if side == "a" else b).append(run(src, task, job, args.workers, args.rounds))
        print(f"pair {i}: A {a[-1]:.1f}  B {b[-1]:.1f} rounds/s  B/A {b[-1] / a[-1]:.3f}",
              flush=True)
    ratios = [y / x for x, y in zip(a, b)]
    print(f"median A {statistics.median(a):.1f}, B {statistics.median(b):.1f} rounds/s; "
          f"median pair ratio B/A {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}, {args.pairs} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
