"""torch's optimizers run by the shards: checked against torch itself stepping the same model.

A "model" of three parameters is laid out flat (keys 0..3, 4..10, 11..15), in two parameter
groups with their own settings; it is cut into shards at keys that fall inside parameters and
groups. Every shard applies the same gradients with the registered rule, and the values must
be what torch's own optimizer makes of the three real parameters, step by step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paramserver.core.keyspace import KeyRange
from paramserver.optim import TORCH_OPTIMIZERS, UPDATE_RULES, make_rule
from paramserver.server.store import ShardStore

SIZES = (4, 7, 5)
EDGES = np.cumsum((0,) + SIZES)
# group 0: params 0 and 2; group 1: param 1 (its own lr and, where the class has one, decay)
GROUP_PARAMS = ([0, 2], [1])

CASES = {
    "torch-sgd": dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
    "adam": dict(betas=[0.8, 0.99], eps=1e-6, weight_decay=0.01, amsgrad=True),
    "adamw": dict(weight_decay=0.05),
    "adagrad": dict(lr_decay=0.01, initial_accumulator_value=0.1),
    "rmsprop": dict(alpha=0.9, momentum=0.5, centered=True),
    "adamax": dict(betas=[0.9, 0.95]),
}
GROUP_SETTINGS = {"torch-sgd": {"lr": 0.02, "weight_decay": 0.0, "nesterov": True},
                  "adagrad": {"lr": 0.3}, "rmsprop": {"lr": 0.002, "momentum": 0.0}}


def _reference(name: str, options: dict, initial: torch.Tensor):
    params = [torch.nn.Parameter(initial[a:b].clone()) for a, b in zip(EDGES, EDGES[1:])]
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    second = {"lr": 0.05, **GROUP_SETTINGS.get(name, {})}
    groups = [{"params": [params[i] for i in GROUP_PARAMS[0]]},
              {"params": [params[i] for i in GROUP_PARAMS[1]], **second}]
    return params, TORCH_OPTIMIZERS[name](groups, lr=0.1, **opts)


def _rule(name: str, options: dict):
    second = {"lr": 0.05, **GROUP_SETTINGS.get(name, {})}
    ranges = [[int(EDGES[i]), int(EDGES[i + 1])] for i in GROUP_PARAMS[1]]
    return make_rule(name, 0.1, groups=[{"ranges": ranges, **second}], **options)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("cuts", [(0, 16), (0, 6, 16), (0, 2, 12, 16)])
def test_the_shards_step_as_torch_steps_the_model(name, cuts):
    torch.manual_seed(0)
    initial = torch.randn(int(EDGES[-1]))
    params, reference = _reference(name, CASES[name], initial)
    shards = []
    for lo, hi in zip(cuts, cuts[1:]):
        store = ShardStore(KeyRange(lo, hi), "float32", _rule(name, CASES[name]), "arrival")
        store.values.copy_(initial[lo:hi])
        shards.append(store)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        grad = torch.randn(int(EDGES[-1]), generator=g)
        # Steps 2 and 4 push only parameter 1's range (a layer's push): torch steps only it.
        only = step in (2, 4)
        for i, p in enumerate(params):
            p.grad = None if only and i != 1 else grad[EDGES[i]:EDGES[i + 1]].clone()
        reference.step()
        a, b = (int(EDGES[1]), int(EDGES[2])) if only else (0, int(EDGES[-1]))
        for store in shards:
            lo, hi = store.range.lo, store.range.hi
            s, e = max(a, lo), min(b, hi)
            if s < e:
                store.push("w", slice(s - lo, e - lo), grad[s:e].clone(), step, 1, 0, 1.0)
        got = torch.cat([s.values for s in shards])
        want = torch.cat([p.detach() for p in params])
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7,
                                   msg=f"{name} diverged from torch at step {step}")


def test_state_survives_a_checkpoint_round_trip():
    """The per-key state and step counts are the store's state: restored into a new shard, the
    next steps are torch's as if nothing happened."""
    torch.manual_seed(0)
    initial = torch.randn(16)
    params, reference = _reference("adam", CASES["adam"], initial)
    store = ShardStore(KeyRange(0, 16), "float32", _rule("adam", CASES["adam"]), "arrival")
    store.values.copy_(initial)
    grads = [torch.randn(16) for _ in range(4)]
    for step, grad in enumerate(grads):
        for i, p in enumerate(params):
            p.grad = grad[EDGES[i]:EDGES[i + 1]].clone()
        reference.step()
        if step == 1:
            arrays, meta = store.snapshot()
            arrays = {k: np.array(v) for k, v in arrays.items()}
            store = ShardStore(KeyRange(0, 16), "float32", _rule("adam", CASES["adam"]),
                               "arrival")
            store.restore(arrays, meta)
        store.push("w", slice(0, 16), grad.clone(), step, 1, 0, 1.0)
    torch.testing.assert_close(store.values, torch.cat([p.detach() for p in params]))


def test_a_round_is_averaged_before_the_optimizer_sees_it():
    """Round mode: the optimizer gets the batch-weighted mean of the round's pushes."""
    initial = torch.randn(16)
    params, reference = _reference("adamw", CASES["adamw"], initial)
    store = ShardStore(KeyRange(0, 16), "float32", _rule("adamw", CASES["adamw"]), "round")
    store.values.copy_(initial)
    g1, g2 = torch.randn(16), torch.randn(16)
    store.push("a", slice(0, 16), g1.clone(), 0, 32, 0, 1.0)  # each a batch's mean
    store.push("b", slice(0, 16), g2.clone(), 0, 96, 0, 1.0)
    store.apply_round(0)
    mean = (g1 * 32 + g2 * 96) / 128
    for i, p in enumerate(params):
        p.grad = mean[EDGES[i]:EDGES[i + 1]].clone()
    reference.step()
    torch.testing.assert_close(store.values, torch.cat([p.detach() for p in params]))


def test_bad_settings_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="has no option 'betaz'.*did you mean"):
        make_rule("adam", 0.1, betaz=[0.9, 0.9])
    with pytest.raises(ValueError, match="torch.optim.Adam: Invalid beta"):
        make_rule("adam", 0.1, betas=[1.5, 0.9])
    with pytest.raises(ValueError, match="group 0: a key range"):
        make_rule("adam", 0.1, groups=[{"ranges": [[5, 2]]}])
    with pytest.raises(ValueError, match="sparse keys go to a table"):
        rule = make_rule("adam", 0.1)
        store = ShardStore(KeyRange(0, 4), "float32", rule, "arrival")
        store.push("w", torch.tensor([1, 2]), torch.ones(2), 0, 1, 0, 1.0)


def test_every_torch_optimizer_is_registered_with_its_options():
    for name, cls in TORCH_OPTIMIZERS.items():
        help_ = UPDATE_RULES.get(name).option_help()
        assert "weight_decay" in help_ and "lr" not in help_ and "foreach" not in help_
        assert cls.__name__ in help_["weight_decay"][1]


def test_step_counts_move_with_their_keys_whatever_the_values_dtype():
    """Resharding cuts per-key state with its keys; the float32 step counts of a float16
    shard are per key too (the dtype alone would call them the shard's scalar state)."""
    from paramserver.server.handoff import keyed_state
    store = ShardStore(KeyRange(0, 8), "float16", make_rule("adam", 0.1), "arrival")
    keyed, scalar = keyed_state(store)
    assert keyed == ["exp_avg", "exp_avg_sq", "step"] and scalar == []
    sgd = ShardStore(KeyRange(0, 8), "float16", make_rule("torch-sgd", 0.1), "arrival")
    assert keyed_state(sgd) == (["step"], [])  # no momentum: no buffer


def test_a_schedule_retunes_a_group_and_a_change_of_kept_state_is_refused():
    rule = make_rule("torch-sgd", 0.1, groups=[{"ranges": [[0, 4]]}, {"ranges": [[4, 8]]}])
    rule.retune([[1, {"lr": 0.5, "weight_decay": 0.01}]])
    assert rule.options()["groups"][1] == {"ranges": [[4, 8]], "lr": 0.5, "weight_decay": 0.01}
    with pytest.raises(ValueError, match="changes what the optimizer keeps per key"):
        rule.retune([[0, {"momentum": 0.9}]])  # a buffer the shard never allocated
    with pytest.raises(ValueError, match="has no option 'lrr'"):
        rule.retune([[0, {"lrr": 0.5}]])
    with pytest.raises(ValueError, match=r"\[group 0..1"):
        rule.retune([[2, {"lr": 0.5}]])
    with pytest.raises(ValueError, match="takes no settings from the script"):
        make_rule("sgd", 0.1).retune([[0, {"lr": 0.5}]])


def test_the_step_runs_kept_beside_the_counts_match_them_through_range_pushes_and_a_load():
    """The rule keeps runs of equal step counts instead of scanning state["step"] on every
    apply; after random range pushes, and after a restore that rewrote the counts, what it
    keeps is what the counts say."""
    import random
    rng = random.Random(3)
    store = ShardStore(KeyRange(100, 140), "float32", make_rule("adam", 0.1), "arrival")
    rule = store.rule

    def from_tensor():
        counts, sizes = torch.unique_consecutive(store.state["step"], return_counts=True)
        out, at = [], 0
        for n, size in zip(counts.tolist(), sizes.tolist()):
            out.append((at, at + size, int(n)))
            at += size
        return out

    for i in range(60):
        a = rng.randrange(0, 40)
        b = rng.randrange(a + 1, 41)
        store.push("w", slice(a, b), torch.randn(b - a), i, 1, 0, 1.0)
        assert rule._runs == from_tensor()
        if i == 30:  # a checkpoint of other counts loaded into it
            arrays, meta = store.snapshot()
            arrays = {k: np.array(v) for k, v in arrays.items()}
            arrays["state.step"][:7] += 5
            store.restore(arrays, meta)
            assert rule._runs is None
    assert len(rule._runs) > 1


@pytest.mark.parametrize("rule,factor", [
    ("dynsgd", lambda s: 1 / (s + 1)), ("staleness-aware", lambda s: 1 / max(s, 1)),
    ("consgd", lambda s: 0.5)])
def test_a_staleness_rule_scales_the_torch_optimizers_lr_per_push(rule, factor):
    """Composed with a staleness rule, each push is Adam's step at lr times the rule's
    factor for that push's staleness (torch stepping with that lr is the reference)."""
    torch.manual_seed(0)
    extra = {"global_rate": 0.5} if rule == "consgd" else {}
    r = make_rule("adam", 0.1, staleness=rule, groups=[{"ranges": [[0, 3]], "lr": 0.2}],
                  **extra)
    assert r.staleness_aware
    r.bind(0, 6)
    values = torch.randn(6)
    state = r.init_state(values)
    a, b = torch.nn.Parameter(values[:3].clone()), torch.nn.Parameter(values[3:].clone())
    ref = torch.optim.Adam([{"params": [a], "lr": 0.2}, {"params": [b]}], lr=0.1)
    for staleness in (0, 3, 1, 5):
        g = torch.randn(6)
        r.apply(values, slice(0, 6), g.clone(), state, staleness)
        ref.param_groups[0]["lr"], ref.param_groups[1]["lr"] = (0.2 * factor(staleness),
                                                              0.1 * factor(staleness))
        a.grad, b.grad = g[:3].clone(), g[3:].clone()
        ref.step()
        torch.testing.assert_close(values, torch.cat([a.detach(), b.detach()]))
    with pytest.raises(ValueError, match="staleness must be one of"):
        make_rule("adam", 0.1, staleness="ssp")
    with pytest.raises(ValueError, match="global_rate is consgd's"):
        make_rule("adam", 0.1, global_rate=0.5)


@pytest.mark.parametrize("name", ["adam", "torch-sgd"])
def test_a_pushs_scale_is_its_lr_as_torch_steps_it(name):
    """A push scaled to a share of a round (auto's asp and ssp stretches, R2SP's batch
    weights) is torch's step at lr times that share: Adam's step of a scaled gradient would
    be as long as the whole one's, so N such pushes would move N times a round's step."""
    torch.manual_seed(1)
    opts = {"momentum": 0.9, "weight_decay": 0.01} if name == "torch-sgd" else {}
    r = make_rule(name, 0.1, **opts)
    r.bind(0, 6)
    values = torch.randn(6)
    state = r.init_state(values)
    p = torch.nn.Parameter(values.clone())
    cls = torch.optim.SGD if name == "torch-sgd" else torch.optim.Adam
    ref = cls([p], lr=0.1, **opts)
    for scale in (0.25, 1.0, 0.5, 0.25):
        g = torch.randn(6)
        r.apply(values, slice(0, 6), g.clone(), state, 0, scale)
        ref.param_groups[0]["lr"] = 0.1 * scale
        p.grad = g.clone()
        ref.step()
        torch.testing.assert_close(values, p.detach())


@pytest.mark.parametrize("name,options", [("adam", {}), ("torch-sgd", {"momentum": 0.9,
                                                                      "weight_decay": 0.1})])
def test_keys_of_the_frozen_group_are_never_stepped_as_torch_never_steps_them(name, options):
    """Keys in no group of the script's optimizer (or whose parameter needs no grad) come as
    a last group marked `frozen`: left out of every step, their values, moments and step
    counts as torch leaves a parameter it was not given. Before, they were a group of lr 0,
    stepped: Adam's counts and moments, SGD's momentum (with weight decay) moved. A shard
    that holds part of a frozen run, and a bad frozen group, too."""
    torch.manual_seed(1)
    rule = make_rule(name, 0.1, groups=[{"ranges": [[0, 3]]},
                                        {"ranges": [[3, 5], [8, 10]], "frozen": True}],
                     **options)
    assert rule.options()["groups"][-1] == {"ranges": [[3, 5], [8, 10]], "frozen": True}
    rule.bind(2, 10)  # this shard: keys [2, 10)
    values = torch.randn(8)
    state = rule.init_state(values)
    start = values.clone()
    cls = torch.optim.Adam if name == "adam" else torch.optim.SGD
    a, b = torch.nn.Parameter(start[:1].clone()), torch.nn.Parameter(start[3:6].clone())
    ref = cls([{"params": [a]}, {"params": [b]}], lr=0.1, **options)  # 3-5, 8-10: not given
    for _ in range(3):
        g = torch.randn(8)
        rule.apply(values, slice(0, 8), g.clone(), state, 0)
        a.grad, b.grad = g[:1].clone(), g[3:6].clone()
        ref.step()
    torch.testing.assert_close(values[:1], a.detach())
    torch.testing.assert_close(values[3:6], b.detach())
    for frozen in (slice(1, 3), slice(6, 8)):
        assert torch.equal(values[frozen], start[frozen])
        assert torch.equal(state["step"][frozen], torch.zeros(2))
        for k, v in state.items():
            if k != "step":
                assert torch.equal(v[frozen], torch.zeros(2)), k
    assert state["step"][0] == 3
    with pytest.raises(ValueError, match="a frozen group is the last one"):
        make_rule(name, 0.1, groups=[{"ranges": [[3, 5]], "frozen": True}, {"ranges": [[0, 3]]}])
    with pytest.raises(ValueError, match="a frozen group is the last one"):
        make_rule(name, 0.1, groups=[{"ranges": [[3, 5]], "frozen": True, "lr": 0.0}])
