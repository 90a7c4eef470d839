"""Shard server process: serves push/pull for one key range and applies rounds on command."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import zmq

from paramserver.core.keyspace import KeyRange
from paramserver.optim import make_rule
from paramserver.net import rpc
from paramserver.server.pulls import PendingPullsMixin
from paramserver.server.checkpoint import restore_shard, save_shard
from paramserver.server.store import ShardStore, StoreError
from paramserver.transport import (
    advertised_host, bind_router, connect_dealer, keep_freed_memory, new_context, security, shm,
)
from paramserver.wire import Message, WireError

log = logging.getLogger(__name__)

WORKER_OPS = ("init", "push", "push_sparse", "pull", "pull_keys", "status")
# Of those, the ones that change the shard: with keys, a worker's key only (an evaluator's reads).
WRITE_OPS = ("init", "push", "push_sparse")


class ServerNode(PendingPullsMixin):
    """One shard: a ROUTER for workers, a DEALER to the coordinator, one thread, no blocking."""

    def __init__(self, join: str, host: str = "127.0.0.1", port: int = 0,
                 pull_timeout: float = 60.0, register_timeout: float = 60.0,
                 reuse_memory: bool = True, shared_memory: bool | None = None, keys=None,
                 advertise: str | None = None):
        self.join, self.host, self.port = join, host, port
        # The address workers dial: `host`, or for a wildcard bind (0.0.0.0) `advertise`, else
        # this host's address on the route to the coordinator.
        self.advertise = advertised_host(host, join, advertise)
        self.keys = keys  # security.Keys: CURVE on both sockets; INSECURE: plaintext off loopback
        self.secured = isinstance(keys, security.Keys)  # writers' key roles are checked
        # A server process receives large frames all day: let their memory be reused (see
        # keep_freed_memory) rather than page-faulted in afresh for every push.
        self.reuse_memory = reuse_memory
        # Workers on this host may read pull replies in place and have pushes read from theirs
        # (transport.shm); None: when serving loopback only and PARAMSERVER_SHM is not 0.
        self.shared_memory = shared_memory
        self.pull_timeout = pull_timeout
        self.register_timeout = register_timeout
        self.src = "server"
        self.pending_pulls: list[tuple[float, bytes, Message]] = []
        self._handlers: dict = {}
        self.running = True
        self.store: ShardStore | None = None
        self.duplicates = 0  # retried pushes answered from the dedup table
        self.counters_sent = {"late_pushes": 0, "duplicates": 0}  # as the last heartbeat told

    # ---- setup ----------------------------------------------------------------------------------
    def _register(self, addr: str) -> dict:
        rpc.send(self.coord, Message("register", {"role": "server", "addr": addr}, src=self.src))
        if not self.coord.poll(int(self.register_timeout * 1000)):
            raise TimeoutError(f"coordinator at {self.join} did not answer registration within "
                               f"{self.register_timeout:.0f} s")
        _, msg, _ = rpc.recv(self.coord, routed=False)
        if msg is None or isinstance(msg, WireError) or msg.op != "welcome":
            raise RuntimeError(f"coordinator refused registration: {getattr(msg, 'fields', msg)}")
        return msg

    def _build_store(self, welcome: Message) -> None:
        job = welcome["job"]
        self.rank = welcome["rank"]
        self.src = f"s{self.rank}"
        lo, hi = job["shard_range"]
        opt = job["optimizer"]
        rule = make_rule(opt["name"], opt["lr"], **opt.get("options", {}))
        self.store = ShardStore(KeyRange(lo, hi), job["dtype"], rule, job["apply_mode"],
                                alloc=self._shared_values(hi - lo, job["dtype"]))
        # Idle OpenMP threads spin; on a few shared cores that starves the other processes.
        torch.set_num_threads(int(job.get("server_threads", 1)))
        self.lost_updates = 0
        if job.get("restore"):
            r = job["restore"]
            self.lost_updates = restore_shard(self.store, r["dir"], r["tag"], self.rank,
                                              int(r.get("version_floor", 0)))
            log.info("restored shard %d from checkpoint %s (%d updates lost)", self.rank,
                     r["tag"], self.lost_updates)
            if r.get("restart"):  # back after a crash: the coordinator counts what was lost
                rpc.send(self.coord, Message("restored", {
                    "tag": r["tag"], "lost_updates": self.lost_updates,
                    "version": self.store.version}, src=self.src))
        self.heartbeat_interval = float(job.get("heartbeat_interval", 1.0))
        self.coordinator_timeout = float(job.get("coordinator_timeout", 60.0))

    # Values plus spares for copy-on-write while workers still read replies in place.
    SHARED_BUFFERS = 4

    def _shared_values(self, size: int, dtype: str):
        """An allocator of value buffers in a shared arena, for workers on this host to read
        pull replies from in place (transport.shm); None when not serving loopback only."""
        wanted = shm.enabled() if self.shared_memory is None else self.shared_memory
        if not (wanted and shm.local_address(self.addr)):
            return None
        try:
            arena = shm.Arena(self.SHARED_BUFFERS * (size * np.dtype(dtype).itemsize + 64))
        except OSError:
            return None
        shm.serve_shared(self.router, arena)
        return lambda: arena.alloc(size, dtype)

    def run(self) -> int:
        if self.reuse_memory:
            keep_freed_memory()  # before the context: its I/O thread allocates the frames
        ctx = new_context()
        self.router, addr = bind_router(ctx, self.host, self.port, keys=self.keys,
                                        advertise=self.advertise)
        self.addr = addr
        self.coord = connect_dealer(ctx, self.join, keys=self.keys)
        try:
            self._build_store(self._register(addr))
            log.info("server %s serving keys [%d, %d) at %s", self.src, self.store.range.lo,
                     self.store.range.hi, addr)
            self._loop()
            return 0
        finally:
            self.router.close(0)
            self.coord.close(0)
            ctx.term()

    # ---- main loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.coord, zmq.POLLIN)
        next_beat = 0.0
        self.coord_heard = time.monotonic()
        while self.running:
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = now + self.heartbeat_interval
            timeout = max(0.0, min(next_beat, self._next_pull_deadline()) - now)
            for sock, _ in poller.poll(timeout * 1000):
                if sock is self.coord:
                    self.coord_heard = time.monotonic()
                self._drain(sock)
            self._expire_pulls(time.monotonic())
            self._check_coordinator()

    def _beat(self) -> None:
        """A heartbeat; it carries the shard's loss counters when they changed, for the job's
        metrics (summed in summary.json): pushes dropped as late, retries answered twice."""
        counters = {"late_pushes": self.store.late_pushes, "duplicates": self.duplicates}
        fields = {}
        if counters != self.counters_sent:
            fields["counters"] = self.counters_sent = counters
        rpc.send(self.coord, Message("heartbeat", fields, src=self.src))

    def _check_coordinator(self) -> None:
        """The coordinator answers every heartbeat: long silence means it is gone, and a
        server without it would serve a job that no longer exists forever."""
        silent = time.monotonic() - self.coord_heard
        if silent > self.coordinator_timeout:
            raise SystemExit(f"server {self.src}: the coordinator at {self.join} has been "
                             f"silent for {silent:.0f} s; exiting")

    def _drain(self, sock) -> None:
        routed = sock is self.router
        # Bounded batch per wake-up so that the coordinator's commands are never starved.
        for _ in range(256):
            try:
                ident, msg, frames = rpc.recv_nowait(sock, routed)
            except zmq.Again:
                return
            if isinstance(msg, WireError):
                rpc.refuse(sock, ident, msg, self.src, frames)
                continue
            try:
                self._dispatch(sock, ident, msg, routed)
            except (StoreError, ValueError, KeyError, TypeError) as exc:
                rpc.send(sock, Message("error", {"msg": str(exc), "code": "refused"},
                                       rid=msg.rid, src=self.src), ident)

    def _dispatch(self, sock, ident, msg: Message, from_worker: bool) -> None:
        if from_worker and msg.op not in WORKER_OPS:
            raise ValueError(f"op {msg.op!r} is not served by a parameter server")
        if from_worker and msg.op in WRITE_OPS:
            security.check_role(ident, "worker", self.secured)
        handler = self._handlers.get(msg.op)
        if handler is None:
            handler = self._handlers[msg.op] = getattr(self, f"_on_{msg.op}", None)
        if handler is None:
            raise ValueError(f"op {msg.op!r} is not served by a parameter server")
        reply = handler(msg, ident)
        if reply is not None:
            reply.rid, reply.src = msg.rid, self.src
            rpc.send(sock, reply, ident)
        if self.store.round_full:
            # The round's last push: apply now (after its ack, so the pusher's clock leaves
            # first) rather than after the coordinator hears every clock and says so.
            self.store.apply_round(self.store.round_step)
            self._serve_pulls()

    # ---- handlers -------------------------------------------------------------------------------
    def _on_init(self, msg: Message, ident) -> Message:
        lo, hi = msg["range"]
        self._need_arrays(msg, 1)
        took = self.store.init(lo, hi, msg.arrays[0])
        self._serve_pulls()
        return Message("ack", {"version": self.store.version, "staleness": 0 if took else -1})

    def _tags(self, msg: Message) -> dict:
        return {"step": msg["step"], "batch": msg["batch"], "base_version": msg["version"],
                "scale": float(msg.get("scale", 1.0)), "round_size": msg.get("round_size", 0)}

    def _on_push(self, msg: Message, ident) -> Message:
        self._need_init()
        self._need_arrays(msg, 1)
        lo, hi = msg["range"]
        done = self._already_applied(msg)
        if done is not None:
            return done
        res = self.store.push_dense(msg.src, lo, hi, msg.arrays[0], **self._tags(msg))
        self._serve_pulls()
        return self._ack(msg, res)

    def _on_push_sparse(self, msg: Message, ident) -> Message:
        self._need_init()
        self._need_arrays(msg, 2)
        keys, values = msg.arrays
        if keys.dtype != np.int64:
            raise StoreError("sparse keys must be int64")
        done = self._already_applied(msg)
        if done is not None:
            return done
        res = self.store.push_sparse(msg.src, keys, values, **self._tags(msg))
        self._serve_pulls()
        return self._ack(msg, res)

    def _already_applied(self, msg: Message) -> Message | None:
        """A retried push that was applied before: the original ack again, nothing applied."""
        fields = self.store.applied.lookup(msg.src, msg.rid)
        if fields is None:
            return None
        self.duplicates += 1
        return Message("ack", fields)

    def _ack(self, msg: Message, res) -> Message:
        fields = {"version": res.version, "staleness": res.staleness}
        self.store.applied.remember(msg.src, msg.rid, fields)
        return Message("ack", fields)

    def _on_pull(self, msg: Message, ident) -> None:
        lo, hi = msg["range"]
        self.store.local(lo, hi)  # refuse a bad range now, not when the pull is finally served
        self._pull_or_wait(msg, ident)

    def _on_pull_keys(self, msg: Message, ident) -> None:
        self._need_arrays(msg, 1)
        if msg.arrays[0].dtype != np.int64:
            raise StoreError("keys must be int64")
        self.store.local_keys(msg.arrays[0])
        self._pull_or_wait(msg, ident)

    def _on_apply_round(self, msg: Message, ident) -> None:
        # No reply: the coordinator waits for none, and every message costs both ends CPU.
        self.store.apply_round(msg["step"])
        self._serve_pulls()

    def _on_status(self, msg: Message, ident) -> Message:
        st = self.store
        return Message("state", {"state": {
            "rank": self.rank, "range": [st.range.lo, st.range.hi], "version": st.version,
            "initialized": st.initialized, "updates_applied": st.updates_applied,
            "lost_updates": self.lost_updates, "duplicates": self.duplicates,
            "late_pushes": st.late_pushes, "copies_on_write": st.copies_on_write,
            "pending_pulls": len(self.pending_pulls)}})

    def _on_checkpoint(self, msg: Message, ident) -> Message:
        save_shard(self.store, msg["dir"], msg["tag"], self.rank)
        return Message("saved", {"tag": msg["tag"], "version": self.store.version})

    def _on_shutdown(self, msg: Message, ident) -> None:
        self.running = False

    def _on_ok(self, msg: Message, ident) -> None:
        return None

    def _on_error(self, msg: Message, ident) -> None:
        log.warning("coordinator reported: %s", msg["msg"])

    # ---- checks ---------------------------------------------------------------------------------
    def _need_init(self) -> None:
        if not self.store.initialized:
            raise StoreError("shard not initialized: a worker must init before pushing")

    @staticmethod
    def _need_arrays(msg: Message, count: int) -> None:
        if len(msg.arrays) != count:
            raise StoreError(f"op {msg.op!r} needs {count} array frame(s), got {len(msg.arrays)}")
