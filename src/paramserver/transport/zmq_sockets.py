"""ZeroMQ sockets: bind ROUTERs, connect DEALERs, move opaque frames; nothing here reads them."""

from __future__ import annotations

import os
from typing import Sequence

import zmq

# Bounded queues give back-pressure: a peer that sends faster than we read blocks on send
# instead of growing our memory without limit.
DEFAULT_HWM = 64


def new_context() -> zmq.Context:
    return zmq.Context()


def _tune(sock: zmq.Socket, hwm: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)


def bind_router(ctx: zmq.Context, host: str = "127.0.0.1", port: int = 0,
                scheme: str = "tcp", hwm: int = DEFAULT_HWM) -> tuple[zmq.Socket, str]:
    """Bind a ROUTER; port 0 picks a free port. Returns the socket and its connectable address."""
    sock = ctx.socket(zmq.ROUTER)
    _tune(sock, hwm)
    # Peers that vanish must not block sends to them: drop instead of blocking.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if scheme == "ipc":
        path = f"/tmp/paramserver-{os.getpid()}-{id(sock):x}.ipc"
        sock.bind(f"ipc://{path}")
        return sock, f"ipc://{path}"
    if scheme != "tcp":
        raise ValueError(f"unknown transport scheme {scheme!r}; known: tcp, ipc")
    if port:
        sock.bind(f"tcp://{host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{host}")
    return sock, f"tcp://{host}:{port}"


def connect_dealer(ctx: zmq.Context, addr: str, identity: bytes | None = None,
                   hwm: int = DEFAULT_HWM, send_timeout: float | None = None) -> zmq.Socket:
    """Connect a DEALER; with `send_timeout` (s) a send to a full, unread queue raises zmq.Again."""
    sock = ctx.socket(zmq.DEALER)
    _tune(sock, hwm)
    if send_timeout is not None:
        sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(addr)
    return sock


def send_frames(sock: zmq.Socket, frames: Sequence, identity: bytes | None = None) -> None:
    """Send one multipart message; large frames go zero-copy."""
    parts = [identity, *frames] if identity is not None else list(frames)
    sock.send_multipart(parts, copy=False)


def recv_frames(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, list]:
    """Receive one multipart message; ROUTER sockets yield (peer identity, frames)."""
    frames = sock.recv_multipart(copy=False)
    if routed:
        return frames[0].bytes, frames[1:]
    return None, frames
