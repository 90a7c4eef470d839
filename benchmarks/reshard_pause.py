"""What live resharding costs the workers: how long their releases are held while a server
joins (and while one is drained), against a round's usual length, by model size.

A BSP job of `--servers 2:3` (real processes on 127.0.0.1, float32, SGD) with two KV workers
that pull, push a gradient and clock as fast as they can; once rounds flow, a third server
joins (`paramserver server --join`), later server 0 is drained. The coordinator's
`server_joined` / `server_drained` events say how long releases were held (`pause_s`: from
the ask to the commit, the fence included) and how long the keys took to move (`move_s`).

  python benchmarks/reshard_pause.py --sizes 3.73MB,64MB --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _events(run: Path) -> list[dict]:
    path = run / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait(pred, what: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while not (found := pred()):
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)
    return found


def one(nbytes: int) -> dict:
    import numpy as np

    from paramserver.cli.drain_cmd import drain
    from paramserver.client.kv import KVWorker
    from paramserver.launch.local import LocalCluster

    keys = nbytes // 4
    job = {"num_keys": keys, "dtype": "float32", "servers": 2, "max_servers": 3,
           "workers": 2, "batch_size": 1, "sync": {"name": "bsp"},
           "optimizer": {"name": "sgd", "lr": 1e-9}, "heartbeat_timeout": 10.0}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cluster = LocalCluster(job, run, keys=None)
        joiner = None
        stop = threading.Event()
        rounds: list[float] = []
        try:
            cluster.start(spawn_workers=False)
            kvs = [KVWorker(cluster.address) for _ in range(2)]
            kvs[0].init(np.zeros(keys, np.float32))
            grad = np.ones(keys, np.float32)

            def work(kv):
                release = kv.start()
                t = time.monotonic()
                while not stop.is_set():
                    kv.pull(min_version=release.min_version)
                    kv.push(grad, step=release.step, batch=1)
                    release = kv.clock(release.step, batch=1, compute_time=0.0)
                    if kv.rank == 0:  # a whole round: pull, push, the barrier
                        rounds.append(time.monotonic() - t)
                    t = time.monotonic()
                kv.bye()

            threads = [threading.Thread(target=work, args=(kv,)) for kv in kvs]
            for t in threads:
                t.start()
            _wait(lambda: len(rounds) >= 20, "20 rounds")
            joiner = subprocess.Popen([sys.executable, "-m", "paramserver", "server",
                                       "--join", cluster.address],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            joined = _wait(lambda: [e for e in _events(run)
                                    if e["event"] == "server_joined" and "epoch" in e],
                           "the join")[0]
            n = len(rounds)
            _wait(lambda: len(rounds) >= n + 10, "rounds on three servers")
            drain(cluster.address, 0, wait=300, out=open(os.devnull, "w"))
            drained = [e for e in _events(run) if e["event"] == "server_drained"][0]
            stop.set()
            for t in threads:
                t.join(120)
            for kv in kvs:
                kv.close()
        finally:
            stop.set()
            if joiner is not None:
                joiner.terminate()
                joiner.wait(30)
            cluster.stop()
    return {"round_s": statistics.median(rounds[5:20]),
            "join_pause_s": joined["pause_s"], "join_move_s": joined["move_s"],
            "join_moved_keys": joined["moved_keys"],
            "drain_pause_s": drained["pause_s"], "drain_move_s": drained["move_s"],
            "drain_moved_keys": drained["moved_keys"]}


def main() -> None:
    from paramserver.core import units

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="3.73MB,64MB", help="model sizes, comma separated")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for text in args.sizes.split(","):
        nbytes = int(units.parse_size(text, "size"))
        runs = [one(nbytes) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{text}: round {med['round_s'] * 1000:.1f} ms; join held releases "
              f"{med['join_pause_s'] * 1000:.0f} ms (move {med['join_move_s'] * 1000:.0f} ms, "
              f"{med['join_moved_keys']:.0f} keys); drain held {med['drain_pause_s'] * 1000:.0f}"
              f" ms (move {med['drain_move_s'] * 1000:.0f} ms, {med['drain_moved_keys']:.0f} "
              f"keys); medians of {args.repeats}", flush=True)


if __name__ == "__main__":
    main()
