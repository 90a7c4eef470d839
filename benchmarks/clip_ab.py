"""Interleaved A/B of a BSP round with and without `opt.clip_grad_norm_`: the extra time a
clipped round costs (each shard's partial to the coordinator and its factor back).

A user script (DistributedOptimizer over an MLP, torch SGD on the servers) runs as a local
job of 2 workers and 2 shards, alternately clipping each step's average (max_norm small
enough to be active) and not; rank 0 times its steps after a warm-up. The side that runs
first alternates from pair to pair, so a slow spell of this shared machine weighs on both.

  python benchmarks/clip_ab.py --pairs 6 --steps 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import paramserver

    out, clip, width = sys.argv[1], sys.argv[2] == "clip", int(sys.argv[3])
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    opt = paramserver.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                           named_parameters=model.named_parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    times, steps = [], 0
    while not opt.should_stop:
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if clip:
            opt.clip_grad_norm_(1e-3)
        opt.step()
        times.append(time.perf_counter() - t0)
        steps += 1
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times[20:], f)
    opt.close()
""")


def run(root: Path, clip: bool, steps: int, width: int) -> float:
    """Median seconds per step of rank 0 after its warm-up."""
    from paramserver.launch.jobs import script_job
    from paramserver.launch.local import LocalCluster
    from paramserver.spec.config import TrainConfig
    root.mkdir(parents=True)
    script, out = root / "train.py", root / "times.json"
    script.write_text(SCRIPT)
    cfg = TrainConfig(sync="bsp", workers=2, steps=steps, servers=2)
    LocalCluster(script_job(cfg, root), root / "run", job_timeout=600,
                 worker_cmd=[sys.executable, str(script), str(out),
                             "clip" if clip else "plain", str(width)]).run()
    return statistics.median(json.loads(out.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    args = parser.parse_args()
    plain, clipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            sides = [False, True] if i % 2 == 0 else [True, False]
            for clip in sides:
                t = run(Path(tmp) / f"{i}-{clip}", clip, args.steps, args.width)
                (clipped if clip else plain).append(t)
            print(f"pair {i}: plain {plain[-1] * 1e3:.2f} ms  clipped {clipped[-1] * 1e3:.2f} "
                  f"ms per step  (+{(clipped[-1] - plain[-1]) * 1e3:.2f} ms)", flush=True)
    extra = [c - p for p, c in zip(plain, clipped)]
    print(f"median plain {statistics.median(plain) * 1e3:.2f} ms, clipped "
          f"{statistics.median(clipped) * 1e3:.2f} ms per step; median pair difference "
          f"{statistics.median(extra) * 1e3:+.2f} ms (range {min(extra) * 1e3:+.2f} to "
          f"{max(extra) * 1e3:+.2f}, {args.pairs} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
