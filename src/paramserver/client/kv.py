"""KVWorker: the worker-side client of the parameter server (push, pull, ranges, sparse, clock).

Usage::

    kv = KVWorker("tcp://127.0.0.1:5555")      # registers; kv.rank, kv.num_keys, kv.job
    kv.init(initial_values)                      # rank 0 sets them; others' inits are ignored
    release = kv.start()                         # wait for the policy to release step 0
    params = kv.pull(min_version=release.min_version)
    kv.push(grad, step=release.step, batch=release.batch_size)
    release = kv.clock(release.step, batch=..., compute_time=...)
    kv.close()

Requests are sliced across shards and their replies reassembled. `push_async`/`pull_async`
return a Handle; `kv.wait(handle)` finishes it (like ps-lite's timestamps). A buffer passed to
an async push is sent zero-copy: do not modify it before the handle is waited on.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import zmq

from paramserver.core.keyspace import KeyRange
from paramserver.client.requests import ShardRequests
from paramserver.client.session import Release, StepProtocolMixin
from paramserver.client.transport import WorkerTransportMixin
from paramserver.transport import connect_dealer, new_context, security, shaping
from paramserver.wire import Message

# Release lives with the step protocol; callers import it from here too.
__all__ = ["Handle", "KVWorker", "Release"]


@dataclass
class Shard:
    rank: int
    addr: str
    range: KeyRange
    sock: zmq.Socket
    version: int = 0  # the version this worker last pulled from the shard


@dataclass
class Handle:
    """An outstanding request: its per-shard request ids and how to assemble the replies."""

    kind: str
    parts: list[tuple[int, int, slice]] = field(default_factory=list)  # (shard, rid, out slice)
    out: np.ndarray | None = None
    done: bool = False
    result: object = None


def _as_array(values, dtype: np.dtype) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.dtype != dtype:
        raise ValueError(f"values have dtype {arr.dtype}; this job's parameters are {dtype}")
    return np.ascontiguousarray(arr.reshape(-1))


class KVWorker(StepProtocolMixin, WorkerTransportMixin):
    """Client of one job: a DEALER per shard, one to the coordinator, and a heartbeat thread."""

    def __init__(self, join: str, *, timeout: float = 120.0, release_timeout: float = 600.0,
                 heartbeat: bool = True, src: str | None = None, role: str = "worker",
                 num_keys: int | None = None, shared_memory: bool | None = None,
                 keys: security.Keys | None = None):
        self.timeout, self.release_timeout = timeout, release_timeout
        self.src = src or f"w-{os.getpid()}-{secrets.token_hex(3)}"
        # A user's script started by `paramserver launch` finds the job's keys in the environment.
        self.keys = keys if keys is not None else security.from_env(role)
        self.ctx = new_context()
        self.coord = connect_dealer(self.ctx, join, keys=self.keys)
        self.join = join
        self._rid = 0
        # An "observer" (an evaluator) reads parameters but is no member of the sync policy.
        # `num_keys` tells a job started without a model (`paramserver launch`) its key space.
        fields = {"role": role} if not num_keys else {"role": role, "num_keys": int(num_keys)}
        welcome = self._call_coord(Message("register", fields), self.timeout)
        self.rank: int = welcome["rank"]
        self.job: dict = welcome["job"]
        self.num_keys: int = self.job["num_keys"]
        self.dtype = np.dtype(self.job["dtype"])
        self._shaped = role == "worker" and self._shape_link()
        self.shards = [Shard(r, a, KeyRange(lo, hi),
                             connect_dealer(self.ctx, a, send_timeout=self.timeout,
                                            keys=self.keys, peer="server"))
                       for r, a, lo, hi in self.job["shards"]]
        self._starts = np.array([s.range.lo for s in self.shards], dtype=np.int64)
        # `retry_interval`: seconds without an answer before a request is sent again.
        self.requests = ShardRequests(self.shards, self.src, self._next_rid, self.timeout,
                                      float(self.job.get("retry_interval", 3.0)))
        self.arena = self._offer_shared_memory(shared_memory)
        everything = KeyRange(0, self.num_keys)
        self._all_pieces = list(self._pieces(everything))  # the common request, worked out once
        self._stop_beat = threading.Event()
        self.coord_heard = time.monotonic()  # the coordinator's last answer to a heartbeat
        self._beat = self._start_heartbeat() if heartbeat else None

    @property
    def timeout(self) -> float:
        """Seconds any request (to the coordinator or a shard) may wait for its answer."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = seconds
        if hasattr(self, "requests"):
            self.requests.timeout = seconds

    # ---- plumbing -------------------------------------------------------------------------------
    def _next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def _pieces(self, key_range: KeyRange):
        """(shard index, piece range, slice into the request) for each shard the range touches."""
        if key_range.lo == 0 and key_range.hi == self.num_keys and hasattr(self, "_all_pieces"):
            yield from self._all_pieces
            return
        for i, shard in enumerate(self.shards):
            part = shard.range.intersect(key_range)
            if part is not None:
                yield i, part, slice(part.lo - key_range.lo, part.hi - key_range.lo)

    def _full(self, keys: KeyRange | tuple[int, int] | None) -> KeyRange:
        r = KeyRange(0, self.num_keys) if keys is None else KeyRange(*keys) if isinstance(
            keys, tuple) else keys
        if r.hi > self.num_keys:
            raise ValueError(f"key range [{r.lo}, {r.hi}) exceeds the {self.num_keys} keys")
        return r

    # ---- the KV API -----------------------------------------------------------------------------
    def init(self, values, keys: KeyRange | tuple[int, int] | None = None) -> bool:
        """Offer initial values; the first offer per shard wins. True if ours was taken."""
        r = self._full(keys)
        arr = _as_array(values, self.dtype)
        parts = [(i, self.requests.send(i, Message("init", {"range": [p.lo, p.hi]}, [arr[sl]])), sl)
                 for i, p, sl in self._pieces(r)]
        replies = self.requests.collect(parts, "init")
        return all(m.get("staleness", 0) >= 0 for m in replies.values())

    def push_async(self, values, keys: KeyRange | tuple[int, int] | None = None, *, step: int,
                   batch: int, scale: float = 1.0, round_size: int = 0) -> Handle:
        """Send a dense gradient for a key range (default: all keys); returns at once.

        `round_size` (the release's): give it when this push is all the step sends; a shard
        counts it only from a piece that covers the shard."""
        r = self._full(keys)
        arr = _as_array(values, self.dtype)
        if arr.size != r.size:
            raise ValueError(f"{arr.size} values for {r.size} keys")
        handle = Handle("push")
        for i, p, sl in self._pieces(r):
            fields = {"range": [p.lo, p.hi], "step": step, "version": self.shards[i].version,
                      "batch": batch, "scale": float(scale)}
            if round_size:
                fields["round_size"] = round_size
            handle.parts.append((i, self.requests.send(i, Message("push", fields, [arr[sl]])), sl))
        return handle

    def push(self, values, keys=None, *, step: int, batch: int, scale: float = 1.0,
             round_size: int = 0) -> int:
        """Dense push; blocks until every shard acknowledged. Returns the largest staleness seen."""
        return self.wait(self.push_async(values, keys, step=step, batch=batch, scale=scale,
                                         round_size=round_size))

    def push_sparse_async(self, keys, values, *, step: int, batch: int,
                          scale: float = 1.0, round_size: int = 0) -> Handle:
        """Send (keys, values) pairs; repeated keys add up on the server."""
        k = np.ascontiguousarray(np.asarray(keys, dtype=np.int64).reshape(-1))
        v = _as_array(values, self.dtype)
        if k.size != v.size:
            raise ValueError(f"{k.size} keys but {v.size} values")
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"sparse keys must lie in [0, {self.num_keys})")
        order = None if k.size < 2 or np.all(k[1:] >= k[:-1]) else np.argsort(k, kind="stable")
        if order is not None:
            k, v = k[order], v[order]
        cuts = np.searchsorted(k, self._starts[1:], side="left")
        handle = Handle("push")
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, k.size])):
            # Every shard hears from the worker, even with no keys for it: in round mode the
            # shard counts the worker's batch in the round's average.
            fields = {"step": step, "version": self.shards[i].version, "batch": batch,
                      "scale": float(scale)}
            if round_size:
                fields["round_size"] = round_size
            msg = Message("push_sparse", fields, [k[a:b], v[a:b]])
            handle.parts.append((i, self.requests.send(i, msg), slice(a, b)))
        return handle

    def push_sparse(self, keys, values, *, step: int, batch: int, scale: float = 1.0,
                    round_size: int = 0) -> int:
        return self.wait(self.push_sparse_async(keys, values, step=step, batch=batch, scale=scale,
                                                round_size=round_size))

    def pull_async(self, keys: KeyRange | tuple[int, int] | None = None,
                   out: np.ndarray | None = None, min_version: int = 0) -> Handle:
        """Ask for a key range (default: all); servers answer once they reach `min_version`."""
        r = self._full(keys)
        if out is None:
            out = np.empty(r.size, dtype=self.dtype)
        elif out.size != r.size or out.dtype != self.dtype:
            raise ValueError(f"out must hold {r.size} values of {self.dtype}")
        handle = Handle("pull", out=out)
        for i, p, sl in self._pieces(r):
            fields = {"range": [p.lo, p.hi], "min_version": min_version}
            handle.parts.append((i, self.requests.send(i, Message("pull", fields)), sl))
        return handle

    def pull(self, keys=None, out: np.ndarray | None = None, min_version: int = 0) -> np.ndarray:
        """Blocking pull; returns the values (written into `out` when given)."""
        return self.wait(self.pull_async(keys, out, min_version))

    def pull_keys(self, keys, min_version: int = 0) -> np.ndarray:
        """Values of arbitrary keys, in the order given."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        owner = np.searchsorted(self._starts, k, side="right") - 1
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"keys must lie in [0, {self.num_keys})")
        handle = Handle("pull_keys", out=np.empty(k.size, dtype=self.dtype))
        for i in np.unique(owner):
            idx = np.flatnonzero(owner == i)
            msg = Message("pull_keys", {"min_version": min_version}, [np.ascontiguousarray(k[idx])])
            handle.parts.append((int(i), self.requests.send(int(i), msg), idx))
        return self.wait(handle)

    def wait(self, handle: Handle):
        """Finish an async request: a push returns its max staleness, a pull its values."""
        if handle.done:
            return handle.result
        replies = self.requests.collect(handle.parts, handle.kind)
        if handle.kind == "push":
            handle.result = max((m.get("staleness", 0) for m in replies.values()), default=0)
        else:
            for shard, rid, sl in handle.parts:
                reply = replies[rid]
                handle.out[sl] = reply.arrays[0]
                self.shards[shard].version = reply["version"]
                reply.arrays = []
                self.requests.let_go(rid)  # the server may overwrite those values now
            handle.result = handle.out
        handle.done = True
        return handle.result

    def borrow(self, handle: Handle) -> tuple[np.ndarray, int | None]:
        """Finish a pull without copying: (values read in place from the reply, loan). A reply
        from a server on this host lives in its shared arena, which the server does not
        write while lent: hand the loan back (give_back) as soon as the values are read.
        A pull answered by several shards is copied as by wait (loan None)."""
        if handle.done or len(handle.parts) != 1:
            return self.wait(handle), None
        shard, rid, _ = handle.parts[0]
        reply = self.requests.collect(handle.parts, handle.kind)[rid]
        self.shards[shard].version = reply["version"]
        handle.done, handle.result = True, reply.arrays[0]
        return handle.result, rid

    def give_back(self, loan: int | None) -> None:
        """The borrowed values are read: the server may write over them now."""
        if loan is not None:
            self.requests.let_go(loan)

    def abandon(self, handle: Handle) -> None:
        """Give up on an async request: its replies, now or later, are dropped (and frames
        of them that live in a server's arena released)."""
        self.requests.forget(rid for _, rid, _ in handle.parts)
        handle.done, handle.result = True, None

    @property
    def version(self) -> int:
        """The smallest shard version this worker has pulled."""
        return min(s.version for s in self.shards)

    def close(self) -> None:
        self._stop_beat.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        for s in self.shards:
            s.sock.close(0)
        self.coord.close(0)
        self.ctx.term()
        if self._shaped:
            shaping.install(None)

    def __enter__(self) -> "KVWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
