"""What happens to the unsent part of a gradient: dropped, kept as a residual, or DGC momentum."""

from __future__ import annotations

import torch


class Drop:
    """No error feedback: the candidate is the gradient itself; whatever is not sent is lost."""

    def __init__(self):
        self.size = None

    def reset(self) -> None:
        self.size = None

    def add(self, grad: torch.Tensor) -> torch.Tensor:
        self.size = grad.numel()
        return grad

    def kept(self, keys: torch.Tensor, extra: torch.Tensor) -> None:
        pass

    def sent(self, keys: torch.Tensor, left: torch.Tensor | None = None) -> None:
        pass

    @property
    def residual(self) -> torch.Tensor | None:
        return None

    @property
    def velocity(self) -> torch.Tensor | None:
        return None


class Residual:
    """Error feedback: v += g; send part of v; the sent positions of v restart from zero."""

    def __init__(self):
        self.v = None

    def reset(self) -> None:
        self.v = None

    def add(self, grad: torch.Tensor) -> torch.Tensor:
        if self.v is None:
            self.v = torch.zeros_like(grad)
        self.v.add_(grad)
        return self.v

    def sent(self, keys: torch.Tensor, left: torch.Tensor | None = None) -> None:
        """The positions sent restart from zero, or from `left` (what a codec's rounding kept
        back there), so the residual plus what was sent still sums every gradient."""
        if left is None:
            self.v.index_fill_(0, keys, 0)
        else:
            self.v.index_copy_(0, keys, left)

    def kept(self, keys: torch.Tensor, extra: torch.Tensor) -> None:
        """`extra` at `keys` was not delivered after all (a later rounding): keep it."""
        self.v.index_add_(0, keys, extra)

    @property
    def residual(self) -> torch.Tensor | None:
        return self.v

    @property
    def velocity(self) -> torch.Tensor | None:
        return None


class MomentumCorrection(Residual):
    """Deep Gradient Compression (Lin et al. 2018): u = m*u + g; v += u; send part of v;
    clear u and v where sent (momentum factor masking, so stale momentum is not re-sent)."""

    def __init__(self, momentum: float):
        super().__init__()
        self.momentum = momentum
        self.u = None

    def reset(self) -> None:
        super().reset()
        self.u = None

    def add(self, grad: torch.Tensor) -> torch.Tensor:
        if self.u is None:
            self.u = torch.zeros_like(grad)
        self.u.mul_(self.momentum).add_(grad)
        return super().add(self.u)

    def sent(self, keys: torch.Tensor, left: torch.Tensor | None = None) -> None:
        super().sent(keys, left)
        self.u.index_fill_(0, keys, 0)

    @property
    def velocity(self) -> torch.Tensor | None:
        return self.u


def make_feedback(error_feedback: bool, momentum: float):
    if momentum > 0:
        return MomentumCorrection(momentum)
    return Residual() if error_feedback else Drop()
