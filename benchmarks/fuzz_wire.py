"""Fuzz the wire: random and mutated frames against the decoder, then against live sockets.

Part 1 feeds N frames (random bytes, and valid messages with bytes flipped, inserted, cut or
whole fields retyped) to `wire.decode`: anything but a WireError is a crash. Part 2 sends M of
them to a live shard server and coordinator over ZeroMQ, then checks both still answer a
well-behaved client correctly and no process died.

Usage: python benchmarks/fuzz_wire.py [--frames 1000000] [--live 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker
from paramserver.wire import Message, WireError, decode, encode
from paramserver.wire.protocol import PROTOCOL_VERSION, SCHEMAS

SEEDS = [
    Message("push", {"range": [0, 8], "step": 1, "version": 0, "batch": 4},
            [np.arange(8, dtype=np.float32)], rid=1, src="w"),
    Message("push_sparse", {"step": 0, "version": 0, "batch": 1},
            [np.array([1, 5], dtype=np.int64), np.ones(2, dtype=np.float32)], rid=2, src="w"),
    Message("pull", {"range": [0, 8], "min_version": 0}, rid=3, src="w"),
    Message("clock", {"step": 0, "batch": 4, "compute_time": 0.1, "record": {"loss": 1.0}},
            rid=4, src="w"),
    Message("register", {"role": "worker"}, rid=5, src="w"),
]
JUNK_VALUES = [None, True, -1, 2 ** 64 - 1, 1.5, float("inf"), "x" * 300, b"\x00", [], [1, -2],
               {"a": {"b": 1}}, [0, 2 ** 63]]


def mutate(rng: random.Random) -> list[bytes]:
    """One hostile message: random bytes, a corrupted valid one, or a retyped field."""
    kind = rng.randrange(4)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(0, 4))]
    frames = [bytes(f) for f in encode(rng.choice(SEEDS))]
    if kind == 1:  # flip bytes in one frame
        i = rng.randrange(len(frames))
        buf = bytearray(frames[i]) or bytearray(b"\0")
        for _ in range(rng.randrange(1, 5)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        frames[i] = bytes(buf)
    elif kind == 2:  # cut or extend a frame, or drop/add one
        i = rng.randrange(len(frames))
        frames[i] = frames[i][:rng.randrange(len(frames[i]) + 1)] + rng.randbytes(rng.randrange(3))
        if rng.random() < 0.3:
            frames = frames[:-1] if rng.random() < 0.5 else frames + [rng.randbytes(8)]
    else:  # retype a header field
        head = msgpack.unpackb(frames[0])
        key = rng.choice(list(head) + ["v", "op", "arrays", "zzz"])
        head[key] = rng.choice(JUNK_VALUES + [rng.choice(sorted(SCHEMAS)), PROTOCOL_VERSION])
        frames[0] = msgpack.packb(head)
    return frames


def fuzz_decoder(n: int, rng: random.Random) -> tuple[int, int, float]:
    """(refused, accepted) counts; raises on anything but WireError."""
    refused = accepted = 0
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            decode(mutate(rng))
            accepted += 1
        except WireError:
            refused += 1
    return refused, accepted, time.perf_counter() - t0


def fuzz_live(m: int, rng: random.Random) -> dict:
    job = {"num_keys": 8, "dtype": "float32", "servers": 1, "workers": 1, "batch_size": 1,
           "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None)  # plaintext: the codec is the target
        try:
            cluster.start(spawn_workers=False)
            kv = KVWorker(cluster.address)
            kv.init(np.zeros(8, dtype=np.float32))
            kv.start()
            ctx = zmq.Context()
            replies = 0
            for addr in (kv.shards[0].addr, cluster.address):
                rogue = ctx.socket(zmq.DEALER)
                rogue.setsockopt(zmq.LINGER, 0)
                rogue.connect(addr)
                for _ in range(m):
                    frames = mutate(rng)
                    if frames:
                        rogue.send_multipart(frames)
                    while rogue.poll(0):
                        rogue.recv_multipart()
                        replies += 1
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and rogue.poll(200):
                    rogue.recv_multipart()
                    replies += 1
                rogue.close(0)
            ctx.term()
            kv.push(np.ones(8, dtype=np.float32), step=0, batch=1)
            after = kv.pull()
            alive = all(c.proc.poll() is None for c in cluster.children)
            kv.close()
            return {"sent": 2 * m, "replies": replies, "alive": alive,
                    "correct_after": bool(np.all(np.abs(after) > 0))}
        finally:
            cluster.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--live", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    refused, accepted, secs = fuzz_decoder(args.frames, rng)
    print(f"decoder: {args.frames} frames in {secs:.1f} s ({args.frames / secs:,.0f}/s): "
          f"{refused} refused with WireError, {accepted} valid, 0 crashes")
    live = fuzz_live(args.live, rng)
    print(f"live: {live['sent']} hostile messages to a server and a coordinator, "
          f"{live['replies']} error replies; processes alive: {live['alive']}; "
          f"a client is served correctly afterwards: {live['correct_after']}")
    return 0 if live["alive"] and live["correct_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
