"""BSP and ASP as pure state machines, driven by scripted event sequences."""

import pytest

from paramserver.policies import (
    ApplyRound, Joined, Left, PolicyError, Pushed, Release, SYNC_POLICIES, make_policy,
)
from paramserver.core.registry import UnknownNameError


def pushed(w, step, t=0.0, batch=8):
    return Pushed(worker=w, step=step, now=t, batch_size=batch, compute_time=0.01)


def test_bsp_waits_for_every_active_worker_then_applies_and_releases_all():
    p = make_policy("bsp", batch_size=8)
    assert p.handle(Joined(0, 0.0)) == [Release(0, 0, 8)]
    p.handle(Joined(1, 0.0))
    assert p.handle(pushed(0, 0)) == []
    out = p.handle(pushed(1, 0))
    assert out == [ApplyRound(0, (0, 1)), Release(0, 1, 8), Release(1, 1, 8)]


def test_bsp_round_completes_without_a_worker_that_left():
    p = make_policy("bsp", batch_size=4)
    for w in range(3):
        p.handle(Joined(w, 0.0))
    p.handle(pushed(0, 0))
    p.handle(pushed(2, 0))
    out = p.handle(Left(1, 1.0, "dead"))
    assert out[0] == ApplyRound(0, (0, 2))
    assert [d.worker for d in out[1:]] == [0, 2]


def test_bsp_refuses_a_push_of_the_wrong_round_or_twice():
    p = make_policy("bsp", batch_size=4)
    p.handle(Joined(0, 0.0))
    p.handle(Joined(1, 0.0))
    with pytest.raises(PolicyError):
        p.handle(pushed(0, 1))
    p.handle(pushed(0, 0))
    with pytest.raises(PolicyError):
        p.handle(pushed(0, 0))


def test_asp_releases_at_once():
    p = make_policy("asp", batch_size=2)
    assert p.handle(Joined(3, 0.0)) == [Release(3, 0, 2)]
    assert p.handle(pushed(3, 0)) == [Release(3, 1, 2)]
    assert p.apply_mode == "arrival"


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(UnknownNameError, match="bsp"):
        make_policy("nope", batch_size=1)
    assert {"bsp", "asp"} <= set(SYNC_POLICIES.names())


def test_push_from_unknown_worker_is_refused():
    p = make_policy("asp", batch_size=2)
    with pytest.raises(PolicyError):
        p.handle(pushed(5, 0))
