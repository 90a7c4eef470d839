"""Server pulls that wait for a version: answered once the shard reaches it, else timed out."""

from __future__ import annotations

import time

from paramserver.net import rpc
from paramserver.wire import Message


class PendingPullsMixin:
    """Part of the ServerNode: shares its state (store, router, pending_pulls, pull_timeout)."""

    def _ready(self, msg: Message) -> bool:
        return self.store.initialized and self.store.version >= msg.get("min_version", 0)

    def _pull_or_wait(self, msg: Message, ident) -> None:
        if self._ready(msg):
            self._answer_pull(msg, ident)
        elif not any(i == ident and m.rid == msg.rid for _, i, m in self.pending_pulls):
            # (a retry of a pull that is already waiting needs no second place in the queue)
            self.pending_pulls.append((time.monotonic() + self.pull_timeout, ident, msg))

    def _answer_pull(self, msg: Message, ident) -> None:
        """Reply with the values. A range is sent straight from the store's buffer, no copy:
        the store gets the send's tracker and copies on write if it must change them earlier."""
        if msg.op == "pull":
            lo, hi = msg["range"]
            data = self.store.read(lo, hi, shared=True)
            fields = {"version": self.store.version, "range": [lo, hi]}
        else:
            data = self.store.read_keys(msg.arrays[0])  # gathered: already a private copy
            fields = {"version": self.store.version}
        reply = Message("values", fields, [data.numpy()], rid=msg.rid, src=self.src)
        tracker = rpc.send(self.router, reply, ident, track=msg.op == "pull")
        if tracker is not None:
            self.store.lend(tracker)

    def _serve_pulls(self) -> None:
        if not self.pending_pulls:
            return
        waiting = []
        for deadline, ident, msg in self.pending_pulls:
            if self._ready(msg):
                self._answer_pull(msg, ident)
            else:
                waiting.append((deadline, ident, msg))
        self.pending_pulls = waiting

    def _next_pull_deadline(self) -> float:
        return min((d for d, _, _ in self.pending_pulls), default=float("inf"))

    def _expire_pulls(self, now: float) -> None:
        expired = [p for p in self.pending_pulls if p[0] <= now]
        if not expired:
            return
        self.pending_pulls = [p for p in self.pending_pulls if p[0] > now]
        for _, ident, msg in expired:
            what = ("initial values" if not self.store.initialized
                    else f"version {msg.get('min_version', 0)} (at {self.store.version})")
            rpc.send(self.router, Message("error", {
                "msg": f"server {self.src} waited {self.pull_timeout:.0f} s for {what}",
                "code": "timeout"}, rid=msg.rid, src=self.src), ident)
