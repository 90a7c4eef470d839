"""A million hostile frames at live roles: zero crashes, service afterwards, memory flat.

Sends N frames of every kind (benchmarks/fuzz_wire.py's generator: every protocol op and the
shared-memory handshake and descriptors, mutated, and garbage) to a live shard server and N to
a live coordinator, each over a few rogue DEALERs that first offered a real arena, then checks
that no process died, that a real client's push and pull are served exactly, and reports each
role's RSS after a warm-up and at the end, frames per second, and the bytes its log grew by
(refusals are rate-limited). Then M hostile replies go to a worker's reply path in this process:
a ROUTER standing where a shard would be answers a DEALER that offered its arena, and the
client's ShardRequests takes them in (rpc.recv, the handshake, the codec, WorkerCore.reply).

Usage: python benchmarks/fuzz_frames.py [--frames 1000000] [--worker-frames 200000] [--seed 0]
                                        [--roles server,coordinator]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_wire  # noqa: E402  (the generator lives beside this script)

from paramserver.client.core.worker_core import WorkerCore  # noqa: E402
from paramserver.client.kv import KVWorker  # noqa: E402
from paramserver.client.requests import ShardRequests  # noqa: E402
from paramserver.launch.local import LocalCluster  # noqa: E402
from paramserver.transport import connect_dealer, shm  # noqa: E402

ROGUES = 4  # sockets per role: the roles see several senders, as in a real flood
WARMUP = 20_000


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2 ** 20


def flood(ctx, addr: str, n: int, rng: random.Random, seeds,
          pid: int | None = None) -> tuple[int, float, list[float]]:
    """n hostile frames to the ROUTER at `addr`: (answers received, seconds, the RSS of
    process `pid` in MB after each quarter of them)."""
    rogues = [fuzz_wire.Rogue(ctx, addr, seeds) for _ in range(ROGUES)]
    quarters = {n * q // 4 for q in (1, 2, 3)}
    rss = []
    t0 = time.perf_counter()
    for i in range(n):
        frames = fuzz_wire.mutate(rng, seeds)
        if frames:
            rogues[i % ROGUES].send(frames)
        if pid is not None and i + 1 in quarters:
            rss.append(rss_mb(pid))
    for r in rogues:
        r.drain(2000)
    secs = time.perf_counter() - t0
    if pid is not None:
        rss.append(rss_mb(pid))
    answers = sum(r.replies for r in rogues)
    for r in rogues:
        r.close()
    return answers, secs, rss


def worker_path(m: int, rng: random.Random, seeds) -> dict:
    """m hostile replies into a client's ShardRequests, from a ROUTER where its shard would be."""
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.SNDHWM, 100_000)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        addr = f"tcp://127.0.0.1:{port}"
        dealer = connect_dealer(ctx, addr, hwm=100_000)
        arena = shm.Arena(1 << 16)
        shm.offer_shared(dealer, arena, 0)
        assert router.poll(5000), "the client's offer never came"
        ident = router.recv_multipart()[0]
        shard = SimpleNamespace(sock=dealer, addr=addr, rank=0)
        requests = ShardRequests([shard], "w0", WorkerCore(), timeout=5.0, retry_interval=1.0)
        t0 = time.perf_counter()
        for i in range(m):
            frames = fuzz_wire.mutate(rng, seeds)
            router.send_multipart([ident, *frames])
            if i % 256 == 255:
                while dealer.poll(0):
                    requests._receive(0.0)
                while router.poll(0):  # the client's confirmations of our arena
                    router.recv_multipart()
        while dealer.poll(200):
            requests._receive(0.0)
        secs = time.perf_counter() - t0
        return {"frames": m, "secs": secs, "refused": requests.refusals.total}
    finally:
        ctx.destroy(linger=0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1_000_000, help="per role (server, coordinator)")
    p.add_argument("--worker-frames", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--roles", default="server,coordinator",
                   help="which live roles to flood, comma-separated")
    args = p.parse_args()
    rng = random.Random(args.seed)
    seeds = fuzz_wire.ShmSeeds()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(fuzz_wire.fuzz_job(), Path(tmp), keys=None)
        try:
            cluster.start(spawn_workers=False)
            kv = KVWorker(cluster.address)
            kv.init(np.zeros(8))
            kv.start()
            roles = {"server": (cluster.children[1], kv.shards[0].addr),
                     "coordinator": (cluster.children[0], cluster.address)}
            assert roles["server"][0].role == "server", [c.role for c in cluster.children]
            ctx = zmq.Context()
            try:
                for name, (child, addr) in roles.items():
                    if name not in args.roles.split(","):
                        continue
                    pid = child.proc.pid
                    cold = rss_mb(pid)
                    flood(ctx, addr, WARMUP, rng, seeds)
                    warm = rss_mb(pid)
                    log_before = child.log_path.stat().st_size
                    answers, secs, rss = flood(ctx, addr, args.frames, rng, seeds, pid)
                    alive = child.proc.poll() is None
                    ok &= alive
                    grown = child.log_path.stat().st_size - log_before
                    print(f"{name}: {args.frames:,} frames in {secs:.0f} s "
                          f"({args.frames / secs:,.0f} frames/s), {answers:,} answers; "
                          f"alive: {alive}; RSS {cold:.1f} MB at start, {warm:.1f} MB after "
                          f"{WARMUP:,} warm-up frames, then after each quarter: "
                          f"{', '.join(f'{r:.1f}' for r in rss)} MB "
                          f"({rss[-1] - warm:+.1f} MB); log +{grown:,} bytes", flush=True)
            finally:
                ctx.destroy(linger=0)
            before = kv.pull()
            kv.push(np.ones(8), step=0, batch=1)
            after = kv.pull()
            exact = bool(np.array_equal(after, before - 1.0))
            alive = all(c.proc.poll() is None for c in cluster.children)
            kv.close()
            ok &= exact and alive
            print(f"afterwards: every process alive: {alive}; a real push and pull served "
                  f"exactly: {exact}")
        finally:
            cluster.stop()
    w = worker_path(args.worker_frames, rng, seeds)
    print(f"worker reply path: {w['frames']:,} hostile replies in {w['secs']:.0f} s "
          f"({w['frames'] / w['secs']:,.0f}/s), {w['refused']:,} refused, 0 exceptions")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
