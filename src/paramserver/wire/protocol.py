"""Protocol version, operation names and the header schema of every operation."""

from __future__ import annotations

PROTOCOL_VERSION = 1

# Tensor frames may only carry these dtypes; keys are always int64. uint8: the raw frames of
# codec-encoded values (compression/payload.py), checked against their `enc` header.
DTYPES = ("float32", "float64", "int64", "uint8")
MAX_ELEMENTS = 1 << 31
# Keys in one pull_rows/push_rows: a bigger batch is refused (by the client before sending, by
# the server if one comes anyway) rather than answered with gigabytes in one message.
MAX_KEYS_PER_REQUEST = 1 << 22
# The largest frame a control socket takes (the coordinator's, a server's from the
# coordinator): those messages are headers only (at most codec.MAX_HEADER_BYTES, 64 KB).
CONTROL_MESSAGE_BYTES = 1 << 20

INT, FLOAT, STR, BOOL, LIST, DICT = int, (int, float), str, bool, (list, tuple), dict
RANGE = "range"  # [lo, hi) of non-negative ints
# [[lo, hi], ...]: key ranges with lo < hi, sorted, none overlapping, at most MAX_RUNS of them
RUNS = "runs"
# At most 2048 runs, about 38 KB of msgpack at the largest keys: a push's header stays well
# under the codec's 64 KB bound with its other fields (the groups' settings among them).
MAX_RUNS = 2048
NONNEG = "nonneg"  # non-negative int
# [max_norm, norm_type]: a finite number >= 0, and a number > 0 or "inf" (core/clipping.py)
CLIP = "clip"
RECORD = "record"  # flat map of str -> number/str/bool/None, for metrics lines
MAX_RECORD_FIELDS = 64
# How deep a list or map field may nest. The deepest real one (a job inside `welcome`) is about
# 5; msgpack itself stops at 1024, which leaves room for values that Python code formatting or
# walking them would hit its recursion limit on.
MAX_NESTING = 32


def _f(kind, required=True):
    return (kind, required)


# Codec-encoded values (issue 22): the Encoded header and the codec's options, the payload's
# frames as uint8 arrays; checked by compression/payload.py on receipt.
ENCODED = {"enc": _f(DICT, False), "enc_opts": _f(DICT, False)}


# op -> {field: (kind, required)}; every header also has v, op, rid, src (checked in the codec).
SCHEMAS: dict[str, dict[str, tuple]] = {
    # worker -> server
    "init": {"range": _f(RANGE)},
    # wm (optional): the pusher's watermark, the lowest rid of its pushes to this shard not
    # yet acknowledged; the shard forgets the pusher's applied requests only below it.
    "push": {"range": _f(RANGE), "step": _f(NONNEG), "version": _f(NONNEG),
             "batch": _f(NONNEG), "scale": _f(FLOAT, False), "layer": _f(INT, False),
             "round_size": _f(NONNEG, False), "parts": _f(NONNEG, False),
             "wm": _f(NONNEG, False),
             # arrival mode: the lockstep round (auto's) the shard sums this push into
             "round_id": _f(NONNEG, False),
             # a script's optimizer settings by group, once its schedule moved them
             "hyper": _f(LIST, False),
             # the push's keys of parameters that got no gradient this step (a script's
             # torch optimizer skips them, as torch does a parameter whose grad is None)
             "idle": _f(RUNS, False),
             # round mode: the round's average is clipped by its norm over every shard
             # (DistributedOptimizer.clip_grad_norm_, server/clip_round.py)
             "clip": _f(CLIP, False), **ENCODED},
    "push_sparse": {"step": _f(NONNEG), "version": _f(NONNEG), "batch": _f(NONNEG),
                    "scale": _f(FLOAT, False), "round_size": _f(NONNEG, False),
                    "parts": _f(NONNEG, False), "wm": _f(NONNEG, False),
                    "round_id": _f(NONNEG, False), **ENCODED},
    # delta: pull values minus what this worker holds, encoded by codec {"name", "opts"};
    # ref: a dense pull that also resets what the shard thinks this worker holds
    "pull": {"range": _f(RANGE), "min_version": _f(NONNEG, False), "delta": _f(DICT, False),
             "ref": _f(BOOL, False)},
    "pull_keys": {"min_version": _f(NONNEG, False)},
    # sparse tables: one int64 keys array; push_rows adds float32 grads (len(keys) * dim)
    "pull_rows": {"table": _f(STR), "min_version": _f(NONNEG, False)},
    "push_rows": {"table": _f(STR), "step": _f(NONNEG), "version": _f(NONNEG),
                  "batch": _f(NONNEG), "scale": _f(FLOAT, False),
                  "round_size": _f(NONNEG, False), "parts": _f(NONNEG, False),
                  "wm": _f(NONNEG, False), "round_id": _f(NONNEG, False)},
    # a script's optimizer state (client/optimizer_state.py): read, or written per state name
    # (one array each, in `names` order)
    "pull_state": {"range": _f(RANGE)},
    "load_state": {"range": _f(RANGE), "names": _f(LIST)},
    # server -> worker
    "opt_state": {"names": _f(LIST), "rule": _f(STR), "version": _f(NONNEG)},
    "ack": {"version": _f(NONNEG), "staleness": _f(INT, False)},
    "values": {"version": _f(NONNEG), "range": _f(RANGE, False), **ENCODED},
    "rows": {"version": _f(NONNEG)},  # one float32 array: len(keys) * dim, in key order
    # anyone -> coordinator
    "register": {"role": _f(STR), "addr": _f(STR, False), "want_rank": _f(INT, False),
                 "num_keys": _f(NONNEG, False), "rejoin": _f(RECORD, False),
                 # a worker's model layout (core/layout.py; checked there, the header's 64 KB
                 # bound its size): every rank's must be the job's
                 "layout": _f(DICT, False),
                 # a script's torch optimizer (spec.job.OptimizerSpec's wire form)
                 "optimizer": _f(DICT, False),
                 "backup": _f(BOOL, False)},  # a server that comes as a shard's backup
    "clock": {"step": _f(NONNEG), "batch": _f(NONNEG), "compute_time": _f(FLOAT),
              "cpu_load": _f(FLOAT, False), "free_mem": _f(FLOAT, False),
              "record": _f(RECORD, False),
              # the worker's last step: it leaves with it (an elastic job's preempted worker)
              "leave": _f(STR, False)},
    # an elastic job's worker: its training set's size (the sample ledger's)
    "start": {"data_len": _f(NONNEG, False)},
    "heartbeat": {"counters": _f(RECORD, False), "shard": _f(RECORD, False)},
    "bye": {"reason": _f(STR, False)},
    "status": {},
    "report": {"record": _f(RECORD)},
    # a read-only observer (`paramserver top ADDRESS`): the metrics records after `since`
    "observe": {"since": _f(NONNEG)},
    # a worker's part of a small collective (coordinator/collectives.py) and its answer
    "collective": {"kind": _f(STR), "name": _f(STR), "values": _f(LIST),
                   "root": _f(NONNEG, False)},
    "collected": {"values": _f(LIST), "count": _f(NONNEG)},
    # coordinator -> others
    "welcome": {"rank": _f(NONNEG), "job": _f(DICT), "backup": _f(BOOL, False),
                # live resharding: the shard map's epoch; a joining server takes handoffs;
                # a restarted server of a resharded job gets the map (`moved` refusals)
                "epoch": _f(NONNEG, False), "handoff": _f(BOOL, False),
                "layout": _f(LIST, False)},
    "release": {"step": _f(NONNEG), "batch": _f(NONNEG), "min_version": _f(NONNEG),
                "stop": _f(BOOL, False), "scale": _f(FLOAT, False),
                "round_size": _f(NONNEG, False),
                # auto's lockstep round: the pushes of this step name it (round_id)
                "round_id": _f(NONNEG, False),
                # an elastic job: [[epoch, lo, hi], ...] of the epochs' permutations to train on
                "samples": _f(LIST, False),
                # live resharding: a newer shard map, [[rank, addr, lo, hi], ...]
                "epoch": _f(NONNEG, False), "layout": _f(LIST, False)},
    "apply_round": {"step": _f(NONNEG), "contributors": _f(LIST, False)},
    # a clipped round's factor, once every shard's partial is in (coordinator/clip_rounds.py)
    "clip_factor": {"step": _f(NONNEG), "factor": _f(FLOAT)},
    "shutdown": {"reason": _f(STR, False)},
    "checkpoint": {"tag": _f(STR), "dir": _f(STR)},
    # server -> coordinator
    # failed: the shard could not write its part (a full disk): the checkpoint is given up
    "saved": {"tag": _f(STR), "version": _f(NONNEG, False), "failed": _f(STR, False)},
    "restored": {"tag": _f(STR), "lost_updates": _f(NONNEG), "version": _f(NONNEG)},
    # a clipped round held for its factor: this shard's part of the norm (server/clip_round.py)
    "clip_partial": {"step": _f(NONNEG), "partial": _f(FLOAT), "clip": _f(CLIP)},
    "state": {"state": _f(DICT)},
    # replicated shards (--replicas 2, server/replication.py, coordinator/replicas.py):
    # coordinator -> primary / backup
    "attach_backup": {"rank": _f(NONNEG), "addr": _f(STR), "epoch": _f(NONNEG)},
    "backup_dropped": {"rank": _f(NONNEG), "epoch": _f(NONNEG)},
    # a backup promoted before it was synced first loads `restore` (a ShardRestore's dict)
    "promote": {"rank": _f(NONNEG), "epoch": _f(NONNEG), "restore": _f(DICT, False)},
    # primary -> coordinator
    "backup_synced": {"rank": _f(NONNEG), "epoch": _f(NONNEG), "version": _f(NONNEG)},
    "backup_lost": {"rank": _f(NONNEG), "epoch": _f(NONNEG), "reason": _f(STR)},
    # backup -> coordinator: its primary's connection dropped (promoted sooner if it is silent)
    "primary_down": {"rank": _f(NONNEG), "epoch": _f(NONNEG)},
    # primary -> backup: a request that changes the shard, as it came (its header as the first
    # uint8 array, then its arrays), numbered per link (seq) of attach `epoch`; the shard's
    # whole state to start from (sync: a JSON description, then each array's bytes);
    # backup -> primary: every forward up to seq is applied
    "fwd": {"seq": _f(NONNEG), "epoch": _f(NONNEG)},
    "sync": {"seq": _f(NONNEG), "epoch": _f(NONNEG), "arrays_n": _f(NONNEG, False),
             "addr": _f(STR, False)},  # addr: the primary's, which its backup watches
    "fwd_ack": {"seq": _f(NONNEG), "epoch": _f(NONNEG), "refused": _f(STR, False)},
    # live resharding (--servers MIN:MAX; coordinator/reshard.py, server/handoff.py):
    # coordinator -> server: the new layout and the old, [[rank, addr, lo, hi], ...]
    "reshard": {"epoch": _f(NONNEG), "layout": _f(LIST), "old": _f(LIST),
                "version": _f(NONNEG, False)},
    # server -> server: keys [lo, hi) (values, then the optimizer state arrays meta names)
    "handoff": {"epoch": _f(NONNEG), "lo": _f(NONNEG), "hi": _f(NONNEG),
                "version": _f(NONNEG), "meta": _f(DICT, False)},
    # server -> server: sparse tables' rows the receiver owns now (sparse/moves.py RowBundle's
    # arrays), from old rank `from`, whose clock read `tick`; its last piece to this receiver
    # says how many it sent (`pieces`)
    "handoff_rows": {"epoch": _f(NONNEG), "from": _f(NONNEG), "table": _f(STR),
                     "tick": _f(NONNEG), "pieces": _f(NONNEG, False)},
    # coordinator -> server: every server of reshard `epoch` reported: serve the new range
    "reshard_commit": {"epoch": _f(NONNEG)},
    # coordinator -> server: reshard `epoch` is given up: serve the old range as before
    "reshard_abort": {"epoch": _f(NONNEG)},
    # server -> coordinator: its new range is whole (drained: all it held is sent)
    "resharded": {"epoch": _f(NONNEG), "rank": _f(NONNEG), "version": _f(NONNEG, False),
                  "drained": _f(BOOL, False)},
    # anyone -> coordinator: the server of `rank` should leave the job
    "drain": {"rank": _f(NONNEG)},
    # the hang doctor (observe/): the coordinator asks every live member for its stack, its
    # flight recorder's last lines and what it waits for; the answer fits one header (64 KB)
    "stall_probe": {"n": _f(NONNEG)},
    "stall_answer": {"n": _f(NONNEG), "role": _f(STR), "stack": _f(STR),
                     "flight": _f(LIST, False), "waiting": _f(DICT, False)},
    # preflight (issue 23): worker -> server `probe` asks for `bytes` zero bytes, answered by
    # a `probe` with that many in one uint8 frame; worker -> coordinator `preflight` reports
    # its links, each [shard, rtt_ms, mbit_s, bytes] (checked in observe/core/preflight.py)
    "probe": {"bytes": _f(NONNEG)},
    "preflight": {"links": _f(LIST)},
    # coordinator -> observer: records after `since` up to `seq` (more: ask again at once)
    "observed": {"seq": _f(NONNEG), "records": _f(LIST), "members": _f(DICT),
                 "more": _f(BOOL, False)},
    # either direction
    "ok": {"epoch": _f(NONNEG, False),  # a worker's heartbeat answered after a takeover:
           "shards": _f(LIST, False),  # the moved shards, [[rank, addr], ...]
           "replaced": _f(LIST, False),  # dead primaries' successors, [[old, new], ...]
           "layout": _f(LIST, False)},  # live resharding: the whole map of `epoch`
    "error": {"msg": _f(STR), "code": _f(STR, False),
              # code "moved": the map the refused request should follow
              "epoch": _f(NONNEG, False), "layout": _f(LIST, False)},
}

OPS = frozenset(SCHEMAS)
