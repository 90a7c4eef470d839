"""Which of a script's parameters got no gradient since zero_grad() (client/idle_params.py):
the key runs a push names `idle`. Bound to the flat buffers as DistributedOptimizer binds a
model, on cpu and staged as on cuda (DeviceStaging's own hooks beside these), and with grads a
script set to None (then a .grad of None is what says unused). The servers' side and the live
checks against torch: tests/server/test_idle_keys.py, tests/optim/test_unused_params.py."""

import numpy as np
import pytest
import torch
from torch import nn

from paramserver.client.dense import checked_idle
from paramserver.client.device_staging import DeviceStaging
from paramserver.client.idle_params import IdleParams
from paramserver.core.keyspace import KeyRange
from paramserver.models import ModelKeys
from paramserver.models.flat_binding import bind_to_flat, grads_are_bound


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(3, 4)  # keys [0, 16)
        self.aux = nn.Linear(4, 2)  # [16, 26)
        self.head = nn.Linear(4, 2)  # [26, 36)
        self.spare = nn.Linear(4, 2)  # [36, 46)

    def forward(self, x, aux=False, head=True):
        h = torch.tanh(self.body(x))
        out = self.head(h) if head else h[:, :2]
        return out + self.aux(h) if aux else out


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _bound(stage=False, frozen=()):
    model = Net()
    for name in frozen:
        model.get_parameter(name).requires_grad = False
    if stage == "cuda":  # staged through pinned host copies, DeviceStaging's hooks copying
        model, stage = model.cuda(), None
    keys = ModelKeys(model)
    staging = DeviceStaging(model, keys, stage=stage)
    bind_to_flat(model, keys, staging.params, staging.grads)
    staging.watch(model)
    idle = IdleParams(model, keys, tuple(p.requires_grad for p in model.parameters()))
    return model, staging, idle


def _step(model, staging, idle, **uses):
    staging.grads.zero_()
    staging.grads_zeroed()
    idle.zeroed()
    model(torch.randn(5, 3, device=staging.device), **uses).sum().backward()


@pytest.mark.parametrize("stage", [False, True, pytest.param("cuda", marks=cuda)])
def test_the_parameters_no_backward_reached_since_zero_grad_are_named(stage):
    model, staging, idle = _bound(stage)
    _step(model, staging, idle, aux=True)
    assert idle.runs(True) == [[36, 46]]  # the spare head only
    _step(model, staging, idle)
    assert idle.runs(True) == [[16, 26], [36, 46]]
    _step(model, staging, idle, head=False)  # aux unused, head unused: one run with spare
    assert idle.runs(True) == [[16, 46]]
    # a second backward before the step (gradient accumulation) that uses aux
    model(torch.randn(5, 3, device=staging.device), aux=True, head=False).sum().backward()
    assert idle.runs(True) == [[26, 46]]
    if stage:  # DeviceStaging's hooks still copy every layer: the host has the whole gradient
        assert torch.equal(torch.from_numpy(staging.grads_to_host()), staging.grads.cpu())


def test_every_parameter_used_names_none_and_a_frozen_one_is_not_named():
    model, staging, idle = _bound(frozen=("spare.weight", "spare.bias"))
    _step(model, staging, idle, aux=True)
    assert idle.runs(True) is None
    _step(model, staging, idle)
    assert idle.runs(True) == [[16, 26]]


def test_grads_a_script_set_to_none_say_unused_by_being_none():
    model, staging, idle = _bound()
    _step(model, staging, idle, aux=True)
    model.zero_grad()  # (set_to_none): backward makes new gradients, None where unused
    model(torch.randn(5, 3)).sum().backward()
    assert not grads_are_bound(model, staging.grads)
    assert model.aux.weight.grad is None
    assert idle.runs(False, staging.grads) == [[16, 26], [36, 46]]
    model.aux.bias.grad = torch.zeros(2)  # a gradient the script set: torch would step it
    assert idle.runs(False, staging.grads) == [[16, 24], [36, 46]]


def test_a_push_checks_its_idle_runs_against_its_keys():
    assert checked_idle([[2, 4], [6, 8]], KeyRange(0, 10)) == [(2, 4), (6, 8)]
    for bad in ([[4, 2]], [[2, 6], [4, 8]], [[6, 8], [2, 4]], [[8, 12]], [[2, 2]]):
        with pytest.raises(ValueError, match="idle keys must be a list of sorted"):
            checked_idle(bad, KeyRange(0, 10))


@pytest.mark.parametrize("bad,says", [
    ("abc", "got 'abc'"), (5, "got 5"), ([1, 2], "got the item 1"),
    ([[1.5, 3]], "got the item [1.5, 3]"), ([["a", 2]], "got the item ['a', 2]"),
    ([[True, 3]], "got the item [True, 3]"), ([[3, 1]], "got [[3, 1]]"),
    ([[0, 20]], "got [[0, 20]]"), ([[2, 4], [3, 5]], "got [[2, 4], [3, 5]]")])
def test_a_kv_push_names_what_is_wrong_with_its_idle_keys(bad, says):
    """The KV API's `idle` is checked before anything is sent: a list of sorted, disjoint
    [lo, hi] pairs of whole numbers inside the pushed keys, else one clear ValueError (not
    int()'s message, nor a float taken as its floor)."""
    with pytest.raises(ValueError, match="idle keys must be a list of sorted, disjoint") as err:
        checked_idle(bad, KeyRange(0, 10))
    assert says in str(err.value)
    assert checked_idle([[0, 2], (np.int64(4), 10)], KeyRange(0, 10)) == [(0, 2), (4, 10)]
