"""How long a job stands still when one of its shard servers is SIGKILLed and restarted.

A `paramserver train` job (BSP, digits MLP, 2 workers, 2 shards, `--restart-servers 1`,
checkpoints every 10 rounds) runs for a few seconds; then one shard's process is killed. The
stall is the longest gap between consecutive step records (any worker) from the kill on: the
restart, the restore and whatever the workers wait on before their next step. The variants
take turns `--repeats` times; `--schedule` adds per-layer requests (`fifo`), `--a TREE` runs
another source tree's code (its `src` on PYTHONPATH) as an interleaved A/B.

Usage: python benchmarks/restart_stall.py [--repeats 3] [--schedule off,fifo] [--a TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUNNER = r"""
import os, signal, sys, time
from pathlib import Path
from paramserver.launch.jobs import prepare_job
from paramserver.launch.local import LocalCluster
from paramserver.spec.config import TrainConfig
out, schedule = Path(sys.argv[1]), sys.argv[2]
cfg = TrainConfig(sync="bsp", workers=2, servers=2, max_seconds=12, eval_interval=0,
                  restart_servers=1, checkpoint_dir=str(out / "ckpt"), checkpoint_every=10,
                  schedule=schedule)
cluster = LocalCluster(prepare_job(cfg), out / "run", job_timeout=120,
                       restart_servers=cfg.restart_servers)
state = {"t0": None, "killed": False}
def tick():
    now = time.monotonic()
    metrics = out / "run" / "metrics.jsonl"
    if state["t0"] is None and metrics.exists() and metrics.stat().st_size > 0:
        state["t0"] = now
    if state["t0"] is not None and not state["killed"] and now - state["t0"] > 3.0:
        victim = next(c for c in cluster.children if c.role == "server" and c.index == 1)
        os.kill(victim.proc.pid, signal.SIGKILL)
        state["killed"] = True
cluster.run(on_tick=tick)
"""


def stall(run: Path) -> float:
    """The longest gap between consecutive step records (job clock), from the last step
    before the restart record through the next 20."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = sorted(r["t"] for r in records if r.get("kind") == "step")
    restart = [r["t"] for r in records if r.get("kind") == "restart"]
    if not restart:
        raise RuntimeError(f"{run}: no server restart was recorded")
    before = sum(1 for t in steps if t <= restart[0])
    seq = steps[max(before - 1, 0):before + 20]
    if before == 0 or len(seq) < 2:
        raise RuntimeError(f"{run}: no steps on both sides of the restart")
    return max(b - a for a, b in zip(seq, seq[1:]))


def one(src: Path, schedule: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(src)}
        p = subprocess.run([sys.executable, "-c", RUNNER, tmp, schedule], env=env,
                           capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        return stall(Path(tmp) / "run")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--schedule", default="off", help="comma-separated: off, fifo, ...")
    ap.add_argument("--a", type=Path, help="another tree, run in turn with this one")
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    trees = {"this": here / "src"}
    if args.a:
        trees = {"a": args.a.resolve() / "src", **trees}
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for schedule in args.schedule.split(","):
            for name, src in trees.items():
                s = one(src, schedule)
                got.setdefault((name, schedule), []).append(s)
                print(f"repeat {r} {name} schedule={schedule}: stall {s * 1e3:.0f} ms",
                      flush=True)
    print("tree     schedule  median stall (ms)  repeats")
    for (name, schedule), v in got.items():
        print(f"{name:<8} {schedule:<9} {statistics.median(v) * 1e3:17.0f}  "
              f"{', '.join(f'{x * 1e3:.0f}' for x in v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
