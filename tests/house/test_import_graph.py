"""The package import graph, every import counted (inside functions too): no cycles, and the
arrows docs/architecture.md ("Packages") states."""

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "paramserver"
ROLES = {"coordinator", "server", "client", "training"}
PURE_PACKAGES = {"core", "sparse", "compression", "emulation", "optim", "predict", "zipline",
                 "policies", "spec"}


def package_edges(root: Path = SRC) -> dict[str, dict[str, list[str]]]:
    """package -> {imported package: ["file:line", ...]} over every import statement."""
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "paramserver" and len(parts) > 1 and parts[1] in packages \
                        and parts[1] != rel.parts[0]:
                    edges[rel.parts[0]][parts[1]].append(f"{rel}:{node.lineno}")
    return edges


def find_cycle(edges) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(p):
        state[p] = 1
        stack.append(p)
        for q in edges.get(p, {}):
            if state.get(q) == 1:
                return stack[stack.index(q):] + [q]
            if q not in state:
                found = visit(q)
                if found:
                    return found
        state[p] = 2
        stack.pop()
        return None
    for p in list(edges):
        if p not in state:
            found = visit(p)
            if found:
                return found
    return None


def test_no_package_imports_itself_back():
    edges = package_edges()
    cycle = find_cycle(edges)
    if cycle:
        where = [f"{a} -> {b} ({edges[a][b][0]})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("package cycle: " + "; ".join(where))


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    for pkg, body in (("a", "from paramserver.b import x\n"),
                      ("b", "def f():\n    from paramserver.a import y\n")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "m.py").write_text(body)
    assert find_cycle(package_edges(tmp_path)) in (["a", "b", "a"], ["b", "a", "b"])


def test_the_arrows_the_docs_state():
    edges = package_edges()
    offences = []

    def refuse(pkg, targets, why):
        for t in sorted(set(edges.get(pkg, {})) & set(targets)):
            offences.append(f"{pkg} -> {t} ({edges[pkg][t][0]}): {why}")
    for pkg in edges:
        refuse(pkg, {"cli"}, "cli is the top: nothing imports it")
    for pkg in PURE_PACKAGES:
        refuse(pkg, set(edges) - PURE_PACKAGES, "a pure package imports only pure ones")
    refuse("wire", {"transport", "net"}, "wire knows no sockets")
    refuse("transport", {"wire", "net"}, "transport knows no protocol")
    for role in ROLES:
        others = ROLES - {role} - ({"client"} if role == "training" else set())
        refuse(role, others | {"launch", "sim", "report", "advise"},
               "a role reaches another only through messages")
    refuse("sim", ROLES - {"server"}, "the simulator runs no role")
    assert not offences, "\n".join(offences)
    # The simulator borrows one module of a role: the shard's store, which is pure.
    assert {f.split(":")[0] for f in edges["sim"].get("server", [])} <= {"sim/train.py"}


def test_no_test_module_imports_another():
    """Shared builders, waits and texts live in tests/ps_helpers.py: a test module that
    imports another runs that module's tests' imports (and fixtures) by accident."""
    tests = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders
