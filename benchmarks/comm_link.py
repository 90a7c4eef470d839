"""Benchmark: gradient pruning over an emulated 100 Mbit/s link, digits MLP, 4 workers, BSP.

    PYTHONPATH=src .venv/bin/python benchmarks/comm_link.py --out runs/comm-link
    PYTHONPATH=src .venv/bin/python benchmarks/comm_link.py --table-only runs/comm-link

Runs `paramserver compare` once with every pruning setting as a --compress-variant (dense,
topk 10%/1%/0.1%, std k=1/2/3, dynamic; each with and without error feedback), so the
compare report (report.html in the output folder) holds the same runs, then prints a markdown
table: push bytes per worker step, median push and pull seconds per step, wall time to the
target accuracy, final and best accuracy.
The runs go one after the other (not interleaved repeats): on a shared machine the load
drifts between them, so compare times of runs far apart with care (see --repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = ["dense=none"] + [
    f"{label}{suffix}={spec}{opt}"
    for label, spec in [("topk-10%", "topk:fraction=0.1"), ("topk-1%", "topk:fraction=0.01"),
                        ("topk-0.1%", "topk:fraction=0.001"), ("std-k1", "std:k=1"),
                        ("std-k2", "std:k=2"), ("std-k3", "std:k=3"), ("dynamic", "dynamic")]
    for suffix, opt in [("", ""), ("-noEF", ":error_feedback=false")]]


def run_compare(out: Path, args) -> None:
    cmd = [sys.executable, "-m", "paramserver", "compare", "--sync", "bsp", "--no-single",
           "--scenario", "homogeneous", "--link", args.link, "--device-time", "off",
           "--epochs", str(args.epochs), "--lr", str(args.lr), "--eval-interval", "0.5",
           "--target", str(args.target), "--heartbeat-timeout", str(args.heartbeat_timeout), "--repeats", str(args.repeats), "--quiet",
           "--out", str(out)]
    for v in VARIANTS:
        if not args.only or v.split("=", 1)[0] in args.only.split(","):
            cmd += ["--compress-variant", v]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def table(out: Path, target: float) -> str:
    rows = ["| setting | push bytes/step | vs dense | push s/step | pull s/step | time to "
            f"{target:g} (s) | final acc. | best acc. | wall (s) |",
            "|---|---|---|---|---|---|---|---|---|"]
    dense = None
    for folder in sorted((out / "runs").glob("*/*/rep-*"), key=_plan_order(out)):
        if not (folder / "summary.json").exists():
            continue  # failed or still running
        s = json.loads((folder / "summary.json").read_text())
        label = folder.parent.name.split("+", 1)[-1]
        push = s.get("push_bytes_per_step") or 0.0
        dense = push if label == "dense" else dense
        tta = (s.get("time_to_accuracy") or {}).get(f"{target:g}")
        steps = [r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
                 if r.get("kind") == "step"]
        push_s = statistics.median(r["push_s"] for r in steps)
        pull_s = statistics.median(r["pull_s"] for r in steps)
        rows.append(f"| {label} (rep {folder.name[4:]}) | {push:,.0f} | "
                    f"{'' if not dense else f'{push / dense:.4f}'} | {push_s:.3f} | {pull_s:.3f} | "
                    f"{'not reached' if tta is None else f'{tta:.1f}'} | "
                    f"{s['final_test_accuracy']:.4f} | {s['best_test_accuracy']:.4f} | "
                    f"{s['wall_time_s']:.1f} |")
    return "\n".join(rows)


def _plan_order(out: Path):
    order = {f"bsp+{v.split('=', 1)[0]}": i for i, v in enumerate(VARIANTS)}
    return lambda f: (order.get(f.parent.name, 99), f.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/comm-link")
    p.add_argument("--table-only", metavar="DIR", help="print the table of an earlier run")
    p.add_argument("--link", default="100mbit")
    p.add_argument("--epochs", type=float, default=12.0)
    p.add_argument("--heartbeat-timeout", type=float, default=30.0,
                   help="generous: on a crowded machine a worker building its model may "
                        "miss heartbeats for seconds and be declared dead")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--only", help="comma-separated labels of the settings to run, e.g. "
                                  "dense,topk-1%%,topk-1%%-noEF")
    args = p.parse_args()
    out = Path(args.table_only or args.out)
    if not args.table_only:
        run_compare(out, args)
    print(table(out, args.target))


if __name__ == "__main__":
    main()
