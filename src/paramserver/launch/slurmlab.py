"""A real Slurm cluster on one Linux machine: slurmctld and one slurmd per NetLab host.

`SlurmLab(lab)` takes a created `NetLab` (network namespaces on a bridge, launch/netlab.py)
and runs Debian's slurm-wlm on it: one munged (its socket in the lab's state folder, which
every namespace sees: namespaces split the network, not the file system), slurmctld in host
0's namespace and `slurmd -N nodeI` in host I's namespace, node I's NodeAddr being host I's
address. `start()` returns once every node is idle (bounded: a clear error with the daemons'
log tails otherwise); `sbatch()`, `job()` and `wait_job()` drive jobs through the client
commands run inside host 0; `close()` cancels what is left, ends every daemon by PID, reaps
it and removes nothing of the lab's (the NetLab's own close() removes the namespaces and
whatever still runs inside them).

    with NetLab(3) as lab, SlurmLab(lab, state_dir) as slurm:
        job_id = slurm.sbatch(["--nodes=3", "script.sbatch", "job.json"], cwd=run_dir)
        info = slurm.wait_job(job_id, timeout=180)   # {"JobState": "COMPLETED", ...}

What this takes in a container without systemd or a writable cgroup tree (Slurm 22.05):

- `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, `JobAcctGatherType=none`,
  no accounting daemon (`AccountingStorageType=none`): nothing needs a cgroup of its own.
- slurmd 22.05 still loads its cgroup plugin at start and refuses to run when
  /sys/fs/cgroup has no cgroup file system. `ip netns exec` mounts a fresh sysfs for the
  namespace (hiding /sys/fs/cgroup), so every daemon and client is started with
  `nsenter --net=/run/netns/NAME` instead, which switches the network namespace only.
- Every node has the same kernel hostname, so each slurmd is told its node name (`-N`);
  the controller's `SlurmctldHost` is this machine's hostname (slurmctld checks it) with
  host 0's address in parentheses.
- `SlurmdParameters=config_overrides`: the nodes offer `cpus` CPUs each whatever the
  machine has, so a batch script's `--cpus-per-task` fits on a small machine.
- `SlurmdSpoolDir`, pid and log files carry `%n` (node name): several slurmd share one file
  system. `AuthInfo=...,cred_expire=10`: a requeued job waits cred_expire before it starts
  again (120 s by default). `MinJobAge` keeps a finished job in `scontrol show job` for an hour (there is no
  slurmdbd, so no sacct).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from paramserver.launch.netlab import NetLab, _die_with_parent

__all__ = ["SlurmLab", "SlurmLabError", "slurm_unavailable", "TERMINAL_STATES"]

_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun", "nsenter")
# Slurm's job states from which a job does not move on by itself (REQUEUED jobs go PENDING).
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})


class SlurmLabError(RuntimeError):
    """A daemon did not start, a node did not come up, a command failed (with log tails)."""


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def slurm_unavailable() -> str | None:
    """None when Slurm and munge are installed here; otherwise what is missing (for a skip)."""
    missing = [n for n in (*_DAEMONS, *_CLIENTS) if _binary(n) is None]
    if missing:
        return (f"{', '.join(missing)} not installed "
                "(apt-get install slurm-wlm munge util-linux)")
    return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def parse_record(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output (one record, KEY=VALUE separated by spaces) as a dict.

    Values with spaces (Command=..., a path with blanks) keep the words up to the next KEY=.
    """
    out: dict[str, str] = {}
    key = None
    for word in text.strip().split(" "):
        m = re.match(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", word)
        if m:
            key = m.group(1)
            out[key] = m.group(2)
        elif key is not None:
            out[key] += " " + word
    return out


@dataclass
class SlurmLab:
    """slurmctld + one slurmd per host of `lab`; see the module doc."""

    lab: NetLab
    state_dir: Path | None = None
    cpus: int = 4  # CPUs each node offers (SlurmdParameters=config_overrides)
    partition: str = "lab"
    start_timeout: float = 60.0
    cluster: str = "pslab"
    cred_expire: int = 10  # seconds; a requeued job may start again after it
    extra_conf: str = ""  # more slurm.conf lines (they come before the node lines)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self):
        reason = slurm_unavailable()
        if reason:
            raise SlurmLabError(reason)
        if not self.lab.created:
            raise SlurmLabError("the NetLab is not created: call lab.create() first")
        self._own_state = self.state_dir is None
        self.state_dir = Path(self.state_dir or tempfile.mkdtemp(prefix="slurmlab-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # munged wants its socket's folder (and those above it) reachable by every user.
        os.chmod(self.state_dir, 0o755)
        self.conf = self.state_dir / "slurm.conf"
        self.munge_socket = self.state_dir / "munge" / "munge.socket"

    # ---- names -------------------------------------------------------------------------------
    def node(self, host: int) -> str:
        self.lab._check_host(host)
        return f"node{host}"

    @property
    def nodes(self) -> list[str]:
        return [self.node(h) for h in range(self.lab.hosts)]

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm's clients (and a job's submitter): SLURM_CONF set."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # ---- configuration -----------------------------------------------------------------------
    def slurm_conf(self) -> str:
        s = self.state_dir
        hosts = self.lab.hosts
        nodes = f"node[0-{hosts - 1}]" if hosts > 1 else "node0"
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={socket.gethostname()}({self.lab.address(0)})",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire also holds a requeued job back that long (default 120 s).
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}",
            "SlurmUser=root", "SlurmdUser=root",
            "SlurmctldPort=6817", "SlurmdPort=6818",
            f"StateSaveLocation={s}/ctld",
            f"SlurmdSpoolDir={s}/spool/%n",
            f"SlurmctldPidFile={s}/slurmctld.pid", f"SlurmdPidFile={s}/slurmd-%n.pid",
            f"SlurmctldLogFile={s}/slurmctld.log", f"SlurmdLogFile={s}/slurmd-%n.log",
            f"PlugStackConfig={s}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "MpiDefault=none",
            # Pending jobs are looked at every 2 s, not every 30-60 s (a requeued one too).
            "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=2,bf_interval=2",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=5", "SlurmdTimeout=60", "InactiveLimit=0",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            *[ln for ln in self.extra_conf.splitlines() if ln.strip()],
        ]
        for h in range(hosts):
            lines.append(f"NodeName={self.node(h)} NodeAddr={self.lab.address(h)} "
                         f"CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName={self.partition} Nodes={nodes} Default=YES "
                     "MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _write_files(self) -> None:
        s = self.state_dir
        (s / "ctld").mkdir(exist_ok=True)
        for n in self.nodes:
            (s / "spool" / n).mkdir(parents=True, exist_ok=True)
        munge = s / "munge"
        munge.mkdir(exist_ok=True)
        os.chmod(munge, 0o755)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        os.chmod(key, 0o600)
        (s / "plugstack.conf").write_text("")
        self.conf.write_text(self.slurm_conf())

    # ---- daemons -----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.state_dir / f"{name}.out", "ab")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env,
                                    preexec_fn=_die_with_parent)
        finally:
            out.close()
        self.procs[name] = proc
        return proc

    def _logs(self) -> str:
        parts = []
        for name, proc in self.procs.items():
            parts.append(f"--- {name} (exit {proc.poll()}):\n"
                         f"{_tail(self.state_dir / f'{name}.out')}")
        parts.append(f"--- slurmctld.log:\n{_tail(self.state_dir / 'slurmctld.log')}")
        return "\n".join(parts)

    def failure(self, msg: str) -> SlurmLabError:
        return SlurmLabError(f"{msg}\n{self._logs()}")

    def start(self) -> "SlurmLab":
        """munged, slurmctld, the slurmds; returns once every node is idle (or raises)."""
        try:
            self._write_files()
            s = self.state_dir
            munge = s / "munge"
            self._spawn("munged", [
                _binary("munged"), "--foreground", "--force",
                f"--key-file={munge / 'munge.key'}", f"--socket={self.munge_socket}",
                f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}"])
            self._wait(lambda: self.munge_socket.exists(), "munged did not create its socket",
                       deadline=time.monotonic() + 15)
            self._spawn("slurmctld", self.lab.nsenter(0, [
                _binary("slurmctld"), "-D", "-i", "-f", str(self.conf)]))
            for h, n in enumerate(self.nodes):
                self._spawn(f"slurmd-{n}", self.lab.nsenter(h, [
                    _binary("slurmd"), "-D", "-N", n, "-f", str(self.conf)]))
            self._wait(self._all_idle, f"the nodes were not all idle within "
                       f"{self.start_timeout:g} s", deadline=time.monotonic() + self.start_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _wait(self, ready, msg: str, deadline: float) -> None:
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise self.failure(f"{', '.join(dead)} exited while starting")
            if time.monotonic() > deadline:
                raise self.failure(msg)
            time.sleep(0.25)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it (idle, alloc, down*, unk*, ...)."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _all_idle(self) -> bool:
        try:
            states = self.node_states()
        except SlurmLabError:
            return False
        return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

    # ---- clients -----------------------------------------------------------------------------
    def run(self, argv: list[str], host: int = 0, timeout: float = 30.0, check: bool = True,
            cwd: str | Path | None = None, env: dict | None = None,
            ) -> subprocess.CompletedProcess:
        """A Slurm client command inside `host`'s namespace, to its end (bounded)."""
        exe = _binary(argv[0]) or argv[0]
        try:
            proc = subprocess.run(self.lab.nsenter(host, [exe, *argv[1:]]), capture_output=True,
                                  text=True, timeout=timeout, cwd=cwd,
                                  env={**(env or os.environ), "SLURM_CONF": str(self.conf)},
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise self.failure(f"{' '.join(argv)} did not finish in {timeout:g} s") from exc
        if check and proc.returncode != 0:
            raise self.failure(f"{' '.join(argv)} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()}")
        return proc

    def popen(self, argv: list[str], host: int = 0, cwd: str | Path | None = None,
              env: dict | None = None, **kwargs) -> subprocess.Popen:
        """A Slurm client command inside `host`'s namespace, left running (an `srun` step the
        caller waits for, bounded, and reaps)."""
        exe = _binary(argv[0]) or argv[0]
        return subprocess.Popen(self.lab.nsenter(host, [exe, *argv[1:]]), cwd=cwd,
                                env={**(env or os.environ), "SLURM_CONF": str(self.conf)},
                                stdin=subprocess.DEVNULL, **kwargs)

    def sbatch(self, args: list[str], cwd: str | Path, env: dict | None = None) -> int:
        """Submit from host 0 with `cwd` as the submit folder; returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd, env=env).stdout.strip()
        try:
            return int(out.split(";")[0])
        except ValueError:
            raise self.failure(f"sbatch printed no job id: {out!r}") from None

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o JOB` as a dict (JobState, ExitCode, NodeList, Restarts, ...)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return parse_record(out.splitlines()[0] if out.strip() else "")

    def wait_job(self, job_id: int, timeout: float, states=TERMINAL_STATES,
                 poll: float = 0.5) -> dict[str, str]:
        """Poll the job until its state is one of `states`; its record then (or raises)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise self.failure(f"job {job_id} was still {info.get('JobState')} after "
                                   f"{timeout:g} s ({info.get('Reason')})")
            time.sleep(poll)

    # ---- teardown ----------------------------------------------------------------------------
    def close(self, grace: float = 10.0) -> None:
        """Cancel every job, end the daemons by PID (SIGTERM, then SIGKILL) and reap them."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run(["scancel", "--full", f"--partition={self.partition}"],
                         check=False, timeout=10)
            except SlurmLabError:
                pass
        # The slurmds first (they end their job steps), then the controller, munged last.
        slurmds = [n for n in self.procs if n.startswith("slurmd-")]
        for group in (slurmds, ["slurmctld"], ["munged"]):
            for name in group:
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            self._reap(group, grace)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _reap(self, names: list[str], grace: float) -> None:
        deadline = time.monotonic() + grace
        for name in names:
            proc = self.procs.get(name)
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def __enter__(self) -> "SlurmLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
