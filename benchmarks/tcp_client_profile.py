"""Where a worker's push+pull spends its time over TCP alone: cProfile of the client's loop
against one local shard with shared memory off, beside the wall and the client process's CPU
time per round (that CPU includes ZeroMQ's I/O thread, which copies the bytes to and from the
kernel).

    python benchmarks/tcp_client_profile.py [--bytes 3730000] [--rounds 400] [--top 14]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ["PARAMSERVER_SHM"] = "0"  # this process's client too, not only the shard's

from paramserver.client.kv import KVWorker  # noqa: E402
from paramserver.launch.local import LocalCluster  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=3_730_000, help="float32 bytes a push moves")
    ap.add_argument("--rounds", type=int, default=400, help="push+pull rounds profiled")
    ap.add_argument("--top", type=int, default=14, help="functions listed, by own time")
    args = ap.parse_args(argv)
    num_keys = args.bytes // 4
    job = {"num_keys": num_keys, "dtype": "float32", "servers": 1, "workers": 1,
           "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None, env={"PARAMSERVER_SHM": "0"})
        cluster.start(spawn_workers=False)
        try:
            kv = KVWorker(cluster.address, shared_memory=False)
            kv.init(np.zeros(num_keys, np.float32))
            grad = np.full(num_keys, 1e-6, np.float32)
            out = np.empty(num_keys, np.float32)
            for _ in range(50):  # warm: connections, the shard's first applies
                kv.push(grad, step=0, batch=1)
                kv.pull(out=out)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.rounds):
                kv.push(grad, step=0, batch=1)
                kv.pull(out=out)
            prof.disable()
            wall = (time.perf_counter() - wall0) / args.rounds * 1e3
            cpu = (time.process_time() - cpu0) / args.rounds * 1e3
            print(f"{args.bytes / 1e6:.2f} MB push+pull over TCP: wall {wall:.2f} ms, client "
                  f"process CPU {cpu:.2f} ms a round (under cProfile)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
            kv.close()
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
