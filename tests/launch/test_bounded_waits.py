"""Waits that end: a server whose coordinator is gone exits naming it; a coordinator whose
workers never start fails naming who registered."""

import os
import signal
import subprocess
import time

from paramserver.core.exits import Exit, PeerLost
from ps_helpers import make_job, running_job


def test_a_server_exits_naming_its_coordinator_once_that_is_gone(tmp_path):
    with running_job(tmp_path, make_job(8, 1, 1, coordinator_timeout=1.5)) as cluster:
        coord = cluster.children[0]
        server = next(c for c in cluster.children if c.role == "server")
        events = cluster.run_dir / "events.jsonl"
        deadline = time.monotonic() + 30
        while "server_joined" not in events.read_text():
            assert time.monotonic() < deadline, "the server never joined"
            time.sleep(0.05)
        time.sleep(0.5)  # it has heard the coordinator at least once since
        os.kill(coord.proc.pid, signal.SIGKILL)
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError("the server outlived its coordinator by 20 s") from None
        assert server.proc.returncode == Exit.PEER_LOST
        assert f"coordinator at {cluster.address} has been silent" in server.tail()


def test_no_worker_started_fails_the_job_naming_the_registered(tmp_path):
    with running_job(tmp_path, make_job(8, 1, 2, start_timeout=2.0)) as cluster:
        coord = cluster.children[0]
        coord.proc.wait(20)
        assert coord.proc.returncode == Exit.PEER_LOST  # no worker came: a retry may do
        assert "no worker started within 2 s; expected 2, registered: none" in coord.tail()


def test_a_worker_waiting_for_its_release_gives_up_once_the_coordinator_is_gone(tmp_path):
    """The coordinator answers workers' heartbeats: a worker blocked in start() (the barrier
    waits for a second worker) ends with an error naming it soon after it died, rather than
    after release_timeout (10 minutes)."""
    import threading

    import numpy as np

    from paramserver.client.kv import KVWorker

    with running_job(tmp_path, make_job(8, 1, 2, sync="bsp", coordinator_timeout=1.5)) as cluster:
        kv = KVWorker(cluster.address)
        outcome = []

        def start():
            try:
                kv.start()
                outcome.append("released")
            except TimeoutError as exc:
                outcome.append(str(exc))
        try:
            kv.init(np.zeros(8))
            waiter = threading.Thread(target=start, daemon=True)
            waiter.start()
            time.sleep(1.0)  # blocked at the barrier, heartbeats answered
            assert not outcome
            os.kill(cluster.children[0].proc.pid, signal.SIGKILL)
            waiter.join(timeout=30)
            assert outcome and "has been silent" in outcome[0], outcome
            assert cluster.address in outcome[0]
        finally:
            kv.close()


def test_a_role_given_a_join_file_reads_the_address_once_written_or_gives_up_naming_it(
        tmp_path, monkeypatch):
    import argparse
    import threading

    import pytest

    from paramserver.cli import roles
    path = tmp_path / "coordinator.addr"
    args = argparse.Namespace(command="server", join=None, join_file=str(path))
    monkeypatch.setattr(roles, "JOIN_FILE_WAIT", 0.3)
    with pytest.raises(PeerLost, match=f"no coordinator address in {path} within 0.3 s"):
        roles._join(args)
    monkeypatch.setattr(roles, "JOIN_FILE_WAIT", 30.0)
    writer = threading.Timer(0.2, path.write_text, args=("tcp://127.0.0.1:5555\n",))
    writer.start()
    try:
        assert roles._join(args) == "tcp://127.0.0.1:5555"
    finally:
        writer.join(10)
    assert roles._join(argparse.Namespace(join="tcp://h:1", join_file=None)) == "tcp://h:1"
