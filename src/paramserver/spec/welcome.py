"""What each role is told of the job in its `welcome`: typed slices of the JobSpec.

The coordinator's core builds a `ServerJob` (one shard's part: its key range, the update rule,
the limits a server keeps) or a `WorkerJob` (the whole job as the worker sees it: the learned
key space, where each shard listens, the policy's apply mode and name, the samples its rank
already did) from its JobSpec; the message carries `to_dict()`, and the receiving node parses it
once with `from_dict()`, which refuses unknown or missing fields and names them. Every default
stays in spec/job.py: these slices copy values out of a JobSpec, they add none of their own.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Mapping

from paramserver.core.keyspace import KeyRange
from paramserver.spec.job import (
    DTYPES, JobSpec, JobSpecError, Limits, OptimizerSpec, ResumeSpec, SyncSpec, TableSpec, _fail,
    _int, _name, _num, _part, _plain, _tables,
)

APPLY_MODES = ("round", "arrival")
# Checkpoint 0: a shard's initial values, which it saves as soon as it has them when its job
# may restart servers (ServerJob.initial_checkpoint_dir), so that a server lost before the
# first scheduled checkpoint comes back from them. Tags are the count zero-padded to 9 digits.
INITIAL_TAG = f"{0:09d}"


def _fields_of(cls, data: Any, what: str) -> dict:
    """`data` as keyword arguments of `cls`: a table with no unknown and no missing field."""
    if not isinstance(data, Mapping):
        raise JobSpecError(f"a {what} is a table, got {type(data).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise JobSpecError(f"unknown {what} field(s) {', '.join(map(repr, unknown))}")
    return dict(data)


def _required(d: dict, key: str, what: str):
    try:
        return d.pop(key)
    except KeyError:
        raise JobSpecError(f"{what} field {key!r} is missing") from None


def _apply_mode(v: Any) -> None:
    if v not in APPLY_MODES:
        _fail("apply_mode", v, f"one of {', '.join(APPLY_MODES)}")


@dataclass(frozen=True)
class ShardRestore:
    """The checkpoint a shard server loads before it serves: the job's resume point (restart
    False) or, for a server back from the dead, the newest committed checkpoint."""

    dir: str
    tag: str
    version_floor: int = 0  # versions the job already counts (pulls wait for no less)
    restart: bool = False
    # Checkpoint 0 before the coordinator committed it: the shard's own part if it saved one,
    # else the shard starts empty (it never had its initial values, and its init is retried).
    initial: bool = False

    def __post_init__(self):
        _name("restore.dir", self.dir)
        _name("restore.tag", self.tag)
        _int("restore.version_floor", self.version_floor, 0)
        for key in ("restart", "initial"):
            if not isinstance(getattr(self, key), bool):
                _fail(f"restore.{key}", getattr(self, key), "true or false")

    @classmethod
    def of_resume(cls, resume: ResumeSpec, version_floor: int) -> "ShardRestore":
        return cls(resume.dir, resume.tag, version_floor)

    def to_dict(self) -> dict:
        out = {"dir": self.dir, "tag": self.tag, "version_floor": self.version_floor}
        if self.restart:  # the wire leaves it out for a resume, as it always has
            out["restart"] = True
        if self.initial:
            out["initial"] = True
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "ShardRestore":
        return cls(**_fields_of(cls, data, "restore"))


@dataclass(frozen=True)
class ServerJob:
    """One shard server's part of the job."""

    shard_range: tuple[int, int]  # [lo, hi) of the key space
    dtype: str
    apply_mode: str  # "round": the coordinator applies whole rounds; "arrival": each push
    optimizer: OptimizerSpec
    heartbeat_interval: float
    coordinator_timeout: float
    server_threads: int
    restore: ShardRestore | None = None
    # The job's sparse tables and how many shards share each one's row budget.
    tables: tuple[TableSpec, ...] = ()
    servers: int = 1
    # Where the shard saves checkpoint 0 once its initial values are in (see INITIAL_TAG);
    # None: it does not (its job restarts no servers, or resumes from a checkpoint).
    initial_checkpoint_dir: str | None = None
    # Bounds the server enforces (spec.job.Limits); the message size resolved for this shard.
    max_message_bytes: int = Limits.chunk_bytes
    max_pending_pulls: int = Limits.max_pending_pulls
    max_unacked_pushes: int = Limits.max_unacked_pushes
    # Live resharding: the job's most servers (0: fixed; a SIGTERM then asks for a drain) and
    # its chunk size (a handoff piece's bound).
    max_servers: int = 0
    chunk_bytes: int = Limits.chunk_bytes
    # Copies of the shard (--replicas 2): a replicated primary acknowledges the init that
    # gives it its values only once a backup holds them (server/replication.py).
    replicas: int = JobSpec.replicas

    def __post_init__(self):
        r = self.shard_range
        if (not isinstance(r, (tuple, list)) or len(r) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)
                or not 0 <= r[0] <= r[1]):
            _fail("shard_range", r, "[lo, hi] with 0 <= lo <= hi")
        object.__setattr__(self, "shard_range", (r[0], r[1]))
        if self.dtype not in DTYPES:
            _fail("dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        _apply_mode(self.apply_mode)
        if not isinstance(self.optimizer, OptimizerSpec):
            _fail("optimizer", self.optimizer, "an OptimizerSpec")
        _num("heartbeat_interval", self.heartbeat_interval)
        _num("coordinator_timeout", self.coordinator_timeout)
        _int("server_threads", self.server_threads, 1)
        if self.restore is not None and not isinstance(self.restore, ShardRestore):
            _fail("restore", self.restore, "a ShardRestore or null")
        object.__setattr__(self, "tables", _tables(self.tables))
        _int("servers", self.servers, 1)
        if self.initial_checkpoint_dir is not None:
            _name("initial_checkpoint_dir", self.initial_checkpoint_dir)
        _int("max_message_bytes", self.max_message_bytes, 1)
        _int("max_pending_pulls", self.max_pending_pulls, 1)
        _int("max_unacked_pushes", self.max_unacked_pushes, 1)
        _int("max_servers", self.max_servers, 0)
        _int("chunk_bytes", self.chunk_bytes, 8)
        _int("replicas", self.replicas, 1)

    @classmethod
    def of(cls, job: JobSpec, lo: int, hi: int, apply_mode: str,
           restore: ShardRestore | None = None) -> "ServerJob":
        """Shard [lo, hi) of `job`."""
        limits = job.limits
        return cls((lo, hi), job.dtype, apply_mode, job.optimizer, limits.heartbeat_interval,
                   limits.coordinator_timeout, job.server_threads, restore, job.tables,
                   job.servers,
                   # Keys move in a job of --servers MIN:MAX: any shard may come to hold any
                   # number of them, so its frames are bounded by the whole key space's.
                   max_message_bytes=job.message_limit(None if job.max_servers else hi - lo),
                   max_pending_pulls=limits.max_pending_pulls,
                   max_unacked_pushes=limits.max_unacked_pushes,
                   max_servers=job.max_servers, chunk_bytes=limits.chunk_bytes,
                   replicas=job.replicas)

    def with_restore(self, restore: ShardRestore | None) -> "ServerJob":
        return replace(self, restore=restore)

    def with_initial_checkpoint(self, directory: str | None) -> "ServerJob":
        return replace(self, initial_checkpoint_dir=directory)

    def to_dict(self) -> dict:
        out = {"shard_range": list(self.shard_range), "dtype": self.dtype,
               "apply_mode": self.apply_mode, "optimizer": _plain(self.optimizer),
               "heartbeat_interval": self.heartbeat_interval,
               "coordinator_timeout": self.coordinator_timeout,
               "server_threads": self.server_threads}
        if self.restore is not None:
            out["restore"] = self.restore.to_dict()
        if self.tables:
            out["tables"] = [_plain(t) for t in self.tables]
        out["servers"] = self.servers
        if self.initial_checkpoint_dir is not None:
            out["initial_checkpoint_dir"] = self.initial_checkpoint_dir
        out.update(max_message_bytes=self.max_message_bytes,
                   max_pending_pulls=self.max_pending_pulls,
                   max_unacked_pushes=self.max_unacked_pushes,
                   max_servers=self.max_servers, chunk_bytes=self.chunk_bytes)
        if self.replicas > 1:
            out["replicas"] = self.replicas
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "ServerJob":
        d = _fields_of(cls, data, "server job")
        what = "server job"
        # Fields with a default may be left out (a welcome from before they existed): the
        # default then holds; the others are required.
        args = {f.name: _required(d, f.name, what) for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
        args.update({f.name: d.pop(f.name) for f in fields(cls) if f.name in d})
        args["optimizer"] = _part(OptimizerSpec, "optimizer", args["optimizer"])
        if args.get("restore") is not None:
            args["restore"] = ShardRestore.from_dict(args["restore"])
        return cls(**args)


@dataclass(frozen=True)
class ShardAddress:
    """Where shard `rank`, keys [lo, hi), listens."""

    rank: int
    addr: str
    lo: int
    hi: int

    def __post_init__(self):
        _int("shards.rank", self.rank, 0)
        _name("shards.addr", self.addr)
        _int("shards.lo", self.lo, 0)
        _int("shards.hi", self.hi, self.lo)

    def to_list(self) -> list:
        return [self.rank, self.addr, self.lo, self.hi]


@dataclass(frozen=True)
class ShardLayout:
    """Shard map `epoch` (live resharding): shard rank r holds the r-th contiguous key range,
    its server at `shards[r].addr`; together they cover [0, num_keys). Servers and clients
    read a map off the wire only through `parse`."""

    epoch: int
    shards: tuple[ShardAddress, ...]

    @property
    def ranges(self) -> list[KeyRange]:
        return [KeyRange(s.lo, s.hi) for s in self.shards]

    @property
    def addrs(self) -> list[str]:
        return [s.addr for s in self.shards]

    def to_list(self) -> list:
        return [s.to_list() for s in self.shards]

    @classmethod
    def parse(cls, epoch, layout, num_keys: int | None = None) -> "ShardLayout":
        """`layout` as the wire says it, [[rank, addr, lo, hi], ...]; checked (ValueError
        naming what is wrong): ranks 0..S-1 in order, ranges contiguous from key 0 (to
        `num_keys`, when given), each address once."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"a shard map's epoch is a non-negative int, got {epoch!r}")
        if not isinstance(layout, (list, tuple)) or not layout:
            raise ValueError(f"shard map {epoch}: a layout is a non-empty list of "
                             f"[rank, addr, lo, hi], got {layout!r}")
        shards = []
        for item in layout:
            if not isinstance(item, (list, tuple)) or len(item) != 4:
                raise ValueError(f"shard map {epoch}: each shard is [rank, addr, lo, hi], "
                                 f"got {item!r}")
            try:
                shards.append(ShardAddress(*item))
            except JobSpecError as exc:
                raise ValueError(f"shard map {epoch}: {exc}") from None
        edge = 0
        for r, s in enumerate(shards):
            if s.rank != r:
                raise ValueError(f"shard map {epoch}: ranks go 0..{len(shards) - 1} in order, "
                                 f"found rank {s.rank} at position {r}")
            if s.lo != edge:
                raise ValueError(f"shard map {epoch}: shard {r} starts at key {s.lo}, the "
                                 f"previous one ends at {edge} (ranges must be contiguous)")
            edge = s.hi
        if num_keys is not None and edge != num_keys:
            raise ValueError(f"shard map {epoch}: the ranges end at key {edge}, the job has "
                             f"{num_keys} keys")
        if len({s.addr for s in shards}) != len(shards):
            raise ValueError(f"shard map {epoch}: an address is named twice: "
                             f"{[s.addr for s in shards]}")
        return cls(epoch, tuple(shards))


@dataclass(frozen=True)
class WorkerJob:
    """The job as a worker (or the evaluator) is told it. `job.num_keys` is the key space the
    coordinator settled on (learned from the first worker when the job file said 0), and
    `job.sync` carries the policy's name only: its options are the coordinator's business."""

    job: JobSpec
    shards: tuple[ShardAddress, ...]
    apply_mode: str
    resume_samples: int  # samples this rank's data stream already went through

    def __post_init__(self):
        if not isinstance(self.job, JobSpec):
            _fail("job", self.job, "a JobSpec")
        if self.job.sync.options:
            object.__setattr__(self, "job", replace(self.job, sync=SyncSpec(self.job.sync.name)))
        shards = tuple(self.shards)
        if not all(isinstance(s, ShardAddress) for s in shards):
            _fail("shards", self.shards, "a list of ShardAddress")
        object.__setattr__(self, "shards", shards)
        _apply_mode(self.apply_mode)
        _int("resume_samples", self.resume_samples, 0)

    @classmethod
    def of(cls, job: JobSpec, num_keys: int, shards, apply_mode: str, sync: str,
           resume_samples: int) -> "WorkerJob":
        """`job` as told to a worker: `sync` is the name of the policy the coordinator runs,
        `shards` (rank, addr, lo, hi) tuples."""
        return cls(replace(job, num_keys=num_keys, sync=SyncSpec(sync)),
                   tuple(ShardAddress(*s) for s in shards), apply_mode, resume_samples)

    @property
    def sync(self) -> str:
        return self.job.sync.name

    def to_dict(self) -> dict:
        """The welcome's job: the job file's fields, `sync` as the policy's name, and the
        worker's own fields beside them."""
        out = self.job.to_dict()
        out.update(sync=self.job.sync.name, shards=[s.to_list() for s in self.shards],
                   apply_mode=self.apply_mode, resume_samples=self.resume_samples)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "WorkerJob":
        if not isinstance(data, Mapping):
            raise JobSpecError(f"a worker job is a table, got {type(data).__name__}")
        d, what = dict(data), "worker job"
        shards = _required(d, "shards", what)
        apply_mode = _required(d, "apply_mode", what)
        resume_samples = _required(d, "resume_samples", what)
        sync = _required(d, "sync", what)
        _name("sync", sync)
        if not isinstance(shards, (list, tuple)) or not all(
                isinstance(s, (list, tuple)) and len(s) == 4 for s in shards):
            _fail("shards", shards, "a list of [rank, address, lo, hi]")
        return cls(JobSpec.from_dict({**d, "sync": {"name": sync}}),
                   tuple(ShardAddress(*s) for s in shards), apply_mode, resume_samples)
