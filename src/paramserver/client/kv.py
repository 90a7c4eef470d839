"""KVWorker: the worker-side client of the parameter server (push, pull, ranges, sparse, clock).

Usage::

    kv = KVWorker("tcp://127.0.0.1:5555")      # registers; kv.rank, kv.num_keys, kv.spec
    kv.init(initial_values)                      # rank 0 sets them; others' inits are ignored
    release = kv.start()                         # wait for the policy to release step 0
    params = kv.pull(min_version=release.min_version)
    kv.push(grad, step=release.step, batch=release.batch_size)
    release = kv.clock(release.step, batch=..., compute_time=...)
    kv.close()

Requests are sliced across shards and their replies reassembled. `push_async`/`pull_async`
return a Handle; `kv.wait(handle)` finishes it (like ps-lite's timestamps). A buffer passed to
an async push is sent zero-copy: do not modify it before the handle is waited on.

In a job whose servers join and leave (`--servers MIN:MAX`), key ranges move between servers
while it runs: the client follows each new shard map (heard in a release, a heartbeat answer or
a server's `moved` refusal) at a quiet point, and a request a server refused `moved` is sent
again under the new map by wait() (see adopt and _follow_moved).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass

import numpy as np

from paramserver.client.core import Chunk, Handle, Stream, WorkerCore
from paramserver.client.links import ShardLinks
from paramserver.client.requests import Moved, ShardRequests
from paramserver.client.shard_map import Shard, ShardMap
from paramserver.client.streams import ChunkedRequests, take_values
from paramserver.client.session import CoordinatorSession
from paramserver.client.transport import (PayloadArea, offer_shared_memory, shape_link,
                                          shared_buffer, unshape)
from paramserver.compression import payload
from paramserver.compression.codec import Codec
from paramserver.core.keyspace import KeyRange
from paramserver.net.rpc import RemoteError
from paramserver.observe.preflight import LinkProbe, probe_link
from paramserver.policies.base import Release
from paramserver.sparse.placement import shard_of
from paramserver.spec.job import Limits, TableSpec
from paramserver.spec.welcome import WorkerJob
from paramserver.transport import (
    connect_dealer, keep_freed_memory, new_context, security, terminate,
)
from paramserver.wire import Message
from paramserver.wire.protocol import MAX_KEYS_PER_REQUEST

log = logging.getLogger(__name__)
# The longest one preflight probe may wait for its shard (a dead one must not hold the start).
PROBE_TIMEOUT = 15.0
# Beyond a dense push's float32 bytes, a codec payload's per-block scales and alignment.
PAYLOAD_SLACK = 1 << 20

# Handle is the core's and Release the policies' (one type): callers import them here too.
__all__ = ["Handle", "KVWorker", "Release"]


@dataclass(frozen=True)
class WorkerSettings:
    """What the client takes from the WorkerJob of its welcome."""

    num_keys: int
    dtype: np.dtype
    shards: tuple[tuple[int, str, int, int], ...]  # (rank, address, lo, hi)
    retry_interval: float  # seconds without an answer before a request is sent again
    heartbeat_interval: float
    coordinator_timeout: float
    links: object  # the job's link table (paramserver.emulation.links.LinkTable)
    chunk_bytes: int = Limits.chunk_bytes  # larger pieces of a request go as chunks
    chunks_in_flight: int = Limits.chunks_in_flight  # unanswered chunks per shard
    tcp_chunk_bytes: int = Limits.tcp_chunk_bytes  # the same for a shard reached over TCP
    tcp_chunks_in_flight: int = Limits.tcp_chunks_in_flight

    @classmethod
    def of(cls, welcome: WorkerJob) -> "WorkerSettings":
        job, limits = welcome.job, welcome.job.limits
        return cls(job.num_keys, np.dtype(job.dtype),
                   tuple((s.rank, s.addr, s.lo, s.hi) for s in welcome.shards),
                   limits.retry_interval, limits.heartbeat_interval,
                   limits.coordinator_timeout, job.links, limits.chunk_bytes,
                   limits.chunks_in_flight, limits.tcp_chunk_bytes, limits.tcp_chunks_in_flight)


def _as_array(values, dtype: np.dtype) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.dtype != dtype:
        raise ValueError(f"values have dtype {arr.dtype}; this job's parameters are {dtype}")
    return np.ascontiguousarray(arr.reshape(-1))


def _push_values(values, dtype: np.dtype, codec: Codec | None):
    """A dense push's values: numpy, or with a codec a torch tensor kept where it is (a
    device's gradient is encoded there, and only the payload crosses to the host)."""
    if codec is not None and hasattr(values, "detach"):
        v = values.detach()
        if v.dim() != 1 or str(v.dtype) != "torch.float32":
            raise ValueError(f"values must be a 1-D float32 tensor with a codec; got "
                             f"{v.dim()}-D {v.dtype}")
        if dtype != np.float32:
            raise ValueError(f"values have dtype float32; this job's parameters are {dtype}")
        return v.contiguous()
    return _as_array(values, dtype)


def _check_codec(codec: Codec | None, values) -> Codec | None:
    if codec is None:
        return None
    if not isinstance(codec, Codec):
        raise ValueError(f"codec must be a Codec (make_codec(name)); got {codec!r}")
    if np.dtype(str(values.dtype).removeprefix("torch.")) != np.float32:
        raise ValueError(f"codec {codec.name!r} takes float32 values; this job's are "
                         f"{values.dtype}")
    return codec


def _part(codec: Codec | None, sl: slice) -> Codec | None:
    """The codec of one message's slice of a push (a `mixed` codec's runs are the whole
    vector's; others are the same codec)."""
    return None if codec is None else codec.part(sl.start, sl.stop)


def _values_message(handle: Handle, fields: dict, values: np.ndarray,
                    codec: Codec | None, sent: np.ndarray | None = None,
                    place=None) -> Message:
    """A dense push of `values` (encoded by `codec` when given), counted in handle.nbytes;
    `sent` receives what the encoded values decode to; `place(handle, frames)` puts the
    payload's frames where they go by reference (PayloadArea)."""
    if codec is None:
        handle.nbytes += values.nbytes
        return Message("push", fields, [values])
    if sent is None:
        enc = codec.encode(values)
    else:
        enc, sent[:] = codec.encode_decoded(values)
    enc_fields, frames = payload.as_fields(codec, enc)
    fields.update(enc_fields)
    handle.nbytes += payload.frame_bytes(frames)
    return Message("push", fields, frames if place is None else place(handle, frames))


def _as_keys(keys) -> np.ndarray:
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


class KVWorker:
    """Client of one job. It composes a WorkerCore (the bookkeeping), a CoordinatorSession
    (coordinator calls and heartbeats) and ShardRequests (a DEALER per shard)."""

    def __init__(self, join: str, *, timeout: float = 120.0,
                 release_timeout: float = Limits.release_timeout,
                 heartbeat: bool = True, src: str | None = None, role: str = "worker",
                 num_keys: int | None = None, shared_memory: bool | None = None,
                 keys: security.Keys | None = None, reuse_memory: bool = True,
                 layout: dict | None = None, optimizer: dict | None = None):
        self.src = src or f"w-{os.getpid()}-{secrets.token_hex(3)}"
        # A user's script started by `paramserver launch` finds the job's keys in the environment.
        self.keys = keys if keys is not None else security.from_env(role)
        self.join = join
        self.core = WorkerCore()
        if reuse_memory:  # pull replies land in reused memory: see keep_freed_memory
            keep_freed_memory()
        self.ctx = new_context()
        self.session = CoordinatorSession(self.ctx, join, self.src, self.keys, self.core.next_rid,
                                          timeout, release_timeout)
        # An "observer" (an evaluator) reads parameters but is no member of the sync policy.
        # `num_keys` tells a job started without a model (`paramserver launch`) its key space.
        # `layout` (core.layout's wire form): the coordinator refuses a model unlike the job's;
        # `optimizer` (an OptimizerSpec's wire form): a script's torch optimizer, likewise.
        welcome = self.session.register(role, num_keys, want_rank=_launch_rank(), layout=layout,
                                        optimizer=optimizer)
        self.rank: int = welcome["rank"]
        self.left: str | None = None  # why this worker left the job (bye or leave), once it has
        self.job: dict = welcome["job"]  # the welcome's job as it came (user scripts read it)
        self.spec: WorkerJob = WorkerJob.from_dict(self.job)  # parsed once, typed
        settings = WorkerSettings.of(self.spec)
        self.num_keys, self.dtype = settings.num_keys, settings.dtype
        self._shaped = role == "worker" and shape_link(settings.links, self.rank)
        shards = [Shard(r, a, KeyRange(lo, hi),
                        connect_dealer(self.ctx, a, send_timeout=timeout, keys=self.keys,
                                       peer="server"))
                  for r, a, lo, hi in settings.shards]
        self.core.welcome(self.rank, [s.range for s in shards], self.num_keys)
        self._arrival = self.spec.apply_mode == "arrival"
        # Waits on shards end once the coordinator or a shard is judged gone: a server counts
        # as gone when unreachable for a heartbeat timeout, or while dead servers may be
        # restarted at the same address, for as long as the coordinator waits for that.
        limits = self.spec.job.limits
        # With replicas, a dead primary's backup takes over once the coordinator has found it
        # silent for a heartbeat timeout, and this worker hears of it with its next beat.
        self._replicated = self.spec.job.replicas > 1
        # Live resharding (an elastic-servers job): the shard map followed and the newest one
        # heard of, switched to at a quiet point (see adopt).
        self._elastic_servers = getattr(self.spec.job, "max_servers", 0) > 0
        self.map = ShardMap(self.ctx, self.keys, shards, welcome.get("epoch", 0),
                            self.num_keys, self.session, self.core,
                            streams=lambda: self.chunked.active, frame_limit=self._frame_limit,
                            rechunk=lambda: self._chunking(settings),
                            timeout=lambda: self.timeout)
        self.links = ShardLinks(list(shards), limits.heartbeat_timeout
                                if not self.spec.job.restart_servers else
                                max(limits.heartbeat_timeout, limits.restart_timeout))
        if self._replicated:
            self.links.limit = 3 * limits.heartbeat_timeout
        self.session.servers = self.links
        self.requests = ShardRequests(
            list(shards), self.src, self.core, timeout, settings.retry_interval,
            limits.max_unacked_pushes,
            [self._frame_limit(s.range.size) for s in shards],
            check_peers=self.session.check_alive)
        self.map.bind(self.requests, self.links)
        self.chunked = ChunkedRequests(self.core, self.requests)
        if self._replicated:  # every wait's look at the shards follows a moved one first
            self.links.follow = self.map.follow_moves
        else:  # a wait's look at the shards switches to a newer shard map, when quiet
            self.links.follow = self.map.follow_layout
        self.requests.flight = self.session.flight  # one recorder for the whole client
        self.tables: dict[str, TableSpec] = {t.name: t for t in self.spec.job.tables}
        # (Replicated shards move, and so do key ranges in an elastic-servers job: an arena
        # offered to one server would not follow its keys.)
        # Room for the gradient buffer (shared_buffer) and a push's codec payload, which is
        # never larger than float32 values (PayloadArea); pages are backed once touched.
        self.arena = offer_shared_memory(
            self.shards, self.num_keys * (self.dtype.itemsize + 4) + PAYLOAD_SLACK,
            False if self._replicated or self._elastic_servers else shared_memory)
        self.payload_area = PayloadArea(self.arena, self.num_keys * 4 + PAYLOAD_SLACK)
        self._chunking(settings)
        if heartbeat:
            self.session.start_heartbeat(settings.heartbeat_interval,
                                         settings.coordinator_timeout)
        if role == "worker" and self.spec.job.preflight:
            # Here, not in start(): the step loops time start() as step 0's wait.
            self._preflight()

    def _frame_limit(self, keys: int) -> int:
        """The largest frame a shard of `keys` keys takes (the server's bound, the same rule):
        in a job whose keys move between servers, the whole key space's."""
        job = self.spec.job
        return job.message_limit(None if getattr(job, "max_servers", 0) else keys)

    # ---- live resharding (the map itself: shard_map.py) ---------------------------------------
    def adopt(self, epoch: int, layout) -> bool:
        """Follow shard map `epoch`, `layout` [[rank, addr, lo, hi], ...] (rank order is key
        order), if it is newer than the one followed: at once when no request is in flight,
        else before the first request sent once none is. True if it is newer."""
        return self.map.adopt(epoch, layout)

    @property
    def shard_epoch(self) -> int:
        """The epoch of the shard map this client follows (live resharding)."""
        return self.map.epoch

    @property
    def shards(self) -> list[Shard]:
        """The shards this client talks to now (rank order is key order)."""
        return self.map.shards

    def _become(self, handle: Handle, new: Handle) -> None:
        """`handle` (the caller's) takes over `new`, the same request sent again."""
        nbytes = handle.nbytes
        vars(handle).update(vars(new))
        handle.nbytes += nbytes
        self.chunked.replace(new, handle)

    def _chunking(self, settings: WorkerSettings) -> None:
        """Chunks by shard: pieces above chunk_bytes go in chunks. Over TCP those are
        tcp_chunk_bytes, tcp_chunks_in_flight unanswered: smaller chunks pipeline (the shard
        adds one while the next is on the wire, the worker copies a pulled one while the next
        arrives). Through shared memory there is no transfer to overlap, so a worker that
        offered its shards the arena (every shard or none) keeps chunk_bytes."""
        itemsize = self.dtype.itemsize
        chunk = max(1, settings.chunk_bytes // itemsize)
        if self.arena is not None:
            self.core.chunking(chunk, settings.chunks_in_flight)
        else:
            self.core.chunking(chunk, settings.tcp_chunks_in_flight,
                               run=max(1, settings.tcp_chunk_bytes // itemsize))

    @property
    def timeout(self) -> float:
        """Seconds any request (to the coordinator or a shard) may wait for its answer."""
        return self.session.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.session.timeout = self.requests.timeout = seconds

    @property
    def release_timeout(self) -> float:
        """Seconds start() and clock() may wait for their release."""
        return self.session.release_timeout

    @release_timeout.setter
    def release_timeout(self, seconds: float) -> None:
        self.session.release_timeout = seconds

    # ---- the KV API -----------------------------------------------------------------------------
    def init(self, values, keys: KeyRange | tuple[int, int] | None = None) -> bool:
        """Offer initial values; the first offer per shard wins. True if ours was taken."""
        self.map.before_request()
        r = self.core.key_range(keys)
        arr = _as_array(values, self.dtype)
        pieces = self.core.pieces(r)
        stream = self.core.stream(r, pieces)
        if stream is not None:
            handle = self.chunked.start(Handle("init", stream=stream), lambda c: Message(
                "init", {"range": [c.keys.lo, c.keys.hi]}, [arr[c.out]]))
            return self.wait(handle) >= 0
        parts = [(i, self.requests.send(i, Message("init", {"range": [p.lo, p.hi]}, [arr[sl]])), sl)
                 for i, p, sl in pieces]
        return self.wait(Handle("init", parts=parts)) >= 0

    def push_async(self, values, keys: KeyRange | tuple[int, int] | None = None, *, step: int,
                   batch: int, scale: float = 1.0, round_size: int = 0,
                   codec: Codec | None = None, sent: np.ndarray | None = None,
                   hyper: list | None = None) -> Handle:
        """Send a dense gradient for a key range (default: all keys); returns at once.

        `round_size` (the release's): give it when this push is all the step sends; a shard
        counts it only from a piece that covers the shard. `codec` (make_codec("bf16"), ...):
        each message's values go encoded and the shard adds what they decode to; the caller
        keeps any error feedback: `sent` (as many float32 as `values`), if given, receives
        what each message decodes to, i.e. what the shards add (the handle's `nbytes` says
        what went on the wire). Like `values`, `sent` is written until the handle is waited.
        With a codec, `values` (and `sent`) may be a torch tensor on a device: each message is
        encoded there and only its payload is copied to the host. `hyper`: a script's optimizer
        settings by group ([[group, {name: value}], ...]) once its schedule changed them; every
        shard takes them before this push."""
        self.map.before_request()
        core = self.core
        r = core.key_range(keys)
        arr = _push_values(values, self.dtype, codec)
        if len(arr) != r.size:
            raise ValueError(f"{len(arr)} values for {r.size} keys")
        if sent is not None and (codec is None or tuple(sent.shape) != (len(arr),)
                                 or isinstance(sent, np.ndarray) != isinstance(arr, np.ndarray)
                                 or str(sent.dtype) not in ("float32", "torch.float32")):
            raise ValueError(f"sent must be {len(arr)} float32 values held as the values "
                             f"are (numpy, or a tensor on their device), given with a codec")
        pieces = core.pieces(r)
        fields = self._push_fields(step, batch, scale, round_size)
        if hyper is not None:
            fields["hyper"] = hyper
        return self._send_dense(Handle("push"), arr, pieces, core.stream(r, pieces), fields,
                                codec=_check_codec(codec, arr), sent=sent)

    def _send_dense(self, handle: Handle, arr: np.ndarray, pieces, stream: Stream | None,
                    fields: dict, beside: int | None = None,
                    codec: Codec | None = None, sent: np.ndarray | None = None) -> Handle:
        """The one place dense push messages are made: one per piece into `handle.parts`, or,
        with a `stream`, its chunks (the first now, the rest from wait()). `fields`: the step's
        (see _push_fields), handed over; `beside`: the step's other messages to each shard
        (its tables' rows, in round mode), so each message says in `parts` all the shard gets.
        A chunk always says its count (with nothing beside, one message needs no word).

        In arrival mode a shard applies each chunk as it comes and moves its version per chunk:
        chunk j says the version the worker pulled plus j, so the worker's own earlier chunks
        do not count as staleness; the push's staleness is the largest any chunk saw."""
        versions = self.core.versions
        place = None
        if codec is not None:  # its payload into the arena, to go by reference
            self.payload_area.claim(handle)
            place = self.payload_area.place
        if stream is None:
            send, last = self.requests.send, pieces[-1] if pieces else None
            for piece in pieces:
                i, p, sl = piece
                # `fields` is handed over: the last message takes it (the common push, one
                # shard's, builds one dict as it always did), the others a copy.
                f = fields if piece is last else fields.copy()
                f["range"], f["version"] = [p.lo, p.hi], versions[i]
                if beside is not None:
                    f["parts"] = 1 + beside
                handle.parts.append((i, send(i, _values_message(
                    handle, f, arr[sl], _part(codec, sl), None if sent is None else sent[sl],
                    place)), sl))
            return handle
        arrival, extra = self._arrival, beside or 0

        def message(c: Chunk) -> Message:
            f = {**fields, "range": [c.keys.lo, c.keys.hi],
                 "version": versions[c.shard] + (c.index if arrival else 0),
                 "parts": c.count + extra}
            return _values_message(handle, f, arr[c.out], _part(codec, c.out),
                                   None if sent is None else sent[c.out], place)
        handle.stream = stream
        return self.chunked.start(handle, message)

    def push(self, values, keys=None, *, step: int, batch: int, scale: float = 1.0,
             round_size: int = 0, codec: Codec | None = None, hyper: list | None = None) -> int:
        """Dense push; blocks until every shard acknowledged. Returns the largest staleness seen."""
        return self.wait(self.push_async(values, keys, step=step, batch=batch, scale=scale,
                                         round_size=round_size, codec=codec, hyper=hyper))

    def push_sparse_async(self, keys, values, *, step: int, batch: int,
                          scale: float = 1.0, round_size: int = 0,
                          codec: Codec | None = None, sent: np.ndarray | None = None
                          ) -> Handle:
        """Send (keys, values) pairs; repeated keys add up on the server. With `codec` each
        shard's values go encoded (each shard's slice on its own: a compressor's decoded values
        re-encode to themselves under an elementwise cast; a block codec may round again);
        `sent` (as many float32 as `values`), if given, receives what each value decodes to,
        i.e. what the shards add, in the caller's order."""
        self.map.before_request()
        k = np.ascontiguousarray(np.asarray(keys, dtype=np.int64).reshape(-1))
        v = _as_array(values, self.dtype)
        if k.size != v.size:
            raise ValueError(f"{k.size} keys but {v.size} values")
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"sparse keys must lie in [0, {self.num_keys})")
        order = None if k.size < 2 or np.all(k[1:] >= k[:-1]) else np.argsort(k, kind="stable")
        if order is not None:
            k, v = k[order], v[order]
        codec = _check_codec(codec, v)
        if sent is not None and (codec is None or sent.shape != (v.size,)
                                 or sent.dtype != np.float32):
            raise ValueError(f"sent must be {v.size} float32 values, given with a codec")
        decoded = None if sent is None else (sent if order is None else np.empty_like(sent))
        handle = Handle("push")
        if codec is not None:
            self.payload_area.claim(handle)
        for i, (a, b) in enumerate(self.core.sparse_cuts(k)):
            # Every shard hears from the worker, even with no keys for it: in round mode the
            # shard counts the worker's batch in the round's average.
            fields = {"step": step, "version": self.core.versions[i], "batch": batch,
                      "scale": float(scale)}
            if round_size:
                fields["round_size"] = round_size
            if codec is None:
                msg = Message("push_sparse", fields, [k[a:b], v[a:b]])
                handle.nbytes += k[a:b].nbytes + v[a:b].nbytes
            else:
                enc = codec.encode(v[a:b])
                if decoded is not None:
                    decoded[a:b] = codec.decode(enc, b - a)
                enc_fields, frames = payload.as_fields(codec, enc)
                fields.update(enc_fields)
                msg = Message("push_sparse", fields,
                              [k[a:b], *self.payload_area.place(handle, frames)])
                handle.nbytes += k[a:b].nbytes + payload.frame_bytes(frames)
            handle.parts.append((i, self.requests.send(i, msg), slice(a, b)))
        if decoded is not None and order is not None:
            sent[order] = decoded
        return handle

    def push_sparse(self, keys, values, *, step: int, batch: int, scale: float = 1.0,
                    round_size: int = 0, codec: Codec | None = None) -> int:
        return self.wait(self.push_sparse_async(keys, values, step=step, batch=batch, scale=scale,
                                                round_size=round_size, codec=codec))

    def pull_async(self, keys: KeyRange | tuple[int, int] | None = None,
                   out: np.ndarray | None = None, min_version: int = 0, *,
                   delta: Codec | None = None, ref: bool = False) -> Handle:
        """Ask for a key range (default: all); servers answer once they reach `min_version`.

        Compressed pulls (float32 jobs; `out` is the worker's copy, kept between pulls): with
        `ref` the pull is dense and each shard remembers it as what this worker holds; with
        `delta` (a codec) a shard sends the change since, encoded, which is added into `out`
        (a shard that remembers nothing of the range answers dense). Pull with `ref` every so
        often: between, `out` differs from the shard by the last delta's coding error."""
        self.map.before_request()
        if delta is not None or ref:
            return self._pull_refs(keys, out, min_version, delta)
        r = self.core.key_range(keys)
        ours = out is None
        if ours:
            out = np.empty(r.size, dtype=self.dtype)
        elif out.size != r.size or out.dtype != self.dtype:
            raise ValueError(f"out must hold {r.size} values of {self.dtype}")
        pieces = self.core.pieces(r)
        stream = self.core.stream(r, pieces)
        if stream is not None:
            handle = self.chunked.start(Handle("pull", out=out, stream=stream), lambda c: Message(
                "pull", {"range": [c.keys.lo, c.keys.hi], "min_version": min_version}))
        else:
            handle = Handle("pull", out=out, out_ours=ours)
            for i, p, sl in pieces:
                fields = {"range": [p.lo, p.hi], "min_version": min_version}
                handle.parts.append((i, self.requests.send(i, Message("pull", fields)), sl))
        # Refused `moved`: the same pull again under the new shard map, into the same out.
        handle.again = lambda: self.pull_async(r, out, min_version)
        return handle

    def _pull_refs(self, keys, out: np.ndarray | None, min_version: int,
                   codec: Codec | None) -> Handle:
        r = self.core.key_range(keys)
        if out is None or out.size != r.size or out.dtype != np.float32:
            raise ValueError(f"a compressed pull adds into the worker's copy: out must hold "
                             f"{r.size} float32 values")
        _check_codec(codec, out)
        if self.map.take_dense():  # a new map: what each shard thinks we hold starts again
            codec = None
        fields = {"ref": True} if codec is None else {
            "delta": {"name": codec.name, "opts": codec.options()}}
        pieces = self.core.pieces(r)
        stream = self.core.stream(r, pieces)
        if stream is not None:
            handle = self.chunked.start(Handle("pull", out=out, stream=stream, delta=True),
                                 lambda c: Message("pull", {"range": [c.keys.lo, c.keys.hi],
                                                            "min_version": min_version,
                                                            **fields}))
        else:
            handle = Handle("pull", out=out, delta=True)
            for i, p, sl in pieces:
                f = {"range": [p.lo, p.hi], "min_version": min_version, **fields}
                handle.parts.append((i, self.requests.send(i, Message("pull", f)), sl))
        # Refused `moved`: pulled again dense, which also resets what each shard of the new
        # map thinks this worker holds (the replies to the rest were dropped).
        handle.again = lambda: self.pull_async(r, out, min_version, ref=True)
        return handle

    def pull(self, keys=None, out: np.ndarray | None = None, min_version: int = 0, *,
             delta: Codec | None = None, ref: bool = False) -> np.ndarray:
        """Blocking pull; returns the values (written into `out` when given; without `out`, one
        shard's reply that came through the socket is returned as it came, uncopied)."""
        return self.wait(self.pull_async(keys, out, min_version, delta=delta, ref=ref))

    def pull_keys(self, keys, min_version: int = 0) -> np.ndarray:
        """Values of arbitrary keys, in the order given."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"keys must lie in [0, {self.num_keys})")
        return self.wait(self._pull_keys_async(k, np.empty(k.size, dtype=self.dtype),
                                               min_version))

    def _pull_keys_async(self, k: np.ndarray, out: np.ndarray, min_version: int) -> Handle:
        self.map.before_request()
        owner = self.core.owners(k)
        handle = Handle("pull_keys", out=out)
        for i in np.unique(owner):
            idx = np.flatnonzero(owner == i)
            msg = Message("pull_keys", {"min_version": min_version}, [np.ascontiguousarray(k[idx])])
            handle.parts.append((int(i), self.requests.send(int(i), msg), idx))
        handle.again = lambda: self._pull_keys_async(k, out, min_version)
        return handle

    # ---- sparse tables --------------------------------------------------------------------------
    # A key's rows live on shard shard_of(key): the same on every client. A push's duplicate
    # keys are sent as they are and summed by the shard's table (with the round's, in round
    # mode); a pull asks for each distinct key once and copies its row to every place the key
    # has in the request (Zipf batches repeat keys a lot: fewer bytes, less work on the shard).
    def _table(self, name: str) -> TableSpec:
        spec = self.tables.get(name)
        if spec is None:
            known = ", ".join(sorted(self.tables)) or "none"
            raise ValueError(f"unknown table {name!r} (this job's tables: {known})")
        return spec

    def _by_shard(self, keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(shard, positions in `keys`) for every shard, in shard order (maybe empty)."""
        owner = shard_of(keys, len(self.shards))
        order = np.argsort(owner, kind="stable")
        cuts = np.searchsorted(owner[order], np.arange(1, len(self.shards))).tolist()
        return list(enumerate(np.split(order, cuts)))

    def pull_rows_async(self, table: str, keys, min_version: int = 0) -> Handle:
        """Ask for the rows of `keys` (int64, duplicates allowed); finish with wait()."""
        self.map.before_request()
        spec = self._table(table)
        k = _as_keys(keys)
        expand = None
        if k.size > 1:
            uniq, inverse = np.unique(k, return_inverse=True)
            if uniq.size < k.size:
                k, expand = uniq, inverse
        handle = Handle("pull_rows", out=np.empty((k.size, spec.dim), dtype=np.float32),
                        expand=expand)
        for i, idx in self._by_shard(k):
            if idx.size:
                msg = Message("pull_rows", {"table": table, "min_version": min_version},
                              [k[idx]])
                handle.parts.append((i, self.requests.send(i, msg), idx))
        # Refused `moved` (servers joined or left): asked again, placed by the new count.
        handle.again = lambda: self.pull_rows_async(table, keys, min_version)
        if not handle.parts:
            handle.done, handle.result = True, handle.out  # no keys
        return handle

    def pull_rows(self, table: str, keys, min_version: int = 0) -> np.ndarray:
        """Rows of `keys`, float32 (len(keys), dim), in the order of `keys`; a key without a
        row yet reads as its initial row. Waits until the shards reach `min_version`."""
        return self.wait(self.pull_rows_async(table, keys, min_version))

    def _rows_messages(self, table: str, keys, grads, fields: dict, every_shard: bool,
                       parts: list[int] | None = None) -> list[tuple[int, int, slice]]:
        """Send a push_rows per shard with keys (every shard with `every_shard`: in round mode
        each shard counts the pusher's batch); `parts[i]`: the step's messages to shard i."""
        spec = self._table(table)
        k = _as_keys(keys)
        g = _as_grads(grads, k.size, spec.dim)
        sent = []
        for i, idx in self._by_shard(k):
            if not (idx.size or every_shard):
                continue
            f = {**fields, "table": table, "version": self.core.versions[i]}
            if parts is not None:
                f["parts"] = parts[i]
            msg = Message("push_rows", f, [k[idx], g[idx].reshape(-1)])
            sent.append((i, self.requests.send(i, msg), slice(0, 0)))
        return sent

    @staticmethod
    def _push_fields(step: int, batch: int, scale: float, round_size: int) -> dict:
        fields = {"step": step, "batch": batch, "scale": float(scale)}
        if round_size:
            fields["round_size"] = round_size
        return fields

    def push_rows_async(self, table: str, keys, grads, *, step: int, batch: int,
                        scale: float = 1.0, round_size: int = 0) -> Handle:
        """Send gradients (float32, (len(keys), dim)) for rows of `table`; returns at once.
        `round_size` (the release's): give it when these rows are all the step sends; a step
        that also pushes dense values or other tables' rows in round mode uses push_step, or
        the round may be applied before all of it is in."""
        self.map.before_request()
        handle = Handle("push")
        handle.parts = self._rows_messages(
            table, keys, grads, self._push_fields(step, batch, scale, round_size),
            every_shard=bool(round_size), parts=[1] * len(self.shards) if round_size else None)
        return handle

    def push_rows(self, table: str, keys, grads, *, step: int, batch: int, scale: float = 1.0,
                  round_size: int = 0) -> int:
        """Blocking push_rows_async; returns the largest staleness any shard saw."""
        return self.wait(self.push_rows_async(table, keys, grads, step=step, batch=batch,
                                              scale=scale, round_size=round_size))

    def push_step_async(self, dense=None, rows: dict | None = None, *, step: int, batch: int,
                        scale: float = 1.0, round_size: int = 0) -> Handle:
        """Everything one step pushes: the dense gradient (all keys, in chunks when a shard's
        piece is above the chunk size) and {table: (keys, grads)}; one handle for all of it.
        In round mode (`round_size`) every shard hears once per table and once per dense
        message, and each message says how many that is (`parts`), so a shard applies the
        round only once every contributor's values and rows are in."""
        self.map.before_request()
        rows = rows or {}
        for name in rows:
            self._table(name)  # before anything is sent
        fields = self._push_fields(step, batch, scale, round_size)
        dense_msgs: dict[int, int] = {}  # dense messages by shard
        if dense is not None and self.num_keys > 0:
            arr = _as_array(dense, self.dtype)
            if arr.size != self.num_keys:
                raise ValueError(f"{arr.size} values for {self.num_keys} keys")
            r = KeyRange(0, self.num_keys)
            pieces = self.core.pieces(r)
            stream = self.core.stream(r, pieces)
            dense_msgs = stream.counts if stream is not None else {i: 1 for i, _, _ in pieces}
        parts = ([dense_msgs.get(i, 0) + len(rows) for i in range(len(self.shards))]
                 if round_size else None)
        handle = Handle("push")
        # Rows first: in arrival mode the dense chunks advance the version, and rows sent
        # after them would count the step's own dense update as staleness.
        for name, (keys, grads) in rows.items():
            handle.parts += self._rows_messages(name, keys, grads, fields, bool(round_size),
                                                parts)
        if dense_msgs:
            self._send_dense(handle, arr, pieces, stream, fields,
                             len(rows) if round_size else None)
        return handle

    def push_step(self, dense=None, rows: dict | None = None, *, step: int, batch: int,
                  scale: float = 1.0, round_size: int = 0) -> int:
        """Blocking push_step_async; returns the largest staleness any shard saw."""
        return self.wait(self.push_step_async(dense, rows, step=step, batch=batch, scale=scale,
                                              round_size=round_size))

    def wait(self, handle: Handle):
        """Finish an async request: a push returns its max staleness, a pull its values.

        A request a server refused `moved` (live resharding: the shard map changed under it)
        is followed: the map it names adopted, a pull sent again whole, a push's or init's
        refused parts sent again under the new map; its result is then the whole request's."""
        since = None
        while True:
            try:
                if handle.moved is not None:
                    moved, handle.moved = handle.moved, None
                    raise moved
                return self._finish(handle)
            except Moved as moved:
                since = time.monotonic() if since is None else since
                again = self.map.follow_moved(handle, moved, since, self._arrival)
                if again is not None:
                    self._become(handle, again)

    def _finish(self, handle: Handle):
        if handle.done:
            return handle.result
        if handle.stream is not None or self.chunked.active:
            # Chunks of any request still to send go out as earlier ones are answered: a
            # pull may wait for a round that only another request's last chunk fills.
            self.chunked.drive(handle)
            if handle.done:
                return handle.result
        replies = self.requests.collect(handle.parts, handle.kind)
        if handle.kind == "push":
            return self.core.push_done(handle, replies)
        if handle.kind == "init":  # -1 from a shard that had its values already
            seen = [m.get("staleness", 0) for m in replies.values()]
            if handle.carried is not None:
                seen.append(handle.carried)
            handle.result, handle.done = min(seen, default=0), True
            return handle.result
        if handle.kind == "pull_rows":
            self.requests.give_back(self.core.rows_done(handle, replies))
            return handle.result
        if handle.delta:
            for shard, rid, where in handle.parts:
                take_values(handle, where, replies[rid])
                self.core.note_version(shard, rid, replies[rid]["version"])
                self.requests.let_go(rid)
            handle.done, handle.result = True, handle.out
            return handle.result
        # Copied out: the server may overwrite the values it lent now.
        self.requests.give_back(self.core.pull_done(handle, replies))
        return handle.result

    def borrow(self, handle: Handle) -> tuple[np.ndarray, int | None]:
        """Finish a pull without copying: (values read in place from the reply, loan). A reply
        from a server on this host lives in its shared arena, which the server does not
        write while lent: hand the loan back (give_back) as soon as the values are read.
        A pull answered by several shards is copied as by wait (loan None)."""
        if handle.done or len(handle.parts) != 1 or handle.stream is not None:
            return self.wait(handle), None
        _, rid, _ = handle.parts[0]
        try:
            reply = self.requests.collect(handle.parts, handle.kind)[rid]
        except Moved as moved:  # followed, and the pull sent again: wait for it as any
            handle.moved = moved
            return self.wait(handle), None
        return self.core.borrowed(handle, reply), rid

    def give_back(self, loan: int | None) -> None:
        """The borrowed values are read: the server may write over them now."""
        if loan is not None:
            self.requests.let_go(loan)

    def abandon(self, handle: Handle) -> None:
        """Give up on an async request: its replies, now or later, are dropped (and frames
        of them that live in a server's arena released)."""
        self.requests.forget(rid for _, rid, _ in handle.parts)
        if handle.stream is not None:
            self.chunked.end(handle)
        handle.done, handle.result = True, None

    @property
    def version(self) -> int:
        """The smallest shard version this worker has pulled."""
        return self.core.version

    def shared_buffer(self, count: int | None = None) -> np.ndarray:
        """A zeroed array of `count` values (default: one per key) for gradients: pushed from
        it, the bytes reach servers on this host through shared memory instead of the socket.
        Where that is unavailable (or the arena is used up) it is a plain array."""
        return shared_buffer(self.arena, self.num_keys if count is None else int(count),
                             self.dtype)

    # ---- the step protocol ----------------------------------------------------------------------
    def start(self, data_len: int | None = None) -> Release | None:
        """Tell the coordinator this worker is ready; blocks until the policy releases step 0.

        An observer's start returns None at once: it only marks it ready. `data_len`: the
        training set's size, which an elastic job's worker gives (its releases then name the
        samples to train on: `drawn`).
        """
        reply = self.session.start(data_len)
        if reply.op == "ok":
            return None
        self.core.released(reply)
        self._released(reply)
        return self.core.take_release()

    def preflight(self) -> list[LinkProbe]:
        """Probe the link to each shard, one after another (observe/preflight.py): round
        trip and a short burst's rate, through the same sockets and emulated link as pulls."""
        def roundtrip(shard: int):
            def timed(nbytes: int) -> float:
                began = time.perf_counter()
                rid = self.requests.send(shard, Message("probe", {"bytes": int(nbytes)}))
                self.requests.collect([(shard, rid, None)], "probe")
                took = time.perf_counter() - began
                self.requests.let_go(rid)
                return took
            return timed
        timeout, self.requests.timeout = self.requests.timeout, min(self.timeout,
                                                                    PROBE_TIMEOUT)
        try:
            return [probe_link(s.rank, roundtrip(i)) for i, s in enumerate(self.shards)]
        finally:
            self.requests.timeout = timeout

    def _preflight(self) -> None:
        """The start's preflight: probes sent to the coordinator for RUN/preflight.json. It
        never stops the job: a failed probe or an older coordinator is logged."""
        began = time.perf_counter()
        try:
            links = self.preflight()
            self.session.call(Message("preflight", {"links": [p.wire() for p in links]}),
                              self.timeout)
        except (TimeoutError, RemoteError, ValueError) as exc:
            log.warning("preflight of worker %s skipped: %s", self.rank, exc)
            return
        log.info("preflight of worker %s: %s in %.3f s", self.rank,
                 ", ".join(f"shard {p.shard} {p.rtt_s * 1e3:.2f} ms {p.rate / 1e6:.0f} mbit/s"
                           for p in links), time.perf_counter() - began)

    def clock(self, step: int, batch: int, compute_time: float, cpu_load: float | None = None,
              free_mem: float | None = None, record: dict | None = None,
              while_waiting=None) -> Release:
        """Report step `step` done (its pushes acknowledged); blocks until the next release.

        `record` (a flat dict) rides along into the job's metrics log at no extra round trip;
        `while_waiting()`, if given, runs once the clock is sent, before the wait for the
        release: work for the next step done while the round closes elsewhere.
        """
        fields = {"step": step, "batch": batch, "compute_time": float(compute_time)}
        if record:
            fields["record"] = record
        if cpu_load is not None:
            fields["cpu_load"] = float(cpu_load)
        if free_mem is not None:
            fields["free_mem"] = float(free_mem)
        reply = self.session.clock(fields, while_waiting)
        self.core.released(reply)
        self._released(reply)
        return self.core.take_release()

    def _released(self, release: Message) -> None:
        """A release names a newer shard map (live resharding: the coordinator switched maps
        while every worker waited for its release): switched to now, or, with a pull sent
        ahead still in flight, before the next request."""
        if "layout" in release.fields:
            self.map.released(release.get("epoch"), release["layout"])

    def leave(self, step: int, batch: int, compute_time: float, record: dict | None = None,
              reason: str = "preempted") -> None:
        """Report step `step` done and leave the job in one message (a preempted worker: its
        push is acknowledged, its step counts, nothing is rolled back); no bye after it."""
        fields = {"step": step, "batch": batch, "compute_time": float(compute_time)}
        if record:
            fields["record"] = record
        self.session.leave(fields, reason)
        self.left = reason

    @property
    def drawn(self) -> list | None:
        """The samples the last release names ([[epoch, lo, hi], ...]; elastic jobs), or None."""
        return self.core.drawn

    def status(self) -> dict:
        """The coordinator's view of the job (samples done, members, whether workers are done)."""
        return self.session.status()

    def report(self, record: dict) -> None:
        """Send one metrics record (a flat dict) to the coordinator's metrics log."""
        self.session.report(record)

    def bye(self, reason: str = "done") -> None:
        self.session.bye(reason)
        self.left = reason

    @contextlib.contextmanager
    def paused(self, reason: str = "evaluation"):
        """A legitimate pause in this worker's steps (its own evaluation, say): announced to
        the coordinator, whose stall detector then flags no hang or missing worker for it."""
        self.report({"kind": "pause", "reason": str(reason)[:64]})
        try:
            yield
        finally:
            self.report({"kind": "resume", "reason": str(reason)[:64]})

    def close(self) -> None:
        self.session.close()
        self.links.close()  # monitors too: an open one would keep the context from ending
        terminate(self.ctx, [s.sock for s in self.shards])
        if self.arena is not None:  # the shards see it let go and unmap it
            self.arena.close()
        if self._shaped:
            unshape()

    def __enter__(self) -> "KVWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _launch_rank() -> int | None:
    """The worker's slot as `paramserver launch` (or torchrun) numbers it: $RANK, asked for as
    the job rank so that RANK, paramserver.rank() and the '[rank i]' prefix agree."""
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None
