"""Benchmark: each value codec's encode and decode throughput, GB/s of float32 input, one core.

    PYTHONPATH=src .venv/bin/python benchmarks/codec_throughput.py            # 1M and 16M floats
    PYTHONPATH=src .venv/bin/python benchmarks/codec_throughput.py --sizes 1000000 --repeats 9

torch runs on one thread (torch.set_num_threads(1)). The input is a heavy-tailed float32
gradient (Student t, 3 dof, with per-block scales, as benchmarks/compression.py); GB/s is
4 * n bytes / time for both directions, so encode and decode read as the rate at which
float32 values go in and come out. The codecs and a plain numpy copy of the same bytes
(`memcpy`: x.copy(), a fresh array, as the codecs allocate theirs; `copyto`: into a buffer
kept across calls) take turns within each repeat, so machine load hits them alike; the table
shows medians, and each codec's ratio to memcpy's median. Stateful codecs (randomk's step,
powersgd's warm start) run as they would from step to step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from paramserver.compression import make_codec

DEFAULT_SIZES = [1 << 20, 1 << 24]
CODECS = [("fp32", {}), ("fp16", {}), ("fp16-scaled", {}), ("bf16", {}), ("uniform8", {}),
          ("quantile8", {}), ("sign", {}), ("randomk", {"fraction": 0.01}),
          ("powersgd", {"rank": 4})]


def gradient(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_t(3, n).astype(np.float32)
    return g * np.repeat(rng.uniform(0.01, 1, 8).astype(np.float32), -(-n // 8))[:n]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(n: int, repeats: int) -> list[dict]:
    x = gradient(n)
    buf = np.empty_like(x)
    codecs = [(f"{name}" + "".join(f" {k}={v}" for k, v in opts.items()),
               make_codec(name, **opts)) for name, opts in CODECS]
    times: dict[str, list[float]] = {"memcpy": [], "copyto": []}
    for label, _ in codecs:
        times[label + ":enc"], times[label + ":dec"] = [], []
    payloads = {label: c.encode(x) for label, c in codecs}  # warm-up, and the sizes
    for _ in range(repeats):
        times["memcpy"].append(timed(lambda: x.copy()))
        times["copyto"].append(timed(lambda: np.copyto(buf, x)))
        for label, c in codecs:
            enc = None

            def encode(c=c):
                nonlocal enc
                enc = c.encode(x)

            times[label + ":enc"].append(timed(encode))
            times[label + ":dec"].append(timed(lambda c=c, e=enc: c.decode(e, n)))
            payloads[label] = enc
    gb = 4 * n / 1e9
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [{"codec": "memcpy (x.copy())", "n": n, "enc": gb / med["memcpy"], "dec": None,
             "bpv": 4.0},
            {"codec": "copyto (kept buffer)", "n": n, "enc": gb / med["copyto"], "dec": None,
             "bpv": 4.0}]
    for label, _ in codecs:
        rows.append({"codec": label, "n": n, "enc": gb / med[label + ":enc"],
                     "dec": gb / med[label + ":dec"],
                     "bpv": payloads[label].bytes_per_value})
    memcpy = rows[0]["enc"]
    for r in rows:
        r["enc_x"] = r["enc"] / memcpy
        r["dec_x"] = r["dec"] / memcpy if r["dec"] is not None else None
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'codec':<24} {'floats':>9} {'B/value':>8} {'enc GB/s':>9} {'x memcpy':>9} "
          f"{'dec GB/s':>9} {'x memcpy':>9}")
    for n in args.sizes:
        for r in run(n, args.repeats):
            dec = f"{r['dec']:9.2f} {r['dec_x']:9.2f}" if r["dec"] is not None else ""
            print(f"{r['codec']:<24} {n:>9} {r['bpv']:8.3f} {r['enc']:9.2f} {r['enc_x']:9.2f} "
                  f"{dec}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
