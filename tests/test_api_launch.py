"""A user's own script through `paramserver launch` and DistributedOptimizer, as the README shows."""

import os
import subprocess
import sys
from pathlib import Path

from paramserver.runlog.metrics import read_records

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_my_model.py"


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
