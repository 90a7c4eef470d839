"""What CURVE (encryption + authentication on every socket) costs: push+pull and BSP rounds.

Side by side in one run, repeats interleaved, medians:

  push+pull   one client (in this process) pushes a dense float32 gradient of SIZE bytes to one
              shard and pulls the values back (ASP), through LocalCluster with keys=None
              (plaintext) and keys="ephemeral" (CURVE); each over shared memory (the default on
              one host: big frames skip the socket) and over TCP alone (PARAMSERVER_SHM=0, what
              crosses hosts: every byte is encrypted)
  bsp rounds  `train` task (digits MLP, batch 32, 2 workers, 1 shard, no evaluator) under BSP:
              rounds/s of the job's training wall time, plaintext vs CURVE

Usage: python benchmarks/curve_overhead.py [--size 3730000] [--steps 40] [--rounds 150]
       [--repeats 3] [--only pushpull|bsp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from paramserver.spec.config import TrainConfig
from paramserver.runlog.metrics import read_records, summarize
from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker

MODES = {"plain": None, "curve": "ephemeral"}


def push_pull(nbytes: int, steps: int, keys, shared: bool, codec: str | None = None) -> float:
    """Median seconds of one push+pull of `nbytes` (the push through `codec` if named: its
    payload is what crosses; the pull stays dense)."""
    n = nbytes // 4
    job = {"num_keys": n, "dtype": "float32", "servers": 1, "workers": 1, "batch_size": 1,
           "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1e-9},
           "heartbeat_timeout": 60.0}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=keys,
                               env=None if shared else {"PARAMSERVER_SHM": "0"})
        try:
            cluster.start(spawn_workers=False)
            # The job's one worker (never started): with keys, only a worker's may push.
            kv = KVWorker(cluster.address, role="worker", shared_memory=shared,
                          keys=cluster.client_keys("worker"))
            try:
                kv.init(np.zeros(n, np.float32))
                grad, out = kv.shared_buffer(), np.empty(n, np.float32)
                grad[:] = 1.0
                times = []
                enc = None
                if codec is not None:
                    from paramserver.compression import make_codec
                    enc = make_codec(codec)
                for _ in range(steps + 3):
                    t = time.perf_counter()
                    kv.push(grad, step=0, batch=1, codec=enc)
                    kv.pull(out=out)
                    times.append(time.perf_counter() - t)
                return statistics.median(times[3:])  # the first ones connect and fault pages
            finally:
                kv.close()
        finally:
            cluster.stop()


def bsp_rounds(rounds: int, keys) -> float:
    from paramserver.launch.jobs import prepare_job
    cfg = TrainConfig(sync="bsp", workers=2, servers=1, batch_size=32, lr=0.1, steps=rounds,
                      threads=1, seed=0)
    job = prepare_job(cfg)
    job["eval_interval"] = 0.0  # no evaluator
    with tempfile.TemporaryDirectory() as d:
        LocalCluster(job, Path(d), job_timeout=600, keys=keys).run()
        s = summarize(read_records(Path(d) / "metrics.jsonl"), {**job, "apply_mode": "round"})
    return s["updates_applied"] / s["wall_time_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=3_730_000, help="bytes per push (and pull)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("pushpull", "bsp"), help="run one half")
    parser.add_argument("--codec", help="push+pull: the push through this codec (e.g. bf16)")
    args = parser.parse_args()
    pp = {(m, s): [] for m in MODES for s in (True, False)}
    rr = {m: [] for m in MODES}
    for rep in range(args.repeats):
        order = list(MODES) if rep % 2 == 0 else list(MODES)[::-1]  # neither always goes first
        for mode in order:
            for shared in (True, False):
                if args.only in (None, "pushpull"):
                    pp[(mode, shared)].append(push_pull(args.size, args.steps, MODES[mode],
                                                        shared, args.codec))
            if args.only in (None, "bsp"):
                rr[mode].append(bsp_rounds(args.rounds, MODES[mode]))
    if args.only != "bsp":
        med = {k: statistics.median(v) for k, v in pp.items()}
        print(f"push+pull of {args.size / 1e6:.2f} MB"
              f"{'' if args.codec is None else f' (pushes through {args.codec})'}, median of "
              f"{args.repeats} x {args.steps} steps")
        for shared, label in ((True, "shared memory"), (False, "tcp only")):
            plain, curve = med[("plain", shared)], med[("curve", shared)]
            print(f"  {label:14s} plain {plain * 1e3:7.2f} ms  curve {curve * 1e3:7.2f} ms  "
                  f"curve/plain {curve / plain:.2f}")
    if args.only != "pushpull":
        plain, curve = statistics.median(rr["plain"]), statistics.median(rr["curve"])
        print(f"BSP rounds/s (digits MLP, 2 workers, {args.rounds} rounds, median of "
              f"{args.repeats}): plain {plain:.1f}  curve {curve:.1f}  "
              f"curve/plain {curve / plain:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
