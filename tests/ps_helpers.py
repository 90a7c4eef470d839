"""The tests' one helpers module: real jobs (coordinator + shards) and worker processes, waits,
the coordinator core's job builders, and the fixtures of text several test files share. A test
module imports from here, never from another test module."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker
from paramserver.coordinator.events import Clocked, Registered, SendRelease, Started
from paramserver.spec.job import CheckpointSpec, JobSpec, Limits, ResumeSpec, SyncSpec

# Worker processes fork from a fork server that has numpy, pyzmq, torch and the client
# imported already: each is a fresh process with its own sockets, started in a fraction of the
# seconds a spawned interpreter takes to import torch on 2 busy cores. The server is
# single-threaded and never touches a socket or a tensor, so forking it is safe where forking
# pytest itself (threads, contexts) would not be. (Its sys.path is the environment's, not
# pytest's: it preloads the package, and each child imports the test's module itself.)
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["numpy", "paramserver.client.kv", "paramserver.launch.local"])


def make_job(num_keys: int, servers: int, workers: int, sync: str = "asp",
             dtype: str = "float64", lr: float = 1.0, optimizer: str = "sgd", **extra) -> dict:
    job = {"num_keys": num_keys, "dtype": dtype, "servers": servers, "workers": workers,
           "batch_size": 1, "sync": {"name": sync}, "optimizer": {"name": optimizer, "lr": lr},
           "heartbeat_interval": 0.2, "heartbeat_timeout": 2.0}
    job.update(extra)
    return job


@contextlib.contextmanager
def running_job(tmp_path: Path, job: dict):
    """Coordinator and shard servers as real processes; workers are the test's business."""
    # Plaintext on loopback: these tests drive raw clients; tests/wire/test_security.py covers CURVE.
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, keys=None)
    try:
        cluster.start(spawn_workers=False)
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def step_loop(tmp_path: Path, **options):
    """(KVWorker, StepLoop) of the train task for one worker on 2 real shards: ASP, SGD lr 0.5,
    float64, batch 8, no evaluator; `options` override TrainConfig fields."""
    from paramserver.launch.jobs import prepare_job
    from paramserver.spec.config import TrainConfig
    from paramserver.training.train_task import StepLoop
    settings = dict(workers=1, servers=2, sync="asp", lr=0.5, dtype="float64", eval_interval=0,
                    batch_size=8)
    job = prepare_job(TrainConfig(**{**settings, **options}))
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            yield kv, StepLoop(kv, kv.spec.job.task)
        finally:
            kv.close()


@contextlib.contextmanager
def started_client(tmp_path: Path, num_keys: int):
    """(cluster, KVWorker) of a 1-shard, 1-worker ASP job (SGD, lr 1, zeros), started."""
    with running_job(tmp_path, make_job(num_keys, 1, 1, sync="asp", lr=1.0)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(num_keys))
            kv.start()
            yield cluster, kv
        finally:
            kv.close()


def steps_after_the_death(records: list[dict]) -> list[dict]:
    """Step records of the one worker declared dead, after its death: its replacement's."""
    left = [i for i, r in enumerate(records) if r["kind"] == "left" and r["reason"] == "dead"]
    assert len(left) == 1, left
    dead_rank = records[left[0]]["worker"]
    return [r for r in records[left[0]:] if r["kind"] == "step" and r["worker"] == dead_rank]


def known_gradient(rank: int, step: int, num_keys: int, dtype) -> np.ndarray:
    """Integer-valued, distinct per (rank, step), so sums are exact in float32 and float64."""
    keys = np.arange(num_keys)
    return ((keys * 7 + rank * 13 + step * 3) % 11 - 5).astype(dtype)


def push_known(addr: str, steps: int, init: np.ndarray | None, out_dir: str,
               batch_of_rank=None, final_version: int = 0) -> None:
    """Worker body: init (rank 0), then `steps` of pull/push/clock with known gradients.

    The final pull waits for shard version `final_version` (under ASP: every push applied).
    """
    kv = KVWorker(addr)
    try:
        if init is not None and kv.rank == 0:
            kv.init(init)
        release = kv.start()
        batch = 1 if batch_of_rank is None else batch_of_rank[kv.rank]
        for _ in range(steps):
            kv.pull(min_version=release.min_version)
            grad = known_gradient(kv.rank, release.step, kv.num_keys, kv.dtype)
            kv.push(grad, step=release.step, batch=batch)
            release = kv.clock(release.step, batch=batch, compute_time=0.0)
        final = kv.pull(min_version=max(release.min_version, final_version))
        np.save(Path(out_dir) / f"final-{kv.rank}.npy", final)
        kv.bye()
    finally:
        kv.close()


def start_workers(target, n: int, *args) -> list:
    procs = [CTX.Process(target=target, args=args, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def join_all(procs, timeout: float = 120.0) -> list[int | None]:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
        codes.append(p.exitcode)
    return codes


def side_by_side(commands: dict[str, tuple[list[str], dict]], timeout: float = 300.0
                 ) -> dict[str, subprocess.CompletedProcess]:
    """Every NAME: (ARGV, POPEN KWARGS) started at once (most of a job is process start-up,
    which overlaps), each waited for within `timeout`; {name: finished process, text output}.
    Every child is reaped, killed if its wait ran out."""
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, **kwargs)
             for name, (argv, kwargs) in commands.items()}
    done = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return done


def train_side_by_side(root: Path, runs: dict[str, list[str]], timeout: float = 300.0
                       ) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """`paramserver train ARGS --out root/NAME --quiet` for every NAME: ARGS at once;
    {name: (run folder, finished process)}."""
    done = side_by_side({name: ([sys.executable, "-m", "paramserver", "train", *args, "--out",
                                 str(root / name), "--quiet"], {})
                         for name, args in runs.items()}, timeout)
    return {name: (root / name, proc) for name, proc in done.items()}


def wait_for(predicate, what: str, timeout: float = 60.0, poll: float = 0.02):
    """Poll `predicate` until it returns something true (returned), or fail naming `what`
    once `timeout` seconds have passed: every wait in a live test is bounded."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(poll)
    return found


def run_events(run_dir: Path) -> list[dict]:
    """The run folder's events.jsonl as records so far (none before the file exists)."""
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_together(kvs, timeout: float = 60.0) -> None:
    """Every client's start() at once (the start barrier waits for all of them), each bounded
    by `timeout`."""
    starts = [threading.Thread(target=kv.start) for kv in kvs]
    for t in starts:
        t.start()
    for t in starts:
        t.join(timeout)


def server_listening_at(cluster, addr: str, timeout: float = 15.0):
    """The live server process of `cluster` listening at `addr` (LocalCluster's lookup, as
    a test failure when there is none within `timeout`: a server says its address when it
    registers and listens only once its welcome came, so a test that read the address from
    the join event may ask before it listens)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return cluster.server_listening_at(addr)
        except LookupError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(str(exc)) from None
            time.sleep(0.05)


def bsp_run(steps: int, slow: dict, workers: int = 4, base: float = 0.5, jitter: float = 0.05,
            seed: int = 0) -> list[dict]:
    """Step records of a BSP job: worker w's compute at step k is base x slow(w, k) (with a
    little noise); the round ends when the slowest ends, the others wait for it."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    for k in range(steps):
        compute = {w: base * slow.get(w, lambda k: 1.0)(k) * (1 + jitter * rng.random())
                   for w in range(workers)}
        end = max(compute.values())
        for w in sorted(compute, key=compute.get):
            out.append({"t": round(t + compute[w] + 0.004, 6), "kind": "step", "worker": w,
                        "step": k, "batch": 32, "compute_s": compute[w], "data_s": 0.001,
                        "push_s": 0.002, "pull_s": 0.002, "staleness": 0,
                        "wait_s": round(end - compute[w], 6)})
        t += end + 0.01
    return out


# ---- the coordinator's core, driven by events ---------------------------------------------------
HB = 5.0  # heartbeat timeout of these jobs
ADDR = "tcp://h:1"


def match(instr, instr_type, /, **fields) -> bool:
    """`instr` is an `instr_type` whose named fields are as given; a name that is no attribute is
    looked up in the instruction's payload (a reply's fields, an event's data, a record)."""
    if type(instr) is not instr_type:
        return False
    payload = getattr(instr, "fields", None) or getattr(instr, "data", None) or getattr(
        instr, "record", None) or {}
    for name, want in fields.items():
        have = getattr(instr, name) if hasattr(instr, name) else payload.get(name, KeyError)
        if have != want:
            return False
    return True


def only(out, kind):
    return [i for i in out if type(i) is kind]


def job_of(sync="bsp", evaluator=False, checkpoint_dir=None, checkpoint_every=None,
           resume=None, restart_servers=False, heartbeat_timeout=HB, start_timeout=120.0,
           start_grace=30.0, server_timeout=None, **fields) -> JobSpec:
    """The JobSpec of a test's job: two workers, one server, 10 keys, BSP, no evaluator."""
    fields = dict(dict(workers=2, servers=1, batch_size=32, num_keys=10), **fields)
    job = JobSpec(
        sync=SyncSpec(sync), eval_interval=1.0 if evaluator else 0.0,
        checkpoint=CheckpointSpec(checkpoint_dir, checkpoint_every) if checkpoint_dir else None,
        resume=ResumeSpec(**resume) if resume else None,
        restart_servers=int(restart_servers) if checkpoint_dir else 0,
        limits=Limits(heartbeat_timeout=heartbeat_timeout, start_timeout=start_timeout,
                      start_grace=start_grace, server_timeout=server_timeout), **fields)
    if restart_servers and not checkpoint_dir:
        # A job the spec refuses (nothing to restart from): the core's own guard is tested.
        object.__setattr__(job, "restart_servers", 1)
    return job


def register_all(state, servers=1, workers=2):
    for r in range(servers):
        state.handle(Registered(f"srv{r}", "server", 0.0, to=f"reg-srv{r}", link=f"L{r}",
                                addr=f"tcp://h:{r + 1}"))
    for w in range(workers):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"reg-w{w}"))


def start_round(state):
    """Both workers registered and started: returns the instructions of the last start."""
    register_all(state)
    assert not only(state.handle(Started("w0", 0.5, to="s0")), SendRelease)
    return state.handle(Started("w1", 0.6, to="s1"))


def clock_round(state, step=0, t=1.0, record=None):
    first = state.handle(Clocked("w0", step, 32, 0.1, t, to=f"c0-{step}", record=record))
    return first, state.handle(Clocked("w1", step, 32, 0.1, t + 0.2, to=f"c1-{step}"))


LAUNCH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import paramserver
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PARAMSERVER_JOIN")
    print("ENV " + json.dumps({k: os.environ.get(k) for k in names}), flush=True)
    model = torch.nn.Linear(3, 1)
    opt = paramserver.DistributedOptimizer(model)
    print(f"JOB RANK {opt.rank}", flush=True)
    while not opt.should_stop:
        opt.zero_grad()
        model(torch.ones(opt.batch_size, 3)).sum().backward()
        opt.step(loss=1.0)
    opt.kv.report({"test_accuracy": 0.875})  # a test metric the progress line shows
    print("done", flush=True)
    opt.close()
""")


class Reply(SimpleNamespace):
    """Stands in for a wire Message: fields by name, arrays beside them."""

    def __init__(self, arrays=(), **fields):
        super().__init__(fields=fields, arrays=list(arrays))

    def __getitem__(self, name):
        return self.fields[name]

    def get(self, name, default=None):
        return self.fields.get(name, default)


# The live runtime's packages: nothing pure may reach into them.
RUNTIME = ("paramserver.coordinator", "paramserver.server", "paramserver.client",
           "paramserver.launch", "paramserver.net", "paramserver.training")


def shard_process(cluster, rank: int):
    """The live server process holding shard `rank`: the one listening at its address."""
    events = (cluster.run_dir / "events.jsonl").read_text().splitlines()
    addr = next(e["addr"] for e in map(json.loads, events)
                if e["event"] == "server_joined" and e["rank"] == rank)
    return server_listening_at(cluster, addr)


README = Path(__file__).resolve().parents[1] / "README.md"


README_ADDRESS = "tcp://127.0.0.1:5555"


def kv_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## The KV API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_bare_job(tmp_path, *extra):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "paramserver", "serve", "--num-keys", "1000", "--port", str(port),
         "--out", str(tmp_path / "run"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # printed once the coordinator listens
    return proc, port, first


def reap(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def supervised(cluster, start: bool = True):
    """(thread, errors): `cluster.wait()` in a daemon thread (started unless `start` is
    False), what it raised landing in `errors` for the test to assert on."""
    errors: list = []

    def wait():
        try:
            cluster.wait()
        except Exception as exc:  # the test asserts on it
            errors.append(exc)
    thread = threading.Thread(target=wait, daemon=True)
    if start:
        thread.start()
    return thread, errors
