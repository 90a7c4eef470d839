"""Interleaved A/B of a DistributedOptimizer step between two source trees: what naming the
parameters that got no gradient (client/idle_params.py, the push's `idle` keys) costs a step.

Each side is one process running a script's loop (zero_grad, forward, backward, step) on its
own tree's `src`, as a job of one worker of its own (plain python: a coordinator and a shard
of that tree, BSP). The model has `--layers` Linear(`--width`, `--width`) layers, two parameter
tensors each (100 by default). The sides take turns: a burst of `--burst` steps from one, then
from the other, the side that goes first alternating from pair to pair, so the machine's slow
spells hit both sides of a pair alike; the median of the pair ratios B/A is the result. Each
side also reports the worker process's CPU time per step.

Arms (`--arm`): `optimizer` (the script passes torch.optim.Adam: the servers run it and the
worker hooks every parameter), `model` (the script passes the model: the servers' own rule,
nothing hooked; must show no change), `unused` (Adam, with the last `--unused` layers left out
of forward: their keys go as `idle` and the servers skip them; A steps them with zeros).

  python benchmarks/idle_ab.py --a /work/main/src --b src --arm optimizer --pairs 15
  python benchmarks/idle_ab.py --a /work/main/src --b src --arm model --pairs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "src"

SIDE = textwrap.dedent("""
    import statistics, sys, time
    import torch
    import paramserver

    arm, layers, width, unused = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    used = model[:layers - unused] if arm == "unused" else model
    if arm == "model":
        opt = paramserver.DistributedOptimizer(model)
    else:
        opt = paramserver.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                               named_parameters=model.named_parameters())
    x = torch.randn(32, width)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        n = int(line)
        times, c0 = [], time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            opt.zero_grad()
            used(x).square().mean().backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        print(statistics.median(times), (time.process_time() - c0) / n, flush=True)
    opt.close()
""")


def start(src: str, args, cwd: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARAMSERVER_JOIN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = src
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen([sys.executable, "-c", SIDE, args.arm, str(args.layers),
                             str(args.width), str(args.unused)], cwd=cwd, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise SystemExit(f"side {src} did not start: {line!r}")
    return proc


def burst(proc: subprocess.Popen, n: int) -> tuple[float, float]:
    proc.stdin.write(f"{n}\n")
    proc.stdin.flush()
    wall, cpu = proc.stdout.readline().split()
    return float(wall), float(cpu)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", default=str(HERE), help="src folder of tree A (default: this one)")
    p.add_argument("--b", default=str(HERE), help="src folder of tree B (default: this one)")
    p.add_argument("--arm", choices=("optimizer", "model", "unused"), default="optimizer")
    p.add_argument("--layers", type=int, default=50)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--unused", type=int, default=5, help="layers left out (arm unused)")
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--warmup", type=int, default=100)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = start(args.a, args, tmp), start(args.b, args, tmp)
        try:
            burst(a, args.warmup)
            burst(b, args.warmup)
            ratios, cpu_ratios, walls = [], [], {"A": [], "B": []}
            for i in range(args.pairs):
                order = [("A", a), ("B", b)] if i % 2 == 0 else [("B", b), ("A", a)]
                got = {name: burst(proc, args.burst) for name, proc in order}
                ratios.append(got["B"][0] / got["A"][0])
                cpu_ratios.append(got["B"][1] / got["A"][1])
                for name in "AB":
                    walls[name].append(got[name])
        finally:
            for proc in (a, b):
                try:
                    proc.stdin.write("quit\n")
                    proc.stdin.close()
                    proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
    for name, src in (("A", args.a), ("B", args.b)):
        w = statistics.median(x for x, _ in walls[name])
        c = statistics.median(y for _, y in walls[name])
        print(f"{name} ({src}): median step {w * 1e3:.3f} ms, worker CPU {c * 1e3:.3f} ms/step")
    print(f"arm {args.arm}, {2 * args.layers} parameter tensors, {args.pairs} pairs of "
          f"{args.burst} steps: B/A median {statistics.median(ratios):.3f} (range "
          f"{min(ratios):.3f}-{max(ratios):.3f}), worker CPU B/A median "
          f"{statistics.median(cpu_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
