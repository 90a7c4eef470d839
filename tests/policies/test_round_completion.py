"""A round applied on its last push (round_size) rather than on the coordinator's word."""

import numpy as np
import pytest

from paramserver.core.keyspace import KeyRange
from paramserver.optim import make_rule
from paramserver.server.store import ShardStore
from paramserver.client.kv import KVWorker
from ps_helpers import known_gradient, make_job, running_job

NUM_KEYS = 97  # two shards, an uneven cut


def round_store():
    s = ShardStore(KeyRange(0, 10), "float64", make_rule("sgd", 1.0), "round")
    s.init(0, 10, np.zeros(10))
    return s


def push(s, worker, lo=0, hi=10, step=0, value=1.0, round_size=2, parts=0):
    return s.push_dense(worker, lo, hi, np.full(hi - lo, value), step=step, batch=1,
                        base_version=step, scale=1.0, round_size=round_size, parts=parts)


def test_the_round_is_full_once_round_size_contributors_pushed():
    s = round_store()
    push(s, "a")
    assert not s.round_full
    push(s, "a")  # the same worker again is not a second contributor
    assert not s.round_full
    push(s, "b", value=3.0)
    assert s.round_full
    assert s.apply_round(0) and s.version == 1
    np.testing.assert_allclose(s.read(0, 10).numpy(), -(1 + 1 + 3) / 2)
    assert not s.round_full


def test_a_piece_of_the_shard_never_completes_a_round():
    s = round_store()
    push(s, "a", 0, 5)
    push(s, "b", 0, 5)
    assert not s.round_full, "two half pushes claimed a full round"
    push(s, "a", 5, 10)
    push(s, "b", 5, 10)
    assert not s.round_full  # pieces do not say they are the whole step: the coordinator does
    assert s.apply_round(0)


def test_pieces_that_say_how_many_they_are_complete_the_round_with_the_last_one():
    """A large push streamed in chunks: each chunk says the step comes in `parts` messages,
    and the round is full exactly when every contributor's last chunk is in, in any order."""
    s = round_store()
    push(s, "a", 0, 4, parts=3)
    push(s, "b", 4, 10, parts=2, value=3.0)
    push(s, "a", 7, 10, parts=3)
    assert not s.round_full
    push(s, "b", 0, 4, parts=2, value=3.0)
    assert not s.round_full, "b is complete but a still owes a chunk"
    push(s, "a", 4, 7, parts=3)
    assert s.round_full
    assert s.apply_round(0)
    np.testing.assert_allclose(s.read(0, 10).numpy(), -(1 + 3) / 2)
    # The counts start over with the next round.
    push(s, "a", 0, 10, step=1)
    assert not s.round_full
    push(s, "b", 0, 5, step=1, parts=2)
    assert not s.round_full
    push(s, "b", 5, 10, step=1, parts=2)
    assert s.round_full


def test_a_sparse_push_beside_a_dense_one_is_one_more_part():
    """Rows (a sparse push) and the dense values of one step: two parts, neither alone fills."""
    s = round_store()
    for w in ("a", "b"):
        push(s, w, parts=2)
    assert not s.round_full
    for w in ("a", "b"):
        s.push_sparse(w, np.array([1, 1], dtype=np.int64), np.array([1.0, 1.0]), step=0,
                      batch=1, base_version=0, scale=1.0, round_size=2, parts=2)
    assert s.round_full
    s.apply_round(0)
    expected = np.full(10, -1.0)
    expected[1] -= 2.0  # each worker's two values for key 1 add up, averaged over 2 batches
    np.testing.assert_allclose(s.read(0, 10).numpy(), expected)


def applied_round():
    """A store whose round 0 (two workers) is applied, and its values after it."""
    s = round_store()
    push(s, "a")
    push(s, "b")
    s.apply_round(0)
    return s, s.read(0, 10).numpy().copy()


def test_being_told_after_the_round_was_applied_changes_nothing():
    s, before = applied_round()
    assert not s.apply_round(0)
    assert s.version == 1
    np.testing.assert_array_equal(s.read(0, 10).numpy(), before)
    # The next round's pushes may come before the word about this one: still fine.
    push(s, "a", step=1)
    assert not s.apply_round(0) and s.round_step == 1


def test_a_push_for_a_round_already_applied_is_dropped_and_counted():
    s, before = applied_round()
    push(s, "c", value=100.0, round_size=3)  # a newcomer released into round 0 too late
    assert s.late_pushes == 1 and s.round_step is None
    np.testing.assert_array_equal(s.read(0, 10).numpy(), before)


@pytest.mark.parametrize("sparse", [False, True])
def test_servers_apply_a_full_round_without_any_clock(tmp_path, sparse):
    """Two clients push round 0 with round_size 2 and never clock: both shards must apply the
    round by themselves, and a pull for version 1 returns the average."""
    job = make_job(NUM_KEYS, 2, 2, sync="bsp", lr=0.5)
    with running_job(tmp_path, job) as cluster:
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        try:
            kvs[0].init(np.zeros(NUM_KEYS))
            grads = [known_gradient(r, 0, NUM_KEYS, np.float64) for r in range(2)]
            for kv, g in zip(kvs, grads):
                if sparse:
                    keys = np.arange(0, NUM_KEYS, 2)  # every other key; both shards hear
                    kv.push_sparse(keys, g[keys], step=0, batch=1, round_size=2)
                    g[1::2] = 0
                else:
                    kv.push(g, step=0, batch=1, round_size=2)
            kvs[1].timeout = 10.0  # without the fast path no one would ever apply the round
            got = kvs[1].pull(min_version=1)
            np.testing.assert_allclose(got, -0.5 * (grads[0] + grads[1]) / 2)
            states = [kv.requests for kv in kvs]
            assert all(not r.inbox for r in states)
        finally:
            for kv in kvs:
                kv.close()


def test_every_release_tells_the_full_round_size(tmp_path):
    """Releases at the start barrier go out once every worker joined: each one, and each
    later release, carries the number of workers in the round (BSP: all of them)."""
    import threading

    job = make_job(NUM_KEYS, 1, 2, sync="bsp", lr=0.5)
    with running_job(tmp_path, job) as cluster:
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        try:
            kvs[0].init(np.zeros(NUM_KEYS))
            releases = [None, None]

            def start(i):
                releases[i] = kvs[i].start()
            threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert [r.round_size for r in releases] == [2, 2]
            for kv in kvs:
                kv.push(np.zeros(NUM_KEYS), step=0, batch=1, round_size=2)
            nexts = [None, None]

            def clock(i):
                nexts[i] = kvs[i].clock(0, 1, 0.0)
            threads = [threading.Thread(target=clock, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            assert [(r.step, r.round_size, r.min_version) for r in nexts] == [(1, 2, 1)] * 2
        finally:
            for kv in kvs:
                kv.close()


def test_a_late_push_reaches_the_summary(tmp_path):
    """The shard's late-push count travels with its heartbeat into metrics.jsonl, and
    summary.json sums it: a run that dropped gradients says so."""
    import threading
    import time

    from paramserver.runlog.metrics import read_records, summarize

    job = make_job(NUM_KEYS, 1, 2, sync="bsp", lr=0.5)
    with running_job(tmp_path, job) as cluster:
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        try:
            kvs[0].init(np.zeros(NUM_KEYS))
            threads = [threading.Thread(target=kv.start) for kv in kvs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=30)
            for kv in kvs:
                kv.push(np.ones(NUM_KEYS), step=0, batch=1, round_size=2)
            kvs[0].pull(min_version=1)  # round 0 is applied
            kvs[0].push(np.ones(NUM_KEYS), step=0, batch=1, round_size=2)  # too late
            metrics = tmp_path / "run" / "metrics.jsonl"
            deadline = time.monotonic() + 20
            summary = {}
            while time.monotonic() < deadline and summary.get("late_pushes") != 1:
                time.sleep(0.1)
                if metrics.exists():
                    summary = summarize(read_records(metrics), {**job, "apply_mode": "round"})
            assert summary.get("late_pushes") == 1
            assert summary["duplicate_pushes"] == 0
        finally:
            for kv in kvs:
                kv.close()
