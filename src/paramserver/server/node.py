"""Shard server process: the sockets, the clock and the files around one ShardCore."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from paramserver.compression import payload
from paramserver.core.endpoints import NO_ANSWER_YET, SAY_WAITING
from paramserver.core.exits import Exit, PeerLost, Refused
from paramserver.core.ratelimit import RefusalLog
from paramserver.net import rpc
from paramserver.observe.flight import FlightRecorder, probe_answer
from paramserver.observe.core.preflight import served_bytes
from paramserver.runlog.checkpoint import CheckpointError, CheckpointWriteError, part_folder
from paramserver.server.checkpoint import part_name, restore_shard, write_shard
from paramserver.server.core import ShardCore
from paramserver.transport.hugepages import no_hugepage_advice
from paramserver.server.replica_link import ReplicaLink
from paramserver.server.replication import LIVE, LOST
from paramserver.server.reshard_link import ReshardLink
from paramserver.server.events import (
    ApplyRound, Checkpoint, ClipFactor, CloseHandoffs, HandoffPiece, Heartbeat, Init, JoinMove, LayoutKnown,
    LoadState, Log, Pull, PullRows, PullState, Push, PushRows, PushSparse, ReleaseHeld, Reply,
    ReshardAbort, ReshardCommit, ReshardStart, Restore, RestoreFrom, SaveShard, SendHandoffs,
    ShardSettings, Shutdown, Status, Stop, Then, TimePassed, ToCoordinator,
)
from paramserver.server.store import StoreError, spare_buffers
from paramserver.spec.welcome import ServerJob, ShardRestore
from paramserver.transport import (
    PortHold, advertised_host, bind_router, connect_dealer, keep_freed_memory, new_context,
    return_freed_memory, security, shm, terminate,
)
from paramserver.transport.comeback import ComeBack
from paramserver.transport.shm_arena import drop_departed
from paramserver.transport.zmq_sockets import router_address
from paramserver.wire import Message, WireError
from paramserver.wire.protocol import CONTROL_MESSAGE_BYTES

log = logging.getLogger(__name__)

# keep_freed_memory keeps freed frames' memory for the next frame, which suits frames up to the
# chunk size (16 MB by default) that come all day; after one above this size the heap's free
# pages go back to the kernel at the next tick, so a rare big frame leaves no peak behind.
TRIM_ABOVE = 64 << 20

WORKER_OPS = ("init", "push", "push_sparse", "pull", "pull_keys", "status", "pull_rows",
              "push_rows", "pull_state", "load_state")
# Of those, the ones that change the shard: with keys, a worker's key only (an evaluator's reads).
WRITE_OPS = ("init", "push", "push_sparse", "push_rows", "load_state")
# Replies that carry the shard's values: on a replicated primary, held until committed.
READ_REPLIES = frozenset(("values", "rows"))
# What a request that parsed may still raise in its handling: refused with an error reply, the
# server goes on. (OverflowError, IndexError: numbers that fit the wire but not an array.)
REFUSED = (StoreError, ValueError, KeyError, TypeError, IndexError, ArithmeticError)


# The settings a shard reads from its ServerJob by the same name, as they are: a new one that
# both declare reaches core and node with no line here. (The rest are mapped below.)
_AS_SENT = frozenset(f.name for f in dataclasses.fields(ShardSettings)) & frozenset(
    f.name for f in dataclasses.fields(ServerJob)) - {"optimizer", "restore"}


def shard_settings(welcome: Message, pull_timeout: float) -> ShardSettings:
    """The one place that reads the job of a welcome: parsed as a ServerJob, mapped to the
    settings of core and node."""
    job = ServerJob.from_dict(welcome["job"])
    lo, hi = job.shard_range
    opt = job.optimizer
    return ShardSettings(
        rank=welcome["rank"], lo=lo, hi=hi, optimizer=opt.name, lr=opt.lr,
        optimizer_options=dict(opt.options), pull_timeout=pull_timeout,
        restore=restore_from(job.restore), **{name: getattr(job, name) for name in _AS_SENT})


def restore_from(r: ShardRestore | None) -> RestoreFrom | None:
    """The checkpoint a welcome's (or a promotion's) ShardRestore names, for the node."""
    return None if r is None else RestoreFrom(r.dir, r.tag, r.version_floor, r.restart,
                                              r.initial)


# ---- op -> event: the whole protocol of a shard, one entry per op ------------------------------
# (Fields are read from msg.fields directly: these run for every push and pull.)
def _arrays(msg: Message, count: int) -> list:
    arrays = msg.arrays
    if len(arrays) != count:
        raise StoreError(f"op {msg.op!r} needs {count} array frame(s), got {len(arrays)}")
    return arrays


def _init(msg: Message, to) -> Init:
    lo, hi = msg.fields["range"]
    return Init(to, lo, hi, _arrays(msg, 1)[0])


def _push(msg: Message, to) -> Push:
    f = msg.fields
    lo, hi = f["range"]
    # Codec values are decoded to float32 here, before the core sees them: the store adds
    # float32 gradients to its float32 master values whatever the wire carried.
    grad = _arrays(msg, 1)[0] if "enc" not in f else payload.unpack(f, msg.arrays, hi - lo)
    return Push(to, msg.src, msg.rid, lo, hi, grad, f["step"], f["batch"],
                f["version"], float(f.get("scale", 1.0)), f.get("round_size", 0),
                f.get("parts", 0), f.get("wm"), f.get("hyper"), f.get("round_id", 0),
                f.get("idle"), f.get("clip"))


def _push_sparse(msg: Message, to) -> PushSparse:
    f = msg.fields
    if "enc" in f:
        if not msg.arrays:
            raise StoreError("push_sparse needs its keys frame")
        keys = msg.arrays[0]
        values = payload.unpack(f, msg.arrays[1:], keys.size)
    else:
        keys, values = _arrays(msg, 2)
    return PushSparse(to, msg.src, msg.rid, keys, values, f["step"], f["batch"], f["version"],
                      float(f.get("scale", 1.0)), f.get("round_size", 0), f.get("parts", 0),
                      f.get("wm"), f.get("round_id", 0))


def _pull(msg: Message, to) -> Pull:
    f = msg.fields
    lo, hi = f["range"]
    pull = Pull(to, time.monotonic(), f.get("min_version", 0), lo, hi, client=to[0])
    if f.get("ref") or "delta" in f:  # compressed pulls: server/deltas.py
        pull.ref, pull.sender, pull.rid = True, msg.src, msg.rid
        d = f.get("delta")
        if d is not None:
            pull.delta = payload.codec_of(d.get("name"), d.get("opts", {}))
    return pull


def _pull_keys(msg: Message, to) -> Pull:
    return Pull(to, time.monotonic(), msg.fields.get("min_version", 0),
                keys=_arrays(msg, 1)[0], client=to[0])


def _pull_rows(msg: Message, to) -> PullRows:
    f = msg.fields
    return PullRows(to, time.monotonic(), f["table"], _arrays(msg, 1)[0],
                    f.get("min_version", 0), client=to[0])


def _range(msg: Message) -> tuple[int, int]:
    lo, hi = msg.fields["range"]
    return int(lo), int(hi)


def _load_state(msg: Message, to) -> LoadState:
    names = msg.fields["names"]
    if not isinstance(names, list):
        raise StoreError("load_state: names must be a list")
    return LoadState(to, *_range(msg), names, _arrays(msg, len(names)))


def _push_rows(msg: Message, to) -> PushRows:
    keys, grads = _arrays(msg, 2)
    f = msg.fields
    return PushRows(to, msg.src, msg.rid, f["table"], keys, grads, f["step"], f["batch"],
                    f["version"], float(f.get("scale", 1.0)), f.get("round_size", 0),
                    f.get("parts", 0), f.get("wm"), f.get("round_id", 0))


EVENTS = {
    "init": _init, "push": _push, "push_sparse": _push_sparse, "pull": _pull,
    "pull_keys": _pull_keys, "pull_rows": _pull_rows, "push_rows": _push_rows,
    "status": lambda msg, to: Status(to),
    "pull_state": lambda msg, to: PullState(to, *_range(msg)),
    "load_state": _load_state,
    "apply_round": lambda msg, to: ApplyRound(to, msg["step"]),
    # the coordinator's factor for a clipped round (server/clip_round.py)
    "clip_factor": lambda msg, to: ClipFactor(to, msg["step"], float(msg["factor"])),
    "checkpoint": lambda msg, to: Checkpoint(to, msg["tag"], msg["dir"]),
    "shutdown": lambda msg, to: Shutdown(to),
    "ok": lambda msg, to: None,  # the coordinator's answer to a heartbeat
}


# ---- live resharding's ops -> events: no request of a worker, none answered --------------------
# `addr` is this server's own address, by which the layouts name it.
def _handoff(msg: Message, addr: str) -> HandoffPiece:
    return HandoffPiece(msg["epoch"], msg.src, msg.op == "handoff_rows", msg.fields,
                        msg.arrays)


# Other servers' pieces (their role checked).
PIECE_EVENTS = {"handoff": _handoff, "handoff_rows": _handoff}
# The coordinator's word on a move.
RESHARD_EVENTS = {
    "reshard": lambda msg, addr: ReshardStart(msg["epoch"], msg["old"], msg["layout"],
                                              msg.get("version", 0), addr),
    "reshard_commit": lambda msg, addr: ReshardCommit(msg["epoch"]),
    "reshard_abort": lambda msg, addr: ReshardAbort(msg["epoch"]),
}


class ShardLoad:
    """The shard's load for `paramserver top`, sent with each heartbeat as a `kind: shard`
    record (docs/metrics.md): seconds the core spent on pushes (adding into the round,
    applying it), updates applied, pulls held waiting for a version, and the most messages one
    read of the sockets found waiting; each since the last beat."""

    PUSHES = (Push, PushSparse, PushRows)

    def __init__(self) -> None:
        self.apply_s = 0.0
        self.backlog = 0
        self.applied = 0  # the store's updates_applied at the last beat

    def beat(self, updates_applied: int, queue: int) -> dict | None:
        """The figures since the last beat, None when the shard was idle."""
        applies = updates_applied - self.applied
        if not (applies or queue or self.apply_s or self.backlog > 1):
            return None
        out = {"apply_s": round(self.apply_s, 6), "applies": applies, "queue": queue,
               "backlog": self.backlog}
        self.apply_s, self.backlog, self.applied = 0.0, 0, updates_applied
        return out


class ServerNode:
    """One shard: a ROUTER for workers, a DEALER to the coordinator, one thread, no blocking.

    Reply tokens are (peer identity, request id); the identity is None for the coordinator."""

    def __init__(self, join: str, host: str = "127.0.0.1", port: int = 0,
                 pull_timeout: float = 60.0, register_timeout: float = 60.0,
                 reuse_memory: bool = True, shared_memory: bool | None = None, keys=None,
                 advertise: str | None = None, backup: bool = False):
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
        self.running = True
        self.core: ShardCore | None = None
        self.backup = backup  # registers as a shard's backup (--replicas 2)
        self.replica: ReplicaLink | None = None  # a replicated shard's link (replica_link.py)
        self.resharding: ReshardLink | None = None  # live resharding (reshard_link.py)
        # SIGTERMs had in an elastic-servers job (the first asks to be drained), and whether
        # that was asked
        self.sigterms = 0
        self.drain_asked = False
        self._rejoin_rid = 0  # of the last re-registration sent to a restarted coordinator
        # ... and of the last registration sent again before the welcome: a re-registration's
        # rid is past it, so a late answer to one of those is never taken for its refusal
        self._register_rid = 0
        self._rejoin_at = -1e9
        self.dropped = 0  # messages to the coordinator dropped on its full queue
        self.big_frame = False  # a frame above TRIM_ABOVE came since the last tidy
        # Refused frames and requests, logged at a bounded rate (a flood costs a few lines).
        self.refusals = RefusalLog(log.warning, time.monotonic)
        # The last protocol events, for the coordinator's stall probe (observe/flight.py).
        self.flight = FlightRecorder()
        self.flight.waiting = self._holding
        self.load = ShardLoad()
        self._probe_bytes = np.zeros(0, np.uint8)  # what preflight probes are answered from

    # ---- setup ----------------------------------------------------------------------------------
    def _register(self, addr: str) -> Message:
        """Register and wait for the welcome. A joiner of a running job (--servers MIN:MAX)
        waits through the fence, and the coordinator may die meanwhile: when the connection
        comes back (a coordinator restarted at its address, or a blip) whatever it had been
        sent is lost, so the registration goes again under a new rid and the wait starts
        over. (Without it the restarted coordinator never heard of the joiner, which gave up
        after register_timeout.)"""
        fields = {"role": "server", "addr": addr}
        if self.backup:
            fields["backup"] = True
        watch = ComeBack(self.coord)
        rpc.send(self.coord, Message("register", fields, src=self.src))
        try:
            poller = zmq.Poller()
            poller.register(self.coord, zmq.POLLIN)
            poller.register(watch.monitor, zmq.POLLIN)
            early = min(SAY_WAITING, self.register_timeout)
            since, said = time.monotonic(), False
            while True:
                now = time.monotonic()
                if not said and now - since >= early:  # a wrong address says so early
                    log.warning(NO_ANSWER_YET, self.join, early, self.register_timeout)
                    said = True
                left = since + self.register_timeout - now
                if left <= 0:
                    raise TimeoutError(f"coordinator at {self.join} did not answer "
                                       f"registration within {self.register_timeout:.0f} s")
                wait = left if said else min(left, since + early - now)
                ready = dict(poller.poll(1000 * wait))
                if watch.monitor in ready and watch.came_back():
                    self._register_rid += 1
                    log.warning("server at %s: the connection to the coordinator at %s came "
                                "back; registering again", addr, self.join)
                    rpc.send(self.coord, Message("register", fields, rid=self._register_rid,
                                                 src=self.src))
                    since = time.monotonic()
                if self.coord in ready:
                    break
        finally:
            watch.close()
        _, msg, _ = rpc.recv(self.coord, routed=False)
        if msg is None or isinstance(msg, WireError) or msg.op != "welcome":
            why = msg.get("msg") if isinstance(msg, Message) else msg
            raise Refused(f"server {self.src}: the coordinator at {self.join} refused its "
                          f"registration: {why}")
        return msg

    def _build_core(self, welcome: Message, ctx: zmq.Context, hold) -> None:
        s = shard_settings(welcome, self.pull_timeout)
        backup = bool(welcome.get("backup", False))
        limit = s.max_message_bytes
        if backup:  # the state sync carries the whole shard, an array per frame
            limit = max(limit, (s.hi - s.lo) * 8 + (1 << 20))
        # Bound only now, when the job has said how large a frame may be: ZeroMQ then refuses a
        # larger one before it is read, rather than this process holding it.
        self.router, self.addr = bind_router(ctx, self.host, self.port, keys=self.keys,
                                             advertise=self.advertise,
                                             max_message=limit, hold=hold)
        self.core = ShardCore(s, alloc=self._shared_values(s.hi - s.lo, s.dtype))
        # Every server can be a replicated shard's: a backup from its welcome, a primary once
        # the coordinator attaches a backup to it.
        self.replica = ReplicaLink(ctx, self.keys, backup, 2 * s.heartbeat_interval
                                   + s.coordinator_timeout, self.core, self._execute,
                                   self._notify, self.addr, feed=self.feed)
        self.resharding = ReshardLink(ctx, self.keys, self.core.resharding, self.router,
                                      lambda: self.src)
        self._route()
        # Idle OpenMP threads spin; on a few shared cores that starves the other processes.
        torch.set_num_threads(s.server_threads)
        if welcome.get("handoff"):  # joining a running job: its keys come from the others
            self.feed(JoinMove(welcome.get("epoch", 0), self.addr))
        elif welcome.get("layout") is not None:  # restarted after keys moved
            self.core.handle(LayoutKnown(welcome.get("epoch", 0), welcome["layout"]))
        if s.restore is not None:
            self._restore(s.restore)

    def _restore(self, r: RestoreFrom, fresh: bool = False) -> None:
        """Start from checkpoint `r`: after a crash, from the previous kept one if it is
        unusable; checkpoint 0 not saved yet means no initial values to lose (start empty).
        `fresh`: a promoted backup's, whatever it held dropped first."""
        s, core = self.settings, self.core
        if r.initial and not part_folder(Path(r.dir), r.tag, part_name(s.rank)).exists():
            log.info("shard %d had no initial values yet: it starts empty", s.rank)
            self._execute([ToCoordinator("restored", {"tag": r.tag, "lost_updates": 0,
                                                      "version": core.store.version})])
            return
        found = restore_shard(r.dir, r.tag, s.rank, core.store, core.tables, s.servers,
                              fallback=r.restart)
        for warning in found.warnings:
            log.warning("shard %d: %s", s.rank, warning)
        self._execute(core.handle(Restore(found.tag, found.arrays, found.meta, r.version_floor,
                                          announce=r.restart, fresh=fresh)))
        log.info("restored shard %d from checkpoint %s (%d updates lost)", s.rank, found.tag,
                 core.lost_updates)

    def _shared_values(self, size: int, dtype: str):
        """An allocator of value buffers in a shared arena, for workers on this host to read
        pull replies from in place (transport.shm); None when not serving loopback only."""
        wanted = shm.enabled() if self.shared_memory is None else self.shared_memory
        if not (wanted and shm.local_address(self.addr)):
            return None
        try:
            # Values plus spares for copy-on-write while workers still read replies in place.
            nbytes = size * np.dtype(dtype).itemsize
            arena = shm.Arena((1 + spare_buffers(nbytes)) * (nbytes + 64))
        except OSError:
            return None
        shm.serve_shared(self.router, arena)
        return lambda: arena.alloc(size, dtype)

    def run(self) -> int:
        if self.reuse_memory:
            keep_freed_memory()  # before the context: its I/O thread allocates the frames
        no_hugepage_advice()  # a growing table's fresh pages then fault without compaction
        ctx = new_context()
        self.router = self.coord = None
        try:
            # The port is held until the welcome says the largest frame to accept (see
            # _build_core).
            hold = PortHold(self.host, self.port)
            addr = router_address(self.host, hold.port, advertise=self.advertise)
            # The coordinator sends headers only (welcomes, commands): nothing large may come.
            # Sends to it never wait: a dead one's queue fills (64 heartbeats) and a blocked
            # send would stop the loop that judges it gone (_check_coordinator).
            self.coord = connect_dealer(ctx, self.join, keys=self.keys, send_timeout=0,
                                        max_message=CONTROL_MESSAGE_BYTES)
            try:
                self._build_core(self._register(addr), ctx, hold)
            except CheckpointError as exc:  # one clear line, not a traceback
                log.error("server %s cannot start from its checkpoint: %s", self.src, exc)
                raise Refused(f"server {self.src}: {exc}") from None
            finally:
                hold.release()
            st = self.core.store
            log.info("server %s serving keys [%d, %d) at %s", self.src, st.range.lo,
                     st.range.hi, addr)
            self._on_sigterm()
            self._loop()
            # Drained because SIGTERM asked it (a preemption notice): PREEMPTED, as an elastic
            # worker's; drained by `paramserver drain`, or the job done: FINISHED.
            return Exit.PREEMPTED if self.drain_asked and self.core.resharding.drained else 0
        finally:
            if self.replica is not None:
                self.replica.close()
            if self.resharding is not None:
                self.resharding.close()
            terminate(ctx, (self.router, self.coord))

    def _on_sigterm(self) -> None:
        """In an elastic-servers job a SIGTERM (a preemption notice) asks the coordinator to
        drain this server, which goes on serving until its `reshard`; a second one ends it.
        Other jobs keep the default (the process ends). Only the main thread takes signals."""
        if self.settings.max_servers <= 0 or threading.current_thread() is not \
                threading.main_thread():
            return

        def term(signum, frame):
            self.sigterms += 1  # (the drain is asked from the loop: the sockets are its own)
            if self.sigterms > 1 or self.core.resharding.drained:
                log.warning("server %s: terminated", self.src)
                raise SystemExit(Exit.PREEMPTED)

        signal.signal(signal.SIGTERM, term)

    def _ask_drain(self) -> None:
        self.drain_asked = True
        log.warning("server %s: SIGTERM, asking the coordinator to drain it", self.src)
        self._to_coordinator(Message("drain", {"rank": self.settings.rank}, src=self.src))

    # ---- main loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        poller, polled = zmq.Poller(), ()
        replica = self.replica
        self.coord_heard = time.monotonic()
        # Seconds spent receiving, handling and answering messages (wall time, the shard's
        # load: its torch threads included), beside the time spent waiting for them.
        busy = 0.0
        clock = time.perf_counter
        tidy_at = 0.0
        while self.running:
            now = time.monotonic()
            core = self.core
            if self.sigterms and not self.drain_asked:
                self._ask_drain()
            if now >= core.next_wakeup():  # a heartbeat due, or a waiting pull's deadline
                self._execute(core.handle(TimePassed(now, busy)))
            if now >= tidy_at:
                tidy_at = now + self.settings.heartbeat_interval
                self._tidy()
            replica.tick(now)
            # Workers' requests wait while the backup's window of forwards is full.
            socks = (self.coord, *(() if replica.full else (self.router,)),
                     *(() if replica.sock is None else (replica.sock,)),
                     *(() if replica.monitor is None else (replica.monitor,)))
            if socks != polled:
                poller, polled = zmq.Poller(), socks
                for sock in socks:
                    poller.register(sock, zmq.POLLIN)
            timeout = max(0.0, min(core.next_wakeup(), replica.next_deadline()) - now)
            for sock, _ in poller.poll(timeout * 1000):
                if sock is self.coord:
                    self.coord_heard = time.monotonic()
                began = clock()
                if sock is replica.sock:
                    replica.from_backup()
                elif sock is replica.monitor:
                    replica.from_monitor()
                elif sock is self.coord or sock is self.router:
                    self._drain(sock)
                # (else a backup's DEALER or monitor that a message handled before it in
                # this batch replaced and closed: an attach, a drop)
                busy += clock() - began
            self._check_coordinator()
            self.refusals.flush()

    def _tidy(self) -> None:
        """Memory nothing else gives back: the arenas of clients that left or died, and the
        heap's free pages after a big frame."""
        gone = drop_departed(self.router)
        if gone:
            log.info("unmapped the shared memory of %d client(s) that left", gone)
        if self.big_frame:
            self.big_frame = False
            return_freed_memory()

    def _check_coordinator(self) -> None:
        """The coordinator answers every heartbeat: long silence means it is gone, and a
        server without it would serve a job that no longer exists forever."""
        silent = time.monotonic() - self.coord_heard
        if silent > self.settings.coordinator_timeout:
            log.error("the coordinator at %s has been silent for %.1f s; exiting", self.join,
                      silent)
            raise PeerLost(f"server {self.src}: the coordinator at {self.join} has been "
                             f"silent for {silent:.0f} s; exiting")

    def _drain(self, sock) -> None:
        routed = sock is self.router
        # Bounded batch per wake-up so that the coordinator's commands are never starved.
        for n in range(256):
            try:
                ident, msg, frames = rpc.recv_nowait(sock, routed)
            except zmq.Again:
                return
            if n >= self.load.backlog:
                self.load.backlog = n + 1
            for f in frames:
                if len(f) > TRIM_ABOVE:
                    self.big_frame = True
            if isinstance(msg, WireError):
                rpc.refuse(sock, ident, msg, self.src, frames, self.refusals)
                continue
            self._safely(sock, ident, msg, routed, frames)
            if not rpc.queued(sock) or (routed and self.replica.full):
                return

    def _safely(self, sock, ident, msg: Message, routed: bool, frames) -> None:
        """Dispatch `msg`; a request refused is answered with an error, the server goes on."""
        try:
            self._dispatch(ident, msg, routed, frames)
        except REFUSED as exc:
            # As the coordinator does: a refused role or op is seen in the log.
            sender = f"{msg.src!r} ({rpc.peer_name(ident)})"
            self.refusals.refused(sender, f"refused {msg.op} from {sender}: {exc}")
            rpc.send_or_drop(sock, Message("error", {"msg": str(exc), "code": "refused"},
                                           rid=msg.rid, src=self.src), ident)

    @property
    def settings(self) -> ShardSettings:
        """The shard's settings: its core's (a reshard renumbers it, a re-attached backup
        mirrors another shard)."""
        return self.core.settings

    @property
    def src(self) -> str:
        """The name this server sends under: its shard's (b<rank> while a backup, which a
        promotion ends; a reshard renumbers it), "server" until its welcome."""
        replica = self.replica
        if replica is None:
            return "server"
        return f"{'b' if replica.backup else 's'}{self.core.settings.rank}"

    def _route(self) -> None:
        """Who takes each op that is not a request for the core: the replica link the ops it
        declares, the node its own (a worker's link probe; the coordinator's welcome, error
        and stall probe) and live resharding's, parsed into events for the core. Every other
        op is a request, parsed into an event for the core."""
        def piece(ident, msg, frames):
            self.feed(PIECE_EVENTS[msg.op](msg, self.addr))

        def word(msg):
            self.feed(RESHARD_EVENTS[msg.op](msg, self.addr))
        peer = {"probe": (None, self._probe), **dict.fromkeys(PIECE_EVENTS, ("server", piece))}
        coordinator = {"welcome": self._from_coordinator, "error": self._from_coordinator,
                       "stall_probe": self._stall_probe, **dict.fromkeys(RESHARD_EVENTS, word)}
        link_peer, link_coordinator = self.replica.routes(self.router, EVENTS)
        if peer.keys() & link_peer.keys() or coordinator.keys() & link_coordinator.keys():
            raise TypeError("two parts of a server take the same op")
        peer.update(link_peer)
        coordinator.update(link_coordinator)
        promote = coordinator["promote"]

        def promoted(msg):  # a backup not synced yet starts from the checkpoint named
            promote(msg)
            if msg.get("restore") is not None and msg["rank"] == self.settings.rank:
                self._restore(restore_from(ShardRestore.from_dict(msg["restore"])), fresh=True)
        coordinator["promote"] = promoted
        self._peer_ops, self._coordinator_ops = peer, coordinator

    def _dispatch(self, ident, msg: Message, from_worker: bool, frames=()) -> None:
        """The message to the part that takes it (refused here when the peer may not send
        it): a link's op to the link, a request as an event for the core, and the core's
        instructions carried out. A request that changes a replicated shard goes to its
        backup first, and its replies wait for the backup's acknowledgement."""
        if from_worker:
            route = self._peer_ops.get(msg.op)
            if route is not None:
                role, take = route
                if role is not None:
                    security.check_role(ident, role, self.secured)
                take(ident, msg, frames)
                return
            if self.replica.backup:
                raise ValueError(f"this server is shard {self.settings.rank}'s backup: it "
                                 f"serves workers once promoted")
            if msg.op not in WORKER_OPS:
                raise ValueError(f"op {msg.op!r} is not served by a parameter server")
            if msg.op in WRITE_OPS:
                security.check_role(ident, "worker", self.secured)
            if self.resharding.hold(ident, msg, frames):  # moving keys: handled after
                return
        else:
            take = self._coordinator_ops.get(msg.op)
            if take is not None:
                take(msg)
                return
        replica = self.replica
        self.flight.record("recv", op=msg.op, src=msg.src, rid=msg.rid)
        as_event = EVENTS.get(msg.op)
        if as_event is None:
            raise ValueError(f"op {msg.op!r} is not served by a parameter server")
        to = (ident, msg.rid)
        event = as_event(msg, to)
        if event is None:
            return
        # A replicated shard's write goes to the backup first (its replies are held below).
        seq = replica.forward(msg, frames[0] if frames else None) \
            if replica.forwards(msg.op) else None
        if type(event) in ShardLoad.PUSHES:
            began = time.perf_counter()
            out = self.core.handle(event)
            self.load.apply_s += time.perf_counter() - began
        else:
            out = self.core.handle(event)
        # A replicated shard's init, before training: acknowledged once a backup holds it.
        init = msg.op == "init" and replica.holds_init()
        if seq is None and not init:
            self._execute(out)
            return
        held, rest = replica.hold_out(to, out)
        self._execute(rest)
        self._execute(replica.hold(seq, held, init))

    def _stall_probe(self, msg: Message) -> None:
        self._to_coordinator(Message("stall_answer", probe_answer(msg["n"], "server",
                                                                  self.flight), src=self.src))

    def _probe(self, ident, msg: Message, frames=()) -> None:
        """A worker's link probe: as many zero bytes as it asked for, within bounds."""
        n = served_bytes(msg["bytes"], self.settings.max_message_bytes)
        if self._probe_bytes.size < n:
            self._probe_bytes = np.zeros(n, np.uint8)
        arrays = [self._probe_bytes[:n]] if n else []
        rpc.send(self.router, Message("probe", {"bytes": n}, arrays, rid=msg.rid, src=self.src),
                 ident)

    def _from_coordinator(self, msg: Message) -> None:
        """A restarted coordinator does not know this server (`unknown`): register again with
        the shard's rank, range and version (with replicas: a primary the backup it forwards
        to, a backup the attach it mirrors; resharding: a move under way, a drain its SIGTERM
        asked for and not done), and go on serving meanwhile. A refusal of that
        ends the server: the job it serves is not the coordinator's (or, for a backup, it is
        not taken back; the launcher starts a new one)."""
        if msg.op == "welcome":
            if msg["rank"] != self.settings.rank:
                raise Refused(f"server {self.src}: the restarted coordinator gave rank "
                                 f"{msg['rank']}, this server holds shard {self.settings.rank}")
            log.info("server %s taken back by the restarted coordinator", self.src)
            return
        if msg.rid and msg.rid == self._rejoin_rid:
            raise Refused(f"server {self.src}: the restarted coordinator at {self.join} "
                             f"refused to take it back: {msg['msg']}")
        if msg.get("code") != "unknown":
            log.warning("coordinator reported: %s", msg["msg"])
            return
        now = time.monotonic()
        if now - self._rejoin_at < self.settings.heartbeat_interval:
            return  # one re-registration in flight per beat
        self._rejoin_at = now
        self._rejoin_rid = max(self._rejoin_rid, self._register_rid) + 1
        st = self.core.store
        fields = {"role": "server", "addr": self.addr}
        rejoin = fields["rejoin"] = {"rank": self.settings.rank, "lo": st.range.lo,
                                     "hi": st.range.hi, "version": st.version}
        moves = self.core.resharding
        if moves.moving:  # a move its coordinator never committed: the new one gives it up
            rejoin["moving"] = moves.epoch
        if self.drain_asked and not moves.drained:  # its SIGTERM's drain, not done yet
            rejoin["draining"] = True
        replica = self.replica
        if replica.backup:  # the attach it took the sync of (coordinator/replicas.py)
            fields["backup"] = True
            rejoin.update(epoch=replica.epoch, synced=replica.primary is not None)
        else:
            fw = replica.forwarder
            if fw.active:  # the backup it forwards to: taken back only if that one agrees
                rejoin.update(backup_addr=fw.addr, backup_epoch=fw.epoch,
                              backup_synced=fw.state == LIVE, backup_lost=fw.state == LOST)
            if replica.map_epoch:
                rejoin["map_epoch"] = replica.map_epoch
        self._to_coordinator(Message("register", fields, rid=self._rejoin_rid, src=self.src))

    # ---- instructions ---------------------------------------------------------------------------
    def _execute(self, instructions) -> None:
        replica = self.replica
        for ins in instructions:
            kind = type(ins)
            if kind is Reply:  # (inline: one per push and pull)
                if ins.op in READ_REPLIES and not ins.committed and replica.hold_read(ins):
                    continue
                ident, rid = ins.to
                self.flight.record("send", op=ins.op, rid=rid)
                msg = Message(ins.op, ins.fields, ins.arrays, rid=rid, src=self.src)
                if ident is None:
                    self._to_coordinator(msg)
                elif ins.lend:  # from the live values: the store copies on write until it is out
                    tracker = rpc.send(self.router, msg, ident, track=True)
                    if tracker is not None:
                        self.core.lend(tracker)
                else:
                    rpc.send(self.router, msg, ident)
            elif kind is Then:
                self._execute(self.core.handle(ins.event))
            elif kind is Heartbeat:
                fields = {} if ins.counters is None else {"counters": ins.counters}
                shard = self.load.beat(self.core.store.updates_applied, len(self.core.pulls))
                if shard is not None:
                    fields["shard"] = shard
                self._to_coordinator(Message("heartbeat", fields, src=self.src))
            elif kind is SaveShard:
                self._save(ins)
            elif kind is ToCoordinator:
                self._to_coordinator(Message(ins.op, ins.fields, src=self.src))
            elif kind is Stop:
                self.running = False
            elif kind is Log:
                getattr(log, ins.level)("%s", ins.text)
            elif kind is SendHandoffs:
                self.resharding.send(ins.addr, ins.messages)
            elif kind is CloseHandoffs:
                self.resharding.close()
            elif kind is ReleaseHeld:
                for ident, msg, frames in self.resharding.release():  # in order, as they came
                    self._safely(self.router, ident, msg, True, frames)
            else:
                raise TypeError(f"no way to carry out {ins!r}")

    def _save(self, ins: SaveShard) -> None:
        done = ins.done
        try:
            write_shard(ins.dir, ins.tag, self.settings.rank, ins.arrays, ins.meta)
        except CheckpointWriteError as exc:
            log.error("%s; training goes on", exc)
            if done is None:
                return
            done = Reply(done.to, done.op, {**done.fields, "failed": str(exc)[:1000]})
        if done is not None:
            self._execute([done])

    def _notify(self, op: str, fields: dict) -> None:
        self._to_coordinator(Message(op, fields, src=self.src))

    def feed(self, event) -> None:
        """An event that is no worker's request for the core (live resharding's, a backup's
        LoadSync), its instructions carried out (the node's settings and name are its core's,
        so they follow a reshard or a re-attached backup's new shard)."""
        core, was = self.core, self.core.settings
        out = core.handle(event)
        s = core.settings
        if (s.rank, s.lo, s.hi) != (was.rank, was.lo, was.hi) and self.replica.backup:
            log.info("backup now mirrors shard %d, keys [%d, %d)", s.rank, s.lo, s.hi)
        self._execute(out)

    def _holding(self) -> dict | None:
        """What this shard holds back, for a stall probe: a server never blocks, but pulls
        wait here for a version the pushes have not reached."""
        core = self.core
        if core is None:
            return {"op": "welcome", "peer": "coordinator"}
        held = len(self.resharding.queued) if self.resharding is not None else 0
        moving = core.resharding.waiting(held)
        if moving is not None:
            return moving
        return {"op": "serve", "note": f"version {core.store.version}, {len(core.pulls)} "
                                       f"pull(s) waiting for a newer one"}

    def _to_coordinator(self, msg: Message) -> None:
        """Send to the coordinator, or drop when its queue is full: it is gone or hopelessly
        behind, and _check_coordinator ends the server once it has been silent too long."""
        if not rpc.send_or_drop(self.coord, msg):
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, ...: the log stays short
                log.warning("the coordinator's queue is full: dropped %s (%d dropped so far)",
                            msg.op, self.dropped)
