"""Live resharding, the server side: handoff pieces against direct slicing, the `moved`
refusal of the shard core, and live ServerNodes (threads of this process, real sockets on
127.0.0.1) moving keys on a `reshard`. The coordinator is a test ROUTER sending what
coordinator/reshard.py would; the real one drives real servers in tests/server/test_reshard_live.py."""

import numpy as np
import pytest

from paramserver.server.core import ShardCore
from paramserver.server.events import (
    Init, Pull, Push, PushSparse, Rebuild, ShardSettings, Status,
)
from paramserver.server.handoff import (
    Assembly, HandoffError, Piece, cut, parse_layout, piece_keys, plan,
)
from paramserver.wire import Message, decode, encode
from paramserver.transport import terminate

N = 200


def settings(rank, lo, hi, optimizer="momentum", **options):
    return ShardSettings(rank=rank, lo=lo, hi=hi, dtype="float32", apply_mode="arrival",
                         optimizer=optimizer, lr=0.1, optimizer_options=options)


def layout(cuts, addrs):
    return [[r, a, lo, hi] for r, (a, lo, hi) in enumerate(zip(addrs, cuts[:-1], cuts[1:]))]


def random_cuts(rng, shards):
    inner = sorted(rng.choice(np.arange(1, N), size=shards - 1, replace=False).tolist())
    return [0, *inner, N]


def trained_cores(rng, cuts, optimizer, **options):
    """One core per old shard, initialized and pushed to by two workers (each worker's
    optimizer state appears with its first push)."""
    cores = []
    for r, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        c = ShardCore(settings(r, lo, hi, optimizer, **options))
        c.handle(Init("i", lo, hi, rng.standard_normal(hi - lo).astype(np.float32)))
        for rid in range(1, 6):
            for w in ("w0", "w1"):
                g = rng.standard_normal(hi - lo).astype(np.float32)
                assert c.handle(Push("t", w, rid, lo, hi, g, rid, 1, 0))[-1].op == "ack"
        cores.append(c)
    return cores


def global_arrays(cores):
    """The reference: every per-key array of the old shards concatenated over the key space."""
    names = set().union(*(c.store.state for c in cores))
    out = {"values": np.concatenate([c.store.values.numpy() for c in cores])}
    for name in names:
        out[name] = np.concatenate([
            c.store.state[name].numpy() if name in c.store.state
            else np.zeros(c.store.range.size, np.float32) for c in cores])
    return out


def wire(piece, epoch):
    """A piece through the real codec: what a receiver parses."""
    fields, arrays = piece.message(epoch)
    msg = decode(encode(Message("handoff", fields, arrays, src="s0")))
    return Piece.parse(msg.fields, msg.arrays, "float32")


@pytest.mark.parametrize("optimizer,options", [("momentum", {"momentum": 0.9}),
                                               ("adagrad-global", {}),
                                               ("adagrad-global", {"granularity": "worker"}),
                                               ("adam", {"weight_decay": 0.01}),
                                               ("torch-sgd", {"momentum": 0.9})])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_assemble_shifted_ranges_exactly_as_direct_slicing(seed, optimizer, options):
    rng = np.random.default_rng(seed)
    old_n, new_n = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    old_cuts, new_cuts = random_cuts(rng, old_n), random_cuts(rng, new_n)
    # Some servers stay (maybe under another rank), some leave, some join.
    pool = [f"tcp://h:{p}" for p in range(8)]
    old_addrs = list(rng.permutation(pool[:5])[:old_n])
    new_addrs = list(rng.permutation(pool[2:])[:new_n])
    old, new = layout(old_cuts, old_addrs), layout(new_cuts, new_addrs)
    cores = trained_cores(rng, old_cuts, optimizer, **options)
    ref = global_arrays(cores)
    by_addr = dict(zip(old_addrs, cores))
    assemblies = {a: Assembly(lo, hi, "float32") for _, a, lo, hi in new}
    max_keys = int(rng.integers(1, 30))
    for addr in set(old_addrs) | set(new_addrs):
        move = plan(3, old, new, addr)
        assert move.drained == (addr not in new_addrs)
        if move.kept is not None:
            assemblies[addr].keep(by_addr[addr].store, *move.kept)
        for to, lo, hi in move.sends:
            pieces = cut(by_addr[addr].store, lo, hi, max_keys)
            assert [p.lo for p in pieces] == list(range(lo, hi, max_keys))
            assert all(p.hi - p.lo <= max_keys for p in pieces)
            for p in pieces:
                assemblies[to].add(wire(p, 3))
    for r, (_, addr, lo, hi) in enumerate(new):
        asm = assemblies[addr]
        assert asm.whole and asm.missing() == []
        core = ShardCore(settings(r, lo, hi, optimizer, **options))
        asm.install(core.store)
        np.testing.assert_array_equal(core.store.values.numpy(), ref["values"][lo:hi])
        for name, t in core.store.state.items():
            if t.shape == core.store.values.shape and name in ref:
                np.testing.assert_array_equal(t.numpy(), ref[name][lo:hi], err_msg=name)
        assert core.store.version == max(c.store.version for c in cores
                                         if c.store.range.lo < hi and lo < c.store.range.hi)
        if options.get("granularity") == "worker":  # scalar state: one contributor's
            assert {n for n in core.store.state if n.startswith("sumsq/")} == {"sumsq/w0",
                                                                               "sumsq/w1"}


def test_assembly_takes_every_key_once_and_says_what_is_missing():
    asm = Assembly(10, 30, "float32")
    assert asm.missing() == [(10, 30)] and not asm.whole
    asm.add(Piece(15, 20, 4, np.ones(5, np.float32)))
    asm.add(Piece(25, 30, 7, np.full(5, 2, np.float32)))
    assert asm.missing() == [(10, 15), (20, 25)]
    with pytest.raises(HandoffError, match="overlaps"):
        asm.add(Piece(18, 22, 4, np.ones(4, np.float32)))
    with pytest.raises(HandoffError, match="outside"):
        asm.add(Piece(28, 31, 4, np.ones(3, np.float32)))
    with pytest.raises(HandoffError, match="float32"):
        asm.add(Piece(10, 12, 4, np.ones(2, np.float64)))
    asm.add(Piece(10, 15, 1, np.zeros(5, np.float32)))
    asm.add(Piece(20, 25, 1, np.zeros(5, np.float32)))
    assert asm.whole and asm.version == 7
    core = ShardCore(settings(0, 10, 30))
    with pytest.raises(HandoffError, match="missing"):
        Assembly(10, 31, "float32").install(core.store)
    asm.install(core.store, version_floor=9)
    assert core.store.version == 9 and core.store.initialized
    assert core.store.values.numpy().tolist() == [0] * 5 + [1] * 5 + [0] * 5 + [2] * 5
    assert core.store.state["momentum"].numpy().tolist() == [0] * 20  # none came: zeros


def test_plan_join_drain_and_bad_layouts():
    old = [[0, "a", 0, 50], [1, "b", 50, 100]]
    new = [[0, "a", 0, 30], [1, "c", 30, 70], [2, "b", 70, 100]]
    assert plan(1, old, new, "a").sends == (("c", 30, 50),)
    assert plan(1, old, new, "a").kept == (0, 30)
    joiner = plan(1, old, new, "c")
    assert joiner.old is None and joiner.sends == () and joiner.new.rank == 1
    assert plan(1, old, new, "b").new.rank == 2
    drained = plan(2, new, old, "c")
    assert drained.drained and drained.sends == (("a", 30, 50), ("b", 50, 70))
    for bad, why in [([[0, "a", 0, 50], [1, "b", 60, 100]], "previous one ends"),
                     ([[1, "a", 0, 100]], "ranks go"),
                     ([[0, "a", 0, 50], [1, "a", 50, 100]], "twice"),
                     ([[0, "a", 0]], "rank, addr, lo, hi"),
                     ([[0, "a", 50, 10]], "shards.hi")]:
        with pytest.raises(HandoffError, match=why):
            parse_layout(bad)
    with pytest.raises(HandoffError, match="covers"):
        plan(1, old, [[0, "a", 0, 90]], "a")
    with pytest.raises(HandoffError, match="neither"):
        plan(1, old, new, "z")
    assert piece_keys(4, 100 << 20, 16 << 20) == 4 << 20
    assert piece_keys(4, 2 << 20, 16 << 20) == 1 << 18  # half the receiver's frame limit
    assert piece_keys(8, 100 << 20) == 1 << 17  # chunk_bytes not known: 1 MB pieces
    assert piece_keys(4, 100 << 20, 16 << 20, arrays=2) == 2 << 20  # values + momentum


def test_rows_assembly_is_whole_once_every_old_server_said_its_count():
    from paramserver.server.handoff import RowsAssembly, rows_pieces
    from paramserver.sparse.moves import RowBundle, split
    from paramserver.sparse.table import SparseTable
    table = SparseTable(2, capacity=100)
    table.push(np.arange(10, dtype=np.int64), np.ones((10, 2), np.float32))
    (bundle,) = split(table, lambda k: np.zeros(len(k), np.int64)).values()
    pieces = rows_pieces({"emb": bundle}, 4)
    assert [len(p) for _, p in pieces] == [4, 4, 2]
    assert len(rows_pieces({"emb": RowBundle.empty(2, True)}, 4)) == 1  # one, empty: a count
    asm = RowsAssembly({"emb": 2}, {"emb": True})
    frames = [p.frames() for _, p in pieces]
    asm.add(2, "emb", bundle.tick, frames[0], None)  # before the old layout is known
    assert not asm.whole and asm.waiting() is None
    asm.expect([0, 2])
    assert asm.waiting() == [0, 2]
    with pytest.raises(HandoffError, match="sends none"):
        asm.add(1, "emb", 0, frames[1], None)
    with pytest.raises(HandoffError, match="said 3 piece"):
        asm.add(2, "emb", bundle.tick, frames[1], 3)  # the count of three on the second
    asm.add(2, "emb", bundle.tick, frames[1], None)  # (the refusal changed nothing)
    asm.add(2, "emb", bundle.tick, frames[2], 3)
    with pytest.raises(HandoffError, match="after its last piece"):
        asm.add(2, "emb", bundle.tick, frames[2], None)
    with pytest.raises(HandoffError, match="table 'other'"):
        asm.add(0, "other", 0, frames[0], 1)
    assert asm.waiting() == [0]
    asm.add(0, "emb", 0, RowBundle.empty(2, True).frames(), 1)
    assert asm.whole and sum(len(b) for b in asm.bundles["emb"]) == 10
    early = RowsAssembly({"emb": 2}, {"emb": True})
    early.add(7, "emb", 0, frames[0], None)  # from a server the old layout turns out not to hold
    with pytest.raises(HandoffError, match="not of the old layout"):
        early.expect([0])


def test_piece_that_does_not_match_its_header_is_refused():
    fields, arrays = Piece(0, 4, 1, np.ones(4, np.float32),
                           (("momentum", np.ones(4, np.float32)),)).message(0)
    with pytest.raises(HandoffError, match="carries"):
        Piece.parse(fields, arrays[:1], "float32")
    with pytest.raises(HandoffError, match="expected float32"):
        Piece.parse(fields, [arrays[0], np.ones(3, np.float32)], "float32")
    with pytest.raises(HandoffError, match="empty"):
        Piece.parse({**fields, "hi": 0}, arrays, "float32")


# ---- the core's `moved` refusal -----------------------------------------------------------------
LAYOUT = [[0, "a", 0, 10], [1, "b", 10, 20]]


def resharded_core():
    """Shard [0, 20) with one push applied (rid 1), then resharded to keep [0, 10)."""
    c = ShardCore(settings(0, 0, 20, "sgd"))
    c.handle(Init("i", 0, 20, np.zeros(20, np.float32)))
    assert c.handle(Push("t", "w", 1, 0, 20, np.ones(20, np.float32), 0, 1, 0))[-1].op == "ack"
    asm = Assembly(0, 10, "float32")
    asm.keep(c.store, 0, 10)
    assert c.handle(Rebuild(settings(0, 0, 10, "sgd"), asm, 1, LAYOUT)) == []
    assert (c.store.range.lo, c.store.range.hi, c.epoch) == (0, 10, 1)
    return c


def test_requests_outside_the_range_are_refused_moved_with_nothing_applied():
    c = resharded_core()
    before = c.store.values.numpy().copy()
    requests = [Push(("w", 2), "w", 2, 5, 15, np.ones(10, np.float32), 1, 1, 1),
                PushSparse(("w", 3), "w", 3, np.array([3, 12]), np.ones(2, np.float32), 1, 1,
                           1),
                Pull(("w", 4), 0.0, 0, 10, 12),
                Pull(("w", 5), 0.0, 0, keys=np.array([0, 19])),
                Init(("w", 6), 0, 20, np.zeros(20, np.float32))]
    for ev in requests:
        (reply,) = c.handle(ev)
        assert reply.op == "error" and reply.fields["code"] == "moved", ev
        assert reply.fields["epoch"] == 1 and reply.fields["layout"] == LAYOUT
    np.testing.assert_array_equal(c.store.values.numpy(), before)
    assert c.store.updates_applied == 1 and c.retries.duplicates == 0
    # Nothing of them is in the dedup table: the same rids in range are applied as new.
    assert c.handle(Push(("w", 2), "w", 2, 0, 10, np.ones(10, np.float32), 1, 1, 1))[-1].op \
        == "ack"
    assert c.store.updates_applied == 2 and c.retries.duplicates == 0
    assert c.handle(Pull("p", 0.0, 0, 0, 10))[0].op == "values"


def test_retry_of_a_push_applied_before_the_reshard_is_answered_not_moved():
    c = resharded_core()
    (ack,) = c.handle(Push(("w", 1), "w", 1, 0, 20, np.ones(20, np.float32), 0, 1, 0))
    assert ack.op == "ack" and c.retries.duplicates == 1 and c.store.updates_applied == 1
    # A drained server (an empty range) still answers it, and refuses everything else.
    c.handle(Rebuild(settings(0, 10, 10, "sgd"), None, 2, [[0, "b", 0, 20]]))
    d = c
    assert d.handle(Push(("w", 1), "w", 1, 0, 20, np.ones(20, np.float32), 0, 1, 0))[0].op \
        == "ack"
    (moved,) = d.handle(Pull(("w", 9), 0.0, 0, 0, 1))
    assert moved.fields["code"] == "moved" and moved.fields["epoch"] == 2
    assert d.handle(Status("s"))[0].fields["state"]["duplicates"] == 2


def test_waiting_pulls_are_served_or_moved_by_the_rebuilt_shard():
    c = ShardCore(settings(0, 0, 20, "sgd"))
    c.handle(Init("i", 0, 20, np.zeros(20, np.float32)))
    assert c.handle(Pull(("p", 1), 0.0, 5, 0, 5)) == ()  # waits for version 5
    assert c.handle(Pull(("p", 2), 0.0, 5, 15, 20)) == ()
    asm = Assembly(0, 10, "float32")
    asm.keep(c.store, 0, 10)
    out = c.handle(Rebuild(settings(0, 0, 10, "sgd"), asm, 1, LAYOUT, version_floor=5))
    assert len(c.pulls) == 0
    by_to = {r.to: r for r in out}
    assert by_to[("p", 1)].op == "values" and by_to[("p", 1)].fields["version"] == 5
    assert by_to[("p", 2)].fields["code"] == "moved"
    # Without a known layout a request outside is bad input, as before resharding existed.
    (refused,) = ShardCore(settings(0, 0, 10, "sgd")).handle(Pull("x", 0.0, 0, 5, 15))
    assert refused.fields["code"] == "refused"


def test_a_round_mode_shard_rebuilt_starts_at_the_round_version_and_drops_late_pushes():
    from paramserver.server.events import ApplyRound
    s = ShardSettings(rank=0, lo=0, hi=20, dtype="float32", apply_mode="round",
                      optimizer="sgd", lr=1.0)
    c = ShardCore(s)
    c.handle(Init("i", 0, 20, np.zeros(20, np.float32)))
    c.handle(Push(("w", 1), "w", 1, 0, 20, np.ones(20, np.float32), 3, 1, 0))
    c.handle(ApplyRound(None, 3))
    assert c.store.last_round == 3 and c.store.version == 1
    asm = Assembly(0, 10, "float32")
    asm.keep(c.store, 0, 10)
    c.handle(Rebuild(ShardSettings(rank=0, lo=0, hi=10, dtype="float32", apply_mode="round",
                                   optimizer="sgd", lr=1.0), asm, 1, LAYOUT, version_floor=4))
    new = c
    assert new.store.version == 4 and new.store.last_round == 3
    # A push for the round applied before the move is late, as it would have been there.
    new.handle(Push(("w", 2), "w", 2, 0, 10, np.ones(10, np.float32), 3, 1, 0))
    assert new.store.late_pushes == 1
    np.testing.assert_array_equal(new.store.values.numpy(), -np.ones(10, np.float32))
    # The next round is taken and applied as usual.
    new.handle(Push(("w", 3), "w", 3, 0, 10, np.ones(10, np.float32), 4, 1, 4))
    new.handle(ApplyRound(None, 4))
    assert new.store.version == 5
    np.testing.assert_array_equal(new.store.values.numpy(), np.full(10, -2, np.float32))


# ---- live ServerNodes, driven by a test ROUTER acting as the coordinator ------------------------
# The real coordinator side (coordinator/reshard.py) is the lead's: FakeCoordinator welcomes the
# servers and sends the `reshard` messages it would, and collects the `resharded` reports.
LIMIT = 8192  # the servers' frame limit: a piece (values + momentum) is 512 float32 keys
KEYS = 6000


def server_job(lo, hi, **extra):
    from paramserver.spec.job import OptimizerSpec
    from paramserver.spec.welcome import ServerJob
    return ServerJob((lo, hi), "float32", "arrival", OptimizerSpec("momentum", 0.5,
                                                                   {"momentum": 0.5}),
                     heartbeat_interval=0.5, coordinator_timeout=60.0, server_threads=1,
                     max_message_bytes=LIMIT, **extra)


class FakeCoordinator:
    """A ROUTER on 127.0.0.1; every wait bounded."""

    def __init__(self, ctx):
        import zmq
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.addr = f"tcp://127.0.0.1:{port}"
        self.idents = {}  # server addr -> ROUTER identity

    def recv(self, op, timeout=10.0):
        """The next message `op` from a server (heartbeats and the like skipped)."""
        import time
        from paramserver.net import rpc
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.sock.poll(int(max(0.0, end - time.monotonic()) * 1000)):
                ident, msg, _ = rpc.recv(self.sock, True)
                if msg is not None and msg.op == op:
                    return ident, msg
        raise AssertionError(f"no {op} from a server within {timeout} s")

    def register(self, timeout=10.0):
        ident, msg = self.recv("register", timeout)
        self.idents[msg["addr"]] = ident
        return msg["addr"]

    def welcome(self, addr, rank, job, **extra):
        self.send(addr, "welcome", {"rank": rank, "job": job.to_dict(), **extra})

    def send(self, addr, op, fields):
        from paramserver.net import rpc
        rpc.send(self.sock, Message(op, fields, src="coordinator"), self.idents[addr])

    def reshard(self, epoch, old, new, to=None):
        for addr in to or {e[1] for e in old + new}:
            self.send(addr, "reshard", {"epoch": epoch, "layout": new, "old": old,
                                        "version": 0})

    def reports(self, n, epoch, old, new):
        """The `resharded` of n servers, then the commit every server of both layouts gets
        (as coordinator/resharding.py sends it once all have reported)."""
        got = [self.recv("resharded")[1] for _ in range(n)]
        for addr in {e[1] for e in old + new}:
            self.send(addr, "reshard_commit", {"epoch": epoch})
        return got


class Worker:
    """A DEALER per server address."""

    def __init__(self, ctx):
        self.ctx, self.socks, self.rid = ctx, {}, 0

    def sock(self, addr):
        import zmq
        if addr not in self.socks:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(addr)
            self.socks[addr] = s
        return self.socks[addr]

    def send(self, addr, op, fields, arrays=()):
        from paramserver.net import rpc
        self.rid += 1
        rpc.send(self.sock(addr), Message(op, fields, list(arrays), rid=self.rid, src="w0"))

    def answer(self, addr, timeout=10.0):
        from paramserver.net import rpc
        assert self.sock(addr).poll(int(timeout * 1000)), f"no answer from {addr}"
        return rpc.recv(self.sock(addr), False)[1]

    def ask(self, addr, op, fields, arrays=()):
        """The answer to this request: one to an earlier `send` is skipped (a malformed piece
        refused while a reshard runs is answered; held before it, it is only logged)."""
        self.send(addr, op, fields, arrays)
        for _ in range(8):
            reply = self.answer(addr)
            if reply.rid == self.rid:
                return reply
        raise AssertionError(f"no answer to request {self.rid} among 8 from {addr}")

    def put(self, addr, op, lo, hi, values, **fields):
        """Init or push [lo, hi) in chunks under the servers' frame limit."""
        for a in range(lo, hi, 1500):
            b = min(hi, a + 1500)
            reply = self.ask(addr, op, {"range": [a, b], **fields}, [values[a:b]])
            assert reply.op == "ack", reply.fields

    def pull(self, addr, lo, hi):
        msg = self.ask(addr, "pull", {"range": [lo, hi]})
        return msg if msg.op == "error" else msg.arrays[0].copy()


@pytest.fixture
def live():
    """(coordinator, worker, start(n) -> the new servers' addresses); every server thread is
    told shutdown and joined at the end."""
    import threading
    import zmq
    from paramserver.server.node import ServerNode
    ctx = zmq.Context()
    coord, w = FakeCoordinator(ctx), Worker(ctx)
    threads = []

    def start(n):
        for _ in range(n):
            node = ServerNode(coord.addr, shared_memory=False, register_timeout=10)
            t = threading.Thread(target=node.run, daemon=True)
            t.start()
            threads.append(t)
        return [coord.register() for _ in range(n)]

    try:
        yield coord, w, start
    finally:
        for addr in coord.idents:
            coord.send(addr, "shutdown", {})
        for t in threads:
            t.join(10)
        for s in w.socks.values():
            s.close(0)
        coord.sock.close(0)
        terminate(ctx)  # bounded: a socket left open must not hold the test
    assert not any(t.is_alive() for t in threads)


def two_servers(coord, w, start):
    """Servers a [0, 3000) and b [3000, 6000) of KEYS keys, initialized and pushed once:
    (a, b, the values after one push, after a second)."""
    a, b = start(2)
    coord.welcome(a, 0, server_job(0, 3000))
    coord.welcome(b, 1, server_job(3000, KEYS))
    x = np.arange(KEYS, dtype=np.float32)
    g = np.ones(KEYS, np.float32)
    for addr, lo, hi in [(a, 0, 3000), (b, 3000, KEYS)]:
        w.put(addr, "init", lo, hi, x)
        w.put(addr, "push", lo, hi, g, step=0, version=0, batch=1)
    # momentum 0.5, lr 0.5: buf = g, x -= 0.5 g; a second push: buf = 1.5 g, x -= 0.75 g
    return a, b, x - 0.5, x - 1.25


def test_live_servers_move_keys_join_and_drain_on_reshard(live):
    """a gives keys [1000, 3000) to b, a third server c joins with [1000, 3500), then is
    drained: each time the new owner serves the moved values (and momentum: a push after the
    move continues it) and the old one answers `moved`. Moves are several pieces each."""
    coord, w, start = live
    a, b, x1, x2 = two_servers(coord, w, start)
    old = [[0, a, 0, 3000], [1, b, 3000, KEYS]]
    new = [[0, a, 0, 1000], [1, b, 1000, KEYS]]
    coord.reshard(1, old, new)
    assert {m["rank"] for m in coord.reports(2, 1, old, new)} == {0, 1}
    np.testing.assert_array_equal(w.pull(b, 1000, KEYS), x1[1000:])
    moved = w.pull(a, 1000, 1010)
    assert moved.fields["code"] == "moved" and moved.fields["epoch"] == 1
    assert moved.fields["layout"] == new
    w.put(b, "push", 1000, KEYS, np.ones(KEYS, np.float32), step=1, version=1, batch=1)
    np.testing.assert_array_equal(w.pull(b, 1000, KEYS), x2[1000:])  # momentum moved too
    # A third server joins with keys [1000, 3500) (the coordinator held its welcome).
    (c,) = start(1)
    joined = [[0, a, 0, 1000], [1, c, 1000, 3500], [2, b, 3500, KEYS]]
    coord.welcome(c, 1, server_job(1000, 3500), epoch=2, handoff=True)
    coord.reshard(2, new, joined)
    reports = {m["rank"]: m for m in coord.reports(3, 2, new, joined)}
    assert sorted(reports) == [0, 1, 2] and reports[1]["epoch"] == 2
    np.testing.assert_array_equal(w.pull(c, 1000, 3500), x2[1000:3500])
    assert w.pull(b, 1000, 1001).fields["code"] == "moved"
    # ... and is drained again: its keys go back to b.
    coord.reshard(3, joined, new)
    reports = coord.reports(3, 3, joined, new)
    assert [r.get("drained", False) for r in reports].count(True) == 1
    np.testing.assert_array_equal(w.pull(b, 1000, KEYS), x2[1000:])
    gone = w.pull(c, 1000, 1001)
    assert gone.fields["code"] == "moved" and gone.fields["layout"] == new


def test_live_requests_while_moving_wait_for_the_rebuild_and_overflow_busy(live):
    """b has heard its reshard, a not yet: b waits for a's keys, holding workers' requests
    (one over the bound is refused "busy"); once a sends and the coordinator commits, the held
    ones are answered under the new layout, in order."""
    from paramserver.server.reshard_link import MAX_QUEUED
    coord, w, start = live
    a, b, x1, _ = two_servers(coord, w, start)
    old = [[0, a, 0, 3000], [1, b, 3000, KEYS]]
    new = [[0, a, 0, 1000], [1, b, 1000, KEYS]]
    coord.reshard(1, old, new, to=[b])
    # (its stall answer comes after it handled the reshard: same socket, in order)
    coord.send(b, "stall_probe", {"n": 1})
    waiting = coord.recv("stall_answer")[1]["waiting"]
    assert waiting["op"] == "handoff" and "[1000, 3000]" in waiting["note"]
    for _ in range(MAX_QUEUED + 1):
        w.send(b, "pull", {"range": [1000, 1010]})
    busy = w.answer(b)
    assert busy.op == "error" and busy.fields["code"] == "busy"
    coord.reshard(1, old, new, to=[a])
    # Whole, b holds them still: its old core serves nothing new until the commit.
    assert {m["epoch"] for m in coord.reports(2, 1, old, new)} == {1}
    for _ in range(MAX_QUEUED):
        reply = w.answer(b)
        assert reply.op == "values", reply.fields
    np.testing.assert_array_equal(reply.arrays[0], x1[1000:1010])


def test_live_servers_keep_their_old_range_until_the_commit_and_after_an_abort(live):
    """Both servers have their new ranges and said so, but the coordinator gives the move up:
    each serves its old range again (nothing of the move applied), and answers the requests
    it held; a pull of a key that was to move was held, not refused, and reads the old value."""
    coord, w, start = live
    a, b, x1, _ = two_servers(coord, w, start)
    old = [[0, a, 0, 3000], [1, b, 3000, KEYS]]
    new = [[0, a, 0, 1000], [1, b, 1000, KEYS]]
    coord.reshard(1, old, new)
    assert {coord.recv("resharded")[1]["rank"] for _ in range(2)} == {0, 1}
    w.send(a, "pull", {"range": [1000, 1010]})  # held: a is moving until the word
    assert not w.sock(a).poll(300)
    for addr in (a, b):
        coord.send(addr, "reshard_abort", {"epoch": 1})
    held = w.answer(a)
    assert held.op == "values", held.fields
    np.testing.assert_array_equal(held.arrays[0], x1[1000:1010])
    np.testing.assert_array_equal(w.pull(a, 0, 3000), x1[:3000])
    np.testing.assert_array_equal(w.pull(b, 3000, KEYS), x1[3000:])
    assert w.pull(b, 1000, 1010).op == "error"  # b never took [1000, 3000)
    # The same move again, under the next epoch, goes through.
    coord.reshard(2, old, new)
    coord.reports(2, 2, old, new)
    np.testing.assert_array_equal(w.pull(b, 1000, KEYS), x1[1000:])


def test_live_table_rows_follow_their_placement_through_a_join_and_a_drain(live):
    """Two servers holding a sparse table's rows (adagrad, admission after 2 pushes): a third
    joins, then is drained. Each time every row, its accumulator and its admission count
    are on the shard the new server count places it on, read exactly as one table that never
    moved reads them; the old owner answers `moved`; training goes on alike."""
    from paramserver.spec.job import TableSpec
    from paramserver.sparse.placement import shard_of
    from paramserver.sparse.table import SparseTable
    coord, w, start = live
    spec = TableSpec("emb", 4, row_budget=4000, admit_after=2)
    a, b = start(2)
    old = [[0, a, 0, 3000], [1, b, 3000, KEYS]]
    for rank, (_, addr, lo, hi) in enumerate(old):
        coord.welcome(addr, rank, server_job(lo, hi, tables=(spec,), servers=2))
        w.put(addr, "init", lo, hi, np.zeros(KEYS, np.float32))
    reference = SparseTable.of(spec, 4000)
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-10**12, 10**12, 700)).astype(np.int64)

    def push(layout, batch):
        """One push of `batch`'s rows to their shards and to the reference."""
        grads = rng.standard_normal((len(batch), 4)).astype(np.float32)
        reference.push(batch, grads)
        owner = shard_of(batch, len(layout))
        for rank, addr, *_ in layout:
            mine = owner == rank
            reply = w.ask(addr, "push_rows", {"table": "emb", "step": 0, "version": 0,
                                              "batch": 1}, [batch[mine], grads[mine].ravel()])
            assert reply.op == "ack", reply.fields

    def check(layout):
        owner = shard_of(keys, len(layout))
        for rank, addr, *_ in layout:
            got = w.ask(addr, "pull_rows", {"table": "emb"}, [keys[owner == rank]])
            assert got.op == "rows", got.fields
            np.testing.assert_array_equal(got.arrays[0].reshape(-1, 4),
                                          reference.pull(keys[owner == rank]))

    for batch in (keys, keys[:500], keys[::3]):  # keys[500:] seen once: candidates, no rows
        push(old, batch)
    check(old)
    (c,) = start(1)
    joined = [[0, a, 0, 2000], [1, c, 2000, 4000], [2, b, 4000, KEYS]]
    # A malformed piece for the coming reshard, before it: refused alone when it begins.
    w.send(b, "handoff_rows", {"epoch": 1, "from": 0, "table": "emb", "tick": 0},
           [np.zeros(3, np.int64)])
    coord.welcome(c, 1, server_job(2000, 4000, tables=(spec,), servers=2), epoch=1,
                  handoff=True)
    coord.reshard(1, old, joined)
    assert sorted(m["rank"] for m in coord.reports(3, 1, old, joined)) == [0, 1, 2]
    check(joined)
    stale = keys[shard_of(keys, 2) != shard_of(keys, 3)][:5]
    owner2 = shard_of(stale, 2)
    moved = w.ask(old[int(owner2[0])][1], "pull_rows", {"table": "emb"},
                  [stale[owner2 == owner2[0]]])
    assert moved.op == "error" and moved.fields["code"] == "moved", moved.fields
    push(joined, keys[450:])  # candidates that moved are admitted on their second push
    check(joined)
    coord.reshard(2, joined, old)
    reports = coord.reports(3, 2, joined, old)
    assert [r.get("drained", False) for r in reports].count(True) == 1
    check(old)
    push(old, keys)
    check(old)
    gone = w.ask(c, "pull_rows", {"table": "emb"}, [keys[:3]])
    assert gone.op == "error" and gone.fields["code"] == "moved"


def _serve(join):
    from paramserver.server.node import ServerNode
    raise SystemExit(ServerNode(join, shared_memory=False, register_timeout=10).run())


@pytest.mark.slow  # (~8 s: a server process imports torch)
def test_sigterm_asks_to_drain_and_the_drained_server_hands_its_keys_over():
    """A server process of an elastic-servers job told SIGTERM sends `drain` and goes on
    serving; drained by the next reshard it sends its keys (here to a test ROUTER standing
    for the receiving server), reports, answers `moved`, and exits on shutdown with 143
    (PREEMPTED: drained on SIGTERM, docs/multihost.md "Exit codes"), as an elastic worker."""
    import os
    import signal
    import zmq
    from paramserver.net import rpc
    from ps_helpers import CTX
    ctx = zmq.Context()
    coord, w = FakeCoordinator(ctx), Worker(ctx)
    peer = ctx.socket(zmq.ROUTER)
    peer.setsockopt(zmq.LINGER, 0)
    peer_addr = f"tcp://127.0.0.1:{peer.bind_to_random_port('tcp://127.0.0.1')}"
    proc = CTX.Process(target=_serve, args=(coord.addr,), daemon=True)
    proc.start()
    try:
        a = coord.register(timeout=30)
        coord.welcome(a, 0, server_job(0, 3000, max_servers=2))
        x = np.arange(3000, dtype=np.float32)
        w.put(a, "init", 0, 3000, x)
        coord.send(a, "stall_probe", {"n": 1})  # (answered from the loop: handler set)
        coord.recv("stall_answer")
        os.kill(proc.pid, signal.SIGTERM)
        assert coord.recv("drain")[1]["rank"] == 0
        np.testing.assert_array_equal(w.pull(a, 0, 10), x[:10])  # still serving
        coord.reshard(1, [[0, a, 0, 3000]], [[0, peer_addr, 0, 3000]], to=[a])
        got = np.zeros(3000, np.float32)
        for _ in range(6):  # values + momentum of 512 keys a piece under the 8 KB limit
            assert peer.poll(10_000)
            _, msg, _ = rpc.recv(peer, True)
            assert msg.op == "handoff" and msg["epoch"] == 1
            got[msg["lo"]:msg["hi"]] = msg.arrays[0]
        np.testing.assert_array_equal(got, x)
        report = coord.recv("resharded")[1]
        assert report.fields == {"epoch": 1, "rank": 0, "version": 0, "drained": True}
        coord.send(a, "reshard_commit", {"epoch": 1})
        assert w.pull(a, 0, 10).fields["code"] == "moved"
        coord.send(a, "shutdown", {})
        proc.join(10)
        assert proc.exitcode == 143
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        for s in (*w.socks.values(), peer, coord.sock):
            s.close(0)
        terminate(ctx)  # bounded: a socket left open must not hold the test
