"""Horovod's PyTorch API on the parameter server: `import paramserver.horovod as hvd`.

A Horovod script changes its import line and is launched with `paramserver launch -- python
script.py` (run with plain python, it is a job of one worker, as under Horovod): `hvd.init()`, `hvd.rank()`/`size()`, `hvd.DistributedOptimizer(optimizer,
named_parameters=...)`, `hvd.broadcast_parameters`, `hvd.broadcast_optimizer_state` and
`hvd.allreduce` of metrics keep their names and signatures, and so do the optimizer's
`synchronize()` and `skip_synchronize()` (Horovod's mixed-precision loop).

What differs, and why:
- the gradients are not allreduced among the workers: each `step()` pushes them to the servers,
  which run the script's optimizer (its class, settings, groups and schedule) under the job's
  sync policy, and pulls the parameters back;
- `broadcast_parameters` checks the parameters are the job's (rank 0's initial values start the
  job; every rank pulls them when its optimizer joins) and broadcasts the rest of a state dict
  (buffers such as BatchNorm's statistics) from the root for real;
- `broadcast_optimizer_state` has nothing to send: the optimizer's state lives on the servers,
  one copy for every rank;
- `allreduce`, `allgather` and `broadcast` of tensors, and `barrier`, go through the
  coordinator and are meant for metrics (at most 65,536 numbers each): every training rank
  must call each one, in the same order, as under Horovod;
- `op=Adasum`, `Sum` on the optimizer, process sets and NCCL/MPI/Gloo queries have no meaning
  here: the first are refused with the reason, the queries answer False as Horovod's do when a
  feature is not built.
"""

from __future__ import annotations

import contextlib
import itertools
import os

import torch

from paramserver import user_api

api = user_api()

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Sum", "allgather",
    "allreduce", "allreduce_", "barrier", "broadcast", "broadcast_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank",
    "cross_size", "cuda_built",
    "ddl_built", "gloo_built", "gloo_enabled", "init", "is_initialized", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "rocm_built", "shutdown", "size",
]

Average, Sum, Adasum = "Average", "Sum", "Adasum"


class Compression:
    """Horovod's gradient compressions: `none`, or `fp16` (each push's values in float16)."""

    none = "none"
    fp16 = "fp16"


_initialized = False
_names = itertools.count()


def init(comm=None, process_sets=None) -> None:
    """Join the job `paramserver launch` started (it sets PARAMSERVER_JOIN), or, run with plain
    python, a job of one worker of this process's own (as hvd.init() without horovodrun)."""
    global _initialized
    if comm is not None or process_sets is not None:
        raise ValueError("communicators and process sets have no meaning on the parameter "
                         "server: call hvd.init()")
    api.init()
    _initialized = True


def is_initialized() -> bool:
    return _initialized


def rank() -> int:
    return api.rank()


def size() -> int:
    return api.size()


def local_rank() -> int:
    """The rank on this host: torchrun's LOCAL_RANK, which launch sets."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else rank()


def local_size() -> int:
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() else size()


def cross_rank() -> int:
    return 0


def cross_size() -> int:
    return 1


class _DistributedOptimizer(api.DistributedOptimizer):
    """What hvd.DistributedOptimizer returns: the job's optimizer with Horovod's own methods.

    Horovod's mixed-precision loop (its pytorch_mnist.py) calls `synchronize()` to finish the
    allreduces before `scaler.unscale_(optimizer)`, then `scaler.step(optimizer)` inside
    `skip_synchronize()`. Here nothing is in flight before `step()`, which pushes this rank's
    gradient as it finds it then (unscaled, clipped); so the first waits for nothing and the
    second only marks the block."""

    def synchronize(self) -> None:
        """Nothing to wait for: the gradients go to the servers with step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=Compression.none, backward_passes_per_step: int = 1,
                         op=Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups=None, sparse_as_dense: bool = False,
                         process_set=None) -> api.DistributedOptimizer:
    """Horovod's signature: the servers run `optimizer` (see this module's doc). Several
    backward passes per step accumulate in the gradient buffer until `step()`, as Horovod's
    `backward_passes_per_step` does; `gradient_predivide_factor` changes nothing (Average's
    result is the same with it)."""
    if op != Average:
        raise ValueError(f"op={op}: the servers average the workers' gradients (Average); "
                         f"{op} has no counterpart on the parameter server")
    # Horovod splits Average's 1/size into 1/factor before the sum and factor/size after it,
    # against fp16 overflow in the sum: the same average, which the servers take.
    factor = gradient_predivide_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"gradient_predivide_factor must be a number > 0, got {factor!r}")
    if process_set is not None:
        raise ValueError("process sets have no meaning on the parameter server")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    if compression not in (Compression.none, Compression.fp16):
        raise ValueError(f"compression must be hvd.Compression.none or hvd.Compression.fp16, "
                         f"got {compression!r}")
    # The parameters' storage before joining rebinds them: a state dict taken earlier (for
    # broadcast_parameters) still points there.
    before = {p.data_ptr() for g in optimizer.param_groups for p in g["params"]}
    opt = _DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                compression=compression)
    deferred, _deferred[:] = list(_deferred), []
    names = {n for n, _ in opt.model.named_parameters()}
    for items, root in deferred:
        _broadcast_state(items, root, before | {p.data_ptr() for p in opt.model.parameters()},
                         names)
    return opt


def _joined(what: str = "this call") -> api.DistributedOptimizer:
    if not api._joined:
        raise RuntimeError(f"hvd.{what} before hvd.DistributedOptimizer: collectives go "
                           f"through the job's coordinator, which a rank joins with its "
                           f"optimizer; call it after hvd.DistributedOptimizer(optimizer, "
                           f"named_parameters=...) (e.g. Horovod's ImageNet example's broadcast "
                           f"of resume_from_epoch: move it below the optimizer's wrapping)")
    return api._joined[-1]


def _collective(kind: str, tensor: torch.Tensor, name: str | None, root: int = 0):
    what = "barrier()" if name and name.startswith("barrier.") else f"{kind}()"
    opt = _joined(what)
    name = name or f"{kind}.{next(_names)}"
    values = tensor.detach().reshape(-1).to("cpu", torch.float64).tolist()
    return opt.kv.session.collective(kind, name, values, root)


def _like(values, tensor: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(tensor.dtype).reshape(
        tensor.shape).to(tensor.device)


def allreduce(tensor: torch.Tensor, average=None, name: str | None = None, compression=None,
              op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set=None) -> torch.Tensor:
    """The element-wise average (or, with op=hvd.Sum, sum) of `tensor` over the training
    ranks, as a new tensor of its shape, dtype and device."""
    op = op or (Sum if average is False else Average)
    if op not in (Average, Sum):
        raise ValueError(f"op={op}: allreduce here averages or sums")
    summed, count = _collective("allreduce", tensor * prescale_factor, name)
    out = _like(summed, tensor)
    if op == Average:
        out = out / count if out.is_floating_point() else out // count
    return out * postscale_factor if postscale_factor != 1.0 else out


def allreduce_(tensor: torch.Tensor, average=None, name: str | None = None, op=None,
               **kwargs) -> torch.Tensor:
    tensor.copy_(allreduce(tensor, average, name, op=op, **kwargs))
    return tensor


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set=None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along its first dimension, in rank order (their
    first dimensions may differ, as under Horovod)."""
    if tensor.dim() == 0:
        raise ValueError("allgather takes a tensor of at least one dimension")
    parts, _ = _collective("allgather", tensor, name)
    rest = tuple(tensor.shape[1:])
    width = max(1, int(torch.tensor(rest).prod())) if rest else 1
    pieces = [torch.tensor(v, dtype=torch.float64).reshape(len(v) // width, *rest)
              for _, v in parts]
    return torch.cat(pieces).to(tensor.dtype).to(tensor.device)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set=None) -> torch.Tensor:
    values, _ = _collective("broadcast", tensor, name, root_rank)
    return _like(values, tensor)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set=None) -> torch.Tensor:
    tensor.copy_(broadcast(tensor, root_rank, name))
    return tensor


def barrier(process_set=None) -> None:
    """Returns once every training rank has called it (as Horovod's, and DDP's dist.barrier):
    an empty collective through the coordinator, so it needs the optimizer to have joined."""
    if process_set is not None:
        raise ValueError("process sets have no meaning on the parameter server")
    _collective("allreduce", torch.zeros(1), f"barrier.{next(_names)}")


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, process_set=None):
    raise TypeError("broadcast_object would pickle the object: broadcast tensors instead "
                    "(hvd.broadcast), or numbers")


def broadcast_parameters(params, root_rank: int = 0, process_set=None) -> None:
    """Horovod's `broadcast_parameters(model.state_dict(), root_rank=0)`: the job's parameters
    are rank 0's already on every rank; the state dict's other tensors (buffers) are
    broadcast from `root_rank` (once the optimizer has joined, when called before it). Called
    after joining, parameters rank 0 wrote since (a checkpoint it restored) become the job's
    and every rank's, as under Horovod."""
    items = list(params.items() if hasattr(params, "items") else params)
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is no tensor")
    if not api._joined:  # Horovod's examples call it before wrapping the optimizer
        _deferred.append((items, root_rank))
        return
    opt = api._joined[-1]
    _broadcast_state(items, root_rank, {p.data_ptr() for p in opt.model.parameters()},
                     {n for n, _ in opt.model.named_parameters()})
    _broadcast_written(opt, root_rank)


def _broadcast_written(opt: api.DistributedOptimizer, root_rank: int) -> None:
    """Horovod's resume (its pytorch_imagenet_resnet50.py): rank 0 restores a checkpoint into
    the model after wrapping the optimizer, then broadcasts the parameters. The root's
    parameters written since its last pull become the job's (written to the servers), and
    once every rank is here each rank that holds other values pulls them."""
    published = opt.rank == root_rank and opt._wrote_params()
    if published:
        opt._publish_params()
    # (every rank takes part, so none pulls before the root's values are on the servers)
    summed, _ = _collective("allreduce", torch.tensor([float(published)]),
                            f"broadcast_parameters.written.{next(_names)}")
    if summed[0] or opt._wrote_params():
        opt._pull()


_deferred: list = []  # broadcast_parameters called before the optimizer joined


def _broadcast_state(items, root_rank: int, params: set[int], names: set[str]) -> None:
    for name, value in sorted(items, key=lambda kv: kv[0]):
        if (value.data_ptr() in params or name in names
                or isinstance(value, torch.nn.Parameter)):
            if root_rank != 0:
                raise ValueError("the job's parameters start from rank 0's: "
                                 "broadcast_parameters(..., root_rank=0)")
            continue
        if value.numel():
            broadcast_(value, root_rank, name=f"broadcast_parameters.{name}")


def broadcast_optimizer_state(optimizer, root_rank: int = 0, model=None,
                              process_set=None) -> None:
    """Nothing to send: the optimizer's state is on the servers, one copy for every rank."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state takes the optimizer, got "
                        f"{type(optimizer).__name__}")


def join(device: int = -1) -> int:
    """This rank is done (its data ran out): it leaves the job, so the others stop waiting
    for it; returns its rank."""
    me = rank()
    for opt in list(api._joined):
        opt.close()
    return me


def shutdown() -> None:
    for opt in list(api._joined):
        opt.close()


def __getattr__(name: str):
    if name == "elastic":  # Horovod Elastic: hvd.elastic.run, TorchState, ElasticSampler
        raise AttributeError(
            "hvd.elastic (Horovod Elastic: elastic.run, TorchState, commit, ElasticSampler) "
            "has no counterpart here: call the train function directly, and for workers that "
            "come and go use `paramserver launch --workers MIN:MAX` with "
            "paramserver.BatchSampler(len(data), opt) and DistributedOptimizer(..., "
            "data_len=len(data))")
    raise AttributeError(f"module 'paramserver.horovod' has no attribute {name!r}")


def _not_built() -> bool:
    """What Horovod answers for a feature it was built without: none of these exist here."""
    return False


mpi_threads_supported = mpi_enabled = mpi_built = _not_built
gloo_enabled = gloo_built = ddl_built = ccl_built = cuda_built = rocm_built = _not_built


def nccl_built() -> int:
    return 0
