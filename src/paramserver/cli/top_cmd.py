"""`paramserver top RUN_DIR|ADDRESS`: a live terminal view of a running job, or a replay."""

from __future__ import annotations

import sys

SUMMARY = {"top": "a live per-worker view of a running job (run folder or coordinator address)"}

# Rows of workers drawn at most; beyond it the flagged and costliest are shown.
MAX_WORKERS = 32


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "top", help=SUMMARY["top"],
        description="Watch a job: per worker its step, samples/s, batch, staleness and the split "
                    "of its steps into data, compute, push, wait and pull; min/median/max across "
                    "workers; slow workers flagged chronic or transient; the seconds the others "
                    "lost waiting for each; per shard its apply time and queue. TARGET is a run "
                    "folder (followed as metrics.jsonl grows; --replay plays a finished one) or "
                    "the coordinator's join address tcp://HOST:PORT (asked as a read-only "
                    "observer: it never registers, pushes or clocks). Quit with q or Ctrl-C; "
                    "without a terminal on stdin it ends when the run does.")
    p.add_argument("target", metavar="RUN_DIR|ADDRESS",
                   help="a run folder, or a coordinator address tcp://HOST:PORT")
    p.add_argument("--replay", action="store_true",
                   help="play a finished run folder back at --speed")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="replay speed factor: 2 plays twice as fast, 0 all at once (default 1)")
    p.add_argument("--once", action="store_true",
                   help="print one frame and exit (a replay: the frame at its end)")
    p.add_argument("--refresh", type=float, default=4.0, metavar="HZ",
                   help="screen refreshes per second (default 4)")
    p.add_argument("--window", type=int, default=16, metavar="STEPS",
                   help="the steps per worker the statistics and the slow-worker flags look at "
                        "(default 16)")
    p.add_argument("--slow-factor", type=float, default=1.5, metavar="X",
                   help="a step is slow when its work per sample exceeds X times the median of "
                        "the other workers' (default 1.5)")
    p.add_argument("--keys", metavar="DIR",
                   help="with an address: the job's key folder (default $PARAMSERVER_KEYS; a "
                        "local `train` job's is RUN/keys); its observer key pair is used")
    p.add_argument("--width", type=int, metavar="COLS",
                   help="draw this many columns wide (default: the terminal's)")
    p.set_defaults(func=run)


def run(args) -> int:
    from paramserver.observe.source import SourceError, open_source
    from paramserver.observe.core.stats import JobStats, SlowSettings

    if args.refresh <= 0:
        print("paramserver top: --refresh must be > 0", file=sys.stderr)
        return 2
    try:
        window = args.window
        settings = SlowSettings(window=window, slow_factor=args.slow_factor,
                                chronic_min=max(1, round(window * 0.75)),
                                chronic_keep=max(1, window // 2),
                                transient_min=min(2, window),
                                clear_after=max(1, min(6, window // 2)))
        source = open_source(args.target, args.replay, args.speed, _keys(args))
    except (SourceError, ValueError) as exc:
        print(f"paramserver top: {exc}", file=sys.stderr)
        return 2
    try:
        stats = JobStats(source.round_mode, settings)
        if args.once:
            return _once(source, stats, args)
        return _live(source, stats, args)
    except SourceError as exc:
        print(f"paramserver top: {exc}", file=sys.stderr)
        return 1
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _keys(args):
    """The observer's CURVE keys for an address target: --keys or $PARAMSERVER_KEYS."""
    import os

    if not args.target.startswith(("tcp://", "ipc://")):
        return None
    from paramserver.transport import security

    directory = args.keys or os.environ.get(security.ENV)
    return security.load(directory, "observer") if directory else None


def _frame(source, stats, finished: bool, width: int | None = None):
    from paramserver.observe.view import Header, render

    note = ""
    if getattr(source, "silent_since", None) is not None:
        note = (f"no answer from {source.address} yet: is the job running, and are these its "
                f"keys (--keys DIR)?")
    head = Header(source.describe, source.label, finished, source.members, source.preflight(),
                  note)
    return render(stats.snapshot(), head, MAX_WORKERS, width)


def _feed(source, stats, now: float) -> None:
    for record in source.poll(now):
        stats.add(record)
    if stats.round_mode != source.round_mode:  # an observer learns the policy on first reply
        stats.round_mode = stats.ledger.round_mode = source.round_mode


def _console(args):
    from rich.console import Console

    return Console(width=args.width) if args.width else Console()


def _once(source, stats, args) -> int:
    if args.replay:
        source.speed = 0  # the frame at the end
    _feed(source, stats, 0.0)
    if source.finished:
        stats.finish()
    console = _console(args)
    console.print(_frame(source, stats, source.finished, console.width))
    return 0


def _live(source, stats, args) -> int:
    import time

    from rich.live import Live

    console = _console(args)
    period = 1.0 / args.refresh
    t0 = time.monotonic()
    finished_shown = False
    with KeyReader(sys.stdin) as keys, Live(
            _frame(source, stats, False, console.width), console=console, screen=True,
            transient=False, auto_refresh=True, refresh_per_second=args.refresh,
            redirect_stdout=False, redirect_stderr=False) as live:
        try:
            while True:
                _feed(source, stats, time.monotonic() - t0)
                if source.finished and not finished_shown:
                    stats.finish()
                    finished_shown = True
                live.update(_frame(source, stats, source.finished, console.width))
                if finished_shown and not keys.interactive:
                    break  # nobody can press q (a pipe, a script): the run's end ends the view
                if keys.wait_for_quit(period):
                    break
        except KeyboardInterrupt:
            pass
    # The last frame stays on the normal screen once the full-screen view is gone.
    console.print(_frame(source, stats, source.finished, console.width))
    return 0


class KeyReader:
    """The terminal's keys without blocking: the tty in cbreak mode (no echo, no line buffer)
    while the view runs, restored on exit; without a tty (a pipe, a test) only time passes."""

    def __init__(self, stream):
        self.stream = stream
        self.fd = None
        self.saved = None

    def __enter__(self) -> "KeyReader":
        try:
            if self.stream.isatty():
                import termios
                import tty

                self.fd = self.stream.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (OSError, ValueError, AttributeError):
            self.fd = self.saved = None
        return self

    @property
    def interactive(self) -> bool:
        """Whether a key can quit the view (a terminal on stdin)."""
        return self.fd is not None

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def wait_for_quit(self, timeout: float) -> bool:
        """Wait up to `timeout` s; True when q (or Q) was pressed."""
        import select
        import time

        if self.fd is None:
            time.sleep(timeout)
            return False
        import os

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return False
            data = os.read(self.fd, 64)
            if not data or b"q" in data.lower():
                return True
