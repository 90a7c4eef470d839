"""The dense and key-list requests of the KV API, made and sent: init, push (dense, chunked or
one message per shard, encoded by a codec when given), sparse push of (key, value) pairs, and
pulls of a key range or of a list of keys. Each returns a Handle that Completion finishes; a
request refused `moved` carries `again`, the same request under the new shard map."""

from __future__ import annotations

import numpy as np

from paramserver.client.core.worker_core import Chunk, Handle, Stream, WorkerCore
from paramserver.client.requests import ShardRequests
from paramserver.client.shard_map import ShardMap
from paramserver.client.streams import ChunkedRequests
from paramserver.client.transport import PayloadArea
from paramserver.compression import payload
from paramserver.compression.codec import Codec
from paramserver.core.keyspace import KeyRange, clip_runs
from paramserver.wire import Message
from paramserver.wire.protocol import MAX_RUNS

def as_array(values, dtype: np.dtype) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.dtype != dtype:
        raise ValueError(f"values have dtype {arr.dtype}; this job's parameters are {dtype}")
    return np.ascontiguousarray(arr.reshape(-1))


def key_array(keys) -> np.ndarray:
    """Keys as a flat int64 array; keys of another kind are refused, not cast (1.5 would
    have named key 1)."""
    if hasattr(keys, "detach"):
        keys = keys.detach().cpu().numpy()
    k = np.asarray(keys)
    if k.size and k.dtype.kind not in "iu":
        raise ValueError(f"keys must be integers; got an array of {k.dtype}")
    return k.astype(np.int64, copy=False).reshape(-1)


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
    return as_array(values, dtype)


def check_codec(codec: Codec | None, values) -> Codec | None:
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


def checked_idle(idle, r: KeyRange) -> list[tuple[int, int]]:
    """A push's idle key runs: sorted, disjoint [lo, hi) with lo < hi, inside the push's keys
    `r` (what a shard refuses otherwise)."""
    runs, end = [], r.lo
    shape = (f"idle keys must be a list of sorted, disjoint [lo, hi] pairs of whole numbers "
             f"with lo < hi inside the pushed keys [{r.lo}, {r.hi})")
    if isinstance(idle, (str, bytes)) or not hasattr(idle, "__iter__"):
        raise ValueError(f"{shape}; got {idle!r}")
    for item in idle:
        try:
            lo, hi = item
        except (TypeError, ValueError):
            raise ValueError(f"{shape}; got the item {item!r}") from None
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                   for x in (lo, hi)):
            raise ValueError(f"{shape}; got the item {item!r}")
        lo, hi = int(lo), int(hi)
        if not end <= lo < hi <= r.hi:
            raise ValueError(f"{shape}; got {list(idle)[:4]}")
        runs.append((lo, hi))
        end = hi
    return runs


def _idle_field(fields: dict, idle: list, lo: int, hi: int) -> None:
    """One message of keys [lo, hi): the part of the push's idle runs inside them, if any."""
    part = clip_runs(idle, lo, hi)
    if len(part) > MAX_RUNS:
        raise ValueError(f"{len(part)} separate runs of keys [{lo}, {hi}) got no gradient this "
                         f"step; a push names at most {MAX_RUNS} to a shard")
    if part:
        fields["idle"] = part


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


class DenseRequests:
    """Builds the dense and key-list requests over the client's parts (its bookkeeping, shard
    sockets, chunk driver and shard map); holds nothing that changes but what those own."""

    def __init__(self, core: WorkerCore, requests: ShardRequests, chunked: ChunkedRequests,
                 shard_map: ShardMap, payload_area: PayloadArea, dtype: np.dtype,
                 num_keys: int, arrival: bool):
        self.core, self.requests, self.chunked, self.map = core, requests, chunked, shard_map
        self.payload_area, self.dtype, self.num_keys = payload_area, dtype, num_keys
        self.arrival = arrival  # a shard applies each chunk as it comes (arrival-mode policy)

    def init(self, values, keys: KeyRange | tuple[int, int] | None = None) -> Handle:
        """Offer initial values; the first offer per shard wins (the finished handle says
        -1 from a shard that had its values already)."""
        self.map.before_request()
        r = self.core.key_range(keys)
        arr = as_array(values, self.dtype)
        pieces = self.core.pieces(r)
        stream = self.core.stream(r, pieces)
        if stream is not None:
            return self.chunked.start(Handle("init", stream=stream), lambda c: Message(
                "init", {"range": [c.keys.lo, c.keys.hi]}, [arr[c.out]]))
        parts = [(i, self.requests.send(i, Message("init", {"range": [p.lo, p.hi]}, [arr[sl]])), sl)
                 for i, p, sl in pieces]
        return Handle("init", parts=parts)

    def push(self, values, keys: KeyRange | tuple[int, int] | None = None, *, step: int,
             batch: int, scale: float = 1.0, round_size: int = 0, round_id: int = 0,
             codec: Codec | None = None, sent: np.ndarray | None = None,
             hyper: list | None = None, idle: list | None = None,
             clip: list | None = None) -> Handle:
        """A dense push of a key range, sent at once (the arguments: KVWorker.push_async)."""
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
        fields = self.core.releases.push_fields(step, batch, scale, round_size, round_id)
        if hyper is not None:
            fields["hyper"] = hyper
        if clip is not None:
            fields["clip"] = clip
        if idle is not None:
            idle = checked_idle(idle, r)
        return self.send(Handle("push"), arr, pieces, core.stream(r, pieces), fields,
                         codec=check_codec(codec, arr), sent=sent, idle=idle)

    def send(self, handle: Handle, arr: np.ndarray, pieces, stream: Stream | None,
             fields: dict, beside: int | None = None, codec: Codec | None = None,
             sent: np.ndarray | None = None, idle: list | None = None) -> Handle:
        """The one place dense push messages are made: one per piece into `handle.parts`, or,
        with a `stream`, its chunks (the first now, the rest from wait()). `fields`: the step's
        (see Releases.push_fields), handed over; `beside`: the step's other messages to each shard
        (its tables' rows, in round mode), so each message says in `parts` all the shard gets.
        A chunk always says its count (with nothing beside, one message needs no word).
        `idle`: the push's key runs that got no gradient; each message carries those inside its
        own keys, and none when there are none.

        In arrival mode a shard applies each chunk as it comes and moves its version per chunk:
        chunk j says the version the worker pulled plus j, so the worker's own earlier chunks
        do not count as staleness; the push's staleness is the largest any chunk saw. (A
        lockstep round's chunks, `round_id`, are summed and move no version.)"""
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
                if idle is not None:
                    _idle_field(f, idle, p.lo, p.hi)
                handle.parts.append((i, send(i, _values_message(
                    handle, f, arr[sl], _part(codec, sl), None if sent is None else sent[sl],
                    place)), sl))
            return handle
        arrival, extra = self.arrival and "round_id" not in fields, beside or 0

        def message(c: Chunk) -> Message:
            f = {**fields, "range": [c.keys.lo, c.keys.hi],
                 "version": versions[c.shard] + (c.index if arrival else 0),
                 "parts": c.count + extra}
            if idle is not None:
                _idle_field(f, idle, c.keys.lo, c.keys.hi)
            return _values_message(handle, f, arr[c.out], _part(codec, c.out),
                                   None if sent is None else sent[c.out], place)
        handle.stream = stream
        return self.chunked.start(handle, message)

    def push_sparse(self, keys, values, *, step: int, batch: int,
                          scale: float = 1.0, round_size: int = 0, round_id: int = 0,
                          codec: Codec | None = None, sent: np.ndarray | None = None
                          ) -> Handle:
        """(keys, values) pairs, sent at once (the arguments: KVWorker.push_sparse_async)."""
        self.map.before_request()
        k = np.ascontiguousarray(key_array(keys))
        v = as_array(values, self.dtype)
        if k.size != v.size:
            raise ValueError(f"{k.size} keys but {v.size} values")
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"sparse keys must lie in [0, {self.num_keys})")
        order = None if k.size < 2 or np.all(k[1:] >= k[:-1]) else np.argsort(k, kind="stable")
        if order is not None:
            k, v = k[order], v[order]
        codec = check_codec(codec, v)
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
            fields = self.core.releases.push_fields(step, batch, scale, round_size, round_id)
            fields["version"] = self.core.versions[i]
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


    def pull(self, keys: KeyRange | tuple[int, int] | None = None,
                   out: np.ndarray | None = None, min_version: int = 0, *,
                   delta: Codec | None = None, ref: bool = False) -> Handle:
        """A pull of a key range, sent at once (the arguments: KVWorker.pull_async)."""
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
        handle.again = lambda: self.pull(r, out, min_version)
        return handle

    def _pull_refs(self, keys, out: np.ndarray | None, min_version: int,
                   codec: Codec | None) -> Handle:
        r = self.core.key_range(keys)
        if out is None or out.size != r.size or out.dtype != np.float32:
            raise ValueError(f"a compressed pull adds into the worker's copy: out must hold "
                             f"{r.size} float32 values")
        check_codec(codec, out)
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
        handle.again = lambda: self.pull(r, out, min_version, ref=True)
        return handle


    def pull_keys(self, keys, min_version: int = 0) -> Handle:
        """Values of arbitrary keys, in the order given."""
        k = key_array(keys)
        if k.size and (k.min() < 0 or k.max() >= self.num_keys):
            raise ValueError(f"keys must lie in [0, {self.num_keys})")
        return self._pull_keys(k, np.empty(k.size, dtype=self.dtype), min_version)

    def _pull_keys(self, k: np.ndarray, out: np.ndarray, min_version: int) -> Handle:
        self.map.before_request()
        owner = self.core.owners(k)
        handle = Handle("pull_keys", out=out)
        for i in np.unique(owner):
            idx = np.flatnonzero(owner == i)
            msg = Message("pull_keys", {"min_version": min_version}, [np.ascontiguousarray(k[idx])])
            handle.parts.append((int(i), self.requests.send(int(i), msg), idx))
        handle.again = lambda: self._pull_keys(k, out, min_version)
        return handle

    # ---- sparse tables --------------------------------------------------------------------------
    # A key's rows live on shard shard_of(key): the same on every client. A push's duplicate
    # keys are sent as they are and summed by the shard's table (with the round's, in round
    # mode); a pull asks for each distinct key once and copies its row to every place the key
    # has in the request (Zipf batches repeat keys a lot: fewer bytes, less work on the shard).
