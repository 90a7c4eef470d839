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
an async push is sent zero-copy: do not modify it before the handle is waited on. Sparse tables'
rows are `kv.rows` (client/rows.py).

KVWorker composes its parts, as ps-lite's KVWorker holds a Customer and a Van: WorkerCore (the
bookkeeping), CoordinatorSession (coordinator calls and heartbeats), ShardRequests (a DEALER per
shard), ShardMap (which shard holds which keys), DenseRequests and RowTables (the requests
made), and Completion (replies turned into results). In a job whose servers join and leave
(`--servers MIN:MAX`), key ranges move between servers while it runs: the client follows each
new shard map (heard in a release, a heartbeat answer or a server's `moved` refusal) at a quiet
point, and a request a server refused `moved` is sent again under the new map by wait().
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass

import numpy as np

from paramserver.client.completion import Completion
from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.client.dense import DenseRequests, as_array
from paramserver.client.links import ShardLinks
from paramserver.client.preflight import preflight
from paramserver.client.requests import ShardRequests
from paramserver.client.rows import RowTables
from paramserver.client.shard_map import Shard, ShardMap
from paramserver.client.streams import ChunkedRequests
from paramserver.client.session import CoordinatorSession
from paramserver.client.transport import (PayloadArea, offer_shared_memory, shape_link,
                                          shared_buffer, unshape)
from paramserver.compression.codec import Codec
from paramserver.core.keyspace import KeyRange
from paramserver.policies.base import Release
from paramserver.spec.job import JobSpec, Limits
from paramserver.spec.welcome import WorkerJob
from paramserver.transport import (
    connect_dealer, keep_freed_memory, new_context, security, terminate,
)
from paramserver.wire import Message

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
        # A chunk is one frame: under a max_message_bytes given smaller, chunks shrink to fit.
        given = limits.max_message_bytes
        cap = limits.chunk_bytes if given is None else given - security.CURVE_FRAME_BYTES
        return cls(job.num_keys, np.dtype(job.dtype),
                   tuple((s.rank, s.addr, s.lo, s.hi) for s in welcome.shards),
                   limits.retry_interval, limits.heartbeat_interval,
                   limits.coordinator_timeout, job.links, min(limits.chunk_bytes, cap),
                   limits.chunks_in_flight, min(limits.tcp_chunk_bytes, cap),
                   limits.tcp_chunks_in_flight)



    def chunking(self, core: WorkerCore, itemsize: int, shared: bool) -> None:
        """Chunks by shard: pieces above chunk_bytes go in chunks. Over TCP those are
        tcp_chunk_bytes, tcp_chunks_in_flight unanswered: smaller chunks pipeline (the shard
        adds one while the next is on the wire, the worker copies a pulled one while the next
        arrives). Through shared memory there is no transfer to overlap, so a worker that
        offered its shards the arena (every shard or none, `shared`) keeps chunk_bytes."""
        chunk = max(1, self.chunk_bytes // itemsize)
        if shared:
            core.chunking(chunk, self.chunks_in_flight)
        else:
            core.chunking(chunk, self.tcp_chunks_in_flight,
                          run=max(1, self.tcp_chunk_bytes // itemsize))


def _frame_limit(job: JobSpec, keys: int) -> int:
    """The largest frame a shard of `keys` keys takes (the server's bound, the same rule, less
    what CURVE wraps a frame in): in a job whose keys move between servers, the whole key
    space's."""
    return job.message_limit(None if job.elastic_servers else keys) - security.CURVE_FRAME_BYTES


class _Closed:
    """What a closed client's request parts become: any use says the client is closed,
    instead of ZeroMQ's 'Socket operation on non-socket' from deep in a send (and costs the
    open client's calls nothing)."""

    def __getattr__(self, name: str):
        raise RuntimeError("this client is closed (close() was called); join again with a new "
                           "KVWorker(address)")


_CLOSED = _Closed()


class KVWorker:
    """Client of one job: the KV API and the step protocol over its composed parts."""

    closed = False  # set by close(), which puts _CLOSED in its request parts' places

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
        self.core = core = WorkerCore()
        if reuse_memory:  # pull replies land in reused memory: see keep_freed_memory
            keep_freed_memory()
        self.ctx = new_context()
        self.session = CoordinatorSession(self.ctx, join, self.src, self.keys, core.next_rid,
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
        job, limits = self.spec.job, self.spec.job.limits
        self.num_keys, self.dtype = settings.num_keys, settings.dtype
        self._shaped = role == "worker" and shape_link(settings.links, self.rank)
        shards = [Shard(r, a, KeyRange(lo, hi),
                        connect_dealer(self.ctx, a, send_timeout=timeout, keys=self.keys,
                                       peer="server"))
                  for r, a, lo, hi in settings.shards]
        core.welcome(self.rank, [s.range for s in shards], self.num_keys)
        arrival = self.spec.apply_mode == "arrival"
        # With replicas, a dead primary's backup takes over once the coordinator has found it
        # silent for a heartbeat timeout, and this worker hears of it with its next beat.
        replicated = job.replicas > 1
        frame_limit = functools.partial(_frame_limit, job)
        # Live resharding (an elastic-servers job): the shard map followed and the newest one
        # heard of, switched to at a quiet point (see ShardMap.adopt).
        self.map = ShardMap(self.ctx, self.keys, shards, welcome.get("epoch", 0),
                            self.num_keys, self.session, core,
                            streams=lambda: self.chunked.active, frame_limit=frame_limit,
                            rechunk=lambda: settings.chunking(core, self.dtype.itemsize,
                                                              self.arena is not None),
                            timeout=lambda: self.timeout)
        # Waits on shards end once the coordinator or a shard is judged gone: a server counts
        # as gone when unreachable for a heartbeat timeout, or while dead servers may be
        # restarted at the same address, for as long as the coordinator waits for that.
        self.links = ShardLinks(list(shards), limits.heartbeat_timeout
                                if not job.restart_servers else
                                max(limits.heartbeat_timeout, limits.restart_timeout))
        if replicated:
            self.links.limit = 3 * limits.heartbeat_timeout
        self.session.servers = self.links
        self.requests = ShardRequests(
            list(shards), self.src, core, timeout, settings.retry_interval,
            limits.max_unacked_pushes, [frame_limit(s.range.size) for s in shards],
            check_peers=self.session.check_alive, came_back=self.links.came_back)
        self.map.bind(self.requests, self.links)
        self.chunked = ChunkedRequests(core, self.requests)
        if replicated:  # every wait's look at the shards follows a moved one first
            self.links.follow = self.map.follow_moves
        else:  # a wait's look at the shards switches to a newer shard map, when quiet
            self.links.follow = self.map.follow_layout
        self.requests.flight = self.session.flight  # one recorder for the whole client
        # (Replicated shards move, and so do key ranges in an elastic-servers job: an arena
        # offered to one server would not follow its keys.)
        # Room for the gradient buffer (shared_buffer) and a push's codec payload, which is
        # never larger than float32 values (PayloadArea); pages are backed once touched.
        self.arena = offer_shared_memory(
            self.shards, self.num_keys * (self.dtype.itemsize + 4) + PAYLOAD_SLACK,
            False if replicated or job.elastic_servers else shared_memory)
        payload_area = PayloadArea(self.arena, self.num_keys * 4 + PAYLOAD_SLACK)
        settings.chunking(core, self.dtype.itemsize, self.arena is not None)
        self.completion = Completion(core, self.requests, self.chunked, self.map, arrival)
        self.dense = DenseRequests(core, self.requests, self.chunked, self.map, payload_area,
                                   self.dtype, self.num_keys, arrival)
        self.rows = RowTables(job.tables, core, self.requests, self.map, self.wait)
        if heartbeat:
            self.session.start_heartbeat(settings.heartbeat_interval,
                                         settings.coordinator_timeout)
        if role == "worker" and job.preflight:
            # Here, not in start(): the step loops time start() as step 0's wait.
            preflight(self.session, self.requests, self.shards, self.rank)

    @property
    def shards(self) -> list[Shard]:
        """The shards this client talks to now (rank order is key order; see ShardMap)."""
        return self.map.shards

    @property
    def timeout(self) -> float:
        """Seconds any request (to the coordinator or a shard) may wait for its answer."""
        return self.session.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.session.timeout = self.requests.timeout = seconds

    # ---- the KV API -----------------------------------------------------------------------------
    def init(self, values, keys: KeyRange | tuple[int, int] | None = None) -> bool:
        """Offer initial values; the first offer per shard wins. True if ours was taken."""
        return self.wait(self.dense.init(values, keys)) >= 0

    def push_async(self, values, keys: KeyRange | tuple[int, int] | None = None, *, step: int,
                   batch: int, scale: float = 1.0, round_size: int = 0, round_id: int = 0,
                   codec: Codec | None = None, sent: np.ndarray | None = None,
                   hyper: list | None = None, idle: list | None = None,
                   clip: list | None = None) -> Handle:
        """Send a dense gradient for a key range (default: all keys); returns at once.

        `round_size` (the release's): give it when this push is all the step sends; a shard
        counts it only from a piece that covers the shard. `round_id` (the release's): the
        lockstep round a shard applying on arrival sums this push into. `codec`
        (make_codec("bf16"), ...): each message's values go encoded and the shard adds what they
        decode to; the caller keeps any error feedback: `sent` (as many float32 as `values`), if
        given, receives what each message decodes to, i.e. what the shards add (the handle's
        `nbytes` says what went on the wire). Like `values`, `sent` is written until the handle
        is waited. With a codec, `values` (and `sent`) may be a torch tensor on a device: each
        message is encoded there and only its payload is copied to the host. `hyper`: a script's
        optimizer settings by group ([[group, {name: value}], ...]) once its schedule changed
        them; every shard takes them before this push. `idle`: sorted, disjoint key ranges
        [[lo, hi], ...] of `keys` that got no gradient this step (a script's parameters no
        backward reached): a torch rule on the servers leaves them out of its step. `clip`
        (round mode): [max_norm, norm_type] (core/clipping.py's wire form), the round's
        average clipped by its norm over every shard; every contributor must ask the same."""
        return self.dense.push(values, keys, step=step, batch=batch, scale=scale,
                               round_size=round_size, round_id=round_id, codec=codec, sent=sent,
                               hyper=hyper, idle=idle, clip=clip)

    def push(self, values, keys=None, *, step: int, batch: int, scale: float = 1.0,
             round_size: int = 0, round_id: int = 0, codec: Codec | None = None,
             hyper: list | None = None, idle: list | None = None,
             clip: list | None = None) -> int:
        """Dense push; blocks until every shard acknowledged. Returns the largest staleness seen."""
        return self.wait(self.push_async(values, keys, step=step, batch=batch, scale=scale,
                                         round_size=round_size, round_id=round_id, codec=codec,
                                         hyper=hyper, idle=idle, clip=clip))

    def push_sparse_async(self, keys, values, *, step: int, batch: int,
                          scale: float = 1.0, round_size: int = 0, round_id: int = 0,
                          codec: Codec | None = None, sent: np.ndarray | None = None
                          ) -> Handle:
        """Send (keys, values) pairs; repeated keys add up on the server. With `codec` each
        shard's values go encoded (each shard's slice on its own: a compressor's decoded values
        re-encode to themselves under an elementwise cast; a block codec may round again);
        `sent` (as many float32 as `values`), if given, receives what each value decodes to,
        i.e. what the shards add, in the caller's order."""
        return self.dense.push_sparse(keys, values, step=step, batch=batch, scale=scale,
                                      round_size=round_size, round_id=round_id, codec=codec,
                                      sent=sent)

    def push_sparse(self, keys, values, *, step: int, batch: int, scale: float = 1.0,
                    round_size: int = 0, round_id: int = 0, codec: Codec | None = None) -> int:
        return self.wait(self.push_sparse_async(keys, values, step=step, batch=batch, scale=scale,
                                                round_size=round_size, round_id=round_id,
                                                codec=codec))

    def pull_async(self, keys: KeyRange | tuple[int, int] | None = None,
                   out: np.ndarray | None = None, min_version: int = 0, *,
                   delta: Codec | None = None, ref: bool = False) -> Handle:
        """Ask for a key range (default: all); servers answer once they reach `min_version`.

        Compressed pulls (float32 jobs; `out` is the worker's copy, kept between pulls): with
        `ref` the pull is dense and each shard remembers it as what this worker holds; with
        `delta` (a codec) a shard sends the change since, encoded, which is added into `out`
        (a shard that remembers nothing of the range answers dense). Pull with `ref` every so
        often: between, `out` differs from the shard by the last delta's coding error."""
        return self.dense.pull(keys, out, min_version, delta=delta, ref=ref)

    def pull(self, keys=None, out: np.ndarray | None = None, min_version: int = 0, *,
             delta: Codec | None = None, ref: bool = False) -> np.ndarray:
        """Blocking pull; returns the values (written into `out` when given; without `out`, one
        shard's reply that came through the socket is returned as it came, uncopied)."""
        return self.wait(self.pull_async(keys, out, min_version, delta=delta, ref=ref))

    def pull_keys(self, keys, min_version: int = 0) -> np.ndarray:
        """Values of arbitrary keys, in the order given."""
        return self.wait(self.dense.pull_keys(keys, min_version))

    def push_step_async(self, dense=None, rows: dict | None = None, *, step: int, batch: int,
                        scale: float = 1.0, round_size: int = 0,
                        round_id: int = 0) -> Handle:
        """Everything one step pushes: the dense gradient (all keys, in chunks when a shard's
        piece is above the chunk size) and {table: (keys, grads)}; one handle for all of it.
        In round mode (`round_size`) every shard hears once per table and once per dense
        message, and each message says how many that is (`parts`), so a shard applies the
        round only once every contributor's values and rows are in."""
        self.map.before_request()
        rows = rows or {}
        for name in rows:
            self.rows.spec(name)  # before anything is sent
        fields = self.core.releases.push_fields(step, batch, scale, round_size, round_id)
        dense_msgs: dict[int, int] = {}  # dense messages by shard
        if dense is not None and self.num_keys > 0:
            arr = as_array(dense, self.dtype)
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
            handle.parts += self.rows.messages(name, keys, grads, fields, bool(round_size),
                                               parts)
        if dense_msgs:
            self.dense.send(handle, arr, pieces, stream, fields,
                            len(rows) if round_size else None)
        return handle

    def push_step(self, dense=None, rows: dict | None = None, *, step: int, batch: int,
                  scale: float = 1.0, round_size: int = 0, round_id: int = 0) -> int:
        """Blocking push_step_async; returns the largest staleness any shard saw."""
        return self.wait(self.push_step_async(dense, rows, step=step, batch=batch, scale=scale,
                                              round_size=round_size, round_id=round_id))

    def wait(self, handle: Handle):
        """Finish an async request: a push returns its max staleness, a pull its values.

        A request a server refused `moved` (live resharding: the shard map changed under it)
        is followed: the map it names adopted, a pull sent again whole, a push's or init's
        refused parts sent again under the new map; its result is then the whole request's."""
        if not isinstance(handle, Handle):
            raise TypeError(f"wait takes the Handle a push_async or pull_async returned; got "
                            f"{type(handle).__name__}")
        return self.completion.wait(handle)

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
        return self._take(reply)

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
        return self._take(reply)


    def _take(self, release: Message) -> Release:
        """A release taken: a newer shard map it names (live resharding: the coordinator
        switched maps while every worker waited for its release) is switched to now, or,
        with a pull sent ahead still in flight, before the next request."""
        self.core.releases.released(self.core.rank, release)
        if "layout" in release.fields:
            self.map.released(release.get("epoch"), release["layout"])
        return self.core.releases.take()

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
        return self.core.releases.drawn

    def report(self, record: dict) -> None:
        """Send one metrics record (a flat dict) to the coordinator's metrics log."""
        self.session.report(record)

    def bye(self, reason: str = "done") -> None:
        self.session.bye(reason)
        self.left = reason

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.session.close()
        self.links.close()  # monitors too: an open one would keep the context from ending
        terminate(self.ctx, [s.sock for s in self.shards])
        if self.arena is not None:  # the shards see it let go and unmap it
            self.arena.close()
        if self._shaped:
            unshape()
        self.session = self.requests = self.dense = self.rows = self.completion = _CLOSED

    def __enter__(self) -> "KVWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _launch_rank() -> int | None:
    """The worker's slot as `paramserver launch` (or torchrun) numbers it: $RANK, asked for as
    the job rank so that RANK, paramserver.rank() and the '[rank i]' prefix agree."""
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None
