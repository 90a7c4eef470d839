"""Coordinator recovery in the core: a restarted coordinator takes back live servers and workers
from their re-registrations, driven by events alone (no sockets, no processes, no sleeps)."""

from __future__ import annotations

import pytest

from paramserver.coordinator.events import (
    AppendEvent, Bye, Clocked, Finish, Heartbeat, Registered, Reply, SendRelease, Started,
    TimePassed, ToServers,
)
from paramserver.coordinator.state import CoordinatorState
from ps_helpers import HB, job_of, match, only, start_round

# The coordinator's part of a checkpoint taken at round 2 (64 samples a round, 2 workers).
SAVED = {"rounds_applied": 2, "samples_done": 128, "steps_done": 4, "policy": {"round": 2},
         "worker_samples": {"0": 64, "1": 64}, "sync": "bsp", "num_keys": 10,
         "elapsed_s": 3.0}


@pytest.fixture
def restarted():
    made = []

    def build(saved=SAVED, latest=None, **options):
        options.setdefault("server_timeout", 30.0)
        state = CoordinatorState(job_of(**options), None, latest, take_back=dict(saved),
                                 elapsed=9.0)
        made.append(state)
        return state

    yield build
    for state in made:
        state.check_invariants()


@pytest.fixture
def make_live():
    made = []

    def build(**options):
        state = CoordinatorState(job_of(**options))
        start_round(state)
        made.append(state)
        return state

    yield build
    for state in made:
        state.check_invariants()


def server_back(state, version, t=0.1, rank=0, lo=0, hi=10):
    return state.handle(Registered(f"s{rank}", "server", t, to=f"rs{rank}", link=f"L{rank}",
                                   addr=f"tcp://h:{rank + 1}",
                                   rejoin={"rank": rank, "lo": lo, "hi": hi,
                                           "version": version}))


def worker_back(state, w, step, clocked, samples, t=0.2):
    return state.handle(Registered(f"w{w}", "worker", t, to=f"rw{w}", num_keys=10,
                                   rejoin={"rank": w, "step": step, "clocked": clocked,
                                           "samples": samples}))


def test_an_unknown_member_is_told_to_come_back(restarted):
    state = restarted()
    out = state.handle(Heartbeat("w0", 0.05, to="h"))
    assert out == [Reply("h", "error", {"msg": "unknown member 'w0'", "code": "unknown"})]
    out = state.handle(Clocked("w1", 5, 32, 0.1, 0.06, to="c"))
    assert match(out[0], Reply, to="c", op="error", code="unknown")


def test_bsp_mid_round_the_live_state_wins_over_the_checkpoint(restarted):
    state = restarted()
    out = server_back(state, version=5)  # rounds 0..4 applied: ahead of the checkpoint's 2
    assert match(out[0], Reply, to="rs0", op="welcome", rank=0)
    assert out[0].fields["job"]["shard_range"] == [0, 10]
    assert match(out[1], AppendEvent, kind="server_taken_back", rank=0, version=5)
    out = worker_back(state, 0, step=5, clocked=True, samples=5 * 32)
    assert out[0] == Reply("rw0", "welcome", {"rank": 0, "job": {}})
    # w0's clock of round 5 is sent again; it waits for the rebuild.
    assert state.handle(Clocked("w0", 5, 32, 0.1, 0.3, to="c0-5")) == []
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.4)
    taken = [i for i in out if match(i, AppendEvent, kind="taken_back")]
    assert taken and taken[0].data["round"] == 5 and taken[0].data["versions"] == {"0": 5}
    assert not only(out, SendRelease)  # the round waits for w1's push
    assert state.rounds_applied == 5 and state.samples_done == 10 * 32 + 32
    assert state.barrier.open and state.barrier.t_start == pytest.approx(0.4 - 9.0)
    out = state.handle(Clocked("w1", 5, 32, 0.1, 0.5, to="c1-5"))
    assert match(out[0], ToServers, op="apply_round", step=5, contributors=[0, 1])
    releases = only(out, SendRelease)
    assert [(r.to, r.step, r.min_version, r.round_size) for r in releases] == [
        ("c0-5", 6, 6, 2), ("c1-5", 6, 6, 2)]
    assert state.samples_done == 12 * 32


def test_bsp_a_worker_whose_release_was_lost_gets_the_round_that_completed(restarted):
    # The old coordinator applied round 5 and released w0 into 6, then died before w1's
    # release went out: w1 clocked 5 and still waits.
    state = restarted()
    server_back(state, version=6)
    worker_back(state, 0, step=6, clocked=False, samples=6 * 32)
    out = worker_back(state, 1, step=5, clocked=True, samples=5 * 32)
    assert state.rounds_applied == 6
    assert not only(out, SendRelease)
    out = state.handle(Clocked("w1", 5, 32, 0.1, 0.5, to="c1-5"))
    assert not only(out, ToServers)  # not pushed again: round 5 is applied
    assert [(r.to, r.step, r.min_version) for r in only(out, SendRelease)] == [
        ("c1-5", 6, 6)]
    assert state.samples_done == 12 * 32
    state.handle(Clocked("w0", 6, 32, 0.1, 0.6, to="c0-6"))
    out = state.handle(Clocked("w1", 6, 32, 0.1, 0.7, to="c1-6"))
    assert match(out[0], ToServers, op="apply_round", step=6, contributors=[0, 1])


def test_asp_workers_go_on_from_their_own_steps(restarted):
    state = restarted(saved={}, sync="asp")
    server_back(state, version=123)
    worker_back(state, 0, step=40, clocked=True, samples=40 * 32)
    state.handle(Clocked("w0", 40, 32, 0.1, 0.25, to="c0"))
    out = worker_back(state, 1, step=12, clocked=False, samples=12 * 32, t=0.3)
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0", 41)]
    out = state.handle(Clocked("w1", 12, 32, 0.1, 0.4, to="c1"))
    assert [(r.to, r.step, r.min_version) for r in only(out, SendRelease)] == [("c1", 13, 0)]
    assert state.samples_done == 52 * 32 + 2 * 32


def test_the_deadline_rebuilds_with_those_back_and_the_round_closes_without_the_rest(
        restarted):
    state = restarted()
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=True, samples=5 * 32)
    state.handle(Clocked("w0", 5, 32, 0.1, 0.3, to="c0-5"))
    assert state.next_wakeup() == pytest.approx(HB)
    out = state.handle(TimePassed(HB + 0.01))
    assert match(out[0], AppendEvent, kind="taken_back", workers=1)
    assert match(only(out, ToServers)[0], ToServers, op="apply_round", step=5, contributors=[0])
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0-5", 6)]


def test_a_server_that_does_not_come_back_ends_the_job_naming_it(restarted):
    state = restarted(servers=2, server_timeout=10.0)
    server_back(state, version=5, hi=5)
    worker_back(state, 0, step=5, clocked=False, samples=0)
    assert not only(state.handle(TimePassed(HB + 1)), Finish)  # servers are waited for longer
    out = state.handle(TimePassed(10.01))
    assert Finish("server(s) [1] did not come back to the restarted coordinator within "
                  "10 s") in out


def test_rejoins_are_checked_and_idempotent(restarted):
    state = restarted()
    out = server_back(state, version=5, lo=0, hi=7)
    assert match(out[-1], Reply, op="error", code="refused")
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=0)
    out = worker_back(state, 0, step=5, clocked=False, samples=0)  # twice: same answer
    assert out == [Reply("rw0", "welcome", {"rank": 0, "job": {}})]
    out = state.handle(Registered("w9", "worker", 0.3, to="r9",
                                  rejoin={"rank": 0, "step": 5, "samples": 0}))
    assert match(out[-1], Reply, to="r9", op="error", code="refused")


def test_a_fresh_worker_waits_for_the_take_back_and_a_leaver_is_let_go(restarted):
    state = restarted()
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    state.handle(Bye("w0", 0.25, to="b"))  # done before the rebuild: not in the policy
    # Rank 0 left, the newcomer stands for rank 1 (a fixed job's replacement): the rebuild
    # is now, and the newcomer is welcomed after it, to the lowest free rank.
    out = state.handle(Registered("new", "worker", 0.3, to="r-new"))
    kinds = [i.kind if isinstance(i, AppendEvent) else getattr(i, "to", None) for i in out]
    assert kinds.index("taken_back") < kinds.index("r-new")
    assert [match(i, Reply, to="r-new", op="welcome", rank=0) for i in out].count(True) == 1
    # The newcomer joins the running round through its start.
    out = state.handle(Started("new", HB + 0.1, to="s-new"))
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("s-new", 5)]


def test_a_replacement_counts_for_its_rank_so_the_take_back_does_not_wait(restarted):
    state = restarted()
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = state.handle(Registered("new", "worker", 0.3, to="r-new"))
    assert match(out[0], AppendEvent, kind="taken_back", workers=1)
    assert [match(i, Reply, to="r-new", op="welcome", rank=1) for i in out].count(True) == 1


def test_a_clock_sent_twice_is_answered_once_and_never_pushed_twice(make_live):
    # A worker re-sends a clock whose answer it did not see (its first copy may still come).
    state = make_live()
    state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0"))
    assert state.handle(Clocked("w0", 0, 32, 0.1, 1.1, to="c0-again")) == []
    out = state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0-again", 1), ("c1", 1)]
    out = state.handle(Clocked("w1", 0, 32, 0.1, 1.3, to="c1-again"))
    assert [(r.to, r.step, r.min_version) for r in out] == [("c1-again", 1, 1)]
    assert state.samples_done == 64 and state.rounds_applied == 1


def test_a_server_restarted_during_the_take_back_is_restored_from_the_checkpoint(restarted):
    state = restarted(servers=2, checkpoint_dir="/ck", checkpoint_every=2, restart_servers=True,
                      latest="000000002")
    server_back(state, version=5, hi=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    worker_back(state, 1, step=5, clocked=False, samples=5 * 32)
    assert not only(state.handle(TimePassed(0.3)), SendRelease)
    out = state.handle(Registered("new", "server", 0.4, to="r-new", link="L9",
                                  addr="tcp://h:2"))
    welcome = [i for i in out if match(i, Reply, to="r-new", op="welcome", rank=1)]
    assert welcome and welcome[0].fields["job"]["restore"] == {
        "dir": "/ck", "tag": "000000002", "version_floor": 5, "restart": True}
    assert state.members.roster.servers["s1"].addr == "tcp://h:2"


def test_a_registration_sent_again_is_answered_as_the_first(make_live, restarted):
    # Its answer may have died with the old coordinator: the repeat must not be refused.
    state = restarted()
    assert state.handle(Registered("new", "worker", 0.1, to="r1")) == []
    assert state.handle(Registered("new", "worker", 0.2, to="r2")) == []
    server_back(state, version=5)
    out = state.handle(TimePassed(HB + 0.01))
    assert [i.to for i in out if match(i, Reply, op="welcome")] == ["r2"]
    out = state.handle(Registered("new", "worker", HB + 0.1, to="r3"))
    assert match(out[0], Reply, to="r3", op="welcome", rank=0) and len(out) == 1


def test_a_worker_back_after_the_rebuild_joins_the_running_policy(restarted):
    state = restarted()
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=True, samples=5 * 32)
    state.handle(Clocked("w0", 5, 32, 0.1, 0.3, to="c0-5"))
    out = state.handle(TimePassed(HB + 0.01))  # w1 was slow: round 5 closes without it
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0-5", 6)]
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=HB + 0.1)
    assert match(out[1], AppendEvent, kind="worker_taken_back", rank=1)
    assert not only(out, SendRelease)
    # Its clock of round 5 (applied without it) is answered with round 6, not pushed.
    out = state.handle(Clocked("w1", 5, 32, 0.1, HB + 0.2, to="c1-5"))
    assert [(r.to, r.step, r.min_version) for r in out] == [("c1-5", 6, 6)]
    state.handle(Clocked("w0", 6, 32, 0.1, HB + 0.3, to="c0-6"))
    out = state.handle(Clocked("w1", 6, 32, 0.1, HB + 0.4, to="c1-6"))
    assert match(out[0], ToServers, op="apply_round", step=6, contributors=[0, 1])


def test_asp_a_worker_back_after_the_rebuild_keeps_its_steps(restarted):
    state = restarted(saved={}, sync="asp")
    server_back(state, version=50)
    worker_back(state, 0, step=30, clocked=False, samples=30 * 32)
    state.handle(TimePassed(HB + 0.01))
    worker_back(state, 1, step=17, clocked=True, samples=17 * 32, t=HB + 0.1)
    out = state.handle(Clocked("w1", 17, 32, 0.1, HB + 0.2, to="c1"))
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c1", 18)]


def test_a_resharded_job_is_taken_back_on_the_shard_map_its_log_committed_last():
    """--servers MIN:MAX: a server joined (keys moved) before the coordinator died. The
    restarted one takes the servers back on the dead one's last committed shard map, read
    from its events.jsonl, waits for all of them, and numbers shard maps on from its epoch;
    the job's first map would refuse every server ("not this job's server")."""
    from paramserver.coordinator.replica_history import ReplicaHistory
    layout = [[0, "tcp://h:1", 0, 4], [1, "tcp://h:2", 4, 10]]
    log = [{"event": "start"},
           {"event": "server_joined", "addr": "tcp://h:2", "epoch": 1, "servers": 2,
            "layout": [[0, "tcp://h:1", 0, 6], [1, "tcp://h:2", 6, 10]]},
           {"event": "server_joined", "addr": "tcp://h:2", "epoch": 2, "servers": 2,
            "layout": layout},
           {"event": "reshard_refused", "addr": "tcp://h:3"}]
    state = CoordinatorState(job_of(servers=1, max_servers=3), None, None,
                             take_back=dict(SAVED), elapsed=9.0,
                             replica_history=ReplicaHistory.of(log))
    out = server_back(state, version=5, rank=0, lo=0, hi=4)
    assert match(out[0], Reply, to="rs0", op="welcome", rank=0)
    assert out[0].fields["job"]["shard_range"] == [0, 4]
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert not [i for i in out if match(i, AppendEvent, kind="taken_back")]  # s1 not back
    out = server_back(state, version=5, rank=1, lo=4, hi=10, t=0.4)
    assert match(out[0], Reply, to="rs1", op="welcome", rank=1)
    assert out[0].fields["job"]["shard_range"] == [4, 10]
    taken = [i for i in out if match(i, AppendEvent, kind="taken_back")]
    assert taken and taken[0].data["servers"] == 2
    out = state.handle(Heartbeat("w0", 0.5, to="hb"))
    assert out == [Reply("hb", "ok", {"epoch": 2, "layout": layout})]
    state.check_invariants()


def test_a_move_the_dead_coordinator_never_committed_is_given_up_on_the_servers_back():
    """--servers MIN:MAX: the coordinator died while keys moved (its servers told `reshard`,
    no commit). Each server kept its old core but stays moving (refusing requests `busy`)
    until told otherwise: a server back saying so is told `reshard_abort` of that move, and
    shard maps number on past its epoch."""
    state = CoordinatorState(job_of(servers=1, max_servers=2), None, None,
                             take_back=dict(SAVED), elapsed=9.0)
    out = state.handle(Registered("s0", "server", 0.1, to="rs0", link="L0",
                                  addr="tcp://h:1", rejoin={"rank": 0, "lo": 0, "hi": 10,
                                                            "version": 5, "moving": 1}))
    assert match(out[0], Reply, to="rs0", op="welcome", rank=0)
    assert [i for i in out if isinstance(i, ToServers)] == [
        ToServers("reshard_abort", {"epoch": 1}, ("L0",))]
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert [i for i in out if match(i, AppendEvent, kind="taken_back")]
    assert state.reshard.epoch == 1  # the next move is epoch 2: the servers' last was 1
    out = server_back(state, version=5, t=0.4)  # a live server that never moved: no abort
    assert not [i for i in out if isinstance(i, ToServers)]
    state.check_invariants()


@pytest.mark.parametrize("max_servers", [0, 2])
def test_a_new_server_registering_during_the_take_back_is_let_in_after_it(max_servers):
    """A server registering anew while the take-back waits (`paramserver server --join`, not
    one restarted in a dead one's place: every rank is back) is handled after the rebuild as
    at any time: a join asked (--servers MIN:MAX) or refused; it used to crash the rebuild
    ("all 1 server ranks are taken")."""
    state = CoordinatorState(job_of(servers=1, max_servers=max_servers), None, None,
                             take_back=dict(SAVED), elapsed=9.0)
    server_back(state, version=5)
    assert state.handle(Registered("sJ", "server", 0.15, to="rJ", link="LJ",
                                   addr="tcp://h:9")) == []  # waits for the rebuild
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert [i for i in out if match(i, AppendEvent, kind="taken_back")]
    if max_servers:
        assert [i for i in out if match(i, AppendEvent, kind="server_join_asked")]
    else:
        assert [i for i in out if match(i, Reply, to="rJ", op="error", code="refused")]
    state.check_invariants()


def test_the_take_back_is_a_metrics_record_the_summary_counts(restarted):
    """summary.json says the coordinator was restarted (coordinator_restarts), as it says the
    servers restarted from a checkpoint; before, only events.jsonl did."""
    from paramserver.coordinator.events import AppendMetric
    from paramserver.runlog.metrics import summarize
    state = restarted()
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.4)
    (record,) = [i for i in out if isinstance(i, AppendMetric)
                 and i.record.get("kind") == "takeback"]
    assert record.t == pytest.approx(9.0) and record.record["workers"] == 2
    job = {"sync": {"name": "bsp"}, "workers": 2, "servers": 1, "batch_size": 32,
           "optimizer": {"name": "sgd", "lr": 0.1}, "task": {"model": "mlp"},
           "apply_mode": "round"}
    assert summarize([{"t": record.t, **record.record}], job)["coordinator_restarts"] == 1


def test_a_re_sent_clock_the_dead_coordinator_recorded_is_not_recorded_twice(tmp_path):
    """The dead coordinator wrote worker 0's step 83 and died before its release went out;
    the worker sends that clock again to the new one, whose step record would be the same
    line again (summary.json: 602 steps of a 600-step job). The node skips it, once."""
    import json
    from paramserver.coordinator.events import AppendMetric
    from paramserver.coordinator.node import CoordinatorNode
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"t": 1.0 + s, "kind": "step", "worker": w, "step": s,
                                        "batch": 32}) + "\n"
                            for s in (82, 83) for w in (0, 1) if (w, s) != (1, 83)))
    node = CoordinatorNode(job_of(), metrics_path=str(path), take_back=True)
    try:
        for w, s in [(0, 83), (1, 83), (0, 84), (1, 84), (0, 83)]:
            node._append_metric(AppendMetric(9.0, {"kind": "step", "worker": w, "step": s,
                                                   "batch": 32}))
    finally:
        node.metrics.close()
    steps = [(r["worker"], r["step"]) for r in map(json.loads, path.read_text().splitlines())]
    assert steps == [(0, 82), (1, 82), (0, 83), (1, 83), (0, 84), (1, 84), (0, 83)]


# ---- an elastic job's take-back waits for the members the dead coordinator's log names -------

ELASTIC_SAVED = {"rounds_applied": 2, "samples_done": 128, "steps_done": 4, "policy": {"round": 2},
                 "worker_samples": {"0": 64, "2": 64}, "sync": "bsp", "num_keys": 10}


def elastic_restarted(live, **options):
    """A `--workers 2:4` job's coordinator restarted; `live`: the worker ranks its predecessor's
    log named members (worker_history.py)."""
    from paramserver.coordinator.worker_history import WorkerHistory
    return CoordinatorState(job_of(workers=4, min_workers=2, **options), None, None,
                            take_back=dict(ELASTIC_SAVED), elapsed=9.0,
                            worker_history=None if live is None else WorkerHistory(live))


def taken_back(out):
    events = [i for i in out if match(i, AppendEvent, kind="taken_back")]
    return events[0].data if events else None


def test_the_log_of_a_running_elastic_job_names_its_members_at_the_end():
    """The roster at the coordinator's death, from its own lines: ranks given, ranks gone
    (preempted, done, dead), a take-back's rebuild; a new job (`start`) begins again."""
    from paramserver.coordinator.worker_history import WorkerHistory
    log = [{"event": "start"},
           {"event": "worker_registered", "rank": 0, "src": "a"},
           {"event": "worker_registered", "rank": 1, "src": "b"},
           {"event": "observer_registered", "rank": 0, "src": "eval"},
           {"event": "barrier_open", "workers": 2},
           {"event": "worker_registered", "rank": 2, "src": "c"},
           {"event": "worker_joined", "worker": 2, "workers": 3},
           {"event": "worker_left", "worker": 1, "reason": "preempted", "workers": 2},
           {"event": "worker_registered", "rank": 3, "src": "d"},
           {"event": "worker_left", "worker": 3, "reason": "dead", "workers": 2},
           "not a record", {"event": "worker_left", "worker": "x"}]
    assert WorkerHistory.of(log).ranks == {0, 2}
    # A take-back rebuilt on those back (rank 2 never came); later ranks count on from it.
    log += [{"event": "restart"}, {"event": "worker_taken_back", "rank": 0, "src": "a"},
            {"event": "taken_back", "ranks": [0], "workers": 1},
            {"event": "worker_registered", "rank": 1, "src": "e"}]
    assert WorkerHistory.of(log).ranks == {0, 1}
    assert WorkerHistory.of(log + [{"event": "start"}]).ranks == set()  # a resumed job
    assert WorkerHistory.of([{"event": "worker_registered", "rank": 0}]).ranks is None


def test_an_elastic_take_back_ends_when_the_live_members_are_back_not_at_its_deadline():
    """MIN 2, MAX 4, three running when the coordinator died (one of four left before): it
    used to wait for MAX and rebuild only at its deadline (heartbeat_timeout), every time."""
    from paramserver.coordinator.worker_history import WorkerHistory
    # The log a running coordinator writes (the node adds `start`): four joined, rank 1 was
    # preempted.
    live = CoordinatorState(job_of(workers=4, min_workers=2))
    events = [Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1")]
    events += [Registered(f"w{w}", "worker", 0.1, to=f"r-w{w}") for w in range(4)]
    events += [Started(f"w{w}", 0.5, to=f"s{w}", data_len=100) for w in range(4)]
    events += [Clocked("w1", 0, 32, 0.1, 1.0, to="c1", leave="preempted")]
    lines = [{"event": "start"}] + [{"event": i.kind, **i.data} for e in events
                                    for i in live.handle(e) if isinstance(i, AppendEvent)]
    assert WorkerHistory.of(lines).ranks == {0, 2, 3}

    state = elastic_restarted({0, 2, 3})
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 2, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert taken_back(out) is None  # rank 3 is live: waited for
    out = worker_back(state, 3, step=5, clocked=False, samples=5 * 32, t=0.4)
    assert taken_back(out) == {**taken_back(out), "ranks": [0, 2, 3], "expected": [0, 2, 3],
                               "missing": [], "by": "members", "workers": 3}
    assert state.barrier.open


def test_an_elastic_member_that_died_with_the_coordinator_is_waited_for_until_the_deadline(
        ):
    state = elastic_restarted({0, 1, 2})
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 2, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert taken_back(out) is None
    assert state.next_wakeup() == pytest.approx(HB)
    assert taken_back(state.handle(TimePassed(HB - 0.01))) is None
    done = taken_back(state.handle(TimePassed(HB + 0.01)))
    assert done["by"] == "deadline" and done["missing"] == [1] and done["ranks"] == [0, 2]
    # Back late, it joins the running job under its rank, as after any take-back.
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=HB + 0.1)
    assert match(out[0], Reply, op="welcome", rank=1)


def test_an_elastic_joiner_during_the_take_back_ends_no_wait_and_takes_a_free_rank():
    """A new worker is no replacement in an elastic job: counted as one it would end the wait
    before a live member is back and take that member's rank (the lowest free)."""
    state = elastic_restarted({0, 1})
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    assert state.handle(Registered("new", "worker", 0.3, to="r-new")) == []
    out = worker_back(state, 1, step=5, clocked=True, samples=5 * 32, t=0.4)
    assert taken_back(out)["by"] == "members"
    welcomes = [i for i in out if match(i, Reply, to="r-new", op="welcome")]
    assert len(welcomes) == 1 and welcomes[0].fields["rank"] == 2


def test_an_elastic_member_that_leaves_during_the_take_back_is_not_waited_for():
    state = elastic_restarted({0, 1})
    server_back(state, version=5)
    worker_back(state, 1, step=5, clocked=False, samples=5 * 32)
    out = state.handle(Bye("w1", 0.3, to="b1", reason="preempted"))
    assert taken_back(out) is None  # rank 0 still to come
    out = worker_back(state, 0, step=5, clocked=False, samples=5 * 32, t=0.4)
    assert taken_back(out)["by"] == "members" and taken_back(out)["ranks"] == [0]
    # None live (all left before the death): the servers are all it waits for.
    state = elastic_restarted(set())
    assert taken_back(server_back(state, version=5))["by"] == "members"


def test_an_elastic_job_below_min_at_the_death_waits_again_after_the_take_back():
    """MIN 2: one member left when the coordinator died (it was holding every release until
    a join). The rebuilt job used to train on below MIN; it waits again, and a joiner ends
    the wait with the releases held meanwhile."""
    state = elastic_restarted({0})
    server_back(state, version=5)
    out = worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    assert taken_back(out)["by"] == "members"
    waiting = [i for i in out if match(i, AppendEvent, kind="waiting_for_workers")]
    assert waiting and waiting[0].data == {"workers": 1, "min_workers": 2}
    assert state.elastic.paused
    out = state.handle(Clocked("w0", 5, 32, 0.1, 0.3, to="c0-5"))
    assert match(only(out, ToServers)[0], ToServers, op="apply_round", step=5)
    assert not only(out, SendRelease)  # held: one worker is fewer than MIN
    out = state.handle(Registered("new", "worker", 0.4, to="r-new", num_keys=10))
    assert match(out[0], Reply, to="r-new", op="welcome", rank=1)
    out = state.handle(Started("new", 0.5, to="s-new", data_len=100))
    assert [i for i in out if match(i, AppendEvent, kind="workers_back")]
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0-5", 6)]
    assert not state.elastic.paused
    out = state.handle(Clocked("w0", 6, 32, 0.1, 0.6, to="c0-6"))  # the joiner's round next
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0-6", 7), ("s-new", 7)]


def test_an_elastic_take_back_short_of_min_by_its_deadline_waits_until_a_member_is_back():
    """Rank 1 died with the coordinator, or is slow: rebuilt at the deadline on rank 0 alone,
    the job waits; rank 1 back late (under its rank, into the running policy) ends it."""
    state = elastic_restarted({0, 1})
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=True, samples=5 * 32)
    state.handle(Clocked("w0", 5, 32, 0.1, 0.3, to="c0-5"))
    out = state.handle(TimePassed(HB + 0.01))
    assert taken_back(out)["by"] == "deadline"
    assert [i for i in out if match(i, AppendEvent, kind="waiting_for_workers")]
    assert not only(out, SendRelease)
    out = worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=HB + 0.1)
    assert [i for i in out if match(i, AppendEvent, kind="workers_back")]
    assert [r.to for r in only(out, SendRelease)] == ["c0-5"]
    assert not state.elastic.paused


def test_an_elastic_take_back_at_min_does_not_wait():
    state = elastic_restarted({0, 2})
    server_back(state, version=5)
    worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    out = worker_back(state, 2, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert taken_back(out)["by"] == "members"
    assert not [i for i in out if match(i, AppendEvent, kind="waiting_for_workers")]
    assert not state.elastic.paused


def test_without_its_log_an_elastic_take_back_and_a_fixed_job_s_wait_for_every_rank():
    """A fixed job's take-back waits for a rank the log names no member at the death (it
    died: its replacement takes the rank, maybe during the take-back)."""
    from paramserver.coordinator.worker_history import WorkerHistory
    for state in (elastic_restarted(None), CoordinatorState(
            job_of(), None, None, take_back=dict(SAVED), elapsed=9.0,
            worker_history=WorkerHistory({0}))):
        server_back(state, version=5)
        out = worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
        assert taken_back(out) is None
        assert taken_back(state.handle(TimePassed(HB + 0.01)))["by"] == "deadline"


def test_the_restarted_node_reads_the_members_from_the_dead_one_s_events(tmp_path):
    import json
    from paramserver.coordinator.node import CoordinatorNode
    path = tmp_path / "events.jsonl"
    lines = [{"t": 0.0, "event": "start", "address": "tcp://h:1", "policy": "bsp"},
             {"t": 0.1, "event": "worker_registered", "rank": 0, "src": "a"},
             {"t": 0.1, "event": "worker_registered", "rank": 1, "src": "b"},
             {"t": 0.2, "event": "barrier_open", "workers": 2},
             {"t": 3.0, "event": "worker_left", "worker": 0, "reason": "preempted"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn": \n')
    node = CoordinatorNode(job_of(workers=4, min_workers=2), events_path=str(path),
                           take_back=True)
    try:
        assert node.state.rejoins.pending.expected == {1}
    finally:
        node.events.close()
    node = CoordinatorNode(job_of(workers=3), events_path=str(path), take_back=True)
    try:  # a fixed job: every rank but the one that left (preempted) on its own word
        assert node.state.rejoins.pending.expected == {1, 2}
    finally:
        node.events.close()


# ---- a fixed job's take-back does not wait for the ranks that left on their own word ---------

FIXED_SAVED = {"rounds_applied": 2, "samples_done": 192, "steps_done": 6, "policy": {"round": 2},
               "worker_samples": {"0": 64, "1": 64, "2": 64}, "sync": "bsp", "num_keys": 10}


def fixed_log() -> list[dict]:
    """The log a running fixed job of three workers writes (the node adds `start`): rank 1
    finished (its bye said "done"), rank 2 was declared dead."""
    live = CoordinatorState(job_of(workers=3))
    events = [Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1")]
    events += [Registered(f"w{w}", "worker", 0.1, to=f"r-w{w}", num_keys=10) for w in range(3)]
    events += [Started(f"w{w}", 0.5, to=f"s{w}") for w in range(3)]
    events += [Heartbeat("w0", 0.5 + HB, to="h0"), Heartbeat("w1", 0.5 + HB, to="h1"),
               Bye("w1", 0.6 + HB, to="b1"), TimePassed(1.0 + HB)]
    return [{"event": "start"}] + [{"event": i.kind, **i.data} for e in events
                                   for i in live.handle(e) if isinstance(i, AppendEvent)]


def test_the_log_names_the_ranks_that_left_on_their_own_word():
    from paramserver.coordinator.worker_history import WorkerHistory
    log = fixed_log()
    assert [(r["worker"], r["reason"]) for r in log if r["event"] == "worker_left"] == [
        (1, "done"), (2, "dead")]
    h = WorkerHistory.of(log)
    assert h.ranks == {0} and h.left == {1}  # (the dead rank's replacement may come)
    # A rank taken again is a member once more; a take-back's rebuild keeps who left.
    assert WorkerHistory.of(log + [{"event": "worker_registered", "rank": 1}]).left == set()
    assert WorkerHistory.of(log + [{"event": "taken_back", "ranks": [0]}]).left == {1}
    assert WorkerHistory.of(log + [{"event": "start"}]).left == set()


def test_a_fixed_take_back_ends_without_the_ranks_that_finished_before_the_death():
    """Rank 1 said bye before the coordinator died: it never comes back, and the take-back
    used to wait its whole deadline (heartbeat_timeout) for it. Rank 2 died: its
    replacement may come, so it is waited for, and a newcomer stands for it."""
    from paramserver.coordinator.worker_history import WorkerHistory
    state = CoordinatorState(job_of(workers=3), None, None, take_back=dict(FIXED_SAVED),
                             elapsed=9.0, worker_history=WorkerHistory.of(fixed_log()))
    server_back(state, version=5)
    out = worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    assert taken_back(out) is None  # rank 2 is waited for
    out = state.handle(Registered("new", "worker", 0.3, to="r-new", num_keys=10))
    assert taken_back(out) == {**taken_back(out), "expected": [0, 2], "missing": [2],
                               "by": "members", "ranks": [0]}
    assert [match(i, Reply, to="r-new", op="welcome", rank=1) for i in out].count(True) == 1
    state.check_invariants()


def test_a_fixed_take_back_with_every_other_rank_finished_needs_only_the_one_back():
    from paramserver.coordinator.worker_history import WorkerHistory
    log = [{"event": "start"}] + [{"event": "worker_registered", "rank": r} for r in range(3)]
    log += [{"event": "worker_left", "worker": 1, "reason": "done"},
            {"event": "worker_left", "worker": 2, "reason": "preempted"}]
    state = CoordinatorState(job_of(workers=3), None, None, take_back=dict(FIXED_SAVED),
                             elapsed=9.0, worker_history=WorkerHistory.of(log))
    server_back(state, version=5)
    out = worker_back(state, 0, step=5, clocked=False, samples=5 * 32, t=0.3)
    assert taken_back(out) == {**taken_back(out), "expected": [0], "missing": [],
                               "by": "members", "ranks": [0]}
    assert state.barrier.open
    state.check_invariants()


# ---- a drain asked of a coordinator that died before it was done -----------------------------

THREE = [[0, "tcp://h:1", 0, 3], [1, "tcp://h:2", 3, 6], [2, "tcp://h:3", 6, 10]]


def test_the_log_names_the_drains_asked_and_neither_done_nor_refused():
    from paramserver.coordinator.replica_history import ReplicaHistory
    log = [{"event": "start"},
           {"event": "server_drain_asked", "rank": 1, "addr": "tcp://h:2", "by": "cli"},
           {"event": "server_drain_asked", "rank": 2, "addr": "tcp://h:3", "by": "s2"},
           {"event": "server_drain_asked", "rank": 0, "addr": "tcp://h:1", "by": "s0"},
           {"event": "reshard_refused", "kind": "move", "addr": "tcp://h:3", "reason": "-"},
           {"event": "reshard_refused", "kind": "drain", "addr": "tcp://h:1", "reason": "-"},
           {"event": "server_drain_asked", "addr": ["not", "an", "address"]}]
    assert ReplicaHistory.of(log).drains == {"tcp://h:2": "cli", "tcp://h:3": "s2"}
    log.append({"event": "server_drained", "addr": "tcp://h:2", "epoch": 2, "layout": THREE})
    assert ReplicaHistory.of(log).drains == {"tcp://h:3": "s2"}
    assert ReplicaHistory.of(log + [{"event": "start"}]).drains == {}


def resharded_restarted(log):
    """A `--servers 2:3` job on three servers (a join committed), its coordinator restarted."""
    from paramserver.coordinator.replica_history import ReplicaHistory
    log = [{"event": "start"},
           {"event": "server_joined", "addr": "tcp://h:3", "epoch": 1, "layout": THREE}] + log
    return CoordinatorState(job_of(servers=2, max_servers=3), None, None,
                            take_back=dict(SAVED), elapsed=9.0,
                            replica_history=ReplicaHistory.of(log))


def take_back_three(state, draining=None):
    out = []
    for rank, addr, lo, hi in THREE:
        rejoin = {"rank": rank, "lo": lo, "hi": hi, "version": 5}
        if addr == draining:
            rejoin["draining"] = True
        out += state.handle(Registered(f"s{rank}", "server", 0.1, to=f"rs{rank}",
                                       link=f"L{rank}", addr=addr, rejoin=rejoin))
    out += worker_back(state, 0, step=5, clocked=False, samples=5 * 32)
    return out + worker_back(state, 1, step=5, clocked=False, samples=5 * 32, t=0.3)


def test_a_drain_the_dead_coordinator_queued_is_asked_again_once_the_job_is_taken_back():
    """`paramserver drain` was answered once queued; the coordinator died before the fence:
    the restarted one reads the ask in its predecessor's log and drains the server."""
    state = resharded_restarted([{"event": "server_drain_asked", "rank": 1,
                                  "addr": "tcp://h:2", "by": "cli"}])
    out = take_back_three(state)
    kinds = [i.kind for i in out if isinstance(i, AppendEvent)]
    assert kinds.index("taken_back") < kinds.index("server_drain_asked")
    (asked,) = [i for i in out if match(i, AppendEvent, kind="server_drain_asked")]
    assert asked.data == {"rank": 1, "addr": "tcp://h:2", "by": "cli", "again": True}
    assert not [i for i in out if isinstance(i, Reply) and i.op == "error"]
    out = state.handle(TimePassed(0.4))  # the fence begins at the next look
    assert [i.data for i in out if match(i, AppendEvent, kind="reshard_fence")] == [
        {"kind": "drain", "addr": "tcp://h:2"}]
    state.check_invariants()


def test_a_server_whose_sigterm_asked_a_drain_says_so_when_taken_back_and_is_drained():
    """Its `drain` died with the coordinator (queued there, or never read): the server's
    rejoin says it is still to be drained."""
    state = resharded_restarted([])
    out = take_back_three(state, draining="tcp://h:3")
    (asked,) = [i for i in out if match(i, AppendEvent, kind="server_drain_asked")]
    assert asked.data == {"rank": 2, "addr": "tcp://h:3", "by": "s2", "again": True}
    # Named by both the log and the server: asked once.
    state = resharded_restarted([{"event": "server_drain_asked", "rank": 2,
                                  "addr": "tcp://h:3", "by": "s2"}])
    out = take_back_three(state, draining="tcp://h:3")
    assert len([i for i in out if match(i, AppendEvent, kind="server_drain_asked")]) == 1


def test_a_drain_asked_again_that_would_leave_too_few_servers_is_written_down_as_refused():
    state = resharded_restarted([
        {"event": "server_drain_asked", "rank": 1, "addr": "tcp://h:2", "by": "cli"},
        {"event": "server_drain_asked", "rank": 2, "addr": "tcp://h:3", "by": "s2"}])
    out = take_back_three(state)
    assert [i.data["addr"] for i in out if match(i, AppendEvent, kind="server_drain_asked")] \
        == ["tcp://h:2"]
    (refused,) = [i for i in out if match(i, AppendEvent, kind="reshard_refused")]
    assert refused.data["kind"] == "drain" and refused.data["addr"] == "tcp://h:3"
    assert "fewer than the job's 2 servers" in refused.data["reason"]
