"""Coordinator side of server recovery: a server back from a crash, and servers gone silent."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from paramserver.net import rpc
from paramserver.runlog.checkpoint import latest
from paramserver.coordinator.membership import Member
from paramserver.wire import Message

log = logging.getLogger(__name__)


class ServerRecoveryMixin:
    """Part of the Coordinator: shares its state (roster, keeper, job, counters).

    A restarted server registers again at the address it had: it gets its old rank and is
    told to restore its shard from the latest committed checkpoint, its version lifted to the
    rounds (or steps) the job has done, so pulls waiting for the job's version are served.
    The updates it loses are those applied since that checkpoint; it reports them and they are
    logged (`restart` metrics, `server_restored` events). A server that stays silent ends the
    job with its name unless servers may be restarted, and then after `restart_timeout` s.
    """

    lost_updates = 0
    server_restarts = 0
    failure: str | None = None

    def _server_back(self, ident: bytes, msg: Message, member: Member) -> None:
        root = self.keeper.root
        tag = latest(Path(root)) if root is not None else None
        src = f"s{member.rank}"
        if tag is None:
            self._reply(ident, msg, Message("error", {
                "msg": "no committed checkpoint to restore the shard from", "code": "refused"}))
            self._fail(f"server {src} at {member.addr} restarted, but the job has no committed "
                       f"checkpoint to restore its shard from")
            return
        if self.keeper.pending_tag is not None:
            # The dead server will never confirm it: that checkpoint is abandoned.
            self.record("checkpoint_aborted", tag=self.keeper.pending_tag, server=member.rank)
            self.keeper.abort()
        member.ident, member.last_seen, member.silent_since = ident, time.monotonic(), None
        restore = {"dir": str(root), "tag": tag, "version_floor": self._progress(),
                   "restart": True}
        self._reply(ident, msg, Message("welcome", {
            "rank": member.rank, "job": dict(self._server_job(member.rank), restore=restore)}))
        self.server_restarts += 1
        self.record("server_rejoined", rank=member.rank, addr=member.addr, checkpoint=tag)

    def _on_restored(self, ident: bytes, msg: Message) -> None:
        member = self.roster.servers.get(msg.src)
        if member is None:
            raise ValueError(f"unknown server {msg.src!r}")
        lost = int(msg["lost_updates"])
        self.lost_updates += lost
        self.record("server_restored", rank=member.rank, checkpoint=msg["tag"],
                    lost_updates=lost, version=msg["version"])
        self.metric({"kind": "restart", "role": "server", "server": member.rank,
                     "checkpoint": msg["tag"], "lost_updates": lost})

    def _check_servers(self, now: float) -> None:
        """A server silent for `server_timeout` s is gone: the job waits `restart_timeout` s
        for it when servers may be restarted, else stops naming it."""
        silent_for = float(self.job.get("server_timeout", max(6 * self.hb_timeout, 30.0)))
        for src, m in self.roster.servers.items():
            quiet = now - m.last_seen
            if quiet <= silent_for:
                continue
            if not self.job.get("restart_servers"):
                self._fail(f"server {src} at {m.addr} has been silent for {quiet:.0f} s: the "
                           f"job stops (--restart-servers restarts dead servers)")
                return
            if m.silent_since is None:
                m.silent_since = now
                self.record("server_lost", rank=m.rank, addr=m.addr)
            restart_timeout = float(self.job.get("restart_timeout", 120.0))
            if quiet > restart_timeout:
                self._fail(f"server {src} at {m.addr} did not come back within "
                           f"{restart_timeout:.0f} s: the job stops")
                return

    def _fail(self, message: str) -> None:
        """End the job now, with `message` as the reason; waiting workers are told to stop."""
        if self.failure is not None:
            return
        log.error("%s", message)
        self.failure = message
        self.record("job_failed", reason=message)
        self.stopping = True
        for m in list(self.roster.workers.values()):
            if m.waiting_rid is not None:
                rpc.send(self.sock, Message("error", {"msg": message, "code": "failed"},
                                            rid=m.waiting_rid, src="coord"), m.ident)
                m.waiting_rid = None
        self.finished = True
