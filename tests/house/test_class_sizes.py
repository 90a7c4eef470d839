"""A class owns one piece of state: none in src grows past 30 methods or 600 lines. A class
that would is doing several jobs; the fix is a part it composes (client/kv.py's KVWorker hands
requests to DenseRequests, RowTables and Completion), not a longer class."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "paramserver"
MAX_METHODS, MAX_LINES = 30, 600


def oversized(tree: ast.AST, where: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
        lines = node.end_lineno - node.lineno + 1
        if methods > MAX_METHODS or lines > MAX_LINES:
            found.append(f"{where}:{node.name}: {methods} methods, {lines} lines")
    return found


def test_no_class_in_src_is_over_the_limits():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 200, "the sources were not found"
    found = [o for f in files
             for o in oversized(ast.parse(f.read_text()), str(f.relative_to(SRC)))]
    assert not found, "\n".join(found)


def test_the_checker_counts_methods_and_lines():
    many = "class A:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(31))
    long = "class B:\n    x = 1\n" + "    y = 2\n" * 600
    fits = "class C:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(30))
    assert oversized(ast.parse(many), "f") == ["f:A: 31 methods, 63 lines"]
    assert oversized(ast.parse(long), "f") == ["f:B: 0 methods, 602 lines"]
    assert oversized(ast.parse(fits), "f") == []


def test_only_spec_reads_a_job_dict_by_key():
    """Roles and offline readers read the typed JobSpec (or RunJob), never the raw dict: one
    place owns each field's name, default and check."""
    import re
    raw = re.compile(r"\bjob(?:_dict)?\[[\"']|\bjob(?:_dict)?\.get\(")
    found = [f"{f.relative_to(SRC)}:{n}" for f in sorted(SRC.rglob("*.py"))
             if f.relative_to(SRC).parts[0] != "spec"
             for n, line in enumerate(f.read_text().splitlines(), 1) if raw.search(line)]
    assert not found, found
