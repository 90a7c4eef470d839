"""A pull sent ahead of its release (round mode) and an abandoned pull, against real shards."""

import numpy as np

from paramserver.client.kv import KVWorker
from ps_helpers import known_gradient, make_job, running_job

NUM_KEYS = 97  # two shards, an uneven cut


def test_pull_sent_with_the_push_returns_the_round_and_abandoned_replies_are_dropped(tmp_path):
    lr, steps = 0.5, 8
    job = make_job(NUM_KEYS, 2, 1, sync="bsp", lr=lr)
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            params = np.zeros(NUM_KEYS)
            kv.init(params)
            release = kv.start()
            # Asked for a version that comes only after step 4's round, then given up on: its
            # late answer must not be mistaken for any later reply.
            kv.completion.abandon(kv.pull_async(min_version=5))
            np.testing.assert_array_equal(kv.pull(min_version=release.min_version), params)
            for _ in range(steps):
                grad = known_gradient(0, release.step, NUM_KEYS, np.float64)
                kv.push(grad, step=release.step, batch=1)
                ahead = kv.pull_async(min_version=release.min_version + 1)
                params = params - lr * grad
                release = kv.clock(release.step, 1, 0.0)
                assert release.min_version == release.step  # one round per step
                np.testing.assert_array_equal(kv.wait(ahead), params)
            assert kv.version == steps
            assert not kv.requests.inbox and not kv.requests.held, "a dropped reply was kept"
        finally:
            kv.close()


def _shard_state(kv):
    from paramserver.wire import Message
    rid = kv.requests.send(0, Message("status"))
    return kv.requests.collect([(0, rid, None)], "status")[rid]["state"]


def test_a_borrowed_pull_is_read_in_place_and_handed_back_before_the_round_applies(tmp_path):
    """One shard on this host: the borrowed values are the server's own (an in-place update
    after give_back shows through them), and a round applied after every loan came back
    needs no copy on write; one applied while a loan is out copies and leaves it intact."""
    lr, keys = 0.5, 20_000  # 160 kB: replies big enough to go through the shared arena
    job = make_job(keys, 1, 1, sync="bsp", lr=lr)
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(keys))
            release = kv.start()
            out = np.full(keys, 7.0)
            values, loan = kv.completion.borrow(kv.pull_async(out=out, min_version=release.min_version))
            assert loan is not None and not np.shares_memory(values, out)
            assert list(kv.requests.held) == [loan]  # the reply lives in the server's arena
            np.testing.assert_array_equal(values, 0.0)
            np.testing.assert_array_equal(out, 7.0)  # nothing was copied
            kv.completion.give_back(loan)
            grad = known_gradient(0, 0, keys, np.float64)
            kv.push(grad, step=0, batch=1, round_size=1)
            kv.pull(min_version=1)
            np.testing.assert_array_equal(values, -lr * grad)  # the live buffer, updated in place
            assert _shard_state(kv)["copies_on_write"] == 0
            # Kept past the next round: the server must write elsewhere, not under the loan.
            held, loan = kv.completion.borrow(kv.pull_async(min_version=1))
            snapshot = held.copy()
            kv.push(grad, step=1, batch=1, round_size=1)
            np.testing.assert_array_equal(kv.pull(min_version=2), -2 * lr * grad)
            np.testing.assert_array_equal(held, snapshot)
            assert _shard_state(kv)["copies_on_write"] == 1
            kv.completion.give_back(loan)
            assert not kv.requests.held
        finally:
            kv.close()
