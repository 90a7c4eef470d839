"""Pulls that wait for a version: kept until the shard reaches it or their deadline passes."""

from __future__ import annotations

import heapq
from itertools import count

from paramserver.server.events import Pull

# The waiting pulls a client may have at one shard unless the settings say otherwise: a
# training step keeps one or two, a chunked pull a window of chunks.
MAX_PER_CLIENT = 1024


class TooManyPulls(ValueError):
    """A client asked for more waiting pulls than it may have at once."""


class PendingPulls:
    """Waiting pulls, each with the time (event time) at which it gives up.

    A waiting pull costs nothing until its version comes or its deadline passes: pulls sit in
    two heaps, by version and by deadline, and a new version or a clock tick pops only the
    pulls it concerns (an entry of a pull already answered or expired is skipped when it comes
    up). A retried pull (an equal reply token) finds its first place through a dict. Each
    client (the `client` of a Pull, the node's peer identity) may have at most `per_client`
    waiting at once: more are refused, so a flood of pulls is bounded in memory and never in
    the work each push does.
    """

    def __init__(self, per_client: int = MAX_PER_CLIENT):
        if per_client < 1:
            raise ValueError("per_client must be at least 1")
        self.per_client = per_client
        self._pulls: dict = {}  # reply token -> (seq, pull), while it waits
        self._by_version: list = []  # (min_version, seq, token)
        self._by_deadline: list = []  # (deadline, seq, token)
        self._clients: dict = {}  # client -> pulls it has waiting
        self._seq = count()

    def __len__(self) -> int:
        return len(self._pulls)

    @property
    def next_deadline(self) -> float:
        """The earliest deadline of a waiting pull (inf when none waits)."""
        heap, pulls = self._by_deadline, self._pulls
        while heap:
            deadline, seq, to = heap[0]
            entry = pulls.get(to)
            if entry is not None and entry[0] == seq:
                return deadline
            heapq.heappop(heap)  # answered before its deadline
        return float("inf")

    def waiting(self, client) -> int:
        """How many pulls `client` has waiting."""
        return self._clients.get(client, 0)

    def add(self, pull: Pull, deadline: float) -> bool:
        """Keep `pull` until `deadline`. A retry of a pull already waiting (an equal reply
        token) needs no second place: False, and the first one keeps its deadline. A client
        with `per_client` pulls waiting already is refused (TooManyPulls)."""
        if pull.to in self._pulls:
            return False
        client = pull.client
        have = self._clients.get(client, 0)
        if have >= self.per_client:
            raise TooManyPulls(f"{have} pulls of this client wait for a version already, at "
                               f"most {self.per_client} may: wait for some before sending more")
        seq = next(self._seq)
        if len(self._by_version) > 2 * len(self._pulls) + 64:
            self._compact()
        self._pulls[pull.to] = (seq, pull)
        self._clients[client] = have + 1
        heapq.heappush(self._by_version, (pull.min_version, seq, pull.to))
        heapq.heappush(self._by_deadline, (deadline, seq, pull.to))
        return True

    def reached(self, version: int) -> list[Pull]:
        """Remove and return, in arrival order, the pulls that `version` satisfies."""
        heap = self._by_version
        if not heap or heap[0][0] > version:
            return []
        ready = []
        while heap and heap[0][0] <= version:
            _, seq, to = heapq.heappop(heap)
            pull = self._take(to, seq)
            if pull is not None:
                ready.append((seq, pull))
        ready.sort(key=lambda sp: sp[0])
        return [p for _, p in ready]

    def expire(self, now: float) -> list[Pull]:
        """Remove and return, in arrival order, the pulls whose deadline is `now` or earlier."""
        heap, expired = self._by_deadline, []
        while heap and heap[0][0] <= now:
            _, seq, to = heapq.heappop(heap)
            pull = self._take(to, seq)
            if pull is not None:
                expired.append((seq, pull))
        if not self._pulls:  # nothing waits: drop what is left of answered pulls' entries
            self._by_version.clear()
            self._by_deadline.clear()
        expired.sort(key=lambda sp: sp[0])  # in arrival order, as reached()
        return [p for _, p in expired]

    def _compact(self) -> None:
        """Heaps rebuilt from the pulls still waiting: entries of pulls answered or expired
        otherwise stay until their version or deadline comes up."""
        live = [(seq, to, p) for to, (seq, p) in self._pulls.items()]
        self._by_version = [(p.min_version, seq, to) for seq, to, p in live]
        heapq.heapify(self._by_version)
        self._by_deadline = [e for e in self._by_deadline
                             if e[2] in self._pulls and self._pulls[e[2]][0] == e[1]]
        heapq.heapify(self._by_deadline)

    def _take(self, to, seq: int) -> Pull | None:
        """The pull of token `to` if the heap entry `seq` is still its own, now removed."""
        entry = self._pulls.get(to)
        if entry is None or entry[0] != seq:
            return None
        del self._pulls[to]
        pull = entry[1]
        left = self._clients[pull.client] - 1
        if left:
            self._clients[pull.client] = left
        else:
            del self._clients[pull.client]
        return pull
