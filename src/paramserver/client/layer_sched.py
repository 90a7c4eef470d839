"""Per-layer requests in the worker: a layer's gradient is pushed the moment backward has it,
and each layer's pull is waited on only when forward reaches that layer.

Pushes go out from post-accumulate-grad hooks (zero copy, async) while backward goes on with
the layers below; pulls are all asked at the step's start, in the order the schedule names
(compression/schedule.py), and a forward pre-hook on each layer's module waits for its own.
Time spent blocked in those waits, and in the wait for the last push acknowledgements after
backward, is the step's *suspend* time. The clock (and so the release) still comes once per
step, after every layer's push was acknowledged: the sync policies' contract is unchanged.

A model on cuda (a staged `DeviceStaging`, client/device_staging.py) pushes each layer's range
once its device-to-host copy has landed (the staging's hooks say so), and each layer's pulled
range is copied to the device when forward reaches that layer.
"""

from __future__ import annotations

import time

from torch import nn

from paramserver.compression.schedule import check_order, pull_order, push_order
from paramserver.models import ModelKeys
from paramserver.client.kv import KVWorker


class LayerRequests:
    """Hooks a model's layers to per-layer pushes and pulls through `kv`."""

    def __init__(self, kv: KVWorker, model: nn.Module, keys: ModelKeys, params_np, grads_np,
                 order: str, staging=None):
        self.kv, self.order = kv, check_order(order)
        self.params_np, self.grads_np = params_np, grads_np
        self.ranges = [layer.keys for layer in keys.layers]
        n = len(self.ranges)
        owner = {name: i for i, layer in enumerate(keys.layers) for name in layer.params}
        self.size = [len(layer.params) for layer in keys.layers]
        self.pushed = list(reversed(range(n)))  # backward's order, until one was seen
        self.lag, self.pushed_at = [0] * n, [-1] * n  # lag: last push staleness per layer
        self.pulls: dict = {}
        self.pushes: list = []
        self.tags: dict = {}
        self.seen = [0] * n
        self.suspend = 0.0
        # staged: the host copy of a layer's gradient exists only once its copy landed
        self.staging = staging if staging is not None and staging.staged else None
        if self.staging is not None:
            self.staging.on_landed = self._on_landed
        else:
            for (name, p), slot in zip(model.named_parameters(), keys.params):
                p.register_post_accumulate_grad_hook(self._on_grad(owner[slot.name]))
        for i, layer in enumerate(keys.layers):
            model.get_submodule(layer.name).register_forward_pre_hook(self._on_forward(i))

    def begin(self, release) -> list[int]:
        """Ask for every layer, in schedule order; returns that order."""
        # How old each layer's local copy was, in server updates: its last push's staleness.
        fresh = [release.step - lag for lag in self.lag]
        order = pull_order(self.order, self.pushed, fresh)
        if self.staging is not None:
            self.staging.before_host_write()
        for i in order:
            r = self.ranges[i]
            self.pulls[i] = self.kv.pull_async((r.lo, r.hi), out=self.params_np[r.lo:r.hi],
                                               min_version=release.min_version)
        self.tags = {"step": release.step, "batch": release.batch_size, "scale": release.scale}
        self.pushes, self.seen, self.suspend = [], [0] * len(self.ranges), 0.0
        return order

    def _wait(self, handle):
        t0 = time.perf_counter()
        result = self.kv.wait(handle)
        self.suspend += time.perf_counter() - t0
        return result

    def _on_forward(self, i: int):
        def hook(module, args):
            handle = self.pulls.pop(i, None)
            if handle is not None:
                self._wait(handle)
                self._upload(i)
        return hook

    def _upload(self, i: int) -> None:
        if self.staging is not None:
            self.staging.params_from_host(self.ranges[i].lo, self.ranges[i].hi)

    def _on_landed(self, i: int) -> None:
        self.seen[i] = self.size[i]
        self._push([i])

    def _on_grad(self, i: int):
        def hook(param):
            self.seen[i] += 1
            if self.seen[i] == self.size[i]:
                self._push([i])
        return hook

    def _push(self, ready: list[int]) -> None:
        for i in push_order(ready, self.pushed_at):
            r = self.ranges[i]
            handle = self.kv.push_async(self.grads_np[r.lo:r.hi], (r.lo, r.hi), **self.tags)
            self.pushes.append((i, handle))
            self.pushed_at[i] = self.tags["step"]

    def finish(self) -> dict[int, int]:
        """After backward: wait for what is left; returns each layer's push staleness."""
        for i, handle in list(self.pulls.items()):  # a layer forward never reached
            self._wait(handle)
            self._upload(i)
        self.pulls = {}
        if self.staging is not None:  # the layers whose copies are still on their way
            self.staging.finish_backward()
        missing = [i for i in range(len(self.ranges)) if self.seen[i] < self.size[i]]
        self._push(missing)  # layers backward gave no gradient: their zeros still count
        self.pushed = [i for i, _ in self.pushes]
        stale = {i: int(self._wait(h)) for i, h in self.pushes}
        for i, lag in stale.items():
            self.lag[i] = lag
        return stale
