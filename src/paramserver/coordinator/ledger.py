"""Which samples of each epoch went to whom: exactly-once per epoch while workers come and go.

With a fixed worker count each rank walks its own shard of the training set (data/base.py).
When ranks join and leave mid-epoch, shards would be skipped or walked twice, so an elastic
job's coordinator owns the epoch instead. Each epoch is one permutation of the training set
(the worker computes it from the job's seed and the epoch number: `data/ledger_sampler.py`);
the ledger hands out positions in it, as pieces (epoch, lo, hi), with each release:

- `lend(worker, n, step)`: the release's `n` positions: first what leavers gave back (oldest
  epoch first), then fresh ones from the newest epoch's cursor, a new epoch opening when it is
  done;
- `consume(worker, step)`: its clock of that step came (sent once its push was acknowledged),
  the step ran on them: they are seen. A clock of another step (a release the ledger never
  lent, e.g. one a restarted coordinator's predecessor sent) consumes nothing;
- `give_back(worker)`: it left (or died: declared dead once silent) without clocking its
  release: its pieces go back, once (they are no longer lent to it).

So every position of an epoch is lent to one worker at a time and consumed at most once, and
an epoch is complete (consumed == size) once all its pieces were consumed. Pure: no I/O, no
randomness (the permutation is the worker's, from the seed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paramserver.core.pieces import Piece




@dataclass
class EpochCount:
    """One epoch's positions: handed out so far (the cursor's share) and consumed."""

    consumed: int = 0
    completed: bool = False


@dataclass
class SampleLedger:
    """The ledger of a training set of `size` samples (see the module doc)."""

    size: int
    epoch: int = 0  # the newest epoch opened
    cursor: int = 0  # its next position never handed out
    free: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # given back
    lent: dict[int, tuple[Piece, ...]] = field(default_factory=dict)  # worker -> its release's
    lent_step: dict[int, int] = field(default_factory=dict)  # worker -> that release's step
    epochs: dict[int, EpochCount] = field(default_factory=dict)

    def __post_init__(self):
        if not (isinstance(self.size, int) and self.size >= 1):
            raise ValueError(f"a sample ledger needs a training set of >= 1 sample, "
                             f"got {self.size!r}")
        self.epochs.setdefault(self.epoch, EpochCount())

    def lend(self, worker: int, n: int, step: int | None = None) -> tuple[Piece, ...]:
        """`n` positions for `worker`'s next step. A worker holds one release's pieces at a
        time: lending again before they were consumed or given back gives the old ones back
        first (a release replaced before it was used)."""
        if n < 0:
            raise ValueError(f"cannot lend {n} samples")
        if worker in self.lent:
            self.give_back(worker)
        pieces: list[Piece] = []
        need = n
        while need and self.free:
            epoch = min(self.free)
            ranges = self.free[epoch]
            lo, hi = ranges.pop()
            take = min(need, hi - lo)
            pieces.append(Piece(epoch, lo, lo + take))
            if lo + take < hi:
                ranges.append((lo + take, hi))
            if not ranges:
                del self.free[epoch]
            need -= take
        while need:
            if self.cursor == self.size:
                self.epoch += 1
                self.cursor = 0
                self.epochs[self.epoch] = EpochCount()
            take = min(need, self.size - self.cursor)
            pieces.append(Piece(self.epoch, self.cursor, self.cursor + take))
            self.cursor += take
            need -= take
        self.lent[worker] = out = tuple(pieces)
        if step is not None:
            self.lent_step[worker] = step
        return out

    def consume(self, worker: int, step: int | None = None) -> list[int]:
        """`worker` ran its step `step` on what it was lent for it; returns the epochs this
        completed. (None: whatever release it holds.)"""
        if step is not None and self.lent_step.get(worker, step) != step:
            return []  # not the step its pieces were lent for: they stay lent
        self.lent_step.pop(worker, None)
        done = []
        for p in self.lent.pop(worker, ()):
            count = self.epochs[p.epoch]
            count.consumed += p.size
            if count.consumed == self.size and not count.completed:
                count.completed = True
                done.append(p.epoch)
        return done

    def give_back(self, worker: int) -> int:
        """`worker` left without running its step: its positions go back; returns how many."""
        pieces = self.lent.pop(worker, ())
        self.lent_step.pop(worker, None)
        for p in pieces:
            if p.size:
                self.free.setdefault(p.epoch, []).append((p.lo, p.hi))
        return sum(p.size for p in pieces)

    # ---- checkpoints ----------------------------------------------------------------------------
    def to_state(self) -> dict:
        """JSON-ready, for the coordinator's part of a checkpoint. Positions lent then count as
        given back: the steps run on them after the checkpoint are lost with it on a resume."""
        free = [[e, lo, hi] for e, ranges in sorted(self.free.items()) for lo, hi in ranges]
        free += [p.to_wire() for pieces in self.lent.values() for p in pieces if p.size]
        return {"size": self.size, "epoch": self.epoch, "cursor": self.cursor, "free": free,
                "consumed": {str(e): c.consumed for e, c in self.epochs.items()}}

    @classmethod
    def from_state(cls, state: dict) -> "SampleLedger":
        ledger = cls(int(state["size"]), int(state["epoch"]), int(state["cursor"]))
        for item in state.get("free", ()):
            p = Piece.from_wire(item)
            ledger.free.setdefault(p.epoch, []).append((p.lo, p.hi))
        for epoch, consumed in state.get("consumed", {}).items():
            n = int(consumed)
            ledger.epochs[int(epoch)] = EpochCount(n, n == ledger.size)
        problem = ledger.inconsistency()
        if problem is not None:
            raise ValueError(f"the checkpoint's sample ledger does not add up: {problem}")
        return ledger

    def consumed(self, epoch: int) -> int:
        count = self.epochs.get(epoch)
        return 0 if count is None else count.consumed

    def check_invariants(self) -> None:
        """Per epoch: consumed + lent + free + (newest: not yet handed out) == size."""
        problem = self.inconsistency()
        assert problem is None, problem

    def inconsistency(self) -> str | None:
        """What contradicts the accounting (see check_invariants), or None."""
        held: dict[int, int] = {}
        for pieces in self.lent.values():
            for p in pieces:
                held[p.epoch] = held.get(p.epoch, 0) + p.size
        for epoch, ranges in self.free.items():
            held[epoch] = held.get(epoch, 0) + sum(hi - lo for lo, hi in ranges)
        for epoch, count in self.epochs.items():
            rest = self.size - self.cursor if epoch == self.epoch else 0
            total = count.consumed + held.get(epoch, 0) + rest
            if total != self.size:
                return f"epoch {epoch}: {total} positions accounted for of {self.size}"
            if count.completed != (count.consumed == self.size):
                return f"epoch {epoch}: marked complete with {count.consumed} seen"
        if set(held) - set(self.epochs):
            return f"positions of epochs never opened: {sorted(set(held) - set(self.epochs))}"
        return None
