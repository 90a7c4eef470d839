"""A script's optimizer.state_dict() and load_state_dict(), over the servers' state.

The servers run the script's torch optimizer (optim/torch_rule.py): each shard keeps its
per-element state (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer, ...) as arrays over
its keys, and each key's step count. `read` brings them back in torch's own state_dict format
(each parameter by its index in the groups: its tensors in the parameter's shape and device,
its step), so a script's checkpoint holds the optimizer as torch's would and loads into this
optimizer or a plain torch one; `write` puts such a dict back on the servers. Both go shard by
shard in pieces of at most PIECE keys (`pull_state`, `load_state`), so a large model's state
never needs one large message.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from paramserver.core.keyspace import KeyRange
from paramserver.models.core.keyspace import ModelKeys
from paramserver.wire import Message

PIECE = 1 << 18  # keys per request: 1 MiB per float32 state array


def _pieces(kv, r: KeyRange):
    for shard, part, sl in kv.core.pieces(r):
        for lo in range(part.lo, part.hi, PIECE):
            hi = min(lo + PIECE, part.hi)
            yield shard, lo, hi, slice(sl.start + lo - part.lo, sl.start + hi - part.lo)


def pull_state(kv, r: KeyRange) -> dict[str, np.ndarray]:
    """The servers' per-key state over keys `r`, by name (each an array of r.size)."""
    out: dict[str, np.ndarray] = {}
    for shard, lo, hi, sl in _pieces(kv, r):
        rid = kv.requests.send(shard, Message("pull_state", {"range": [lo, hi]}))
        reply = kv.requests.collect([(shard, rid, None)], "pull_state")[rid]
        try:
            for name, array in zip(reply["names"], reply.arrays):
                if name not in out:
                    out[name] = np.zeros(r.size, dtype=array.dtype)
                out[name][sl] = array
        finally:
            kv.requests.let_go(rid)
    return out


def load_state(kv, r: KeyRange, arrays: dict[str, np.ndarray]) -> None:
    """Write per-key state over keys `r` (each array of r.size) to the servers."""
    names = sorted(arrays)
    for shard, lo, hi, sl in _pieces(kv, r):
        msg = Message("load_state", {"range": [lo, hi], "names": names},
                      [np.ascontiguousarray(arrays[n][sl]) for n in names])
        rid = kv.requests.send(shard, msg)
        kv.requests.collect([(shard, rid, None)], "load_state")
        kv.requests.let_go(rid)


def _params(model: nn.Module, keys: ModelKeys, optimizer: torch.optim.Optimizer):
    """(group, index, parameter, its key range) in torch's state_dict order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    index = 0
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            yield g, index, p, keys.param_range(name_of[id(p)])
            index += 1


def read(kv, model: nn.Module, keys: ModelKeys, optimizer: torch.optim.Optimizer) -> dict:
    """torch's optimizer state_dict of what the servers hold now. A parameter none of whose
    keys has stepped has no state, as in torch."""
    arrays = pull_state(kv, KeyRange(0, keys.num_keys))
    steps = arrays.pop("step", None)
    state: dict[int, dict] = {}
    for _, i, p, r in _params(model, keys, optimizer):
        n = None if steps is None else float(steps[r.lo])
        # (frozen on the servers, as it needs no grad: torch keeps no state for it)
        if n == 0.0 or (n is None and not arrays) or not p.requires_grad:
            continue
        entry = {k: torch.from_numpy(a[r.lo:r.hi].copy()).view_as(p).to(p.device)
                 for k, a in arrays.items()}
        if n is not None:
            entry["step"] = torch.tensor(n, dtype=torch.float32)
        state[i] = entry
    groups, at = [], 0
    for group in optimizer.param_groups:
        count = len(group["params"])
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": list(range(at, at + count))})
        at += count
    return {"state": state, "param_groups": groups}


def write(kv, model: nn.Module, keys: ModelKeys, optimizer: torch.optim.Optimizer,
          state_dict: dict) -> None:
    """Load torch's optimizer `state_dict` onto the servers and its groups' settings into
    `optimizer` (sent with the next push, as a schedule's are). Checked whole before anything
    is written; a parameter without state in it starts afresh, as in torch."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
        raise ValueError("load_state_dict takes an optimizer state_dict: a dict with 'state' "
                         "and 'param_groups' (what optimizer.state_dict() returns)")
    saved = state_dict["param_groups"]
    ours = optimizer.param_groups
    if len(saved) != len(ours) or any(len(a["params"]) != len(b["params"])
                                      for a, b in zip(saved, ours)):
        raise ValueError(f"the state_dict's parameter groups ({[len(g['params']) for g in saved]}"
                         f" parameters) do not match the optimizer's "
                         f"({[len(g['params']) for g in ours]})")
    arrays = pull_state(kv, KeyRange(0, keys.num_keys))
    kept = set(arrays)
    by_index = {int(k): v for k, v in state_dict["state"].items()}
    for _, i, p, r in _params(model, keys, optimizer):
        entry = by_index.get(i, {})
        unknown = set(entry) - kept
        if unknown:
            raise ValueError(f"parameter {i}'s state holds {', '.join(sorted(unknown))}, which "
                             f"the servers' optimizer does not keep ({', '.join(sorted(kept))})")
        for name, a in arrays.items():
            value = entry.get(name)
            if value is None:
                a[r.lo:r.hi] = 0
                continue
            value = torch.as_tensor(value).detach().cpu()
            if name == "step":
                a[r.lo:r.hi] = float(value)
            elif value.numel() != r.size:
                raise ValueError(f"parameter {i}'s {name} has {value.numel()} values; the "
                                 f"parameter has {r.size}")
            else:
                a[r.lo:r.hi] = value.reshape(-1).numpy()
    load_state(kv, KeyRange(0, keys.num_keys), arrays)
    for group, old in zip(ours, saved):
        for k, v in old.items():
            if k != "params":
                group[k] = v
