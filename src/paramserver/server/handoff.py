"""Live resharding, a shard's side of moving key ranges (RESHARD_API.md): pure, no sockets.

A reshard replaces the layout `[[rank, addr, lo, hi], ...]` (ranks in key order, contiguous,
covering the key space) by a new one. Each server finds its old and new entries by its
address (plan()): the keys of its old range that another server owns now are cut into pieces
(cut()) and sent there; the keys it keeps and the pieces it receives are assembled into its
new range (Assembly), which tracks the keys still missing. Once nothing is missing the state
is installed into the new range's store (Assembly.install) and the server reports.

What moves with a key: its value and every per-key optimizer state array (momentum, a
worker's accumulator, ...), sliced like the values. Scalar state (an array of another shape:
a per-worker norm, a push counter) describes the whole old shard and cannot be split by key:
the new shard takes that of the contributor of most keys (its kept part if it keeps any).
A state array counts as per-key when it has the values' shape and dtype; in a shard of one or
two keys a scalar state array of that shape would be taken for a per-key one.

Sparse tables' rows are placed by a hash modulo the server count, not by range, so every
server of the old layout sends every other server of the new one the rows it now owns
(`rows_pieces`, sparse/moves.py), at least one piece, its last one saying how many it sent;
a new share is whole once its dense keys are and every old server's pieces are in
(`RowsAssembly`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paramserver.server.store import ShardStore, StoreError, merge_runs
from paramserver.sparse.moves import RowBundle
from paramserver.sparse.table import TableError
from paramserver.spec.welcome import ShardAddress, ShardLayout


class HandoffError(ValueError):
    """A layout or a handoff piece that does not fit this reshard."""


# ---- layouts ------------------------------------------------------------------------------------
def parse_layout(raw, epoch: int = 0) -> tuple[ShardAddress, ...]:
    """A wire layout as ShardAddresses, checked (spec/welcome.py ShardLayout, as clients read
    it): ranks 0..n-1 in order, ranges contiguous from key 0, one entry per address."""
    try:
        return ShardLayout.parse(epoch, raw).shards
    except ValueError as exc:
        raise HandoffError(str(exc)) from None


def layout_list(layout: tuple[ShardAddress, ...]) -> list:
    """The wire form of a parsed layout."""
    return [s.to_list() for s in layout]


def _entry(layout: tuple[ShardAddress, ...], addr: str) -> ShardAddress | None:
    return next((s for s in layout if s.addr == addr), None)


def _overlap(a_lo: int, a_hi: int, b_lo: int, b_hi: int) -> tuple[int, int] | None:
    lo, hi = max(a_lo, b_lo), min(a_hi, b_hi)
    return (lo, hi) if lo < hi else None


@dataclass(frozen=True)
class Move:
    """One server's part of reshard `epoch`: its entries in the old and new layouts (None:
    it joins, it is drained), the key ranges it sends to whom, and the range it keeps."""

    epoch: int
    old: ShardAddress | None
    new: ShardAddress | None
    sends: tuple[tuple[str, int, int], ...]  # (receiver's addr, lo, hi)
    kept: tuple[int, int] | None

    @property
    def drained(self) -> bool:
        return self.new is None


def plan(epoch: int, old_raw, new_raw, addr: str) -> Move:
    """What server `addr` does in reshard `epoch` from layout `old_raw` to `new_raw`."""
    old, new = parse_layout(old_raw, max(epoch - 1, 0)), parse_layout(new_raw, epoch)
    if old[-1].hi != new[-1].hi:
        raise HandoffError(f"the new layout covers {new[-1].hi} keys, the old {old[-1].hi}")
    mine_old, mine_new = _entry(old, addr), _entry(new, addr)
    if mine_old is None and mine_new is None:
        raise HandoffError(f"server {addr} is in neither layout of reshard {epoch}")
    sends, kept = [], None
    if mine_old is not None:
        for shard in new:
            part = _overlap(mine_old.lo, mine_old.hi, shard.lo, shard.hi)
            if part is None:
                continue
            if shard.addr == addr:
                kept = part
            else:
                sends.append((shard.addr, *part))
    return Move(epoch, mine_old, mine_new, tuple(sends), kept)


# ---- pieces -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """The state of keys [lo, hi) of a shard at `version`: values, per-key state arrays
    (name, array) in order, the shard's scalar state and its last applied round."""

    lo: int
    hi: int
    version: int
    values: np.ndarray
    state: tuple[tuple[str, np.ndarray], ...] = ()
    scalars: tuple[tuple[str, np.ndarray], ...] = ()
    last_round: int | None = None

    def message(self, epoch: int) -> tuple[dict, list]:
        """A `handoff` message's (fields, arrays): frame 0 the values, then each state array
        in the order meta["state"] names them; the scalar state in meta as [dtype, shape,
        values] (JSON-able: nothing unpickled on the other side)."""
        meta = {"state": [name for name, _ in self.state],
                "scalars": {name: [str(a.dtype), list(a.shape), a.reshape(-1).tolist()]
                            for name, a in self.scalars},
                "last_round": self.last_round}
        fields = {"epoch": epoch, "lo": self.lo, "hi": self.hi, "version": self.version,
                  "meta": meta}
        return fields, [self.values, *(a for _, a in self.state)]

    @classmethod
    def parse(cls, fields: dict, arrays: list, dtype) -> "Piece":
        """A received `handoff` as a Piece, its frames checked against its range and dtype."""
        lo, hi, meta = fields["lo"], fields["hi"], fields.get("meta") or {}
        if hi <= lo:
            raise HandoffError(f"handoff of an empty range [{lo}, {hi})")
        names = meta.get("state", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise HandoffError("handoff meta['state'] must list the state arrays' names")
        if len(arrays) != 1 + len(names):
            raise HandoffError(f"handoff names {len(names)} state arrays but carries "
                               f"{len(arrays) - 1}")
        dtype = np.dtype(dtype)
        for a in arrays:
            if a.dtype != dtype or a.shape != (hi - lo,):
                raise HandoffError(f"handoff of [{lo}, {hi}): an array of {a.dtype} "
                                   f"{a.shape}, expected {dtype} ({hi - lo},)")
        scalars = []
        for name, spec in (meta.get("scalars") or {}).items():
            try:
                sdtype, shape, data = spec
                scalars.append((name, np.asarray(data, dtype=sdtype).reshape(shape)))
            except (TypeError, ValueError) as exc:
                raise HandoffError(f"handoff scalar state {name!r}: {exc}") from None
        last = meta.get("last_round")
        if last is not None and not isinstance(last, int):
            raise HandoffError(f"handoff last_round {last!r} is not an int")
        return cls(lo, hi, fields["version"], arrays[0], tuple(zip(names, arrays[1:])),
                   tuple(scalars), last)


# A server's frame limit derived from its job (JobSpec.message_limit) is above the job's
# chunk_bytes plus 1 MB whatever its range; a limit set outright is every server's.
SAFE_PIECE_BYTES = 1 << 20


def piece_keys(itemsize: int, limit: int, chunk_bytes: int = 0, arrays: int = 1) -> int:
    """Keys per piece of `arrays` arrays (the values and the per-key state): all of them
    together at most the job's `chunk_bytes` (0: not known, 1 MB) and half this server's frame
    limit (`limit`), so that a piece fits every receiver's."""
    piece = min(chunk_bytes or SAFE_PIECE_BYTES, limit // 2)
    return max(1, piece // (max(1, itemsize) * max(1, arrays)))


def keyed_state(store: ShardStore) -> tuple[list[str], list[str]]:
    """(per-key state names, scalar state names) of the store's rule, sorted."""
    keyed, scalar = [], []
    for name in sorted(store.state):
        (keyed if store.rule.keyed(name, store.state[name], store.values) else scalar).append(
            name)
    return keyed, scalar


def cut(store: ShardStore, lo: int, hi: int, max_keys: int) -> list[Piece]:
    """Keys [lo, hi) of `store` as pieces of at most `max_keys` keys each (copies: the
    store's buffers may change once the pieces are out)."""
    if max_keys < 1:
        raise HandoffError("pieces need at least one key")
    arrays, meta = store.snapshot()  # views of the live values and state
    keyed, scalar = keyed_state(store)
    scalars = tuple((n, np.array(arrays[f"state.{n}"])) for n in scalar)
    base = store.range.lo
    store.local(lo, hi)  # (refuses keys outside the store)
    out = []
    for a in range(lo, hi, max_keys):
        b = min(hi, a + max_keys)
        part = slice(a - base, b - base)
        out.append(Piece(a, b, meta["version"], np.array(arrays["values"][part]),
                         tuple((n, np.array(arrays[f"state.{n}"][part])) for n in keyed),
                         scalars, store.last_round))
    return out


# ---- assembly -----------------------------------------------------------------------------------
class Assembly:
    """A new range [lo, hi) of dtype `dtype` filling up from the kept part and received
    pieces; every key must come exactly once."""

    def __init__(self, lo: int, hi: int, dtype):
        if not 0 <= lo <= hi:
            raise HandoffError(f"bad range [{lo}, {hi})")
        self.lo, self.hi = lo, hi
        self.dtype = np.dtype(dtype)
        self.values = np.zeros(hi - lo, dtype=self.dtype)
        self.state: dict[str, np.ndarray] = {}  # per-key arrays, zeros where no piece had one
        self.version = 0
        self.last_round: int | None = None
        self._runs: list[tuple[int, int]] = []  # keys covered, merged
        self._scalars: tuple = ()
        self._scalar_keys = -1  # keys of the contributor the scalar state came from
        self._kept_scalars = False
        self.rows: RowsAssembly | None = None  # a job with sparse tables: their rows

    def keep(self, store: ShardStore, lo: int, hi: int) -> None:
        """The keys [lo, hi) this server's old `store` keeps (its scalar state wins)."""
        (piece,) = cut(store, lo, hi, hi - lo)
        self.add(piece)
        self._scalars, self._kept_scalars = piece.scalars, True

    def add(self, piece: Piece) -> None:
        """Take a piece; refused when outside the range or overlapping a key already had."""
        lo, hi = piece.lo, piece.hi
        if not self.lo <= lo < hi <= self.hi:
            raise HandoffError(f"piece [{lo}, {hi}) is outside the new range "
                               f"[{self.lo}, {self.hi})")
        if any(a < hi and lo < b for a, b in self._runs):
            raise HandoffError(f"piece [{lo}, {hi}) overlaps keys already received")
        if piece.values.dtype != self.dtype:
            raise HandoffError(f"piece of {piece.values.dtype}, the shard holds {self.dtype}")
        part = slice(lo - self.lo, hi - self.lo)
        self.values[part] = piece.values
        for name, array in piece.state:
            if name not in self.state:
                self.state[name] = np.zeros(self.hi - self.lo, dtype=array.dtype)
            self.state[name][part] = array
        self._runs = merge_runs(self._runs, lo, hi)
        self.version = max(self.version, piece.version)
        if piece.last_round is not None:
            self.last_round = max(self.last_round or 0, piece.last_round)
        if not self._kept_scalars and hi - lo > self._scalar_keys:
            self._scalars, self._scalar_keys = piece.scalars, hi - lo

    def missing(self) -> list[tuple[int, int]]:
        """The key runs of the new range no piece has brought yet."""
        out, at = [], self.lo
        for a, b in self._runs:
            if a > at:
                out.append((at, a))
            at = b
        if at < self.hi:
            out.append((at, self.hi))
        return out

    @property
    def whole(self) -> bool:
        return not self.missing() and (self.rows is None or self.rows.whole)

    def install(self, store: ShardStore, version_floor: int = 0) -> None:
        """Make `store` (a fresh one of this range, the rule's state as it starts) hold the
        assembled state at version max(pieces', floor)."""
        if not self.whole:
            raise HandoffError(f"keys {self.missing()} of [{self.lo}, {self.hi}) or rows from "
                               f"servers {self.rows and self.rows.waiting()} are missing")
        if (store.range.lo, store.range.hi) != (self.lo, self.hi):
            raise StoreError(f"a store of [{store.range.lo}, {store.range.hi}) cannot take "
                             f"[{self.lo}, {self.hi})")
        arrays = {"values": self.values}
        for name, tensor in store.state.items():  # the rule's own arrays, zeros if none came
            arrays[f"state.{name}"] = self.state.get(name, tensor.numpy())
        store.restore(arrays, {"version": max(self.version, version_floor),
                               "updates_applied": store.updates_applied})
        for name, array in self.state.items():  # a worker's arrays, made on its first push
            if name not in store.state:
                store.state[name] = torch.from_numpy(array)
        for name, array in self._scalars:
            store.state[name] = torch.from_numpy(np.array(array))
        store.last_round = self.last_round


# ---- sparse tables' rows ------------------------------------------------------------------------
def rows_pieces(bundles: dict[str, RowBundle], max_items: int) -> list[tuple[str, RowBundle]]:
    """(table, piece) of every table's bundle for one receiver, at least one piece in all."""
    out = [(name, piece) for name in sorted(bundles)
           for piece in bundles[name].pieces(max_items) if piece.items]
    if not out and bundles:
        name = min(bundles)
        out = [(name, bundles[name].take(slice(0, 0), slice(0, 0)))]
    return out


class RowsAssembly:
    """The rows of a new share of the sparse tables: the shard's own (`keep`) and the pieces
    of every other server of the old layout (`add`), each sender's last piece saying how many
    it sent. Senders are known from the old layout (`expect`; a joining server learns it after
    its welcome, pieces may come first)."""

    def __init__(self, dims: dict[str, int], adagrad: dict[str, bool]):
        self.dims, self.adagrad = dims, adagrad
        self.bundles: dict[str, list[RowBundle]] = {name: [] for name in dims}
        self.senders: frozenset[int] | None = None  # old ranks to hear from
        self._got: dict[int, int] = {}
        self._said: dict[int, int] = {}

    def expect(self, senders) -> None:
        senders = frozenset(int(s) for s in senders)
        strays = set(self._got) - senders
        if strays:
            raise HandoffError(f"rows came from servers {sorted(strays)}, not of the old layout")
        self.senders = senders

    def keep(self, bundles: dict[str, RowBundle]) -> None:
        for name, bundle in bundles.items():
            self.bundles[name].append(bundle)

    def add(self, sender: int, table: str, tick: int, frames: list, total: int | None) -> None:
        """A piece from old rank `sender`; `total`: its count of pieces, on its last one."""
        if table not in self.dims:
            raise HandoffError(f"rows of table {table!r}, which this job does not have")
        if self.senders is not None and sender not in self.senders:
            raise HandoffError(f"rows from server {sender}, which sends none in this reshard")
        if sender in self._said:
            raise HandoffError(f"rows from server {sender} after its last piece")
        try:
            bundle = RowBundle.from_frames(tick, frames, self.dims[table], self.adagrad[table])
        except TableError as exc:
            raise HandoffError(f"rows of table {table!r} from server {sender}: {exc}") from None
        got = self._got.get(sender, 0) + 1
        if total is not None and total != got:
            raise HandoffError(f"server {sender} said {total} piece(s) of rows, {got} came")
        self._got[sender] = got
        if total is not None:
            self._said[sender] = total
        self.bundles[table].append(bundle)

    def waiting(self) -> list[int] | None:
        """Old ranks whose pieces are not all in (None: the old layout not known yet)."""
        if self.senders is None:
            return None
        return sorted(s for s in self.senders if s not in self._said)

    @property
    def whole(self) -> bool:
        return self.senders is not None and not self.waiting()
