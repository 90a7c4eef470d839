"""summarize(): the summary.json numbers from hand-written records."""

import json

import pytest

from paramserver.runlog.metrics import diverged_at, read_records, summarize, time_to_accuracy

JOB = {"sync": {"name": "bsp"}, "workers": 2, "servers": 1, "batch_size": 8,
       "optimizer": {"name": "sgd", "lr": 0.1}, "task": {"model": "mlp", "dataset": "digits"},
       "apply_mode": "round"}


def step(t, worker, step_no, compute, wait, pull=0.0, push=0.0, staleness=0, real=None):
    return {"t": t, "kind": "step", "worker": worker, "step": step_no, "batch": 8,
            "compute_s": compute, "real_compute_s": compute if real is None else real,
            "wait_s": wait, "pull_s": pull, "push_s": push, "staleness": staleness,
            "push_bytes": 100, "pull_bytes": 100}


RECORDS = [
    step(1.0, 0, 0, 1.0, 0.0), step(1.0, 1, 0, 0.5, 0.5, real=0.25),
    {"t": 1.2, "kind": "eval", "accuracy": 0.5},
    step(2.0, 0, 1, 1.0, 0.0, staleness=2), step(2.0, 1, 1, 0.5, 0.5, real=0.25),
    {"t": 2.5, "kind": "eval", "accuracy": 0.92},
    {"t": 3.0, "kind": "eval", "accuracy": 0.9, "final": True},
]


def test_summary_numbers_match_a_hand_computation():
    s = summarize(RECORDS, JOB)
    assert (s["steps"], s["samples"], s["wall_time_s"]) == (4, 32, 3.0)
    assert s["final_test_accuracy"] == 0.9 and s["best_test_accuracy"] == 0.92
    assert s["time_to_accuracy"]["0.9"] == 2.5 and s["time_to_accuracy"]["0.95"] is None
    # worker 0 never waits; worker 1 waits half of each step: mean of 0 and 0.5
    assert s["mean_wait_fraction"] == pytest.approx(0.25)
    assert s["updates_applied"] == 2  # round mode: rounds, not pushes
    assert s["mean_staleness"] == pytest.approx(0.5)
    assert s["real_compute_share"] == pytest.approx(2.5 / 3.0)
    assert s["per_worker"]["1"]["wait_s"] == pytest.approx(1.0)


def test_bytes_per_step_and_the_codecs_each_worker_named():
    s = summarize(RECORDS, JOB)
    assert (s["push_bytes_per_step"], s["pull_bytes_per_step"]) == (100, 100)
    assert (s["push_codecs"], s["pull_codecs"]) == ([], [])  # no step named one: dense
    # --compress auto: worker 1 behind a slow link pushed 8-bit, worker 0 dense.
    named = [{**r, "push_codec": ["none", "uniform8"][r["worker"]], "pull_codec": "none",
              "push_bytes": [100, 26][r["worker"]]} if r["kind"] == "step" else r
             for r in RECORDS]
    s = summarize(named, JOB)
    assert (s["push_codecs"], s["pull_codecs"]) == (["none", "uniform8"], ["none"])
    assert s["push_bytes_per_step"] == pytest.approx(63.0)
    assert "push_saved_bytes_per_step" not in s  # no step said what it saved
    # steps that say what their format saved (worker 1's): the mean over those steps
    saved = [{**r, "push_saved_bytes": 74, "pull_saved_bytes": 0}
             if r["kind"] == "step" and r["worker"] == 1 else r for r in named]
    s = summarize(saved, JOB)
    assert (s["push_saved_bytes_per_step"], s["pull_saved_bytes_per_step"]) == (74, 0)


def test_arrival_mode_counts_every_push_as_an_update():
    assert summarize(RECORDS, {**JOB, "apply_mode": "arrival"})["updates_applied"] == 4


def test_server_counters_are_each_shards_last_report_summed():
    reports = [{"t": 1.1, "kind": "server", "server": 0, "late_pushes": 1, "duplicates": 0},
               {"t": 1.5, "kind": "server", "server": 1, "late_pushes": 2, "duplicates": 1},
               {"t": 2.1, "kind": "server", "server": 0, "late_pushes": 3, "duplicates": 2}]
    s = summarize(RECORDS + reports, JOB)
    assert (s["late_pushes"], s["duplicate_pushes"]) == (5, 3)  # 3 + 2, not 1 + 2 + 3
    assert summarize(RECORDS, JOB)["late_pushes"] == 0


def test_time_to_accuracy_is_the_first_crossing():
    evals = [{"t": 1, "accuracy": 0.96}, {"t": 2, "accuracy": 0.5}, {"t": 3, "accuracy": 0.97}]
    assert time_to_accuracy(evals, (0.95, 0.97, 0.99)) == {"0.95": 1, "0.97": 3, "0.99": None}


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + '\n{"t": 4, "kind": "st')
    assert len(read_records(path)) == len(RECORDS)


def test_divergence_is_the_first_evaluation_whose_loss_is_not_finite(tmp_path):
    evals = [{"t": 1.0, "accuracy": 0.7, "test_loss": 0.9},
             {"t": 1.6, "accuracy": 0.1, "test_loss": 2.4e23},  # huge, but still a number
             {"t": 2.2, "accuracy": 0.1, "test_loss": float("inf")},
             {"t": 2.7, "accuracy": 0.1, "test_loss": float("nan")}]
    assert diverged_at(evals) == 2.2
    assert diverged_at(evals[:2]) is None
    assert diverged_at([{"t": 1.0, "accuracy": 0.5}]) is None  # no loss recorded: no verdict
    # Through the file: the evaluator writes NaN as JSON's NaN token, and it reads back.
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS + [
        {"t": 3.5, "kind": "eval", "accuracy": 0.1, "test_loss": float("nan")}]))
    assert summarize(read_records(path), JOB)["diverged_at_s"] == 3.5
    assert summarize(RECORDS, JOB)["diverged_at_s"] is None


def test_shard_load_is_each_shards_busy_share_and_the_imbalance():
    from paramserver.cli.train_cmd import unbalanced_line
    from paramserver.runlog.metrics import UNBALANCED
    beats = [{"t": 1.0, "kind": "server", "server": 0, "busy_s": 0.5},
             {"t": 2.0, "kind": "server", "server": 0, "busy_s": 1.5},  # the last one counts
             {"t": 2.0, "kind": "server", "server": 1, "busy_s": 0.5}]
    s = summarize(RECORDS + beats, {**JOB, "servers": 3})
    # shard 2 never reported: idle. Mean (1.5 + 0.5 + 0) / 3 = 2/3; wall 3 s.
    assert s["per_shard"] == {"0": {"busy_s": 1.5, "busy_fraction": 0.5},
                              "1": {"busy_s": 0.5, "busy_fraction": round(0.5 / 3, 4)},
                              "2": {"busy_s": 0.0, "busy_fraction": 0.0}}
    assert s["shard_imbalance"] == pytest.approx(1.5 / (2 / 3), abs=1e-4)
    assert s["shard_imbalance"] > UNBALANCED
    assert "busy 2.2x the shards' mean" in unbalanced_line(s)
    even = summarize(RECORDS + [{**b, "busy_s": 1.0} for b in beats], {**JOB, "servers": 2})
    assert even["shard_imbalance"] == 1.0 and unbalanced_line(even) is None
    # Runs that measured nothing (the simulator's, older ones) say so.
    assert summarize(RECORDS, JOB)["shard_imbalance"] is None
    assert summarize(RECORDS, JOB)["per_shard"] == {}


def test_drop_after_keeps_the_records_up_to_a_resumed_checkpoint(tmp_path):
    from paramserver.runlog.metrics import drop_after
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"t": 9.0, "kind": "st')
    assert drop_after(path, 2.0) == 3  # two records after t=2 and the torn last line
    kept = read_records(path)
    assert kept == RECORDS[:5]
    assert summarize(kept, JOB)["steps"] == 4
    assert drop_after(path, 2.0) == 0 and read_records(path) == RECORDS[:5]
    assert drop_after(tmp_path / "none.jsonl", 1.0) == 0  # a resume into a new folder


def test_last_steps_names_each_workers_newest_step_record(tmp_path):
    from paramserver.runlog.metrics import last_steps
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"t": 9.0, "kind": "st')
    assert last_steps(path) == {0: 1, 1: 1}
    assert last_steps(tmp_path / "none.jsonl") == {}


def test_workers_that_died_are_counted_and_train_says_so(capsys):
    """A worker SIGKILLed under BSP: the job went on and ended 0, and only events.jsonl said
    the worker had died."""
    from pathlib import Path

    from paramserver.cli.train_cmd import print_summary
    left = [{"t": 1.5, "kind": "left", "worker": 1, "reason": "dead"},
            {"t": 2.5, "kind": "left", "worker": 0, "reason": "done"}]
    s = summarize(RECORDS + left, JOB)
    assert s["workers_died"] == 1 and summarize(RECORDS, JOB)["workers_died"] == 0
    print_summary(s, Path("RUN"))
    assert "workers that died during the job: 1 (the others went on; --restart-workers N " \
        "replaces dead workers)" in capsys.readouterr().out
