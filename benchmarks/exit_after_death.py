"""How long each role outlives the peer it depends on, started by hand (`paramserver ROLE`).

For every (role, peer) pair, with and without CURVE: start a coordinator, a shard server and
the roles the case needs as separate processes, let the job train, SIGKILL the peer and time
the role's exit. The bound the roles promise is 2 timeouts of the link that died:
`coordinator_timeout` for a role's coordinator, `heartbeat_timeout` for a worker's server and
for the coordinator's workers.

    PYTHONPATH=src python benchmarks/exit_after_death.py [--repeats 3] [--beat 0.02]
        [--timeout 2] [--json out.json]

Prints one row per case (median and worst seconds to exit, worst in timeouts) and the worst
over all. Runs about 5 processes at a time; about 2 minutes per repeat on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = [sys.executable, "-m", "paramserver"]
STARTUP = 90.0

# (role that must exit, peer killed, roles started besides the coordinator, workers in the job,
#  which timeout bounds it)
CASES = [
    ("server", "coordinator", ("server",), 1, "coordinator_timeout"),
    ("worker", "coordinator", ("server", "worker"), 1, "coordinator_timeout"),
    ("worker", "server", ("server", "worker"), 1, "heartbeat_timeout"),
    ("evaluator", "coordinator", ("server", "evaluator"), 2, "coordinator_timeout"),
    ("coordinator", "worker", ("server", "worker"), 1, "heartbeat_timeout"),
]


def _job(folder: Path, workers: int, beat: float, timeout: float) -> Path:
    from paramserver.launch.jobs import prepare_job
    from paramserver.spec.config import TrainConfig
    job = prepare_job(TrainConfig(workers=workers, servers=1, sync="asp", eval_interval=0,
                                  max_seconds=600.0, batch_size=8))
    job["limits"].update({"heartbeat_interval": beat, "heartbeat_timeout": timeout,
                          "coordinator_timeout": timeout})
    path = folder / "job.json"
    path.write_text(json.dumps(job))
    return path


def _wait(what: str, ready, procs: dict, folder: Path) -> None:
    deadline = time.monotonic() + STARTUP
    while not ready():
        for name, p in procs.items():
            if p.poll() is not None:
                tail = (folder / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} exited before {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {STARTUP:.0f} s")
        time.sleep(0.05)


def one(case, curve: bool, beat: float, timeout: float) -> float:
    """Seconds from the peer's SIGKILL to the role's exit."""
    role, peer, roles, workers, _ = case
    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="exit-after-death-") as tmp:
        folder = Path(tmp)
        keys = []
        if curve:
            from paramserver.transport import security
            security.generate(folder / "keys")
            keys = ["--keys", str(folder / "keys")]
        events, addr_file = folder / "events.jsonl", folder / "addr"

        def start(name: str, args: list[str]) -> None:
            with open(folder / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen(PY + args + keys, stdout=log,
                                               stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
        try:
            start("coordinator", ["coordinator", "--job", str(_job(folder, workers, beat,
                                                                    timeout)),
                                  "--address-file", str(addr_file), "--events", str(events)])
            _wait("the coordinator's address", addr_file.exists, procs, folder)
            addr = addr_file.read_text().strip()
            for r in roles:
                start(r, [r, "--join", addr])
            text = lambda: events.read_text() if events.exists() else ""  # noqa: E731
            mark = '"barrier_open"' if "worker" in roles else (
                '"observer_registered"' if "evaluator" in roles else '"server_joined"')
            _wait(mark, lambda: mark in text(), procs, folder)
            time.sleep(1.0)  # (beats sent after the death fill the dead peer's queue)
            os.kill(procs[peer].pid, signal.SIGKILL)
            procs[peer].wait(10)
            killed = time.monotonic()
            procs[role].wait(10 * timeout + 30)
            return time.monotonic() - killed
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--beat", type=float, default=0.02,
                    help="heartbeat_interval (s); 0.02 fills a dead peer's queue (64 "
                         "messages) within the default 2 s timeout, as 0.5 s does within 60 s")
    ap.add_argument("--timeout", type=float, default=2.0,
                    help="heartbeat_timeout and coordinator_timeout (s)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows, worst = [], (0.0, None)
    print(f"heartbeat_interval {args.beat:g} s, timeouts {args.timeout:g} s, "
          f"{args.repeats} repeats")
    print(f"{'role':<12}{'peer killed':<13}{'curve':<7}{'median s':>9}{'worst s':>9}"
          f"{'worst/timeout':>15}")
    for case in CASES:
        for curve in (False, True):
            times = [one(case, curve, args.beat, args.timeout) for _ in range(args.repeats)]
            row = {"role": case[0], "peer": case[1], "curve": curve, "bound": case[4],
                   "median_s": round(statistics.median(times), 3),
                   "worst_s": round(max(times), 3),
                   "worst_in_timeouts": round(max(times) / args.timeout, 2)}
            rows.append(row)
            if max(times) > worst[0]:
                worst = (max(times), row)
            print(f"{case[0]:<12}{case[1]:<13}{'yes' if curve else 'no':<7}"
                  f"{row['median_s']:>9.2f}{row['worst_s']:>9.2f}"
                  f"{row['worst_in_timeouts']:>15.2f}", flush=True)
    print(f"worst over all: {worst[0]:.2f} s = {worst[0] / args.timeout:.2f} timeouts "
          f"({worst[1]['role']} after its {worst[1]['peer']}'s death)")
    if args.json:
        Path(args.json).write_text(json.dumps({"beat": args.beat, "timeout": args.timeout,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
