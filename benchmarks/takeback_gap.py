"""How long an elastic job stops when its coordinator dies: a `--workers 2:4` BSP job of three
KV workers (MIN < running < MAX) whose coordinator is SIGKILLed mid-run and restarted by the
launcher (`--restart-coordinator 1`), which takes the three back.

Two figures per job: `gap_s`, from the SIGKILL to the first step recorded after it (measured
here, metrics.jsonl polled every 5 ms: the launcher noticing, the new coordinator starting,
the take-back, a round); `takeback_s`, the restarted coordinator's own time from its start
(`restart`) to its rebuild (`taken_back`, whose `by` says whether every expected worker came
back or its deadline, heartbeat_timeout, ended the wait).

`--fixed`: a fixed job of four workers instead, one of which finished (said bye) before the
SIGKILL; the take-back expects every rank but that one (it never comes back), where it used
to wait its deadline for it.

A/B against another tree (e.g. main): `--trees src,/work/main/src` runs each job in a fresh
process with that tree first on PYTHONPATH, the trees' jobs interleaved; the figures to quote
are the medians per tree.

  python benchmarks/takeback_gap.py --jobs 3 --trees src,/work/main/src
  python benchmarks/takeback_gap.py --jobs 3 --fixed --trees src,/work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KEYS = 1000
WORKERS = 3  # running, of --workers 2:4


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # (a line being written)
            continue
    return out


def _wait(cond, what: str, limit: float = 60.0, every: float = 0.005):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"no {what} within {limit:.0f} s")


def one_job(heartbeat_timeout: float, fixed: bool = False) -> dict:
    import numpy as np
    from paramserver.client.kv import KVWorker
    from paramserver.launch.local import LocalCluster

    job = {"num_keys": KEYS, "dtype": "float64", "servers": 1, "workers": 4, "min_workers": 2,
           "batch_size": 1, "sync": {"name": "bsp"}, "optimizer": {"name": "sgd", "lr": 0.01},
           "heartbeat_timeout": heartbeat_timeout}
    if fixed:  # four ranks, one of which leaves (bye) before the kill
        del job["min_workers"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        metrics, events = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
        cluster = LocalCluster(job, run_dir, job_timeout=600, keys=None, restart_coordinator=1)
        cluster.start(spawn_workers=False)
        stop = threading.Event()
        kvs, threads = [], []
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        try:
            supervisor.start()
            kvs = [KVWorker(cluster.address) for _ in range(WORKERS + fixed)]
            next(kv for kv in kvs if kv.rank == 0).init(np.zeros(KEYS))
            leaver = stop if not fixed else threading.Event()

            def work(kv) -> None:
                release = kv.start(data_len=10_000)
                gone = leaver if kv.rank == WORKERS else stop
                while not gone.is_set():
                    kv.pull(min_version=release.min_version)
                    kv.push(np.full(KEYS, 1e-3), step=release.step, batch=1)
                    release = kv.clock(release.step, batch=1, compute_time=0.001,
                                       record={"loss": 0.0})
                if gone is leaver and not stop.is_set():
                    kv.bye()  # finished, its process gone: its rank never comes back
                    kv.close()
            threads = [threading.Thread(target=work, args=(kv,), daemon=True) for kv in kvs]
            for t in threads:
                t.start()

            def steps() -> int:
                return sum(r.get("kind") == "step" for r in _lines(metrics))
            _wait(lambda: steps() >= 50 * WORKERS, "steps", limit=120)
            if fixed:
                leaver.set()
                _wait(lambda: '"worker_left"' in events.read_text(), "the leaver's bye")
                before = steps()
                _wait(lambda: steps() >= before + 10 * WORKERS, "steps without it")
            first = cluster.coordinator
            os.kill(first.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            first.proc.wait(30)
            before = steps()  # (every line of the dead one is in: it wrote line by line)
            _wait(lambda: steps() > before, "a step after the kill", limit=120)
            gap = time.monotonic() - killed
            log = _lines(events)
            restart = next(e for e in log if e["event"] == "restart")
            taken = next(e for e in log if e["event"] == "taken_back")
            return {"gap_s": round(gap, 3), "takeback_s": round(taken["t"] - restart["t"], 3),
                    "by": taken.get("by", "?"), "workers": taken["workers"]}
        finally:
            stop.set()  # each worker thread ends at its next release
            for t in threads:
                t.join(30)
            for kv in kvs:
                kv.close()
            cluster.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3, help="jobs per tree")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--fixed", action="store_true",
                   help="a fixed job of four, one finished before the kill")
    p.add_argument("--trees", default="", help="comma-separated src folders to compare")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one or not args.trees:
        print(json.dumps(one_job(args.heartbeat_timeout, args.fixed)), flush=True)
        return 0
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    results: dict[str, list[dict]] = {t: [] for t in trees}
    for j in range(args.jobs):
        for tree in (trees if j % 2 == 0 else trees[::-1]):
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, __file__, "--one", "--heartbeat-timeout",
                                  str(args.heartbeat_timeout),
                                  *(["--fixed"] if args.fixed else [])], env=env,
                                 capture_output=True, text=True, timeout=900)
            got = [json.loads(line) for line in out.stdout.splitlines()
                   if line.startswith("{")]
            if out.returncode != 0:
                print(f"{tree}: job {j} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            results[tree] += got
            print(f"{tree} job {j}: {got}", flush=True)
    shape = (f"--workers 4, {WORKERS} running (one finished)" if args.fixed
             else f"--workers 2:4, {WORKERS} running")
    print(f"\n{shape}, BSP, heartbeat_timeout {args.heartbeat_timeout:g} s; SIGKILL of the "
          f"coordinator")
    print("| tree | jobs | median gap_s | min | max | median takeback_s | by |")
    print("|---|---|---|---|---|---|---|")
    for tree, rs in results.items():
        if not rs:
            print(f"| {tree} | 0 | | | | | |")
            continue
        gaps = [r["gap_s"] for r in rs]
        took = [r["takeback_s"] for r in rs]
        print(f"| {tree} | {len(rs)} | {statistics.median(gaps):.3f} | {min(gaps):.3f} | "
              f"{max(gaps):.3f} | {statistics.median(took):.3f} | "
              f"{','.join(sorted({r['by'] for r in rs}))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
