"""Many logical ASP workers and a large lr: plain SGD breaks down, dynsgd keeps converging."""

import json
import subprocess
import sys

import pytest


def simulate(tmp_path, rule):
    out = tmp_path / rule
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "simulate", "--sync", "asp", "--workers", "48",
         "--steps", "30", "--train", "--model", "mlp", "--lr", "0.4", "--optimizer", rule,
         "--compute", "lognormal:2ms:0.3", "--eval-interval", "0.2", "--out", str(out),
         "--quiet"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_dynsgd_survives_the_staleness_that_breaks_fixed_rate_asp(tmp_path):
    sgd, dyn = simulate(tmp_path, "sgd"), simulate(tmp_path, "dynsgd")
    assert sgd["mean_staleness"] > 20 and dyn["mean_staleness"] == sgd["mean_staleness"]
    # dynsgd ends at 0.83 / 0.81 / 0.87 for seeds 0-2 (best 0.87-0.89) and fixed-rate SGD at
    # 0.10. The bar was 0.85 when seed 0 gave 0.897 on sklearn's split of digits; our own
    # stratified split (a8ad9e9) draws other test rows and seed 0 now ends at 0.831.
    assert dyn["final_test_accuracy"] >= 0.8 and dyn["best_test_accuracy"] >= 0.85
    assert sgd["final_test_accuracy"] < dyn["final_test_accuracy"] - 0.3
