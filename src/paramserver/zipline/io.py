"""Read push times from files: `WORKER:t1,t2,...,` history text, CSV (one row per worker) or .npy."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_INT = re.compile(r"[+-]?\d+\Z")


class TimesFileError(ValueError):
    """A file that cannot be read as push times; the message names the file and the line."""


@dataclass(frozen=True)
class TimesFile:
    """Rows of push times in worker order, the worker ids they belong to, and the format read."""

    rows: list[np.ndarray]
    worker_ids: list[int]
    fmt: str


def _numbers(cells: list[str], where: str) -> np.ndarray:
    cells = [c.strip() for c in cells]
    cells = [c for c in cells if c]
    if not cells:
        raise TimesFileError(f"{where}: no push times")
    # Integers stay int64 so that millisecond timestamps and their differences are exact.
    if all(_INT.match(c) for c in cells):
        try:
            return np.array([int(c) for c in cells], dtype=np.int64)
        except OverflowError:
            raise TimesFileError(f"{where}: integer out of int64 range") from None
    try:
        return np.array([float(c) for c in cells], dtype=np.float64)
    except ValueError:
        bad = next(c for c in cells if not _is_float(c))
        raise TimesFileError(f"{where}: not a number: {bad!r}") from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _content_lines(text: str) -> list[tuple[int, str]]:
    return [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)
            if ln.strip() and not ln.lstrip().startswith("#")]


def _parse_history(path: Path, lines: list[tuple[int, str]]) -> TimesFile:
    by_id: dict[int, np.ndarray] = {}
    for no, line in lines:
        head, sep, rest = line.partition(":")
        if not sep or not _INT.match(head.strip()):
            raise TimesFileError(f"{path}:{no}: expected 'WORKER:t1,t2,...', got {line[:40]!r}")
        wid = int(head)
        if wid in by_id:
            raise TimesFileError(f"{path}:{no}: worker {wid} appears twice")
        by_id[wid] = _numbers(rest.split(","), f"{path}:{no}")
    ids = sorted(by_id)
    return TimesFile(rows=[by_id[i] for i in ids], worker_ids=ids, fmt="history")


def _parse_csv(path: Path, lines: list[tuple[int, str]]) -> TimesFile:
    # A first line that is not all numbers is a header.
    if lines and not all(_is_float(c) for c in lines[0][1].split(",") if c.strip()):
        lines = lines[1:]
    rows = [_numbers(line.split(","), f"{path}:{no}") for no, line in lines]
    return TimesFile(rows=rows, worker_ids=list(range(len(rows))), fmt="csv")


def _read_npy(path: Path) -> TimesFile:
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise TimesFileError(f"{path}: not a readable .npy array ({exc})") from None
    if arr.ndim != 2 or arr.dtype.kind not in "iuf":
        raise TimesFileError(
            f"{path}: expected a 2-D numeric array (workers x times), got {arr.dtype} {arr.shape}")
    return TimesFile(rows=list(arr), worker_ids=list(range(arr.shape[0])), fmt="npy")


def read_times(path: str | Path) -> TimesFile:
    """Read a times file; the format comes from the suffix (.npy) or the content (':' = history)."""
    path = Path(path)
    if not path.is_file():
        raise TimesFileError(f"{path}: no such file")
    if path.suffix.lower() == ".npy":
        return _read_npy(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TimesFileError(f"{path}: cannot read as text ({exc})") from None
    lines = _content_lines(text)
    if not lines:
        raise TimesFileError(f"{path}: empty file")
    if ":" in lines[0][1]:
        return _parse_history(path, lines)
    return _parse_csv(path, lines)
