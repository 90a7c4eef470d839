"""The policy registry is the one list of policies: what the report, advise and compare ask of a
policy (apply mode, bounded staleness, the paired update rule, advise's option grid, colour and
order) comes from the policy classes, and no other module keeps its own list of names."""

import ast
from pathlib import Path

from paramserver.advise.core.recommend import default_candidates
from paramserver.cli.compare_cmd import paired_optimizers
from paramserver.optim import UPDATE_RULES
from paramserver.policies import SYNC_POLICIES, SyncPolicy
from paramserver.report.core import diagnose
from paramserver.report.collect import KNOWN_ORDER
from paramserver.report.series import policy_color

SRC = Path(__file__).resolve().parents[2] / "src" / "paramserver"
# The registry itself, and the help texts' copy that tests/spec/test_cli_help.py holds equal to it.
ALLOWED = {SRC / "cli" / "catalog.py"}


def literal_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    else:
        return set()
    return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def test_no_module_keeps_its_own_list_of_policies():
    names = set(SYNC_POLICIES.names())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path in ALLOWED or path.parent.name == "policies":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            hit = literal_names(node) & names
            if len(hit) >= 2:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(hit)}")
    assert not found, "lists of policy names outside the registry: " + "; ".join(found)


def test_the_checker_sees_a_list_and_a_dict_of_names():
    tree = ast.parse('X = ("bsp", "asp")\nY = {"ssp": 1, "dssp": 2}\nZ = ("bsp",)')
    hits = [literal_names(n) for n in ast.walk(tree) if literal_names(n)]
    assert {"bsp", "asp"} in hits and {"ssp", "dssp"} in hits and {"bsp"} in hits


class _Toy(SyncPolicy):
    """A policy registered for the length of one test: every tool must see it."""

    name = "toy"
    apply_mode = "round"
    bounded = True
    paired_rule = "consgd"
    advise_options = ((("k", 1),), (("k", 2),))


def test_a_new_policy_reaches_every_tool_through_its_class(monkeypatch):
    monkeypatch.setitem(SYNC_POLICIES._entries, "toy", _Toy)  # registered for this test only
    assert "toy" in SYNC_POLICIES.names()
    assert paired_optimizers()["toy"] == "consgd"
    assert [c.label for c in default_candidates(["toy"])] == ["toy(k=1)", "toy(k=2)"]
    assert diagnose._bounded("toy") and not diagnose._arrival("toy")
    assert policy_color("toy") not in {policy_color(n) for n in SYNC_POLICIES.names()
                                       if n != "toy"}


def test_what_the_tools_read_is_what_the_policies_say():
    assert paired_optimizers() == {n: SYNC_POLICIES.get(n).paired_rule
                                   for n in SYNC_POLICIES.names()
                                   if SYNC_POLICIES.get(n).paired_rule}
    assert KNOWN_ORDER == tuple(SYNC_POLICIES.names()) and "dssp" in KNOWN_ORDER
    for name in SYNC_POLICIES.names():
        cls = SYNC_POLICIES.get(name)
        assert diagnose._arrival(name) == (cls.apply_mode == "arrival")
        assert diagnose._bounded(name) == cls.bounded
    assert {n for n in UPDATE_RULES.names() if diagnose._aware(n)} == {
        "consgd", "dynsgd", "staleness-aware"}
    assert not diagnose._aware(None) and not diagnose._arrival("single")
    colors = [policy_color(n) for n in SYNC_POLICIES.names()]
    assert len(set(colors)) == len(colors)  # every registered policy its own colour
    assert policy_color("bsp") == "#1f77b4"  # unchanged from the reports already written
