"""Benchmark: suspend time per step under per-layer request scheduling, fifo vs lifo vs stalest.

    PYTHONPATH=src .venv/bin/python benchmarks/layer_schedule.py --out runs/layer-schedule

Digits MLP, ASP, `--workers` workers; the server's link is emulated (`--link s=RATE`, default
500mbit) so that it is the bottleneck: a shaped server sends pull replies one after the other
at RATE, while the workers' own sends do not block (an emulated link blocks the sender, so a
worker-side link would hide the overlap of pushes with backward). Each schedule (and `off`,
the whole-model pull and push) runs `--repeats` times, the schedules taking turns repeat by
repeat so that machine load hits them alike. Printed per schedule: the median over all worker
steps of suspend_s (for `off`: pull_s + push_s, the time it is blocked on requests), of
pull/push time, of the step time (record to record) and the mean per-layer staleness.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SCHEDULES = ["off", "fifo", "lifo", "stalest"]


def run(schedule: str, folder: Path, args) -> None:
    cmd = [sys.executable, "-m", "paramserver", "train", "--sync", args.sync,
           "--workers", str(args.workers), "--steps", str(args.steps), "--eval-interval", "0",
           "--link", f"s={args.link}", "--schedule", schedule, "--quiet",
           "--heartbeat-timeout", "30", "--device-time", args.device_time, "--out", str(folder)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def steps_of(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "step"]


def summarize(folders: list[Path]) -> dict:
    recs = [r for f in folders for r in steps_of(f)]
    recs = [r for r in recs if r["step"] >= 2]  # the first steps warm up
    blocked = [r.get("suspend_s", r["pull_s"] + r["push_s"]) for r in recs]
    layers = sorted(k for k in recs[0] if k.startswith("staleness_layer_"))
    by_worker: dict = {}
    for f in folders:
        for r in steps_of(f):
            by_worker.setdefault((f, r["worker"]), []).append(r["t"])
    gaps = [b - a for ts in by_worker.values() for a, b in zip(ts, ts[1:])]
    return {"suspend_ms": 1e3 * statistics.median(blocked),
            "pull_ms": 1e3 * statistics.median(r["pull_s"] for r in recs),
            "push_ms": 1e3 * statistics.median(r["push_s"] for r in recs),
            "step_ms": 1e3 * statistics.median(gaps),
            "layer_staleness": [round(statistics.mean(r[k] for r in recs), 2) for k in layers],
            "steps": len(recs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/layer-schedule")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sync", default="asp")
    p.add_argument("--link", default="500mbit")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device-time", default="off",
                   help="emulated compute per sample (e.g. 1ms): a sleep after backward, "
                        "during which the layer pushes already sent are on their way")
    p.add_argument("--table-only", action="store_true", help="summarize an earlier --out")
    args = p.parse_args()
    out = Path(args.out)
    if not args.table_only:
        for rep in range(args.repeats):
            for s in SCHEDULES:
                print(f"rep {rep}: {s}", flush=True)
                run(s, out / s / f"rep-{rep}", args)
    print("| schedule | blocked on requests per step (ms, median) | pull (ms) | push (ms) | "
          "step (ms) | mean staleness per layer | steps |")
    print("|---|---|---|---|---|---|---|")
    for s in SCHEDULES:
        folders = sorted((out / s).glob("rep-*"))
        if folders:
            m = summarize(folders)
            print(f"| {s} | {m['suspend_ms']:.1f} | {m['pull_ms']:.1f} | {m['push_ms']:.1f} | "
                  f"{m['step_ms']:.1f} | {m['layer_staleness'] or '-'} | {m['steps']} |")


if __name__ == "__main__":
    main()
