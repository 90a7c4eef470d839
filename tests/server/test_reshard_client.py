"""The client side of live resharding: which shard map a client follows (pure), its core
rebuilt on a new map, and a KVWorker following `moved` refusals over real sockets.

The live test stands up, on 127.0.0.1 in one thread, a fake coordinator (it answers register
with a welcome, start with a release, heartbeats with `ok`) and fake shard servers: ROUTERs
that hold one shared array but serve only the keys the test's current shard map gives their
address, refusing any other request `moved` with that map, as RESHARD_API.md says a server
does. The servers' own side (handoffs, the fence) is not here: the test moves the map.
"""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from paramserver.client.core.reshard import LayoutFollower
from paramserver.client.core.worker_core import Handle, WorkerCore
from paramserver.client.kv import KVWorker
from paramserver.client.links import ShardLinks
from paramserver.spec.welcome import ShardLayout
from paramserver.compression import make_codec, payload
from paramserver.core.keyspace import KeyRange
from paramserver.net import rpc
from paramserver.net.rpc import RemoteError
from paramserver.spec.job import JobSpec
from paramserver.sparse.placement import shard_of
from paramserver.spec.welcome import WorkerJob
from paramserver.transport import bind_router, connect_dealer, new_context, terminate
from paramserver.wire import Message
from ps_helpers import make_job
from ps_helpers import Reply

# ---- which map is followed (pure) ---------------------------------------------------------------


def test_a_newer_map_wins_and_an_older_or_repeated_one_is_ignored():
    f = LayoutFollower(0, 10)
    two = [[0, "tcp://a:1", 0, 4], [1, "tcp://b:1", 4, 10]]
    assert f.offer(2, two) and f.behind
    assert not f.offer(1, [[0, "tcp://a:1", 0, 10]])  # older than the one pending
    assert not f.offer(2, two)  # the same, heard again
    assert f.take() == ShardLayout.parse(2, two, 10) and f.epoch == 2 and not f.behind
    assert not f.offer(2, two) and not f.offer(None, None)
    assert f.offer(3, [[0, "tcp://b:1", 0, 10]]) and f.take().addrs == ["tcp://b:1"]


@pytest.mark.parametrize("layout, says", [
    ([[1, "tcp://a:1", 0, 10]], "ranks go 0..0"),
    ([[0, "tcp://a:1", 0, 4], [1, "tcp://b:1", 5, 10]], "contiguous"),
    ([[0, "tcp://a:1", 0, 4], [1, "tcp://b:1", 4, 9]], "the job has 10 keys"),
    ([[0, "tcp://a:1", 0, 4], [1, "tcp://a:1", 4, 10]], "named twice"),
    ([[0, "tcp://a:1", 0]], "[rank, addr, lo, hi]"),
    ([], "non-empty"),
])
def test_a_map_that_does_not_hold_together_is_refused_naming_why(layout, says):
    with pytest.raises(ValueError, match=None) as err:
        LayoutFollower(0, 10).offer(1, layout)
    assert says in str(err.value)


# ---- the core on a new map (pure) ---------------------------------------------------------------


def test_the_core_rebuilt_on_a_new_map_splits_by_it_and_its_rids_keep_counting_up():
    core = WorkerCore()
    core.welcome(0, [KeyRange(0, 50), KeyRange(50, 100)], 100)
    core.chunking(1 << 40, 1)
    for i, p, _ in core.pieces(KeyRange(0, 100)):
        core.request(i, ("push", p), push=True)
    with pytest.raises(RuntimeError, match="unanswered"):  # only at a quiet point
        core.reshard([KeyRange(0, 100)])
    for rid in list(core.sent):
        core.reply(rid, Reply(staleness=0))
    core.take(list(core.sent))
    core.versions = [7, 4]
    last = core.rid
    core.reshard([KeyRange(0, 30), KeyRange(30, 70), KeyRange(70, 100)])
    assert core.versions == [7, 4, 4]  # the oldest version read of any key a shard now holds
    assert [(i, (p.lo, p.hi), (sl.start, sl.stop)) for i, p, sl in core.pieces(KeyRange(20, 80))
            ] == [(0, (20, 30), (0, 10)), (1, (30, 70), (10, 50)), (2, (70, 80), (50, 60))]
    assert [(i, (p.lo, p.hi)) for i, p, _ in core.pieces(KeyRange(0, 100))] == [
        (0, (0, 30)), (1, (30, 70)), (2, (70, 100))]
    assert core.sparse_cuts(np.array([1, 29, 30, 69, 70, 99])) == [(0, 2), (2, 4), (4, 6)]
    rids = [core.request(i, ("push", i), push=True) for i in range(3)]
    assert rids == [last + 1, last + 2, last + 3]  # never reused: servers dedup on them
    assert [core.watermark(i) for i in range(3)] == rids


def test_a_reply_to_a_request_sent_under_the_old_map_notes_no_version():
    core = WorkerCore()
    core.welcome(0, [KeyRange(0, 5), KeyRange(5, 10)], 10)
    handle = Handle("pull", out=np.zeros(10))
    for i, p, sl in core.pieces(KeyRange(0, 10)):
        handle.parts.append((i, core.request(i, ("pull", p)), sl))
    for (i, rid, sl) in handle.parts:  # answered, not yet taken, when the map changes
        core.reply(rid, Reply([np.full(5, float(i))], version=9))
    core.reshard([KeyRange(0, 10)])
    replies = core.take([rid for _, rid, _ in handle.parts])
    core.pull_done(handle, replies)
    np.testing.assert_array_equal(handle.result, [0.0] * 5 + [1.0] * 5)
    assert core.versions == [0]  # shard 1 of the old map is no shard of the new one


# ---- a client following `moved` over real sockets --------------------------------------------

NUM_KEYS = 100


class FakeJob:
    """A fake coordinator and shard servers in one thread (see the module docstring)."""

    def __init__(self, servers: int, apply_mode: str = "arrival", **job):
        self.ctx = new_context()
        self.stop = threading.Event()
        self.routers = [bind_router(self.ctx) for _ in range(servers + 1)]
        self.coord, self.coord_addr = self.routers[0]
        self.addrs = [addr for _, addr in self.routers[1:]]
        self.values = np.zeros(NUM_KEYS)
        self.version = 0
        self.applied: list[tuple] = []  # (address, op, keys applied)
        self.refused: list[tuple] = []  # (address, op)
        self.pulls: list[tuple] = []  # (address, fields) of pulls served
        self.rows: dict = {}  # sparse key -> the sum of its pushed rows
        self.seen: set = set()  # (src, rid) of pushes applied: a retry is answered, not applied
        self.heartbeat_layout = None  # what heartbeat answers say, (epoch, layout)
        self.release_layout = None  # what the start's release says, (epoch, layout)
        self.moved_to(0, [[r, a, lo, hi] for r, (a, (lo, hi)) in enumerate(
            zip(self.addrs, [(0, 50), (50, 100)]))])
        spec = JobSpec.from_dict(make_job(NUM_KEYS, 2, 1, preflight=False, **job))
        self.job = WorkerJob.of(spec, NUM_KEYS, [tuple(s) for s in self.layout], apply_mode,
                                "asp", 0).to_dict()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def moved_to(self, epoch: int, layout: list) -> None:
        """Servers follow map `epoch` from now on (the test's handoff: values stay put)."""
        self.held = {addr: (lo, hi) for _, addr, lo, hi in layout}
        self.epoch, self.layout = epoch, layout

    def _serve(self) -> None:
        poller = zmq.Poller()
        for sock, _ in self.routers:
            poller.register(sock, zmq.POLLIN)
        addr_of = {id(sock): addr for sock, addr in self.routers}
        while not self.stop.is_set():
            for sock, _ in poller.poll(50):
                who, msg, _ = rpc.recv(sock, routed=True)
                if not isinstance(msg, Message):
                    continue
                reply = (self._coordinate(msg) if sock is self.coord
                         else self._shard(addr_of[id(sock)], msg))
                reply.rid, reply.src = msg.rid, "fake"
                rpc.send(sock, reply, who)
        for sock, _ in self.routers:
            sock.close(0)

    def _coordinate(self, msg: Message) -> Message:
        if msg.op == "register":
            return Message("welcome", {"rank": 0, "job": self.job, "epoch": 0})
        if msg.op in ("start", "clock"):
            step = msg["step"] + 1 if msg.op == "clock" else 0
            fields = {"step": step, "batch": 1, "min_version": 0}
            if self.release_layout is not None:
                fields["epoch"], fields["layout"] = self.release_layout
            return Message("release", fields)
        if msg.op == "heartbeat" and self.heartbeat_layout is not None:
            epoch, layout = self.heartbeat_layout
            return Message("ok", {"epoch": epoch, "layout": layout})
        return Message("ok")

    def _shard(self, addr: str, msg: Message) -> Message:
        if msg.op == "push_rows":
            return self._push_rows(addr, msg)
        lo, hi = self.held.get(addr, (0, 0))
        keys = (np.arange(*msg["range"]) if "range" in msg.fields else msg.arrays[0])
        if keys.size and (keys.min() < lo or keys.max() >= hi):
            self.refused.append((addr, msg.op))
            return Message("error", {"msg": f"keys outside [{lo}, {hi})", "code": "moved",
                                     "epoch": self.epoch, "layout": self.layout})
        if msg.op == "pull":
            self.pulls.append((addr, dict(msg.fields)))
            a, b = msg["range"]
            return Message("values", {"version": self.version, "range": [a, b]},
                           [self.values[a:b].copy()])
        if msg.op == "pull_keys":
            return Message("values", {"version": self.version}, [self.values[keys]])
        if (msg.src, msg.rid) not in self.seen:  # push, push_sparse, init
            self.seen.add((msg.src, msg.rid))
            frames = msg.arrays[1:] if msg.op == "push_sparse" else msg.arrays
            vals = (payload.unpack(msg.fields, frames, keys.size) if "enc" in msg.fields
                    else frames[0])
            if msg.op == "init":
                self.values[keys] = vals
            else:
                np.add.at(self.values, keys, vals)
                self.version += 1
            self.applied.append((addr, msg.op, tuple(int(k) for k in keys)))
        return Message("ack", {"version": self.version, "staleness": 0})

    def _push_rows(self, addr: str, msg: Message) -> Message:
        """Rows are placed by the map's server count (sparse/placement.py): refused `moved`
        at a server the map leaves out or when any key is placed on another."""
        keys = msg.arrays[0]
        ranks = [a for _, a, *_ in self.layout]
        if addr not in ranks or (shard_of(keys, len(ranks)) != ranks.index(addr)).any():
            self.refused.append((addr, msg.op))
            return Message("error", {"msg": "rows placed elsewhere", "code": "moved",
                                     "epoch": self.epoch, "layout": self.layout})
        if (msg.src, msg.rid) not in self.seen:
            self.seen.add((msg.src, msg.rid))
            grads = msg.arrays[1].reshape(keys.size, -1)
            for k, g in zip(keys.tolist(), grads):
                self.rows[k] = self.rows.get(k, 0) + g
            self.applied.append((addr, msg.op, tuple(keys.tolist())))
        return Message("ack", {"version": self.version, "staleness": 0})

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        terminate(self.ctx)


@pytest.fixture
def fake():
    job = FakeJob(3)
    yield job
    job.close()


def owner(layout: list, key: int) -> str:
    """An independent look-up of who holds `key` under `layout`."""
    return next(addr for _, addr, lo, hi in layout if lo <= key < hi)


def by_server(applied: list) -> dict:
    out: dict = {}
    for addr, _, keys in applied:
        for k in keys:
            out.setdefault(k, []).append(addr)
    return out


def test_a_pull_refused_moved_is_redone_on_the_new_map_reusing_the_kept_servers_sockets(fake):
    a, b, c = fake.addrs
    fake.values[:] = np.arange(NUM_KEYS)
    with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
        np.testing.assert_array_equal(kv.pull(), np.arange(NUM_KEYS))
        socks, rid = {s.addr: s.sock for s in kv.shards}, kv.core.rid
        fake.moved_to(1, [[0, a, 0, 30], [1, b, 30, 70], [2, c, 70, 100]])
        out = np.zeros(NUM_KEYS)
        assert kv.pull(out=out) is out
        np.testing.assert_array_equal(out, np.arange(NUM_KEYS))
        assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [a, b, c]
        assert kv.shards[0].sock is socks[a] and kv.shards[1].sock is socks[b]
        assert [(s.range.lo, s.range.hi) for s in kv.shards] == [(0, 30), (30, 70), (70, 100)]
        assert kv.core.rid > rid
        assert set(fake.refused) == {(a, "pull"), (b, "pull")}  # refused once, then followed
        np.testing.assert_array_equal(kv.pull((25, 75)), np.arange(25, 75))
        np.testing.assert_array_equal(kv.pull_keys([99, 0, 45]), [99, 0, 45])
        assert len(fake.refused) == 2


def test_a_pushs_refused_parts_are_sent_again_once_each_under_the_new_map(fake):
    a, b, c = fake.addrs
    with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
        kv.map.adopt(1, [[0, a, 0, 30], [1, b, 30, 70], [2, c, 70, 100]])
        fake.moved_to(1, kv_layout := [[0, a, 0, 30], [1, b, 30, 70], [2, c, 70, 100]])
        assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [a, b, c]
        # a is drained, b and c split its keys: a refuses all, b refuses its part's [60, 70)
        new = [[0, b, 0, 60], [1, c, 60, 100]]
        fake.moved_to(2, new)
        grad = np.arange(NUM_KEYS, dtype=np.float64) + 1
        assert kv.push(grad, step=0, batch=1) == 0
        np.testing.assert_array_equal(fake.values, grad)  # every key once
        where = by_server(fake.applied)
        assert where == {k: [owner(kv_layout if k >= 70 else new, k)] for k in range(NUM_KEYS)}
        # the refused parts went again as new messages, split by the new map: exactly once
        assert sorted((keys[0], keys[-1] + 1, addr) for addr, _, keys in fake.applied) == [
            (0, 30, b), (30, 60, b), (60, 70, c), (70, 100, c)]
        assert [s.addr for s in kv.shards] == [b, c]
        # a sparse push met by the next map: its refused keys go again, each once
        fake.applied.clear()
        fake.moved_to(3, third := [[0, b, 0, 20], [1, c, 20, 100]])
        keys = np.array([5, 25, 65, 95, 5])
        kv.push_sparse(keys, np.ones(5), step=1, batch=1)
        assert by_server(fake.applied) == {5: [b, b], 25: [c], 65: [c], 95: [c]}
        assert {k: owner(third, k) for k in (5, 25, 65, 95)} == {5: b, 25: c, 65: c, 95: c}
        np.testing.assert_array_equal(fake.values[keys], grad[keys] + [2, 1, 1, 1, 2])


def test_an_arrival_push_of_rows_refused_moved_goes_again_placed_by_the_new_count():
    job = FakeJob(3, tables=[{"name": "emb", "dim": 2}])
    try:
        a, b, c = job.addrs
        with KVWorker(job.coord_addr, heartbeat=False, keys=None) as kv:
            kv.map.adopt(1, [[0, a, 0, 30], [1, b, 30, 70], [2, c, 70, 100]])
            job.moved_to(2, new := [[0, b, 0, 60], [1, c, 60, 100]])  # a drained
            keys = np.arange(-40, 40, 3, dtype=np.int64)
            grads = np.arange(2 * keys.size, dtype=np.float32).reshape(-1, 2)
            kv.rows.push("emb", np.concatenate([keys, keys[:4]]),
                         np.concatenate([grads, grads[:4]]), step=0, batch=1)
            owner = shard_of(keys, 2)
            where = by_server([x for x in job.applied if x[1] == "push_rows"])
            # each key once, where the new count places it (a duplicate's grads summed)
            assert where == {int(k): [new[int(o)][1]] for k, o in zip(keys, owner)}
            for i, k in enumerate(keys.tolist()):
                np.testing.assert_array_equal(job.rows[k], grads[i] * (2 if i < 4 else 1))
            assert kv.map.epoch == 2 and job.refused
    finally:
        job.close()


def test_an_encoded_push_refused_moved_goes_again_as_the_values_it_stood_for(fake):
    a, b, c = fake.addrs
    fake.job["dtype"] = "float32"
    fake.values = np.zeros(NUM_KEYS, np.float32)
    with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
        fake.moved_to(1, [[0, a, 0, 10], [1, c, 10, 100]])
        grad = np.linspace(-1, 1, NUM_KEYS, dtype=np.float32)
        sent = np.empty_like(grad)
        handle = kv.push_async(grad, step=0, batch=1, codec=make_codec("bf16"), sent=sent)
        kv.wait(handle)
        np.testing.assert_array_equal(fake.values, sent)  # what the shards added, once
        assert not np.array_equal(sent, grad)  # (bf16 rounded them)
        assert set(fake.refused) == {(a, "push"), (b, "push")}


def test_layouts_heard_from_heartbeats_and_releases_are_followed_before_the_next_request(fake):
    a, b, c = fake.addrs
    fake.values[:] = np.arange(NUM_KEYS)
    fake.release_layout = (1, [[0, b, 0, 40], [1, c, 40, 100]])
    with KVWorker(fake.coord_addr, keys=None) as kv:
        kv.start()
        assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [b, c]
        fake.moved_to(*fake.release_layout)
        fake.moved_to(2, two := [[0, c, 0, 70], [1, a, 70, 100]])
        fake.heartbeat_layout = (2, two)
        deadline = time.monotonic() + 10
        while kv.session.layout is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kv.session.layout == (2, two)
        np.testing.assert_array_equal(kv.pull(), np.arange(NUM_KEYS))
        assert kv.map.epoch == 2 and [s.addr for s in kv.shards] == [c, a]
        assert fake.refused == []  # switched before the pull: no server refused anything
        assert not kv.map.adopt(1, [[0, a, 0, 100]])  # older: ignored


def test_a_delta_pull_refused_moved_is_redone_dense_and_a_chunked_push_is_refused_clearly():
    fake = FakeJob(3, dtype="float32", chunk_bytes=64, tcp_chunk_bytes=64)
    a, b, c = fake.addrs
    try:
        with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
            fake.values = np.arange(NUM_KEYS, dtype=np.float32)
            out = np.zeros(NUM_KEYS, np.float32)
            kv.pull(out=out, ref=True)  # chunks of 16 keys
            fake.moved_to(1, [[0, a, 0, 60], [1, c, 60, 100]])
            fake.pulls.clear()
            kv.pull(out=out, delta=make_codec("bf16"))
            np.testing.assert_array_equal(out, np.arange(NUM_KEYS))
            assert [s.addr for s in kv.shards] == [a, c]
            # again, dense: 4 chunks of 16 keys to a, 3 to c (which only ever got these)
            assert len([f for _, f in fake.pulls if f.get("ref")]) == 7
            assert all(f.get("ref") and "delta" not in f for addr, f in fake.pulls if addr == c)
            fake.moved_to(2, [[0, c, 0, 100]])
            with pytest.raises(RemoteError, match="chunked push met a moved shard"):
                kv.push(np.ones(NUM_KEYS, np.float32), step=0, batch=1)
    finally:
        fake.close()


def test_a_round_mode_push_meeting_moved_raises_naming_the_server_and_the_map():
    fake = FakeJob(2, apply_mode="round")
    a, b = fake.addrs[:2]
    try:
        with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
            fake.moved_to(4, [[0, b, 0, 100]])
            with pytest.raises(RemoteError, match="round-mode push met a moved shard") as err:
                kv.push(np.ones(NUM_KEYS), step=0, batch=1, round_size=1)
            assert f"at {a} refused push" in str(err.value) and "shard map 4" in str(err.value)
    finally:
        fake.close()


def test_a_release_naming_a_new_map_while_a_pull_sent_ahead_is_in_flight_waits_for_it():
    """Round mode's pull ahead: the release of the next step names the new map while the pull
    sent under the old one is unanswered; the client switches before its next request."""
    fake = FakeJob(3, apply_mode="round")
    a, b, c = fake.addrs
    try:
        with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
            fake.values[:] = np.arange(NUM_KEYS)
            kv.start()
            ahead = kv.pull_async()
            fake.release_layout = (1, new := [[0, c, 0, 25], [1, a, 25, 100]])
            kv.clock(0, batch=1, compute_time=0.0)
            assert kv.map.epoch == 0  # not while the pull is in flight
            np.testing.assert_array_equal(kv.wait(ahead), np.arange(NUM_KEYS))
            fake.moved_to(1, new)  # (the servers switched at the fence, after answering it)
            kv.push(np.ones(NUM_KEYS), step=1, batch=1, round_size=1)
            assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [c, a]
            assert fake.refused == [] and by_server(fake.applied) == {
                k: [owner(new, k)] for k in range(NUM_KEYS)}
    finally:
        fake.close()


def test_pipelined_pushes_all_refused_are_each_sent_again_once():
    """Two async pushes in flight when the map changes: the first one's wait follows the map
    once the second's replies are in too, and the second's refused parts go again as well."""
    fake = FakeJob(3)
    a, b, c = fake.addrs
    try:
        with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
            fake.moved_to(1, new := [[0, c, 0, 40], [1, b, 40, 100]])
            h1 = kv.push_async(np.ones(NUM_KEYS), step=0, batch=1)
            h2 = kv.push_async(np.full(NUM_KEYS, 2.0), step=0, batch=1)
            assert kv.wait(h1) == 0 and kv.wait(h2) == 0
            np.testing.assert_array_equal(fake.values, np.full(NUM_KEYS, 3.0))
            assert by_server(fake.applied) == {k: [owner(new, k)] * 2 for k in range(NUM_KEYS)}
            assert set(fake.refused) == {(a, "push")}
    finally:
        fake.close()


def test_a_server_the_pending_map_drops_is_not_judged_gone_and_kept_monitors_carry_over():
    """ShardLinks on a new map: a kept DEALER keeps its monitor; until the client switches, a
    server the newer map no longer names (drained, shutting down) is not reported gone."""
    ctx = new_context()
    live, live_addr = bind_router(ctx)
    dead, dead_addr = bind_router(ctx)
    dead.close(0)  # its port refuses: the DEALER's reconnects are retried, and say so
    shards = [SimpleNamespace(rank=r, addr=a, sock=connect_dealer(ctx, a, peer="server"))
              for r, a in enumerate([live_addr, dead_addr])]
    links, first = ShardLinks(shards, limit=0.05), list(shards)
    try:
        deadline = time.monotonic() + 10
        while links.down_since[1] is None and time.monotonic() < deadline:
            links._read(time.monotonic())
            time.sleep(0.02)
        time.sleep(0.1)
        with pytest.raises(TimeoutError, match=f"at {dead_addr} has been unreachable"):
            links.check()
        links.leaving = frozenset([dead_addr])
        links.check()  # excused: the map that drops it is pending
        kept = links.monitors[0]
        old = list(shards)
        shards = [SimpleNamespace(rank=0, addr=live_addr, sock=old[0].sock)]
        links.reshard(shards, old)
        old[1].sock.close(0)
        assert links.monitors == [kept] and links.leaving == frozenset()
        links.check()
    finally:
        links.close()
        live.close(0)
        terminate(ctx, [s.sock for s in first])


def test_a_release_naming_the_map_already_followed_changes_nothing():
    """A release may name the map the worker follows already: a coordinator restarted in
    place of a dead one (taken-back workers' releases say the map once more). It used to
    switch to no map at all (AttributeError: 'NoneType' object has no attribute 'shards'),
    killing every worker."""
    fake = FakeJob(3, apply_mode="round")
    a, b, c = fake.addrs
    try:
        with KVWorker(fake.coord_addr, heartbeat=False, keys=None) as kv:
            fake.values[:] = np.arange(NUM_KEYS)
            fake.release_layout = (1, new := [[0, c, 0, 25], [1, a, 25, 100]])
            fake.moved_to(*fake.release_layout)
            kv.start()
            assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [c, a]
            kv.clock(0, batch=1, compute_time=0.0)  # its release says map 1 again
            assert kv.map.epoch == 1 and [s.addr for s in kv.shards] == [c, a]
            np.testing.assert_array_equal(kv.pull(), np.arange(NUM_KEYS))
            assert fake.refused == []
    finally:
        fake.close()
