"""A pull sent ahead of its release (round mode) and an abandoned pull, against real shards."""

import numpy as np

from paramserver.runtime.worker_client import KVWorker
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
            kv.abandon(kv.pull_async(min_version=5))
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
