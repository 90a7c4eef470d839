"""Checkpoint files: round trip, checksums, atomic replacement, crash leftovers ignored."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from paramserver.runlog.checkpoint import CheckpointError, commit, latest, read_part, write_part


def test_round_trip_with_meta(tmp_path):
    arrays = {"values": np.arange(10, dtype=np.float32), "momentum": np.ones(10)}
    write_part(tmp_path, "7", "server-0", arrays, {"version": 7, "range": [0, 10]})
    commit(tmp_path, "7")
    got, meta = read_part(tmp_path, latest(tmp_path), "server-0")
    np.testing.assert_array_equal(got["values"], arrays["values"])
    assert got["momentum"].dtype == np.float64 and meta == {"version": 7, "range": [0, 10]}


def test_corruption_is_detected(tmp_path):
    write_part(tmp_path, "1", "p", {"v": np.arange(100.0)}, {})
    path = tmp_path / "ckpt-1" / "p" / "v.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        read_part(tmp_path, "1", "p")


def test_latest_moves_only_on_commit_and_old_ones_are_pruned(tmp_path):
    for tag in ("1", "2", "3"):
        write_part(tmp_path, tag, "p", {"v": np.full(3, float(tag))}, {})
        assert latest(tmp_path) == (None if tag == "1" else str(int(tag) - 1))
        commit(tmp_path, tag, keep=2)
        time.sleep(0.01)
    assert latest(tmp_path) == "3"
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-2", "ckpt-3"]


WRITER = """
import sys, numpy as np
from pathlib import Path
from paramserver.runlog.checkpoint import write_part, commit
root = Path(sys.argv[1])
for i in range(2, 100000):
    write_part(root, str(i), "server-0", {"values": np.full(2_000_000, float(i))}, {"i": i})
    commit(root, str(i))
"""


def test_a_writer_killed_at_a_random_moment_leaves_a_readable_latest(tmp_path):
    write_part(tmp_path, "1", "server-0", {"values": np.full(2_000_000, 1.0)}, {"i": 1})
    commit(tmp_path, "1")
    rng = np.random.default_rng(0)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)])
        time.sleep(0.3 + rng.random() * 0.7)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        tag = latest(tmp_path)
        arrays, meta = read_part(tmp_path, tag, "server-0")
        assert meta["i"] == int(tag) and arrays["values"][0] == float(tag)


def test_a_checkpoint_a_dead_server_never_confirms_is_abandoned(tmp_path):
    from paramserver.coordinator.checkpoint_keeper import save_coordinator_state
    from paramserver.coordinator.checkpoint_schedule import CheckpointSchedule
    keeper = CheckpointSchedule(str(tmp_path), every=10)
    keeper.begin("000000010", [0, 1], 10, now=1.0)
    assert not keeper.saved(0, "000000010")  # server 1 dies before saving
    assert not keeper.due(25, now=2.0)  # one in flight: none other starts
    keeper.abort()
    assert keeper.pending_tag is None and latest(tmp_path) is None
    assert not keeper.saved(1, "000000010")  # a late confirmation of the abandoned tag
    assert keeper.due(20, now=3.0)
    keeper.begin("000000020", [0, 1], 20, now=3.0)
    assert not keeper.saved(0, "000000020") and keeper.saved(1, "000000020")
    assert keeper.complete() == "000000020"
    save_coordinator_state(tmp_path, "000000020", {"rounds_applied": 20})
    assert latest(tmp_path) == "000000020"
