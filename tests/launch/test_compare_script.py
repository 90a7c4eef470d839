"""`paramserver compare ... -- CMD`: the user's own script under each policy, and the report."""

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paramserver.cli.main import main
from paramserver.runlog.metrics import evaluations, summarize

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "compare_my_model.py"

# Rank 0 reports a made-up test accuracy that grows with its steps: the report must show the
# script's own numbers, not an evaluator's.
SCRIPT = """
import torch
from torch import nn
import paramserver

torch.manual_seed(0)
model = nn.Linear(4, 2)
with paramserver.DistributedOptimizer(model) as opt:
    step = 0
    while not opt.should_stop:
        opt.zero_grad()
        model(torch.ones(opt.batch_size, 4)).pow(2).mean().backward()
        opt.step()
        step += 1
        if opt.rank == 0:
            opt.report(test_accuracy=min(1.0, 0.25 * step), test_loss=1.0 / step)
"""


def compare(tmp_path, script: Path, *flags: str, timeout: float = 120):
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "compare", "--out", str(out), "--quiet",
         "--no-single", "--repeats", "1", *flags, "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=timeout)
    return proc, out


def results(out: Path) -> dict[str, dict]:
    with open(out / "results.csv") as f:
        return {row["policy"]: row for row in csv.DictReader(f)}


def test_compare_runs_a_user_script_per_policy_and_reports_its_metric(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(SCRIPT))
    # One worker a run keeps it short (each run starts its processes); the slow test below
    # runs three, and LB-BSP. R2SP, whose batches and releases follow measured speeds, runs
    # a user script here.
    proc, out = compare(tmp_path, script, "--sync", "bsp,r2sp", "--workers", "1",
                        "--scenario", "slow=0:3", "--steps", "6", "--batch-size", "4",
                        "--device-time", "1ms", "--target", "0.9")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (out / "report.html").exists()
    # The verdict ends the console's output too, before the page's path.
    verdict = " ".join((out / "verdict.txt").read_text().split())
    printed = " ".join(proc.stdout.split())  # (the console wraps it to its width)
    assert verdict.startswith("On slow, ") and verdict in printed
    assert printed.index(verdict) < printed.index("report: ")
    rows = results(out)
    assert set(rows) == {"bsp", "r2sp"}
    for policy, row in rows.items():
        run = out / "runs" / "slow" / policy / "rep-0"
        summary = json.loads((run / "summary.json").read_text())
        # The budget is the same for each policy: 6 steps x 4 samples.
        assert summary["samples"] == 24 and summary["sync"] == policy
        # The scenario's straggler reached the script: 3 x 4 samples x 1 ms a step.
        assert summary["straggler"] == "0:3"
        assert summary["per_worker"]["0"]["compute_s"] == pytest.approx(6 * 0.012, rel=0.2)
        assert float(row["final_score"]) == 1.0 and row["reached"] == "1"
        assert 0 < float(row["time_to_target_s"]) <= summary["wall_time_s"]
        config = json.loads((run / "config.json").read_text())
        assert config["command"] == [sys.executable, str(script)]
        assert "model" not in config["config"] and summary["model"] == " ".join(
            config["command"])  # no built-in model is named as if it had run
    plan = json.loads((out / "compare.json").read_text())
    assert plan["worker_command"] == [sys.executable, str(script)]
    assert "epochs" not in plan["config"] and plan["config"]["steps"] == 6


@pytest.mark.parametrize("flags, named", [
    (["--model", "cnn", "--steps", "5"], "--model does not apply to a script run"),
    (["--epochs", "3"], "--epochs does not apply"),
    (["--eval-interval", "1", "--steps", "5"], "opt.report(test_accuracy=...)"),
    (["--compress-variant", "topk", "--steps", "5"], "--compress-variant does not apply"),
    ([], "--steps N"),
    (["--servers", "auto", "--steps", "5"], "give a count"),
])
def test_built_in_model_flags_are_refused_for_a_script(flags, named, capsys):
    assert main(["compare", *flags, "--", "python", "train.py"]) == 2
    assert named in capsys.readouterr().err


def test_stray_arguments_without_the_separator_are_refused(capsys):
    assert main(["compare", "python", "train.py"]) == 2
    assert "goes after '--'" in capsys.readouterr().err


def test_a_scripts_reported_test_metric_counts_as_the_evaluation():
    records = [
        {"kind": "step", "t": 0.5, "worker": 0, "step": 0, "batch": 8},
        {"t": 1.0, "test_accuracy": 0.6},  # kv.report({"test_accuracy": ...})
        {"t": 2.0, "kind": "eval", "accuracy": 0.96, "worker": 0},  # opt.report(...)
        {"t": 3.0, "acc": 0.99},  # ambiguous names (training accuracy?) do not count
        {"t": 1.5, "kind": "left", "test_accuracy": 0.99},
    ]
    evals = evaluations(records)
    assert [(e["t"], e["accuracy"]) for e in evals] == [(1.0, 0.6), (2.0, 0.96)]
    summary = summarize(records, {"workers": 1})
    assert summary["time_to_accuracy"]["0.95"] == 2.0
    assert summary["final_test_accuracy"] == 0.96


@pytest.mark.slow
def test_lbbsp_reaches_a_user_scripts_target_before_bsp_with_a_3x_straggler(tmp_path):
    # The example script (own model, DataLoader, test split; rank 0 reports its accuracy) with
    # worker 1 three times slower: LB-BSP shrinks its batch and reaches 95% sooner than BSP,
    # as in `compare` on the built-in model; R2SP runs the script too.
    proc, out = compare(tmp_path, EXAMPLE, "--sync", "bsp,lbbsp,r2sp", "--workers", "3",
                        "--steps", "150", "--device-time", "1ms", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = results(out)
    assert rows["bsp"]["reached"] == rows["lbbsp"]["reached"] == "1", rows
    assert float(rows["lbbsp"]["time_to_target_s"]) < float(rows["bsp"]["time_to_target_s"])
    assert rows["r2sp"]["outcome"] and int(rows["r2sp"]["steps"]) >= 400
    assert float(rows["r2sp"]["best_score"]) > 0.5  # it trained on the script's reports


@pytest.mark.slow  # ~7 s on a loaded machine: the default suite keeps the one run above
def test_a_script_that_fails_is_named_with_its_output_and_no_report_is_claimed(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text('raise SystemExit("no data here on purpose")\n')
    proc, out = compare(tmp_path, script, "--sync", "bsp", "--workers", "1", "--scenario",
                        "same=none", "--steps", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worker 0 died" in proc.stdout and "no data here on purpose" in proc.stdout
    assert "Traceback" not in proc.stderr and "no report" in proc.stderr
    assert not (out / "report.html").exists()
