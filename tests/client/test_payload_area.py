"""Codec payloads through the arena: a push's encoded frames written into the worker's shared
memory go to a server on this host by reference, as dense pushes from the shared buffer do."""

import numpy as np
import pytest

from paramserver.client.core.worker_core import Handle
from paramserver.client.transport import PayloadArea
from paramserver.compression import make_codec
from paramserver.transport import shm


def test_one_push_at_a_time_holds_the_region_and_what_does_not_fit_goes_as_it_is():
    area = PayloadArea(shm.Arena(1 << 20), 300_000)
    big, small, huge = (np.full(n, 7, np.uint8) for n in (100_000, 100, 400_000))
    first = Handle("push")
    area.claim(first)
    placed = area.place(first, [big, small, big, huge])
    inside = [area.arena.offset(memoryview(f)) is not None for f in placed]
    assert inside == [True, False, True, False]  # small: as cheap through the socket
    assert all(np.array_equal(a, b) for a, b in zip(placed, [big, small, big, huge]))
    # a second push while the first is not done: its frames stay where they are
    second = Handle("push")
    area.claim(second)
    assert area.place(second, [big])[0] is big
    assert area.place(first, [big])[0] is big  # (no room left for the first either)
    first.done = True
    area.claim(second)  # now it is free: the second starts from the region's beginning
    again = area.place(second, [big])[0]
    assert area.arena.offset(memoryview(again)) == area.arena.offset(memoryview(placed[0]))


def test_without_an_arena_nothing_moves():
    area = PayloadArea(None, 1 << 20)
    h = Handle("push")
    area.claim(h)
    frame = np.zeros(1 << 17, np.uint8)
    assert area.place(h, [frame])[0] is frame


@pytest.mark.parametrize("chunk_bytes", [None, 200_000])
def test_codec_pushes_from_the_arena_apply_exactly_what_they_encode(tmp_path, chunk_bytes):
    """Two bf16 pushes in a row (the second reuses the region the first wrote), whole or in
    chunks: the shard holds exactly minus the sum of what each decodes to."""
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker
    n = 300_000
    extra = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    with running_job(tmp_path, make_job(n, 1, 1, dtype="float32", **extra)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            assert kv.arena is not None, "this test needs the shared-memory path"
            kv.init(np.zeros(n, np.float32))
            kv.start()
            gen = np.random.default_rng(0)
            total = np.zeros(n, np.float32)
            for step in range(2):
                values = gen.standard_normal(n).astype(np.float32)
                sent = np.empty(n, np.float32)
                kv.wait(kv.push_async(values, step=step, batch=1, codec=make_codec("bf16"),
                                      sent=sent))
                assert kv.dense.payload_area.owner is not None and kv.dense.payload_area.top > 0
                total += sent
            np.testing.assert_array_equal(kv.pull(), -total)
        finally:
            kv.close()
