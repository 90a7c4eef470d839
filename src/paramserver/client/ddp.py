"""DDP's model wrapper as a DDP script uses it, on the parameter server.

    model = paramserver.DistributedDataParallel(model, device_ids=[local_rank])

A DDP script keeps its `DDP(model)` line (the import changes): `model.module` (what DDP's
tutorial saves, `model.module.state_dict()`), `model(x)` and `with model.no_sync():` (gradient
accumulation) work as under DDP, and its state_dict has DDP's `module.` names. Nothing happens
in backward: the gradients accumulate in the optimizer's buffer and go to the servers with
`DistributedOptimizer.step()`, so `no_sync()` has nothing to hold back and only marks the block;
the accumulated gradient is pushed at the step, as DDP's is reduced at the last backward.
The parameters start from rank 0's when the optimizer joins (as DDP broadcasts them); buffers
(BatchNorm's statistics) stay each rank's own, as with `broadcast_buffers=False`.
`find_unused_parameters` needs nothing: with the script's optimizer on the servers, a parameter
no rank's backward reached in a step is left out of it, as DDP leaves its grad None, and one
some rank used gets the averaged gradient (client/idle_params.py).
"""

from __future__ import annotations

import contextlib

from torch import nn


class DistributedDataParallel(nn.Module):
    """`torch.nn.parallel.DistributedDataParallel`'s signature; the module as `.module`."""

    def __init__(self, module: nn.Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 **kwargs):
        super().__init__()
        if process_group is not None:
            raise ValueError("process groups have no meaning on the parameter server: "
                             "DistributedDataParallel(model)")
        if not isinstance(module, nn.Module):
            raise TypeError(f"DistributedDataParallel wraps a torch.nn.Module, got "
                            f"{type(module).__name__}")
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's gradient accumulation: here every backward accumulates until step()."""
        yield
