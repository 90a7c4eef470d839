"""The test suite, by area: each folder holds the tests of one part of the system.

    policies/     sync policies, their host, auto, ZipLine
    optim/        update rules and the user's torch optimizer on the servers
    compression/  codecs and compressed pushes and pulls
    coordinator/  the coordinator's core and its parts: membership, elastic, stalls
    server/       the shard's core, store, replicas, resharding, sparse tables, bounds
    client/       the worker's client, its API, device staging, zero-copy paths
    wire/         the wire format, hostile frames, CURVE, addresses
    launch/       launchers (local, Ray, netns, Kubernetes manifests, scheduler tasks),
                  checkpoints, resume, export, lifetimes, exit codes, compare
    sim/          the simulator and the speed predictors
    advise/       advise and calibrate
    observe/      report, summary, top, trace, TensorBoard, Prometheus
    spec/         the job spec, the CLI's help and errors, models and data
    house/        the shape of the code: layering, import arrows, class sizes, the docs

Shared builders, process starts and bounded waits live in tests/ps_helpers.py (policy_driver.py
drives a policy as the runtime does; script_setup.py holds the user-script tests' common
setup); a test module never imports another. The slow tests are marked `slow` (`pytest -m
slow`), each with a fast twin here; every test of a module that starts processes (roles,
scripts, launchers, namespaces) is marked `live` here, so `pytest -m "not live"` runs the pure
tier alone (cores, policies, codecs, specs: no process started) in about 80 s here.
"""

import os
import sys
from pathlib import Path

# The helpers above are imported by name from every folder.
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# One torch thread a process, as torchrun gives each of several local ranks: a launched job's
# user scripts (and the roles, workers and jobs the tests start, which inherit this) share
# 2 cores, where torch's default of a thread per core had each rank's steps wait on the
# others' threads (a 2-rank script's 48 rounds: 8.3 s -> 0.8 s here). Set before torch is
# imported, so this process keeps one thread too; a test that needs more sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# In the test process a DistributedOptimizer or init() with no job to join is refused, as it
# was before a script run with plain python got a job of its own (launch/standalone.py, tested
# through such a script in a process of its own): marked wired, the API keeps `own_job` None,
# so no test that checks a refusal starts a job in the test process.
import paramserver  # noqa: E402  (light: the torch-backed API loads on first use)

paramserver._wired = True


# What a module that starts processes names: a test in one is `live`.
LIVE_NAMES = ("subprocess", "multiprocessing", "CTX", "running_job", "LocalCluster", "NetLab",
              "SlurmLab", "start_workers", "started_client", "serve_bare_job", "KVWorker(",
              "ServerNode(", "step_loop", "train_side_by_side", "run_training", "run_script",
              "RayCluster", 'importorskip("ray"', "chaos_run")


def pytest_collection_modifyitems(config, items):
    import pytest
    seen: dict[str, bool] = {}
    for item in items:
        path = str(item.fspath)
        if path not in seen:
            text = Path(path).read_text()
            seen[path] = any(name in text for name in LIVE_NAMES)
        if seen[path]:
            item.add_marker(pytest.mark.live)
