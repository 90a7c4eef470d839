"""Train your own PyTorch model through the parameter server: an optimizer-shaped wrapper.

In a script started by `paramserver launch` (which sets PARAMSERVER_JOIN for every worker)::

    model = MyNet()
    with paramserver.DistributedOptimizer(model.parameters()) as opt:   # joins the job
        for x, y in DataLoader(data, batch_sampler=paramserver.BatchSampler(len(data), opt)):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()                                   # push, wait for the policy, pull

The update rule runs on the servers: the script's own torch optimizer, passed as Horovod's is
(`DistributedOptimizer(torch.optim.AdamW(groups, lr=...), named_parameters=...)`: each shard
runs that class's implementation with its settings and groups), or, given the model, the one
`paramserver launch --optimizer` chose.
The model's parameters are views into the buffer that pulls write, so after `step()` the model
holds the newest parameters the policy allows. First init: rank 0's weights are the job's
initial parameters; every other rank gets them with its first pull (its own are overwritten).

The time from the pull's return (or a later `zero_grad()`) to `step()` is the step's compute
time: it goes to the sync policy with the clock, as the built-in worker's does, so LB-BSP and
R2SP learn each worker's speed. `launch --straggler/--device-time` stretch it here.

The model may live on any one device: put it on cuda first (`model.cuda()`) and the flat
buffers are made there, with pinned host copies for the wire (client/device_staging.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections import OrderedDict
from typing import Iterable

import torch
from torch import nn

from paramserver.core import clipping
from paramserver.core.layout import ModelLayout
from paramserver.core.endpoints import endpoint
from paramserver.core.leaving import NO_STEP_REASON
from paramserver.models.core.keyspace import ModelKeys
from paramserver.client.device_staging import DeviceStaging, model_device
from paramserver.models.flat_binding import bind_to_flat, grads_are_bound, point_grads_at
from paramserver.client.idle_params import IdleParams
from paramserver.client.kv import KVWorker
from paramserver.client.preemption import Preemption
from paramserver.policies.base import Release
from paramserver.client.pacing import Pacer
from paramserver.client.torch_optimizer import describe, settings_of

JOIN_ENV = "PARAMSERVER_JOIN"
# What a script run with plain python joins (no join=, not under launch): a job of its own,
# with join_address() and stop(), which the package wires in (paramserver/__init__.py: the
# module launch/standalone.py, one worker on this host); None: such a script is refused.
own_job = None
log = logging.getLogger("paramserver")


def _layout(model: nn.Module, dtype: torch.dtype) -> dict:
    """The model's layout as the coordinator compares it across ranks (core/layout.py)."""
    return ModelLayout.of(((n, tuple(p.shape)) for n, p in model.named_parameters()),
                          str(dtype).removeprefix("torch.")).to_wire()


class _Named(nn.Module):
    """The parameters a script named (Horovod's `named_parameters=`), under those names:
    they name the job's layout and the exported model.pt's entries."""

    def __init__(self, pairs: list[tuple[str, nn.Parameter]]):
        super().__init__()
        self.pairs = pairs  # (a plain list: not registered, named as given instead)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        return ((prefix + n, p) for n, p in self.pairs)

    def parameters(self, recurse: bool = True):
        return (p for _, p in self.pairs)

    def state_dict(self, *args, **kwargs) -> "OrderedDict[str, torch.Tensor]":
        return OrderedDict((n, p.detach()) for n, p in self.pairs)


def _named(pairs) -> list[tuple[str, nn.Parameter]]:
    out, seen = [], set()
    for item in pairs:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"named_parameters must be (name, parameter) pairs, as "
                            f"model.named_parameters() gives; got {type(item).__name__}")
        if id(item[1]) not in seen:
            seen.add(id(item[1]))
            out.append(item)
    if not out:
        raise ValueError("named_parameters is empty")
    return out


def _as_module(params, named_parameters=None) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    """(the model, or a holder of its parameters; the script's torch optimizer or None).
    The holder names parameters as `named_parameters` does, else "0", "1", ...."""
    if isinstance(params, torch.optim.Optimizer):
        if named_parameters is not None:
            return _Named(_named(named_parameters)), params
        return _as_module([p for g in params.param_groups for p in g["params"]])[0], params
    if named_parameters is not None:
        raise TypeError("named_parameters= goes with a torch optimizer: "
                        "DistributedOptimizer(optimizer, named_parameters=model.named_parameters())")
    if isinstance(params, nn.Module):
        return params, None
    if isinstance(params, torch.Tensor):
        params = [params]
    unique, seen = [], set()
    for p in params:
        if isinstance(p, dict):
            raise TypeError("parameter groups go in a torch optimizer: "
                            "DistributedOptimizer(torch.optim.AdamW(groups), "
                            "named_parameters=model.named_parameters())")
        if isinstance(p, tuple):  # model.named_parameters()
            p = p[1]
        if not isinstance(p, nn.Parameter):
            raise TypeError(f"expected the model, its parameters or a torch optimizer, got "
                            f"{type(p).__name__}")
        if id(p) not in seen:
            seen.add(id(p))
            unique.append(p)
    return nn.ParameterList(unique), None


class DistributedOptimizer(torch.optim.Optimizer):
    """One worker's view of a job: `zero_grad()`, `step()`, `should_stop`, `close()`.

    `params` is the model (its state_dict names are kept), `model.parameters()`, or the
    script's own torch optimizer (SGD, Adam, AdamW, Adagrad, RMSprop, Adamax), as Horovod's
    `DistributedOptimizer(optimizer, named_parameters=model.named_parameters())`: the servers
    then run that optimizer's own implementation, its settings and parameter groups, instead
    of launch's `--optimizer`. Every rank must pass the same model (names, shapes, dtype) and
    the same optimizer: the coordinator refuses one that differs from the first rank's.
    It is a torch.optim.Optimizer: `param_groups` are the script's optimizer's (torch's
    GradScaler and lr schedulers take it).
    """

    # Steps pushed: a rank that closes with none (the job not stopped) leaves saying so, and
    # `paramserver launch` names it as failed (launch/core/verdict.py).
    _steps = 0
    _stop_said = False
    # Whether the script reads `batch_size` (itself or through BatchSampler): one that never
    # does, under a policy that sizes each worker's batch, is told once how to follow it.
    _follows_batch = False
    _batch_said = False
    _notice: Preemption | None = None  # an elastic job's SIGTERM watch (set once it joined)
    _moved = False  # a schedule has moved the groups' settings: each push carries them
    staging: DeviceStaging | None = None
    # The script's optimizer's parameters that got no gradient in a step (None: the servers'
    # own rule, which steps every key)
    idle: IdleParams | None = None
    # clip_grad_norm_'s setting for the next push (round mode: the servers clip the round's
    # average), in its wire form; None: not asked this step
    _clip: list | None = None

    def __init__(self, params: nn.Module | Iterable[nn.Parameter] | torch.optim.Optimizer,
                 join: str | None = None, timeout: float = 120.0, data_len: int | None = None,
                 named_parameters: Iterable[tuple[str, nn.Parameter]] | None = None,
                 compression: str | None = None):
        """`data_len`: the training set's size, which an elastic job (`launch --workers
        MIN:MAX`) needs: its coordinator deals each epoch's samples out to whoever is there,
        and `BatchSampler(data_len, opt)` draws what each release names. `compression`: a
        value codec for the pushed gradients ("fp16", "bf16", ...: compression/), as
        Horovod's `Compression.fp16`."""
        # Bad input fails before anything joins.
        self._codec = None
        if compression not in (None, "none", "fp32"):
            from paramserver.compression import make_codec
            self._codec = make_codec(compression)
        self.model, self.optimizer = _as_module(params, named_parameters)
        model_device(self.model)  # all on one device (cpu or cuda), also before joining
        dtype = next(self.model.parameters()).dtype
        self.keys = ModelKeys(self.model, dtype=dtype)
        spec = None if self.optimizer is None else describe(self.optimizer, self.model,
                                                            self.keys)
        # The groups' settings the servers started with: a schedule that moves them sends
        # them with each push from then on (a restarted or new shard learns them too).
        self._settings = None if self.optimizer is None else settings_of(self.optimizer)
        # Which parameters train: those that need no grad now are frozen on the servers.
        self._trains = self._trainable()
        join = _join_address(join)
        join = endpoint(join)  # a malformed one named now, not as a socket error
        self.kv = KVWorker(join, timeout=timeout, num_keys=self.keys.num_keys,
                           layout=_layout(self.model, dtype), optimizer=spec)
        try:
            if self.optimizer is not None:  # the script's groups, the same dicts
                torch.optim.Optimizer.__init__(self, self.optimizer.param_groups,
                                               self.optimizer.defaults)
            else:
                torch.optim.Optimizer.__init__(
                    self, [{"params": list(self.model.parameters())}],
                    {"lr": self.kv.spec.job.optimizer.lr})
            self._check_model(dtype)
            # Device handling: the flat buffers live on the model's device (cpu: the host
            # buffers the wire reads; cuda: staged through pinned host mirrors). The
            # gradients' host buffer is where a server on this host reads pushes in place
            # (shared memory), as the built-in worker's is; on cuda it is page-locked there.
            self.staging = DeviceStaging(self.model, self.keys,
                                         host_grads=torch.from_numpy(self.kv.shared_buffer()))
            self.params, self.grads = self.staging.params, self.staging.grads
            bind_to_flat(self.model, self.keys, self.params, self.grads)
            self.staging.watch(self.model)
            if self.optimizer is not None:
                self.idle = IdleParams(self.model, self.keys, self._trains)
            if self.kv.rank == 0:
                self.kv.init(self.staging.params_to_host())
            task = self.kv.spec.job.task
            self.pacer = Pacer(self.kv.rank, task.straggler, task.device_time, task.seed)
            self._t0 = time.monotonic()
            # An elastic job's worker leaves cleanly on SIGTERM (a preemption notice).
            self.elastic = self.kv.spec.job.elastic
            self._notice = Preemption() if self.elastic else None
            self.data_len = data_len
            t0 = time.perf_counter()
            self.release = self.kv.start(data_len if self.elastic else None)
            self._wait = time.perf_counter() - t0
            self._pull()
        except BaseException:
            self._leave(f"failed to start on rank {self.kv.rank}")
            raise
        _joined.append(self)

    def _check_model(self, dtype) -> None:
        if self.kv.num_keys != self.keys.num_keys:
            raise ValueError(
                f"rank {self.kv.rank}: the model has {self.keys.num_keys} parameters, the job's "
                f"key space (from the first worker's model) has {self.kv.num_keys}: every rank "
                f"must build the same model")
        if self.kv.dtype != torch.empty(0, dtype=dtype).numpy().dtype:
            raise ValueError(f"rank {self.kv.rank}: the job holds {self.kv.dtype} parameters, "
                             f"the model is {dtype}: launch the job with --dtype "
                             f"{str(dtype).removeprefix('torch.')} or convert the model "
                             f"(model.to(torch.{self.kv.dtype})) before DistributedOptimizer")

    @property
    def rank(self) -> int:
        return self.kv.rank

    @property
    def size(self) -> int:
        """The job's worker count."""
        return self.kv.spec.job.workers

    @property
    def param_groups(self) -> list[dict]:
        """The script's optimizer's groups (or the model's parameters as one group), for
        what works on an optimizer's groups (torch.amp.GradScaler: `scaler.step(opt)`
        unscales them, then calls step() unless they overflowed). Read between backward and
        step(), it says the gradient may change in place where torch's version counter does
        not see it (GradScaler's unscale): on a device step() then copies the whole gradient
        to the host again."""
        if self.staging is not None:
            self.staging.grads_replaced()
        return self._groups

    @param_groups.setter
    def param_groups(self, groups: list[dict]) -> None:
        self._groups = groups  # (torch.optim.Optimizer.__init__ sets it)

    @property
    def batch_size(self) -> int:
        """The batch size the sync policy wants for the next step."""
        self._follows_batch = True
        return self.release.batch_size

    @property
    def should_stop(self) -> bool:
        """True once the job's budget is spent: leave the loop and call close()."""
        return self.release.stop

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient buffer (never None: backward accumulates into the bound buffer).
        The step's compute time is counted from here when it comes after the pull."""
        self.grads.zero_()
        if not grads_are_bound(self.model, self.grads):
            # The script set them to None (model.zero_grad(), as many loops call before
            # training): backward made its own, which this zeroing would not reach, so the
            # next steps would push them summed with every gradient since.
            point_grads_at(self.model, self.keys, self.grads)
        self.staging.grads_zeroed()
        if self.idle is not None:
            self.idle.zeroed()
        self._clip = None  # (asked of the gradient it clipped, not of the next one)
        self._ready = time.perf_counter()

    def clip_grad_norm_(self, max_norm: float, norm_type: float | str = 2.0) -> torch.Tensor:
        """Clip the gradient this step applies by its norm, as DDP's script clips the averaged
        gradient with `torch.nn.utils.clip_grad_norm_` (FSDP's method of the same name): call
        it between backward and `step()`.

        Under a policy that averages each round on the servers (bsp, lbbsp) the gradient
        applied is the round's batch-weighted average over the ranks: this asks the servers to
        scale it by min(1, max_norm / (norm + 1e-6)), its norm taken over every shard, before
        the update rule sees it; every rank must ask the same (a rank that differs is refused
        at `step()`, naming both). Under a policy that applies each push on arrival (asp, ssp,
        dssp, ebsp, r2sp, auto) each push is an update of its own, so this rank's gradient is
        clipped here, as torch clips it. `norm_type`: a number > 0 or inf.

        Returns this rank's own gradient norm (before clipping), as torch's does for the
        gradient it is given; the norm of the average is put together on the servers."""
        norm_type = clipping.norm_type_of(norm_type)
        clipping.setting([max_norm, norm_type])  # (a bad max_norm named now)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.kv.spec.apply_mode == "arrival":
            self.staging.grads_replaced()  # (changed in place after backward's copies)
            return torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.grad is not None], max_norm,
                norm_type)
        self._clip = clipping.wire(max_norm, norm_type)
        if not grads:
            return torch.tensor(0.0)
        return torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.detach(), norm_type) for g in grads]),
            norm_type)

    def _pull(self) -> None:
        self.staging.before_host_write()
        self.kv.pull(out=self.staging.host_params_np, min_version=self.release.min_version)
        self.staging.params_from_host()  # cuda: queued; the next forward waits on the device
        self._ready = time.perf_counter()
        # (a pull writes the flat buffer, whose version counter is not the parameters')
        self._written = self._param_writes()

    def _param_writes(self) -> int:
        """How often the script has written the model's parameters in place (torch counts
        each in-place write of a tensor: load_state_dict, nn.init, copy_ under no_grad)."""
        return sum(p._version for p in self.model.parameters())

    def _trainable(self) -> tuple[bool, ...] | None:
        if self.optimizer is None:
            return None
        return tuple(p.requires_grad for p in self.model.parameters())

    def _check_frozen(self) -> None:
        """The servers froze the parameters that needed no grad when the optimizer joined (as
        torch skips them); one unfrozen or frozen since would silently keep the old course."""
        if self._trains is None or self._trainable() == self._trains:
            return
        name, p = next((n, p) for (n, p), was in zip(self.model.named_parameters(),
                                                       self._trains) if p.requires_grad != was)
        now = "requires grad now" if p.requires_grad else "needs no grad now"
        raise RuntimeError(
            f"rank {self.rank}: parameter {name!r} {now}, not as when DistributedOptimizer "
            f"joined: the servers freeze the parameters that need no grad at that point, "
            f"for the whole job (as DDP fixes them when it wraps the model). Set requires_grad "
            f"before creating the DistributedOptimizer; to hold a parameter back for a while, "
            f"put it in its own parameter group and set that group's lr to 0")

    def _wrote_params(self) -> bool:
        """The script has written the model's parameters since the last pull."""
        return self._param_writes() != self._written

    def _publish_params(self) -> None:
        """This rank's parameters as they are now (a checkpoint it restored after joining)
        become the job's: written over the servers' values. The other ranks take them with
        their next pull (horovod.broadcast_parameters makes every rank pull once it is in)."""
        from paramserver.client import optimizer_state
        from paramserver.core.keyspace import KeyRange
        optimizer_state.load_state(self.kv, KeyRange(0, self.keys.num_keys),
                                   {"values": self.staging.params_to_host()})

    def _check_unwritten(self) -> None:
        """The parameters are the servers': one the script wrote since the last pull (a
        snapshot loaded after joining, as DDP's tutorial does before its first step) would be
        overwritten by the next pull without a word, so it is refused, naming the fix."""
        if self._wrote_params():
            raise RuntimeError(
                f"rank {self.rank}: the model's parameters were written after "
                f"DistributedOptimizer joined the job (model.load_state_dict, an nn.init or "
                f"another in-place change): the servers hold the job's parameters, and the "
                f"next pull would overwrite these. Load or set the weights before creating the "
                f"DistributedOptimizer (rank 0's start the job), restore on rank 0 and then "
                f"call hvd.broadcast_parameters(model.state_dict(), root_rank=0) as Horovod's "
                f"resume does, or resume a launched run with `paramserver launch --resume RUN`")

    def step(self, loss: torch.Tensor | float | None = None, batch: int | None = None) -> None:
        """Push this step's gradients, wait for the policy's release, pull fresh parameters."""
        if self not in _joined:
            raise RuntimeError(f"rank {self.rank}: step() after close()")
        if self.release.stop:
            # The budget is spent: a script that loops over its own epochs (DDP's, Horovod's)
            # is not interrupted by an exception; its steps do nothing from here.
            if not self._stop_said:
                self._stop_said = True
                log.warning("rank %d: the job has stopped (its budget is spent); step() does "
                            "nothing from here (paramserver.DistributedSampler's epochs end "
                            "with the job; another loop can stop on opt.should_stop)",
                            self.rank)
            return
        self._check_unwritten()
        self._check_frozen()
        bound = grads_are_bound(self.model, self.grads)
        idle = None if self.idle is None else self.idle.runs(bound, self.grads)
        if not bound:
            self.keys.flatten_grads(self.model, self.grads)
            self.staging.grads_replaced()
        # cuda: waits for backward's last copies, so the device's compute is counted too.
        grads = self.staging.grads_to_host()
        real = time.perf_counter() - self._ready
        if batch is None and not self._follows_batch:
            self._fixed_batch()
        batch = self.release.batch_size if batch is None else int(batch)
        compute, factor = self.pacer.stretch(self.release.step, time.monotonic() - self._t0,
                                             batch, real)
        t0 = time.perf_counter()
        staleness = self.kv.push(grads, step=self.release.step, batch=batch,
                                 scale=self.release.scale, round_size=self.release.round_size,
                                 round_id=self.release.round_id,
                                 codec=self._codec, hyper=self._hyper(), idle=idle,
                                 clip=self._clip)
        self._clip = None
        record = {"compute_s": round(compute, 6), "real_compute_s": round(real, 6),
                  "wait_s": round(self._wait, 6), "push_s": round(time.perf_counter() - t0, 6),
                  "staleness": int(staleness), "factor": round(factor, 4),
                  # Dense both ways: the report's bytes per step, as the built-in worker's.
                  "push_bytes": int(grads.nbytes), "pull_bytes": int(grads.nbytes)}
        if loss is not None:
            value = loss.detach() if isinstance(loss, torch.Tensor) else loss
            record["loss"] = round(float(value), 6)
        if self._notice is not None and self._notice.given:
            # Preempted: this step's push is in; it counts, and the worker is gone.
            self.kv.leave(self.release.step, batch, compute, record, "preempted")
            self._steps += 1
            self._stopped()
            return
        if self.optimizer is not None:
            # The script's optimizer stepped, on the servers: a torch lr scheduler built on it
            # (before it was wrapped, as DDP and Horovod scripts do) checks this flag, which
            # its own step() would have set, and otherwise warns that the schedule is stepped
            # before the optimizer, telling the script to reorder a correct loop.
            self.optimizer._opt_called = True
        t1 = time.perf_counter()
        self.release = self.kv.clock(self.release.step, batch, compute_time=compute,
                                     record=record)
        self._wait = time.perf_counter() - t1
        self._steps += 1
        if self._notice is not None and self._notice.given and not self.release.stop:
            self.kv.bye("preempted")  # the notice came during the wait: its release unrun
            self._stopped()
            return
        # At the stop too: the model (and state_dict(), the exported model.pt) then ends on
        # the job's final parameters, not one round short of them.
        self._pull()

    def _fixed_batch(self) -> None:
        """The policy sized this step's batch (LB-BSP, R2SP's heterogeneous mode, auto with
        LB-BSP in force) but the script never read opt.batch_size: it trains on its own
        DataLoader's batch, while the push would say the policy's and be weighted by it."""
        asked, job = self.release.batch_size, self.kv.spec.job
        if self._batch_said or asked == job.batch_size:
            return
        self._batch_said = True
        log.warning("rank %d: the sync policy %s sizes each worker's batch (this step: %d "
                    "samples, the job's batch %d) but this script never reads opt.batch_size: "
                    "its pushes are weighted as if it trained on the policy's batches. Draw "
                    "batches with paramserver.BatchSampler(len(data), opt) (DataLoader's "
                    "batch_sampler), or pass the batch trained on: opt.step(batch=len(x)); "
                    "a fixed batch works as is under bsp, asp, ssp, dssp and ebsp",
                    self.rank, job.sync.name, asked, job.batch_size)

    def _hyper(self) -> list | None:
        """The groups' settings, once a schedule has moved any from those the job began
        with (from then on at every push, even back at those); None until then."""
        if self.optimizer is None:
            return None
        now = settings_of(self.optimizer)
        if now == self._settings and not self._moved:
            return None
        # From the first move on, every push carries them: a schedule that comes back to the
        # settings the job began with (a warmup ending at the base lr) must reach the servers
        # too, which hold the last ones sent.
        self._moved = True
        return [[i, g] for i, g in enumerate(now)]

    def report(self, test_accuracy: float, test_loss: float | None = None, **extra: float) -> None:
        """Report the script's own test evaluation: it becomes the run's evaluation record
        (metrics.jsonl `kind: eval`, timed on the job's clock when the coordinator receives
        it), which `compare -- CMD` takes its time to target from and launch's progress line
        shows. `extra` numbers (e.g. test_auc) ride along."""
        record = {"kind": "eval", "accuracy": float(test_accuracy), "worker": self.rank,
                  "step": self.release.step}
        if test_loss is not None:
            record["test_loss"] = float(test_loss)
        for key, value in extra.items():
            record["auc" if key == "test_auc" else key] = float(value)
        self.kv.report(record)

    def paused(self, reason: str = "evaluation"):
        """`with opt.paused():` around the script's own evaluation (or any deliberate wait
        between steps): the job's stall detector does not flag it (docs/observability.md,
        "Seeing a stalled job")."""
        return self.kv.session.paused(reason)

    def state_dict(self) -> dict:
        """Wrapping a model: a copy of the trained model's state (the model's own names;
        buffers included), as of the last pull, that loads into a fresh model with
        load_state_dict. Wrapping the script's torch optimizer: that optimizer's state_dict
        as the servers hold it now (its moments and step counts, torch's own format), as
        Horovod's DistributedOptimizer gives it."""
        if self.optimizer is None:
            return OrderedDict((k, v.detach().clone())
                               for k, v in self.model.state_dict().items())
        from paramserver.client import optimizer_state
        return optimizer_state.read(self.kv, self.model, self.keys, self.optimizer)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load an optimizer state_dict (this one's, or a plain torch optimizer's of the same
        class and groups) onto the servers; its groups' settings (lr, ...) go with the next
        push. Only when wrapping the script's torch optimizer."""
        if self.optimizer is None:
            raise ValueError("this DistributedOptimizer wraps a model, whose update rule the "
                             "servers choose (launch's --optimizer): load weights with "
                             "model.load_state_dict before creating the DistributedOptimizer, "
                             "or resume a run with `paramserver launch --resume RUN`")
        from paramserver.client import optimizer_state
        optimizer_state.write(self.kv, self.model, self.keys, self.optimizer, state_dict)

    def _stopped(self) -> None:
        """This worker has left (preempted): should_stop turns True, the loop ends."""
        r = self.release
        self.release = Release(r.worker, r.step, r.batch_size, None, r.scale, r.min_version,
                               r.round_size, True, r.round_id)

    def _leave(self, reason: str) -> None:
        if self._notice is not None:
            self._notice.restore()
        if self.staging is not None:
            self.staging.close()  # its page-locked memory is the KV's, which closes now
        if self.kv.left is not None:  # gone already (preempted)
            self.kv.close()
            return
        try:
            self.kv.bye(reason)
        except Exception:  # noqa: BLE001 - the coordinator may be gone; the sockets still close
            pass
        finally:
            self.kv.close()

    def close(self) -> None:
        """Leave the job (the policy stops waiting for this worker) and close the sockets."""
        if self in _joined:
            _joined.remove(self)
            self._leave("done" if self._steps or self.release.stop else NO_STEP_REASON)

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self in _joined:  # leave at once: the others must not wait for this rank
            _joined.remove(self)
            self._leave(f"rank {self.rank} failed: {exc_type.__name__}: {exc}"[:200])


_joined: list[DistributedOptimizer] = []  # this process's optimizers, for rank() and size()


@atexit.register
def _close_at_exit() -> None:
    """A script that returns without close(): its rank leaves now, so the others do not wait
    a heartbeat timeout for it (and one that never stepped says so)."""
    left = bool(_joined)
    for opt in list(_joined):
        # A coordinator already gone must not hold the interpreter's exit for long.
        opt.kv.session.timeout = min(opt.kv.session.timeout, 5.0)
        opt.close()
    if own_job is not None:  # a job of this process's own ends with it
        own_job.stop(finished=left)


def init(join: str | None = None) -> None:
    """Horovod's `init()`: makes sure this process has a job to join (the optimizer joins it):
    `join`, launch's, or run with plain python a job of one worker of its own (own_job)."""
    _join_address(join)


def _join_address(join: str | None) -> str:
    join = join or os.environ.get(JOIN_ENV)
    if join:
        return join
    if own_job is None:
        raise RuntimeError(f"no job to join: pass join='tcp://HOST:PORT' or run under "
                           f"`paramserver launch` (which sets {JOIN_ENV})")
    join = os.environ[JOIN_ENV] = own_job.join_address()  # this process's from here on
    return join


def _env_int(*names: str) -> int | None:
    for name in names:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return None


def rank() -> int:
    """This worker's rank: the coordinator's once an optimizer has joined, else the
    launcher's RANK (under launch the two agree: a worker asks for its RANK at register)."""
    if _joined:
        return _joined[-1].rank
    value = _env_int("PARAMSERVER_RANK", "RANK")
    if value is None:
        raise RuntimeError("rank() is known once DistributedOptimizer(...) has joined the job")
    return value


def size() -> int:
    """The job's worker count: the welcome's once joined, else the launcher's WORLD_SIZE."""
    if _joined:
        return _joined[-1].size
    value = _env_int("PARAMSERVER_WORLD_SIZE", "WORLD_SIZE")
    if value is None:
        raise RuntimeError("size() is known once DistributedOptimizer(...) has joined the job")
    return value
