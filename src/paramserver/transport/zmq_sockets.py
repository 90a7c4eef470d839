"""ZeroMQ sockets: bind ROUTERs, connect DEALERs, move opaque frames; nothing here reads them."""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import sys
import threading
from typing import Sequence

import zmq

from paramserver.transport import security, shaping, shm
from paramserver.transport.addresses import PortInUse, is_wildcard

# Bounded queues give back-pressure: a peer that sends faster than we read blocks on send
# instead of growing our memory without limit.
DEFAULT_HWM = 64
# No send waits longer than this by default: a peer that died leaves its queue full, and a send
# into it must not hold the process past its own judgement that the peer is gone.
SEND_TIMEOUT = 30.0
# How long closing a context may wait for sockets it does not know of (see terminate).
TERM_TIMEOUT = 5.0

log = logging.getLogger(__name__)


def new_context() -> zmq.Context:
    shaping.install_from_env()  # a link emulated for this process ($PARAMSERVER_LINK)
    return zmq.Context()


_SNDMORE = int(zmq.SNDMORE)  # a plain int: enum arithmetic per frame shows in profiles

# glibc mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """Make freed frame memory reusable by the next frame instead of page-faulting in fresh memory.

    libzmq mallocs one buffer per received frame. glibc maps a large one (above its dynamic
    mmap threshold, always above 32 MB) fresh from the kernel and unmaps it when the frame dies,
    so every byte received page-faults: measured here, that halves the throughput of 64 MB
    frames. With one arena (the zmq I/O thread shares the main heap), no mmap and no trimming, a
    freed frame's memory serves the next one. The price: the process keeps its peak heap.

    Process-wide: call it before creating the zmq context (its I/O thread then shares the main
    heap). Servers call it, and so does every KVWorker (pull replies are as large as pushes)
    unless made with reuse_memory=False. Returns False where this is not glibc (then nothing
    changed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_ARENA_MAX, 1) and mallopt(_M_MMAP_MAX, 0)
    return bool(ok and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc malloc_trim): after a frame far
    larger than the ones keep_freed_memory keeps for reuse, so that its peak is not held for
    good. Returns False where this is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


# Frames below this are copied into ZeroMQ's own message when sent, larger ones lent zero-copy.
# pyzmq's default (64 KB) lends mid-sized frames too, and each lend costs a Frame, a reference
# kept in pyzmq's garbage collector and that collector thread's wake-up to let it go: over TCP a
# 128 KB push+pull took 0.75 ms lent against 0.53 copied, 200 KB 0.74 against 0.63, while from
# 600 KB on the copy costs more than the lend (benchmarks/README, "Mid-sized frames").
COPY_BELOW = 256 << 10


def _tune(sock: zmq.Socket, hwm: int, max_message: int | None = None) -> None:
    sock.copy_threshold = COPY_BELOW
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if max_message is not None:
        # A peer that sends a larger frame is disconnected before its bytes are held. ZeroMQ
        # copies the option when a socket binds or connects: it must be set before.
        sock.setsockopt(zmq.MAXMSGSIZE, int(max_message))


class PortHold:
    """A free TCP port on `host`, held (bound, not listening) so that nothing else takes it
    until the ROUTER that will listen there is bound (bind_router(..., hold=)): a server says
    its address when it registers, but binds only once the welcome told it its limits."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        if port:  # a port given (a restarted server's) may have connections in TIME_WAIT
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Without SO_REUSEADDR no other socket may bind the port while it is held.
        self._sock.bind(("0.0.0.0" if is_wildcard(host) else host.strip("[]"), port))
        self.port = self._sock.getsockname()[1]

    def release(self) -> None:
        self._sock.close()


def bind_router(ctx: zmq.Context, host: str = "127.0.0.1", port: int = 0,
                scheme: str = "tcp", hwm: int = DEFAULT_HWM,
                keys=None, advertise: str | None = None,
                max_message: int | None = None,
                hold: PortHold | None = None) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER; port 0 picks a free port. Returns the socket and its connectable address:
    on `advertise` (the host peers dial) if given, else on `host`, which must then not be a
    wildcard such as 0.0.0.0 (see addresses.advertised_host).

    `keys` (security.Keys) makes it a CURVE server admitting only the cluster's keys; without
    keys a non-loopback `host` is refused unless `keys` is security.INSECURE. A frame above
    `max_message` bytes disconnects its sender (ZMQ_MAXMSGSIZE). `hold`: the port reserved for
    it, released at the last moment."""
    security.check_bind(host, scheme, keys)
    router_address(host, 0, scheme, advertise)  # (refuses a wildcard with no advertise)
    sock = ctx.socket(zmq.ROUTER)
    try:
        _tune(sock, hwm, max_message)
        security.secure_router(sock, keys)
        # Peers that vanish must not block sends to them: drop instead of blocking.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if scheme == "ipc":
            path = f"/tmp/paramserver-{os.getpid()}-{id(sock):x}.ipc"
            sock.bind(f"ipc://{path}")
            return sock, f"ipc://{path}"
        if scheme != "tcp":
            raise ValueError(f"unknown transport scheme {scheme!r}; known: tcp, ipc")
        if hold is not None:
            port = hold.port
            hold.release()
        if port:
            try:
                sock.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EADDRINUSE:
                    raise PortInUse(host, port) from None
                raise
        else:
            port = sock.bind_to_random_port(f"tcp://{host}")
        return sock, router_address(host, port, scheme, advertise)
    except BaseException:  # (a port taken, say): a socket left open keeps the context alive
        sock.close(0)
        raise


def router_address(host: str, port: int, scheme: str = "tcp",
                   advertise: str | None = None) -> str:
    """The address peers dial for a ROUTER bound to `host`:`port` (see bind_router)."""
    if scheme == "tcp" and not advertise and is_wildcard(host):
        raise ValueError(f"bound to {host or '*'}: say which address peers dial (advertise)")
    return f"tcp://{advertise or host}:{port}"


def connect_dealer(ctx: zmq.Context, addr: str | None, identity: bytes | None = None,
                   hwm: int = DEFAULT_HWM, send_timeout: float = SEND_TIMEOUT,
                   keys=None, peer: str = "coordinator",
                   max_message: int | None = None) -> zmq.Socket:
    """Connect a DEALER; a send to a queue that stays full for `send_timeout` s (0: at once)
    raises zmq.Again. (A DEALER keeps queueing for a peer that died: without the bound, the
    65th send after its death would block forever.)

    With `keys` it is a CURVE client that trusts only the public key of role `peer`; a frame
    above `max_message` bytes from the peer drops the connection. `addr` None: connected to
    nothing yet (the caller connects it once it watches the socket's events)."""
    sock = ctx.socket(zmq.DEALER)
    _tune(sock, hwm, max_message)
    security.secure_dealer(sock, keys, peer)
    sock.setsockopt(zmq.SNDTIMEO, max(0, int(send_timeout * 1000)))
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    if addr is not None:
        sock.connect(addr)
    return sock


def terminate(ctx: zmq.Context, sockets: Sequence = (), timeout: float = TERM_TIMEOUT) -> bool:
    """Close `sockets` and the context, waiting at most `timeout` s; False if it did not end.

    zmq_ctx_term waits for every socket of the context to close, so one left open anywhere (a
    thread's, a monitor's) would hold the process forever. Past the bound the context is left
    to the process's exit, with a warning: nothing that is still open can be waited for."""
    for sock in sockets:
        if sock is not None:
            sock.close(0)
    done = threading.Event()

    def term() -> None:
        ctx.term()
        done.set()

    threading.Thread(target=term, name="paramserver-term", daemon=True).start()
    if done.wait(timeout):
        return True
    log.warning("the ZeroMQ context did not close within %g s (a socket was left open); "
                "exiting without it", timeout)
    return False


def send_frames(sock: zmq.Socket, frames: Sequence, identity: bytes | None = None,
                track: bool = False) -> zmq.MessageTracker | None:
    """Send one multipart message; large frames go zero-copy (small ones are copied).

    With `track`, returns a MessageTracker whose `done` turns true once ZeroMQ has let go of
    every zero-copy frame: until then their buffers must not change.
    """
    loan = None
    if shaping.active():  # charged in full before shm may move big frames off the socket
        shaping.on_send(frames)
    if shm._STATES:  # a peer on this host may read some frames from our arena instead
        frames, loan = shm.by_reference(sock, list(frames), identity)
    parts = [identity, *frames] if identity is not None else list(frames)
    last = len(parts) - 1
    if not track:
        for i, part in enumerate(parts):
            sock.send(part, _SNDMORE if i < last else 0, copy=False)
        return loan
    pending = []
    for i, part in enumerate(parts):
        if type(part) is bytes or type(part) is Peer:  # immutable: nothing to wait for
            sock.send(part, _SNDMORE if i < last else 0, copy=False)
            continue
        tracker = sock.send(part, _SNDMORE if i < last else 0, copy=False, track=True)
        if tracker is not None and not tracker.done:
            pending.append(tracker)
    if loan is not None:
        loan.also = tuple(pending)
        return loan
    return pending[0] if len(pending) == 1 else zmq.MessageTracker(*pending)


def recv_all(sock: zmq.Socket, flags: int = 0) -> list:
    """All frames of one message, zero-copy (recv_multipart without its per-frame sockopt call).

    With flags=zmq.NOBLOCK raises zmq.Again when nothing is queued."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(0, copy=False)
        frames.append(frame)
    return frames


class Peer(bytes):
    """A ROUTER peer's routing id, as bytes, that also tells the role of the peer's CURVE key.

    The role comes from the routing-id frame, which libzmq makes itself: the peer cannot swap
    it for one of its own (as it can the body's frames, through shared memory)."""

    def __new__(cls, frame: zmq.Frame) -> "Peer":
        peer = super().__new__(cls, frame.bytes)
        peer._frame = frame
        return peer

    def __reduce__(self):  # a copy is the plain routing id: the frame stays behind
        return bytes, (bytes(self),)

    @property
    def key_role(self) -> str | None:
        """The role the peer's key is filed under (security.key_role); None when plaintext or
        when the key's file name is no valid key name."""
        return security.key_role(self._frame)


def recv_message(sock: zmq.Socket, routed: bool,
                 flags: int = 0) -> tuple[Peer | None, list | None]:
    """One message: (peer identity for ROUTERs, a Peer; frames). Frames sent by reference from
    a peer's shared arena come as shm.SharedFrame (with `.buffer`); a transport-level message
    (the shared-memory handshake) is answered here and yields (identity, None). One that does
    not parse raises shm.ShmFrameError, its `peer` the sender."""
    frames = recv_all(sock, flags)
    identity = Peer(frames[0]) if routed else None
    body = frames[1:] if routed else frames
    if body:
        head = body[0].buffer
        if len(head) and head[0] == 0:
            try:
                body = shm.intercept(sock, identity, body)
            except shm.ShmFrameError as exc:
                exc.peer = identity  # for the caller's refusal: who sent it
                raise
        if body is not None and shaping.active():
            shaping.on_recv(body)
    return identity, body


def recv_frames(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, list | None]:
    """Receive one multipart message; ROUTER sockets yield (peer identity, frames)."""
    return recv_message(sock, routed)
