"""Whether one timed batch at a worker's start could seed LB-BSP's first split: the forward and
backward times of the first few batches of the digits MLP and CNN (batch 32, one thread), each
run in a fresh process, as a worker's first steps would be.

LB-BSP splits its first round evenly (no speed measured yet). A prior from one batch timed at
start is honest only if that batch says the worker's speed; the first batch pays the lazy
initialisation (allocator, kernels), and on a shared host one batch is noise. The rows show
both: the first batch against the median of the later ones, and the spread across processes.

  python benchmarks/first_batch_timing.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CODE = r"""
import json, time, torch
torch.set_num_threads(1)
from paramserver.data.digits import load_digits
from paramserver.models.nets import cnn, mlp
X = torch.as_tensor(load_digits().train.X[:32]).float()
y = torch.zeros(32, dtype=torch.long)
out = {}
for name, model, shape in (("mlp", mlp((64,), 10), (64,)), ("cnn", cnn((1, 8, 8), 10),
                                                          (1, 8, 8))):
    loss, xb, times = torch.nn.CrossEntropyLoss(), X.reshape(32, *shape), []
    for _ in range(BATCHES):
        t = time.perf_counter()
        model.zero_grad()
        loss(model(xb), y).backward()
        times.append(time.perf_counter() - t)
    out[name] = times
print(json.dumps(out))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="fresh processes")
    p.add_argument("--batches", type=int, default=8, help="batches timed per process")
    args = p.parse_args()
    rows: dict[str, list[list[float]]] = {}
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CODE.replace("BATCHES",
                                                                  str(args.batches))],
                              capture_output=True, text=True, timeout=300, check=True)
        for name, times in json.loads(done.stdout).items():
            rows.setdefault(name, []).append(times)
    print("| model | first ms (per run) | 2nd ms (per run) | median of later ms | "
          "first / later | spread of 2nd across runs |")
    print("|---|---|---|---|---|---|")
    for name, runs in rows.items():
        first = [r[0] * 1e3 for r in runs]
        second = [r[1] * 1e3 for r in runs]
        later = statistics.median(t * 1e3 for r in runs for t in r[2:])
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in first)} | "
              f"{', '.join(f'{v:.1f}' for v in second)} | {later:.2f} | "
              f"{statistics.median(first) / later:.1f}x | "
              f"{max(second) / min(second):.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
