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
    from paramserver.runlog.checkpoint_set import save_coordinator_state
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


# ---- nothing read is trusted: checked against the manifest and the job, fast, by name ----------
import hashlib  # noqa: E402
import json  # noqa: E402

from paramserver.server.checkpoint import read_shard, write_shard  # noqa: E402
from paramserver.server.core import ShardCore  # noqa: E402
from paramserver.server.events import Checkpoint, Init, ShardSettings  # noqa: E402
from paramserver.server.events import PushRows, SaveShard  # noqa: E402
from paramserver.spec.job import TableSpec  # noqa: E402

TABLE = TableSpec("emb", 4, optimizer="sgd", lr=0.5, row_budget=64)


def _core(rank=0, lo=0, hi=10, dtype="float64", optimizer="momentum", servers=1, tables=()):
    return ShardCore(ShardSettings(rank=rank, lo=lo, hi=hi, dtype=dtype, apply_mode="arrival",
                                   optimizer=optimizer, lr=1.0, tables=tables, servers=servers))


def _save(core, root, tag):
    """The shard's part of checkpoint `tag`, written as its node writes it."""
    save = next(i for i in core.handle(Checkpoint(None, tag, str(root))) if type(i) is SaveShard)
    write_shard(str(root), tag, core.settings.rank, save.arrays, save.meta)
    return root / f"ckpt-{tag}" / f"server-{core.settings.rank}"


def _saved_shard(root, tag="1", **settings):
    core = _core(**settings)
    s = core.settings
    core.handle(Init(("w", 1), s.lo, s.hi, np.arange(s.lo, s.hi, dtype=s.dtype)))
    return _save(core, root, tag)


def _rewrite(folder, name, array, manifest_too=False):
    """Replace array `name` of a part by `array` and give the manifest its checksum (what a
    buggy writer or an unlucky copy leaves: every checksum matches)."""
    path = folder / f"{name}.npy"
    np.save(path, array, allow_pickle=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["arrays"][name]
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    if manifest_too:
        entry["shape"], entry["dtype"] = list(array.shape), str(array.dtype)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_truncated_shard_file_is_refused_at_once_naming_it(tmp_path):
    folder = _saved_shard(tmp_path)
    path = folder / "values.npy"
    path.write_bytes(path.read_bytes()[:150])  # the header is whole
    with pytest.raises(CheckpointError, match=r"values\.npy is truncated: 150 bytes, a float64 "
                                              r"array of shape \[10\] needs 208"):
        read_shard(str(tmp_path), "1", 0, _core().store)


@pytest.mark.parametrize("manifest_too", [False, True], ids=["file-only", "manifest-too"])
def test_a_shard_file_of_another_shape_with_a_matching_checksum_is_refused(tmp_path,
                                                                          manifest_too):
    folder = _saved_shard(tmp_path)
    _rewrite(folder, "values", np.full(1, 7.0), manifest_too)  # restored, it would broadcast
    want = (r"'values' is float64 \[1\], this shard needs float64 \[10\]" if manifest_too else
            r"values\.npy holds a float64 array of shape \[1\], the manifest says float64 \[10\]")
    store = _core().store
    with pytest.raises(CheckpointError, match=want):
        read_shard(str(tmp_path), "1", 0, store)
    assert not store.initialized


@pytest.mark.parametrize("name", ["values", "state.momentum"])
def test_a_shard_file_of_another_dtype_is_refused(tmp_path, name):
    folder = _saved_shard(tmp_path)
    _rewrite(folder, name, np.zeros(10, np.float32), manifest_too=True)
    with pytest.raises(CheckpointError, match=rf"'{name}' is float32 \[10\], this shard needs "
                                              r"float64 \[10\]"):
        read_shard(str(tmp_path), "1", 0, _core().store)


def test_another_shards_part_is_refused(tmp_path):
    _saved_shard(tmp_path, lo=0, hi=10)
    with pytest.raises(CheckpointError, match=r"holds keys \[0, 10\) \(float64\), this shard "
                                              r"is \[10, 20\)"):
        read_shard(str(tmp_path), "1", 0, _core(lo=10, hi=20).store)


@pytest.mark.parametrize("field", ["format", "arrays", "meta", "tag"])
def test_a_manifest_missing_a_field_is_refused_naming_it(tmp_path, field):
    folder = _saved_shard(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest[field]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=rf"manifest field '{field}' is missing"):
        read_shard(str(tmp_path), "1", 0, _core().store)


@pytest.mark.parametrize("where, value, want", [
    (("arrays", "values", "shape"), None, r"'arrays\.values\.shape' is missing"),
    (("arrays", "values", "shape"), "10", r"'arrays\.values\.shape' must be a list of integers"),
    (("arrays", "values", "file"), "../../../etc/passwd",
     r"'arrays\.values\.file' must be a \.npy file name in the part's folder"),
    (("arrays", "values", "dtype"), "object", r"'arrays\.values\.dtype' must be a numeric"),
    (("meta", "version"), None, r"shard meta field 'version' is missing"),
    (("meta", "range"), [3], r"shard meta field 'range' must be \[lo, hi\]"),
])
def test_a_manifest_field_missing_or_of_the_wrong_kind_is_named(tmp_path, where, value, want):
    folder = _saved_shard(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    node = manifest
    for key in where[:-1]:
        node = node[key]
    if value is None:
        del node[where[-1]]
    else:
        node[where[-1]] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=want):
        read_shard(str(tmp_path), "1", 0, _core().store)


def test_a_coordinator_state_missing_a_field_is_refused_naming_it(tmp_path):
    from paramserver.runlog.checkpoint_set import (
        load_coordinator_state, save_coordinator_state,
    )
    save_coordinator_state(tmp_path, "3", {"rounds_applied": 3, "steps_done": 3,
                                           "num_keys": 10, "worker_samples": {"0": 3}})
    with pytest.raises(CheckpointError, match="coordinator state field 'samples_done' is "
                                              "missing"):
        load_coordinator_state(tmp_path, "3")


def _table_core(rank, servers=2):
    return _core(rank=rank, servers=servers, optimizer="sgd", tables=(TABLE,))


def _with_rows(core, keys):
    s = core.settings
    core.handle(Init(("w", 1), s.lo, s.hi, np.zeros(s.hi - s.lo, s.dtype)))
    grads = np.ones((len(keys), TABLE.dim), np.float32)
    core.handle(PushRows(("w", 2), "w", 2, "emb", keys, grads.reshape(-1), 0, 1, 0))
    return core


def test_a_sparse_table_checkpoint_gets_the_same_checks(tmp_path):
    from paramserver.sparse.placement import shard_of
    keys = np.arange(200, dtype=np.int64)
    mine = keys[shard_of(keys, 2) == 0][:5]
    folder = _save(_with_rows(_table_core(0), mine), tmp_path, "1")
    arrays, _ = read_shard(str(tmp_path), "1", 0, _table_core(0).store,
                           _table_core(0).tables, servers=2)  # its own shard: accepted
    np.testing.assert_array_equal(np.sort(arrays["table.emb.keys"]), np.sort(mine))
    # Shard 1 of the same job must not take shard 0's rows.
    other = _table_core(1)
    other_folder = folder.parent / "server-1"
    other_folder.mkdir()
    for f in folder.iterdir():
        (other_folder / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((other_folder / "manifest.json").read_text())
    manifest["part"] = "server-1"
    (other_folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"table 'emb': 5 of its keys belong to other "
                                              r"shards than 1 of 2"):
        read_shard(str(tmp_path), "1", 1, other.store, other.tables, servers=2)
    # Rows of another width, every checksum matching.
    rows = np.zeros((5, TABLE.dim + 1), np.float32)
    _rewrite(folder, "table.emb.rows", rows, manifest_too=True)
    with pytest.raises(CheckpointError, match=r"table 'emb': .*rows"):
        read_shard(str(tmp_path), "1", 0, _table_core(0).store, _table_core(0).tables, 2)


def test_an_unusable_checkpoint_falls_back_to_the_previous_kept_one_naming_both(tmp_path):
    from paramserver.server.checkpoint import restore_shard
    core = _core()
    core.handle(Init(("w", 1), 0, 10, np.arange(10.0)))
    for tag in ("000000002", "000000004"):
        _save(core, tmp_path, tag)
        commit(tmp_path, tag)
    (tmp_path / "ckpt-000000004" / "server-0" / "values.npy").write_bytes(b"\x93NUMPY")
    store = _core().store
    with pytest.raises(CheckpointError, match="values.npy: not a readable .npy file"):
        restore_shard(str(tmp_path), "000000004", 0, store)  # a resume never mixes tags
    found = restore_shard(str(tmp_path), "000000004", 0, store, fallback=True)
    assert found.tag == "000000002"
    (warning,) = found.warnings
    assert warning.startswith("checkpoint 000000004 is unusable (") and "values.npy" in warning
    assert warning.endswith("falling back to the previous kept checkpoint 000000002")
    (tmp_path / "ckpt-000000002" / "server-0" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no usable checkpoint of shard 0 .*000000004.*"
                                              "000000002 has no part 'server-0'"):
        restore_shard(str(tmp_path), "000000004", 0, store, fallback=True)


def test_a_resume_takes_the_newest_checkpoint_whose_every_part_is_usable(tmp_path):
    from paramserver.runlog.checkpoint_set import (
        save_coordinator_state, usable_checkpoint,
    )
    shards = [_core(rank=r, lo=5 * r, hi=5 * r + 5) for r in range(2)]
    for c in shards:
        c.handle(Init(("w", 1), c.settings.lo, c.settings.hi, np.zeros(5)))
    for tag in ("000000002", "000000004"):
        for c in shards:
            _save(c, tmp_path, tag)
        save_coordinator_state(tmp_path, tag, {
            "rounds_applied": int(tag), "samples_done": int(tag), "steps_done": int(tag),
            "num_keys": 10, "worker_samples": {"0": int(tag)}})
    assert usable_checkpoint(tmp_path, 2, "float64") == ("000000004", [])
    path = tmp_path / "ckpt-000000004" / "server-1" / "values.npy"
    path.write_bytes(path.read_bytes()[:-8])
    tag, warnings = usable_checkpoint(tmp_path, 2, "float64")
    assert tag == "000000002" and len(warnings) == 1
    assert "checkpoint 000000004 is unusable" in warnings[0] and "truncated" in warnings[0]
    assert usable_checkpoint(tmp_path, 2, "float32")[0] is None  # another job's checkpoints
    assert usable_checkpoint(tmp_path, 3, "float64")[0] is None


def test_a_shard_saves_checkpoint_0_once_its_init_makes_it_whole_and_before_the_ack(tmp_path):
    from paramserver.server.events import Push, Reply
    from paramserver.spec.welcome import INITIAL_TAG
    core = ShardCore(ShardSettings(rank=0, lo=0, hi=10, dtype="float32", apply_mode="arrival",
                                   optimizer="sgd", lr=1.0, tables=(TABLE,),
                                   initial_checkpoint_dir=str(tmp_path)))
    first = core.handle(Init(("w", 1), 0, 6, np.ones(6, np.float32)))  # a chunk: not whole yet
    assert [type(i) for i in first] == [Reply]
    out = core.handle(Init(("w", 2), 6, 10, np.ones(4, np.float32)))
    assert [type(i) for i in out] == [SaveShard, Reply]  # on disk before its initializer goes on
    save = out[0]
    assert save.tag == INITIAL_TAG and save.dir == str(tmp_path)
    np.testing.assert_array_equal(save.arrays["values"], np.ones(10, np.float32))
    assert save.arrays["table.emb.keys"].size == 0  # rows start by key: none exists yet
    write_shard(str(tmp_path), save.tag, 0, save.arrays, save.meta)
    core.handle(Push(("w", 3), "w", 3, 0, 10, np.ones(10, np.float32), 0, 1, 0))
    # The coordinator's commit of checkpoint 0 must not overwrite the initial values.
    assert [i.op for i in core.handle(Checkpoint(("c", 1), INITIAL_TAG, str(tmp_path)))] == [
        "saved"]
    arrays, _ = read_shard(str(tmp_path), INITIAL_TAG, 0, _core(dtype="float32",
                                                               optimizer="sgd").store)
    np.testing.assert_array_equal(arrays["values"], np.ones(10, np.float32))
