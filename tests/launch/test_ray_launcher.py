"""`train --launcher ray`: the roles as Ray actors on a local Ray instance, ZeroMQ as the data path.

Ray is an optional extra (`paramserver[ray]`); without it these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional extra paramserver[ray]; "
                                        "pip install 'paramserver[ray]' to run these tests")

from paramserver.launch.jobs import prepare_job, run_training  # noqa: E402
from paramserver.spec.config import TrainConfig  # noqa: E402
from paramserver.runlog.metrics import read_records  # noqa: E402
from paramserver.launch.local import LaunchError  # noqa: E402
from paramserver.launch.ray_launcher import (  # noqa: E402
    RayCluster, Resources, check_resources,
)
from ps_helpers import steps_after_the_death  # noqa: E402

SMALL = {"worker_cpus": 0.5, "server_cpus": 0.5}  # 2 workers + 1 server fit in 2 CPUs


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def role_folders() -> set[str]:
    """The role folders Ray actors on this host have in the temp folder (RoleProcess)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("paramserver-*-*")
            if p.is_dir() and p.name.split("-")[1] in ("coordinator", "server", "worker",
                                                       "evaluator")}


@pytest.mark.slow  # ~35 s on 2 shared cores, most of it Ray starting: beyond the default budget
def test_default_training_reaches_target_accuracy_as_ray_actors(local_ray, tmp_path):
    cfg = TrainConfig(sync="bsp", workers=2, epochs=4, lr=0.2)
    before = role_folders()
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
    assert (tmp_path / "run" / "model.pt").stat().st_size > 0  # the evaluator's final model
    # The roles ran with the job's keys: a plaintext peer would have been refused.
    coordinator_log = (tmp_path / "run" / "logs" / "coordinator.log").read_text()
    assert "coordinator at tcp://127.0.0.1:" in coordinator_log
    # Each role's private folder (its keys among its files) is gone once the job is.
    assert role_folders() - before == set()


@pytest.mark.slow  # ~40 s: waits for the heartbeat timeout and Ray's restart
def test_a_killed_worker_is_restarted_by_ray_and_rejoins(local_ray, tmp_path):
    cfg = TrainConfig(sync="bsp", workers=2, epochs=10, lr=0.2, heartbeat_timeout=2.0,
                      device_time="2ms", eval_interval=1.0, restart_workers=1)
    cluster = RayCluster(prepare_job(cfg), tmp_path, resources=Resources(**SMALL),
                         job_timeout=300, restart_workers=1)
    killed = []
    before = role_folders()

    def kill_once():  # 20 rounds into training: SIGKILL worker 1's role process
        actors = {name: a for name, _, a in cluster.actors}
        if killed or ray.get(actors["coordinator"].read.remote("events.jsonl")).count(
                b"apply_round") < 20:
            return
        actor = actors["worker 1"]
        pid = ray.get(actor.pid.remote())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    cluster.run(on_tick=kill_once)
    assert killed
    records = read_records(tmp_path / "metrics.jsonl")
    later = steps_after_the_death(records)
    assert later, "the worker Ray restarted never trained"
    assert [r for r in records if r["kind"] == "eval"][-1]["accuracy"] >= 0.9
    # Neither the killed incarnation's folder nor its successor's is left on the node.
    assert role_folders() - before == set()


@pytest.mark.slow  # ~45 s: Ray starting, the heartbeat timeout and Ray's actor restart
def test_replicated_shards_as_ray_actors_a_killed_primary_loses_nothing(local_ray, tmp_path):
    """--replicas 2 through Ray: a backup actor beside the shard's primary; the primary's
    process is SIGKILLed mid-training, its backup takes over, and Ray restarts the dead
    actor as a new backup that the survivor rebuilds."""
    from paramserver.runlog.metrics import summarize
    cfg = TrainConfig(sync="asp", workers=1, epochs=6, lr=0.2, heartbeat_timeout=2.0,
                      device_time="2ms", eval_interval=1.0, replicas=2)
    job = prepare_job(cfg)
    cluster = RayCluster(job, tmp_path, resources=Resources(**SMALL), job_timeout=300)
    killed = []
    before = role_folders()

    def kill_once():  # 100 steps into training: SIGKILL the primary's role process
        actors = {name: a for name, _, a in cluster.actors}
        if killed or ray.get(actors["coordinator"].read.remote("metrics.jsonl")).count(
                b'"kind": "step"') < 100:
            return
        killed.append(ray.get(actors["server 0"].pid.remote()))
        os.kill(killed[0], signal.SIGKILL)

    cluster.run(on_tick=kill_once)
    assert killed
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("backup_synced") == 1 and kinds.count("replica_promoted") == 1, kinds
    assert "backup_rebuilt" in kinds[kinds.index("replica_promoted"):], kinds
    records = read_records(tmp_path / "metrics.jsonl")
    summary = summarize(records, job)
    assert (summary["lost_updates"], summary["replica_promotions"]) == (0, 1)
    assert [r for r in records if r["kind"] == "eval"][-1]["accuracy"] >= 0.9
    logs = {p.name for p in (tmp_path / "logs").glob("*.log")}
    assert {"server-0.log", "backup-0.log"} <= logs
    # The killed primary's actor, restarted by Ray, came back as the shard's new backup.
    assert "server b0 serving keys" in (tmp_path / "logs" / "server-0.log").read_text()


def test_a_replicated_job_asks_ray_for_a_backup_per_shard():
    job = {"workers": 2, "servers": 2, "replicas": 2}
    with pytest.raises(LaunchError, match="asks Ray for 6 CPUs"):
        check_resources(job, Resources(1.0, 0.0, 1.0), {"CPU": 4.0})


def test_more_than_the_cluster_has_is_a_clear_error():
    job = {"workers": 4, "servers": 1}
    with pytest.raises(LaunchError, match="asks Ray for 5 CPUs and 0 GPUs, the cluster has 2"):
        check_resources(job, Resources(1.0, 0.0, 1.0), {"CPU": 2.0})
    with pytest.raises(LaunchError, match="2 GPUs"):
        check_resources(job, Resources(0.25, 0.5, 1.0), {"CPU": 2.0})
    check_resources(job, Resources(0.25, 0.5, 1.0), {"CPU": 2.0, "GPU": 2.0})  # fits


def test_an_address_with_no_ray_cluster_is_a_clear_error(tmp_path, monkeypatch):
    """`--launcher ray --address auto` where no Ray cluster runs: one line naming the address
    and what to do, not Ray's ConnectionError as a traceback."""
    import types

    def init(**kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the "
                              "one to connect to by setting `--address` flag or `RAY_ADDRESS` "
                              "environment variable.")
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setattr("paramserver.launch.ray_launcher.import_ray", lambda: fake)
    cluster = RayCluster(prepare_job(TrainConfig(workers=2, steps=2)), tmp_path, address="auto")
    with pytest.raises(LaunchError) as failed:
        cluster.run()
    assert str(failed.value) == (
        "no Ray cluster at --address auto: Could not find any running Ray instance (start "
        "one with `ray start --head`, or leave --address out for a local Ray instance)")
