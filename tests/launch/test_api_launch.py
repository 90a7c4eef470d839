"""A user's own script through `paramserver launch` and DistributedOptimizer, as the README shows."""

import os
import subprocess
import sys
from pathlib import Path

from paramserver.runlog.metrics import read_records

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_my_model.py"


def test_readme_example_trains_through_launch(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--steps", "120",
         "--out", str(out), "--", sys.executable, str(EXAMPLE)],
        capture_output=True, text=True, timeout=300,
        # A key name left in the shell names no key of the job's fresh folder: not passed on.
        env=dict(os.environ, PARAMSERVER_KEY_NAME="worker-hostB"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = " ".join(p.read_text() for p in (out / "logs").glob("worker-*.log"))
    accuracies = [float(line.rsplit(" ", 1)[1]) for line in logs.splitlines()
                  if "training accuracy" in line]
    assert len(accuracies) == 2 and min(accuracies) > 0.8
    # BSP keeps the replicas identical: both workers end on the same parameters.
    assert accuracies[0] == accuracies[1]
    steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    assert len(steps) == 240 and all("loss" in r for r in steps)
    # The example's two layers, float32, dense both ways: the report's bytes per step.
    assert {(r["push_bytes"], r["pull_bytes"]) for r in steps} == {(9610 * 4, 9610 * 4)}


def test_launch_without_a_command_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "launch", "--out",
                           str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "after --" in proc.stderr


def test_optimizer_outside_a_job_says_how_to_join(monkeypatch):
    import pytest
    import torch
    from paramserver import DistributedOptimizer
    monkeypatch.delenv("PARAMSERVER_JOIN", raising=False)
    with pytest.raises(RuntimeError, match="paramserver launch"):
        DistributedOptimizer(torch.nn.Linear(2, 2))


def test_a_rank_that_dies_before_the_job_starts_ends_the_launch_naming_it(tmp_path):
    """Rank 1 crashes before joining: without this the start barrier waited for it until
    launch's --timeout and then said only that the job did not finish."""
    import time
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, sys, torch, paramserver\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit('rank 1: cannot build the model (on purpose)')\n"
        "opt = paramserver.DistributedOptimizer(torch.nn.Linear(4, 2))\n"
        "while not opt.should_stop:\n"
        "    opt.zero_grad(); opt.step()\n"
        "opt.close()\n")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--steps", "5",
         "--timeout", "240", "--quiet", "--out", str(tmp_path / "run"), "--", sys.executable,
         str(script)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert "worker 1 died" in proc.stderr and "before the job started" in proc.stderr, proc.stderr
    assert "cannot build the model (on purpose)" in proc.stderr
    assert took < 120, f"the launch waited {took:.0f} s for a worker that had died"


DDP_STYLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_style.py"


def test_the_ddp_tutorial_script_runs_its_own_epochs_under_launch(tmp_path):
    """examples/ddp_style.py is PyTorch's multigpu_torchrun.py with its process-group and DDP
    lines changed: its Trainer's epoch loop, len(train_data), set_epoch and the script's own
    SGD run as written; without --steps the job ends when the scripts do."""
    import re
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--quiet",
         "--out", str(out), "--", sys.executable, str(DDP_STYLE), "3", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    # 1,797 digits over 2 ranks (DistributedSampler pads to 899 each): 29 batches of 32
    epochs = re.findall(r"\[RANK(\d)\] Epoch (\d) \| Batchsize: 32 \| Steps: 29", proc.stdout)
    assert sorted(epochs) == [(r, e) for r in "01" for e in "012"]
    accuracy = re.findall(r"\[RANK(\d)\] training accuracy ([\d.]+)", proc.stdout)
    assert len(accuracy) == 2 and accuracy[0][1] == accuracy[1][1]  # BSP: one model
    assert float(accuracy[0][1]) > 0.85
    assert (tmp_path / "snapshot.pt").exists()


def test_a_budget_ends_the_ddp_scripts_epochs_without_an_exception_in_its_code(tmp_path):
    """launch --steps 20 under a script with its own epoch loop: the sampler's epochs end with
    the job, steps after the stop do nothing, the script ends normally and saves its model."""
    import re
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "2", "--steps", "20",
         "--quiet", "--out", str(tmp_path / "run"), "--", sys.executable, str(DDP_STYLE),
         "3", "1"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "40 steps" in proc.stdout  # 20 a rank, then the budget
    assert len(re.findall(r"training accuracy", proc.stdout)) == 2
    assert "step() does nothing from here" in proc.stdout


def test_paramservers_distributed_sampler_is_torchs_with_the_jobs_rank_and_size(monkeypatch):
    import torch
    from torch.utils.data.distributed import DistributedSampler as Torch

    from paramserver import DistributedSampler
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    data = list(range(31))
    ours = DistributedSampler(data, seed=4)
    theirs = Torch(data, num_replicas=3, rank=1, seed=4)
    for epoch in (0, 1):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs) and len(ours) == len(theirs) == 11
    assert isinstance(ours, torch.utils.data.Sampler)
