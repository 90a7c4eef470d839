"""Server update rules and their registry (`--optimizer NAME`)."""

from __future__ import annotations

from paramserver.optim.adagrad_global import AdaGradGlobal
from paramserver.optim.base import Index, UpdateRule, add_at
from paramserver.optim.direction_distance import DirectionDistance
from paramserver.optim.sgd import SGD, MomentumSGD
from paramserver.optim.staleness import ConSGD, DynSGD, StalenessAware
from paramserver.optim.torch_rule import TORCH_OPTIMIZERS, TorchRule, torch_rule
from paramserver.core.options import option_help
from paramserver.core.registry import Registry

UPDATE_RULES: Registry[type[UpdateRule]] = Registry("optimizer")
UPDATE_RULES.register("sgd")(SGD)
UPDATE_RULES.register("momentum")(MomentumSGD)
UPDATE_RULES.register("consgd")(ConSGD)
UPDATE_RULES.register("dynsgd")(DynSGD)
UPDATE_RULES.register("staleness-aware")(StalenessAware)
UPDATE_RULES.register("adagrad-global")(AdaGradGlobal)
UPDATE_RULES.register("direction-distance")(DirectionDistance)
for _name, _cls in TORCH_OPTIMIZERS.items():  # torch's own, run by each shard
    UPDATE_RULES.register(_name)(torch_rule(_name, _cls))


def make_rule(name: str, lr: float, **options) -> UpdateRule:
    """Build the update rule registered as `name`; bad options fail with a clear error."""
    return UPDATE_RULES.create(name, lr=lr, **options)


def rule_options(name: str) -> dict:
    """name -> (default, help) of the options (besides lr) the rule registered as `name` takes."""
    return option_help(UPDATE_RULES.get(name))


__all__ = ["AdaGradGlobal", "ConSGD", "DirectionDistance", "DynSGD", "Index", "MomentumSGD",
           "SGD", "StalenessAware", "TORCH_OPTIMIZERS", "TorchRule", "UPDATE_RULES", "UpdateRule", "add_at", "make_rule",
           "rule_options"]
