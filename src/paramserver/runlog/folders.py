"""Which folders are runs: a command that reads one run (export, trace, top, advise, ...) given
a folder that holds several (a compare's or calibrate's output) names some of them."""

from __future__ import annotations

import os
from pathlib import Path

MARKERS = ("metrics.jsonl", "events.jsonl")
DEPTH = 4  # compare's layout: OUT/runs/SCENARIO/POLICY/rep-K
VISITS = 2000  # folders looked into at most: a hint, not a search of the disk


def runs_inside(folder: Path, limit: int = 3) -> tuple[list[Path], int]:
    """(up to `limit` run folders under `folder`, in name order, and how many there are),
    looking DEPTH levels down and into VISITS folders at most; a run's own subfolders are not
    searched."""
    found: list[Path] = []
    top = len(Path(folder).parts)
    for visits, (here, dirs, files) in enumerate(os.walk(folder)):
        if visits >= VISITS:
            break
        if any(m in files for m in MARKERS):
            if Path(here) == Path(folder):
                return [], 0  # a run: its subfolders are its own, not runs beside it
            found.append(Path(here))
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if len(Path(here, d).parts) - top <= DEPTH)
    found.sort()
    return found[:limit], len(found)


def runs_hint(folder: Path) -> str:
    """'; it holds N runs (A, B, ...): give one of them', or '' when it holds none."""
    if not Path(folder).is_dir():
        return ""
    some, count = runs_inside(Path(folder))
    if not count:
        return ""
    more = ", ..." if count > len(some) else ""
    return (f"; it holds {count} run{'s' if count > 1 else ''} "
            f"({', '.join(map(str, some))}{more}): give one of them")
