"""Interleaved A/B of the worker client alone: one cluster, one client process per tree.

Both clients (tree A's and tree B's `src`, each first on its own PYTHONPATH) join the same
running job and take turns: a burst of `--burst` push+pull round trips (or pushes alone) from
one, then from the other, the side that goes first alternating from pair to pair. The server
and the machine's slow spells are shared by both sides of a pair, so the median of the pair
ratios B/A isolates what the client costs; each side also reports its process CPU time per
operation, which the machine's other load disturbs less than wall time.

  python benchmarks/client_ab.py --a /work/main/src --b src --size 3730000 --pairs 61
  python benchmarks/client_ab.py --a /work/main/src --b src --size 4096 --burst 200 --tcp
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent / "src"


def client(addr: str, shared: bool) -> None:
    """A client process: answers each "OP N" line on stdin with wall and CPU seconds per op."""
    from paramserver.client.kv import KVWorker

    kv = KVWorker(addr, shared_memory=shared)
    grad = kv.shared_buffer()
    grad[:] = 1e-6
    out = np.empty(kv.num_keys, kv.dtype)
    kv.pull(out=out)
    print("ready", flush=True)
    for line in sys.stdin:
        op, n = line.split()
        if op == "quit":
            break
        n = int(n)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            kv.push(grad, step=0, batch=1)
            if op == "pushpull":
                kv.pull(out=out)
        print((time.perf_counter() - t0) / n, (time.process_time() - c0) / n, flush=True)
    kv.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default=str(HERE), help="src folder of tree A (default: this one)")
    parser.add_argument("--b", default=str(HERE), help="src folder of tree B (default: this one)")
    parser.add_argument("--size", type=int, default=3_730_000, help="bytes pushed and pulled")
    parser.add_argument("--pairs", type=int, default=41)
    parser.add_argument("--burst", type=int, default=50, help="round trips per turn")
    parser.add_argument("--push-only", action="store_true")
    parser.add_argument("--tcp", action="store_true", help="shared memory off: bytes via TCP")
    parser.add_argument("--b-first", action="store_true", help="B's client registers first")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: run as a client
    args = parser.parse_args()
    if args.client:
        client(args.client, not args.tcp)
        return 0

    from paramserver.client.kv import KVWorker
    from paramserver.launch.local import LocalCluster

    num_keys = args.size // 4
    job = {"num_keys": num_keys, "dtype": "float32", "servers": 1, "workers": 2,
           "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0}
    shm_env = {"PARAMSERVER_SHM": "0"} if args.tcp else {}
    sides = [("A", args.a), ("B", args.b)]
    if args.b_first:
        sides.reverse()
    op = "push" if args.push_only else "pushpull"
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None, env=shm_env or None)
        cluster.start(spawn_workers=False)
        procs = {}
        try:
            with KVWorker(cluster.address, role="observer", shared_memory=not args.tcp) as init:
                init.init(np.zeros(num_keys, np.float32))
            for name, src in sides:
                cmd = [sys.executable, __file__, "--client", cluster.address]
                procs[name] = subprocess.Popen(
                    cmd + (["--tcp"] if args.tcp else []), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, text=True,
                    env=dict(os.environ, PYTHONPATH=str(src), **shm_env))
                if procs[name].stdout.readline().strip() != "ready":
                    raise RuntimeError(f"client {name} did not start")

            def turn(name: str) -> tuple[float, float]:
                p = procs[name]
                p.stdin.write(f"{op} {args.burst}\n")
                p.stdin.flush()
                wall, cpu = p.stdout.readline().split()
                return float(wall), float(cpu)

            turn("A"), turn("B")  # warm-up
            got = {"A": [], "B": []}
            for i in range(args.pairs):
                for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
                    got[name].append(turn(name))
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.stdin.write("quit 0\n")
                    p.stdin.flush()
                    p.wait(30)
            cluster.stop()
    for i, what in ((0, "wall"), (1, "client CPU")):
        a = [x[i] for x in got["A"]]
        b = [x[i] for x in got["B"]]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        label = f"{args.size} B {op}{' tcp' if args.tcp else ''} {what}"
        print(f"{label}: A {statistics.median(a) * 1e3:.3f} ms, B {statistics.median(b) * 1e3:.3f} "
              f"ms per op, median pair ratio B/A {ratio:.3f} "
              f"({args.pairs} pairs of {args.burst})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
