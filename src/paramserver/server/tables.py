"""A shard's sparse tables: name -> SparseTable, and the rows pushed into the open round.

Beside the dense values a shard holds its share of each of the job's sparse tables (the keys
that paramserver.sparse.placement.shard_of places on it). In arrival mode pushed rows go to the
table at once; in round mode they are kept, batch-weighted like the dense values
(store.ShardStore._accumulate), and applied with the round, averaged over the round's batches.
Duplicate keys, within one push or across the round's pushes, are summed by SparseTable.push.

Everything a request carries is checked before anything changes: a refused push leaves the
tables as they were.
"""

from __future__ import annotations

import numpy as np

from paramserver.server.handoff import RowsAssembly
from paramserver.server.store import StoreError
# (the wire's limit, wire.protocol.MAX_KEYS_PER_REQUEST, is the same number: a test checks)
from paramserver.sparse import moves
from paramserver.sparse.moves import RowBundle
from paramserver.sparse.placement import shard_of
from paramserver.sparse.table import (MAX_KEYS_PER_REQUEST, SNAPSHOT_PREFIX, SparseTable,
                                      TableError)

# The arrays of table `name` in a shard's checkpoint are named PREFIX + name + "." + array.
PREFIX = SNAPSHOT_PREFIX
# The open round's rows in a backup's state sync: ROUND_PREFIX + table + ".keys" / ".grads".
ROUND_PREFIX = "round_rows."
# Counters summed over tables for the heartbeat (a metrics record holds at most 64 fields; the
# status reply has every table's own).
BEAT_COUNTERS = ("rows", "created", "admitted", "not_admitted", "dropped", "evicted")


def placed_elsewhere(keys: np.ndarray, rank: int, servers: int) -> bool:
    """Some of `keys` belong to another shard than `rank` of `servers`."""
    return bool(keys.size) and bool((shard_of(keys, servers) != rank).any())


class ShardTables:
    """The sparse tables of one shard and the round's rows not yet applied."""

    def __init__(self, specs, servers: int, seed: int = 0):
        """`specs`: the job's TableSpecs; each table keeps ceil(row_budget / servers) rows."""
        self.tables = {s.name: SparseTable.of(s, s.capacity(servers), seed=seed) for s in specs}
        self.dims = {s.name: s.dim for s in specs}
        self._specs, self._seed = {s.name: s for s in specs}, seed
        # Round mode: (keys, batch-weighted grads) pushed this round, by table.
        self._round: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.round_rows = 0  # rows held for the open round

    def __bool__(self) -> bool:
        return bool(self.tables)

    # ---- checks ---------------------------------------------------------------------------------
    def checked(self, name: str, keys: np.ndarray, grads: np.ndarray | None = None):
        """(table, grads as (len(keys), dim)) for a request, or StoreError naming what is wrong."""
        table = self.tables.get(name)
        if table is None:
            known = ", ".join(sorted(self.tables)) or "none"
            raise StoreError(f"unknown table {name!r} (this job's tables: {known})")
        if keys.dtype != np.int64:
            raise StoreError(f"table {name!r}: keys must be int64, got {keys.dtype}")
        if keys.size > MAX_KEYS_PER_REQUEST:
            raise StoreError(f"table {name!r}: {keys.size} keys in one request; at most "
                             f"{MAX_KEYS_PER_REQUEST} are served (split the batch)")
        if grads is None:
            return table, None
        dim = self.dims[name]
        if grads.dtype != np.float32:
            raise StoreError(f"table {name!r}: gradients must be float32, got {grads.dtype}")
        if grads.size != keys.size * dim:
            raise StoreError(f"table {name!r} has rows of {dim} values: {keys.size} keys need "
                             f"{keys.size * dim} gradient values, got {grads.size}")
        return table, grads.reshape(keys.size, dim)

    # ---- reads and updates ----------------------------------------------------------------------
    def pull(self, name: str, keys: np.ndarray) -> np.ndarray:
        table, _ = self.checked(name, keys)
        return table.pull(keys)

    @staticmethod
    def apply(table: SparseTable, keys: np.ndarray, grads: np.ndarray, scale: float) -> None:
        """Arrival mode: the rows' update now."""
        table.push(keys, grads, scale=scale)

    def add_to_round(self, name: str, keys: np.ndarray, grads: np.ndarray,
                     weight: float) -> None:
        """Round mode: keep the rows, weighted by the pusher's batch times its scale."""
        if not keys.size:
            return
        # A copy either way: the frames the rows came in go back to the socket's pool.
        weighted = grads * np.float32(weight) if weight != 1 else grads.copy()
        self._round.setdefault(name, []).append((keys.copy(), weighted))
        self.round_rows += keys.size

    def apply_round(self, total_batch: int) -> None:
        """The round's rows, averaged over its `total_batch` samples, as one push per table."""
        scale = 1.0 / max(total_batch, 1)
        for name, parts in self._round.items():
            keys = np.concatenate([k for k, _ in parts])
            grads = np.concatenate([g for _, g in parts])
            self.tables[name].push(keys, grads, scale=scale)
        self.drop_round()

    def drop_round(self) -> None:
        self._round, self.round_rows = {}, 0

    def round_arrays(self) -> dict[str, np.ndarray]:
        """The open round's rows, already weighted, one keys and one grads array per table
        (for a backup's state sync: applied with the round there as here)."""
        out = {}
        for name, parts in self._round.items():
            out[f"{ROUND_PREFIX}{name}.keys"] = np.concatenate([k for k, _ in parts])
            out[f"{ROUND_PREFIX}{name}.grads"] = np.concatenate([g for _, g in parts])
        return out

    def load_round(self, arrays: dict) -> None:
        """The open round's rows of `round_arrays` (any round held before is dropped);
        StoreError, nothing kept, when they do not fit the tables."""
        found = []
        for key, keys in arrays.items():
            if key.startswith(ROUND_PREFIX) and key.endswith(".keys"):
                name = key[len(ROUND_PREFIX):-len(".keys")]
                grads = arrays.get(f"{ROUND_PREFIX}{name}.grads")
                if grads is None:
                    raise StoreError(f"the open round's rows of table {name!r} came without "
                                     f"their gradients")
                found.append((name, keys, self.checked(name, keys, grads.reshape(-1))[1]))
        self.drop_round()
        for name, keys, grads in found:
            self.add_to_round(name, keys, grads, 1.0)

    # ---- counters and checkpoints ---------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        """Each table's counters (SparseTable.counters), by table name."""
        return {name: dict(t.counters()) for name, t in self.tables.items()}

    def beat_counters(self) -> dict[str, int]:
        """The counters summed over tables, named table_<counter>, for the heartbeat."""
        out = dict.fromkeys((f"table_{c}" for c in BEAT_COUNTERS), 0)
        for counters in self.counters().values():
            for c in BEAT_COUNTERS:
                out[f"table_{c}"] += int(counters.get(c, 0))
        return out

    def snapshot(self) -> dict[str, np.ndarray]:
        """Every table's rows that exist, and their optimizer and admission state."""
        out = {}
        for name, table in self.tables.items():
            out.update({f"{PREFIX}{name}.{k}": v for k, v in table.snapshot().items()})
        return out

    def _split(self, arrays: dict) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for key, value in arrays.items():
            if key.startswith(PREFIX):
                name, _, array = key[len(PREFIX):].partition(".")
                found.setdefault(name, {})[array] = value
        unknown = sorted(set(found) - set(self.tables))
        if unknown:
            raise StoreError(f"the checkpoint holds tables {unknown} this job does not have")
        return found

    def check(self, arrays: dict, rank: int, servers: int) -> None:
        """StoreError unless a checkpoint's arrays make valid tables of this job whose every
        key (rows and admission candidates) is one shard `rank` of `servers` holds; nothing
        changes."""
        for name, table_arrays in self._split(arrays).items():
            try:
                self.tables[name].check(table_arrays)
            except TableError as exc:
                raise StoreError(f"table {name!r}: {exc}") from None
            for kind in ("keys", "cand_keys"):
                keys = table_arrays.get(kind)
                if keys is None or not keys.size:
                    continue
                elsewhere = shard_of(keys, servers) != rank
                if elsewhere.any():
                    raise StoreError(f"table {name!r}: {int(elsewhere.sum())} of its "
                                     f"{kind.replace('_', ' ')} belong to other shards than "
                                     f"{rank} of {servers} (e.g. key {keys[elsewhere][0]})")

    # ---- rows changing shards (sparse/moves.py) -------------------------------------------------
    def split(self, servers: int) -> list[dict[str, RowBundle]]:
        """Every table's rows and candidates by their shard under `servers` servers: for each
        new rank {table: bundle}, every table named (nothing changes here)."""
        out = [{name: RowBundle.empty(t.dim, t.adagrad)
                for name, t in self.tables.items()} for _ in range(servers)]
        for name, table in self.tables.items():
            for rank, bundle in moves.split(table, lambda k: shard_of(k, servers)).items():
                out[rank][name] = bundle
        return out

    def assembly(self):
        """An empty handoff.RowsAssembly for these tables (None without tables)."""
        if not self.tables:
            return None
        return RowsAssembly(dict(self.dims), {n: t.adagrad for n, t in self.tables.items()})

    def gather(self, bundles: dict[str, list[RowBundle]], counters: dict[str, dict]) -> int:
        """Every table made of the bundles it got (this shard's own rows among them), within
        its capacity; `counters`: the tables' own before the move. Returns the rows evicted."""
        return sum(moves.gather(table, bundles.get(name, []), counters.get(name))
                   for name, table in self.tables.items())

    def recut(self, parts: list[dict], rank: int, servers: int) -> dict[str, np.ndarray]:
        """Snapshot arrays of this shard's tables (`rank` of `servers`) gathered from the
        arrays of every part of a checkpoint taken on another server count: each part's tables
        checked as a table of its own capacity, then split by the new placement. The counters
        start again; nothing here changes. StoreError naming the table when a part is bad."""
        out = {}
        for name, table in self.tables.items():
            bundles = []
            for arrays in parts:
                saved = self._split(arrays).get(name)
                if not saved:
                    continue
                try:
                    capacity = int(np.asarray(saved["meta_i"]).reshape(-1)[3])
                    source = SparseTable.of(self._specs[name], capacity, seed=self._seed)
                    source.restore(saved)
                except (TableError, KeyError, IndexError, TypeError, ValueError) as exc:
                    raise StoreError(f"table {name!r} of a checkpoint part: {exc}") from None
                bundle = moves.split(source, lambda k: shard_of(k, servers)).get(rank)
                if bundle is not None:
                    bundles.append(bundle)
            fresh = SparseTable.of(self._specs[name], table.config.capacity, seed=self._seed)
            try:
                moves.gather(fresh, bundles, None)
            except TableError as exc:
                raise StoreError(f"table {name!r}: {exc}") from None
            out.update({f"{PREFIX}{name}.{k}": v for k, v in fresh.snapshot().items()})
        return out

    def restore(self, arrays: dict) -> None:
        """The tables of a checkpoint's arrays (a table the checkpoint lacks stays empty)."""
        for name, table_arrays in self._split(arrays).items():
            self.tables[name].restore(table_arrays)
        self.drop_round()
