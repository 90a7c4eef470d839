"""`paramserver demo`: a short local push/pull job that shows the runtime working end to end."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from paramserver.cli import args as flag
from paramserver.cli import catalog
from paramserver.spec.job import JobSpec, OptimizerSpec, SyncSpec, TaskSpec


def _run(args) -> int:
    from paramserver.launch.local import LaunchError, LocalCluster
    from paramserver.policies import SYNC_POLICIES
    if args.sync not in SYNC_POLICIES:
        print(f"paramserver demo: unknown sync policy {args.sync!r}; known: "
              f"{', '.join(SYNC_POLICIES.names())}", file=sys.stderr)
        return 2
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-demo-{args.sync}")
    # The demo task (constant gradients for `steps`) takes its step count as a task option.
    try:
        job = JobSpec(num_keys=args.keys, servers=args.servers, workers=args.workers,
                      batch_size=1, sync=SyncSpec(args.sync),
                      optimizer=OptimizerSpec("sgd", 1.0), eval_interval=0.0,
                      task=TaskSpec(name="demo", options={"steps": args.steps}))
    except ValueError as exc:  # e.g. fewer keys than shards
        print(f"paramserver demo: {exc}", file=sys.stderr)
        return 2
    cluster = LocalCluster(job, run_dir, job_timeout=args.timeout)
    t0 = time.perf_counter()
    try:
        cluster.run()
    except LaunchError as exc:
        print(f"paramserver demo: {exc}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    results = cluster.worker_results()
    mb = args.keys * 4 / 1e6
    print(f"demo: {args.workers} workers x {args.steps} steps, {args.servers} shards, "
          f"{args.keys} float32 keys ({mb:.1f} MB per push and per pull), sync={args.sync}")
    for r in results:
        print(f"  worker {r['rank']}: {r['steps_per_s']:7.1f} steps/s, max staleness "
              f"{r['max_staleness']}, last pulled value {r['last_value']:.0f}")
    print(f"wall time {wall:.2f} s (process start-up included); logs in {run_dir}")
    return 0 if len(results) == args.workers else 1


# The one-line help of each command here (cli.main lists them without building parsers).
SUMMARY = {"demo": "a short local push/pull job"}


def register(sub) -> None:
    p = sub.add_parser("demo", help=SUMMARY["demo"],
                       description="Start a coordinator, S shards and N workers on 127.0.0.1; each "
                                   "worker pushes a constant gradient of (rank + 1) per step with "
                                   "SGD at lr 1 and reports its throughput.")
    p.add_argument("--workers", type=flag.positive_int, default=4,
                   help="number of workers (default 4)")
    p.add_argument("--servers", type=flag.positive_int, default=2,
                   help="number of shards (default 2)")
    p.add_argument("--num-keys", dest="keys", type=flag.positive_int, default=1_000_000,
                   metavar="COUNT", help="parameter count (default 1e6), as serve's --num-keys")
    # (its first name: every other command's --keys is a folder of CURVE keys)
    p.add_argument("--keys", dest="keys", type=flag.positive_int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=flag.positive_int, default=50,
                   help="steps per worker (default 50)")
    p.add_argument("--sync", default="bsp",
                   help=f"sync policy ({catalog.listed(catalog.SYNC_POLICIES)})")
    p.add_argument("--out", type=flag.out_folder,
                   help="run folder (default runs/<time>-demo-<sync>)")
    p.add_argument("--timeout", type=flag.positive_seconds, default=300.0,
                   help="give up after this many seconds")
    p.set_defaults(func=_run)
