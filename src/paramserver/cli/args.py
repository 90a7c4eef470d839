"""argparse `type=` for every flag grammar: each value is parsed once, here, into a typed value.

A bad value fails as argparse fails, naming the flag: `argument --link: cannot read ...`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable

from paramserver.core import endpoints, units
from paramserver.core.keyspace import AUTO_SERVERS
from paramserver.emulation.device_time import DeviceTime, parse_device_time
from paramserver.emulation.links import LinkTable
from paramserver.emulation.stragglers import ParsedStraggler
from paramserver.emulation.trace_io import read_trace


def _typed(fn: Callable, name: str) -> Callable:
    """`fn` with its ValueError shown verbatim by argparse (and its name in usage errors)."""
    def parse(text: str):
        try:
            return fn(text)
        except argparse.ArgumentTypeError:
            raise
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = name
    return parse


def _option(text: str) -> tuple[str, object]:
    """KEY=VALUE with the value read as JSON when it is a number, true, false or null."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{text!r} is not KEY=VALUE")
    return key.strip(), option_value(raw)


def option_value(raw: str):
    """'3' -> 3, '0.5' -> 0.5, 'true' -> True, 'null' -> None; anything else stays text."""
    low = raw.strip().lower()
    if low in ("true", "false", "null"):
        return json.loads(low)
    try:
        float(raw)
    except ValueError:
        return raw
    try:
        return json.loads(raw)  # keeps 3 an int
    except ValueError:
        return float(raw)  # 5., inf


def parse_options(pairs, what: str) -> dict:
    """KEY=VALUE texts into a dict (for grammars that hold several pairs in one value)."""
    out = {}
    for pair in pairs or []:
        try:
            key, value = _option(pair)
        except ValueError:
            raise ValueError(f"{what} option {pair!r} is not KEY=VALUE") from None
        out[key] = value
    return out


def _policy_option(text: str) -> tuple[str, str, object]:
    """POLICY.KEY=VALUE (compare's --sync-opt)."""
    head, sep, raw = text.partition("=")
    policy, dot, key = head.partition(".")
    if not (sep and dot and key):
        raise ValueError(f"{text!r} is not POLICY.KEY=VALUE")
    return policy, key, option_value(raw)


def _count(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number >= {lo}, got {text!r}") from None
        if value < lo:
            raise ValueError(f"expected a whole number >= {lo}, got {text!r}")
        return value
    return parse


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected a number > 0, got {text!r}")
    return value


class Given(argparse.Action):
    """Stores the flag's value and notes in `namespace.given` that it was given, so a command
    can tell a value typed from its default (flags that conflict are refused)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = set(getattr(namespace, "given", ())) | {self.dest}


def given(args, name: str) -> bool:
    """Whether flag `name` (its dest) was on the command line, for flags stored with Given."""
    return name in getattr(args, "given", ())


def options(pairs) -> dict:
    """The (key, value) pairs of a repeated KEY=VALUE flag as a dict (the last one wins)."""
    return dict(pairs or [])


link = _typed(LinkTable.parse, "link")
positive_int = _typed(_count(1), "int")
positive_number = _typed(_positive_number, "number")
count = _typed(_count(0), "int")
straggler: Callable[[str], ParsedStraggler] = _typed(
    lambda text: ParsedStraggler(text, read_trace=read_trace), "straggler")
device_time: Callable[[str], DeviceTime] = _typed(parse_device_time, "device_time")
option = _typed(_option, "KEY=VALUE")
policy_option = _typed(_policy_option, "POLICY.KEY=VALUE")
seconds = _typed(lambda t: units.parse_seconds(t, "duration"), "seconds")
positive_seconds = _typed(lambda t: units.parse_seconds(t, "duration", allow_zero=False),
                          "seconds")
duration = _typed(lambda t: units.parse_duration(t, "duration"), "duration")
size = _typed(lambda t: units.parse_size(t, "size"), "size")
bandwidth = _typed(lambda t: units.parse_bandwidth(t, "bandwidth"), "bandwidth")
model_size = _typed(lambda t: units.parse_count(t, "model size"), "count")
AUTO = AUTO_SERVERS


def _servers(text: str):
    """A shard count, "auto" (resolved once the model's size is known), or MIN:MAX (a job
    that servers join and leave while it runs: spec/job.py ServerCount)."""
    if text.strip().lower() == AUTO:
        return AUTO
    if ":" in text:
        from paramserver.spec.job import ServerCount
        return ServerCount.parse(text)
    return _count(1)(text)


servers = _typed(_servers, "servers")


def _server_count(text: str):
    """N, or MIN:MAX (servers join and leave while the job runs)."""
    if ":" in text:
        from paramserver.spec.job import ServerCount
        return ServerCount.parse(text)
    return _count(1)(text)


server_count = _typed(_server_count, "servers")
SERVERS_RANGE_HELP = ("or MIN:MAX: start MIN, let servers join (`paramserver server --join "
                      "ADDR`) up to MAX and be drained (`paramserver drain`, or SIGTERM to a "
                      "server) back to MIN while the job runs")


def add_shard_args(p) -> None:
    """--servers and --replicas as launch and serve take them (train has its own defaults)."""
    p.add_argument("--servers", type=server_count, default=1,
                   help=f"shards, {SERVERS_RANGE_HELP} (default 1)")
    p.add_argument("--replicas", type=int, choices=(1, 2), default=1,
                   help="copies of each shard: 2 runs a backup beside each shard server, which "
                        "every update reaches before it is acknowledged and which takes over, "
                        "with no update lost, when the primary dies (a new backup is then "
                        "rebuilt from the survivor); twice the server processes (default 1)")


def _workers(text: str):
    from paramserver.spec.job import WorkerCount
    return WorkerCount.parse(text)


# N, or MIN:MAX for an elastic job (spec/job.py WorkerCount).
workers = _typed(_workers, "workers")


def _batch_rule(text: str) -> str:
    from paramserver.policies.batch_rule import BatchRule
    return BatchRule.parse(text, 1, 1).text()


batch_rule = _typed(_batch_rule, "batch rule")


def _membership(text: str):
    from paramserver.sim.core.membership import parse_membership
    return parse_membership(text)


# simulate's join@T[*N] / leave@T[:wR] schedule (sim/core/membership.py Schedule).
membership = _typed(_membership, "membership")


def _join_at(text: str):
    from paramserver.spec.compare_plan import JoinAt
    return JoinAt.parse(text)


# compare's --join-at: seconds of training or N% of the budget (spec/compare_plan.py JoinAt).
join_at = _typed(_join_at, "join_at")


def checked_text(parser: Callable) -> Callable:
    """A flag whose value stays text for a config that stores text (SimConfig): checked here
    with the shared grammar, so a bad value fails at the flag, not inside the run."""
    def check(text: str) -> str:
        parser(text)
        return text
    check.__name__ = parser.__name__
    return check


def _accuracy(text: str) -> float:
    """--target: a test accuracy (or a click model's AUC), which no run passes beyond 1."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ValueError(f"expected an accuracy (or AUC) in (0, 1], e.g. 0.95, got {text!r}")
    return value


accuracy = _typed(_accuracy, "accuracy")


def _nearest(path: Path) -> Path | None:
    """The nearest of `path` and the folders above it that exists."""
    return next((above for above in (path, *path.parents) if above.exists()), None)


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest of `path` and the folders above it that exists, when it is no folder."""
    there = _nearest(path)
    return None if there is None or there.is_dir() else there


def _out_folder(text: str) -> str:
    """A folder a command writes into (--out): refused at the flag when a file stands where it
    or a folder above it would be, or the nearest folder there is one this user cannot write
    into, which mkdir would refuse only once the command runs."""
    path = Path(text)
    there = _nearest(path)
    if there is not None and not there.is_dir():
        where = "" if there == path else f"{text}: "
        raise ValueError(f"{where}{there} is a file, not a folder; give a new or existing "
                         f"folder")
    if there is not None and not os.access(there, os.W_OK | os.X_OK):
        raise ValueError(f"{text}: this user cannot write into {there}; give a folder it can")
    return text


def _out_file(text: str) -> str:
    """A file a command writes (--out FILE): refused at the flag when it names a folder, or
    when a file stands where a folder above it would be."""
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"{text} is a folder; give the name of a file to write")
    block = _file_in_the_way(path.parent)
    if block is not None:
        raise ValueError(f"{text}: {block} is a file, not a folder; give a file in a new or "
                         f"existing folder")
    return text


out_folder = _typed(_out_folder, "folder")
out_file = _typed(_out_file, "file")


def links(values) -> LinkTable:
    """The LinkTables of a repeated --link, merged (a later entry for a target wins)."""
    table = LinkTable()
    for value in values or []:
        table = table.merged(value)
    return table


# ---- issue 23: the coordinator's Prometheus endpoint and the preflight link probes ----------
def port(text: str) -> int:
    value = _count(0)(text)
    if value > 65535:
        raise ValueError(f"expected a port number 0..65535, got {text!r}")
    return value


port = _typed(port, "port")
endpoint = _typed(endpoints.endpoint, "address")


def add_observe_args(p) -> None:
    """--metrics-port, --metrics-host and --preflight/--no-preflight (train, compare, launch)."""
    p.add_argument("--metrics-port", type=port, metavar="PORT",
                   help="serve Prometheus metrics of the job (workers, shards, the last step's "
                        "time) at http://HOST:PORT/metrics on the coordinator while it runs "
                        "(0: a free port; the address is in the coordinator's log and "
                        "events.jsonl, event metrics_endpoint); needs the optional extra: pip "
                        "install 'paramserver[metrics]'")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address the metrics endpoint binds (default 127.0.0.1)")
    p.add_argument("--preflight", action=argparse.BooleanOptionalAction, default=True,
                   help="before the start barrier each worker probes its link to each shard "
                        "(round trip, a short burst's rate) into RUN/preflight.json "
                        "(default: on)")


def check_observe_args(args, command: str) -> int:
    """0, or 2 after saying why: --metrics-port without prometheus_client installed."""
    if getattr(args, "metrics_port", None) is None:
        return 0
    from paramserver.observe.prom import MetricsUnavailable, require
    try:
        require()
    except MetricsUnavailable as exc:
        import sys
        print(f"paramserver {command}: {exc}", file=sys.stderr)
        return 2
    return 0
