"""Keys a push says got no gradient (`idle`), on the pure parts (no sockets): a torch rule
leaves them out of its step as torch leaves out a parameter whose grad is None, per push in
arrival mode, and in a round only the keys idle in every push of it (as DDP: a parameter any
rank used gets the averaged gradient); chunks carry their own part; a malformed or misplaced
field is refused with an error reply and nothing applied; a new backup's sync carries the open
round's idle keys. The live checks against torch: tests/optim/test_unused_params.py."""

import numpy as np
import pytest
import torch

from paramserver.core.keyspace import KeyRange, clip_runs, subtract_runs, union_runs
from paramserver.optim import make_rule
from paramserver.server.core import ShardCore
from paramserver.server.events import Init, LoadSync, Reply, ShardSettings, Then
from paramserver.server.idle_keys import RoundIdle, local_idle
from paramserver.server.node import EVENTS
from paramserver.server.replication import sync_payload
from paramserver.server.store import ShardStore
from paramserver.wire import Message, WireError, decode, encode
from paramserver.wire.codec import MAX_HEADER_BYTES
from paramserver.wire.protocol import MAX_RUNS

# Three "parameters": keys [0, 4), [4, 10), [10, 16).
EDGES = (0, 4, 10, 16)


def _params(initial):
    return [torch.nn.Parameter(initial[a:b].clone()) for a, b in zip(EDGES, EDGES[1:])]


def _flat(params):
    return torch.cat([p.detach() for p in params])


# ---- runs ---------------------------------------------------------------------------------------
def test_run_arithmetic():
    assert union_runs([(0, 2), (5, 7)], [[2, 3], (6, 9)]) == [(0, 3), (5, 9)]
    assert subtract_runs([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract_runs([(0, 4), (6, 9)], [(3, 7)]) == [(0, 3), (7, 9)]
    assert subtract_runs([(0, 4)], []) == [(0, 4)] and subtract_runs([], [(0, 4)]) == []
    assert clip_runs([[0, 4], [6, 9], [12, 20]], 3, 13) == [(3, 4), (6, 9), (12, 13)]
    assert clip_runs([[0, 4], [6, 9]], 3, 8, base=3) == [(0, 1), (3, 5)]


# ---- the round's intersection -------------------------------------------------------------------
def test_a_round_leaves_out_only_what_every_push_left_idle():
    r = RoundIdle()
    r.add(slice(0, 16), [(0, 4), (10, 16)])  # worker a used only the middle parameter
    r.add(slice(0, 16), [(4, 10), (10, 16)])  # worker b used only the first
    assert r.take() == [(10, 16)]
    assert r.take() == []  # the next round starts empty
    r.add(slice(0, 16), [(4, 10)])
    r.add(slice(0, 16), None)  # a push that used everything
    assert r.take() == []
    r.add(slice(0, 16), None)  # whichever order
    r.add(slice(0, 16), [(4, 10)])
    assert r.take() == []


def test_a_workers_chunks_each_carry_their_part():
    r = RoundIdle()
    # worker a in two chunks: [0, 8) with [4, 8) idle, [8, 16) with [8, 10) idle
    r.add(slice(0, 8), [(4, 8)])
    r.add(slice(8, 16), [(8, 10)])
    r.add(slice(0, 16), [(4, 10)])  # worker b in one message
    assert r.take() == [(4, 10)]
    # one chunk of b's says [6, 8) was used
    r.add(slice(0, 16), [(4, 10)])
    r.add(slice(0, 8), [(4, 6)])
    r.add(slice(8, 16), [(8, 10)])
    assert r.take() == [(4, 6), (8, 10)]


def test_a_sparse_push_summed_into_the_round_counts_its_span_as_used():
    r = RoundIdle()
    r.add(slice(0, 16), [(0, 16)])
    r.add(torch.tensor([5, 7]), None)
    r.add(torch.tensor([], dtype=torch.int64), None)  # a table's rows: no dense keys
    assert r.take() == [(0, 5), (8, 16)]


def test_the_round_state_round_trips():
    r = RoundIdle()
    r.add(slice(0, 16), [(4, 10)])
    r.add(slice(0, 8), None)
    other = RoundIdle()
    other.load(r.state())
    assert other.take() == r.take() == [(8, 10)]
    other.load(None)  # a sync from a primary that kept none
    assert other.take() == []


def test_local_idle_refuses_runs_outside_the_push_and_moves_to_local_keys():
    assert local_idle([[12, 14], [15, 16]], 10, 20, base=10) == [(2, 4), (5, 6)]
    with pytest.raises(ValueError, match=r"outside the push's keys \[10, 20\)"):
        local_idle([[8, 12]], 10, 20, base=10)
    with pytest.raises(ValueError, match="outside"):
        local_idle([[12, 14], [18, 21]], 10, 20, base=10)


# ---- a torch rule on the store against torch ----------------------------------------------------
def _torch_rule_case(name):
    return {"adam": (dict(weight_decay=0.1, betas=[0.8, 0.9]),
                     lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.1,
                                                 betas=(0.8, 0.9))),
            "torch-sgd": (dict(momentum=0.9, weight_decay=0.05),
                          lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                     weight_decay=0.05)),
            "adamw": (dict(weight_decay=0.1),
                      lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1))}[name]


@pytest.mark.parametrize("name", ["adam", "torch-sgd", "adamw"])
@pytest.mark.parametrize("cuts", [(0, 16), (0, 6, 16)])
def test_arrival_pushes_leave_their_idle_parameters_as_torch_leaves_a_none_grad(name, cuts):
    options, make = _torch_rule_case(name)
    torch.manual_seed(0)
    initial = torch.randn(16)
    params = _params(initial)
    ref = make(params)
    shards = []
    for lo, hi in zip(cuts, cuts[1:]):
        store = ShardStore(KeyRange(lo, hi), "float32", make_rule(name, 0.1, **options),
                           "arrival")
        store.values.copy_(initial[lo:hi])
        shards.append(store)
    g = torch.Generator().manual_seed(1)
    # which parameters get no gradient at each step (parameter 2 never does)
    unused = [{2}, {1, 2}, {0, 2}, {2}, {1, 2}, {2}]
    for step, idle_params in enumerate(unused):
        grad = torch.randn(16, generator=g)
        for i, p in enumerate(params):
            p.grad = None if i in idle_params else grad[EDGES[i]:EDGES[i + 1]].clone()
        ref.step()
        idle = [[EDGES[i], EDGES[i + 1]] for i in sorted(idle_params)]
        for store in shards:
            lo, hi = store.range.lo, store.range.hi
            part = [list(r) for r in clip_runs(idle, lo, hi)]
            store.push_dense("w", lo, hi, grad[lo:hi].clone().numpy(), step, 1, 0, 1.0,
                             idle=part or None)
        torch.testing.assert_close(torch.cat([s.values for s in shards]), _flat(params),
                                   rtol=1e-6, atol=1e-7, msg=f"{name} at step {step}")
    # the never-used parameter: its values, state and step counts as they started
    last = shards[-1]
    assert torch.equal(last.values[-6:], initial[10:16])
    assert torch.count_nonzero(last.state["step"][-6:]) == 0
    assert torch.equal(shards[0].state["step"][:4], torch.full((4,), 5.0))  # stepped 5 of 6


def _round_store(name, mode="round"):
    options, _ = _torch_rule_case(name)
    store = ShardStore(KeyRange(0, 16), "float32", make_rule(name, 0.1, **options), mode)
    return store


@pytest.mark.parametrize("mode", ["round", "arrival"])
def test_a_round_steps_a_parameter_any_worker_used_with_the_average_and_skips_the_rest(mode):
    """Two workers' round (round mode, or an arrival shard's lockstep round): parameter 0 used
    by a only, parameter 1 by both, parameter 2 by neither. torch's step of DDP's averaged
    gradient: 0 gets a's half, 1 the mean, 2 keeps grad None."""
    _, make = _torch_rule_case("adam")
    torch.manual_seed(0)
    initial = torch.randn(16)
    params = _params(initial)
    ref = make(params)
    store = _round_store("adam", mode)
    store.values.copy_(initial)
    g = torch.Generator().manual_seed(2)
    for step in range(3):
        ga, gb = torch.randn(16, generator=g), torch.randn(16, generator=g)
        ga[10:] = 0
        gb[0:4] = gb[10:] = 0
        kw = dict(round_id=step + 1) if mode == "arrival" else {}
        store.push_dense("a", 0, 16, ga.numpy(), step, 8, 0, 1.0, idle=[[10, 16]], **kw)
        store.push_dense("b", 0, 16, gb.numpy(), step, 8, 0, 1.0, idle=[[0, 4], [10, 16]],
                         **kw)
        store.apply_round(step + 1 if mode == "arrival" else step)
        mean = (ga + gb) / 2
        for i, p in enumerate(params):
            p.grad = None if i == 2 else mean[EDGES[i]:EDGES[i + 1]].clone()
        ref.step()
        torch.testing.assert_close(store.values, _flat(params), rtol=1e-6, atol=1e-7)
    assert store.state["step"].tolist() == [3.0] * 10 + [0.0] * 6


def test_a_rule_of_the_servers_own_steps_every_key_as_before():
    store = ShardStore(KeyRange(0, 4), "float32", make_rule("sgd", 1.0), "arrival")
    assert store.round_idle is None
    store.push_dense("w", 0, 4, np.ones(4, np.float32), 0, 1, 0, 1.0, idle=[[0, 2]])
    assert store.values.tolist() == [-1.0] * 4
    with pytest.raises(ValueError, match="outside"):  # still checked
        store.push_dense("w", 2, 4, np.ones(2, np.float32), 0, 1, 0, 1.0, idle=[[0, 2]])


def test_a_push_with_every_key_idle_steps_nothing():
    store = _round_store("adam", "arrival")
    store.values.fill_(1.0)
    store.push_dense("w", 0, 16, np.ones(16, np.float32), 0, 1, 0, 1.0, idle=[[0, 16]])
    assert store.values.tolist() == [1.0] * 16 and store.version == 1
    assert torch.count_nonzero(store.state["step"]) == 0


# ---- the shard core: the field from the wire, refused when malformed ----------------------------
def _core(mode="arrival", optimizer="adam"):
    core = ShardCore(ShardSettings(rank=0, lo=0, hi=16, dtype="float32", apply_mode=mode,
                                   optimizer=optimizer, lr=0.1))
    core.handle(Init(None, 0, 16, np.zeros(16, np.float32)))
    return core


def _push_message(rid, idle, lo=0, hi=16, **extra):
    fields = {"range": [lo, hi], "step": 0, "version": 0, "batch": 1, **extra}
    if idle is not None:
        fields["idle"] = idle
    return Message("push", fields, [np.ones(hi - lo, np.float32)], rid=rid, src="w0")


def _received(msg):
    """The push as the shard's node makes an event of it, through the wire both ways (into
    writable frames: torch warns once when it wraps a read-only one)."""
    return EVENTS["push"](decode([bytearray(f) for f in encode(msg)]), (msg.src, msg.rid))


def _run(core, ev):
    out, queue = [], [ev]
    while queue:
        for item in core.handle(queue.pop(0)):
            (queue.append(item.event) if type(item) is Then else out.append(item))
    return out


@pytest.mark.parametrize("idle", [
    [[3, 1]], [[0, 4], [2, 6]], [[4, 6], [0, 2]], [[0, 0]], [[-1, 2]], [1, 2], [[1, 2, 3]],
    [[1.0, 2]], [[True, 2]], "0-4", {"0": 4}, [[0, 1 << 62]], [[2 * i, 2 * i + 1]
                                                            for i in range(MAX_RUNS + 1)]])
def test_a_malformed_idle_field_is_refused_by_the_wire(idle):
    with pytest.raises(WireError, match="'idle'"):
        _received(_push_message(1, idle))


def test_a_misplaced_idle_field_is_refused_with_an_error_reply_and_nothing_applied():
    core = _core()
    before = core.store.values.clone()
    out = _run(core, _received(_push_message(1, [[4, 8]], lo=8, hi=16)))
    assert [(r.op, r.fields["code"]) for r in out if type(r) is Reply] == [("error", "refused")]
    assert "outside the push's keys [8, 16)" in out[0].fields["msg"]
    assert torch.equal(core.store.values, before) and core.store.version == 0
    # The shard goes on serving: the next push of that sender is applied.
    out = _run(core, _received(_push_message(2, [[8, 12]], lo=8, hi=16)))
    assert [r.op for r in out] == ["ack"] and core.store.version == 1
    assert torch.equal(core.store.values[:12], before[:12])
    assert not torch.equal(core.store.values[12:], before[12:])


def test_the_most_runs_a_message_may_name_fit_its_header_at_the_largest_keys():
    base = (1 << 62) - 4 * MAX_RUNS
    runs = [[base + 2 * i, base + 2 * i + 1] for i in range(MAX_RUNS)]
    msg = _push_message(1, runs, lo=base, hi=base + 2 * MAX_RUNS,
                        hyper=[[g, {"lr": 0.1, "weight_decay": 0.01}] for g in range(20)])
    assert len(encode(msg)[0]) < MAX_HEADER_BYTES // 2 + MAX_HEADER_BYTES // 4
    assert _received(msg).idle == runs


def test_a_backup_fed_the_same_pushes_and_a_backup_synced_mid_round_match_the_primary():
    primary, mirror = _core("round"), _core("round")
    pushes = [_received(_push_message(1, [[0, 4], [10, 16]], round_size=2)),
              _received(Message("push", {"range": [0, 16], "step": 0, "version": 0,
                                         "batch": 1, "round_size": 2, "idle": [[10, 16]]},
                                [np.ones(16, np.float32)], rid=1, src="w1"))]
    _run(primary, pushes[0])
    _run(mirror, pushes[0])
    synced = _core("round")
    synced.handle(LoadSync([np.array(a) for a in sync_payload(primary)[1]]))
    for core in (primary, mirror, synced):
        _run(core, pushes[1])
        assert core.store.version == 1
        assert core.store.state["step"].tolist() == [1.0] * 10 + [0.0] * 6
        assert torch.equal(core.store.values[10:], torch.zeros(6))
    assert torch.equal(primary.store.values, mirror.store.values)
    assert torch.equal(primary.store.values, synced.store.values)
