"""Benchmark: time per compress call for every pruning scheme, and the bytes a push would carry.

    .venv/bin/python benchmarks/compression.py                 # 0.6M, 0.93M, 3.7M, 25M floats
    .venv/bin/python benchmarks/compression.py --sizes 600000 --repeats 9 --threads 2

For each size every setting gets its own compressor (error feedback on, the default) and the
same sequence of float32 gradients; the settings take turns call by call, so machine load
hits them alike. The table shows the median ms per call, the sent fraction over all calls,
then for the last call the sent fraction and the bytes of keys + values: as the wire carries
them now (int64 keys), with uint32 keys, and with the smallest lossless key encoding
(compression/encoding.py), beside the dense push; "enc ms" is the time to pick and encode
the keys. A `clone` row (one dense copy) calibrates the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from paramserver.compression import encode_keys, make_compressor

DEFAULT_SIZES = [600_000, 930_000, 3_700_000, 25_000_000]
SETTINGS = [
    ("none", {}),
    ("topk", {"fraction": 0.1, "method": "exact"}),
    ("topk", {"fraction": 0.1, "method": "sampled"}),
    ("topk", {"fraction": 0.01, "method": "exact"}),
    ("topk", {"fraction": 0.01, "method": "sampled"}),
    ("topk", {"fraction": 0.001, "method": "exact"}),
    ("topk", {"fraction": 0.001, "method": "sampled"}),
    ("topk", {"fraction": 0.01, "momentum": 0.9}),
    ("std", {"k": 1}),
    ("std", {"k": 2}),
    ("std", {"k": 3}),
    ("dynamic", {}),
    ("dynamic", {"min_fraction": 0.001}),
    ("dynamic", {"error_feedback": False}),
]


def label(name: str, options: dict) -> str:
    return " ".join([name] + [f"{k}={v}" for k, v in options.items()])


def gradients(n: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """Heavy-tailed (Student t, 3 dof) float32 vectors with per-block scales, like layers."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        g = rng.standard_t(3, n).astype(np.float32)
        blocks = np.repeat(rng.uniform(0.01, 1, 8).astype(np.float32), -(-n // 8))[:n]
        out.append(torch.from_numpy(g * blocks))
    return out


def time_settings(n: int, repeats: int, settings) -> dict:
    """label -> (per-call seconds, last Sparse, compressor); settings take turns each call."""
    grads = gradients(n, 3)
    comps = {label(nm, o): make_compressor(nm, **o) for nm, o in settings}
    times = {lab: [] for lab in ["clone", *comps]}
    last = {}
    for step in range(repeats + 1):  # call 0 warms up (allocates residual and buffers)
        g = grads[step % len(grads)]
        t = time.perf_counter()
        g.clone()
        times["clone"].append(time.perf_counter() - t)
        for lab, comp in comps.items():
            t = time.perf_counter()
            last[lab] = comp.compress(g)
            times[lab].append(time.perf_counter() - t)
    return {lab: (ts[1:], last.get(lab), comps.get(lab)) for lab, ts in times.items()}


def encode_cost(sparse) -> tuple[int, int, float, str]:
    """Bytes with u32 keys, bytes with the smallest encoding, seconds to encode, its name."""
    t = time.perf_counter()
    enc = encode_keys(sparse.keys, sparse.dense_size, "auto")
    secs = time.perf_counter() - t
    vals = sparse.values.nbytes
    return 4 * sparse.nnz + vals, enc.nbytes + vals, secs, enc.encoding


def fmt_bytes(b: float) -> str:
    return f"{b / 1e6:.2f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB"


def table(n: int, results: dict) -> list[str]:
    dense = 4 * n
    rows = [f"\n### {n:,} float32 (dense push {fmt_bytes(dense)})\n",
            "| setting | ms/call | avg sent % | sent % | push bytes now (i64 keys) | vs dense "
            "| u32 keys | best encoding | enc ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lab, (ts, sparse, comp) in results.items():
        ms = statistics.median(ts) * 1e3
        if sparse is None:
            rows.append(f"| {lab} (baseline) | {ms:.2f} | | | | | | | |")
            continue
        pct, avg = 100 * comp.stats.fraction, 100 * comp.stats.total_fraction
        now = sparse.dense_nbytes if sparse.is_dense else sparse.nbytes
        u32, best, enc_s, enc = encode_cost(sparse) if not sparse.is_dense else (now, now, 0, "-")
        rows.append(f"| {lab} | {ms:.2f} | {avg:.2f} | {pct:.2f} | {fmt_bytes(now)} "
                    f"| {now / dense:.3f} | {fmt_bytes(u32)} | {fmt_bytes(best)} ({enc}) "
                    f"| {enc_s * 1e3:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per setting")
    ap.add_argument("--big-repeats", type=int, default=3, help="timed calls above 10M entries")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a worker uses 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); median of {args.repeats} calls "
          f"({args.big_repeats} above 10M), error feedback on unless stated")
    for n in args.sizes:
        repeats = args.repeats if n <= 10_000_000 else args.big_repeats
        print("\n".join(table(n, time_settings(n, repeats, SETTINGS))), flush=True)


if __name__ == "__main__":
    main()
