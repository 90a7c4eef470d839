"""The trained model as a file a user takes home: parameters under the model's own names.

A run's parameters live as one flat vector (the servers' shards, in a checkpoint one .npy per
key range); models/core/keyspace.ModelKeys knows which slice is which named tensor. This module
reassembles the flat vector from a checkpoint, cuts it into named tensors and writes them as
safetensors (the field's standard weight file: no code runs on load) or as a torch state
dict (`torch.load(..., weights_only=True)` reads it).

safetensors is an optional extra (`pip install paramserver[safetensors]`): the project keeps
its dependencies to numpy, torch, pyzmq, msgpack and psutil, and `.pt` needs nothing more, so
`train` writes model.pt and `export --format safetensors` says how to get the library.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from paramserver.runlog.checkpoint import CheckpointError, latest, load_part
from paramserver.runlog.folders import runs_hint
from paramserver.core.bounded import json_value
from paramserver.spec.run_job import RunJob

FORMATS = ("safetensors", "pt")
FINAL_MODEL = "model.pt"  # what `train` and `launch` write into the run folder at the end
LAYOUT_FILE = "model_layout.json"  # a launch job's model layout, from the coordinator


class ExportError(ValueError):
    """A run or checkpoint that cannot give a model file (the message says why)."""


def named_tensors(keys, flat) -> dict[str, torch.Tensor]:
    """{parameter name: tensor of its shape} cut from `flat` by `keys` (ModelKeys); copies,
    so the result owns its memory (safetensors refuses views that share storage)."""
    return {slot.name: keys.view(flat, slot.name).clone() for slot in keys.params}


def write_model(path: str | Path, tensors: dict[str, torch.Tensor], fmt: str) -> Path:
    """Write `tensors` to `path` in format `fmt` (one of FORMATS); returns the path."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if fmt == "pt":
        torch.save(tensors, tmp)
    else:
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ExportError("--format safetensors needs the safetensors package: "
                              "pip install 'paramserver[safetensors]' (or use --format pt)"
                              ) from None
        save_file(tensors, str(tmp), metadata={"written_by": "paramserver"})
    tmp.replace(path)  # a reader never sees half a file
    return path


def read_model(path: str | Path) -> dict[str, torch.Tensor]:
    """The named tensors of a file write_model wrote (by its suffix)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    return torch.load(path, weights_only=True)


def _job_of(folder: Path) -> dict:
    """The job of a run folder: its config.json (`train`), else its job.json (`launch`, whose
    job is the user's script), ExportError when it has neither."""
    config = folder / "config.json"
    if not config.exists() and (folder / "job.json").exists():
        try:
            job = json_value((folder / "job.json").read_text())
        except (OSError, ValueError) as exc:
            raise ExportError(f"{folder / 'job.json'} is unreadable ({exc})") from None
        if not isinstance(job, dict):
            raise ExportError(f"{folder / 'job.json'} holds no job")
        ckpt = RunJob.of(job).checkpoint_dir
        return {"config": {"checkpoint_dir": ckpt} if ckpt else {}, "job": job,
                "folder": str(folder)}
    try:
        doc = json_value(config.read_text())
    except FileNotFoundError:
        raise ExportError(f"{folder} is no run folder (no config.json or job.json)"
                          f"{runs_hint(folder)}") from None
    except (OSError, ValueError) as exc:
        raise ExportError(f"{config} is unreadable ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("job"), dict):
        raise ExportError(f"{config} holds no job")
    return {**doc, "folder": str(folder)}


class LayoutKeys:
    """The names and shapes of a user script's model, from the model_layout.json its launch
    job's coordinator wrote: the same cutting of the flat vector as ModelKeys."""

    def __init__(self, layout):
        self.layout = layout
        self.num_keys = layout.num_keys

    def named(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, lo = {}, 0
        for name, shape in self.layout.params:
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[lo:lo + size].reshape(shape).clone()
            lo += size
        return out


def _layout_keys(folder: Path) -> LayoutKeys:
    from paramserver.core.layout import LayoutError, ModelLayout
    path = folder / LAYOUT_FILE
    try:
        layout = ModelLayout.from_wire(json_value(path.read_text()))
    except FileNotFoundError:
        raise ExportError(f"{path} is missing: the job's coordinator writes it when the first "
                          f"worker joins (a launch job run by an older paramserver has none)"
                          ) from None
    except (OSError, ValueError, LayoutError) as exc:
        raise ExportError(f"{path} is unreadable ({exc})") from None
    if not layout.complete:
        raise ExportError(f"{path} holds the layout's fingerprint only (the model has too many "
                          f"parameter tensors to send by name): the names are unknown")
    return LayoutKeys(layout)


def model_keys(job: dict, folder: Path | None = None):
    """The ModelKeys of a job's model (names and shapes), the model built on torch's meta
    device (no weights are made); for a `launch` job (task "external") the layout its
    coordinator wrote into `folder`. ExportError for a job that names no model."""
    run = RunJob.of(job)
    if run.task.name == "external" and folder is not None:
        return _layout_keys(folder)
    if run.task.name != "train":
        raise ExportError(f"the job runs task {run.task.name!r}, which records no model "
                          f"parameter names to write the values under")
    from paramserver.models.workload import build
    return build(dict(run.task.fields), run.dtype, shape_only=True)[2]


def named(keys, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: tensor} of `flat` by a job's keys (model_keys: ModelKeys or a launch's layout)."""
    return _named(keys, flat)


def _named(keys, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    return keys.named(flat) if isinstance(keys, LayoutKeys) else named_tensors(keys, flat)


def checkpoint_flat(root: Path, tag: str, servers: int, dtype: str) -> np.ndarray:
    """The flat parameter vector of checkpoint `tag`: every shard's values, checked and
    placed at its key range."""
    from paramserver.runlog.checkpoint_set import check_checkpoint
    from paramserver.runlog.checkpoint import ShardMeta, part_folder
    servers = check_checkpoint(root, tag, servers, dtype)
    parts = []
    for rank in range(servers):
        arrays, manifest = load_part(root, tag, f"server-{rank}")
        meta = ShardMeta.from_dict(manifest.meta, str(part_folder(root, tag, f"server-{rank}")))
        values = arrays.get("values")
        if values is None or values.shape != (meta.hi - meta.lo,):
            raise CheckpointError(f"{part_folder(root, tag, f'server-{rank}')}: no values "
                                  f"array of keys [{meta.lo}, {meta.hi})")
        parts.append(values)
    return np.ascontiguousarray(np.concatenate(parts))


def locate(source: str | Path) -> tuple[dict, Path, str | None]:
    """(the job document, checkpoint root, tag or None for the newest usable) of a run folder,
    a checkpoint root (a folder with LATEST) or one checkpoint (a ckpt-TAG folder)."""
    source = Path(source)
    if not source.exists():
        raise ExportError(f"{source} does not exist")
    if not source.is_dir():
        raise ExportError(f"{source} is no folder (give a run folder or a checkpoint folder)")
    if (source / "config.json").exists() or (source / "job.json").exists():
        doc = _job_of(source)
        ckpt = doc.get("config", {}).get("checkpoint_dir")
        root = Path(ckpt) if ckpt else source / "checkpoints"
        if not root.exists() and (source / root.name).exists():
            root = source / root.name  # a run folder moved, or named relative to another cwd
        return doc, root, None
    if source.name.startswith("ckpt-"):
        root, tag = source.parent, source.name[len("ckpt-"):]
    else:
        root, tag = source, None
    for up in (root.parent, root.parent.parent):
        if (up / "config.json").exists() or (up / "job.json").exists():
            return _job_of(up), root, tag
    raise ExportError(f"no config.json next to {source}: the checkpoint's job (its model) is "
                      f"unknown" + (runs_hint(source) or "; give the run folder"))


def export(source: str | Path, out: str | Path, fmt: str) -> tuple[Path, str]:
    """Write the trained parameters of `source` (see locate) to `out`; returns (path, what
    was read: the final model or checkpoint TAG)."""
    from paramserver.runlog.checkpoint_set import usable_checkpoint
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    doc, root, tag = locate(source)
    job = doc["job"]
    keys = model_keys(job, Path(doc["folder"]))
    final = Path(source) / FINAL_MODEL
    if tag is None and final.exists():  # a run folder after its end: the final parameters
        tensors = read_model(final)
        return write_model(out, tensors, fmt), f"the final model {final}"
    run = RunJob.of(job)
    servers, dtype = run.servers or 1, run.dtype
    if tag is None:
        if latest(root) is None:
            rows = (" (a model with a sparse table keeps its rows on the servers, so the run "
                    "writes no model.pt: train it with --checkpoint-every N and export the "
                    "checkpoint)" if run.has_tables else "")
            raise ExportError(f"{source}: no model.pt and no committed checkpoint in "
                              f"{root}{rows}")
        tag, warnings = usable_checkpoint(root, servers, dtype)
        if tag is None:
            raise ExportError(f"{source}: no usable checkpoint in {root}: "
                              + "; ".join(warnings))
    try:
        flat = checkpoint_flat(root, tag, servers, dtype)
    except CheckpointError as exc:
        raise ExportError(f"checkpoint {tag}: {exc}") from None
    if flat.size != keys.num_keys:
        raise ExportError(f"checkpoint {tag} holds {flat.size} keys, the job's model "
                          f"{keys.num_keys}")
    tensors = _named(keys, torch.from_numpy(flat))
    if run.has_tables:
        try:
            tensors.update(checkpoint_rows(root, tag, servers))
        except CheckpointError as exc:
            raise ExportError(f"checkpoint {tag}: {exc}") from None
    return write_model(out, tensors, fmt), f"checkpoint {tag} in {root}"


def checkpoint_rows(root: Path, tag: str, servers: int) -> dict[str, torch.Tensor]:
    """Each sparse table's rows in checkpoint `tag`, gathered from every shard and ordered by
    key: TABLE.keys (int64) and TABLE.rows (one row per key). They sit beside the model's
    own names, so `load_state_dict(..., strict=False)` takes the dense part and leaves them."""
    from paramserver.sparse.table import SNAPSHOT_PREFIX
    found: dict[str, tuple[list, list]] = {}
    for rank in range(servers):
        arrays, _ = load_part(root, tag, f"server-{rank}")
        for key, value in arrays.items():
            if key.startswith(SNAPSHOT_PREFIX) and key.endswith(".keys"):
                name = key[len(SNAPSHOT_PREFIX):-len(".keys")]
                rows = arrays.get(f"{SNAPSHOT_PREFIX}{name}.rows")
                if rows is None or len(rows) != len(value):
                    raise CheckpointError(f"server-{rank}: table {name!r} has {len(value)} keys "
                                          f"and no rows for them")
                found.setdefault(name, ([], []))[0].append(value)
                found[name][1].append(rows)
    out = {}
    for name, (key_parts, row_parts) in sorted(found.items()):
        keys, rows = np.concatenate(key_parts), np.concatenate(row_parts)
        order = np.argsort(keys, kind="stable")
        out[f"{name}.keys"] = torch.from_numpy(np.ascontiguousarray(keys[order]))
        out[f"{name}.rows"] = torch.from_numpy(np.ascontiguousarray(rows[order]))
    return out
