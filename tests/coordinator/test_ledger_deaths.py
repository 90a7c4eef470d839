"""Exactly-once samples on the coordinator core while workers join, clock, leave and die.

A model of the workers drives the real CoordinatorState (no sockets): each holds the samples
of the release it was sent, and when the core accepts its clock those samples are seen, by an
independent count kept here. Workers die (fall silent: declared dead after the heartbeat
timeout) at any point: between a release and its clock, with a clock queued, after a repeat
of a clock. Whatever the schedule, no position of an epoch is seen twice, nothing seen is
lent again, and the ledger's counts equal ours.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from paramserver.coordinator.events import (
    Bye, Clocked, Heartbeat, Registered, Reply, SendRelease, Started, TimePassed,
)
from paramserver.coordinator.ledger import SampleLedger
from paramserver.core.pieces import Piece
from paramserver.coordinator.state import CoordinatorState
from paramserver.spec.job import JobSpec, Limits, SyncSpec

SIZE = 23  # a prime, so that batches straddle epochs
HB = 5.0


def job(sync: str, lo: int, hi: int) -> JobSpec:
    return JobSpec(workers=hi, min_workers=lo, servers=1, batch_size=5, num_keys=10,
                   sync=SyncSpec(sync), eval_interval=0.0, batch_rule="fixed",
                   limits=Limits(heartbeat_timeout=HB, start_timeout=1e9))


class Fleet:
    """The workers as the core sees them from outside: who holds which release."""

    def __init__(self, state: CoordinatorState):
        self.state = state
        self.now = 1.0
        self.n = 0
        self.alive: dict[str, dict] = {}  # src -> {"token", "step", "samples", "clocked"}
        self.dead: set[str] = set()  # silent, not yet declared dead
        # Declared dead but still running (stalled, not killed): (step, samples) of the release
        # each holds, whose clock may still come.
        self.zombies: dict[str, tuple] = {}
        self.seen: dict[int, list[int]] = {}  # epoch -> positions whose clock was accepted
        self.held: dict[str, list] = {}  # src -> the samples of its release, while unclocked
        self.last_answer: dict[str, tuple] = {}

    def tick(self, dt: float = 0.01) -> float:
        self.now += dt
        return self.now

    def handle(self, event) -> list:
        out = self.state.handle(event)
        for i in out:
            if isinstance(i, SendRelease):
                src = i.to[1]
                w = self.alive.get(src)
                if w is None or src in self.dead:
                    continue  # an answer nobody reads
                if i.stop:
                    continue
                # A worker trains on what the release names (a repeat of a release: the same).
                assert i.samples is not None, "an elastic release must name its samples"
                w["step"], w["samples"], w["clocked"] = i.step, i.samples, False
                self.held[src] = i.samples
        self.state.check_invariants()
        return out

    def join(self) -> None:
        src = f"w{self.n}"
        self.n += 1
        out = self.handle(Registered(src, "worker", self.tick(), to=("r", src)))
        if not any(isinstance(i, Reply) and i.op == "welcome" for i in out):
            return  # refused (past MAX)
        self.alive[src] = {"step": None, "samples": None, "clocked": False}
        self.handle(Started(src, self.tick(), to=("s", src), data_len=SIZE))

    def runnable(self) -> list[str]:
        return sorted(s for s, w in self.alive.items()
                      if s not in self.dead and w["samples"] is not None and not w["clocked"])

    def clock(self, src: str, leave: str | None = None) -> None:
        w = self.alive[src]
        step, samples = w["step"], w["samples"]
        batch = sum(hi - lo for _, lo, hi in samples)
        self.held.pop(src, None)  # (the answer may lend it the next release's)
        w["clocked"] = True  # it waits for its next release
        out = self.handle(Clocked(src, step, batch, 0.01, self.tick(), to=("c", src),
                                  leave=leave))
        refused = any(isinstance(i, Reply) and i.op == "error" for i in out)
        if refused:  # the worker exits; what it held was given back when it was dropped
            self.alive.pop(src)
            return
        for epoch, lo, hi in samples:  # its step ran on them: seen
            self.seen.setdefault(epoch, []).extend(range(lo, hi))
        self.last_answer[src] = (step, batch)
        if leave is not None:
            del self.alive[src]

    def repeat_clock(self, src: str) -> None:
        """The same clock again (its answer lost): the step is not counted twice."""
        self.alive[src]  # (a KeyError for a worker that left)
        step, batch = self.last_answer[src]
        self.handle(Clocked(src, step, batch, 0.01, self.tick(), to=("c", src)))

    def bye(self, src: str) -> None:
        self.handle(Bye(src, self.tick(), to=("b", src), reason="preempted"))
        del self.alive[src]
        self.held.pop(src, None)

    def die(self, src: str) -> None:
        self.dead.add(src)

    def time_passes(self) -> None:
        """The living beat; the dead are declared dead."""
        t = self.now + HB + 0.5
        for src in sorted(self.alive):
            if src not in self.dead:
                self.handle(Heartbeat(src, t, to=("h", src)))
        self.now = t + 0.1
        self.handle(TimePassed(self.now))
        for src in list(self.dead):
            if src not in self.state.members.roster.workers:
                self.dead.discard(src)
                w = self.alive.pop(src, None)
                self.held.pop(src, None)
                if w is not None and w["samples"] is not None and not w["clocked"]:
                    self.zombies[src] = (w["step"], w["samples"])

    def late_clock(self, src: str) -> None:
        """A worker declared dead clocks after all: refused, its samples not seen (they went
        back to the pool when it was dropped)."""
        step, samples = self.zombies.pop(src)
        batch = sum(hi - lo for _, lo, hi in samples)
        out = self.handle(Clocked(src, step, batch, 0.01, self.tick(), to=("c", src)))
        assert any(isinstance(i, Reply) and i.op == "error" for i in out)

    def revive(self, src: str) -> None:
        """Silent for less than the timeout: it is alive after all."""
        self.dead.discard(src)


ACTIONS = st.lists(st.tuples(st.sampled_from(
    ["join", "clock", "clock", "clock", "leave", "bye", "die", "time", "repeat", "late",
     "revive"]),
    st.integers(0, 7)), max_size=60)


def check(fleet: Fleet) -> None:
    ledger: SampleLedger = fleet.state.elastic.ledger
    for epoch, positions in fleet.seen.items():
        assert len(positions) == len(set(positions)), f"epoch {epoch}: a sample seen twice"
        assert ledger.consumed(epoch) == len(positions), (epoch, ledger.consumed(epoch),
                                                         len(positions))
        if ledger.epochs[epoch].completed:
            assert sorted(positions) == list(range(SIZE))
    seen = {(e, i) for e, ix in fleet.seen.items() for i in ix}
    held = [(e, i) for s in fleet.held for e, lo, hi in fleet.held[s] for i in range(lo, hi)]
    assert len(held) == len(set(held)), "a position lent to two workers at once"
    assert not seen & set(held), "a position seen and lent again"
    ledger.check_invariants()


@settings(max_examples=300, deadline=None)
@given(sync=st.sampled_from(["bsp", "ssp", "asp"]), lo=st.integers(1, 2),
       actions=ACTIONS)
def test_every_sample_is_seen_once_whoever_dies(sync, lo, actions):
    state = CoordinatorState(job(sync, lo, 4))
    state.handle(Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1"))
    fleet = Fleet(state)
    for _ in range(lo):
        fleet.join()
    for action, k in actions:
        if action == "join":
            fleet.join()
        elif action == "time":
            fleet.time_passes()
        elif action == "late":
            if fleet.zombies:
                fleet.late_clock(sorted(fleet.zombies)[k % len(fleet.zombies)])
        elif action == "revive":
            if fleet.dead:
                fleet.revive(sorted(fleet.dead)[k % len(fleet.dead)])
        elif action == "repeat":
            done = sorted(s for s in fleet.last_answer if s in fleet.alive
                          and s not in fleet.dead)
            if done:
                fleet.repeat_clock(done[k % len(done)])
        else:
            who = fleet.runnable() if action in ("clock", "leave") else sorted(
                s for s in fleet.alive if s not in fleet.dead)
            if not who:
                continue
            src = who[k % len(who)]
            if action == "clock":
                fleet.clock(src)
            elif action == "leave":
                fleet.clock(src, leave="preempted")
            elif action == "bye":
                fleet.bye(src)
            else:
                fleet.die(src)
        check(fleet)
    fleet.time_passes()
    check(fleet)


def test_a_clock_repeated_after_the_job_failed_hears_the_failure():
    """A worker clocks, its server falls silent and the job fails while the worker waits for
    the round; the failure it was answered is lost and it clocks again. Before, the repeat was
    answered with the release it had already trained on (its samples lent a second time)."""
    state = CoordinatorState(job("bsp", 2, 4))
    state.handle(Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1"))
    fleet = Fleet(state)
    fleet.join()
    fleet.join()
    fleet.clock("w0")
    while state.failure is None:  # the server never beats: declared dead, the job fails
        fleet.time_passes()
    out = fleet.handle(Clocked("w0", 0, 5, 0.01, fleet.tick(), to=("c2", "w0")))
    assert [(type(i), i.op, i.fields["code"]) for i in out] == [(Reply, "error", "failed")]
    assert "silent" in out[0].fields["msg"]
    check(fleet)


# ---- the ledger alone: a clock consumes only the pieces lent for its step ------------------

STEP_OPS = st.lists(st.tuples(st.sampled_from(["lend", "clock", "stale_clock", "die"]),
                              st.integers(0, 3), st.integers(0, 30)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 40), ops=STEP_OPS)
def test_a_clock_consumes_the_pieces_of_its_own_step_only(size, ops):
    ledger = SampleLedger(size)
    step: dict[int, int] = {}  # worker -> its next step
    held: dict[int, tuple[int, tuple[Piece, ...]]] = {}  # worker -> (step, pieces) unclocked
    seen: dict[int, list[int]] = {}
    back = 0
    for op, worker, n in ops:
        if op == "lend" and worker not in held:
            s = step.get(worker, 0)
            held[worker] = (s, ledger.lend(worker, n, s))
        elif op == "clock" and worker in held:
            s, pieces = held.pop(worker)
            ledger.consume(worker, s)
            step[worker] = s + 1
            for p in pieces:
                seen.setdefault(p.epoch, []).extend(range(p.lo, p.hi))
        elif op == "stale_clock":  # a clock of a step it holds no pieces for
            s = held[worker][0] if worker in held else step.get(worker, 0)
            assert ledger.consume(worker, s - 1 - n % 2) == []
        elif op == "die":
            s, pieces = held.pop(worker, (0, ()))
            assert ledger.give_back(worker) == sum(p.size for p in pieces)
            assert ledger.give_back(worker) == 0  # once
            back += sum(p.size for p in pieces)
        ledger.check_invariants()
        out = [(p.epoch, i) for _, ps in held.values() for p in ps for i in range(p.lo, p.hi)]
        assert len(out) == len(set(out))
        assert not set(out) & {(e, i) for e, ix in seen.items() for i in ix}
    for epoch, positions in seen.items():
        assert len(positions) == len(set(positions))
        assert ledger.consumed(epoch) == len(positions)


# ---- the same, one schedule at a time ------------------------------------------------------

def _two_workers():
    state = CoordinatorState(job("asp", 2, 4))  # both start at the barrier
    state.handle(Registered("srv", "server", 0.0, to="r-srv", link="L", addr="tcp://h:1"))
    for w in ("w0", "w1"):
        state.handle(Registered(w, "worker", 0.1, to=("r", w)))
    out = []
    for w in ("w0", "w1"):
        out += state.handle(Started(w, 0.5, to=("s", w), data_len=SIZE))
    return state, {i.to[1]: i.samples for i in out if isinstance(i, SendRelease)}


def test_a_repeated_clock_is_answered_with_the_same_samples():
    state, lent = _two_workers()
    first = next(i for i in state.handle(Clocked("w0", 0, 5, 0.1, 1.0, to=("c", "w0")))
                 if isinstance(i, SendRelease))
    assert first.to == ("c", "w0") and first.samples == [[0, 10, 15]]
    again = state.handle(Clocked("w0", 0, 5, 0.1, 1.2, to=("c2", "w0")))
    assert [(i.to, i.step, i.samples) for i in again if isinstance(i, SendRelease)] == [
        (("c2", "w0"), 1, first.samples)]
    assert state.elastic.ledger.consumed(0) == 5  # the repeat counted nothing


def test_a_dead_workers_samples_go_back_once_and_its_late_clock_is_refused():
    state, lent = _two_workers()
    state.handle(Clocked("w0", 0, 5, 0.1, 1.0, to=("c", "w0")))  # w1 dies holding its release
    state.handle(Heartbeat("w0", 5.9, to=("h", "w0")))
    out = state.handle(TimePassed(6.0))
    left = next(i for i in out if getattr(i, "kind", None) == "worker_left")
    assert left.data["reason"] == "dead" and left.data["samples_returned"] == 5
    ledger = state.elastic.ledger
    assert ledger.free == {0: [tuple(lent["w1"][0][1:])]}
    out = state.handle(Clocked("w1", 0, 5, 0.1, 6.1, to=("c", "w1")))  # it was only stalled
    assert any(isinstance(i, Reply) and i.op == "error" for i in out)
    assert ledger.consumed(0) == 5 and ledger.free  # not seen, still free
    # the next release takes the dead worker's positions first, once
    again = [i.samples for i in out if isinstance(i, SendRelease)]
    assert again == []
    state.handle(Registered("w2", "worker", 6.2, to=("r", "w2")))
    out = state.handle(Started("w2", 6.3, to=("s", "w2"), data_len=SIZE))
    handed = [p for i in out if isinstance(i, SendRelease) for p in i.samples] + [
        p for s in again for p in s]
    assert handed.count(lent["w1"][0]) == 1 and not ledger.free
    ledger.check_invariants()
