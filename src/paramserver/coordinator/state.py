"""The coordinator's logic as a pure state machine: events in, instructions out.

`CoordinatorState.handle(event)` returns the instructions (replies, releases, messages to the
servers, log lines, a checkpoint to write, the end of the job) for the node to carry out; it
does no I/O and reads no clock: times come in the events. It is composed of objects that own
their state: Membership (roster, ranks, key ranges, liveness), the PolicyHost (the policy, held
releases, versions, the sample budget), StartBarrier, Budget, EndOfJob, CheckpointSchedule and
ServerRecovery. Like dask's WorkerState, it ends every event with one housekeeping pass (start
barrier, budget, end of job); the node's loop turns are `TimePassed` events.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePath

from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.coordinator.elastic import Elastic
from paramserver.coordinator.events import (
    Answered, AppendEvent, AppendMetric, Bye, Clocked, Finish, Heartbeat, Registered, Reply,
    Report, SaveLayout, SendRelease, ShardRestored, ShardSaved, Started,
    StatusAsked, TimePassed, ToServers, Warn,
)
from paramserver.coordinator.events import CheckpointUnwritten, ReplicaReport
from paramserver.coordinator.events import DrainAsked, Resharded
from paramserver.coordinator.reshard import Resharder
from paramserver.coordinator.resharding import Outcome, Resharding, Situation
from paramserver.coordinator.events import ObserveAsked
from paramserver.coordinator.events import PreflightReported, SavePreflight
from paramserver.coordinator.membership import (
    Member, Membership, UnknownMember, queue_waiting,
)
from paramserver.coordinator.progress import Budget, EndOfJob, StartBarrier, waiting_for
from paramserver.coordinator.recent import RecentRecords
from paramserver.coordinator.replicas import Replicas
from paramserver.coordinator.server_recovery import ServerRecovery
from paramserver.coordinator.replica_history import ReplicaHistory
from paramserver.coordinator.takeback import BackupBack, ServerBack, TakeBack, WorkerBack
from paramserver.observe.preflight import PreflightBook, parse_links
from paramserver.policies import (
    ApplyRound, Note, PolicyError, PolicyHost, Pushed, Release, make_policy,
)
from paramserver.spec.job import JobSpec
from paramserver.spec.welcome import ServerJob, ShardRestore, WorkerJob

_OK: dict = {}  # the empty fields of an "ok" reply; never changed


def _wait(queue: list, e: Registered, out: list) -> None:
    """A registration that waits for the start: queued, or refused when too many do."""
    refused = queue_waiting(queue, e)
    if refused is not None:
        out.append(Warn(f"refused register from {e.src}: {refused}", e.src))
        out.append(Reply(e.to, "error", {"msg": refused, "code": "refused"}))


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
    take over a primary lost with it (replica_history.py)."""

    def __init__(self, job: JobSpec, resume: dict | None = None,
                 latest_checkpoint: str | None = None, now: float = 0.0,
                 take_back: dict | None = None, elapsed: float = 0.0,
                 replica_history: ReplicaHistory | None = None):
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
        self.checkpoints = self.schedule.enabled
        self.recovery = ServerRecovery(bool(job.restart_servers), limits.server_timeout,
                                       limits.restart_timeout)
        # Shard backups (--replicas 2): a dead primary's backup takes over (replicas.py).
        self.replicas = Replicas(job.replicas, job.servers, limits.heartbeat_timeout,
                                 fast=2 * limits.heartbeat_interval)
        # Live resharding (--servers MIN:MAX): servers join and leave (reshard.py).
        self.resharding = Resharding(
            Resharder(job.servers, job.max_servers, limits.server_timeout,
                      limits.server_timeout), grace=2 * limits.heartbeat_interval)
        self.reshard = self.resharding.plan  # (read here: its epoch, whether it holds)
        self.takeback: TakeBack | None = None
        if take_back is not None:
            self.takeback = TakeBack(now + limits.heartbeat_timeout, job.servers, job.workers,
                                     take_back, job.batch_size)
            # Servers hold the parameters: without all of them back there is no job.
            self.takeback_fails_at = now + limits.server_timeout
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
        self._steps_applied = self.host.steps_done  # steps in the rounds applied (round mode)
        self._members_due_fresh = False
        self._handlers = {
            Clocked: self._on_clocked, TimePassed: self._on_time, Heartbeat: self._on_heartbeat,
            Registered: self._on_registered, Started: self._on_started, Bye: self._on_bye,
            Report: self._on_report, StatusAsked: self._on_status, ShardSaved: self._on_saved,
            ShardRestored: self._on_restored, Answered: self._on_answered,
            CheckpointUnwritten: lambda e, out: self.schedule.unwritten(e.tag, e.reason, e.now,
                                                                        out),
            ReplicaReport: self._on_replica_report,
            ObserveAsked: self._on_observe,
        }
        self.recent = RecentRecords()  # the latest metrics records, for observers
        # Preflight link probes (issue 23): each worker's figures, for RUN/preflight.json.
        self.preflight = PreflightBook(job.workers)
        self._handlers[PreflightReported] = self._on_preflight
        self._handlers[DrainAsked] = self._on_drain
        self._handlers[Resharded] = self._on_resharded

    # ---- the envelope ---------------------------------------------------------------------------
    def handle(self, event) -> list:
        """The instructions that follow from `event`, housekeeping included. A request the
        state refuses (an unknown worker, a push the policy did not release) gets an error
        reply and a warning."""
        out = self._handle(event)
        for i in out:  # what goes to metrics.jsonl is kept for observers too
            if type(i) is AppendMetric:
                self.recent.add(i.t, i.record)
        return out

    def _handle(self, event) -> list:
        out: list = []
        self._members_due_fresh = False
        self._dispatch(event, out)
        now = event.now
        if self.takeback is not None:
            self._check_takeback(now, out)
            if self.takeback is not None:
                return out
        if not self.barrier.open:
            self._check_start_barrier(now, out)
        budget = self.budget
        if not budget.closed and (budget.max_seconds or self.host.stopping):
            self._check_budget(now, out)
        if self.barrier.open and not self.members.roster.workers and not (
                self.elastic is not None and self.elastic.paused and not self.host.stopping):
            self._check_finished(now, out)
        return out

    def _dispatch(self, event, out: list) -> None:
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
        if self.takeback is not None:
            t = min(self.takeback.deadline, self.takeback_fails_at)
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
        """What versions count: rounds applied (round mode) or worker steps (arrival mode)."""
        return self.host.rounds_applied if self.round_mode else self.host.steps_done

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

    def metric(self, now: float, record: dict, age: float = 0.0) -> AppendMetric | None:
        """A metrics.jsonl line, stamped with seconds since the start barrier opened."""
        t_start = self.barrier.t_start
        return None if t_start is None else AppendMetric(now - t_start - age, record)

    # ---- registration ---------------------------------------------------------------------------
    def _on_registered(self, e: Registered, out: list) -> None:
        members = self.members
        members.touch(e.src, e.now)
        role = e.role
        if role == "worker" and members.ranges is None and e.num_keys:
            waited = members.learn_key_space(e.num_keys)
            out.append(AppendEvent(e.now, "key_space", {"num_keys": e.num_keys}))
            for server in waited:
                self._admit(self._register_server, server, e.now, out)
        if role == "server":
            if members.ranges is None:
                _wait(members.pending_servers, e, out)
            else:
                self._register_server(e, e.now, out)
        elif role in ("worker", "observer"):
            if e.rejoin is not None:
                self._rejoin_worker(e, out)
            elif self._registered_again(e, out):
                pass
            elif self.takeback is not None:
                _wait(self.takeback.fresh, e, out)  # a replacement: once taken back
            elif not members.servers_complete:
                _wait(members.pending_workers, e, out)
            else:
                self._register_worker(e, e.now, out)
        else:
            raise ValueError(f"unknown role {role!r}; known: server, worker, observer")

    def _admit(self, register, e: Registered, now: float, out: list) -> None:
        """A registration that waited (for the key space, the servers, a free rank): refused
        on its own if it is wrong, not with the event that let it in."""
        try:
            register(e, now, out)
        except ValueError as exc:
            out.append(Warn(f"refused register from {e.src}: {exc}", e.src))
            out.append(Reply(e.to, "error", {"msg": str(exc), "code": "refused"}))

    def _server_job(self, rank: int) -> ServerJob:
        shard = self.members.ranges[rank]
        job = self._shard_job(shard.lo, shard.hi)
        if self.schedule.keeps_initial:
            job = job.with_initial_checkpoint(str(self.schedule.root))
        return job

    def _shard_job(self, lo: int, hi: int) -> ServerJob:
        job = self.job
        if job.max_servers and job.num_keys != self.members.num_keys:
            # (the key space learned from the first worker bounds a moving shard's frames)
            job = replace(job, num_keys=self.members.num_keys)
        return ServerJob.of(job, lo, hi, self.host.apply_mode)

    def _register_server(self, e: Registered, now: float, out: list) -> None:
        if e.addr is None:
            raise ValueError("a server must register with its address")
        members = self.members
        if e.backup:
            def welcome(rank: int) -> Reply:
                return Reply(e.to, "welcome", {"rank": rank, "backup": True,
                                               "job": self._server_job(rank).to_dict()})
            if e.rejoin is not None:  # a live backup back to this restarted coordinator
                self.replicas.backup_back(e, BackupBack.of(e.rejoin), members, welcome, out)
            else:
                self.replicas.register(e, members, welcome, out)
            return
        if e.rejoin is not None:
            self._rejoin_server(e, now, out)
            return
        if self.takeback is not None:
            _wait(self.takeback.fresh_servers, e, out)
            return
        back = members.server_at(e.addr)
        if back is not None:  # only one process can listen there: the old one is dead
            failure = self.recovery.back(e, back, self.schedule, self.progress,
                                         self._server_job(back.rank), out,
                                         self._layout_now())
            members.relinked()
            if failure is not None:
                self._fail(failure, now, out)
            return
        if self.reshard.enabled and members.servers_complete:
            self.resharding.join(e, members, now, out)
            return
        member = members.add_server(e)
        job = self._server_job(member.rank)
        if self.job.resume is not None:
            job = job.with_restore(ShardRestore.of_resume(self.job.resume, self.progress))
        out.append(Reply(e.to, "welcome", {"rank": member.rank, "job": job.to_dict()}))
        out.append(AppendEvent(now, "server_joined", {"rank": member.rank, "addr": e.addr}))
        if self.replicas.enabled:
            self.replicas.primary_up(member, now, out)
        if members.servers_complete:
            pending, members.pending_workers = members.pending_workers, []
            for worker in pending:
                self._admit(self._register_worker, worker, now, out)

    def _rejoin_server(self, e: Registered, now: float, out: list) -> None:
        """A live server back to this (restarted) coordinator: its shard and version are the
        job's; it goes on serving as it was."""
        back = ServerBack.of(e.rejoin)
        member = self.members.rejoin_server(e, back.rank, back.lo, back.hi)
        out.append(Reply(e.to, "welcome", {"rank": member.rank,
                                           "job": self._server_job(member.rank).to_dict()}))
        out.append(AppendEvent(now, "server_taken_back", {"rank": member.rank, "addr": e.addr,
                                                         "version": back.version}))
        if self.takeback is not None:
            self.takeback.server_back(back)
        if self.replicas.enabled:  # the backup it forwards to, when that one is back too
            self.replicas.primary_back(member, back, now, self.members, out)
        members = self.members
        if members.servers_complete and members.pending_workers:
            pending, members.pending_workers = members.pending_workers, []
            for worker in pending:
                self._admit(self._register_worker, worker, now, out)

    def _rejoin_worker(self, e: Registered, out: list) -> None:
        """A live worker (or evaluator) back under its rank, with the step it is at; the job
        it was given holds (the welcome's job is empty)."""
        back = WorkerBack.of(e.rejoin)
        member, again = self.members.rejoin_worker(e, back.rank)
        out.append(Reply(e.to, "welcome", {"rank": member.rank, "job": {}}))
        if again:
            return
        out.append(AppendEvent(e.now, f"{e.role}_taken_back", {
            "rank": member.rank, "src": e.src, "step": back.step, "clocked": back.clocked}))
        if e.role == "observer":
            member.started = True
            return
        member.steps = max(back.step, 0)
        if self.takeback is not None:
            self.takeback.worker_back(e.src, back)
            member.started = back.step >= 0
        elif back.step >= 0:  # back after the rebuild: it joins the running policy
            self._join_taken_back([member], [back], e.now, out)

    def _join_taken_back(self, members: list[Member], backs: list[WorkerBack], now: float,
                         out: list) -> None:
        for m, back in zip(members, backs):
            m.started, m.joining, m.waiting, m.ready = True, back, None, None
        ranks = [m.rank for m in members]
        self._apply(self.host.joined_all(ranks, now), now, out)

    def _registered_again(self, e: Registered, out: list) -> bool:
        """A worker's registration sent again (its answer may have died with a coordinator):
        a waiting one now waits on the new request, a welcomed one that has not started is
        welcomed again; True if it was one."""
        members, src = self.members, e.src
        queues = [members.pending_workers]
        if self.takeback is not None:
            queues.append(self.takeback.fresh)
        for queue in queues:
            for i, queued in enumerate(queue):
                if queued.src == src and queued.role == e.role:
                    queue[i] = e
                    return True
        for i, (queued, deadline) in enumerate(members.rank_waiters):
            if queued.src == src and queued.role == e.role:
                members.rank_waiters[i] = (e, deadline)
                return True
        group = members.roster.observers if e.role == "observer" else members.roster.workers
        member = group.get(src)
        if member is None or member.started:
            return False
        self._welcome_worker(member, e, out)
        return True

    def _register_worker(self, e: Registered, now: float, out: list) -> None:
        known = self.members.layout
        member = self.members.add_worker(e)
        if self.members.layout is not known:
            out.append(SaveLayout(self.members.layout.to_wire()))
        if member is None:
            return  # waits for a rank
        self._welcome_worker(member, e, out)
        out.append(AppendEvent(now, f"{e.role}_registered", {"rank": member.rank, "src": e.src}))

    def _welcome_worker(self, member: Member, e: Registered, out: list) -> None:
        job = WorkerJob.of(self.job, self.members.num_keys, self.members.shard_map(),
                           self.host.apply_mode, self.host.name,
                           self.budget.worker_samples.get(member.rank, 0))
        fields = {"rank": member.rank, "job": job.to_dict()}
        if self.reshard.enabled:
            fields["epoch"] = member.epoch = self.reshard.epoch
        out.append(Reply(e.to, "welcome", fields))

    # ---- the step protocol ----------------------------------------------------------------------
    def _on_started(self, e: Started, out: list) -> None:
        members, now = self.members, e.now
        observer = members.roster.observers.get(e.src)
        if observer is not None:  # an evaluator is ready: training may begin
            observer.last_seen, observer.started = now, True
            out.append(Reply(e.to, "ok", _OK))
            return
        member = members.worker(e.src)
        if self.takeback is not None:
            self.takeback.defer(e)
            return
        if self.elastic is not None and not member.started:
            self.elastic.check_data(e.data_len)  # refused: it never starts
        member.last_seen, member.waiting, member.started = now, e.to, True
        if member.ready is not None:
            ready, member.ready = member.ready, None
            self._deliver(ready, out, refill=True)
        elif self.barrier.open:
            # A join of the running job (an elastic joiner, a replacement worker).
            out.append(AppendEvent(now, "worker_joined", {
                "worker": member.rank, "src": e.src, "workers": self._started(),
                "round": self.host.rounds_applied, "samples": self.host.samples_done}))
            elastic = self.elastic
            if elastic is not None:
                self._metric(now, {"kind": "membership", "change": "joined",
                                   "worker": member.rank, "workers": self._started()}, out)
                self._resume_if_enough(now, out)
            self._apply(self.host.joined(member.rank, now, late=elastic is not None), now, out)

    def _on_clocked(self, e: Clocked, out: list) -> None:
        member = self.members.worker(e.src)
        if self.takeback is not None:
            self.takeback.defer(e)  # answered once the policy is rebuilt
            return
        now = e.now
        if e.step + 1 == member.steps and member.started:  # this clock again: not a new step
            member.last_seen = now
            if member.waiting is not None:
                member.waiting = e.to  # the release goes to the request still waited on
            elif member.last_release is not None:
                # The same release, all of it: its samples (the ledger counts them seen at
                # this worker's next clock) and a shard map it carried.
                out.append(replace(member.last_release, to=e.to))
            return
        member.last_seen, member.waiting, member.steps = now, e.to, e.step + 1
        if e.leave is not None:
            # Its last step: counted as any, then it is gone; a release the policy makes for
            # it now is kept back (never sent: the answer is "ok") and dropped with it.
            member.waiting = None
        if member.behind is not None and self._caught_up(member, e, out):
            return
        budget = self.budget
        if not budget.closed and budget.max_seconds:  # time's up: this step is the last one
            self._check_budget(now, out)
        decisions = self.host.pushed(Pushed(member.rank, e.step - member.offset, now, e.batch,
                                            e.compute_time, e.cpu_load, e.free_mem))
        budget.count(member.rank, e.batch)
        if self.elastic is not None:
            self.elastic.clocked(member.rank, now, out, e.step)
        self._apply(decisions, now, out)
        if e.record is not None and self.barrier.t_start is not None:
            # After the releases: the log line is off their path.
            out.append(AppendMetric(now - self.barrier.t_start, {
                "kind": "step", "worker": member.rank, "step": e.step, "batch": e.batch,
                **e.record}))
        if e.leave is not None:
            out.append(Reply(e.to, "ok", _OK))
            self._drop_worker(e.src, e.leave, now, out)
        if self.checkpoints:
            self._maybe_checkpoint(now, out)

    def _caught_up(self, member: Member, e: Clocked, out: list) -> bool:
        """A taken-back worker's re-sent clock of a round that completed before the old
        coordinator died: the release it holds is the answer (counted, not pushed again)."""
        behind, member.behind = member.behind, None
        if e.step != behind or member.ready is None:
            return False
        host = self.host
        host.samples_done += e.batch
        host.steps_done += 1
        self._steps_applied += 1  # (of a round applied before)
        self.budget.count(member.rank, e.batch)
        ready, member.ready = member.ready, None
        self._deliver(ready, out, refill=True)
        return True

    def _apply(self, decisions: list, now: float, out: list) -> None:
        for d in decisions:
            kind = type(d)
            if kind is Release:
                self._deliver(d, out)
            elif kind is ApplyRound:
                self._steps_applied = self.host.steps_done
                contributors = list(d.contributors)
                out.append(ToServers("apply_round", {"step": d.step, "contributors": contributors},
                                     self.members.server_links))
                out.append(AppendEvent(now, "apply_round",
                                       {"step": d.step, "contributors": contributors}))
            elif kind is Note:
                if d.kind == "budget_reached":
                    self.budget.closed = True
                out.append(AppendEvent(now, d.kind, dict(d.data)))
        if self.host.stopping:
            self._stop_waiting(out)

    def _stop_waiting(self, out: list) -> None:
        """Once the budget is spent no step will come that a held worker waits for (ElasticBSP
        holds one for another's next push, a round may never fill): every worker still waiting
        is told to stop now, not left to wait for a release that cannot come."""
        host = self.host
        for m in self.members.roster.workers.values():
            if m.waiting is not None and m.ready is None:
                out.append(SendRelease(m.waiting, m.steps, self.job.batch_size,
                                       host.version if self.round_mode else 0,
                                       host.policy.round_size(), True))
                m.waiting = None

    def _deliver(self, d: Release, out: list, refill: bool = False) -> None:
        member = self.members.by_rank.get(d.worker)
        if member is None:
            return  # released after it left: nothing to tell
        if member.joining is not None and self._joined_back(member, d):
            return
        if member.waiting is None:
            member.ready = d  # decided before the worker asked for it
            return
        elastic = self.elastic
        if elastic is not None and elastic.paused and not d.stop:
            elastic.hold(d)  # fewer than MIN workers: nobody steps until enough are back
            return
        reshard = self.reshard
        if reshard.holding and not d.stop:
            reshard.hold(d)  # the fence: nobody steps until the keys have moved
            return
        if refill:  # it waited for its worker: what it must say is what holds now
            host = self.host
            d = Release(d.worker, d.step, d.batch_size, d.not_before, d.scale,
                        host.version if self.round_mode else 0, host.policy.round_size(),
                        host.stopping)
        member.last_release = release = SendRelease(
            member.waiting, d.step + member.offset, d.batch_size, d.min_version, d.round_size,
            d.stop, d.scale)
        if elastic is not None and not d.stop:
            release.samples = elastic.lend(d.worker, d.batch_size, release.step)
        if member.epoch != reshard.epoch:  # the keys moved since it last heard
            release.epoch, release.layout = reshard.epoch, self.members.shard_map()
            member.epoch = reshard.epoch
        out.append(release)
        member.waiting = None

    def _joined_back(self, member: Member, d: Release) -> bool:
        """The policy's join release of a taken-back worker, which already holds a release:
        True if it is swallowed. In round mode steps are rounds, the same in policy and
        workers; a worker behind (its clock of a completed round unanswered, or, back after
        the rebuild, still in a round that closed without it) keeps this release for its
        clock of that round. In arrival mode the rebuilt policy counts steps from its join:
        the worker's steps are the policy's plus `offset`."""
        back, member.joining = member.joining, None
        if not self.round_mode:
            member.offset = back.step - d.step
            return True
        if d.step > back.step:
            member.ready, member.behind = d, back.step
        return True

    def _on_heartbeat(self, e: Heartbeat, out: list) -> None:
        if self.replicas.enabled:
            backup = self.replicas.heartbeat(e.src, e.link, e.now, self.members)
            if backup is not None:
                if backup:
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
                    self._metric(e.now, {"kind": "server", "server": member.rank, **e.counters},
                                 out)
                if e.shard is not None:
                    self._metric(e.now, {"kind": "shard", "server": member.rank, **e.shard}, out)
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

    def _on_bye(self, e: Bye, out: list) -> None:
        members = self.members
        members.touch(e.src, e.now)
        if e.src in members.roster.observers:
            del members.roster.observers[e.src]
            out.append(Reply(e.to, "ok", _OK))
            return
        members.worker(e.src)
        out.append(Reply(e.to, "ok", _OK))
        if self.takeback is not None:  # not in the policy yet
            self.takeback.forget(e.src)
            members.drop_worker(e.src, e.reason)
            return
        self._drop_worker(e.src, e.reason, e.now, out)

    def _on_report(self, e: Report, out: list) -> None:
        role, member = self.members.find(e.src)
        if member is not None:
            member.last_seen = e.now
        if role is None and e.src not in self.members.roster.gone:
            raise UnknownMember(f"report from {e.src!r}, which is no registered worker or "
                                f"observer here")
        if role not in ("worker", "observer"):
            raise ValueError(f"report from {e.src!r}, which is no registered worker or "
                             f"observer")
        record = dict(e.record)
        age = record.pop("age_s", 0.0)
        self._metric(e.now, record, out, age=float(age) if isinstance(age, (int, float)) else 0.0)
        out.append(Reply(e.to, "ok", _OK))

    def _on_status(self, e: StatusAsked, out: list) -> None:
        self.members.touch(e.src, e.now)
        roster, host, t_start = self.members.roster, self.host, self.barrier.t_start
        state = {"policy": host.name, "rounds_applied": host.rounds_applied,
                 "samples_done": host.samples_done, "stopping": host.stopping,
                 "started": self.barrier.open,
                 "waiting_for": None if self.barrier.open else self.waiting_for(),
                 "workers_done": self.barrier.open and not roster.workers,
                 "elapsed_s": 0.0 if t_start is None else e.now - t_start,
                 "workers": {s: {"rank": m.rank, "steps": m.steps}
                             for s, m in roster.workers.items()},
                 "servers": {s: {"rank": m.rank, "addr": m.addr}
                             for s, m in roster.servers.items()},
                 "gone": dict(roster.gone)}
        out.append(Reply(e.to, "state", {"state": state}))

    def _on_observe(self, e: ObserveAsked, out: list) -> None:
        """An observer is no member: it is answered and forgotten (no liveness, no rank)."""
        seq, records, more = self.recent.since(e.since)
        roster, t_start = self.members.roster, self.barrier.t_start
        workers = sorted(roster.workers.values(), key=lambda m: m.rank)[:256]
        members = {"policy": self.host.name, "round_mode": self.round_mode,
                   "started": self.barrier.open,
                   "finished": self.finished or (
                       self.barrier.open and not roster.workers
                       and not (self.elastic is not None and self.elastic.paused)),
                   "elapsed_s": 0.0 if t_start is None else round(e.now - t_start, 3),
                   "workers": {str(m.rank): m.steps for m in workers},
                   "servers": len(roster.servers), "gone": len(roster.gone)}
        out.append(Reply(e.to, "observed", {"seq": seq, "records": records, "more": more,
                                            "members": members}))

    def _on_preflight(self, e: PreflightReported, out: list) -> None:
        """A worker's link probes: preflight.json rewritten with them; once every worker of
        the job reported, one `preflight` event with all links (later, one per newcomer)."""
        member = self.members.worker(e.src)
        member.last_seen = e.now
        links = parse_links(e.links)  # a malformed report is refused (ValueError)
        due = self.preflight.report(f"worker-{member.rank}", links)
        out.append(Reply(e.to, "ok", _OK))
        out.append(SavePreflight(self.preflight.document(e.now)))
        if due:
            out.append(AppendEvent(e.now, "preflight", {"links": self.preflight.entries(due)}))

    def _on_answered(self, e: Answered, out: list) -> None:
        self.members.touch(e.src, e.now)
        if e.error is not None:
            out.append(Warn(f"{e.src} reported an error: {e.error}", e.src))

    # ---- checkpoints and server recovery --------------------------------------------------------
    def _maybe_checkpoint(self, now: float, out: list, final: bool = False) -> None:
        count, schedule = self.progress, self.schedule
        if not (final or schedule.due(count, now)) or schedule.pending_tag is not None:
            return
        if self.reshard.running is not None:  # keys on the move: the next due time saves
            return
        tag = f"{count:09d}"
        # The counters as they stand when the servers are asked, not when the last one has
        # saved: pushes of the next round counted meanwhile are not in the shards' values, and a
        # resume would skip their samples.
        t_start = self.barrier.t_start
        state = dict(
            self.host.resume_state(),
            worker_samples={str(k): v for k, v in self.budget.worker_samples.items()},
            sync=self.host.name, num_keys=self.members.num_keys,
            elapsed_s=0.0 if t_start is None else now - t_start)
        if self.elastic is not None:
            state["elastic"] = self.elastic.resume_state()
        if self.reshard.enabled:  # the parts to read back: servers may have come and gone
            state["servers"] = len(self.members.roster.servers)
        schedule.begin(tag, [m.rank for m in self.members.roster.servers.values()], count, now,
                       state)
        out.append(ToServers("checkpoint", {"tag": tag, "dir": str(schedule.root)},
                             self.members.server_links))

    def _on_saved(self, e: ShardSaved, out: list) -> None:
        self.members.touch(e.src, e.now)
        member = self.members.roster.servers.get(e.src)
        if member is None:
            return
        schedule = self.schedule
        schedule.shard_saved(member.rank, e.tag, e.failed, e.src, e.now, out)
        if schedule.pending_tag is None and self._at_rest():
            # One that fell due while this one was written is taken now: the step that would
            # take it may never come (workers that wait for it, the job's last round).
            self._maybe_checkpoint(e.now, out)

    def _at_rest(self) -> bool:
        """Whether the shards' values hold every step counted so far (so a checkpoint's
        counters match them): always in arrival mode, where a push is applied before its
        clock; in round mode, only while no worker has clocked the round in progress."""
        return not self.round_mode or self.host.steps_done == self._steps_applied

    def _on_restored(self, e: ShardRestored, out: list) -> None:
        self.members.touch(e.src, e.now)
        member = self.members.roster.servers.get(e.src)
        if member is None:
            raise ValueError(f"unknown server {e.src!r}")
        event, record = self.recovery.restored(e, member)
        out.append(event)
        self._metric(e.now, record, out)

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
            version=host.version if self.round_mode else 0, shard_job=self._shard_job), out)

    def _layout_now(self) -> tuple[int, list] | None:
        """(epoch, shard map) once keys have moved (a restarted server refuses by it)."""
        return (self.reshard.epoch, self.members.shard_map()) if self.reshard.epoch else None

    def _carry_out(self, done: Outcome, now: float, out: list) -> bool:
        """What the resharding part left to the coordinator; True when the job failed."""
        for record in done.metrics:
            self._metric(now, record, out)
        if done.failure is not None:
            self._fail(done.failure, now, out)
            return True
        if done.new is not None:  # keys moved: each backup follows its primary
            self.replicas.resharded(done.old, done.new, self.members, now, out)
        for d in done.held:
            self._deliver(d, out)
        return False

    # ---- time -----------------------------------------------------------------------------------
    def _on_time(self, e: TimePassed, out: list) -> None:
        now, members = e.now, self.members
        if self.barrier.open:
            self._apply(self.host.advance(now), now, out)
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
            for rank in self.replicas.check(now, members, self.schedule, out):
                self._metric(now, {"kind": "promotion", "role": "server", "server": rank}, out)
                new = members.roster.servers[f"s{rank}"].addr
                self.resharding.promoted(self.replicas.predecessor(new), new)
            self.reshard.follow(self.replicas.epoch)
            took_over, self.replicas.took_over = self.replicas.took_over, []
            for back in took_over:  # a backup in place of a primary lost with the coordinator
                self._metric(now, {"kind": "promotion", "role": "server", "server": back.rank},
                             out)
                if self.takeback is not None:
                    self.takeback.server_back(back)
        if self.reshard.enabled:
            self._check_reshard(now, out)
        failure = self.recovery.check(now, members.roster.servers, out)
        if failure is None and self.elastic is not None:
            failure = self.elastic.check(now, out)
        if failure is not None:
            self._fail(failure, now, out)
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
            self._drop_worker(src, "dead", now, out)

    def _drop_worker(self, src: str, reason: str, now: float, out: list) -> None:
        members = self.members
        member = members.drop_worker(src, reason)
        left = {"worker": member.rank, "reason": reason}
        elastic = self.elastic
        if elastic is not None:
            left["samples_returned"] = elastic.left(member.rank)
            left["workers"] = self._started()
        out.append(AppendEvent(now, "worker_left", left))
        self._metric(now, {"kind": "left", "worker": member.rank, "reason": reason}, out)
        if member.started and self.barrier.open:
            # A release still held for this rank must not reach a newcomer that takes it.
            self._apply(self.host.left(member.rank, now, reason), now, out)
        elif not self.barrier.open:
            self.barrier.lost_before_start += 1
        if members.rank_waiters:
            self._admit(self._register_worker, members.rank_waiters.pop(0)[0], now, out)
        if elastic is not None and self.barrier.open and not self.host.stopping:
            if elastic.below_min(self._started(), now, out):
                self._metric(now, {"kind": "membership", "change": "waiting",
                                   "workers": self._started(),
                                   "min_workers": elastic.min_workers}, out)

    # ---- elastic workers ------------------------------------------------------------------------
    def _started(self) -> int:
        """Workers that are training (started), the count an elastic job keeps >= MIN."""
        return sum(1 for m in self.members.roster.workers.values() if m.started)

    def _resume_if_enough(self, now: float, out: list) -> None:
        """Enough workers again: the releases held while below MIN go out."""
        elastic = self.elastic
        if not elastic.paused:
            return
        for d in elastic.enough(self._started(), now, out):
            self._deliver(d, out)
        if not elastic.paused:
            self._metric(now, {"kind": "membership", "change": "back",
                               "workers": self._started()}, out)

    # ---- coordinator recovery -------------------------------------------------------------------
    def _check_takeback(self, now: float, out: list) -> None:
        """Once every server and worker is back (or the deadline passed): rebuild the policy
        from what they said, then answer the requests that waited for it."""
        tb = self.takeback
        if not tb.ready(now):
            if now >= self.takeback_fails_at:
                missing = sorted(set(range(self.job.servers)) - set(tb.servers))
                self.takeback = None
                self._fail(f"server(s) {missing} did not come back to the restarted "
                           f"coordinator within {self.job.limits.server_timeout:.0f} s", now,
                           out)
            return
        self.takeback = None
        plan = tb.plan(self.round_mode)
        saved, host = tb.saved, self.host
        policy_state = dict(saved.get("policy", {}))
        if self.round_mode:
            policy_state["round"] = plan.round  # the round-mode policies' (BSP's) counter
        host.resume({"rounds_applied": plan.round, "samples_done": plan.samples,
                     "steps_done": plan.steps, "policy": policy_state})
        self._steps_applied = host.steps_done
        self.budget.worker_samples = dict(plan.worker_samples)
        self.schedule.last_count, self.schedule.last_time = self.progress, now
        roster = self.members.roster
        out.append(AppendEvent(now, "taken_back", {
            "servers": len(roster.servers), "workers": len(tb.workers), "round": plan.round,
            "samples": plan.samples, "versions": {str(r): b.version
                                                  for r, b in sorted(tb.servers.items())}}))
        if plan.open_barrier:
            barrier = self.barrier
            barrier.open, barrier.t_start = True, now - barrier.elapsed_before
            back = sorted(((roster.workers[src], b) for src, b in tb.workers.items()
                           if src in roster.workers and b.step >= 0),
                          key=lambda mb: mb[0].rank)
            if back:
                self._join_taken_back([m for m, _ in back], [b for _, b in back], now, out)
            if host.stopping:
                self.budget.closed = True
        for e in tb.fresh_servers:  # a restarted server: its shard from the checkpoint
            member = self.members.add_server(e)
            failure = self.recovery.back(e, member, self.schedule, self.progress,
                                         self._server_job(member.rank), out)
            if failure is not None:
                self._fail(failure, now, out)
                return
        for e in tb.deferred:
            self._dispatch(e, out)
        for e in tb.fresh:
            self._admit(self._register_worker, e, now, out)

    # ---- housekeeping ---------------------------------------------------------------------------
    def _check_start_barrier(self, now: float, out: list) -> None:
        if not self.replicas.complete:  # no push is acknowledged by one copy alone
            if now > self.barrier.start_timeout:
                self._fail(f"the shards' replicas were not ready within "
                           f"{self.barrier.start_timeout:.0f} s: {self.replicas.waiting()}",
                           now, out)
            elif self.barrier.note_due(now):
                out.append(Warn(f"start barrier: waiting for replicas: "
                                f"{self.replicas.waiting()}"))
            return
        failure, started, warning = self.barrier.check(now, self.members.roster)
        if failure is not None:
            self._fail(f"{failure} ({self.waiting_for()})", now, out)
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
        self._apply(self.host.joined_all([m.rank for m in started], now), now, out)
        if self.schedule.keeps_initial:
            # Commit checkpoint 0 (the count is 0): each shard saved its initial values when
            # its init came and answers at once; the coordinator's part makes it whole.
            self._maybe_checkpoint(now, out, final=True)

    def _check_budget(self, now: float, out: list) -> None:
        """Past the sample or time budget, every release tells its worker to stop."""
        if self.budget.reached(now, self.barrier.t_start, self.host.stopping):
            self.host.stop()
            out.append(AppendEvent(now, "budget_reached", {"samples": self.host.samples_done}))
            self._stop_waiting(out)

    def _check_finished(self, now: float, out: list) -> None:
        verdict = self.end.check(now, self.barrier.open, self.members.roster, self.schedule)
        if verdict == EndOfJob.CHECKPOINT:
            # The last checkpoint holds the final parameters: a resumed job starts from them.
            self._maybe_checkpoint(now, out, final=True)
        elif verdict == EndOfJob.FINISH and not self.finished:
            self.finished = True
            out.append(Finish(None))

    def _fail(self, message: str, now: float, out: list) -> None:
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

    def _metric(self, now: float, record: dict, out: list, age: float = 0.0) -> None:
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
