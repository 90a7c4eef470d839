"""The seed's per-worker AdaGrad-style global rate: eta / sqrt(sum of that worker's g^2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paramserver.optim.base import Index, UpdateRule, add_at
from paramserver.core.options import Configurable, check_choice, check_range, opt


@dataclass(frozen=True)
class AdaGradGlobalOptions:
    granularity: str = opt("key", "key: one accumulator per key and worker (AdaGrad); "
                                  "worker: one scalar sum of squared norms per worker")
    eps: float = opt(1e-8, "added to the square root, against division by zero")

    def __post_init__(self):
        check_choice("granularity", self.granularity, ("key", "worker"))
        check_range("eps", self.eps, 0, lo_open=True)


def merge_keys(index: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the values of repeated sparse keys: (unique keys, merged values)."""
    keys, inverse = torch.unique(index, return_inverse=True)
    return keys, torch.zeros(len(keys), dtype=grad.dtype).index_add_(0, inverse, grad)


class AdaGradGlobal(UpdateRule, Configurable):
    """w <- w - eta / sqrt(sum_{k<=t} g_k^2) * g_t, the sum over the pushing worker's own pushes.

    Interpretation of seed 001 ("the workers with smaller iterations have larger local learning
    rate", then the AdaGrad-shaped formula): each worker's rate decays with its own
    accumulated squared gradients, so a worker that has pushed less (a straggler) keeps a
    larger rate than ConSGD's single constant would give it. The current gradient is in the
    sum (i <= t+1 in the seed). eta is `lr`; `scale` multiplies the step, not the sum.
    Memory: granularity "key" keeps one shard-sized tensor per worker (N x shard),
    "worker" one scalar per worker. An aggregated round (worker "") is one more "worker".
    """

    name = "adagrad-global"
    Options = AdaGradGlobalOptions

    def __init__(self, lr: float, granularity: str = "key", eps: float = 1e-8):
        super().__init__(lr)
        self.opts = AdaGradGlobalOptions(granularity, eps)

    def _acc(self, state: dict, worker: str, params: torch.Tensor) -> torch.Tensor:
        key = f"sumsq/{worker}"
        if key not in state:  # a worker's accumulator appears with its first push
            shape = params.shape if self.opts.granularity == "key" else (1,)
            state[key] = torch.zeros(shape, dtype=params.dtype)
        return state[key]

    def apply(self, params, index: Index, grad, state, staleness, scale=1.0, worker=""):
        acc = self._acc(state, worker, params)
        step = -self.lr * scale
        if self.opts.granularity == "worker":
            acc.add_(torch.sum(grad * grad))
            add_at(params, index, grad, step / (float(acc.sqrt()) + self.opts.eps))
        elif isinstance(index, slice):
            view = acc[index]
            view.addcmul_(grad, grad)
            params[index].addcdiv_(grad, view.sqrt().add_(self.opts.eps), value=step)
        else:
            keys, merged = merge_keys(index, grad)
            acc.index_add_(0, keys, merged * merged)
            params.index_add_(0, keys, merged / (acc[keys].sqrt() + self.opts.eps), alpha=step)

    def options(self) -> dict:
        return {"lr": self.lr, "granularity": self.opts.granularity, "eps": self.opts.eps}
