"""Model <-> key space: every parameter scalar is one key of a flat vector, in parameters() order."""

from __future__ import annotations

import bisect
import warnings
from dataclasses import dataclass
from typing import Union

import numpy as np
import torch
from torch import nn

from paramserver.core.keyspace import KeyRange

Flat = Union[torch.Tensor, np.ndarray]


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter tensor lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    keys: KeyRange

    @property
    def num_rows(self) -> int:
        """Output rows (neurons / output channels); a scalar parameter has one row."""
        return self.shape[0] if self.shape else 1

    @property
    def row_size(self) -> int:
        return self.keys.size // self.num_rows if self.num_rows else 0


@dataclass(frozen=True)
class Layer:
    """The parameters of one module (e.g. a Linear's weight then bias): one contiguous range."""

    name: str
    keys: KeyRange
    params: tuple[str, ...]


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    mapping = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float64}
    try:
        return mapping[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"key space dtype must be float32 or float64, got {dtype!r}") from None


def _layers(slots: list[ParamSlot]) -> list[Layer]:
    """Group consecutive parameters by owning module (named_parameters yields them together)."""
    groups: list[list[ParamSlot]] = []
    for slot in slots:
        module = slot.name.rpartition(".")[0]
        if groups and groups[-1][0].name.rpartition(".")[0] == module:
            groups[-1].append(slot)
        else:
            groups.append([slot])
    return [Layer(g[0].name.rpartition(".")[0], KeyRange(g[0].keys.lo, g[-1].keys.hi),
                  tuple(s.name for s in g)) for g in groups]


class ModelKeys:
    """The layout of a model's parameters in one flat key space, and fast copies in and out.

    Copies loop over parameter tensors (a handful), never over elements: each is one torch copy
    into a view of the flat buffer, converting dtype on the way when the key space is float64.
    """

    def __init__(self, model: nn.Module, dtype=torch.float32):
        self.dtype = _torch_dtype(dtype)
        self.params: list[ParamSlot] = []
        lo = 0
        for name, p in model.named_parameters():
            self.params.append(ParamSlot(name, tuple(p.shape), KeyRange(lo, lo + p.numel())))
            lo += p.numel()
        if not self.params:
            raise ValueError("model has no parameters")
        self.num_keys = lo
        self.layers: list[Layer] = _layers(self.params)
        self._by_name = {s.name: s for s in self.params}
        self._starts = [s.keys.lo for s in self.params]

    def __repr__(self) -> str:
        return (f"ModelKeys({self.num_keys} keys, {len(self.params)} tensors, "
                f"{len(self.layers)} layers, {self.dtype})")

    # --- layout -------------------------------------------------------------------------------
    def slot(self, name: str) -> ParamSlot:
        """The ParamSlot of parameter `name` (as in model.named_parameters())."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no parameter {name!r}; known: {', '.join(self._by_name)}") from None

    def param_range(self, name: str) -> KeyRange:
        """Key range of one parameter tensor."""
        return self.slot(name).keys

    def row_range(self, name: str, row: int) -> KeyRange:
        """Keys of output row `row` of parameter `name`: one neuron's incoming weights."""
        slot = self.slot(name)
        if not 0 <= row < slot.num_rows:
            raise IndexError(f"{name} has rows 0..{slot.num_rows - 1}, asked for {row}")
        lo = slot.keys.lo + row * slot.row_size
        return KeyRange(lo, lo + slot.row_size)

    def locate(self, key: int) -> tuple[str, int]:
        """(parameter name, row) that key `key` belongs to."""
        if not 0 <= key < self.num_keys:
            raise IndexError(f"key {key} outside [0, {self.num_keys})")
        slot = self.params[bisect.bisect_right(self._starts, key) - 1]
        return slot.name, (key - slot.keys.lo) // max(slot.row_size, 1)

    def describe(self) -> list[dict]:
        """JSON-ready layout: one entry per layer with its tensors and key ranges."""
        return [{"layer": layer.name, "lo": layer.keys.lo, "hi": layer.keys.hi,
                 "params": {n: list(self._by_name[n].shape) for n in layer.params}}
                for layer in self.layers]

    # --- buffers ------------------------------------------------------------------------------
    def new_buffer(self) -> torch.Tensor:
        """A zeroed flat vector of the key space's dtype (allocate once, then reuse)."""
        return torch.zeros(self.num_keys, dtype=self.dtype)

    def view(self, flat: Flat, name: str) -> torch.Tensor:
        """Parameter `name`'s part of `flat`, shaped like the parameter (a view, no copy)."""
        slot = self.slot(name)
        return self._tensor(flat)[slot.keys.lo:slot.keys.hi].view(slot.shape)

    def flatten_params(self, model: nn.Module, out: Flat | None = None) -> Flat:
        """Copy the model's parameters into `out` (allocated if None); returns `out`."""
        return self._gather(model, out, grads=False)

    def flatten_grads(self, model: nn.Module, out: Flat | None = None) -> Flat:
        """Copy the gradients into `out`, reused across steps; a missing grad gives zeros."""
        return self._gather(model, out, grads=True)

    @torch.no_grad()
    def load_flat(self, model: nn.Module, flat: Flat) -> None:
        """Copy a flat vector (torch or numpy, any float dtype) into the model's parameters."""
        src = self._tensor(flat)
        for slot, p in self._pairs(model):
            p.copy_(src[slot.keys.lo:slot.keys.hi].view(slot.shape))

    # --- internals ----------------------------------------------------------------------------
    def _pairs(self, model: nn.Module):
        params = list(model.parameters())
        if len(params) != len(self.params):
            raise ValueError(f"model has {len(params)} parameter tensors, key space {len(self.params)}")
        for slot, p in zip(self.params, params):
            if tuple(p.shape) != slot.shape:
                raise ValueError(f"{slot.name}: model shape {tuple(p.shape)} != key space {slot.shape}")
            yield slot, p

    @torch.no_grad()
    def _gather(self, model: nn.Module, out: Flat | None, grads: bool) -> Flat:
        out = self.new_buffer() if out is None else out
        dst = self._tensor(out)
        pairs = [(slot, p.grad if grads else p) for slot, p in self._pairs(model)]
        if all(src is not None and src.dtype == dst.dtype for _, src in pairs):
            # One concatenation into the buffer is several times faster than a copy per tensor.
            torch.cat([src.reshape(-1) for _, src in pairs], out=dst)
            return out
        for slot, src in pairs:
            part = dst[slot.keys.lo:slot.keys.hi].view(slot.shape)
            if src is None:
                part.zero_()
            else:
                part.copy_(src)
        return out

    def _tensor(self, flat: Flat) -> torch.Tensor:
        """`flat` as a 1-D torch tensor sharing its memory (numpy arrays are wrapped, not copied)."""
        if isinstance(flat, np.ndarray):
            if not flat.flags.writeable:
                # Read-only sources (e.g. received frames) are only read here; silence torch's note.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    flat = torch.from_numpy(flat)
            else:
                flat = torch.from_numpy(flat)
        if flat.ndim != 1 or flat.numel() != self.num_keys:
            raise ValueError(f"flat vector must have shape ({self.num_keys},), got {tuple(flat.shape)}")
        if not flat.is_contiguous():
            raise ValueError("flat vector must be contiguous")
        return flat
