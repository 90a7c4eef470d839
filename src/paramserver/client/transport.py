"""A worker's transport setup beside its sockets: its rank's emulated link, and an arena of
shared memory with the shards on this host."""

from __future__ import annotations

import numpy as np

from paramserver.emulation.links import link_for
from paramserver.transport import shaping, shm


def shape_link(links, rank: int) -> bool:
    """Emulate worker `rank`'s link from the job's table (paramserver.emulation.links), if it
    names one; True if this process's traffic is shaped now (undo with unshape())."""
    spec = link_for(links, "w", rank)
    if spec is not None:
        shaping.install(spec)
    return spec is not None


def unshape() -> None:
    shaping.install(None)


def offer_shared_memory(shards: list, nbytes: int, wanted: bool | None) -> shm.Arena | None:
    """With every shard on this host, offer them an arena of `nbytes` (see transport.shm):
    pushes from shared_buffer() and pull replies then skip the sockets' copies. None where that
    cannot be, or with wanted=False or PARAMSERVER_SHM=0."""
    if wanted is False or (wanted is None and not shm.enabled()):
        return None
    if not shards or len(shards) > shm.SLOTS or not all(
            shm.local_address(s.addr) for s in shards):
        return None
    try:
        arena = shm.Arena(nbytes)
    except OSError:
        return None
    for i, s in enumerate(shards):
        shm.offer_shared(s.sock, arena, i)
    return arena


class PayloadArea:
    """A region of the worker's arena that one push at a time writes its codec payload into,
    so that payload reaches a server on this host by reference, as a dense push from the
    shared buffer does, instead of through the socket (and its encryption, with keys).

    A push `claim`s it when no other request holds it (the holder's handle is done); its
    messages' frames are `place`d one after the other, each at least shm.MIN_BYTES and
    fitting. What does not fit, or a push that finds it held, goes through the socket as
    before. The region is taken from the arena at the first claim."""

    def __init__(self, arena: shm.Arena | None, nbytes: int):
        self.arena, self.nbytes = arena, int(nbytes)
        self.buf: np.ndarray | None = None
        self.owner = None
        self.top = 0

    def claim(self, handle) -> None:
        if self.arena is None or (self.owner is not None and not self.owner.done):
            return
        if self.buf is None:
            self.buf = self.arena.alloc(self.nbytes, np.uint8)
            if self.buf is None:  # no room: every payload through the socket
                self.arena = None
                return
        self.owner, self.top = handle, 0

    def place(self, handle, frames: list) -> list:
        """`frames` (uint8 arrays) copied into the region where `handle` holds it and they
        fit; the others as they are."""
        if handle is not self.owner or self.buf is None:
            return frames
        out = []
        for frame in frames:
            n = frame.nbytes
            start = -(-self.top // 64) * 64
            if n < shm.MIN_BYTES or start + n > self.buf.size:
                out.append(frame)
                continue
            view = self.buf[start:start + n]
            np.copyto(view, frame.reshape(-1).view(np.uint8))
            self.top = start + n
            out.append(view)
        return out


def shared_buffer(arena: shm.Arena | None, count: int, dtype: np.dtype) -> np.ndarray:
    """A zeroed array of `count` values, in `arena` while it has room, else a plain one."""
    if arena is not None:
        buf = arena.alloc(count, dtype)
        if buf is not None:
            return buf
    return np.zeros(count, dtype=dtype)
