"""Interleaved A/B of the per-message cost the flight recorder adds: small push+pulls through
the whole stack (1 worker, 1 shard), timed in wall seconds and in CPU seconds of the worker
process and of the shard server process, between two source trees.

Wall time on this shared 2-core machine swings by 2-3x from run to run under load (the
pushpull_ab.py figures); CPU seconds per step are what recording adds and move far less with
the load, so they resolve a few percent where wall time cannot. Each run is a fresh process
with that tree's `src` first on PYTHONPATH; pairs run back to back and the side that goes
first alternates. The figures to quote are the medians of the pair ratios B/A.

  python benchmarks/flight_ab.py --a /work/main --b . --pairs 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, statistics, tempfile, time
from pathlib import Path
import numpy as np
import psutil
from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster

nbytes, steps, repeats = {nbytes}, {steps}, {repeats}
keys = nbytes // 4
job = {{"num_keys": keys, "dtype": "float32", "servers": 1, "workers": 1, "batch_size": 1,
        "sync": {{"name": "asp"}}, "optimizer": {{"name": "sgd", "lr": 1.0}},
        "heartbeat_timeout": 60.0}}
with tempfile.TemporaryDirectory() as tmp:
    cluster = LocalCluster(job, Path(tmp), keys=None)
    try:
        cluster.start(spawn_workers=False)
        server = psutil.Process(next(c.proc.pid for c in cluster.children
                                     if c.role == "server"))
        kv = KVWorker(cluster.address)
        grad = kv.shared_buffer()
        grad[:] = 1e-6
        out = np.empty(keys, np.float32)
        kv.init(np.zeros(keys, np.float32))

        def batch(n):
            for _ in range(n):
                kv.push(grad, step=0, batch=1)
                kv.pull(out=out)
        batch(200)
        wall, wcpu, scpu = [], [], []
        for _ in range(repeats):
            s0, c0, t0 = server.cpu_times(), time.process_time(), time.perf_counter()
            batch(steps)
            t1, c1, s1 = time.perf_counter(), time.process_time(), server.cpu_times()
            wall.append((t1 - t0) / steps)
            wcpu.append((c1 - c0) / steps)
            scpu.append((s1.user + s1.system - s0.user - s0.system) / steps)
        kv.close()
        print(json.dumps({{"wall": statistics.median(wall), "worker_cpu": statistics.median(wcpu),
                          "server_cpu": statistics.median(scpu)}}))
    finally:
        cluster.stop()
'''


def one_run(tree: Path, nbytes: int, steps: int, repeats: int, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", CHILD.format(nbytes=nbytes, steps=steps,
                                                             repeats=repeats)],
                         env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise SystemExit(f"run in {tree} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="repository root of tree A")
    parser.add_argument("--b", type=Path, default=HERE, help="repository root of tree B "
                        "(default: this one)")
    parser.add_argument("--bytes", type=int, default=4096, help="push and pull size (4 KB: "
                        "the per-message cost dominates)")
    parser.add_argument("--steps", type=int, default=3000, help="push+pulls per timed batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per run")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args()
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    keys = ("wall", "worker_cpu", "server_cpu")
    for i in range(args.pairs):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            runs[side].append(one_run(trees[side], args.bytes, args.steps, args.repeats,
                                      args.timeout))
        a, b = runs["a"][-1], runs["b"][-1]
        print(f"pair {i}: " + "  ".join(
            f"{k} A {a[k] * 1e6:.1f} us B {b[k] * 1e6:.1f} us B/A {b[k] / a[k]:.3f}"
            for k in keys), flush=True)
    for k in keys:
        ratios = [b[k] / a[k] for a, b in zip(runs["a"], runs["b"])]
        print(f"{k}: median A {statistics.median(r[k] for r in runs['a']) * 1e6:.1f} us, "
              f"B {statistics.median(r[k] for r in runs['b']) * 1e6:.1f} us; median pair "
              f"ratio B/A {statistics.median(ratios):.3f} (range {min(ratios):.2f}-"
              f"{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
