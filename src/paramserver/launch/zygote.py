"""A job's own role processes forked from a zygote that has imported torch and paramserver once.

Every role process (coordinator, server, worker, evaluator) of a local job used to start as
`python -m paramserver ROLE`, and each import of torch costs about 1.2 s of CPU here: a 4-worker
job's start spent most of its 15 CPU seconds importing the same modules 7 times. The zygote is
multiprocessing's forkserver with those modules preloaded: a role is a fork of it, its own
process from the first instruction (its own pid, log, environment, working folder and process
group), running the same `paramserver ROLE ...` entry point. Its parent is the zygote, which
exits when the launcher does; each child dies with the zygote (PR_SET_PDEATHSIG), so nothing
outlives the launcher. The launcher talks to the zygote over a local socketpair (multiprocessing
sends it the role's argv, environment and paths); no role's traffic passes through it.

`PARAMSERVER_FORK=0` starts every role as its own interpreter instead (as a user's script is).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

ENV = "PARAMSERVER_FORK"
# What every role imports on its way up: torch (most of the time), numpy, pyzmq and the roles.
PRELOAD = ["numpy", "torch", "zmq", "paramserver.cli.main", "paramserver.cli.roles",
           "paramserver.coordinator.node", "paramserver.server.node",
           "paramserver.training.worker", "paramserver.training.evaluator",
           "paramserver.training.train_task"]

_context = None


def enabled() -> bool:
    return os.environ.get(ENV, "1").lower() not in ("0", "off", "no", "false")


def warm() -> None:
    """Start the zygote now, so its imports overlap the launcher's own work (checking the job,
    sizing the model); the first role forked waits for them to end."""
    if enabled():
        _zygote()
        _ensure_running()


def _ensure_running() -> None:
    """Start the zygote if it is not running, deaf to SIGINT and SIGTERM from birth (ignored
    dispositions survive its exec), as multiprocessing's resource tracker is: it shares the
    launcher's process group, so a Ctrl-C at the terminal reaches it too, and during its
    preload (seconds of importing torch) it would die of a KeyboardInterrupt printed as a
    traceback, or of a SIGTERM, taking the forked roles with it before the launcher has saved
    what they trained. It ends when the launcher does (its pipe from the launcher closes)."""
    from multiprocessing import forkserver
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()  # (only the main thread may change a disposition)
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        forkserver.ensure_running()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _zygote():
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _role_main(argv: list[str], env: dict, cwd: str, log_path: str, prepare) -> None:
    """The forked child: become the role's own process, then run `paramserver ROLE ...`."""
    prepare()  # dies with its parent, leaves the terminal's process group (launch/local.py)
    # multiprocessing hands every child the write end of the zygote's "alive" pipe, and the
    # zygote ends only once every holder of it has: a role holding it kept the zygote of a
    # SIGKILLed launcher up, and so itself (it dies with the zygote), the job training on.
    from multiprocessing import forkserver
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (the zygote ignores both)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 1
    try:
        # What `python -m paramserver ROLE ...` runs, run as that program (not imported from
        # here: the command line sits above the launcher).
        sys.argv = ["paramserver", *argv]
        runpy.run_module("paramserver", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - an exception a role did not catch: its log says it
        import traceback
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(int(code or 0))


@contextlib.contextmanager
def _no_main_module():
    """multiprocessing has each child import the parent's __main__ again (a script's top level,
    or its module run with -m) before the target runs. A role runs `paramserver ROLE`, not the
    launcher's script (which may be a `python -c`, stdin, or a script with no main guard), so
    while a role starts the launcher shows it no main module."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class ForkedRole:
    """A role forked from the zygote, with the part of subprocess.Popen's surface the launcher
    uses (pid, poll, wait, returncode, send_signal, terminate, kill)."""

    stdout = None

    def __init__(self, argv: list[str], env: dict, log_path: Path, prepare):
        _zygote()
        _ensure_running()
        self._proc = _zygote().Process(
            target=_role_main, args=(list(argv), dict(env), os.getcwd(), str(log_path),
                                     prepare),
            daemon=True, name=f"paramserver {argv[0]}")
        with _no_main_module():
            self._proc.start()
        self.pid = self._proc.pid
        self.args = argv

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
