"""What goes into the coordinator's core (events) and what comes out of it (instructions).

Every event carries `now`, seconds on the node's clock. `to` is the node's reply token for the
request the event came from; `link` is the node's handle of the sender's connection. The core
never looks inside either: it hands them back in instructions, and compares links only for
equality. Plain slotted dataclasses (not frozen, which costs on the clock -> release path);
treat them as immutable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


# ---- events ---------------------------------------------------------------------------------

@dataclass(slots=True)
class Registered:
    """A server, worker or observer (evaluator) registers under the name `src`."""

    op: ClassVar[str] = "register"
    src: str
    role: str
    now: float
    to: Any = None
    link: Any = None
    addr: str | None = None  # a server's address
    num_keys: int | None = None  # a worker's model size, when it knows it
    rejoin: dict | None = None  # a live member back to a restarted coordinator: who it is
    want_rank: int | None = None  # a worker's launch slot ($RANK): its rank when still free
    layout: Any = None  # a worker's core.layout.ModelLayout, when it sent one
    backup: bool = False  # a server that registers as a shard's backup (--replicas 2)
    optimizer: Any = None  # a worker's script's torch optimizer (spec.job.OptimizerSpec)


@dataclass(slots=True)
class Started:
    """A worker waits for its first release; an observer is ready."""

    op: ClassVar[str] = "start"
    src: str
    now: float
    to: Any = None
    data_len: int | None = None  # an elastic job's worker: its training set's size


@dataclass(slots=True)
class Clocked:
    """A worker finished step `step` (its push is acknowledged) and waits for its release."""

    op: ClassVar[str] = "clock"
    src: str
    step: int
    batch: int
    compute_time: float
    now: float
    to: Any = None
    cpu_load: float | None = None
    free_mem: float | None = None
    record: dict | None = None  # the step's metrics, for metrics.jsonl
    leave: str | None = None  # its last step: the worker leaves with it (why: preempted)


@dataclass(slots=True)
class Heartbeat:
    op: ClassVar[str] = "heartbeat"
    src: str
    now: float
    to: Any = None
    link: Any = None
    counters: dict | None = None  # a server's loss counters, when they changed
    shard: dict | None = None  # a server's load since its last beat (kind shard), if not idle


@dataclass(slots=True)
class ReplicaReport:
    """A primary about its backup (`backup_synced`, `backup_lost`); see replicas.py."""

    op: str
    src: str
    now: float
    to: Any = None
    link: Any = None
    fields: dict = field(default_factory=dict)


@dataclass(slots=True)
class DrainAsked:
    """`drain` {rank}: the server of that rank should leave the job (a `paramserver drain`, or
    the server itself on SIGTERM); see reshard.py."""

    op: ClassVar[str] = "drain"
    src: str
    now: float
    rank: int
    to: Any = None


@dataclass(slots=True)
class Resharded:
    """A server's `resharded`: its new range is whole (or, drained, it sent all it held)."""

    op: ClassVar[str] = "resharded"
    src: str
    now: float
    epoch: int
    version: int
    to: Any = None
    link: Any = None


@dataclass(slots=True)
class Bye:
    op: ClassVar[str] = "bye"
    src: str
    now: float
    to: Any = None
    reason: str = "done"


@dataclass(slots=True)
class Report:
    """A metrics record from a worker or observer (`age_s`: how old it is)."""

    op: ClassVar[str] = "report"
    src: str
    record: dict
    now: float
    to: Any = None


@dataclass(slots=True)
class CollectiveAsked:
    """A worker's part of a small collective among the job's workers (Horovod's allreduce,
    allgather, broadcast of metrics): `kind`, the collective's `name` (the same on every
    rank), its `values` (a flat list of numbers), `root` (broadcast's)."""

    op: ClassVar[str] = "collective"
    src: str
    kind: str
    name: str
    values: list
    now: float
    to: Any = None
    root: int = 0


@dataclass(slots=True)
class ObserveAsked:
    """A read-only observer (`paramserver top ADDRESS`) asks for the metrics records after
    number `since`; it is no member and is not remembered."""

    op: ClassVar[str] = "observe"
    src: str
    since: int
    now: float
    to: Any = None


@dataclass(slots=True)
class StatusAsked:
    op: ClassVar[str] = "status"
    src: str
    now: float
    to: Any = None


@dataclass(slots=True)
class ShardSaved:
    """A server saved its shard for checkpoint `tag` (or could not: `failed` says why)."""

    op: ClassVar[str] = "saved"
    src: str
    tag: str
    now: float
    to: Any = None
    failed: str | None = None


@dataclass(slots=True)
class ClipPartial:
    """A shard holding clipped round `step` for its factor: its part of the round's norm
    (`partial`: sum of |g|^p over its keys, the largest |g| for inf, -1 when not finite) and
    the round's setting (`clip`, [max_norm, norm_type] as the wire has it)."""

    op: ClassVar[str] = "clip_partial"
    src: str
    step: int
    partial: float
    clip: list
    now: float
    to: Any = None
    link: Any = None


@dataclass(slots=True)
class CheckpointUnwritten:
    """The coordinator's own part of checkpoint `tag` could not be written or committed."""

    tag: str
    reason: str
    now: float


@dataclass(slots=True)
class ShardRestored:
    """A restarted server restored its shard from checkpoint `tag`."""

    op: ClassVar[str] = "restored"
    src: str
    tag: str
    lost_updates: int
    version: int
    now: float
    to: Any = None


@dataclass(slots=True)
class Answered:
    """A member's `ok`, or its `error` (with `error` the message)."""

    op: ClassVar[str] = "ok"
    src: str
    now: float
    to: Any = None
    error: str | None = None


@dataclass(slots=True)
class TimePassed:
    """The node's loop turned: timers, policy deadlines and liveness are due for a look."""

    now: float


# ---- instructions ---------------------------------------------------------------------------

@dataclass(slots=True)
class Reply:
    """Answer the request of token `to` with `op` (welcome, ok, error, state)."""

    to: Any
    op: str
    fields: dict


@dataclass(slots=True)
class SendRelease:
    """Release the worker waiting on token `to` into step `step`."""

    to: Any
    step: int
    batch: int
    min_version: int
    round_size: int = 0  # 0: not known, not sent
    stop: bool = False
    scale: float = 1.0
    round_id: int = 0  # auto's lockstep round (0: none, not sent)
    # An elastic job: the positions of the epochs' permutations this step trains on,
    # [[epoch, lo, hi], ...] (coordinator/ledger.py); None otherwise.
    samples: list | None = None
    # Live resharding: the shard map's epoch and layout ([[rank, addr, lo, hi], ...]), sent to
    # a worker whose map is older; None otherwise.
    epoch: int = 0
    layout: list | None = None


@dataclass(slots=True)
class ToServers:
    """Send `op` (apply_round, clip_factor, checkpoint, shutdown) to the servers of `links`."""

    op: str
    fields: dict
    links: tuple


@dataclass(slots=True)
class SaveLayout:
    """The job's model layout (core.layout wire form) into the run folder's model_layout.json,
    from which `export` names the flat vector's parameters."""

    layout: dict


@dataclass(slots=True)
class AppendEvent:
    """A line of events.jsonl."""

    t: float
    kind: str
    data: dict


@dataclass(slots=True)
class AppendMetric:
    """A line of metrics.jsonl; `t` is seconds since the start barrier opened."""

    t: float
    record: dict


@dataclass(slots=True)
class SaveCoordinatorState:
    """Write the coordinator's part of checkpoint `tag` and commit the tag."""

    tag: str
    state: dict


@dataclass(slots=True)
class Warn:
    message: str
    source: str | None = None  # a refusal of this sender's request: logged rate-limited


@dataclass(slots=True)
class Finish:
    """The job is over: failed with `failure`, or done (None)."""

    failure: str | None = None


# ---- preflight (issue 23): a worker's link probes, into RUN/preflight.json -------------------

@dataclass(slots=True)
class PreflightReported:
    """A worker's link figures to each shard, measured before its start (observe/core/preflight.py
    wire form: [shard, rtt_ms, mbit_s, bytes] per link)."""

    op: ClassVar[str] = "preflight"
    src: str
    links: list
    now: float
    to: Any = None


@dataclass(slots=True)
class SavePreflight:
    """RUN/preflight.json's document (observe/preflight.PreflightBook.document)."""

    document: dict
