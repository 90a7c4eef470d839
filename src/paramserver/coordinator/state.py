"""The coordinator's logic as a pure state machine: events in, instructions out.

`CoordinatorState.handle(event)` returns the instructions (replies, releases, messages to the
servers, log lines, a checkpoint to write, the end of the job) for the node to carry out; it
does no I/O and reads no clock: times come in the events. It is a router over parts that own
their state. The event parts (Steps, Registration, Rejoins, Checkpoints, Observations) declare
the events they take in `handlers()`; the bookkeeping parts below them (Membership, the
PolicyHost, StartBarrier, Budget, EndOfJob, ServerRecovery, Replicas, OrphanedShards,
Resharding, Elastic) are called with what they need. The router keeps the envelope, the timer
and heartbeat events, the carrying out of what the pure parts return, and, like dask's
WorkerState, one housekeeping pass at the end of every event (take-back, start barrier,
budget, end of job); the node's loop
turns are `TimePassed` events.
"""

from __future__ import annotations

from pathlib import PurePath

from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.coordinator.checkpoints import Checkpoints
from paramserver.coordinator.clip_rounds import ClipRounds
from paramserver.coordinator.collectives import Collectives
from paramserver.coordinator.elastic import Elastic
from paramserver.coordinator.events import (
    AppendEvent, AppendMetric, Clocked, DrainAsked, Finish, Heartbeat, ReplicaReport, Reply,
    Resharded, ShardRestored, Started, TimePassed, ToServers, Warn,
)
from paramserver.coordinator.membership import Membership, UnknownMember
from paramserver.coordinator.observations import Observations
from paramserver.coordinator.orphans import OrphanedShards
from paramserver.coordinator.progress import Budget, EndOfJob, StartBarrier, waiting_for
from paramserver.coordinator.registration import Registration
from paramserver.coordinator.rejoins import Rejoins
from paramserver.coordinator.replica_history import ReplicaHistory
from paramserver.coordinator.replicas import Replicas
from paramserver.coordinator.reshard import Resharder
from paramserver.coordinator.resharding import Outcome, Resharding, Situation
from paramserver.coordinator.script_optimizer import ScriptOptimizer
from paramserver.coordinator.server_recovery import ServerRecovery
from paramserver.coordinator.steps import Steps
from paramserver.coordinator.worker_history import WorkerHistory
from paramserver.policies import (
    PolicyError, PolicyHost, make_policy,
)
from paramserver.spec.job import JobSpec

_OK: dict = {}  # the empty fields of an "ok" reply; never changed
_STEP_REQUESTS = (Clocked, Started)  # a worker's asks for its next release



class CoordinatorState:
    """The coordinator's state and rules, for the job `job`. `resume` is the coordinator's part
    of the checkpoint the job resumes from (as saved in SaveCoordinatorState);
    `latest_checkpoint` the newest committed tag in the checkpoint folder when the node
    started. The key space (job.num_keys, or learned from the first worker when that is 0) is
    the state's own (`members.num_keys`): the job is never written to.

    `take_back`: this coordinator replaces one that died; the dict is the coordinator's part of
    the job's latest checkpoint ({} without one) and `elapsed` the job's seconds of training
    so far. It takes back the live servers and workers (see takeback.py);
    `replica_history`, what the dead coordinator's log says of the backups, lets a backup
    take over a primary lost with it (replica_history.py); `worker_history`, what it says of
    the workers (worker_history.py), which ranks the take-back waits for (None: not read; it
    waits for every rank)."""

    def __init__(self, job: JobSpec, resume: dict | None = None,
                 latest_checkpoint: str | None = None, now: float = 0.0,
                 take_back: dict | None = None, elapsed: float = 0.0,
                 replica_history: ReplicaHistory | None = None,
                 worker_history: WorkerHistory | None = None):
        self.job = job
        limits, ckpt = job.limits, job.checkpoint
        policy = make_policy(job.sync.name, job.batch_size, **job.sync.options)
        self.host = PolicyHost(policy, job.max_samples or None,
                               batch_rule=job.batch_rule_spec() if job.elastic else None)
        self.round_mode = policy.apply_mode == "round"
        self.members = Membership(job.servers, job.workers, job.num_keys,
                                  limits.heartbeat_timeout, limits.start_grace, job.layer_edges,
                                  elastic=job.elastic)
        # An elastic job (--workers MIN:MAX): the wait below MIN and the sample ledger.
        self.elastic = Elastic(job.min_workers, job.workers, limits.start_timeout) \
            if job.elastic else None
        self.budget = Budget(job.max_seconds or None)
        self.schedule = CheckpointSchedule(
            None if ckpt is None else str(PurePath(ckpt.dir)),
            None if ckpt is None else ckpt.every, None if ckpt is None else ckpt.seconds,
            now, latest_checkpoint,
            keeps_initial=bool(job.restart_servers) and job.resume is None)
        self.recovery = ServerRecovery(bool(job.restart_servers), limits.server_timeout,
                                       limits.restart_timeout, replicated=job.replicas > 1)
        # Shard backups (--replicas 2): a dead primary's backup takes over (replicas.py).
        self.replicas = Replicas(job.replicas, job.servers, limits.heartbeat_timeout,
                                 fast=2 * limits.heartbeat_interval)
        # ... and one not synced yet, as what the job has done allows (orphans.py).
        self.orphans = OrphanedShards(self)
        # Live resharding (--servers MIN:MAX): servers join and leave (reshard.py).
        self.resharding = Resharding(
            Resharder(job.servers, job.max_servers, limits.server_timeout,
                      limits.server_timeout), grace=2 * limits.heartbeat_interval)
        self.reshard = self.resharding.plan  # (read here: its epoch, whether it holds)
        self.registration = Registration(self)
        # A launched script's torch optimizer, sent by its first worker (script_optimizer.py).
        self.script_optimizer = ScriptOptimizer(job.optimizer, learns=not job.num_keys)
        self.observations = Observations(self)
        # A coordinator restarted in place of one that died takes the job back (rejoins.py).
        if take_back is not None and replica_history is not None and \
                replica_history.layout is not None and self.reshard.enabled:
            # Keys moved under the dead coordinator: its servers serve its last shard map.
            epoch, layout = replica_history.layout
            self.members.adopt_shard_map(layout)
            self.reshard.epoch = epoch
            self.replicas.servers = len(layout)
        self.rejoins = Rejoins(self, take_back, now, worker_history, replica_history)
        if take_back is not None:
            self.replicas.take_back(now + limits.heartbeat_timeout,  # and their backups
                                    replica_history)
            if self.members.ranges is None and take_back.get("num_keys"):
                self.members.learn_key_space(int(take_back["num_keys"]))
            if self.elastic is not None:  # the ledger as of the latest checkpoint, if any
                self.elastic.resume(take_back.get("elastic", {}))
        else:
            elapsed = 0.0
        if resume is not None:
            self.host.resume(resume)
            if self.elastic is not None:  # each epoch goes on where the checkpoint left it
                self.elastic.resume(resume.get("elastic", {}))
            self.budget.worker_samples = {int(k): v for k, v in resume["worker_samples"].items()}
            self.schedule.last_count = self.progress
            elapsed = float(resume.get("elapsed_s", 0.0))
        self.barrier = StartBarrier(job.min_workers or job.workers, bool(job.eval_interval),
                                    limits.start_timeout, elapsed)
        self.end = EndOfJob(limits.observer_grace)
        self.failure: str | None = None
        self.finished = False
        self._members_due: float | None = None  # as the last TimePassed found it
        self.steps = Steps(self)
        self.checkpoints = Checkpoints(self, self.schedule)
        # Horovod's allreduce/allgather/broadcast of metrics among the workers.
        self.collectives = Collectives(self, max(limits.start_timeout, 300.0))
        # Rounds clipped by their norm over every shard (DistributedOptimizer.clip_grad_norm_):
        # a shard silent this long is declared dead anyway.
        self.clips = ClipRounds(self, limits.server_timeout)
        self._members_due_fresh = False
        self._handlers = {
            TimePassed: self._on_time, Heartbeat: self._on_heartbeat,
            ShardRestored: self._on_restored, ReplicaReport: self._on_replica_report,
            DrainAsked: self._on_drain, Resharded: self._on_resharded,
            **self.steps.handlers(), **self.registration.handlers(),
            **self.checkpoints.handlers(), **self.observations.handlers(),
            **self.collectives.handlers(), **self.clips.handlers(),
        }

    # ---- the envelope ---------------------------------------------------------------------------
    def handle(self, event) -> list:
        """The instructions that follow from `event`, housekeeping included. A request the
        state refuses (an unknown worker, a push the policy did not release) gets an error
        reply and a warning."""
        out = self._handle(event)
        self.observations.keep(out)
        return out

    def _handle(self, event) -> list:
        out: list = []
        self._members_due_fresh = False
        self.dispatch(event, out)
        now = event.now
        if self.rejoins.pending is not None:
            self.rejoins.check(now, out)
            if self.rejoins.pending is not None:
                return out
        if not self.barrier.open:
            self._check_start_barrier(now, out)
        budget = self.budget
        if not budget.closed and (budget.max_seconds or self.host.stopping):
            self.check_budget(now, out)
        if self.barrier.open and not self.members.roster.workers and not (
                self.elastic is not None and self.elastic.paused and not self.host.stopping):
            self._check_finished(now, out)
        return out

    def dispatch(self, event, out: list) -> None:
        if self.failure is not None and type(event) in _STEP_REQUESTS:
            # A failed job releases nothing more. A worker whose answer (the failure) was lost
            # asks again: it hears the failure, not the release it already trained on.
            out.append(Reply(event.to, "error", {"msg": self.failure, "code": "failed"}))
            return
        try:
            self._handlers[type(event)](event, out)
        except UnknownMember as exc:  # after a coordinator restart: it re-registers
            to = getattr(event, "to", None)
            if to is not None:
                out.append(Reply(to, "error", {"msg": str(exc), "code": "unknown"}))
        except (PolicyError, ValueError, KeyError, TypeError) as exc:
            src = getattr(event, "src", "?")
            out.append(Warn(f"refused {getattr(event, 'op', '?')} from {src}: {exc}", src))
            to = getattr(event, "to", None)
            if to is not None:
                out.append(Reply(to, "error", {"msg": str(exc), "code": "refused"}))

    def next_wakeup(self) -> float | None:
        """When a TimePassed has something to do, None if only events can change anything."""
        # Asked once per turn of the node's loop, right after its TimePassed: the members'
        # next deadline found then still holds unless an event came in between.
        due = self._members_due if self._members_due_fresh else self.members.next_deadline()
        barrier = self.barrier
        if barrier.open:
            t = self.host.next_wakeup()
            if t is not None and (due is None or t < due):
                due = t
            if self.budget.max_seconds:
                t = self.budget.next_deadline(barrier.t_start)
                if t is not None and (due is None or t < due):
                    due = t
            if self.end.workers_done_at is not None:
                t = self.end.next_deadline(self.members.roster, self.schedule)
                if t is not None and (due is None or t < due):
                    due = t
        else:
            t = barrier.next_deadline()
            if due is None or t < due:
                due = t
        t = self.recovery.next_deadline(self.members.roster.servers)
        if t is not None and (due is None or t < due):
            due = t
        if self.replicas.watching:
            t = self.replicas.next_deadline(self.members)
            if t is not None and (due is None or t < due):
                due = t
        if self.elastic is not None:
            t = self.elastic.next_deadline()
            if t is not None and (due is None or t < due):
                due = t
        if self.rejoins.pending is not None:
            t = self.rejoins.next_deadline()
            if due is None or t < due:
                due = t
        if self.collectives.open:
            t = self.collectives.next_deadline()
            if due is None or t < due:
                due = t
        if self.clips.open:
            t = self.clips.next_deadline()
            if due is None or t < due:
                due = t
        if self.reshard.enabled:
            t = self.resharding.next_deadline()
            if t is not None and (due is None or t < due):
                due = t
        return due

    # ---- queries --------------------------------------------------------------------------------
    def waiting_for(self) -> str:
        """Whom the start barrier waits for (its note, its failure, a status reply)."""
        m = self.members
        # (an elastic job's barrier waits for MIN, not MAX)
        return waiting_for(m.roster, self.barrier.workers_expected, m.servers_expected,
                           len(m.pending_workers), self.barrier.evaluator)

    @property
    def progress(self) -> int:
        """What the shards' versions count: rounds applied (round mode) or worker steps
        (arrival mode), of which a round the servers summed (auto's lockstep) counts once."""
        return self.host.versions()

    @property
    def rounds_applied(self) -> int:
        return self.host.rounds_applied

    @property
    def samples_done(self) -> int:
        return self.host.samples_done

    @property
    def stopping(self) -> bool:
        return self.host.stopping

    def role_of(self, src: str) -> str | None:
        return self.members.find(src)[0]

    def shutdown(self, reason: str) -> ToServers:
        """The message that stops every server (the node sends it as it exits)."""
        return ToServers("shutdown", {"reason": reason},
                         self.members.server_links + self.replicas.links)

    # ---- members' beats ------------------------------------------------------------------------
    def _on_heartbeat(self, e: Heartbeat, out: list) -> None:
        if self.replicas.enabled:
            backup = self.replicas.heartbeat(e.src, e.link, e.now, self.members)
            if backup is not None:
                if backup:
                    out.append(Reply(e.to, "ok", _OK))
                return
        if self.resharding.draining_link(e.link):
            # Drained, it beats until its shutdown: told `unknown` it would take this for a
            # restarted coordinator, ask to be taken back, and exit refused.
            out.append(Reply(e.to, "ok", _OK))
            return
        role, member = self.members.find(e.src)
        run = self.reshard.running
        if run is not None and run.moving_since is not None and (
                member is None or member.link != e.link) and (
                run.ask.link == e.link
                or any(m.link == e.link for m in self.members.roster.servers.values())):
            # Keys on the move: a server beats under its new name before the roster has it
            # (the joiner, a renumbered one); no stranger, so not told to register again.
            out.append(Reply(e.to, "ok", _OK))
            return
        if member is None:
            if e.src not in self.members.roster.gone:  # a coordinator restart: come back
                out.append(Reply(e.to, "error", {"msg": f"unknown member {e.src!r}",
                                                 "code": "unknown"}))
            return
        member.last_seen = e.now
        # Members hear back, to know we are alive; a server only on the connection it
        # registered from (a stale process at its name is left to time out).
        if role == "server":
            if member.link == e.link:
                out.append(Reply(e.to, "ok", _OK))
                if e.counters is not None:
                    self.add_metric(e.now, {"kind": "server", "server": member.rank, **e.counters},
                                 out)
                if e.shard is not None:
                    self.add_metric(e.now, {"kind": "shard", "server": member.rank, **e.shard}, out)
                    apply_s = e.shard.get("apply_s")
                    if isinstance(apply_s, (int, float)):
                        self.resharding.busy(member.rank, float(apply_s))
        elif self.reshard.epoch:
            # Keys moved: observers and bare clients learn the map here (workers in releases),
            # and every client which shards' backups took over since (a request in flight to
            # a dead primary goes again to its backup: the layout waits for a quiet point).
            fields = {"epoch": self.reshard.epoch, "layout": self.members.shard_map()}
            promoted = self.replicas.worker_fields()
            if promoted is not None:
                fields["shards"], fields["replaced"] = promoted["shards"], promoted["replaced"]
            out.append(Reply(e.to, "ok", fields))
        else:
            # Once a shard's backup took over, workers learn its address here.
            out.append(Reply(e.to, "ok", self.replicas.worker_fields() or _OK))

    # ---- server recovery ------------------------------------------------------------------------
    def _on_restored(self, e: ShardRestored, out: list) -> None:
        self.members.touch(e.src, e.now)
        member = self.members.roster.servers.get(e.src)
        if member is None:
            raise ValueError(f"unknown server {e.src!r}")
        event, record = self.recovery.restored(e, member)
        out.append(event)
        self.add_metric(e.now, record, out)

    def _on_replica_report(self, e: ReplicaReport, out: list) -> None:
        self.replicas.report(e, self.members, out)

    # ---- live resharding (resharding.py) -------------------------------------------------------
    def _on_drain(self, e: DrainAsked, out: list) -> None:
        self.resharding.drain(e.rank, e.src, e.now, e.to, self.members, out)

    def _on_resharded(self, e: Resharded, out: list) -> None:
        self._carry_out(self.resharding.resharded(e, self.members, out), e.now, out)

    def _check_reshard(self, now: float, out: list) -> None:
        part, host = self.resharding, self.host
        if self._carry_out(part.overdue(now, host.stopping, self.members, out), now, out):
            return
        part.advance(now, self.members, Situation(
            stopping=host.stopping,
            may_begin=self.barrier.open and self.schedule.pending_tag is None,
            version=host.version if self.round_mode else 0, shard_job=self.registration.shard_job), out)

    def layout_now(self) -> tuple[int, list] | None:
        """(epoch, shard map) once keys have moved (a restarted server refuses by it)."""
        return (self.reshard.epoch, self.members.shard_map()) if self.reshard.epoch else None

    def _carry_out(self, done: Outcome, now: float, out: list) -> bool:
        """What the resharding part left to the coordinator; True when the job failed."""
        for record in done.metrics:
            self.add_metric(now, record, out)
        if done.failure is not None:
            self.fail(done.failure, now, out)
            return True
        if done.new is not None:  # keys moved: each backup follows its primary
            self.replicas.resharded(done.old, done.new, self.members, now, out)
        for d in done.held:
            self.steps.deliver(d, out)
        return False

    # ---- time -----------------------------------------------------------------------------------
    def _on_time(self, e: TimePassed, out: list) -> None:
        now, members = e.now, self.members
        if self.barrier.open:
            self.steps.apply(self.host.advance(now), now, out)
        due = members.next_deadline()  # one look at the members while none is late
        late = due is not None and now >= due
        if late:
            for waiter in members.expired_waiters(now):
                out.append(Reply(waiter.to, "error", {
                    "msg": f"all {self.job.workers} worker ranks of this job are taken",
                    "code": "refused"}))
        if self.replicas.watching:
            # One shard-map epoch for promotions and reshards: clients follow either by it.
            self.replicas.epoch = max(self.replicas.epoch, self.reshard.epoch)
            promoted = self.replicas.check(now, members, self.schedule, out)
            for rank in promoted + self.orphans.check(now, out):
                self.add_metric(now, {"kind": "promotion", "role": "server", "server": rank}, out)
                new = members.roster.servers[f"s{rank}"].addr
                self.resharding.promoted(self.replicas.predecessor(new), new)
            self.reshard.follow(self.replicas.epoch)
            took_over, self.replicas.took_over = self.replicas.took_over, []
            for back in took_over:  # a backup in place of a primary lost with the coordinator
                self.add_metric(now, {"kind": "promotion", "role": "server", "server": back.rank},
                             out)
                self.rejoins.took_over(back)
        if self.reshard.enabled:
            self._check_reshard(now, out)
        if self.collectives.open:
            self.collectives.check(now, out)
        if self.clips.open:
            self.clips.check(now, out)
        failure = self.recovery.check(now, members.roster.servers, out)
        if failure is None and self.elastic is not None:
            failure = self.elastic.check(now, out)
        if failure is not None:
            self.fail(failure, now, out)
        if not late:
            self._members_due, self._members_due_fresh = due, True
            return
        observers = members.roster.observers
        for src in members.silent_observers(now):
            out.append(Warn(f"observer {src} silent for {now - observers[src].last_seen:.1f} s: "
                            f"dropped"))
            del observers[src]
        for src in members.silent_workers(now):
            m = members.roster.workers[src]
            out.append(Warn(f"worker {src} (rank {m.rank}) silent for "
                            f"{now - m.last_seen:.1f} s: declared dead"))
            self.steps.drop_worker(src, "dead", now, out)

    # ---- housekeeping ---------------------------------------------------------------------------
    def _check_start_barrier(self, now: float, out: list) -> None:
        if not self.replicas.complete:  # no push is acknowledged by one copy alone
            if now > self.barrier.start_timeout:
                self.fail(f"the shards' replicas were not ready within "
                           f"{self.barrier.start_timeout:.0f} s: {self.replicas.waiting()}",
                           now, out)
            elif self.barrier.note_due(now):
                out.append(Warn(f"start barrier: waiting for replicas: "
                                f"{self.replicas.waiting()}"))
            return
        failure, started, warning = self.barrier.check(now, self.members.roster)
        if failure is not None:
            self.fail(f"{failure} ({self.waiting_for()})", now, out)
            return
        if not self.barrier.open:
            if self.barrier.note_due(now):
                out.append(Warn(f"start barrier: waiting, {self.waiting_for()}; going on with "
                                f"the workers that started at {self.barrier.start_timeout:.0f} "
                                f"s (start_timeout)"))
            return
        if warning is not None:
            out.append(Warn(warning))
        out.append(AppendEvent(now, "barrier_open", {"workers": len(started)}))
        # All join before any release goes out: each release then tells the full round size.
        self.steps.apply(self.host.joined_all([m.rank for m in started], now), now, out)
        if self.schedule.keeps_initial:
            # Commit checkpoint 0 (the count is 0): each shard saved its initial values when
            # its init came and answers at once; the coordinator's part makes it whole.
            self.checkpoints.maybe(now, out, final=True)

    def check_budget(self, now: float, out: list) -> None:
        """Past the sample or time budget, every release tells its worker to stop."""
        if self.budget.reached(now, self.barrier.t_start, self.host.stopping):
            self.host.stop()
            out.append(AppendEvent(now, "budget_reached", {"samples": self.host.samples_done}))
            self.steps.stop_waiting(out)

    def _check_finished(self, now: float, out: list) -> None:
        verdict = self.end.check(now, self.barrier.open, self.members.roster, self.schedule)
        if verdict == EndOfJob.CHECKPOINT:
            # The last checkpoint holds the final parameters: a resumed job starts from them.
            self.checkpoints.maybe(now, out, final=True)
        elif verdict == EndOfJob.FINISH and not self.finished:
            self.finished = True
            out.append(Finish(None))
        elif verdict == EndOfJob.LOST:
            self.fail(EndOfJob.lost(self.members.roster), now, out)

    def fail(self, message: str, now: float, out: list) -> None:
        """End the job now, with `message` as the reason; waiting workers are told to stop."""
        if self.failure is not None:
            return
        self.failure = message
        out.append(AppendEvent(now, "job_failed", {"reason": message}))
        self.host.stop()
        self.budget.closed = True
        for m in self.members.roster.workers.values():
            if m.waiting is not None:
                out.append(Reply(m.waiting, "error", {"msg": message, "code": "failed"}))
                m.waiting = None
        self.finished = True
        out.append(Finish(message))

    def add_metric(self, now: float, record: dict, out: list, age: float = 0.0) -> None:
        t_start = self.barrier.t_start
        if t_start is not None:
            out.append(AppendMetric(now - t_start - age, record))

    # ---- checks ---------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the state contradicts itself (for tests)."""
        self.members.check_invariants()
        host, roster = self.host, self.members.roster
        if not self.barrier.open:
            assert self.barrier.t_start is None and not host.policy.active
        else:
            assert self.barrier.t_start is not None
        active = host.policy.active
        assert active <= set(self.members.by_rank), f"policy has departed workers {active}"
        for m in roster.workers.values():
            assert not (m.ready is not None and m.waiting is not None), \
                f"rank {m.rank} has a release and waits for one"
            if m.rank in active:
                assert m.started, f"rank {m.rank} joined the policy before its start"
        if self.schedule.pending_tag is None:
            assert not self.schedule.waiting
        if self.failure is not None:
            assert self.finished and host.stopping
        assert sum(self.budget.worker_samples.values()) <= host.samples_done or (
            self.job.resume is not None)
