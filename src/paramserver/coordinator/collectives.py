"""Small collectives among the job's workers: Horovod's allreduce, allgather and broadcast of a
few numbers (a test metric's average, each rank's count), through the coordinator.

The gradients go through the servers; what a Horovod script still exchanges between ranks is
small and rare (once an epoch), so the coordinator gathers it: each worker sends its part of
the collective `name` and waits; once every worker that is training has sent its part, each
gets the result (allreduce: the element-wise sum and how many were summed; allgather: the parts
in rank order; broadcast: the root's). A worker that leaves is no longer waited for; a
collective not complete within `timeout` s is answered with an error naming the ranks it
waited for, so no script hangs on a rank that never calls it. Pure: times come in events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paramserver.coordinator.events import CollectiveAsked, Reply

KINDS = ("allreduce", "allgather", "broadcast")
MAX_VALUES = 65536  # numbers in one part: metrics, not tensors (those go to the servers)
MAX_OPEN = 64  # collectives in progress at once


@dataclass
class _Open:
    kind: str
    deadline: float
    parts: dict[int, tuple] = field(default_factory=dict)  # rank -> (reply token, values)
    root: int = 0


class Collectives:
    """The collectives part of `coord` (a CoordinatorState)."""

    def __init__(self, coord, timeout: float):
        self.coord = coord
        self.timeout = timeout
        self.open: dict[str, _Open] = {}

    def handlers(self) -> dict:
        return {CollectiveAsked: self.on_asked}

    def next_deadline(self) -> float | None:
        return min((c.deadline for c in self.open.values()), default=None)

    def on_asked(self, e: CollectiveAsked, out: list) -> None:
        member = self.coord.members.worker(e.src)  # (an unknown sender: refused)
        member.last_seen = e.now
        if not member.started:
            raise ValueError("collectives are among the workers that train: call them once "
                             "DistributedOptimizer has joined the job")
        if e.kind not in KINDS:
            raise ValueError(f"unknown collective {e.kind!r}; known: {', '.join(KINDS)}")
        if len(e.values) > MAX_VALUES or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in e.values):
            raise ValueError(f"a collective's part is at most {MAX_VALUES} numbers (metrics; "
                             f"tensors go through the servers)")
        c = self.open.get(e.name)
        if c is None:
            if len(self.open) >= MAX_OPEN:
                raise ValueError(f"{len(self.open)} collectives are in progress already")
            c = self.open[e.name] = _Open(e.kind, e.now + self.timeout, root=e.root)
        if c.kind != e.kind or c.root != e.root:
            raise ValueError(f"collective {e.name!r} is a {c.kind} (root {c.root}) on another "
                             f"rank; rank {member.rank} calls it as a {e.kind} (root {e.root})")
        c.parts[member.rank] = (e.to, list(e.values))
        self._maybe_done(e.name, out)

    def check(self, now: float, out: list) -> None:
        """A loop turn: collectives a departed worker completed, and those past their time."""
        for name in list(self.open):
            if self._maybe_done(name, out):
                continue
            c = self.open[name]
            if now >= c.deadline:
                missing = sorted(self._ranks() - set(c.parts))
                del self.open[name]
                msg = (f"{c.kind} {name!r}: ranks {missing} did not call it within "
                       f"{self.timeout:.0f} s (every rank must call each collective, in the "
                       f"same order)")
                for to, _ in c.parts.values():
                    out.append(Reply(to, "error", {"msg": msg, "code": "failed"}))

    def _ranks(self) -> set[int]:
        return {m.rank for m in self.coord.members.roster.workers.values() if m.started}

    def _maybe_done(self, name: str, out: list) -> bool:
        c = self.open[name]
        if not self._ranks() <= set(c.parts):
            return False
        del self.open[name]
        ranks = sorted(c.parts)
        if c.kind == "allreduce":
            lengths = {len(c.parts[r][1]) for r in ranks}
            if len(lengths) > 1:
                result = None
                msg = f"allreduce {name!r}: the ranks' tensors differ in size ({sorted(lengths)})"
            else:
                result = [sum(vals) for vals in zip(*(c.parts[r][1] for r in ranks))]
        elif c.kind == "allgather":
            result = [[r, c.parts[r][1]] for r in ranks]
        else:
            root = c.parts.get(c.root)
            result = None if root is None else root[1]
            msg = f"broadcast {name!r}: root rank {c.root} is not in the job"
        for to, _ in c.parts.values():
            if result is None:
                out.append(Reply(to, "error", {"msg": msg, "code": "refused"}))
            else:
                out.append(Reply(to, "collected", {"values": result, "count": len(ranks)}))
        return True
