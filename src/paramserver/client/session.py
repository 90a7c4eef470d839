"""A worker's line to the coordinator: its DEALER, the calls of the step protocol (register,
start, clock, status, report, bye), the heartbeat thread, and judging the coordinator alive.

A coordinator restarted at the same address (`train --restart-coordinator`) does not know this
worker: it answers `unknown`. The session then registers again with its identity (rank, the
step of the release it holds, whether its clock of it is unanswered, its rank's samples) and
sends the request it waits on again; the heartbeat thread does the same when its beats come
back `unknown`, so a worker waiting for a release is taken back within a beat or two."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq

from paramserver.core.endpoints import NO_ANSWER_YET, SAY_WAITING
from paramserver.core.ratelimit import RefusalLog
from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.observe.flight import FlightRecorder, probe_answer
from paramserver.transport import connect_dealer, security
from paramserver.spec.welcome import WorkerJob
from paramserver.wire import Message, WireError

log = logging.getLogger(__name__)

# The longest a call waits without asking whether its peers are still there.
PEER_CHECK = 0.25
# A first registration unanswered this long is sent again: a coordinator that died with it
# never answers, and its replacement knows nothing of it (a repeat is answered as the first).
REGISTER_AGAIN = 2.0
# While start() waits for the start barrier, how often it asks the coordinator whom for (and
# says so): a job that never starts tells its user which peers it misses.
STATUS_EVERY = 5.0


@dataclass
class Identity:
    """What this member tells a restarted coordinator about itself (see takeback.py)."""

    role: str = "worker"
    rank: int | None = None
    num_keys: int | None = None
    step: int = -1  # the step of the release held; -1: none yet
    clocked: bool = False  # its clock is sent and unanswered
    samples: int = 0  # the rank's samples, counted when their clock is answered
    pending_batch: int = 0

    def rejoin(self) -> dict:
        return {"rank": self.rank, "step": self.step, "clocked": self.clocked,
                "samples": self.samples}


class CoordinatorSession:
    """Calls to the coordinator at `join`, each answered by its own request id, and the
    heartbeats whose answers tell the coordinator is alive."""

    def __init__(self, ctx: zmq.Context, join: str, src: str, keys: security.Keys | None,
                 next_rid: Callable[[], int], timeout: float, release_timeout: float):
        self.ctx, self.join, self.src, self.keys = ctx, join, src, keys
        self.next_rid = next_rid
        self.timeout, self.release_timeout = timeout, release_timeout
        # A call's send waits at most `timeout` for room in the coordinator's queue.
        self.sock = connect_dealer(ctx, join, keys=keys, send_timeout=timeout)
        self.heard = time.monotonic()  # the coordinator's last answer to a heartbeat
        self.coordinator_timeout = 60.0
        self._stop_beat = threading.Event()
        self._beat: threading.Thread | None = None
        self.me = Identity()
        self._rejoin_lock = threading.Lock()
        self.rejoined_at = 0.0  # monotonic time of the last re-registration
        # Said bye (or left with its last clock): a restarted coordinator would take it back
        # as a live member, its rank in the policy again with no step to come (a round
        # waits for it), so it never re-registers, and its beats end.
        self.gone = False
        self.rejoins = 0
        # The shard servers' liveness (client/links.ShardLinks), judged during calls as well.
        self.servers = None
        # Bad frames from the coordinator are dropped (the call waits on, bounded by its
        # timeout) and logged at a bounded rate.
        self.refusals = RefusalLog(log.warning, time.monotonic)
        self.barrier_wait: str | None = None  # whom the start barrier waited for, last asked
        # Replicated shards: (epoch, {rank: address}) of the shards whose backup took over, as
        # the latest heartbeat answer said (one assignment: read by the requests' thread).
        self.moved: tuple[int, dict] | None = None
        # ... and by address: a dead primary's -> its successor's (one assignment of a new
        # dict); it holds across reshards that renumber the shards.
        self.replaced: dict[str, str] = {}
        # Live resharding: (epoch, layout as the wire says it) of the newest shard map a
        # heartbeat answer named (one assignment, read by the requests' thread, which checks
        # it: client/core/reshard.py).
        self.layout: tuple[int, list] | None = None
        # The member's protocol events and what it waits for: the heartbeat thread answers
        # the coordinator's stall probe with them (observe/flight.py).
        self.flight = FlightRecorder()

    # ---- liveness -------------------------------------------------------------------------------
    def start_heartbeat(self, interval: float, coordinator_timeout: float) -> None:
        """Beat every `interval` s; a wait for the coordinator then ends once it has answered
        none for `coordinator_timeout` s."""
        self.coordinator_timeout = coordinator_timeout
        self._beat = threading.Thread(target=self._heartbeat, args=(interval,), daemon=True)
        self._beat.start()

    def _heartbeat(self, interval: float) -> None:
        # A beat never waits: a dead coordinator's queue fills, and a thread blocked in a send
        # would outlive the session (and keep the context from closing).
        sock = connect_dealer(self.ctx, self.join, keys=self.keys, send_timeout=0)
        try:
            while not self._stop_beat.wait(interval):
                sent = time.monotonic()
                rpc.send_or_drop(sock, Message("heartbeat", src=self.src))
                unknown = False
                while sock.poll(0):  # the answers to earlier beats: the coordinator is alive
                    _, reply, _ = rpc.recv(sock, routed=False)
                    self.heard = time.monotonic()
                    unknown = unknown or _unknown(reply)
                    if isinstance(reply, Message) and reply.op == "ok" and "epoch" in reply.fields:
                        self._moved(reply)
                    if isinstance(reply, Message) and reply.op == "stall_probe":
                        self._answer_probe(sock, reply["n"])
                if unknown:
                    self.rejoin(sock, sent - interval)
        finally:
            sock.close(0)

    def _moved(self, reply: Message) -> None:
        epoch = reply["epoch"]
        try:
            replaced = {str(o): str(n) for o, n in reply.get("replaced", [])}
        except (TypeError, ValueError):
            replaced = {}  # malformed: the next beat's answer says it again
        if replaced and any(self.replaced.get(o) != n for o, n in replaced.items()):
            self.replaced = {**self.replaced, **replaced}
        layout = reply.get("layout")
        if layout is not None and (self.layout is None or epoch > self.layout[0]):
            self.layout = (epoch, layout)
        if self.moved is None or epoch > self.moved[0]:
            try:
                where = {int(r): str(a) for r, a in reply.get("shards", [])}
            except (TypeError, ValueError):
                return  # malformed: the next beat's answer says it again
            self.moved = (epoch, where)

    def _answer_probe(self, sock, n: int) -> None:
        """The coordinator saw the job stall: say where this process is (from this thread,
        which the main thread's wait does not block)."""
        fields = probe_answer(n, self.me.role, self.flight)
        waiting = fields.get("waiting")
        if waiting is not None and waiting.get("step") is None and self.me.step >= 0:
            waiting["step"] = self.me.step  # the step of the release held
        rpc.send_or_drop(sock, Message("stall_answer", fields, src=self.src))

    def check_alive(self, waiting_since: float) -> None:
        """A coordinator that died must not leave its workers waiting for their release
        (release_timeout, minutes) with nothing to wait for."""
        if self._beat is not None:  # without heartbeats, nothing to judge it by
            silent = time.monotonic() - max(self.heard, waiting_since)
            limit = self.coordinator_timeout
            if silent > limit:
                raise TimeoutError(f"the coordinator at {self.join} has been silent for "
                                   f"{silent:.0f} s (coordinator_timeout {limit:g} s)")
        if self.servers is not None:  # (second: servers leave once their coordinator is gone)
            self.servers.check()

    # ---- a restarted coordinator ---------------------------------------------------------------
    def rejoin(self, sock, asked_at: float) -> bool:
        """Register again, with this member's identity, over `sock` (the caller's thread owns
        it), unless that was done since `asked_at`; True once re-registered."""
        me = self.me
        if me.rank is None:
            return False  # never welcomed: nothing to come back as
        with self._rejoin_lock:
            if self.gone:
                return False
            if self.rejoined_at > asked_at:
                return True
            fields = {"role": me.role, "rejoin": me.rejoin()}
            if me.num_keys:
                fields["num_keys"] = int(me.num_keys)
            msg = Message("register", fields, rid=self.next_rid(), src=self.src)
            if not rpc.send_or_drop(sock, msg):
                return False  # its queue is full: the next beat or poll tries again
            # Bounded by the coordinator's own limit: a beat must not wait longer than that.
            deadline = time.monotonic() + min(self.timeout, self.coordinator_timeout)
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(min(left, PEER_CHECK) * 1000):
                    continue
                _, reply, _ = rpc.recv(sock, routed=False)
                if reply is None or isinstance(reply, WireError) or reply.rid != msg.rid:
                    continue
                if reply.op != "welcome" or reply["rank"] != me.rank:
                    raise RemoteError(f"the restarted coordinator at {self.join} did not take "
                                      f"back {me.role} rank {me.rank}: "
                                      f"{reply.get('msg', reply.op)}")
                self.rejoined_at, self.heard = time.monotonic(), time.monotonic()
                self.rejoins += 1
                return True
            return False  # not answered: the next beat or poll tries again

    # ---- calls ----------------------------------------------------------------------------------
    def call(self, msg: Message, timeout: float, while_waiting=None) -> Message:
        """Send `msg` and wait for the answer to it (an error answer raises RemoteError). If
        the coordinator was restarted meanwhile, `msg` goes again to the new one."""
        msg.rid, msg.src = self.next_rid(), self.src
        flight = self.flight
        if msg.op == "status":  # asked often (an evaluator's loop): kept off the recorder
            return self._call(msg, timeout, while_waiting)
        flight.record("send", op=msg.op, rid=msg.rid, step=msg.fields.get("step"))
        before, since = flight.waiting, time.monotonic()
        if msg.op == "clock":  # the release into the next step
            want, step = "release", msg.fields["step"] + 1
        else:
            want, step = ("release" if msg.op == "start" else f"{msg.op} answer"), self.me.step
        flight.waiting = lambda: {"op": want, "step": step, "peer": "coordinator",
                                  "for_s": round(time.monotonic() - since, 3)}
        try:
            reply = self._call(msg, timeout, while_waiting)
        finally:
            flight.waiting = before
        flight.record("recv", op=reply.op, rid=reply.rid, step=reply.fields.get("step"))
        return reply

    def _call(self, msg: Message, timeout: float, while_waiting) -> Message:
        if not rpc.send_or_drop(self.sock, msg):
            raise TimeoutError(f"coordinator at {self.join} accepted no {msg.op!r} for "
                               f"{self.timeout:.0f} s (its queue is full)")
        if while_waiting is not None:
            while_waiting()
        since = sent = time.monotonic()
        deadline = since + timeout
        asked, status_rid = since, None  # a start's questions: whom does the barrier wait for
        said = msg.op != "register"  # a join with no answer says so once, early
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                waited = (f"; the start barrier was waiting: {self.barrier_wait}"
                          if msg.op == "start" and self.barrier_wait else "")
                raise TimeoutError(f"coordinator at {self.join} did not answer {msg.op!r} "
                                   f"within {timeout:.0f} s{waited}")
            if msg.op == "start" and time.monotonic() - asked >= STATUS_EVERY:
                asked, status_rid = time.monotonic(), self.next_rid()
                rpc.send_or_drop(self.sock, Message("status", rid=status_rid, src=self.src))
            if not self.sock.poll(min(left, PEER_CHECK) * 1000):
                if msg.op == "register":
                    if not said and time.monotonic() - since >= SAY_WAITING:
                        said = True
                        log.warning(NO_ANSWER_YET, self.join, time.monotonic() - since,
                                    timeout)
                    if time.monotonic() - sent > REGISTER_AGAIN:
                        sent = self._send_again(msg)
                    continue
                if self.rejoined_at > sent:
                    sent = self._send_again(msg)  # its answer died with the old coordinator
                    continue
                self.check_alive(since)
                continue
            _, reply, _ = rpc.recv(self.sock, routed=False)
            if reply is None:
                continue
            if isinstance(reply, WireError):
                name = f"the coordinator at {self.join}"
                self.refusals.refused(name, f"dropped a bad frame from {name}: {reply}")
                continue
            if status_rid is not None and reply.rid == status_rid and reply.op == "state":
                self._barrier_status(reply["state"], time.monotonic() - since)
                continue
            if reply.rid != msg.rid:
                continue  # a late answer to an earlier, timed-out request
            if reply.op == "error":
                if _unknown(reply) and msg.op != "register" and self.rejoin(self.sock, sent):
                    sent = self._send_again(msg)
                    continue
                raise RemoteError(f"coordinator refused {msg.op!r}: {reply['msg']}")
            return reply

    def _barrier_status(self, state, waited: float) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("waiting_for"), str):
            return  # open already (its release is on the way), or an older coordinator
        self.barrier_wait = state["waiting_for"]
        log.warning("start(): waited %.0f s for the start barrier at %s: %s", waited, self.join,
                    self.barrier_wait)

    def _send_again(self, msg: Message) -> float:
        msg.rid = self.next_rid()
        rpc.send_or_drop(self.sock, msg)  # dropped: the wait goes on, bounded, as for the first
        return time.monotonic()

    def register(self, role: str, num_keys: int | None, want_rank: int | None = None,
                 layout: dict | None = None, optimizer: dict | None = None) -> Message:
        """Join the job as `role` (a worker: as rank `want_rank` if that is free, with its
        model's `layout` in core.layout's wire form, which must be the job's, and the script's
        torch `optimizer` as an OptimizerSpec's wire form, if it passed one); the welcome
        carries the rank and the job."""
        fields = {"role": role} if not num_keys else {"role": role, "num_keys": int(num_keys)}
        if want_rank is not None and role == "worker":
            fields["want_rank"] = int(want_rank)
        if layout is not None and role == "worker":
            fields["layout"] = layout
        if optimizer is not None and role == "worker":
            fields["optimizer"] = optimizer
        welcome = self.call(Message("register", fields), self.timeout)
        job = WorkerJob.from_dict(welcome["job"])
        self.me = Identity(role, welcome["rank"], num_keys or job.job.num_keys or None,
                           samples=job.resume_samples)
        return welcome

    def start(self, data_len: int | None = None) -> Message:
        """Ready: the answer is the release of step 0 (or "ok" for an observer). `data_len`:
        an elastic job's worker tells its training set's size (the coordinator's ledger)."""
        fields = {} if data_len is None else {"data_len": int(data_len)}
        reply = self.call(Message("start", fields), self.release_timeout)
        if reply.op == "release":
            with self._rejoin_lock:
                self.me.step = reply["step"]
        return reply

    def clock(self, fields: dict, while_waiting=None) -> Message:
        """A step done: the answer is the next release."""
        me = self.me
        with self._rejoin_lock:  # the heartbeat thread may be telling who we are
            me.clocked, me.pending_batch = True, fields["batch"]
        reply = self.call(Message("clock", fields), self.release_timeout, while_waiting)
        with self._rejoin_lock:
            me.step, me.clocked = reply["step"], False
            me.samples += me.pending_batch
        return reply

    def status(self) -> dict:
        return self.call(Message("status"), self.timeout)["state"]

    def report(self, record: dict) -> None:
        self.call(Message("report", {"record": record}), self.timeout)

    @contextlib.contextmanager
    def paused(self, reason: str = "evaluation"):
        """A legitimate pause in this worker's steps (its own evaluation, say): announced to
        the coordinator, whose stall detector then flags no hang or missing worker for it."""
        self.report({"kind": "pause", "reason": str(reason)[:64]})
        try:
            yield
        finally:
            self.report({"kind": "resume", "reason": str(reason)[:64]})

    def collective(self, kind: str, name: str, values: list, root: int = 0,
                   timeout: float = 600.0) -> tuple[list, int]:
        """This worker's part of collective `name` among the training workers (allreduce,
        allgather, broadcast: coordinator/collectives.py); (the result, how many took part)
        once every one has sent its part. The coordinator answers an error past its own
        bound (a rank that never calls it), before `timeout`."""
        answer = self.call(Message("collective", {"kind": kind, "name": name,
                                                  "values": values, "root": int(root)}),
                           timeout)
        return answer["values"], int(answer.get("count", 0))

    def leave(self, fields: dict, reason: str) -> None:
        """The last step done, and gone: the clock of step `fields["step"]` (counted as any)
        that also says this worker leaves (`reason`: preempted); answered "ok", no release."""
        me = self.me
        with self._rejoin_lock:
            me.clocked, me.pending_batch = True, fields["batch"]
        self.call(Message("clock", {**fields, "leave": reason}), self.timeout)
        with self._rejoin_lock:
            me.clocked = False
            me.samples += me.pending_batch
        self._left()

    def bye(self, reason: str) -> None:
        self.call(Message("bye", {"reason": reason}), self.timeout)
        self._left()

    def _left(self) -> None:
        with self._rejoin_lock:
            self.gone = True
        self._stop_beat.set()

    def close(self) -> None:
        self._stop_beat.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        self.sock.close(0)


def _unknown(reply) -> bool:
    """A coordinator's answer saying it does not know the sender: it was restarted."""
    return (isinstance(reply, Message) and reply.op == "error"
            and reply.get("code") == "unknown")
