"""The take-back part: a restarted coordinator takes back the live servers and workers.

`TakeBack` (takeback.py) collects what the members say of themselves; this part decides what
their re-registrations are told, holds the job's other events while it waits, and rebuilds the
policy, the budget and the barrier from the plan once every server is back (or fails the job
when one is not within `server_timeout`). After the rebuild it still answers members that come
back late, and it owns the two marks the rebuild leaves on a member: `joining` (the policy's
join release of a worker that already holds one) and `behind` (a worker whose clock of a round
that completed before the old coordinator died is still unanswered).
"""

from __future__ import annotations

from paramserver.coordinator.events import (
    AppendEvent, Clocked, Registered, Reply, Started, ToServers,
)
from paramserver.coordinator.membership import Member
from paramserver.coordinator.replica_history import ReplicaHistory
from paramserver.coordinator.takeback import ServerBack, TakeBack, WorkerBack
from paramserver.coordinator.worker_history import WorkerHistory
from paramserver.policies import Release


class Rejoins:
    """The take-back part of `coord` (a CoordinatorState). `saved` is the coordinator's part
    of the job's latest checkpoint, None when this coordinator did not replace one.
    `workers`, `servers`: what the old coordinator's log says of its workers (the take-back
    waits for the ranks it names, `expected`) and of its servers (the drains it did not do,
    where its servers were); None: its log was not read."""

    def __init__(self, coord, saved: dict | None, now: float,
                 workers: WorkerHistory | None = None, servers: ReplicaHistory | None = None):
        self.coord = coord
        job, limits = coord.job, coord.job.limits
        # The re-registrations while the rebuild waits for them; None once rebuilt (or never).
        self.pending: TakeBack | None = None
        self.fails_at = float("inf")
        # Live resharding: drains the old coordinator was asked for and did not do, {server
        # address: who asked}, from its log, then from servers back whose SIGTERM asked one;
        # asked again of this one once the job is rebuilt.
        self.drains: dict[str, str] = {} if servers is None else dict(servers.drains)
        if saved is not None:
            expected, replacements = self.expected(job, workers)
            addrs = None  # (a server new to a job whose servers cannot join: one restarted)
            if coord.reshard.enabled and servers is not None and servers.servers:
                addrs = frozenset(servers.servers.values())
            self.pending = TakeBack(now + limits.heartbeat_timeout,
                                    coord.members.servers_expected, expected, saved,
                                    job.batch_size, replacements, addrs)
            # Servers hold the parameters: without all of them back there is no job.
            self.fails_at = now + limits.server_timeout

    @staticmethod
    def expected(job, workers: WorkerHistory | None) -> tuple[frozenset[int], bool]:
        """The worker ranks a take-back waits for, and whether a new worker stands for one
        not back. Without the log: every rank, any newcomer a replacement. An elastic job:
        the members at the death (a rank past MAX cannot come back: it would be refused),
        a newcomer as likely a joiner. A fixed job: every rank but those that left on their
        own word (done, preempted: nobody replaces them), a newcomer a dead one's
        replacement."""
        every = frozenset(range(job.workers))
        if workers is None or workers.ranks is None:
            return every, True
        if job.elastic:
            return every & frozenset(workers.ranks), False
        return every - frozenset(workers.left), True

    def next_deadline(self) -> float | None:
        if self.pending is None:
            return None
        return min(self.pending.deadline, self.fails_at)

    # ---- events held until the rebuild -----------------------------------------------------
    def hold(self, e: Clocked | Started) -> bool:
        """True when `e` waits for the rebuild (it is answered then)."""
        if self.pending is None:
            return False
        self.pending.defer(e)
        return True

    def forget(self, src: str) -> bool:
        """A worker that said bye before the rebuild: True if it was one (it never joined the
        policy)."""
        if self.pending is None:
            return False
        self.pending.forget(src)
        return True

    def took_over(self, back: ServerBack) -> None:
        """A backup took the place of a primary lost with the coordinator: its shard is back."""
        if self.pending is not None:
            self.pending.server_back(back)

    # ---- members back ----------------------------------------------------------------------
    def server_back(self, e: Registered, now: float, out: list) -> None:
        """A live server back to this (restarted) coordinator: its shard and version are the
        job's; it goes on serving as it was."""
        coord = self.coord
        back = ServerBack.of(e.rejoin)
        member = coord.members.rejoin_server(e, back.rank, back.lo, back.hi)
        out.append(Reply(e.to, "welcome", {
            "rank": member.rank, "job": coord.registration.server_job(member.rank).to_dict()}))
        out.append(AppendEvent(now, "server_taken_back", {"rank": member.rank, "addr": e.addr,
                                                         "version": back.version}))
        if back.moving and coord.reshard.enabled:
            # Keys were moving when the old coordinator died: the server kept its old core
            # (it rejoined with that range) and holds or refuses requests until the move ends.
            # Nobody will commit it: it is given up, as an overdue move is (its epoch spent).
            if back.moving > coord.reshard.epoch:  # (said once, by its first server back)
                coord.reshard.epoch = back.moving
                out.append(AppendEvent(now, "reshard_refused", {
                    "kind": "move", "addr": e.addr, "epoch": back.moving,
                    "reason": "the coordinator that started it died before its commit"}))
            out.append(ToServers("reshard_abort", {"epoch": back.moving}, (member.link,)))
        if back.draining and coord.reshard.enabled:  # its SIGTERM's drain, lost with the old
            self.drains.setdefault(e.addr, e.src)
            if self.pending is None:
                self._drain_again(now, out)
        if self.pending is not None:
            self.pending.server_back(back)
        if coord.replicas.enabled:  # the backup it forwards to, when that one is back too
            coord.replicas.primary_back(member, back, now, coord.members, out)
        coord.registration.admit_waiting_workers(now, out)

    def worker_back(self, e: Registered, out: list) -> None:
        """A live worker (or evaluator) back under its rank, with the step it is at; the job
        it was given holds (the welcome's job is empty)."""
        back = WorkerBack.of(e.rejoin)
        member, again = self.coord.members.rejoin_worker(e, back.rank)
        out.append(Reply(e.to, "welcome", {"rank": member.rank, "job": {}}))
        if again:
            return
        out.append(AppendEvent(e.now, f"{e.role}_taken_back", {
            "rank": member.rank, "src": e.src, "step": back.step, "clocked": back.clocked}))
        if e.role == "observer":
            member.started = True
            return
        member.steps = max(back.step, 0)
        if self.pending is not None:
            self.pending.worker_back(e.src, back)
            member.started = back.step >= 0
        elif back.step >= 0:  # back after the rebuild: it joins the running policy
            self._join([member], [back], e.now, out)

    def _join(self, members: list[Member], backs: list[WorkerBack], now: float,
              out: list) -> None:
        for m, back in zip(members, backs):
            m.started, m.joining, m.waiting, m.ready = True, back, None, None
        coord = self.coord
        coord.steps.apply(coord.host.joined_all([m.rank for m in members], now), now, out)
        coord.steps.resume_if_enough(now, out)  # (one back late may bring an elastic job to MIN)

    def _drain_again(self, now: float, out: list) -> None:
        """The drains lost with the old coordinator, asked of this one in the order asked."""
        coord = self.coord
        drains, self.drains = self.drains, {}
        if coord.reshard.enabled:
            for addr, by in drains.items():
                coord.resharding.drain_again(addr, by, now, coord.members, out)

    # ---- the marks the rebuild leaves on a worker ------------------------------------------
    def caught_up(self, member: Member, e: Clocked, out: list) -> bool:
        """A taken-back worker's re-sent clock of a round that completed before the old
        coordinator died: the release it holds is the answer (counted, not pushed again)."""
        behind, member.behind = member.behind, None
        if e.step != behind or member.ready is None:
            return False
        coord = self.coord
        coord.steps.counted_again(member.rank, e.batch)
        ready, member.ready = member.ready, None
        coord.steps.deliver(ready, out, refill=True)
        return True

    def joined_back(self, member: Member, d: Release) -> bool:
        """The policy's join release of a taken-back worker, which already holds a release:
        True if it is swallowed. In round mode steps are rounds, the same in policy and
        workers; a worker behind (its clock of a completed round unanswered, or, back after
        the rebuild, still in a round that closed without it) keeps this release for its
        clock of that round. In arrival mode the rebuilt policy counts steps from its join:
        the worker's steps are the policy's plus `offset`."""
        back, member.joining = member.joining, None
        if not self.coord.round_mode:
            member.offset = back.step - d.step
            return True
        if d.step > back.step:
            member.ready, member.behind = d, back.step
        return True

    # ---- the rebuild -----------------------------------------------------------------------
    def check(self, now: float, out: list) -> None:
        """Once every server and worker is back (or the deadline passed): rebuild the policy
        from what they said, then answer the requests that waited for it."""
        tb, coord = self.pending, self.coord
        if not tb.ready(now):
            if now >= self.fails_at:
                missing = sorted(set(range(coord.members.servers_expected)) -
                                 set(tb.servers))
                self.pending = None
                coord.fail(f"server(s) {missing} did not come back to the restarted "
                           f"coordinator within {coord.job.limits.server_timeout:.0f} s", now,
                           out)
            return
        self.pending = None
        plan = tb.plan(coord.round_mode)
        host = coord.host
        policy_state = dict(tb.saved.get("policy", {}))
        if coord.round_mode:
            policy_state["round"] = plan.round  # the round-mode policies' (BSP's) counter
        host.resume({"rounds_applied": plan.round, "samples_done": plan.samples,
                     "steps_done": plan.steps, "policy": policy_state})
        if tb.servers:  # (auto: its rounds since the checkpoint, from the live shards)
            host.align_versions(max(b.version for b in tb.servers.values()))
        coord.steps.rebuilt()
        coord.budget.worker_samples = dict(plan.worker_samples)
        coord.schedule.restart_count(coord.progress, now)
        roster = coord.members.roster
        # What it waited for and whether all of it came (`by`: "members", else "deadline"):
        # the members this coordinator rebuilt on are the ones the next one waits for.
        out.append(AppendEvent(now, "taken_back", {
            "servers": len(roster.servers), "workers": len(tb.workers), "round": plan.round,
            "samples": plan.samples, "versions": {str(r): b.version
                                                  for r, b in sorted(tb.servers.items())},
            "ranks": sorted(m.rank for m in roster.workers.values()),
            "expected": sorted(tb.expected),
            "missing": tb.missing(), "by": "members" if tb.all_back() else "deadline"}))
        if plan.open_barrier:
            coord.barrier.reopen(now)
            # Fewer than MIN back (the old coordinator was waiting for joins, or members died
            # with it): the rebuilt job waits as after a leave, before any release is made.
            coord.steps.wait_if_below_min(now, out)
            back = sorted(((roster.workers[src], b) for src, b in tb.workers.items()
                           if src in roster.workers and b.step >= 0),
                          key=lambda mb: mb[0].rank)
            if back:
                self._join([m for m, _ in back], [b for _, b in back], now, out)
            if host.stopping:
                coord.budget.closed = True
        # (summary.json counts it, beside the servers restarted: coordinator_restarts)
        coord.add_metric(now, {"kind": "takeback", "role": "coordinator", "round": plan.round,
                               "samples": plan.samples, "servers": len(roster.servers),
                               "workers": len(tb.workers)}, out)
        for e in tb.fresh_servers:  # a restarted server: its shard from the checkpoint
            if coord.members.servers_complete:  # every rank is back: a joiner, or one too many
                coord.registration.admit_server(e, now, out)
                continue
            member = coord.members.add_server(e, now)
            failure = coord.recovery.back(e, member, coord.schedule, coord.progress,
                                          coord.registration.server_job(member.rank), out)
            if failure is not None:
                coord.fail(failure, now, out)
                return
        for e in tb.joiners:  # (after every server: the job's servers are all in)
            coord.registration.admit_server(e, now, out)
        self._drain_again(now, out)
        for e in tb.deferred:
            coord.dispatch(e, out)
        for e in tb.fresh:
            coord.registration.admit_worker(e, now, out)
