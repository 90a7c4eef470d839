"""Layering: pure modules (policies, optim, compression, predict, zipline search, config) do no I/O."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "paramserver"
PURE = ["policies", "optim", "compression", "predict", "zipline", "core", "emulation",
        "client/core.py"]
# File readers that sit beside the pure code they feed; they may open files but not sockets.
IO_ADAPTERS = {"zipline/io.py"}
FORBIDDEN = {"zmq", "socket", "threading", "time", "subprocess", "multiprocessing", "asyncio",
             "select", "selectors", "psutil", "signal", "http", "urllib", "pickle"}
# The live runtime's packages: nothing pure may reach into them.
RUNTIME = ("paramserver.coordinator", "paramserver.server", "paramserver.client",
           "paramserver.launch", "paramserver.net", "paramserver.training")
FORBIDDEN_INTERNAL = RUNTIME + ("paramserver.transport", "paramserver.cli", "paramserver.wire",
                                "paramserver.sim")


def pure_files():
    for entry in PURE:
        path = SRC / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            if str(f.relative_to(SRC)) not in IO_ADAPTERS:
                yield f


def imported(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_pure_modules_import_no_io():
    checked, offenders = 0, []
    for f in pure_files():
        checked += 1
        for name in imported(ast.parse(f.read_text())):
            top = name.split(".")[0]
            if top in FORBIDDEN or name.startswith(FORBIDDEN_INTERNAL):
                offenders.append(f"{f.relative_to(SRC)} imports {name}")
    assert checked >= 8, "the pure packages were not found"
    assert not offenders, "\n".join(offenders)


def test_wire_knows_no_sockets_and_transport_knows_no_protocol():
    for f in (SRC / "wire").rglob("*.py"):
        names = list(imported(ast.parse(f.read_text())))
        assert not [n for n in names if n.split(".")[0] in ("zmq", "socket")], f
    for f in (SRC / "transport").rglob("*.py"):
        names = list(imported(ast.parse(f.read_text())))
        assert not [n for n in names if n.startswith(("paramserver.wire", "msgpack"))], f


def test_the_checker_catches_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport zmq\nfrom paramserver.net import rpc\n")
    names = list(imported(ast.parse(bad.read_text())))
    assert "zmq" in names and "paramserver.net" in names
