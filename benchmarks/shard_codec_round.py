"""Benchmark: one shard's codec work per BSP round, in-process (issue 22, shared delta encodes).

A float32 shard of --keys values (the MNIST MLP's 932,362 by default) in round mode; each
round W workers' delta pulls wait for it, W codec-encoded pushes come in and are decoded as the
shard node decodes them (`payload.unpack`), the last one fills the round, the round is applied
and the waiting pulls are answered. Prints milliseconds per round: decoding the pushes, adding
them into the round, and applying it and answering the pulls (the delta encodes); and the
encodes the shard's pull references counted (trees before the sharing have no count).

    PYTHONPATH=src python benchmarks/shard_codec_round.py --codec uniform8 --rounds 20

Run it from each tree (PYTHONPATH=<tree>/src) for an A/B; no sockets, no processes. torch
runs on --threads threads (1, as a shard server does by default: server_threads).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from paramserver.compression import make_codec, payload
from paramserver.server.core import ShardCore
from paramserver.server.events import Init, Pull, Push, ShardSettings, Then


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=932_362)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=20, help="timed rounds (after one untimed)")
    p.add_argument("--codec", default="uniform8", help="push and pull codec")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (the shard's server_threads; default 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n, names = args.keys, [f"w{k}" for k in range(args.workers)]
    core = ShardCore(ShardSettings(rank=0, lo=0, hi=n, dtype="float32", apply_mode="round",
                                   optimizer="sgd", lr=0.01))
    rng = np.random.default_rng(0)
    core.handle(Init("init", 0, n, rng.standard_normal(n).astype(np.float32)))
    rids = iter(range(1, 1 << 62))

    def pull(s: str, version: int, delta: bool = True) -> Pull:
        return Pull(("c", s), 0.0, version, 0, n, client=s, ref=True, sender=s,
                    rid=next(rids), delta=make_codec(args.codec) if delta else None)

    for s in names:  # the dense pull each worker starts from
        core.handle(pull(s, 0, delta=False))
    pushes = [payload.pack(make_codec(args.codec),
                           rng.standard_normal(n).astype(np.float32) * np.float32(0.01))
              for _ in names]
    spent = {"decode pushes": 0.0, "add pushes": 0.0, "apply + pulls": 0.0}

    def one_round(version: int) -> None:
        for s in names:
            core.handle(pull(s, version))
        out = []
        for k, s in enumerate(names):
            t0 = time.perf_counter()
            grad = payload.unpack(*pushes[k], n)
            t1 = time.perf_counter()
            out += core.handle(Push(("c", s), s, next(rids), 0, n, grad, version - 1, 1,
                                    version - 1, 1.0, len(names)))
            spent["decode pushes"] += t1 - t0
            spent["add pushes"] += time.perf_counter() - t1
        t0 = time.perf_counter()
        for ins in out:
            if type(ins) is Then:
                out += core.handle(ins.event)
        spent["apply + pulls"] += time.perf_counter() - t0

    one_round(1)
    spent = dict.fromkeys(spent, 0.0)
    before = getattr(core.refs, "encodes", None)
    for version in range(2, 2 + args.rounds):
        one_round(version)
    per = {k: 1000 * v / args.rounds for k, v in spent.items()}
    encodes = ("-" if before is None
               else f"{(core.refs.encodes - before) / args.rounds:g}")
    print(" ".join(f"{k}: {v:.1f} ms," for k, v in per.items()),
          f"total {sum(per.values()):.1f} ms; encodes per round {encodes}")


if __name__ == "__main__":
    main()
