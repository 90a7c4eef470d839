"""Local launcher: the coordinator, S servers and N workers as child processes on 127.0.0.1."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from paramserver.core import exits
from paramserver.launch import zygote
from paramserver.launch.core.verdict import before_start_message, ends_job_before_start
from paramserver.spec.job import JobSpec
from paramserver.transport import security, shaping

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it if the launcher dies (no orphans),
    and it leaves the terminal's process group, so a Ctrl-C reaches the launcher alone, which
    saves what was trained before it stops the job."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LaunchError(RuntimeError):
    """The job could not start or a vital process died."""


@dataclass
class Child:
    role: str
    index: int
    proc: subprocess.Popen | zygote.ForkedRole
    log_path: Path
    replaced: bool = False
    pump: threading.Thread | None = None  # copies a streamed child's output to log and console

    @property
    def name(self) -> str:
        return self.role if self.role == "coordinator" else f"{self.role} {self.index}"

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalCluster:
    """Starts and supervises one job's processes; `run()` returns when the job is over. `job`
    is a JobSpec or its dict form (parsed here once: a bad job fails before any process
    starts); afterwards `spec` is the JobSpec and `job` its dict, as written to job.json."""

    job: JobSpec | dict
    run_dir: Path
    host: str = "127.0.0.1"
    startup_timeout: float = 60.0
    job_timeout: float | None = None
    env: dict | None = None
    worker_cmd: list[str] | None = None  # a user's own script instead of `paramserver worker`
    # Where a user script's output goes besides its log, each line prefixed "[rank i] "; None:
    # the log only. `console` serializes these writes with a progress line's.
    stream: object = None
    console: threading.Lock = field(default_factory=threading.Lock)
    progress: object = None  # a launch.console.ProgressLine, cleared around each line
    restart_workers: int = 0  # how many dead workers to replace over the job's life
    restarts: int = 0
    # "ephemeral": a fresh key pair per role in the run folder's keys/ (0700), removed at
    # stop(); a folder: those keys (`paramserver keys generate`); None: plaintext (loopback only).
    keys: str | os.PathLike | None = "ephemeral"
    restart_servers: int = 0  # how many dead servers to restart (from the latest checkpoint)
    server_restarts: int = 0
    server_ports: list[int] = field(default_factory=list)  # fixed when servers may restart
    # How many times a dead coordinator is restarted at its address (--take-back): it takes
    # back the live servers and workers. Its port is then fixed up front.
    restart_coordinator: int = 0
    coordinator_restarts: int = 0
    # Roles forked from the zygote (launch/zygote.py); False: each its own interpreter, as when
    # the launching process is a user's script, whose __main__ a fork server imports again.
    fork: bool = True
    coordinator_port: int = 0
    # With replicas (JobSpec.replicas 2): each dead server is replaced by a new backup, which
    # the survivor of its shard rebuilds (at most `backup_rebuilds` over the job's life).
    backup_rebuilds: int = 0
    children: list[Child] = field(default_factory=list)
    address: str = ""
    barrier_opened: bool = False  # seen in events.jsonl: from then on dead workers are the policy's
    keys_dir: str | None = None
    _own_keys: bool = False

    def __post_init__(self):
        self.spec = self.job if isinstance(self.job, JobSpec) else JobSpec.from_dict(self.job)
        self.job = self.spec.to_dict()  # a copy: the caller's dict is never written to

    def _prepare_keys(self) -> None:
        """Every child finds the job's keys through $PARAMSERVER_KEYS (a user's worker script
        too, via KVWorker). The ephemeral folder is the run folder's keys/, 0700, removed at
        stop(): a launcher killed before that (SIGKILL runs no cleanup) leaves the job's
        private keys inside its own run folder, not in a shared temporary directory."""
        if self.keys_dir is not None or self.keys is None:
            return
        try:
            if self.keys == "ephemeral":
                folder = self.run_dir.resolve() / "keys"
                shutil.rmtree(folder, ignore_errors=True)  # a killed launcher's, in this folder
                folder.mkdir(mode=0o700)
                os.chmod(folder, 0o700)  # (mkdir's mode passes through the umask)
                self.keys_dir = str(folder)
                self._own_keys = True
                security.generate(self.keys_dir)
            else:
                self.keys_dir = str(self.keys)
                security.load(self.keys_dir, "coordinator")  # fail here, not in every child
        except (security.SecurityError, OSError) as exc:
            raise LaunchError(f"keys: {exc}") from None

    def client_keys(self, role: str = "worker") -> security.Keys | None:
        """Keys for a client of this job started outside the launcher (a test, a benchmark)."""
        return security.load(self.keys_dir, role) if self.keys_dir else None

    def _spawn(self, role: str, index: int, args: list[str],
               command: list[str] | None = None) -> Child:
        log_path = self.run_dir / "logs" / f"{role}-{index}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        if self.address:  # (unknown yet to a role started beside the coordinator)
            env["PARAMSERVER_JOIN"] = self.address
        env.pop(security.ENV, None)
        if self.keys_dir:
            env[security.ENV] = self.keys_dir
        if self._own_keys or not self.keys_dir:  # a name from the shell is not in our folder
            env.pop(security.NAME_ENV, None)
        env.pop(shaping.ENV, None)  # links come from the job: servers by index, workers by rank
        link = self.spec.links.to_dict().get("s", {}) if role == "server" else {}
        if link.get(str(index), link.get("*")):
            env[shaping.ENV] = link.get(str(index), link.get("*"))
        if command is not None:
            env.update(self.worker_env(index))
            if self.spec.workers > 1:
                # As torchrun does for several local ranks: one OpenMP thread each unless the
                # caller set it, or every rank's torch takes every core and each waits on the
                # others' threads (on 2 cores a script's rounds took 10x as long).
                env.setdefault("OMP_NUM_THREADS", "1")
        streamed = command is not None and self.stream is not None
        if command is None and self.fork and zygote.enabled():  # ours: forked, imports done
            child = Child(role, index, zygote.ForkedRole([role, *args], env, log_path,
                                                         _die_with_parent), log_path)
            self.children.append(child)
            return child
        command = command or [sys.executable, "-m", "paramserver", role, *args]
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE if streamed else log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        preexec_fn=_die_with_parent, env=env)
            except OSError as exc:  # not found, not executable, not a program at all
                raise LaunchError(f"cannot start {command[0]!r} as {role} {index}: "
                                  f"{exc.strerror or exc}") from None
        child = Child(role, index, proc, log_path)
        if streamed:
            child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True)
            child.pump.start()
        self.children.append(child)
        return child

    def worker_env(self, index: int) -> dict[str, str]:
        """What torchrun gives each worker; one host, so local rank = rank. RANK is the
        launch slot, which names the worker's log and output prefix."""
        n = str(self.spec.workers)
        return {"RANK": str(index), "WORLD_SIZE": n, "LOCAL_RANK": str(index),
                "LOCAL_WORLD_SIZE": n}

    def _pump(self, child: Child) -> None:
        """A user script's output, line by line, into its log and onto the console, prefixed
        with its rank; ends when the script closes its output (it exited)."""
        prefix = f"[rank {child.index}] "
        with open(child.log_path, "ab") as log:
            for line in iter(child.proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                text = line.decode(errors="replace").rstrip("\n")
                with self.console:
                    try:
                        if self.progress is not None:
                            self.progress.clear()
                        self.stream.write(prefix + text + "\n")
                        if self.progress is not None:
                            self.progress.redraw()
                        self.stream.flush()
                    except (OSError, ValueError):  # a closed console: the log still gets it
                        pass
        child.proc.stdout.close()

    def _join(self) -> list[str]:
        """How a role finds the coordinator: its address once known, else the file the
        coordinator publishes it in (the role then starts beside the coordinator)."""
        if self.address:
            return ["--join", self.address]
        return ["--join-file", str(self.run_dir / "coordinator.addr")]

    def _spawn_server(self, index: int, backup: bool = False) -> Child:
        args = [*self._join(), "--bind", self.host]
        if self.server_ports:  # a restarted server must come back where workers look for it
            args += ["--port", str(self.server_ports[index])]
        return self._spawn("server", index, args + (["--backup"] if backup else []))

    def _rebuild_backup(self) -> bool:
        """A replicated job's server died: start a new backup (its shard's survivor sends it
        the state), while the budget lasts (4 per shard)."""
        if self.spec.replicas < 2 or self.backup_rebuilds >= 4 * self.spec.servers:
            return False
        self.backup_rebuilds += 1
        index = 1 + max(c.index for c in self.children if c.role == "server")
        self._spawn_server(index, backup=True)
        return True

    def _prepare_server_restarts(self) -> None:
        """With server recovery on: each server's port is fixed up front (a restart rebinds
        it, and workers' sockets reconnect by themselves); shared-memory links, which cannot
        outlive their peer, are off; the coordinator learns that servers may come back."""
        if not self.restart_servers:
            return
        self.spec = replace(self.spec, restart_servers=self.restart_servers)
        self.job = self.spec.to_dict()
        self.env = {**(self.env or {}), "PARAMSERVER_SHM": "0"}
        self.server_ports = [_free_port(self.host) for _ in range(self.spec.servers)]

    def start(self, spawn_workers: bool = True) -> str:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_keys()
        self._prepare_server_restarts()
        job_path = self.run_dir / "job.json"
        job_path.write_text(json.dumps(self.job, indent=2))
        addr_file = self.run_dir / "coordinator.addr"
        addr_file.unlink(missing_ok=True)
        if self.restart_coordinator:
            self.coordinator_port = _free_port(self.host)
        coord = self._spawn_coordinator()
        # The servers and the evaluator import torch before they need the address (seconds on
        # two busy cores): they start now, beside the coordinator, and read its address file.
        for s in range(self.spec.servers):
            self._spawn_server(s)
        if self.spec.replicas > 1:  # a backup per shard (coordinator/replicas.py pairs them)
            for s in range(self.spec.servers):
                self._spawn_server(self.spec.servers + s, backup=True)
        if spawn_workers and self.spec.eval_interval:
            self._spawn("evaluator", 0, [*self._join(), "--interval",
                                         str(self.spec.eval_interval), "--save-model",
                                         str(self.run_dir / "model.pt")])
        deadline = time.monotonic() + self.startup_timeout
        while not addr_file.exists():
            if coord.proc.poll() is not None:
                raise LaunchError(f"coordinator exited with {coord.proc.returncode} at start:\n"
                                  f"{coord.tail()}")
            if time.monotonic() > deadline:
                raise LaunchError(f"coordinator did not publish its address within "
                                  f"{self.startup_timeout:.0f} s")
            time.sleep(0.02)
        self.address = addr_file.read_text().strip()
        if spawn_workers:
            # An elastic job starts with its MIN workers; more join by hand (paramserver
            # worker --join, the address in RUN/coordinator.addr) or by add_worker.
            for w in range(self.spec.min_workers or self.spec.workers):
                self.add_worker(w)
        return self.address

    def _spawn_coordinator(self, take_back: bool = False) -> Child:
        args = ["--job", str(self.run_dir / "job.json"), "--bind", self.host,
                "--address-file", str(self.run_dir / "coordinator.addr"),
                "--events", str(self.run_dir / "events.jsonl"),
                "--metrics", str(self.run_dir / "metrics.jsonl")]
        if self.coordinator_port:
            args += ["--port", str(self.coordinator_port)]
        return self._spawn("coordinator", 0, args + (["--take-back"] if take_back else []))

    @property
    def coordinator(self) -> Child:
        """The coordinator process now (the latest one, after restarts)."""
        return next(c for c in reversed(self.children) if c.role == "coordinator")

    def _restart_coordinator(self, c: Child) -> bool:
        """Restart a coordinator that died without a word (killed), not one that ended with a
        code of the exit table (finished, failed, refused its job, or failed the job for want
        of peers), while the budget lasts."""
        if (c.replaced or exits.own(c.proc.returncode)
                or self.coordinator_restarts >= self.restart_coordinator):
            return False
        c.replaced = True
        self.coordinator_restarts += 1
        self._spawn_coordinator(take_back=True)
        return True

    def add_worker(self, index: int) -> Child:
        if self.worker_cmd:
            return self._spawn("worker", index, [], command=self.worker_cmd)
        return self._spawn("worker", index, ["--join", self.address,
                                             "--result-dir", str(self.run_dir / "results")])

    def server_listening_at(self, addr: str) -> Child:
        """The live server process listening at `addr`: a promoted backup or a restarted
        server is a new process, so it is found by its port, not remembered. LookupError
        when none is."""
        import psutil
        port = int(addr.rsplit(":", 1)[1])
        for c in self.children:
            if c.role == "server" and c.proc.poll() is None and any(
                    conn.laddr.port == port and conn.status == psutil.CONN_LISTEN
                    for conn in psutil.Process(c.proc.pid).net_connections("tcp")):
                return c
        raise LookupError(f"no live server listens at {addr}")

    def _vital_failure(self) -> Child | None:
        """A dead coordinator ends the job, and so does a dead server unless it is restarted
        (see restart_servers); a worker's exit: see verdict.ends_job_before_start."""
        for c in list(self.children):
            code = c.proc.poll()
            if code is None or c.replaced:
                continue
            if c.role == "worker":
                if ends_job_before_start(code, self._barrier_open(),
                                         self.restarts < self.restart_workers):
                    return c
                continue
            if code == 0 or c.role not in ("coordinator", "server") or (
                    c.role == "server" and exits.server_left(code)):
                continue
            if c.role == "coordinator" and self._restart_coordinator(c):
                continue
            if c.role == "server" and self.server_restarts < self.restart_servers:
                c.replaced = True
                self.server_restarts += 1
                self._spawn_server(c.index)
                continue
            if c.role == "server" and self._rebuild_backup():
                # Its shard's survivor serves on; whether the job can go on is the
                # coordinator's to say (both copies of a shard lost ends it).
                c.replaced = True
                continue
            return c
        return None

    def _barrier_open(self) -> bool:
        if not self.barrier_opened:
            try:
                text = (self.run_dir / "events.jsonl").read_text()
            except OSError:
                return False
            self.barrier_opened = '"event": "barrier_open"' in text
        return self.barrier_opened

    def _failure_message(self, c: Child) -> str:
        msg = f"{c.name} died with {exits.describe(c.proc.returncode)}"
        if c.role == "worker":
            tail = c.tail()
            return (f"{before_start_message(c.index, c.proc.returncode)}; "
                    + (f"its last output:\n{tail}" if tail.strip() else "it printed nothing"))
        if c.role == "server":
            if self.restart_servers:
                msg += f" after {self.server_restarts} server restart(s) of {self.restart_servers}"
            elif self.spec.replicas > 1:  # (--restart-servers cannot join --replicas)
                msg += (" and no backup took its shard over (both copies are gone; with "
                        "--checkpoint-dir, --resume starts the job again from its latest "
                        "checkpoint)")
            else:
                msg += (" (server recovery is off: --restart-servers N restarts dead servers "
                        "from the latest checkpoint)")
        elif c.role == "coordinator":
            reason = job_failed_reason(self.run_dir / "events.jsonl")
            if reason is not None:  # it ended the job itself: no restart would mend that
                # Workers that failed (their script refused the job, say) hold the cause;
                # the coordinator only counted them.
                failed = self._failed_worker()
                if failed is not None:
                    return f"{reason}; {failed.name}'s last output:\n{failed.tail()}"
                return f"{reason}; the coordinator's last output:\n{c.tail()}"
            if not self.restart_coordinator:
                msg += " (--restart-coordinator N restarts a dead coordinator)"
        return f"{msg}:\n{c.tail()}"

    def _failed_worker(self, settle: float = 2.0) -> Child | None:
        """The lowest-ranked worker that exited failing and printed something, once the
        workers still running have had `settle` seconds to exit (a worker's bye reaches the
        coordinator before its process is gone)."""
        workers = sorted((w for w in self.children if w.role == "worker"), key=lambda w: w.index)
        until = time.monotonic() + settle
        while time.monotonic() < until and any(w.proc.poll() is None for w in workers):
            time.sleep(0.05)
        return next((w for w in workers if w.proc.poll() not in (None, exits.Exit.FINISHED)
                     and w.tail().strip()), None)

    def wait(self, poll: float = 0.05, on_tick=None) -> None:
        deadline = None if self.job_timeout is None else time.monotonic() + self.job_timeout
        while (coord := self.coordinator).proc.poll() is None or self._restart_coordinator(coord):
            failed = self._vital_failure()
            if failed is not None:
                raise LaunchError(self._failure_message(failed))
            if deadline is not None and time.monotonic() > deadline:
                raise LaunchError(f"job did not finish within {self.job_timeout:.0f} s")
            self._replace_dead_workers()
            if on_tick is not None:
                on_tick()
            time.sleep(poll)
        if coord.proc.returncode != 0:
            for c in self.children:  # a server's death, seen by the coordinator first
                if c.role == "server" and not c.replaced and c.proc.poll() is not None \
                        and not exits.server_left(c.proc.poll()):
                    raise LaunchError(self._failure_message(c))
            raise LaunchError(self._failure_message(coord))

    def _replace_dead_workers(self) -> None:
        """Start a new worker for each one that died, while the restart budget lasts (one that
        finished, or left preempted, did not: preempting it was someone's decision)."""
        for c in list(self.children):
            if (c.role == "worker" and not c.replaced
                    and c.proc.poll() not in (None, exits.Exit.FINISHED, exits.Exit.PREEMPTED)
                    and self.restarts < self.restart_workers):
                c.replaced = True
                self.restarts += 1
                self.add_worker(c.index)

    def stop(self, grace: float = 5.0) -> None:
        """Ask every child to stop, then kill the ones that do not; always reaps them all."""
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(timeout=5)
        for c in self.children:  # the last lines of a script that exited, then its pipe closes
            if c.pump is not None:
                c.pump.join(timeout=5)
        if self._own_keys and self.keys_dir:
            shutil.rmtree(self.keys_dir, ignore_errors=True)
            self.keys_dir, self._own_keys = None, False

    def finish(self, grace: float = 15.0) -> None:
        """After the coordinator is done: let servers and workers exit on their own, then reap."""
        deadline = time.monotonic() + grace
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.stop(grace=2.0)

    def run(self, on_tick=None, on_interrupt=None) -> None:
        """Start the job, wait for its end, reap every process. `on_interrupt()`, if given,
        runs on a Ctrl-C while the job's processes are still up (then the job stops and the
        KeyboardInterrupt goes on)."""
        try:
            self.start()
            self.wait(on_tick=on_tick)
            self.finish()
        except KeyboardInterrupt:
            if on_interrupt is not None:
                on_interrupt()
            raise
        finally:
            self.stop()

    def worker_results(self) -> list[dict]:
        out = []
        for path in sorted((self.run_dir / "results").glob("worker-*.json")):
            out.append(json.loads(path.read_text()))
        return sorted(out, key=lambda r: r.get("rank", 0))


def job_failed_reason(events: Path, tail_bytes: int = 1 << 16) -> str | None:
    """Why the coordinator failed the job (its last `job_failed` event), or None: it did not
    (it died, or the file is not there)."""
    from paramserver.runlog.metrics import tail_records
    failed = [r for r in tail_records(events, tail_bytes) if r.get("event") == "job_failed"]
    reason = failed[-1].get("reason") if failed else None
    return None if reason is None else str(reason)
