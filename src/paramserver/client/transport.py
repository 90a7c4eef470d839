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


def shared_buffer(arena: shm.Arena | None, count: int, dtype: np.dtype) -> np.ndarray:
    """A zeroed array of `count` values, in `arena` while it has room, else a plain one."""
    if arena is not None:
        buf = arena.alloc(count, dtype)
        if buf is not None:
            return buf
    return np.zeros(count, dtype=dtype)
