"""Global-rate rules for stale updates: ConSGD, DynSGD and staleness-aware ASGD."""

from __future__ import annotations

from dataclasses import dataclass

from paramserver.optim.base import UpdateRule, add_at
from paramserver.core.options import Configurable, check_range, opt


@dataclass(frozen=True)
class ConSGDOptions:
    global_rate: float = opt(1.0, "lambda: constant global rate multiplying each local update")

    def __post_init__(self):
        check_range("global_rate", self.global_rate, 0, lo_open=True)


class ConSGD(UpdateRule, Configurable):
    """params -= lambda * lr * scale * grad: one constant global rate on every local update."""

    name = "consgd"
    staleness_aware = True
    linear_in_grad = True
    Options = ConSGDOptions

    def __init__(self, lr: float, global_rate: float = 1.0):
        super().__init__(lr)
        self.global_rate = ConSGDOptions(global_rate).global_rate

    def apply(self, params, index, grad, state, staleness, scale=1.0, worker=""):
        add_at(params, index, grad, -self.global_rate * self.lr * scale)

    def options(self) -> dict:
        return {"lr": self.lr, "global_rate": self.global_rate}


class DynSGD(UpdateRule, Configurable):
    """params -= lr * scale * grad / (staleness + 1): the staler, the smaller the step."""

    name = "dynsgd"
    staleness_aware = True
    linear_in_grad = True

    def apply(self, params, index, grad, state, staleness, scale=1.0, worker=""):
        add_at(params, index, grad, -self.lr * scale / (staleness + 1))


class StalenessAware(UpdateRule, Configurable):
    """Staleness-aware ASGD: lr = lr0 / max(staleness, 1), so fresh and 1-stale get lr0."""

    name = "staleness-aware"
    staleness_aware = True
    linear_in_grad = True

    def apply(self, params, index, grad, state, staleness, scale=1.0, worker=""):
        add_at(params, index, grad, -self.lr * scale / max(staleness, 1))
