"""Sparse rows per second: lookups + updates of an embedding table, three ways, in one run.

One step = look up the rows of a batch of keys, then push a gradient for each (Adagrad);
rows/s = keys per batch / seconds per step. Keys are Zipf-distributed ids over a 10^12 key
space (duplicates within a batch, as in click logs), dim 16, batches of 4,096 keys.

  stack      paramserver: this process's KVWorker, pull_rows then push_rows, through ZeroMQ
             to 2 shard server processes (ASP: rows applied on arrival), 1 worker
  stack ovl  the same with the next batch's pull_rows sent before this batch's push is
             waited on (what a training loop with pull-ahead does)
  table      paramserver.sparse.table.SparseTable in this process: pull, then push (with
             numpy's huge-page advice off in this process, as a shard server turns it off:
             transport/hugepages.py)
  torch      nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad in this process: forward,
             backward and step over one bag per key (ids folded into the bag's rows, which
             torch must allocate up front: it cannot hold a 10^12 key space)

The variants take turns (interleaved) `--repeats` times; each figure is the median.

Usage: python benchmarks/sparse_ps.py [--quick] [--repeats 5] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from paramserver.transport.hugepages import no_hugepage_advice
from paramserver.sparse.table import SparseTable

DIM, BATCH, KEY_SPACE = 16, 4096, 10**12
TORCH_ROWS = 1 << 20  # rows torch allocates: ids are folded into them


def zipf_batches(count: int, seed: int = 0, a: float = 1.1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.zipf(a, BATCH) % KEY_SPACE).astype(np.int64) for _ in range(count)]


def grads_for(batches) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((b.size, DIM), dtype=np.float32) * 0.01 for b in batches]


class Stack:
    """A job of 2 shards holding table "emb", and this process's KVWorker."""

    def __init__(self, tmp: Path):
        job = {"num_keys": 16, "dtype": "float32", "servers": 2, "workers": 1,
               "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 0.1},
               "heartbeat_timeout": 60.0,
               "tables": [{"name": "emb", "dim": DIM, "optimizer": "adagrad", "lr": 0.05,
                           "row_budget": 4_000_000}]}
        self.cluster = LocalCluster(job, tmp, keys=None)
        self.cluster.start(spawn_workers=False)
        self.kv = KVWorker(self.cluster.address)
        self.kv.init(np.zeros(16, np.float32))
        self.step = self.kv.start().step

    def run(self, batches, grads) -> None:
        kv = self.kv
        for keys, g in zip(batches, grads):
            kv.rows.pull("emb", keys)
            kv.rows.push("emb", keys, g, step=self.step, batch=1)

    def run_overlapped(self, batches, grads) -> None:
        kv = self.kv
        pending = kv.rows.pull_async("emb", batches[0])
        for i, (keys, g) in enumerate(zip(batches, grads)):
            kv.wait(pending)
            push = kv.rows.push_async("emb", keys, g, step=self.step, batch=1)
            if i + 1 < len(batches):
                pending = kv.rows.pull_async("emb", batches[i + 1])
            kv.wait(push)

    def close(self) -> None:
        try:
            self.kv.bye()
            self.kv.close()
        finally:
            self.cluster.stop()


def local_table():
    table = SparseTable(DIM, optimizer="adagrad", lr=0.05, capacity=4_000_000)

    def run(batches, grads):
        for keys, g in zip(batches, grads):
            table.pull(keys)
            table.push(keys, g)
    return run


def torch_bag():
    import torch
    torch.set_num_threads(1)  # as each shard server runs (server_threads 1)
    bag = torch.nn.EmbeddingBag(TORCH_ROWS, DIM, mode="sum", sparse=True)
    opt = torch.optim.Adagrad(bag.parameters(), lr=0.05)
    offsets = torch.arange(BATCH)

    def run(batches, grads):
        for keys, g in zip(batches, grads):
            ids = torch.from_numpy(keys % TORCH_ROWS)
            out = bag(ids, offsets[:ids.numel()])
            out.backward(torch.from_numpy(g))
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved turns of each variant")
    ap.add_argument("--steps", type=int, default=50, help="batches per turn")
    ap.add_argument("--quick", action="store_true", help="3 turns of 10 batches")
    args = ap.parse_args()
    no_hugepage_advice()  # the table here runs as a shard server runs it
    repeats, steps = (3, 10) if args.quick else (args.repeats, args.steps)
    batches = zipf_batches(steps * (repeats + 1))
    grads = grads_for(batches)
    unique = statistics.median(np.unique(b).size for b in batches)
    print(f"dim {DIM}, {BATCH} Zipf keys per batch (median {unique:.0f} distinct), "
          f"{steps} batches x {repeats} turns")
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            variants = {"stack": stack.run, "stack ovl": stack.run_overlapped,
                        "table": local_table(), "torch": torch_bag()}
            for run in variants.values():  # warm-up: connections, first rows, page faults
                run(batches[:steps], grads[:steps])
            times: dict[str, list[float]] = {name: [] for name in variants}
            for turn in range(repeats):
                part = slice((turn + 1) * steps, (turn + 2) * steps)
                for name, run in variants.items():
                    t0 = time.perf_counter()
                    run(batches[part], grads[part])
                    times[name].append((time.perf_counter() - t0) / steps)
        finally:
            stack.close()
    base = statistics.median(times["torch"])
    print(f"{'variant':<10} {'ms/batch':>9} {'rows/s':>12} {'vs torch':>9}")
    for name, samples in times.items():
        t = statistics.median(samples)
        print(f"{name:<10} {t * 1e3:9.2f} {BATCH / t:12,.0f} {base / t:8.2f}x")


if __name__ == "__main__":
    main()
