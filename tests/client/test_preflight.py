"""Preflight link probes: the probe's arithmetic on a modelled link, the coordinator core's
bookkeeping, a real shard's `probe` answers, and (slow) a job whose worker 1 sits behind an
emulated slow link showing it in RUN/preflight.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paramserver.coordinator.events import (
    AppendEvent, PreflightReported, Registered, Reply, SavePreflight,
)
from paramserver.coordinator.state import CoordinatorState
from paramserver.observe.core.preflight import (
    MAX_BYTES, MIN_BYTES, SERVE_MAX, PreflightBook, burst_size, parse_links, probe_link, rate_of,
)
from paramserver.spec.job import JobSpec, SyncSpec


class ModelledLink:
    """A link of `rate` bits/s and round trip `rtt` s: what a probe of n bytes takes."""

    def __init__(self, rate: float, rtt: float):
        self.rate, self.rtt, self.asked = rate, rtt, []

    def __call__(self, nbytes: int) -> float:
        self.asked.append(nbytes)
        return self.rtt + nbytes * 8 / self.rate


@pytest.mark.parametrize("rate,rtt", [(10e6, 0.005), (100e6, 0.0002), (10e9, 0.00005),
                                      (1e6, 0.05)])
def test_the_probe_reads_a_modelled_links_rate_and_round_trip(rate, rtt):
    link = ModelledLink(rate, rtt)
    probe = probe_link(3, link)
    assert probe.shard == 3
    assert probe.rtt_s == pytest.approx(rtt)
    assert probe.rate == pytest.approx(rate, rel=1e-6)
    assert link.asked[:3] == [0, 0, 0] and len(link.asked) == 5
    assert MIN_BYTES <= probe.nbytes <= MAX_BYTES and probe.nbytes == link.asked[-1]
    # Bounded in time: the burst takes about TARGET_S at most (more only at the floor size).
    assert link(probe.nbytes) - rtt <= max(0.25, MIN_BYTES * 8 / rate) + 1e-9
    shard, rtt_ms, mbit_s, nbytes = probe.wire()
    assert (shard, nbytes) == (3, probe.nbytes) and mbit_s == pytest.approx(rate / 1e6, rel=1e-3)


def test_burst_size_and_rate_arithmetic():
    assert burst_size(65536, 0.0, 0.0) == MAX_BYTES  # an instant first burst: the ceiling
    assert burst_size(65536, 10.0, 0.0) == MIN_BYTES  # a crawling one: the floor
    assert burst_size(65536, 0.101, 0.001, target_s=0.5) == 327680
    assert rate_of(1_000_000, 1.001, 0.001) == pytest.approx(8e6)
    # A round trip (a ping on a busy host) longer than the burst is not taken off: the
    # burst's whole time counts, never ~0 s and a rate of terabits (seen: 16777216 Mbit/s).
    assert rate_of(1000, 0.001, 0.002) == pytest.approx(8e6)
    assert rate_of(2_097_152, 0.004, 0.0056) == pytest.approx(2_097_152 * 8 / 0.004)
    assert rate_of(2_097_152, 0.004, 0.0019) == pytest.approx(2_097_152 * 8 / 0.0021)


def test_reports_are_checked():
    assert parse_links([[0, 0.5, 100.0, 1024]]) == [
        {"shard": 0, "rtt_ms": 0.5, "mbit_s": 100.0, "bytes": 1024}]
    for bad in ([[0, 1.0, 2.0]], [[0.5, 1.0, 2.0, 3]], [[0, -1.0, 2.0, 3]], "x",
                [[0, True, 2.0, 3]], [[0, 1.0, 2.0, 3]] * 5000):
        with pytest.raises(ValueError):
            parse_links(bad)


def test_the_book_announces_once_every_worker_reported_then_each_newcomer():
    book = PreflightBook(2)
    link = {"shard": 0, "rtt_ms": 1.0, "mbit_s": 2.0, "bytes": 3}
    assert book.report("worker-0", [link]) == []
    assert book.report("worker-1", [link]) == ["worker-0", "worker-1"]
    assert book.report("worker-2", [link]) == ["worker-2"]
    doc = book.document(1.5)
    assert doc["version"] == 1 and doc["t"] == 1.5
    assert [e["worker"] for e in doc["links"]] == ["worker-0", "worker-1", "worker-2"]


def test_the_coordinator_core_writes_the_file_and_one_event():
    state = CoordinatorState(JobSpec(workers=2, servers=1, num_keys=10, sync=SyncSpec("bsp"),
                                     eval_interval=0.0))
    state.handle(Registered("srv0", "server", 0.0, to="r-s", link="L0", addr="tcp://h:1"))
    for w in range(2):
        state.handle(Registered(f"w{w}", "worker", 0.1, to=f"r-w{w}"))
    out = state.handle(PreflightReported("w0", [[0, 0.2, 900.0, 4194304]], 0.5, to="p0"))
    assert any(isinstance(i, Reply) and i.to == "p0" and i.op == "ok" for i in out)
    saves = [i for i in out if isinstance(i, SavePreflight)]
    assert saves and saves[0].document["links"][0]["worker"] == "worker-0"
    assert not any(isinstance(i, AppendEvent) and i.kind == "preflight" for i in out)
    out = state.handle(PreflightReported("w1", [[0, 0.3, 20.0, 524288]], 0.6, to="p1"))
    events = [i for i in out if isinstance(i, AppendEvent) and i.kind == "preflight"]
    assert len(events) == 1 and len(events[0].data["links"]) == 2
    out = state.handle(PreflightReported("w1", [[0, "x"]], 0.7, to="p2"))  # refused, not fatal
    assert any(isinstance(i, Reply) and i.op == "error" for i in out)
    out = state.handle(PreflightReported("nobody", [], 0.8, to="p3"))
    assert any(isinstance(i, Reply) and i.op == "error" for i in out)
    state.check_invariants()


@pytest.mark.slow  # a live cluster (6-12 s here); every default test whose worker starts probes
def test_a_shard_answers_probes_within_bounds(tmp_path):
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker
    from paramserver.client.preflight import probe_shards
    from paramserver.wire import Message
    with running_job(tmp_path, make_job(100, 1, 1, preflight=False)) as cluster:
        kv = KVWorker(cluster.address)
        try:
            for asked, got in ((0, 0), (1000, 1000), (SERVE_MAX * 4, SERVE_MAX)):
                rid = kv.requests.send(0, Message("probe", {"bytes": asked}))
                reply = kv.requests.collect([(0, rid, None)], "probe")[rid]
                assert reply.op == "probe" and reply["bytes"] == got
                assert sum(a.nbytes for a in reply.arrays) == got
                kv.requests.let_go(rid)
            probes = probe_shards(kv.requests, kv.shards, kv.timeout)
            assert [p.shard for p in probes] == [0] and probes[0].rate > 0
            kv.init(np.zeros(100))  # the shard serves on as before
            assert kv.pull().shape == (100,)
        finally:
            kv.close()


@pytest.mark.slow
def test_an_emulated_slow_link_shows_in_preflight_json(tmp_path):
    import subprocess
    import sys
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--workers", "2",
                           "--servers", "2", "--steps", "2", "--eval-interval", "0",
                           "--model-opt", "hidden=16", "--link", "w1=20mbit", "--out",
                           str(run), "--quiet"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((run / "preflight.json").read_text())
    assert doc["version"] == 1 and isinstance(doc["t"], float)
    links = {(e["worker"], e["shard"]): e for e in doc["links"]}
    assert set(links) == {(f"worker-{w}", s) for w in range(2) for s in range(2)}
    for s in range(2):
        slow, fast = links[("worker-1", s)], links[("worker-0", s)]
        assert 10 < slow["mbit_s"] < 25, slow  # the emulated 20 mbit/s, measured
        assert fast["mbit_s"] > 3 * slow["mbit_s"]
        assert slow["rtt_ms"] >= 0 and slow["bytes"] >= MIN_BYTES
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    pre = [e for e in events if e["event"] == "preflight"]
    assert len(pre) == 1 and len(pre[0]["links"]) == 4
    barrier = next(e["t"] for e in events if e["event"] == "barrier_open")
    assert pre[0]["t"] <= barrier  # before the start barrier
