"""Shared-memory arenas, mapped peer arenas, frames and per-socket link state for transport.shm."""

from __future__ import annotations

import mmap
import os
import weakref

import numpy as np
import zmq

from paramserver.transport.shm_frames import (
    HEADER_BYTES, SLOTS, ArenaDesc, ShmFrameError, parse_arena,
)

# The name Arena gives its memfd: a peer maps only files of that name (a hostile hello may name
# any process's descriptor).
MEMFD_NAME = "paramserver-arena"


def _host_token() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _address(buf) -> tuple[int, int]:
    """(start address, length in bytes) of a contiguous buffer."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes


class Arena:
    """Memory of this process that peers on the host may map; a bump allocator over a memfd.

    Pages are only backed once touched, so an arena sized for the worst case costs nothing
    until used. Buffers are never freed back: allocate the long-lived ones (a gradient buffer,
    a shard's values and its spares) once.
    """

    def __init__(self, nbytes: int):
        self.size = HEADER_BYTES + _round_up(max(int(nbytes), 1), 4096)
        self.fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.bytes.ctypes.data
        self.counters = np.frombuffer(self.map, dtype=np.uint64, count=SLOTS)
        self.top = HEADER_BYTES
        self.host = _host_token()

    def alloc(self, count: int, dtype) -> np.ndarray | None:
        """A zeroed array of `count` x `dtype` inside the arena, or None when it is full."""
        dtype = np.dtype(dtype)
        start = _round_up(self.top, 64)
        end = start + int(count) * dtype.itemsize
        if end > self.size:
            return None
        self.top = end
        out = self.bytes[start:end].view(dtype)
        out[...] = 0
        return out

    def offset(self, buf) -> int | None:
        """Where `buf` starts inside the arena, or None if it is not wholly inside."""
        start, n = _address(buf)
        off = start - self.base
        return off if HEADER_BYTES <= off and off + n <= self.size else None

    def describe(self) -> dict:
        return {"host": self.host, "pid": os.getpid(), "fd": self.fd, "size": self.size}

    def close(self) -> None:
        """Let go of the arena's file: peers that mapped it see that (PeerArena.held) and
        unmap it. Our own mapping stays valid for the arrays still in it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PeerArena:
    """A peer's arena, mapped read-only here, until the peer lets go of it (close)."""

    def __init__(self, desc: ArenaDesc):
        self.path = f"/proc/{desc.pid}/fd/{desc.fd}"
        if not os.readlink(self.path).startswith(f"/memfd:{MEMFD_NAME}"):
            raise ValueError(f"{self.path} is not a paramserver arena")
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size < desc.size:
                raise ValueError(f"{self.path} is smaller than the {desc.size} bytes announced")
            self.map = mmap.mmap(f.fileno(), desc.size, prot=mmap.PROT_READ)
        self.file = (st.st_dev, st.st_ino)  # the memfd itself, to tell it from a reused fd
        self.size = desc.size
        self.view = memoryview(self.map)
        self.counters = np.frombuffer(self.map, dtype=np.uint64, count=SLOTS)
        self.closed = False

    def held(self) -> bool:
        """Whether the peer still holds its arena: its process is alive with the memfd open.
        A peer that exited or closed its arena (KVWorker.close) answers False."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.file

    def close(self) -> bool:
        """Unmap the arena; False while frames received from it are still referenced (then
        try again later). Loans on a closed arena are done: nobody reads them any more."""
        self.closed = True
        self.counters = _RELEASED_ALL
        self.view.release()
        try:
            self.map.close()
        except BufferError:  # a SharedFrame still points into it
            return False
        return True

    @staticmethod
    def attach(desc: ArenaDesc | dict) -> "PeerArena | None":
        """The peer's arena mapped, or None where it cannot be (another host or pid namespace,
        no access, not an arena): then frames travel as bytes. A dict is Arena.describe()'s
        form, parsed first."""
        if isinstance(desc, dict):
            try:
                desc = parse_arena(desc)
            except ShmFrameError:
                return None
        if desc.host != _host_token() or not desc.host:
            return None
        try:
            return PeerArena(desc)
        except (OSError, ValueError, OverflowError):
            return None

    def frame(self, offset: int, length: int) -> memoryview | None:
        if not (HEADER_BYTES <= offset and 0 <= length and offset + length <= self.size):
            return None
        return self.view[offset:offset + length]


class SharedFrame:
    """A received frame whose bytes live in the peer's arena; `.buffer` as zmq.Frame has."""

    __slots__ = ("buffer", "link", "seq")

    def __init__(self, buffer: memoryview, link: "_Link", seq: int):
        self.buffer, self.link, self.seq = buffer, link, seq

    def __len__(self) -> int:
        return self.buffer.nbytes


class _Link:
    """One side's view of one peer: the peer's mapped arena and the release bookkeeping."""

    def __init__(self):
        self.peer: PeerArena | None = None
        self.reads_ours = False  # the peer mapped our arena
        self.slot = 0  # the counter slot releases are published in (in the DEALER's arena)
        self.seq = 0  # ROUTER: last sequence number sent by reference to this peer
        self.outstanding: set[int] = set()  # DEALER: received by reference, not yet released
        self.seen = 0  # DEALER: highest sequence received
        self.arena: Arena | None = None  # DEALER: ours, where releases are published


class _SocketState:
    def __init__(self, arena: Arena | None, routed: bool):
        self.arena, self.routed = arena, routed
        self.links: dict[bytes | None, _Link] = {}


_STATES: "weakref.WeakKeyDictionary[zmq.Socket, _SocketState]" = weakref.WeakKeyDictionary()


class Loan:
    """Done once the peer released the frames sent by reference with sequence `seq` (or once
    the last of `also`, ZeroMQ trackers of frames sent zero-copy as bytes, is done)."""

    __slots__ = ("peer", "slot", "seq", "also")

    def __init__(self, peer: PeerArena, slot: int, seq: int, also=()):
        self.peer, self.slot, self.seq, self.also = peer, slot, seq, tuple(also)

    @property
    def done(self) -> bool:
        return int(self.peer.counters[self.slot]) >= self.seq and all(t.done for t in self.also)


# What a closed PeerArena reads as: every sequence number released.
_RELEASED_ALL = np.full(SLOTS, np.iinfo(np.uint64).max, dtype=np.uint64)
_RELEASED_ALL.flags.writeable = False
_unmapping: list[PeerArena] = []  # closed while frames of them were still referenced


def drop_departed(sock: zmq.Socket) -> int:
    """Unmap the arenas of a ROUTER's peers that let go of theirs (exited, died or closed):
    each client's arena would otherwise stay mapped here for good. Their links go too (a
    late message from such a peer then finds no arena and is refused). Returns how many."""
    global _unmapping
    _unmapping = [p for p in _unmapping if not p.close()]
    state = _STATES.get(sock)
    if state is None:
        return 0
    gone = [ident for ident, link in state.links.items()
            if link.peer is not None and not link.peer.held()]
    for ident in gone:
        forget(state, ident)
    return len(gone)


def forget(state: _SocketState, identity: bytes | None) -> None:
    """Drop the link to one peer, unmapping its arena (later, if frames of it are held)."""
    link = state.links.pop(identity, None)
    if link is not None and link.peer is not None and not link.peer.close():
        _unmapping.append(link.peer)
