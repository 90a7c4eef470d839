"""Dense at scale, in small sizes: chunked pushes and pulls equal the one-message path, a BSP
round of chunks applies once, the chunks in flight stay bounded, the wide model's size, and
`--servers auto`."""

import threading

import numpy as np
import pytest

from paramserver.client.core.worker_core import Stream, WorkerCore, chunk_pieces
from paramserver.client.kv import KVWorker
from paramserver.core.keyspace import KeyRange, auto_servers
from paramserver.core.units import UnitError, parse_count
from paramserver.wire import Message
from ps_helpers import known_gradient, make_job, running_job

N = 97  # two shards (48 + 49 keys), cut into chunks of 8 keys: uneven everywhere
SMALL = 64  # bytes: 8 float64 keys a chunk


# ---- the bookkeeping, no sockets ----------------------------------------------------------------
def test_chunks_cover_each_piece_once_and_say_how_many_they_are():
    pieces = [(0, KeyRange(10, 48), slice(0, 38)), (1, KeyRange(48, 97), slice(38, 87))]
    per_shard = chunk_pieces(pieces, 8)
    assert [len(c) for c in per_shard] == [5, 7]
    for (shard, r, sl), chunks in zip(pieces, per_shard):
        assert all(c.shard == shard and c.count == len(chunks) for c in chunks)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert chunks[0].keys.lo == r.lo and chunks[-1].keys.hi == r.hi
        assert all(a.keys.hi == b.keys.lo for a, b in zip(chunks, chunks[1:]))
        assert all(c.keys.size <= 8 for c in chunks)
        assert all(c.out.stop - c.out.start == c.keys.size for c in chunks)
        assert chunks[0].out.start == sl.start and chunks[-1].out.stop == sl.stop


def test_a_stream_keeps_at_most_its_window_unanswered_per_shard():
    pieces = [(0, KeyRange(0, 40), slice(0, 40)), (1, KeyRange(40, 60), slice(40, 60))]
    stream = Stream(chunk_pieces(pieces, 4), window=3)
    rid, sent = 0, []
    first = stream.ready()
    assert [pos for pos, _ in first] == [0, 0, 0, 1, 1, 1]
    for pos, chunk in first:
        rid += 1
        stream.sent(pos, rid, chunk)
        sent.append(chunk)
    assert stream.ready() == []  # both windows full
    while not stream.done:
        rid_answered = max(stream.waiting)  # the newest: answers may come in any order
        pos = stream.waiting[rid_answered][0]
        stream.answered(rid_answered)
        for p, chunk in stream.ready():
            assert p == pos  # room opens only where an answer came from
            rid += 1
            stream.sent(p, rid, chunk)
            sent.append(chunk)
        assert max(stream.busy) <= 3
    assert stream.most_in_flight == 6
    assert sorted((c.keys.lo, c.keys.hi) for c in sent) == [(lo, lo + 4) for lo in range(0, 60, 4)]



def test_chunk_sizes_and_windows_may_differ_by_shard():
    core = WorkerCore()
    core.welcome(0, [KeyRange(0, 40), KeyRange(40, 100)], 100)
    core.chunking([64, 16], [2, 3])  # shard 0 fits whole, shard 1 goes in 4 chunks
    assert core.chunk == 16 and not core.all_fit
    stream = core.stream(KeyRange(0, 100), core.pieces(KeyRange(0, 100)))
    assert [len(t) for t in stream.todo] == [1, 4] and stream.window == [2, 3]
    assert core.stream(KeyRange(0, 40), core.pieces(KeyRange(0, 40))) is None
    core.chunking(50, 2, run=[10, 70])  # only shard 1's piece is above 50; runs <= chunk
    stream = core.stream(KeyRange(0, 100), core.all_pieces)
    assert [len(t) for t in stream.todo] == [1, 2] and core.runs == [10, 50]
    core.chunking(60, 1)  # one size for every shard: everything fits
    assert core.all_fit and core.stream(KeyRange(0, 100), core.all_pieces) is None
    with pytest.raises(ValueError, match="2 shards"):
        core.chunking([8], 1)

# ---- real processes -----------------------------------------------------------------------------
def _job(sync: str, chunk_bytes: int, workers: int = 1, **extra) -> dict:
    return make_job(N, 2, workers, sync=sync, lr=0.5, chunk_bytes=chunk_bytes,
                    chunks_in_flight=2, **extra)


def _steps(kv: KVWorker, steps: int = 3) -> list[np.ndarray]:
    """init, then pull/push/clock `steps` times; every value pulled, and one of a sub-range."""
    kv.init(np.arange(N, dtype=np.float64) / 7)
    release = kv.start()
    seen = []
    for s in range(steps):
        seen.append(kv.pull(min_version=release.min_version).copy())
        kv.push(known_gradient(0, s, N, np.float64), step=release.step, batch=1,
                round_size=release.round_size)
        release = kv.clock(release.step, 1, 0.0)
    seen.append(kv.pull(min_version=release.min_version).copy())
    seen.append(kv.pull((5, 90), min_version=release.min_version).copy())
    return seen


@pytest.mark.parametrize("sync", ["asp", pytest.param("bsp", marks=pytest.mark.slow)])
def test_chunked_pushes_and_pulls_equal_one_message_per_shard(tmp_path, sync):
    results = {}
    for chunk_bytes in (SMALL, 1 << 30):
        with running_job(tmp_path / str(chunk_bytes), _job(sync, chunk_bytes)) as cluster:
            kv = KVWorker(cluster.address)
            try:
                assert kv.core.chunk == (8 if chunk_bytes == SMALL else (1 << 30) // 8)
                results[chunk_bytes] = _steps(kv)
                versions = list(kv.core.versions)
            finally:
                kv.close()
        if sync == "asp" and chunk_bytes == SMALL:
            # Arrival mode applies each chunk: 7 and 6 chunks per push (49 + 48 keys), 3 pushes.
            assert versions == [3 * 7, 3 * 6]
    for chunked, whole in zip(results[SMALL], results[1 << 30]):
        np.testing.assert_array_equal(chunked, whole)


def _status(kv: KVWorker, shard: int) -> dict:
    rid = kv.requests.send(shard, Message("status", {}))
    return kv.requests.collect([(shard, rid, None)], "status")[rid]["state"]


def test_a_bsp_round_of_chunked_pushes_from_two_workers_applies_once(tmp_path):
    with running_job(tmp_path, _job("bsp", SMALL, workers=2)) as cluster:
        kvs = [KVWorker(cluster.address) for _ in range(2)]
        try:
            kvs[0].init(np.zeros(N))
            grads = [known_gradient(r, 0, N, np.float64) for r in range(2)]
            # Both push at once, chunks interleaving on each shard; round_size 2, no clocks.
            threads = [threading.Thread(target=kv.push, args=(g,),
                                        kwargs=dict(step=0, batch=b, round_size=2))
                       for kv, g, b in zip(kvs, grads, (1, 3))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            kvs[1].timeout = 10.0
            got = kvs[1].pull(min_version=1)
            np.testing.assert_allclose(got, -0.5 * (1 * grads[0] + 3 * grads[1]) / 4)
            for shard in range(2):
                state = _status(kvs[0], shard)
                assert (state["version"], state["updates_applied"]) == (1, 1), state
        finally:
            for kv in kvs:
                kv.close()


def test_chunks_in_flight_stay_bounded(tmp_path):
    """The requests the client waits on (its core's `sent`), counted at every send: never
    more than window x shards for a push or pull of 13 chunks."""
    with running_job(tmp_path, _job("asp", SMALL)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(N))
            kv.start()
            counts = []
            send = kv.requests.send

            def counting_send(shard, msg):
                rid = send(shard, msg)
                counts.append(len(kv.core.sent))
                return rid
            kv.requests.send = counting_send
            for what in ("push", "pull"):
                counts.clear()
                h = (kv.push_async(np.ones(N), step=0, batch=1) if what == "push"
                     else kv.pull_async())
                assert h.stream is not None and len(counts) == 4  # 2 per shard at once
                kv.wait(h)
                assert len(counts) == 13 and max(counts) <= 4, (what, counts)
                assert not kv.core.sent and not kv.core.inbox  # nothing left behind
            # A request below the chunk size is one message per shard, as always.
            counts.clear()
            h = kv.pull_async((44, 54))  # 10 keys, but 5 to each shard
            assert h.stream is None and len(h.parts) == 2 and len(counts) == 2
            kv.wait(h)
        finally:
            kv.close()


def test_a_pull_waits_while_its_round_fills_with_a_chunked_push(tmp_path):
    """Pull ahead for the round's version, then the push that fills the round: waiting on
    the pull must send the push's remaining chunks, or neither would ever finish."""
    with running_job(tmp_path, _job("bsp", SMALL)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.zeros(N))
            release = kv.start()
            kv.timeout = 20.0
            pull = kv.pull_async(min_version=1)
            push = kv.push_async(np.ones(N), step=release.step, batch=1, round_size=1)
            np.testing.assert_allclose(kv.wait(pull), -0.5)
            assert kv.wait(push) == 0
        finally:
            kv.close()


def test_a_chunked_init_initializes_once_every_chunk_is_in(tmp_path):
    with running_job(tmp_path, _job("asp", SMALL)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            assert kv.init(np.arange(N, dtype=np.float64))
            assert all(_status(kv, s)["initialized"] for s in range(2))
            assert not kv.init(np.zeros(N))  # a second offer is ignored
            np.testing.assert_array_equal(kv.pull(), np.arange(N))
        finally:
            kv.close()


def test_an_abandoned_chunked_pull_leaves_the_client_usable(tmp_path):
    with running_job(tmp_path, _job("asp", SMALL)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            kv.init(np.arange(N, dtype=np.float64))
            h = kv.pull_async(min_version=10**6)  # never served
            kv.completion.abandon(h)
            assert not kv.chunked.active and not kv.core.sent
            np.testing.assert_array_equal(kv.pull(), np.arange(N))
        finally:
            kv.close()


# ---- the large model and the shard count --------------------------------------------------------
@pytest.mark.parametrize("size", [10**5, 10**6, 10**8, 5 * 10**8, 10**9])
def test_the_wide_model_has_the_size_asked_for(size):
    from paramserver.models import build_model
    from paramserver.models.nets import wide_params
    model = build_model("wide", (64,), 10, shape_only=True, size=size)  # no memory
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / size - 1) < 0.01
    assert count == wide_params((64,), 10, size)
    squares = [p.numel() for p in model.parameters() if p.dim() == 2][1:-1]
    assert len(squares) == 8 and len(set(squares)) == 1  # 8 equal layers


def test_the_wide_model_built_for_real_trains_through_its_flat_binding():
    from paramserver.models import build_model
    model = build_model("wide", (8, 8), 10, size=20_000, seed=3)
    again = build_model("wide", (8, 8), 10, size=20_000, seed=3)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / 20_000 - 1) < 0.03
    for a, b in zip(model.parameters(), again.parameters()):
        assert a.device.type == "cpu" and bool((a == b).all())


def test_model_size_reads_counts():
    assert parse_count("1e9") == 10**9
    assert parse_count("500M") == 5 * 10**8
    assert parse_count("2.5G") == 25 * 10**8
    assert parse_count("100k") == 10**5
    for bad in ("", "0", "-5", "1e9x", "lots"):
        with pytest.raises(UnitError, match="model size"):
            parse_count(bad, "model size")


def test_servers_auto_follows_size_cores_and_memory():
    gib = 1 << 30
    assert auto_servers(4 * 10**6, 1, 16, 64 * gib) == 1  # a small model: one shard
    assert auto_servers(4 * 10**9, 1, 16, 64 * gib) == 15  # 4 GB: capped by free cores
    assert auto_servers(4 * 10**9, 1, 64, 64 * gib) == 15  # 4 GB / 256 MB = 14.9 -> 15
    assert auto_servers(4 * 10**9, 2, 2, 64 * gib) == 1  # no core left: one shard
    # 13 GiB free: 1.96 GB beside the worker (2 x 4 GB) and the shards (4 GB): 9 processes
    assert auto_servers(4 * 10**9, 1, 16, 13 * gib) == 9


def test_a_large_shard_keeps_one_spare_copy_for_copy_on_write():
    from paramserver.optim import make_rule
    from paramserver.server.store import ShardStore, spare_buffers
    assert spare_buffers(1 << 30) == 1  # a 1 GB shard: one retired copy, not three
    assert spare_buffers(100 << 20) == 2
    assert spare_buffers(4 << 20) == 3  # small shards as before
    store = ShardStore(KeyRange(0, 1000), "float32", make_rule("sgd", 1.0), "arrival")
    assert store.spares == 3
    store.init(0, 1000, np.zeros(1000, np.float32))

    class Lent:  # a reply still reading the values in place (a zmq tracker's `done`)
        done = False
    store.spares = 1
    for _ in range(4):
        store.lend(Lent())
        store.push_dense("w", 0, 1000, np.ones(1000, np.float32), 0, 1, 0, 1.0)
    assert store.copies_on_write == 4 and len(store._retired) == 1


def test_shard_cuts_move_to_layer_edges_only_when_the_bytes_stay_balanced():
    from paramserver.core.keyspace import split_balanced, split_by_bytes
    from paramserver.models import ModelKeys, build_model
    # The wide model: 8 equal square layers, small input and output layers around them.
    keys = ModelKeys(build_model("wide", (64,), 10, shape_only=True, size=10**8))
    edges = [layer.keys.lo for layer in keys.layers[1:]]
    for shards in (2, 4, 8):
        ranges = split_by_bytes(keys.num_keys, shards, edges)
        assert all(r.lo in edges for r in ranges[1:])  # no layer split
        ideal = keys.num_keys / shards
        assert all(abs(r.size - ideal) <= 0.05 * ideal for r in ranges)
        assert ranges[0].lo == 0 and ranges[-1].hi == keys.num_keys
    # Three big layers over 4 shards cannot stay whole: cut where the balance says.
    assert split_by_bytes(300, 4, [100, 200]) == split_balanced(300, 4)
    # A small layer beside a cut: the cut moves onto its edge.
    cut = split_by_bytes(1000, 2, [497, 900])
    assert [(r.lo, r.hi) for r in cut] == [(0, 497), (497, 1000)]
    assert all(r.size >= 1 for r in split_by_bytes(4, 3, [1, 2, 3]))  # every shard has keys


def test_a_job_carries_its_layer_edges_to_the_coordinator(tmp_path):
    from paramserver.launch.jobs import prepare_spec
    from paramserver.spec.config import TrainConfig
    from paramserver.spec.job import JobSpec
    spec = prepare_spec(TrainConfig(model="wide", model_size=10**6, servers=4, workers=1,
                                    eval_interval=0, steps=1))
    assert len(spec.layer_edges) == 9 and spec.servers == 4
    assert JobSpec.from_dict(spec.to_dict()) == spec
    auto = prepare_spec(TrainConfig(model="wide", model_size=10**6, servers="auto", workers=1,
                                    eval_interval=0, steps=1))
    assert auto.servers >= 1  # 4 MB: one shard
    assert JobSpec().to_dict()["layer_edges"] == []  # no preference


# ---- shard load, measured -----------------------------------------------------------------------
def test_a_shard_given_more_keys_reports_more_busy_time(tmp_path):
    """Each push gives shard 0 all its keys and shard 1 a thousandth of its own: the busy
    seconds the shards' heartbeats bring into the job's metrics say shard 0 worked more, and
    the summary calls the shards unbalanced."""
    import time
    from paramserver.cli.train_cmd import unbalanced_line
    from paramserver.runlog.metrics import read_records, summarize
    # 32 MB a shard: applying a push outweighs a message's fixed costs by far even on busy
    # cores (at 8 MB a shard, a loaded machine's ~1 ms per tiny message left the ratio at 2x)
    keys = 1 << 24
    job = make_job(keys, 2, 1, sync="asp", dtype="float32", lr=0.1)
    with running_job(tmp_path, job) as cluster:
        with KVWorker(cluster.address) as kv:
            kv.init(np.zeros(keys, np.float32))
            kv.start()  # the job's metrics start with training
            (s0, s1) = (s.range for s in kv.shards)
            big, small = np.ones(s0.size, np.float32), np.ones(s1.size // 1000, np.float32)
            for step in range(50):
                kv.push(big, (s0.lo, s0.hi), step=step, batch=1)
                kv.push(small, (s1.lo, s1.lo + small.size), step=step, batch=1)
            path = cluster.run_dir / "metrics.jsonl"
            deadline = time.monotonic() + 20
            while True:  # the next heartbeats bring the busy time in
                s = summarize(read_records(path), job) if path.exists() else {}
                busy = {k: v["busy_s"] for k, v in s.get("per_shard", {}).items()}
                if busy.get("0", 0) > 3 * busy.get("1", 0) > 0:
                    break
                assert time.monotonic() < deadline, f"no busy shard 0 in the metrics: {busy}"
                time.sleep(0.1)
            kv.bye()
    assert s["shard_imbalance"] > 1.5 and 0 < s["per_shard"]["0"]["busy_fraction"] <= 1, s
    assert "shards unbalanced" in unbalanced_line(s)
# ---- TCP chunks: smaller pieces where the bytes cross a socket ----------------------------------
TCP_KEYS = 3_730_000 // 4  # the 3.73 MB float32 model of benchmarks/pushpull.py


def _tcp_steps(kv: KVWorker, steps: int = 3) -> list[np.ndarray]:
    kv.init(np.arange(TCP_KEYS, dtype=np.float32) / 8)
    release = kv.start()
    out = np.empty(TCP_KEYS, np.float32)
    seen = []
    for s in range(steps):
        seen.append(kv.pull(out=out, min_version=release.min_version).copy())
        kv.push(known_gradient(0, s, TCP_KEYS, np.float32), step=release.step, batch=1,
                round_size=release.round_size)
        release = kv.clock(release.step, 1, 0.0)
    seen.append(kv.pull(min_version=release.min_version).copy())
    seen.append(kv.pull((1000, 700_000), min_version=release.min_version).copy())
    return seen


@pytest.mark.parametrize("sync", ["asp", pytest.param("bsp", marks=pytest.mark.slow)])
def test_tcp_chunks_of_a_3_73_mb_push_and_pull_equal_one_message(tmp_path, sync):
    """Shared memory off: pieces (1.87 MB) above chunk_bytes (1 MB) go in 0.25 MB TCP chunks
    (8 per shard, 3 in flight) and give exactly what one message per shard gives; a worker
    that shares memory with the shards uses chunk_bytes and chunks_in_flight."""
    results = {}
    for chunk_bytes in (1 << 20, 1 << 30):
        job = make_job(TCP_KEYS, 2, 1, sync=sync, dtype="float32", lr=0.5,
                       chunk_bytes=chunk_bytes, chunks_in_flight=2,
                       tcp_chunk_bytes=1 << 18, tcp_chunks_in_flight=3)
        with running_job(tmp_path / str(chunk_bytes), job) as cluster:
            kv = KVWorker(cluster.address, shared_memory=False)
            try:
                assert kv.core.runs == [min(1 << 18, chunk_bytes) // 4] * 2
                assert kv.core.windows == [3, 3]
                results[chunk_bytes] = _tcp_steps(kv)
            finally:
                kv.close()
            if chunk_bytes == 1 << 20:
                near = KVWorker(cluster.address, role="observer", shared_memory=True)
                try:
                    if near.arena is not None:  # shared memory offered to every shard
                        assert near.core.runs == [(1 << 20) // 4] * 2
                        assert near.core.windows == [2, 2]
                finally:
                    near.close()
    for chunked, whole in zip(results[1 << 20], results[1 << 30]):
        np.testing.assert_array_equal(chunked, whole)


def test_a_job_whose_parameters_cannot_fit_this_machine_is_refused_counting_each_copy():
    from paramserver.launch.jobs import check_local_memory
    from paramserver.spec.job import JobSpec
    gb = 1 << 30
    job = JobSpec(num_keys=gb // 4, workers=4, servers=2)  # 1 GB of float32 parameters
    check_local_memory(job, 10 * gb)  # 4 x 2 for the workers, 1 for the shards, 1 evaluator
    with pytest.raises(ValueError, match=r"need at least 10.0 GB on this machine \(8 copies "
                                         r"for 4 workers' parameters and gradients, 1 for the "
                                         r"shards, 1 for the evaluator\); 9.0 GB is available"):
        check_local_memory(job, 9 * gb)
    replicated = JobSpec(num_keys=gb // 8, workers=2, servers=1, replicas=2, eval_interval=0,
                         dtype="float64")  # 1 GB of float64, a backup, no evaluator
    check_local_memory(replicated, 6 * gb)
    with pytest.raises(ValueError, match=r"6.0 GB .*2 for the shards\); 5.9 GB"):
        check_local_memory(replicated, int(5.9 * gb))
    # an elastic job starts MIN workers here; the others may join from other hosts
    elastic = JobSpec(num_keys=gb // 4, workers=8, min_workers=2, servers=1, eval_interval=0)
    check_local_memory(elastic, 5 * gb)
    with pytest.raises(ValueError, match=r"4 copies for 2 workers'"):
        check_local_memory(elastic, 4 * gb)
