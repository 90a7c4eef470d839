"""Checkpoints on disk: numpy arrays plus a JSON manifest with checksums, written atomically.

Layout: DIR/ckpt-<tag>/<part>/{manifest.json, <name>.npy}, and DIR/LATEST naming the newest
complete checkpoint. A part (one server shard, the coordinator) is written into a temporary
folder, fsynced and renamed into place; LATEST is replaced only after every part of a
checkpoint is in, so a crash at any moment leaves the previous checkpoint intact and readable.

Reading trusts nothing: the manifest is parsed into a typed `Manifest` (a missing or ill-typed
field is named), and each array file's .npy header and size are checked against the manifest's
dtype and shape before its checksum is computed, so a truncated or reshaped file is refused at
once, naming the file and what is wrong. Loading never unpickles (`allow_pickle=False`).
`kept_tags` lists the checkpoints still on disk, newest first, for a caller that falls back to
an older one when the newest is unusable.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from paramserver.spec.job import DTYPES as _DTYPES
from paramserver.core.bounded import json_value

FORMAT = 1
MANIFEST = "manifest.json"
_MANIFEST_FIELDS = ("format", "tag", "part", "arrays", "meta")
_ARRAY_FIELDS = ("file", "sha256", "dtype", "shape")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or corrupt."""


class CheckpointWriteError(CheckpointError):
    """A part that could not be written (a full disk, a folder without write permission);
    nothing of it is left behind, and the committed checkpoints are untouched."""


# ---- the manifest, typed --------------------------------------------------------------------
@dataclass(frozen=True)
class ArrayEntry:
    """One array file of a part as its manifest describes it."""
    name: str
    file: str
    sha256: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Manifest:
    """A part's manifest.json: format, tag, part, its arrays and the writer's meta."""
    format: int
    tag: str
    part: str
    arrays: tuple[ArrayEntry, ...]
    meta: Mapping[str, Any]

    def array(self, name: str) -> ArrayEntry | None:
        return next((a for a in self.arrays if a.name == name), None)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Manifest":
        """The manifest of `data` (parsed JSON), or CheckpointError naming `where` and the
        field that is missing or of the wrong kind."""
        def bad(field: str, want: str, got: Any = None) -> CheckpointError:
            what = "is missing" if got is _MISSING else f"must be {want}, got {got!r}"
            return CheckpointError(f"{where}: manifest field {field!r} {what}")

        if not isinstance(data, dict):
            raise CheckpointError(f"{where}: the manifest is not a JSON object")
        for key in _MANIFEST_FIELDS:
            if key not in data:
                raise bad(key, "", _MISSING)
        unknown = sorted(set(data) - set(_MANIFEST_FIELDS))
        if unknown:
            raise CheckpointError(f"{where}: unknown manifest field(s) {unknown}")
        if data["format"] != FORMAT or isinstance(data["format"], bool):
            raise CheckpointError(f"{where}: unknown checkpoint format {data['format']!r} "
                                  f"(this version reads format {FORMAT})")
        for key in ("tag", "part"):
            if not isinstance(data[key], str) or not data[key]:
                raise bad(key, "a non-empty string", data[key])
        if not isinstance(data["arrays"], dict):
            raise bad("arrays", "an object of array entries", data["arrays"])
        if not isinstance(data["meta"], dict):
            raise bad("meta", "an object", data["meta"])
        arrays = tuple(_entry(name, info, bad) for name, info in data["arrays"].items())
        return cls(FORMAT, data["tag"], data["part"], arrays, data["meta"])

    def to_dict(self) -> dict:
        return {"format": self.format, "tag": self.tag, "part": self.part,
                "arrays": {a.name: {"file": a.file, "sha256": a.sha256, "dtype": str(a.dtype),
                                    "shape": list(a.shape)} for a in self.arrays},
                "meta": dict(self.meta)}


_MISSING = object()


def _entry(name: str, info: Any, bad) -> ArrayEntry:
    here = f"arrays.{name}"
    if not isinstance(info, dict):
        raise bad(here, "an object", info)
    for key in _ARRAY_FIELDS:
        if key not in info:
            raise bad(f"{here}.{key}", "", _MISSING)
    file, digest, dtype, shape = (info[k] for k in _ARRAY_FIELDS)
    # The file must sit in the part's own folder: a manifest names no path elsewhere.
    if not isinstance(file, str) or not file.endswith(".npy") or "/" in file or "\\" in file \
            or file.startswith("."):
        raise bad(f"{here}.file", "a .npy file name in the part's folder", file)
    if not isinstance(digest, str) or len(digest) != 64:
        raise bad(f"{here}.sha256", "a hex SHA-256 digest", digest)
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.hasobject or dt.fields is not None:
        raise bad(f"{here}.dtype", "a numeric dtype name", dtype)
    if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise bad(f"{here}.shape", "a list of integers >= 0", shape)
    return ArrayEntry(name, file, digest, dt, tuple(shape))



@dataclass(frozen=True)
class ShardMeta:
    """The meta of a server shard's part (store.ShardStore.snapshot plus the dedup table)."""
    version: int
    lo: int
    hi: int
    dtype: np.dtype
    updates_applied: int
    applied: tuple = ()  # the dedup table's dump (server.dedup.DedupTable.load reads it)

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any], where: str) -> "ShardMeta":
        def need(key: str, ok, want: str):
            if key not in meta:
                raise CheckpointError(f"{where}: shard meta field {key!r} is missing")
            if not ok(meta[key]):
                raise CheckpointError(f"{where}: shard meta field {key!r} must be {want}, got "
                                      f"{meta[key]!r}")
            return meta[key]

        count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
        version = need("version", count, "an integer >= 0")
        lo, hi = need("range", lambda v: isinstance(v, list) and len(v) == 2
                      and all(map(count, v)) and v[0] <= v[1], "[lo, hi] with 0 <= lo <= hi")
        dtype = need("dtype", lambda v: isinstance(v, str) and v in _DTYPES,
                     f"one of {', '.join(_DTYPES)}")
        updates = need("updates_applied", count, "an integer >= 0")
        applied = meta.get("applied", [])
        if not isinstance(applied, list):
            raise CheckpointError(f"{where}: shard meta field 'applied' must be a list, got "
                                  f"{type(applied).__name__}")
        return cls(version, lo, hi, np.dtype(dtype), updates, tuple(applied))



# ---- writing --------------------------------------------------------------------------------
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


# The coordinator's part of a checkpoint (its counters and policy state), beside server-<rank>.
COORDINATOR_PART = "coordinator"


def part_folder(root: Path, tag: str, part: str) -> Path:
    return Path(root) / f"ckpt-{tag}" / part


def write_part(root: Path, tag: str, part: str, arrays: dict[str, np.ndarray],
               meta: dict) -> Path:
    """Write one part of checkpoint `tag` atomically; returns its folder. CheckpointWriteError
    (naming the path, the space it needs and the space there is) when the disk refuses it."""
    final = part_folder(root, tag, part)
    tmp = final.parent / f".{part}.tmp-{os.getpid()}"
    try:
        return _write_part(final, tmp, tag, part, arrays, meta)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written part would only take space
        need = sum(np.asarray(a).nbytes for a in arrays.values()) + 4096
        raise CheckpointWriteError(unwritable(Path(root), tag, exc, need)) from None


def folder_problem(root: Path) -> str | None:
    """Why checkpoints cannot be written under `root` (made if missing, and a file written and
    removed there), or None when they can: asked before a job starts, so that a folder that
    cannot be written is said at once, not at the first checkpoint."""
    probe = Path(root) / f".write-test-{os.getpid()}"
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"0")
        probe.unlink()
    except OSError as exc:
        return f"{exc.filename or root}: {exc.strerror or exc}"
    return None


def unwritable(root: Path, tag: str, exc: OSError, need: int) -> str:
    """One line for a checkpoint the disk refused: where, why, the space needed and free."""
    try:
        free = f"{shutil.disk_usage(root).free / 2 ** 20:.1f} MB free there"
    except OSError:
        free = "the folder cannot be read"
    return (f"checkpoint {tag} not written to {exc.filename or root}: "
            f"{exc.strerror or exc} (it needs {need / 2 ** 20:.1f} MB, {free}); "
            f"the last committed checkpoint stays as it was")


def _write_part(final: Path, tmp: Path, tag: str, part: str, arrays: dict[str, np.ndarray],
                meta: dict) -> Path:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries = []
    for name, array in arrays.items():
        path = tmp / f"{name}.npy"
        with open(path, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        entries.append(ArrayEntry(name, path.name, _sha256(path), array.dtype,
                                  tuple(array.shape)))
    manifest = Manifest(FORMAT, tag, part, tuple(entries), meta)
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest.to_dict(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


# ---- reading --------------------------------------------------------------------------------
def read_manifest(root: Path, tag: str, part: str) -> Manifest:
    """The typed manifest of one part; CheckpointError when it is absent or malformed."""
    folder = part_folder(root, tag, part)
    path = folder / MANIFEST
    try:
        data = json_value(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {tag} has no part {part!r} ({path} is missing)") \
            from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from None
    manifest = Manifest.from_dict(data, str(path))
    if (manifest.tag, manifest.part) != (tag, part):
        raise CheckpointError(f"{path} describes part {manifest.part!r} of checkpoint "
                              f"{manifest.tag}, not {part!r} of {tag}")
    return manifest


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, offset of the data) from a .npy file's header, without reading the data."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unknown .npy version {version}")
        except (ValueError, EOFError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable .npy file ({exc})") from None
        if fortran and len(shape) > 1:
            raise CheckpointError(f"{path}: Fortran-ordered arrays are never written here")
        return tuple(shape), dtype, f.tell()


def check_file(folder: Path, entry: ArrayEntry) -> Path:
    """The array file of `entry`, checked against the manifest: present, its header's dtype
    and shape the manifest's, its size exactly what they need, its checksum the manifest's.
    The cheap checks come first, so a truncated or wrong file is refused without hashing."""
    path = folder / entry.file
    if not path.is_file():
        raise CheckpointError(f"{path} is missing (the manifest lists array {entry.name!r})")
    shape, dtype, offset = _npy_header(path)
    if dtype != entry.dtype or shape != entry.shape:
        raise CheckpointError(f"{path} holds a {dtype} array of shape {list(shape)}, the "
                              f"manifest says {entry.dtype} {list(entry.shape)}")
    size, need = path.stat().st_size, offset + entry.nbytes
    if size != need:
        what = "truncated" if size < need else "longer than its array"
        raise CheckpointError(f"{path} is {what}: {size} bytes, a {entry.dtype} array of shape "
                              f"{list(entry.shape)} needs {need}")
    if _sha256(path) != entry.sha256:
        raise CheckpointError(f"{path}: checksum mismatch (the file changed after it was "
                              f"written)")
    return path


def load_part(root: Path, tag: str, part: str) -> tuple[dict[str, np.ndarray], Manifest]:
    """Arrays and typed manifest of one part, every file checked (see check_file)."""
    folder = part_folder(root, tag, part)
    manifest = read_manifest(root, tag, part)
    arrays = {}
    for entry in manifest.arrays:
        path = check_file(folder, entry)
        try:
            arrays[entry.name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable ({exc})") from None
    return arrays, manifest


def read_part(root: Path, tag: str, part: str) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and meta of one part, every file checked (see check_file)."""
    arrays, manifest = load_part(root, tag, part)
    return arrays, dict(manifest.meta)


def verify_part(root: Path, tag: str, part: str) -> Manifest:
    """The part's manifest once every file it lists passed check_file (nothing loaded)."""
    folder = part_folder(root, tag, part)
    manifest = read_manifest(root, tag, part)
    for entry in manifest.arrays:
        check_file(folder, entry)
    return manifest


# ---- the folder's checkpoints ---------------------------------------------------------------
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
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tag or None


def _order(tag: str) -> tuple:
    # Tags are zero-padded counts; any other tag sorts after them by name.
    return (0, int(tag), "") if tag.isdigit() else (1, 0, tag)


def kept_tags(root: Path, newest: str | None = None) -> list[str]:
    """The checkpoints in `root`, newest first: `newest` (LATEST when None) and every older
    one still kept. A folder newer than LATEST was never committed and is left out."""
    root = Path(root)
    newest = latest(root) if newest is None else newest
    if newest is None:
        return []
    tags = {p.name[len("ckpt-"):] for p in root.glob("ckpt-*") if p.is_dir()}
    tags.add(newest)
    top = _order(newest)
    return sorted((t for t in tags if _order(t) <= top), key=_order, reverse=True)


def newest_usable(root: Path, check, newest: str | None = None) -> tuple[str | None, list[str]]:
    """(tag, warnings): the newest kept checkpoint (from `newest`, LATEST when None) that
    `check(tag)` accepts, and one warning for each newer one it refused, naming both it and
    the one used instead. `check` raises CheckpointError with the reason. (None, reasons) when
    no kept checkpoint is usable."""
    refused: list[tuple[str, str]] = []
    for tag in kept_tags(root, newest):
        try:
            check(tag)
        except CheckpointError as exc:
            refused.append((tag, str(exc)))
            continue
        return tag, [f"checkpoint {bad} is unusable ({why}); falling back to the previous kept "
                     f"checkpoint {tag}" for bad, why in refused]
    return None, [f"checkpoint {bad} is unusable ({why})" for bad, why in refused]
