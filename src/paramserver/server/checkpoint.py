"""A shard's part of a checkpoint on disk: written from, and read back for, the ShardCore."""

from __future__ import annotations

from pathlib import Path

from paramserver.runlog.checkpoint import CheckpointError, read_part, write_part
from paramserver.server.store import ShardStore


def part_name(rank: int) -> str:
    return f"server-{rank}"


def write_shard(root: str, tag: str, rank: int, arrays: dict, meta: dict) -> None:
    """Write a shard's snapshot (ShardCore's SaveShard) under checkpoint `tag`."""
    write_part(Path(root), tag, part_name(rank), arrays, meta)


def read_shard(root: str, tag: str, rank: int, store: ShardStore) -> tuple[dict, dict]:
    """The snapshot saved under `tag`, refused unless it fits `store` (its keys, dtype and
    optimizer state): a shard must not start from another shard's values."""
    arrays, meta = read_part(Path(root), tag, part_name(rank))
    if meta["range"] != [store.range.lo, store.range.hi] or meta["dtype"] != str(store.dtype):
        raise CheckpointError(f"checkpoint {tag} holds keys {meta['range']} ({meta['dtype']}), "
                              f"this shard is [{store.range.lo}, {store.range.hi}) ({store.dtype})")
    for key in store.state:
        if f"state.{key}" not in arrays:
            raise CheckpointError(f"checkpoint {tag} has no optimizer state {key!r}")
    return arrays, meta
