"""`paramserver tensorboard RUN`: a run's metrics as event files TensorBoard itself reads back."""

import json
import subprocess
import sys

import pytest

from paramserver.runlog.tensorboard import EVAL_RUN, scalars

RECORDS = [
    {"t": 0.1, "kind": "step", "worker": 0, "step": 0, "batch": 32, "loss": 2.3,
     "compute_s": 0.01, "wait_s": 0.002, "staleness": 0},
    {"t": 0.2, "kind": "step", "worker": 1, "step": 0, "batch": 32, "loss": 2.4,
     "compute_s": 0.03, "wait_s": 0.0, "staleness": 1},
    {"t": 0.3, "kind": "server", "server": 0, "busy_s": 0.1},
    {"t": 0.4, "kind": "step", "worker": 1, "step": 1, "batch": 11, "loss": 1.9,
     "compute_s": 0.01, "wait_s": 0.001, "staleness": 2},
    {"t": 0.5, "kind": "eval", "accuracy": 0.5, "test_loss": 1.5, "samples": 96, "final": False},
    {"t": 0.9, "kind": "eval", "accuracy": 0.75, "test_loss": 1.0, "samples": 160, "final": True},
]


def test_steps_go_per_worker_and_tests_over_samples():
    points = scalars(RECORDS)
    batch = {(p.run, p.step): p.value for p in points if p.tag == "train/batch"}
    assert batch == {("worker-0", 0): 32, ("worker-1", 0): 32, ("worker-1", 1): 11}
    acc = [(p.run, p.step, p.value) for p in points if p.tag == "test/accuracy"]
    assert acc == [(EVAL_RUN, 96, 0.5), (EVAL_RUN, 160, 0.75)]
    assert not any(p.run.startswith("server") for p in points)


def test_the_event_files_read_back_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="the optional tensorboard extra is absent "
                                              "(pip install 'paramserver[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    proc = subprocess.run([sys.executable, "-m", "paramserver", "tensorboard", str(run)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "tensorboard --logdir" in proc.stdout

    def read(name):
        acc = EventAccumulator(str(run / "tensorboard" / name))
        acc.Reload()
        return acc

    w1 = read("worker-1")
    assert [(e.step, e.value) for e in w1.Scalars("train/batch")] == [(0, 32), (1, 11)]
    assert [e.value for e in w1.Scalars("train/staleness")] == [1, 2]
    assert {"train/loss", "time/wait_s", "time/compute_s"} <= set(w1.Tags()["scalars"])
    walls = [e.wall_time for e in w1.Scalars("train/loss")]
    assert walls[1] - walls[0] == pytest.approx(0.2, abs=1e-3)
    ev = read(EVAL_RUN)
    assert [(e.step, e.value) for e in ev.Scalars("test/accuracy")] == [(96, 0.5), (160, 0.75)]


def test_a_folder_without_metrics_is_refused_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "tensorboard", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr


def test_a_simulated_runs_step_bands_become_quantile_tags(tmp_path):
    """A simulation with --detail summary keeps no step lines: its steps.npz bands are what
    TensorBoard shows, one tag per quantile, equal to the arrays."""
    pytest.importorskip("tensorboard", reason="the optional tensorboard extra is absent "
                                              "(pip install 'paramserver[tensorboard]')")
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "sim"
    sim = subprocess.run([sys.executable, "-m", "paramserver", "simulate", "--sync", "bsp",
                          "--workers", "50", "--steps", "20", "--straggler", "0:3",
                          "--detail", "summary", "--out", str(run)],
                         capture_output=True, text=True, timeout=120)
    assert sim.returncode == 0, sim.stderr
    proc = subprocess.run([sys.executable, "-m", "paramserver", "tensorboard", str(run)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    acc = EventAccumulator(str(run / "tensorboard" / "bands"))
    acc.Reload()
    arrays = np.load(run / "steps.npz")
    q90 = list(arrays["quantiles"]).index(0.9)
    got = [(e.step, e.value) for e in acc.Scalars("time/wait_s/q90")]
    assert [s for s, _ in got] == arrays["band_step"].tolist()
    np.testing.assert_allclose([v for _, v in got], arrays["band_wait_s"][:, q90], rtol=1e-6)
