"""The job spec: what every process of a training job is told, typed, versioned, validated once.

`JobSpec` is a tree of frozen dataclasses; each default lives here and nowhere else, and
`__post_init__` checks values (never the host: no files, devices or registries), naming the
field. `to_dict()` is the JSON form in the job file and the `welcome` message, version 2: every
field written out, each part nested as the spec nests it (the limits under "limits").
`from_dict()` refuses unknown fields and a foreign version; a field left out takes its default.
Version 1 (the limits flat at the top level, fields added since left out at their defaults, a
left-out eval_interval or task meaning no evaluator and the demo task) is read through
`migrate_v1`, and a dict without `version` (a job file written before versions existed) is
version 1, the format it has.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping

from paramserver.emulation.links import LinkTable

JOB_VERSION = 2
READ_VERSIONS = (1, 2)  # what from_dict takes: version 1 through migrate_v1
DTYPES = ("float32", "float64")
SCHEDULES = ("off", "fifo", "lifo", "stalest")
DEVICES = ("cpu", "cuda", "auto")  # and cuda:N; auto: cuda where the worker sees one
AMP_MODES = ("off", "bf16", "fp16")  # fp16 scales the loss (torch.amp.GradScaler)
TABLE_OPTIMIZERS = ("adagrad", "sgd")
TABLE_EVICTIONS = ("lru", "lfu")
MAX_TABLE_DIM = 4096
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


class JobSpecError(ValueError):
    """A job spec with a bad value, an unknown field or a foreign version; names the field."""


# --- checks ---------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and not math.isnan(v)


def _fail(name: str, value: Any, want: str) -> None:
    raise JobSpecError(f"job field {name!r} must be {want}; got {value!r}")


def _int(name: str, v: Any, lo: int) -> None:
    if not _is_int(v) or v < lo:
        _fail(name, v, f"an integer >= {lo}")


def _num(name: str, v: Any, lo: float = 0.0, open_lo: bool = True, optional: bool = False):
    if optional and v is None:
        return
    if not _is_num(v) or (v <= lo if open_lo else v < lo):
        _fail(name, v, f"a number {'>' if open_lo else '>='} {lo:g}"
              + (" or null" if optional else ""))


def _name(name: str, v: Any) -> None:
    if not isinstance(v, str) or not v.strip():
        _fail(name, v, "a non-empty string")


def _options(name: str, v: Any) -> Mapping:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        _fail(name, v, "a table of KEY: VALUE options")
    return MappingProxyType(dict(v))  # frozen: the spec crosses processes, nobody edits it


def _freeze(obj, prefix: str, *names: str) -> None:
    """Store option tables read-only (a frozen dataclass still holds a mutable dict otherwise)."""
    for key in names:
        object.__setattr__(obj, key, _options(f"{prefix}.{key}", getattr(obj, key)))


# --- the parts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyncSpec:
    """The sync policy (`--sync`, `--sync-opt`)."""

    name: str = "bsp"
    options: Mapping = field(default_factory=dict)

    def __post_init__(self):
        _name("sync.name", self.name)
        _freeze(self, "sync", "options")


# The update rules that discount a push by its staleness (optim/staleness.py; composed with a
# script's torch optimizer by coordinator/script_optimizer.py).
STALENESS_RULES = ("dynsgd", "consgd", "staleness-aware")


@dataclass(frozen=True)
class OptimizerSpec:
    """The servers' update rule (`--optimizer`, `--lr`, `--optimizer-opt`)."""

    name: str = "sgd"
    lr: float = 0.1
    options: Mapping = field(default_factory=dict)

    def __post_init__(self):
        _name("optimizer.name", self.name)
        _num("optimizer.lr", self.lr)
        _freeze(self, "optimizer", "options")

    @classmethod
    def from_wire(cls, data: Any) -> "OptimizerSpec":
        """A script's torch optimizer as a worker's registration carries it (JobSpecError,
        a ValueError, when malformed)."""
        return _part(cls, "optimizer", data)

    def to_wire(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class TaskSpec:
    """What each worker runs: model, data, injected slowness and what it pushes.

    `straggler` and `device_time` are the texts of their flags, already checked by the
    command line; each worker builds its model from them with its own seed."""

    name: str = "train"
    model: str = "mlp"
    model_options: Mapping = field(default_factory=dict)
    dataset: str = "digits"
    data_dir: str | None = None
    dataset_options: Mapping = field(default_factory=dict)
    seed: int = 0
    straggler: str = "none"
    device_time: str = "off"
    threads: int = 1
    compress: str = "none"
    compress_options: Mapping = field(default_factory=dict)
    # Compressed pulls (compression/wire.py): a codec name or "none", and the dense refresh
    # interval in pulls. Job files without them read as dense pulls.
    pull_compress: str = "none"
    pull_refresh: int = 20
    push_range: str = "all"  # compression/ranges.py grammar
    schedule: str = "off"  # per-layer requests: off, fifo, lifo, stalest
    # Round mode: the next step's pull goes out with this step's push (benchmarks/ turn it
    # off for A/B runs), and a single shard's reply is computed on in place (borrow).
    pull_ahead: bool = True
    borrow: bool = True
    options: Mapping = field(default_factory=dict)  # a task of its own's (the demo's steps)
    device: str = "cpu"  # where the worker's model computes (`train --device`)
    amp: str = "off"  # mixed precision: forward under torch.autocast in bf16 or fp16 (`--amp`)

    def __post_init__(self):
        for key in ("name", "model", "dataset", "straggler", "device_time", "compress",
                    "push_range", "pull_compress"):
            _name(f"task.{key}", getattr(self, key))
        _int("task.pull_refresh", self.pull_refresh, 1)
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            _fail("task.data_dir", self.data_dir, "a path or null")
        _int("task.seed", self.seed, 0)
        _int("task.threads", self.threads, 1)
        if self.schedule not in SCHEDULES:
            _fail("task.schedule", self.schedule, f"one of {', '.join(SCHEDULES)}")
        device = self.device
        if not isinstance(device, str) or not (
                device in DEVICES or (device.startswith("cuda:") and device[5:].isdigit())):
            _fail("task.device", device, f"one of {', '.join(DEVICES)} or cuda:N")
        if self.amp not in AMP_MODES:
            _fail("task.amp", self.amp, f"one of {', '.join(AMP_MODES)}")
        for key in ("pull_ahead", "borrow"):
            if not isinstance(getattr(self, key), bool):
                _fail(f"task.{key}", getattr(self, key), "true or false")
        _freeze(self, "task", "model_options", "dataset_options", "compress_options", "options")


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the job saves (`--checkpoint-dir/-every/-seconds`)."""

    dir: str
    every: int | None = None  # rounds (round-mode policies) or worker steps
    seconds: float | None = None

    def __post_init__(self):
        _name("checkpoint.dir", self.dir)
        if self.every is not None:
            _int("checkpoint.every", self.every, 1)
        _num("checkpoint.seconds", self.seconds, optional=True)


@dataclass(frozen=True)
class ResumeSpec:
    """A checkpoint the job continues from (`train --resume`)."""

    dir: str
    tag: str

    def __post_init__(self):
        _name("resume.dir", self.dir)
        _name("resume.tag", self.tag)


# The smallest max_message_bytes: a message header may be 64 KB (wire.codec.MAX_HEADER_BYTES).
MIN_MESSAGE_BYTES = 1 << 17
# Keys one pull_rows/push_rows may carry (wire.protocol.MAX_KEYS_PER_REQUEST; spec imports no
# wire module).
_MAX_ROW_KEYS = 1 << 22


# How long members wait for a coordinator that is restarted on death (--restart-coordinator):
# a new process starts (python, torch) and takes them back; measured 1.5-2.3 s on 2 idle cores
# (benchmarks/README.md, chaos), and far longer on loaded ones.
RESTART_COORDINATOR_TIMEOUT = 30.0


def coordinator_timeout_for(restart_coordinator: int) -> float | None:
    """The members' coordinator_timeout of a job with that many coordinator restarts (None:
    derived from the heartbeat timeout)."""
    return RESTART_COORDINATOR_TIMEOUT if restart_coordinator else None


@dataclass(frozen=True)
class Limits:
    """Every timeout and interval of the job, in seconds, and the chunking of large requests
    (bytes, a count). In the job dict they sit at the top level, where the roles read them.
    None for heartbeat_interval, coordinator_timeout and server_timeout means derived from
    heartbeat_timeout, resolved here once."""

    heartbeat_timeout: float = 5.0  # silence after which a worker is declared dead
    heartbeat_interval: float | None = None  # None: min(1 s, heartbeat_timeout / 4)
    # Silence after which servers, workers and evaluators give up on their coordinator. None:
    # 1.5 x heartbeat_timeout, so a member exits within 2 heartbeat timeouts of its death (the
    # check runs every 0.25 s). A job whose coordinator is restarted on death waits longer
    # (RESTART_COORDINATOR_TIMEOUT): a new process must start and take the members back.
    coordinator_timeout: float | None = None
    start_timeout: float = 120.0  # registration of every member before the start barrier
    start_grace: float = 30.0  # silence tolerated from a member before the barrier opens
    server_timeout: float | None = None  # None: max(6 x heartbeat_timeout, 30 s)
    restart_timeout: float = 120.0  # for a dead server to come back from its checkpoint
    observer_grace: float = 30.0  # for the evaluator to finish once training is done
    retry_interval: float = 3.0  # a worker resends an unanswered shard request after this
    release_timeout: float = 600.0  # a worker's wait for its release (read by KVWorker's
    # constructor today; written here so the one default is visible)
    # Not times, but limits of the same kind: a worker sends a request's piece for a shard
    # larger than chunk_bytes as chunks of that size, chunks_in_flight unanswered per shard
    # (benchmarks/dense_scale.py measured the default; see benchmarks/README.md).
    chunk_bytes: int = 16 << 20
    chunks_in_flight: int = 2
    # A piece above chunk_bytes for a shard reached over TCP (not through shared memory) goes
    # in chunks of min(chunk_bytes, tcp_chunk_bytes), tcp_chunks_in_flight unanswered, so that
    # the shard's add of a chunk and the worker's copy of a pulled one overlap the next one's
    # transfer: measured on 2 cores, 4 MB x 4 took 64 MB 8-25% faster, while chunking smaller
    # requests (3.73 and 8 MB) cost more per message than it overlapped (benchmarks/README.md).
    tcp_chunk_bytes: int = 4 << 20
    tcp_chunks_in_flight: int = 4
    # Bounds on what one peer may make a server hold. A frame above max_message_bytes is
    # refused by ZeroMQ before it is read (the sender is disconnected); None: derived from the
    # job (JobSpec.message_limit: its largest legitimate frame plus headroom).
    max_message_bytes: int | None = None
    max_pending_pulls: int = 1024  # pulls one client may have waiting at one shard
    # Pushes one client may have unacknowledged at one shard: the client waits for the oldest
    # before sending more, and the shard refuses more (its exactly-once window is this deep).
    max_unacked_pushes: int = 1024
    # No step completing for this long makes the coordinator write a stall report
    # (observe/core/stall.py). None: derived from the step time, max(10 x median, floor), the floor
    # min(3 s, heartbeat_timeout / 2): a stopped worker is reported before it is declared dead.
    stall_timeout: float | None = None

    def __post_init__(self):
        _num("heartbeat_timeout", self.heartbeat_timeout)
        if self.heartbeat_interval is None:
            object.__setattr__(self, "heartbeat_interval", min(1.0, self.heartbeat_timeout / 4))
        if self.server_timeout is None:
            object.__setattr__(self, "server_timeout", max(6 * self.heartbeat_timeout, 30.0))
        if self.coordinator_timeout is None:
            object.__setattr__(self, "coordinator_timeout", 1.5 * self.heartbeat_timeout)
        for f in fields(self):
            if f.name not in ("max_message_bytes", "stall_timeout"):
                _num(f.name, getattr(self, f.name))
        _num("stall_timeout", self.stall_timeout, optional=True)
        if self.max_message_bytes is not None:
            _int("max_message_bytes", self.max_message_bytes, MIN_MESSAGE_BYTES)
        _int("max_pending_pulls", self.max_pending_pulls, 1)
        _int("max_unacked_pushes", self.max_unacked_pushes, 1)
        _int("chunk_bytes", self.chunk_bytes, 8)
        _int("chunks_in_flight", self.chunks_in_flight, 1)
        _int("tcp_chunk_bytes", self.tcp_chunk_bytes, 8)
        _int("tcp_chunks_in_flight", self.tcp_chunks_in_flight, 1)
        if self.heartbeat_interval > self.heartbeat_timeout:
            _fail("heartbeat_interval", self.heartbeat_interval,
                  f"<= heartbeat_timeout ({self.heartbeat_timeout:g})")


@dataclass(frozen=True)
class TableSpec:
    """A sparse embedding table beside the dense shards: rows of `dim` floats under 64-bit keys,
    created on first push, spread over the shards by key hash. Each shard keeps at most
    ceil(row_budget / servers) rows of it."""

    name: str  # how pull_rows/push_rows name it: [a-z][a-z0-9_]{0,31}
    dim: int  # floats per row, 1..4096
    optimizer: str = "adagrad"  # per-row optimizer state: "adagrad" or "sgd"
    lr: float = 0.05
    init_scale: float = 0.01  # a row starts uniform(-init_scale, init_scale), seeded by its key
    row_budget: int = 1_000_000  # rows kept over all shards
    admit_after: int = 1  # pushes a key must be seen in before it gets a row (1: at once)
    evict: str = "lru"  # which row goes when a shard's share of the budget is full: lru or lfu

    def __post_init__(self):
        if not isinstance(self.name, str) or not _TABLE_NAME.fullmatch(self.name):
            _fail("tables.name", self.name, "a name matching [a-z][a-z0-9_]{0,31}")
        where = f"tables.{self.name}"
        if not _is_int(self.dim) or not 1 <= self.dim <= MAX_TABLE_DIM:
            _fail(f"{where}.dim", self.dim, f"an integer in 1..{MAX_TABLE_DIM}")
        if self.optimizer not in TABLE_OPTIMIZERS:
            _fail(f"{where}.optimizer", self.optimizer, f"one of {', '.join(TABLE_OPTIMIZERS)}")
        _num(f"{where}.lr", self.lr)
        _num(f"{where}.init_scale", self.init_scale, open_lo=False)
        _int(f"{where}.row_budget", self.row_budget, 1)
        _int(f"{where}.admit_after", self.admit_after, 1)
        if self.evict not in TABLE_EVICTIONS:
            _fail(f"{where}.evict", self.evict, f"one of {', '.join(TABLE_EVICTIONS)}")

    def capacity(self, servers: int) -> int:
        """Rows one of `servers` shards keeps: its share of the budget, rounded up."""
        return -(-self.row_budget // servers)


def _tables(v: Any) -> tuple:
    """The job's tables as TableSpecs (tables from a dict are parsed), names unique."""
    if not isinstance(v, (list, tuple)):
        _fail("tables", v, "a list of tables")
    out = tuple(t if isinstance(t, TableSpec) else _part(TableSpec, "tables", t) for t in v)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        _fail("tables", names, "tables of distinct names")
    return out


_LIMIT_KEYS = tuple(f.name for f in fields(Limits))
START_SECONDS_PER_GB = 60.0  # a worker builds, binds and offers a model before it starts


def start_timeout_for(num_keys: int, dtype: str) -> float:
    """The start barrier's wait for a model of `num_keys`: the default, plus a minute per
    whole GB of parameters (a worker of 10^9 float32 parameters builds 4 GB, binds it to its
    flat buffer and pushes it to the shards as their initial values before it starts)."""
    nbytes = num_keys * (8 if dtype == "float64" else 4)
    return Limits.start_timeout + START_SECONDS_PER_GB * (nbytes // 10**9)
# A version-1 job dict written by hand (a test's, the demo's) may leave these out; they then
# mean what the roles always read them as, which is not the default of a job built from a config.
_V1_ABSENT = {"eval_interval": 0.0,  # no evaluator process
                "task": {"name": "demo"}}  # workers run the demo task (constant gradients)


# --- elastic workers ----------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerCount:
    """`--workers N` (a fixed job: min == max, not elastic) or `--workers MIN:MAX` (elastic:
    the job starts with MIN, takes joiners up to MAX, waits while fewer than MIN are left)."""

    min: int
    max: int
    elastic: bool = False

    def __post_init__(self):
        _int("workers (min)", self.min, 1)
        _int("workers (max)", self.max, 1)
        if self.min > self.max:
            raise JobSpecError(f"workers {self.min}:{self.max}: MIN must be <= MAX")

    @classmethod
    def parse(cls, text: str) -> "WorkerCount":
        lo, colon, hi = str(text).strip().partition(":")
        try:
            least, most = int(lo), int(hi if colon else lo)
        except ValueError:
            least = most = 0
        if least < 1 or most < 1:
            raise JobSpecError(f"workers {text!r}: expected N or MIN:MAX (whole numbers "
                               f">= 1)")
        return cls(least, most, bool(colon))  # MIN > MAX: refused as such

    def text(self) -> str:
        return f"{self.min}:{self.max}" if self.elastic else str(self.max)


@dataclass(frozen=True)
class ServerCount:
    """`--servers MIN:MAX`: a job that starts with MIN shard servers, takes servers joining
    while it runs up to MAX and lets them be drained back to MIN (live resharding)."""

    min: int
    max: int

    def __post_init__(self):
        _int("servers (min)", self.min, 1)
        _int("servers (max)", self.max, 1)
        if self.min >= self.max:
            raise JobSpecError(f"servers {self.min}:{self.max}: MIN must be below MAX (a "
                               f"fixed count is one number)")

    @classmethod
    def parse(cls, text: str) -> "ServerCount":
        lo, _, hi = str(text).strip().partition(":")
        try:
            least, most = int(lo), int(hi)
        except ValueError:
            least = most = 0
        if least >= 1 and most >= 1:
            return cls(least, most)  # MIN >= MAX: refused as such
        raise JobSpecError(f"servers {text!r}: expected N, auto or MIN:MAX (whole "
                           f"numbers >= 1)")

    def text(self) -> str:
        return f"{self.min}:{self.max}"


# --- the job --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSpec:
    """One training job. `JobSpec()` is the default job; `from_config` builds it from the
    command line's TrainConfig; `to_dict`/`from_dict` are its job-file and wire form."""

    version: int = JOB_VERSION
    num_keys: int = 0  # 0: learned from the first worker that registers
    dtype: str = "float32"
    servers: int = 1
    workers: int = 4
    batch_size: int = 32
    sync: SyncSpec = field(default_factory=SyncSpec)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    max_samples: int | None = None  # the sample budget all workers share
    max_seconds: float | None = None
    eval_interval: float = 1.0  # 0: no evaluator process
    restart_servers: int = 0  # dead servers the launcher restarts from a checkpoint
    server_threads: int = 1  # torch threads per shard server
    links: LinkTable = field(default_factory=LinkTable)
    checkpoint: CheckpointSpec | None = None
    task: TaskSpec = field(default_factory=TaskSpec)
    limits: Limits = field(default_factory=Limits)
    resume: ResumeSpec | None = None
    tables: tuple[TableSpec, ...] = ()  # sparse embedding tables (none: a dense job)
    # Keys where the model's layers start: the cuts between shards move to them when that
    # keeps the shards' bytes balanced (core/keyspace.split_by_bytes). Empty: no preference.
    layer_edges: tuple = ()
    # Copies of each shard: 2 keeps a backup that every update reaches before it is
    # acknowledged and that takes over when the primary dies (server/replication.py).
    replicas: int = 1
    # Observability (issue 23): the coordinator's Prometheus endpoint (None: none; 0: a free
    # port) and the host it binds; workers probe their links to the shards before the start
    # barrier (preflight).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    preflight: bool = True
    # An elastic job (`--workers MIN:MAX`): `workers` is MAX, this is MIN; 0: not elastic
    # (every worker is expected at the start, as always).
    min_workers: int = 0
    # The global-batch rule as workers come and go (policies/batch_rule.py): fixed,
    # keep-global, target:T, linear.
    batch_rule: str = "fixed"
    # Live resharding (`--servers MIN:MAX`): `servers` is MIN, the count the job starts with
    # and the fewest a drain may leave; this is MAX, the most a join may make; 0: a fixed
    # server count (core/reshard_plan.py, coordinator/reshard.py).
    max_servers: int = 0

    @property
    def elastic(self) -> bool:
        return self.min_workers > 0

    @property
    def elastic_servers(self) -> bool:
        return self.max_servers > 0

    def batch_rule_spec(self):
        """The typed rule (its reference head count: MIN workers, or all of them)."""
        from paramserver.policies.batch_rule import BatchRule
        return BatchRule.parse(self.batch_rule, self.batch_size,
                               self.min_workers or self.workers)

    def __post_init__(self):
        edges = self.layer_edges
        if not isinstance(edges, (list, tuple)) or not all(_is_int(e) and e >= 0 for e in edges):
            _fail("layer_edges", edges, "a list of key offsets")
        object.__setattr__(self, "layer_edges", tuple(edges))
        if self.version != JOB_VERSION:  # (from_dict migrates older ones first)
            raise JobSpecError(f"a JobSpec is version {JOB_VERSION}, not {self.version!r}")
        _int("num_keys", self.num_keys, 0)
        if self.dtype not in DTYPES:
            _fail("dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        _int("servers", self.servers, 1)
        if 0 < self.num_keys < self.servers:
            raise JobSpecError(f"{self.num_keys} keys cannot be spread over {self.servers} "
                               f"servers (each holds one key at least): give fewer servers")
        _int("workers", self.workers, 1)
        _int("batch_size", self.batch_size, 1)
        if self.max_samples is not None:
            _int("max_samples", self.max_samples, 0)
        _num("max_seconds", self.max_seconds, optional=True)
        _num("eval_interval", self.eval_interval, open_lo=False)
        _int("restart_servers", self.restart_servers, 0)
        _int("server_threads", self.server_threads, 1)
        _int("replicas", self.replicas, 1)
        if self.replicas > 2:
            _fail("replicas", self.replicas, "1 or 2 (a primary and one backup)")
        if self.replicas > 1 and self.restart_servers:
            raise JobSpecError("--replicas 2 and --restart-servers (job fields 'replicas' and "
                               "'restart_servers') are exclusive: a replicated shard's backup "
                               "takes over, no checkpoint restore; give one of them")
        for key, cls in (("sync", SyncSpec), ("optimizer", OptimizerSpec), ("task", TaskSpec),
                         ("limits", Limits), ("links", LinkTable)):
            if not isinstance(getattr(self, key), cls):
                _fail(key, getattr(self, key), f"a {cls.__name__}")
        for key, cls in (("checkpoint", CheckpointSpec), ("resume", ResumeSpec)):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), cls):
                _fail(key, getattr(self, key), f"a {cls.__name__} or null")
        if self.restart_servers and not (self.checkpoint and (
                self.checkpoint.every or self.checkpoint.seconds)):
            raise JobSpecError("job field 'restart_servers' needs checkpoints to restart from: "
                               "give --checkpoint-every or --checkpoint-seconds")
        object.__setattr__(self, "tables", _tables(self.tables))
        if self.metrics_port is not None:
            _int("metrics_port", self.metrics_port, 0)
            if self.metrics_port > 65535:
                _fail("metrics_port", self.metrics_port, "a port number (0: any free one)")
        _name("metrics_host", self.metrics_host)
        if not isinstance(self.preflight, bool):
            _fail("preflight", self.preflight, "true or false")
        _int("min_workers", self.min_workers, 0)
        if self.min_workers > self.workers:
            _fail("min_workers", self.min_workers, f"at most workers ({self.workers})")
        try:
            self.batch_rule_spec()
        except ValueError as exc:
            raise JobSpecError(f"job field 'batch_rule': {exc}") from None
        if self.batch_rule != "fixed" and not self.elastic:
            raise JobSpecError("job field 'batch_rule' applies to an elastic job (--workers "
                               "MIN:MAX); a fixed job's batch is --batch-size per worker")
        _int("max_servers", self.max_servers, 0)
        if self.max_servers:
            if self.max_servers <= self.servers:
                _fail("max_servers", self.max_servers,
                      f"above servers ({self.servers}), or 0 for a fixed count")

    @classmethod
    def from_config(cls, config, num_keys: int, train_size: int,
                    tables: tuple[TableSpec, ...] = ()) -> "JobSpec":
        """The job of `config` (spec.config.TrainConfig) for a model of `num_keys` parameters
        and a training set of `train_size` samples (they size the key space and the budget),
        with the sparse `tables` the model needs (DLRM's "emb")."""
        c = config
        return cls(
            num_keys=num_keys, dtype=c.dtype, servers=c.servers, workers=c.workers,
            batch_size=c.batch_size, sync=SyncSpec(c.sync, _paired_sync_options(c)),
            optimizer=OptimizerSpec(c.optimizer, c.lr, c.optimizer_options),
            max_samples=c.max_samples(train_size), max_seconds=c.max_seconds,
            eval_interval=c.eval_interval, restart_servers=c.restart_servers,
            replicas=c.replicas, links=c.links,
            checkpoint=CheckpointSpec(c.checkpoint_dir, c.checkpoint_every,
                                      c.checkpoint_seconds) if c.checkpoint_dir else None,
            task=TaskSpec(model=c.model, dataset=c.dataset,
                          model_options=c.model_options if c.model_size is None
                          else {**c.model_options, "size": c.model_size},
                          data_dir=c.data_dir,
                          dataset_options=c.dataset_options, seed=c.seed,
                          straggler=str(c.straggler), device_time=c.device_time.text(),
                          threads=c.threads, compress=c.compress,
                          compress_options=c.compress_options, push_range=c.push_range,
                          pull_compress=c.pull_compress, pull_refresh=c.pull_refresh,
                          schedule=c.schedule, device=c.device, amp=c.amp),
            limits=Limits(heartbeat_timeout=c.heartbeat_timeout,
                          coordinator_timeout=coordinator_timeout_for(c.restart_coordinator),
                          start_timeout=start_timeout_for(num_keys, c.dtype),
                          max_message_bytes=c.max_message_bytes,
                          stall_timeout=c.stall_timeout),
            tables=tuple(tables), metrics_port=c.metrics_port, metrics_host=c.metrics_host,
            preflight=c.preflight, min_workers=c.min_workers, batch_rule=c.batch_rule,
            max_servers=c.max_servers)

    def message_limit(self, keys: int | None = None) -> int:
        """The largest frame a server accepts: limits.max_message_bytes, or derived from the
        job: its largest legitimate frame (a dense chunk of chunk_bytes, a keys frame naming
        every key of a shard of `keys` keys (default: all), a table's rows for the most keys
        one request may carry) plus an eighth and 1 MB of headroom. Frames larger than
        chunk_bytes only come from requests that name keys one by one; dense requests are cut
        into chunks (client/core/worker_core.py)."""
        if self.limits.max_message_bytes is not None:
            return self.limits.max_message_bytes
        itemsize = 8 if self.dtype in ("float64", "int64") else 4
        keys = self.num_keys if keys is None else keys
        largest = max(self.limits.chunk_bytes, keys * max(8, itemsize),
                      *(_MAX_ROW_KEYS * max(8, t.dim * 4) for t in self.tables))
        return largest + largest // 8 + (1 << 20)

    def with_resume(self, resume: ResumeSpec | None) -> "JobSpec":
        return replace(self, resume=resume)

    # --- the dict form ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The job file's JSON object, version 2: every field, each part nested as here (a
        fresh dict: launchers may still add to it)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, LinkTable):
                value = value.to_dict()
            elif f.name == "tables":
                value = [_plain(t) for t in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif is_dataclass(value):
                value = _plain(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "JobSpec":
        """A job dict back into a spec; unknown fields and a foreign version are refused, a
        field left out takes its default, and a version-1 dict is migrated first."""
        if not isinstance(data, Mapping):
            raise JobSpecError(f"a job is a JSON object, got {type(data).__name__}")
        d = dict(migrate_v1(data) if check_version(data) == 1 else data)
        d["version"] = JOB_VERSION
        nested = {"sync": SyncSpec, "optimizer": OptimizerSpec, "task": TaskSpec,
                  "checkpoint": CheckpointSpec, "resume": ResumeSpec, "limits": Limits}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise JobSpecError(f"unknown job field(s) {', '.join(map(repr, unknown))}")
        for key, part in nested.items():
            if d.get(key) is not None:
                d[key] = _part(part, key, d[key])
        if "links" in d:
            try:
                d["links"] = LinkTable.from_dict(d["links"])
            except ValueError as exc:
                raise JobSpecError(f"job field 'links': {exc}") from None
        return cls(**d)


def migrate_v1(data: Mapping) -> dict:
    """A version-1 job dict as version 2. Version 1 wrote the limits flat at the top level, and
    a hand-written version-1 dict (a test's, the demo's) that left out eval_interval or task
    meant no evaluator and the demo task, which version 2 writes out; fields version 1 left out
    at their defaults stay out (version 2 reads those as their defaults too)."""
    if "limits" in data:
        raise JobSpecError("job field 'limits' is version 2's: a version-1 job writes its "
                           "limits at the top level (give \"version\": 2)")
    d = {**_V1_ABSENT, **data, "version": 2}
    d["limits"] = {k: d.pop(k) for k in _LIMIT_KEYS if k in d}
    return d


def check_version(data: Mapping) -> int:
    """The version of a job dict: missing is version 1 (files written before versions)."""
    version = data.get("version", 1)
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise JobSpecError(f"job version {version!r} is not supported: this paramserver reads "
                           f"versions {', '.join(map(str, READ_VERSIONS))} (was the job "
                           f"written by another release?)")
    return version


def task_from_dict(data: Mapping) -> TaskSpec:
    """A task table (the job's "task", or a simulator's) as a TaskSpec; unknown fields refused."""
    return _part(TaskSpec, "task", data)


def _part(cls, key: str, data: Any):
    if not isinstance(data, Mapping):
        _fail(key, data, "a table")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = "" if cls is Limits else f"{key}."
        raise JobSpecError(f"unknown job field(s) "
                           f"{', '.join(repr(where + u) for u in unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:  # a required field left out
        raise JobSpecError(f"job field {key!r}: {exc}") from None


def _plain(part) -> dict:
    return {f.name: (dict(v) if isinstance(v := getattr(part, f.name), Mapping) else v)
            for f in fields(part)}


def _paired_sync_options(config) -> dict:
    """The policy's options as given, but for auto beside a staleness-aware update rule: its
    ssp and asp pushes then go as they come (`discount=rule`), for the rule to discount, where
    with plain sgd auto scales them itself; both at once would discount them twice."""
    options = dict(config.sync_options)
    if config.sync == "auto" and config.optimizer in STALENESS_RULES:
        options.setdefault("discount", "rule")
    return options

