"""The coordinator's Prometheus endpoint (`--metrics-port`): job, worker and shard metrics.

`JobMetrics` is fed by the coordinator node's thread with what it writes anyway (each
metrics.jsonl record, each events.jsonl event, the member counts once per loop turn) and read
by the exporter's HTTP thread at each scrape, under one lock; a scrape copies the figures and
builds the families outside it. It is a custom collector in a private CollectorRegistry, never
the process-wide one. `MetricsEndpoint` serves it (prometheus_client's own HTTP server) on
127.0.0.1 by default and is closed with the job.

prometheus_client is the optional extra `metrics` (pip install 'paramserver[metrics]');
without it `require()` raises MetricsUnavailable naming the extra.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

EXTRA = "pip install 'paramserver[metrics]' (or: pip install 'prometheus_client>=0.20,<1')"
PREFIX = "paramserver_"


class MetricsUnavailable(RuntimeError):
    """--metrics-port was asked for and prometheus_client is not installed."""


def require() -> None:
    """Raise MetricsUnavailable unless prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailable(f"--metrics-port needs the optional prometheus_client "
                                 f"package: {EXTRA}") from None


def _num(record: dict, key: str) -> float | None:
    v = record.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


@dataclass
class _Worker:
    steps: int = 0
    samples: int = 0
    step: int = -1
    staleness: float = 0.0
    wait_s: float = 0.0
    busy_s: float = 0.0  # compute + data + push + pull
    push_bytes: float = 0.0
    pull_bytes: float = 0.0
    last_step_ts: float = 0.0


@dataclass
class _Shard:
    apply_s: float | None = None  # None until the shard's first `shard` record
    applies: float | None = None
    queue: float | None = None
    backlog: float | None = None
    busy_s: float | None = None
    version: float | None = None
    late_pushes: float | None = None


@dataclass
class _Job:
    workers: dict = field(default_factory=dict)
    shards: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)  # (worker, shard) -> (rtt_s, bits_per_s)
    last_step_ts: float = 0.0
    workers_alive: int = 0
    servers_alive: int = 0
    updates: int = 0
    samples: int = 0
    started: bool = False
    stalls: int = 0
    workers_left: int = 0


class JobMetrics:
    """The figures the endpoint shows, kept up to date by the coordinator node. `clock` gives
    the wall-clock time stamped on a step (the alerts' `time() - last_step` needs wall time)."""

    def __init__(self, policy: str, clock=time.time):
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._job = _Job()

    # ---- fed by the coordinator node ---------------------------------------------------------
    def on_metric(self, record: dict) -> None:
        kind = record.get("kind")
        if kind == "step":
            self._step(record)
        elif kind in ("shard", "server"):
            self._shard(record)

    def _step(self, r: dict) -> None:
        rank = r.get("worker")
        if not isinstance(rank, int):
            return
        now = self.clock()
        with self._lock:
            w = self._job.workers.setdefault(rank, _Worker())
            w.steps += 1
            w.samples += int(_num(r, "batch") or 0)
            w.step = int(r.get("step", w.step)) if isinstance(r.get("step"), int) else w.step
            w.staleness = _num(r, "staleness") or 0.0
            w.wait_s += _num(r, "wait_s") or 0.0
            w.busy_s += sum(_num(r, k) or 0.0 for k in ("compute_s", "data_s", "push_s",
                                                         "pull_s"))
            w.push_bytes += _num(r, "push_bytes") or 0.0
            w.pull_bytes += _num(r, "pull_bytes") or 0.0
            w.last_step_ts = self._job.last_step_ts = now

    def _shard(self, r: dict) -> None:
        rank = r.get("shard", r.get("server"))
        if not isinstance(rank, int):
            return
        with self._lock:
            s = self._job.shards.setdefault(rank, _Shard())
            if r["kind"] == "shard":  # per-beat figures: summed
                s.apply_s = (s.apply_s or 0.0) + (_num(r, "apply_s") or 0.0)
                s.applies = (s.applies or 0.0) + (_num(r, "applies") or 0.0)
                for key in ("queue", "backlog"):  # as at the beat
                    if _num(r, key) is not None:
                        setattr(s, key, _num(r, key))
            for key in ("busy_s", "version", "late_pushes"):  # cumulative: the last one
                if _num(r, key) is not None:
                    setattr(s, key, _num(r, key))

    def on_event(self, kind: str, data: dict) -> None:
        with self._lock:
            job = self._job
            if kind == "barrier_open":
                job.started = True
            elif kind.startswith("stall"):
                job.stalls += 1
            elif kind == "worker_left":
                job.workers_left += 1
            elif kind == "preflight":
                for link in data.get("links") or ():
                    if isinstance(link, dict) and isinstance(link.get("shard"), int):
                        rtt, rate = _num(link, "rtt_ms"), _num(link, "mbit_s")
                        job.links[(str(link.get("worker")), link["shard"])] = (
                            None if rtt is None else rtt / 1e3,
                            None if rate is None else rate * 1e6)

    def set_job(self, workers_alive: int, servers_alive: int, updates: int,
                samples: int) -> None:
        with self._lock:
            job = self._job
            job.workers_alive, job.servers_alive = workers_alive, servers_alive
            job.updates, job.samples = updates, samples

    # ---- read by the scrape ------------------------------------------------------------------
    def snapshot(self) -> _Job:
        with self._lock:
            job = self._job
            return _Job({k: _Worker(**vars(v)) for k, v in job.workers.items()},
                        {k: _Shard(**vars(v)) for k, v in job.shards.items()},
                        dict(job.links), job.last_step_ts, job.workers_alive,
                        job.servers_alive, job.updates, job.samples, job.started, job.stalls,
                        job.workers_left)

    def collect(self):
        """The metric families (the prometheus_client Collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        job = self.snapshot()

        def gauge(name, doc, value=None, labels=()):
            return GaugeMetricFamily(PREFIX + name, doc, value=value, labels=labels or None)

        def counter(name, doc, value=None, labels=()):
            return CounterMetricFamily(PREFIX + name, doc, value=value, labels=labels or None)

        info = gauge("info", "the job's sync policy (value 1)", labels=("policy",))
        info.add_metric([self.policy], 1)
        yield info
        yield gauge("last_step_timestamp_seconds",
                    "wall-clock time (Unix seconds) the coordinator received the last step "
                    "(0: none yet); alert on time() - this", job.last_step_ts)
        yield gauge("job_started", "1 once the start barrier opened", float(job.started))
        yield gauge("workers_alive", "workers registered and not gone", job.workers_alive)
        yield gauge("servers_alive", "shard servers registered and not gone", job.servers_alive)
        yield counter("updates_applied", "rounds applied (round mode) or worker steps "
                      "(arrival mode): the version the shards count", job.updates)
        yield counter("job_samples", "samples trained, all workers", job.samples)
        yield counter("workers_left", "workers that left the job (done or dead)",
                      job.workers_left)
        yield counter("stalls", "stall reports the coordinator wrote", job.stalls)
        per_worker = {
            "steps": counter("steps", "steps the worker clocked", labels=("worker",)),
            "samples": counter("samples", "samples the worker trained", labels=("worker",)),
            "step": gauge("worker_step", "the worker's last step index", labels=("worker",)),
            "staleness": gauge("worker_staleness", "staleness of the worker's last push",
                               labels=("worker",)),
            "wait": gauge("worker_wait_fraction", "wait / (wait + data + compute + push + "
                          "pull) over the worker's steps", labels=("worker",)),
            "push": counter("push_bytes", "payload bytes the worker pushed",
                            labels=("worker",)),
            "pull": counter("pull_bytes", "payload bytes the worker pulled",
                            labels=("worker",)),
            "ts": gauge("worker_last_step_timestamp_seconds", "wall-clock time of the "
                        "worker's last step", labels=("worker",)),
        }
        for rank, w in sorted(job.workers.items()):
            label = [str(rank)]
            total = w.wait_s + w.busy_s
            per_worker["steps"].add_metric(label, w.steps)
            per_worker["samples"].add_metric(label, w.samples)
            per_worker["step"].add_metric(label, w.step)
            per_worker["staleness"].add_metric(label, w.staleness)
            per_worker["wait"].add_metric(label, w.wait_s / total if total > 0 else 0.0)
            per_worker["push"].add_metric(label, w.push_bytes)
            per_worker["pull"].add_metric(label, w.pull_bytes)
            per_worker["ts"].add_metric(label, w.last_step_ts)
        yield from per_worker.values()
        per_shard = {
            "apply_s": counter("shard_apply_seconds", "seconds the shard spent applying "
                               "updates (from its heartbeats)", labels=("shard",)),
            "applies": counter("shard_applies", "updates the shard applied (from its "
                               "heartbeats)", labels=("shard",)),
            "queue": gauge("shard_queue", "requests waiting at the shard at its last "
                           "heartbeat", labels=("shard",)),
            "backlog": gauge("shard_backlog", "the most messages one read of the shard's "
                             "sockets found waiting, at its last heartbeat", labels=("shard",)),
            "busy_s": counter("shard_busy_seconds", "seconds the shard spent receiving, "
                              "handling and answering messages", labels=("shard",)),
            "version": gauge("shard_version", "the shard's version at its last heartbeat",
                             labels=("shard",)),
            "late_pushes": counter("shard_late_pushes", "pushes dropped as late",
                                   labels=("shard",)),
        }
        for rank, s in sorted(job.shards.items()):
            label = [str(rank)]
            for key in ("apply_s", "applies", "queue", "backlog", "busy_s", "version",
                        "late_pushes"):
                if getattr(s, key) is not None:
                    per_shard[key].add_metric(label, getattr(s, key))
        yield from per_shard.values()
        rtt = gauge("link_rtt_seconds", "preflight round trip, worker to shard",
                    labels=("worker", "shard"))
        rate = gauge("link_bandwidth_bits_per_second", "preflight burst rate, shard to "
                     "worker", labels=("worker", "shard"))
        for (worker, shard), (r, b) in sorted(job.links.items()):
            if r is not None:
                rtt.add_metric([worker, str(shard)], r)
            if b is not None:
                rate.add_metric([worker, str(shard)], b)
        yield rtt
        yield rate


class MetricsEndpoint:
    """prometheus_client's HTTP server for one JobMetrics on a private registry; close()
    stops it (the endpoint ends with the job)."""

    def __init__(self, metrics: JobMetrics, host: str = "127.0.0.1", port: int = 0):
        require()
        from prometheus_client import CollectorRegistry, start_http_server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.host = host
        self.port = self.server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
