"""Benchmark: ZipLine search time per variant over n workers x R predictions, heap baseline in the same run.

    .venv/bin/python benchmarks/zipline.py            # n in {10,100,1000,10000}, R in {15,150,960}
    .venv/bin/python benchmarks/zipline.py --quick    # n in {10,100,1000}, R in {15,150}

Inputs follow the ZipLine authors' generator: each worker pushes every U[1000,1500] ms from a
start in [0, n) ms; 20 recorded pushes are turned into R predictions by the published
last-interval rule. Each timing is a full `search()` call (validation, search, sync indices);
the table shows the median over repeats. A slow variant is skipped in a cell when its time,
extrapolated from the previous cell, exceeds --skip-above seconds (a note is printed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np

from paramserver.predict import last_interval
from paramserver.zipline import DEFAULT_VARIANT, VARIANTS, search

PAPER_SECONDS = 0.56  # ZipLineOptBS, n = 1000, R = 150, C++ (Zhao et al. 2021)
BASELINE = "heap"


def make_matrix(n: int, lookahead: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, n, size=n)
    interval = rng.integers(1000, 1501, size=n)
    history = start[:, None] + interval[:, None] * np.arange(20)[None, :]
    return last_interval(history, lookahead)


def time_variant(matrix: np.ndarray, variant: str, repeats: int, budget: float):
    """Median seconds over up to `repeats` runs (fewer once `budget` seconds are spent)."""
    times, plan = [], None
    while len(times) < repeats and sum(times) < budget:
        start = time.perf_counter()
        plan = search(matrix, variant)
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(times), plan


def run_grid(ns, rs, repeats, budget, skip_above):
    results, notes, rate = {}, [], {}
    for n in ns:
        for r in rs:
            matrix = make_matrix(n, r)
            points = n * r
            ref = None
            for variant in VARIANTS:
                guess = rate.get(variant, 0.0) * points
                if variant != DEFAULT_VARIANT and guess > skip_above:
                    notes.append(f"skipped {variant} at n={n}, R={r}: about {guess:.0f} s per run")
                    continue
                secs, runs, plan = time_variant(matrix, variant, repeats, budget)
                rate[variant] = max(rate.get(variant, 0.0), secs / points)
                if ref is None:
                    ref = plan
                elif plan != ref:
                    raise SystemExit(f"variants disagree at n={n}, R={r}: {variant}")
                results[(n, r, variant)] = (secs, runs)
            print(f"  measured n={n:>5} R={r:>3}", flush=True)
    return results, notes


def exponent(results, variant, min_points=10_000):
    """Least-squares slope of log(time) against log(n*R) over cells with n*R >= min_points."""
    pts = [(math.log(n * r), math.log(s)) for (n, r, v), (s, _) in results.items()
           if v == variant and n * r >= min_points]
    if len(pts) < 2:
        return float("nan")
    xs, ys = zip(*pts)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)


def print_table(results, ns, rs):
    names = list(VARIANTS)
    print("\nmedian search() time in ms (runs in brackets)")
    print(f"{'n':>6} {'R':>4} {'n*R':>9} " + " ".join(f"{v:>16}" for v in names)
          + f" {'heap/default':>13}")
    for n in ns:
        for r in rs:
            cells = []
            for v in names:
                got = results.get((n, r, v))
                cells.append(f"{got[0] * 1e3:>11.2f} [{got[1]}]" if got else f"{'skipped':>16}")
            base, default = results.get((n, r, BASELINE)), results.get((n, r, DEFAULT_VARIANT))
            ratio = f"{base[0] / default[0]:>12.1f}x" if base and default else f"{'-':>13}"
            print(f"{n:>6} {r:>4} {n * r:>9} " + " ".join(f"{c:>16}" for c in cells) + f" {ratio}")


def print_summary(results):
    print("\nscaling exponent k (time ~ (n*R)^k, cells with n*R >= 10^4):")
    print("  " + ", ".join(f"{v} {exponent(results, v):.2f}" for v in VARIANTS))
    default, base = results.get((1000, 150, DEFAULT_VARIANT)), results.get((1000, 150, BASELINE))
    bs = results.get((1000, 150, "zipline-opt-bs"))
    if default and base:
        print(f"n=1000, R=150: default {DEFAULT_VARIANT} {default[0] * 1e3:.2f} ms, heap baseline "
              f"{base[0] * 1e3:.2f} ms -> {base[0] / default[0]:.1f}x faster (target >= 5x)")
        print(f"paper (C++ ZipLineOptBS, n=1000, R=150): {PAPER_SECONDS} s -> default is "
              f"{PAPER_SECONDS / default[0]:.0f}x below it"
              + (f"; our pure-Python zipline-opt-bs takes {bs[0]:.3f} s" if bs else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small grid: n<=1000, R<=150")
    parser.add_argument("--repeats", type=int, default=5, help="runs per cell (median reported)")
    parser.add_argument("--budget", type=float, default=10.0,
                        help="stop repeating a cell once this many seconds are spent on it")
    parser.add_argument("--skip-above", type=float, default=30.0,
                        help="skip a non-default variant whose extrapolated run exceeds this (s)")
    parser.add_argument("--json", metavar="FILE", help="also write the raw medians as JSON")
    args = parser.parse_args(argv)
    ns = [10, 100, 1000] if args.quick else [10, 100, 1000, 10000]
    rs = [15, 150] if args.quick else [15, 150, 960]
    repeats = min(args.repeats, 3) if args.quick else args.repeats
    results, notes = run_grid(ns, rs, repeats, args.budget, args.skip_above)
    print_table(results, ns, rs)
    for note in notes:
        print("note:", note)
    print_summary(results)
    if args.json:
        rows = [{"n": n, "R": r, "variant": v, "median_s": s, "runs": k}
                for (n, r, v), (s, k) in results.items()]
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
