"""Runs a paramserver job across a NetLab: coordinator and servers on host 0, workers beyond."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paramserver.core import exits
from paramserver.launch.netlab import NetLab
from paramserver.spec.job import JobSpec
from paramserver.transport import security



# ---- a paramserver job across the lab ------------------------------------------------------------
class JobFailed(RuntimeError):
    """The job across the lab did not finish (the message carries the logs' tails)."""


@dataclass
class LabRun:
    """What run_job returns: the run folder, metrics records and each worker host's rank."""

    run_dir: Path
    records: list[dict]
    rank_of_host: dict[int, int]
    wall_s: float


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_job(lab: NetLab, job: JobSpec | dict, run_dir: Path, timeout: float = 300.0,
            port: int = 5555, python: str | None = None, keys: bool = True) -> LabRun:
    """Coordinator + servers (+ an evaluator when the job has an eval_interval) on host 0,
    worker k on host k (k = 1..workers), over TCP to host 0's address; returns when the
    coordinator is done.

    The coordinator listens on host 0's `port`: the namespace is the run's own, so a fixed port
    cannot collide, and every other role starts at once with the address it will have (they
    retry until the coordinator listens). port=0 picks a free one and waits for it instead.

    With `keys` (the default) every connection is CURVE-authenticated with a key set written to
    run_dir/keys; without, the roles bind with --insecure.

    Writes job.json, metrics.jsonl, events.jsonl, logs/*.log and results/host-K/ in run_dir.
    Every process is killed by PID before returning; the namespaces stay (lab.close()).
    """
    from paramserver.runlog.metrics import read_records

    spec = job if isinstance(job, JobSpec) else JobSpec.from_dict(job)  # bad: fails here
    workers = spec.workers
    if lab.hosts < workers + 1:
        raise ValueError(f"{workers} workers need {workers + 1} hosts, the lab has {lab.hosts}")
    python = python or sys.executable
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    job_path = run_dir / "job.json"
    job_path.write_text(json.dumps(spec.to_dict(), indent=2))
    addr_file = run_dir / "coordinator.addr"
    addr_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(security.ENV, None)
    if keys:
        security.generate(run_dir / "keys")
        env[security.ENV] = str(run_dir / "keys")
    plain = [] if keys else ["--insecure"]
    started: list[tuple[str, subprocess.Popen, Path]] = []

    def spawn(host: int, name: str, args: list[str]) -> subprocess.Popen:
        log_path = logs / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = lab.popen(host, [python, "-m", "paramserver", *args], stdout=log,
                             stderr=subprocess.STDOUT, env=env)
        started.append((name, proc, log_path))
        return proc

    def failure(msg: str) -> JobFailed:
        tails = "\n".join(f"--- {n} (exit {p.poll()}):\n{_tail(lp)}" for n, p, lp in started)
        return JobFailed(f"{msg}\n{tails}")

    host0 = lab.address(0)
    t0 = time.monotonic()
    deadline = t0 + timeout
    try:
        coord = spawn(0, "coordinator", [
            "coordinator", "--job", str(job_path), "--bind", host0, "--port", str(port),
            "--address-file", str(addr_file), "--events", str(run_dir / "events.jsonl"),
            "--metrics", str(run_dir / "metrics.jsonl"), *plain])
        while port == 0 and not addr_file.exists():
            if coord.poll() is not None or time.monotonic() > deadline:
                raise failure("the coordinator did not publish its address")
            time.sleep(0.05)
        address = f"tcp://{host0}:{port}" if port else addr_file.read_text().strip()
        for s in range(spec.servers):
            spawn(0, f"server-{s}", ["server", "--join", address, "--bind", host0, *plain])
        if spec.eval_interval:
            spawn(0, "evaluator", ["evaluator", "--join", address,
                                   "--interval", str(spec.eval_interval)])
        for k in range(1, workers + 1):
            spawn(k, f"worker-host{k}", ["worker", "--join", address,
                                         "--result-dir", str(run_dir / "results" / f"host-{k}")])
        while coord.poll() is None:
            for name, proc, _ in started:
                if name.startswith("server") and proc.poll() is not None \
                        and not exits.server_left(proc.poll()):
                    raise failure(f"{name} died")
            if time.monotonic() > deadline:
                raise failure(f"the job did not finish within {timeout:g} s")
            time.sleep(0.1)
        if coord.returncode != 0:
            raise failure(f"the coordinator ended with {exits.describe(coord.returncode)}")
        grace = time.monotonic() + 15  # servers, workers and evaluator exit on their own
        for _, proc, _ in started:
            try:
                proc.wait(timeout=max(0.0, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for _, proc, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in started:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    rank_of_host = {}
    for k in range(1, workers + 1):
        for path in (run_dir / "results" / f"host-{k}").glob("worker-*.json"):
            rank_of_host[k] = int(json.loads(path.read_text())["rank"])
    return LabRun(run_dir, read_records(run_dir / "metrics.jsonl"), rank_of_host,
                  time.monotonic() - t0)
