"""What one decision of `--sync auto` costs, and what auto adds to every push.

    python benchmarks/auto_decision.py [--workers 4,64,1000] [--window 16] [--repeats 5]

Two figures per worker count, medians of `--repeats`:

- decide_us: one SwitchController.decide over every candidate (the forecasts from each
  worker's pace, the choice), with the paces made as the policy makes them at a decision;
- push_us_auto / push_us_bsp: the PolicyHost's cost per push under auto (candidate bsp in
  force, a decision every 2 s of virtual time) against plain BSP, on the same virtual cluster
  (one worker 3x slow), so the ratio is auto's overhead on the coordinator's hot path.

Prints one JSON line per worker count.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import time


def decide_us(workers: int, window: int, repeats: int) -> float:
    from paramserver.policies.auto import AutoSync
    from paramserver.policies.pace import PaceBook

    book = PaceBook(window)
    t = 0.0
    for step in range(window):
        for w in range(workers):
            book.released(w, t)
            book.pushed(w, t + 0.01 * (3 if w == 0 else 1) * (1 + 0.1 * (step % 3)), 32,
                        0.009 * (3 if w == 0 else 1))
        t += 1.0
    policy = AutoSync(32, interval=1e-9, window=window)
    ctl = policy.controller
    times = []
    for _ in range(repeats):
        n = max(1, 20000 // workers)
        start = time.perf_counter()
        for i in range(n):
            ctl.next_at = 0.0
            paces = {w: book.pace(w, 32) for w in range(workers)}
            ctl.decide(1.0 + i, "bsp", paces, 32)
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def push_us(sync: str, workers: int, pushes: int) -> float:
    from paramserver.policies import PolicyHost, Pushed, Release, make_policy

    host = PolicyHost(make_policy(sync, 32, **({"candidates": "bsp"} if sync == "auto" else {})))
    queue: list = []
    t = 0.0

    def take(out, now):
        for d in out:
            if type(d) is Release:
                cost = 0.03 if d.worker == 0 else 0.01
                heapq.heappush(queue, (now + cost, d.worker, d.step, d.batch_size, cost))

    take(host.joined_all(range(workers), 0.0), 0.0)
    spent = 0.0
    for _ in range(pushes):
        t, w, step, batch, cost = heapq.heappop(queue)
        start = time.perf_counter()
        out = host.pushed(Pushed(w, step, t, batch, cost * 0.9))
        spent += time.perf_counter() - start
        take(out, t)
    return spent / pushes * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="4,64,1000")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pushes", type=int, default=40000)
    args = ap.parse_args()
    for n in (int(x) for x in args.workers.split(",")):
        decide = decide_us(n, args.window, args.repeats)
        auto, bsp = [], []
        for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
            auto.append(push_us("auto", n, args.pushes))
            bsp.append(push_us("bsp", n, args.pushes))
        a, b = statistics.median(auto), statistics.median(bsp)
        print(json.dumps({"workers": n, "window": args.window, "decide_us": round(decide, 2),
                          "push_us_auto": round(a, 3), "push_us_bsp": round(b, 3),
                          "auto_over_bsp": round(a / b, 3)}), flush=True)


if __name__ == "__main__":
    main()
