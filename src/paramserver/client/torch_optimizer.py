"""A script's torch optimizer, described for the servers: its class by name, its settings by value.

`DistributedOptimizer(optimizer, named_parameters=...)` takes the torch optimizer a script
built. What the servers need of it travels with the worker's registration as an optimizer spec
(`spec.job.OptimizerSpec` in wire form): the registered update rule that runs that class
(`optim/torch_rule.py`), the settings of its constructor (`optimizer.defaults`, less what is
not the optimizer's math: foreach, fused, capturable, differentiable), and each parameter
group's key ranges with the settings in which it differs. Keys of parameters no group holds
are frozen, as torch leaves them (a last group marked `frozen`, never given to the optimizer on
the servers: values, state and step counts stay), and so are parameters that do not require
grad when the optimizer joins (a frozen backbone in a group with weight decay: torch skips a
parameter whose grad is None; here every gradient is a zeroed buffer, which a decay or a moment
would still move). A trainable parameter that gets no gradient in a step (an unused branch, an
auxiliary head of some steps) is skipped per step instead: each push names the keys of those
no backward reached since zero_grad() (`idle`, client/idle_params.py) and the servers' rule
leaves them out of that step, in a round those no worker used (server/idle_keys.py). Nothing
is pickled: names, numbers, lists.

Only classes the servers run are taken; another is refused at once, before joining, with the
list; so is an option the servers' rule would refuse (the rule is built here to check).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from paramserver.models.core.keyspace import ModelKeys

# torch class -> the update rule that runs it on the servers (optim/torch_rule.py).
RULE_OF = {torch.optim.SGD: "torch-sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw",
           torch.optim.Adagrad: "adagrad", torch.optim.RMSprop: "rmsprop",
           torch.optim.Adamax: "adamax"}
# Constructor settings that say how torch runs, not what it computes.
_HOW = {"foreach", "fused", "capturable", "differentiable", "params"}


def _number(value):
    """A setting as the wire carries it: tensors (a tensor lr) as floats, tuples as lists."""
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, tuple):
        return [_number(v) for v in value]
    return value


def _runs(ranges: list[tuple[int, int]]) -> list[list[int]]:
    """Sorted key ranges with touching ones joined."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


@functools.cache
def _takes(cls: type) -> frozenset:
    """The settings the rule running torch class `cls` takes (its constructor's)."""
    from paramserver.optim import UPDATE_RULES
    return frozenset(UPDATE_RULES.get(RULE_OF[cls]).torch_options()) - _HOW


def settings_of(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's settings that the servers' rule takes (what a schedule moves:
    lr, betas, momentum, weight decay), as the wire carries them. Read at every step()."""
    takes = _takes(type(optimizer)) | {"lr"}
    return [{k: _number(v) for k, v in g.items() if k in takes} for g in optimizer.param_groups]


def describe(optimizer: torch.optim.Optimizer, model: nn.Module, keys: ModelKeys) -> dict:
    """The optimizer spec (wire form) of `optimizer` over `model`'s keys; ValueError (a class
    the servers do not run, a parameter the model does not have) or TypeError."""
    cls = type(optimizer)
    rule = RULE_OF.get(cls)
    if rule is None:
        known = ", ".join(f"torch.optim.{c.__name__}" for c in RULE_OF)
        raise ValueError(f"the servers do not run {cls.__module__}.{cls.__name__}; they run "
                         f"{known} (or pass the model and choose the servers' update rule "
                         f"with `paramserver launch --optimizer`)")
    from paramserver.optim import make_rule
    # What the class's constructor takes (AdamW's defaults hold a setting it fixes itself).
    takes = _takes(cls)
    defaults = {k: _number(v) for k, v in optimizer.defaults.items() if k in takes}
    lr = _number(optimizer.defaults["lr"])
    if not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"the optimizer's lr must be a number > 0, got {lr!r}")
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups, covered = [], set()
    for i, group in enumerate(optimizer.param_groups):
        ranges = []
        for p in group["params"]:
            name = name_of.get(id(p))
            if name is None:
                raise ValueError(f"parameter group {i} holds a tensor of shape "
                                 f"{tuple(p.shape)} that is not among the model's parameters "
                                 f"(named_parameters): the servers hold only the model's")
            if not p.requires_grad:
                continue  # frozen: torch never steps it (its grad stays None)
            covered.add(name)
            r = keys.param_range(name)
            ranges.append((r.lo, r.hi))
        settings = {k: _number(v) for k, v in group.items()
                    if k in {"lr", *defaults}
                    and _number(v) != (lr if k == "lr" else defaults.get(k))}
        # (an empty group too: a schedule's settings name groups by their index)
        groups.append({"ranges": _runs(ranges), **settings})
    frozen = [(keys.param_range(n).lo, keys.param_range(n).hi)
              for n, _ in model.named_parameters() if n not in covered]
    if frozen:  # torch never steps a parameter it was not given, nor one that needs no grad
        groups.append({"ranges": _runs(frozen), "frozen": True})
    options = dict(defaults)
    if groups:
        options["groups"] = groups
    make_rule(rule, lr, **options)  # the servers' own check, before joining
    return {"name": rule, "lr": float(lr), "options": options}
