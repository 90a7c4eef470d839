"""The coordinator's core driven by events alone: no sockets, no processes, no sleeps."""

from __future__ import annotations

import random

import pytest

from paramserver.coordinator.events import (
    AppendEvent, AppendMetric, Bye, Clocked, Finish, Heartbeat, Registered, Reply,
    SaveCoordinatorState, SendRelease, ShardRestored, ShardSaved, Started, StatusAsked,
    TimePassed, ToServers, Warn,
)
from paramserver.coordinator.membership import MAX_OBSERVERS
from paramserver.policies import SYNC_POLICIES
from paramserver.spec.welcome import ServerJob, WorkerJob
from ps_helpers import (
    ADDR, HB, clock_round, match, only, register_all, start_round,
)



# ---- one BSP round ------------------------------------------------------------------------------

def test_one_bsp_round(make):
    state = make()
    out = state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr=ADDR))
    assert len(out) == 2
    assert match(out[0], Reply, to="r0", op="welcome", rank=0)
    assert out[0].fields["job"]["shard_range"] == [0, 10]
    assert out[0].fields["job"]["apply_mode"] == "round"
    assert match(out[1], AppendEvent, kind="server_joined", rank=0, addr=ADDR)

    for rank, src in enumerate(["w0", "w1"]):
        out = state.handle(Registered(src, "worker", 0.1, to=f"r-{src}"))
        assert match(out[0], Reply, to=f"r-{src}", op="welcome", rank=rank)
        job = out[0].fields["job"]
        assert job["shards"] == [[0, ADDR, 0, 10]] and job["sync"] == "bsp"
        assert job["num_keys"] == 10 and job["resume_samples"] == 0
        assert match(out[1], AppendEvent, kind="worker_registered", rank=rank, src=src)

    assert state.handle(Started("w0", 0.5, to="s0")) == []
    out = state.handle(Started("w1", 0.6, to="s1"))
    assert len(out) == 3
    assert match(out[0], AppendEvent, kind="barrier_open", workers=2)
    for instr, to in zip(out[1:], ["s0", "s1"]):
        assert match(instr, SendRelease, to=to, step=0, batch=32, min_version=0, round_size=2,
                     stop=False, scale=1.0)

    out = state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0", record={"loss": 0.5}))
    assert not only(out, SendRelease) and not only(out, ToServers)
    assert len(out) == 1 and match(out[0], AppendMetric, kind="step", worker=0, step=0,
                                   batch=32, loss=0.5)
    assert out[0].t == pytest.approx(0.4)  # since the barrier opened

    out = state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    assert len(out) == 4
    assert match(out[0], ToServers, op="apply_round", step=0, contributors=[0, 1],
                 links=("L0",))
    assert match(out[1], AppendEvent, kind="apply_round", step=0, contributors=[0, 1])
    assert match(out[2], SendRelease, to="c0", step=1, batch=32, min_version=1, round_size=2,
                 stop=False)
    assert match(out[3], SendRelease, to="c1", step=1, min_version=1)

    assert state.rounds_applied == 1 and state.samples_done == 64 and not state.stopping
    # The nearest deadline: worker 0, last heard at 1.0, is declared dead after HB s.
    assert state.next_wakeup() == pytest.approx(1.0 + HB)


def test_the_last_samples_of_the_budget_release_with_stop(make):
    state = make(max_samples=64)
    start_round(state)
    _, out = clock_round(state)
    assert match(out[0], AppendEvent, kind="budget_reached", samples=64)
    releases = only(out, SendRelease)
    assert len(releases) == 2 and all(r.stop for r in releases)
    assert state.stopping


def test_a_time_budget_stops_the_next_releases(make):
    state = make(max_seconds=10.0)
    start_round(state)  # the barrier opens at 0.6
    state.handle(Clocked("w0", 0, 32, 0.1, 5.0, to="c0"))
    out = state.handle(Clocked("w1", 0, 32, 0.1, 10.7, to="c1"))
    assert match(out[0], AppendEvent, kind="budget_reached", samples=32)
    assert all(r.stop for r in only(out, SendRelease)) and len(only(out, SendRelease)) == 2


def test_a_spent_budget_stops_a_worker_held_for_a_round_that_will_not_fill(make):
    # Three workers; the budget runs out on the second push of the round. The first worker,
    # held for the third's push, hears stop at once rather than waiting for it.
    state = make(workers=3, max_samples=64)
    register_all(state, workers=3)
    for w in range(3):
        state.handle(Started(f"w{w}", 0.5 + w / 10, to=f"s{w}"))
    state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0"))
    out = state.handle(Clocked("w1", 0, 32, 0.1, 1.2, to="c1"))
    assert any(match(i, AppendEvent, kind="budget_reached") for i in out)
    assert sorted(r.to for r in only(out, SendRelease) if r.stop) == ["c0", "c1"]
    out = state.handle(Clocked("w2", 0, 32, 0.1, 2.0, to="c2"))  # the last one hears it too
    assert [r.to for r in only(out, SendRelease) if r.stop] == ["c2"]


@pytest.mark.parametrize("sync", SYNC_POLICIES.names())
@pytest.mark.parametrize("seed", range(4))
def test_once_the_budget_is_spent_no_worker_is_left_waiting(make, sync, seed):
    """Workers of uneven speed clock in a random order until the budget runs out: from then
    on every worker that asks for a release hears stop within the policy's own hold, whatever
    the policy was waiting for (a round, the slowest clock, another's next push)."""
    rng = random.Random(seed)
    workers, batch = 4, 32
    state = make(sync=sync, workers=workers, max_samples=batch * 13, heartbeat_timeout=1e6)
    register_all(state, workers=workers)
    free, waiting, steps, now = {}, {}, [0] * workers, 1.0
    for w in range(workers):
        for r in only(state.handle(Started(f"w{w}", 0.5, to=f"w{w}-0")), SendRelease):
            free[int(r.to[1:].split("-")[0])] = r
    speed = [1.0, 1.0, 2.0, 5.0]  # a persistent straggler, as the policies expect
    for _ in range(400):
        if not free:  # everyone waits: let time pass to the policy's next hold or deadline
            wake = state.next_wakeup()
            assert wake is not None, f"{sync}: every worker waits and nothing is due"
            now = max(now, wake)
            out = state.handle(TimePassed(now))
        else:
            w = rng.choice(sorted(free))
            del free[w]
            now += speed[w] * rng.uniform(0.05, 0.15)
            waiting[w] = f"w{w}-{steps[w] + 1}"
            out = state.handle(Clocked(f"w{w}", steps[w], batch, 0.1, now, to=waiting[w]))
            steps[w] += 1
        for r in only(out, SendRelease):
            w = int(r.to[1:].split("-")[0])
            assert waiting.pop(w, None) == r.to or r.to.endswith("-0")
            free[w] = r
        if state.stopping:
            break
    assert state.stopping, f"{sync}: the budget was never spent"
    # From the budget on, a worker's next clock or its wait ends in stop: drive the rest.
    for _ in range(100):
        if not waiting and not free:
            break
        for w, r in list(free.items()):
            del free[w]
            if r.stop:
                continue
            waiting[w] = f"w{w}-{steps[w] + 1}"
            out = state.handle(Clocked(f"w{w}", steps[w], batch, 0.1, now, to=waiting[w]))
            steps[w] += 1
            for rel in only(out, SendRelease):
                free[int(rel.to[1:].split("-")[0])] = rel
                waiting.pop(int(rel.to[1:].split("-")[0]), None)
        if waiting and not free:
            wake = state.next_wakeup()
            assert wake is not None, f"{sync}: workers {sorted(waiting)} wait past the budget " \
                f"and nothing is due"
            now = max(now, wake)
            for rel in only(state.handle(TimePassed(now)), SendRelease):
                free[int(rel.to[1:].split("-")[0])] = rel
                waiting.pop(int(rel.to[1:].split("-")[0]), None)
    assert not waiting, f"{sync}: workers {sorted(waiting)} still wait after the budget"


def test_a_time_budget_stops_a_worker_already_waiting(make):
    state = make(workers=3, max_seconds=10.0, heartbeat_timeout=100.0)
    register_all(state, workers=3)
    for w in range(3):
        state.handle(Started(f"w{w}", 0.5 + w / 10, to=f"s{w}"))
    state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0"))  # held for the round
    out = state.handle(TimePassed(11.0))
    assert [r.to for r in only(out, SendRelease) if r.stop] == ["c0"]


# ---- liveness and the end of the job ------------------------------------------------------------

def test_workers_silent_past_the_heartbeat_timeout_are_dropped(make):
    state = make()
    start_round(state)
    clock_round(state)
    out = state.handle(TimePassed(1.2 + HB + 0.01))
    left = only(out, AppendEvent)
    assert [(e.kind, e.data) for e in left[:2]] == [
        ("worker_left", {"worker": 0, "reason": "dead"}),
        ("worker_left", {"worker": 1, "reason": "dead"})]
    assert sum(match(m, AppendMetric, kind="left", reason="dead") for m in out) == 2
    assert len(only(out, Warn)) == 2
    # No worker left, and none finished: the job did not end, it was lost (retryable).
    assert out[-1] == Finish("every worker left the job and none finished it (2 dead)")
    assert match(only(out, AppendEvent)[-1], AppendEvent, kind="job_failed")
    assert not state.members.roster.workers and state.members.roster.gone == {
        "w0": "dead", "w1": "dead"}


def test_the_job_ends_finished_once_a_worker_left_having_finished(make):
    state = make()
    start_round(state)
    clock_round(state)
    out = state.handle(Bye("w0", 1.3, to="bye", reason="done"))
    assert not only(out, Finish)
    out = state.handle(TimePassed(1.3 + HB + 0.01))  # w1, silent, declared dead
    assert match(only(out, AppendEvent)[0], AppendEvent, kind="worker_left", reason="dead")
    assert out[-1] == Finish(None) and state.failure is None


def test_a_heartbeat_keeps_a_worker(make):
    state = make()
    start_round(state)
    clock_round(state)
    out = state.handle(Heartbeat("w1", 5.0, to="hb"))
    assert out == [Reply("hb", "ok", {})]
    out = state.handle(TimePassed(1.2 + HB + 0.01))
    assert [e.data["worker"] for e in only(out, AppendEvent)] == [0]
    assert "w1" in state.members.roster.workers and not only(out, Finish)


def test_a_worker_that_leaves_lets_the_round_close_without_it(make):
    state = make()
    start_round(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0"))
    out = state.handle(Bye("w1", 1.1, to="bye", reason="done"))
    assert out[0] == Reply("bye", "ok", {})
    assert match(out[1], AppendEvent, kind="worker_left", worker=1, reason="done")
    assert match(only(out, ToServers)[0], ToServers, op="apply_round", contributors=[0])
    assert [(r.to, r.step) for r in only(out, SendRelease)] == [("c0", 1)]


# Members that never start are waited for, and the server's heartbeats are not played here.
PATIENT = dict(start_timeout=120.0, start_grace=1000.0, server_timeout=1000.0)


def test_no_worker_started_in_time_fails_the_job(make):
    state = make(**PATIENT)
    register_all(state)
    # Meanwhile it says, every few seconds, whom it waits for.
    assert state.next_wakeup() == pytest.approx(5.0)
    out = state.handle(TimePassed(5.0))
    assert out == [Warn("start barrier: waiting, 0 of 2 workers started (ranks none); "
                        "registered, not started: 0, 1; servers: 1/1 registered; going on "
                        "with the workers that started at 120 s (start_timeout)")]
    assert state.next_wakeup() == pytest.approx(10.0)
    assert state.handle(TimePassed(7.0)) == []
    assert all(type(i) is Warn for i in state.handle(TimePassed(119.0)))
    assert state.next_wakeup() == pytest.approx(120.0)
    out = state.handle(TimePassed(120.5))
    assert match(out[0], AppendEvent, kind="job_failed")
    assert isinstance(out[-1], Finish) and out[-1].failure == (
        "no worker started within 120 s; expected 2, registered: rank 0 (w0), rank 1 (w1) "
        "(0 of 2 workers started (ranks none); registered, not started: 0, 1; servers: 1/1 "
        "registered)")
    assert state.failure == out[-1].failure and state.stopping


def test_a_worker_gets_the_rank_it_asks_for_while_that_is_free(make):
    def rank_of(state, src, want):
        reply = state.handle(Registered(src, "worker", 0.1, to=src, want_rank=want))[0]
        assert reply.op == "welcome"
        return reply.fields["rank"]

    state = make(**PATIENT)
    register_all(state, workers=0)
    # b's wish is taken: the first free rank.
    assert [rank_of(state, "a", 1), rank_of(state, "b", 1)] == [1, 0]
    state = make(**PATIENT)
    register_all(state, workers=0)
    assert rank_of(state, "c", 7) == 0  # no rank of this 2-worker job


def test_the_start_barrier_says_whom_it_waits_for_in_status_and_notes(make):
    state = make(**PATIENT)
    state.handle(Registered("w0", "worker", 0.1, to="reg-w0"))
    # A worker's registration is answered once every shard is up.
    assert state.waiting_for() == ("0 of 2 workers started (ranks none); not registered: 1; "
                                   "servers: 0/1 registered (not yet: shards 0); 1 worker(s) wait for the "
                                   "servers")
    register_all(state)
    state.handle(Started("w1", 1.0, to="x"))
    reply = state.handle(StatusAsked("w0", 2.0, to="q"))[0]
    assert reply.fields["state"]["waiting_for"] == (
        "1 of 2 workers started (ranks 1); registered, not started: 0; servers: 1/1 registered")


def test_past_the_start_timeout_the_started_workers_go_on(make):
    state = make(**PATIENT)
    register_all(state)
    state.handle(Started("w0", 1.0, to="s0"))
    state.handle(Heartbeat("w0", 118.0, to="h"))
    out = state.handle(TimePassed(120.5))
    assert match(out[0], Warn, message="only 1 of 2 workers started within 120 s; going on "
                                       "with them")
    assert match(out[1], AppendEvent, kind="barrier_open", workers=1)
    assert match(out[2], SendRelease, to="s0", step=0, round_size=1)


def test_a_silent_server_fails_the_job_and_waiting_workers_hear_it(make):
    state = make()
    start_round(state)
    state.handle(Clocked("w0", 0, 32, 0.1, 1.0, to="c0"))
    state.handle(Heartbeat("w0", 29.0, to="h0"))
    state.handle(Heartbeat("w1", 29.0, to="h1"))
    out = state.handle(TimePassed(30.5))  # the server's last word was at 0.0
    assert match(out[0], AppendEvent, kind="job_failed")
    assert match(out[1], Reply, to="c0", op="error", code="failed")
    assert len(only(out, Reply)) == 1  # w1 is mid-step: nothing waits for an answer
    assert out[-1].failure.startswith("server s0 at tcp://h:1 has been silent for 30 s")


def test_a_replacement_worker_waits_for_the_rank_of_the_dead_one(make):
    state = make()
    start_round(state)
    clock_round(state)
    assert state.handle(Registered("w2", "worker", 2.0, to="r-w2")) == []
    state.handle(Heartbeat("w1", 6.0, to="h1"))
    out = state.handle(TimePassed(1.0 + HB + 0.01))
    welcome = only(out, Reply)
    assert len(welcome) == 1 and match(welcome[0], Reply, to="r-w2", op="welcome", rank=0)
    assert welcome[0].fields["job"]["resume_samples"] == 32  # rank 0's data, where it was
    assert state.members.roster.workers["w2"].rank == 0


def test_a_worker_that_finds_every_rank_taken_is_refused_after_a_while(make):
    state = make()
    start_round(state)
    state.handle(Registered("w2", "worker", 1.0, to="r-w2"))
    for src in ("w0", "w1"):
        state.handle(Heartbeat(src, 10.0, to="h"))
    out = state.handle(TimePassed(1.0 + 2 * HB + 0.01))
    assert out == [Reply("r-w2", "error", {
        "msg": "all 2 worker ranks of this job are taken", "code": "refused"})]


def test_registrations_waiting_for_a_rank_are_bounded(make):
    """A flood of registrations (a hostile local process) waits in a list no longer than the
    job's ranks; a retry replaces its sender's earlier wait."""
    state = make()
    start_round(state)
    assert state.handle(Registered("w2", "worker", 1.0, to="a")) == []
    assert state.handle(Registered("w2", "worker", 1.1, to="b")) == []
    assert [w[0].to for w in state.members.rank_waiters] == ["b"]
    assert state.handle(Registered("w3", "worker", 1.2, to="c")) == []
    for i in range(100):
        out = state.handle(Registered(f"x{i}", "worker", 1.3, to=f"x{i}"))
        assert match(only(out, Reply)[0], Reply, to=f"x{i}", op="error", code="refused")
    assert len(state.members.rank_waiters) == 2
    for i in range(40):
        state.handle(Registered(f"o{i}", "observer", 1.4, to=f"o{i}"))
    assert len(state.members.roster.observers) == MAX_OBSERVERS


def test_a_request_from_an_unknown_worker_is_refused_as_unknown(make):
    # `unknown`, not `refused`: after a coordinator restart the sender re-registers.
    state = make()
    start_round(state)
    out = state.handle(Clocked("ghost", 0, 32, 0.1, 1.0, to="c"))
    assert out == [Reply("c", "error", {"msg": "unknown worker 'ghost' (never registered "
                                               "here)", "code": "unknown"})]
    assert state.samples_done == 0
    # One that left is refused for good: it has nothing to come back to.
    state.handle(Bye("w0", 1.1, to="b"))
    out = state.handle(Clocked("w0", 1, 32, 0.1, 1.2, to="c2"))
    assert match(out[1], Reply, to="c2", op="error", code="refused")


def test_a_worker_may_not_take_a_servers_name(make):
    state = make()
    register_all(state, workers=0)
    out = state.handle(Registered("s0", "worker", 0.1, to="r"))
    assert match(out[-1], Reply, op="error", code="refused")
    assert not state.members.roster.workers


# ---- registration order -------------------------------------------------------------------------

def test_workers_wait_for_the_servers_and_servers_for_the_key_space(make):
    state = make(num_keys=0)
    assert state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr=ADDR)) == []
    out = state.handle(Registered("w0", "worker", 0.1, to="rw", num_keys=12))
    assert match(out[0], AppendEvent, kind="key_space", num_keys=12)
    assert match(out[1], Reply, to="r0", op="welcome", rank=0)
    assert out[1].fields["job"]["shard_range"] == [0, 12]
    assert match(out[2], AppendEvent, kind="server_joined")
    assert match(out[3], Reply, to="rw", op="welcome", rank=0)
    assert out[3].fields["job"]["num_keys"] == 12


def test_status(make):
    state = make()
    start_round(state)
    clock_round(state)
    out = state.handle(StatusAsked("w0", 2.6, to="st"))
    s = out[0].fields["state"]
    assert s["rounds_applied"] == 1 and s["samples_done"] == 64 and s["started"]
    assert s["elapsed_s"] == pytest.approx(2.0)
    assert s["workers"] == {"w0": {"rank": 0, "steps": 1}, "w1": {"rank": 1, "steps": 1}}
    assert s["servers"] == {"s0": {"rank": 0, "addr": "tcp://h:1"}}


# ---- checkpoints and server recovery ------------------------------------------------------------

def test_servers_that_wait_for_the_key_space_are_each_welcomed(make):
    """A script job learns its key space from the first worker; its servers, which all
    register under one name until they have a rank, wait for it, and each is welcomed (the
    queue once kept only the last, and `launch --servers 2 -- script` hung)."""
    state = make(num_keys=0, servers=3)
    for r in range(3):
        out = state.handle(Registered("server", "server", 0.0, to=f"reg{r}", link=f"L{r}",
                                      addr=f"tcp://h:{r + 1}"))
        assert out == []
    state.handle(Registered("server", "server", 0.1, to="reg1-again", link="L1",
                            addr="tcp://h:2"))  # a server's retry replaces its own wait only
    out = state.handle(Registered("w0", "worker", 0.2, to="rw0", num_keys=30))
    welcomed = {i.to: i.fields["rank"] for i in out if match(i, Reply, op="welcome")}
    assert welcomed == {"reg0": 0, "reg1-again": 1, "reg2": 2, "rw0": 0}


def test_a_server_that_waited_long_for_the_key_space_counts_its_silence_from_its_welcome(make):
    """A launched job's servers wait for the first worker's model (which may take longer
    than the silence limit to start) and cannot beat before their welcome: the wait is not
    silence. A server silent after its welcome still fails the job."""
    state = make(num_keys=0)
    assert state.handle(Registered("server", "server", 0.0, to="reg", link="L0",
                                   addr=ADDR)) == []
    out = state.handle(Registered("w0", "worker", 40.0, to="rw", num_keys=12))
    assert match(out[1], Reply, to="reg", op="welcome", rank=0)
    out = state.handle(TimePassed(40.1))
    assert not [i for i in out if isinstance(i, Finish) or match(i, AppendEvent,
                                                                   kind="job_failed")], out
    out = state.handle(TimePassed(40.0 + 30.5))
    failures = [i.failure for i in out if getattr(i, "failure", None)]
    assert failures and failures[-1].startswith(f"server s0 at {ADDR} has been silent for 30 s")


def test_a_checkpoint_cycle(make):
    state = make(servers=2, checkpoint_dir="/ck", checkpoint_every=1)
    register_all(state, servers=2)
    state.handle(Started("w0", 0.5, to="s0"))
    state.handle(Started("w1", 0.6, to="s1"))
    _, out = clock_round(state)
    ckpt = only(out, ToServers)[-1]
    assert match(ckpt, ToServers, op="checkpoint", tag="000000001", dir="/ck",
                 links=("L0", "L1"))
    assert state.handle(ShardSaved("s0", "000000001", 1.5, to="x")) == []
    # A push of the next round is counted while s1 still saves: the checkpoint records the
    # counters of the round it was asked at, which is what the shards' values hold.
    state.handle(Clocked("w0", 1, 32, 0.1, 1.55, to="c0-1"))
    assert state.handle(ShardSaved("s0", "000000001", 1.6, to="x")) == []  # s1 still saves
    out = state.handle(ShardSaved("s1", "000000001", 1.7, to="x"))
    assert len(out) == 2 and match(out[0], SaveCoordinatorState, tag="000000001")
    saved = out[0].state
    assert saved["rounds_applied"] == 1 and saved["samples_done"] == 64
    assert saved["steps_done"] == 2 and saved["worker_samples"] == {"0": 32, "1": 32}
    assert saved["sync"] == "bsp" and saved["num_keys"] == 10
    assert saved["elapsed_s"] == pytest.approx(0.6)  # when asked: the round's end
    assert match(out[1], AppendEvent, kind="checkpoint", tag="000000001", samples=64)
    assert state.schedule.latest == "000000001" and state.schedule.pending_tag is None
    # One in flight at a time; the next is due a round later.
    out = state.handle(Clocked("w1", 1, 32, 0.1, 2.2, to="c1-1"))
    assert match(only(out, ToServers)[-1], ToServers, op="checkpoint", tag="000000002")


def test_a_checkpoint_due_while_one_is_written_is_taken_when_that_one_commits(make):
    """Rounds faster than the disk: the checkpoint due at round 2 falls while round 1's is
    still written. It is asked as soon as round 1's commits, not at a step that may never
    come; but never while a push of the open round is counted and not yet applied."""
    state = make(checkpoint_dir="/ck", checkpoint_every=1)
    start_round(state)
    _, out = clock_round(state, 0, 1.0)
    assert match(only(out, ToServers)[-1], ToServers, op="checkpoint", tag="000000001")
    _, out = clock_round(state, 1, 1.5)  # round 2 applied: due, but 1 is being written
    assert [i.op for i in only(out, ToServers)] == ["apply_round"]
    out = state.handle(ShardSaved("s0", "000000001", 1.8, to="x"))
    assert match(out[0], SaveCoordinatorState, tag="000000001")
    ckpt = only(out, ToServers)
    assert len(ckpt) == 1 and match(ckpt[0], ToServers, op="checkpoint", tag="000000002")

    _, out = clock_round(state, 2, 2.0)  # round 3 applied while 2 is written
    assert [i.op for i in only(out, ToServers)] == ["apply_round"]
    state.handle(Clocked("w0", 3, 32, 0.1, 2.4, to="c0-3"))  # round 4 half pushed
    out = state.handle(ShardSaved("s0", "000000002", 2.5, to="x"))
    assert match(out[0], SaveCoordinatorState, tag="000000002")
    assert out[0].state["samples_done"] == 128
    assert not only(out, ToServers)  # the shards do not hold w0's push yet
    out = state.handle(Clocked("w1", 3, 32, 0.1, 2.6, to="c1-3"))
    assert [i.op for i in only(out, ToServers)] == ["apply_round", "checkpoint"]
    assert only(out, ToServers)[-1].fields["tag"] == "000000004"
    out = state.handle(ShardSaved("s0", "000000004", 2.9, to="x"))
    assert out[0].state["samples_done"] == 256 and not only(out, ToServers)


def test_a_resumed_job_goes_on_from_its_checkpoint(make):
    resume = {"rounds_applied": 7, "samples_done": 448, "steps_done": 14, "policy": {},
              "worker_samples": {"0": 224, "1": 224}, "elapsed_s": 3.0}
    state = make(resume_state=resume, checkpoint_dir="/ck", checkpoint_every=100,
                 resume={"dir": "/ck", "tag": "000000007"})
    out = state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr=ADDR))
    assert out[0].fields["job"]["restore"] == {"dir": "/ck", "tag": "000000007",
                                               "version_floor": 7}
    out = state.handle(Registered("w1", "worker", 0.1, to="rw"))
    assert out[0].fields["job"]["resume_samples"] == 224
    state.handle(Registered("w0", "worker", 0.1, to="rw0"))
    state.handle(Started("w0", 0.5, to="s0"))
    out = state.handle(Started("w1", 0.6, to="s1"))
    assert match(out[1], SendRelease, min_version=7)
    assert state.barrier.t_start == pytest.approx(0.6 - 3.0)


@pytest.fixture
def recovering(make):
    """Restartable servers: the checkpoint taken as the barrier opened is committed, one round
    is done and the checkpoint after it is still being written."""
    state = make(checkpoint_dir="/ck", checkpoint_every=1, restart_servers=True)
    out = start_round(state)
    assert match(out[-1], ToServers, op="checkpoint", tag="000000000")
    assert match(state.handle(ShardSaved("s0", "000000000", 0.7, to="x"))[0],
                 SaveCoordinatorState, tag="000000000")
    _, out = clock_round(state)
    assert match(out[-1], ToServers, op="checkpoint", tag="000000001")
    return state


def test_a_server_back_at_its_address_restores_its_shard(recovering):
    state = recovering
    out = state.handle(Registered("server", "server", 3.0, to="r-back", link="L-new", addr=ADDR))
    # The dead server never confirms the checkpoint in flight: abandoned.
    assert match(out[0], AppendEvent, kind="checkpoint_aborted", tag="000000001", server=0)
    assert state.schedule.pending_tag is None
    assert match(out[1], Reply, to="r-back", op="welcome", rank=0)
    assert out[1].fields["job"]["restore"] == {"dir": "/ck", "tag": "000000000",
                                               "version_floor": 1, "restart": True}
    assert out[1].fields["job"]["shard_range"] == [0, 10]
    assert match(out[2], AppendEvent, kind="server_rejoined", rank=0, checkpoint="000000000")
    assert state.members.server_links == ("L-new",)
    assert state.recovery.server_restarts == 1
    # Only the new process hears back; the old one's connection is left to time out.
    assert state.handle(Heartbeat("s0", 3.1, to="hb", link="L0")) == []
    assert state.handle(Heartbeat("s0", 3.2, to="hb", link="L-new")) == [Reply("hb", "ok", {})]
    out = state.handle(ShardRestored("s0", "000000000", 5, 0, 3.5, to="x"))
    assert match(out[0], AppendEvent, kind="server_restored", lost_updates=5)
    assert match(out[1], AppendMetric, kind="restart", server=0, lost_updates=5)
    assert state.recovery.lost_updates == 5


def test_a_server_back_with_nothing_to_restore_fails_the_job(make):
    state = make(restart_servers=True)
    start_round(state)
    out = state.handle(Registered("server", "server", 3.0, to="r-back", link="L-new", addr=ADDR))
    assert match(out[0], Reply, to="r-back", op="error", code="refused")
    assert isinstance(out[-1], Finish) and "no committed checkpoint" in out[-1].failure


def test_a_silent_restartable_server_is_waited_for(recovering):
    state = recovering
    for t in (10.0, 20.0, 30.0):
        for src in ("w0", "w1"):
            state.handle(Heartbeat(src, t, to="h"))
    out = state.handle(TimePassed(31.0))  # the server's last word was at 0.7
    assert out == [AppendEvent(31.0, "server_lost", {"rank": 0, "addr": ADDR})]
    assert state.handle(TimePassed(31.5)) == []  # noted once
    assert not state.finished


def test_the_end_takes_a_final_checkpoint_and_gives_the_evaluator_a_last_look(make):
    state = make(checkpoint_dir="/ck", checkpoint_every=100, evaluator=True)
    register_all(state)
    out = state.handle(Registered("ev", "observer", 0.2, to="r-ev"))
    assert match(out[0], Reply, op="welcome", rank=0)
    state.handle(Started("w0", 0.5, to="s0"))
    assert not only(state.handle(Started("w1", 0.6, to="s1")), SendRelease)  # evaluator?
    out = state.handle(Started("ev", 0.7, to="s-ev"))
    assert out[0] == Reply("s-ev", "ok", {}) and len(only(out, SendRelease)) == 2
    clock_round(state)
    state.handle(Bye("w0", 2.0, to="b0"))
    out = state.handle(Bye("w1", 2.1, to="b1"))
    assert match(out[-1], ToServers, op="checkpoint", tag="000000001")
    end = lambda: state.end.next_deadline(state.members.roster, state.schedule)  # noqa: E731
    assert end() == pytest.approx(2.1 + 60.0)  # a checkpoint being written holds it that long
    assert state.next_wakeup() == pytest.approx(0.7 + HB)  # the evaluator's liveness
    out = state.handle(ShardSaved("s0", "000000001", 2.5, to="x"))
    assert match(out[0], SaveCoordinatorState, tag="000000001") and not only(out, Finish)
    assert end() == pytest.approx(2.1 + 30.0)  # the evaluator's grace
    state.handle(Heartbeat("ev", 30.0, to="h"))
    assert state.handle(TimePassed(32.0)) == []
    assert state.handle(TimePassed(32.2)) == [Finish(None)]


# ---- the welcomes are typed slices of the job ---------------------------------------------------

def test_welcomes_parse_as_the_typed_slices_of_the_job(make):
    state = make(num_keys=0, sync="ssp", resume={"dir": "/ck", "tag": "000000003"},
                 checkpoint_dir="/ck", checkpoint_every=5,
                 resume_state={"rounds_applied": 0, "samples_done": 96, "steps_done": 3,
                               "policy": {"clocks": {"0": 2, "1": 1}},
                               "worker_samples": {"0": 64, "1": 32}, "elapsed_s": 1.0})
    server_out = state.handle(Registered("srv", "server", 0.0, to="r0", link="L0", addr=ADDR))
    assert server_out == []  # waits for the key space
    out = state.handle(Registered("w0", "worker", 0.1, to="r-w0", num_keys=12))
    server = ServerJob.from_dict(next(r for r in out if match(r, Reply, to="r0")).fields["job"])
    assert server.shard_range == (0, 12) and server.apply_mode == "arrival"
    assert server.optimizer == state.job.optimizer and server.server_threads == 1
    assert server.heartbeat_interval == state.job.limits.heartbeat_interval
    assert (server.restore.dir, server.restore.tag, server.restore.restart) == (
        "/ck", "000000003", False)
    worker = WorkerJob.from_dict(next(r for r in out if match(r, Reply, to="r-w0"))
                                 .fields["job"])
    assert worker.job.num_keys == 12 and worker.sync == "ssp" and worker.resume_samples == 64
    assert [(s.rank, s.addr, s.lo, s.hi) for s in worker.shards] == [(0, ADDR, 0, 12)]
    assert worker.job.limits == state.job.limits and worker.job.task == state.job.task
    assert worker.job.resume == state.job.resume
    # The key space learned is the core's: the job it was given still says 0.
    assert state.job.num_keys == 0 and state.members.num_keys == 12


def test_a_flood_of_registrations_before_the_servers_are_up_is_bounded(make):
    """Workers registering before every shard is up wait for it; a flood of them from ever
    new names is refused past MAX_WAITING, and one sender waits once however often it asks."""
    from paramserver.coordinator.membership import MAX_WAITING
    state = make(servers=2)
    for i in range(MAX_WAITING + 50):
        out = state.handle(Registered(f"w{i % (MAX_WAITING + 50)}", "worker", 0.1, to=f"r{i}"))
        assert bool(only(out, Reply)) == (i >= MAX_WAITING)
    assert len(state.members.pending_workers) == MAX_WAITING
    assert match(out[-1], Reply, op="error", code="refused")
    state.handle(Registered("w0", "worker", 0.2, to="again"))  # asked again: its newest asks
    assert len(state.members.pending_workers) == MAX_WAITING
    assert [e.to for e in state.members.pending_workers if e.src == "w0"] == ["again"]


def test_a_shard_that_cannot_write_its_part_gives_the_checkpoint_up_and_training_goes_on(make):
    state = make(checkpoint_dir="/ckpt", checkpoint_every=1, latest="000000000")
    start_round(state)
    clock_round(state)
    pending = state.schedule.pending_tag
    assert pending is not None
    out = state.handle(ShardSaved("s0", pending, 1.5, to="x",
                                  failed="No space left on device"))
    assert not only(out, SaveCoordinatorState)
    (warn,) = only(out, Warn)
    assert f"checkpoint {pending} given up" in warn.message and "No space" in warn.message
    assert any(match(i, AppendEvent, kind="checkpoint_failed") for i in out)
    assert state.schedule.pending_tag is None and state.schedule.latest == "000000000"
    first, second = clock_round(state, step=1, t=2.0)
    assert only(second, SendRelease)  # the job goes on; the next checkpoint is asked for
    assert state.schedule.pending_tag not in (None, pending)


@pytest.mark.parametrize("replicated,remedy", [
    (False, "--restart-servers restarts dead servers"),
    (True, "no backup took its shard over: both copies of it are gone; with --checkpoint-dir, "
           "--resume starts the job again")])
def test_a_silent_servers_failure_names_the_remedy_the_job_can_use(replicated, remedy):
    """--restart-servers cannot join --replicas 2: a replicated job's silent server is one no
    backup took over, and the failure says what that job can do instead."""
    from paramserver.coordinator.membership import Member
    from paramserver.coordinator.server_recovery import ServerRecovery
    recovery = ServerRecovery(False, 30.0, 120.0, replicated=replicated)
    failure = recovery.check(31.0, {"s0": Member(0, "tcp://h:1", last_seen=0.0)}, [])
    assert failure.startswith("server s0 at tcp://h:1 has been silent for 31 s: the job stops")
    assert remedy in failure
    assert ("--restart-servers" in failure) is not replicated
