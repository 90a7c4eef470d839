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
setup); a test module never imports another. Tests that start processes say so in their
docstring and the slow ones are marked `slow` (`pytest -m slow`), each with a fast twin here.
"""

import sys
from pathlib import Path

# The helpers above are imported by name from every folder.
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
