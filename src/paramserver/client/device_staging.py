"""A model's flat buffers on its own device, and the host buffers the servers read and write.

The wire moves host memory: a push sends a host vector, a pull writes one. A model on `cpu`
computes in those host vectors directly (models/flat_binding.py), so `DeviceStaging` is a
pass-through there: `params`/`grads` *are* the host buffers and every method returns at once.

A model on an accelerator (`cuda`) computes in flat buffers on its device; this class owns
their host mirrors (pinned when CUDA is available, so copies are asynchronous DMA) and the
copies between them, on side streams with events. The gradients' mirror, when the caller
gives one, is the worker's shared-memory buffer (KVWorker.shared_buffer) page-locked in place
(cudaHostRegister): the device's copy lands where a server on this host reads the push, with
no copy through a socket.

- device -> host, overlapping backward: a hook on every parameter
  (`register_post_accumulate_grad_hook`) counts each layer's gradients; when a layer has all
  of them, its key range is copied to the host on the copy stream, after an event recorded on
  the compute stream, while backward goes on with the layers below. `on_landed(i)` (the
  per-layer requests, client/layer_sched.py) hears of a layer once its copy is done and
  pushes that range. `grads_to_host()` copies what the hooks did not (a layer without a
  gradient, a layer accumulated twice) and waits for every copy: the whole push starts then.
  Gradients changed in place after backward by torch ops (`clip_grad_norm_`, `mul_`) are
  seen by the buffer's version counter and copied again, so the push sends them as changed;
  a GradScaler's unscale (which leaves the counter alone) is announced by the caller
  (`grads_replaced()`).
- host -> device, overlapping the next forward: `params_from_host()` queues the copy of the
  pulled parameters on the other side stream and makes the compute stream wait for it on the
  device, not on the host. The host goes straight on to the next step (data loading, the
  batch's copy, launching forward's kernels) while the copy runs; forward's kernels run once
  it is done. With per-layer requests each layer is copied as its pull arrives, when forward
  reaches that layer, so the copies and pulls of later layers overlap earlier layers' forward.
  Not overlapped: a whole-model pull itself (the host waits for the servers before queueing
  the copy), and forward's first kernel waits for the whole model's copy.

`stage=True` stages a model on `cpu` too (plain synchronous copies, no streams): the tests
check the staging logic on any machine with it. `host_grads=False`: the gradients stay on the
device (a push encoded there, compression/codec.py): no mirror, no hooks.

Memory on the device: the two flat buffers, `device_bytes()` (2 x parameters x dtype size),
made once; every step reuses them.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch
from torch import nn

from paramserver.models import ModelKeys

DEVICES = ("cpu", "cuda", "auto")
# PARAMSERVER_STAGE=1 stages a model on the cpu through separate buffers, as on cuda: the
# device paths (copies, encoding where the gradient is) run, and are checked, on any machine.
STAGE_ENV = "PARAMSERVER_STAGE"


def staging_forced() -> bool:
    return os.environ.get(STAGE_ENV, "") == "1"


def resolve_device(name: str, rank: int | None = None) -> torch.device:
    """`cpu`, `cuda` (or `cuda:N`), or `auto` (cuda if this process sees one, else cpu). With
    `rank`, plain `cuda` is GPU rank mod the GPUs this process sees, so the workers of a host
    spread over its GPUs (a Ray actor given one GPU sees only that one)."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        name = "cuda"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            built = "without CUDA" if torch.version.cuda is None else "with CUDA but sees no GPU"
            raise ValueError(f"device {name!r}: CUDA is not available (torch {torch.__version__} "
                             f"is built {built}); use --device cpu or auto")
        if name == "cuda" and rank is not None:
            return torch.device("cuda", rank % torch.cuda.device_count())
        return torch.device(name)
    raise ValueError(f"device {name!r}: expected one of {', '.join(DEVICES)}")


def page_lock(t: torch.Tensor) -> bool:
    """Page-lock host memory that torch did not allocate (cudaHostRegister), so device copies
    to and from it are DMA; False where that cannot be (no CUDA, or the driver refused)."""
    if not torch.cuda.is_available() or t.numel() == 0:
        return False
    rt = torch.cuda.cudart()
    rc = rt.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    return int(rc) == 0


def page_unlock(t: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def model_device(model: nn.Module) -> torch.device:
    """The one device every parameter of `model` is on; a model split over devices is refused
    (the flat buffers are one tensor each)."""
    first: dict[torch.device, str] = {}
    for name, p in model.named_parameters():
        first.setdefault(p.device, name)
    if len(first) > 1:
        where = ", ".join(f"{name!r} on {dev}" for dev, name in first.items())
        raise ValueError(f"the model's parameters are on {len(first)} devices ({where}): "
                         f"the parameter server binds them to one flat buffer; move the whole "
                         f"model to one device first (model.to(device))")
    if not first:
        raise ValueError("model has no parameters")
    return next(iter(first))


class _CudaCopies:
    """Side streams and events of one device (only built where the model is on cuda)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)

    def compute_stream(self):
        return torch.cuda.current_stream(self.device)

    def to_host(self, dst: torch.Tensor, src: torch.Tensor):
        """Copy after what the compute stream has queued so far; returns the done event."""
        ready = torch.cuda.Event()
        ready.record(self.compute_stream())
        with torch.cuda.stream(self.d2h):
            self.d2h.wait_event(ready)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.d2h)
        return done

    def to_device(self, dst: torch.Tensor, src: torch.Tensor):
        """Copy once the compute stream is done with `dst` (the last backward read it); the
        compute stream then waits for the copy on the device. Returns the done event."""
        self.h2d.wait_stream(self.compute_stream())
        with torch.cuda.stream(self.h2d):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.h2d)
        self.compute_stream().wait_event(done)
        return done


class DeviceStaging:
    """The flat `params`/`grads` a model is bound to, on its device, and their host mirrors
    `host_params`/`host_grads` (numpy views: `host_params_np`, `host_grads_np`).

    On cpu (unless `stage`) the mirrors are the buffers themselves. `host_params`/`host_grads`,
    if given, are the host buffers to use (the gradients live in shared memory, page-locked
    in place on cuda); `host_grads=False` keeps the gradients on the device only (staged).
    """

    def __init__(self, model: nn.Module, keys: ModelKeys,
                 host_params: torch.Tensor | None = None,
                 host_grads: torch.Tensor | None | bool = None, stage: bool | None = None):
        self.device = model_device(model)
        if stage is None:
            stage = self.device.type != "cpu" or staging_forced()
        self.staged = bool(stage)
        self.keys = keys
        n, dtype = keys.num_keys, keys.dtype
        # Pinned host memory needs a CUDA driver; on a machine without one plain memory does.
        pin = self.staged and torch.cuda.is_available()
        self.locked: list[torch.Tensor] = []  # host memory page-locked here, unlocked at close
        if host_params is None:
            # Left empty (not zeroed): binding copies each tensor in, and on cpu a zeroed
            # buffer would hold the model twice for a moment.
            host_params = torch.empty(n, dtype=dtype, pin_memory=pin)
        self.grads_on_host = host_grads is not False or not self.staged
        if host_grads is False:
            host_grads = None if self.staged else torch.zeros(n, dtype=dtype)
        elif host_grads is None:
            host_grads = torch.zeros(n, dtype=dtype, pin_memory=pin)
        elif pin and not host_grads.is_pinned():
            if page_lock(host_grads):
                self.locked.append(host_grads)
            else:  # (a driver that refuses: a pinned mirror of its own, copied on push)
                host_grads = torch.zeros(n, dtype=dtype, pin_memory=True)
        self.host_params, self.host_grads = host_params, host_grads
        self.host_params_np: np.ndarray = host_params.numpy()
        self.host_grads_np: np.ndarray | None = (None if host_grads is None
                                                 else host_grads.numpy())
        if not self.staged:
            self.params, self.grads = host_params, host_grads
            return
        self.params = torch.empty(n, dtype=dtype, device=self.device)
        self.grads = torch.zeros(n, dtype=dtype, device=self.device)
        self.cuda = _CudaCopies(self.device) if self.device.type == "cuda" else None
        self.ranges = [layer.keys for layer in keys.layers]
        self.size = [len(layer.params) for layer in keys.layers]
        self.seen = [0] * len(self.ranges)  # gradients accumulated per layer this step
        self.in_flight: list[tuple[int, object]] = []  # (layer, done event) not yet landed
        self.landed: list[bool] = [False] * len(self.ranges)
        self.copied: list[int] = []  # layers copied to the host this step, in order
        self.uploading: object = None  # the last host -> device copy's done event
        self.on_landed: Callable[[int], None] | None = None
        # The gradients' version when the hooks last saw them: a later in-place change
        # (clipping, unscaling) is what grads_to_host must copy again.
        self.seen_version = self.grads._version

    def device_bytes(self) -> int:
        """Bytes this staging holds on the model's device: the flat parameters and gradients
        (0 on cpu, where they are the host buffers)."""
        if not self.staged:
            return 0
        return self.params.nbytes + self.grads.nbytes

    def close(self) -> None:
        """Unlock the host memory page-locked here (before its owner unmaps it)."""
        for t in self.locked:
            page_unlock(t)
        self.locked = []

    # --- device -> host ------------------------------------------------------------------------
    def watch(self, model: nn.Module) -> None:
        """Hook every parameter of `model` (bound to `grads`) so each layer's gradient goes to
        the host as soon as backward has it. Nothing to do on cpu."""
        if not self.staged or not self.grads_on_host:
            return
        owner = {name: i for i, layer in enumerate(self.keys.layers) for name in layer.params}
        for p, slot in zip(model.parameters(), self.keys.params):
            p.register_post_accumulate_grad_hook(self._hook(owner[slot.name]))

    def _hook(self, i: int):
        def hook(param):
            self.seen[i] += 1
            if self.seen[i] == self.size[i]:
                self._copy_layer(i)
            self.seen_version = self.grads._version
            self._poll()
        return hook

    def _copy_layer(self, i: int) -> None:
        r = self.ranges[i]
        dst, src = self.host_grads[r.lo:r.hi], self.grads[r.lo:r.hi]
        if self.cuda is None:
            dst.copy_(src)
            done = None
        else:
            done = self.cuda.to_host(dst, src)
        self.copied.append(i)
        self.in_flight.append((i, done))

    def _poll(self) -> None:
        """Hand on the layers whose copies are done, in the order they were copied."""
        while self.in_flight:
            i, done = self.in_flight[0]
            if done is not None and not done.query():
                return
            self.in_flight.pop(0)
            self._land(i)

    def _land(self, i: int) -> None:
        if self.landed[i]:  # copied again (accumulated twice): the push already went
            return
        self.landed[i] = True
        if self.on_landed is not None:
            self.on_landed(i)

    def finish_backward(self) -> None:
        """After backward: copy the layers the hooks did not copy exactly once (no gradient,
        or accumulated more than once since the last `grads_zeroed()`), wait for every copy
        and hand each layer not yet handed on. A layer pushed before a second accumulation
        cannot be taken back: `--schedule` steps run one backward each."""
        if not self.staged:
            return
        if self.grads._version != self.seen_version:  # changed in place since the hooks
            self.seen = [-1] * len(self.ranges)
        for i, count in enumerate(self.seen):
            if count != self.size[i]:
                self._copy_layer(i)
        for i, done in self.in_flight:
            if done is not None:
                done.synchronize()
            self._land(i)
        self.in_flight = []
        self.seen_version = self.grads._version

    def grads_replaced(self) -> None:
        """The gradients were written into `grads` other than by the hooks (flatten_grads):
        every layer is copied again."""
        if self.staged:
            self.seen = [-1] * len(self.ranges)

    def grads_to_host(self) -> np.ndarray:
        """This step's gradient on the host, for a push of the whole vector."""
        if not self.grads_on_host:
            raise RuntimeError("this staging keeps the gradients on the device "
                               "(host_grads=False): push them from there")
        if self.staged:
            self.finish_backward()
        return self.host_grads_np

    def grads_zeroed(self) -> None:
        """A new step's gradients begin (the caller zeroed `grads`)."""
        if self.staged:
            self.seen = [0] * len(self.ranges)
            self.landed = [False] * len(self.ranges)
            self.copied = []
            self.seen_version = self.grads._version

    # --- host -> device ------------------------------------------------------------------------
    def params_to_host(self) -> np.ndarray:
        """The model's parameters on the host (rank 0's initial values); waits for the copy."""
        if self.staged:
            self.host_params.copy_(self.params)
        return self.host_params_np

    def before_host_write(self) -> None:
        """Call before a pull writes `host_params`: an upload may still be reading them."""
        if self.staged and self.uploading is not None:
            self.uploading.synchronize()
            self.uploading = None

    def params_from_host(self, lo: int = 0, hi: int | None = None) -> None:
        """Queue the copy of the pulled `host_params[lo:hi]` to the device; the model's next
        kernels wait for it on the device (the host does not wait)."""
        if not self.staged:
            return
        hi = self.keys.num_keys if hi is None else hi
        dst, src = self.params[lo:hi], self.host_params[lo:hi]
        if self.cuda is None:
            dst.copy_(src)
        else:
            self.uploading = self.cuda.to_device(dst, src)
