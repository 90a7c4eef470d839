"""`train --launcher ray`: the roles as Ray actors on a local Ray instance, ZeroMQ as the data path.

Ray is an optional extra (`paramserver[ray]`); without it these tests skip and say so.
"""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional extra paramserver[ray]; "
                                        "pip install 'paramserver[ray]' to run these tests")

from paramserver.cli.train_cmd import run_training  # noqa: E402
from paramserver.config import TrainConfig  # noqa: E402
from paramserver.metrics import read_records  # noqa: E402
from paramserver.runtime.launcher import LaunchError  # noqa: E402
from paramserver.runtime.ray_launcher import Resources, check_resources  # noqa: E402

SMALL = {"worker_cpus": 0.5, "server_cpus": 0.5}  # 2 workers + 1 server fit in 2 CPUs


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow  # ~35 s on 2 shared cores, most of it Ray starting: beyond the default budget
def test_default_training_reaches_target_accuracy_as_ray_actors(local_ray, tmp_path):
    cfg = TrainConfig(sync="bsp", workers=2, epochs=4, lr=0.2)
    summary = run_training(cfg, tmp_path / "run", quiet=True, timeout=300,
                           launcher={"name": "ray", "resources": SMALL})
    assert summary["final_test_accuracy"] >= 0.9
    steps = [r for r in read_records(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "step"]
    assert {r["worker"] for r in steps} == {0, 1}
    logs = {p.name for p in (tmp_path / "run" / "logs").glob("*.log")}
    assert logs == {"coordinator.log", "server-0.log", "worker-0.log", "worker-1.log",
                    "evaluator.log"}
    results = sorted(json.loads(p.read_text())["rank"]
                     for p in (tmp_path / "run" / "results").glob("worker-*.json"))
    assert results == [0, 1]
    # The roles ran with the job's keys: a plaintext peer would have been refused.
    coordinator_log = (tmp_path / "run" / "logs" / "coordinator.log").read_text()
    assert "coordinator at tcp://127.0.0.1:" in coordinator_log


def test_more_than_the_cluster_has_is_a_clear_error():
    job = {"workers": 4, "servers": 1}
    with pytest.raises(LaunchError, match="asks Ray for 5 CPUs and 0 GPUs, the cluster has 2"):
        check_resources(job, Resources(1.0, 0.0, 1.0), {"CPU": 2.0})
    with pytest.raises(LaunchError, match="2 GPUs"):
        check_resources(job, Resources(0.25, 0.5, 1.0), {"CPU": 2.0})
    check_resources(job, Resources(0.25, 0.5, 1.0), {"CPU": 2.0, "GPU": 2.0})  # fits
