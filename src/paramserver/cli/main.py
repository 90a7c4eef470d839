"""The `paramserver` command: builds the argument parser from the subcommand modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from paramserver.cli.parser import CommandParser

# Each module here exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
COMMAND_MODULES = (
    "paramserver.cli.advise_cmd",
    "paramserver.cli.calibrate_cmd",
    "paramserver.cli.compare_cmd",
    "paramserver.cli.demo_cmd",
    "paramserver.cli.doctor_cmd",
    "paramserver.cli.drain_cmd",
    "paramserver.cli.export_cmd",
    "paramserver.cli.keys_cmd",
    "paramserver.cli.launch_cmd",
    "paramserver.cli.report_cmd",
    "paramserver.cli.roles",
    "paramserver.cli.serve_cmd",
    "paramserver.cli.simulate_cmd",
    "paramserver.cli.task_cmd",
    "paramserver.cli.tensorboard_cmd",
    "paramserver.cli.top_cmd",
    "paramserver.cli.trace_cmd",
    "paramserver.cli.train_cmd",
    "paramserver.cli.zipline_cmd",
)


# A command given first loads only its own module: role processes are started that way by
# launchers, and `paramserver CMD --help` answers without the others' imports. No module
# here imports torch, matplotlib or the transport until its command runs
# (tests/spec/test_cli_help.py).
ROLE_COMMANDS = frozenset({"coordinator", "server", "worker", "evaluator"})
COMMANDS = {**{r: "paramserver.cli.roles" for r in ROLE_COMMANDS},
            **{m.rsplit(".", 1)[1].removesuffix("_cmd"): m for m in COMMAND_MODULES
               if m.endswith("_cmd")}}
LIGHT_COMMANDS = COMMANDS  # the name older callers knew


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = CommandParser(
        prog="paramserver",
        description="A parameter server for data-parallel deep learning on heterogeneous clusters.",
    )
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def build_parser(modules=COMMAND_MODULES) -> argparse.ArgumentParser:
    """The full parser of `modules`' commands."""
    parser, sub = _top_parser()
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def build_overview() -> argparse.ArgumentParser:
    """Every command by name and one-line help, without its options: what the top level needs
    (`paramserver --help`, no command, an unknown one), at the cost of no command's imports."""
    parser, sub = _top_parser()
    for name in COMMAND_MODULES:
        for command, line in importlib.import_module(name).SUMMARY.items():
            sub.add_parser(command, help=line)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    module = COMMANDS.get(argv[0]) if argv else None
    parser = build_parser((module,)) if module else build_overview()
    args, extra = parser.parse_known_args(argv)
    if extra:  # refused by the command's own parser, which knows its flags' names
        commands = parser._subparsers._group_actions[0].choices if parser._subparsers else {}
        # (by argv's first word: a command's own `command` option, launch's script, shadows
        # the subparsers' dest in `args`)
        target = commands.get(argv[0], parser)
        (target if isinstance(target, CommandParser) else parser).unrecognized(extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # A command that runs a job (train, launch, compare, serve, ...) ends on SIGTERM (kill, a
    # `timeout`, a scheduler's cancel) as on a Ctrl-C: what was trained and written is kept,
    # every process of the job is stopped and reaped, its temporary files go. The default
    # action ended it at once, silent, with no summary, and left its zygote's socket folder.
    # A role keeps its own meaning of SIGTERM (a drain, a preemption), as `task` (a role).
    own_term = (argv[0] in ROLE_COMMANDS or argv[0] == "task"
                or threading.current_thread() is not threading.main_thread())
    before = None if own_term else signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `paramserver ... | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
    except OSError as exc:
        if exc.filename is None:
            raise
        # A path the command could not use (a folder this user cannot write, a full disk, a
        # file gone meanwhile): the path and the reason, not a traceback.
        print(f"paramserver {argv[0]}: {exc.filename}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    raise SystemExit(main())
