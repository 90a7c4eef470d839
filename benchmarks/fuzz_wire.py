"""Fuzz the wire: every frame kind, random and mutated, against the parsers, then live sockets.

Frame kinds: every op of wire/protocol.py SCHEMAS (a valid message of each, its arrays
included), and the shared-memory transport's own frames (transport/shm_frames.py): the
DEALER's offer, the ROUTER's answer, the confirmation, and by-reference descriptors followed by
a protocol message whose array lies in a real arena. Mutations: random bytes, valid frames
with bytes flipped, inserted, cut or frames dropped/added, header fields retyped or removed or
set to extremes (NaN, Infinity, 2^64-1, negative, huge strings, paths), handshake fields
likewise, nesting past the parser's recursion limit; and any field of any op replaced by raw
msgpack that nests lists, maps or both at every depth up to msgpack's own limit (1024) and past
it, wide containers, declared lengths far beyond the frame, and mixed types.

Part 1 feeds N frames to the parsers (`wire.decode`, `shm_frames.parse_*`): anything but a
WireError or ShmFrameError is a crash. Part 2 sends M of them to a live shard server and
coordinator over ZeroMQ, then checks both still answer a well-behaved client correctly and no
process died. benchmarks/fuzz_frames.py is the long live run (>= 1M frames, memory, rates).

Usage: python benchmarks/fuzz_wire.py [--frames 1000000] [--live 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from paramserver.transport import shm
from paramserver.transport.shm_frames import (
    ShmFrameError, parse_refs, parse_to_dealer, parse_to_router,
)
from paramserver.wire import Message, WireError, decode, encode
from paramserver.wire.protocol import (
    BOOL, CLIP, DICT, FLOAT, INT, LIST, NONNEG, PROTOCOL_VERSION, RANGE, RECORD, RUNS, SCHEMAS,
    STR,
)

F32, I64 = np.float32, np.int64
# The array frames each op carries (the rest carry none).
ARRAYS = {
    "init": lambda: [np.arange(8, dtype=np.float64)],
    "push": lambda: [np.ones(8, dtype=np.float64)],
    "push_sparse": lambda: [np.array([1, 5], dtype=I64), np.ones(2, dtype=np.float64)],
    "pull_keys": lambda: [np.array([0, 3], dtype=I64)],
    "pull_rows": lambda: [np.array([7, 1 << 40], dtype=I64)],
    "push_rows": lambda: [np.array([7], dtype=I64), np.ones(4, dtype=F32)],
    "values": lambda: [np.ones(8, dtype=np.float64)],
    "rows": lambda: [np.ones(4, dtype=F32)],
}
STRINGS = {"role": "worker", "table": "emb", "tag": "ckpt-1", "dir": "/tmp/x", "msg": "no",
           "addr": "tcp://127.0.0.1:1"}


def _valid(name: str, kind):
    if kind == RANGE:
        return [0, 8]
    if kind == RUNS:
        return [[1, 3], [5, 6]]
    if kind == NONNEG:
        return 1
    if kind == RECORD:
        return {"loss": 1.0, "kind": "step"}
    if kind is STR:
        return STRINGS.get(name, "x")
    if kind is BOOL:
        return True
    if kind == LIST:
        return [0]
    if kind is DICT:
        return {}
    if kind is INT:
        return 0
    if kind == FLOAT:
        return 0.5
    if kind == CLIP:
        return [1.0, "inf"]
    raise ValueError(f"no valid value for {kind!r}")


def protocol_seeds() -> list[Message]:
    """A valid message of every op, every field given (optional ones too)."""
    return [Message(op, {f: _valid(f, kind) for f, (kind, _) in schema.items()},
                    ARRAYS.get(op, list)(), rid=i + 1, src="fuzz")
            for i, (op, schema) in enumerate(sorted(SCHEMAS.items()))]


SEEDS = protocol_seeds()
JUNK_VALUES = [None, True, -1, 2 ** 64 - 1, -(2 ** 63), 2 ** 62, 1.5, float("inf"),
               float("-inf"), float("nan"), 1e308, "x" * 300, "../../etc/passwd", "", b"\x00",
               [], [1, -2], [0, 2 ** 63], [2 ** 62, 2 ** 62], {"a": {"b": 1}}, {"loss": 1e999},
               [[3, 1]], [[0, 4], [2, 6]], [[0, 2 ** 62]], [[0, 1]] * 3000]
JSON_JUNK = [None, True, -1, 0, 2 ** 64, -(2 ** 70), 1.5, float("inf"), float("nan"), 1e308,
             "1", "x" * 5000, "/proc/self/mem", [], [1, 2, 3], {"a": 1}]


class ShmSeeds:
    """Valid shared-memory frames: an offer of a real arena (this process's, mapped by the
    peer), the answer and the confirmation, and a push whose array goes by reference."""

    def __init__(self):
        self.arena = shm.Arena(1 << 16)
        self.values = self.arena.alloc(8, np.float64)
        self.values[:] = 1.0

    def offer(self) -> dict:
        return {"arena": self.arena.describe(), "slot": 0}

    def hellos(self) -> list[dict]:
        return [self.offer(), {"confirm": True}, {"attached": True, "arena": self.arena.describe()},
                {"attached": False}]

    def refs_message(self) -> tuple[dict, list[bytes]]:
        """(descriptor, the push's frames with its array left empty for the reference)."""
        head = encode(Message("push", {"range": [0, 8], "step": 0, "version": 0, "batch": 1},
                              [self.values], rid=99, src="fuzz"))[0]
        off = self.arena.offset(memoryview(self.values))
        return {"seq": 0, "refs": [[1, off, self.values.nbytes]]}, [bytes(head), b""]


def _mutate_json(value, rng: random.Random, depth: int = 0):
    """A JSON value with one field (at any depth) retyped, removed or added."""
    if isinstance(value, dict) and value and depth < 3:
        value = dict(value)
        key = rng.choice(list(value) + ["zzz"])
        roll = rng.random()
        if roll < 0.2:
            value.pop(key, None)
        elif roll < 0.5 and key in value:
            value[key] = _mutate_json(value[key], rng, depth + 1)
        else:
            value[key] = rng.choice(JSON_JUNK)
        return value
    if isinstance(value, list) and value and depth < 3:
        value = list(value)
        i = rng.randrange(len(value))
        value[i] = _mutate_json(value[i], rng, depth + 1) if rng.random() < 0.5 else \
            rng.choice(JSON_JUNK)
        if rng.random() < 0.2:
            value.append(rng.choice(JSON_JUNK))
        return value
    return rng.choice(JSON_JUNK)


def _json_body(value, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b"[" * rng.choice([10, 1500, 3000]) + b"]" * rng.randrange(3)
    body = json.dumps(value).encode()  # writes inf/nan as Infinity/NaN, as a hostile peer may
    if roll < 0.2:
        buf = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        body = bytes(buf)
    return body


def mutate_shm(rng: random.Random, seeds: ShmSeeds) -> list[bytes]:
    """One hostile shared-memory frame: a hello or a descriptor, mutated."""
    if rng.random() < 0.5:
        hello = rng.choice(seeds.hellos())
        return [shm.HELLO, _json_body(_mutate_json(hello, rng), rng)]
    refs, body = seeds.refs_message()
    if rng.random() < 0.8:
        refs = _mutate_json(refs, rng)
    frames = [shm.REFS + _json_body(refs, rng), *body]
    if rng.random() < 0.2:
        frames = frames[:-1] if rng.random() < 0.5 else frames + [b""]
    return frames


_NEST_MARK = "\x00nest\x00"


def nesting_depth(rng: random.Random) -> int:
    """A depth anywhere up to just past msgpack's limit, dense where parsers change behaviour
    (Python's recursion limit near 1000, msgpack's at 1024)."""
    roll = rng.random()
    if roll < 0.4:
        return rng.randrange(1, 1100)
    if roll < 0.8:
        return rng.randrange(900, 1030)
    return rng.choice([2, 31, 32, 33, 64, 999, 1000, 1023, 1024])


def hostile_value(rng: random.Random) -> bytes:
    """Raw msgpack for one hostile value: deep lists, maps or both, wide containers, lengths
    declared far beyond the bytes that follow, or a mix (written by hand: msgpack's packer
    refuses to nest past its limit, and the point is values no well-behaved packer makes)."""
    kind = rng.randrange(6)
    if kind == 0:  # a list in a list ... around a scalar
        return b"\x91" * nesting_depth(rng) + b"\x01"
    if kind == 1:  # {"a": {"a": ...}}
        return b"\x81\xa1a" * nesting_depth(rng) + b"\x01"
    if kind == 2:  # lists and maps alternating, each holding a scalar beside the next level
        out = bytearray()
        for i in range(nesting_depth(rng)):
            out += b"\x92\x00" if i % 2 else b"\x82\xa1k\x00\xa1v"
        return bytes(out + b"\xc0")
    if kind == 3:  # wide: thousands of items, numbers, strings and small lists
        n = rng.randrange(1, 6000)
        items = [rng.choice([b"\x00", b"\xa1x", b"\x92\x00\x01", b"\xcb" + b"\x7f" * 8, b"\xc0"])
                 for _ in range(n)]
        return b"\xdc" + n.to_bytes(2, "big") + b"".join(items)
    if kind == 4:  # a length far past the frame: array32, map32, str32, bin32
        head = rng.choice([b"\xdd", b"\xdf", b"\xdb", b"\xc6"])
        return head + rng.choice([0xFFFFFFFF, 1 << 30, 70_000]).to_bytes(4, "big") + b"\x00" * 4
    # a mixed container holding a deep value and a deep map beside scalars
    return (b"\x94\x01\xa1s" + b"\x91" * nesting_depth(rng) + b"\xc0"
            + b"\x81\xa1d" * rng.randrange(1, 40) + b"\xc3")


def mutate_nesting(rng: random.Random) -> list[bytes]:
    """A valid message of any op with one field (its own, or v/op/rid/src/arrays) replaced
    by a hostile value."""
    msg = rng.choice(SEEDS)
    frames = [bytes(f) for f in encode(msg)]
    head = msgpack.unpackb(frames[0])
    head[rng.choice(list(head) + ["zzz"])] = _NEST_MARK
    packed = msgpack.packb(head)
    mark = msgpack.packb(_NEST_MARK)
    frames[0] = packed.replace(mark, hostile_value(rng), 1)
    return frames


def mutate_protocol(rng: random.Random) -> list[bytes]:
    """One hostile protocol message: random bytes, a corrupted valid one, a retyped field, or
    a field holding a hostile value."""
    kind = rng.randrange(7)
    if kind >= 5:
        return mutate_nesting(rng)
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(0, 4))]
    frames = [bytes(f) for f in encode(rng.choice(SEEDS))]
    if kind == 1:  # flip bytes in one frame
        i = rng.randrange(len(frames))
        buf = bytearray(frames[i]) or bytearray(b"\0")
        for _ in range(rng.randrange(1, 5)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        frames[i] = bytes(buf)
    elif kind == 2:  # cut or extend a frame, or drop/add one
        i = rng.randrange(len(frames))
        frames[i] = frames[i][:rng.randrange(len(frames[i]) + 1)] + rng.randbytes(rng.randrange(3))
        if rng.random() < 0.3:
            frames = frames[:-1] if rng.random() < 0.5 else frames + [rng.randbytes(8)]
    else:  # retype, remove or add header fields (kind 4: several at once)
        head = msgpack.unpackb(frames[0])
        for _ in range(1 if kind == 3 else rng.randrange(2, 5)):
            key = rng.choice(list(head) + ["v", "op", "arrays", "zzz"])
            if rng.random() < 0.15:
                head.pop(key, None)
            else:
                head[key] = rng.choice(JUNK_VALUES + [rng.choice(sorted(SCHEMAS)),
                                                      PROTOCOL_VERSION])
        frames[0] = msgpack.packb(head)
    return frames


def mutate(rng: random.Random, seeds: ShmSeeds | None = None) -> list[bytes]:
    """One hostile message of any kind: protocol (4 in 5) or shared-memory transport."""
    if seeds is not None and rng.random() < 0.2:
        return mutate_shm(rng, seeds)
    return mutate_protocol(rng)


def parse(frames: list[bytes]) -> None:
    """What a receiver does before using a frame: raises WireError or ShmFrameError only."""
    if frames and frames[0] == shm.HELLO and len(frames) == 2:
        refused = []  # both ends' parsers see the same hello
        for parser in (parse_to_router, parse_to_dealer):
            try:
                parser(frames[1])
            except ShmFrameError as exc:
                refused.append(exc)
        if refused:
            raise refused[0]
    elif frames and frames[0].startswith(shm.REFS):
        parse_refs(frames[0][len(shm.REFS):], len(frames) - 1)
    else:
        decode(frames)


def fuzz_decoder(n: int, rng: random.Random) -> tuple[int, int, float]:
    """(refused, accepted, seconds) over n frames of every kind; raises on anything but
    WireError or ShmFrameError."""
    refused = accepted = 0
    seeds = ShmSeeds()
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            parse(mutate(rng, seeds))
            accepted += 1
        except (WireError, ShmFrameError):
            refused += 1
    return refused, accepted, time.perf_counter() - t0


class Rogue:
    """A DEALER that sends hostile frames to one ROUTER and counts the answers, having first
    offered a real arena (so descriptors reach the peer's mapping code)."""

    def __init__(self, ctx: zmq.Context, addr: str, seeds: ShmSeeds):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.connect(addr)
        self.sock.send_multipart([shm.HELLO, json.dumps(seeds.offer()).encode()])
        self.replies = 0

    def send(self, frames: list[bytes]) -> None:
        while True:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK)
                break
            except zmq.Again:  # the peer's queue is full: take its answers meanwhile
                self.sock.poll(50)
                self.drain()
        self.drain()

    def drain(self, wait_ms: int = 0) -> None:
        while self.sock.poll(wait_ms):
            self.sock.recv_multipart()
            self.replies += 1
            wait_ms = min(wait_ms, 200)

    def close(self) -> None:
        self.sock.close(0)


def fuzz_job() -> dict:
    return {"num_keys": 8, "dtype": "float64", "servers": 1, "workers": 1, "batch_size": 1,
            "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
            "heartbeat_timeout": 60.0}


def fuzz_live(m: int, rng: random.Random) -> dict:
    seeds = ShmSeeds()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(fuzz_job(), Path(tmp), keys=None)  # plaintext: parsers targeted
        try:
            cluster.start(spawn_workers=False)
            kv = KVWorker(cluster.address)
            kv.init(np.zeros(8))
            kv.start()
            ctx = zmq.Context()
            replies = 0
            try:
                for addr in (kv.shards[0].addr, cluster.address):
                    rogue = Rogue(ctx, addr, seeds)
                    for _ in range(m):
                        frames = mutate(rng, seeds)
                        if frames:
                            rogue.send(frames)
                    rogue.drain(5000)
                    replies += rogue.replies
                    rogue.close()
            finally:
                ctx.destroy(linger=0)
            # Frames that parsed may have been applied (the fuzzer's pushes are real pushes):
            # the check is that a push now moves the values by exactly its step.
            before = kv.pull()
            kv.push(np.ones(8), step=0, batch=1)
            after = kv.pull()
            alive = all(c.proc.poll() is None for c in cluster.children)
            kv.close()
            return {"sent": 2 * m, "replies": replies, "alive": alive,
                    "correct_after": bool(np.array_equal(after, before - 1.0))}
        finally:
            cluster.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--live", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    refused, accepted, secs = fuzz_decoder(args.frames, rng)
    print(f"parsers: {args.frames} frames in {secs:.1f} s ({args.frames / secs:,.0f}/s): "
          f"{refused} refused (WireError, ShmFrameError), {accepted} valid, 0 crashes")
    live = fuzz_live(args.live, rng)
    print(f"live: {live['sent']} hostile messages to a server and a coordinator, "
          f"{live['replies']} replies; processes alive: {live['alive']}; "
          f"a client is served correctly afterwards: {live['correct_after']}")
    return 0 if live["alive"] and live["correct_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
