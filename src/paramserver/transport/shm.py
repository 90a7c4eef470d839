"""Frames by reference between processes of one host: shared-memory arenas beside ZeroMQ.

ZeroMQ over TCP copies every byte of a frame twice through the kernel (in, out) and wakes two
I/O threads; for a parameter server on one machine that is most of the cost of a push or a
pull. Here a process owns one *arena* (a memfd mapping). A frame whose bytes lie inside the
arena may go as a small descriptor instead, to a peer that has mapped the arena: the message
still travels through ZeroMQ (order, back-pressure, identities unchanged), only the bytes of
such frames skip the socket. The frames the receiver hands to the codec are the same bytes.

Handshake (transport-level, never seen by the protocol): a DEALER offers its arena with a
hello; the ROUTER maps it if it can (same kernel boot and pid namespace, /proc access) and
answers with its own; the DEALER maps that. Either side may decline; then frames go as bytes.

Lifetimes, the two directions differ:
- A frame a DEALER sends by reference (a push) is read by the ROUTER's handler before it
  replies: the DEALER may reuse the buffer once the reply is in (KVWorker's contract for async
  pushes already).
- A frame a ROUTER sends by reference (a pull reply) stays valid until the DEALER releases it
  (release_frames): the DEALER publishes the highest released sequence number in its arena's
  first page, which the ROUTER reads; the send's loan (`done`) tells the ROUTER when it may
  write the buffer again (ShardStore copies on write until then).

Counters beside the frames: a ROUTER's own arena header holds no releases (those live in its
DEALERs' arenas), so a ROUTER may post counters there (publish) that a DEALER which mapped its
arena reads without a message (peer_counter): a replicated shard's backup posts the forwards it
holds, which its primary reads the moment it has applied its own copy.

Disabled with PARAMSERVER_SHM=0 in the environment.
"""

from __future__ import annotations

import json
import os

import zmq

# The arena, frame and link classes live in shm_arena; `shm.X` keeps naming them all, and
# _STATES is the one registry both modules (and zmq_sockets) read.
from paramserver.transport.shm_arena import (
    HEADER_BYTES, SLOTS, _STATES, Arena, Loan, PeerArena, SharedFrame, _Link, _SocketState,
    forget,
)
from paramserver.transport.shm_frames import (
    Confirm, ShmFrameError, parse_to_dealer, parse_to_router, parse_refs,
)

__all__ = ["HEADER_BYTES", "HELLO", "MIN_BYTES", "REFS", "SLOTS", "Arena", "Loan", "PeerArena",
           "SharedFrame", "ShmFrameError", "by_reference", "enabled", "intercept",
           "local_address", "offer_shared", "peer_counter", "publish", "release_frames",
           "serve_shared", "shared_with"]

HELLO = b"\x00psm-hello"  # a msgpack header never starts with a zero byte
REFS = b"\x00psm-refs"
MIN_BYTES = 1 << 16  # smaller frames are as cheap to copy through the socket
_ENV = "PARAMSERVER_SHM"


def enabled() -> bool:
    return os.environ.get(_ENV, "1").lower() not in ("0", "off", "no", "false")


def local_address(addr: str) -> bool:
    """True for addresses only this host can reach (loopback TCP, ipc): shared memory is an
    option there; across real or emulated networks the bytes must travel the wire."""
    if addr.startswith("ipc://"):
        return True
    if addr.startswith("tcp://"):
        host = addr[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
        return host.startswith("127.") or host in ("localhost", "::1")
    return False


# ---- setup --------------------------------------------------------------------------------------
def serve_shared(router: zmq.Socket, arena: Arena) -> None:
    """A ROUTER answers hellos with `arena` and may send frames inside it by reference."""
    _STATES[router] = _SocketState(arena, routed=True)


def offer_shared(dealer: zmq.Socket, arena: Arena, slot: int) -> None:
    """A DEALER offers `arena` to its peer; releases of the peer's frames go in counter `slot`."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"release slot {slot} outside [0, {SLOTS})")
    state = _SocketState(arena, routed=False)
    link = state.links[None] = _Link()
    link.slot, link.arena = slot, arena
    _STATES[dealer] = state
    dealer.send_multipart([HELLO, json.dumps({"arena": arena.describe(), "slot": slot}).encode()])


def shared_with(sock: zmq.Socket) -> bool:
    """Whether a DEALER's peer maps our arena (pushes from it skip the socket)."""
    state = _STATES.get(sock)
    link = state.links.get(None) if state is not None else None
    return bool(link and link.reads_ours)


def publish(router: zmq.Socket, slot: int, value: int) -> bool:
    """Post `value` in counter `slot` of a ROUTER's own arena, for the DEALERs that mapped it;
    False when the ROUTER serves no arena."""
    state = _STATES.get(router)
    if state is None or state.arena is None or not state.routed:
        return False
    state.arena.counters[slot] = value
    return True


def peer_counter(dealer: zmq.Socket, slot: int) -> int | None:
    """Counter `slot` of the arena of a DEALER's ROUTER (publish), or None when that arena is
    not mapped here."""
    state = _STATES.get(dealer)
    link = state.links.get(None) if state is not None else None
    if link is None or link.peer is None or link.peer.closed:
        return None
    return int(link.peer.counters[slot])


# ---- send ---------------------------------------------------------------------------------------
def by_reference(sock: zmq.Socket, frames: list, identity: bytes | None):
    """Frames with the arena's big ones replaced by a descriptor, and the loan (ROUTER) for
    them; (frames, None) unchanged when nothing goes by reference."""
    state = _STATES.get(sock)
    if state is None or state.arena is None:
        return frames, None
    link = state.links.get(identity)
    if link is None or not link.reads_ours or (state.routed and link.peer is None):
        return frames, None
    refs, out = [], list(frames)
    for i, frame in enumerate(frames):
        if isinstance(frame, (bytes, bytearray)):
            continue
        view = frame if isinstance(frame, memoryview) else memoryview(frame)
        if view.nbytes < MIN_BYTES:
            continue
        off = state.arena.offset(view)
        if off is not None:
            refs.append([i, off, view.nbytes])
            out[i] = b""
    if not refs:
        return frames, None
    seq = 0
    if state.routed:
        link.seq += 1
        seq = link.seq
    head = REFS + json.dumps({"seq": seq, "refs": refs}).encode()
    loan = Loan(link.peer, link.slot, seq) if state.routed else None
    return [head, *out], loan


# ---- receive ------------------------------------------------------------------------------------
def intercept(sock: zmq.Socket, identity: bytes | None, frames: list):
    """Handle transport-level frames. Returns the message's frames for the caller (shared
    frames substituted), or None when the message was a handshake (already answered).
    A handshake or descriptor that does not parse (shm_frames) raises ShmFrameError before
    any of its numbers is used."""
    if not frames:
        return frames
    first = frames[0]
    buf = getattr(first, "buffer", first)
    if len(buf) == 0 or buf[0] != 0:
        return frames
    raw = bytes(buf)
    if raw == HELLO and len(frames) == 2:
        _on_hello(sock, identity, bytes(getattr(frames[1], "buffer", frames[1])))
        return None
    if raw.startswith(REFS):
        return _resolve(sock, identity, raw[len(REFS):], frames[1:])
    return frames


def _on_hello(sock: zmq.Socket, identity: bytes | None, body: bytes) -> None:
    state = _STATES.get(sock)
    if identity is None:  # a DEALER hears its ROUTER's answer
        if state is None or None not in state.links:
            raise ShmFrameError("a shared-memory answer to an offer never made")
        answer = parse_to_dealer(body)
        link = state.links[None]
        link.reads_ours = answer.attached
        if answer.arena is not None:
            link.peer = PeerArena.attach(answer.arena)
            # Only now may the ROUTER send by reference: we can read its frames.
            sock.send_multipart([HELLO, json.dumps({"confirm": link.peer is not None}).encode()])
        return
    hello = parse_to_router(body)
    if isinstance(hello, Confirm):  # the DEALER mapped our arena (or could not)
        link = state.links.get(identity) if state is not None else None
        if link is not None and link.peer is not None:
            link.reads_ours = hello.mapped
        return
    # A ROUTER hears a DEALER's offer: map its arena, answer with ours.
    if state is None:
        state = _STATES[sock] = _SocketState(None, routed=True)
    forget(state, identity)  # a second hello replaces the first link
    link = _Link()
    link.slot = hello.slot
    link.peer = None if hello.arena is None else PeerArena.attach(hello.arena)
    if link.peer is not None:
        # Only a mapped peer has anything to track; keeping the others would let a flood of
        # unmappable hellos (another host's token) grow this table for good.
        state.links[identity] = link
    answer = {"attached": link.peer is not None}
    if state.arena is not None and link.peer is not None:
        answer["arena"] = state.arena.describe()  # by reference once the DEALER confirms
    sock.send_multipart([identity, HELLO, json.dumps(answer).encode()])


def _resolve(sock: zmq.Socket, identity: bytes | None, head: bytes, body: list) -> list:
    state = _STATES.get(sock)
    link = state.links.get(identity) if state is not None else None
    if link is None or link.peer is None:
        raise ShmFrameError("frames by reference from a peer whose arena is not mapped")
    refs = parse_refs(head, len(body))
    out = list(body)
    for i, off, n in refs.refs:
        view = link.peer.frame(off, n)
        if view is None:
            raise ShmFrameError(f"frame [{off}, {off + n}) lies outside the peer's arena of "
                                f"{link.peer.size} bytes")
        out[i] = SharedFrame(view, link, refs.seq)
    if refs.seq and identity is None:
        link.outstanding.add(refs.seq)
        link.seen = max(link.seen, refs.seq)
    return out


def release_frames(frames) -> None:
    """The receiver is done with these frames: shared ones may be written again by their owner."""
    for frame in frames:
        if isinstance(frame, SharedFrame) and frame.seq:
            link = frame.link
            link.outstanding.discard(frame.seq)
            released = min(link.outstanding) - 1 if link.outstanding else link.seen
            if link.arena is not None:
                link.arena.counters[link.slot] = released
