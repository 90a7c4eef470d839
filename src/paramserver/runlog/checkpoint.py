"""Checkpoints on disk: numpy arrays plus a JSON manifest with checksums, written atomically.

Layout: DIR/ckpt-<tag>/<part>/{manifest.json, <name>.npy}, and DIR/LATEST naming the newest
complete checkpoint. A part (one server shard, the coordinator) is written into a temporary
folder, fsynced and renamed into place; LATEST is replaced only after every part of a
checkpoint is in, so a crash at any moment leaves the previous checkpoint intact and readable.
Loading never unpickles (`allow_pickle=False`) and verifies every checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupt."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_part(root: Path, tag: str, part: str, arrays: dict[str, np.ndarray],
               meta: dict) -> Path:
    """Write one part of checkpoint `tag` atomically; returns its folder."""
    final = root / f"ckpt-{tag}" / part
    tmp = final.parent / f".{part}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = {}
    for name, array in arrays.items():
        path = tmp / f"{name}.npy"
        with open(path, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        files[name] = {"file": path.name, "sha256": _sha256(path), "dtype": str(array.dtype),
                       "shape": list(array.shape)}
    manifest = {"format": FORMAT, "tag": tag, "part": part, "arrays": files, "meta": meta}
    with open(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def read_part(root: Path, tag: str, part: str) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and meta of one part, every checksum verified."""
    folder = root / f"ckpt-{tag}" / part
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint part {folder} is unreadable: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder}: unknown checkpoint format {manifest.get('format')!r}")
    arrays = {}
    for name, info in manifest["arrays"].items():
        path = folder / info["file"]
        if not path.is_file() or _sha256(path) != info["sha256"]:
            raise CheckpointError(f"{path}: missing or checksum mismatch")
        arrays[name] = np.load(path, allow_pickle=False)
    return arrays, manifest["meta"]


def commit(root: Path, tag: str, keep: int = 2) -> None:
    """Point LATEST at `tag` (atomically) and drop all but the newest `keep` checkpoints."""
    tmp = root / f".LATEST.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / "LATEST")
    _fsync_dir(root)
    tags = sorted((p for p in root.glob("ckpt-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in tags[:-keep]:
        if old.name != f"ckpt-{tag}":
            shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> str | None:
    """The tag of the newest complete checkpoint, or None."""
    try:
        tag = (root / "LATEST").read_text().strip()
    except FileNotFoundError:
        return None
    return tag or None
