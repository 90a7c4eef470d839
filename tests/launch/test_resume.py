"""Stop a BSP run, resume it from its checkpoint, and land where an uninterrupted run lands."""

import json
import subprocess
import sys

import numpy as np
import pytest

from paramserver.runlog.checkpoint import latest, read_part
from ps_helpers import train_side_by_side

COMMON = ["--sync", "bsp", "--workers", "2", "--dtype", "float64", "--batch-size", "16",
          "--eval-interval", "0", "--quiet", "--seed", "3"]


def train(*args, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", *COMMON, *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted 40-round run both tests compare with, and the first test's run
    stopped at 25, side by side: most of a run is process start-up. Checkpoints change no
    value, so one uninterrupted run serves checkpoints every 10 and every 15 rounds. (The
    corrupt checkpoint's test is slow: it stops its own run.)"""
    root = tmp_path_factory.mktemp("resume")
    plans = {"straight": ("40", "10"), "stopped-15": ("25", "15")}
    done = train_side_by_side(root, {
        name: [*COMMON, "--steps", steps, "--checkpoint-every", every]
        for name, (steps, every) in plans.items()})
    for name, (_, proc) in done.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    return root


def final_values(ckpt_dir):
    tag = latest(ckpt_dir)
    values, _ = read_part(ckpt_dir, tag, "server-0")
    return tag, values["values"]


def test_resumed_bsp_run_matches_an_uninterrupted_one(runs):
    straight, stopped = runs / "straight", runs / "stopped-15"
    tag_stop, at_stop = final_values(stopped / "checkpoints")
    assert tag_stop == f"{25:09d}"
    train("--resume", str(stopped), "--steps", "40")
    tag_a, a = final_values(straight / "checkpoints")
    tag_b, b = final_values(stopped / "checkpoints")
    assert tag_a == tag_b == f"{40:09d}"
    # Round sums add pushes in arrival order, so agreement is to rounding, not bit for bit.
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-9)
    assert not np.allclose(b, at_stop, atol=1e-6)  # the resumed part did train
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["steps"] == 80  # both parts' step records, 2 workers x 40 rounds


@pytest.mark.slow  # two more train runs, ~12 s; fast twins: the pick of the previous kept
# checkpoint past an unusable one (tests/launch/test_checkpoint.py::test_an_unusable_checkpoint_
# falls_back_...), a restarted server's truncated checkpoint passed over live
# (tests/server/test_server_recovery.py), and the resume landing where the straight run does
# (above)
def test_a_resume_whose_latest_checkpoint_is_corrupt_falls_back_to_the_previous_kept_one(runs):
    straight, stopped = runs / "straight", runs / "stopped-10"
    train("--steps", "25", "--checkpoint-every", "10", "--out", str(stopped))
    ckpt = stopped / "checkpoints"
    assert latest(ckpt) == f"{25:09d}"
    path = ckpt / f"ckpt-{25:09d}" / "server-0" / "values.npy"
    path.write_bytes(path.read_bytes()[:-4])  # a copy cut short
    proc = train("--resume", str(stopped), "--steps", "40", "--timeout", "120")
    assert (f"checkpoint {25:09d} is unusable (" in proc.stderr and "truncated" in proc.stderr
            and f"falling back to the previous kept checkpoint {20:09d}" in proc.stderr)
    coordinator_log = (stopped / "logs" / "coordinator-0.log").read_text()
    assert f"resuming from checkpoint {20:09d}" in coordinator_log
    tag_a, a = final_values(straight / "checkpoints")
    tag_b, b = final_values(ckpt)
    assert tag_a == tag_b == f"{40:09d}"
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-9)  # rounds 20..39 done again, as before


def test_a_resume_from_a_checkpoint_before_the_stop_counts_the_steps_after_it_once(tmp_path):
    """A job stopped (killed) after its last checkpoint: the resume trains the rounds after it
    again, so the first part's records of those rounds go; summary.json counts each round's
    steps once and every worker's step numbers run on without repeating."""
    run = tmp_path / "run"
    train("--steps", "25", "--checkpoint-every", "10", "--out", str(run))
    ckpt = run / "checkpoints"
    # As if killed at round 25 with round 20's checkpoint the newest committed.
    import shutil
    shutil.rmtree(ckpt / f"ckpt-{25:09d}")
    (ckpt / "LATEST").write_text(f"{20:09d}")
    train("--resume", str(run), "--steps", "40")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 80 and summary["samples"] == 80 * 16  # 2 workers x 40 rounds
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for worker in (0, 1):
        numbers = [r["step"] for r in steps if r.get("kind") == "step" and r["worker"] == worker]
        assert numbers == list(range(40))
