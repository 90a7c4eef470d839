"""Coordinator decisions -> messages: releases (held until not_before), rounds, notes."""

from __future__ import annotations

import heapq

from paramserver.policies import ApplyRound, Note, Release
from paramserver.net import rpc
from paramserver.wire import Message


class DecisionsMixin:
    """Part of the Coordinator: shares its state (roster, policy, timers, sock, counters)."""

    def _apply(self, decisions) -> None:
        for d in decisions:
            if isinstance(d, Release):
                if d.not_before is not None and d.not_before > self.now():
                    self.timer_seq += 1
                    heapq.heappush(self.timers, (d.not_before, self.timer_seq, d))
                else:
                    self._deliver(d)
            elif isinstance(d, ApplyRound):
                self._apply_round(d)
            elif isinstance(d, Note):
                self.record(d.kind, **d.data)

    def _apply_round(self, d: ApplyRound) -> None:
        for m in self.roster.servers.values():
            rpc.send(self.sock, Message("apply_round", {"step": d.step,
                                                        "contributors": list(d.contributors)},
                                        src="coord"), m.ident)
        self.rounds_applied += 1
        self.record("apply_round", step=d.step, contributors=list(d.contributors))

    def _deliver(self, d: Release) -> None:
        member = next((m for m in self.roster.workers.values() if m.rank == d.worker), None)
        if member is None:
            return  # released after it left: nothing to tell
        if member.waiting_rid is None:
            member.ready = d
            return
        min_version = self.rounds_applied if self.policy.apply_mode == "round" else 0
        fields = {"step": d.step, "batch": d.batch_size, "min_version": min_version}
        size = self.policy.round_size()
        if size:
            fields["round_size"] = size
        if self.stopping:
            fields["stop"] = True
        if d.scale != 1.0:
            fields["scale"] = float(d.scale)
        reply = Message("release", fields, rid=member.waiting_rid, src="coord")
        member.waiting_rid = None
        rpc.send(self.sock, reply, member.ident)

    def _fire_timers(self) -> None:
        while self.timers and self.timers[0][0] <= self.now():
            self._deliver(heapq.heappop(self.timers)[2])
