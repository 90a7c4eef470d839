"""Real processes over ZeroMQ: pushes are applied exactly once, under ASP and BSP, across shards."""

import numpy as np

from ps_helpers import join_all, known_gradient, make_job, push_known, running_job, start_workers

NUM_KEYS = 1001  # odd, so the two shards differ in size


def test_asp_eight_workers_two_hundred_pushes_sum_exactly(tmp_path):
    workers, steps = 8, 200
    init = (np.arange(NUM_KEYS) % 17 - 8).astype(np.float64)  # integers: any order is exact
    with running_job(tmp_path, make_job(NUM_KEYS, 2, workers, sync="asp", lr=1.0)) as cluster:
        procs = start_workers(push_known, workers, cluster.address, steps, init, str(tmp_path),
                              None, workers * steps)
        assert join_all(procs, timeout=180) == [0] * workers
    expected = init.copy()
    for rank in range(workers):
        for step in range(steps):
            expected -= known_gradient(rank, step, NUM_KEYS, np.float64)
    for rank in range(workers):  # each waited for every push to be applied
        np.testing.assert_array_equal(np.load(tmp_path / f"final-{rank}.npy"), expected)


def test_bsp_equals_sequential_sgd_on_batch_weighted_round_averages(tmp_path):
    workers, steps, lr = 4, 30, 0.25
    batches = [1, 2, 3, 6]  # integer weights keep the average exact in float64
    init = np.zeros(NUM_KEYS)
    job = make_job(NUM_KEYS, 2, workers, sync="bsp", lr=lr)
    with running_job(tmp_path, job) as cluster:
        procs = start_workers(push_known, workers, cluster.address, steps, init, str(tmp_path),
                              batches)
        assert join_all(procs, timeout=180) == [0] * workers
    expected = init.copy()
    for step in range(steps):
        total = sum(batches[r] * known_gradient(r, step, NUM_KEYS, np.float64)
                    for r in range(workers))
        expected -= lr * total / sum(batches)
    for rank in range(workers):  # every worker pulled the same, fully applied parameters
        np.testing.assert_allclose(np.load(tmp_path / f"final-{rank}.npy"), expected,
                                   rtol=0, atol=1e-12)
