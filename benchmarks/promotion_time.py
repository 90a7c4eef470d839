"""How long a replicated shard (`--replicas 2`) runs without a primary: seconds from the
SIGKILL of shard 1's primary to the coordinator's `replica_promoted` event, while KV workers
push (ASP).

Each job kills the primary `--kills` times (the launcher rebuilds a backup after each
promotion; the next kill waits for it). The time is measured here, from the kill to the
event's line appearing in RUN/events.jsonl (polled every 5 ms), and the event's own
`silent_s` (the primary's silence when it was promoted) and `after` (`link_down`: its backup
saw its connection drop; `silence`: the heartbeat timeout) are kept beside it.

A/B against another tree (e.g. main): `--trees src,/work/main/src` runs each job in a fresh
process with that tree first on PYTHONPATH, the trees' jobs interleaved; the figures to quote
are the medians per tree.

  python benchmarks/promotion_time.py --jobs 3 --kills 3 --trees src,/work/main/src

(PROMOTION_RUN_DIR=DIR keeps a single job's run folder there, logs included.)
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


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(cond, what: str, limit: float = 60.0, every: float = 0.005):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"no {what} within {limit:.0f} s")


def one_job(kills: int, heartbeat_timeout: float) -> list[dict]:
    """One replicated job; a record per kill of shard 1's primary."""
    import numpy as np
    from paramserver.client.kv import KVWorker
    from paramserver.launch.local import LocalCluster

    job = {"num_keys": KEYS, "dtype": "float64", "servers": 2, "workers": 2, "batch_size": 1,
           "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0}, "replicas": 2,
           "heartbeat_timeout": heartbeat_timeout}
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(os.environ.get("PROMOTION_RUN_DIR") or Path(tmp) / "run")
        cluster = LocalCluster(job, run_dir, job_timeout=600, keys=None)
        cluster.start(spawn_workers=False)
        stop = threading.Event()
        kvs, threads = [], []
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        try:
            supervisor.start()
            kvs = [KVWorker(cluster.address) for _ in range(2)]
            kvs[0].init(np.zeros(KEYS))
            starts = [threading.Thread(target=kv.start) for kv in kvs]
            for t in starts:
                t.start()
            for t in starts:
                t.join(120)
            pushed = [0, 0]

            def push(i: int, kv) -> None:
                step = 0
                while not stop.is_set():
                    kv.push(np.ones(KEYS), step=step, batch=1)
                    pushed[i] += 1
                    step += 1
            threads = [threading.Thread(target=push, args=(i, kv), daemon=True)
                       for i, kv in enumerate(kvs)]
            for t in threads:
                t.start()
            for k in range(kills):
                _wait(lambda: sum(e["event"] in ("backup_synced", "backup_rebuilt")
                                  and e["rank"] == 1 for e in _events(run_dir)) >= k + 1,
                      "synced backup of shard 1")
                before = sum(pushed)
                _wait(lambda: sum(pushed) >= before + 50, "pushes")
                events = _events(run_dir)
                primary = [e["addr"] for e in events
                           if e["event"] in ("server_joined", "replica_promoted")
                           and e["rank"] == 1][-1]
                promoted = sum(e["event"] == "replica_promoted" for e in events)
                victim = cluster.server_listening_at(primary)
                os.kill(victim.proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                event = _wait(lambda: ([e for e in _events(run_dir)
                                        if e["event"] == "replica_promoted"][promoted:]
                                       or [None])[0], "promotion")
                took = time.monotonic() - killed
                records.append({"promotion_s": round(took, 3),
                                "silent_s": event.get("silent_s"),
                                "after": event.get("after", "silence"), "kill": k})
            stop.set()
            for t in threads:
                t.join(30)
        except Exception:
            for e in _events(run_dir):
                if e["event"] not in ("apply_round",):
                    print(json.dumps(e), file=sys.stderr)
            raise
        finally:
            stop.set()
            for kv in kvs:
                kv.close()
            cluster.stop()
    return records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3, help="jobs per tree")
    p.add_argument("--kills", type=int, default=3, help="primary kills per job")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--trees", default="", help="comma-separated src folders to compare")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one or not args.trees:
        for r in one_job(args.kills, args.heartbeat_timeout):
            print(json.dumps(r), flush=True)
        return 0
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    results: dict[str, list[dict]] = {t: [] for t in trees}
    for j in range(args.jobs):
        for tree in (trees if j % 2 == 0 else trees[::-1]):
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, __file__, "--one", "--kills",
                                  str(args.kills), "--heartbeat-timeout",
                                  str(args.heartbeat_timeout)], env=env, capture_output=True,
                                 text=True, timeout=900)
            got = [json.loads(line) for line in out.stdout.splitlines()
                   if line.startswith("{")]
            if out.returncode != 0:
                print(f"{tree}: job {j} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            results[tree] += got
            print(f"{tree} job {j}: {[r['promotion_s'] for r in got]} "
                  f"{[r['after'] for r in got]}", flush=True)
    print(f"\nheartbeat_timeout {args.heartbeat_timeout:g} s; SIGKILL of the primary -> "
          f"replica_promoted")
    print("| tree | kills | median s | min s | max s | median silent_s | after |")
    print("|---|---|---|---|---|---|---|")
    for tree, rs in results.items():
        if not rs:
            print(f"| {tree} | 0 | | | | | |")
            continue
        took = [r["promotion_s"] for r in rs]
        silent = [r["silent_s"] for r in rs if r["silent_s"] is not None]
        afters = sorted({r["after"] for r in rs})
        print(f"| {tree} | {len(rs)} | {statistics.median(took):.3f} | {min(took):.3f} | "
              f"{max(took):.3f} | {statistics.median(silent):.3f} | {','.join(afters)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
