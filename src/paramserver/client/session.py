"""A worker's line to the coordinator: its DEALER, the calls of the step protocol (register,
start, clock, status, report, bye), the heartbeat thread, and judging the coordinator alive."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from paramserver.core.ratelimit import RefusalLog
from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.transport import connect_dealer, security
from paramserver.wire import Message, WireError

log = logging.getLogger(__name__)

# The longest a call waits without asking whether its peers are still there.
PEER_CHECK = 0.25


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
        # The shard servers' liveness (client/links.ShardLinks), judged during calls as well.
        self.servers = None
        # Bad frames from the coordinator are dropped (the call waits on, bounded by its
        # timeout) and logged at a bounded rate.
        self.refusals = RefusalLog(log.warning, time.monotonic)

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
                rpc.send_or_drop(sock, Message("heartbeat", src=self.src))
                while sock.poll(0):  # the answers to earlier beats: the coordinator is alive
                    rpc.recv(sock, routed=False)
                    self.heard = time.monotonic()
        finally:
            sock.close(0)

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

    # ---- calls ----------------------------------------------------------------------------------
    def call(self, msg: Message, timeout: float, while_waiting=None) -> Message:
        """Send `msg` and wait for the answer to it (an error answer raises RemoteError)."""
        msg.rid, msg.src = self.next_rid(), self.src
        if not rpc.send_or_drop(self.sock, msg):
            raise TimeoutError(f"coordinator at {self.join} accepted no {msg.op!r} for "
                               f"{self.timeout:.0f} s (its queue is full)")
        if while_waiting is not None:
            while_waiting()
        since = time.monotonic()
        deadline = since + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"coordinator at {self.join} did not answer {msg.op!r} "
                                   f"within {timeout:.0f} s")
            if not self.sock.poll(min(left, PEER_CHECK) * 1000):
                self.check_alive(since)
                continue
            _, reply, _ = rpc.recv(self.sock, routed=False)
            if reply is None:
                continue
            if isinstance(reply, WireError):
                name = f"the coordinator at {self.join}"
                self.refusals.refused(name, f"dropped a bad frame from {name}: {reply}")
                continue
            if reply.rid != msg.rid:
                continue  # a late answer to an earlier, timed-out request
            if reply.op == "error":
                raise RemoteError(f"coordinator refused {msg.op!r}: {reply['msg']}")
            return reply

    def register(self, role: str, num_keys: int | None) -> Message:
        """Join the job as `role`; the welcome carries the rank and the job."""
        fields = {"role": role} if not num_keys else {"role": role, "num_keys": int(num_keys)}
        return self.call(Message("register", fields), self.timeout)

    def start(self) -> Message:
        """Ready: the answer is the release of step 0 (or "ok" for an observer)."""
        return self.call(Message("start"), self.release_timeout)

    def clock(self, fields: dict, while_waiting=None) -> Message:
        """A step done: the answer is the next release."""
        return self.call(Message("clock", fields), self.release_timeout, while_waiting)

    def status(self) -> dict:
        return self.call(Message("status"), self.timeout)["state"]

    def report(self, record: dict) -> None:
        self.call(Message("report", {"record": record}), self.timeout)

    def bye(self, reason: str) -> None:
        self.call(Message("bye", {"reason": reason}), self.timeout)

    def close(self) -> None:
        self._stop_beat.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        self.sock.close(0)
