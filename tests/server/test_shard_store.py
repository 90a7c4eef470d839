"""ShardStore: exact update arithmetic on arrival and per round, ranges, sparse keys, momentum."""

import numpy as np
import pytest
import torch

from paramserver.core.keyspace import KeyRange
from paramserver.optim import UPDATE_RULES, make_rule
from paramserver.server.store import ShardStore, StoreError


def store(mode="arrival", lo=10, hi=20, rule="sgd", lr=1.0, **opts):
    s = ShardStore(KeyRange(lo, hi), "float64", make_rule(rule, lr, **opts), mode)
    s.init(lo, hi, np.arange(lo, hi, dtype=np.float64))
    return s


# The rules whose round average rides in the scale; the others are divided first.
LINEAR_RULES = [n for n in UPDATE_RULES.names() if UPDATE_RULES.get(n).linear_in_grad]
TAGS = dict(step=0, batch=1, base_version=0, scale=1.0)


def test_arrival_applies_each_push_and_counts_staleness():
    s = store(lr=0.5)
    s.push_dense("a", 10, 20, np.ones(10), **TAGS)
    res = s.push_dense("b", 12, 14, np.full(2, 4.0), **TAGS)
    expected = np.arange(10, 20) - 0.5
    expected[2:4] -= 2.0
    np.testing.assert_array_equal(s.read(10, 20).numpy(), expected)
    assert res.staleness == 1 and s.version == 2


def _lockstep(s, rid, pushes, base=0, size=3):
    """Pushes of one lockstep round of `size`: (worker, batch, grad value) each."""
    return [s.push_dense(w, 10, 20, np.linspace(-1, 1, 10) * g, step=7 + rid, batch=b,
                         base_version=base, scale=1.0, round_size=size, parts=1,
                         round_id=rid).staleness for w, b, g in pushes]


ROUNDS = [[("a", 1, 1.0), ("b", 3, -2.0), ("c", 2, 0.5)], [("a", 2, 0.25), ("b", 1, 3.0),
                                                             ("c", 1, -1.0)]]


@pytest.mark.parametrize("rule", UPDATE_RULES.names())
def test_a_lockstep_round_on_arrival_is_summed_and_applied_once_as_round_mode_does(rule):
    """auto's bsp and lbbsp: the shard stays in arrival mode, each push naming its round. The
    round's pushes are summed and applied once, so every rule (adam, momentum: stateful)
    ends bit for bit where round mode does, not where three applies a round would."""
    arrival, rounds = store(rule=rule, lr=0.1), store("round", rule=rule, lr=0.1)
    for rid, pushes in enumerate(ROUNDS, start=1):
        assert _lockstep(arrival, rid, pushes, base=rid - 1) == [0, 0, 0]  # one version
        for w, b, g in pushes:
            rounds.push_dense(w, 10, 20, np.linspace(-1, 1, 10) * g, step=rid, batch=b,
                              base_version=rid - 1, scale=1.0)
        assert arrival.round_full and arrival.version == rid - 1  # nothing applied yet
        assert arrival.apply_round(rid) and rounds.apply_round(rid)
        assert not arrival.apply_round(rid)  # the coordinator's word after the full round
        assert arrival.version == rounds.version == rid
    torch.testing.assert_close(arrival.values, rounds.values, rtol=0, atol=0)
    for k in rounds.state:
        torch.testing.assert_close(arrival.state[k], rounds.state[k], rtol=0, atol=0)
    if rule in ("adam", "momentum"):  # (the old way, each push applied, ends elsewhere)
        each = store(rule=rule, lr=0.1)
        for rid, pushes in enumerate(ROUNDS, start=1):
            total = sum(b for _, b, _ in pushes)
            for w, b, g in pushes:
                each.push_dense(w, 10, 20, np.linspace(-1, 1, 10) * g, **{
                    **TAGS, "scale": b / total})
        assert not torch.allclose(each.values, rounds.values)


def test_a_push_of_another_round_or_of_none_applies_the_open_round_first():
    """A round closed without one of its pushes here (its worker left) is applied when the
    next round's push comes, if the coordinator's word has not come first: as round mode's
    average of what came. A push of no round (asp after a switch) does the same, then is
    applied on arrival; a lower id (a restart) is taken too, never dropped."""
    s, ref = store(rule="momentum"), store("round", rule="momentum")
    _lockstep(s, 4, ROUNDS[0][:2])  # c never pushes here
    for w, b, g in ROUNDS[0][:2]:
        ref.push_dense(w, 10, 20, np.linspace(-1, 1, 10) * g, step=0, batch=b, base_version=0,
                       scale=1.0)
    ref.apply_round(0)
    assert s.version == 0 and not s.round_full
    stale = _lockstep(s, 5, ROUNDS[1][:1])  # pulled before round 4 was applied
    assert stale == [1] and s.version == 1 and s.round_step == 5
    torch.testing.assert_close(s.values, ref.values, rtol=0, atol=0)
    res = s.push_dense("a", 10, 20, np.ones(10), **TAGS)  # asp: closes round 5, then applied
    assert s.version == 3 and res.staleness == 2 and s.round_step is None
    _lockstep(s, 2, ROUNDS[0][:1], base=3)  # ids started over: taken
    assert s.round_step == 2 and s.late_pushes == 0
    assert not s.apply_round(1) and s.version == 3  # not the open round: nothing happens
def test_round_mode_applies_the_batch_weighted_average_once():
    s = store("round")
    s.push_dense("a", 10, 20, np.full(10, 1.0), step=0, batch=1, base_version=0, scale=1.0)
    s.push_dense("b", 10, 20, np.full(10, 4.0), step=0, batch=3, base_version=0, scale=1.0)
    np.testing.assert_array_equal(s.read(10, 20).numpy(), np.arange(10, 20))  # nothing yet
    s.apply_round(0)
    np.testing.assert_allclose(s.read(10, 20).numpy(), np.arange(10, 20) - (1 + 12) / 4)
    assert s.version == 1


def test_round_counts_a_workers_batch_once_across_pieces():
    s = store("round")
    s.push_dense("a", 10, 15, np.full(5, 2.0), step=0, batch=2, base_version=0, scale=1.0)
    s.push_dense("a", 15, 20, np.full(5, 2.0), step=0, batch=2, base_version=0, scale=1.0)
    s.apply_round(0)
    np.testing.assert_allclose(s.read(10, 20).numpy(), np.arange(10, 20) - 2.0)


def test_round_refuses_a_push_of_another_step():
    s = store("round")
    s.push_dense("a", 10, 20, np.ones(10), step=3, batch=1, base_version=0, scale=1.0)
    with pytest.raises(StoreError, match="round 3"):
        s.push_dense("b", 10, 20, np.ones(10), step=4, batch=1, base_version=0, scale=1.0)


def test_sparse_push_accumulates_repeated_keys():
    s = store()
    s.push_sparse("a", np.array([11, 11, 19], dtype=np.int64), np.array([1.0, 2.0, 5.0]), **TAGS)
    expected = np.arange(10, 20, dtype=np.float64)
    expected[1] -= 3
    expected[9] -= 5
    np.testing.assert_array_equal(s.read(10, 20).numpy(), expected)


def test_out_of_range_and_wrong_dtype_are_refused():
    s = store()
    with pytest.raises(StoreError, match="outside"):
        s.push_dense("a", 5, 15, np.ones(10), **TAGS)
    with pytest.raises(StoreError, match="outside"):
        s.push_sparse("a", np.array([20], dtype=np.int64), np.ones(1), **TAGS)
    with pytest.raises(StoreError, match="dtype"):
        s.push_dense("a", 10, 20, np.ones(10, dtype=np.float32), **TAGS)
    with pytest.raises(StoreError, match="carries"):
        s.push_dense("a", 10, 20, np.ones(9), **TAGS)


def test_init_only_once():
    s = store()
    assert not s.init(10, 20, np.zeros(10))
    np.testing.assert_array_equal(s.read(10, 20).numpy(), np.arange(10, 20))


def test_load_state_writes_the_values_themselves_and_refuses_without_writing_any():
    """A script's rank 0 that restored a checkpoint after joining sends its parameters as the
    state named "values" (horovod.broadcast_parameters); a load naming an unknown state
    beside them writes neither."""
    s = store(rule="momentum", momentum=0.9)
    with pytest.raises(StoreError, match="keeps no per-key state nope"):
        s.load_state(12, 14, ["values", "nope"], [np.full(2, 7.0), np.zeros(2)])
    np.testing.assert_array_equal(s.read(10, 20).numpy(), np.arange(10, 20))
    s.load_state(12, 14, ["values"], [np.full(2, 7.0)])
    expected = np.arange(10, 20, dtype=np.float64)
    expected[2:4] = 7.0
    np.testing.assert_array_equal(s.read(10, 20).numpy(), expected)


def test_momentum_dense_and_sparse_agree_with_a_reference():
    dense, sparse = store(rule="momentum", lr=0.1, momentum=0.5), store(rule="momentum", lr=0.1,
                                                                          momentum=0.5)
    ref_p, ref_b = np.arange(10, 20, dtype=np.float64), np.zeros(10)
    rng = np.random.default_rng(0)
    for _ in range(5):
        g = rng.normal(size=10)
        dense.push_dense("a", 10, 20, g, **TAGS)
        sparse.push_sparse("a", np.arange(10, 20, dtype=np.int64), g, **TAGS)
        ref_b = 0.5 * ref_b + g
        ref_p = ref_p - 0.1 * ref_b
    np.testing.assert_allclose(dense.read(10, 20).numpy(), ref_p)
    np.testing.assert_allclose(sparse.read(10, 20).numpy(), ref_p)
    assert torch.is_tensor(dense.state["momentum"])


@pytest.mark.parametrize("rule", UPDATE_RULES.names())
def test_every_rule_applies_a_round_as_its_explicit_average(rule):
    """Linear rules take the average's 1/total in their scale instead of a division pass:
    two rounds must still equal the rule applied to the averages computed by hand."""
    rng = np.random.default_rng(1)
    s = store("round", rule=rule, lr=0.1)
    ref_params = torch.arange(10, 20, dtype=torch.float64)
    ref_rule = make_rule(rule, 0.1)
    ref_state = ref_rule.init_state(ref_params)
    for step in range(2):
        grads = {w: rng.normal(size=10) for w in "abc"}
        batches = {"a": 2, "b": 3, "c": 5}
        for w, g in grads.items():
            s.push_dense(w, 10, 20, g, step=step, batch=batches[w], base_version=step, scale=1.0)
        s.apply_round(step)
        avg = sum(batches[w] * grads[w] for w in grads) / sum(batches.values())
        ref_rule.apply(ref_params, slice(None), torch.from_numpy(avg), ref_state, 0, 1.0)
        np.testing.assert_allclose(s.read(10, 20).numpy(), ref_params.numpy(), rtol=1e-12)


@pytest.mark.parametrize("rule", LINEAR_RULES)
def test_rules_declared_linear_are_linear_in_the_gradient(rule):
    """apply(c * g, scale=s) == apply(g, scale=c * s), over two steps (momentum state too)."""
    r = make_rule(rule, 0.1)
    rng = np.random.default_rng(2)
    a, b = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    sa, sb = r.init_state(a), r.init_state(b)
    for _ in range(2):
        g, c = torch.from_numpy(rng.normal(size=8)), 0.37
        r.apply(a, slice(None), g * c, sa, 1, 2.0)
        r.apply(b, slice(None), g, sb, 1, 2.0 * c)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
