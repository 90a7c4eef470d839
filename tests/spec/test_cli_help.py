"""`paramserver [COMMAND] --help` answers without loading torch, matplotlib or sklearn, and the
names the help texts list (cli/catalog.py) are the registries' names."""

import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli import catalog

ROOT = Path(__file__).resolve().parents[2]

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


def test_calibrate_and_the_readme_name_compares_rule_pairing():
    """Which policies compare runs with their own update rule is said from the policies'
    paired_rule (calibrate's help and the README said ssp and dssp; ebsp pairs too)."""
    from paramserver.cli.compare_cmd import paired_optimizers, paired_text
    from paramserver.cli.main import build_parser
    calibrate = build_parser(("paramserver.cli.calibrate_cmd",))._subparsers._group_actions[
        0].choices["calibrate"]
    words = " ".join(calibrate.format_help().split())
    assert f"pairing: {paired_text()})" in words
    pairs = paired_optimizers()
    readme = (ROOT / "README.md").read_text()
    named = ", ".join(p.upper() for p in list(pairs)[:-1]) + f" and {list(pairs)[-1].upper()}"
    assert f"({named} with `{set(pairs.values()).pop()}` unless `--optimizer`" in readme


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
