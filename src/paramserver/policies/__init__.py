"""Synchronization policies and their registry (`--sync NAME`)."""

from __future__ import annotations

from paramserver.policies.asp import ASP
from paramserver.policies.base import (
    ApplyRound, Decision, Event, Joined, Left, Note, PolicyError, Pushed, Release, SyncPolicy, Tick,
)
from paramserver.policies.bsp import BSP
from paramserver.registry import Registry

SYNC_POLICIES: Registry[type[SyncPolicy]] = Registry("sync policy")
SYNC_POLICIES.register("bsp")(BSP)
SYNC_POLICIES.register("asp")(ASP)


def make_policy(name: str, batch_size: int, **options) -> SyncPolicy:
    """Build the policy registered as `name`; unknown names and options fail with a clear error."""
    cls = SYNC_POLICIES.get(name)
    try:
        return cls(batch_size=batch_size, **options)
    except TypeError as exc:
        raise ValueError(f"bad options for sync policy {name!r}: {exc}") from None


__all__ = [
    "ASP", "BSP", "ApplyRound", "Decision", "Event", "Joined", "Left", "Note", "PolicyError",
    "Pushed", "Release", "SYNC_POLICIES", "SyncPolicy", "Tick", "make_policy",
]
