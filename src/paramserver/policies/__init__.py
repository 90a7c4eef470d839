"""Synchronization policies and their registry (`--sync NAME`)."""

from __future__ import annotations

from paramserver.core.options import option_help
from paramserver.policies.asp import ASP
from paramserver.policies.auto import AutoSync
from paramserver.policies.base import (
    ApplyRound, Decision, Event, Joined, Left, Note, PolicyError, Pushed, Release, SyncPolicy, Tick,
)
from paramserver.policies.bsp import BSP
from paramserver.policies.dssp import DSSP
from paramserver.policies.ebsp import ElasticBSP
from paramserver.policies.host import PolicyHost
from paramserver.policies.lbbsp import LBBSP
from paramserver.policies.r2sp import R2SP
from paramserver.policies.ssp import SSP
from paramserver.core.registry import Registry

SYNC_POLICIES: Registry[type[SyncPolicy]] = Registry("sync policy")
SYNC_POLICIES.register("bsp")(BSP)
SYNC_POLICIES.register("asp")(ASP)
SYNC_POLICIES.register("ssp")(SSP)
SYNC_POLICIES.register("ebsp")(ElasticBSP)
SYNC_POLICIES.register("r2sp")(R2SP)
SYNC_POLICIES.register("lbbsp")(LBBSP)
SYNC_POLICIES.register("dssp")(DSSP)
SYNC_POLICIES.register("auto")(AutoSync)


def make_policy(name: str, batch_size: int, **options) -> SyncPolicy:
    """Build the policy registered as `name`; unknown names and options fail with a clear error."""
    return SYNC_POLICIES.create(name, batch_size=batch_size, **options)


def policy_options(name: str) -> dict:
    """name -> (default, help) of the options the policy registered as `name` takes."""
    return option_help(SYNC_POLICIES.get(name))


__all__ = [
    "ASP", "AutoSync", "BSP", "DSSP", "LBBSP", "R2SP", "SSP", "ApplyRound", "Decision", "ElasticBSP", "Event",
    "Joined", "Left", "Note", "PolicyError", "PolicyHost", "Pushed", "Release", "SYNC_POLICIES",
    "SyncPolicy", "Tick", "make_policy", "policy_options",
]
