"""Train your own PyTorch model through the parameter server: an optimizer-shaped wrapper.

In a script started by `paramserver launch` (which sets PARAMSERVER_JOIN for every worker)::

    model = MyNet()
    opt = paramserver.DistributedOptimizer(model)        # joins; rank 0 offers its weights
    while not opt.should_stop:
        x, y = next_batch(opt.batch_size)                # the policy may change the size
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step(loss=loss)                              # push, wait for the policy, pull
    opt.close()

The update rule (SGD, momentum, staleness-aware...) runs on the servers, chosen with
`paramserver launch --optimizer`; the model's parameters are views into the buffer that pulls
write, so after `step()` the model holds the newest parameters the policy allows.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from paramserver.models.keyspace import ModelKeys
from paramserver.client.flat_binding import bind_to_flat, grads_are_bound
from paramserver.client.kv import KVWorker

JOIN_ENV = "PARAMSERVER_JOIN"


class DistributedOptimizer:
    """One worker's view of a job: `zero_grad()`, `step()`, `should_stop`, `close()`."""

    def __init__(self, model: nn.Module, join: str | None = None, timeout: float = 120.0):
        join = join or os.environ.get(JOIN_ENV)
        if not join:
            raise RuntimeError(f"no job to join: pass join='tcp://HOST:PORT' or run under "
                               f"`paramserver launch` (which sets {JOIN_ENV})")
        self.model = model
        dtype = next(model.parameters()).dtype
        self.keys = ModelKeys(model, dtype=dtype)
        self.kv = KVWorker(join, timeout=timeout, num_keys=self.keys.num_keys)
        if self.kv.dtype != torch.empty(0, dtype=dtype).numpy().dtype:
            raise ValueError(f"the job holds {self.kv.dtype} parameters, the model is {dtype}")
        self.params, self.grads = self.keys.new_buffer(), self.keys.new_buffer()
        bind_to_flat(model, self.keys, self.params, self.grads)
        if self.kv.rank == 0:
            self.kv.init(self.params.numpy())
        t0 = time.perf_counter()
        self.release = self.kv.start()
        self._wait = time.perf_counter() - t0
        self._pull()

    @property
    def rank(self) -> int:
        return self.kv.rank

    @property
    def batch_size(self) -> int:
        """The batch size the sync policy wants for the next step."""
        return self.release.batch_size

    @property
    def should_stop(self) -> bool:
        """True once the job's budget is spent: leave the loop and call close()."""
        return self.release.stop

    def zero_grad(self) -> None:
        self.grads.zero_()

    def _pull(self) -> None:
        self.kv.pull(out=self.params.numpy(), min_version=self.release.min_version)

    def step(self, loss: torch.Tensor | float | None = None, batch: int | None = None) -> None:
        """Push this step's gradients, wait for the policy's release, pull fresh parameters."""
        if self.release.stop:
            raise RuntimeError("the job has stopped; call close()")
        if not grads_are_bound(self.model, self.grads):
            self.keys.flatten_grads(self.model, self.grads)
        batch = self.release.batch_size if batch is None else int(batch)
        t0 = time.perf_counter()
        staleness = self.kv.push(self.grads.numpy(), step=self.release.step, batch=batch,
                                 scale=self.release.scale, round_size=self.release.round_size)
        record = {"wait_s": round(self._wait, 6), "push_s": round(time.perf_counter() - t0, 6),
                  "staleness": int(staleness)}
        if loss is not None:
            value = loss.detach() if isinstance(loss, torch.Tensor) else loss
            record["loss"] = round(float(value), 6)
        t1 = time.perf_counter()
        self.release = self.kv.clock(self.release.step, batch, compute_time=0.0, record=record)
        self._wait = time.perf_counter() - t1
        if not self.release.stop:
            self._pull()

    def close(self) -> None:
        """Leave the job (the policy stops waiting for this worker) and close the sockets."""
        try:
            self.kv.bye()
        finally:
            self.kv.close()
