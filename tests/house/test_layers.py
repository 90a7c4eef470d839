"""Layering: the pure packages do no I/O, read no clock, start no thread, draw no unseeded random.

The pure packages (policies, update rules, compressors, predictors, the ZipLine search, the
shared vocabulary, the job spec, emulation, the simulator's core and the role cores) are driven
by events that carry the time; the live runtime and the simulator share them. The gate reads
each module's syntax tree: imports, calls of I/O builtins and file methods, and random draws
that do not take an injected generator.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "paramserver"
PURE = ["policies", "optim", "compression", "predict", "zipline", "core", "emulation", "spec",
        "sparse",
        # The coordinator and the shard server: each whole package is its role's core and
        # parts (events in, instructions out), but for the I/O side named in IO_SIDE, so a new
        # part is held to purity the moment it lands.
        "coordinator", "server",
        # advise's calibration files, beside its core: an adapter (IO_ADAPTERS) the pure
        # prediction may import.
        "advise/calibration_io.py"]
# Every folder named core/ is pure whole, wherever it sits: the simulator's (sim/core), advise's
# prediction (advise/core), what observe computes (observe/core), the report's conclusions
# (report/core), the launchers' decisions (launch/core), the worker client's bookkeeping and
# the shard map it follows (client/core), a model's key space and the evaluator's scoring
# (models/core), the batch sampler (data/core), mixed precision (training/core). A module moved
# into one, or a new core/ folder, is gated the moment it lands.
PURE += sorted(str(d.relative_to(SRC)) for d in SRC.rglob("core")
               if d.is_dir() and str(d.relative_to(SRC)) not in PURE)
# The I/O side of the pure role packages above: the nodes that turn sockets, files and
# signals into events and carry out the instructions, and the links and files they drive.
IO_SIDE = {"coordinator/node.py", "coordinator/stall_doctor.py", "server/node.py",
           "server/checkpoint.py", "server/replica_link.py", "server/reshard_link.py"}
# File readers that sit beside the pure code they feed; they may open files but not sockets.
IO_ADAPTERS = {"zipline/io.py", "emulation/trace_io.py", "advise/calibration_io.py"}
FORBIDDEN = {"zmq", "socket", "threading", "time", "subprocess", "multiprocessing", "asyncio",
             "select", "selectors", "psutil", "signal", "http", "urllib", "pickle", "os", "sys",
             "random", "logging", "datetime", "shutil", "tempfile", "faulthandler"}
# Builtins and methods that reach a file, a terminal or the interpreter's state.
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__", "breakpoint"}
FORBIDDEN_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink",
                     "rmdir", "iterdir", "rglob", "open"}
# numpy.random: only seeded generators; torch: draws only with generator=.
NUMPY_RANDOM_OK = {"default_rng", "Generator", "SeedSequence", "PCG64", "Philox"}
TORCH_DRAWS = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial",
               "rand_like", "randn_like", "randint_like", "manual_seed", "seed"}


def module_name(entry: str) -> str:
    return "paramserver." + entry.removesuffix(".py").replace("/", ".")


# A pure module inside a runtime package may import the pure modules beside it.


def pure_files():
    for entry in PURE:
        path = SRC / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            if str(f.relative_to(SRC)) not in IO_ADAPTERS | IO_SIDE:
                yield f


def is_pure(module: str) -> bool:
    """Whether `module` (paramserver.x.y) is one of the pure files or packages above."""
    parts = module.split(".")[1:]
    if "/".join(parts) + ".py" in IO_SIDE:
        return False
    return any("/".join(parts[:i]) in PURE or "/".join(parts[:i]) + ".py" in PURE
               for i in range(1, len(parts) + 1))


def imported(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def dotted(node) -> str:
    """`np.random.rand` for the callee of a call, '' when it is not a plain attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def offences(tree) -> list[str]:
    """Every I/O, clock, thread or unseeded random use in one module, as 'line: what'."""
    found = []
    for name in imported(tree):
        if name.startswith("paramserver."):
            if not is_pure(name):
                found.append(f"imports {name}, which is not pure")
        elif name.split(".")[0] in FORBIDDEN:
            found.append(f"imports {name}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee, line = dotted(node.func), node.lineno
        keywords = {k.arg for k in node.keywords}
        if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            found.append(f"{line}: calls {node.func.id}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS:
            found.append(f"{line}: calls .{node.func.attr}()")
        elif callee.startswith(("np.random.", "numpy.random.")):
            fn = callee.rsplit(".", 1)[1]
            if fn not in NUMPY_RANDOM_OK or (fn == "default_rng" and not node.args):
                found.append(f"{line}: {callee}() draws without a seeded generator")
        elif callee.startswith("torch.") and callee.rsplit(".", 1)[1] in TORCH_DRAWS:
            if "generator" not in keywords or callee.endswith(("manual_seed", ".seed")):
                found.append(f"{line}: {callee}() draws from torch's global generator")
    return found


def test_pure_modules_do_no_io():
    checked, offenders = 0, []
    for f in pure_files():
        checked += 1
        offenders += [f"{f.relative_to(SRC)}: {o}" for o in offences(ast.parse(f.read_text()))]
    assert checked >= 60, "the pure packages were not found"
    assert not offenders, "\n".join(offenders)


def test_every_core_folder_is_under_the_gate():
    """The gate finds the core/ folders by name, so a pure module moved into one is checked;
    the ones the docs name are there."""
    folders = {e for e in PURE if (SRC / e).is_dir() and e.endswith("core")}
    assert {"core", "sim/core", "advise/core", "observe/core", "report/core",
            "launch/core", "client/core", "models/core", "data/core", "training/core"} <= folders
    gated = {str(f.relative_to(SRC)) for f in pure_files()}
    assert {"sim/core/engine.py", "advise/core/recommend.py", "observe/core/stall.py",
            "client/core/worker_core.py", "client/core/reshard.py", "models/core/keyspace.py",
            "models/core/auc.py", "data/core/sampler.py", "training/core/amp.py"} <= gated


def test_wire_knows_no_sockets_and_transport_knows_no_protocol():
    for f in (SRC / "wire").rglob("*.py"):
        names = list(imported(ast.parse(f.read_text())))
        assert not [n for n in names if n.split(".")[0] in ("zmq", "socket")], f
    for f in (SRC / "transport").rglob("*.py"):
        names = list(imported(ast.parse(f.read_text())))
        assert not [n for n in names if n.startswith(("paramserver.wire", "msgpack"))], f


def test_the_checker_catches_each_kind_of_offence():
    bad = {
        "import os": "imports os",
        "import zmq": "imports zmq",
        "from paramserver.net import rpc": "imports paramserver.net, which is not pure",
        "import paramserver.server.node": "imports paramserver.server.node, which is not pure",
        "import time": "imports time",
        "import logging": "imports logging",
        "import random": "imports random",
        "f = open('x')": "calls open()",
        "print('x')": "calls print()",
        "from pathlib import Path\nPath('x').read_text()": "calls .read_text()",
        "import numpy as np\nnp.random.rand(3)": "np.random.rand() draws",
        "import numpy as np\nnp.random.default_rng()": "np.random.default_rng() draws",
        "import torch\ntorch.randn(3)": "torch.randn() draws",
        "import torch\ntorch.manual_seed(0)": "torch.manual_seed() draws",
    }
    for source, expected in bad.items():
        found = offences(ast.parse(source))
        assert any(expected in o for o in found), (source, found)
    clean = ("import numpy as np\nimport torch\nimport math\n"
             "from paramserver.server.store import ShardStore\n"
             "rng = np.random.default_rng(7)\ng = torch.Generator().manual_seed(1)\n"
             "x = torch.rand(3, generator=g)\ny = rng.normal(size=3)\n")
    assert offences(ast.parse(clean)) == []
    assert not is_pure("paramserver.net") and not is_pure("paramserver.server.node")
    assert is_pure("paramserver.server.store") and is_pure("paramserver.policies.base")
