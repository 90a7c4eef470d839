"""Simulate + report at scale, interleaved A/B between two source trees.

Usage: python benchmarks/sim_report_ab.py --base /path/to/other/tree [--workers 10000]
       [--steps 100] [--sync bsp,ebsp] [--reps 3] [--base-report-reps 1] [--detail auto]

For each repeat, each policy and each tree (the order of the trees alternates by repeat):
`paramserver simulate` as a user runs it, in a child process with that tree's src/ on
PYTHONPATH. Measured: the simulator's events/s (the command's own figure, summary.json), the
whole command's wall and CPU time, the run folder's size, then `paramserver report` of that
folder: its wall time, CPU time and peak RSS (the child's getrusage). On a shared, loaded machine
the CPU seconds are the steadier figure: wall time there is mostly waiting for a core. The report of the other tree's folder can
take minutes and gigabytes (a 243 MB metrics.jsonl), so it runs only --base-report-reps times.
Prints medians per tree and policy and the ratio this tree / other tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent.parent
# Runs a paramserver command in this process and prints its peak RSS (kB) to stderr last.
_RUN = ("import resource, runpy, sys\n"
        "sys.argv = ['paramserver'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('paramserver', run_name='__main__')\n"
        "finally:\n"
        "    u = resource.getrusage(resource.RUSAGE_SELF)\n"
        "    print('PEAK_RSS_KB', u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr)\n")


def command(tree: Path, args: list[str], timeout: float) -> tuple[float, int, float]:
    """(wall seconds, peak RSS kB, CPU seconds) of `paramserver ARGS` with tree's sources."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _RUN, *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{args[0]} failed in {tree}: {out.stderr[-2000:]}")
    rss, cpu = next(line.split()[1:] for line in reversed(out.stderr.splitlines())
                    if line.startswith("PEAK_RSS_KB"))
    return wall, int(rss), float(cpu)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def one(tree: Path, name: str, sync: str, rep: int, args, tmp: Path, report: bool) -> dict:
    out = tmp / f"{name}-{sync}-{rep}"
    sim = ["simulate", "--sync", sync, "--workers", str(args.workers), "--steps",
           str(args.steps), "--compute", args.compute, "--param-bytes", args.param_bytes,
           "--out", str(out), "--quiet"]
    if name == "this" and args.detail:
        sim += ["--detail", args.detail]
    wall, rss, cpu = command(tree, sim, args.timeout)
    summary = json.loads((out / "summary.json").read_text())["simulator"]
    # events per CPU second of the whole command (imports and writing included): a lower
    # bound of the engine's rate that a loaded machine does not halve
    row = {"tree": name, "sync": sync, "events_per_s": summary["events_per_s"],
           "events_per_cpu_s": summary["events"] / cpu,
           "sim_wall": wall, "sim_cpu": cpu, "sim_rss_mb": rss / 1024,
           "folder_mb": folder_bytes(out) / 1e6}
    if report:
        row["report_wall"], kb, row["report_cpu"] = command(tree, ["report", str(out)],
                                                            args.timeout)
        row["report_rss_mb"] = kb / 1024
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
          flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the other source tree (e.g. main)")
    p.add_argument("--workers", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sync", default="bsp,ebsp")
    p.add_argument("--compute", default="const:2ms")
    p.add_argument("--param-bytes", default="400kB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--base-report-reps", type=int, default=1)
    p.add_argument("--detail", default=None, help="this tree's --detail (default: its own)")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args()
    trees = [("this", HERE), ("base", args.base.resolve())]
    rows = []
    print(f"load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        for rep in range(args.reps):
            for name, tree in (trees if rep % 2 == 0 else trees[::-1]):
                for sync in args.sync.split(","):
                    report = name == "this" or rep < args.base_report_reps
                    rows.append(one(tree, name, sync, rep, args, Path(tmp), report))
    print(f"load average at end: {os.getloadavg()}")
    keys = ("events_per_s", "events_per_cpu_s", "sim_wall", "sim_cpu", "folder_mb", "report_wall", "report_cpu",
            "report_rss_mb")
    print(f"\n{args.workers:,} workers x {args.steps} steps, medians of {args.reps} "
          f"(base report: {args.base_report_reps})")
    print(f"{'sync':6} {'tree':5} " + " ".join(f"{k:>13}" for k in keys))
    for sync in args.sync.split(","):
        med = {}
        for name, _ in trees:
            sel = [r for r in rows if r["tree"] == name and r["sync"] == sync]
            med[name] = {k: median(r[k] for r in sel if k in r) if any(k in r for r in sel)
                         else None for k in keys}
            print(f"{sync:6} {name:5} " + " ".join(
                f"{'-' if v is None else f'{v:,.2f}':>13}" for v in med[name].values()))
        print(f"{sync:6} ratio " + " ".join(
            f"{med['this'][k] / med['base'][k]:>13.3f}" if med["this"][k] and med["base"][k]
            else f"{'-':>13}" for k in keys))


if __name__ == "__main__":
    main()
