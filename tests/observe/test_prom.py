"""The coordinator's Prometheus endpoint (`--metrics-port`): scraped over HTTP and parsed with
prometheus_client's own parser, from a coordinator node fed records (default) and during a
real job (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

prom = pytest.importorskip("prometheus_client", reason="the optional extra 'metrics'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from paramserver.coordinator.events import AppendEvent, AppendMetric  # noqa: E402
from paramserver.coordinator.node import CoordinatorNode  # noqa: E402
from paramserver.spec.job import JobSpec  # noqa: E402

FAMILIES = {
    "paramserver_last_step_timestamp_seconds", "paramserver_steps", "paramserver_samples",
    "paramserver_worker_staleness", "paramserver_worker_wait_fraction",
    "paramserver_push_bytes", "paramserver_pull_bytes", "paramserver_workers_alive",
    "paramserver_shard_apply_seconds", "paramserver_shard_version", "paramserver_updates_applied",
    "paramserver_shard_busy_seconds", "paramserver_link_rtt_seconds",
    "paramserver_shard_queue", "paramserver_shard_backlog",
}


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """{family: {labels (sorted pairs) + sample name: value}} of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(family.name, {})[
                (sample.name, *sorted(sample.labels.items()))] = sample.value
    return out


def _step(worker: int, step: int) -> AppendMetric:
    return AppendMetric(0.1 * step, {"kind": "step", "worker": worker, "step": step,
                                     "batch": 32, "compute_s": 0.03, "wait_s": 0.01,
                                     "pull_s": 0.005, "push_s": 0.005, "push_bytes": 1000,
                                     "pull_bytes": 2000, "staleness": step % 3})


def test_a_fed_coordinator_node_is_scraped_and_its_values_move(tmp_path):
    node = CoordinatorNode(JobSpec(workers=2, metrics_port=0),
                           events_path=str(tmp_path / "events.jsonl"))
    endpoint = node._serve_metrics()
    try:
        assert endpoint.host == "127.0.0.1"
        event = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
        assert event["event"] == "metrics_endpoint" and event["url"] == endpoint.url
        before = scrape(endpoint.url)
        assert before["paramserver_last_step_timestamp_seconds"][
            ("paramserver_last_step_timestamp_seconds",)] == 0
        node.execute([AppendEvent(1.0, "barrier_open", {"workers": 2}),
                      AppendEvent(0.5, "preflight", {"links": [
                          {"worker": "worker-0", "shard": 0, "rtt_ms": 0.2, "mbit_s": 900.0,
                           "bytes": 1 << 20}]})])
        node.execute([_step(w, s) for s in range(3) for w in range(2)])
        node.execute([AppendMetric(0.3, {"kind": "shard", "server": 0, "apply_s": 0.25,
                                         "applies": 3, "queue": 1, "backlog": 4,
                                         "version": 3}),
                      AppendMetric(0.3, {"kind": "server", "server": 0, "busy_s": 0.5,
                                         "late_pushes": 0, "duplicates": 0})])
        node.exporter.set_job(2, 1, 3, 192)
        t0 = time.time()
        mid = scrape(endpoint.url)
        assert FAMILIES <= set(mid), FAMILIES - set(mid)
        last = mid["paramserver_last_step_timestamp_seconds"][
            ("paramserver_last_step_timestamp_seconds",)]
        assert t0 - 60 < last <= t0 + 1
        assert mid["paramserver_steps"][("paramserver_steps_total", ("worker", "1"))] == 3
        assert mid["paramserver_samples"][("paramserver_samples_total", ("worker", "0"))] == 96
        assert mid["paramserver_worker_wait_fraction"][
            ("paramserver_worker_wait_fraction", ("worker", "0"))] == pytest.approx(0.2)
        assert mid["paramserver_shard_apply_seconds"][
            ("paramserver_shard_apply_seconds_total", ("shard", "0"))] == 0.25
        assert mid["paramserver_shard_version"][("paramserver_shard_version",
                                                 ("shard", "0"))] == 3
        assert mid["paramserver_workers_alive"][("paramserver_workers_alive",)] == 2
        assert mid["paramserver_link_bandwidth_bits_per_second"][
            ("paramserver_link_bandwidth_bits_per_second", ("shard", "0"),
             ("worker", "worker-0"))] == 900e6
        node.execute([_step(0, 3)])
        node.execute([AppendMetric(0.5, {"kind": "shard", "server": 0, "apply_s": 0.5,
                                         "applies": 1, "queue": 0, "backlog": 1})])
        after = scrape(endpoint.url)
        assert after["paramserver_steps"][("paramserver_steps_total", ("worker", "0"))] == 4
        assert after["paramserver_push_bytes"][
            ("paramserver_push_bytes_total", ("worker", "0"))] == 4000
        assert after["paramserver_shard_apply_seconds"][
            ("paramserver_shard_apply_seconds_total", ("shard", "0"))] == 0.75
        assert after["paramserver_shard_backlog"][("paramserver_shard_backlog",
                                                   ("shard", "0"))] == 1
        assert after["paramserver_last_step_timestamp_seconds"][
            ("paramserver_last_step_timestamp_seconds",)] >= last
    finally:
        endpoint.close()
        node.events.close()
    with pytest.raises(urllib.error.URLError):  # closed with the job: nothing answers
        urllib.request.urlopen(endpoint.url, timeout=5)


def test_the_registry_is_private(tmp_path):
    from prometheus_client import REGISTRY
    before = set(REGISTRY._names_to_collectors)
    node = CoordinatorNode(JobSpec(metrics_port=0))
    node._serve_metrics().close()
    assert set(REGISTRY._names_to_collectors) == before


def test_without_prometheus_client_metrics_port_exits_2_naming_the_extra(monkeypatch, capsys):
    from paramserver.cli.main import main
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if absent
    for argv in (["train", "--metrics-port", "0", "--steps", "1"],
                 ["launch", "--metrics-port", "0", "--", "true"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "paramserver[metrics]" in err and "prometheus_client" in err
    with pytest.raises(SystemExit) as exc:  # argparse names the flag
        main(["train", "--metrics-port", "70000"])
    assert exc.value.code == 2 and "--metrics-port" in capsys.readouterr().err


def test_a_bad_metrics_port_is_refused_by_the_flag_and_the_job():
    from paramserver.spec.job import JobSpecError
    for bad in (-1, 70000, "x"):
        with pytest.raises(JobSpecError):
            JobSpec(metrics_port=bad)
    job = JobSpec(metrics_port=0, metrics_host="0.0.0.0", preflight=False)
    assert JobSpec.from_dict(job.to_dict()) == job
    assert JobSpec().to_dict()["metrics_port"] is None  # no endpoint


@pytest.mark.slow
def test_the_endpoint_of_a_live_job_moves_and_ends_with_it(tmp_path):
    run = tmp_path / "run"
    job = subprocess.Popen(
        [sys.executable, "-m", "paramserver", "train", "--workers", "2", "--servers", "1",
         "--steps", "80", "--device-time", "1ms", "--eval-interval", "0", "--sync", "asp",
         "--metrics-port", "0", "--out", str(run), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
            events = run / "events.jsonl"
            if events.is_file():
                for line in events.read_text().splitlines():
                    if '"metrics_endpoint"' in line:
                        url = json.loads(line)["url"]
        assert url is not None, "no metrics_endpoint event"
        seen = []
        while job.poll() is None and time.monotonic() < deadline and len(seen) < 2:
            got = scrape(url)
            steps = sum(got.get("paramserver_steps", {}).values())
            if steps and (not seen or steps > seen[-1][0]):
                seen.append((steps, got))
            time.sleep(0.5)
        assert len(seen) == 2, "the steps did not move while the job ran"
        (_, first), (_, second) = seen
        assert {"paramserver_last_step_timestamp_seconds", "paramserver_steps",
                "paramserver_samples", "paramserver_worker_wait_fraction",
                "paramserver_push_bytes", "paramserver_workers_alive",
                "paramserver_link_rtt_seconds"} <= set(second)
        key = ("paramserver_last_step_timestamp_seconds",)
        assert second["paramserver_last_step_timestamp_seconds"][key] > \
            first["paramserver_last_step_timestamp_seconds"][key] > 0
        assert second["paramserver_workers_alive"][("paramserver_workers_alive",)] == 2
        out, err = job.communicate(timeout=240)
        assert job.returncode == 0, err[-2000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate(timeout=30)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
