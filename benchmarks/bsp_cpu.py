"""CPU per BSP round by role: where a round's CPU goes (workers, server, coordinator).

Runs the job of `bsp_rounds.py`'s paramserver row (its `paramserver_job`) twice, with R1 and R2 rounds, samples
each child's CPU time (psutil) until it exits, and reports the difference per extra round, so
start-up (imports, model build) cancels out. 4 workers, 1 shard, digits MLP, batch 32. Each
role starts as its own interpreter (PARAMSERVER_FORK=0): a role forked from the launcher's
zygote has the zygote's command line, which does not name it.

Usage: python benchmarks/bsp_cpu.py [--short 400] [--long 1600]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import psutil

from bsp_rounds import paramserver_job, rounds_per_second


def _role(proc: psutil.Process) -> str:
    args = proc.cmdline()
    return next((a for a in ("coordinator", "server", "worker", "evaluator") if a in args), "")


def cpu_by_role(rounds: int) -> tuple[float, dict[str, list[float]]]:
    """(rounds/s, role -> CPU seconds of each process of that role) for one job."""
    job = paramserver_job(4, rounds)
    last: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def watch() -> None:
        me = psutil.Process()
        while not done.is_set():
            for child in me.children(recursive=True):
                try:
                    role, t = _role(child), child.cpu_times()
                    if role:
                        last[child.pid] = (role, t.user + t.system)
                except psutil.Error:
                    pass
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rate = rounds_per_second(job)
    done.set()
    watcher.join(timeout=5)
    out: dict[str, list[float]] = {}
    for role, cpu in last.values():
        out.setdefault(role, []).append(cpu)
    return rate, out


def main() -> int:
    os.environ["PARAMSERVER_FORK"] = "0"  # roles by their command lines (see the docstring)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=400, help="rounds of the short run")
    parser.add_argument("--long", type=int, default=1600, help="rounds of the long run")
    args = parser.parse_args()
    rate_s, short = cpu_by_role(args.short)
    rate_l, long = cpu_by_role(args.long)
    extra = args.long - args.short
    print(f"rounds/s: {rate_s:.1f} ({args.short} rounds), {rate_l:.1f} ({args.long} rounds)")
    total = 0.0
    for role in ("worker", "server", "coordinator"):
        # The last sample of a process is up to 50 ms before it exits: a few ms per run.
        per = (sum(long.get(role, [])) - sum(short.get(role, []))) / extra * 1000
        n = max(len(long.get(role, [])), 1)
        total += per
        print(f"{role:12s} {per / n:6.2f} ms CPU per round per process ({n} processes)")
    cores = psutil.cpu_count() or 1
    print(f"total        {total:6.2f} ms CPU per round: at most {1000 * cores / total:.0f} "
          f"rounds/s on {cores} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
