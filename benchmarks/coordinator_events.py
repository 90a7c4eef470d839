"""The coordinator core's event rate: how many clocks a second `CoordinatorState` turns into
releases, with no sockets (the part the coordinator's node runs for every worker step).

    python benchmarks/coordinator_events.py [--workers 32] [--rounds 300] [--sync bsp]
    python benchmarks/coordinator_events.py --src /path/to/other/checkout/src   # an A/B side

Prints one JSON line: clocks per second (median of `--repeats`). For an A/B, run it
interleaved against another tree's `src` with `--src` and compare the medians side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def one_run(workers: int, rounds: int, sync: str) -> float:
    from paramserver.coordinator.events import Clocked, Registered, Started, TimePassed
    from paramserver.coordinator.state import CoordinatorState
    from paramserver.spec.job import JobSpec

    job = JobSpec.from_dict({"servers": 2, "workers": workers, "num_keys": 1000,
                             "sync": {"name": sync}, "batch_size": 32})
    state = CoordinatorState(job)
    t = 0.0
    for r in range(2):
        state.handle(Registered(f"srv{r}", "server", t, to=f"r{r}", link=f"L{r}",
                                addr=f"tcp://h:{r + 1}"))
    for w in range(workers):
        state.handle(Registered(f"w{w}", "worker", t, to=f"rw{w}"))
    for w in range(workers):
        state.handle(Started(f"w{w}", t, to=f"s{w}"))
    start = time.perf_counter()
    for step in range(rounds):
        for w in range(workers):
            t += 1e-4
            state.handle(Clocked(f"w{w}", step, 32, 0.01, t, to=f"c{w}-{step}"))
        state.handle(TimePassed(t))
    return workers * rounds / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--sync", default="bsp")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--src", help="import paramserver from this folder (an A/B's other side)")
    a = p.parse_args()
    if a.src:
        sys.path.insert(0, a.src)
    rates = [one_run(a.workers, a.rounds, a.sync) for _ in range(a.repeats)]
    print(json.dumps({"sync": a.sync, "workers": a.workers,
                      "clocks_per_s": round(statistics.median(rates)),
                      "min": round(min(rates)), "max": round(max(rates))}))


if __name__ == "__main__":
    main()
