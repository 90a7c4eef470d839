"""A command that reads one run, given a folder that holds several (compare's output), names the
runs inside it: the user gave the folder compare printed, not one of its runs."""

import pytest

from paramserver.cli.main import main
from paramserver.runlog.folders import runs_hint, runs_inside


def _compare_like(root):
    """compare's layout: OUT/runs/SCENARIO/POLICY/rep-K, each run with its metrics.jsonl."""
    runs = []
    for policy in ("ssp", "bsp", "asp"):
        for rep in (1, 0):
            run = root / "runs" / "one-slow" / policy / f"rep-{rep}"
            (run / "checkpoints" / "inner").mkdir(parents=True)
            (run / "metrics.jsonl").write_text("")
            # a run's own subfolders are not searched: this one must not be listed
            (run / "checkpoints" / "inner" / "events.jsonl").write_text("")
            runs.append(run)
    (root / "report.html").write_text("<html></html>")
    return sorted(runs)


def test_runs_inside_lists_the_runs_in_name_order_and_counts_them(tmp_path):
    runs = _compare_like(tmp_path)
    some, count = runs_inside(tmp_path, limit=2)
    assert count == 6 and some == runs[:2]
    assert runs_inside(runs[0]) == ([], 0)  # a run itself holds no runs
    hint = runs_hint(tmp_path)
    assert hint.startswith("; it holds 6 runs (") and hint.endswith(", ...): give one of them")
    assert str(runs[0]) in hint and str(runs[3]) not in hint


def test_nothing_is_hinted_for_a_folder_without_runs_or_no_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert runs_hint(tmp_path) == ""
    assert runs_hint(tmp_path / "missing") == ""


def test_runs_deeper_than_compare_lays_them_are_not_searched(tmp_path):
    deep = tmp_path / "1" / "2" / "3" / "4" / "5"
    deep.mkdir(parents=True)
    (deep / "metrics.jsonl").write_text("")
    assert runs_inside(tmp_path) == ([], 0)
    assert runs_inside(tmp_path / "1")[1] == 1


@pytest.mark.parametrize("command", ["trace DIR", "tensorboard DIR", "doctor DIR",
                                     "top --once DIR", "top --replay DIR --once",
                                     "export DIR --format pt", "advise --profile DIR"])
def test_each_reader_given_a_compare_folder_names_its_runs(command, tmp_path, monkeypatch,
                                                          capsys):
    runs = _compare_like(tmp_path / "cmp")
    monkeypatch.chdir(tmp_path)
    try:
        code = main([str(tmp_path / "cmp") if a == "DIR" else a for a in command.split()])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert "it holds 6 runs" in lines[0] and str(runs[0]) in lines[0], err
