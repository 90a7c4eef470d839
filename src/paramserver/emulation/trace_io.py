"""The file reader that the edges (command line, worker, simulator) hand the pure straggler
parser for trace:FILE terms."""

from __future__ import annotations

from pathlib import Path


def read_trace(path: str) -> str:
    """The text of a trace file; OSError when it cannot be read (the parser names the spec)."""
    return Path(path).read_text()
