"""Live resharding's pure parts: the plan (core/reshard_plan.py) checked against brute force,
and the coordinator's core (coordinator/reshard.py in CoordinatorState) driven by events."""

from __future__ import annotations

import random

import pytest

from paramserver.coordinator.events import (
    AppendEvent, AppendMetric, Clocked, DrainAsked, Heartbeat, Registered, Reply, Resharded,
    SendRelease, Started, TimePassed, ToServers,
)
from paramserver.coordinator.state import CoordinatorState
from paramserver.core.keyspace import KeyRange
from paramserver.core.reshard_plan import ReshardPlan, plan_drain, plan_join, weighted_cuts
from paramserver.spec.job import (
    CheckpointSpec, JobSpec, JobSpecError, Limits, ServerCount, SyncSpec, TableSpec,
)


def ranges_of(bounds):
    return tuple(KeyRange(a, b) for a, b in zip(bounds, bounds[1:]))


def random_layout(rng, num_keys, count):
    cuts = sorted(rng.sample(range(1, num_keys), count - 1))
    return ranges_of([0, *cuts, num_keys])


# ---- the plan -----------------------------------------------------------------------------------

def owner_of_each_key(ranges, owners):
    """key -> the server holding it (an old rank, or 'J' for the joiner), one by one."""
    out = []
    for r, o in zip(ranges, owners):
        out += ["J" if o is None else o] * r.size
    return out


@pytest.mark.parametrize("seed", range(30))
def test_moves_take_every_key_to_its_new_owner_once(seed):
    rng = random.Random(seed)
    num_keys = rng.randint(5, 60)
    old = random_layout(rng, num_keys, rng.randint(2, min(5, num_keys)))
    busy = [rng.random() for _ in old] if rng.random() < 0.7 else None
    plan = (plan_join(old, busy) if rng.random() < 0.5
            else plan_drain(old, rng.randrange(len(old)), busy))
    before = owner_of_each_key(old, range(len(old)))
    after = owner_of_each_key(plan.new, plan.owners)
    # Replay the moves key by key: each key that changes server moves exactly once, from the
    # old rank that held it to the server of its new rank.
    moved = {}
    for m in plan.moves:
        assert before[m.keys.lo:m.keys.hi] == [m.src] * m.keys.size
        for k in range(m.keys.lo, m.keys.hi):
            assert k not in moved
            moved[k] = "J" if plan.owners[m.dst] is None else plan.owners[m.dst]
    for k in range(num_keys):
        if k in moved:
            assert moved[k] == after[k] != before[k]
        else:
            assert after[k] == before[k]
    assert plan.moved_keys == sum(a != b for a, b in zip(before, after))


@pytest.mark.parametrize("seed", range(20))
def test_a_join_goes_where_it_moves_fewest_keys(seed):
    rng = random.Random(100 + seed)
    old = random_layout(rng, rng.randint(8, 50), rng.randint(1, 4))
    busy = [rng.random() for _ in old]
    plan = plan_join(old, busy)
    # Every placement of the joiner that keeps the old servers' order, on the same cuts.
    brute = min(ReshardPlan(old, plan.new, tuple([*range(at), None, *range(at, len(old))]))
                .moved_keys for at in range(len(old) + 1))
    assert plan.moved_keys == brute
    assert len(plan.new) == len(old) + 1 and plan.drained == []


def test_a_drain_gives_its_keys_to_its_neighbours_and_leaves():
    old = ranges_of([0, 30, 60, 90])
    plan = plan_drain(old, 1)
    assert plan.drained == [1] and plan.owners == (0, 2)
    assert plan.new == ranges_of([0, 45, 90])
    assert {(m.src, m.dst) for m in plan.moves} == {(1, 0), (1, 1)}
    with pytest.raises(ValueError, match="last server"):
        plan_drain(ranges_of([0, 9]), 0)


def cost_of(old, busy, r):
    """An independent sum of the per-key cost over range r (module note: half bytes, half
    the shard's busy share spread over its keys)."""
    n, total = old[-1].hi, sum(busy)
    c = 0.0
    for k in range(r.lo, r.hi):
        i = next(i for i, o in enumerate(old) if o.lo <= k < o.hi)
        c += 0.5 / n + 0.5 * busy[i] / total / old[i].size
    return c


@pytest.mark.parametrize("seed", range(15))
def test_cuts_balance_bytes_and_measured_load(seed):
    rng = random.Random(200 + seed)
    num_keys = rng.randint(200, 2000)
    old = random_layout(rng, num_keys, rng.randint(2, 5))
    busy = [rng.uniform(0.1, 5.0) for _ in old]
    count = rng.randint(2, 6)
    new = weighted_cuts(old, busy, count)
    costs = [cost_of(old, busy, r) for r in new]
    # Each range within one key's worth of cost of the ideal share (cuts are whole keys).
    worst_key = max(0.5 / num_keys + 0.5 * b / sum(busy) / o.size for o, b in zip(old, busy))
    for c in costs:
        assert abs(c - 1.0 / count) <= worst_key + 1e-9


def test_a_busier_shard_gives_away_more_keys():
    old = ranges_of([0, 500, 1000])
    even = plan_join(old, [1.0, 1.0])
    hot = plan_join(old, [9.0, 1.0])
    # The joiner lands beside the busy first shard, which keeps fewer keys than when even.
    assert hot.new[0].size < even.new[0].size
    assert weighted_cuts(old, None, 2) == old  # nothing measured: bytes alone


def test_cuts_prefer_layer_edges_nearby():
    old = ranges_of([0, 1000])
    assert weighted_cuts(old, None, 2, edges=(480,)) == ranges_of([0, 480, 1000])
    assert weighted_cuts(old, None, 2, edges=(300,)) == ranges_of([0, 500, 1000])


def test_every_range_keeps_a_key():
    old = ranges_of([0, 1, 3])
    for busy in ([100.0, 0.0], [0.0, 100.0], None):
        new = weighted_cuts(old, busy, 3)
        assert [r.size for r in new] == [1, 1, 1]


# ---- the job spec -------------------------------------------------------------------------------

def test_servers_min_max_in_the_job():
    assert ServerCount.parse("2:3") == ServerCount(2, 3)
    for bad in ("3:2", "2:2", "a:3", "0:2"):
        with pytest.raises(JobSpecError):
            ServerCount.parse(bad)
    job = JobSpec(servers=2, max_servers=3)
    assert job.elastic_servers and JobSpec.from_dict(job.to_dict()) == job
    assert JobSpec().to_dict()["max_servers"] == 0  # written out: a fixed server count
    with pytest.raises(JobSpecError, match="max_servers"):
        JobSpec(servers=2, max_servers=2)
    assert JobSpec(servers=2, max_servers=3, replicas=2).replicas == 2  # backups follow
    # Sparse tables move with the keys (their rows placed anew by the server count).
    with_table = JobSpec(servers=2, max_servers=3, tables=(TableSpec("emb", 4),))
    assert JobSpec.from_dict(with_table.to_dict()) == with_table


# ---- the coordinator --------------------------------------------------------------------------

HB = 5.0


def job_of(sync="bsp", **fields):
    fields = dict(dict(workers=2, servers=2, max_servers=3, batch_size=32, num_keys=100),
                  **fields)
    return JobSpec(sync=SyncSpec(sync), eval_interval=0.0,
                   limits=Limits(heartbeat_timeout=HB, start_timeout=60.0), **fields)


def kinds(out, kind):
    return [i for i in out if type(i) is kind]


def started_job(sync="bsp", **fields):
    state = CoordinatorState(job_of(sync, **fields))
    for r in range(state.job.servers):
        state.handle(Registered(f"s{r}", "server", 0.0, to=f"reg-s{r}", link=f"L{r}",
                                addr=f"tcp://h:{r + 1}"))
    for w in range(2):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"reg-w{w}"))
    state.handle(Started("w0", 0.5, to="st0"))
    out = state.handle(Started("w1", 0.6, to="st1"))
    assert len(kinds(out, SendRelease)) == 2
    return state


def join(state, t=1.0):
    return state.handle(Registered("new", "server", t, to="reg-new", link="LN",
                                   addr="tcp://h:9"))


def move_after_round_0(state):
    """Round 0 clocked by both workers (the quiet point), the move asked, and every server of
    the join (L0, L1 and the joiner LN) reporting epoch 1 moved."""
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    state.handle(TimePassed(1.3))
    for link in ("L0", "L1", "LN"):
        state.handle(Resharded("x", 1.4, 1, 1, link=link))


def test_a_server_joins_at_a_quiet_point_and_workers_get_the_new_map():
    state = started_job()
    out = join(state)
    assert not kinds(out, Reply)  # answered at the reshard, with its range
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    out = state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    # The round is applied; its releases are held: every worker waits, so the keys move.
    assert kinds(out, ToServers)[0].op == "apply_round" and not kinds(out, SendRelease)
    out = state.handle(TimePassed(1.3))
    reshard = [i for i in kinds(out, ToServers) if i.op == "reshard"]
    assert {link for i in reshard for link in i.links} == {"L0", "L1", "LN"}
    fields = reshard[0].fields
    assert fields["epoch"] == 1 and fields["version"] == 1
    assert fields["old"] == [[0, "tcp://h:1", 0, 50], [1, "tcp://h:2", 50, 100]]
    new = fields["layout"]
    assert [x[1] for x in new].count("tcp://h:9") == 1 and new[-1][3] == 100
    welcome = kinds(out, Reply)[0]
    assert welcome.to == "reg-new" and welcome.fields["handoff"] and welcome.fields["epoch"] == 1
    rank, _, lo, hi = next(x for x in new if x[1] == "tcp://h:9")
    assert welcome.fields["rank"] == rank
    assert welcome.fields["job"]["shard_range"] == [lo, hi]
    # Nothing goes out until every server of both layouts has its keys.
    assert not kinds(state.handle(Resharded("s0", 1.4, 1, 1, link="L0")), SendRelease)
    assert not kinds(state.handle(Resharded("s9", 1.4, 0, 1, link="LN")), SendRelease)  # stale
    assert not kinds(state.handle(Resharded("s1", 1.5, 1, 1, link="L1")), SendRelease)
    out = state.handle(Resharded("s2", 1.6, 1, 1, link="LN"))
    releases = kinds(out, SendRelease)
    assert [r.to for r in releases] == ["c0", "c1"]
    assert all(r.epoch == 1 and r.layout == new and r.step == 1 for r in releases)
    events = {i.kind: i.data for i in kinds(out, AppendEvent)}
    assert events["server_joined"]["servers"] == 3 and events["server_joined"]["epoch"] == 1
    assert any(m.record.get("change") == "server_joined" for m in kinds(out, AppendMetric))
    assert state.members.shard_map() == new
    assert [m.link for m in state.members.roster.servers.values()] == [
        {"tcp://h:1": "L0", "tcp://h:2": "L1", "tcp://h:9": "LN"}[x[1]] for x in new]
    # The next round's releases carry no map: the workers have it.
    state.handle(Clocked("w0", 1, 32, 0.1, 2.0, to="c0b"))
    out = state.handle(Clocked("w1", 1, 32, 0.1, 2.1, to="c1b"))
    assert all(r.layout is None for r in kinds(out, SendRelease))
    state.check_invariants()


def test_a_drain_moves_keys_to_the_others_then_stops_the_server():
    state = started_job()
    join(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    state.handle(TimePassed(1.3))
    for src, link in (("s0", "L0"), ("s1", "L1"), ("s2", "LN")):
        state.handle(Resharded(src, 1.4, 1, 1, link=link))
    assert len(state.members.roster.servers) == 3
    out = state.handle(DrainAsked("ops", 2.0, 0, to="d"))
    assert kinds(out, Reply)[0].op == "ok"
    # A second drain of a 3:2 job would go below MIN.
    out = state.handle(DrainAsked("ops", 2.0, 1, to="d2"))
    assert kinds(out, Reply)[0].op == "error"
    state.handle(Clocked("w0", 1, 32, 0.1, 2.1, to="c0"))
    state.handle(Clocked("w1", 1, 32, 0.1, 2.2, to="c1"))
    out = state.handle(TimePassed(2.3))
    fields = next(i for i in kinds(out, ToServers) if i.op == "reshard").fields
    assert fields["epoch"] == 2 and len(fields["layout"]) == 2
    assert "tcp://h:1" not in [x[1] for x in fields["layout"]]
    for link in ("L0", "L1", "LN"):
        out = state.handle(Resharded("x", 2.4, 2, 2, link=link))
    assert kinds(out, SendRelease) and kinds(out, AppendEvent)[0].kind == "server_drained"
    assert len(state.members.roster.servers) == 2
    # The drained server answers stragglers `moved` a little longer, then is told to stop.
    out = state.handle(TimePassed(2.4 + 2 * state.job.limits.heartbeat_interval + 0.01))
    stop = [i for i in kinds(out, ToServers) if i.op == "shutdown"]
    assert stop and stop[0].links == ("L0",)
    state.check_invariants()


def test_a_drained_server_beating_in_its_grace_is_answered_not_told_to_register_again():
    """After the commit a drained server still beats until its shutdown; answered `unknown`,
    it took the coordinator for a restarted one, asked to be taken back, was refused and
    exited 2 (refused input) instead of 0 at the shutdown."""
    state = started_job()
    join(state)
    move_after_round_0(state)
    state.handle(DrainAsked("ops", 2.0, 2, to="d"))  # the last rank: its name leaves the roster
    state.handle(Clocked("w0", 1, 32, 0.1, 2.1, to="c0"))
    state.handle(Clocked("w1", 1, 32, 0.1, 2.2, to="c1"))
    state.handle(TimePassed(2.3))
    drained = next(m for m in state.members.roster.servers.values() if m.rank == 2)
    for link in ("L0", "L1", "LN"):
        out = state.handle(Resharded("x", 2.4, 2, 2, link=link))
    assert kinds(out, AppendEvent)[0].kind == "server_drained"
    assert "s2" not in state.members.roster.servers
    out = state.handle(Heartbeat("s2", 2.5, to="hb-drained", link=drained.link))
    assert [(r.to, r.op) for r in kinds(out, Reply)] == [("hb-drained", "ok")]
    out = state.handle(TimePassed(2.4 + 2 * state.job.limits.heartbeat_interval + 0.01))
    assert [i.links for i in kinds(out, ToServers) if i.op == "shutdown"] == [(drained.link,)]
    # Once told to stop, a beat from that connection is a stranger's again.
    out = state.handle(Heartbeat("s2", 5.0, to="hb-late", link=drained.link))
    assert [r.fields.get("code") for r in kinds(out, Reply)] == ["unknown"]
    state.check_invariants()


def test_arrival_mode_fences_every_worker_before_moving():
    state = started_job("asp")
    join(state)
    out = state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    assert not kinds(out, SendRelease)  # held
    assert not [i for i in kinds(state.handle(TimePassed(1.15)), ToServers)
                if i.op == "reshard"]  # w1 computes still
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    out = state.handle(TimePassed(1.3))
    fields = next(i for i in kinds(out, ToServers) if i.op == "reshard").fields
    assert fields["version"] == 0  # arrival mode: each server takes its pieces' newest


def test_a_fence_that_never_comes_gives_the_join_up_and_releases_the_workers():
    state = started_job("asp")
    join(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(TimePassed(1.2))
    # w1 keeps beating but never clocks past the fence limit.
    limit = state.job.limits.server_timeout
    state.handle(Heartbeat("w1", 1.2 + limit / 2, to="hb"))
    out = state.handle(TimePassed(1.2 + limit + 0.1))
    assert [r.to for r in kinds(out, SendRelease)] == ["c0"]
    refused = [i for i in kinds(out, Reply) if i.to == "reg-new"]
    assert refused and refused[0].op == "error"
    assert any(i.kind == "reshard_refused" for i in kinds(out, AppendEvent))


def test_joins_beyond_max_and_asks_in_fixed_jobs_are_refused():
    state = started_job()
    join(state)
    out = state.handle(Registered("new2", "server", 1.0, to="reg-2", link="L9",
                                  addr="tcp://h:10"))
    assert kinds(out, Reply)[0].op == "error" and "most servers" in kinds(
        out, Reply)[0].fields["msg"]
    fixed = CoordinatorState(job_of(max_servers=0))
    out = fixed.handle(DrainAsked("ops", 0.0, 0, to="d"))
    assert kinds(out, Reply)[0].op == "error"


def test_a_worker_hears_the_map_in_heartbeat_answers_once_keys_moved():
    state = started_job()
    out = state.handle(Heartbeat("w0", 0.9, to="hb0"))
    assert "layout" not in kinds(out, Reply)[0].fields
    join(state)
    move_after_round_0(state)
    out = state.handle(Heartbeat("w0", 1.5, to="hb1"))
    assert kinds(out, Reply)[0].fields == {"epoch": 1, "layout": state.members.shard_map()}


# ---- checkpoints of a job whose servers came and went -----------------------------------------

def test_a_checkpoint_is_read_back_with_the_server_count_it_was_taken_with(tmp_path):
    import numpy as np

    from paramserver.runlog.checkpoint_set import (
        CheckpointError, check_checkpoint, save_coordinator_state)
    from paramserver.runlog.model_file import checkpoint_flat
    from paramserver.server.checkpoint import write_shard

    flat = np.arange(30, dtype=np.float32)
    cuts = [(0, 7), (7, 19), (19, 30)]  # three servers at the checkpoint, the job started two
    for rank, (lo, hi) in enumerate(cuts):
        write_shard(str(tmp_path), "000000005", rank, {"values": flat[lo:hi].copy()},
                    {"version": 5, "range": [lo, hi], "dtype": "float32", "updates_applied": 5})
    state = {"rounds_applied": 5, "samples_done": 0, "steps_done": 0, "num_keys": 30,
             "worker_samples": {}, "elapsed_s": 0.0}
    save_coordinator_state(tmp_path, "000000005", {**state, "servers": 3})
    assert check_checkpoint(tmp_path, "000000005", 2, "float32") == 3
    np.testing.assert_array_equal(checkpoint_flat(tmp_path, "000000005", 2, "float32"), flat)
    # Without the count recorded, the job's two are read, and the third part is missed.
    save_coordinator_state(tmp_path, "000000006", state)
    for rank, (lo, hi) in enumerate(cuts):
        write_shard(str(tmp_path), "000000006", rank, {"values": flat[lo:hi].copy()},
                    {"version": 6, "range": [lo, hi], "dtype": "float32", "updates_applied": 6})
    with pytest.raises(CheckpointError, match="hold keys"):
        check_checkpoint(tmp_path, "000000006", 2, "float32")


def test_servers_beating_under_their_new_names_before_the_commit_are_no_strangers():
    state = started_job()
    join(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    state.handle(TimePassed(1.3))
    # The joiner got rank 2 (or another); it beats before the roster knows it.
    for src, link in (("s2", "LN"), ("s1", "L0")):
        out = state.handle(Heartbeat(src, 1.35, to="hb", link=link))
        assert [r.op for r in kinds(out, Reply)] == ["ok"]
    # A stranger still hears `unknown` (a coordinator restart's signal to register again).
    out = state.handle(Heartbeat("s7", 1.35, to="hb", link="LX"))
    assert kinds(out, Reply)[0].fields.get("code") == "unknown"


def test_a_join_asked_once_the_budget_is_spent_is_refused_at_once():
    state = CoordinatorState(job_of(max_samples=64))
    for r in range(2):
        state.handle(Registered(f"s{r}", "server", 0.0, to=f"reg-s{r}", link=f"L{r}",
                                addr=f"tcp://h:{r + 1}"))
    for w in range(2):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"reg-w{w}"))
    state.handle(Started("w0", 0.5, to="st0"))
    state.handle(Started("w1", 0.6, to="st1"))
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    assert state.stopping
    join(state, t=1.3)
    out = state.handle(TimePassed(1.4))
    refused = [i for i in kinds(out, Reply) if i.to == "reg-new"]
    assert refused and refused[0].op == "error" and "ending" in refused[0].fields["msg"]
    assert not state.reshard.holding


def test_a_moving_shard_takes_frames_as_large_as_the_whole_key_space():
    state = CoordinatorState(job_of(num_keys=4_000_000))
    out = state.handle(Registered("s0", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    limit = kinds(out, Reply)[0].fields["job"]["max_message_bytes"]
    assert limit == state.job.message_limit(None) > state.job.message_limit(2_000_000)
    fixed = CoordinatorState(job_of(num_keys=4_000_000, max_servers=0))
    out = fixed.handle(Registered("s0", "server", 0.0, to="r0", link="L0", addr="tcp://h:1"))
    assert kinds(out, Reply)[0].fields["job"]["max_message_bytes"] == \
        fixed.job.message_limit(2_000_000)


def test_a_resumed_shard_is_cut_from_a_checkpoint_taken_on_another_layout(tmp_path):
    import numpy as np

    from paramserver.runlog.checkpoint_set import save_coordinator_state
    from paramserver.optim import make_rule
    from paramserver.server.checkpoint import read_shard, write_shard
    from paramserver.server.store import ShardStore

    values = np.arange(30, dtype=np.float64)
    momentum = -np.arange(30, dtype=np.float64)
    cuts = [(0, 7), (7, 19), (19, 30)]  # three servers at the checkpoint
    for rank, (lo, hi) in enumerate(cuts):
        write_shard(str(tmp_path), "000000009", rank,
                    {"values": values[lo:hi].copy(), "state.momentum": momentum[lo:hi].copy()},
                    {"version": 9 - rank, "range": [lo, hi], "dtype": "float64",
                     "updates_applied": 9, "rule": "momentum"})
    save_coordinator_state(tmp_path, "000000009", {
        "rounds_applied": 9, "samples_done": 0, "steps_done": 0, "num_keys": 30,
        "worker_samples": {}, "elapsed_s": 0.0, "servers": 3})
    # The resumed job starts two servers: shard 0 holds [0, 15), shard 1 [15, 30).
    for rank, (lo, hi, version) in enumerate([(0, 15, 9), (15, 30, 8)]):
        store = ShardStore(KeyRange(lo, hi), "float64", make_rule("momentum", 0.1), "arrival")
        arrays, meta = read_shard(str(tmp_path), "000000009", rank, store)
        np.testing.assert_array_equal(arrays["values"], values[lo:hi])
        np.testing.assert_array_equal(arrays["state.momentum"], momentum[lo:hi])
        # (the newest version of the parts it was cut from)
        assert meta["range"] == [lo, hi] and meta["version"] == version
        assert meta["applied"] == []
        store.restore(arrays, meta)
        np.testing.assert_array_equal(store.values.numpy(), values[lo:hi])
    # A part that lost a file is refused, not silently filled with zeros.
    (tmp_path / "ckpt-000000009" / "server-1" / "values.npy").unlink()
    store = ShardStore(KeyRange(0, 15), "float64", make_rule("momentum", 0.1), "arrival")
    with pytest.raises(Exception, match="values"):
        read_shard(str(tmp_path), "000000009", 0, store)


def test_a_resumed_shards_tables_are_gathered_from_a_checkpoint_taken_on_another_count(
        tmp_path):
    """Tables saved by three servers, resumed on two: each shard's rows are those the two
    place on it, from whichever part held them, exact; a part of another table configuration
    is refused naming the table."""
    import numpy as np

    from paramserver.optim import make_rule
    from paramserver.runlog.checkpoint_set import save_coordinator_state
    from paramserver.server.checkpoint import read_shard, write_shard
    from paramserver.server.store import ShardStore
    from paramserver.server.tables import ShardTables
    from paramserver.sparse.placement import shard_of
    from paramserver.sparse.table import SparseTable

    spec = TableSpec("emb", 3, row_budget=900, admit_after=2)
    keys = np.arange(-200, 200, 7, dtype=np.int64)
    rng = np.random.default_rng(0)
    reference = SparseTable.of(spec, 900)
    three = [ShardTables((spec,), 3) for _ in range(3)]  # the shards the checkpoint saw
    for batch in (keys, keys[:40], keys[::2]):  # the odd keys past 40: pushed once
        grads = rng.standard_normal((len(batch), 3)).astype(np.float32)
        reference.push(batch, grads)
        owner = shard_of(batch, 3)
        for r, shard in enumerate(three):
            shard.tables["emb"].push(batch[owner == r], grads[owner == r])
    values = np.arange(30, dtype=np.float64)
    for rank, (lo, hi) in enumerate([(0, 7), (7, 19), (19, 30)]):
        write_shard(str(tmp_path), "000000009", rank,
                    {"values": values[lo:hi].copy(), **three[rank].snapshot()},
                    {"version": 9, "range": [lo, hi], "dtype": "float64",
                     "updates_applied": 9, "rule": "sgd"})
    save_coordinator_state(tmp_path, "000000009", {
        "rounds_applied": 9, "samples_done": 0, "steps_done": 0, "num_keys": 30,
        "worker_samples": {}, "elapsed_s": 0.0, "servers": 3})
    owner = shard_of(keys, 2)
    for rank, (lo, hi) in enumerate([(0, 15), (15, 30)]):
        store = ShardStore(KeyRange(lo, hi), "float64", make_rule("sgd", 0.1), "arrival")
        tables = ShardTables((spec,), 2)
        arrays, meta = read_shard(str(tmp_path), "000000009", rank, store, tables, 2)
        tables.restore(arrays)
        np.testing.assert_array_equal(arrays["values"], values[lo:hi])
        mine = keys[owner == rank]
        np.testing.assert_array_equal(tables.pull("emb", mine), reference.pull(mine))
        assert tables.tables["emb"].config.capacity == 450
        # The counts of keys seen once went along: a second push admits them on each shard.
        once = np.setdiff1d(keys[1::2], keys[:40])
        batch = once[shard_of(once, 2) == rank]
        grads = np.ones((len(batch), 3), np.float32)
        tables.tables["emb"].push(batch, grads)
        reference.push(batch, grads)
        np.testing.assert_array_equal(tables.pull("emb", batch), reference.pull(batch))
        assert len(tables.tables["emb"]) == len(np.unique(keys[owner == rank]))
    # Another table configuration in a part (admission after 3) is refused, naming the table.
    other = ShardTables((TableSpec("emb", 3, row_budget=900, admit_after=3),), 3)
    write_shard(str(tmp_path), "000000010", 0, {"values": values[0:7].copy(),
                                                **other.snapshot()},
                {"version": 9, "range": [0, 7], "dtype": "float64", "updates_applied": 9,
                 "rule": "sgd"})
    for rank, (lo, hi) in enumerate([(7, 19), (19, 30)], start=1):
        write_shard(str(tmp_path), "000000010", rank,
                    {"values": values[lo:hi].copy(), **three[rank].snapshot()},
                    {"version": 9, "range": [lo, hi], "dtype": "float64",
                     "updates_applied": 9, "rule": "sgd"})
    save_coordinator_state(tmp_path, "000000010", {
        "rounds_applied": 9, "samples_done": 0, "steps_done": 0, "num_keys": 30,
        "worker_samples": {}, "elapsed_s": 0.0, "servers": 3})
    store = ShardStore(KeyRange(0, 15), "float64", make_rule("sgd", 0.1), "arrival")
    with pytest.raises(Exception, match="emb"):
        read_shard(str(tmp_path), "000000010", 0, store, ShardTables((spec,), 2), 2)


def replicated_after_a_join():
    """A --servers 2:3 --replicas 2 job whose two primaries (tcp://h:1, tcp://h:2; backups
    tcp://b:1, tcp://b:2) took a third server (tcp://h:9, the middle range) at epoch 1; the
    backups synced again under their primaries' new ranks 0 and 2."""
    from paramserver.coordinator.events import ReplicaReport
    state = CoordinatorState(job_of("asp", replicas=2))

    def synced(now):
        for r, b in state.replicas.backups.items():
            primary = state.members.roster.servers[f"s{r}"]
            state.handle(ReplicaReport("backup_synced", f"s{r}", now, link=primary.link,
                                       fields={"rank": r, "epoch": b.epoch, "version": 0}))

    for r in range(2):
        state.handle(Registered(f"s{r}", "server", 0.0, to=f"reg-s{r}", link=f"L{r}",
                                addr=f"tcp://h:{r + 1}"))
        state.handle(Registered("server", "server", 0.0, to=f"reg-b{r}", link=f"LB{r}",
                                addr=f"tcp://b:{r + 1}", backup=True))
    synced(0.05)
    for w in range(2):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"reg-w{w}"))
    state.handle(Started("w0", 0.5, to="st0"))
    state.handle(Started("w1", 0.6, to="st1"))
    join(state)  # tcp://h:9 takes the middle range
    move_after_round_0(state)
    assert {r: b.addr for r, b in state.replicas.backups.items()} == {0: "tcp://b:1",
                                                                     2: "tcp://b:2"}
    synced(1.45)
    return state


def test_a_backup_promoted_during_a_drains_fence_is_drained_in_its_primarys_place():
    """--servers 2:3 --replicas 2: a third server joins (the backups follow their primaries'
    ranks), then shard 0's primary dies while a drain of it waits for the fence. Its backup
    is promoted under a new shard-map epoch (heartbeat answers carry the layout and the
    promoted shard, so a push in flight goes to it), the move names the backup in the old
    layout and drains it, and the others' backups follow their primaries' new ranks."""
    state = replicated_after_a_join()
    state.handle(DrainAsked("ops", 1.5, 0, to="d"))
    state.handle(Clocked("w1", 1, 32, 0.1, 1.6, to="c1"))  # w0's push hangs at the dead s0
    for t in (2.0, 3.5, 5.0, 6.0):  # everyone but s0 beats
        for src, link in (("s1", "LN"), ("s2", "L1"), ("b0", "LB0"), ("b2", "LB1")):
            state.handle(Heartbeat(src, t, to="hb", link=link))
        state.handle(Heartbeat("w0", t, to="hb"))
        state.handle(Heartbeat("w1", t, to="hb"))
    out = state.handle(TimePassed(1.4 + HB + 0.1))  # s0 silent past the heartbeat timeout
    promote = next(i for i in kinds(out, ToServers) if i.op == "promote")
    assert promote.links == ("LB0",) and state.reshard.epoch == promote.fields["epoch"] == 2
    beat = next(r for r in kinds(state.handle(Heartbeat("w0", 6.6, to="hb")), Reply))
    assert beat.fields["epoch"] == 2 and beat.fields["shards"] == [[0, "tcp://b:1"]]
    assert [x[1] for x in beat.fields["layout"]] == ["tcp://b:1", "tcp://h:9", "tcp://h:2"]
    out = state.handle(Clocked("w0", 1, 32, 0.1, 6.7, to="c0"))  # resent to b0: acked
    out += state.handle(TimePassed(6.8))
    fields = next(i for i in kinds(out, ToServers) if i.op == "reshard").fields
    assert fields["epoch"] == 3
    assert [x[1] for x in fields["old"]] == ["tcp://b:1", "tcp://h:9", "tcp://h:2"]
    assert [x[1] for x in fields["layout"]] == ["tcp://h:9", "tcp://h:2"]  # b0 drained
    for link in ("LB0", "LN", "L1"):
        out = state.handle(Resharded("x", 6.9, 3, 2, link=link))
    assert any(i.kind == "server_drained" for i in kinds(out, AppendEvent))
    attaches = sorted((i.fields["rank"], i.fields["addr"], i.links)
                      for i in kinds(out, ToServers) if i.op == "attach_backup")
    assert attaches == [(1, "tcp://b:2", ("L1",))]  # the joiner (rank 0 now) has none
    state.check_invariants()


def test_a_move_that_loses_a_primary_to_its_backup_starts_again_under_the_next_epoch():
    """As above, but shard 2's primary dies after the move began: when its backup is
    promoted the same move goes again under the next epoch, naming the backup; reports of
    the given-up move are ignored; the commit tells every server to serve its new range."""
    state = replicated_after_a_join()
    state.handle(DrainAsked("ops", 1.5, 0, to="d"))
    state.handle(Clocked("w0", 1, 32, 0.1, 1.6, to="c0"))
    state.handle(Clocked("w1", 1, 32, 0.1, 1.6, to="c1"))
    first = next(i for i in kinds(state.handle(TimePassed(1.7)), ToServers)
                 if i.op == "reshard").fields
    assert first["epoch"] == 2 and [x[1] for x in first["old"]][2] == "tcp://h:2"
    state.handle(Resharded("x", 1.8, 2, 2, link="L0"))  # s0 and the joiner report; s2 dies
    state.handle(Resharded("x", 1.8, 2, 2, link="LN"))
    for t in (2.0, 3.5, 5.0, 6.0):
        for src, link in (("s0", "L0"), ("s1", "LN"), ("b0", "LB0"), ("b2", "LB1")):
            state.handle(Heartbeat(src, t, to="hb", link=link))
        state.handle(Heartbeat("w0", t, to="hb"))
        state.handle(Heartbeat("w1", t, to="hb"))
    out = state.handle(TimePassed(1.4 + HB + 0.1))  # s2 silent: b2 promoted, the move again
    assert next(i for i in kinds(out, ToServers) if i.op == "promote").links == ("LB1",)
    again = [i for i in kinds(out, ToServers) if i.op == "reshard"]
    assert again and again[0].fields["epoch"] == 3
    assert [x[1] for x in again[0].fields["old"]] == ["tcp://h:1", "tcp://h:9", "tcp://b:2"]
    assert [x[1] for x in again[0].fields["layout"]] == ["tcp://h:9", "tcp://b:2"]
    assert "LB1" in again[0].links and "L1" not in again[0].links
    assert any(i.kind == "reshard_moving" and i.data.get("again") for i in kinds(out,
                                                                                 AppendEvent))
    assert not kinds(state.handle(Resharded("x", 6.7, 2, 2, link="L0")), AppendEvent)  # stale
    for link in ("L0", "LN", "LB1"):
        out = state.handle(Resharded("x", 6.8, 3, 2, link=link))
    commit = next(i for i in kinds(out, ToServers) if i.op == "reshard_commit")
    assert commit.fields == {"epoch": 3} and set(commit.links) == {"L0", "LN", "LB1"}
    assert any(i.kind == "server_drained" for i in kinds(out, AppendEvent))
    assert [m.addr for m in sorted(state.members.roster.servers.values(),
                                   key=lambda m: m.rank)] == ["tcp://h:9", "tcp://b:2"]
    state.check_invariants()


def test_a_move_that_never_finishes_is_given_up_and_every_server_keeps_its_old_range():
    """The joiner dies while keys move (it never says `resharded`): past the move's limit the
    coordinator gives the move up instead of the job. The old servers are told
    `reshard_abort` (they kept their old cores until a commit), the joiner `shutdown`, the
    held releases go, and the next join moves under a later epoch."""
    state = started_job()
    join(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    moved = next(i for i in kinds(state.handle(TimePassed(1.3)), ToServers)
                 if i.op == "reshard").fields
    assert moved["epoch"] == 1
    for src, link in (("s0", "L0"), ("s1", "L1")):  # the old servers report; the joiner not
        state.handle(Resharded(src, 1.4, 1, 1, link=link))
    limit = state.job.limits.server_timeout
    for t in (1.5 + k * HB / 2 for k in range(int(2 * limit / HB) + 1)):
        for src, link in (("s0", "L0"), ("s1", "L1")):
            state.handle(Heartbeat(src, t, to="hb", link=link))
        for w in ("w0", "w1"):
            state.handle(Heartbeat(w, t, to="hb"))
    out = state.handle(TimePassed(1.3 + limit + 0.1))
    sends = {i.op: i for i in kinds(out, ToServers)}
    assert sends["reshard_abort"].fields == {"epoch": 1}
    assert set(sends["reshard_abort"].links) == {"L0", "L1"}
    assert sends["shutdown"].links == ("LN",)
    assert sorted(r.to for r in kinds(out, SendRelease)) == ["c0", "c1"]
    for r in kinds(out, SendRelease):  # the map is the old one (under the spent epoch)
        assert r.layout is None or [x[1] for x in r.layout] == ["tcp://h:1", "tcp://h:2"]
    assert any(i.kind == "reshard_refused" for i in kinds(out, AppendEvent))
    assert not any(i.kind == "job_failed" for i in kinds(out, AppendEvent))
    assert len(state.members.roster.servers) == 2 and state.reshard.running is None
    # The given-up move's late report changes nothing; the next join moves under epoch 2.
    assert not kinds(state.handle(Resharded("s2", 40.0, 1, 1, link="LN")), ToServers)
    state.handle(Registered("new2", "server", 40.1, to="reg-2", link="L9", addr="tcp://h:10"))
    state.handle(Clocked("w0", 1, 32, 0.1, 40.2, to="c0b"))
    state.handle(Clocked("w1", 1, 32, 0.1, 40.3, to="c1b"))
    again = next(i for i in kinds(state.handle(TimePassed(40.4)), ToServers)
                 if i.op == "reshard").fields
    assert again["epoch"] == 2
    state.check_invariants()


def test_a_server_restarted_after_keys_moved_is_welcomed_with_the_map_and_restores(tmp_path):
    """--servers 2:3 --restart-servers: a server that dies after a join comes back at its
    address (the launcher restarts it there) with its current rank's range to restore from
    the latest checkpoint (cut anew from the parts if it was taken on another layout) and
    the shard map, so it refuses requests for other keys `moved`."""
    state = started_job(restart_servers=1,
                        checkpoint=CheckpointSpec(dir=str(tmp_path), every=1000))
    from paramserver.coordinator.events import ShardSaved
    for src in ("s0", "s1"):  # checkpoint 0, the initial values, is on disk
        state.handle(ShardSaved(src, "000000000", 0.7, to="x"))
    state.schedule.latest = "000000005"  # (and a later one was committed)
    join(state)
    move_after_round_0(state)
    layout = state.members.shard_map()
    assert state.reshard.epoch == 1 and len(layout) == 3
    out = state.handle(Registered("s-new", "server", 2.0, to="reg-again", link="L0b",
                                  addr="tcp://h:1"))  # s0's address: the old process is gone
    welcome = next(r for r in kinds(out, Reply) if r.to == "reg-again")
    assert welcome.op == "welcome" and welcome.fields["rank"] == 0
    assert welcome.fields["epoch"] == 1 and welcome.fields["layout"] == layout
    job = welcome.fields["job"]
    assert job["shard_range"] == layout[0][2:4] and job["restore"]["tag"] == "000000005"
    assert any(i.kind == "server_rejoined" for i in kinds(out, AppendEvent))


# ---- a joiner's registration sent again (its connection came back) ----------------------------

def test_a_joiner_asking_again_while_queued_or_fencing_is_welcomed_on_its_newest_connection():
    """A joiner not welcomed yet sends its registration again when its connection to the
    coordinator comes back (a blip, or a restarted coordinator at the same address): the old
    reply token and connection are dead, so the welcome and the move go to the new ones. It
    used to be refused ("already asked") and the joiner exited."""
    state = started_job()
    join(state)  # queued: the fence begins at the next look
    out = state.handle(Registered("new", "server", 1.05, to="reg-new-2", link="LN2",
                                  addr="tcp://h:9"))
    assert not kinds(out, Reply)
    assert [i.data for i in kinds(out, AppendEvent)] == [{"addr": "tcp://h:9", "again": True}]
    state.handle(TimePassed(1.06))
    assert state.reshard.running is not None and state.reshard.running.moving_since is None
    out = state.handle(Registered("new", "server", 1.07, to="reg-new-3", link="LN3",
                                  addr="tcp://h:9"))  # fencing
    assert not kinds(out, Reply)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0"))
    state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    out = state.handle(TimePassed(1.3))
    assert [r.to for r in kinds(out, Reply)] == ["reg-new-3"]
    assert {link for i in kinds(out, ToServers) if i.op == "reshard" for link in i.links} == {
        "L0", "L1", "LN3"}
    # Once keys move it was welcomed: a repeat is refused, the move goes on.
    out = state.handle(Registered("new", "server", 1.35, to="reg-new-4", link="LN4",
                                  addr="tcp://h:9"))
    assert [(r.to, r.op) for r in kinds(out, Reply)] == [("reg-new-4", "error")]
    for link in ("L0", "L1", "LN3"):
        out = state.handle(Resharded("x", 1.4, 1, 1, link=link))
    assert [i.kind for i in kinds(out, AppendEvent)] == ["server_joined"]
    assert state.members.server_at("tcp://h:9").link == "LN3"
    state.check_invariants()


def test_a_server_asking_to_join_while_its_drain_waits_is_refused():
    state = started_job()
    join(state)
    move_after_round_0(state)
    state.handle(DrainAsked("ops", 2.0, 0, to="d"))
    out = state.handle(Registered("again", "server", 2.1, to="reg-x", link="LX",
                                  addr=state.members.roster.servers["s0"].addr))
    assert [(r.to, r.op) for r in kinds(out, Reply)] == [("reg-x", "error")]


# ---- ... to a coordinator restarted while its ask waited ---------------------------------------

TAKEN = {"rounds_applied": 1, "samples_done": 64, "steps_done": 2, "policy": {"round": 1},
         "worker_samples": {"0": 32, "1": 32}, "sync": "bsp", "num_keys": 100}
FIRST = [{"event": "start"},
         {"event": "server_joined", "rank": 0, "addr": "tcp://h:1"},
         {"event": "server_joined", "rank": 1, "addr": "tcp://h:2"},
         {"event": "server_join_asked", "addr": "tcp://h:9"},
         {"event": "reshard_fence", "kind": "join", "addr": "tcp://h:9"}]


def restarted(log=FIRST, **fields):
    from paramserver.coordinator.replica_history import ReplicaHistory
    return CoordinatorState(job_of(**fields), None, None, take_back=dict(TAKEN), elapsed=9.0,
                            replica_history=ReplicaHistory.of(log))


def server_back(state, rank, t, moving=0):
    rejoin = {"rank": rank, "lo": 50 * rank, "hi": 50 * rank + 50, "version": 1}
    if moving:
        rejoin["moving"] = moving
    return state.handle(Registered(f"s{rank}", "server", t, to=f"rb{rank}", link=f"L{rank}",
                                   addr=f"tcp://h:{rank + 1}", rejoin=rejoin))


def worker_back(state, w, t):
    return state.handle(Registered(f"w{w}", "worker", t, to=f"rw{w}",
                                   rejoin={"rank": w, "step": 1, "clocked": False,
                                           "samples": 32}))


def test_the_log_says_where_the_servers_were():
    from paramserver.coordinator.replica_history import ReplicaHistory
    assert ReplicaHistory.of(FIRST).servers == {0: "tcp://h:1", 1: "tcp://h:2"}
    moved = FIRST + [{"event": "server_joined", "addr": "tcp://h:9", "rank": 1, "epoch": 1,
                      "layout": [[0, "tcp://h:1", 0, 40], [1, "tcp://h:9", 40, 70],
                                 [2, "tcp://h:2", 70, 100]]},
                     {"event": "replica_promoted", "rank": 0, "addr": "tcp://h:5", "epoch": 2}]
    assert ReplicaHistory.of(moved).servers == {0: "tcp://h:5", 1: "tcp://h:9",
                                                2: "tcp://h:2"}
    assert ReplicaHistory.of(moved + [{"event": "start"}]).servers == {}


def test_a_joiner_asking_again_of_a_restarted_coordinator_is_fenced_afresh_after_the_take_back():
    """The coordinator died while it fenced for a joiner (no key had moved). The joiner's
    registration, sent again as its connection came back, is no server restarted in a dead
    one's place: it used to count as one, so with s0 back the take-back rebuilt without s1
    and made the joiner shard 1 from a checkpoint (none here: the job failed). It waits for
    the rebuild and is then asked, fenced and moved afresh."""
    state = restarted()
    out = state.handle(Registered("server", "server", 0.05, to="reg-new", link="LN",
                                  addr="tcp://h:9"))
    assert out == []
    server_back(state, 0, 0.1)
    worker_back(state, 0, 0.2)
    out = worker_back(state, 1, 0.3)
    assert not [i for i in kinds(out, AppendEvent) if i.kind == "taken_back"]  # s1 awaited
    out = server_back(state, 1, 0.4)
    events = [i.kind for i in kinds(out, AppendEvent)]
    assert events.index("taken_back") < events.index("server_join_asked")
    assert not [i for i in kinds(out, Reply) if i.to == "reg-new"]
    state.handle(TimePassed(0.5))
    assert state.reshard.running.ask.link == "LN"  # fenced afresh
    state.handle(Clocked("w0", 1, 32, 0.1, 0.6, to="c0"))
    state.handle(Clocked("w1", 1, 32, 0.1, 0.7, to="c1"))
    out = state.handle(TimePassed(0.8))
    welcome = [i for i in kinds(out, Reply) if i.to == "reg-new"]
    assert welcome and welcome[0].fields["epoch"] == 1 and welcome[0].fields["handoff"]
    for link in ("L0", "L1", "LN"):
        out = state.handle(Resharded("x", 0.9, 1, 2, link=link))
    joined = [i.data for i in kinds(out, AppendEvent) if i.kind == "server_joined"]
    assert joined and joined[0]["servers"] == 3 and joined[0]["addr"] == "tcp://h:9"
    assert sorted(r.to for r in kinds(out, SendRelease)) == ["c0", "c1"]
    state.check_invariants()


def test_after_a_move_the_dead_coordinator_never_committed_a_joiner_is_fenced_afresh():
    """The dead coordinator was moving keys for a drain, a join queued behind it. The
    servers back are told `reshard_abort` of that move (its epoch spent); the joiner, asked
    again, is fenced and moved under the next epoch from the servers' old ranges."""
    log = FIRST[:3] + [{"event": "server_drain_asked", "rank": 1, "addr": "tcp://h:2",
                        "by": "ops"},
                       {"event": "server_join_asked", "addr": "tcp://h:9"}]
    state = restarted(log)
    out = server_back(state, 0, 0.1, moving=1)
    assert [i.fields for i in kinds(out, ToServers)] == [{"epoch": 1}]
    state.handle(Registered("server", "server", 0.15, to="reg-new", link="LN",
                            addr="tcp://h:9"))
    server_back(state, 1, 0.2, moving=1)
    worker_back(state, 0, 0.3)
    out = worker_back(state, 1, 0.4)
    assert [i.kind for i in kinds(out, AppendEvent)
            if i.kind in ("taken_back", "server_join_asked")] == ["taken_back",
                                                                  "server_join_asked"]
    state.handle(TimePassed(0.5))
    state.handle(Clocked("w0", 1, 32, 0.1, 0.6, to="c0"))
    state.handle(Clocked("w1", 1, 32, 0.1, 0.7, to="c1"))
    out = state.handle(TimePassed(0.8))
    moved = next(i for i in kinds(out, ToServers) if i.op == "reshard").fields
    assert moved["epoch"] == 2 and moved["old"] == [[0, "tcp://h:1", 0, 50],
                                                     [1, "tcp://h:2", 50, 100]]
    for link in ("L0", "L1", "LN"):
        out = state.handle(Resharded("x", 0.9, 2, 2, link=link))
    assert [i.data["epoch"] for i in kinds(out, AppendEvent) if i.kind == "server_joined"] == [2]
    # The drain the dead coordinator was asked for is asked again, after the join.
    assert "tcp://h:2" in {a.addr for a in state.reshard.asks}
    state.check_invariants()


def test_a_server_restarted_at_its_address_during_the_take_back_still_stands_in(tmp_path):
    """--servers 2:3 --restart-servers: s1 died with the coordinator and the launcher
    restarted it at its address: it stands for shard 1 and is restored, as before."""
    state = restarted(restart_servers=1, checkpoint=CheckpointSpec(dir=str(tmp_path), every=1000))
    state.schedule.latest = "000000001"
    server_back(state, 0, 0.1)
    worker_back(state, 0, 0.2)
    worker_back(state, 1, 0.3)
    out = state.handle(Registered("server", "server", 0.4, to="reg-s1", link="L1b",
                                  addr="tcp://h:2"))
    assert [i.kind for i in kinds(out, AppendEvent)][:1] == ["taken_back"]
    welcome = [i for i in kinds(out, Reply) if i.to == "reg-s1"]
    assert welcome and welcome[0].fields["rank"] == 1 and welcome[0].fields["job"]["restore"]
