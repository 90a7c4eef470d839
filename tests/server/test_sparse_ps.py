"""Sparse tables end to end: real coordinator and shard processes, workers as threads.

Rows pushed by 8 concurrent workers equal a numpy reference (arrival and round mode), rows are
initialised by key wherever they live, bad requests are refused with a clear error while the
server keeps serving, tables survive a checkpoint and a server's crash, and every sync policy
runs steps of rows.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.net.rpc import RemoteError
from paramserver.policies import SYNC_POLICIES
from paramserver.runlog.checkpoint import latest
from paramserver.runlog.metrics import read_records
from paramserver.sparse.init import initial_rows
from paramserver.wire import Message
from paramserver.wire.protocol import MAX_KEYS_PER_REQUEST
from ps_helpers import known_gradient, make_job, running_job, wait_for

DIM, SCALE, LR = 4, 0.1, 0.5
TABLE = {"name": "emb", "dim": DIM, "optimizer": "sgd", "lr": LR, "init_scale": SCALE}
DENSE_KEYS = 6
# Hashed ids are any int64: negative ones and very large ones too.
KEY_SPACE = np.array([0, 1, 2, 3, 5, 8, 13, 21, -1, -7, 2**62 + 3, -(2**63)], dtype=np.int64)


def _job(servers: int, workers: int, sync: str, **extra) -> dict:
    return make_job(DENSE_KEYS, servers, workers, sync=sync, dtype="float32", lr=LR,
                    tables=[TABLE], retry_interval=0.5, **extra)


def step_rows(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """A worker's keys for a step, with repeats, and small dyadic gradients (sums are exact
    in float32 in any order)."""
    rng = np.random.default_rng(1000 * rank + step)
    keys = KEY_SPACE[rng.integers(0, KEY_SPACE.size, size=10)]
    grads = (rng.integers(-8, 9, size=(keys.size, DIM)) / 8).astype(np.float32)
    return keys, grads


def rows_reference(workers: int, steps: int, batch_of, sync: str) -> list[np.ndarray]:
    """The table's rows over KEY_SPACE after each of `steps` rounds (SGD): arrival mode adds
    every push whole; round mode the batch-weighted average of the round's pushes."""
    rows = initial_rows(KEY_SPACE, DIM, SCALE).astype(np.float64)
    where = {int(k): i for i, k in enumerate(KEY_SPACE)}
    out = [rows.copy()]
    for step in range(steps):
        total = sum(batch_of(r) for r in range(workers))
        delta = np.zeros_like(rows)
        for rank in range(workers):
            keys, grads = step_rows(rank, step)
            weight = 1.0 if sync == "asp" else batch_of(rank) / total
            for k, g in zip(keys.tolist(), grads):
                delta[where[k]] += weight * g
        rows = rows - LR * delta
        out.append(rows.copy())
    return out


def run_threads(target, n: int, timeout: float = 120.0) -> list:
    """Run target(i) in n threads; the errors they raised (none if all went well)."""
    errors: list = []

    def body(i):
        try:
            target(i)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append((i, exc))

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "worker threads still running"
    return errors


def table_rows_in_metrics(run_dir) -> bool:
    """Whether a shard's heartbeat brought its tables' rows into the job's metrics."""
    path = run_dir / "metrics.jsonl"
    return path.exists() and any(r.get("kind") == "server" and r.get("table_rows", 0) > 0
                                 for r in read_records(path))


# ---- the spec -----------------------------------------------------------------------------------
def test_tables_travel_in_the_job_and_the_server_welcome():
    from paramserver.spec.job import JobSpec, JobSpecError, TableSpec
    from paramserver.spec.welcome import ServerJob
    job = JobSpec.from_dict(_job(3, 1, "bsp"))
    assert job.tables == (TableSpec(**TABLE),)
    assert JobSpec.from_dict(job.to_dict()) == job
    assert JobSpec.from_dict(make_job(4, 1, 1)).tables == ()  # a dense job's file as before
    shard = ServerJob.from_dict(ServerJob.of(job, 0, 2, "round").to_dict())
    assert shard.tables == job.tables and shard.servers == 3
    assert TableSpec("t", 2, row_budget=10).capacity(3) == 4  # rounded up
    for bad, field in (({"name": "Emb"}, "tables.name"), ({"dim": 0}, "tables.emb.dim"),
                       ({"optimizer": "adam"}, "tables.emb.optimizer"),
                       ({"evict": "fifo"}, "tables.emb.evict"),
                       ({"admit_after": 0}, "tables.emb.admit_after"),
                       ({"row_budget": 0}, "tables.emb.row_budget")):
        with pytest.raises(JobSpecError, match=f"'{field}'"):
            JobSpec.from_dict({**_job(1, 1, "asp"), "tables": [{**TABLE, **bad}]})
    with pytest.raises(JobSpecError, match="distinct names"):
        JobSpec.from_dict({**_job(1, 1, "asp"), "tables": [TABLE, TABLE]})


# ---- exactness ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", ["asp", "bsp"])
def test_rows_of_8_concurrent_workers_equal_a_numpy_reference(tmp_path, sync):
    """8 workers push rows with repeated keys (and dense values) through push_step; in BSP
    each step's pull sees exactly the rounds so far, rows and dense values alike."""
    workers, steps = 8, 4
    batch_of = (lambda r: 1) if sync == "asp" else (lambda r: r + 1)
    ref = rows_reference(workers, steps, batch_of, sync)
    seen, finals = {}, {}
    done = threading.Barrier(workers, timeout=60)
    with running_job(tmp_path, _job(2, workers, sync)) as cluster:
        def worker(_):
            kv = KVWorker(cluster.address)
            try:
                if kv.rank == 0:
                    kv.init(np.zeros(DENSE_KEYS, np.float32))
                release = kv.start()
                for _ in range(steps):
                    step = release.step
                    if sync == "bsp":
                        now = kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version)
                        seen[(kv.rank, step)] = now
                    keys, grads = step_rows(kv.rank, step)
                    dense = known_gradient(kv.rank, step, DENSE_KEYS, np.float32)
                    kv.push_step(dense, {"emb": (keys, grads)}, step=step,
                                 batch=batch_of(kv.rank), round_size=release.round_size)
                    release = kv.clock(step, batch=batch_of(kv.rank), compute_time=0.0)
                done.wait()  # every push acknowledged: all applied (ASP) or in rounds (BSP)
                finals[kv.rank] = (kv.rows.pull("emb", KEY_SPACE, release.min_version),
                                   kv.pull(min_version=release.min_version))
                if kv.rank == 0:  # the job lasts until the shards' next heartbeats are in
                    wait_for(lambda: table_rows_in_metrics(cluster.run_dir), "table counters")
                done.wait()  # nobody leaves before all have read: the job ends with the last
                kv.bye()
            finally:
                kv.close()

        assert run_threads(worker, workers) == []
    final, dense = finals[0]
    np.testing.assert_allclose(final, ref[steps], rtol=0, atol=1e-6)
    # The dense values went with the rows, in the same rounds.
    expected = np.zeros(DENSE_KEYS)
    for step in range(steps):
        grads = [known_gradient(r, step, DENSE_KEYS, np.float64) for r in range(workers)]
        if sync == "asp":
            expected -= LR * sum(grads)
        else:
            total = sum(batch_of(r) for r in range(workers))
            expected -= LR * sum(batch_of(r) * g for r, g in enumerate(grads)) / total
    np.testing.assert_allclose(dense, expected, rtol=0, atol=1e-5)
    if sync == "bsp":
        assert len(seen) == workers * steps
        for (rank, step), rows in seen.items():
            np.testing.assert_allclose(rows, ref[step], rtol=0, atol=1e-6,
                                       err_msg=f"worker {rank} at step {step}")


def test_rows_are_initialised_by_key_on_any_shard(tmp_path):
    """An untouched key reads as initial_rows(key) whichever shard holds it: with 2 or 3
    shards (another placement), and in the caller's order, duplicates included."""
    keys = np.concatenate([KEY_SPACE, KEY_SPACE[::-1], np.arange(100, 140)])
    expected = initial_rows(keys, DIM, SCALE)
    for servers in (2, 3):
        with running_job(tmp_path / f"s{servers}", _job(servers, 1, "asp")) as cluster:
            with KVWorker(cluster.address) as kv:
                assert kv.rows.specs["emb"].dim == DIM
                got = kv.rows.pull("emb", keys)
                # hashed ids come as uint64 too: the same keys, bit for bit
                again = kv.rows.pull("emb", keys.view(np.uint64))
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(again, expected)


# ---- bad input ----------------------------------------------------------------------------------
def test_the_wire_and_the_table_refuse_the_same_batch_size():
    from paramserver.sparse import table
    assert MAX_KEYS_PER_REQUEST == table.MAX_KEYS_PER_REQUEST


def _refused(kv, shard: int, msg: Message) -> str:
    """Send `msg` as it is (past the client's checks); the server's error text."""
    rid = kv.requests.send(shard, msg)
    with pytest.raises(RemoteError) as info:
        kv.requests.collect([(shard, rid, None)], msg.op)
    return str(info.value)


def test_bad_row_requests_get_clear_errors_and_the_server_keeps_serving(tmp_path):
    with running_job(tmp_path, _job(1, 1, "asp")) as cluster:
        with KVWorker(cluster.address) as kv:
            kv.init(np.zeros(DENSE_KEYS, np.float32))
            kv.start()
            keys = np.array([3, 4], dtype=np.int64)
            before = kv.rows.pull("emb", keys)
            grads = np.ones((2, DIM), np.float32)
            push = {"step": 0, "version": 0, "batch": 1}
            # The client refuses before sending...
            with pytest.raises(ValueError, match="int64"):
                kv.rows.pull("emb", np.array([3.0, 4.0]))
            with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
                kv.rows.push("emb", keys, np.ones((2, DIM + 1), np.float32), step=0, batch=1)
            with pytest.raises(ValueError, match="unknown table 'nope'"):
                kv.rows.pull("nope", keys)
            huge = np.broadcast_to(np.int64(7), (10**9,))  # no memory: refused by its size
            import torch
            np.testing.assert_array_equal(kv.rows.pull("emb", torch.from_numpy(keys)), before)
            with pytest.raises(ValueError, match=f"at most {MAX_KEYS_PER_REQUEST}"):
                kv.rows.pull("emb", huge)
            # ...and the server refuses what comes anyway, naming the fault.
            text = _refused(kv, 0, Message("push_rows", {"table": "emb", **push},
                                           [keys.astype(np.float64), grads.reshape(-1)]))
            assert "keys must be int64" in text
            text = _refused(kv, 0, Message("push_rows", {"table": "emb", **push},
                                           [keys, np.ones(2 * DIM + 2, np.float32)]))
            assert "rows of 4 values" in text
            text = _refused(kv, 0, Message("pull_rows", {"table": "nope"}, [keys]))
            assert "unknown table 'nope'" in text and "emb" in text
            too_many = np.zeros(MAX_KEYS_PER_REQUEST + 1, dtype=np.int64)
            text = _refused(kv, 0, Message("pull_rows", {"table": "emb"}, [too_many]))
            assert f"at most {MAX_KEYS_PER_REQUEST}" in text
            # Nothing changed, and the shard still serves rows and values.
            np.testing.assert_array_equal(kv.rows.pull("emb", keys), before)
            kv.rows.push("emb", keys, grads, step=0, batch=1)
            np.testing.assert_allclose(kv.rows.pull("emb", keys), before - LR, atol=1e-6)
            np.testing.assert_array_equal(kv.pull(), np.zeros(DENSE_KEYS, np.float32))
            state = cluster_status_tables(kv)
            assert state["rows"] == 2 and state["created"] == 2
            kv.bye()


def cluster_status_tables(kv) -> dict:
    """Shard 0's counters of table emb, from its status reply."""
    rid = kv.requests.send(0, Message("status"))
    reply = kv.requests.collect([(0, rid, None)], "status")[rid]
    return reply["state"]["tables"]["emb"]


# ---- a step's dense values in chunks beside its rows --------------------------------------------
CHUNKED_KEYS = 97  # two shards (49 + 48 keys) in chunks of 8 float32 keys: 7 and 6 chunks


def _chunked_job(workers: int, sync: str) -> dict:
    return make_job(CHUNKED_KEYS, 2, workers, sync=sync, dtype="float32", lr=LR,
                    tables=[TABLE], retry_interval=0.5, chunk_bytes=32, chunks_in_flight=2)


def counting_sends(kv) -> list:
    """Every message kv sends to a shard from now on, as (shard, op, fields)."""
    sent, send = [], kv.requests.send

    def counted(shard, msg):
        rid = send(shard, msg)
        sent.append((shard, msg.op, dict(msg.fields)))
        return rid
    kv.requests.send = counted
    return sent


def add_rows(rows: np.ndarray, keys, grads, weight: float) -> None:
    where = {int(k): i for i, k in enumerate(KEY_SPACE)}
    for k, g in zip(np.asarray(keys).tolist(), grads):
        rows[where[k]] -= LR * weight * g


def test_a_bsp_step_of_chunked_dense_values_and_rows_applies_each_round_once(tmp_path):
    """3 workers push_step dense values larger than the chunk size beside rows; no clocks, so
    only the messages' `parts` can fill a round: a pull of round s+1 is served only once every
    worker's chunks and rows of step s are in, and never before (a round applied early would
    drop the rest as late). Values and rows equal the batch-weighted numpy reference."""
    workers, steps = 3, 3
    batch_of = (lambda r: r + 1)
    ref_rows = rows_reference(workers, steps, batch_of, "bsp")
    init = (np.arange(CHUNKED_KEYS) / 8).astype(np.float32)
    ref_dense = [init.astype(np.float64)]
    for step in range(steps):
        grads = sum(batch_of(r) * known_gradient(r, step, CHUNKED_KEYS, np.float64)
                    for r in range(workers))
        ref_dense.append(ref_dense[-1] - LR * grads / sum(map(batch_of, range(workers))))
    seen, messages = {}, {}
    with running_job(tmp_path, _chunked_job(workers, "bsp")) as cluster:
        kvs = [KVWorker(cluster.address) for _ in range(workers)]
        try:
            kvs[0].init(init)

            def worker(i):
                kv = kvs[i]
                kv.timeout = 30.0
                sent = counting_sends(kv)
                for step in range(steps):
                    sent.clear()
                    keys, grads = step_rows(i, step)
                    dense = known_gradient(i, step, CHUNKED_KEYS, np.float32)
                    kv.push_step(dense, {"emb": (keys, grads)}, step=step, batch=batch_of(i),
                                 round_size=workers)
                    messages[(i, step)] = list(sent)
                    assert not kv.core.sent and not kv.chunked.active  # every message answered
                    seen[(i, step)] = (kv.pull(min_version=step + 1),
                                       kv.rows.pull("emb", KEY_SPACE, min_version=step + 1))

            assert run_threads(worker, workers) == []
            for shard in range(2):
                rid = kvs[0].requests.send(shard, Message("status"))
                state = kvs[0].requests.collect([(shard, rid, None)], "status")[rid]["state"]
                assert (state["version"], state["updates_applied"], state["late_pushes"]) == (
                    steps, steps, 0), state
        finally:
            for kv in kvs:
                kv.close()
    chunk = 32 // 4
    for (rank, step), sent in messages.items():
        pushes = [(s, f) for s, op, f in sent if op == "push"]
        # The dense part went in chunks: 7 + 6 of them, none above the chunk size.
        assert len(pushes) == 13 and all(f["range"][1] - f["range"][0] <= chunk
                                         for _, f in pushes), pushes
        for shard in range(2):
            to_shard = [f for s, op, f in sent if s == shard]
            # Each says all the step sends that shard: its chunks and the table's rows.
            assert {f["parts"] for f in to_shard} == {len(to_shard)}, (rank, step, shard)
    for (rank, step), (dense, rows) in seen.items():
        np.testing.assert_allclose(dense, ref_dense[step + 1], rtol=0, atol=1e-5,
                                   err_msg=f"worker {rank} after step {step}")
        np.testing.assert_allclose(rows, ref_rows[step + 1], rtol=0, atol=1e-6,
                                   err_msg=f"worker {rank} after step {step}")


def test_an_asp_step_of_chunked_dense_values_and_rows_is_one_handle(tmp_path):
    """Under ASP the push_step handle covers every chunk and row message: not done when sent,
    done with nothing unanswered once waited on, and its staleness is the largest any chunk or
    row saw: worker b pulled before a's step, whose chunks moved shard i's version by its
    chunk count, so each of b's chunks to shard i sees that many updates it has not read."""
    from paramserver.sparse.placement import shard_of
    init = (np.arange(CHUNKED_KEYS) / 8).astype(np.float32)
    with running_job(tmp_path, _chunked_job(2, "asp")) as cluster:
        a, b = KVWorker(cluster.address), KVWorker(cluster.address)
        try:
            a.init(init)
            b.pull()  # b reads version 0 everywhere
            sent = counting_sends(a)
            keys_a, grads_a = step_rows(0, 0)
            dense_a = known_gradient(0, 0, CHUNKED_KEYS, np.float32)
            h = a.push_step_async(dense_a, {"emb": (keys_a, grads_a)}, step=0, batch=1)
            assert not h.done and a.core.sent
            assert a.wait(h) == 0 and h.done
            assert not a.core.sent and not a.core.inbox and not a.chunked.active
            row_shards = set(shard_of(keys_a, 2).tolist())
            assert sum(op == "push" for _, op, _ in sent) == 13
            assert sum(op == "push_rows" for _, op, _ in sent) == len(row_shards)
            versions = []
            for shard in range(2):
                rid = a.requests.send(shard, Message("status"))
                versions.append(a.requests.collect([(shard, rid, None)], "status")[rid][
                    "state"]["version"])
            assert sorted(versions) == [6, 7]  # one update per chunk
            # b's rows go to the shard with fewer chunks only: they see less staleness than
            # b's dense chunks to the other shard, which the handle must report.
            low = int(np.argmin(versions))
            keys_b = KEY_SPACE[shard_of(KEY_SPACE, 2) == low]
            grads_b = np.full((keys_b.size, DIM), 0.25, np.float32)
            dense_b = known_gradient(1, 0, CHUNKED_KEYS, np.float32)
            h = b.push_step_async(dense_b, {"emb": (keys_b, grads_b)}, step=0, batch=1)
            assert b.wait(h) == max(versions)
            assert not b.core.sent and not b.core.inbox and not b.chunked.active
            dense = a.pull(min_version=0)
            rows = a.rows.pull("emb", KEY_SPACE)
        finally:
            a.close()
            b.close()
    np.testing.assert_allclose(dense, init - LR * (dense_a.astype(np.float64) + dense_b),
                               rtol=0, atol=1e-5)
    ref = initial_rows(KEY_SPACE, DIM, SCALE).astype(np.float64)
    add_rows(ref, keys_a, grads_a, 1.0)
    add_rows(ref, keys_b, grads_b, 1.0)
    np.testing.assert_allclose(rows, ref, rtol=0, atol=1e-6)


# ---- checkpoints and a crashed server -----------------------------------------------------------
def _bsp_steps(kv, release, steps: int, offset: int = 0):
    for _ in range(steps):
        keys, grads = step_rows(offset + release.step, 0)
        kv.push_step(np.ones(DENSE_KEYS, np.float32), {"emb": (keys, grads)},
                     step=release.step, batch=1, round_size=release.round_size)
        release = kv.clock(release.step, batch=1, compute_time=0.0)
    return release


def test_a_killed_shard_restarts_from_its_checkpoint_with_the_same_rows(tmp_path):
    """Rows are in the shard's checkpoint (only rows that exist) and come back when a
    SIGKILLed server is restarted from it; keys created after the restart start from their
    initial rows as anywhere else."""
    from paramserver.launch.local import LocalCluster
    from ps_helpers import shard_process# the live process holding a shard
    job = _job(2, 1, "bsp", checkpoint={"dir": str(tmp_path / "ckpt"), "every": 2})
    cluster = LocalCluster(job, tmp_path / "run", job_timeout=120, keys=None,
                           restart_servers=1)
    supervisor = None
    try:
        cluster.start(spawn_workers=False)
        supervisor = threading.Thread(target=cluster.wait, daemon=True)
        supervisor.start()
        with KVWorker(cluster.address) as kv:
            kv.init(np.zeros(DENSE_KEYS, np.float32))
            release = _bsp_steps(kv, kv.start(), 4)  # rounds 0..3; checkpoints at 2 and 4
            wait_for(lambda: latest(tmp_path / "ckpt") == f"{4:09d}", "checkpoint 4")
            before = kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version)
            os.kill(shard_process(cluster, 1).proc.pid, signal.SIGKILL)
            after = kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version)
            np.testing.assert_array_equal(after, before)
            fresh = np.array([777, -778], dtype=np.int64)
            np.testing.assert_array_equal(kv.rows.pull("emb", fresh),
                                          initial_rows(fresh, DIM, SCALE))
            release = _bsp_steps(kv, release, 2, offset=50)  # the restarted shard trains on
            assert kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version).shape == (
                KEY_SPACE.size, DIM)
            assert kv.requests.retries >= 1
            kv.bye()
        supervisor.join(60)
        assert not supervisor.is_alive()
    finally:
        cluster.stop()


def test_a_resumed_job_starts_from_the_tables_checkpoint(tmp_path):
    """A job resumed from a checkpoint serves the rows it saved, on every shard."""
    ckpt = tmp_path / "ckpt"
    with running_job(tmp_path / "a", _job(2, 1, "bsp", checkpoint={"dir": str(ckpt),
                                                                   "every": 3})) as cluster:
        with KVWorker(cluster.address) as kv:
            kv.init(np.zeros(DENSE_KEYS, np.float32))
            release = _bsp_steps(kv, kv.start(), 3)
            saved = kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version)
            wait_for(lambda: latest(ckpt) == f"{3:09d}", "checkpoint 3")
            kv.bye()
    assert not np.allclose(saved, initial_rows(KEY_SPACE, DIM, SCALE))
    resumed = _job(2, 1, "bsp", resume={"dir": str(ckpt), "tag": f"{3:09d}"})
    with running_job(tmp_path / "b", resumed) as cluster:
        with KVWorker(cluster.address, role="observer") as kv:
            np.testing.assert_array_equal(kv.rows.pull("emb", KEY_SPACE), saved)


# ---- every sync policy --------------------------------------------------------------------------
# One arrival-mode and one round-mode policy in the default suite; every policy under -m slow.
@pytest.mark.parametrize("sync", [s if s in ("asp", "bsp") else pytest.param(
    s, marks=pytest.mark.slow) for s in SYNC_POLICIES.names()])
def test_every_sync_policy_runs_steps_of_rows(tmp_path, sync):
    workers, steps = 2, 3
    done = threading.Barrier(workers, timeout=60)
    finals = {}
    # A sample budget ends the job, not a step count per worker: a policy that holds one
    # worker for the other's next push (ElasticBSP) would wait forever on a worker that quit.
    job = _job(2, workers, sync, max_samples=workers * steps)
    with running_job(tmp_path, job) as cluster:
        def worker(_):
            with KVWorker(cluster.address) as kv:
                if kv.rank == 0:
                    kv.init(np.zeros(DENSE_KEYS, np.float32))
                release = kv.start()
                for _ in range(10 * steps):  # (bounded: the budget stops it far sooner)
                    if release.stop:
                        break
                    kv.rows.pull("emb", KEY_SPACE, min_version=release.min_version)
                    keys, grads = step_rows(kv.rank, release.step)
                    kv.push_step(np.ones(DENSE_KEYS, np.float32), {"emb": (keys, grads)},
                                 step=release.step, batch=release.batch_size,
                                 scale=release.scale, round_size=release.round_size)
                    release = kv.clock(release.step, batch=release.batch_size,
                                       compute_time=0.01)
                done.wait()
                # Every push is acked by now; a stop may come before the last round is
                # applied (the budget ran out mid-round), so wait for no version.
                finals[kv.rank] = kv.rows.pull("emb", KEY_SPACE)
                done.wait()
                kv.bye()

        assert run_threads(worker, workers) == []
    rows = finals[0]
    assert not np.allclose(rows, initial_rows(KEY_SPACE, DIM, SCALE))


# ---- the shard's core, without processes --------------------------------------------------------
def _core(mode: str):
    from paramserver.server.core import ShardCore
    from paramserver.server.events import Init, ShardSettings
    from paramserver.spec.job import TableSpec
    spec = TableSpec(**TABLE)
    c = ShardCore(ShardSettings(rank=0, lo=0, hi=DENSE_KEYS, dtype="float32", apply_mode=mode,
                                optimizer="sgd", lr=LR, tables=(spec,), servers=2))
    c.handle(Init("i", 0, DENSE_KEYS, np.zeros(DENSE_KEYS, np.float32)))
    return c


def _push_rows(sender, rid, keys, grads, step=0, batch=1, round_size=0, parts=0, table="emb",
               round_id=0, version=0):
    from paramserver.server.events import PushRows
    return PushRows((sender, rid), sender, rid, table, keys, grads.reshape(-1), step, batch,
                    version, 1.0, round_size, parts, round_id=round_id)


def _rows(c, keys):
    from paramserver.server.events import PullRows
    (reply,) = c.handle(PullRows("p", 0.0, "emb", keys))
    assert reply.op == "rows"
    return reply.arrays[0].reshape(keys.size, DIM)


def test_a_retried_push_rows_is_answered_not_applied_twice():
    c = _core("arrival")
    keys = np.array([9, 9, -4], dtype=np.int64)
    grads = np.ones((3, DIM), np.float32)
    first = c.handle(_push_rows("w", 7, keys, grads))
    again = c.handle(_push_rows("w", 7, keys, grads))
    assert [r.op for r in first] == [r.op for r in again] == ["ack"]
    assert again[0].fields == first[0].fields and c.retries.duplicates == 1
    expected = initial_rows(keys, DIM, SCALE)
    expected[:2] -= 2 * LR  # key 9 twice in the push: summed
    expected[2] -= LR
    np.testing.assert_allclose(_rows(c, keys), expected, atol=1e-6)
    # A refused push changes nothing and the core keeps serving.
    (err,) = c.handle(_push_rows("w", 8, keys, np.ones((3, DIM + 1), np.float32)))
    assert err.op == "error" and err.fields["code"] == "refused"
    np.testing.assert_allclose(_rows(c, keys), expected, atol=1e-6)
    assert c.handle(_push_rows("w", 9, keys, grads, table="nope"))[0].fields["code"] == "refused"


def test_in_round_mode_rows_wait_for_the_round_and_are_averaged_with_it():
    """Two workers each send dense values and rows (parts=2): the round fills with the last of
    the four, and the rows are applied with it, weighted by batch."""
    from paramserver.server.events import ApplyRound, Push, Then
    c = _core("round")
    keys = np.array([5], dtype=np.int64)
    start = _rows(c, keys)
    for n, (w, batch) in enumerate((("a", 1), ("b", 3))):
        out = c.handle(Push((w, 1), w, 1, 0, DENSE_KEYS, np.ones(DENSE_KEYS, np.float32), 0,
                            batch, 0, 1.0, 2, 2))
        assert [type(i) for i in out] == [type(out[0])] and not c.store.round_full
        grads = np.full((1, DIM), 1.0 if w == "a" else 5.0, np.float32)
        out = c.handle(_push_rows(w, 2, keys, grads, batch=batch, round_size=2, parts=2))
        if n == 0:
            assert not c.store.round_full
            np.testing.assert_array_equal(_rows(c, keys), start)  # not applied yet
    assert isinstance(out[-1], Then) and out[-1].event == ApplyRound(None, 0)
    c.handle(out[-1].event)
    # (1 * 1 + 3 * 5) / 4 = 4 per column
    np.testing.assert_allclose(_rows(c, keys), start - LR * 4.0, atol=1e-6)
    assert c.store.version == 1
    # A late push of round 0 is dropped, rows included.
    c.handle(_push_rows("a", 3, keys, np.ones((1, DIM), np.float32), round_size=2, parts=2))
    np.testing.assert_allclose(_rows(c, keys), start - LR * 4.0, atol=1e-6)


def test_in_arrival_mode_a_lockstep_rounds_rows_are_summed_with_its_values():
    """auto's lockstep round (round_id) on an arrival-mode shard: the rows wait for the round
    and are averaged with it, as in round mode; a round left open (a worker gone) is applied,
    rows and values, when the next round's push comes."""
    from paramserver.server.events import ApplyRound, Push, Then
    c = _core("arrival")
    keys = np.array([5], dtype=np.int64)
    start = _rows(c, keys)
    for n, (w, batch) in enumerate((("a", 1), ("b", 3))):
        c.handle(Push((w, 1), w, 1, 0, DENSE_KEYS, np.ones(DENSE_KEYS, np.float32), 3, batch,
                      0, 1.0, 2, 2, round_id=1))
        grads = np.full((1, DIM), 1.0 if w == "a" else 5.0, np.float32)
        out = c.handle(_push_rows(w, 2, keys, grads, step=3, batch=batch, round_size=2,
                                  parts=2, round_id=1))
        if n == 0:
            np.testing.assert_array_equal(_rows(c, keys), start)  # not applied yet
            assert c.store.version == 0
    assert isinstance(out[-1], Then) and out[-1].event == ApplyRound(None, 1)
    c.handle(out[-1].event)
    np.testing.assert_allclose(_rows(c, keys), start - LR * 4.0, atol=1e-6)
    assert c.store.version == 1
    # Round 2: only a's rows come here; then round 3's push applies them first.
    c.handle(_push_rows("a", 3, keys, np.full((1, DIM), 2.0, np.float32), step=4, batch=2,
                        round_size=2, parts=1, round_id=2, version=1))
    np.testing.assert_allclose(_rows(c, keys), start - LR * 4.0, atol=1e-6)
    (ack,) = [i for i in c.handle(_push_rows("b", 4, keys, np.zeros((1, DIM), np.float32),
                                             step=5, batch=1, round_size=2, parts=1,
                                             round_id=3, version=1)) if hasattr(i, "fields")]
    np.testing.assert_allclose(_rows(c, keys), start - LR * 6.0, atol=1e-6)
    assert c.store.version == 2 and ack.fields["staleness"] == 1
