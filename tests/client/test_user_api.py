"""The PyTorch-native API as a user script meets it: launched real jobs, real DataLoaders."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import paramserver
from paramserver.runlog.metrics import read_records

STRAGGLER_SCRIPT = """
import torch
from torch import nn
import paramserver

paramserver.init()
torch.manual_seed(0)
model = nn.Linear(8, 2)
data = torch.randn(4096, 8)
with paramserver.DistributedOptimizer(model.parameters()) as opt:
    assert paramserver.rank() == opt.rank and paramserver.size() == 3
    for idx in paramserver.BatchSampler(len(data), opt):
        opt.zero_grad()
        model(data[idx]).pow(2).mean().backward()
        opt.step()
"""

LOADER_SCRIPT = """
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import paramserver

out = sys.argv[1]
torch.manual_seed(0)
data = TensorDataset(torch.arange(50), torch.randn(50, 4))
torch.manual_seed(os.getpid())  # each rank its own initial weights: rank 0's must win
model = nn.Linear(4, 1)
seen = []
own = model.weight.detach().clone()
with paramserver.DistributedOptimizer(model) as opt:
    torch.save({"own": own, "joined": model.weight.detach().clone()},
               f"{out}/init-{opt.rank}.pt")
    sampler = paramserver.BatchSampler(len(data), opt, seed=3)
    for index, x in DataLoader(data, batch_sampler=sampler):
        seen.append(index.tolist())
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    torch.save(opt.state_dict(), f"{out}/model-{opt.rank}.pt")
    with open(f"{out}/seen-{opt.rank}.json", "w") as f:
        json.dump({"batches": seen, "size": opt.size}, f)
"""


def launch(tmp_path, script: str, *flags: str, timeout: float = 120) -> tuple:
    return launch_side_by_side({"run": (tmp_path, script, flags, timeout)})["run"]


def launch_side_by_side(runs: dict[str, tuple]) -> dict[str, tuple]:
    """`paramserver launch FLAGS -- python user.py FOLDER` for every NAME: (FOLDER, SCRIPT,
    FLAGS, TIMEOUT) at once (most of each job is process start-up, which overlaps);
    {name: (finished process, its run folder)}. Every launcher is reaped, killed if its wait
    ran out."""
    started = {}
    for name, (folder, script, flags, timeout) in runs.items():
        path = folder / "user.py"
        path.write_text(textwrap.dedent(script))
        started[name] = subprocess.Popen(
            [sys.executable, "-m", "paramserver", "launch", "--out", str(folder / "run"),
             *flags, "--timeout", str(timeout), "--", sys.executable, str(path), str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    try:
        for name, proc in started.items():
            out, err = proc.communicate(timeout=runs[name][3] + 60)
            done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          runs[name][0] / "run")
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return done


@pytest.fixture(scope="module")
def loader_and_crash(tmp_path_factory):
    """The DataLoader job and the job whose rank raises, side by side; {name: (finished
    launcher, run folder, the folder the script wrote to)}."""
    runs = {"loader": (LOADER_SCRIPT, ("--workers", "2", "--batch-size", "8", "--steps", "9"),
                       120),
            # BSP waits for every member: the failed rank must leave (not be timed out) for
            # rank 0 to go.
            "crash": (CRASH_SCRIPT, ("--workers", "2", "--steps", "10",
                                     "--heartbeat-timeout", "60"), 50)}
    folders = {name: tmp_path_factory.mktemp(name) for name in runs}
    done = launch_side_by_side({name: (folders[name], *run) for name, run in runs.items()})
    return {name: (*done[name], folders[name]) for name in runs}


@pytest.mark.slow  # 25 steps of 3 launched ranks, ~11 s; fast twins: LB-BSP's split in
# tests/policies, and a launched script following the policy's batch sizes in
# tests/optim/test_optimizer_state.py::test_a_script_that_ignores_the_policys_batches_is_told_...
def test_lbbsp_shrinks_a_user_scripts_straggler_batch(tmp_path):
    proc, out = launch(tmp_path, STRAGGLER_SCRIPT, "--workers", "3", "--sync", "lbbsp",
                       "--straggler", "0:3", "--device-time", "1ms", "--steps", "25")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    assert steps and all(r["compute_s"] > 0 for r in steps)
    # The emulated device time is what the policy hears: batch * 1 ms * factor.
    slow = {r["step"]: r for r in steps if r["worker"] == 0}
    assert all(r["factor"] == 3.0 for r in slow.values())
    assert slow[0]["compute_s"] == pytest.approx(slow[0]["batch"] * 0.003, rel=0.05)
    fast = {r["step"]: r["batch"] for r in steps if r["worker"] == 1}
    # Within 20 steps the 3x straggler gets about a third of a fast worker's batch, and keeps it.
    late = [s for s in slow if 20 <= s < 25]
    assert late and all(0.25 <= slow[s]["batch"] / fast[s] <= 0.45 for s in late)
    assert slow[0]["batch"] == fast[0] == 32


def test_batch_sampler_over_a_dataloader_in_a_launched_job(loader_and_crash):
    proc, _, tmp_path = loader_and_crash["loader"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"seen-{r}.json").read_text()) for r in (0, 1)]
    assert all(s["size"] == 2 for s in seen)
    streams = [[i for b in s["batches"] for i in b] for s in seen]
    assert all(len(b) == 8 for s in seen for b in s["batches"])  # the released size, always
    # 9 steps of 8 = 72 indices a rank, 25 an epoch: in each full epoch the two ranks' shards
    # are disjoint and cover the dataset, so every sample is seen exactly once.
    for lo in (0, 25):
        epoch = [stream[lo:lo + 25] for stream in streams]
        assert sorted(epoch[0] + epoch[1]) == list(range(50))
    # state_dict(): the trained weights under the model's names, loadable into a fresh model;
    # BSP keeps the replicas equal.
    init = [torch.load(tmp_path / f"init-{r}.pt") for r in (0, 1)]
    assert not torch.equal(init[0]["own"], init[1]["own"])
    assert torch.equal(init[1]["joined"], init[0]["own"])  # first pull: rank 0's weights
    assert torch.equal(init[0]["joined"], init[0]["own"])
    states = [torch.load(tmp_path / f"model-{r}.pt") for r in (0, 1)]
    fresh = nn.Linear(4, 1)
    fresh.load_state_dict(states[0])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not torch.equal(init[0]["own"], fresh.weight)  # it trained


LATE_LOAD_SCRIPT = """
import torch
import paramserver

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
snapshot = {k: torch.full_like(v, 7.0) for k, v in model.state_dict().items()}
model.load_state_dict(snapshot)  # loaded before joining: rank 0's weights start the job
opt = paramserver.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
opt.zero_grad()
opt.step()  # a zero gradient: the weights stay the snapshot's
assert model.weight.eq(7.0).all(), model.weight
print("loaded before joining: kept", flush=True)
model.load_state_dict({k: v - 1.0 for k, v in snapshot.items()})  # as Trainer._load_snapshot
opt.zero_grad()
opt.step()
"""


def test_weights_loaded_after_joining_are_refused_at_the_step_not_lost(tmp_path):
    """A snapshot loaded into the model after DistributedOptimizer joined (multigpu_torchrun's
    Trainer loads it after the optimizer is built) was overwritten by the first step's pull
    without a word; the step now refuses it, naming where to load weights instead."""
    proc, _ = launch(tmp_path, LATE_LOAD_SCRIPT, "--workers", "1", timeout=60)
    assert "loaded before joining: kept" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode != 0
    assert ("the model's parameters were written after DistributedOptimizer joined the job"
            in proc.stdout + proc.stderr)
    assert "before creating the DistributedOptimizer" in proc.stdout + proc.stderr


SCHEDULED_SCRIPT = """
import warnings
import torch
import paramserver

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
optimizer = paramserver.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
lrs = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
print("lrs", lrs, flush=True)
for w in caught:
    print("warned:", w.message, flush=True)
"""


def test_a_schedule_built_on_the_wrapped_optimizer_steps_without_torchs_order_warning(tmp_path):
    """A scheduler built on the script's optimizer before wrapping it (optimizer.step(), then
    scheduler.step(), as torch asks) follows torch's lr sequence, and torch does not warn
    that the scheduler was stepped before the optimizer (which told a correct script to
    reorder its loop, so as to skip the schedule's first value)."""
    proc, _ = launch(tmp_path, SCHEDULED_SCRIPT, "--workers", "1", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(reference, step_size=2, gamma=0.5)
    expected = []
    for _ in range(4):
        reference.step()
        scheduler.step()
        expected.append(scheduler.get_last_lr()[0])
    assert f"lrs {expected}" in proc.stdout, proc.stdout
    assert "before `optimizer.step()`" not in proc.stdout + proc.stderr


ACCUMULATING = """
import contextlib, sys
import torch

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def train(ddp_model, optimizer, accumulate=3):
    # DDP's gradient accumulation: no_sync() on all but every third backward
    for i in range(9):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        last = (i + 1) % accumulate == 0
        with contextlib.nullcontext() if last else ddp_model.no_sync():
            (torch.nn.functional.mse_loss(ddp_model(x), y) / accumulate).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()

if __name__ == "__main__":
    import paramserver
    model, optimizer = build()
    ddp_model = paramserver.DistributedDataParallel(model)  # DDP(model, device_ids=[rank])
    optimizer = paramserver.DistributedOptimizer(optimizer,
                                                 named_parameters=model.named_parameters())
    train(ddp_model, optimizer)
    torch.save({"module": ddp_model.module.state_dict(), "names": list(ddp_model.state_dict())},
               sys.argv[1] + "/trained.pt")
"""


def test_ddps_wrapper_accumulates_under_no_sync_and_saves_its_module_as_torch_does(tmp_path):
    """A DDP script keeps its DDP(model) line (paramserver's): model.no_sync() gradient
    accumulation steps as torch's SGD does with one worker, model.module.state_dict() is the
    model's, and the wrapper's state_dict has DDP's `module.` names."""
    proc, _ = launch(tmp_path, ACCUMULATING, "--workers", "1", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scope: dict = {}
    exec(compile(ACCUMULATING, "accumulating", "exec"), scope)
    model, optimizer = scope["build"]()

    class Local(nn.Module):  # what torch's DDP is with one process: no_sync() holds nothing
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)

        def no_sync(self):
            import contextlib
            return contextlib.nullcontext()

    scope["train"](Local(model), optimizer)
    saved = torch.load(tmp_path / "trained.pt")
    assert saved["names"] == [f"module.{n}" for n in model.state_dict()]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(saved["module"][name], value, rtol=1e-5, atol=1e-6)


GRADS_SET_TO_NONE = """
import sys
import torch

def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def train(model, optimizer):
    model.zero_grad()  # once before the loop: torch sets the grads to None
    for k in range(5):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

if __name__ == "__main__":
    import paramserver
    model, optimizer = build()
    optimizer = paramserver.DistributedOptimizer(optimizer,
                                                 named_parameters=model.named_parameters())
    train(model, optimizer)
    torch.save(model.state_dict(), sys.argv[1] + "/trained.pt")
"""


def test_grads_a_script_set_to_none_are_zeroed_by_the_next_zero_grad(tmp_path):
    """model.zero_grad() (set_to_none) before the loop left backward's own grads outside
    the buffer, which opt.zero_grad() then never zeroed: every push carried the sum of all
    the gradients so far. With one worker the steps are now torch's."""
    proc, _ = launch(tmp_path, GRADS_SET_TO_NONE, "--workers", "1", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scope: dict = {}
    exec(compile(GRADS_SET_TO_NONE, "set_to_none", "exec"), scope)
    model, optimizer = scope["build"]()
    scope["train"](model, optimizer)
    trained = torch.load(tmp_path / "trained.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)


def test_a_torch_optimizer_the_servers_cannot_run_is_refused_before_joining(monkeypatch):
    monkeypatch.delenv("PARAMSERVER_JOIN", raising=False)
    # (no job of its own for a script run with plain python: that is the refusal below)
    monkeypatch.setattr(paramserver.user_api(), "own_job", None)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="do not run .*LBFGS.*--optimizer"):
        paramserver.DistributedOptimizer(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(ValueError, match="lr must be a number > 0"):
        paramserver.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.0))
    with pytest.raises(TypeError, match="parameter groups go in a torch optimizer"):
        paramserver.DistributedOptimizer([{"params": model.parameters()}])
    with pytest.raises(TypeError, match="named_parameters= goes with a torch optimizer"):
        paramserver.DistributedOptimizer(model, named_parameters=model.named_parameters())
    # a supported one passes the checks and only then needs a job
    with pytest.raises(RuntimeError, match="no job to join"):
        paramserver.DistributedOptimizer(torch.optim.AdamW(model.parameters()),
                                         named_parameters=model.named_parameters())


def test_rank_and_size_before_joining(monkeypatch):
    for name in ("PARAMSERVER_JOIN", "RANK", "WORLD_SIZE", "PARAMSERVER_RANK",
                 "PARAMSERVER_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(paramserver.user_api(), "own_job", None)
    with pytest.raises(RuntimeError, match="paramserver launch"):
        paramserver.init()
    with pytest.raises(RuntimeError, match="joined"):
        paramserver.rank()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert (paramserver.rank(), paramserver.size()) == (2, 3)


class Releases:
    """The two things BatchSampler reads of an optimizer: the released size and the stop."""

    def __init__(self, sizes):
        self.sizes, self.rank, self.size = list(sizes), 1, 3

    @property
    def batch_size(self):
        return self.sizes[0]

    @property
    def should_stop(self):
        return not self.sizes


def test_batch_sampler_follows_the_size_and_deals_each_epoch_once():
    releases = Releases([5, 7, 2, 9, 4])
    sampler = paramserver.BatchSampler(30, releases, seed=1)
    data = TensorDataset(torch.arange(30))
    got = []
    for (batch,) in DataLoader(data, batch_sampler=sampler):
        got.append(batch.tolist())
        releases.sizes.pop(0)  # the next step's size, as step() would change it
    assert [len(b) for b in got] == [5, 7, 2, 9, 4]
    stream = [i for b in got for i in b]
    assert sampler.epoch == 2 and sampler.epochs_done == pytest.approx(2.7)
    # The three ranks' shards of each epoch partition the dataset; epochs reshuffle.
    others = [paramserver.BatchSampler(30, Releases([1]), seed=1, rank=r) for r in (0, 2)]
    for lo in (0, 10):
        epoch = stream[lo:lo + 10] + [i for o in others for i in o.take(10)]
        assert sorted(epoch) == list(range(30))
    assert stream[:10] != stream[10:20]
    with pytest.raises(ValueError, match="rank 3"):
        paramserver.BatchSampler(30, releases, rank=3)


def test_a_loader_over_the_batch_sampler_has_a_length_of_one_epochs_batches():
    """`len(train_loader)`, as PyTorch's DDP tutorial prints it: this rank's share of one
    epoch in batches of the size in force (torch's DistributedSampler gives the same)."""
    from torch.utils.data import BatchSampler as TorchBatchSampler
    from torch.utils.data.distributed import DistributedSampler
    data = TensorDataset(torch.arange(31))
    for rank in range(3):
        for size in (4, 5, 40):
            ours = DataLoader(data, batch_sampler=paramserver.BatchSampler(
                31, Releases([size]), rank=rank))
            torch_side = TorchBatchSampler(DistributedSampler(
                data, num_replicas=3, rank=rank, shuffle=False), size, drop_last=False)
            assert len(ours) == len(torch_side) == -(-11 // size)  # 31 over 3: 11 each


CRASH_SCRIPT = """
import torch
from torch import nn
import paramserver

model = nn.Linear(4, 1)
with paramserver.DistributedOptimizer(model) as opt:
    while not opt.should_stop:
        if opt.rank == 1 and opt.release.step == 3:
            raise RuntimeError("bad batch on purpose")
        opt.zero_grad()
        model(torch.ones(opt.batch_size, 4)).sum().backward()
        opt.step()
print(f"rank {opt.rank} finished")
"""


def test_a_rank_that_raises_leaves_at_once_and_the_others_finish(loader_and_crash):
    proc, out, _ = loader_and_crash["crash"]
    assert proc.returncode == 1 and "bad batch on purpose" in proc.stderr
    left = {r["worker"]: r["reason"] for r in read_records(out / "metrics.jsonl")
            if r["kind"] == "left"}
    assert left == {0: "done", 1: "rank 1 failed: RuntimeError: bad batch on purpose"}


class ElasticReleases:
    """An elastic optimizer as BatchSampler reads it: each release names its samples."""

    elastic, data_len, rank, size, should_stop = True, 30, 0, 2, False

    def __init__(self):
        self.kv = type("KV", (), {"drawn": [[0, 0, 4]]})()

    def step(self):  # the next release: a new list of samples
        lo = self.kv.drawn[-1][2]
        self.kv.drawn = [[0, lo, lo + 4]]


def test_an_elastic_batch_sampler_refuses_to_be_read_ahead_of_its_release():
    opt = ElasticReleases()
    sampler = paramserver.BatchSampler(30, opt, shuffle=False)
    it = iter(sampler)
    assert next(it) == [0, 1, 2, 3]
    opt.step()
    assert next(it) == [4, 5, 6, 7]  # one batch per release: as num_workers=0 reads it
    with pytest.raises(RuntimeError, match="num_workers"):
        next(it)  # a look ahead, before step(): what a prefetching DataLoader does
