"""Keys a push says got no gradient (its `idle` runs), as an update rule that skips them sees.

torch's optimizers leave out a parameter whose grad is None: no step count, no decay, no moment
moves it. A worker's gradient here is a buffer that is never None, so a script that passes its
own torch optimizer names in each push the keys of the parameters no backward reached since its
zero_grad() (client/idle_params.py), and the shard's torch rule leaves them out of the step
(`UpdateRule.skips_idle`). Arrival mode: each push's own. A round (round mode, or an arrival
shard's lockstep round) is one step of the summed gradient, as DDP's: a key is left out only if
every push of the round that carried it said it was idle; one any worker used gets the round's
average, as DDP gives a parameter any rank used its averaged gradient. Pure: no I/O.
"""

from __future__ import annotations

from paramserver.core.keyspace import clip_runs, subtract_runs, union_runs


def local_idle(runs: list, lo: int, hi: int, base: int) -> list[tuple[int, int]]:
    """A push of keys [lo, hi)'s idle runs (global keys; the wire checked they are sorted,
    disjoint, lo < hi) in the shard's local keys (less `base`). A run outside the push's keys
    is refused: a chunk or range push carries only the part of the step's runs inside it."""
    if runs and (runs[0][0] < lo or runs[-1][1] > hi):
        raise ValueError(f"idle keys {list(runs[0])}..{list(runs[-1])} reach outside the "
                          f"push's keys [{lo}, {hi})")
    return clip_runs(runs, lo, hi, base)


class RoundIdle:
    """The open round's keys that some push said were idle and none used (local keys)."""

    __slots__ = ("idle", "used")

    def __init__(self) -> None:
        self.idle: list[tuple[int, int]] = []  # said idle by a push of the round
        self.used: list[tuple[int, int]] = []  # carried with a gradient by a push of it

    def add(self, index, idle: list | None) -> None:
        """A push of local keys `index` (a slice; a key tensor: a sparse push summed into the
        round, its span counted as used) joined the round, `idle` runs of them unused."""
        if isinstance(index, slice):
            start, stop = index.start, index.stop
        elif len(index):
            start, stop, idle = int(index.min()), int(index.max()) + 1, None
        else:
            return  # (a table's rows: no dense keys)
        used = self.used
        if not idle:
            # The usual push, of a shard whose keys a push of this round used already.
            if used and used[0][0] <= start and stop <= used[0][1]:
                return
            self.used = union_runs(used, [(start, stop)])
        else:
            self.idle = union_runs(self.idle, idle)
            self.used = union_runs(used, subtract_runs([(start, stop)], idle))

    def take(self) -> list[tuple[int, int]]:
        """The round's idle keys as it is applied; the next round starts empty."""
        out = subtract_runs(self.idle, self.used) if self.idle else []
        self.idle, self.used = [], []
        return out

    # ---- a new backup's copy of the open round (server/replication.py) ------------------------
    def state(self) -> dict:
        return {"idle": [list(r) for r in self.idle], "used": [list(r) for r in self.used]}

    def load(self, meta: dict | None) -> None:
        meta = meta or {}  # (a sync from a primary that kept none)
        self.idle = [(int(a), int(b)) for a, b in meta.get("idle", ())]
        self.used = [(int(a), int(b)) for a, b in meta.get("used", ())]
