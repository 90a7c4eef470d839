"""Sparse tables from the client's side: rows pulled and pushed by key (`kv.rows`).

A key's rows live on shard shard_of(key): the same on every client. A pull asks for each
distinct key once and copies its row to every place the key has in the request; a push sums
a key's duplicate gradients here, as the shard's table would (sparse.groups: in float64,
rounded once), and sends each distinct key once. Zipf batches repeat keys a lot: fewer bytes,
less work on the shard, and a push of the keys just pulled reaches each shard as exactly the
keys of that pull, so its table reuses the pull's lookups (sparse/table.py).
"""

from __future__ import annotations

import numpy as np

from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.client.requests import ShardRequests
from paramserver.client.shard_map import ShardMap
from paramserver.sparse.groups import KeyGroup, sum_duplicates
from paramserver.sparse.placement import shard_of
from paramserver.spec.job import TableSpec
from paramserver.wire import Message
from paramserver.wire.protocol import MAX_KEYS_PER_REQUEST

GROUPED_KEYS = 1 << 16  # the most keys of a pull whose grouping the next push may reuse
MASKED_SPLIT = 16  # up to this many shards a request's keys are split by one mask per shard


def as_keys(keys) -> np.ndarray:
    """Row keys as int64 (hashed ids given as uint64 are viewed as int64, bit for bit); the
    count is checked before anything is copied, so a batch far too big fails at once."""
    if hasattr(keys, "detach"):  # torch tensor, without importing torch here
        keys = keys.detach().cpu().numpy()
    k = keys if isinstance(keys, np.ndarray) else np.asarray(keys)
    if k.size > MAX_KEYS_PER_REQUEST:
        raise ValueError(f"{k.size} keys in one request; at most {MAX_KEYS_PER_REQUEST} "
                         f"(split the batch)")
    if k.dtype == np.uint64:
        k = k.view(np.int64)
    elif k.dtype != np.int64:
        raise ValueError(f"row keys must be int64 (or uint64 hashed ids), got {k.dtype}")
    return np.ascontiguousarray(k.reshape(-1))


def _as_grads(grads, count: int, dim: int) -> np.ndarray:
    if hasattr(grads, "detach"):
        grads = grads.detach().cpu().numpy()
    g = np.asarray(grads)
    if g.dtype != np.float32:
        raise ValueError(f"row gradients must be float32, got {g.dtype}")
    if g.size != count * dim:
        raise ValueError(f"{count} keys need gradients of shape ({count}, {dim}), got "
                         f"{g.shape}")
    return np.ascontiguousarray(g.reshape(count, dim))


class RowTables:
    """The job's sparse tables (by name) and the requests that read and update their rows.
    Finish a handle with kv.wait; push_step sends a step's rows beside its dense values."""

    def __init__(self, tables, core: WorkerCore, requests: ShardRequests, shard_map: ShardMap,
                 wait):
        self.specs: dict[str, TableSpec] = {t.name: t for t in tables}
        self.core, self.requests, self.map = core, requests, shard_map
        self._wait = wait  # the client's: follows a request refused `moved`
        # The last pull's keys (a copy), their grouping and the split of its keys by shard
        # ((shard count, split), once made): a push of the same keys (a batch pulled, then
        # its gradients pushed) groups and splits them once.
        self._grouped: tuple[np.ndarray, KeyGroup, tuple | None] | None = None

    def _group(self, keys: np.ndarray) -> KeyGroup:
        last = self._grouped
        if last is not None and last[0].size == keys.size and np.array_equal(last[0], keys):
            return last[1]
        group = KeyGroup(keys)
        # (kept for a batch's size, not a 4M-key request's: its grouping is ~25 bytes a key)
        self._grouped = (keys.copy(), group, None) if keys.size <= GROUPED_KEYS else None
        return group

    def _split(self, keys: np.ndarray, group: KeyGroup | None) -> list[tuple[int, np.ndarray]]:
        """_by_shard of the keys a request sends: those of `group` (its distinct keys, or
        the keys themselves when all are distinct), split once per grouping kept."""
        last = self._grouped
        if group is None or last is None or last[1] is not group:
            return self._by_shard(keys)
        n = len(self.map.shards)
        if last[2] is None or last[2][0] != n:  # (a reshard between pull and push: again)
            self._grouped = (last[0], group, (n, self._by_shard(keys)))
        return self._grouped[2][1]

    def spec(self, name: str) -> TableSpec:
        spec = self.specs.get(name)
        if spec is None:
            known = ", ".join(sorted(self.specs)) or "none"
            raise ValueError(f"unknown table {name!r} (this job's tables: {known})")
        return spec

    def _by_shard(self, keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(shard, positions in `keys`) for every shard, in shard order (maybe empty)."""
        n = len(self.map.shards)
        owner = shard_of(keys, n)
        if n <= MASKED_SPLIT:  # a pass per shard beats a stable sort of a batch
            return [(i, np.flatnonzero(owner == i)) for i in range(n)]
        order = np.argsort(owner, kind="stable")
        cuts = np.searchsorted(owner[order], np.arange(1, n)).tolist()
        return list(enumerate(np.split(order, cuts)))

    def pull_async(self, table: str, keys, min_version: int = 0) -> Handle:
        """Ask for the rows of `keys` (int64, duplicates allowed); finish with wait()."""
        self.map.before_request()
        spec = self.spec(table)
        k = as_keys(keys)
        expand = group = None
        if k.size > 1:
            group = self._group(k)
            if group.uniq.size < k.size:
                k, expand = group.uniq, group.inverse()
        handle = Handle("pull_rows", out=np.empty((k.size, spec.dim), dtype=np.float32),
                        expand=expand)
        for i, idx in self._split(k, group):
            if idx.size:
                msg = Message("pull_rows", {"table": table, "min_version": min_version},
                              [k[idx]])
                handle.parts.append((i, self.requests.send(i, msg), idx))
        # Refused `moved` (servers joined or left): asked again, placed by the new count.
        handle.again = lambda: self.pull_async(table, keys, min_version)
        if not handle.parts:
            handle.done, handle.result = True, handle.out  # no keys
        return handle

    def pull(self, table: str, keys, min_version: int = 0) -> np.ndarray:
        """Rows of `keys`, float32 (len(keys), dim), in the order of `keys`; a key without a
        row yet reads as its initial row. Waits until the shards reach `min_version`."""
        return self._wait(self.pull_async(table, keys, min_version))

    def messages(self, table: str, keys, grads, fields: dict, every_shard: bool,
                       parts: list[int] | None = None) -> list[tuple[int, int, slice]]:
        """Send a push_rows per shard with keys (every shard with `every_shard`: in round mode
        each shard counts the pusher's batch); `parts[i]`: the step's messages to shard i."""
        spec = self.spec(table)
        k = as_keys(keys)
        g = _as_grads(grads, k.size, spec.dim)
        group = None
        if k.size > 1:
            group = self._group(k)
            if group.uniq.size < k.size:
                k, g = group.uniq, sum_duplicates(group, g)
        sent = []
        for i, idx in self._split(k, group):
            if not (idx.size or every_shard):
                continue
            f = {**fields, "table": table, "version": self.core.versions[i]}
            if parts is not None:
                f["parts"] = parts[i]
            msg = Message("push_rows", f, [k[idx], g[idx].reshape(-1)])
            sent.append((i, self.requests.send(i, msg), slice(0, 0)))
        return sent

    def push_async(self, table: str, keys, grads, *, step: int, batch: int,
                        scale: float = 1.0, round_size: int = 0,
                        round_id: int = 0) -> Handle:
        """Send gradients (float32, (len(keys), dim)) for rows of `table`; returns at once.
        `round_size` (the release's): give it when these rows are all the step sends; a step
        that also pushes dense values or other tables' rows in round mode uses push_step, or
        the round may be applied before all of it is in. `round_id`: the release's."""
        self.map.before_request()
        handle = Handle("push")
        handle.parts = self.messages(
            table, keys, grads,
            self.core.releases.push_fields(step, batch, scale, round_size, round_id),
            every_shard=bool(round_size), parts=[1] * len(self.map.shards) if round_size else None)
        return handle

    def push(self, table: str, keys, grads, *, step: int, batch: int, scale: float = 1.0,
                  round_size: int = 0, round_id: int = 0) -> int:
        """Blocking push_async; returns the largest staleness any shard saw."""
        return self._wait(self.push_async(table, keys, grads, step=step, batch=batch,
                                              scale=scale, round_size=round_size,
                                              round_id=round_id))
