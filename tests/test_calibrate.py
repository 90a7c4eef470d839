"""`paramserver calibrate` end to end on a tiny live grid: real jobs, the convergence fit from
their run folders, leave-one-out predictions through advise's cluster fit and simulator, and
the files it writes (calibration.json readable by advise, .csv, .html)."""

import csv
import json
import subprocess
import sys

import pytest

from paramserver.advise.calibration_io import find_runs
from paramserver.advise.convergence import ConvergenceModel
from paramserver.advise.fit_convergence import live_run


@pytest.mark.slow
def test_calibrate_tiny_grid_end_to_end(tmp_path):
    out = tmp_path / "cal"
    cmd = [sys.executable, "-m", "paramserver", "calibrate", "--sync", "bsp,asp",
           "--scenario", "one-slow", "--repeats", "1", "--epochs", "3", "--target", "0.8",
           "--lr", "0.1", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr

    doc = json.loads((out / "calibration.json").read_text())
    model = ConvergenceModel.from_json(doc)  # what advise --calibration reads
    assert model.target == 0.8 and set(model.policies) == {"bsp", "asp"}
    assert doc["command"].startswith("paramserver calibrate") and doc["date"]
    assert {c["policy"] for c in doc["cells"]} == {"bsp", "asp"}
    for c in doc["cells"]:
        assert c["runs"] == 1 and c["profiles"] == 1  # the other policy's run profiles it
        if c["reached"]:
            assert c["measured_s"] > 0
    rows = list(csv.DictReader((out / "calibration.csv").open()))
    assert len(rows) == 2 and rows[0]["policy"] in ("bsp", "asp")
    page = (out / "calibration.html").read_text()
    assert page.index('id="verdict"') < page.index("<svg") < page.index("Per cell")
    assert "Seed claims" in page

    # The fit read the real run folders: samples to target from the eval records, never
    # later than the first evaluation at the target (it interpolates before it).
    for r in find_runs(out / "grid"):
        lr = live_run(r.policy, "round" if r.policy == "bsp" else "arrival", "c", 0,
                      r.summary, r.evals, 0.8)
        first = r.summary["time_to_accuracy"]["0.8"]
        assert (lr.time_to_target is None) == (first is None)
        if first is not None:
            assert 0 < lr.time_to_target <= first + 1e-6
            assert 0 < lr.samples_to_target <= r.summary["samples"]
