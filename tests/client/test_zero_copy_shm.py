"""Frames by reference through shared memory between processes of one host (transport.shm)."""

import multiprocessing as mp

import numpy as np
import zmq

from paramserver.transport import (
    bind_router, connect_dealer, recv_message, send_frames, shm, terminate,
)

CTX = mp.get_context("spawn")


def test_local_addresses_only():
    assert shm.local_address("tcp://127.0.0.1:5555") and shm.local_address("ipc:///tmp/x")
    assert shm.local_address("tcp://localhost:1")
    assert not shm.local_address("tcp://10.0.0.2:5555")
    assert not shm.local_address("tcp://192.168.1.1:1")


def test_env_switch(monkeypatch):
    monkeypatch.setenv("PARAMSERVER_SHM", "0")
    assert not shm.enabled()
    monkeypatch.setenv("PARAMSERVER_SHM", "1")
    assert shm.enabled()


def test_arena_allocates_inside_and_knows_its_own_buffers():
    arena = shm.Arena(1 << 20)
    a = arena.alloc(1000, np.float32)
    b = arena.alloc(1000, np.float64)
    assert a is not None and b is not None and not a.any()
    assert arena.offset(memoryview(a)) is not None and arena.offset(memoryview(b[10:20])) is not None
    assert arena.offset(memoryview(np.zeros(10))) is None
    assert arena.alloc(1 << 20, np.uint8) is None  # full: the caller falls back to plain memory
    peer = shm.PeerArena.attach(arena.describe())
    a[:] = 7
    off = arena.offset(memoryview(a))
    np.testing.assert_array_equal(np.frombuffer(peer.frame(off, a.nbytes), np.float32), a)
    assert peer.frame(0, 8) is None  # the header page is not a frame
    assert shm.PeerArena.attach({**arena.describe(), "host": "elsewhere"}) is None


def _pair():
    ctx = zmq.Context()
    router, addr = bind_router(ctx)
    dealer = connect_dealer(ctx, addr)
    return ctx, router, dealer


def _recv(sock, routed):
    while True:
        assert sock.poll(5000)
        ident, frames = recv_message(sock, routed)
        if frames is not None:
            return ident, frames


def _handshake(router, dealer, server_arena, worker_arena):
    shm.serve_shared(router, server_arena)
    shm.offer_shared(dealer, worker_arena, 3)
    # hello -> answer -> confirm: each side handles what the other sent while polling
    for sock, routed in ((router, True), (dealer, False), (router, True)):
        assert sock.poll(5000)
        assert recv_message(sock, routed)[1] is None
    assert shm.shared_with(dealer)


def test_push_and_pull_by_reference_and_release():
    ctx, router, dealer = _pair()
    try:
        server_arena, worker_arena = shm.Arena(1 << 20), shm.Arena(1 << 20)
        _handshake(router, dealer, server_arena, worker_arena)
        grad = worker_arena.alloc(1 << 16, np.float32)
        grad[:] = np.arange(1 << 16)
        send_frames(dealer, [b"head", memoryview(grad).cast("B")])
        ident, frames = _recv(router, True)
        assert isinstance(frames[1], shm.SharedFrame)
        np.testing.assert_array_equal(np.frombuffer(frames[1].buffer, np.float32), grad)

        values = server_arena.alloc(1 << 16, np.float32)
        values[:] = 5
        loan = send_frames(router, [b"head", memoryview(values).cast("B")], ident, track=True)
        assert isinstance(loan, shm.Loan) and not loan.done
        _, frames = _recv(dealer, False)
        assert isinstance(frames[1], shm.SharedFrame)
        np.testing.assert_array_equal(np.frombuffer(frames[1].buffer, np.float32), values)
        assert not loan.done
        shm.release_frames(frames)
        assert loan.done

        small = send_frames(router, [b"head", b"x" * 100], ident, track=True)  # bytes
        assert small.done
        _, frames = _recv(dealer, False)
        assert bytes(frames[1].buffer) == b"x" * 100
    finally:
        ctx.destroy(0)


def test_releases_out_of_order_keep_the_earlier_loan_open():
    ctx, router, dealer = _pair()
    try:
        server_arena, worker_arena = shm.Arena(1 << 20), shm.Arena(1 << 20)
        _handshake(router, dealer, server_arena, worker_arena)
        send_frames(dealer, [b"hi"])
        ident, _ = _recv(router, True)
        values = server_arena.alloc(1 << 16, np.float32)
        loans = [send_frames(router, [b"h", memoryview(values).cast("B")], ident, track=True)
                 for _ in range(2)]
        first, second = _recv(dealer, False)[1], _recv(dealer, False)[1]
        shm.release_frames(second)
        assert not loans[0].done and not loans[1].done
        shm.release_frames(first)
        assert loans[0].done and loans[1].done
    finally:
        ctx.destroy(0)


def test_buffers_outside_the_arena_and_peers_without_one_go_as_bytes():
    ctx, router, dealer = _pair()
    try:
        shm.offer_shared(dealer, shm.Arena(1 << 16), 0)  # the ROUTER has no arena
        assert router.poll(5000) and recv_message(router, True)[1] is None
        assert dealer.poll(5000) and recv_message(dealer, False)[1] is None
        assert shm.shared_with(dealer)  # it maps ours, but sends us bytes
        send_frames(dealer, [b"h", memoryview(np.ones(1 << 15)).cast("B")])
        ident, frames = _recv(router, True)
        assert not isinstance(frames[1], shm.SharedFrame)
        tracker = send_frames(router, [b"h", memoryview(np.ones(1 << 15)).cast("B")], ident,
                              track=True)
        assert not isinstance(tracker, shm.Loan)
        _, frames = _recv(dealer, False)
        assert not isinstance(frames[1], shm.SharedFrame)
    finally:
        ctx.destroy(0)


def _child_reads(desc, offset, nbytes, q):
    peer = shm.PeerArena.attach(desc)
    q.put(None if peer is None else float(np.frombuffer(peer.frame(offset, nbytes), np.float64).sum()))


def test_another_process_maps_the_arena():
    arena = shm.Arena(1 << 16)
    a = arena.alloc(100, np.float64)
    a[:] = 1.5
    q = CTX.Queue()
    p = CTX.Process(target=_child_reads, args=(arena.describe(), arena.offset(memoryview(a)),
                                                a.nbytes, q))
    p.start()
    assert q.get(timeout=60) == 150.0
    p.join(10)


def test_a_job_on_this_host_pushes_and_pulls_through_shared_memory_exactly(tmp_path):
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker

    num_keys = 100_001  # two shards of 400 KB: above the by-reference threshold
    with running_job(tmp_path, make_job(num_keys, 2, 1, sync="asp", lr=0.5)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            assert kv.arena is not None
            kv.init(np.zeros(num_keys))
            grad = kv.shared_buffer()
            assert kv.arena.offset(memoryview(grad)) is not None
            expected = np.zeros(num_keys)
            for step in range(20):
                grad[:] = (np.arange(num_keys) * 7 + step) % 11 - 5
                kv.push(grad, step=step, batch=1)
                expected -= 0.5 * grad
                np.testing.assert_array_equal(kv.pull(), expected)
            assert all(shm.shared_with(s.sock) for s in kv.shards)
            assert (kv.arena.counters[:2] > 0).all()  # pulls came by reference and were released
            assert not kv.requests.held
        finally:
            kv.close()


def test_a_pull_without_out_from_one_shard_on_this_host_is_a_copy_the_server_cannot_touch(
        tmp_path):
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker

    num_keys = 200_000  # one shard of 800 KB: replies come by reference from its arena
    job = make_job(num_keys, 1, 1, sync="asp", lr=1.0, dtype="float32")
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(num_keys, dtype=np.float32))
            before = kv.pull()
            for step in range(5):  # the server writes its values in place once let go
                kv.push(np.ones(num_keys, dtype=np.float32), step=step, batch=1)
            assert (before == 0.0).all() and (kv.pull() == -5.0).all()
            assert not kv.requests.held
        finally:
            kv.close()


def test_shared_memory_off_in_the_environment_keeps_bytes(tmp_path, monkeypatch):
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker

    monkeypatch.setenv("PARAMSERVER_SHM", "0")
    with running_job(tmp_path, make_job(50_000, 1, 1, sync="asp")) as cluster:
        kv = KVWorker(cluster.address)
        try:
            assert kv.arena is None
            kv.init(np.ones(50_000))
            first = kv.pull()  # the reply's own frame, handed over uncopied: the caller's
            np.testing.assert_array_equal(first, np.ones(50_000))
            first[:] = 7.0
            kv.push(np.ones(50_000), step=0, batch=1)
            np.testing.assert_array_equal(kv.pull(), np.zeros(50_000))  # lr 1: 1 - 1
            assert (first == 7.0).all()
        finally:
            kv.close()


def test_hellos_that_cannot_be_mapped_leave_no_link_and_a_second_hello_unmaps_the_first():
    """A flood of offers from another host (a foreign token) used to grow the ROUTER's link
    table by one entry each, for good; only a mapped peer is kept, and a peer that offers
    again has its first mapping let go."""
    import json
    from paramserver.transport.shm_arena import _STATES
    ctx = zmq.Context()
    router, addr = bind_router(ctx)
    ours, theirs = shm.Arena(1 << 16), shm.Arena(1 << 16)
    shm.serve_shared(router, ours)
    dealers = []
    try:
        for i in range(300):
            d = connect_dealer(ctx, addr)
            dealers.append(d)
            d.send_multipart([shm.HELLO, json.dumps(
                {"arena": {**theirs.describe(), "host": f"elsewhere-{i}"}, "slot": 0}).encode()])
        for _ in range(300):
            assert router.poll(5000)
            assert recv_message(router, True)[1] is None
        for d in dealers:  # each was answered: not mapped, frames go as bytes
            assert d.poll(5000)
            assert json.loads(d.recv_multipart()[1]) == {"attached": False}
        assert len(_STATES[router].links) == 0
        mapped, peers = dealers[0], []
        for slot in (1, 2):
            mapped.send_multipart([shm.HELLO, json.dumps(
                {"arena": theirs.describe(), "slot": slot}).encode()])
            assert router.poll(5000)
            recv_message(router, True)
            (link,) = _STATES[router].links.values()
            peers.append(link.peer)
        assert link.slot == 2 and not peers[1].closed
        assert peers[0].closed  # the first mapping let go, not left behind
    finally:
        for d in dealers:
            d.close(0)
        router.close(0)
        terminate(ctx)  # bounded: a socket left open must not hold the test
