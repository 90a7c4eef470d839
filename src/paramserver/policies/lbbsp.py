"""LB-BSP: BSP whose per-worker batch sizes follow predicted speeds, keeping the global batch."""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.core.options import Configurable, check_choice, check_int, check_range, opt
from paramserver.policies.base import ApplyRound, Decision, Joined, Left, Note, Pushed
from paramserver.policies.batch_split import split_batch
from paramserver.policies.bsp import BSP
from paramserver.predict.speed import SpeedPredictor
from paramserver.predict.speed_factory import SPEED_PREDICTORS, make_speed_predictor


@dataclass(frozen=True)
class LBBSPOptions:
    predictor: str = opt("ema", "speed predictor: last, ema, median, narx")
    min_batch: int = opt(1, "smallest per-worker batch")
    max_batch: int | None = opt(None, "largest per-worker batch (default: the global batch)")
    alpha: float = opt(0.5, "ema predictor: weight of the newest speed")
    window: int = opt(5, "median predictor: speeds in the window")

    def __post_init__(self):
        check_choice("predictor", self.predictor, SPEED_PREDICTORS)
        check_int("min_batch", self.min_batch, 1)
        if self.max_batch is not None:
            check_int("max_batch", self.max_batch, self.min_batch)
        check_range("alpha", self.alpha, 0, 1, lo_open=True)
        check_int("window", self.window, 1)

    def predictor_kwargs(self) -> dict:
        return {"ema": {"alpha": self.alpha}, "median": {"window": self.window}}.get(
            self.predictor, {})


class LBBSP(BSP, Configurable):
    """Load-balanced BSP: worker i gets x_i = X * v_i / sum_j v_j samples per round.

    X = batch_size * N (N active workers at the round's start; an elastic job's batch rule may
    fix X instead: `global_batch`) stays fixed; v_i is the
    predicted speed (samples/s, learnt from batch / compute time of each push, plus the
    host's cpu load and free memory for NARX). Sizes are integers summing to X exactly
    (largest remainder), within [min_batch, max_batch]; when the bounds cannot hold X
    (N * min_batch > X or N * max_batch < X) every worker gets the violated bound. Workers
    with no measurement yet count at the mean predicted speed. A worker joining mid-round
    starts with batch_size; the servers weight every push by its batch, so the aggregate is
    sum_i x_i g_i / sum_i x_i, as LB-BSP prescribes.
    """

    name = "lbbsp"
    Options = LBBSPOptions
    own_batches = True

    def __init__(self, batch_size: int, *, predictor: str = "ema", min_batch: int = 1,
                 max_batch: int | None = None, alpha: float = 0.5, window: int = 5):
        super().__init__(batch_size)
        self.options = LBBSPOptions(predictor, min_batch, max_batch, alpha, window)
        self.predictors: dict[int, SpeedPredictor] = {}
        self.sizes: dict[int, int] = {}
        self.last_speeds: dict[int, float] = {}

    def batch_for(self, worker: int) -> int:
        if worker in self.sizes:
            return self.sizes[worker]
        return max(self.options.min_batch, min(self.batch_size, self.options.max_batch
                                               or self.batch_size))

    def _predictor(self, worker: int) -> SpeedPredictor:
        if worker not in self.predictors:
            self.predictors[worker] = make_speed_predictor(
                self.options.predictor, **self.options.predictor_kwargs())
        return self.predictors[worker]

    def warm(self, speeds: dict[int, float]) -> None:
        """Compute speeds (samples/s) measured before this policy took over (auto's switch,
        before the workers join it): each worker's predictor starts from its speed, and the
        first round is split by them instead of evenly."""
        for w, v in speeds.items():
            if v > 0:
                self._predictor(w).observe(v)
        workers = sorted(w for w, v in speeds.items() if v > 0)
        if workers:
            total = self.global_batch or self.batch_size * len(workers)
            sizes = split_batch(total, [speeds[w] for w in workers], self.options.min_batch,
                                self.options.max_batch)
            self.sizes = dict(zip(workers, sizes))
            self.last_speeds = {w: speeds[w] for w in workers}

    def on_joined(self, event: Joined) -> list[Decision]:
        self._predictor(event.worker)  # (a warm one is kept)
        return super().on_joined(event)

    def on_left(self, event: Left) -> list[Decision]:
        for table in (self.predictors, self.sizes, self.last_speeds):
            table.pop(event.worker, None)
        return self._noted(super().on_left(event))

    def on_pushed(self, event: Pushed) -> list[Decision]:
        return self._noted(super().on_pushed(event))

    def observe(self, event: Pushed) -> None:
        if event.compute_time > 0:
            self.predictors[event.worker].observe(event.batch_size / event.compute_time,
                                                  event.cpu_load, event.free_mem)

    def before_release(self) -> None:
        workers = sorted(self.active)
        predicted = {w: self.predictors[w].predict() for w in workers}
        known = [v for v in predicted.values() if v is not None]
        mean = sum(known) / len(known) if known else 1.0
        speeds = [predicted[w] if predicted[w] is not None else mean for w in workers]
        # An elastic job's batch rule may fix the global batch whoever is there.
        total = self.global_batch or self.batch_size * len(workers)
        sizes = split_batch(total, speeds, self.options.min_batch, self.options.max_batch)
        self.sizes = dict(zip(workers, sizes))
        self.last_speeds = dict(zip(workers, speeds))

    def _noted(self, out: list[Decision]) -> list[Decision]:
        """Append the new allocation to the decisions of a round that just closed."""
        if not any(isinstance(d, ApplyRound) for d in out) or not self.sizes:
            return out
        workers = sorted(self.sizes)
        total = self.global_batch or self.batch_size * len(workers)
        return out + [Note("lbbsp_batches", {
            "round": self.round, "global_batch": total,
            "workers": workers, "batch": [self.sizes[w] for w in workers],
            "speed": [round(self.last_speeds[w], 6) for w in workers]})]
