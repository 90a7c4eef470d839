"""A process bound to every interface (0.0.0.0) tells its peers an address they can dial."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from paramserver.client.kv import KVWorker
from paramserver.transport.addresses import AddressError, advertised_host
from ps_helpers import make_job


def test_a_wildcard_bind_advertises_the_route_to_the_coordinator():
    assert advertised_host("0.0.0.0", "tcp://127.0.0.1:5555") == "127.0.0.1"
    assert advertised_host("10.1.2.3", "tcp://127.0.0.1:5555") == "10.1.2.3"  # as bound
    assert advertised_host("0.0.0.0", "tcp://127.0.0.1:5555", advertise="h7") == "h7"
    with pytest.raises(AddressError, match="--advertise"):
        advertised_host("0.0.0.0", "tcp://no-such-host.invalid:5555")


def _role(*args):
    return subprocess.Popen([sys.executable, "-m", "paramserver", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_workers_reach_a_server_bound_to_every_interface(tmp_path):
    """Before, the server told the coordinator tcp://0.0.0.0:port, which no other host can
    dial; now workers get the address on the server's route to the coordinator."""
    job_file, addr_file = tmp_path / "job.json", tmp_path / "coord.addr"
    job_file.write_text(json.dumps(make_job(10, 1, 1, sync="asp")))
    procs = [_role("coordinator", "--job", str(job_file), "--address-file", str(addr_file))]
    try:
        deadline = time.monotonic() + 60
        while not addr_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        join = addr_file.read_text()
        procs.append(_role("server", "--join", join, "--bind", "0.0.0.0", "--insecure"))
        with KVWorker(join, timeout=60) as kv:
            assert kv.shards[0].addr.startswith("tcp://127.0.0.1:")
            kv.init(np.arange(10.0))
            np.testing.assert_array_equal(kv.pull(), np.arange(10.0))
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
            p.stderr.close()


def test_a_join_address_is_checked_as_text_and_host_port_reads_as_tcp():
    from paramserver.core.endpoints import EndpointError, endpoint
    assert endpoint("tcp://10.0.0.1:5555") == "tcp://10.0.0.1:5555"
    assert endpoint("node-3.cluster:5555") == "tcp://node-3.cluster:5555"
    assert endpoint("tcp://[::1]:5555") == "tcp://[::1]:5555"
    for bad in ("not-an-address", "tcp://h:99999", "tcp://h:", "ipc:///tmp/x", "tcp://:5555",
                "10.0.0.1"):
        with pytest.raises(EndpointError, match="give tcp://HOST:PORT"):
            endpoint(bad)


def test_a_role_given_a_malformed_join_says_the_form_without_a_traceback():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "paramserver", "worker", "--join",
                           "not-an-address"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'not-an-address' is no address to join: give tcp://HOST:PORT" in done.stderr


@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_role_joining_where_no_job_runs_says_so_within_seconds(role):
    # the server waited its whole registration timeout (60 s) without a word
    from ps_helpers import free_port, reap
    proc = subprocess.Popen([sys.executable, "-m", "paramserver", role, "--join",
                             f"tcp://127.0.0.1:{free_port()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    import threading
    guard = threading.Timer(30, proc.kill)  # the read below ends by then, said or not
    guard.start()
    try:
        line = proc.stderr.readline()  # the role says it within SAY_WAITING (3 s)
    finally:
        guard.cancel()
        reap(proc)
        proc.stderr.close()
    assert "no answer yet from a coordinator at tcp://127.0.0.1:" in line, line
    assert "is a job running there?" in line
