"""Discrete-event engine: one sync policy, N virtual workers and the servers' links, in virtual time.

Each worker step is the live protocol, message by message (L = one-way latency):

    release decided at t  -> held until not_before (R2SP) -> reaches the worker L later
    pull request reaches the server L later: the version is read there, the reply queues on the
        server's outbound link (FIFO, model_bytes / servers / bandwidth per reply), lands L after
    compute (the compute model x the straggler factor at the compute's start)
    push queues on the server's inbound link; applied when its transfer ends (staleness then);
        the ack lands L later; the clock reaches the coordinator L after that -> Pushed

Symmetric shards see the same requests in the same order, so one queue per direction stands
for all S servers. Versions count applied pushes (arrival mode) or applied rounds (round mode),
exactly as the servers count them. No clocks, threads or I/O: records go to a sink.

Replayed communication (`comm`, see sim.trace.CommReplay) replaces the links: each step's pull
and push take the times a live run recorded for that worker and step, the worker's unrecorded
time per step (sleep overshoot, bookkeeping) follows its compute, and the coordinator's messages
take comm.release_latency (release -> worker) and comm.clock_latency (clock -> coordinator).
Both timings live in sim.comm; the engine holds one of them.

The policy runs in a PolicyHost (policies.host): it holds releases until their not_before,
ticks the policy, fills each release's min_version and stop. The end: `steps` per
worker, or a sample budget shared by all workers (`max_samples`, the host's), reached when a
clock brings the count to it, before the policy hears of that push; every release from then on
tells its worker to stop. The engine checks what the host lets go against its workers' state.

Membership (`membership`, a sim.core.membership.Schedule): workers join and leave at given virtual
times through the events the live coordinator sends. A join takes the lowest free rank and is
Joined(late=True) (the policy starts it at its next release). A leave is a preemption notice:
a worker with a step under way finishes it, and its clock is its last (the step counts, a
release the policy makes for it then is kept back, then Left(reason="preempted")); a worker
waiting for a release leaves when the release comes, its step unrun. Ranks run up to `workers`
+ the joins (the cost model and the straggler must cover them). An elastic job's global-batch
rule (`batch_rule`, policies.batch_rule) goes to the host, as the live coordinator's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from paramserver.policies.base import ApplyRound, PolicyError, Pushed, Release, SyncPolicy
from paramserver.policies.batch_rule import BatchRule
from paramserver.policies.host import PolicyHost
from paramserver.sim.core.comm import LinkSteps, ReplaySteps
from paramserver.sim.core.membership import Change, Schedule

# Event kinds (indexes into Engine.handlers) and worker states (GONE: left, or a free rank).
READ, COMPUTED, APPLIED, CLOCK, LEAVE, WAKE, MEMBER = range(7)
WAITING, RELEASED, BUSY, GONE = range(4)


class SimError(RuntimeError):
    """The policy broke the protocol (a release for a busy worker, a deadlock...)."""


@dataclass(frozen=True)
class Network:
    """Per server link and direction: bandwidth in bytes/s; latency one-way, per message."""

    model_bytes: float = 0.0
    bandwidth: float = math.inf
    latency: float = 0.0
    servers: int = 1

    @property
    def transfer_time(self) -> float:
        """Seconds one worker's pull or push holds a server link."""
        if self.bandwidth == math.inf or self.model_bytes == 0:
            return 0.0
        return self.model_bytes / self.servers / self.bandwidth


class NullSink:
    """Drops every record (for benchmarks of the engine alone)."""

    def step(self, t, w, step, batch, compute, wait, pull, push, staleness, factor, extra):
        pass

    def left(self, t, w, reason):
        pass

    def event(self, t, kind, data):
        pass

    def record(self, record):
        pass


class Engine:
    """Runs `policy` with `workers` workers of `steps` steps each; `run()` until nothing is left.

    cost(worker, step, batch) -> seconds; straggler: an object with factor(worker, step, t) or
    None; trainer: optional, gets pull / push / apply_round / advance calls (see sim.train).
    max_samples: a budget shared by all workers (steps may then be None: no per-worker cap).
    comm: replayed communication times instead of `network` (see the module doc).
    membership: joins and leaves in virtual time; batch_rule: the elastic job's global-batch
    rule (both: see the module doc). `ranks` is the number of ranks the run can hold.
    """

    def __init__(self, policy: SyncPolicy, workers: int, steps: int | None, cost,
                 network: Network, sink=None, straggler=None, trainer=None,
                 max_samples: int | None = None, comm=None,
                 membership: Schedule | None = None, batch_rule: BatchRule | None = None):
        if steps is None and not max_samples:
            raise ValueError("need steps per worker or a sample budget (max_samples)")
        if workers < 1 or (steps is not None and steps < 1) or (max_samples or 1) < 1:
            raise ValueError(f"need workers >= 1, steps >= 1 and max_samples >= 1, got "
                             f"{workers}, {steps}, {max_samples}")
        self.policy, self.n, self.cost = policy, workers, cost
        self.changes: tuple[Change, ...] = membership.changes if membership else ()
        self.ranks = ranks = workers + sum(c.kind == "join" for c in self.changes)
        self.host = PolicyHost(policy, max_samples or None, batch_rule=batch_rule)
        self.steps = math.inf if steps is None else steps
        self.net, self.sink = network, sink or NullSink()
        self.straggler, self.trainer = straggler, trainer
        self.round_mode = policy.apply_mode == "round"
        self.comm = LinkSteps(network) if comm is None else ReplaySteps(comm)
        self.now, self.version = 0.0, 0  # version: the servers' (pushes or rounds applied)
        self._seq = itertools.count()  # ties in time go in the order they were scheduled
        self.events = 0
        self.queue: list[tuple[float, int, int, int]] = []
        self.wake_at: float | None = None  # the host's next_wakeup, once scheduled
        z = [0] * ranks
        self.status = [WAITING] * workers + [GONE] * (ranks - workers)
        self.done, self.step, self.batch = z[:], z[:], z[:]
        self.scale, self.pulled, self.min_version = [1.0] * ranks, z[:], z[:]
        # In arrival mode under a policy whose releases may name a lockstep round (auto's bsp
        # and lbbsp): per worker, the round its step belongs to (0: none), and the round the
        # servers sum now, applied as the live store does (ShardStore.push). None for every
        # other policy, whose hot path then pays nothing for it.
        self.round_of = z[:] if not self.round_mode and policy.sums_rounds else None
        self.open_round = 0
        self.wait_from = [-self.comm.start_wait(w) for w in range(workers)] + [0.0] * (
            ranks - workers)
        self.wait_s, self.pull_s = [0.0] * ranks, [0.0] * ranks
        self.push_from, self.push_s = [0.0] * ranks, [0.0] * ranks
        self.compute_s, self.factor, self.stale = [0.0] * ranks, [1.0] * ranks, z[:]
        # The step each worker's next release must name; -1: any (a joiner starts where the
        # policy puts it: BSP's round, SSP's slowest clock).
        self.expect = z[:]
        self.leaving: set[int] = set()  # preemption notices not yet acted on
        self.leave_reason: dict[int, str] = {}  # workers whose goodbye is on its way
        self.membership_log: list[dict] = []  # each change: applied (rank, head count) or skipped
        self.handlers = (None, None, None, self._clock, self._leave, self._wake,
                         self._member)  # run(): the first three inline
        self.started = False

    # ---- what the host counts -------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self.host.stopping

    @property
    def samples(self) -> int:
        return self.host.samples_done

    @property
    def steps_done(self) -> int:
        return self.host.steps_done

    @property
    def rounds(self) -> int:
        return self.host.rounds_applied

    @property
    def total_steps(self) -> int | None:
        """Steps of the whole run when fixed (steps per worker), None under a sample budget or
        when workers join and leave."""
        return None if self.steps == math.inf or self.changes else self.n * self.steps

    @property
    def alive(self) -> int:
        """Workers in the job now (a worker with a notice counts until it has left)."""
        return sum(s != GONE for s in self.status)

    # ---- driving --------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the start barrier: every worker joins at t = 0, in rank order."""
        self.started = True
        self.sink.event(0.0, "barrier_open", {"workers": self.n})
        self._take(self.host.joined_all(range(self.n), 0.0), 0.0)
        for i, c in enumerate(self.changes):
            self._at(c.at, MEMBER, i)

    def run(self, max_events: int | None = None) -> bool:
        """Process events (at most `max_events`); True once the simulation has ended."""
        q, pop, push, seq = self.queue, heappop, heappush, self._seq
        handlers, tr = self.handlers, self.trainer
        budget = math.inf if max_events is None else max_events
        # The three events of a step's middle run inline on locals: a method call and a dozen
        # attribute lookups per event were a third of the engine's time at 10,000 workers.
        comm = self.comm
        pull_lag, ack_lag, clock_lag = comm.pull_lag, comm.ack_lag, comm.clock_lag
        comm_pull, compute_end, comm_push = comm.pull, comm.compute_end, comm.push
        cost, straggler, round_mode, clock = self.cost, self.straggler, self.round_mode, self._clock
        wait_s, wait_from, min_version, pulled = (self.wait_s, self.wait_from, self.min_version,
                                                  self.pulled)
        step_of, batch_of, factor, compute_s = self.step, self.batch, self.factor, self.compute_s
        status, push_from, stale, pull_s, push_s = (self.status, self.push_from, self.stale,
                                                    self.pull_s, self.push_s)
        round_of = self.round_of
        # (with a membership schedule a clock may be a leaver's last: _clock sees to it)
        plain_clock = tr is None and comm.real is None and not self.changes
        sink_step, host_pushed, take, done = self.sink.step, self.host.pushed, self._take, self.done
        n, t = 0, self.now
        try:
            if not self.started:
                self.start()
            while q and n < budget:
                t, _, kind, w = pop(q)
                if tr is not None:  # the trainer reads the engine's time
                    if t > tr.next_eval:
                        tr.advance(t, self)
                    self.now = t
                n += 1
                if kind == READ:  # the pull is at the server: read the version, reply, compute
                    wait_s[w] = t - pull_lag - wait_from[w]  # since the release reached it
                    v = self.version
                    if v < min_version[w]:
                        raise SimError(f"t={t}: worker {w} pulls version {v} < min_version "
                                       f"{min_version[w]}")
                    pulled[w] = v
                    if tr is not None:
                        tr.pull(w, v)
                    step = step_of[w]
                    got, pull_s[w] = comm_pull(t, w, step)
                    f = 1.0 if straggler is None else straggler.factor(w, step, got)
                    factor[w] = f
                    compute_s[w] = c = cost(w, step, batch_of[w]) * f
                    status[w] = BUSY
                    push(q, (compute_end(got, w, step, c), next(seq), COMPUTED, w))
                elif kind == COMPUTED:
                    push_from[w] = t
                    push(q, (comm_push(t, w, step_of[w]), next(seq), APPLIED, w))
                elif kind == APPLIED:  # staleness as the server computes it, then the ack
                    v, p = self.version, pulled[w]
                    rid = 0
                    if round_of is not None:
                        rid = round_of[w]
                        if self.open_round and rid != self.open_round:
                            v += 1  # a push of another round (or none) closes the open one
                            self.version, self.open_round = v, 0
                    s = v - p
                    stale[w] = s if s > 0 else 0
                    if tr is not None:
                        tr.push(w, self)
                    if rid:
                        self.open_round = rid  # summed: applied once, by the round's close
                    elif not round_mode:
                        self.version = v + 1
                    acked = t + ack_lag
                    push_s[w] = acked - push_from[w]
                    wait_from[w] = acked
                    if clock_lag:
                        push(q, (acked + clock_lag, next(seq), CLOCK, w))
                    else:
                        self.now = t
                        clock(t, w)
                elif kind == CLOCK and plain_clock:  # _clock without trainer or measured times
                    step, batch, c = step_of[w], batch_of[w], compute_s[w]
                    sink_step(t, w, step, batch, c, wait_s[w], pull_s[w], push_s[w], stale[w],
                              factor[w], None)
                    done[w] += 1
                    status[w] = WAITING
                    take(host_pushed(Pushed(w, step, t, batch, c)), t)
                else:
                    self.now = t
                    handlers[kind](t, w)
        except PolicyError as exc:  # what the host or the policy saw: a protocol breach too
            self.now = t
            raise SimError(f"t={self.now}: {exc}") from exc
        except SimError:
            self.now = t
            raise
        self.now = t
        self.events += n
        if q:
            return False
        self._check_everyone_left()
        if tr is not None:
            tr.finish(self.now, self)
        return True

    def _at(self, t: float, kind: int, w: int) -> None:
        heappush(self.queue, (t, next(self._seq), kind, w))

    # ---- the worker's step: read, computed and applied run inline in run() -----------------------
    def _clock(self, t: float, w: int) -> None:
        """The clock reaches the coordinator: the record is written and the policy told."""
        step, batch, c = self.step[w], self.batch[w], self.compute_s[w]
        extra = None if self.trainer is None else self.trainer.record(w)
        measured = self.comm.real  # None for modelled links: nothing was measured
        real = None if measured is None else measured(w, step)
        if real is not None:
            extra = {"real_compute_s": round(min(real, c), 6), **(extra or {})}
        self.sink.step(t, w, step, batch, c, self.wait_s[w], self.pull_s[w], self.push_s[w],
                       self.stale[w], self.factor[w], extra)
        self.done[w] += 1
        if w in self.leaving:  # its last step: counted, then it is gone (as a live clock with
            self.leaving.discard(w)  # leave: a release made for it now is kept back)
            self.status[w] = RELEASED  # neither waiting nor free until it has left
            outs = self.host.pushed(Pushed(w, step, t, batch, c))
            self._take([d for d in outs if type(d) is not Release or d.worker != w], t)
            self._gone(t, w, "preempted")
            return
        self.status[w] = WAITING
        self._take(self.host.pushed(Pushed(w, step, t, batch, c)), t)

    def _leave(self, t: float, w: int) -> None:
        self.leaving.discard(w)
        self._gone(t, w, self.leave_reason.pop(w, "done"))

    def _gone(self, t: float, w: int, reason: str) -> None:
        self.status[w] = GONE
        self.sink.left(t, w, reason)
        left = {"worker": w, "reason": reason}
        if self.changes:  # an elastic job's events say how many are left (as live)
            left["workers"] = self.alive
            if reason == "preempted":
                self.membership_log.append({"t": t, "change": "left", "worker": w,
                                            "workers": left["workers"]})
        self.sink.event(t, "worker_left", left)
        self._take(self.host.left(w, t, reason), t)
        if self.changes and not self.alive:
            self._end_of_changes(t)

    # ---- membership -----------------------------------------------------------------------------
    def _member(self, t: float, i: int) -> None:
        """The i-th change of the schedule is due."""
        c = self.changes[i]
        if self.host.stopping:
            self._skip(t, c, "the budget is spent")
        elif c.kind == "join":
            self._join(t)
        else:
            self._notice(t, c)

    def _join(self, t: float) -> None:
        """A new worker registers: the lowest free rank, fresh state, a late join."""
        status = self.status
        w = status.index(GONE)  # the ranks hold every join, so one is free
        status[w] = WAITING
        self.done[w], self.expect[w], self.wait_from[w] = 0, -1, t
        workers = self.alive
        self.membership_log.append({"t": t, "change": "joined", "worker": w, "workers": workers})
        self.sink.event(t, "worker_joined", {"worker": w, "workers": workers,
                                             "round": self.host.rounds_applied,
                                             "samples": self.host.samples_done})
        self.sink.record({"t": t, "kind": "membership", "change": "joined", "worker": w,
                          "workers": workers})
        self._take(self.host.joined(w, t, late=True), t)

    def _notice(self, t: float, c: Change) -> None:
        """A preemption notice: acted on at the worker's next clock, or its next release."""
        status, leaving = self.status, self.leaving
        training = [w for w in range(self.ranks) if status[w] != GONE and w not in leaving
                    and w not in self.leave_reason]
        w = c.worker if c.worker is not None else (training[-1] if training else None)
        if w is None or w not in training:
            self._skip(t, c, "no worker training" if w is None else
                       f"worker {w} is not training")
            return
        # Busy: its next clock is its last (_clock); waiting: it leaves when its release
        # comes (_release), as a live worker's SIGTERM handler does.
        leaving.add(w)
        self.sink.event(t, "preemption_notice", {"worker": w})

    def _skip(self, t: float, c: Change, why: str) -> None:
        self.membership_log.append({"t": t, "change": f"skipped {c.text()}", "why": why})
        self.sink.event(t, "membership_skipped", {"change": c.text(), "why": why})

    def _end_of_changes(self, t: float) -> None:
        """Nobody is left: with the budget spent, or with no join to come, the job is over and
        the changes still due are skipped now (not at their time, which would stretch the
        run's virtual time)."""
        q = self.queue
        due = sorted((e for e in q if e[2] == MEMBER), key=lambda e: e[:2])
        if not due:
            return
        if not self.host.stopping and any(self.changes[e[3]].kind == "join" for e in due):
            return  # a worker will come: the job goes on then
        q[:] = [e for e in q if e[2] != MEMBER]  # in place: run() holds this list
        heapify(q)
        for e in due:
            self._skip(t, self.changes[e[3]], "the job had ended")

    def _wake(self, t: float, _: int) -> None:
        if self.wake_at is not None and self.wake_at <= t:
            self.wake_at = None
            self._take(self.host.advance(t), t)

    # ---- what the host lets go ------------------------------------------------------------------
    def _take(self, outs: list, t: float) -> None:
        for d in outs:
            kind = type(d)
            if kind is Release:
                self._release(d, t)
            elif kind is ApplyRound:
                self._apply_round(d, t)
            else:  # a Note
                self.sink.event(t, d.kind, d.data)
        wake = self.host.next_wakeup()
        if wake is not None and (self.wake_at is None or wake < self.wake_at):
            self.wake_at = wake if wake > t else t
            self._at(self.wake_at, WAKE, -1)

    def _release(self, d: Release, t: float) -> None:
        """The release leaves the coordinator: it says stop past the budget or the last step."""
        w = d.worker
        if not 0 <= w < self.ranks or self.status[w] != WAITING:
            state = "unknown" if not 0 <= w < self.ranks else ("waiting", "released", "busy",
                                                               "gone")[self.status[w]]
            raise SimError(f"t={t}: release {d} for a worker that is {state}")
        expect = self.expect[w]
        if (expect >= 0 and d.step != expect) or d.batch_size < 1 or not d.scale > 0:
            raise SimError(f"t={t}: bad release {d}: worker {w} is at step {expect}")
        self.expect[w] = d.step + 1
        self.status[w] = RELEASED
        self.step[w], self.batch[w], self.scale[w] = d.step, d.batch_size, d.scale
        self.min_version[w] = d.min_version
        if self.round_of is not None:
            self.round_of[w] = d.round_id
        if d.stop or self.done[w] >= self.steps or w in self.leaving:
            # the worker's goodbye comes back (a preempted one's step unrun)
            self.leave_reason[w] = "done" if w not in self.leaving else "preempted"
            self._at(t + self.comm.to_leave, LEAVE, w)
        else:
            heappush(self.queue, (t + self.comm.to_read, next(self._seq), READ, w))

    def _apply_round(self, d: ApplyRound, t: float) -> None:
        if self.round_mode:
            self.version += 1
        elif d.step == self.open_round:  # (a round already closed by a push: nothing more)
            self.version, self.open_round = self.version + 1, 0
        if self.trainer is not None:
            self.trainer.apply_round(d.step, self)
        self.sink.event(t, "apply_round", {"step": d.step, "contributors": list(d.contributors)})

    def _check_everyone_left(self) -> None:
        stuck = [w for w in range(self.ranks) if self.status[w] != GONE]
        if stuck:
            raise SimError(f"deadlock at t={self.now}: {len(stuck)} workers never finished "
                           f"(first: {stuck[:10]}); steps done: "
                           f"{[self.done[w] for w in stuck[:10]]}")
