"""What a shard's core hears (events), what it asks its node to do (instructions), and the
settings it runs with. Pure data: no sockets, no clock.

`to` is a reply token the node mints per request and maps back to the peer; the core only
hands it back and compares it (a retried request carries an equal token).

Events and instructions are plain slotted dataclasses, not frozen ones: a frozen dataclass
costs microseconds to build, and one of these is built for every push and pull. Treat them as
immutable all the same. Tensors travel inside them as they came (views of the received frames,
of the shard's values): nothing here copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.spec.job import JobSpec, Limits

_LIMITS = Limits()


# ---- settings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestoreFrom:
    """The checkpoint a shard starts from, and whether it is back after a crash."""
    dir: str
    tag: str
    version_floor: int = 0  # the rounds the coordinator applied: pulls wait for no less
    restart: bool = False  # back after a crash: the coordinator counts what was lost
    initial: bool = False  # uncommitted checkpoint 0: none saved means start empty


@dataclass(frozen=True)
class ShardSettings:
    """Everything a shard reads from its welcome, with the defaults in this one place."""
    rank: int
    lo: int
    hi: int
    dtype: str
    apply_mode: str  # "arrival" or "round"
    optimizer: str
    lr: float
    optimizer_options: dict = field(default_factory=dict)
    pull_timeout: float = 60.0  # a pull waiting for a version gives up after this long
    # The rest comes from the welcome's ServerJob; these defaults (for cores built by hand)
    # are the job spec's own.
    heartbeat_interval: float = _LIMITS.heartbeat_interval
    coordinator_timeout: float = _LIMITS.coordinator_timeout  # (the node's) silence: job gone
    server_threads: int = JobSpec.server_threads  # (the node's) torch threads
    restore: RestoreFrom | None = None
    tables: tuple = ()  # the job's TableSpecs (spec.job), each shard keeping its share
    servers: int = 1  # shards sharing each table's row budget
    max_pending_pulls: int = _LIMITS.max_pending_pulls  # waiting pulls per client
    max_unacked_pushes: int = _LIMITS.max_unacked_pushes  # the dedup table's depth per sender
    max_message_bytes: int = _LIMITS.chunk_bytes  # (the node's) largest frame received
    initial_checkpoint_dir: str | None = None  # where checkpoint 0 goes once initialized
    max_servers: int = 0  # an elastic-servers job's most servers (0: fixed): SIGTERM drains
    chunk_bytes: int = 0  # the job's chunk size, when its welcome says (handoff pieces)
    replicas: int = JobSpec.replicas  # 2: the init's ack waits for a backup (replication.py)


# ---- events -------------------------------------------------------------------------------------
@dataclass(slots=True)
class Init:
    to: Any
    lo: int
    hi: int
    values: np.ndarray


@dataclass(slots=True)
class PullState:
    """Read the update rule's per-key state over keys [lo, hi) (a script's
    optimizer.state_dict())."""
    to: Any
    lo: int
    hi: int


@dataclass(slots=True)
class LoadState:
    """Write the update rule's per-key state over keys [lo, hi): state `names[i]` from
    `arrays[i]` (a script's optimizer.load_state_dict())."""
    to: Any
    lo: int
    hi: int
    names: list
    arrays: list


@dataclass(slots=True)
class Push:
    to: Any
    sender: str
    rid: int  # with `sender`, what makes a retry recognisable
    lo: int
    hi: int
    grad: np.ndarray
    step: int
    batch: int
    version: int  # the version the gradient was computed from
    scale: float = 1.0
    round_size: int = 0  # contributors of the round, when the pusher knows (0: not said)
    parts: int = 0  # messages the pusher sends this shard for the step (0: not said)
    # The pusher's watermark: its pushes below this rid are all acknowledged (None: not said)
    mark: int | None = None
    # A script's optimizer settings by group as its schedule left them (None: as they were)
    hyper: list | None = None
    round_id: int = 0  # in arrival mode, the lockstep round the push is summed into (0: none)
    # Key runs of [lo, hi) that got no gradient (a script's torch optimizer skips them)
    idle: list | None = None
    # [max_norm, norm_type]: the round's average is clipped by its norm over every shard
    # (server/clip_round.py), as the wire had it (checked there)
    clip: Any = None


@dataclass(slots=True)
class PushSparse:
    to: Any
    sender: str
    rid: int
    keys: np.ndarray
    grad: np.ndarray
    step: int
    batch: int
    version: int
    scale: float = 1.0
    round_size: int = 0
    parts: int = 0
    mark: int | None = None
    round_id: int = 0


@dataclass(slots=True)
class Pull:
    """Keys [lo, hi), or the given `keys` when not None, once the shard reaches min_version."""
    to: Any
    now: float  # when it arrived: a pull that must wait gives up pull_timeout later
    min_version: int = 0
    lo: int = 0
    hi: int = 0
    keys: np.ndarray | None = None
    client: Any = None  # who asked (the node's peer): each has only so many pulls waiting
    # A compressed pull (issue 22, server/deltas.py): with `ref` the shard keeps what it
    # sends as what `sender` holds; `delta` (a Codec) sends the change since, encoded.
    ref: bool = False
    delta: Any = None
    sender: str = ""
    rid: int = 0


@dataclass(slots=True)
class PullRows:
    """Rows of `keys` (int64) of sparse table `table`, once the shard reaches min_version."""
    to: Any
    now: float
    table: str
    keys: np.ndarray
    min_version: int = 0
    client: Any = None


@dataclass(slots=True)
class PushRows:
    """Gradients of rows of `table`: `grads` holds len(keys) * dim float32, row after row."""
    to: Any
    sender: str
    rid: int
    table: str
    keys: np.ndarray
    grads: np.ndarray
    step: int
    batch: int
    version: int
    scale: float = 1.0
    round_size: int = 0
    parts: int = 0
    mark: int | None = None
    round_id: int = 0


@dataclass(slots=True)
class ApplyRound:
    """The coordinator's word that round `step` is closed."""
    to: Any
    step: int


@dataclass(slots=True)
class ClipFactor:
    """The coordinator's factor for clipped round `step` (server/clip_round.py)."""
    to: Any
    step: int
    factor: float


@dataclass(slots=True)
class Status:
    to: Any


@dataclass(slots=True)
class Checkpoint:
    to: Any
    tag: str
    dir: str


@dataclass(slots=True)
class Restore:
    """A checkpoint's contents, as server.checkpoint read them, to start from."""
    tag: str
    arrays: dict
    meta: dict
    version_floor: int = 0
    announce: bool = False  # tell the coordinator what was lost (a restart after a crash)
    # Every part of the shard made new first: a backup promoted before it was synced drops
    # what it holds of its primary's (coordinator/orphans.py).
    fresh: bool = False


@dataclass(slots=True)
class Shutdown:
    to: Any


@dataclass(slots=True)
class Rebuild:
    """Reshard `epoch` committed: the shard becomes the one `settings` describe (its new rank
    and range), its values from `assembly` (a whole handoff.Assembly; None: an empty range, a
    drained server), at version max(the pieces', `version_floor`, the shard's own)."""
    settings: ShardSettings
    assembly: Any
    epoch: int
    layout: list
    version_floor: int = 0


@dataclass(slots=True)
class LayoutKnown:
    """The shard map of `epoch` (a welcome's, or the `reshard` of a move this server finished
    as a joiner before it came): requests for keys elsewhere are refused `moved` with it.
    `version`: the version the map's shards start from, at least."""
    epoch: int
    layout: list
    version: int = 0


@dataclass(slots=True)
class JoinMove:
    """A welcome with `handoff`: this server joins a running job at reshard `epoch`, its
    range (empty so far) to fill from other servers' pieces. `addr`: its own address, by
    which the layouts name it."""
    epoch: int
    addr: str


@dataclass(slots=True)
class ReshardStart:
    """The coordinator's `reshard`: shard map `epoch` (`layout`) follows `old`, its shards
    starting from `version` at least. `addr`: this server's own address."""
    epoch: int
    old: list
    layout: list
    version: int
    addr: str


@dataclass(slots=True)
class HandoffPiece:
    """Another server's piece of reshard `epoch`, from `src`: dense keys (`handoff`), or with
    `rows` a sparse table's rows (`handoff_rows`). Its fields and arrays as the wire had them:
    parsed once its reshard is under way, so that a bad early piece is refused alone."""
    epoch: int
    src: str
    rows: bool
    fields: dict
    arrays: list


@dataclass(slots=True)
class ReshardCommit:
    """The coordinator's `reshard_commit`: every server holds its range of `epoch`."""
    epoch: int


@dataclass(slots=True)
class ReshardAbort:
    """The coordinator's `reshard_abort`: the move of `epoch` is given up."""
    epoch: int


@dataclass(slots=True)
class LoadSync:
    """A new backup's whole state from its primary (replication.sync_payload's frames). With
    `settings`, the sync is of another shard than this one (a backup re-attached after live
    resharding): the shard those describe, made fresh, takes it."""
    arrays: list
    settings: ShardSettings | None = None


@dataclass(slots=True)
class TimePassed:
    now: float
    # Seconds the node has spent handling messages so far (its busy time, for the shards'
    # load in the job's metrics): the core has no clock, so the node measures and tells it.
    busy: float = 0.0


# ---- instructions -------------------------------------------------------------------------------
@dataclass(slots=True)
class Reply:
    """Answer request `to` with message `op`. With `lend`, the arrays are views of the live
    values: the node must hand the send's tracker to ShardCore.lend, so that no update writes
    under a reply still being sent."""
    to: Any
    op: str
    fields: dict
    arrays: tuple | list = ()
    lend: bool = False
    committed: bool = False  # (node) values held until the backup had every write in them


@dataclass(slots=True)
class Then:
    """Feed `event` back to the core once the instructions before this one are carried out: work
    that must not delay a reply already decided (a full round's apply after the last push's
    ack, so that pusher's clock is on its way while the shard applies)."""
    event: Any


@dataclass(slots=True)
class SaveShard:
    """Write `arrays` and `meta` as this shard's part of checkpoint `tag` under `dir`, then
    send `done` (the coordinator's `saved`); when the write fails, `done` goes with the reason
    in its `failed` field instead, and the shard trains on."""
    tag: str
    dir: str
    arrays: dict
    meta: dict
    done: Any = None


@dataclass(slots=True)
class ToCoordinator:
    """A message the coordinator did not ask for (other than heartbeats)."""
    op: str
    fields: dict


@dataclass(slots=True)
class Heartbeat:
    counters: dict | None  # loss counters, only when they changed since the last beat


@dataclass(slots=True)
class Stop:
    """Serve no more: the job is over."""


@dataclass(slots=True)
class Log:
    """A line for the server's log, at `level` ("info" or "warning"): a pure part has no
    logger of its own."""
    level: str
    text: str


@dataclass(slots=True)
class SendHandoffs:
    """Open a DEALER to server `addr` and send it `messages`, each (op, fields, arrays), under
    this server's name; it stays open until CloseHandoffs (closed at once, pieces not yet
    delivered would be dropped)."""
    addr: str
    messages: list


@dataclass(slots=True)
class CloseHandoffs:
    """Close the DEALERs of the last SendHandoffs: their reshard is done or given up."""


@dataclass(slots=True)
class ReleaseHeld:
    """The shard serves again: handle the workers' requests held while it moved, in order."""
