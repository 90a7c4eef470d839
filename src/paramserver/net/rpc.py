"""Messages over sockets: encode/decode around the transport, errors turned into values."""

from __future__ import annotations

import msgpack
import zmq

from paramserver.core.ratelimit import RefusalLog
from paramserver.transport import recv_message, send_frames
from paramserver.transport.shm_frames import ShmFrameError
from paramserver.wire import Message, WireError, decode, encode, reply_error

# Seconds a member joining a coordinator (a worker, a server) waits for an answer before it
# says that none came (a wrong address, no job running there).
SAY_WAITING = 3.0
_NOBLOCK = int(zmq.NOBLOCK)
# Plain ints: a getsockopt by enum costs 3-4 times as much, and this runs once per message.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def send(sock: zmq.Socket, msg: Message, identity: bytes | None = None,
         track: bool = False) -> zmq.MessageTracker | None:
    """Send `msg`; with `track`, the tracker of its zero-copy frames (see send_frames)."""
    return send_frames(sock, encode(msg), identity, track)


def send_or_drop(sock: zmq.Socket, msg: Message, identity: bytes | None = None) -> bool:
    """Send `msg` unless the peer's queue stays full for the socket's send timeout; False when
    it was dropped. For messages a dead peer would never read (heartbeats, notices to the
    coordinator): the sender's own liveness judgement, not a blocked send, decides it is gone."""
    try:
        send_frames(sock, encode(msg), identity)
    except zmq.Again:
        return False
    return True


def recv(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, Message | WireError | None, list]:
    """One message from `sock`: (peer, decoded message or the WireError, raw frames).

    The message is None when what arrived was for the transport alone (a shared-memory
    handshake, answered already): poll again. A transport frame that does not parse comes as
    a WireError too, with no frames."""
    try:
        identity, frames = recv_message(sock, routed)
    except ShmFrameError as exc:
        return exc.peer, _transport_error(exc), []
    if frames is None:
        return identity, None, []
    try:
        return identity, decode(frames), frames
    except WireError as exc:
        return identity, exc, frames


def _transport_error(exc: ShmFrameError) -> WireError:
    return WireError(f"shared-memory frame refused: {exc}")


def peer_name(identity: bytes | None) -> str:
    """How refusal lines name a sender: its routing id in hex (the peer of a DEALER: None)."""
    return "the peer" if identity is None else f"peer {bytes(identity).hex()}"


def refuse(sock: zmq.Socket, identity: bytes | None, error: WireError, src: str,
           frames: list, refusals: RefusalLog) -> None:
    """Answer a malformed request with an error (the request id recovered when possible), and
    say so in the log at the rate `refusals` allows."""
    rid = 0
    try:
        head = msgpack.unpackb(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0])
        if isinstance(head, dict) and isinstance(head.get("rid"), int) and head["rid"] >= 0:
            rid = head["rid"]
    except Exception:  # the header itself may be the garbage, or there are no frames
        pass
    peer = peer_name(identity)
    refusals.refused(peer, f"refused a frame from {peer}: {error}")
    send_or_drop(sock, reply_error(rid, src, str(error)), identity)  # (a full queue: dropped)


class RemoteError(RuntimeError):
    """A peer answered a request with an error reply."""


def queued(sock: zmq.Socket) -> bool:
    """Whether a message waits on `sock`: asked before a recv_nowait that would most likely
    find none, since the zmq.Again it raises costs five times this question."""
    return bool(sock.get(_EVENTS) & _POLLIN)


def recv_nowait(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, Message | WireError, list]:
    """Like recv, but raises zmq.Again at once when nothing is queued (transport-level
    messages are handled and skipped)."""
    while True:
        try:
            identity, body = recv_message(sock, routed, _NOBLOCK)
        except ShmFrameError as exc:
            return exc.peer, _transport_error(exc), []
        if body is not None:
            break
    try:
        return identity, decode(body), body
    except WireError as exc:
        return identity, exc, body
