"""Ray launcher: a job's roles as Ray actors, each running the same `paramserver ROLE` process.

Ray places the processes (resource requests per role) and restarts dead workers (`max_restarts`
= the job's restart budget); the data path stays ZeroMQ with CURVE keys made for the job. An
actor starts its role as a child process on its node (`RoleProcess`); when a restartable child
fails, the actor exits with it, Ray starts a new actor, and that starts the role again.
With replicas (`--replicas 2`) each shard gets a backup actor (`server --backup`) beside its
primary, and every server actor is restartable: when its process dies (a primary or a backup),
Ray restarts the actor and it comes back as a new backup (`restart_args`), which the shard's
survivor rebuilds, as the local launcher's `_rebuild_backup` does (at most
`BACKUP_REBUILDS` times per server actor).
Needs the optional extra `paramserver[ray]`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from paramserver.core import exits
from paramserver.launch.local import LaunchError, _die_with_parent
from paramserver.launch.core.verdict import before_start_message, ends_job_before_start
from paramserver.spec.job import JobSpec
from paramserver.transport import security

# With replicas: how many times Ray restarts one server actor as a new backup.
BACKUP_REBUILDS = 4


def import_ray():
    try:
        import ray
    except ImportError:
        raise LaunchError("--launcher ray needs Ray: pip install 'paramserver[ray]'") from None
    return ray


def _write_keys(root: Path, keys: dict[str, str]) -> None:
    """Key files (relative path -> text) into root, secret ones private (security.generate's
    modes)."""
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir(mode=0o700)
    for rel, text in keys.items():
        path = root / rel
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                     0o600 if rel.startswith("private/") else 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)


class RoleProcess:
    """Actor body: one role's process in a private folder of its node."""

    def __init__(self, role: str, args: list[str], files: dict[str, str],
                 keys: dict[str, str], restartable: bool = False,
                 command: list[str] | None = None, env: dict[str, str] | None = None,
                 cwd: str | None = None, restart_args: list[str] | None = None):
        """`command` (a user's script, `launch --launcher ray`) runs instead of `paramserver
        ROLE args`, with `env` added, in `cwd` where this node has that folder. When Ray
        restarts the actor, `restart_args` (if given) replace `args`: a replicated shard's
        dead server comes back as a new backup."""
        import ray
        if restart_args is not None and \
                ray.get_runtime_context().was_current_actor_reconstructed:
            args = restart_args
        self.dir = Path(tempfile.mkdtemp(prefix=f"paramserver-{role}-"))  # 0700
        for name, text in files.items():
            (self.dir / name).write_text(text)
        _write_keys(self.dir / "keys", keys)
        node = ray.util.get_node_ip_address()
        args = [a.format(dir=self.dir, node_ip=node) for a in args]
        env = {**os.environ, **(env or {}), security.ENV: str(self.dir / "keys")}
        env.pop(security.NAME_ENV, None)  # the job's keys are written above under role names
        self.log = self.dir / "role.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command or [sys.executable, "-m", "paramserver", role,
                                                     *args],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                         preexec_fn=_die_with_parent)
        if restartable:
            threading.Thread(target=self._die_with_child, daemon=True).start()

    def _die_with_child(self) -> None:
        if self.proc.wait() != 0:
            # The restarted actor makes a folder of its own; this one (keys included) would
            # outlive the job on this node. Its log went to the launcher as it was written.
            shutil.rmtree(self.dir, ignore_errors=True)
            os._exit(1)  # Ray sees the actor die and restarts it (max_restarts)

    def poll(self) -> int | None:
        return self.proc.poll()

    def node(self) -> str:
        """The address of the node this role runs on."""
        import ray
        return ray.util.get_node_ip_address()

    def pid(self) -> int:
        return self.proc.pid

    def read(self, name: str) -> bytes:
        """One file the role wrote (b"" while it does not exist)."""
        path = self.dir / name
        return path.read_bytes() if path.is_file() and "keys" not in path.parts else b""

    def read_from(self, name: str, offset: int, limit: int = 1 << 20) -> bytes:
        """What the role's file `name` (its log: "role.log") holds from `offset` on, at most
        `limit` bytes: the launcher follows output and metrics while the job runs."""
        path = self.dir / name
        if "keys" in Path(name).parts or not path.is_file():
            return b""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)

    def address(self, timeout: float) -> str:
        """The coordinator's address once it listens."""
        path, deadline = self.dir / "coordinator.addr", time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"coordinator did not publish its address:\n{self.tail()}")
            time.sleep(0.02)
        return path.read_text().strip()

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def fetch(self) -> dict[str, bytes]:
        """The files the role wrote (metrics, events, results, its log)."""
        return {str(p.relative_to(self.dir)): p.read_bytes() for p in self.dir.rglob("*")
                if p.is_file() and not p.relative_to(self.dir).parts[0] == "keys"}

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir / "keys", ignore_errors=True)

    def discard(self) -> None:
        """Stop the role and remove its folder: the launcher has fetched what it keeps, and
        nothing of a job may stay behind in a node's temp folder."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Resources:
    """Ray resource requests per process (the coordinator and the evaluator ask for none)."""

    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    server_cpus: float = 1.0


def _spec(job: JobSpec | dict) -> JobSpec:
    return job if isinstance(job, JobSpec) else JobSpec.from_dict(job)


def demand(job: JobSpec | dict, r: Resources) -> tuple[float, float]:
    """(CPUs, GPUs) the job's processes ask Ray for."""
    spec = _spec(job)
    return (spec.workers * r.worker_cpus + spec.servers * spec.replicas * r.server_cpus,
            spec.workers * r.worker_gpus)


def check_resources(job: JobSpec | dict, r: Resources, available: dict) -> None:
    """Fail before placing anything when the cluster cannot hold the job's requests (Ray
    would wait for them forever)."""
    cpus, gpus = demand(job, r)
    have_cpus, have_gpus = available.get("CPU", 0.0), available.get("GPU", 0.0)
    if cpus > have_cpus or gpus > have_gpus:
        raise LaunchError(f"the job asks Ray for {cpus:g} CPUs and {gpus:g} GPUs, the cluster "
                          f"has {have_cpus:g} CPUs and {have_gpus:g} GPUs; lower "
                          f"--ray-worker-cpus / --ray-server-cpus / --ray-worker-gpus")


def bundles(job: JobSpec | dict, r: Resources) -> list[dict[str, float]]:
    """One bundle per server process (primaries, then backups) and per starting worker, in
    the order the launcher starts them: what the job's gang asks Ray to hold at once."""
    spec = _spec(job)

    def bundle(**amounts) -> dict[str, float]:
        return {k: v for k, v in amounts.items() if v > 0}
    return ([bundle(CPU=r.server_cpus)] * (spec.servers * spec.replicas)
            + [bundle(CPU=r.worker_cpus, GPU=r.worker_gpus)] * (spec.min_workers or spec.workers))


@dataclass
class Gang:
    """The job's servers and workers reserved together on a Ray cluster (a placement group,
    its bundles spread over the nodes): the job starts whole or not at all, instead of some
    processes waiting forever for room while the others hold theirs. A bundle on a lost node
    is placed again by Ray, and the role's restarted actor goes with it."""

    wanted: list[dict[str, float]]
    group: object = None
    given: int = 0

    def reserve(self, ray, timeout: float) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group
        if not any(self.wanted):  # nothing asks for resources: nothing to hold
            return
        # A bundle may not be empty: a role that asks for nothing takes a token CPU share.
        self.group = placement_group([b or {"CPU": 0.001} for b in self.wanted],
                                     strategy="SPREAD", name="")
        try:
            ray.get(self.group.ready(), timeout=timeout)
        except Exception:  # GetTimeoutError, or the group could not be made at all
            remove_placement_group(self.group)
            self.group = None
            total = Counter()
            for b in self.wanted:
                total.update(b)
            asked = ", ".join(f"{v:g} {k}" for k, v in sorted(total.items()))
            raise LaunchError(
                f"Ray could not hold the job's {len(self.wanted)} server and worker processes "
                f"together within {timeout:.0f} s ({asked} in {len(self.wanted)} bundles, "
                f"spread over the nodes); the cluster's free resources now: "
                f"{ray.available_resources()}. Free the cluster, or lower --ray-worker-cpus "
                f"/ --ray-server-cpus / --ray-worker-gpus") from None

    def next(self):
        """The scheduling strategy of the next server or worker started (bundle by bundle)."""
        if self.group is None:
            return None
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        index, self.given = self.given, self.given + 1
        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)

    def release(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self.group)
            self.group = None


@dataclass
class RayCluster:
    """Same contract as LocalCluster (`run(on_tick)`, `worker_results()`), on a Ray cluster;
    `job` a JobSpec or its dict (then `spec` is the JobSpec, `job` its dict)."""

    job: JobSpec | dict
    run_dir: Path
    address: str | None = None  # None: start a local Ray instance; "auto" or HOST:PORT: join
    resources: Resources = field(default_factory=Resources)
    startup_timeout: float = 120.0
    job_timeout: float | None = None
    restart_workers: int = 0
    # `launch --launcher ray`: the user's script as the workers (as LocalCluster.worker_cmd),
    # its output followed onto `stream` with rank prefixes, under `progress` (see launch/local).
    worker_cmd: list[str] | None = None
    stream: object = None
    console: threading.Lock = field(default_factory=threading.Lock)
    progress: object = None
    actors: list = field(default_factory=list)  # (name, role, actor handle)
    exits: dict = field(default_factory=dict)  # worker name -> exit code (None: running)
    join: str = ""
    timings: dict = field(default_factory=dict)
    barrier_opened: bool = False  # seen in the coordinator's events.jsonl
    placement: dict = field(default_factory=dict)  # actor name -> the nodes it ran on, in order
    gang: Gang | None = None  # on a cluster, made by run(): the servers' and workers' bundles
    _events_at: int = 0
    _events_tail: bytes = b""  # a line cut by the last read ends in the next one

    def __post_init__(self):
        self.spec = _spec(self.job)
        self.job = self.spec.to_dict()

    def run(self, on_tick=None) -> None:
        ray = import_ray()
        t0 = time.monotonic()
        started_ray = not ray.is_initialized()
        if started_ray:
            # A local instance gets CPUs enough for the job, like the local launcher would
            # start every process; a cluster has what it has (check_resources).
            cpus = None if self.address else max(os.cpu_count() or 1, math.ceil(
                demand(self.spec, self.resources)[0]))
            # "local", not None: Ray would join whatever cluster its address file on this
            # machine names (a stale one included) instead of starting the instance asked for.
            try:
                ray.init(address=self.address or "local", num_cpus=cpus,
                         include_dashboard=False, log_to_driver=False)
            except ConnectionError as exc:  # no cluster there: the user's to fix, in one line
                raise LaunchError(
                    f"no Ray cluster at --address {self.address}: {str(exc).split('. ')[0]} "
                    f"(start one with `ray start --head`, or leave --address out for a local "
                    f"Ray instance)") from None
        self.timings["ray_init_s"] = time.monotonic() - t0
        self.gang = Gang(bundles(self.spec, self.resources))
        try:
            check_resources(self.spec, self.resources, ray.cluster_resources())
            if self.address is not None:  # a shared cluster: all of the job, or none of it
                self.gang.reserve(ray, self.startup_timeout)
                self.timings["reserve_s"] = time.monotonic() - t0
            self._start(ray)
            self._place(ray)
            self.timings["startup_s"] = time.monotonic() - t0
            self._wait(ray, on_tick)
        finally:
            self._collect(ray)
            for _, _, actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.gang.release()
            if started_ray:
                ray.shutdown()

    def _keys(self) -> dict[str, dict[str, str]]:
        """A fresh key set for the job; per role the public keys and that role's secret only."""
        with tempfile.TemporaryDirectory() as d:
            security.generate(d)
            public = {f"public/{p.name}": p.read_text() for p in Path(d, "public").glob("*.key")}
            return {role: {**public, f"private/{role}.key_secret":
                           Path(d, "private", f"{role}.key_secret").read_text()}
                    for role in security.ROLES}

    def _where(self, ray, role: str):
        """Ray's scheduling strategy for a role. On a cluster the coordinator and the evaluator
        stay on the driver's node, whose loss ends the job anyway, and the servers and workers
        are spread over the nodes, so one node's loss takes as few of them as it can; a local
        instance has one node. (Not soft affinity: Ray 2.60 spreads 0-CPU actors asked for
        softly over every node, so the coordinator would share a worker node's fate.)"""
        if self.address is None:
            return "DEFAULT"
        if role in ("coordinator", "evaluator"):
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                  soft=False)
        return self.gang.next() or "SPREAD"

    def _spawn(self, ray, name: str, role: str, args: list[str], keys: dict, *,
               cpus: float = 0.0, gpus: float = 0.0, restarts: int = 0, files=None,
               command=None, env=None, restart_args=None):
        actor_cls = ray.remote(RoleProcess).options(
            num_cpus=cpus, num_gpus=gpus, max_restarts=restarts, name=None,
            scheduling_strategy=self._where(ray, role))
        key_role = "observer" if role == "evaluator" else role
        actor = actor_cls.remote(role, args, files or {}, keys[key_role], restarts > 0,
                                 command, env, os.getcwd() if command else None,
                                 restart_args)
        self.actors.append((name, role, actor))
        return actor

    def _start(self, ray) -> None:
        keys, r, spec = self._keys(), self.resources, self.spec
        # A local instance: every process on this host, loopback (shared memory applies).
        bind = "127.0.0.1" if self.address is None else "{node_ip}"
        coord = self._spawn(ray, "coordinator", "coordinator", [
            "--job", "{dir}/job.json", "--bind", bind, "--address-file", "{dir}/coordinator.addr",
            "--events", "{dir}/events.jsonl", "--metrics", "{dir}/metrics.jsonl"], keys,
            files={"job.json": json.dumps(self.job)})
        try:
            self.join = ray.get(coord.address.remote(self.startup_timeout),
                                timeout=self.startup_timeout + 30)
        except Exception as exc:  # ray wraps the actor's error; the message carries the log
            raise LaunchError(f"coordinator did not start under Ray: {exc}") from None
        server_args = ["--join", self.join, "--bind", bind]
        # Replicas: a backup actor per shard; a server actor whose process dies (primary or
        # backup) is restarted by Ray as a new backup, rebuilt by its shard's survivor.
        replicated = spec.replicas > 1
        rebuild = dict(restarts=BACKUP_REBUILDS, restart_args=[*server_args, "--backup"]) \
            if replicated else {}
        for s in range(spec.servers):
            self._spawn(ray, f"server {s}", "server", server_args, keys, cpus=r.server_cpus,
                        **rebuild)
        for s in range(spec.servers if replicated else 0):
            self._spawn(ray, f"backup {s}", "server", [*server_args, "--backup"], keys,
                        cpus=r.server_cpus, **rebuild)
        for w in range(spec.min_workers or spec.workers):  # an elastic job: its MIN
            env = None if not self.worker_cmd else {
                "PARAMSERVER_JOIN": self.join, "RANK": str(w), "WORLD_SIZE": str(spec.workers),
                # Ray places each worker where it likes: its local rank is not known here.
                "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
            self._spawn(ray, f"worker {w}", "worker",
                        ["--join", self.join, "--result-dir", "{dir}/results"], keys,
                        cpus=r.worker_cpus, gpus=r.worker_gpus, restarts=self.restart_workers,
                        command=self.worker_cmd, env=env)
        self._followed = {name: [0, b""] for name, role, _ in self.actors if role == "worker"}
        self._metrics_at = 0
        if spec.eval_interval:
            self._spawn(ray, "evaluator", "evaluator",
                        ["--join", self.join, "--interval", str(spec.eval_interval),
                         "--save-model", "{dir}/model.pt"], keys)

    def _place(self, ray) -> None:
        """Note where each role runs now (placement.json in the run folder): a role that Ray
        restarted on another node gets that node added after its first."""
        for name, _, actor in self.actors:
            try:
                node = ray.get(actor.node.remote(), timeout=30)
            except Exception:  # restarting, or gone for good: its last node stays noted
                continue
            seen = self.placement.setdefault(name, [])
            if not seen or seen[-1] != node:
                seen.append(node)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "placement.json.tmp"
        tmp.write_text(json.dumps(self.placement, indent=2))
        tmp.replace(self.run_dir / "placement.json")  # a reader never sees half of it

    def _poll(self, ray, actor):
        try:
            return ray.get(actor.poll.remote(), timeout=30)
        except Exception:  # restarting, or gone for good: the coordinator decides
            return None

    def _wait(self, ray, on_tick) -> None:
        deadline = None if self.job_timeout is None else time.monotonic() + self.job_timeout
        coord = self.actors[0][2]
        while (code := self._poll(ray, coord)) is None:
            barrier_open = self._barrier_open(ray, coord)
            for name, role, actor in self.actors[1:]:
                # (A replicated job's dead server is Ray's to restart as a new backup, and the
                # coordinator's to judge: whether its shard still has a copy.)
                if role == "server" and self.spec.replicas < 2 and \
                        (ended := self._poll(ray, actor)) is not None and \
                        not exits.server_left(ended):
                    raise LaunchError(f"{name} died:\n{ray.get(actor.tail.remote())}")
                if role == "worker" and not barrier_open:
                    exited = self._poll(ray, actor)  # None too while Ray restarts it
                    # The barrier may have opened since this tick's look: look again.
                    if ends_job_before_start(exited, self._barrier_open(ray, coord),
                                             self.restart_workers > 0):
                        raise LaunchError(
                            f"{before_start_message(int(name.split()[1]), exited)}; its last "
                            f"output:\n{ray.get(actor.tail.remote(), timeout=30)}")
            if deadline is not None and time.monotonic() > deadline:
                raise LaunchError(f"job did not finish within {self.job_timeout:.0f} s")
            self._follow(ray)
            if on_tick is not None:
                on_tick()
            time.sleep(0.2)
        self._follow(ray)
        if code != 0:
            raise LaunchError(f"coordinator ended with {exits.describe(code)}:\n"
                              f"{ray.get(coord.tail.remote())}")
        grace = time.monotonic() + 15  # servers and workers leave on their own
        while time.monotonic() < grace and any(
                self._poll(ray, a) is None for _, role, a in self.actors[1:] if role != "worker"):
            time.sleep(0.2)

    def _barrier_open(self, ray, coord) -> bool:
        """Whether the coordinator's events.jsonl says the start barrier opened (read on from
        where the last look ended)."""
        if not self.barrier_opened:
            try:
                data = ray.get(coord.read_from.remote("events.jsonl", self._events_at),
                               timeout=10)
            except Exception:  # ray wraps whatever went wrong; the next tick tries again
                return False
            self._events_at += len(data)
            data, self._events_tail = self._events_tail + data, (self._events_tail + data)[-64:]
            self.barrier_opened = b'"event": "barrier_open"' in data
        return self.barrier_opened

    def _follow(self, ray) -> None:
        """While the job runs: the user's workers' new output onto the console, prefixed with
        their rank, and the coordinator's new metrics into the run folder (train's progress
        bar and launch's progress line read them there, as a user's `top` does; `_collect`
        writes the whole file at the end)."""
        try:
            data = ray.get(self.actors[0][2].read_from.remote("metrics.jsonl", self._metrics_at),
                           timeout=10)
        except Exception:  # ray wraps whatever went wrong; the next tick tries again
            data = b""
        if data:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / "metrics.jsonl", "ab") as f:
                f.write(data)
            self._metrics_at += len(data)
        if self.stream is None or not self.worker_cmd:
            return
        for name, role, actor in self.actors:
            if role != "worker":
                continue
            at = self._followed[name]
            try:
                data = ray.get(actor.read_from.remote("role.log", at[0]), timeout=10)
            except Exception:  # restarting (a fresh log), or gone: nothing to show now
                continue
            at[0] += len(data)
            lines = (at[1] + data).split(b"\n")
            at[1] = lines.pop()  # a line not finished yet waits for its end
            if lines:
                self._show(f"[rank {name.split()[1]}] ", lines)

    def _show(self, prefix: str, lines: list[bytes]) -> None:
        with self.console:
            try:
                if self.progress is not None:
                    self.progress.clear()
                for line in lines:
                    self.stream.write(prefix + line.decode(errors="replace") + "\n")
                if self.progress is not None:
                    self.progress.redraw()
                self.stream.flush()
            except (OSError, ValueError):  # a closed console: the logs still get it all
                pass

    def _collect(self, ray) -> None:
        """Metrics and events from the coordinator, results and logs from every role."""
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._place(ray)
        for name, role, actor in self.actors:
            try:
                if role == "worker":
                    self.exits[name] = ray.get(actor.poll.remote(), timeout=30)
                ray.get(actor.stop.remote(), timeout=30)
                files = ray.get(actor.fetch.remote(), timeout=60)
            except Exception:
                continue
            finally:  # fetched or not, nothing of the job stays on the node (a dead actor: no-op)
                with contextlib.suppress(Exception):
                    ray.get(actor.discard.remote(), timeout=30)
            for rel, data in files.items():
                if rel == "role.log":
                    (logs / f"{name.replace(' ', '-')}.log").write_bytes(data)
                elif role == "coordinator" and rel in ("metrics.jsonl", "events.jsonl",
                                                       "model_layout.json"):
                    (self.run_dir / rel).write_bytes(data)
                elif role == "evaluator" and rel == "model.pt":  # the final model
                    (self.run_dir / rel).write_bytes(data)
                elif rel.startswith("results/"):
                    (self.run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    (self.run_dir / rel).write_bytes(data)

    def worker_exits(self) -> dict[int, int | None]:
        """Each worker's exit code as the job ended, by rank (a user script's failure)."""
        return {int(name.split()[1]): code for name, code in self.exits.items()}

    def worker_results(self) -> list[dict]:
        out = [json.loads(p.read_text()) for p in (self.run_dir / "results").glob("worker-*.json")]
        return sorted(out, key=lambda r: r.get("rank", 0))
