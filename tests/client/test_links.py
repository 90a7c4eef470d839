"""Emulated links: the --link grammar, the token bucket (injected clock), and real shaped sockets."""

import time

import numpy as np
import pytest

from paramserver.spec.config import TrainConfig
from paramserver.emulation.links import Link, LinkSpec, TokenBucket, link_for, parse_link, parse_links
from paramserver.client.kv import KVWorker
from paramserver.transport import shaping
from ps_helpers import make_job, running_job


def test_link_grammar_reads_rates_latencies_and_targets():
    assert parse_link("100mbit") == LinkSpec(100e6, 0.0)
    assert parse_link("10mbit, 5ms") == LinkSpec(10e6, 0.005)
    assert parse_link("250us") == LinkSpec(None, 250e-6)
    assert parse_link("1.5gbit,1s") == LinkSpec(1.5e9, 1.0)
    assert parse_link("unlimited,2ms") == LinkSpec(None, 0.002)
    table = parse_links(["100mbit", "w2=10mbit,5ms;s0=1gbit", "s*=500kbit"])
    assert table == {"w": {"*": "100mbit", "2": "10mbit,5ms"},
                     "s": {"0": "1gbit", "*": "500kbit"}}
    assert link_for(table, "w", 2) == LinkSpec(10e6, 0.005)  # its own entry beats the role's
    assert link_for(table, "w", 3) == LinkSpec(100e6, 0.0)
    assert link_for(table, "s", 1) == LinkSpec(500e3, 0.0)
    assert link_for({}, "w", 0) is None and parse_links([]) == {}


@pytest.mark.parametrize("bad", ["fast", "100mbpz", "10mbit,5ms,1ms", "w2=", "x1=10mbit",
                                 "w=10mbit,20mbit", "0mbit", "-5ms", "w2=10mbit;s=huge"])
def test_bad_links_fail_with_a_clear_error(bad):
    with pytest.raises(ValueError) as err:
        parse_links([bad])
    assert "link" in str(err.value)
    with pytest.raises(ValueError):
        TrainConfig(links=[bad]).validate()


def reference_delays(sizes, gaps, rate, burst):
    """The serial-link definition: a message leaves once the link has carried every earlier
    byte and its own; the first `burst` bytes after an idle spell go at once."""
    free_at, tokens, now, out = 0.0, burst, 0.0, []
    for n, gap in zip(sizes, gaps):
        now += gap
        tokens = min(burst, tokens + max(0.0, now - free_at) * rate) if now > free_at else tokens
        start = max(now, free_at)
        sent_from_tokens = min(tokens, n)
        done = start + (n - sent_from_tokens) / rate
        tokens -= sent_from_tokens
        free_at = done
        out.append(done - now)
    return out


def test_token_bucket_matches_a_serial_link_with_an_injected_clock():
    rng = np.random.default_rng(1)
    rate, burst = 1000.0, 300.0
    sizes = rng.integers(1, 900, 60).tolist()
    gaps = rng.choice([0.0, 0.05, 0.4, 2.0], 60).tolist()
    bucket, now, got = TokenBucket(rate, burst, 0.0), 0.0, []
    for n, gap in zip(sizes, gaps):
        now += gap
        wait = bucket.reserve(n, now)
        got.append(wait)  # the caller does not sleep: the next message queues behind the debt
    np.testing.assert_allclose(got, reference_delays(sizes, gaps, rate, burst), atol=1e-9)


def test_link_throughput_over_time_equals_its_rate_and_adds_latency():
    link = Link(LinkSpec(8e6, 0.004), now=0.0, burst=0.0)  # 1 MB/s
    now = 0.0
    for _ in range(100):  # a sender that sleeps what it is told
        now += link.send_delay(10_000, now)
    assert now == pytest.approx(100 * (0.01 + 0.004))
    assert link.recv_delay(500_000, now) == pytest.approx(0.5 + 0.004)  # own bucket per direction


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_shaped_worker_and_server_links_carry_their_rate_over_real_sockets(tmp_path):
    """Worker 0 at 100 Mbit/s, one of two shards at 50 Mbit/s; 4 MB per shard per request."""
    n = 1_000_000  # float64: 4 MB per shard
    job = make_job(n, 2, 1, links=parse_links(["w0=100mbit", "s0=50mbit"]))
    with running_job(tmp_path, job) as cluster:
        kv = KVWorker(cluster.address)
        try:
            assert shaping.current() == LinkSpec(100e6, 0.0)
            kv.init(np.zeros(n))
            kv.start()
            grad = np.ones(n)
            per_shard = [(s.range.lo, s.range.hi) for s in kv.shards]
            push = [_timed(lambda r=r: kv.push(grad[r[0]:r[1]], r, step=0, batch=1))
                    for r in per_shard]
            pull = _timed(lambda: kv.pull(per_shard[int(np.argmin(push))]))
        finally:
            kv.close()
        assert shaping.current() is None  # close uninstalls the worker's link
    mb = 4e6
    fast, slow = sorted(push)
    # Worker link only: 4 MB at 100 Mbit/s; through both (store and forward): + 4 MB at 50.
    assert mb * 8 / fast == pytest.approx(100e6, rel=0.1)
    assert fast + mb * 8 / 50e6 == pytest.approx(slow, rel=0.1)
    assert mb * 8 / pull == pytest.approx(100e6, rel=0.1)  # the worker's downlink
