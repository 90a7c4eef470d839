"""A client's chunked requests: a request too big for one message per shard goes as chunks,
a few in flight per shard, the next sent as each is answered (WorkerCore's Stream keeps the
chunks' bookkeeping; this object drives them over the sockets and owns the list of requests
with chunks unanswered). Several may be in flight at once: waiting on one takes the others'
replies as they come, so a pull that waits for a round another request's last chunk fills is
never stuck."""

from __future__ import annotations

from paramserver.client.core.worker_core import Chunk, Handle, WorkerCore
from paramserver.client.requests import Moved, ShardRequests
from paramserver.compression import payload
from paramserver.wire import Message


def take_values(handle: Handle, where, reply: Message) -> None:
    """A compressed pull's reply into its place in the worker's copy: a delta added, dense
    values copied (the shard's reference is now what the copy holds)."""
    out = handle.out[where]
    if "enc" in reply.fields:
        out += payload.unpack(reply.fields, reply.arrays, out.size)
        handle.nbytes += payload.frame_bytes(reply.arrays)
    else:
        out[:] = reply.arrays[0]
        handle.nbytes += reply.arrays[0].nbytes


class ChunkedRequests:
    def __init__(self, core: WorkerCore, requests: ShardRequests):
        self.core, self.requests = core, requests
        self.active: list[Handle] = []  # requests with chunks unanswered, in start order

    def start(self, handle: Handle, message) -> Handle:
        """Send the first chunks of a chunked request (`message(chunk)` makes each); the rest
        go from wait() as replies come in."""
        handle.message = message
        self.active.append(handle)
        self._send_ready(handle)
        return handle

    def replace(self, old: Handle, new: Handle) -> None:
        """`new` (the caller's handle, become the request sent again) stands for `old`."""
        for k, h in enumerate(self.active):
            if h is old:
                self.active[k] = new

    def _send_ready(self, handle: Handle) -> None:
        stream, send = handle.stream, self.requests.send
        for pos, chunk in stream.ready():
            stream.sent(pos, send(chunk.shard, handle.message(chunk)), chunk)

    def drive(self, target: Handle) -> None:
        """Take replies to chunks as they come, over every chunked request, sending the next
        chunks as room opens, until `target` is finished (a chunked one) or its chunks are
        answered and its one-message parts' replies all in (collected by the caller) or no
        chunk is unanswered."""
        core, requests = self.core, self.requests
        plain = [(shard, rid, None) for shard, rid, _ in target.parts]
        while not target.done:
            # Only replies still due are waited for: one already in would end every wait_any
            # at once, and the chunks' replies would never be read.
            plain = [p for p in plain if p[1] not in core.inbox]
            if (target.stream is None or target.stream.done) and not plain:
                return
            waiting = [(h, rid, chunk) for h in self.active
                       for rid, (_, chunk) in h.stream.waiting.items()]
            if not waiting:
                return
            try:
                requests.wait_any([(c.shard, rid, None) for _, rid, c in waiting] + plain,
                                  target.kind)
            except BaseException:
                for h in list(self.active):
                    self.end(h)
                    h.done = True
                raise
            for handle, rid, chunk in waiting:
                if rid not in core.inbox:
                    continue
                try:
                    reply = requests.collect([(chunk.shard, rid, None)], handle.kind)[rid]
                except Moved as moved:
                    self.end(handle)  # its other chunks are dropped
                    if handle is target:
                        raise
                    handle.moved = moved  # followed when it is waited on
                    continue
                except BaseException:
                    self.end(handle)
                    handle.done = True
                    raise
                handle.stream.answered(rid)
                self._take_chunk(handle, rid, chunk, reply)
                self._send_ready(handle)
                if handle.stream.done:
                    self._finish(handle)

    def _take_chunk(self, handle: Handle, rid: int, chunk: Chunk, reply: Message) -> None:
        seen = handle.stream.seen
        if handle.kind == "pull":
            if handle.delta:
                take_values(handle, chunk.out, reply)
            else:
                handle.out[chunk.out] = reply.arrays[0]
            reply.arrays = []
            self.requests.let_go(rid)  # copied: frames lent from the server's arena go back
            v = reply["version"]
            seen[chunk.shard] = min(seen.get(chunk.shard, v), v)
        else:
            s = reply.get("staleness", 0)
            seen[chunk.shard] = max(seen.get(chunk.shard, s), s) if handle.kind == "push" \
                else min(seen.get(chunk.shard, s), s)  # init: -1 if any chunk was ignored

    def _finish(self, handle: Handle) -> None:
        self.active.remove(handle)
        if handle.parts:  # one-message parts beside: wait() collects them and finishes it
            return
        seen = handle.stream.seen
        if handle.kind == "pull":
            # A shard's version is the oldest any chunk was read at (in arrival mode chunks
            # read later may be newer): later pushes count staleness from there.
            for shard, v in seen.items():
                self.core.versions[shard] = v
            handle.result = handle.out
        elif handle.kind == "push":
            handle.result = max(seen.values(), default=0)
        else:
            handle.result = min(seen.values(), default=0)
        handle.done = True

    def end(self, handle: Handle) -> None:
        """Drop a request's chunks (answered or not: their replies are forgotten)."""
        self.requests.forget(handle.stream.drop())
        if handle in self.active:
            self.active.remove(handle)
