"""The CURVE guard of a context: answers ZAP requests from an allow-list, logs refused peers."""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from typing import Protocol

import zmq
from zmq.utils import monitor, z85

from paramserver.core.ratelimit import RefusalLog


class Keys(Protocol):
    """What the guard reads of security.Keys (security imports this module, not the reverse)."""

    directory: str
    allowed: dict  # z85 public key -> its file's name


log = logging.getLogger("paramserver.transport.security")  # refusals log where they always did


_GUARDS: "weakref.WeakKeyDictionary[zmq.Context, _Guard]" = weakref.WeakKeyDictionary()
_GUARDS_LOCK = threading.Lock()
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_PROTOCOL_ERRORS = {int(getattr(zmq, n)): n[len("PROTOCOL_ERROR_"):].lower()
                    for n in dir(zmq) if n.startswith("PROTOCOL_ERROR_")}


def guard_of(ctx: zmq.Context) -> "_Guard":
    """The context's guard, started on first use."""
    with _GUARDS_LOCK:
        guard = _GUARDS.get(ctx)
        if guard is None:
            guard = _GUARDS[ctx] = _Guard(ctx)
            guard.start()
        return guard


class _Guard(threading.Thread):
    """Per context: answers ZAP requests and reports failed handshakes of watched ROUTERs."""

    def __init__(self, ctx: zmq.Context):
        super().__init__(daemon=True, name="paramserver-zap")
        self.zap = ctx.socket(zmq.REP)
        self.zap.linger = 0
        self.zap.bind("inproc://zeromq.zap.01")
        self.domains: dict[str, Keys] = {}
        self.incoming: queue.SimpleQueue = queue.SimpleQueue()
        # A peer retrying its connection every 100 ms must not flood the log.
        self.refusals = RefusalLog(log.warning, time.monotonic, burst=1, window=5.0)
        # Every socket the guard owns is closed when it stops, the monitors handed over but not
        # yet polled too: one left open would keep the context (and so the process) from ending.
        self._lock = threading.Lock()
        self._stopped = False

    def admit(self, keys: Keys) -> str:
        domain = f"paramserver-{len(self.domains)}"
        self.domains[domain] = keys
        return domain

    def watch(self, sock: zmq.Socket) -> None:
        monitor_sock = sock.get_monitor_socket(_FAILED)
        monitor_sock.linger = 0
        with self._lock:
            if not self._stopped:
                self.incoming.put(monitor_sock)
                return
        monitor_sock.close(0)  # the context is ending: nothing will read it

    def run(self) -> None:
        poller, monitors = zmq.Poller(), []
        poller.register(self.zap, zmq.POLLIN)
        try:
            while True:
                while not self.incoming.empty():
                    monitors.append(self.incoming.get())
                    poller.register(monitors[-1], zmq.POLLIN)
                ready = dict(poller.poll(200))
                if self.zap in ready:
                    self.zap.send_multipart(self._answer(self.zap.recv_multipart()))
                for m in monitors:
                    if m in ready:
                        self._report(monitor.recv_monitor_message(m))
                self.refusals.flush()
        except zmq.ZMQError:  # the context is terminating: let it
            pass
        finally:
            with self._lock:
                self._stopped = True
                while not self.incoming.empty():
                    monitors.append(self.incoming.get())
            for s in (self.zap, *monitors):
                s.close(0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, rid, domain, address, _identity, mechanism = frames[:6]
        keys = self.domains.get(domain.decode(errors="replace"))
        key = z85.encode(frames[6]) if mechanism == b"CURVE" and len(frames) > 6 else None
        if keys is not None and key in keys.allowed:
            name = keys.allowed[key]
            log.debug("admitted %s (%s key)", address.decode(errors="replace"), name)
            return [version, rid, b"200", b"OK", name.encode(), b""]
        peer = address.decode(errors="replace")
        self.refusals.refused(
            f"zap {peer}", f"refused a connection from {peer}: its key "
            f"{key.decode() if key else mechanism.decode(errors='replace')} is not in "
            f"{f'{keys.directory}/public' if keys else 'any key folder'}")
        return [version, rid, b"400", b"key not allowed", b"", b""]

    def _report(self, event: dict) -> None:
        reason = "no detail"  # NO_DETAIL events carry an errno, PROTOCOL ones the reason
        if event.get("event") == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            reason = _PROTOCOL_ERRORS.get(int(event.get("value", 0)), "protocol error")
        endpoint = event.get("endpoint", b"")
        where = endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else endpoint
        self.refusals.refused(
            f"handshake {reason}", f"refused a connection on {where}: CURVE handshake failed "
            f"({reason}): a peer without this cluster's server key, not using CURVE, or "
            f"replaying a session")
