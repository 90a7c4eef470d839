"""Plain and momentum SGD on a shard."""

from __future__ import annotations

import torch

from paramserver.optim.base import Index, UpdateRule, add_at


class SGD(UpdateRule):
    """params -= lr * scale * grad."""

    name = "sgd"
    linear_in_grad = True

    def apply(self, params, index, grad, state, staleness, scale=1.0, worker=""):
        add_at(params, index, grad, -self.lr * scale)


class MomentumSGD(UpdateRule):
    """Heavy-ball momentum kept on the server per key: buf = mu * buf + grad; params -= lr * buf."""

    name = "momentum"
    linear_in_grad = True

    def __init__(self, lr: float, momentum: float = 0.9):
        super().__init__(lr)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) \
                or not 0 <= momentum < 1:
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        self.momentum = momentum

    def init_state(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"momentum": torch.zeros_like(params)}

    def apply(self, params, index: Index, grad, state, staleness, scale=1.0, worker=""):
        buf = state["momentum"]
        if isinstance(index, slice):
            view = buf[index]
            view.mul_(self.momentum).add_(grad, alpha=scale)
            params[index].add_(view, alpha=-self.lr)
            return
        # Sparse: repeated keys are merged first so each key's momentum decays once per push.
        keys, inverse = torch.unique(index, return_inverse=True)
        merged = torch.zeros(len(keys), dtype=grad.dtype).index_add_(0, inverse, grad)
        updated = buf[keys].mul_(self.momentum).add_(merged, alpha=scale)
        buf[keys] = updated
        params.index_add_(0, keys, updated, alpha=-self.lr)

    def options(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum}
