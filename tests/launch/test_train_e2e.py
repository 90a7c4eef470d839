"""`paramserver train` end to end: real processes, real PyTorch, the run folder's files."""

import json
import subprocess
import sys

import pytest

from paramserver.runlog.metrics import read_records
from ps_helpers import train_side_by_side


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The BSP run and the top-k run, side by side: most of each is process start-up."""
    root = tmp_path_factory.mktemp("train")
    args = {"bsp": ["--sync", "bsp", "--workers", "3", "--epochs", "12", "--lr", "0.2",
                    "--eval-interval", "0.5"],
            "topk": ["--sync", "bsp", "--workers", "2", "--servers", "2", "--epochs", "8",
                     "--compress", "topk", "--compress-opt", "fraction=0.01"]}
    return train_side_by_side(root, args)


@pytest.fixture(scope="module")
def bsp_run(runs):
    out, proc = runs["bsp"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_bsp_training_learns_digits(bsp_run):
    out, proc = bsp_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_accuracy"] >= 0.9
    assert summary["best_test_accuracy"] >= summary["final_test_accuracy"]
    assert "final test accuracy" in proc.stdout


def test_summary_has_the_documented_fields_and_consistent_counts(bsp_run):
    out, _ = bsp_run
    s = json.loads((out / "summary.json").read_text())
    for key in ("sync", "workers", "servers", "model", "dataset", "steps", "wall_time_s",
                "final_test_accuracy", "best_test_accuracy", "time_to_accuracy",
                "mean_wait_fraction", "updates_applied"):
        assert key in s, key
    records = read_records(out / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert s["steps"] == len(steps)
    # BSP: every worker ran every round, and each round was applied once.
    per_worker = {w: sum(1 for r in steps if r["worker"] == w) for w in range(3)}
    assert len(set(per_worker.values())) == 1
    assert s["updates_applied"] == per_worker[0]
    assert all(r["staleness"] == 0 for r in steps)
    assert s["samples"] >= 12 * 1437 * 0.99  # the sample budget was spent


def test_metrics_lines_carry_the_step_schema(bsp_run):
    out, _ = bsp_run
    records = read_records(out / "metrics.jsonl")
    step = next(r for r in records if r["kind"] == "step")
    for key in ("t", "worker", "step", "batch", "loss", "compute_s", "wait_s", "pull_s", "push_s",
                "pull_bytes", "push_bytes", "staleness"):
        assert key in step, key
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) >= 2 and evals[-1]["final"] is True
    assert all(0 <= e["accuracy"] <= 1 for e in evals)
    config = json.loads((out / "config.json").read_text())
    assert config["job"]["workers"] == 3


BAD_OPTIONS = [(["--sync", "nope"], "unknown sync policy"),
               (["--model", "resnet9000"], "unknown model"),
               (["--straggler", "7:3"], "names worker"),
               (["--link", "w7=100mbit"], "names worker 7"),
               (["--servers", "2", "--link", "s2=1gbit"], "names server 2"),
               (["--dataset", "mnist", "--data-dir", "{tmp}"], "train-images"),
               (["--device-time", "fast"], "device-time"),
               (["--launcher", "ray", "--restart-servers", "1", "--checkpoint-every", "5"],
                "not supported with --launcher ray")]


def test_a_bad_option_fails_the_command_process_with_a_clear_message(tmp_path):
    """The whole path once, as a user meets it: a process, exit 2, one line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--sync", "nope",
                           "--out", str(tmp_path / "x"), "--quiet"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown sync policy" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, fragment", BAD_OPTIONS, ids=lambda v: str(v)[:30])
def test_bad_options_fail_fast_with_a_clear_message(tmp_path, capsys, args, fragment):
    # In this interpreter (the one process start is the test above): each is a refusal before
    # any process or run folder, so the command ends with 2 and the message on stderr.
    from paramserver.cli.main import main
    out = tmp_path / "x"
    try:
        code = main(["train", *[a.format(tmp=tmp_path) for a in args], "--out", str(out),
                     "--quiet"])
    except SystemExit as exc:  # argparse's own refusals end the parse this way
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and "Traceback" not in err
    assert not out.exists()


def test_topk_pruned_pushes_carry_one_percent_and_still_learn(runs):
    out, proc = runs["topk"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    num_keys = config["job"]["num_keys"]
    steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
    expected = round(0.01 * num_keys) * (8 + 4)  # int64 key + float32 value per kept entry
    assert all(r["push_bytes"] == expected for r in steps)
    assert all(r["pull_bytes"] == num_keys * 4 for r in steps)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_test_accuracy"] >= 0.85


def test_the_final_model_file_scores_the_evaluators_last_accuracy(bsp_run):
    """model.pt holds the parameters of the evaluator's last evaluation: a fresh model of the
    job's kind loaded from it scores the accuracy the metrics log ends with."""
    import torch
    from paramserver.models.workload import build, evaluate
    out, _ = bsp_run
    job = json.loads((out / "config.json").read_text())["job"]
    ds, model, keys = build({**job["task"], "seed": job["task"].get("seed", 0) + 1},
                            job["dtype"])
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    accuracy, _ = evaluate(model, ds.test.X.to(keys.dtype), ds.test.y)
    last = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert last["final"]
    assert accuracy == pytest.approx(last["accuracy"], abs=1e-5)
