"""A real Ray cluster on one Linux machine: a Ray head and Ray worker nodes, one per NetLab host.

`RayLab(lab)` takes a created `NetLab` (network namespaces on a bridge, launch/netlab.py) and
runs `ray start` in each host's namespace: the head (GCS) in host 0 on host 0's address, a
worker node in every other host joined to it over the lab's network. `start()` returns once
every node is alive in the head's view (bounded: a clear error with the nodes' output tails
otherwise). `run()` and `popen()` start a driver (`paramserver train --launcher ray ...`) in a
host with the cluster's address and token in its environment; `kill_node(host)` cuts a node's
power (every process in its namespace, SIGKILL); `close()` ends every `ray start` by PID and
reaps it.

    with NetLab(3) as lab, RayLab(lab) as ray_lab:
        proc = ray_lab.run(["paramserver", "train", "--launcher", "ray",
                            "--address", ray_lab.address, ...], timeout=600)

What this takes on one machine:

- Ray 2.60 turns token authentication on for a new cluster: every node and driver is given
  the lab's token (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN`), as a real cluster's nodes would
  be, instead of reading a token file from the user's home.
- One short `--temp-dir` per lab in /tmp (sessions, logs, sockets): the nodes share a file
  system, a lab must not find another Ray session of this machine's, and Ray's socket paths
  must fit in 107 bytes.
- `nsenter --net`, as for Slurm: only the network is split, the file system and /sys stay.
- Idle worker processes are not prestarted (`RAY_enable_worker_prestart=0`): each would load
  Ray for nothing, and a node of this lab shares the machine's cores with the others.
- `head_cpus` (default 0): the head offers no CPUs, so Ray places the job's servers and
  workers on the worker nodes and only 0-CPU roles (the coordinator, pinned to the driver's
  node by the launcher) on the head.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from paramserver.launch.netlab import NetLab, _die_with_parent

__all__ = ["RayLab", "RayLabError", "ray_unavailable"]

GCS_PORT = 6379

# Run by a driver inside host 0: waits until `want` nodes are alive, prints them as JSON.
_NODES = """
import json, sys, time
import ray
want, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps([{"ip": n["NodeManagerAddress"], "id": n["NodeID"],
                   "cpus": n["Resources"].get("CPU", 0.0)} for n in nodes]))
"""


class RayLabError(RuntimeError):
    pass


def _ray_cli() -> str | None:
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.is_file() else shutil.which("ray")


def ray_unavailable() -> str | None:
    """Why a RayLab cannot run here (None when it can)."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'paramserver[ray]')"
    if _ray_cli() is None:
        return "the `ray` command is not on PATH beside this Python"
    if shutil.which("nsenter") is None:
        return "nsenter (util-linux) is not installed"
    return None


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


@dataclass
class RayLab:
    """A Ray head in host 0 and a Ray worker node in every other host of `lab`."""

    lab: NetLab
    _: KW_ONLY
    cpus: int = 4  # logical CPUs each worker node offers Ray
    head_cpus: int = 0
    state_dir: Path | None = None
    start_timeout: float = 120.0
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # host -> `ray start`
    killed: set[int] = field(default_factory=set)

    def __post_init__(self):
        reason = ray_unavailable()
        if reason:
            raise RayLabError(reason)
        if not self.lab.created:
            raise RayLabError("the NetLab is not created: call lab.create() first")
        self._own_state = self.state_dir is None
        self.state_dir = Path(self.state_dir or tempfile.mkdtemp(prefix="raylab-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Ray's sessions, apart and short: its socket paths under it must fit AF_UNIX's 107
        # bytes, which a test's tmp folder does not leave room for.
        self.ray_dir = Path(tempfile.mkdtemp(prefix="raylab-", dir="/tmp"))
        self.nodes: list[dict] = []

    # ---- names -------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """The head's GCS address, as `--address` takes it."""
        return f"{self.lab.address(0)}:{GCS_PORT}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of the lab's nodes and drivers."""
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_enable_worker_prestart": "0",
                # A dead node is declared dead within seconds, not the default ~30.
                "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}

    # ---- nodes -------------------------------------------------------------------------------
    def _start_node(self, host: int) -> None:
        common = ["--block", "--node-ip-address", self.lab.address(host),
                  "--disable-usage-stats"]
        if host == 0:
            argv = [_ray_cli(), "start", "--head", *common, "--port", str(GCS_PORT),
                    "--num-cpus", str(self.head_cpus), "--include-dashboard", "false",
                    "--temp-dir", str(self.ray_dir)]
        else:
            argv = [_ray_cli(), "start", *common, "--address", self.address,
                    "--num-cpus", str(self.cpus)]
        with open(self.state_dir / f"node{host}.out", "ab") as out:
            self.procs[host] = subprocess.Popen(
                self.lab.nsenter(host, argv), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env=self.env, preexec_fn=_die_with_parent)

    def _logs(self) -> str:
        return "\n".join(f"--- node{h} (exit {p.poll()}):\n{_tail(self.state_dir / f'node{h}.out')}"
                         for h, p in self.procs.items())

    def failure(self, msg: str) -> RayLabError:
        return RayLabError(f"{msg}\n{self._logs()}")

    def start(self) -> "RayLab":
        """The head, then the worker nodes; returns once all are alive (or raises)."""
        try:
            deadline = time.monotonic() + self.start_timeout
            # One node at a time: a node that starts before the head's GCS answers, or beside
            # another node's start on a small machine, times out registering.
            for host in range(self.lab.hosts):
                self._start_node(host)
                self._wait_started(host, deadline)
            self.nodes = self.alive(self.lab.hosts, self.start_timeout)
            if len(self.nodes) < self.lab.hosts:
                raise self.failure(f"{len(self.nodes)} of {self.lab.hosts} Ray nodes were "
                                   f"alive after {self.start_timeout:g} s")
        except BaseException:
            self.close()
            raise
        return self

    def _wait_started(self, host: int, deadline: float) -> None:
        out = self.state_dir / f"node{host}.out"
        while b"Ray runtime started" not in (out.read_bytes() if out.exists() else b""):
            if self.procs[host].poll() is not None:
                raise self.failure(f"`ray start` on node{host} exited while starting")
            if time.monotonic() > deadline:
                raise self.failure(f"node{host} had not started after {self.start_timeout:g} s")
            time.sleep(0.2)

    def alive(self, want: int, timeout: float) -> list[dict]:
        """The alive nodes ({ip, id, cpus}) once `want` are, or whatever are at `timeout`."""
        proc = self.run([sys.executable, "-c", _NODES, str(want), str(timeout)],
                        timeout=timeout + 60)
        if proc.returncode != 0:
            raise self.failure(f"the node list could not be read from the head:\n"
                               f"{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def kill_node(self, host: int) -> list[int]:
        """Cut host's power: SIGKILL every process in its namespace (its raylet, the actors'
        workers and what they started). Returns the PIDs killed."""
        if host == 0:
            raise ValueError("host 0 holds the head: killing it ends the cluster")
        self.killed.add(host)
        return self.lab.kill_host(host)

    # ---- drivers -----------------------------------------------------------------------------
    def popen(self, argv: list[str], host: int = 0, **kwargs) -> subprocess.Popen:
        """A driver command inside `host`'s namespace with the lab's address and token, left
        running (the caller waits for it, bounded, and reaps it)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs["env"] = {**self.env, **(kwargs.get("env") or {})}
        kwargs.setdefault("preexec_fn", _die_with_parent)
        return subprocess.Popen(self.lab.nsenter(host, argv), **kwargs)

    def run(self, argv: list[str], host: int = 0, timeout: float = 60.0,
            **kwargs) -> subprocess.CompletedProcess:
        """A driver command inside `host`'s namespace, to its end (bounded; its output as
        text)."""
        proc = self.popen(argv, host, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise self.failure(f"{' '.join(argv[:4])} ... did not finish in {timeout:g} s; "
                               f"its output ended:\n{(out or '')[-1500:]}\n{(err or '')[-1500:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    # ---- teardown ----------------------------------------------------------------------------
    def close(self, grace: float = 40.0) -> None:
        """SIGTERM every `ray start` (a node drains, then ends its processes), worker nodes
        before the head; SIGKILL what is left after `grace`; reap them all."""
        order = sorted(self.procs, reverse=True)
        for host in order:
            if self.procs[host].poll() is None:
                self.procs[host].terminate()
        deadline = time.monotonic() + grace
        for host in order:
            proc = self.procs[host]
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        shutil.rmtree(self.ray_dir, ignore_errors=True)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "RayLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
