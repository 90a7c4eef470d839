"""Fixed-rate ASP against staleness-aware update rules with many logical workers and a large lr.

Trains the digits MLP for real on the simulated ASP schedule (`paramserver simulate --train`)
with each update rule and prints the final test accuracy and mean staleness side by side.

Usage: python benchmarks/staleness_rules.py [--workers 64] [--lr 0.4] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RULES = ("sgd", "dynsgd", "staleness-aware")


def run(rule: str, args, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "paramserver", "simulate", "--sync", "asp",
                    "--workers", str(args.workers), "--steps", str(args.steps), "--train",
                    "--model", "mlp", "--lr", str(args.lr), "--optimizer", rule,
                    "--compute", "lognormal:2ms:0.3", "--eval-interval", "0.2",
                    "--seed", str(args.seed), "--out", str(out), "--quiet"],
                   check=True, capture_output=True, timeout=1800)
    return json.loads((out / "summary.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"ASP, {args.workers} simulated workers x {args.steps} steps, lr {args.lr}, digits MLP")
    print(f"{'rule':>16} {'final acc':>9} {'best acc':>9} {'mean staleness':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        for rule in RULES:
            s = run(rule, args, Path(tmp) / rule)
            print(f"{rule:>16} {s['final_test_accuracy']:9.4f} {s['best_test_accuracy']:9.4f} "
                  f"{s['mean_staleness']:15.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
