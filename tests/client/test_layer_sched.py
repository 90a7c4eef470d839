"""Per-layer request scheduling: pull and push orders, and a real worker loop's layer requests."""

import numpy as np
import pytest

from paramserver.compression.schedule import pull_order, push_order


def test_pull_orders():
    pushed = [3, 2, 1, 0]  # backward's order
    assert pull_order("fifo", pushed, [5, 5, 5, 5]) == [3, 2, 1, 0]
    assert pull_order("lifo", pushed, [5, 5, 5, 5]) == [0, 1, 2, 3]
    # stalest: the oldest local copy first; equal ages in lifo order
    assert pull_order("stalest", pushed, [5, 2, 7, 2]) == [1, 3, 0, 2]
    assert pull_order("stalest", [1, 0, 2], [4, 4, 4]) == [2, 0, 1]
    with pytest.raises(ValueError, match="schedule"):
        pull_order("random", pushed, [0] * 4)


def test_a_push_that_advances_the_minimum_layer_step_goes_first():
    assert push_order([3, 2, 1], [7, 6, 7, 6]) == [3, 1, 2]
    assert push_order([2, 0], [5, 5, 5]) == [2, 0]  # all at the minimum: backward's order
    assert push_order([], [1]) == []


def test_layers_are_pushed_during_backward_and_pulled_in_schedule_order(tmp_path):
    """Real shards (ASP, SGD lr 0.5, float64): every step pushes each layer once, in backward
    order, values equal to the flat gradient; pulls go out in the schedule's order; the
    servers end at init - lr * the sum of every gradient."""
    from ps_helpers import step_loop
    with step_loop(tmp_path, steps=4, schedule="lifo") as (kv, loop):
        layers = [layer.keys for layer in loop.keys.layers]
        init = loop.params_np.copy()
        kv.init(init)
        pushes, pulls, total = [], [], np.zeros(kv.num_keys)
        real_push, real_pull = kv.push_async, kv.pull_async
        kv.push_async = lambda v, keys, **t: pushes.append((keys, v.copy())) or real_push(
            v, keys, **t)
        kv.pull_async = lambda keys, **kw: pulls.append(keys) or real_pull(keys, **kw)
        release = kv.start()
        for step, order in enumerate(["lifo", "lifo", "fifo", "fifo"]):
            loop.layered.order = order
            pushes.clear(), pulls.clear()
            record, compute = loop.step(release, 0.0)
            index = [layers.index(type(layers[0])(*k)) for k, _ in pushes]
            assert index == list(reversed(range(len(layers))))  # as backward made them
            np.testing.assert_array_equal(np.concatenate([v for _, v in pushes[::-1]]),
                                          loop.grads_np)
            forward = list(range(len(layers)))
            want = forward if order == "lifo" else forward[::-1]
            assert [layers.index(type(layers[0])(*k)) for k in pulls] == want
            assert record["suspend_s"] >= 0 and "staleness_layer_0" in record
            # Its bytes' formats, as every step record names them (layers go dense).
            assert (record["push_codec"], record["pull_codec"]) == ("none", "none")
            total += loop.grads_np
            release = kv.clock(release.step, release.batch_size, compute)
        kv.pull_async = real_pull
        np.testing.assert_allclose(kv.pull(), init - 0.5 * total, rtol=0, atol=1e-12)
