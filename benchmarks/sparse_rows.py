#!/usr/bin/env python3
"""Sparse rows per second: SparseTable (Adagrad, SGD) against torch's sparse embeddings.

Mode `rate` (default): per batch, pull the rows of B keys, then push a gradient of the same
shape (dim 16, B = 4,096 by default). Keys are Zipf(alpha) ids scattered over the whole
64-bit space by a 64-bit mix, so they look like hashed ids: a hot head plus a long tail seen
once. Variants, interleaved repeat by repeat in one process:
  table-adagrad / table-sgd   paramserver.sparse.SparseTable (key index, per-key init,
                              admission 1, LRU eviction at --rows)
  torch-adagrad / torch-sgd   nn.Embedding(--rows, dim, sparse=True) + torch.optim.Adagrad /
                              SGD, slot = key % rows (no key map, collisions allowed): the
                              forward is the pull, backward + step the push
rows/s = keys pulled per second (duplicates counted; a pull and a push per key), by wall
time and by this process's CPU time (the machine is shared: CPU time is the steadier). Each
repeat runs the next --batches batches of the stream on the same tables (they keep growing),
after --warmup batches. Prints medians (min, max) and the ratios table/torch.

Mode `stream`: --stream-keys distinct keys through a table of --budget rows (admit_after 2):
each batch is a quarter new keys, a quarter the previous batch's new keys again (their
second push: admitted) and half Zipf(1.05) keys drawn afresh (a head that stays, a tail seen
once that fills the admission candidates). Reports peak RSS (psutil) against the table's own
array bytes, and the admission and eviction counters.

  .venv/bin/python benchmarks/sparse_rows.py                      # rate, Zipf 1.05 and 1.2
  .venv/bin/python benchmarks/sparse_rows.py --quick
  .venv/bin/python benchmarks/sparse_rows.py --mode stream --stream-keys 100000000
"""
import argparse
import gc
import json
import statistics
import time

import numpy as np
import psutil
import torch

from paramserver.sparse.mix import as_u64, mix64
from paramserver.sparse.table import SparseTable

DIM = 16


def hashed_ids(ids: np.ndarray) -> np.ndarray:
    """Small ids spread over all of int64, as hashed feature ids are."""
    return mix64(ids.astype(np.uint64)).view(np.int64)


def zipf_batches(alpha: float, nbatches: int, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.zipf(alpha, nbatches * batch).astype(np.int64)
    return hashed_ids(ids).reshape(nbatches, batch)


class TableVariant:
    def __init__(self, optimizer: str, rows: int):
        self.name = f"table-{optimizer}"
        self.t = SparseTable(DIM, optimizer=optimizer, lr=0.05, capacity=rows)

    def step(self, keys: np.ndarray, grads: np.ndarray) -> None:
        self.t.pull(keys)
        self.t.push(keys, grads)

    def info(self) -> dict:
        c = self.t.counters()
        return {"rows": c["rows"], "evicted": c["evicted"], "mb": round(self.t.nbytes() / 2**20)}


class TorchVariant:
    def __init__(self, optimizer: str, rows: int):
        self.name = f"torch-{optimizer}"
        self.rows = np.uint64(rows)
        self.emb = torch.nn.Embedding(rows, DIM, sparse=True)
        params = self.emb.parameters()
        self.opt = (torch.optim.Adagrad(params, lr=0.05) if optimizer == "adagrad"
                    else torch.optim.SGD(params, lr=0.05))

    def step(self, keys: np.ndarray, grads: np.ndarray) -> None:
        idx = torch.from_numpy((as_u64(keys) % self.rows).astype(np.int64))
        out = self.emb(idx)
        self.opt.zero_grad(set_to_none=True)
        out.backward(torch.from_numpy(grads))
        self.opt.step()

    def info(self) -> dict:
        return {}


def rate(args) -> None:
    torch.set_num_threads(args.threads)
    for alpha in args.alpha:
        total = args.warmup + args.repeats * args.batches
        batches = zipf_batches(alpha, total, args.batch, seed=1)
        grads = np.random.default_rng(2).standard_normal((args.batch, DIM)).astype(np.float32)
        uniq = np.mean([len(np.unique(b)) for b in batches[:50]])
        variants = [TableVariant("adagrad", args.rows), TableVariant("sgd", args.rows),
                    TorchVariant("adagrad", args.rows), TorchVariant("sgd", args.rows)]
        for v in variants:
            for b in batches[:args.warmup]:
                v.step(b, grads)
        times = {v.name: [] for v in variants}
        cpu = {v.name: [] for v in variants}
        for r in range(args.repeats):
            part = batches[args.warmup + r * args.batches:args.warmup + (r + 1) * args.batches]
            for v in variants:
                gc.collect()
                t0, c0 = time.perf_counter(), time.process_time()
                for b in part:
                    v.step(b, grads)
                times[v.name].append(time.perf_counter() - t0)
                cpu[v.name].append(time.process_time() - c0)
        rows = args.batches * args.batch
        med, cmed = {}, {}
        for v in variants:
            rates = sorted(rows / t for t in times[v.name])
            med[v.name] = statistics.median(rates)
            cmed[v.name] = statistics.median(rows / t for t in cpu[v.name])
            print(json.dumps({"alpha": alpha, "variant": v.name,
                              "rows_per_s_median": round(med[v.name]),
                              "min": round(rates[0]), "max": round(rates[-1]),
                              "rows_per_cpu_s_median": round(cmed[v.name]),
                              "unique_per_batch": round(uniq), **v.info()}))
        for label, m in (("wall", med), ("cpu", cmed)):
            print(f"alpha {alpha} ({label} time): table/torch adagrad "
                  f"{m['table-adagrad'] / m['torch-adagrad']:.2f}x, sgd "
                  f"{m['table-sgd'] / m['torch-sgd']:.2f}x; table adagrad "
                  f"{m['table-adagrad'] / 1e6:.2f} M rows/s, sgd {m['table-sgd'] / 1e6:.2f} M")
        del variants
        gc.collect()


def stream(args) -> None:
    torch.set_num_threads(args.threads)
    proc = psutil.Process()
    base_rss = proc.memory_info().rss
    t = SparseTable(DIM, capacity=args.budget, admit_after=2, evict=args.evict)
    q = args.batch // 4
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((args.batch, DIM)).astype(np.float32)
    zipf = np.random.default_rng(4)
    fresh = 0
    prev = hashed_ids(np.arange(-q, 0))
    peak_rss, peak_bytes, n = 0, 0, 0
    t0 = time.perf_counter()
    while fresh < args.stream_keys:
        new = hashed_ids(np.arange(fresh, fresh + q))
        hot = hashed_ids(zipf.zipf(1.05, args.batch - 2 * q) + (1 << 40))
        keys = np.concatenate([new, prev, hot])
        t.pull(keys)
        t.push(keys, grads)
        prev, fresh, n = new, fresh + q, n + 1
        if n % 16 == 0:
            peak_rss = max(peak_rss, proc.memory_info().rss)
            peak_bytes = max(peak_bytes, t.nbytes())
    dt = time.perf_counter() - t0
    peak_rss = max(peak_rss, proc.memory_info().rss)
    c = t.counters()
    print(json.dumps({"distinct_keys": fresh, "budget": args.budget, "seconds": round(dt, 1),
                      "rows_per_s": round(n * args.batch / dt),
                      "peak_rss_mb": round(peak_rss / 2**20),
                      "rss_before_table_mb": round(base_rss / 2**20),
                      "table_bytes_peak_mb": round(peak_bytes / 2**20), **c}))
    assert c["created"] == c["rows"] + c["evicted"] and c["rows"] <= args.budget


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["rate", "stream"], default="rate")
    p.add_argument("--alpha", type=float, nargs="+", default=[1.05, 1.2])
    p.add_argument("--rows", type=int, default=10_000_000, help="table capacity / torch rows")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--batches", type=int, default=50, help="batches per timed repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--stream-keys", type=int, default=100_000_000)
    p.add_argument("--budget", type=int, default=1_000_000)
    p.add_argument("--evict", choices=["lru", "lfu"], default="lru")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 10^6 rows, 3 repeats of 10 batches; 10^6 stream keys")
    args = p.parse_args()
    if args.quick:
        args.rows, args.repeats, args.batches, args.warmup = 1_000_000, 3, 10, 10
        args.stream_keys, args.budget = 1_000_000, 100_000
    rate(args) if args.mode == "rate" else stream(args)


if __name__ == "__main__":
    main()
