"""A checkpoint as a whole: the coordinator's part on disk (its node writes it, and reads it
to resume), and the checks every part of a kept checkpoint must pass.

`usable_checkpoint` is what a resume (or a restarted coordinator) starts from: the newest kept
checkpoint whose every part passes the checks (the coordinator's state typed, each shard's
manifest and files, the shards' key ranges tiling the key space in the job's dtype), with a
warning for each newer one refused, naming both it and the one used instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from paramserver.runlog.checkpoint import (
    COORDINATOR_PART, CheckpointError, CheckpointWriteError, ShardMeta, commit, newest_usable,
    part_folder, read_part, unwritable, verify_part, write_part,
)

# The fields of the coordinator's saved state a resume reads (CoordinatorState, PolicyHost).
_COUNTS = ("rounds_applied", "samples_done", "steps_done", "num_keys")


def save_coordinator_state(root: str | Path, tag: str, state: dict) -> None:
    """Write the coordinator's part of checkpoint `tag` and commit the tag."""
    write_part(Path(root), tag, COORDINATOR_PART, {}, state)
    try:
        commit(Path(root), tag)
    except OSError as exc:
        raise CheckpointWriteError(unwritable(Path(root), tag, exc, 4096)) from None


def check_coordinator_state(state: Mapping[str, Any], where: str) -> dict:
    """`state` once every field a resume reads is there and of its kind (CheckpointError
    naming the field otherwise)."""
    def bad(key: str, want: str) -> CheckpointError:
        if key not in state:
            return CheckpointError(f"{where}: coordinator state field {key!r} is missing")
        return CheckpointError(f"{where}: coordinator state field {key!r} must be {want}, got "
                               f"{state[key]!r}")

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    for key in _COUNTS:
        if not count(state.get(key)):
            raise bad(key, "an integer >= 0")
    samples = state.get("worker_samples")
    if not isinstance(samples, dict) or not all(
            isinstance(k, str) and k.isdigit() and count(v) for k, v in samples.items()):
        raise bad("worker_samples", "an object of rank -> samples")
    if not isinstance(state.get("policy", {}), dict):
        raise bad("policy", "an object")
    elapsed = state.get("elapsed_s", 0.0)
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or elapsed < 0:
        raise bad("elapsed_s", "a number >= 0")
    return dict(state)


def load_coordinator_state(root: str | Path, tag: str) -> dict:
    """The coordinator's saved state of checkpoint `tag` (files and fields checked)."""
    _, meta = read_part(Path(root), tag, COORDINATOR_PART)
    return check_coordinator_state(meta, str(part_folder(Path(root), tag, COORDINATOR_PART)))


def check_checkpoint(root: str | Path, tag: str, servers: int, dtype: str,
                     num_keys: int | None = None) -> int:
    """CheckpointError unless checkpoint `tag` is whole and fits a job of `servers` shards
    holding `num_keys` (when given) `dtype` values: the coordinator's state, and each shard's
    part with its files (sizes, headers, checksums), its values one per key of its range, the
    shards' ranges tiling [0, num_keys) in rank order. These are the checks the shards make
    on restore, so that one picked here is not refused there (a resume falls back past it).
    Returns the number of shard parts: a job whose servers joined or left (--servers
    MIN:MAX) records how many it had at the checkpoint, which wins over `servers`."""
    root = Path(root)
    state = load_coordinator_state(root, tag)
    if num_keys is not None and state["num_keys"] != num_keys:
        raise CheckpointError(f"checkpoint {tag} in {root} holds {state['num_keys']} "
                              f"parameters, the job {num_keys}: another model's")
    recorded = state.get("servers")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        servers = recorded
    lo = 0
    for rank in range(servers):
        part = f"server-{rank}"
        manifest = verify_part(root, tag, part)
        meta = ShardMeta.from_dict(manifest.meta, str(part_folder(root, tag, part)))
        if str(meta.dtype) != dtype:
            raise CheckpointError(f"{part_folder(root, tag, part)} holds {meta.dtype} values, "
                                  f"the job {dtype}")
        values = manifest.array("values")
        if values is None or tuple(values.shape) != (meta.hi - meta.lo,):
            shape = "none" if values is None else list(values.shape)
            raise CheckpointError(f"{part_folder(root, tag, part)} holds values of shape "
                                  f"{shape} for keys [{meta.lo}, {meta.hi})")
        if meta.lo != lo:
            raise CheckpointError(f"{part_folder(root, tag, part)} holds keys [{meta.lo}, "
                                  f"{meta.hi}), shard {rank} of {servers} starts at {lo}")
        lo = meta.hi
    if lo != state["num_keys"]:
        raise CheckpointError(f"checkpoint {tag} in {root}: its {servers} shards hold keys "
                              f"[0, {lo}) of the job's {state['num_keys']}")
    return servers


def usable_checkpoint(root: str | Path, servers: int, dtype: str,
                      newest: str | None = None,
                      num_keys: int | None = None) -> tuple[str | None, list[str]]:
    """(tag, warnings): the newest kept checkpoint in `root` (from `newest`, LATEST when None)
    that passes check_checkpoint, and a warning for each newer one that did not, naming it
    and the one used instead; (None, the reasons) when none passes."""
    return newest_usable(
        Path(root), lambda tag: check_checkpoint(root, tag, servers, dtype, num_keys), newest)
