"""Benchmark: value codecs side by side on an emulated 100 Mbit/s link and on a fast one
(issue 22), with one straggler: time to a target accuracy, bytes per step, final accuracy.

    PYTHONPATH=src .venv/bin/python benchmarks/codec_link_compare.py --out runs/codec-link
    PYTHONPATH=src .venv/bin/python benchmarks/codec_link_compare.py --table-only runs/codec-link

Runs `paramserver compare` (BSP, the `one-slow` scenario: worker 1 computes 3x slower) once per
link with every variant as a --compress-variant: dense, bf16, 8-bit (uniform8), top-k 1%,
random-k 1% and PowerSGD rank 4, the compressed ones pulling deltas too (`pull=` in the
variant). `slow` shapes every worker's link to --link (100 Mbit/s each way, servers unshaped);
`fast` has no link emulation (loopback, shared memory on one host). Each link's folder holds
compare's own report.html; this script prints one markdown table of both, with each variant's
speed-up over dense on the same link: BytePS's published shape is several-fold on a slow link
and little or none on a fast one.

The runs go one after the other; the load drifts between them (the script prints the load
average before and after each link). Each run is bounded by --max-seconds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# label=push format:options:pull=pull codec. The pulls of the compressed variants are deltas
# since the worker's last pull (a dense refresh every 20th): bf16 pulls for bf16, 8-bit pulls
# for the others (a delta of the server's values after a top-k, random-k or low-rank push is
# dense: every worker's contribution lands in it).
VARIANTS = [
    "dense=none",
    "bf16=bf16:pull=bf16",
    "8bit=uniform8:pull=uniform8",
    "topk1%=topk:fraction=0.01:pull=uniform8",
    "randomk1%=randomk:fraction=0.01:pull=uniform8",
    "powersgd-r4=powersgd:rank=4:pull=uniform8",
]
LINKS = {"slow": ["--link", "100mbit"], "fast": []}
LINK_BITS = 100e6


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def compare_command(out: Path, link: str, args) -> list[str]:
    cmd = [sys.executable, "-m", "paramserver", "compare", "--sync", "bsp", "--no-single",
           "--scenario", "one-slow", "--workers", str(args.workers),
           "--dataset", args.dataset, "--lr", str(args.lr), "--batch-size", str(args.batch),
           "--epochs", str(args.epochs),
           "--max-seconds", str(args.max_seconds if link == "slow" else args.fast_max_seconds),
           "--eval-interval", str(args.eval_interval), "--target", str(args.target),
           "--seed", str(args.seed), "--quiet", "--out", str(out / link), *LINKS[link]]
    if args.dataset == "mnist":
        cmd += ["--data-dir", args.data_dir]
    for v in VARIANTS:
        if not args.only or v.split("=", 1)[0] in args.only.split(","):
            cmd += ["--compress-variant", v]
    return cmd


def rows(out: Path, link: str) -> dict[str, dict]:
    """label -> results.csv row of that link's compare, with its run's samples/s."""
    path = out / link / "results.csv"
    if not path.exists():
        return {}
    got = {}
    for r in csv.DictReader(path.open()):
        label = r["policy"].split("+", 1)[-1]
        got[label] = r
    return got


def time_to(folder: Path, target: float) -> float | None:
    """Seconds until the run's test accuracy first reached `target` (its metrics.jsonl), so
    --table-only can read the same runs at another target."""
    from paramserver.runlog.metrics import evaluations, read_records, time_to_accuracy
    evals = evaluations(read_records(folder / "metrics.jsonl"))
    return time_to_accuracy(evals, (target,))[f"{target:g}"]


def rounds_to(folder: Path, target: float) -> int | None:
    """The server version (BSP: rounds) at the first evaluation at or above `target`: what the
    variant needs in updates, whatever a round costs."""
    from paramserver.runlog.metrics import evaluations, read_records
    return next((e.get("version") for e in evaluations(read_records(folder / "metrics.jsonl"))
                 if (e.get("accuracy") or 0) >= target), None)


def _f(x, fmt: str, none: str = "-") -> str:
    return none if x in ("", None) else format(float(x), fmt)


def table(out: Path, target: float) -> str:
    lines = [f"| variant | link | push B/step | pull B/step | time to {target:g} (s) | "
             f"speed-up vs dense | rounds to {target:g} | final acc | rounds/s | "
             f"link s/round | server busy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for link in LINKS:
        got = rows(out, link)
        dense = time_to(Path(got["dense"]["run_folder"]), target) if "dense" in got else None
        for label, r in got.items():
            tta = time_to(Path(r["run_folder"]), target)
            speed = (f"{float(dense) / float(tta):.2f}x" if dense and tta else "-")
            summary = json.loads((Path(r["run_folder"]) / "summary.json").read_text())
            # BSP: one server update per round
            rounds = summary["updates_applied"] / summary["wall_time_s"]
            # what a round's push and pull alone take on the link (slow: --link's rate)
            per_round = float(r["push_bytes_per_step"]) + float(r["pull_bytes_per_step"])
            link_s = f"{per_round * 8 / LINK_BITS:.3f}" if link == "slow" else "-"
            busy = max((v["busy_fraction"] for v in summary.get("per_shard", {}).values()),
                       default=None)
            lines.append(
                f"| {label} | {link} | {_f(r['push_bytes_per_step'], ',.0f')} | "
                f"{_f(r['pull_bytes_per_step'], ',.0f')} | "
                f"{_f(tta, '.1f', 'not reached')} | {speed} | "
                f"{rounds_to(Path(r['run_folder']), target) or '-'} | "
                f"{_f(r['final_score'], '.4f')} | "
                f"{rounds:.2f} | {link_s} | {_f(busy, '.0%')} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/codec-link")
    p.add_argument("--links", default="slow,fast", help="which of slow,fast to run")
    p.add_argument("--only", help="comma-separated variant labels (default all)")
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir", default="../shared/fixtures/mnist")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--max-seconds", type=float, default=150)
    p.add_argument("--fast-max-seconds", type=float, default=60)
    p.add_argument("--eval-interval", type=float, default=2)
    p.add_argument("--target", type=float, default=0.92)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table-only", action="store_true", help="print the table of --out")
    args = p.parse_args()
    out = Path(args.out)
    if not args.table_only:
        for link in args.links.split(","):
            cmd = compare_command(out, link, args)
            print(f"# {link}: load average {load()} at {time.strftime('%H:%M:%S')} UTC",
                  flush=True)
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            print(f"# {link} done: load average {load()} at {time.strftime('%H:%M:%S')} UTC",
                  flush=True)
    print(table(out, args.target))


if __name__ == "__main__":
    main()
