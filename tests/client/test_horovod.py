"""Horovod's API on the parameter server: a Horovod script changed only in its import line,
the collectives it still needs (allreduce of metrics) driven through the coordinator's part
with events alone, and what has no meaning here refused with the reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import paramserver.horovod as hvd
from paramserver.coordinator.events import CollectiveAsked, Reply, TimePassed
from paramserver.coordinator.state import CoordinatorState
from ps_helpers import job_of, match, start_round

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "horovod_digits.py"


def test_a_horovod_script_runs_its_epochs_and_averages_its_metrics(tmp_path):
    """examples/horovod_digits.py is written as Horovod's pytorch_mnist.py (DistributedSampler
    with hvd.size()/hvd.rank(), its own epoch loop, broadcast_parameters before wrapping the
    optimizer, metric_average through hvd.allreduce): launched without --steps, the job ends
    when the scripts do, and both ranks print the same averaged test metrics each epoch."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--quiet",
         "--out", str(out), "--", sys.executable, str(EXAMPLE), "--epochs", "2"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    lines = re.findall(r"\[rank (\d)\] rank \d: Test set: Average loss: ([\d.]+), "
                       r"Accuracy: ([\d.]+)%", proc.stdout)
    by_rank = {r: [(float(loss), float(acc)) for rr, loss, acc in lines if rr == r]
               for r in "01"}
    assert len(by_rank["0"]) == len(by_rank["1"]) == 2  # one test() per epoch, each rank
    assert by_rank["0"] == by_rank["1"]  # the allreduced averages agree
    assert by_rank["0"][-1][1] > 75.0
    # 1500 training digits, 2 ranks of 750 each, batches of 32: 24 steps an epoch a rank
    assert "96 steps" in proc.stdout


def test_a_horovod_script_run_with_plain_python_is_a_job_of_one_worker_that_ends_with_it(
        tmp_path):
    """As hvd.init() without horovodrun: the example run as `python script.py` trains as a
    job of one worker on this host (its run folder in the working directory, said in one
    line), the job ends when the script does, and no process of it outlives the script."""
    import psutil
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARAMSERVER_JOIN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "Traceback" not in proc.stderr
    assert "this script runs as a job of one worker on this host" in proc.stderr
    acc = re.findall(r"rank 0: Test set: Average loss: [\d.]+, Accuracy: ([\d.]+)%", proc.stdout)
    assert len(acc) == 1 and float(acc[0]) > 60.0, proc.stdout[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    # 1500 training digits, one rank, batches of 32: 47 steps, then the worker leaves
    assert sum(e["event"] == "apply_round" for e in events) == 47
    assert {"event": "worker_left", "worker": 0, "reason": "done"}.items() <= events[-1].items()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if run.name in " ".join(p.info["cmdline"] or [])]  # (roles name it relatively)
    assert not left, f"processes of the script's job outlived it: {left}"


def test_a_plain_python_script_that_ends_before_joining_takes_its_job_down_at_once(tmp_path):
    """hvd.init() started the script's own job; the script ends before any optimizer joined:
    nothing waits at the start barrier, the roles are stopped at its exit, none outlives it."""
    import psutil
    script = tmp_path / "gives_up.py"
    script.write_text("import paramserver.horovod as hvd\nhvd.init()\n"
                      "raise SystemExit('no data here')\n")
    env = {k: v for k, v in os.environ.items() if k != "PARAMSERVER_JOIN"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no data here" in proc.stderr, proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if run.name in " ".join(p.info["cmdline"] or [])]  # (roles name it relatively)
    assert not left, f"processes of the script's job outlived it: {left}"


def _alone(tmp_path, script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`script` run with plain python, a job of one worker of its own (as hvd.init() without
    horovodrun), in `tmp_path`; its run is bounded and reaped by subprocess.run."""
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARAMSERVER_JOIN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, str(path), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


AMP_LOOP = """
import sys
import torch
import paramserver.horovod as hvd

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def batch(k):
    g = torch.Generator().manual_seed(k)
    return torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)

def train(model, optimizer, horovod):
    # Horovod's pytorch_mnist.py train_mixed_precision, step by step
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for k in range(6):
        x, y = batch(k)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if horovod:
            optimizer.synchronize()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if horovod:
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()

if __name__ == "__main__":
    hvd.init()
    model, optimizer = build()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    train(model, optimizer, horovod=True)
    torch.save(model.state_dict(), sys.argv[1] + "/trained.pt")
"""


def test_horovods_mixed_precision_loop_synchronizes_and_steps_as_torch_does(tmp_path):
    """Horovod's own example's mixed-precision loop calls optimizer.synchronize() before
    unscaling and steps inside optimizer.skip_synchronize(): with one worker under BSP the
    trained weights are those torch's SGD computes with the same GradScaler loop."""
    proc = _alone(tmp_path, AMP_LOOP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scope: dict = {}
    exec(compile(AMP_LOOP, "amp_loop", "exec"), scope)  # build(), train(): the local twin
    model, optimizer = scope["build"]()
    scope["train"](model, optimizer, horovod=False)
    trained = torch.load(tmp_path / "trained.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)


PREDIVIDED = """
import sys
import torch
import paramserver.horovod as hvd

def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

def train(model, optimizer):
    for k in range(4):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

if __name__ == "__main__":
    hvd.init()
    model, optimizer = build()
    # pytorch_mnist.py's --gradient-predivide-factor
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Average, gradient_predivide_factor=4.0)
    train(model, optimizer)
    torch.save(model.state_dict(), sys.argv[1] + "/trained.pt")
"""


def test_a_gradient_predivide_factor_averages_as_horovods_does(tmp_path):
    """Horovod divides by the factor before the sum and multiplies by factor/size after it,
    so the update is Average's: with one worker, torch's own SGD steps."""
    proc = _alone(tmp_path, PREDIVIDED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scope: dict = {}
    exec(compile(PREDIVIDED, "predivided", "exec"), scope)
    model, optimizer = scope["build"]()
    scope["train"](model, optimizer)
    trained = torch.load(tmp_path / "trained.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)


RESUMED = """
import os, sys
import torch
import paramserver.horovod as hvd

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def batch(k):  # the global batch: rank r of W trains on rows r::W
    g = torch.Generator().manual_seed(k)
    return torch.randn(16, 5, generator=g), torch.randn(16, 2, generator=g)

def epoch_of(model, optimizer, epoch, rank=0, workers=1):
    for k in range(3 * epoch, 3 * epoch + 3):
        x, y = batch(k)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank::workers]), y[rank::workers]).backward()
        optimizer.step()

if __name__ == "__main__":  # as Horovod's pytorch_imagenet_resnet50.py resumes
    hvd.init()
    ckpt = os.path.join(sys.argv[1], "checkpoint.pt")
    resume_from_epoch = 1 if os.path.exists(ckpt) else 0
    model, optimizer = build()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # Horovod: restore on the first worker which will broadcast weights to other workers.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(ckpt)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for epoch in range(resume_from_epoch, int(sys.argv[2])):
        epoch_of(model, optimizer, epoch, hvd.rank(), hvd.size())
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, ckpt)
"""


@pytest.mark.slow  # two launches, ~17 s; the fast twin: the store's load of "values"
# (tests/server/test_shard_store.py::test_load_state_writes_the_values_themselves_...)
def test_horovods_resume_restores_on_rank_0_and_broadcasts_the_parameters(tmp_path):
    """Horovod's ImageNet example restores its checkpoint on rank 0 after wrapping the
    optimizer and then calls broadcast_parameters: rank 0's restored weights become the job's
    (every rank's), the momentum goes on from optimizer.load_state_dict, so one epoch, then a
    resumed second, ends where torch's two epochs on the global batch do (before, rank 0's
    first step refused the weights written after joining)."""
    path = tmp_path / "resnet_resume.py"
    path.write_text(RESUMED)
    for epochs in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--quiet",
             "--out", str(tmp_path / f"run{epochs}"), "--", sys.executable, str(path),
             str(tmp_path), epochs], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    scope: dict = {}
    exec(compile(RESUMED, "resumed", "exec"), scope)
    model, optimizer = scope["build"]()
    for epoch in range(2):
        scope["epoch_of"](model, optimizer, epoch, 0, 1)
    trained = torch.load(tmp_path / "checkpoint.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained["model"][name], value, rtol=1e-5, atol=1e-6)


BARRIER = """
import os, sys, time
import torch
import paramserver.horovod as hvd

hvd.init()
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
if hvd.rank() == 1:  # e.g. rank 1 still writing what rank 0 reads after the barrier
    time.sleep(1.0)
    open(os.path.join(sys.argv[1], "written"), "w").close()
hvd.barrier()
print(f"rank {hvd.rank()} past the barrier; written:",
      os.path.exists(os.path.join(sys.argv[1], "written")), flush=True)
opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
"""


def test_a_barrier_returns_once_every_rank_has_reached_it(tmp_path):
    """hvd.barrier() (DDP's dist.barrier()): rank 0 goes on only once the slower rank 1 is
    there too."""
    (tmp_path / "script.py").write_text(BARRIER)
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--quiet",
         "--out", str(tmp_path / "run"), "--timeout", "60", "--", sys.executable,
         str(tmp_path / "script.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "[rank 0] rank 0 past the barrier; written: True" in proc.stdout, proc.stdout
    assert "[rank 1] rank 1 past the barrier; written: True" in proc.stdout


# ---- the coordinator's collectives part ---------------------------------------------------------

def _ask(state, src, kind, name, values, t, root=0):
    return state.handle(CollectiveAsked(src, kind, name, values, t, to=f"c-{src}", root=root))


def test_an_allreduce_answers_every_rank_once_all_training_ranks_sent_theirs():
    state = CoordinatorState(job_of())
    start_round(state)
    assert not [i for i in _ask(state, "w0", "allreduce", "acc", [1.0, 2.0], 1.0)
                if isinstance(i, Reply)]
    out = _ask(state, "w1", "allreduce", "acc", [3.0, 5.0], 1.1)
    answers = {i.to: i.fields for i in out if match(i, Reply, op="collected")}
    assert answers == {"c-w0": {"values": [4.0, 7.0], "count": 2},
                       "c-w1": {"values": [4.0, 7.0], "count": 2}}
    _ask(state, "w1", "allgather", "n", [7.0], 1.2)
    out = _ask(state, "w0", "allgather", "n", [1.0, 2.0], 1.3)
    assert match(out[0], Reply, op="collected", values=[[0, [1.0, 2.0]], [1, [7.0]]])
    _ask(state, "w0", "broadcast", "b", [9.0], 1.4, root=1)
    out = _ask(state, "w1", "broadcast", "b", [6.0], 1.5, root=1)
    assert all(match(i, Reply, op="collected", values=[6.0]) for i in out)
    state.check_invariants()


def test_a_collective_a_rank_never_joins_is_refused_in_time_naming_it():
    state = CoordinatorState(job_of())
    start_round(state)
    _ask(state, "w0", "allreduce", "loss", [1.0], 1.0)
    deadline = state.next_wakeup()
    assert deadline is not None and deadline <= 1.0 + state.collectives.timeout
    out = state.handle(TimePassed(1.0 + state.collectives.timeout))
    (err,) = [i for i in out if isinstance(i, Reply) and i.to == "c-w0"]
    assert match(err, Reply, op="error", code="failed")
    assert "ranks [1] did not call it" in err.fields["msg"]


def test_mismatched_parts_are_refused():
    state = CoordinatorState(job_of())
    start_round(state)
    _ask(state, "w0", "allreduce", "x", [1.0, 2.0], 1.0)
    out = _ask(state, "w1", "allgather", "x", [1.0], 1.1)
    assert match(out[-1], Reply, op="error", code="refused")
    out = _ask(state, "w1", "allreduce", "x", [1.0], 1.2)  # another size
    assert all(match(i, Reply, op="error") for i in out if isinstance(i, Reply))
    out = _ask(state, "w0", "allreduce", "y", [float(i) for i in range(70000)], 1.3)
    assert match(out[-1], Reply, op="error", code="refused")


# ---- what Horovod has and this does not ---------------------------------------------------------

def test_what_has_no_meaning_here_is_refused_or_answered_as_not_built(monkeypatch):
    monkeypatch.delenv("PARAMSERVER_JOIN", raising=False)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Adasum has no counterpart"):
        hvd.DistributedOptimizer(opt, op=hvd.Adasum)
    with pytest.raises(ValueError, match="gradient_predivide_factor must be a number > 0"):
        hvd.DistributedOptimizer(opt, gradient_predivide_factor=0.0)
    with pytest.raises(ValueError, match="compression must be"):
        hvd.DistributedOptimizer(opt, compression="zstd")
    with pytest.raises(TypeError, match="pickle"):
        hvd.broadcast_object({"a": 1})
    with pytest.raises(RuntimeError, match="call it after hvd.DistributedOptimizer"):
        hvd.allreduce(torch.tensor(1.0))
    assert not hvd.mpi_built() and not hvd.gloo_enabled() and hvd.nccl_built() == 0
    monkeypatch.setattr(hvd.api, "own_job", None)  # no job of its own: refused, naming launch
    with pytest.raises(RuntimeError, match="paramserver launch"):
        hvd.init()
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert hvd.local_rank() == 3 and hvd.cross_size() == 1


def test_a_collective_before_the_optimizer_joined_says_which_and_where_to_move_it():
    """Horovod's ImageNet example broadcasts resume_from_epoch right after hvd.init(): here a
    collective needs the joined optimizer, so the error names the call and the fix."""
    from paramserver.client import api
    assert not api._joined
    with pytest.raises(RuntimeError, match=r"hvd\.broadcast\(\) before hvd\.Distributed"
                                           r"Optimizer.*call it after"):
        hvd.broadcast(torch.tensor(0), root_rank=0, name="resume_from_epoch")
    with pytest.raises(RuntimeError, match=r"hvd\.barrier\(\) before"):
        hvd.barrier()
    with pytest.raises(RuntimeError, match=r"hvd\.allreduce\(\) before"):
        hvd.allreduce(torch.tensor(1.0))


def test_horovod_elastic_is_refused_naming_what_to_use_instead():
    """Horovod's elastic examples (`@hvd.elastic.run`, `hvd.elastic.TorchState`) failed with
    a bare "no attribute 'elastic'"; the error names the feature and paramserver's way."""
    with pytest.raises(AttributeError, match=r"hvd\.elastic \(Horovod Elastic.*--workers "
                                             r"MIN:MAX"):
        hvd.elastic.TorchState
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hvd.nope
