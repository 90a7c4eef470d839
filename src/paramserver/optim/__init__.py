"""Server update rules and their registry (`--optimizer NAME`)."""

from __future__ import annotations

from paramserver.optim.base import Index, UpdateRule, add_at
from paramserver.optim.sgd import SGD, MomentumSGD
from paramserver.registry import Registry

UPDATE_RULES: Registry[type[UpdateRule]] = Registry("optimizer")
UPDATE_RULES.register("sgd")(SGD)
UPDATE_RULES.register("momentum")(MomentumSGD)


def make_rule(name: str, lr: float, **options) -> UpdateRule:
    """Build the update rule registered as `name`; bad options fail with a clear error."""
    cls = UPDATE_RULES.get(name)
    try:
        return cls(lr=lr, **options)
    except TypeError as exc:
        raise ValueError(f"bad options for optimizer {name!r}: {exc}") from None


__all__ = ["Index", "MomentumSGD", "SGD", "UPDATE_RULES", "UpdateRule", "add_at", "make_rule"]
