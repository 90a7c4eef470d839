"""One shard's state: values, version, optimizer state and the round aggregate; no sockets."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from paramserver.core.keyspace import KeyRange
from paramserver.optim import UpdateRule, add_at
from paramserver.server.idle_keys import RoundIdle, local_idle

# Frames from the wire are read-only buffers. torch warns when it wraps one because it cannot
# promise not to write; the store only ever reads through these views.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


# Older value buffers kept for copy on write (a push while a pull reply still reads the values
# in place): up to 3 for a small shard, as many as fit in SPARE_BYTES for a large one but at
# least 1, so a 1 GB shard keeps one spare copy, not three.
MAX_SPARES = 3
SPARE_BYTES = 256 << 20


def spare_buffers(nbytes: int) -> int:
    """Retired value buffers a shard of `nbytes` keeps for copy on write."""
    return max(1, min(MAX_SPARES, SPARE_BYTES // max(int(nbytes), 1)))


class StoreError(ValueError):
    """A request this shard cannot serve (outside its range, wrong dtype, wrong round...)."""


@dataclass
class PushResult:
    version: int
    staleness: int


class ShardStore:
    """Keys [lo, hi) of the flat vector, updated on arrival or per round by one update rule."""

    def __init__(self, key_range: KeyRange, dtype: str, rule: UpdateRule, apply_mode: str,
                 alloc=None):
        """`alloc()`, when given, returns a zeroed array for the shard's values (or None): the
        server puts them in memory that pull replies can be read from in place (shared memory)."""
        if apply_mode not in ("arrival", "round"):
            raise ValueError(f"unknown apply mode {apply_mode!r}")
        self.range = key_range
        self.dtype = np.dtype(dtype)
        self._alloc = alloc
        self.values = self._new_buffer() if alloc else torch.zeros(
            key_range.size, dtype=getattr(torch, dtype))
        self.rule = rule
        rule.bind(key_range.lo, key_range.hi)
        self.state = rule.init_state(self.values)
        self.apply_mode = apply_mode
        self.version = 0
        self.initialized = False
        self._init_runs: list[tuple[int, int]] = []  # local runs an init has set, merged
        self.updates_applied = 0
        # Round mode: the running sum of batch-weighted pushes of the current round only.
        self.round_step: int | None = None
        self.round_sum: torch.Tensor | None = None
        self.round_batches: dict[str, int] = {}
        # Contributors the open round waits for, as its pushes say (0: not said): once that
        # many have sent all their parts, the round is full and may be applied without waiting
        # to be told. A contributor's step may reach this shard in several messages (chunks of
        # a large push, a table's rows beside the dense values): each says how many (`parts`).
        self.round_size = 0
        self.round_got: dict[str, int] = {}  # pushes received this round, by contributor
        self.round_need: dict[str, int] = {}  # parts announced, by contributor
        self.round_complete = 0  # contributors whose every part is in
        self.last_round: int | None = None  # the last round applied, full or told
        self.late_pushes = 0  # pushes for a round applied already: dropped
        # The round's keys no push used, for a rule that leaves out what got no gradient.
        self.round_idle = RoundIdle() if rule.skips_idle else None
        # Called with a round's summed batches each time one is applied (the shard's sparse
        # tables apply their rows of the round with it), whatever applied it.
        self.round_applied = None
        # Replies still being sent from views of `values` (see read(shared=True) and lend()),
        # and older value buffers that replies in flight may still read.
        self._loans: list = []
        self._retired: list[tuple[torch.Tensor, list]] = []
        self.spares = spare_buffers(key_range.size * self.dtype.itemsize)
        self.copies_on_write = 0

    # ---- reads and writes of raw values ---------------------------------------------------------
    def local(self, lo: int, hi: int) -> slice:
        r = self.range
        if not r.lo <= lo <= hi <= r.hi:  # (no KeyRange built on the way: every push passes)
            KeyRange(lo, hi)  # a malformed range is refused as such
            raise StoreError(f"keys [{lo}, {hi}) are outside this shard's [{r.lo}, {r.hi})")
        return slice(lo - r.lo, hi - r.lo)

    def local_keys(self, keys: np.ndarray) -> torch.Tensor:
        if keys.size and (keys.min() < self.range.lo or keys.max() >= self.range.hi):
            raise StoreError(f"sparse keys outside this shard's [{self.range.lo}, {self.range.hi})")
        return torch.from_numpy(keys - self.range.lo)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        if array.dtype != self.dtype:
            raise StoreError(f"values have dtype {array.dtype}, this shard holds {self.dtype}")
        return torch.from_numpy(array)

    def init(self, lo: int, hi: int, array: np.ndarray) -> bool:
        """Set initial values once; later inits are ignored. Returns whether this one took effect."""
        if self.initialized:
            return False
        index = self.local(lo, hi)
        if array.size != hi - lo:
            raise StoreError(f"init of [{lo}, {hi}) carries {array.size} values")
        self._writable()
        self.values[index] = self._tensor(array)
        # A large init comes in chunks: the shard is initialized once they cover it.
        self._init_runs = merge_runs(self._init_runs, index.start, index.stop)
        self.initialized = self._init_runs == [(0, self.range.size)]
        return True

    def read(self, lo: int, hi: int, shared: bool = False) -> torch.Tensor:
        """A private copy of keys [lo, hi); with `shared`, a view of the live values instead.

        Replies are sent zero-copy and must not change under the sender: whoever sends a shared
        view must lend() the store its tracker, so the next update does not write under it.
        """
        view = self.values[self.local(lo, hi)]
        return view if shared else view.clone()

    def lend(self, loan) -> None:
        """A reply reads the current values until `loan.done` (a zmq MessageTracker, say)."""
        if not loan.done:
            self._loans.append(loan)

    def _writable(self) -> None:
        """Before values change in place: if a reply may still be reading them, copy on write.

        The new values go into a retired buffer no reply reads any more (or a new one); the old
        buffer stays with the replies in flight, which hold their own reference to it.
        """
        if not self._loans:
            return
        self._loans = [loan for loan in self._loans if not loan.done]
        if not self._loans:
            return
        fresh = None
        for i, (buf, loans) in enumerate(self._retired):
            if all(loan.done for loan in loans):
                fresh = self._retired.pop(i)[0]
                break
        if fresh is None:
            fresh = self._new_buffer()
        fresh.copy_(self.values)
        self._retired.append((self.values, self._loans))
        del self._retired[:-self.spares]  # the replies keep older buffers alive; we need not
        self.values, self._loans = fresh, []
        self.copies_on_write += 1

    def read_keys(self, keys: np.ndarray) -> torch.Tensor:
        return self.values[self.local_keys(keys)]

    def _new_buffer(self) -> torch.Tensor:
        arr = self._alloc() if self._alloc else None
        if arr is None:
            return torch.zeros(self.range.size, dtype=getattr(torch, str(self.dtype)))
        return torch.from_numpy(arr)

    # ---- updates --------------------------------------------------------------------------------
    def retune(self, groups: list) -> None:
        """New settings for the update rule's parameter groups (a script's schedule)."""
        self.rule.retune(groups)

    def push(self, worker: str, index, grad: torch.Tensor, step: int, batch: int,
             base_version: int, scale: float, round_size: int = 0,
             parts: int = 0, round_id: int = 0, idle: list | None = None) -> PushResult:
        """Apply (arrival mode) or add to the round (round mode). `round_size`: how many
        contributors the round has, when the pusher knows it; `parts`: how many pushes this
        pusher sends the shard for the step (0: unknown, so its pushes never fill the round).
        `idle`: local key runs of `index` (a slice) that got no gradient (server/idle_keys.py),
        given only to a rule that skips them.

        In arrival mode a push that names a `round_id` (auto's lockstep rounds) is added to
        that round, as in round mode, and the round is applied once: when full, when told, or
        when a push of another round, or of none, comes (the coordinator closed it: a worker
        left before pushing here, and the next round's push came before the word to apply).
        Nothing of such a round is dropped: round ids may start over after a restart."""
        if self.apply_mode == "arrival":
            if self.round_step is not None:  # (the common push opens no method call here)
                self.close_superseded(round_id)
            staleness = self.staleness(base_version)
            if not round_id:
                self._writable()
                self._step(index, grad, staleness, scale, worker, idle)
                self.version += 1
                self.updates_applied += 1
                return PushResult(self.version, staleness)
            step = round_id
        else:
            staleness = self.staleness(base_version)
            if self.last_round is not None and step <= self.last_round:
                # A worker that joined while the round was closing: the round went without it.
                self.late_pushes += 1
                return PushResult(self.version, staleness)
        self._accumulate(worker, index, grad, step, batch, scale)
        if self.round_idle is not None:
            self.round_idle.add(index, idle)
        if round_size and parts:
            self.round_size = max(self.round_size, round_size)
            self._count_part(worker, parts)
        return PushResult(self.version, staleness)

    def _step(self, index, grad: torch.Tensor, staleness: int, scale: float, worker: str,
              idle: list | None) -> None:
        """The rule's update; key runs that got no gradient go only to a rule that skips them
        (server/idle_keys.py: the store keeps none for the others), and only when there are
        some."""
        if idle:
            self.rule.apply(self.values, index, grad, self.state, staleness, scale, worker,
                            idle=idle)
        else:
            self.rule.apply(self.values, index, grad, self.state, staleness, scale, worker)

    def staleness(self, base_version: int) -> int:
        """Versions applied since `base_version` (a round, summed, is one)."""
        stale = self.version - base_version
        return stale if stale > 0 else 0

    def close_superseded(self, round_id: int = 0) -> None:
        """Arrival mode: apply the open round before a push naming another `round_id` (0: a
        push of no round) is taken (see push)."""
        if self.apply_mode == "arrival" and self.round_step is not None \
                and round_id != self.round_step:
            self.apply_round(self.round_step)

    def _count_part(self, worker: str, parts: int) -> None:
        got = self.round_got.get(worker, 0) + 1
        self.round_got[worker] = got
        need = self.round_need.setdefault(worker, parts)
        if got == need:
            self.round_complete += 1

    @property
    def round_full(self) -> bool:
        """Every contributor the open round waits for has sent all its parts: it can be
        applied now."""
        return self.round_step is not None and 0 < self.round_size <= self.round_complete

    # (The tags are spelled out, not **tags: these run for every push.)
    def push_dense(self, worker: str, lo: int, hi: int, array: np.ndarray, step: int, batch: int,
                   base_version: int, scale: float, round_size: int = 0,
                   parts: int = 0, round_id: int = 0, idle: list | None = None) -> PushResult:
        """`idle`: the push's key runs that got no gradient, global keys inside [lo, hi)."""
        index = self.local(lo, hi)
        if array.size != hi - lo:
            raise StoreError(f"push of [{lo}, {hi}) carries {array.size} values")
        if not parts and index.start == 0 and index.stop == self.range.size:
            parts = 1  # the whole shard in one push: the pusher's step is in
        if idle is not None:  # (checked whatever the rule: a bad one is refused alike)
            idle = local_idle(idle, lo, hi, self.range.lo)
            if self.round_idle is None:
                idle = None  # a rule of the servers' own steps every key
        return self.push(worker, index, self._tensor(array), step, batch, base_version, scale,
                         round_size, parts, round_id, idle)

    def push_sparse(self, worker: str, keys: np.ndarray, array: np.ndarray, step: int,
                    batch: int, base_version: int, scale: float,
                    round_size: int = 0, parts: int = 0, round_id: int = 0) -> PushResult:
        if keys.size != array.size:
            raise StoreError(f"sparse push has {keys.size} keys but {array.size} values")
        # A worker's sparse push reaches every shard, keys or not: one message unless it says.
        return self.push(worker, self.local_keys(keys), self._tensor(array), step, batch,
                         base_version, scale, round_size, parts or 1, round_id)

    def _accumulate(self, worker, index, grad, step, batch, scale) -> None:
        weight = batch * scale
        if self.round_step is None:
            self.round_step = step
            if self.round_sum is None:  # kept across rounds: fresh memory would page-fault
                self.round_sum = torch.zeros_like(self.values)
            elif index == slice(0, self.range.size):
                # The round's first push covers the shard: write w * grad over the old sum
                # instead of zeroing it first (one pass less; 0 + w*g == w*g exactly).
                torch.mul(grad, weight, out=self.round_sum)
                self.round_batches.setdefault(worker, batch)
                return
            else:
                self.round_sum.zero_()
        elif step != self.round_step:
            raise StoreError(f"push for step {step} while round {self.round_step} is open")
        add_at(self.round_sum, index, grad, weight)
        # A worker's batch counts once per round even when it pushes in several pieces.
        self.round_batches.setdefault(worker, batch)

    def round_partial(self, norm_type: float) -> float:
        """This shard's part of the norm of round's batch-weighted average (the gradient the
        rule will see): the sum of |g|^p over its keys, or for the inf norm their largest |g|
        (server/clip_round.py). 0 when no round is open."""
        if self.round_step is None:
            return 0.0
        total = max(sum(self.round_batches.values()), 1)
        # (the norm of the sum over the batches, not a pass that divides the sum first)
        norm = float(torch.linalg.vector_norm(self.round_sum, norm_type)) / total
        return norm if norm_type == float("inf") else norm ** norm_type

    def apply_round(self, step: int, grad_factor: float = 1.0) -> bool:
        """Apply the batch-weighted average of round `step`, times `grad_factor` (a clipped
        round's: on the gradient, so a rule that is not linear in it sees the clipped average).
        False if nothing was pushed for it or it was applied already (when its last push made
        it full). In arrival mode only the open round is applied (an empty one moves no
        version: no pull waits for it)."""
        if self.apply_mode == "arrival" and step != self.round_step:
            return False
        if self.last_round is not None and step <= self.last_round \
                and self.apply_mode == "round":
            return False
        if self.round_step is None:
            self.version += 1  # an empty round still advances the clock that pulls wait on
            self.last_round = step
            return False
        if step != self.round_step:
            raise StoreError(f"asked to apply round {step} but round {self.round_step} is open")
        self.last_round = step
        total = max(sum(self.round_batches.values()), 1)
        scale = 1.0 / total
        if grad_factor != 1.0:
            scale = grad_factor / total  # (linear rules: factor on the gradient = on the scale)
        if not self.rule.linear_in_grad:  # the rule must see the average itself
            if grad_factor == 1.0:
                self.round_sum.div_(total)
            else:
                self.round_sum.mul_(scale)
            scale = 1.0
        self._writable()
        self._step(slice(None), self.round_sum, 0, scale, "",
                   None if self.round_idle is None else self.round_idle.take())
        self.version += 1
        self.updates_applied += 1
        batches = sum(self.round_batches.values())
        # (the sum is reset by the next round's first push)
        self.round_step, self.round_batches, self.round_size = None, {}, 0
        self.round_got, self.round_need, self.round_complete = {}, {}, 0
        if self.round_applied is not None:
            self.round_applied(batches)
        return True

    # ---- the update rule's state, as a script's optimizer reads and loads it ------------------
    def keyed_state(self) -> list[str]:
        """The names of the rule's state kept per key, in name order."""
        return sorted(k for k, v in self.state.items() if self.rule.keyed(k, v, self.values))

    def state_of(self, lo: int, hi: int) -> list[np.ndarray]:
        """Copies of each per-key state (keyed_state's order) over keys [lo, hi)."""
        index = self.local(lo, hi)
        return [self.state[k][index].numpy().copy() for k in self.keyed_state()]

    def load_state(self, lo: int, hi: int, names: list, arrays: list) -> None:
        """Per-key state `names[i]` over keys [lo, hi) from `arrays[i]`, or the parameters
        themselves under the name "values" (a script's rank 0 restoring a checkpoint after its
        optimizer joined, then broadcasting its parameters as Horovod's resume does): all
        checked before any is written, so a refused load changes nothing."""
        index = self.local(lo, hi)
        keyed = self.keyed_state()
        if len(names) != len(arrays):
            raise StoreError(f"load_state names {len(names)} states but carries "
                             f"{len(arrays)} arrays")
        unknown = sorted(set(map(str, names)) - set(keyed) - {"values"})
        if unknown:
            raise StoreError(f"update rule {self.rule.name} keeps no per-key state "
                             f"{', '.join(unknown)}; it keeps {', '.join(keyed) or 'none'}")
        for name, array in zip(names, arrays):
            if array.size != hi - lo:
                raise StoreError(f"state {name} for keys [{lo}, {hi}) carries {array.size} "
                                 f"values")
        if "values" in names:
            self._writable()  # (a reply in flight may still read the values)
        for name, array in zip(names, arrays):
            target = self.values[index] if name == "values" else self.state[name][index]
            target.copy_(torch.from_numpy(np.ascontiguousarray(array)).to(target.dtype))
        self.rule.state_loaded()

    # ---- checkpoints (the files are server.checkpoint's) ----------------------------------------
    def snapshot(self) -> tuple[dict, dict]:
        """The arrays and metadata a checkpoint keeps: views of the live values, not copies
        (they are written out before anything changes them)."""
        arrays = {"values": self.values.numpy()}
        arrays.update({f"state.{k}": v.numpy() for k, v in self.state.items()})
        meta = {"version": self.version, "range": [self.range.lo, self.range.hi],
                "dtype": str(self.dtype), "updates_applied": self.updates_applied,
                "rule": self.rule.name}
        return arrays, meta

    def restore(self, arrays: dict, meta: dict, version_floor: int = 0) -> int:
        """Take values and optimizer state from a snapshot (checked against this shard by
        server.checkpoint.read_shard); returns how many updates were applied since (lost).

        The version is lifted to `version_floor` (the rounds the coordinator has applied) so that
        pulls waiting for the job's current version are served instead of waiting forever.
        """
        self.values.copy_(torch.from_numpy(np.ascontiguousarray(arrays["values"])))
        for key, tensor in self.state.items():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(arrays[f"state.{key}"])))
        self.rule.state_loaded()
        self.initialized = True
        self.updates_applied = meta["updates_applied"]
        lost = max(0, version_floor - meta["version"])
        self.version = max(meta["version"], version_floor)
        return lost


    # ---- replicas (server/replication.py) ------------------------------------------------------
    def round_state(self) -> tuple[dict, dict]:
        """What a new backup needs beside snapshot(): the open round (its sum as an array),
        the init's progress and the late-push count, JSON-able."""
        meta = {"round_step": self.round_step, "round_batches": self.round_batches,
                "round_size": self.round_size, "round_got": self.round_got,
                "round_need": self.round_need, "round_complete": self.round_complete,
                "last_round": self.last_round, "late_pushes": self.late_pushes,
                "init_runs": self._init_runs, "version": self.version}
        if self.round_idle is not None:
            meta["idle"] = self.round_idle.state()
        arrays = {}
        if self.round_step is not None and self.round_sum is not None:
            arrays["round_sum"] = self.round_sum.numpy()
        return meta, arrays

    def load_round_state(self, meta: dict, arrays: dict) -> None:
        """The inverse of round_state (after restore() of the snapshot, if any)."""
        self.round_step = meta["round_step"]
        self.round_batches = {str(k): int(v) for k, v in meta["round_batches"].items()}
        self.round_size = int(meta["round_size"])
        self.round_got = {str(k): int(v) for k, v in meta["round_got"].items()}
        self.round_need = {str(k): int(v) for k, v in meta["round_need"].items()}
        self.round_complete = int(meta["round_complete"])
        self.last_round = meta["last_round"]
        self.late_pushes = int(meta["late_pushes"])
        self.version = int(meta["version"])
        if not self.initialized:
            self._init_runs = [tuple(r) for r in meta["init_runs"]]
        if self.round_idle is not None:
            self.round_idle.load(meta.get("idle"))
        if "round_sum" in arrays:
            self.round_sum = torch.from_numpy(np.array(arrays["round_sum"]))


def merge_runs(runs: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """Sorted disjoint runs with [lo, hi) added, touching runs joined."""
    out = []
    for a, b in sorted([*runs, (lo, hi)]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
