"""`compare --workers MIN:MAX`: every run starts MIN workers and MAX - MIN join it at --join-at,
through the live join path; the report's timelines show the joins.

The default tests check the logic (when the joiners go, which slots, the reference's batch, the
flags); the live comparison is slow (two real jobs, ~1 min on a loaded 2-core machine)."""

import json

import pytest

from paramserver.cli.compare_cmd import ScheduledJoins, joins_for
from paramserver.cli.main import main
from paramserver.spec.compare_plan import THIRD, JoinAt, single_reference
from paramserver.spec.config import TrainConfig


def test_join_at_reads_seconds_or_a_share_of_the_budget():
    assert JoinAt.parse("20s") == JoinAt(seconds=20.0) == JoinAt.parse("20")
    assert JoinAt.parse("500ms").seconds == 0.5
    assert JoinAt.parse("25%") == JoinAt(share=0.25)
    assert THIRD.text() == "33%" and JoinAt.parse("20s").text() == "20s"
    for bad in ("soon", "%", "100%", "-5%", "-1s"):
        with pytest.raises(ValueError):
            JoinAt.parse(bad)


def test_join_at_is_due_at_the_same_work_or_time():
    third = THIRD
    assert not third.due(100.0, 332, 1000, None)  # seconds do not count, samples do
    assert third.due(0.1, 334, 1000, None)
    assert not third.due(9.9, 0, None, 30.0) and third.due(10.0, 0, None, 30.0)
    at = JoinAt(seconds=5.0)
    assert not at.due(4.99, 10 ** 6, 1000, None) and at.due(5.0, 0, 1000, None)


class Slots:
    """What ScheduledJoins needs of a LocalCluster: its job's budget and add_worker (here
    recorded; the slow test below starts real workers)."""

    def __init__(self, max_samples=None, max_seconds=None):
        self.spec = type("Spec", (), {"max_samples": max_samples, "max_seconds": max_seconds})()
        self.added = []

    def add_worker(self, slot):
        self.added.append(slot)


def step(t, batch=10):
    return json.dumps({"t": t, "kind": "step", "worker": 0, "step": 0, "batch": batch}) + "\n"


def test_the_joiners_go_once_when_due_read_from_the_growing_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    joins = ScheduledJoins(metrics, JoinAt(share=0.5), 2, 4)
    cluster = Slots(max_samples=100)
    joins(cluster)  # no file yet
    metrics.write_text(step(0.1) * 4)
    joins(cluster)
    assert cluster.added == []  # 40 of 100 samples
    with open(metrics, "a") as f:
        f.write('{"t": 0.3, "kind": "st')  # a line still being written: not counted yet
    joins(cluster)
    assert cluster.added == []
    with open(metrics, "a") as f:
        f.write('ep", "worker": 1, "step": 0, "batch": 10}\n')  # 50 of 100: due
    joins(cluster)
    joins(cluster)  # once
    assert cluster.added == [2, 3] and joins.joined_at == pytest.approx(0.3)


def test_only_an_elastic_run_with_room_gets_joiners(tmp_path):
    assert joins_for(TrainConfig(workers=4), tmp_path, THIRD) is None
    assert joins_for(TrainConfig(workers=2, min_workers=2), tmp_path, THIRD) is None
    joins = joins_for(TrainConfig(workers=4, min_workers=2), tmp_path, THIRD)
    assert list(joins.slots) == [2, 3]
    # the reference trains alone at the global batch the runs start with
    ref = single_reference(TrainConfig(workers=4, min_workers=2, batch_size=16,
                                       batch_rule="keep-global"))
    assert (ref.workers, ref.min_workers, ref.batch_size, ref.batch_rule) == (1, 0, 32, "fixed")
    ref.validate()


def test_join_at_needs_an_elastic_comparison(tmp_path, capsys):
    assert main(["compare", "--workers", "2", "--join-at", "20s", "--out",
                 str(tmp_path)]) == 2
    assert "--join-at applies to an elastic comparison" in capsys.readouterr().err


def test_an_elastic_comparison_through_ray_is_refused_before_any_run(tmp_path, capsys):
    """Scheduled joins start workers on this machine: under Ray they would not join the
    cluster's job, so the pair is refused, naming what works (nothing needs Ray for this)."""
    out = tmp_path / "cmp"
    assert main(["compare", "--workers", "1:2", "--launcher", "ray", "--address", "10.0.0.1:6379",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--workers MIN:MAX (scheduled joins) needs the local launcher" in err
    assert "Traceback" not in err and not out.exists()


def test_a_ray_comparison_refuses_what_ray_does_not_carry(tmp_path, capsys):
    assert main(["compare", "--launcher", "ray", "--restart-servers", "1",
                 "--out", str(tmp_path / "cmp")]) == 2
    assert "--restart-servers is not supported with --launcher ray" in capsys.readouterr().err


@pytest.mark.slow
def test_an_elastic_comparison_runs_every_policy_through_the_joins(tmp_path):
    # 64 ms a step (32 x 2 ms): ~3 s an epoch alone, so the joiner, started at 15% (~2 s in),
    # has time to start (Python and torch: seconds on a loaded machine) and train.
    code = main(["compare", "--sync", "bsp,ssp", "--workers", "1:2", "--join-at", "15%",
                 "--epochs", "4", "--device-time", "2ms", "--no-single", "--quiet", "--repeats", "1",
                 "--out", str(tmp_path), "--scenario", "homogeneous", "--eval-interval", "1"])
    assert code == 0
    plan = json.loads((tmp_path / "compare.json").read_text())
    assert plan["elastic"] == {"min_workers": 1, "max_workers": 2, "join_at": "15%",
                               "batch_rule": "fixed"}
    assert all(r["ok"] for r in plan["runs"]) and len(plan["runs"]) == 2
    for policy in ("bsp", "ssp"):
        run = tmp_path / "runs" / "homogeneous" / policy / "rep-0"
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        joined = [e for e in events if e["event"] == "worker_joined"]
        assert [e["worker"] for e in joined] == [1], policy
        budget = next(e for e in events if e["event"] == "budget_reached")["samples"]
        # started at 15% of the work; it joins once its process is up
        assert 0.15 * budget <= joined[0]["samples"] < budget
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("kind") == "step" and r["worker"] == 1 for r in steps)
    html = (tmp_path / "report.html").read_text()
    assert html.count("worker 1 joined at round") >= 2
