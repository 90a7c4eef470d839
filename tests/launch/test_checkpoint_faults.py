"""Checkpoints the disk refuses, runs resumed from elsewhere, a newest checkpoint of another
model: training goes on, the last good checkpoint is never harmed, a resume finds its way."""

import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
from paramserver.runlog.checkpoint import (
    CheckpointWriteError, commit, latest, read_part, write_part,
)
from paramserver.runlog.checkpoint_set import save_coordinator_state, usable_checkpoint

QUICK = ["--sync", "bsp", "--workers", "2", "--dtype", "float64", "--batch-size", "16",
         "--eval-interval", "0", "--quiet", "--seed", "3"]


def _train(*args, cwd=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "paramserver", "train", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_a_full_disk_leaves_no_partial_part_and_names_path_and_space(tmp_path, monkeypatch):
    """(The disk is made full by np.save raising ENOSPC: this machine has no small
    filesystem to fill.) The error is one line with the path and the space; the part's temp
    folder is gone and the committed checkpoint is as it was."""
    write_part(tmp_path, "000000002", "server-0", {"values": np.ones(4)}, {"x": 1})
    commit(tmp_path, "000000002")

    def full(f, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f.name))
    monkeypatch.setattr(np, "save", full)
    with pytest.raises(CheckpointWriteError) as failed:
        write_part(tmp_path, "000000004", "server-0", {"values": np.ones(1 << 18)}, {})
    text = str(failed.value)
    assert "checkpoint 000000004 not written to" in text and "values.npy" in text
    assert "No space left on device" in text and "it needs 2.0 MB" in text and "free" in text
    assert list((tmp_path / "ckpt-000000004").iterdir()) == []  # no half-written part
    assert latest(tmp_path) == "000000002"
    np.testing.assert_array_equal(read_part(tmp_path, "000000002", "server-0")[0]["values"],
                                  np.ones(4))


def test_a_checkpoint_given_up_is_neither_pending_nor_the_latest():
    s = CheckpointSchedule("/ckpt", every=2, latest="000000002")
    s.begin("000000004", [0, 1], 4, 0.0)
    assert s.give_up("000000004") and s.pending_tag is None and s.latest == "000000002"
    assert not s.give_up("000000004")  # the second shard's failure of the same one
    assert s.due(6, 1.0)  # the next one is tried on schedule
    s.begin("000000006", [0], 6, 1.0)
    s.saved(0, "000000006")
    assert s.complete() == "000000006" and s.latest == "000000006"
    assert s.give_up("000000006") and s.latest == "000000002"  # its commit failed


def test_a_job_whose_checkpoint_the_filesystem_refuses_trains_on_and_commits_the_next(tmp_path):
    """Checkpoint 4's folder cannot be made (a file stands where it goes: refused by the
    filesystem even for root): the job finishes, says so in one line, and commits 6 and 8."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "ckpt-000000004").write_text("in the way")
    proc = _train(*QUICK, "--steps", "8", "--checkpoint-every", "2", "--checkpoint-dir",
                  str(ckpt), "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert latest(ckpt) == "000000008"
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "logs").glob("server-*.log"))
    assert logs.count("checkpoint 000000004 not written to") == 1, logs[-3000:]
    assert "Traceback" not in logs
    events = [json.loads(line) for line in
              (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e.get("event") == "checkpoint_failed"]
    assert [e["tag"] for e in failed] == ["000000004"]
    assert (ckpt / "ckpt-000000004").read_text() == "in the way"  # nothing of ours harmed it


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A 6-round run with its checkpoints in its own folder, started from a folder of its own
    with relative paths (as a user types them)."""
    root = tmp_path_factory.mktemp("where")
    proc = _train(*QUICK, "--steps", "6", "--checkpoint-every", "2", "--out", "runs/a",
                  cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "runs" / "a"


def test_a_run_resumes_from_any_working_directory_and_after_its_folder_moved(
        stopped_run, tmp_path):
    saved = json.loads((stopped_run / "config.json").read_text())["config"]
    assert os.path.isabs(saved["checkpoint_dir"])  # not read against the resume's folder
    # One resume for both: from another working directory, of a folder moved away from its
    # recorded path (a resume whose recorded folder is in place: tests/launch/test_resume.py).
    moved = tmp_path / "moved"
    shutil.move(str(stopped_run), moved)  # the recorded path is gone; the folder has its own
    proc = _train("--resume", str(moved), "--steps", "10", "--quiet", cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert latest(moved / "checkpoints") == "000000010"


def test_a_copied_run_resumes_from_its_own_checkpoints_and_leaves_the_original_alone(
        tmp_path):
    """A run folder copied (the original still in place) and resumed goes on from the copy's
    checkpoints/ and writes there: it took the original's recorded folder, so it resumed from
    whatever the original held and wrote its checkpoints into it."""
    proc = _train(*QUICK, "--steps", "6", "--checkpoint-every", "2", "--out", "runs/a",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    original = tmp_path / "runs" / "a"
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    proc = _train("--resume", str(copy), "--steps", "10", "--quiet", cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert latest(copy / "checkpoints") == "000000010"
    assert latest(original / "checkpoints") == "000000006"  # the original is untouched
    assert not (original / "checkpoints" / "ckpt-000000010").exists()
    saved = json.loads((copy / "config.json").read_text())["config"]
    assert saved["checkpoint_dir"] == str((copy / "checkpoints").resolve())
    # A budget the checkpoint has spent already is refused; it printed the old summary.
    proc = _train("--resume", str(copy), "--steps", "4", "--quiet", cwd="/")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nothing left to train: checkpoint 000000010 has 320 samples done and the " \
           "budget is 128" in proc.stderr
    assert latest(copy / "checkpoints") == "000000010"


def test_a_newest_checkpoint_of_another_model_is_passed_over_for_the_good_one(tmp_path):
    """What a resume (and a restarted coordinator) picks: the newest checkpoint that fits the
    job, its size included, as the shards would check it."""
    def save(root, tag, n, values_n=None):
        write_part(root, tag, "server-0", {"values": np.zeros(values_n or n)},
                   {"version": 1, "range": [0, n], "dtype": "float64", "updates_applied": 0,
                    "applied": []})
        save_coordinator_state(root, tag, {
            "rounds_applied": 1, "samples_done": 1, "steps_done": 1, "num_keys": n,
            "worker_samples": {"0": 1}})
    for name, newest, fault in (("model", (12, None), "12 parameters, the job 10"),
                                ("shape", (10, 9), "shape [9] for keys [0, 10)")):
        root = tmp_path / name
        save(root, "000000002", 10)
        save(root, "000000004", *newest)
        tag, warnings = usable_checkpoint(root, 1, "float64", num_keys=10)
        assert tag == "000000002", warnings
        assert "000000004" in warnings[0] and fault in warnings[0]
        assert usable_checkpoint(root, 1, "float64")[0] == (
            "000000004" if name == "model" else "000000002")  # (size unknown: not checked)


@pytest.mark.parametrize("depth", [65, 900, 990, 5000, 100_000])
def test_files_nested_past_the_bound_read_as_malformed_json_not_a_recursion_error(
        tmp_path, depth):
    """A manifest (or job file, run config, sync blob) nested deeper than anything written
    here is refused as malformed where it is read, as a truncated one is."""
    from paramserver.core.bounded import MAX_JSON_NESTING, json_value
    from paramserver.runlog.checkpoint import CheckpointError, read_manifest
    deep = "[" * depth + "]" * depth
    with pytest.raises(json.JSONDecodeError, match="nested deeper"):
        json_value(deep)
    assert json_value("[" * MAX_JSON_NESTING + "]" * MAX_JSON_NESTING) is not None
    folder = tmp_path / "ckpt-000000002" / "server-0"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text('{"format": ' + deep + "}")
    with pytest.raises(CheckpointError, match="manifest.json is unreadable"):
        read_manifest(tmp_path, "000000002", "server-0")


def test_a_checkpoint_folder_that_cannot_be_written_is_said_before_the_job_starts(tmp_path):
    """(A file stands where the folder would go: refused by the filesystem even for root.)"""
    (tmp_path / "taken").write_text("a file")
    proc = _train(*QUICK, "--steps", "2", "--checkpoint-every", "1", "--checkpoint-dir",
                  str(tmp_path / "taken" / "ckpt"), "--out", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "checkpoint folder cannot be written" in proc.stderr
    assert str(tmp_path / "taken") in proc.stderr and "--checkpoint-dir" in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started
