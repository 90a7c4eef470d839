"""A worker's side of the step protocol: calls to the coordinator, releases, heartbeats."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.transport import connect_dealer
from paramserver.wire import Message, WireError


@dataclass(frozen=True)
class Release:
    """Permission to run one step: which step, with how many samples, and which version to pull."""

    step: int
    batch_size: int
    min_version: int
    stop: bool = False
    scale: float = 1.0  # weight the policy gives this step's update (pass it to push)
    # Workers in this round (round mode), 0 if not known: pass it to a push that carries the
    # whole step, so servers apply the round on its last push without waiting to be told.
    round_size: int = 0


class StepProtocolMixin:
    """Part of KVWorker: shares its state (coordinator socket, context, address, keys, timeouts)."""

    def _start_heartbeat(self) -> threading.Thread:
        beat = threading.Thread(target=self._heartbeat, daemon=True,
                                args=(float(self.job.get("heartbeat_interval", 1.0)),))
        beat.start()
        return beat

    def _heartbeat(self, interval: float) -> None:
        sock = connect_dealer(self.ctx, self.join, keys=self.keys)
        try:
            while not self._stop_beat.wait(interval):
                rpc.send(sock, Message("heartbeat", src=self.src))
                while sock.poll(0):  # the answers to earlier beats: the coordinator is alive
                    rpc.recv(sock, routed=False)
                    self.coord_heard = time.monotonic()
        finally:
            sock.close(0)

    def _check_coordinator(self, waiting_since: float) -> None:
        """A wait for the coordinator ends once it has not answered a heartbeat for the job's
        coordinator_timeout: a coordinator that died must not leave its workers waiting for
        their release (release_timeout, minutes) with nothing to wait for."""
        if getattr(self, "_beat", None) is None:
            return  # no heartbeats, nothing to judge by
        silent = time.monotonic() - max(self.coord_heard, waiting_since)
        limit = float(self.job.get("coordinator_timeout", 60.0))
        if silent > limit:
            raise TimeoutError(f"the coordinator at {self.join} has been silent for "
                               f"{silent:.0f} s (coordinator_timeout {limit:g} s)")

    def _call_coord(self, msg: Message, timeout: float, while_waiting=None) -> Message:
        msg.rid, msg.src = self._next_rid(), self.src
        rpc.send(self.coord, msg)
        if while_waiting is not None:
            while_waiting()
        since = time.monotonic()
        deadline = since + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"coordinator at {self.join} did not answer {msg.op!r} "
                                   f"within {timeout:.0f} s")
            if not self.coord.poll(min(left, 1.0) * 1000):
                self._check_coordinator(since)
                continue
            _, reply, _ = rpc.recv(self.coord, routed=False)
            if reply is None:
                continue
            if isinstance(reply, WireError):
                raise RemoteError(f"coordinator sent a bad frame: {reply}")
            if reply.rid != msg.rid:
                continue  # a late answer to an earlier, timed-out request
            if reply.op == "error":
                raise RemoteError(f"coordinator refused {msg.op!r}: {reply['msg']}")
            return reply

    def _release(self, reply: Message) -> Release:
        return Release(reply["step"], reply["batch"], reply["min_version"],
                       bool(reply.get("stop", False)), float(reply.get("scale", 1.0)),
                       int(reply.get("round_size", 0)))

    def start(self) -> Release | None:
        """Tell the coordinator this worker is ready; blocks until the policy releases step 0.

        An observer's start returns None at once: it only marks it ready.
        """
        reply = self._call_coord(Message("start"), self.release_timeout)
        return None if reply.op == "ok" else self._release(reply)

    def clock(self, step: int, batch: int, compute_time: float, cpu_load: float | None = None,
              free_mem: float | None = None, record: dict | None = None,
              while_waiting=None) -> Release:
        """Report step `step` done (its pushes acknowledged); blocks until the next release.

        `record` (a flat dict) rides along into the job's metrics log at no extra round trip;
        `while_waiting()`, if given, runs once the clock is sent, before the wait for the
        release: work for the next step done while the round closes elsewhere.
        """
        fields = {"step": step, "batch": batch, "compute_time": float(compute_time)}
        if record:
            fields["record"] = record
        if cpu_load is not None:
            fields["cpu_load"] = float(cpu_load)
        if free_mem is not None:
            fields["free_mem"] = float(free_mem)
        return self._release(self._call_coord(Message("clock", fields), self.release_timeout,
                                              while_waiting))

    def status(self) -> dict:
        """The coordinator's view of the job (samples done, members, whether workers are done)."""
        return self._call_coord(Message("status"), self.timeout)["state"]

    def report(self, record: dict) -> None:
        """Send one metrics record (a flat dict) to the coordinator's metrics log."""
        self._call_coord(Message("report", {"record": record}), self.timeout)

    def bye(self, reason: str = "done") -> None:
        self._call_coord(Message("bye", {"reason": reason}), self.timeout)
