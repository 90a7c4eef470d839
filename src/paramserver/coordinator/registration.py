"""Registration: servers, backups, workers and evaluators joining the job, and what each is told.

The `Registered` event's part. A registration is answered at once (a `welcome` with the
member's job: its shard, or the worker's settings and shard map), or it waits in a queue
(for the key space, for every server, for a take-back, for a free rank) and is admitted when
what it waits for comes. A restarted server is welcomed back at its address by ServerRecovery;
a live member back to a restarted coordinator (a `rejoin` record) goes to the take-back part
(rejoins.py); a server past a full roster of a resharded job joins through Resharding; a
backup through Replicas. This part holds no state of its own beyond the queues Membership
and the take-back keep: it is the one place that decides which of them a registration
enters.
"""

from __future__ import annotations

from dataclasses import replace

from paramserver.coordinator.events import AppendEvent, Registered, Reply, SaveLayout, Warn
from paramserver.coordinator.membership import Member, queue_waiting
from paramserver.coordinator.takeback import BackupBack
from paramserver.spec.welcome import ServerJob, ShardRestore, WorkerJob


def refuse(e: Registered, reason: str, out: list) -> None:
    out.append(Warn(f"refused register from {e.src}: {reason}", e.src))
    out.append(Reply(e.to, "error", {"msg": reason, "code": "refused"}))


def wait(queue: list, e: Registered, out: list) -> None:
    """A registration that waits for the start: queued, or refused when too many do."""
    refused = queue_waiting(queue, e)
    if refused is not None:
        refuse(e, refused, out)


class Registration:
    """The registration part of `coord` (a CoordinatorState): it reads the job, the policy
    host, the budget and the parts registration hands members to."""

    def __init__(self, coord):
        self.coord = coord

    def handlers(self) -> dict:
        return {Registered: self.on_registered}

    # ---- the event --------------------------------------------------------------------------
    def on_registered(self, e: Registered, out: list) -> None:
        coord = self.coord
        members = coord.members
        members.touch(e.src, e.now)
        role = e.role
        if role == "worker" and members.ranges is None and e.num_keys:
            coord.script_optimizer.first(e, out)  # before the servers that wait are welcomed
            waited = members.learn_key_space(e.num_keys)
            out.append(AppendEvent(e.now, "key_space", {"num_keys": e.num_keys}))
            for server in waited:
                self._admit(self._server, server, e.now, out)
        if role == "server":
            if members.ranges is None:
                wait(members.pending_servers, e, out)
            else:
                self._server(e, e.now, out)
        elif role in ("worker", "observer"):
            takeback = coord.rejoins.pending
            if e.rejoin is not None:
                coord.rejoins.worker_back(e, out)
            elif self._again(e, out):
                pass
            elif takeback is not None:
                wait(takeback.fresh, e, out)  # a replacement: once taken back
            elif not members.servers_complete:
                wait(members.pending_workers, e, out)
            else:
                self.worker(e, e.now, out)
        else:
            raise ValueError(f"unknown role {role!r}; known: server, worker, observer")

    # ---- what other parts ask of it ---------------------------------------------------------
    def admit_worker(self, e: Registered, now: float, out: list) -> None:
        """A worker's registration that waited (for the servers, a take-back, a free rank)."""
        self._admit(self.worker, e, now, out)

    def admit_server(self, e: Registered, now: float, out: list) -> None:
        """A server's registration that waited (for a take-back), handled as a new one."""
        self._admit(self._server, e, now, out)

    def admit_waiting_workers(self, now: float, out: list) -> None:
        """Once every server is in, the workers that waited for them."""
        members = self.coord.members
        if members.servers_complete and members.pending_workers:
            pending, members.pending_workers = members.pending_workers, []
            for worker in pending:
                self.admit_worker(worker, now, out)

    def server_job(self, rank: int) -> ServerJob:
        """What server `rank` is told: its shard of the job."""
        coord = self.coord
        shard = coord.members.ranges[rank]
        job = self.shard_job(shard.lo, shard.hi)
        if coord.schedule.keeps_initial:
            job = job.with_initial_checkpoint(str(coord.schedule.root))
        return job

    def shard_job(self, lo: int, hi: int) -> ServerJob:
        """The job of a shard holding keys [lo, hi)."""
        coord = self.coord
        job = coord.job
        if job.max_servers and job.num_keys != coord.members.num_keys:
            # (the key space learned from the first worker bounds a moving shard's frames)
            job = replace(job, num_keys=coord.members.num_keys)
        if coord.script_optimizer.spec is not None:  # the script's torch optimizer
            job = replace(job, optimizer=coord.script_optimizer.spec)
        return ServerJob.of(job, lo, hi, coord.host.apply_mode)

    def worker(self, e: Registered, now: float, out: list) -> None:
        """A worker or evaluator given a rank (or queued for one) and welcomed."""
        members = self.coord.members
        if e.role == "worker":
            self.coord.script_optimizer.check(e)
        known = members.layout
        member = members.add_worker(e)
        if members.layout is not known:
            out.append(SaveLayout(members.layout.to_wire()))
        if member is None:
            return  # waits for a rank
        self._welcome(member, e, out)
        out.append(AppendEvent(now, f"{e.role}_registered", {"rank": member.rank, "src": e.src}))

    # ---- inside -----------------------------------------------------------------------------
    def _admit(self, register, e: Registered, now: float, out: list) -> None:
        """A registration that waited: refused on its own if it is wrong, not with the event
        that let it in. It is taken at `now`: a member's silence counts from its welcome (a
        backup that waited for the key space was otherwise found silent for that wait)."""
        e.now = now
        try:
            register(e, now, out)
        except ValueError as exc:
            refuse(e, str(exc), out)

    def _server(self, e: Registered, now: float, out: list) -> None:
        if e.addr is None:
            raise ValueError("a server must register with its address")
        coord = self.coord
        members = coord.members
        if e.backup:
            def welcome(rank: int) -> Reply:
                return Reply(e.to, "welcome", {"rank": rank, "backup": True,
                                               "job": self.server_job(rank).to_dict()})
            if e.rejoin is not None:  # a live backup back to this restarted coordinator
                coord.replicas.backup_back(e, BackupBack.of(e.rejoin), members, welcome, out)
            elif coord.orphans.step_up(e, welcome, out):  # in place of a primary never come
                self.admit_waiting_workers(now, out)
            else:
                coord.replicas.register(e, members, welcome, out)
            return
        if e.rejoin is not None:
            coord.rejoins.server_back(e, now, out)
            return
        if coord.rejoins.pending is not None:  # a server restarted, or a joiner
            wait(coord.rejoins.pending.server_queue(e.addr), e, out)
            return
        back = members.server_at(e.addr)
        if back is not None:  # only one process can listen there: the old one is dead
            failure = coord.recovery.back(e, back, coord.schedule, coord.progress,
                                          self.server_job(back.rank), out, coord.layout_now())
            members.relinked()
            if failure is not None:
                coord.fail(failure, now, out)
            return
        if coord.reshard.enabled and members.servers_complete:
            coord.resharding.join(e, members, now, out)
            return
        member = members.add_server(e, now)
        job = self.server_job(member.rank)
        if coord.job.resume is not None:
            job = job.with_restore(ShardRestore.of_resume(coord.job.resume, coord.progress))
        out.append(Reply(e.to, "welcome", {"rank": member.rank, "job": job.to_dict()}))
        out.append(AppendEvent(now, "server_joined", {"rank": member.rank, "addr": e.addr}))
        if coord.replicas.enabled:
            coord.replicas.primary_up(member, now, out)
        self.admit_waiting_workers(now, out)

    def _again(self, e: Registered, out: list) -> bool:
        """A worker's registration sent again (its answer may have died with a coordinator):
        a waiting one now waits on the new request, a welcomed one that has not started is
        welcomed again; True if it was one."""
        coord = self.coord
        members, src = coord.members, e.src
        queues = [members.pending_workers]
        if coord.rejoins.pending is not None:
            queues.append(coord.rejoins.pending.fresh)
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
        self._welcome(member, e, out)
        return True

    def _welcome(self, member: Member, e: Registered, out: list) -> None:
        coord = self.coord
        host = coord.host
        job = WorkerJob.of(coord.job, coord.members.num_keys, coord.members.shard_map(),
                           host.apply_mode, host.name,
                           coord.budget.worker_samples.get(member.rank, 0))
        fields = {"rank": member.rank, "job": job.to_dict()}
        if coord.reshard.enabled:
            fields["epoch"] = member.epoch = coord.reshard.epoch
        out.append(Reply(e.to, "welcome", fields))
