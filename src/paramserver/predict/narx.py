"""NARX speed predictor: a small PyTorch network over delayed speeds and host load, trained online."""

from __future__ import annotations

import statistics
from collections import deque

import torch

from paramserver.predict.speed import EMASpeed, LastSpeed, SpeedPredictor, _check_speed


class NARXSpeed(SpeedPredictor):
    """Nonlinear AutoRegressive model with eXogenous inputs, as LB-BSP uses.

    y(t+1) = y(t) + f(y(t-k+1..t), cpu(t-k+1..t), mem(t-k+1..t)), with f one tanh hidden layer.
    The tapped delay lines of past outputs and inputs are what makes a NARX net recurrent; it
    is trained open-loop (on observed speeds, the usual series-parallel setup) and only ever
    predicts one step ahead, so the closed loop is never needed. Speeds are divided by the
    median of the buffer so the net works in O(1) units; cpu percent / 100, free memory as
    given; a missing reading counts as 0. The output layer starts at zero, so an untrained
    NARX predicts exactly like `last`.

    Online training: after each observation, `steps` Adam steps on every window in the last
    `train_window` observations. Until `min_samples` windows exist, `fallback` answers.
    Deterministic: weights come from a generator seeded with `seed`.
    """

    name = "narx"

    def __init__(self, delays: int = 6, hidden: int = 16, lr: float = 0.01, steps: int = 4,
                 train_window: int = 48, min_samples: int = 8, seed: int = 0,
                 fallback: str = "ema"):
        if delays < 1 or hidden < 1 or steps < 0 or train_window < 2 or min_samples < 1:
            raise ValueError("narx needs delays, hidden, train_window, min_samples >= 1 "
                             "and steps >= 0")
        if fallback not in ("last", "ema"):
            raise ValueError(f"fallback must be last or ema, got {fallback!r}")
        self.k, self.steps, self.min_samples = delays, steps, min_samples
        size = train_window + delays
        self.speeds: deque[float] = deque(maxlen=size)
        self.exo: deque[tuple[float, float]] = deque(maxlen=size)
        self.fallback = LastSpeed() if fallback == "last" else EMASpeed(0.5)
        self.net = self._build(3 * delays, hidden, seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.samples = 0

    @staticmethod
    def _build(inputs: int, hidden: int, seed: int) -> torch.nn.Module:
        gen = torch.Generator().manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.Tanh(),
                                  torch.nn.Linear(hidden, 1))
        bound = 1.0 / inputs ** 0.5
        with torch.no_grad():
            net[0].weight.copy_((torch.rand(net[0].weight.shape, generator=gen) * 2 - 1) * bound)
            net[0].bias.copy_((torch.rand(net[0].bias.shape, generator=gen) * 2 - 1) * bound)
            net[2].weight.zero_()
            net[2].bias.zero_()
        return net

    def observe(self, speed, cpu_load=None, free_mem=None):
        s = _check_speed(speed)
        self.fallback.observe(s)
        self.speeds.append(s)
        self.exo.append(((cpu_load or 0.0) / 100.0, free_mem or 0.0))
        if len(self.speeds) > self.k:
            self._train()

    def _series(self) -> tuple[torch.Tensor, float]:
        """Columns (speed / scale, cpu, mem) of the buffer, and the scale."""
        scale = statistics.median(self.speeds)
        y = torch.tensor(list(self.speeds), dtype=torch.float32) / scale
        exo = torch.tensor(list(self.exo), dtype=torch.float32).reshape(-1, 2)
        return torch.cat([y[:, None], exo], dim=1), scale

    def _features(self, series: torch.Tensor) -> torch.Tensor:
        """One row per window of k consecutive observations: k speeds, k cpu, k mem."""
        win = series.unfold(0, self.k, 1)  # (windows, 3, k)
        return win.reshape(win.shape[0], -1)

    def _train(self) -> None:
        series, _ = self._series()
        x = self._features(series[:-1])
        target = series[self.k:, 0] - series[self.k - 1:-1, 0]
        self.samples = x.shape[0]
        for _ in range(self.steps):
            self.opt.zero_grad()
            loss = torch.mean((self.net(x).squeeze(1) - target) ** 2)
            loss.backward()
            self.opt.step()

    def predict(self):
        if self.samples < self.min_samples:
            return self.fallback.predict()
        series, scale = self._series()
        with torch.no_grad():
            step = float(self.net(self._features(series[-self.k:]))[0, 0])
        # A speed is positive: never predict less than a tenth of the last one.
        return max(self.speeds[-1] + step * scale, 0.1 * self.speeds[-1])
