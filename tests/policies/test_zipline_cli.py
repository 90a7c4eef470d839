"""`paramserver zipline`: the three file formats, --predicted, JSON output and clean failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paramserver.cli.main import main
from paramserver.zipline import VARIANTS

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "zipline" / "history_w1000.txt"
needs_fixture = pytest.mark.skipif(
    not FIXTURE.is_file(), reason=f"fixture {FIXTURE} missing (CI clones the repo next to shared/)")


def run_json(capsys, *argv) -> dict:
    assert main(["zipline", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def fail(capsys, *argv) -> str:
    assert main(["zipline", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


@needs_fixture
def test_fixture_through_a_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "zipline", str(FIXTURE), "--lookahead", "15", "--json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["spread"] == 1403 and out["barrier"] - out["low"] == 1403
    assert len(out["sync_index"]) == 1000 and out["workers"] == list(range(1000))
    assert 0 <= out["seconds"] < 10


@needs_fixture
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_gives_the_same_json(capsys, variant):
    out = run_json(capsys, FIXTURE, "-R", 20, "--variant", variant)
    assert out["spread"] == 1400 and out["variant"] == variant


def test_history_csv_and_npy_agree(tmp_path, capsys):
    text = tmp_path / "h.txt"
    # Workers out of order in the file: rows are put in id order.
    text.write_text("2:1,2,4,8,\n0:0,10,25,\n1:3,9,\n")
    csv = tmp_path / "p.csv"
    predicted = [[25, 40, 55], [9, 15, 21], [8, 12, 16]]
    csv.write_text("a,b,c\n" + "\n".join(",".join(map(str, r)) for r in predicted) + "\n")
    npy = tmp_path / "p.npy"
    np.save(npy, np.array(predicted))
    a = run_json(capsys, text, "-R", 3)
    b = run_json(capsys, csv, "--predicted")
    c = run_json(capsys, npy, "--predicted", "--lookahead", 3)
    for key in ("spread", "barrier", "low", "sync_index"):
        assert a[key] == b[key] == c[key]
    assert (a["spread"], a["barrier"], a["sync_index"]) == (9, 25, [0, 2, 2])


def test_predicted_lookahead_keeps_the_first_r(tmp_path, capsys):
    f = tmp_path / "p.csv"
    f.write_text("0,100\n50,101\n")
    assert run_json(capsys, f, "--predicted")["spread"] == 1
    assert run_json(capsys, f, "--predicted", "-R", 1)["spread"] == 50


def test_human_summary(tmp_path, capsys):
    f = tmp_path / "p.csv"
    f.write_text("0,5\n1,6\n")
    assert main(["zipline", str(f), "--predicted"]) == 0
    out = capsys.readouterr().out
    assert "spread 1" in out and "barrier 1" in out and "ms" in out


def test_other_predictor(tmp_path, capsys):
    f = tmp_path / "h.txt"
    f.write_text("0:0,10,30,\n1:5,25,\n")
    assert run_json(capsys, f, "-R", 3, "--predictor", "median")["predictor"] == "median"


@pytest.mark.parametrize("content, argv, message", [
    ("0,1\n", [], "--lookahead R is required"),
    ("0,1\n", ["-R", "0"], "must be >= 1"),
    ("0,1\n", ["-R", "2", "--variant", "nope"], "known: zipline-vec"),
    ("0,1\n", ["-R", "2", "--predictor", "nope"], "known: last_interval"),
    ("3,1\n", ["--predicted"], "not sorted"),
    ("1,nan\n", ["--predicted"], "non-finite"),
    ("1,2\n2,x\n", ["--predicted"], "not a number"),
    ("", ["--predicted"], "empty file"),
    ("0:1,2,\n0:3,4,\n", ["--predicted"], "appears twice"),
    ("0:1,2,\nfoo\n", ["--predicted"], "expected 'WORKER:"),
    ("0:1,\n", ["-R", "2"], "at least two"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, argv, message):
    f = tmp_path / "in.txt"
    f.write_text(content)
    assert message in fail(capsys, f, *argv)


def test_bad_files(tmp_path, capsys):
    assert "no such file" in fail(capsys, tmp_path / "missing.csv", "-R", 2)
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([[1, 2]], dtype=object), allow_pickle=True)
    assert "not a readable .npy" in fail(capsys, obj, "--predicted")
    one_d = tmp_path / "d.npy"
    np.save(one_d, np.arange(3))
    assert "2-D numeric" in fail(capsys, one_d, "--predicted")
    junk = tmp_path / "j.npy"
    junk.write_bytes(b"not numpy")
    assert "not a readable .npy" in fail(capsys, junk, "--predicted")


def test_help_lists_variants(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["zipline", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "zipline-opt-bs" in out and "--predicted" in out and "last_interval" in out
