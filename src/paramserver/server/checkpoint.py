"""A shard's part of a checkpoint on disk: written from, and read back for, the ShardCore.

Nothing read is used before it is checked against the job: the part's key range and dtype,
the shape and dtype of the values and of each optimizer state array, and the sparse tables'
snapshots (their configuration and that every key is one this shard holds). The cheap checks
(manifest against the job) come before the files are read and hashed. A shard back after a
crash whose checkpoint is unusable falls back to the previous kept one (`restore_shard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paramserver.runlog.checkpoint import (
    COORDINATOR_PART, CheckpointError, Manifest, ShardMeta, load_part, newest_usable,
    part_folder, read_manifest, write_part,
)
from paramserver.server.store import ShardStore, StoreError
from paramserver.server.tables import PREFIX, ShardTables


def part_name(rank: int) -> str:
    return f"server-{rank}"


def write_shard(root: str, tag: str, rank: int, arrays: dict, meta: dict) -> None:
    """Write a shard's snapshot (ShardCore's SaveShard) under checkpoint `tag`."""
    write_part(Path(root), tag, part_name(rank), arrays, meta)


def _expected(store: ShardStore) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The dense arrays a snapshot of `store` holds: name -> (dtype, shape)."""
    out = {"values": (store.dtype, (store.range.size,))}
    for key, tensor in store.state.items():
        out[f"state.{key}"] = (tensor.numpy().dtype, tuple(tensor.shape))
    return out


def check_manifest(manifest: Manifest, where: str, store: ShardStore) -> ShardMeta:
    """The part's meta, once its manifest fits `store`: the keys, dtype and optimizer state of
    this shard of this job, every dense array of the shape and dtype the job gives it."""
    meta = ShardMeta.from_dict(manifest.meta, where)
    r = store.range
    if (meta.lo, meta.hi) != (r.lo, r.hi) or meta.dtype != store.dtype:
        raise CheckpointError(f"{where} holds keys [{meta.lo}, {meta.hi}) ({meta.dtype}), this "
                              f"shard is [{r.lo}, {r.hi}) ({store.dtype})")
    expected = _expected(store)
    for entry in manifest.arrays:
        if entry.name.startswith(PREFIX):
            continue  # the tables are checked by ShardTables.check
        want = expected.pop(entry.name, None)
        if want is None:
            what = ("optimizer state this job's rule does not keep"
                    if entry.name.startswith("state.") else "an array no shard writes")
            raise CheckpointError(f"{where}: {entry.name!r} is {what}")
        if (entry.dtype, entry.shape) != want:
            raise CheckpointError(f"{where}: {entry.name!r} is {entry.dtype} "
                                  f"{list(entry.shape)}, this shard needs {want[0]} "
                                  f"{list(want[1])}")
    if expected:
        missing = ", ".join(map(repr, sorted(expected)))
        raise CheckpointError(f"{where}: no array {missing}, which this shard of this job "
                              f"needs (its values, its update rule's state)")
    return meta


def recut(root: Path, tag: str, store: ShardStore, tables: ShardTables | None = None,
          rank: int = 0, servers: int = 1) -> tuple[dict, dict]:
    """`store`'s range assembled from checkpoint `tag` taken on another layout (servers
    joined or left: --servers MIN:MAX): every part holding some of its keys is read (checked
    and hashed) and sliced; per-key state arrays are cut alike, any other state array is the
    shard's scalar state, taken from the part holding most of the range. With sparse `tables`
    every part is read and the rows that `servers` place on `rank` gathered
    (ShardTables.recut). The dedup table starts empty: a resumed job's workers are new
    processes."""
    r, folder = store.range, Path(root) / f"ckpt-{tag}"
    names = sorted((p.name for p in folder.glob("server-*") if p.name[7:].isdigit()),
                   key=lambda n: int(n[7:]))
    values = np.zeros(r.size, dtype=store.dtype)
    keyed: dict[str, np.ndarray] = {}
    scalars: dict[str, np.ndarray] = {}
    most, version, updates, covered = -1, 0, 0, 0
    rows: list[dict] = []  # every part's arrays, for the tables
    for name in names:
        where = str(part_folder(Path(root), tag, name))
        meta = ShardMeta.from_dict(read_manifest(Path(root), tag, name).meta, where)
        lo, hi = max(meta.lo, r.lo), min(meta.hi, r.hi)
        if lo >= hi and not tables:
            continue
        if meta.dtype != store.dtype:
            raise CheckpointError(f"{where} holds {meta.dtype} values, this shard {store.dtype}")
        arrays, _ = load_part(Path(root), tag, name)
        if tables:
            rows.append(arrays)
        if lo >= hi:
            continue
        theirs, mine = slice(lo - meta.lo, hi - meta.lo), slice(lo - r.lo, hi - r.lo)
        values[mine] = arrays["values"][theirs]
        for key, array in arrays.items():
            if not key.startswith("state."):
                continue
            if array.shape == (meta.hi - meta.lo,):
                keyed.setdefault(key, np.zeros(r.size, dtype=array.dtype))[mine] = array[theirs]
            elif hi - lo > most:
                scalars[key] = array
        most = max(most, hi - lo)
        version, updates = max(version, meta.version), max(updates, meta.updates_applied)
        covered += hi - lo
    if covered != r.size:
        raise CheckpointError(f"checkpoint {tag} in {root}: its parts hold {covered} of this "
                              f"shard's keys [{r.lo}, {r.hi})")
    arrays = {"values": values, **keyed, **scalars}
    if tables:
        try:
            arrays.update(tables.recut(rows, rank, servers))
        except StoreError as exc:
            raise CheckpointError(f"checkpoint {tag} in {root}: {exc}") from None
    for name, (dtype, shape) in _expected(store).items():
        got = arrays.get(name)
        if got is None or got.dtype != dtype or tuple(got.shape) != shape:
            raise CheckpointError(f"checkpoint {tag} in {root}: {name!r} cut for keys "
                                  f"[{r.lo}, {r.hi}) is not the {dtype} {list(shape)} this "
                                  f"shard needs")
    return arrays, {"version": version, "range": [r.lo, r.hi], "dtype": str(store.dtype),
                    "updates_applied": updates, "applied": []}


def read_shard(root: str, tag: str, rank: int, store: ShardStore,
               tables: ShardTables | None = None, servers: int = 1) -> tuple[dict, dict]:
    """The snapshot saved under `tag`, refused (CheckpointError naming the file and what is
    wrong) unless it fits `store` and `tables`: a shard must not start from another shard's
    values, nor from a file of another shape. A checkpoint whose coordinator part says it was
    taken on another number of servers (keys moved: `servers` in its state) is cut anew for
    this shard's range (`recut`)."""
    root_path = Path(root)
    where = str(part_folder(root_path, tag, part_name(rank)))
    if _taken_on_another_layout(root_path, tag, store, rank, servers if tables else None):
        return recut(root_path, tag, store, tables, rank, servers)
    manifest = read_manifest(root_path, tag, part_name(rank))
    check_manifest(manifest, where, store)  # before any file is read
    arrays, manifest = load_part(root_path, tag, part_name(rank))
    if tables is not None:
        try:
            tables.check(arrays, rank, servers)
        except StoreError as exc:
            raise CheckpointError(f"{where}: {exc}") from None
    return arrays, dict(manifest.meta)


def _taken_on_another_layout(root: Path, tag: str, store: ShardStore, rank: int,
                             servers: int | None = None) -> bool:
    """True when checkpoint `tag` records a server count (a job whose servers came and went)
    and this rank's part does not hold exactly this shard's keys, or (`servers` given: a job
    with sparse tables, placed by the count) was taken on another count."""
    try:
        state = read_manifest(root, tag, COORDINATOR_PART).meta
    except CheckpointError:
        return False  # (no coordinator part: the usual checks say what is wrong)
    if not isinstance(state.get("servers"), int):
        return False
    if servers is not None and state["servers"] != servers:
        return True
    try:
        meta = read_manifest(root, tag, part_name(rank)).meta
    except CheckpointError:
        return True  # fewer parts than this job's servers
    return meta.get("range") != [store.range.lo, store.range.hi]


@dataclass(frozen=True)
class Restored:
    """What restore_shard found: the tag used, its arrays and meta, warnings of fallbacks."""
    tag: str
    arrays: dict
    meta: dict
    warnings: tuple[str, ...] = ()


def restore_shard(root: str, tag: str, rank: int, store: ShardStore,
                  tables: ShardTables | None = None, servers: int = 1,
                  fallback: bool = False) -> Restored:
    """Checkpoint `tag` of this shard; with `fallback`, when it is unusable, the newest older
    kept one that is, with a warning naming both. CheckpointError when none is usable."""
    if not fallback:
        return Restored(tag, *read_shard(root, tag, rank, store, tables, servers))
    found: dict = {}

    def usable(t: str) -> None:
        found[t] = read_shard(root, t, rank, store, tables, servers)

    used, warnings = newest_usable(Path(root), usable, newest=tag)
    if used is None:
        raise CheckpointError(f"no usable checkpoint of shard {rank} in {root}: "
                              + "; ".join(warnings))
    return Restored(used, *found[used], tuple(warnings))
