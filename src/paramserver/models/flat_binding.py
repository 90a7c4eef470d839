"""Make a model's parameters and gradients views into two flat buffers: pulls and pushes copy
nothing."""

from __future__ import annotations

import torch
from torch import nn

from paramserver.models import ModelKeys


@torch.no_grad()
def bind_to_flat(model: nn.Module, keys: ModelKeys, params: torch.Tensor,
                 grads: torch.Tensor) -> None:
    """After this, writing `params` changes the model and backward accumulates into `grads`.

    Autograd adds into an existing `.grad` in place, so gradients land in `grads` directly as
    long as the caller zeroes `grads` (not sets the .grad to None) between steps.
    """
    for slot, p in zip(keys.params, model.parameters()):
        view = params[slot.keys.lo:slot.keys.hi].view(slot.shape)
        view.copy_(p)
        p.data = view
        p.grad = grads[slot.keys.lo:slot.keys.hi].view(slot.shape)


@torch.no_grad()
def point_params_at(model: nn.Module, keys: ModelKeys, params: torch.Tensor) -> None:
    """Make the model's parameters views of `params` as they are (nothing copied; the
    gradients stay where they were bound)."""
    for slot, p in zip(keys.params, model.parameters()):
        p.data = params[slot.keys.lo:slot.keys.hi].view(slot.shape)


@torch.no_grad()
def point_grads_at(model: nn.Module, keys: ModelKeys, grads: torch.Tensor) -> None:
    """Make the model's .grad views of `grads` again (a script set them to None, or autograd
    replaced one): the next backward accumulates into `grads`."""
    for slot, p in zip(keys.params, model.parameters()):
        p.grad = grads[slot.keys.lo:slot.keys.hi].view(slot.shape)


def grads_are_bound(model: nn.Module, grads: torch.Tensor) -> bool:
    """True if every .grad still lives inside `grads` (autograd may replace a grad it dislikes)."""
    lo = grads.data_ptr()
    hi = lo + grads.numel() * grads.element_size()
    return all(p.grad is not None and lo <= p.grad.data_ptr() < hi for p in model.parameters())


class GradsBoundCheck:
    """grads_are_bound(model, grads) cheap enough for every step: the parameter list and the
    buffer's address range are taken once (walking the module tree costs more than the check)."""

    def __init__(self, model: nn.Module, grads: torch.Tensor):
        self.params = list(model.parameters())
        self.lo = grads.data_ptr()
        self.hi = self.lo + grads.numel() * grads.element_size()

    def __call__(self) -> bool:
        lo, hi = self.lo, self.hi
        for p in self.params:
            g = p.grad
            if g is None or not lo <= g.data_ptr() < hi:
                return False
        return True
