"""Coordinator process: membership, key-range map, clocks, heartbeats, and the sync policy's host."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import zmq

from paramserver.core.keyspace import split_balanced
from paramserver.policies import (
    Joined, PolicyError, Pushed, Release, Tick, make_policy,
)
from paramserver.net import rpc
from paramserver.coordinator.checkpoint_keeper import CheckpointKeeper
from paramserver.coordinator.checks import ChecksMixin
from paramserver.coordinator.checkpoints import CheckpointMixin
from paramserver.coordinator.decisions import DecisionsMixin
from paramserver.coordinator.membership import Member, MembershipMixin, Roster
from paramserver.coordinator.server_recovery import ServerRecoveryMixin
from paramserver.transport import advertised_host, bind_router, new_context, security
from paramserver.wire import Message, WireError

log = logging.getLogger(__name__)


class Coordinator(MembershipMixin, CheckpointMixin, ServerRecoveryMixin, DecisionsMixin,
                  ChecksMixin):
    """Hosts the policy: turns messages into policy events and policy decisions into messages."""

    def __init__(self, job: dict, host: str = "127.0.0.1", port: int = 0,
                 address_file: str | None = None, events_path: str | None = None,
                 metrics_path: str | None = None, keys=None, advertise: str | None = None):
        self.job = job
        self.keys = keys  # security.Keys: CURVE; INSECURE: plaintext off loopback
        self.secured = isinstance(keys, security.Keys)  # senders' key roles are checked
        self.host, self.port = host, port
        self.advertise = advertised_host(host, None, advertise)  # the address others dial
        self.address_file = address_file
        self.events = open(events_path, "a", buffering=1) if events_path else None
        self.metrics = open(metrics_path, "a", buffering=1) if metrics_path else None
        self.samples_done = 0
        self.t_start: float | None = None  # when the start barrier opened: t = 0 of the metrics
        self.stopping = False
        self.workers_done_at: float | None = None
        self.worker_samples: dict[int, int] = {}
        self.steps_done = 0
        self.elapsed_before = 0.0
        self.lost_before_start = 0  # workers that died before training began: not waited for
        sync = job["sync"]
        self.policy = make_policy(sync["name"], job["batch_size"], **sync.get("options", {}))
        # num_keys 0: the first worker to register tells it (a user's own model, `launch`).
        self.ranges = split_balanced(job["num_keys"], job["servers"]) if job["num_keys"] else None
        self.pending_servers: list[tuple[bytes, Message]] = []
        self.rank_waiters: list[tuple[bytes, Message, float]] = []
        self.roster = Roster()
        self.timers: list[tuple[float, int, Release]] = []
        self.timer_seq = 0
        self.rounds_applied = 0
        self.barrier_open = False
        self.t0 = time.monotonic()
        self.hb_timeout = float(job.get("heartbeat_timeout", 5.0))
        self.start_timeout = float(job.get("start_timeout", 120.0))
        self.pending_workers: list[tuple[bytes, Message]] = []
        self.finished = False
        ckpt = job.get("checkpoint") or {}
        self.keeper = CheckpointKeeper(ckpt.get("dir"), ckpt.get("every"), ckpt.get("seconds"))
        self.final_checkpoint = False
        if job.get("resume"):
            self._resume(job["resume"])

    # ---- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        ctx = new_context()
        self.sock, addr = bind_router(ctx, self.host, self.port, keys=self.keys,
                                      advertise=self.advertise)
        if self.address_file:
            with open(self.address_file + ".tmp", "w") as f:
                f.write(addr)
            os.replace(self.address_file + ".tmp", self.address_file)
        log.info("coordinator at %s, policy %s", addr, self.policy.name)
        self.record("start", address=addr, policy=self.policy.name)
        try:
            self._loop()
        finally:
            self._shutdown_servers("job finished" if self.finished else "coordinator stopping")
            self.sock.close(0)
            ctx.term()
            for f in (self.events, self.metrics):
                if f:
                    f.close()
        if self.failure is not None:
            print(f"paramserver coordinator: the job failed: {self.failure}", file=sys.stderr)
            return 1
        return 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, kind: str, **data) -> None:
        if self.events:
            self.events.write(json.dumps({"t": round(self.now(), 6), "event": kind, **data}) + "\n")

    def metric(self, record: dict, age: float = 0.0) -> None:
        """One line of metrics.jsonl, stamped with seconds since the start barrier opened."""
        if self.metrics and self.t_start is not None:
            t = time.monotonic() - self.t_start - age
            self.metrics.write(json.dumps({"t": round(t, 6), **record}) + "\n")

    def _loop(self) -> None:
        while not self.finished:
            timeout = self._poll_timeout()
            if self.sock.poll(timeout * 1000):
                self._drain()
            self._fire_timers()
            self._tick_policy()
            self._check_liveness()
            self._check_start_barrier()
            self._check_budget()
            self._check_finished()

    def _poll_timeout(self) -> float:
        wait = 0.2
        if self.timers:
            wait = min(wait, max(0.0, self.timers[0][0] - self.now()))
        deadline = self.policy.next_deadline()
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - self.now()))
        return wait

    def _tick_policy(self) -> None:
        deadline = self.policy.next_deadline()
        if deadline is not None and deadline <= self.now() and self.barrier_open:
            self._apply(self.policy.handle(Tick(self.now())))

    def _drain(self) -> None:
        for _ in range(512):
            try:
                ident, msg, frames = rpc.recv_nowait(self.sock, routed=True)
            except zmq.Again:
                return
            if isinstance(msg, WireError):
                rpc.refuse(self.sock, ident, msg, "coord", frames)
                continue
            try:
                self._dispatch(ident, msg)
            except (PolicyError, ValueError, KeyError, TypeError) as exc:
                log.warning("refused %s from %s: %s", msg.op, msg.src, exc)
                self._reply(ident, msg, Message("error", {"msg": str(exc), "code": "refused"}))

    def _dispatch(self, ident, msg: Message) -> None:
        """Hand `msg` to its handler. With keys, the sender's key (`ident`, a transport.Peer)
        must be of the role it registers as, or registered in."""
        handler = getattr(self, f"_on_{msg.op}", None)
        if handler is None:
            raise ValueError(f"op {msg.op!r} is not served by the coordinator")
        role, member = self._member(msg)
        claimed = msg["role"] if msg.op == "register" else role
        if claimed is not None:
            security.check_role(ident, claimed, self.secured)
        if member is not None:
            member.last_seen = time.monotonic()
        handler(ident, msg)

    def _member(self, msg: Message) -> tuple[str | None, Member | None]:
        """The role and membership that the sender's `src` registered with, if any."""
        for role, group in (("worker", self.roster.workers), ("server", self.roster.servers),
                            ("observer", self.roster.observers)):
            if msg.src in group:
                return role, group[msg.src]
        return None, None

    def _reply(self, ident: bytes, request: Message, reply: Message) -> None:
        reply.rid, reply.src = request.rid, "coord"
        rpc.send(self.sock, reply, ident)

    # ---- the step protocol ----------------------------------------------------------------------
    def _on_start(self, ident: bytes, msg: Message) -> None:
        if msg.src in self.roster.observers:  # an evaluator is ready: training may begin
            self.roster.observers[msg.src].started = True
            self._reply(ident, msg, Message("ok"))
            return
        member = self._worker(msg.src)
        member.ident, member.waiting_rid, member.started = ident, msg.rid, True
        if member.ready is not None:
            ready, member.ready = member.ready, None
            self._deliver(ready)
        elif self.barrier_open:
            self._apply(self.policy.handle(Joined(member.rank, self.now())))

    def _on_clock(self, ident: bytes, msg: Message) -> None:
        member = self._worker(msg.src)
        member.ident, member.waiting_rid = ident, msg.rid
        member.steps = msg["step"] + 1
        self.samples_done += msg["batch"]
        self.steps_done += 1
        self._check_budget()  # before the policy releases anyone: the last step is this one
        self.worker_samples[member.rank] = self.worker_samples.get(member.rank, 0) + msg["batch"]
        now = self.now()
        event = Pushed(member.rank, msg["step"], now, msg["batch"],
                       float(msg["compute_time"]), msg.get("cpu_load"), msg.get("free_mem"))
        self._apply(self.policy.handle(event))
        if "record" in msg.fields:  # after the releases: the log line is off their path
            self.metric({"kind": "step", "worker": member.rank, "step": msg["step"],
                         "batch": msg["batch"], **msg["record"]},
                        age=self.now() - now)
        self._maybe_checkpoint()

    def _on_heartbeat(self, ident: bytes, msg: Message) -> None:
        # _dispatch already refreshed last_seen; members hear back, to know we are alive.
        member = self.roster.servers.get(msg.src)
        if member is not None and member.ident == ident:
            rpc.send(self.sock, Message("ok", src="coord"), ident)
            if "counters" in msg.fields:
                self.metric({"kind": "server", "server": member.rank, **msg["counters"]})
        elif msg.src in self.roster.workers or msg.src in self.roster.observers:
            rpc.send(self.sock, Message("ok", src="coord"), ident)

    def _on_bye(self, ident: bytes, msg: Message) -> None:
        if msg.src in self.roster.observers:
            del self.roster.observers[msg.src]
            self._reply(ident, msg, Message("ok"))
            return
        member = self._worker(msg.src)
        self._reply(ident, msg, Message("ok"))
        self._drop_worker(msg.src, member, msg.get("reason", "done"))

    def _on_report(self, ident: bytes, msg: Message) -> None:
        if self._member(msg)[0] not in ("worker", "observer"):
            raise ValueError(f"report from {msg.src!r}, which is no registered worker or "
                             f"observer")
        record = dict(msg["record"])
        age = record.pop("age_s", 0.0)
        self.metric(record, age=float(age) if isinstance(age, (int, float)) else 0.0)
        self._reply(ident, msg, Message("ok"))

    def _on_status(self, ident: bytes, msg: Message) -> None:
        state = {"policy": self.policy.name, "rounds_applied": self.rounds_applied,
                 "samples_done": self.samples_done, "stopping": self.stopping,
                 "started": self.barrier_open,
                 "workers_done": self.barrier_open and not self.roster.workers,
                 "elapsed_s": 0.0 if self.t_start is None else time.monotonic() - self.t_start,
                 "workers": {s: {"rank": m.rank, "steps": m.steps}
                             for s, m in self.roster.workers.items()},
                 "servers": {s: {"rank": m.rank, "addr": m.addr}
                             for s, m in self.roster.servers.items()},
                 "gone": dict(self.roster.gone)}
        self._reply(ident, msg, Message("state", {"state": state}))

    def _on_ok(self, ident: bytes, msg: Message) -> None:
        return None

    def _on_error(self, ident: bytes, msg: Message) -> None:
        log.warning("%s reported an error: %s", msg.src, msg["msg"])

    def _shutdown_servers(self, reason: str) -> None:
        for m in self.roster.servers.values():
            rpc.send(self.sock, Message("shutdown", {"reason": reason}, src="coord"), m.ident)
