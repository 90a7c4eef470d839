"""Server update rules: pure functions of (params, update, state, staleness) on a flat shard."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Union

import torch

# Where an update lands in the shard: a contiguous slice (dense/range push) or key indices (sparse).
Index = Union[slice, torch.Tensor]


def add_at(target: torch.Tensor, index: Index, values: torch.Tensor, alpha: float) -> None:
    """target[index] += alpha * values, accumulating repeated sparse keys."""
    if isinstance(index, slice):
        target[index].add_(values, alpha=alpha)
    else:
        target.index_add_(0, index, values, alpha=alpha)


class UpdateRule(ABC):
    """One optimizer on one shard. `state` holds per-key tensors sized like the shard."""

    name: ClassVar[str] = "?"
    # Whether apply(params, i, c * grad, scale=s) == apply(params, i, grad, scale=c * s) for
    # any c > 0: a round's average then costs no pass of its own (the division rides in scale).
    linear_in_grad: ClassVar[bool] = False
    # True for a rule that shrinks a stale push's step (DynSGD, ConSGD, staleness-aware): the
    # report's diagnosis of an unstable asynchronous run asks it.
    staleness_aware: ClassVar[bool] = False
    # False for a rule that updates only ranges of keys (torch's optimizers): a push of a
    # key list (top-k and the other pruners) reaches it only summed into a dense round.
    sparse_keys: ClassVar[bool] = True
    # True for a rule that, as torch's optimizers, leaves out the keys of parameters that got
    # no gradient (their grad None in torch): the store then passes a push's (or a round's)
    # such keys as apply(..., idle=[(a, b), ...]), local runs inside the index, never empty.
    skips_idle: ClassVar[bool] = False

    def __init__(self, lr: float):
        if not lr > 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        self.lr = lr

    def bind(self, lo: int, hi: int) -> None:
        """The shard's keys [lo, hi) in the job's key space, told before init_state (for a
        rule whose settings differ by key range); most rules do not need them."""

    def init_state(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    def state_loaded(self) -> None:
        """The store's state tensors were written from outside the rule (a checkpoint
        restored, keys moved in, a backup synced): what the rule derived from them is stale."""

    def retune(self, groups: list) -> None:
        """New settings for parameter groups ([[group, {name: value}], ...]: a script's
        learning-rate schedule); only a rule that runs a script's optimizer takes them."""
        raise ValueError(f"the servers' update rule ({self.name}) takes no settings from the "
                         f"script; a schedule reaches the servers when the script passes its "
                         f"torch optimizer to DistributedOptimizer")

    def keyed(self, name: str, tensor: torch.Tensor, params: torch.Tensor) -> bool:
        """Whether state `name` holds one entry per key (cut and moved with its keys when
        keys move); else it is the shard's as a whole (a count), copied whole."""
        return tuple(tensor.shape) == tuple(params.shape) and tensor.dtype == params.dtype

    @abstractmethod
    def apply(self, params: torch.Tensor, index: Index, grad: torch.Tensor,
              state: dict[str, torch.Tensor], staleness: int, scale: float = 1.0,
              worker: str = "") -> None:
        """Update params[index] in place from `grad`.

        `staleness` is the server version at arrival minus the version the gradient was computed
        from; `scale` is the policy's weight for this update; `worker` names the pusher, for rules
        that keep per-worker state ("" for an aggregated round).
        """

    def options(self) -> dict:
        return {"lr": self.lr}
