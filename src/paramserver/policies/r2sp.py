"""R2SP: round-robin, evenly gapped permissions, so that workers do not all talk at once."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from paramserver.core.options import Configurable, check_int, check_range, opt
from paramserver.policies.base import (
    Decision, Joined, Left, Note, PolicyError, Pushed, Release, SyncPolicy,
)


@dataclass(frozen=True)
class R2SPOptions:
    gap_ratio: float = opt(0.8, "r: permissions at least r*T/N apart (T: iteration time EMA)")
    ema: float = opt(0.2, "weight of the newest push interval in the iteration-time EMA T")
    warmup: int = opt(10, "steps run unthrottled before the rotation starts")
    heterogeneous: bool = opt(False, "re-tune each worker's batch by its blocking time, "
                                     "scale its update by batch / base_batch")
    base_batch: int | None = opt(None, "batch of scale 1.0 (default: the job's batch size)")
    min_batch: int = opt(1, "heterogeneous mode: smallest batch")
    max_batch: int | None = opt(None, "heterogeneous mode: largest batch (default 4 x base)")
    strict: bool = opt(False, "also hold a permission until every worker that was computing "
                              "when the holder pushed has pushed: staleness <= N-1 always")

    def __post_init__(self):
        check_range("gap_ratio", self.gap_ratio, 0)
        check_range("ema", self.ema, 0, 1, lo_open=True)
        check_int("warmup", self.warmup, 0)
        check_int("min_batch", self.min_batch, 1)
        if self.base_batch is not None:
            check_int("base_batch", self.base_batch, 1)
        if self.max_batch is not None:
            check_int("max_batch", self.max_batch, self.min_batch)


class Rotation:
    """Active worker ids in ascending order; the turn passes to the next id, wrapping round."""

    def __init__(self):
        self.ids: list[int] = []
        self.turn: int | None = None

    def add(self, w: int) -> None:
        bisect.insort(self.ids, w)
        if self.turn is None:
            self.turn = w

    def remove(self, w: int) -> None:
        if self.turn == w:
            self.turn = self.after(w) if len(self.ids) > 1 else None
        self.ids.remove(w)

    def after(self, w: int) -> int:
        k = bisect.bisect_right(self.ids, w)
        return self.ids[k % len(self.ids)]

    def pass_turn(self) -> None:
        self.turn = self.after(self.turn)


class R2SP(SyncPolicy, Configurable):
    """Round-Robin Synchronous Parallel (gap ratio r).

    After its first `warmup` steps (counted on the first worker to get there) the job runs a
    rotation: a worker that pushed waits for its turn; turns go by ascending worker id,
    wrapping round, and each permission (a Release, whose `not_before` carries the spacing)
    comes no sooner than r*T/N after the previous one. T is an EMA of the iteration time,
    measured as the interval between a worker's consecutive pushes; N the active workers.

    Between two permissions of a worker every other worker gets at most one. Here a worker
    pushes as soon as its step is computed (before asking for its turn), so update staleness
    (versions applied between its read and its push) is <= N-1 when step times are steady,
    but a worker whose step outlasts a whole rotation can see another push twice: <= 2(N-1).
    `strict` restores <= N-1 always by holding a permission until everyone who read before
    the holder's push has pushed too; that serializes steady workers pairwise (about half
    the throughput in the driver), so it is off by default.

    Heterogeneous mode: worker i's update is scaled by batch_i / base_batch and its batch is
    re-tuned at each permission as b' = b + v_i * blocking_i (v_i = batch / compute time, in
    samples/s; blocking_i = the time it waited for the permission), clamped to
    [min_batch, max_batch]. As published the rule only grows batches: a worker that never
    waits keeps its batch.
    """

    name = "r2sp"
    apply_mode = "arrival"
    Options = R2SPOptions

    def __init__(self, batch_size: int, *, gap_ratio: float = 0.8, ema: float = 0.2,
                 warmup: int = 10, heterogeneous: bool = False, base_batch: int | None = None,
                 min_batch: int = 1, max_batch: int | None = None, strict: bool = False):
        super().__init__(batch_size)
        self.options = R2SPOptions(gap_ratio, ema, warmup, heterogeneous, base_batch,
                                   min_batch, max_batch, strict)
        self.base = base_batch or batch_size
        # Heterogeneous mode sizes each batch itself: an elastic job's batch rule leaves them.
        self.own_batches = heterogeneous
        self.max_batch = max_batch or max(4 * self.base, min_batch)
        self.rotation = Rotation()
        self.throttling = False
        self.iter_time: float | None = None  # T
        self.last_permit: float | None = None
        self.waiting: dict[int, tuple[int, float]] = {}  # worker -> (step to release, since)
        self.next_step: dict[int, int] = {}
        self.last_push: dict[int, float] = {}
        self.batch: dict[int, int] = {}
        self.speed: dict[int, float] = {}
        # Computing worker -> when it read (got its release). Permission times never decrease,
        # so insertion order is time order and the first entry is the oldest read.
        self.reading_since: dict[int, float] = {}

    def gap(self) -> float:
        """r * T / N: the least time between two permissions."""
        if self.iter_time is None or not self.rotation.ids:
            return 0.0
        return self.options.gap_ratio * self.iter_time / len(self.rotation.ids)

    def on_joined(self, event: Joined) -> list[Decision]:
        w = event.worker
        self.rotation.add(w)
        self.last_push.clear()  # (see on_left)
        self.next_step[w], self.batch[w] = 0, self._clamp(self.base)
        if not self.throttling:
            self.reading_since[w] = event.now
            return [self._release(w, 0)]
        self.waiting[w] = (0, event.now)  # a newcomer also waits for its turn
        return self._grant(event.now)

    def on_left(self, event: Left) -> list[Decision]:
        w = event.worker
        self.rotation.remove(w)  # passes the turn on if it was w's: nobody waits for the dead
        for table in (self.waiting, self.next_step, self.batch, self.speed,
                      self.reading_since):
            table.pop(w, None)
        # A membership change is no iteration: the others' next intervals span it (a dead
        # worker's turn held them a heartbeat timeout), and measured they would inflate T,
        # and the gap with it, for many rotations. Each worker's next push starts anew.
        self.last_push.clear()
        return self._grant(event.now)

    def on_pushed(self, event: Pushed) -> list[Decision]:
        w = event.worker
        if event.step != self.next_step[w] or w in self.waiting:
            raise PolicyError(f"worker {w} pushed step {event.step}, expected {self.next_step[w]}"
                              + (" (it is waiting)" if w in self.waiting else ""))
        self._measure(event)
        self.next_step[w] = event.step + 1
        self.reading_since.pop(w, None)
        out: list[Decision] = []
        if not self.throttling and event.step + 1 >= self.options.warmup:
            self.throttling, self.rotation.turn = True, w
            out.append(Note("r2sp_rotation", {"now": event.now, "first": w,
                                              "iter_time": self.iter_time}))
        if not self.throttling:
            self.reading_since[w] = event.now
            return [self._release(w, event.step + 1)]
        self.waiting[w] = (event.step + 1, event.now)
        return out + self._grant(event.now)

    def _measure(self, event: Pushed) -> None:
        prev = self.last_push.get(event.worker)
        self.last_push[event.worker] = event.now
        if prev is not None:
            a, interval = self.options.ema, event.now - prev
            self.iter_time = interval if self.iter_time is None else (
                a * interval + (1 - a) * self.iter_time)
        if event.compute_time > 0:
            self.speed[event.worker] = event.batch_size / event.compute_time

    def _grant(self, now: float) -> list[Decision]:
        """Permissions for the turn holder while it is waiting, each a gap after the last."""
        out: list[Decision] = []
        while self.rotation.turn in self.waiting and not self._owes(self.rotation.turn):
            w = self.rotation.turn
            step, since = self.waiting.pop(w)
            at = now if self.last_permit is None else max(now, self.last_permit + self.gap())
            self.last_permit = at
            if self.options.heterogeneous:
                self._retune(w, at - since)
            out.append(self._release(w, step, at if at > now else None))
            self.reading_since[w] = at
            self.rotation.pass_turn()
        return out

    def _owes(self, w: int) -> bool:
        """Strict mode: is someone who read before w's push still computing?

        Such a reader already saw w's last push land after its read; letting w go now could
        land a second one before the reader pushes, one more than the N-1 promised.
        """
        if not self.options.strict or not self.reading_since:
            return False
        return next(iter(self.reading_since.values())) <= self.waiting[w][1]

    def _retune(self, w: int, blocking: float) -> None:
        if w in self.speed:
            self.batch[w] = self._clamp(round(self.batch[w] + self.speed[w] * blocking))

    def _clamp(self, b: int) -> int:
        return min(max(b, self.options.min_batch), self.max_batch)

    def _release(self, w: int, step: int, not_before: float | None = None) -> Release:
        if not self.options.heterogeneous:
            return Release(w, step, self.batch_size, not_before)
        b = self.batch[w]
        return Release(w, step, b, not_before, scale=b / self.base)
