"""Range push/pull: the windows each step uses, what is held back, and a real run's traffic."""


import numpy as np
import pytest

from paramserver.compression.ranges import RangeAccumulator, make_plan
from paramserver.core.keyspace import KeyRange

LAYERS = [KeyRange(0, 10), KeyRange(10, 13), KeyRange(13, 33), KeyRange(33, 35)]


def test_windows_cover_the_key_space_once_in_order():
    for n, f in [(35, 0.25), (35, 1.0), (10, 0.3), (7, 0.1), (1000, 0.01)]:
        plan = make_plan(f"window:{f}", n, LAYERS)
        covered = np.concatenate([np.arange(w.lo, w.hi) for w in plan.windows])
        np.testing.assert_array_equal(covered, np.arange(n))
        assert len(plan.windows) == min(n, int(np.ceil(1 / f - 1e-9)))
        sizes = [w.size for w in plan.windows]
        assert max(sizes) - min(sizes) <= 1
    plan = make_plan("window:0.25", 35, LAYERS)
    assert [plan.at(s) for s in range(6)] == [KeyRange(0, 9), KeyRange(9, 18), KeyRange(18, 26),
                                              KeyRange(26, 35), KeyRange(0, 9), KeyRange(9, 18)]


def test_layer_windows_follow_layer_boundaries():
    assert make_plan("layers", 35, LAYERS).windows == tuple(LAYERS)
    assert make_plan("layers:2", 35, LAYERS).windows == (KeyRange(0, 13), KeyRange(13, 35))
    assert make_plan("layers:3", 35, LAYERS).windows == (KeyRange(0, 33), KeyRange(33, 35))
    assert make_plan("all", 35, LAYERS) is None and make_plan(None, 35, LAYERS) is None


@pytest.mark.parametrize("bad", ["window", "window:0", "window:1.5", "window:x", "layers:0",
                                 "layers:-1", "layers:a", "some", "all:1"])
def test_bad_range_specs_fail_clearly(bad):
    with pytest.raises(ValueError, match="push-range"):
        make_plan(bad, 35, LAYERS)


def test_held_back_gradients_go_out_with_their_window_and_nothing_is_lost():
    rng = np.random.default_rng(0)
    plan = make_plan("window:0.34", 35, LAYERS)  # three windows
    acc = RangeAccumulator(35, np.float64)
    grads = [rng.integers(-5, 5, 35).astype(np.float64) for _ in range(7)]
    sent = np.zeros(35)
    for step, g in enumerate(grads):
        w = plan.at(step)
        acc.add(g)
        values = acc.take(w)
        # A key's push is the sum of its gradients since its window last went out.
        last = [s for s in range(step) if plan.at(s) == w]
        since = last[-1] + 1 if last else 0
        np.testing.assert_array_equal(values, np.sum(grads[since:step + 1], axis=0)[w.lo:w.hi])
        sent[w.lo:w.hi] += values
    np.testing.assert_array_equal(sent + acc.pending, np.sum(grads, axis=0))


def test_the_worker_loop_pushes_and_pulls_exactly_its_windows(tmp_path):
    """A real StepLoop against real shards (ASP, SGD lr 0.5, float64): each step pulls and
    pushes one layer; the servers end at init - lr * everything pushed, key for key."""
    from ps_helpers import step_loop
    with step_loop(tmp_path, steps=6, push_range="layers") as (kv, loop):
        windows = loop.plan.windows
        assert len(windows) >= 2 and windows[-1].hi == kv.num_keys
        init = loop.params_np.copy()
        kv.init(init)
        release, pushed, real_push = kv.start(), [], kv.push
        kv.push = lambda v, keys, **tags: pushed.append((keys, v.copy())) or real_push(
            v, keys, **tags)
        for _ in range(6):
            before = loop.params_np.copy()
            record, compute = loop.step(release, 0.0)
            w = windows[release.step % len(windows)]
            assert pushed[-1][0] == w and record["push_bytes"] == record["pull_bytes"] == w.size * 8
            # The pull wrote the window and nothing else.
            outside = np.ones(kv.num_keys, bool)
            outside[w.lo:w.hi] = False
            np.testing.assert_array_equal(loop.params_np[outside], before[outside])
            release = kv.clock(release.step, release.batch_size, compute)
        expected = init.copy()
        for w, values in pushed:
            expected[w.lo:w.hi] -= 0.5 * values
        np.testing.assert_allclose(kv.pull(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", [{"push_range": "window:0.5", "compress": "topk"},
                                     {"push_range": "layers", "schedule": "lifo"},
                                     {"schedule": "newest"}, {"push_range": "window:2"}])
def test_conflicting_or_bad_options_fail_before_any_process_starts(options):
    from paramserver.launch.jobs import prepare_job
    from paramserver.spec.config import TrainConfig
    with pytest.raises(ValueError):
        prepare_job(TrainConfig(**options))
