"""Live resharding against real processes (issue 24): a job of `--servers 2:3` takes a third
server while KV workers push known integer gradients, then lets one go; the final values are
exactly the initial ones less the sum of every acknowledged push (SGD, lr 1), under a round
policy (BSP) and an arrival one (ASP), with an observer pulling throughout (it meets `moved`
and follows). A `train` job does the same and keeps its accuracy. The same logic on the pure
cores runs in the default suite (tests/server/test_reshard_core.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli.drain_cmd import drain
from paramserver.client.kv import KVWorker
from ps_helpers import (
    known_gradient, make_job, run_events, running_job, server_listening_at, wait_for,
)

pytestmark = pytest.mark.slow

KEYS = 3000
WORKERS = 3


def _stop_workers(stop, threads, errors, timeout: float = 60) -> None:
    """Tell the worker threads to stop, wait for each (bounded), and fail with what any
    of them raised."""
    stop.set()
    for t in threads:
        t.join(timeout)
    assert not errors, errors


def _reshards(run_dir, kind: str) -> list[dict]:
    return [e for e in run_events(run_dir) if e["event"] == kind and "epoch" in e]


def _worker(kv: KVWorker, stop: threading.Event, acked: list, errors: list,
            gate: threading.Event | None = None, at_gate: threading.Event | None = None) -> None:
    """Steps until `stop`; with a `gate`, each clock waits for it (`at_gate` set while it
    waits): a worker that holds its release without clocking keeps a reshard's fence open."""
    try:
        release = kv.start()
        while not stop.is_set() and not release.stop:
            kv.pull(min_version=release.min_version)
            # x12: a BSP round's mean over 1..3 pushers is a whole number
            grad = 12 * known_gradient(kv.rank, release.step, KEYS, kv.dtype)
            kv.push(grad, step=release.step, batch=1)
            acked.append((release.step, grad))
            while gate is not None and not gate.is_set() and not stop.is_set():  # (stop bounds it)
                at_gate.set()
                gate.wait(0.05)
            if at_gate is not None:
                at_gate.clear()
            release = kv.clock(release.step, batch=1, compute_time=0.0)
        kv.bye()
    except Exception as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


def _expected(sync: str, init, acked) -> tuple:
    """(the values every acknowledged push makes, the version to wait for): SGD with lr 1;
    ASP applies each push as it comes, BSP each round's mean over those who pushed in it (a
    round that lost workers at the end is applied over the rest)."""
    if sync == "asp":
        return init - sum(g for a in acked for _, g in a), 0
    by_step: dict = {}
    for a in acked:
        for step, g in a:
            by_step.setdefault(step, []).append(g)
    return init - sum(sum(gs) / len(gs) for gs in by_step.values()), len(by_step)


def _observer(kv: KVWorker, stop: threading.Event, pulls: list, errors: list) -> None:
    try:
        while not stop.is_set():
            pulls.append(kv.pull().copy())
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def _server_process(address: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "paramserver", "server", "--join", address],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=dict(os.environ))


@contextmanager
def _train_and_join(tmp_path, run, *flags):
    """`train --servers 2:3` (BSP, 2 workers, a checkpoint every 20 rounds, `flags` besides)
    with a server joined by hand once training runs; yields (the train process, the
    server_joined events). Both processes are reaped, bounded, whatever happened."""
    cmd = [sys.executable, "-m", "paramserver", "train", "--sync", "bsp", "--workers", "2",
           "--servers", "2:3", "--checkpoint-every", "20", "--epochs", "200",
           "--batch-size", "32", "--lr", "0.1", "--eval-interval", "1", "--out", str(run),
           "--timeout", "300", *flags]
    train = subprocess.Popen(cmd, stdout=(tmp_path / "train.log").open("w"),
                             stderr=subprocess.STDOUT)
    joiner = None
    try:
        wait_for(lambda: any(e["event"] == "barrier_open" for e in run_events(run)),
                 "training to start", timeout=120)
        address = (run / "coordinator.addr").read_text().strip()
        joiner = subprocess.Popen(
            [sys.executable, "-m", "paramserver", "server", "--join", address],
            stdout=(tmp_path / "joiner.log").open("w"), stderr=subprocess.STDOUT,
            env=dict(os.environ, PARAMSERVER_KEYS=str(run / "keys")))
        yield train, wait_for(lambda: _reshards(run, "server_joined"), "the join",
                              timeout=120)
    finally:
        for p in (train, joiner):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)


def _end(stop: threading.Event, clients: list, joiner) -> None:
    """A live test's end, whatever happened: the client threads told to stop, the clients
    closed, the joined server process asked to leave and reaped (bounded)."""
    stop.set()
    for kv in clients:
        kv.close()
    if joiner is None:
        return
    if joiner.poll() is None:
        joiner.send_signal(signal.SIGTERM)
    try:
        joiner.wait(30)
    except subprocess.TimeoutExpired:
        joiner.kill()
        joiner.wait(10)


@pytest.mark.parametrize("sync", ["bsp", "asp"])
def test_a_server_joins_and_one_drains_with_every_update_kept_exactly(tmp_path, sync):
    job = make_job(KEYS, 2, WORKERS, sync=sync, max_servers=3, retry_interval=0.5)
    joiner = None
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(WORKERS)]
        watcher = KVWorker(cluster.address, role="observer")
        init = np.arange(KEYS, dtype=np.float64)
        acked = [[] for _ in kvs]
        pulls: list = []
        errors: list = []
        stop = threading.Event()
        threads = []
        try:
            kvs[0].init(init)
            threads = [threading.Thread(target=_worker, args=(kv, stop, a, errors))
                       for kv, a in zip(kvs, acked)]
            threads.append(threading.Thread(target=_observer,
                                            args=(watcher, stop, pulls, errors)))
            for t in threads:
                t.start()
            wait_for(lambda: sum(map(len, acked)) >= 30, "30 acknowledged pushes")
            joiner = _server_process(cluster.address, tmp_path / "joiner.log")
            joined = wait_for(lambda: _reshards(cluster.run_dir, "server_joined"),
                              "the third server's join")[0]
            assert joined["servers"] == 3 and joined["moved_keys"] > 0
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes on three servers")
            drain(cluster.address, 0, wait=60, out=open(os.devnull, "w"))
            drained = _reshards(cluster.run_dir, "server_drained")[0]
            assert drained["servers"] == 2 and drained["epoch"] == 2
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes after the drain")
            _stop_workers(stop, threads, errors)
            assert all(not t.is_alive() for t in threads)
            expected, rounds = _expected(sync, init, acked)
            final = watcher.pull(min_version=rounds)
            # The server scales a round's sum by 1/n (1/3 is inexact in binary), so allow
            # rounding; one lost or doubled push moves hundreds of keys by 4 or more.
            np.testing.assert_allclose(final, expected, rtol=0, atol=1e-9)
            assert len(pulls) > 10  # the observer kept reading across both moves
            watcher.bye()
        finally:
            _end(stop, [*kvs, watcher], joiner)
        supervisor.join(60)
    events = run_events(cluster.run_dir)
    moving = [e for e in events if e["event"] == "reshard_moving"]
    assert [e["epoch"] for e in moving] == [1, 2]
    # The layouts are contiguous over every key, and the drained server is out of the last.
    for e in moving:
        layout = e["layout"]
        assert layout[0][2] == 0 and layout[-1][3] == KEYS
        assert all(a[3] == b[2] for a, b in zip(layout, layout[1:]))
    assert drained["addr"] not in [x[1] for x in moving[-1]["layout"]]
    assert not [e for e in events if e["event"] in ("reshard_refused", "job_failed")]


ROW_KEYS = np.unique(np.random.default_rng(5).integers(-2**62, 2**62, 600)).astype(np.int64)


def _row_worker(kv: KVWorker, stop: threading.Event, acked: list, errors: list) -> None:
    """ASP steps pushing integer rows of a sparse table (SGD lr 1, rows starting at 0):
    a row's final value is minus the sum of every acknowledged push of it, exactly."""
    try:
        release = kv.start()
        rng = np.random.default_rng(kv.rank)
        while not stop.is_set() and not release.stop:
            keys = rng.choice(ROW_KEYS, 40)  # duplicates too: the shard sums them
            grads = rng.integers(-5, 6, (40, 2)).astype(np.float32)
            kv.rows.pull("emb", keys)
            kv.rows.push("emb", keys, grads, step=release.step, batch=1)
            acked.append((keys, grads))
            release = kv.clock(release.step, batch=1, compute_time=0.0)
        kv.bye()
    except Exception as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


def test_sparse_rows_move_with_a_join_and_a_drain_and_every_push_is_kept_exactly(tmp_path):
    """A --servers 2:3 job with a sparse table: workers push integer rows while a server
    joins and one drains; every row ends as exactly the sum of its acknowledged pushes, read
    by an observer that kept pulling rows across both moves (it meets `moved` and follows)."""
    table = {"name": "emb", "dim": 2, "optimizer": "sgd", "lr": 1.0, "init_scale": 0.0,
             "row_budget": 100_000}
    job = make_job(KEYS, 2, WORKERS, sync="asp", max_servers=3, retry_interval=0.5,
                   tables=[table])
    joiner = None
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(WORKERS)]
        watcher = KVWorker(cluster.address, role="observer")
        acked = [[] for _ in kvs]
        reads: list = []
        errors: list = []
        stop = threading.Event()

        def observe():
            try:
                while not stop.is_set():
                    reads.append(watcher.rows.pull("emb", ROW_KEYS[:50]))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=_row_worker, args=(kv, stop, a, errors))
                   for kv, a in zip(kvs, acked)] + [threading.Thread(target=observe)]
        try:
            kvs[0].init(np.zeros(KEYS))
            for t in threads:
                t.start()
            wait_for(lambda: sum(map(len, acked)) >= 30, "30 acknowledged pushes")
            joiner = _server_process(cluster.address, tmp_path / "joiner.log")
            wait_for(lambda: _reshards(cluster.run_dir, "server_joined"), "the join")
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes on three servers")
            drain(cluster.address, 0, wait=60, out=open(os.devnull, "w"))
            assert _reshards(cluster.run_dir, "server_drained")[0]["servers"] == 2
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes after the drain")
            _stop_workers(stop, threads, errors)
            expected = np.zeros((len(ROW_KEYS), 2), np.float64)
            where = {int(k): i for i, k in enumerate(ROW_KEYS)}
            for keys, grads in (x for a in acked for x in a):
                np.add.at(expected, [where[int(k)] for k in keys], -grads)
            np.testing.assert_array_equal(watcher.rows.pull("emb", ROW_KEYS), expected)
            assert len(reads) > 10
            watcher.bye()
        finally:
            _end(stop, [*kvs, watcher], joiner)
        supervisor.join(60)
    events = run_events(cluster.run_dir)
    assert not [e for e in events if e["event"] in ("reshard_refused", "job_failed")]


def test_training_keeps_its_accuracy_across_a_join_and_a_drain(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "paramserver", "train", "--sync", "bsp", "--workers", "2",
           "--servers", "2:3", "--epochs", "200", "--max-seconds", "40", "--batch-size", "32",
           "--lr", "0.1",
           "--eval-interval", "1", "--out", str(run), "--timeout", "300"]
    log = (tmp_path / "train.log").open("w")
    train = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    joiner = None
    try:
        wait_for(lambda: any(e["event"] == "barrier_open" for e in run_events(run)),
                 "training to start", timeout=120)
        address = (run / "coordinator.addr").read_text().strip()
        env = dict(os.environ, PARAMSERVER_KEYS=str(run / "keys"))
        joiner = subprocess.Popen(
            [sys.executable, "-m", "paramserver", "server", "--join", address],
            stdout=(tmp_path / "joiner.log").open("w"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: _reshards(run, "server_joined"), "the join", timeout=120)
        drain(str(run), 1, wait=120, out=open(os.devnull, "w"))
        assert train.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        for p in (train, joiner):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_accuracy"] >= 0.9, summary
    assert [e["servers"] for e in _reshards(run, "server_joined")] == [3]
    assert [e["servers"] for e in _reshards(run, "server_drained")] == [2]


def test_a_job_resumes_on_fewer_servers_than_its_checkpoint_was_taken_on(tmp_path):
    """A --servers 2:3 job whose last checkpoint holds three parts (a server joined) resumes
    on two: each shard is cut anew from the parts holding its keys, and training goes on from
    where the checkpoint left it."""
    run = tmp_path / "run"
    with _train_and_join(tmp_path, run, "--max-seconds", "25") as (train, _):
        assert train.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
        first = json.loads((run / "summary.json").read_text())
        latest = (run / "checkpoints" / "LATEST").read_text().strip()
        parts = sorted(p.name for p in (run / "checkpoints" / f"ckpt-{latest}").glob("server-*"))
        assert parts == ["server-0", "server-1", "server-2"]  # taken on three servers
        resumed = subprocess.run(
            [sys.executable, "-m", "paramserver", "train", "--resume", str(run),
             "--max-seconds", "35", "--timeout", "300"],
            capture_output=True, text=True, timeout=400)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    after = json.loads((run / "summary.json").read_text())
    assert first["final_test_accuracy"] >= 0.85
    # Restored, not restarted: the resumed run goes on from the checkpoint's samples.
    assert after["samples"] > first["samples"] and after["final_test_accuracy"] >= 0.85
    assert any(e["event"] == "checkpoint" for e in run_events(run))


def _row_and_dense_worker(kv: KVWorker, stop: threading.Event, acked: list,
                          errors: list) -> None:
    """ASP steps pushing integer dense values and integer rows (SGD lr 1)."""
    try:
        release = kv.start()
        rng = np.random.default_rng(kv.rank + 10)
        while not stop.is_set() and not release.stop:
            grad = known_gradient(kv.rank, release.step, KEYS, kv.dtype)
            keys = rng.choice(ROW_KEYS, 30)
            rows = rng.integers(-5, 6, (30, 2)).astype(np.float32)
            kv.push(grad, step=release.step, batch=1)
            kv.rows.push("emb", keys, rows, step=release.step, batch=1)
            acked.append((grad, keys, rows))
            release = kv.clock(release.step, batch=1, compute_time=0.0)
        kv.bye()
    except Exception as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


@pytest.mark.parametrize("kill", [False, True], ids=["drain", "drain-killed-primary"])
def test_replicated_shards_follow_a_join_and_a_drain_and_survive_a_killed_primary(
        tmp_path, kill):
    """--servers 2:3 --replicas 2 with a sparse table: a server joins (it takes the drained
    server's backup later), one primary is drained; with `kill`, the primary of the shard to
    be drained is SIGKILLed as the drain is asked, so its backup takes over and is drained in
    its place. Every acknowledged dense and row push is in the final values, exactly."""
    table = {"name": "emb", "dim": 2, "optimizer": "sgd", "lr": 1.0, "init_scale": 0.0,
             "row_budget": 100_000}
    job = make_job(KEYS, 2, WORKERS, sync="asp", max_servers=3, replicas=2,
                   retry_interval=0.5, heartbeat_timeout=3.0, tables=[table])
    joiner = None
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(WORKERS)]
        watcher = KVWorker(cluster.address, role="observer")
        acked = [[] for _ in kvs]
        errors: list = []
        stop = threading.Event()
        threads = []
        try:
            init = np.arange(KEYS, dtype=np.float64)
            kvs[0].init(init)
            threads = [threading.Thread(target=_row_and_dense_worker, args=(kv, stop, a, errors))
                       for kv, a in zip(kvs, acked)]
            for t in threads:
                t.start()
            wait_for(lambda: {e["rank"] for e in run_events(cluster.run_dir)
                              if e["event"] == "backup_synced"} == {0, 1}, "synced backups")
            wait_for(lambda: sum(map(len, acked)) >= 30, "30 acknowledged pushes")
            joiner = _server_process(cluster.address, tmp_path / "joiner.log")
            wait_for(lambda: _reshards(cluster.run_dir, "server_joined"), "the join")
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes on three servers")
            wait_for(lambda: len([e for e in run_events(cluster.run_dir)
                                  if e["event"] in ("backup_synced", "backup_rebuilt")]) >= 4,
                     "the backups synced again after the join")
            if kill:
                layout = _reshards(cluster.run_dir, "server_joined")[-1]["layout"]
                os.kill(server_listening_at(cluster, layout[0][1]).proc.pid, signal.SIGKILL)
            drain(cluster.address, 0, wait=90, out=open(os.devnull, "w"))
            # (a drain of a shard whose primary died ends once its backup is drained)
            drained = wait_for(lambda: _reshards(cluster.run_dir, "server_drained"),
                               "the drain", timeout=90)
            assert drained[0]["servers"] == 2
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 30, "pushes after the drain")
            _stop_workers(stop, threads, errors)
            dense = init - sum(g for a in acked for g, _, _ in a)
            np.testing.assert_array_equal(watcher.pull(), dense)
            expected = np.zeros((len(ROW_KEYS), 2), np.float64)
            where = {int(k): i for i, k in enumerate(ROW_KEYS)}
            for _, keys, rows in (x for a in acked for x in a):
                np.add.at(expected, [where[int(k)] for k in keys], -rows)
            np.testing.assert_array_equal(watcher.rows.pull("emb", ROW_KEYS), expected)
            watcher.bye()
        finally:
            _end(stop, [*kvs, watcher], joiner)
        supervisor.join(60)
    events = run_events(cluster.run_dir)
    kinds = [e["event"] for e in events]
    assert "job_failed" not in kinds and "reshard_refused" not in kinds
    if kill:
        assert "replica_promoted" in kinds



def _dense_worker(kv: KVWorker, keys: int, stop: threading.Event, acked: list,
                  errors: list) -> None:
    """ASP steps pushing known integer gradients of `keys` values (SGD lr 1)."""
    try:
        release = kv.start()
        while not stop.is_set() and not release.stop:
            grad = known_gradient(kv.rank, release.step, keys, kv.dtype)
            kv.push(grad, step=release.step, batch=1)
            acked.append(grad)
            release = kv.clock(release.step, batch=1, compute_time=0.0)
        kv.bye()
    except Exception as exc:  # noqa: BLE001 (reported by the test)
        errors.append(exc)


def test_a_primary_killed_while_keys_move_is_replaced_and_the_move_goes_again(tmp_path):
    """--servers 2:3 --replicas 2 on a key space large enough for the move to take a while:
    a primary is SIGKILLed as soon as the join's move begins. Every server kept its old
    core until the commit, so once the backup is promoted the same move starts again under
    the next epoch from the old cores, and every acknowledged push is in the final values."""
    keys = 2_000_000
    job = make_job(keys, 2, 2, sync="asp", max_servers=3, replicas=2, retry_interval=0.5,
                   heartbeat_timeout=3.0)
    joiner = None
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        watcher = KVWorker(cluster.address, role="observer")
        acked = [[] for _ in kvs]
        errors: list = []
        stop = threading.Event()
        threads = []
        events = cluster.run_dir / "events.jsonl"

        try:
            init = np.zeros(keys)
            kvs[0].init(init)
            threads = [threading.Thread(target=_dense_worker, args=(kv, keys, stop, a, errors))
                       for kv, a in zip(kvs, acked)]
            for t in threads:
                t.start()
            wait_for(lambda: {e["rank"] for e in run_events(cluster.run_dir)
                              if e["event"] == "backup_synced"} == {0, 1}, "synced backups")
            wait_for(lambda: sum(map(len, acked)) >= 6, "6 acknowledged pushes")
            victim = server_listening_at(cluster, next(
                e["addr"] for e in run_events(cluster.run_dir)
                if e["event"] == "server_joined" and e.get("rank") == 1)).proc.pid
            joiner = _server_process(cluster.address, tmp_path / "joiner.log")
            deadline = time.monotonic() + 120
            while b'"reshard_moving"' not in events.read_bytes():  # bounded below
                assert time.monotonic() < deadline, "the move never began"
                time.sleep(0.001)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: _reshards(cluster.run_dir, "server_joined"), "the join",
                     timeout=120)
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 6, "pushes after the join",
                     timeout=120)
            _stop_workers(stop, threads, errors, timeout=120)
            np.testing.assert_array_equal(watcher.pull(), init - sum(g for a in acked for g in a))
            watcher.bye()
        finally:
            _end(stop, [*kvs, watcher], joiner)
        supervisor.join(60)
    moving = [e for e in run_events(cluster.run_dir) if e["event"] == "reshard_moving"]
    kinds = [e["event"] for e in run_events(cluster.run_dir)]
    assert "replica_promoted" in kinds and "job_failed" not in kinds
    # (the kill came before the commit: the move went again under the next epoch)
    assert [e.get("again", False) for e in moving] == [False, True], moving


def test_a_joiner_killed_while_keys_move_is_given_up_and_the_job_goes_on(tmp_path):
    """A joining server SIGKILLed as soon as its move begins: once the move is past its
    limit (server_timeout) it is given up, every server serves its old range from the core
    it kept, and the job goes on with every acknowledged push in the final values."""
    keys = 2_000_000
    job = make_job(keys, 2, 2, sync="asp", max_servers=3, retry_interval=0.5,
                   server_timeout=4.0)
    joiner = None
    with running_job(tmp_path, job) as cluster:
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        watcher = KVWorker(cluster.address, role="observer")
        acked = [[] for _ in kvs]
        errors: list = []
        stop = threading.Event()
        events = cluster.run_dir / "events.jsonl"

        threads = [threading.Thread(target=_dense_worker, args=(kv, keys, stop, a, errors))
                   for kv, a in zip(kvs, acked)]
        try:
            kvs[0].init(np.zeros(keys))
            for t in threads:
                t.start()
            wait_for(lambda: sum(map(len, acked)) >= 6, "6 acknowledged pushes")
            joiner = _server_process(cluster.address, tmp_path / "joiner.log")
            deadline = time.monotonic() + 120
            while b'"reshard_moving"' not in events.read_bytes():  # bounded below
                assert time.monotonic() < deadline, "the move never began"
                time.sleep(0.001)
            joiner.kill()
            joiner.wait(10)
            wait_for(lambda: [e for e in run_events(cluster.run_dir)
                              if e["event"] == "reshard_refused"], "the move given up",
                     timeout=60)
            before = sum(map(len, acked))
            wait_for(lambda: sum(map(len, acked)) >= before + 6, "pushes after the abort")
            _stop_workers(stop, threads, errors, timeout=120)
            np.testing.assert_array_equal(watcher.pull(), -sum(g for a in acked for g in a))
            watcher.bye()
        finally:
            _end(stop, [*kvs, watcher], joiner)
        supervisor.join(60)
    kinds = [e["event"] for e in run_events(cluster.run_dir)]
    assert "job_failed" not in kinds and "server_joined" not in kinds[kinds.index(
        "reshard_moving"):]


def test_a_server_killed_after_keys_moved_restarts_from_a_checkpoint(tmp_path):
    """--servers 2:3 --restart-servers 1: a server joins, a checkpoint is taken on three
    servers, then a launched server is SIGKILLed: it is restarted at its address with its
    current range, restored from that checkpoint, and training ends with its accuracy."""
    import psutil
    run = tmp_path / "run"
    with _train_and_join(tmp_path, run, "--restart-servers", "1", "--max-seconds", "30") as (
            train, joined):
        at = joined[0]["t"]
        wait_for(lambda: [e for e in run_events(run)
                          if e["event"] == "checkpoint" and e["t"] > at], "a checkpoint of 3")
        port = int(joined[0]["layout"][0][1].rsplit(":", 1)[1])
        victim = next(p for p in psutil.Process(train.pid).children(recursive=True) if any(
            c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in p.net_connections("tcp")))
        victim.kill()
        assert train.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
    events = run_events(run)
    rejoined = [e for e in events if e["event"] == "server_rejoined"]
    assert [e["rank"] for e in rejoined] == [0]
    assert any(e["event"] == "server_restored" for e in events)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_accuracy"] >= 0.9, summary


def test_a_sigterm_drain_lost_with_the_coordinator_is_done_by_the_restarted_one(tmp_path):
    """--servers 2:3 --restart-coordinator 1: a server joins; the coordinator is stopped, the
    joined server is sent SIGTERM (it asks to be drained: the `drain` lies unread in the
    stopped coordinator's socket) and the coordinator is SIGKILLed. The restarted one takes the
    job back; the server's rejoin says its drain is still to do, so it is drained and exits
    PREEMPTED. Before, the ask died with the coordinator and the server served on."""
    from paramserver.core.exits import Exit
    from paramserver.launch.local import LocalCluster
    job = make_job(KEYS, 2, 2, sync="asp", max_servers=3, retry_interval=0.5)
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, keys=None,
                           restart_coordinator=1)
    stop = threading.Event()
    kvs, threads, errors, joiner = [], [], [], None
    try:
        cluster.start(spawn_workers=False)
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        kvs[0].init(np.zeros(KEYS))
        acked = [[] for _ in kvs]
        threads = [threading.Thread(target=_worker, args=(kv, stop, a, errors))
                   for kv, a in zip(kvs, acked)]
        for t in threads:
            t.start()
        wait_for(lambda: sum(map(len, acked)) >= 30, "30 acknowledged pushes")
        log = tmp_path / "joiner.log"
        joiner = _server_process(cluster.address, log)
        joined = wait_for(lambda: _reshards(cluster.run_dir, "server_joined"), "the join")[0]
        first = cluster.coordinator
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            joiner.send_signal(signal.SIGTERM)
            wait_for(lambda: "asking the coordinator to drain it" in log.read_text(),
                     "the joined server's drain ask", timeout=20)
            time.sleep(0.2)  # (its `drain` written to the stopped coordinator's socket)
        finally:
            os.kill(first.proc.pid, signal.SIGKILL)
            os.kill(first.proc.pid, signal.SIGCONT)
        drained = wait_for(lambda: _reshards(cluster.run_dir, "server_drained"),
                           "the drain, by the restarted coordinator", timeout=60)[0]
        assert drained["addr"] == joined["addr"] and drained["servers"] == 2
        assert joiner.wait(30) == Exit.PREEMPTED
        before = sum(map(len, acked))
        wait_for(lambda: sum(map(len, acked)) >= before + 20, "pushes after the drain")
        _stop_workers(stop, threads, errors)
    finally:
        _end(stop, kvs, joiner)
        cluster.stop()
    assert cluster.coordinator_restarts == 1
    events = run_events(cluster.run_dir)
    asked = [e for e in events if e["event"] == "server_drain_asked"]
    assert [(e["addr"], e.get("again")) for e in asked] == [(joined["addr"], True)]
    assert [e["event"] for e in events].count("taken_back") == 1


def test_a_joiner_whose_fence_the_coordinator_died_in_joins_under_the_restarted_one(tmp_path):
    """--servers 2:3 --restart-coordinator 1: a server asks to join while a KV worker holds
    its release (it does not clock, so the fence cannot close) and the coordinator is
    SIGKILLed during the fence. The joiner's connection comes back to the restarted
    coordinator and it registers again; after the take-back the job is fenced afresh, the
    worker clocks, keys move, and every acknowledged push is in the final values. Before,
    the restarted coordinator never heard of the joiner, which gave up after its
    register_timeout (60 s) and exited; the job went on without it."""
    from paramserver.launch.local import LocalCluster
    job = make_job(KEYS, 2, 2, sync="asp", max_servers=3, retry_interval=0.5)
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=180, keys=None,
                           restart_coordinator=1)
    stop, gate, at_gate = threading.Event(), threading.Event(), threading.Event()
    gate.set()
    kvs, threads, errors, joiner, watcher = [], [], [], None, None
    try:
        cluster.start(spawn_workers=False)
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        init = np.arange(KEYS, dtype=np.float64)
        kvs[0].init(init)
        acked = [[] for _ in kvs]
        threads = [threading.Thread(target=_worker, args=(kvs[0], stop, acked[0], errors)),
                   threading.Thread(target=_worker,
                                    args=(kvs[1], stop, acked[1], errors, gate, at_gate))]
        for t in threads:
            t.start()
        wait_for(lambda: sum(map(len, acked)) >= 30, "30 acknowledged pushes")
        gate.clear()
        wait_for(at_gate.is_set, "the worker holding its release")
        joiner = _server_process(cluster.address, tmp_path / "joiner.log")
        wait_for(lambda: any(e["event"] == "reshard_fence" for e in run_events(
            cluster.run_dir)), "the fence for the join")
        assert at_gate.is_set() and not _reshards(cluster.run_dir, "server_joined")
        os.kill(cluster.coordinator.proc.pid, signal.SIGKILL)
        wait_for(lambda: any(e["event"] == "taken_back" for e in run_events(cluster.run_dir)),
                 "the take-back", timeout=60)
        fenced = wait_for(lambda: [e for e in run_events(cluster.run_dir)[_restart(cluster):]
                                   if e["event"] == "reshard_fence"],
                          "the restarted coordinator's fence", timeout=60)
        assert fenced[0]["kind"] == "join"
        gate.set()
        joined = wait_for(lambda: _reshards(cluster.run_dir, "server_joined"),
                          "the join, by the restarted coordinator", timeout=60)[0]
        assert joined["servers"] == 3 and joined["moved_keys"] > 0
        assert joined["addr"] == fenced[0]["addr"] and joiner.poll() is None
        watcher = KVWorker(cluster.address, role="observer")  # (reads once the workers left)
        before = sum(map(len, acked))
        wait_for(lambda: sum(map(len, acked)) >= before + 20, "pushes on three servers")
        _stop_workers(stop, threads, errors)
        assert all(not t.is_alive() for t in threads)
        expected, _ = _expected("asp", init, acked)
        np.testing.assert_array_equal(watcher.pull(), expected)
        watcher.bye()
    finally:
        _end(stop, [*kvs, *([watcher] if watcher is not None else [])], joiner)
        cluster.stop()
    assert cluster.coordinator_restarts == 1
    events = run_events(cluster.run_dir)
    kinds = [e["event"] for e in events]
    assert kinds.count("taken_back") == 1 and kinds.count("server_joined") >= 1
    assert kinds.index("restart") < kinds.index("server_joined", kinds.index("restart"))
    assert "job_failed" not in kinds and "reshard_refused" not in kinds


def _restart(cluster) -> int:
    """The index in events.jsonl of the restarted coordinator's first line."""
    kinds = [e["event"] for e in run_events(cluster.run_dir)]
    return kinds.index("restart") if "restart" in kinds else len(kinds)
