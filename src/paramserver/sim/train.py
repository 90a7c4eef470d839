"""Real training on the simulated schedule: each virtual step computes a real gradient, staleness and all.

A worker's gradient is taken at the parameters of the version it pulled, on its own data shard,
and applied by the very ShardStore the live servers use (arrival or round mode). Old versions
are kept copy-on-write: the parameters are cloned just before they change, and only while some
worker still holds the current version, so memory is bounded by the versions still referenced
(at most one per in-flight worker; none at all under BSP). The test split is scored at fixed
virtual-time intervals, so accuracy against (virtual) time is measured, not guessed.

Importing this module loads neither torch nor the live runtime's transport (zmq): torch and
the pure runtime pieces (ShardStore, the flat binding) come in when a Trainer is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.core.keyspace import KeyRange

if TYPE_CHECKING:
    import torch
    from torch import nn


class Trainer:
    """The engine's trainer hooks: pull / push / apply_round / record / advance / finish."""

    def __init__(self, ds, model: nn.Module, keys, workers: int, apply_mode: str, *,
                 lr: float = 0.1, optimizer: str = "sgd", optimizer_options: dict | None = None,
                 eval_interval: float = 1.0, seed: int = 0, sink=None):
        from torch import nn

        from paramserver.optim import make_rule
        from paramserver.models.flat_binding import bind_to_flat
        from paramserver.server.store import ShardStore

        self.ds, self.model, self.keys, self.workers, self.seed = ds, model, keys, workers, seed
        self.sink, self.interval = sink, float(eval_interval)
        if not self.interval > 0:
            raise ValueError(f"eval interval must be > 0, got {eval_interval}")
        rule = make_rule(optimizer, lr, **(optimizer_options or {}))
        self.store = ShardStore(KeyRange(0, keys.num_keys), str(keys.dtype).removeprefix("torch."),
                                rule, apply_mode)
        self.store.init(0, keys.num_keys, keys.flatten_params(model).numpy())
        self.work, self.grads = keys.new_buffer(), keys.new_buffer()
        bind_to_flat(model, keys, self.work, self.grads)
        self.loss_fn = nn.CrossEntropyLoss()
        self.samplers: dict[int, object] = {}  # built on first use: a shard copy per worker
        self.ref: dict[int, int] = {}  # worker -> version it pulled and has not pushed yet
        self.refcount: dict[int, int] = {}
        self.snapshots: dict[int, torch.Tensor] = {}  # versions gone from the store but still held
        self.peak_snapshots = 0
        self.loss: dict[int, float] = {}
        self.next_eval = 0.0
        self.last_eval: tuple[int, float, float] | None = None  # (version, accuracy, loss)
        self.X, self.y = ds.test.X.to(keys.dtype), ds.test.y

    # ---- versions -------------------------------------------------------------------------------
    def pull(self, w: int, version: int) -> None:
        if version != self.store.version:
            raise RuntimeError(f"worker {w} pulls version {version}, the store is at "
                               f"{self.store.version}")
        self.ref[w] = version
        self.refcount[version] = self.refcount.get(version, 0) + 1

    def _params_of(self, version: int) -> torch.Tensor:
        return self.store.values if version == self.store.version else self.snapshots[version]

    def _release(self, version: int) -> None:
        left = self.refcount[version] - 1
        if left:
            self.refcount[version] = left
        else:
            del self.refcount[version]
            self.snapshots.pop(version, None)

    def _before_change(self) -> None:
        """Keep the current version if a worker still computes on it."""
        v = self.store.version
        if v in self.refcount and v not in self.snapshots:
            self.snapshots[v] = self.store.values.clone()
            self.peak_snapshots = max(self.peak_snapshots, len(self.snapshots))

    # ---- the engine's hooks ---------------------------------------------------------------------
    def _sampler(self, w: int):
        s = self.samplers.get(w)
        if s is None:
            s = self.samplers[w] = self.ds.sampler(w, self.workers, seed=self.seed)
        return s

    def _gradient(self, w: int, version: int, batch: int) -> float:
        self.work.copy_(self._params_of(version))
        xb, yb = self._sampler(w).next_batch(batch)
        self.grads.zero_()
        loss = self.loss_fn(self.model(xb.to(self.work.dtype)), yb)
        loss.backward()
        return float(loss.detach())

    def push(self, w: int, engine) -> None:
        """Worker w's push reaches the server: gradient at its pulled version, then the store."""
        version, batch, step = self.ref.pop(w), engine.batch[w], engine.step[w]
        self.loss[w] = self._gradient(w, version, batch)
        self._release(version)
        if self.store.apply_mode == "arrival":
            self._before_change()
        result = self.store.push(str(w), slice(None), self.grads, step, batch, version,
                                 engine.scale[w], round_id=engine.round_of[w]
                                 if engine.round_of is not None else 0)
        if result.staleness != engine.stale[w]:
            raise RuntimeError(f"store staleness {result.staleness} != engine "
                               f"{engine.stale[w]} for worker {w}")

    def apply_round(self, step: int, engine) -> None:
        self._before_change()
        self.store.apply_round(step)

    def record(self, w: int) -> dict:
        return {"loss": round(self.loss.get(w, float("nan")), 6),
                "epoch": round(self._sampler(w).epoch, 4)}

    # ---- evaluation -----------------------------------------------------------------------------
    def _evaluate(self, t: float, engine, final: bool) -> None:
        v = self.store.version
        if self.last_eval is None or self.last_eval[0] != v:
            self.work.copy_(self.store.values)
            from paramserver.models.workload import evaluate  # torch: loaded already

            self.last_eval = (v, *evaluate(self.model, self.X, self.y))
        _, acc, loss = self.last_eval
        if self.sink is not None:
            self.sink.record({"t": round(t, 6), "kind": "eval", "accuracy": round(acc, 6),
                              "test_loss": round(loss, 6), "samples": engine.samples,
                              "version": v, "final": final})

    def advance(self, t: float, engine) -> None:
        """Evaluate at every interval boundary before `t` (the parameters as they were then)."""
        while self.next_eval < t:
            self._evaluate(self.next_eval, engine, final=False)
            self.next_eval += self.interval

    def finish(self, t: float, engine) -> None:
        self.advance(t, engine)
        self._evaluate(t, engine, final=True)
        self.next_eval = float("inf")

    def stats(self) -> dict:
        return {"peak_snapshots": self.peak_snapshots,
                "snapshot_bytes": self.peak_snapshots * self.keys.num_keys
                * self.store.values.element_size(),
                "final_version": self.store.version}
