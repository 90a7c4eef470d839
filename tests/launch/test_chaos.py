"""Chaos: 4-worker digits runs with random SIGKILLs of workers, of one server (restarted from
its checkpoint) and of the coordinator (restarted, it takes the job back) finish, reach the
target accuracy, and lose the updates predicted."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "chaos", Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py")
chaos = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(chaos)

# Digits MLP, 6 epochs: ~0.92-0.95 at the end without faults, but asynchronous runs wander
# (a fault-free 4-epoch ASP run ended at 0.78, another at 0.94): the target must be reached
# after the server's restart, and the end must not be wrecked.
TARGET, FLOOR = 0.88, 0.7
EVERY = 10
POLICIES = ["bsp", "asp", "ssp", "ebsp", "r2sp", "lbbsp", "dssp"]


def check(r: dict, worker_kills: int) -> None:
    print(json.dumps(r))  # shown by pytest -rA: the figures of the run
    assert r["best_accuracy_after_restart"] is not None, r
    assert r["best_accuracy_after_restart"] >= TARGET and r["final_accuracy"] >= FLOOR, r
    assert r["workers_killed"] == worker_kills and r["worker_restarts"] >= worker_kills, r
    assert r["server_restarts"] == 1 and r["server_kill"] is not None, r
    # The restore used the checkpoint that was the latest at the kill, or one committed a
    # moment after (its servers had saved before the kill).
    restored = int(r["restored"][0])
    at_kill = int(r["server_kill"]["latest_at_kill"])
    assert at_kill <= restored <= r["server_kill"]["progress_at_kill"], r
    low, high = r["expected_lost"]
    assert low <= r["lost_updates"] <= high, r
    # The coordinator's death restarts nobody else and loses nothing more.
    assert r["coordinator_restarts"] == 1 and r["take_back_s"] is not None, r
    assert r["members_kept"] == r["members_at_kill"], r


@pytest.mark.slow  # fast twins: each role killed alone (runtime_faults, *_recovery)
def test_chaos_asp_with_a_worker_a_server_and_the_coordinator_killed(tmp_path):
    r = chaos.chaos_run("asp", tmp_path, seed=3, worker_kills=1, checkpoint_every=EVERY,
                        epochs=6.0, kill_coordinator=True)
    check(r, 1)


@pytest.mark.slow
@pytest.mark.parametrize("sync", POLICIES)
def test_chaos_every_policy(tmp_path, sync):
    r = chaos.chaos_run(sync, tmp_path, seed=POLICIES.index(sync), worker_kills=2,
                        checkpoint_every=EVERY, epochs=6.0, kill_coordinator=True)
    check(r, 2)
