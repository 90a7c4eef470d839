"""What replicated shards (`--replicas 2`) cost a push+pull: one worker, one shard, 3.73 MB by
default, with and without a backup, runs interleaved in fresh processes.

Three sides, each `pushpull.py`'s stack loop (push, the server applies SGD and acks; pull):
  plain      one copy, shared memory on (the default on one host)
  plain tcp  one copy, shared memory off: every byte through TCP
  replicas   primary + backup: the primary forwards each push to its backup before it
             applies it and acks once the backup has; workers of a replicated job use TCP
             (an arena offered to one server would not follow its shard to the backup); the
             forward's arrays go through the primary's shared arena (the backup is on this
             host), shared memory being on for the servers as by default
Each round runs the sides in a rotating order, so a slow spell of this shared machine weighs
on all; the figures to quote are the medians of the per-round ratios replicas / plain and
replicas / plain tcp. The replicated runs start timing only once every backup is synced.
`--tcp-forward` adds the replicated job with shared memory off (every forward through TCP);
`--a TREE` adds the replicated job of another source tree (its own benchmarks/ and src/,
e.g. main), for an interleaved A/B: the per-round ratio replicas / replicas A; `--a TREE=NAME`
names the side `replicas NAME` (repeat --a for more trees).

  python benchmarks/replicas_overhead.py --rounds 7
  python benchmarks/replicas_overhead.py --rounds 7 --a /work/main --tcp-forward
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = ("import sys; sys.path.insert(0, {bench!r}); import replicas_overhead as r; "
       "print(r.bench({nbytes}, {repeats}, {replicas}, {shared}, {limits!r}))")
# side -> (replicas, shared memory, job limits)
SIDES = {"plain": (1, True, {}), "plain tcp": (1, False, {}), "replicas": (2, True, {})}
TREES: dict[str, Path] = {}  # side -> the source tree it runs (this one when not named)


def bench(nbytes: int, repeats: int, replicas: int, shared: bool,
          limits: dict | None = None) -> float:
    """Seconds per push+pull of one worker (median of `repeats` batches)."""
    import numpy as np

    import pushpull
    from paramserver.client.kv import KVWorker
    from paramserver.launch.local import LocalCluster
    num_keys = nbytes // 4
    job = {"num_keys": num_keys, "dtype": "float32", "servers": 1, "workers": 1,
           "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0, "replicas": replicas, **(limits or {})}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None,
                               env=None if shared else {"PARAMSERVER_SHM": "0"})
        try:
            cluster.start(spawn_workers=False)
            init = KVWorker(cluster.address, role="observer", shared_memory=shared)
            init.init(np.zeros(num_keys, np.float32))
            deadline = time.monotonic() + 120
            events = Path(tmp) / "events.jsonl"
            while replicas > 1 and '"backup_synced"' not in (
                    events.read_text() if events.exists() else ""):
                if time.monotonic() > deadline:
                    raise SystemExit("the backup did not sync within 120 s")
                time.sleep(0.05)
            q = pushpull.CTX.Queue()
            p = pushpull.CTX.Process(target=pushpull._stack_worker,
                                     args=(cluster.address, nbytes, repeats, q, False, shared))
            p.start()
            per_step = q.get(timeout=600)
            p.join(30)
            init.close()
            if replicas > 1:
                kinds = [json.loads(x)["event"] for x in events.read_text().splitlines()]
                assert "replica_promoted" not in kinds and "backup_lost" not in kinds, kinds
            return per_step
        finally:
            cluster.stop()


def one_run(side: str, nbytes: int, repeats: int, timeout: float) -> float:
    replicas, shared, limits = SIDES[side]
    tree = TREES.get(side, HERE.parent)
    code = RUN.format(bench=str(tree / "benchmarks"), nbytes=nbytes, repeats=repeats,
                      replicas=replicas, shared=shared, limits=limits)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{side} run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=3_730_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--chunks", metavar="MB[:N]", help="add a side `replicas chunked`: "
                        "the replicated job's pushes in chunks of MB (N in flight), so the "
                        "primary forwards one chunk while the next arrives")
    parser.add_argument("--tcp-forward", action="store_true", help="add a side `replicas "
                        "tcp`: the replicated job with shared memory off, forwards over TCP")
    parser.add_argument("--a", action="append", default=[], metavar="TREE[=NAME]",
                        help="add a side `replicas NAME` (A): the replicated job of source "
                        "tree TREE as it measures it")
    args = parser.parse_args()
    if args.tcp_forward:
        SIDES["replicas tcp"] = (2, False, {})
    others = []
    for spec in args.a:
        tree, _, name = spec.partition("=")
        side = f"replicas {name or 'A'}"
        # The other tree's own replicated side (before shared forwards it turned shared
        # memory off, which changed nothing for its forwards).
        SIDES[side] = (2, False, {})
        TREES[side] = Path(tree).resolve()
        others.append(side)
    if args.chunks:
        size, _, window = args.chunks.partition(":")
        nbytes = int(float(size) * (1 << 20))
        limits = {"chunk_bytes": nbytes, "tcp_chunk_bytes": nbytes}
        if window:
            limits["tcp_chunks_in_flight"] = int(window)
        SIDES["replicas chunked"] = (2, False, limits)
    names = list(SIDES)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for side in order:
            times[side].append(one_run(side, args.bytes, args.repeats, args.timeout))
        print("round " + str(i) + ": " + "  ".join(
            f"{n} {times[n][-1] * 1e3:.3f} ms" for n in names), flush=True)
    rep = times["replicas"]
    over = [r / p for r, p in zip(rep, times["plain"])]
    over_tcp = [r / p for r, p in zip(rep, times["plain tcp"])]
    print(f"{args.bytes / 1e6:.2f} MB push+pull, {args.rounds} rounds, medians: "
          + ", ".join(f"{n} {statistics.median(times[n]) * 1e3:.3f} ms" for n in names))
    print(f"replicas / plain: median {statistics.median(over):.3f} "
          f"(range {min(over):.2f}-{max(over):.2f}); replicas / plain tcp: median "
          f"{statistics.median(over_tcp):.3f} (range {min(over_tcp):.2f}-{max(over_tcp):.2f})")
    for extra in [*(("replicas tcp",) if args.tcp_forward else ()), *others]:
        r = [x / p for x, p in zip(times[extra], times["plain tcp"])]
        print(f"{extra} / plain tcp: median {statistics.median(r):.3f} "
              f"(range {min(r):.2f}-{max(r):.2f})")
    for side in others:
        ab = [b / a for b, a in zip(rep, times[side])]
        print(f"A/B: replicas (this tree) / {side}: median {statistics.median(ab):.3f} "
              f"(range {min(ab):.2f}-{max(ab):.2f})")
    if "replicas chunked" in times:
        ch = [r / p for r, p in zip(times["replicas chunked"], times["plain tcp"])]
        print(f"replicas chunked ({args.chunks} MB) / plain tcp: median "
              f"{statistics.median(ch):.3f} (range {min(ch):.2f}-{max(ch):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
