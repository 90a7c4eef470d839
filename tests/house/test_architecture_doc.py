"""docs/architecture.md against the code: the events and instructions it lists for each role
core are those the code has (and the core handles every event listed), and every part its
tables name is a class in the file named beside it, and every part that takes events has a row."""

import ast
import re
from pathlib import Path

import pytest

from paramserver.coordinator.state import CoordinatorState
from paramserver.server.core import ShardCore
from paramserver.server.events import ShardSettings
from ps_helpers import job_of

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SRC = ROOT / "src" / "paramserver"
ITEM = re.compile(r"\s*`(\w+)`(?:\s*\([^)]*\))?\s*([,.])")
# Classes of an events module that are neither (the shard's settings, a restore's source).
NOT_MESSAGES = {"server/events.py": {"ShardSettings", "RestoreFrom"}}


def listed(kind: str, path: str) -> list[str]:
    """The names after "Events (`path`):" (or Instructions) up to the list's full stop."""
    at = DOC.index(f"{kind} (`{path}`):") + len(f"{kind} (`{path}`):")
    names = []
    while True:
        m = ITEM.match(DOC, at)
        assert m, f"the {kind} list of {path} in docs/architecture.md does not parse at " \
                  f"{DOC[at:at + 40]!r}"
        names.append(m.group(1))
        at = m.end()
        if m.group(2) == ".":
            return names


def classes(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


@pytest.mark.parametrize("path", ["coordinator/events.py", "server/events.py"])
def test_the_event_and_instruction_lists_are_the_modules(path):
    events, instructions = listed("Events", path), listed("Instructions", path)
    assert not set(events) & set(instructions)
    documented = set(events) | set(instructions)
    assert documented == classes(SRC / path) - NOT_MESSAGES.get(path, set())


def test_each_core_handles_exactly_the_events_listed():
    coordinator = CoordinatorState(job_of())
    assert {c.__name__ for c in coordinator._handlers} == set(
        listed("Events", "coordinator/events.py"))
    shard = ShardCore(ShardSettings(rank=0, lo=0, hi=4, dtype="float32",
                                    apply_mode="arrival", optimizer="sgd", lr=0.1))
    assert {c.__name__ for c in shard._handlers} == set(listed("Events", "server/events.py"))


def parts_rows() -> list[tuple[str, str]]:
    """(names, files) of every row of the "| part | file | owns |" tables."""
    rows = []
    for table in DOC.split("| part | file | owns |\n|---|---|---|\n")[1:]:
        for line in table.splitlines():
            if not line.startswith("| "):
                break
            names, files = line.split(" | ")[:2]
            rows.append((names, files))
    return rows


def test_every_part_in_the_tables_is_a_class_of_the_file_named():
    rows = parts_rows()
    assert len(rows) >= 20, "the parts tables were not found"
    for names, files in rows:
        defined = set().union(*(classes(SRC / f) for f in re.findall(r"`([\w/]+\.py)`", files)))
        for name in re.findall(r"`(\w+)`", names):
            assert name in defined, f"{name} is no class of {files}"


def test_every_part_that_takes_events_is_in_a_parts_table():
    """The reverse: each object whose handlers a role core merges (a part that takes events)
    has a row, so a new part cannot land unlisted."""
    named = {n for names, _ in parts_rows() for n in re.findall(r"`(\w+)`", names)}
    coordinator = CoordinatorState(job_of())
    shard = ShardCore(ShardSettings(rank=0, lo=0, hi=4, dtype="float32",
                                    apply_mode="arrival", optimizer="sgd", lr=0.1))
    for core in (coordinator, shard):
        owners = {type(h.__self__).__name__ for h in core._handlers.values()
                  if hasattr(h, "__self__") and h.__self__ is not core}
        assert owners, f"no parts found in {type(core).__name__}"
        assert owners <= named, f"parts missing from the tables: {sorted(owners - named)}"
