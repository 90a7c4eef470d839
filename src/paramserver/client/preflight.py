"""A worker's preflight: its link to each shard probed through the same sockets (and emulated
link) as its pulls, and the figures sent to the coordinator for RUN/preflight.json. How a link
is measured is observe/core/preflight.py's (pure); this module does the I/O."""

from __future__ import annotations

import logging
import time

from paramserver.client.requests import ShardRequests
from paramserver.client.session import CoordinatorSession
from paramserver.net.rpc import RemoteError
from paramserver.observe.core.preflight import LinkProbe, probe_link
from paramserver.wire import Message

log = logging.getLogger(__name__)
# The longest one probe may wait for its shard (a dead one must not hold the start).
PROBE_TIMEOUT = 15.0


def probe_shards(requests: ShardRequests, shards: list, timeout: float) -> list[LinkProbe]:
    """Probe the link to each shard, one after another: round trip and a short burst's rate."""
    def roundtrip(shard: int):
        def timed(nbytes: int) -> float:
            began = time.perf_counter()
            rid = requests.send(shard, Message("probe", {"bytes": int(nbytes)}))
            requests.collect([(shard, rid, None)], "probe")
            took = time.perf_counter() - began
            requests.let_go(rid)
            return took
        return timed
    before, requests.timeout = requests.timeout, min(timeout, PROBE_TIMEOUT)
    try:
        return [probe_link(s.rank, roundtrip(i)) for i, s in enumerate(shards)]
    finally:
        requests.timeout = before


def preflight(session: CoordinatorSession, requests: ShardRequests, shards: list,
              rank: int) -> None:
    """The start's preflight, sent to the coordinator. It never stops the job: a failed probe
    or an older coordinator is logged."""
    began = time.perf_counter()
    try:
        links = probe_shards(requests, shards, session.timeout)
        session.call(Message("preflight", {"links": [p.wire() for p in links]}),
                     session.timeout)
    except (TimeoutError, RemoteError, ValueError) as exc:
        log.warning("preflight of worker %s skipped: %s", rank, exc)
        return
    log.info("preflight of worker %s: %s in %.3f s", rank,
             ", ".join(f"shard {p.shard} {p.rtt_s * 1e3:.2f} ms {p.rate / 1e6:.0f} mbit/s"
                       for p in links), time.perf_counter() - began)
