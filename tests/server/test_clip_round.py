"""A clipped round on one shard's core (server/clip_round.py), driven by events alone: held
once full until the coordinator's factor, applied scaled by it, bounded without one; a round
no push asked to clip sends no message and waits for nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from paramserver.core import clipping
from paramserver.server.core import ShardCore
from paramserver.server.events import (
    ApplyRound, ClipFactor, Init, Log, Pull, Push, Reply, ShardSettings, Then, TimePassed,
    ToCoordinator,
)

N = 4
LR = 0.5
RID = iter(range(1, 10 ** 6))


def core(optimizer="sgd", lr=LR, mode="round", pull_timeout=10.0):
    c = ShardCore(ShardSettings(rank=1, lo=0, hi=N, dtype="float32", apply_mode=mode,
                                optimizer=optimizer, lr=lr, pull_timeout=pull_timeout,
                                heartbeat_interval=1.0))
    c.handle(Init("i", 0, N, np.zeros(N, np.float32)))
    return c


def run(c, event):
    out = c.handle(event)
    return [x for ins in out for x in (run(c, ins.event) if type(ins) is Then else [ins])]


def push(sender, grad, step=0, clip=None, batch=1, round_size=2):
    p = Push(("w", sender), sender, next(RID), 0, N, np.asarray(grad, np.float32), step,
             batch, 0, 1.0, round_size, 1)
    p.clip = clip
    return p


def sent(out, kind):
    return [i for i in out if type(i) is kind]


G0, G1 = [3.0, 0.0, 4.0, 0.0], [1.0, 2.0, 0.0, 2.0]


def test_a_round_without_clipping_sends_no_extra_message():
    c = core()
    run(c, push("w0", G0))
    out = run(c, push("w1", G1))
    assert [i.op for i in out] == ["ack"]  # applied at once: nothing to the coordinator
    assert c.store.version == 1
    assert run(c, ApplyRound(None, 0)) == []  # the coordinator's word changes nothing
    np.testing.assert_allclose(c.store.values.numpy(), -LR * (np.add(G0, G1) / 2))


def test_a_full_clipped_round_sends_its_partial_and_waits_for_the_factor():
    c = core()
    run(c, push("w0", G0, clip=[1.0, 2.0], batch=1))
    out = run(c, push("w1", G1, clip=[1.0, 2.0], batch=3))
    avg = (np.array(G0) * 1 + np.array(G1) * 3) / 4
    [partial] = sent(out, ToCoordinator)
    assert partial.op == "clip_partial" and partial.fields["step"] == 0
    assert partial.fields["clip"] == [1.0, 2.0]
    assert partial.fields["partial"] == pytest.approx(float((avg ** 2).sum()), rel=1e-6)
    assert c.store.version == 0  # held
    pull = Pull(("w", "q"), 0.0, 1, 0, N)
    assert run(c, pull) == []  # waits for the round's version
    assert run(c, ApplyRound(None, 0)) == []  # the coordinator's apply_round: still held
    out = run(c, ClipFactor(None, 0, 0.25))
    assert c.store.version == 1
    np.testing.assert_allclose(c.store.values.numpy(), -LR * 0.25 * avg, rtol=1e-6)
    assert [r.op for r in sent(out, Reply)] == ["values"]  # the waiting pull served
    assert run(c, ClipFactor(None, 0, 0.5)) == []  # a second word changes nothing
    np.testing.assert_allclose(c.store.values.numpy(), -LR * 0.25 * avg, rtol=1e-6)


def test_the_inf_norm_partial_is_the_largest_average_entry():
    c = core()
    run(c, push("w0", G0, clip=[1.0, "inf"]))
    [partial] = sent(run(c, push("w1", G1, clip=[1.0, "inf"])), ToCoordinator)
    assert partial.fields["partial"] == pytest.approx(2.0)  # (4 + 0) / 2
    assert partial.fields["clip"] == [1.0, "inf"]


def test_a_torch_rule_sees_the_clipped_average_as_its_gradient():
    """Adam is not linear in the gradient: the factor must scale what it sees (its first step
    moves each key by lr * sign whatever the scale, so look at its moments)."""
    c = core("adam", 0.1)
    run(c, push("w0", G0, clip=[1.0, 2.0]))
    run(c, push("w1", G1, clip=[1.0, 2.0]))
    run(c, ClipFactor(None, 0, 0.5))
    avg = (np.array(G0) + np.array(G1)) / 2
    np.testing.assert_allclose(c.store.state["exp_avg"].numpy(), 0.1 * 0.5 * avg, rtol=1e-6)


def test_ranks_that_disagree_on_clipping_are_refused_naming_both():
    c = core()
    run(c, push("w0", G0, clip=[1.0, 2.0]))
    [err] = run(c, push("w1", G1, clip=[2.0, 2.0]))
    assert err.op == "error" and err.fields["code"] == "refused"
    assert "w1 asks clip_grad_norm_(max_norm=2" in err.fields["msg"]
    assert "w0 asked clip_grad_norm_(max_norm=1" in err.fields["msg"]
    c2 = core()
    run(c2, push("w0", G0))  # no clipping first, then a rank that clips
    [err] = run(c2, push("w1", G1, clip=[1.0, 2.0]))
    assert "w0 asked no clipping" in err.fields["msg"]


def test_a_bad_clip_field_is_refused():
    for bad in ([1.0], [-1.0, 2.0], [1.0, 0.0], [1.0, "two"], [float("nan"), 2.0], "x"):
        c = core()
        [err] = run(c, push("w0", G0, clip=bad))
        assert err.op == "error" and err.fields["code"] == "refused", bad
    c = core(mode="arrival")  # the worker clips its own push there
    [err] = run(c, push("w0", G0, clip=[1.0, 2.0]))
    assert "on arrival" in err.fields["msg"]


def test_a_held_round_sends_its_partial_again_and_is_applied_unclipped_past_its_time():
    c = core(pull_timeout=10.0)
    run(c, push("w0", G0, clip=[1.0, 2.0]))
    run(c, push("w1", G1, clip=[1.0, 2.0]))
    assert not sent(run(c, TimePassed(100.0)), ToCoordinator)  # the wait is timed from here
    assert c.next_wakeup() == pytest.approx(101.0)
    again = sent(run(c, TimePassed(101.0)), ToCoordinator)
    assert [m.op for m in again] == ["clip_partial"]  # a restarted coordinator hears it
    out = run(c, TimePassed(110.0))
    assert sent(out, Log) and "applied unclipped" in sent(out, Log)[0].text
    assert c.store.version == 1 and c.clip.unclipped == 1
    np.testing.assert_allclose(c.store.values.numpy(), -LR * (np.add(G0, G1) / 2))
    assert math.isinf(c.clip.due)


def test_the_next_round_without_clipping_is_plain_again():
    c = core()
    run(c, push("w0", G0, clip=[1.0, 2.0]))
    run(c, push("w1", G1, clip=[1.0, 2.0]))
    run(c, ClipFactor(None, 0, 1.0))
    run(c, push("w0", G0, step=1))
    out = run(c, push("w1", G1, step=1))
    assert not sent(out, ToCoordinator) and c.store.version == 2


def test_clipping_helpers_are_torchs_formula():
    g = torch.tensor([3.0, 0.0, 4.0, 1.0, -2.0])
    for p in (2.0, math.inf, 1.0):
        parts = [clipping.partial(float(torch.linalg.vector_norm(g[:2], p)), p),
                 clipping.partial(float(torch.linalg.vector_norm(g[2:], p)), p)]
        total = clipping.total(parts, p)
        assert total == pytest.approx(float(torch.linalg.vector_norm(g, p)), rel=1e-6)
        ref = torch.zeros(5, requires_grad=True)
        ref.grad = g.clone()
        torch.nn.utils.clip_grad_norm_([ref], 0.7, p)
        np.testing.assert_allclose((g * clipping.factor(total, 0.7)).numpy(), ref.grad.numpy(),
                                   rtol=1e-6)
    assert clipping.factor(0.1, 1.0) == 1.0


def test_a_backup_applies_the_factor_its_primary_forwards():
    """--replicas 2: the backup holds the same round (the pushes are forwarded to it) and
    takes the coordinator's clip_factor as the primary forwards it, so both copies apply the
    same clipped average (its own partial goes to a coordinator that ignores a backup's)."""
    from paramserver.server.node import EVENTS
    from paramserver.server.replica_link import FORWARDED
    from paramserver.wire import Message
    from paramserver.wire.codec import decode, encode
    primary, backup = core(), core()
    for c in (primary, backup):
        run(c, push("w0", G0, clip=[1.0, 2.0]))
        run(c, push("w1", G1, clip=[1.0, 2.0]))
        assert c.store.version == 0
    word = decode(list(encode(Message("clip_factor", {"step": 0, "factor": 0.125},
                                      src="coord"))))
    assert word.op in FORWARDED
    for c in (primary, backup):
        run(c, EVENTS[word.op](word, ("fwd", 1)))
    assert backup.store.version == primary.store.version == 1
    np.testing.assert_array_equal(backup.store.values.numpy(), primary.store.values.numpy())
    np.testing.assert_allclose(primary.store.values.numpy(),
                               -LR * 0.125 * np.add(G0, G1) / 2, rtol=1e-6)


@pytest.mark.parametrize("when,clip", [("mid-round", [1.0, 2.0]), ("held", [1.0, 2.0]),
                                       ("mid-round", [1.0, "inf"])])
def test_a_backup_synced_during_a_clipped_round_applies_it_as_its_primary(when, clip):
    """A backup attached while a clipped round is open takes the round from its primary's
    state sync, the clip setting with it: the round's next forwarded push asks the same
    setting (before, the backup took it for a disagreement and refused it, which loses the
    backup), and a round synced while held for its factor is applied when the factor comes
    (before, the factor was ignored and the backup's copy kept the round open)."""
    from paramserver.server.events import LoadSync
    from paramserver.server.replication import sync_payload
    primary, backup = core(), core()
    run(primary, push("w0", G0, clip=clip))
    if when == "held":
        run(primary, push("w1", G1, clip=clip))
    backup.handle(LoadSync([np.array(a) for a in sync_payload(primary)[1]]))
    if when == "mid-round":
        last = push("w1", G1, clip=clip)
        for c in (primary, backup):
            out = run(c, last)
            assert [r.op for r in sent(out, Reply)] == ["ack"], out
            assert c.store.version == 0  # held for the factor
    for c in (primary, backup):
        run(c, ClipFactor(None, 0, 0.125))
        assert c.store.version == 1
    np.testing.assert_array_equal(backup.store.values.numpy(), primary.store.values.numpy())
    np.testing.assert_allclose(primary.store.values.numpy(),
                               -LR * 0.125 * np.add(G0, G1) / 2, rtol=1e-6)
    assert backup.clip.held is None and primary.clip.held is None  # nothing left held
