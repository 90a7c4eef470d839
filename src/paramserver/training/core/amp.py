"""`--amp`: a worker's mixed precision, on torch's own machinery.

Forward and the loss run under `torch.autocast` in bf16 or fp16; the flat parameters and
gradients the wire moves, and what the servers hold, stay in the job's dtype (float32).
fp16's narrow range needs loss scaling: `torch.amp.GradScaler` scales the loss before
backward, unscales the gradient in place after it and finds overflows, as it does for a local
optimizer. A step whose gradient overflowed has nothing to push: the worker pushes zeros (its
clock and the round go on) where torch's `scaler.step` would skip `optimizer.step()`, and the
scaler lowers its scale for the next step.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Unscaled:
    """What GradScaler unscales and steps: the model's parameters as one group; `step()` only
    notes that the scaler found the gradient finite."""

    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]
        self.finite = False

    def step(self) -> None:
        self.finite = True


class MixedPrecision:
    """Owns the autocast dtype and, for fp16, the GradScaler and its scale."""

    def __init__(self, mode: str, device: torch.device, params):
        if mode != "off" and mode not in DTYPES:
            raise ValueError(f"amp must be off, bf16 or fp16; got {mode!r}")
        self.mode, self.device = mode, torch.device(device)
        self.dtype = DTYPES.get(mode)
        self.scaler = torch.amp.GradScaler(self.device.type) if mode == "fp16" else None
        self.unscaled = _Unscaled(params)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self):
        """The context forward and the loss run in."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def finish(self) -> bool:
        """After backward: the gradient unscaled in place (fp16); False when it overflowed,
        and the caller must not push it."""
        if self.scaler is None:
            return True
        self.unscaled.finite = False
        self.scaler.step(self.unscaled)
        self.scaler.update()
        return self.unscaled.finite

    def fields(self) -> dict:
        """The step record's: fp16's loss scale in force for the next step."""
        return {} if self.scaler is None else {"amp_scale": float(self.scaler.get_scale())}
