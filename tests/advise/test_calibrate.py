"""`paramserver calibrate` end to end on a tiny live grid: real jobs, the convergence fit from
their run folders, leave-one-out predictions through advise's cluster fit and simulator, and
the files it writes (calibration.json readable by advise, .csv, .html)."""

import csv
import json
import subprocess
import sys

import pytest

from paramserver.advise.calibration_io import find_runs
from paramserver.predict.convergence import ConvergenceModel
from paramserver.advise.core.fit_convergence import live_run


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
    # the figure needs a cell where both the live runs and the prediction reached the target
    # (a 3-epoch run at lr 0.1 sometimes stops short of 80%): else it says so in its place
    both = any(c["measured_s"] is not None and c["predicted_s"] is not None for c in doc["cells"])
    figure = "<svg" if both else "No cell where both live runs and the prediction reached"
    assert page.index('id="verdict"') < page.index(figure) < page.index("Per cell")
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


def _plan(tmp_path, *argv):
    from paramserver.cli.calibrate_cmd import plan_grid
    from paramserver.cli.main import build_parser
    args = build_parser().parse_args(["calibrate", *argv])
    return plan_grid(args, tmp_path)


def test_grid_runs_every_policy_with_compares_update_rule_pairing(tmp_path):
    runs = _plan(tmp_path)
    rules = {(r.policy, r.config.optimizer) for r in runs}
    # advise recommends among every policy, so the default grid runs them all; SSP and DSSP
    # with their own rule, as compare runs them
    assert {p for p, _ in rules} == {"bsp", "asp", "ssp", "dssp", "ebsp", "r2sp", "lbbsp"}
    assert rules == {("bsp", "sgd"), ("asp", "sgd"), ("ebsp", "dynsgd"), ("r2sp", "sgd"),
                     ("lbbsp", "sgd"), ("ssp", "dynsgd"), ("dssp", "dynsgd")}
    assert len(runs) == 7 * 2 * 2  # x one-slow, homogeneous x 2 repeats
    # an --optimizer given names every run's rule
    given = _plan(tmp_path, "--sync", "bsp,ssp", "--optimizer", "sgd")
    assert {r.config.optimizer for r in given} == {"sgd"}


def test_worker_counts_are_a_grid_axis_each_in_its_own_folder(tmp_path):
    runs = _plan(tmp_path, "--sync", "bsp,asp", "--scenario", "one-slow", "--workers", "4",
                 "--workers", "8", "--repeats", "1")
    assert sorted((r.policy, r.config.workers) for r in runs) == [
        ("asp", 4), ("asp", 8), ("bsp", 4), ("bsp", 8)]
    assert {r.folder.relative_to(tmp_path / "grid").parts[:2] for r in runs} == {
        ("unlimited", "4-workers"), ("unlimited", "8-workers")}
    # one count keeps the folder it always had
    one = _plan(tmp_path, "--sync", "bsp", "--scenario", "one-slow", "--workers", "8",
                "--repeats", "1")
    assert [r.config.workers for r in one] == [8]
    assert one[0].folder.relative_to(tmp_path / "grid").parts[1] == "runs"


def test_a_cells_setting_names_its_worker_count():
    from paramserver.advise.core.validate import Cell
    assert Cell("bsp", "one-slow", "unlimited", 8).setting == "one-slow@unlimited@8w"
    assert Cell("bsp", "one-slow", "unlimited").setting == "one-slow@unlimited"


def test_the_convergence_model_keys_a_policy_by_its_update_rule():
    from paramserver.advise.calibrate import base_policy, model_key
    # compare's pairing is the bare name advise ranks; any other rule is its own entry
    assert model_key("ssp", "dynsgd") == "ssp" and model_key("bsp", "sgd") == "bsp"
    assert model_key("ssp", "sgd") == "ssp+sgd" and model_key("bsp", "dynsgd") == "bsp+dynsgd"
    assert base_policy("ssp+sgd") == "ssp" and base_policy("ebsp") == "ebsp"


def test_calibrates_default_grid_is_every_registered_policy_but_the_one_that_switches():
    """The grid's policies come from the registry (no list of names of its own): a policy
    registered tomorrow is calibrated by default; auto, which runs the others, is not."""
    from paramserver.cli.calibrate_cmd import calibrated_policies
    from paramserver.policies import SYNC_POLICIES
    names = calibrated_policies().split(",")
    assert "auto" in SYNC_POLICIES.names() and "auto" not in names
    assert names == [n for n in SYNC_POLICIES.names() if n != "auto"]
    assert {"bsp", "asp", "ssp", "dssp", "ebsp", "r2sp", "lbbsp"} <= set(names)


def test_calibrate_refuses_auto_in_its_grid_before_making_anything(tmp_path, capsys):
    """auto runs the other policies: a grid run of it would be fitted as a policy of its own,
    which advise never reads. Asked for by name, it is refused with the fix, nothing made."""
    from paramserver.cli.main import main
    out = tmp_path / "cal"
    assert main(["calibrate", "--sync", "bsp,auto", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--sync auto: not calibrated by runs of its own" in err and "leave it out" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("flags,says", [
    (["--grid-link", "bogus"], "cannot read 'bogus' in link 'bogus'"),
    (["--scenario", "nope"], "unknown scenario 'nope'"),
    (["--epochs", "-1"], "invalid value for epochs=-1.0 (expected a number > 0)"),
])
def test_calibrate_refuses_a_bad_grid_setting_before_making_anything(flags, says, tmp_path,
                                                                    capsys):
    """The grid's links and scenarios are read before the run folder is made (a refused
    calibrate left an empty one behind)."""
    from paramserver.cli.main import main
    out = tmp_path / "cal"
    assert main(["calibrate", "--sync", "bsp", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not out.exists()


def _run_folder(path, interrupted: bool = False):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {}, "job": None}))
    (path / "metrics.jsonl").write_text(json.dumps(
        {"t": 1.0, "kind": "eval", "samples": 32, "accuracy": 0.5}) + "\n")
    (path / "summary.json").write_text(json.dumps(
        {"steps": 1, **({"interrupted": True} if interrupted else {})}))


def test_a_run_a_ctrl_c_cut_short_is_not_a_finished_run(tmp_path):
    """A Ctrl-C during a grid run writes its summary.json, marked interrupted: --from took it
    for a finished run, its few steps fitted as the policy's whole run."""
    _run_folder(tmp_path / "runs/one-slow/bsp/rep-0")
    _run_folder(tmp_path / "runs/one-slow/asp/rep-0", interrupted=True)
    assert [(r.policy, r.repeat) for r in find_runs(tmp_path)] == [("bsp", 0)]


def test_a_ctrl_c_during_the_grid_says_where_the_finished_runs_are(tmp_path, monkeypatch,
                                                                   capsys):
    """It said only 'interrupted': now the folder of the finished runs and the command that
    calibrates on them, exit 130, no traceback."""
    from paramserver.cli.main import main
    from paramserver.launch import jobs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(jobs, "run_training", interrupted)
    out = tmp_path / "cal"
    assert main(["calibrate", "--sync", "bsp", "--scenario", "one-slow", "--repeats", "1",
                 "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"the finished runs are kept in {out / 'grid'}" in err, err
    assert f"paramserver calibrate --from {out / 'grid'}" in err and "Traceback" not in err
