"""Interleaved A/B of one push+pull size between two source trees (the whole stack, 1 worker).

Each run is `pushpull.py`'s `bench_stack` in a fresh process, with tree A's or tree B's `src`
first on PYTHONPATH and that tree's own `benchmarks/pushpull.py` (so a tree from before a
rename of modules still runs). A pair runs back to back and the side that goes first
alternates, so a slow spell of this shared machine weighs on both sides; the figure to quote
is the median of the pair ratios B/A (below 1: B is faster).

  python benchmarks/pushpull_ab.py --a /tmp/wt-old --b . --pairs 7            # 3.73 MB, shm
  python benchmarks/pushpull_ab.py --a /tmp/wt-old --b . --tcp --pairs 7      # every byte on TCP
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
RUN = ("import sys; sys.path.insert(0, {bench!r}); import pushpull; "
       "print(pushpull.bench_stack({nbytes}, {repeats}, 1, shared={shared}))")


def one_run(tree: Path, nbytes: int, repeats: int, shared: bool, timeout: float) -> float:
    """Seconds per push+pull, the median of `repeats` batches, in a new process."""
    code = RUN.format(bench=str(tree / "benchmarks"), nbytes=nbytes, repeats=repeats,
                      shared=shared)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if out.returncode != 0:
        raise SystemExit(f"run in {tree} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="repository root of tree A")
    parser.add_argument("--b", type=Path, default=HERE, help="repository root of tree B "
                        "(default: this one)")
    parser.add_argument("--bytes", type=int, default=3_730_000, help="message size (3.73 MB, "
                        "the digits MLP's parameters as float32)")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per run")
    parser.add_argument("--tcp", action="store_true", help="shared memory off: every byte "
                        "through TCP")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    args = parser.parse_args()
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    times: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(args.pairs):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            times[side].append(one_run(trees[side], args.bytes, args.repeats, not args.tcp,
                                       args.timeout))
        a, b = times["a"][-1], times["b"][-1]
        print(f"pair {i}: A {a * 1e3:.3f} ms  B {b * 1e3:.3f} ms  B/A {b / a:.3f}", flush=True)
    ratios = [b / a for a, b in zip(times["a"], times["b"])]
    print(f"{args.bytes / 1e6:.2f} MB push+pull{' over TCP' if args.tcp else ''}: median A "
          f"{statistics.median(times['a']) * 1e3:.3f} ms, B "
          f"{statistics.median(times['b']) * 1e3:.3f} ms; median pair ratio B/A "
          f"{statistics.median(ratios):.3f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
          f"{args.pairs} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
