"""Per-peer state under a flood of peers that never finish joining: memory before and after.

Opens N connections, one after another (at most --open at once), to a live shard server and to
its coordinator; each sends one shared-memory hello offering an arena this host cannot map
(another host's token), waits for the answer, and closes. Prints each role's RSS after a
warm-up of --warmup such connections and after all N; a role that keeps something per peer
that left grows linearly in N.

Usage: python benchmarks/hello_flood.py [--connections 20000] [--warmup 2000] [--open 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from paramserver.transport import shm


def foreign_hello(arena: shm.Arena, i: int) -> list[bytes]:
    return [shm.HELLO, json.dumps({"arena": {**arena.describe(), "host": f"other-host-{i}"},
                                   "slot": 0}).encode()]


def connect_many(ctx, addr: str, n: int, at_once: int, arena: shm.Arena, start: int) -> int:
    """n connections, each one hello then closed; returns how many were answered."""
    answered = 0
    for base in range(0, n, at_once):
        socks = []
        for i in range(base, min(n, base + at_once)):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(addr)
            s.send_multipart(foreign_hello(arena, start + i))
            socks.append(s)
        for s in socks:
            if s.poll(5000):
                s.recv_multipart()
                answered += 1
            s.close(0)
    return answered


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2 ** 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=20_000)
    p.add_argument("--warmup", type=int, default=2_000)
    p.add_argument("--open", type=int, default=200, help="connections open at once")
    args = p.parse_args()
    job = {"num_keys": 8, "dtype": "float64", "servers": 1, "workers": 1, "batch_size": 1,
           "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0}
    arena = shm.Arena(1 << 16)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None)
        try:
            cluster.start(spawn_workers=False)
            kv = KVWorker(cluster.address)
            kv.init(np.zeros(8))
            kv.start()
            pids = {c.role: c.proc.pid for c in cluster.children}
            targets = {"server": kv.shards[0].addr, "coordinator": cluster.address}
            ctx = zmq.Context()
            ok = True
            try:
                for role, addr in targets.items():
                    pid = pids[role]
                    connect_many(ctx, addr, args.warmup, args.open, arena, 0)
                    before = rss_mb(pid)
                    t0 = time.perf_counter()
                    answered = connect_many(ctx, addr, args.connections, args.open, arena,
                                            args.warmup)
                    time.sleep(1.0)  # let the role take the closes in
                    after = rss_mb(pid)
                    print(f"{role}: {args.connections} hellos in {time.perf_counter() - t0:.1f} s"
                          f" ({answered} answered); RSS {before:.1f} -> {after:.1f} MB "
                          f"({after - before:+.1f} MB)", flush=True)
            finally:
                ctx.destroy(linger=0)
            before = kv.pull()
            kv.push(np.ones(8), step=0, batch=1)
            ok = bool(np.array_equal(kv.pull(), before - 1.0))
            alive = all(c.proc.poll() is None for c in cluster.children)
            kv.close()
            print(f"afterwards: roles alive {alive}; a client served exactly {ok}")
            return 0 if ok and alive else 1
        finally:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
