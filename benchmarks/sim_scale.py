"""Simulator at scale: 10,000 workers x 100 steps under every sync policy, engine events per second.

Usage: python benchmarks/sim_scale.py [--workers 10000] [--steps 100] [--sync bsp,asp] [--write]
       [--budget SECONDS]

For each policy: wall time, simulator events/s, worker steps/s, the share of the wall time spent
inside the policy's handle() and, for ebsp, inside the ZipLine search (paramserver.zipline.search,
timed by wrapping it). By default records go to a null sink (the engine alone); --write also
writes the run folder's logs into a temporary folder, as `paramserver simulate` does: every step
as a metrics.jsonl line (--detail steps, the default here) or into steps.npz only (--detail
summary, what `simulate` does past 200,000 step records).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from paramserver import zipline
from paramserver.policies import SYNC_POLICIES, make_policy
from paramserver.sim import Engine, Network, NullSink, parse_compute
from paramserver.sim.records import RunWriter


class Stopwatch:
    """Accumulates the time spent in a wrapped callable."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1


def run_one(sync: str, args, out_dir: Path | None) -> dict:
    policy = make_policy(sync, args.batch_size)
    handle = policy.handle = Stopwatch(policy.handle)
    search = zipline.search = Stopwatch(ZIPLINE_SEARCH)  # ebsp calls zipline.search at runtime
    cost = parse_compute(args.compute).bind(args.workers, args.steps, 0)
    net = Network(args.param_bytes, args.bandwidth, args.latency)
    sink = (RunWriter(out_dir / sync, round(args.param_bytes), detail=args.detail == "steps")
            if out_dir else NullSink())
    engine = Engine(policy, args.workers, args.steps, cost, net, sink=sink)
    t0 = time.perf_counter()
    while not engine.run(50_000) and time.perf_counter() - t0 < args.budget:
        pass  # a policy that scales badly is cut off and reported with the steps it reached
    wall = time.perf_counter() - t0
    if out_dir:
        sink.close()
    return {"sync": sync, "wall": wall, "events": engine.events, "steps": engine.steps_done,
            "virtual": engine.now, "policy": handle.seconds / wall,
            "zipline": search.seconds / wall if search.calls else None,
            "searches": search.calls}


def table(rows: list[dict], args) -> Table:
    t = Table(title=f"simulator: {args.workers:,} workers x {args.steps} steps, {args.compute}, "
                    f"{args.param_bytes / 1e6:g} MB model at {args.bandwidth / 1e9:g} GB/s, "
                    f"latency {args.latency * 1e6:g} us" + (f", writing logs ({args.detail})" if args.write else ""))
    for col in ("sync", "wall s", "steps done", "events", "events/s", "steps/s", "virtual s",
                "in policy", "in ZipLine (searches)"):
        t.add_column(col, justify="left" if col == "sync" else "right")
    for r in rows:
        zl = "-" if r["zipline"] is None else f"{r['zipline']:.1%} ({r['searches']})"
        done = f"{r['steps']:,}" + ("" if r["steps"] == args.workers * args.steps else " (cut)")
        t.add_row(r["sync"], f"{r['wall']:.1f}", done, f"{r['events']:,}",
                  f"{r['events'] / r['wall']:,.0f}", f"{r['steps'] / r['wall']:,.0f}",
                  f"{r['virtual']:.2f}", f"{r['policy']:.1%}", zl)
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sync", default=",".join(SYNC_POLICIES.names()),
                   help="comma-separated policies (default: every registered one)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compute", default="lognormal:2ms:0.3")
    p.add_argument("--param-bytes", type=float, default=1e6, help="bytes (default 1e6)")
    p.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s (default 10 Gbit/s)")
    p.add_argument("--latency", type=float, default=50e-6, help="seconds (default 50 us)")
    p.add_argument("--write", action="store_true", help="also write the run logs")
    p.add_argument("--detail", choices=("steps", "summary"), default="steps",
                   help="with --write: step lines in metrics.jsonl, or steps.npz only")
    p.add_argument("--budget", type=float, default=600.0,
                   help="wall seconds per policy before it is cut off (default 600)")
    args = p.parse_args()
    console = Console(width=130)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for sync in args.sync.split(","):
            console.print(f"{sync} ...", end=" ")
            rows.append(run_one(sync, args, Path(tmp) if args.write else None))
            console.print(f"{rows[-1]['wall']:.1f} s")
    console.print(table(rows, args))


ZIPLINE_SEARCH = zipline.search

if __name__ == "__main__":
    main()
