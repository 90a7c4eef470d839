"""A user's own script through `paramserver launch` and DistributedOptimizer, as the README shows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.runlog.metrics import read_records
from ps_helpers import side_by_side

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_my_model.py"
DDP_STYLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_style.py"
CRASH = """\
import os, sys, torch, paramserver
if os.environ['RANK'] == '1':
    sys.exit('rank 1: cannot build the model (on purpose)')
opt = paramserver.DistributedOptimizer(torch.nn.Linear(4, 2))
while not opt.should_stop:
    opt.zero_grad(); opt.step()
opt.close()
"""


def _launch(root: Path, name: str, flags: list[str], script: list[str], **kwargs):
    return ([sys.executable, "-m", "paramserver", "launch", *flags, "--out",
             str(root / name / "run"), "--", sys.executable, *script],
            {"cwd": root / name, **kwargs})


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The README's example and PyTorch's DDP tutorial script cut by a budget, launched side
    by side; {name: (finished launch, its folder)}. (The tutorial script run to its end and
    the rank that dies before joining are slow: each test launches its own.)"""
    root = tmp_path_factory.mktemp("launched")
    for name in ("readme", "ddp_budget"):
        (root / name).mkdir()
    done = side_by_side({
        # A key name left in the shell names no key of the job's fresh folder: not passed on.
        "readme": _launch(root, "readme", ["--workers", "2", "--steps", "120"], [str(EXAMPLE)],
                          env=dict(os.environ, PARAMSERVER_KEY_NAME="worker-hostB")),
        "ddp_budget": _launch(root, "ddp_budget", ["--workers", "2", "--steps", "20", "--quiet"],
                              [str(DDP_STYLE), "3", "1"]),
    }, timeout=300)
    return {name: (proc, root / name) for name, proc in done.items()}


def test_readme_example_trains_through_launch(launched):
    proc, folder = launched["readme"]
    out = folder / "run"
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
    # Its folder is a run folder as train's (advise --profile and report read these).
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["workers"], summary["dataset"]) == (
        240, 2, "the script's own")
    config = json.loads((out / "config.json").read_text())
    assert config["command"][-1] == str(EXAMPLE) and config["config"]["steps"] == 120


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


@pytest.mark.slow  # a launch of its own, ~10 s; fast twins: a rank refused as it joins ends
# the launch naming it, with its own error, within 60 s (tests/launch/test_launch_bad_input.py::
# test_a_rank_whose_model_differs_...), and the launcher's decision on a worker's exit there
def test_a_rank_that_dies_before_the_job_starts_ends_the_launch_naming_it(tmp_path):
    """Rank 1 crashes before joining: without this the start barrier waited for it until
    launch's --timeout (240 s) and then said only that the job did not finish."""
    import time
    (tmp_path / "crash").mkdir()
    (tmp_path / "crash" / "crash.py").write_text(CRASH)
    t0 = time.monotonic()
    proc = side_by_side({"crash": _launch(
        tmp_path, "crash", ["--workers", "2", "--steps", "5", "--timeout", "240", "--quiet"],
        [str(tmp_path / "crash" / "crash.py")])}, timeout=300)["crash"]
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert "worker 1 died" in proc.stderr and "before the job started" in proc.stderr, proc.stderr
    assert "cannot build the model (on purpose)" in proc.stderr
    assert took < 120, f"the launch waited {took:.0f} s for a worker that had died"


def test_a_job_the_coordinator_fails_is_said_with_its_reason_not_as_a_death(tmp_path):
    """An elastic launch whose script gives no data_len: the coordinator refuses every rank's
    start and fails the job. The launch said "coordinator died with exit code 203 (lost a
    peer it needs)" and suggested --restart-coordinator; it says the coordinator's reason, and
    the refusal is in the output it quotes: a rank's, whose start was refused."""
    (tmp_path / "elastic").mkdir()
    script = tmp_path / "elastic" / "no_len.py"
    script.write_text(CRASH.replace("if os.environ['RANK'] == '1':\n    sys.exit('rank 1: "
                                    "cannot build the model (on purpose)')\n", ""))
    proc = side_by_side({"elastic": _launch(
        tmp_path, "elastic", ["--workers", "2:3", "--steps", "5", "--quiet"], [str(script)])},
        timeout=300)["elastic"]
    assert proc.returncode != 0
    err = proc.stderr
    assert "the job failed: every worker left the job and none finished it" in err, err
    assert "worker 0's last output" in err and "data_len=len(dataset)" in err, err
    assert "--restart-coordinator" not in err and "died with" not in err, err


@pytest.mark.slow  # 174 steps of a launch of its own; fast twins: the same script under launch
# cut by a budget (below), and a job that ends when its scripts do (the Horovod example's,
# tests/client/test_horovod.py::test_a_horovod_script_runs_its_epochs_and_averages_its_metrics)
def test_the_ddp_tutorial_script_runs_its_own_epochs_under_launch(tmp_path):
    """examples/ddp_style.py is PyTorch's multigpu_torchrun.py with its process-group and DDP
    lines changed: its Trainer's epoch loop, len(train_data), set_epoch and the script's own
    SGD run as written; without --steps the job ends when the scripts do."""
    import re
    (tmp_path / "ddp").mkdir()
    proc = side_by_side({"ddp": _launch(tmp_path, "ddp", ["--workers", "2", "--quiet"],
                                        [str(DDP_STYLE), "3", "1"])}, timeout=300)["ddp"]
    folder = tmp_path / "ddp"
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    # 1,797 digits over 2 ranks (DistributedSampler pads to 899 each): 29 batches of 32
    epochs = re.findall(r"\[RANK(\d)\] Epoch (\d) \| Batchsize: 32 \| Steps: 29", proc.stdout)
    assert sorted(epochs) == [(r, e) for r in "01" for e in "012"]
    accuracy = re.findall(r"\[RANK(\d)\] training accuracy ([\d.]+)", proc.stdout)
    assert len(accuracy) == 2 and accuracy[0][1] == accuracy[1][1]  # BSP: one model
    assert float(accuracy[0][1]) > 0.85
    assert (folder / "snapshot.pt").exists()


def test_a_budget_ends_the_ddp_scripts_epochs_without_an_exception_in_its_code(launched):
    """launch --steps 20 under a script with its own epoch loop: the sampler's epochs end with
    the job, steps after the stop do nothing, the script ends normally and saves its model."""
    import re
    proc, folder = launched["ddp_budget"]
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "40 steps" in proc.stdout  # 20 a rank, then the budget
    assert len(re.findall(r"training accuracy", proc.stdout)) == 2
    assert "step() does nothing from here" in proc.stdout
    assert (folder / "snapshot.pt").exists()


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
