"""A worker's transport setup: its rank's emulated link and shared memory with local shards."""

from __future__ import annotations

import numpy as np

from paramserver.emulation.links import link_for
from paramserver.transport import shaping, shm


class WorkerTransportMixin:
    """Part of KVWorker: shares its state (job, rank, shards, num_keys, dtype, arena)."""

    def _shape_link(self) -> bool:
        """Emulate this rank's link from the job's table (paramserver.emulation.links), if it has one."""
        spec = link_for(self.job.get("links"), "w", self.rank)
        if spec is not None:
            shaping.install(spec)
        return spec is not None

    def _offer_shared_memory(self, wanted: bool | None):
        """With every shard on this host, offer them an arena (see transport.shm): pushes from
        shared_buffer() and pull replies then skip the sockets' copies. Off with
        shared_memory=False or PARAMSERVER_SHM=0."""
        if wanted is False or (wanted is None and not shm.enabled()):
            return None
        if not self.shards or len(self.shards) > shm.SLOTS or not all(
                shm.local_address(s.addr) for s in self.shards):
            return None
        try:
            arena = shm.Arena(self.num_keys * self.dtype.itemsize)
        except OSError:
            return None
        for i, s in enumerate(self.shards):
            shm.offer_shared(s.sock, arena, i)
        return arena

    def shared_buffer(self, count: int | None = None) -> np.ndarray:
        """A zeroed array of `count` values (default: one per key) for gradients: pushed from
        it, the bytes reach servers on this host through shared memory instead of the socket.
        Where that is unavailable (or the arena is used up) it is a plain array."""
        count = self.num_keys if count is None else int(count)
        if self.arena is not None:
            buf = self.arena.alloc(count, self.dtype)
            if buf is not None:
                return buf
        return np.zeros(count, dtype=self.dtype)
