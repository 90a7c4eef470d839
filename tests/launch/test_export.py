"""`paramserver export`: a checkpoint's flat shards back into named tensors a fresh model loads.

The checkpoints here are written by the same functions the coordinator and the servers use
(no job runs: a few seconds); tests/launch/test_train_e2e.py checks the model.pt a live `train` writes.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from paramserver.runlog.checkpoint_set import save_coordinator_state
from paramserver.runlog.model_file import ExportError, export, read_model
from paramserver.server.checkpoint import write_shard
from paramserver.models.workload import build

JOB = {"task": {"model": "mlp", "dataset": "digits", "seed": 3}, "dtype": "float32",
       "servers": 2}


def _checkpoint(root, tag, flat, cut):
    """A checkpoint of `flat` in two shards split at key `cut`, as a job writes it."""
    for rank, (lo, hi) in enumerate(((0, cut), (cut, flat.size))):
        write_shard(str(root), tag, rank, {"values": flat[lo:hi].copy()},
                    {"version": int(tag), "range": [lo, hi], "dtype": "float32",
                     "updates_applied": int(tag)})
    save_coordinator_state(root, tag, {"rounds_applied": int(tag), "samples_done": 0,
                                       "steps_done": 0, "num_keys": int(flat.size),
                                       "worker_samples": {}, "elapsed_s": 0.0})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder with two checkpoints of different values: (folder, {tag: flat})."""
    folder = tmp_path_factory.mktemp("run")
    (folder / "config.json").write_text(json.dumps({"config": {}, "job": JOB}))
    _, model, keys = build(JOB["task"], "float32")
    flats = {}
    for tag, scale in (("000000010", 1.0), ("000000020", 2.0)):
        flat = keys.flatten_params(model).numpy() * scale
        flat[::7] += np.float32(scale)  # values no fresh model has by chance
        _checkpoint(folder / "checkpoints", tag, flat, cut=keys.num_keys // 3)
        flats[tag] = flat
    return folder, flats


def _as_flat(tensors, keys):
    """The exported tensors loaded into a fresh model of the job, flattened again."""
    _, model, _ = build({**JOB["task"], "seed": 99}, "float32")
    model.load_state_dict(tensors)  # strict: every name and shape must match
    return keys.flatten_params(model).numpy()


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_the_newest_checkpoint_comes_back_under_the_model_names(run, tmp_path, fmt):
    if fmt == "safetensors":
        pytest.importorskip("safetensors", reason="the optional safetensors extra is absent")
    folder, flats = run
    _, model, keys = build(JOB["task"], "float32")
    path, what = export(folder, tmp_path / f"m.{fmt}", fmt)
    assert "000000020" in what
    tensors = read_model(path)
    # safetensors keeps names sorted; the loader matches by name, not order
    assert sorted(tensors) == sorted(name for name, _ in model.named_parameters())
    np.testing.assert_array_equal(_as_flat(tensors, keys), flats["000000020"])


def test_one_named_checkpoint_folder_gives_that_checkpoint(run, tmp_path):
    folder, flats = run
    _, _, keys = build(JOB["task"], "float32")
    path, _ = export(folder / "checkpoints" / "ckpt-000000010", tmp_path / "m.pt", "pt")
    np.testing.assert_array_equal(_as_flat(read_model(path), keys), flats["000000010"])


def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one(run, tmp_path):
    import shutil
    folder, flats = run
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    victim = next((copy / "checkpoints" / "ckpt-000000020" / "server-1").glob("*.npy"))
    victim.write_bytes(victim.read_bytes()[:-8])
    _, _, keys = build(JOB["task"], "float32")
    path, what = export(copy, tmp_path / "m.pt", "pt")
    assert "000000010" in what
    np.testing.assert_array_equal(_as_flat(read_model(path), keys), flats["000000010"])


def test_clear_errors(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export(tmp_path / "nope", tmp_path / "m.pt", "pt")
    with pytest.raises(ExportError, match="unknown format 'onnx'"):
        export(tmp_path, tmp_path / "m.x", "onnx")
    with pytest.raises(ExportError, match="no config.json"):
        export(tmp_path, tmp_path / "m.pt", "pt")
    (tmp_path / "config.json").write_text(json.dumps({"config": {}, "job": JOB}))
    with pytest.raises(ExportError, match="no model.pt and no committed checkpoint"):
        export(tmp_path, tmp_path / "m.pt", "pt")
    demo = {**JOB, "task": {"name": "demo"}}
    (tmp_path / "config.json").write_text(json.dumps({"config": {}, "job": demo}))
    with pytest.raises(ExportError, match="records no model parameter names"):
        export(tmp_path, tmp_path / "m.pt", "pt")


def test_the_command_says_what_it_wrote_and_refuses_clearly(run, tmp_path):
    folder, _ = run
    cmd = [sys.executable, "-m", "paramserver", "export"]
    ok = subprocess.run(cmd + [str(folder), "--format", "pt", "--out", str(tmp_path / "a.pt")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "a.pt" in ok.stdout and "checkpoint 000000020" in ok.stdout
    assert isinstance(torch.load(tmp_path / "a.pt", weights_only=True), dict)
    bad = subprocess.run(cmd + [str(tmp_path / "missing")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "missing does not exist" in bad.stderr


def test_an_out_that_is_a_folder_or_under_a_file_is_refused_at_the_flag(run, tmp_path, capsys):
    """--out naming a folder (os.replace's IsADirectoryError) or a path under a file (mkdir's
    FileExistsError) was a traceback; now the flag's error, before anything is read."""
    from paramserver.cli.main import main
    folder, _ = run
    (tmp_path / "notes.txt").write_text("a file\n")
    for out, says in ((tmp_path, f"{tmp_path} is a folder; give the name of a file to write"),
                      (tmp_path / "notes.txt" / "m.pt", "notes.txt is a file, not a folder")):
        with pytest.raises(SystemExit) as refused:
            main(["export", str(folder), "--format", "pt", "--out", str(out)])
        err = capsys.readouterr().err
        assert refused.value.code == 2 and says in err.splitlines()[0], err
        assert "Traceback" not in err


def test_a_model_with_a_sparse_table_exports_its_rows_beside_the_dense_names(tmp_path):
    """DLRM's rows live in the servers' tables, not in its parameters: the export carried
    the dense part only, and a run without checkpoints said nothing of why it had no model."""
    from paramserver.models import sparse_tables
    from paramserver.server.tables import ShardTables
    task = {"model": "dlrm", "dataset": "clicks", "seed": 1}
    _, model, keys = build(task, "float32")
    specs = sparse_tables(model)
    job = {"task": task, "dtype": "float32", "servers": 2,
           "tables": [{"name": s.name, "dim": s.dim} for s in specs]}
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"config": {}, "job": job}))
    with pytest.raises(ExportError, match="keeps its rows on the servers, so the run writes "
                                          "no model.pt: train it with --checkpoint-every N"):
        export(folder, tmp_path / "none.pt", "pt")
    flat = keys.flatten_params(model).numpy()
    cut = keys.num_keys // 2
    rng = np.random.default_rng(0)
    expected = {}
    for rank, (lo, hi) in enumerate(((0, cut), (cut, flat.size))):
        tables = ShardTables(specs, servers=2, seed=rank)
        for spec in specs:
            # each shard holds its own keys, pushed unsorted, some twice
            mine = rng.choice(10**9, 300, replace=False).astype(np.int64) * 2 + rank
            table = tables.tables[spec.name]
            table.push(mine, rng.standard_normal((mine.size, spec.dim), dtype=np.float32), 1.0)
            table.push(mine[:50], rng.standard_normal((50, spec.dim), dtype=np.float32), 1.0)
            expected.update({(spec.name, int(k)): row for k, row in zip(mine, table.pull(mine))})
        write_shard(str(folder / "checkpoints"), "000000005", rank,
                    {"values": flat[lo:hi].copy(), **tables.snapshot()},
                    {"version": 5, "range": [lo, hi], "dtype": "float32",
                     "updates_applied": 5})
    save_coordinator_state(folder / "checkpoints", "000000005",
                           {"rounds_applied": 5, "samples_done": 0, "steps_done": 0,
                            "num_keys": int(flat.size), "worker_samples": {}, "elapsed_s": 0.0})
    tensors = read_model(export(folder, tmp_path / "m.pt", "pt")[0])
    _, fresh, _ = build({**task, "seed": 99}, "float32")
    loaded = fresh.load_state_dict(tensors, strict=False)
    assert not loaded.missing_keys  # the dense part, whole
    for spec in specs:
        got_keys, got_rows = tensors[f"{spec.name}.keys"], tensors[f"{spec.name}.rows"]
        assert got_keys.dtype == torch.int64 and tuple(got_rows.shape) == (600, spec.dim)
        assert torch.all(got_keys[1:] > got_keys[:-1])  # one row per key, in key order
        for k, row in zip(got_keys.tolist(), got_rows.numpy()):
            np.testing.assert_array_equal(row, expected[(spec.name, k)])
    assert sorted(loaded.unexpected_keys) == sorted(
        f"{s.name}.{part}" for s in specs for part in ("keys", "rows"))
