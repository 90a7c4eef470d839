"""What a job asks a Ray cluster to hold together (launch/ray_launcher.py `bundles`), without
Ray: one bundle per process in the launcher's start order, summing to the job's demand."""

import pytest

from paramserver.launch.jobs import prepare_job
from paramserver.launch.ray_launcher import Resources, bundles, demand
from paramserver.spec.config import TrainConfig


@pytest.mark.parametrize("workers, min_workers, servers, replicas", [
    (2, 0, 1, 1), (4, 0, 2, 2), (4, 2, 1, 1)])
def test_one_bundle_per_process_in_start_order_summing_to_the_demand(
        workers, min_workers, servers, replicas):
    job = prepare_job(TrainConfig(workers=workers, min_workers=min_workers, servers=servers,
                                  replicas=replicas))
    r = Resources(worker_cpus=2.0, worker_gpus=0.5, server_cpus=1.0)
    got = bundles(job, r)
    shards = servers * replicas
    starting = min_workers or workers  # an elastic job starts its MIN
    assert got == [{"CPU": 1.0}] * shards + [{"CPU": 2.0, "GPU": 0.5}] * starting
    if not min_workers:  # the gang is the whole demand the resource check compares
        assert (sum(b["CPU"] for b in got), sum(b.get("GPU", 0) for b in got)) == demand(job, r)


def test_a_role_that_asks_for_nothing_has_an_empty_bundle():
    job = prepare_job(TrainConfig(workers=2, servers=1))
    assert bundles(job, Resources(worker_cpus=0.0, server_cpus=1.0)) == [{"CPU": 1.0}, {}, {}]
