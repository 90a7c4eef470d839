"""The coordinator's part of clipped rounds (coordinator/clip_rounds.py), driven by events:
the shards' partials of a round summed, the factor sent once every shard reported, a shard
gone or silent given up on (applied unclipped), a round asked again answered at once, and a
plain round that sends no clip message."""

from __future__ import annotations

import pytest

from paramserver.coordinator.events import AppendEvent, ClipPartial, TimePassed, ToServers, Warn
from ps_helpers import clock_round, match, only, register_all, start_round


def two_shards(make, **kw):
    state = make(servers=2, **kw)
    register_all(state, servers=2)
    return state


def partial(src, step, value, clip=(1.0, 2.0), now=1.0, link=None):
    return ClipPartial(src, step, value, list(clip), now, to=None,
                       link=link or f"L{src[1:]}")


def factors(out):
    return [i for i in only(out, ToServers) if i.op == "clip_factor"]


def test_the_factor_goes_to_every_shard_once_all_partials_are_in(make):
    state = two_shards(make)
    assert factors(state.handle(partial("s0", 3, 9.0))) == []
    [f] = factors(state.handle(partial("s1", 3, 16.0)))
    assert f.fields["step"] == 3 and f.links == ("L0", "L1")
    assert f.fields["factor"] == pytest.approx(1.0 / (5.0 + 1e-6))
    assert state.clips.open == {}
    # asked again (the factor lost, say): answered at once, to that shard alone
    [again] = factors(state.handle(partial("s1", 3, 16.0)))
    assert again.links == ("L1",) and again.fields["factor"] == f.fields["factor"]


def test_the_inf_norm_takes_the_largest_partial_and_a_small_norm_is_not_scaled(make):
    state = two_shards(make)
    state.handle(partial("s0", 0, 0.5, clip=(2.0, "inf")))
    [f] = factors(state.handle(partial("s1", 0, 4.0, clip=(2.0, "inf"))))
    assert f.fields["factor"] == pytest.approx(2.0 / (4.0 + 1e-6))
    state.handle(partial("s0", 1, 0.1))
    [f] = factors(state.handle(partial("s1", 1, 0.2)))
    assert f.fields["factor"] == 1.0


def test_a_non_finite_norm_gives_torchs_factor_zero(make):
    state = two_shards(make)
    state.handle(partial("s0", 0, -1.0))
    [f] = factors(state.handle(partial("s1", 0, 1.0)))
    assert f.fields["factor"] == 0.0


def test_a_backups_or_strangers_partial_is_ignored(make):
    state = two_shards(make)
    assert state.handle(partial("b0", 0, 1.0, link="B0")) == []
    assert state.handle(partial("s0", 0, 1.0, link="elsewhere")) == []
    assert state.clips.open == {}


def test_a_round_whose_shard_is_silent_is_given_up_and_applied_unclipped(make):
    state = two_shards(make, server_timeout=30.0)
    state.handle(partial("s0", 5, 9.0, now=1.0))
    assert state.next_wakeup() <= 31.0
    out = state.handle(TimePassed(31.0))
    [f] = factors(out)
    assert f.fields == {"step": 5, "factor": 1.0}
    assert any(isinstance(w, Warn) and "no partial from shard(s) [1]" in w.message
               for w in out)
    assert any(match(e, AppendEvent, kind="clip_given_up", step=5, missing=[1])
               for e in out)
    assert state.clips.open == {}


def test_a_round_whose_shard_is_gone_is_given_up_at_the_next_turn(make):
    state = two_shards(make)
    state.handle(partial("s0", 2, 9.0, now=1.0))
    state.members.roster.servers["s1"].silent_since = 1.2  # (ServerRecovery: lost)
    out = state.handle(TimePassed(1.5))
    [f] = factors(out)
    assert f.fields["factor"] == 1.0
    assert any(isinstance(w, Warn) and "shard(s) [1] gone" in w.message for w in out)


def test_a_plain_bsp_round_sends_no_clip_message(make):
    state = make()
    start_round(state)
    first, second = clock_round(state)
    ops = [i.op for i in only(first + second, ToServers)]
    assert ops == ["apply_round"]
    assert state.clips.open == {} and not state.clips.decided


def test_a_malformed_setting_is_refused(make):
    state = two_shards(make)
    out = state.handle(partial("s0", 0, 1.0, clip=(1.0, -2.0)))
    assert only(out, Warn) and state.clips.open == {}
