"""`paramserver [COMMAND] --help` answers without loading torch, matplotlib or sklearn, and the
names the help texts list (cli/catalog.py) are the registries' names."""

import subprocess
import sys

import pytest

from paramserver.cli import catalog

COMMANDS = ["", "advise", "coordinator", "server", "worker", "evaluator", "train", "compare", "simulate",
            "launch", "report", "zipline", "keys", "demo", "calibrate", "serve", "trace",
            "top"]
HEAVY = ("torch", "matplotlib", "sklearn")
# Imports the CLI, asks for help, and prints which heavy modules the answer loaded.
RUNNER = """
import sys
from paramserver.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("loaded:" + ",".join(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_no_heavy_module(command):
    argv = [command, "--help"] if command else ["--help"]
    run = subprocess.run([sys.executable, "-c", RUNNER.format(heavy=HEAVY), *argv],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert "usage: paramserver" in run.stdout
    assert last == "loaded:", f"`paramserver {' '.join(argv)} imported {last}"


def test_the_catalog_names_what_the_registries_hold():
    from paramserver.compression import COMPRESSORS
    from paramserver.compression.ranges import HELP as RANGE_HELP
    from paramserver.data import DATASETS
    from paramserver.models import MODELS
    from paramserver.optim import UPDATE_RULES
    from paramserver.policies import SYNC_POLICIES
    from paramserver.predict import PREDICTORS
    from paramserver.transport.security import ROLES
    from paramserver.zipline import DEFAULT_VARIANT, VARIANTS
    assert catalog.SYNC_POLICIES == tuple(SYNC_POLICIES.names())
    assert catalog.MODELS == tuple(MODELS.names())
    assert catalog.DATASETS == tuple(DATASETS.names())
    assert catalog.COMPRESSORS == tuple(COMPRESSORS.names())
    assert catalog.UPDATE_RULES == tuple(UPDATE_RULES.names())
    assert catalog.PREDICTORS == tuple(PREDICTORS)
    assert catalog.ZIPLINE_VARIANTS == tuple(VARIANTS)
    assert catalog.ZIPLINE_DEFAULT == DEFAULT_VARIANT
    assert catalog.KEY_ROLES == tuple(ROLES)
    assert catalog.PUSH_RANGE_HELP == RANGE_HELP
    # The help's word on auto names its default candidates, in their order.
    from paramserver.policies.auto import AutoOptions
    names = ", ".join(AutoOptions().names())
    assert f"auto switches among {names.rsplit(', ', 1)[0]} and {names.rsplit(', ', 1)[1]} " \
        in catalog.AUTO_HELP


def test_the_overview_lists_every_command_the_full_parser_has():
    from paramserver.cli.main import COMMANDS, build_overview, build_parser

    def commands(parser):
        sub = next(a for a in parser._actions if a.dest == "command")
        return {name: p.description or "" for name, p in sub.choices.items()}, [
            (c.dest, c.help) for c in sub._choices_actions]

    _, overview = commands(build_overview())
    _, full = commands(build_parser())
    assert overview == full
    assert sorted(COMMANDS) == sorted(name for name, _ in full)
