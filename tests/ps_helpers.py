"""Helpers for the runtime tests: a real job (coordinator + shards) and worker processes."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker

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
    # Plaintext on loopback: these tests drive raw clients; tests/test_security.py covers CURVE.
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


def train_side_by_side(root: Path, runs: dict[str, list[str]], timeout: float = 300.0
                       ) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """`paramserver train ARGS --out root/NAME --quiet` for every NAME: ARGS at once (most of
    each run is process start-up, which overlaps); {name: (run folder, finished process)}.
    Every child is reaped, killed if the wait ran out."""
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "paramserver", "train", *args, "--out", str(root / name),
         "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, args in runs.items()}
    done = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            done[name] = (root / name,
                          subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return done


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


def server_listening_at(cluster, addr: str):
    """The live server process of `cluster` listening at `addr` (LocalCluster's lookup, as
    a test failure when there is none)."""
    try:
        return cluster.server_listening_at(addr)
    except LookupError as exc:
        raise AssertionError(str(exc)) from None
