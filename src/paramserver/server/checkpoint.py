"""Saving one shard (values, optimizer state, version) into a checkpoint, and restoring it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from paramserver.runlog.checkpoint import CheckpointError, read_part, write_part
from paramserver.server.dedup import DedupTable
from paramserver.server.store import ShardStore


def part_name(rank: int) -> str:
    return f"server-{rank}"


def save_shard(store: ShardStore, root: str, tag: str, rank: int) -> None:
    """Write the shard's values and optimizer state under checkpoint `tag`."""
    arrays = {"values": store.values.numpy()}
    arrays.update({f"state.{k}": v.numpy() for k, v in store.state.items()})
    meta = {"version": store.version, "range": [store.range.lo, store.range.hi],
            "dtype": str(store.dtype), "updates_applied": store.updates_applied,
            "rule": store.rule.name, "applied": store.applied.dump()}
    write_part(Path(root), tag, part_name(rank), arrays, meta)


def restore_shard(store: ShardStore, root: str, tag: str, rank: int,
                  version_floor: int = 0) -> int:
    """Load the shard saved under `tag`; returns how many updates were applied since (lost).

    The version is lifted to `version_floor` (the rounds the coordinator has applied) so that
    pulls waiting for the job's current version are served instead of waiting forever.
    """
    arrays, meta = read_part(Path(root), tag, part_name(rank))
    if meta["range"] != [store.range.lo, store.range.hi] or meta["dtype"] != str(store.dtype):
        raise CheckpointError(f"checkpoint {tag} holds keys {meta['range']} ({meta['dtype']}), "
                              f"this shard is [{store.range.lo}, {store.range.hi}) ({store.dtype})")
    store.values.copy_(torch.from_numpy(np.ascontiguousarray(arrays["values"])))
    for key, tensor in store.state.items():
        saved = arrays.get(f"state.{key}")
        if saved is None:
            raise CheckpointError(f"checkpoint {tag} has no optimizer state {key!r}")
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(saved)))
    store.initialized = True
    store.updates_applied = meta["updates_applied"]
    # The pushes in the checkpoint stay applied once: their retries are answered, not re-applied.
    store.applied = DedupTable.load(meta.get("applied", []), store.applied.window,
                                    store.applied.senders)
    lost = max(0, version_floor - meta["version"])
    store.version = max(meta["version"], version_floor)
    return lost
