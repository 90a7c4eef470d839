"""The coordinator's part of a checkpoint on disk: the node writes it, and reads it to resume."""

from __future__ import annotations

from pathlib import Path

from paramserver.runlog.checkpoint import commit, read_part, write_part

COORDINATOR_PART = "coordinator"


def save_coordinator_state(root: str | Path, tag: str, state: dict) -> None:
    """Write the coordinator's part of checkpoint `tag` and commit the tag."""
    write_part(Path(root), tag, COORDINATOR_PART, {}, state)
    commit(Path(root), tag)


def load_coordinator_state(root: str | Path, tag: str) -> dict:
    """The coordinator's saved state of checkpoint `tag` (checksums verified)."""
    _, meta = read_part(Path(root), tag, COORDINATOR_PART)
    return meta
