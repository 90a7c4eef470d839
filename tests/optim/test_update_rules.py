"""Staleness-aware server update rules against hand-computed references, dense and sparse."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from paramserver.core.keyspace import KeyRange
from paramserver.optim import UPDATE_RULES, make_rule, rule_options
from paramserver.server.store import ShardStore


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def keys(*ks):
    return torch.tensor(ks, dtype=torch.int64)


def fresh(name, values, **options):
    rule = make_rule(name, **options)
    params = t(*values)
    return rule, params, rule.init_state(params)


# ---- constant and staleness-scaled rates --------------------------------------------------------

def test_consgd_multiplies_every_local_update_by_lambda():
    rule, p, s = fresh("consgd", [1, 2, 3], lr=0.1, global_rate=0.5)
    rule.apply(p, slice(None), t(2, 4, 6), s, staleness=7)  # staleness plays no part
    torch.testing.assert_close(p, t(0.9, 1.8, 2.7))
    rule.apply(p, keys(0, 2, 0), t(1, 1, 1), s, staleness=0, scale=2.0)  # key 0 twice
    torch.testing.assert_close(p, t(0.9 - 0.2, 1.8, 2.7 - 0.1))


@pytest.mark.parametrize("staleness,factor", [(0, 1.0), (1, 1 / 2), (2, 1 / 3), (9, 1 / 10)])
def test_dynsgd_divides_by_staleness_plus_one(staleness, factor):
    rule, p, s = fresh("dynsgd", [0, 0, 0], lr=0.3)
    rule.apply(p, slice(1, 3), t(1, 2), s, staleness)
    torch.testing.assert_close(p, t(0, -0.3 * factor, -0.6 * factor))
    rule.apply(p, keys(0), t(1), s, staleness, scale=0.5)
    assert float(p[0]) == pytest.approx(-0.15 * factor)


@pytest.mark.parametrize("staleness,lr", [(0, 0.4), (1, 0.4), (2, 0.2), (4, 0.1)])
def test_staleness_aware_uses_lr0_over_max_staleness_1(staleness, lr):
    rule, p, s = fresh("staleness-aware", [1, 1], lr=0.4)
    rule.apply(p, slice(None), t(1, -1), s, staleness)
    torch.testing.assert_close(p, t(1 - lr, 1 + lr))
    rule.apply(p, keys(1, 1), t(1, 1), s, staleness)
    assert float(p[1]) == pytest.approx(1 + lr - 2 * lr)


# ---- per-worker AdaGrad global rate -------------------------------------------------------------

def test_adagrad_global_accumulates_per_key_and_per_worker():
    rule, p, s = fresh("adagrad-global", [0, 0], lr=1.0, eps=1e-12)
    rule.apply(p, slice(None), t(3, 4), s, 0, worker="a")  # sums (9, 16): step (1, 1)
    torch.testing.assert_close(p, t(-1, -1))
    rule.apply(p, slice(None), t(4, 3), s, 0, worker="a")  # sums (25, 25): step (.8, .6)
    torch.testing.assert_close(p, t(-1.8, -1.6))
    rule.apply(p, slice(None), t(3, 4), s, 0, worker="b")  # b has its own sums: step (1, 1)
    torch.testing.assert_close(p, t(-2.8, -2.6))
    rule.apply(p, keys(1, 1), t(1, 2), s, 0, worker="b", scale=0.5)  # key 1: g=3, sum 25
    torch.testing.assert_close(p, t(-2.8, -2.6 - 0.5 * 3 / 5))
    assert set(s) == {"sumsq/a", "sumsq/b"}


def test_adagrad_global_worker_granularity_keeps_one_scalar_per_worker():
    rule, p, s = fresh("adagrad-global", [0, 0, 0], lr=1.0, granularity="worker", eps=1e-12)
    rule.apply(p, slice(0, 2), t(3, 4), s, 0, worker="a")  # sum 25: rate 1/5
    torch.testing.assert_close(p, t(-0.6, -0.8, 0))
    rule.apply(p, keys(2, 2), t(6, 6), s, 0, worker="a")  # sum 25 + 72 = 97
    assert float(p[2]) == pytest.approx(-12 / math.sqrt(97))
    assert s["sumsq/a"].shape == (1,)


# ---- direction and distance ---------------------------------------------------------------------

def test_direction_distance_keeps_the_norm_of_the_sum_of_latest_gradients():
    rule, p, s = fresh("direction-distance", [0, 0], lr=0.1)
    rule.apply(p, slice(None), t(3, 4), s, 0, worker="a")  # alone: plain SGD
    torch.testing.assert_close(p, t(-0.3, -0.4))
    # b: latest a=(3,4), b=(0,1); |S| = |(3,5)| = sqrt(34); |D| = |(.6, 1.8)| = sqrt(3.6).
    rule.apply(p, slice(None), t(0, 1), s, 0, worker="b")
    tb = math.sqrt(34) / math.sqrt(3.6)
    torch.testing.assert_close(p, t(-0.3, -0.4 - 0.1 * tb))
    # a again with (0, 2): S = (0, 3), D = (0, 2): t = 1.5, step 1.5 * (0, 2) / 2.
    rule.apply(p, slice(None), t(0, 2), s, 0, worker="a")
    torch.testing.assert_close(p, t(-0.3, -0.4 - 0.1 * tb - 0.15))


def test_direction_distance_sparse_and_partial_pushes_overwrite_the_keys_they_carry():
    rule, p, s = fresh("direction-distance", [0, 0, 0], lr=1.0)
    rule.apply(p, keys(0, 0, 2), t(1, 2, 4), s, 0, worker="a")  # merged (3, 0, 4): plain SGD
    torch.testing.assert_close(p, t(-3, 0, -4))
    rule.apply(p, keys(1), t(2), s, 0, worker="b")  # S = (3, 2, 4), D = (.6, 1, .8)
    assert float(p[1]) == pytest.approx(-math.sqrt(29 / 2) * 2 / 2)
    rule2, q, s2 = fresh("direction-distance", [0, 0, 0], lr=1.0)
    rule2.apply(q, slice(0, 2), t(3, 4), s2, 0, worker="a")
    rule2.apply(q, slice(2, 3), t(12), s2, 0, worker="a")  # latest a = (3, 4, 12), alone
    torch.testing.assert_close(q, t(-3, -4, -12))


def test_direction_distance_staleness_alpha():
    rule, p, s = fresh("direction-distance", [0, 0], lr=1.0, alpha="staleness")
    rule.apply(p, slice(None), t(1, 0), s, staleness=0, worker="a")  # alpha 1
    rule.apply(p, slice(None), t(0, 1), s, staleness=1, worker="b")  # alpha 1/2
    tb = math.sqrt(2) / math.sqrt(1 + 0.25)
    torch.testing.assert_close(p, t(-1, -tb * 0.5))


def reference_direction_distance(pushes, dim, lr):
    """From scratch each push: the seed's formula over the latest gradient of every worker."""
    params, latest = np.zeros(dim), {}
    for worker, index, values in pushes:
        g = latest.setdefault(worker, np.zeros(dim))
        merged = np.zeros(dim)
        np.add.at(merged, index, values)
        touched = np.unique(index)
        g[touched] = merged[touched]
        total = sum(latest.values())
        dirs = sum(v / np.linalg.norm(v) for v in latest.values() if np.linalg.norm(v) > 1e-12)
        norm = np.linalg.norm(g)
        if norm <= 1e-12:
            continue
        # Directions that cancel out leave t undefined: the rule falls back to plain SGD.
        d = np.linalg.norm(dirs)
        tt = np.linalg.norm(total) / d if d > 1e-12 else norm
        params[touched] -= lr * tt * merged[touched] / norm
    return params


@settings(max_examples=40, deadline=None)
@given(pushes=st.lists(st.tuples(st.sampled_from("abc"),
                                 st.lists(st.integers(0, 3), min_size=1, max_size=4),
                                 st.lists(st.floats(-5, 5).filter(lambda x: abs(x) > 0.1),
                                          min_size=4, max_size=4)),
                       min_size=1, max_size=12),
       refresh=st.sampled_from([1, 3, 1000]))
def test_direction_distance_matches_a_from_scratch_reference(pushes, refresh):
    rule, p, s = fresh("direction-distance", [0, 0, 0, 0], lr=0.1, refresh=refresh)
    rows = [(w, ix, vals[:len(ix)]) for w, ix, vals in pushes]
    for w, ix, vals in rows:
        rule.apply(p, keys(*ix), t(*vals), s, 0, worker=w)
    expected = reference_direction_distance([(w, np.array(ix), np.array(v)) for w, ix, v in rows],
                                            4, 0.1)
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_direction_distance_on_aggregated_rounds_is_plain_sgd():
    rule, p, s = fresh("direction-distance", [0, 0, 0], lr=0.5)
    g = torch.Generator().manual_seed(0)
    ref = p.clone()
    for _ in range(5):
        grad = torch.randn(3, generator=g, dtype=torch.float64)
        rule.apply(p, slice(None), grad, s, 0)  # worker "" (a round)
        ref -= 0.5 * grad
    torch.testing.assert_close(p, ref)


# ---- registry and the shard store ---------------------------------------------------------------

NEW_RULES = ["consgd", "dynsgd", "staleness-aware", "adagrad-global", "direction-distance"]


def test_registry_lists_the_rules_and_their_options():
    assert set(NEW_RULES) <= set(UPDATE_RULES.names())
    assert list(rule_options("consgd")) == ["global_rate"]
    assert rule_options("consgd")["global_rate"][0] == 1.0
    assert "granularity" in rule_options("adagrad-global")
    assert rule_options("dynsgd") == {}
    with pytest.raises(ValueError, match="granularity"):
        make_rule("adagrad-global", lr=0.1, granularity="row")
    with pytest.raises(ValueError,
                       match=r"optimizer 'dynsgd' has no option 'momentum'; its options: \(none\)"):
        make_rule("dynsgd", lr=0.1, momentum=0.9)


@pytest.mark.parametrize("name", NEW_RULES)
def test_rules_run_inside_the_shard_store_in_both_apply_modes(name):
    for mode in ("arrival", "round"):
        store = ShardStore(KeyRange(10, 14), "float32", make_rule(name, lr=0.1), mode)
        ones = np.ones(4, dtype=np.float32)
        store.push_dense("w0", 10, 14, ones, step=0, batch=4, base_version=0, scale=1.0)
        store.push_sparse("w1", np.array([11, 11, 13]), ones[:3], step=0, batch=4,
                          base_version=0, scale=1.0)
        if mode == "round":
            store.apply_round(0)
        assert store.updates_applied >= 1 and torch.all(store.values < 0)
