"""Device-resident flat buffers and their host staging (client/device_staging.py).

The staging logic runs on any machine: `stage=True` stages a cpu model through separate
buffers with plain copies, so CI checks the key ranges, the hook order and bit-for-bit
equality with the pass-through path. The tests marked `cuda` need a GPU and skip without one.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from paramserver.client.device_staging import DeviceStaging, model_device, resolve_device
from paramserver.models.flat_binding import bind_to_flat
from paramserver.models import ModelKeys
from paramserver.optim import make_rule
from paramserver.spec.job import JobSpec, JobSpecError, TaskSpec

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs CUDA: the device path's copies and pinned memory")


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(),
                         nn.Linear(4, 3))


def bound(model: nn.Module, stage: bool):
    keys = ModelKeys(model)
    staging = DeviceStaging(model, keys, stage=stage)
    bind_to_flat(model, keys, staging.params, staging.grads)
    staging.watch(model)
    return keys, staging


def train_steps(stage: bool, steps: int = 3):
    """Steps as a worker runs them, with the servers' real update rule (momentum) between the
    push and the pull: returns (gradients pushed, parameters after each pull)."""
    model = mlp()
    keys, staging = bound(model, stage)
    server = torch.from_numpy(staging.params_to_host().copy())
    rule = make_rule("momentum", 0.1, momentum=0.9)
    state = rule.init_state(server)
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
    pushed, pulled = [], []
    for _ in range(steps):
        staging.grads.zero_()
        staging.grads_zeroed()
        model(x).pow(2).mean().backward()
        grads = torch.from_numpy(staging.grads_to_host().copy())
        pushed.append(grads)
        rule.apply(server, slice(None), grads, state, 0)
        staging.before_host_write()
        staging.host_params_np[:] = server.numpy()
        staging.params_from_host()
        pulled.append(keys.flatten_params(model).clone())
    return pushed, pulled


def test_a_step_through_the_staging_path_equals_the_plain_path_bit_for_bit():
    plain, staged = train_steps(stage=False), train_steps(stage=True)
    for a, b in zip(plain[0] + plain[1], staged[0] + staged[1]):
        assert torch.equal(a, b)
    assert not torch.equal(plain[1][0], plain[1][-1])  # the steps did move the model


def test_on_cpu_staging_is_a_pass_through():
    model = mlp()
    keys, staging = bound(model, stage=None)
    assert not staging.staged
    assert staging.params is staging.host_params and staging.grads is staging.host_grads
    assert staging.host_params_np.ctypes.data == staging.params.data_ptr()
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    assert staging.grads_to_host() is staging.host_grads_np


def test_each_layer_lands_in_its_key_range_in_backward_order():
    model = mlp()
    keys, staging = bound(model, stage=True)
    assert staging.params.data_ptr() != staging.host_params.data_ptr()
    owner = {name: i for i, layer in enumerate(keys.layers) for name in layer.params}
    completed = []  # layers in the order backward finished their gradients

    def finished(name):
        def hook(p):
            i = owner[name]
            if all(q.grad is not None for n, q in model.named_parameters() if owner[n] == i):
                if i not in completed:
                    completed.append(i)
        return hook

    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(finished(name))
    landed = []
    staging.on_landed = lambda i: landed.append(
        (i, staging.host_grads[keys.layers[i].keys.lo:keys.layers[i].keys.hi].clone()))
    staging.grads_zeroed()
    model(torch.randn(8, 6)).pow(2).sum().backward()
    # Landed during backward (each copy as its layer completed), before anything waited.
    assert [i for i, _ in landed] == completed == [2, 1, 0]
    staging.finish_backward()
    flat = keys.flatten_grads(model)
    for i, values in landed:
        r = keys.layers[i].keys
        assert torch.equal(values, flat[r.lo:r.hi])
    assert torch.equal(torch.from_numpy(staging.host_grads_np), flat)
    assert staging.copied == [2, 1, 0]


def test_a_layer_without_a_gradient_or_accumulated_twice_is_copied_again():
    model = mlp()
    keys, staging = bound(model, stage=True)
    for p in model[0].parameters():
        p.requires_grad_(False)  # layer 0 gets no gradient this step: its zeros still go
    staging.grads.fill_(7.0)
    staging.grads.zero_()
    staging.grads_zeroed()
    x = torch.randn(4, 6)
    model(x).sum().backward()
    model(x).sum().backward()  # accumulated twice: the first copies are stale
    host = torch.from_numpy(staging.grads_to_host())
    assert torch.equal(host, staging.grads)
    assert sorted(staging.copied[-3:]) == [0, 1, 2]


def test_parameters_on_two_devices_are_refused_naming_them():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2, device="meta"))
    with pytest.raises(ValueError, match=r"2 devices \('0.weight' on cpu, '1.weight' on meta\)"):
        model_device(model)
    import paramserver
    with pytest.raises(ValueError, match="one device"):  # refused before joining anything
        paramserver.DistributedOptimizer(model, join="tcp://127.0.0.1:9")


def test_device_names_resolve_and_cuda_without_cuda_is_refused(capsys, tmp_path):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="expected one of cpu, cuda, auto"):
        resolve_device("gpu")
    if torch.cuda.is_available():
        return
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    from paramserver.cli.main import main
    rc = main(["train", "--device", "cuda", "--steps", "1", "--quiet",
               "--out", str(tmp_path / "run")])
    assert rc == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_the_task_carries_its_device():
    assert JobSpec().to_dict()["task"]["device"] == "cpu"
    spec = JobSpec(task=TaskSpec(device="cuda:1"))
    assert JobSpec.from_dict(spec.to_dict()).task.device == "cuda:1"
    with pytest.raises(JobSpecError, match="task.device"):
        TaskSpec(device="gpu")


CUDA_SCRIPT = """
import sys
import torch
from torch import nn
import paramserver

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).cuda()
x = torch.randn(256, 16, device="cuda")
y = (x[:, 0] > 0).long()
losses = []
with paramserver.DistributedOptimizer(model) as opt:
    assert opt.params.is_cuda and opt.grads.is_cuda
    assert opt.staging.host_params.is_pinned() and opt.staging.host_grads.is_pinned()
    assert all(p.is_cuda for p in model.parameters())
    while not opt.should_stop:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss))
        opt.step(loss)
assert losses[-1] < losses[0], losses
print("cuda ok", losses[0], losses[-1])
"""


@cuda
def test_a_cuda_model_trains_through_a_launched_job(tmp_path):
    path = tmp_path / "user.py"
    path.write_text(textwrap.dedent(CUDA_SCRIPT))
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--out", str(tmp_path / "run"),
         "--workers", "2", "--steps", "30", "--lr", "0.5", "--timeout", "120", "--",
         sys.executable, str(path)], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    logs = [(tmp_path / "run" / "logs" / f"worker-{r}.log").read_text() for r in (0, 1)]
    assert all("cuda ok" in log for log in logs)


@cuda
@pytest.mark.parametrize("schedule", ["off", "fifo"])
def test_train_device_cuda_runs_the_built_in_task(tmp_path, schedule):
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "train", "--device", "cuda", "--workers", "2",
         "--steps", "20", "--schedule", schedule, "--quiet", "--out", str(tmp_path / "run"),
         "--timeout", "120"], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"device": "cuda"' in (tmp_path / "run" / "config.json").read_text()


def train_task_steps(tmp_path, schedule: str, stage: bool, monkeypatch) -> tuple:
    """Six steps of the built-in train task's StepLoop on a real 2-shard ASP job; `stage`
    stages the cpu model through separate buffers, as a cuda model is."""
    import functools

    import paramserver.training.train_task as train_task
    from ps_helpers import step_loop
    monkeypatch.setattr(train_task, "DeviceStaging",
                        functools.partial(DeviceStaging, stage=True) if stage else DeviceStaging)
    with step_loop(tmp_path, schedule=schedule) as (kv, loop):
        assert loop.staging.staged == stage
        kv.init(loop.staging.params_to_host())
        release, losses = kv.start(), []
        for _ in range(6):
            record, compute = loop.step(release, 0.0)
            losses.append(record["loss"])
            release = kv.clock(release.step, release.batch_size, compute, 0.0, 1.0, record,
                               while_waiting=loop.prepare_next)
        return losses, loop.keys.flatten_params(loop.model).clone()


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["off", "fifo"])
def test_the_train_task_staged_trains_bit_for_bit_like_the_plain_path(tmp_path, schedule,
                                                                      monkeypatch):
    plain = train_task_steps(tmp_path / "plain", schedule, False, monkeypatch)
    staged = train_task_steps(tmp_path / "staged", schedule, True, monkeypatch)
    assert plain[0] == staged[0] and torch.equal(plain[1], staged[1])
