"""The step protocol: workers start, clock each step and leave; the policy's decisions reach them.

The `Started`, `Clocked` and `Bye` events' part. A clock is counted by the policy host, and
what the policy decides comes back through `apply`: a release goes to the worker that waits
for it (or is kept until it asks, or held while an elastic job is below MIN workers or keys
move), a round closed goes to the servers as `apply_round`, a note to the event log. Once the
budget is spent every worker still waiting is told to stop. The part owns the count of steps
in the rounds applied (`steps_applied`), which says whether the shards hold every step counted
so far (`at_rest`): a checkpoint's counters must match the shards' values.
"""

from __future__ import annotations

from dataclasses import replace

from paramserver.coordinator.events import (
    AppendEvent, AppendMetric, Bye, Clocked, Reply, SendRelease, Started, ToServers,
)
from paramserver.policies import ApplyRound, Note, Pushed, Release

_OK: dict = {}  # the empty fields of an "ok" reply; never changed


class Steps:
    """The step protocol of `coord` (a CoordinatorState)."""

    def __init__(self, coord):
        self.coord = coord
        self.steps_applied = coord.host.steps_done  # steps in the rounds applied (round mode)
        # Arrival mode: steps clocked into a lockstep round (auto's) the shards still sum
        self.summing = 0
        # The parts a step passes through, each made once with the router: read on every
        # clock, so looked up once here.
        self._members, self._host, self._budget = coord.members, coord.host, coord.budget
        self._elastic, self._reshard, self._rejoins = coord.elastic, coord.reshard, coord.rejoins

    def handlers(self) -> dict:
        return {Started: self.on_started, Clocked: self.on_clocked, Bye: self.on_bye}

    def at_rest(self) -> bool:
        """Whether the shards' values hold every step counted so far (so a checkpoint's
        counters match them): always in arrival mode, where a push is applied before its
        clock, but for a lockstep round it sums (auto's); in round mode, only while no worker
        has clocked the round in progress."""
        if not self.coord.round_mode:
            return not self.summing
        return self.coord.host.steps_done == self.steps_applied

    def counted_again(self, rank: int, batch: int) -> None:
        """A clock of a round applied before a coordinator restart, sent again: counted
        (its round is in the shards' values), not pushed to the policy again."""
        coord = self.coord
        coord.host.counted_again(batch)
        coord.budget.count(rank, batch)
        self.steps_applied += 1

    def rebuilt(self) -> None:
        """The policy was rebuilt by a take-back: every step it counts is applied."""
        self.steps_applied, self.summing = self.coord.host.steps_done, 0

    def started(self) -> int:
        """Workers that are training (started), the count an elastic job keeps >= MIN."""
        return sum(1 for m in self.coord.members.roster.workers.values() if m.started)

    # ---- the events ---------------------------------------------------------------------------
    def on_started(self, e: Started, out: list) -> None:
        coord = self.coord
        members, now = coord.members, e.now
        observer = members.roster.observers.get(e.src)
        if observer is not None:  # an evaluator is ready: training may begin
            observer.last_seen, observer.started = now, True
            out.append(Reply(e.to, "ok", _OK))
            return
        member = members.worker(e.src)
        if coord.rejoins.hold(e):
            return
        elastic = coord.elastic
        if elastic is not None and not member.started:
            elastic.check_data(e.data_len)  # refused: it never starts
        member.last_seen, member.waiting, member.started = now, e.to, True
        if member.ready is not None:
            ready, member.ready = member.ready, None
            self.deliver(ready, out, refill=True)
        elif coord.barrier.open:
            # A join of the running job (an elastic joiner, a replacement worker).
            host = coord.host
            out.append(AppendEvent(now, "worker_joined", {
                "worker": member.rank, "src": e.src, "workers": self.started(),
                "round": host.rounds_applied, "samples": host.samples_done}))
            if elastic is not None:
                coord.add_metric(now, {"kind": "membership", "change": "joined",
                                       "worker": member.rank, "workers": self.started()}, out)
                self.resume_if_enough(now, out)
            self.apply(host.joined(member.rank, now, late=elastic is not None), now, out)

    def on_clocked(self, e: Clocked, out: list) -> None:
        coord = self.coord
        member = self._members.worker(e.src)
        if self._rejoins.pending is not None and self._rejoins.hold(e):
            return  # answered once the policy is rebuilt
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
        if member.behind is not None and self._rejoins.caught_up(member, e, out):
            return
        budget = self._budget
        if not budget.closed and budget.max_seconds:  # time's up: this step is the last one
            coord.check_budget(now, out)
        decisions = self._host.pushed(Pushed(member.rank, e.step - member.offset, now,
                                             e.batch, e.compute_time, e.cpu_load, e.free_mem))
        budget.count(member.rank, e.batch)
        if member.last_release is not None and member.last_release.round_id:
            self.summing += 1  # (before the decisions: they may close the round)
        if self._elastic is not None:
            self._elastic.clocked(member.rank, now, out, e.step)
        self.apply(decisions, now, out)
        t_start = coord.barrier.t_start
        if e.record is not None and t_start is not None:
            # After the releases: the log line is off their path.
            out.append(AppendMetric(now - t_start, {
                "kind": "step", "worker": member.rank, "step": e.step, "batch": e.batch,
                **e.record}))
        if e.leave is not None:
            out.append(Reply(e.to, "ok", _OK))
            self.drop_worker(e.src, e.leave, now, out)
        if coord.checkpoints.enabled:
            coord.checkpoints.maybe(now, out)

    def on_bye(self, e: Bye, out: list) -> None:
        members = self.coord.members
        members.touch(e.src, e.now)
        if e.src in members.roster.observers:
            del members.roster.observers[e.src]
            out.append(Reply(e.to, "ok", _OK))
            return
        members.worker(e.src)
        out.append(Reply(e.to, "ok", _OK))
        if self.coord.rejoins.forget(e.src):  # not in the policy yet
            members.drop_worker(e.src, e.reason)
            return
        self.drop_worker(e.src, e.reason, e.now, out)

    # ---- the policy's decisions ---------------------------------------------------------------
    def apply(self, decisions: list, now: float, out: list) -> None:
        for d in decisions:
            kind = type(d)
            if kind is Release:
                self.deliver(d, out)
            elif kind is ApplyRound:
                self.steps_applied, self.summing = self._host.steps_done, 0
                contributors = list(d.contributors)
                out.append(ToServers("apply_round", {"step": d.step, "contributors": contributors},
                                     self._members.server_links))
                out.append(AppendEvent(now, "apply_round",
                                       {"step": d.step, "contributors": contributors}))
            elif kind is Note:
                if d.kind == "budget_reached":
                    self._budget.closed = True
                out.append(AppendEvent(now, d.kind, dict(d.data)))
        if self._host.stopping:
            self.stop_waiting(out)

    def stop_waiting(self, out: list) -> None:
        """Once the budget is spent no step will come that a held worker waits for (ElasticBSP
        holds one for another's next push, a round may never fill): every worker still waiting
        is told to stop now, not left to wait for a release that cannot come."""
        coord = self.coord
        host = coord.host
        for m in coord.members.roster.workers.values():
            if m.waiting is not None and m.ready is None:
                out.append(SendRelease(m.waiting, m.steps, coord.job.batch_size,
                                       host.version if coord.round_mode else 0,
                                       host.policy.round_size(), True))
                m.waiting = None

    def deliver(self, d: Release, out: list, refill: bool = False) -> None:
        """Release `d` to its worker if it waits for one; else kept until it asks, or held
        (below MIN workers, keys on the move)."""
        member = self._members.by_rank.get(d.worker)
        if member is None:
            return  # released after it left: nothing to tell
        if member.joining is not None and self._rejoins.joined_back(member, d):
            return
        if member.waiting is None:
            member.ready = d  # decided before the worker asked for it
            return
        elastic = self._elastic
        if elastic is not None and elastic.paused and not d.stop:
            elastic.hold(d)  # fewer than MIN workers: nobody steps until enough are back
            return
        reshard = self._reshard
        if reshard.holding and not d.stop:
            reshard.hold(d)  # the fence: nobody steps until the keys have moved
            return
        if refill:  # it waited for its worker: what it must say is what holds now
            host = self._host
            d = Release(d.worker, d.step, d.batch_size, d.not_before, d.scale,
                        host.version if self.coord.round_mode else 0, host.policy.round_size(),
                        host.stopping, d.round_id)
        member.last_release = release = SendRelease(
            member.waiting, d.step + member.offset, d.batch_size, d.min_version, d.round_size,
            d.stop, d.scale, d.round_id)
        if elastic is not None and not d.stop:
            release.samples = elastic.lend(d.worker, d.batch_size, release.step)
        if member.epoch != reshard.epoch:  # the keys moved since it last heard
            release.epoch, release.layout = reshard.epoch, self._members.shard_map()
            member.epoch = reshard.epoch
        out.append(release)
        member.waiting = None

    # ---- workers leaving and coming back --------------------------------------------------------
    def drop_worker(self, src: str, reason: str, now: float, out: list) -> None:
        """Worker `src` is gone (`reason`: done, dead, preempted...)."""
        coord = self.coord
        members, barrier = coord.members, coord.barrier
        member = members.drop_worker(src, reason)
        left = {"worker": member.rank, "reason": reason}
        elastic = coord.elastic
        if elastic is not None:
            left["samples_returned"] = elastic.left(member.rank)
            left["workers"] = self.started()
        out.append(AppendEvent(now, "worker_left", left))
        coord.add_metric(now, {"kind": "left", "worker": member.rank, "reason": reason}, out)
        if member.started and barrier.open:
            # A release still held for this rank must not reach a newcomer that takes it.
            self.apply(coord.host.left(member.rank, now, reason), now, out)
        elif not barrier.open:
            barrier.lost_before_start += 1
        if members.rank_waiters:
            coord.registration.admit_worker(members.rank_waiters.pop(0)[0], now, out)
        self.wait_if_below_min(now, out)

    def wait_if_below_min(self, now: float, out: list) -> None:
        """An elastic job with fewer than MIN workers training (after a leave, or a take-back
        that got fewer back) holds every release until enough join."""
        coord = self.coord
        elastic = coord.elastic
        if elastic is None or not coord.barrier.open or coord.host.stopping:
            return
        if elastic.below_min(self.started(), now, out):
            coord.add_metric(now, {"kind": "membership", "change": "waiting",
                                   "workers": self.started(),
                                   "min_workers": elastic.min_workers}, out)

    def resume_if_enough(self, now: float, out: list) -> None:
        """Enough workers again: the releases held while below MIN go out."""
        elastic = self.coord.elastic
        if elastic is None or not elastic.paused:
            return
        for d in elastic.enough(self.started(), now, out):
            self.deliver(d, out)
        if not elastic.paused:
            self.coord.add_metric(now, {"kind": "membership", "change": "back",
                                        "workers": self.started()}, out)
