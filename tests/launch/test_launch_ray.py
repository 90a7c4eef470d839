"""`paramserver launch --launcher ray`: a user's script placed as workers by a local Ray
instance, with torchrun's variables and its output on launch's console.

Ray is an optional extra (`paramserver[ray]`); without it this test skips and says so."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="Ray is the optional extra paramserver[ray]; "
                                  "pip install 'paramserver[ray]' to run this test")

from ps_helpers import LAUNCH_SCRIPT# noqa: E402

from paramserver.runlog.model_file import read_model  # noqa: E402


@pytest.mark.slow  # ~30 s on 2 shared cores, most of it Ray starting
def test_launch_places_a_user_script_through_ray(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(LAUNCH_SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--launcher", "ray", "--workers", "2",
         "--ray-worker-cpus", "0.5", "--ray-server-cpus", "0.5", "--steps", "5",
         "--out", str(out), "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[rank ") and "] ENV " in line:
            prefix, env = line.split(" ENV ", 1)
            seen[int(prefix[len("[rank "):-1])] = json.loads(env)
    assert sorted(seen) == [0, 1], proc.stdout
    for rank, env in seen.items():
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["PARAMSERVER_JOIN"].startswith("tcp://127.0.0.1:")
    assert sorted(line for line in proc.stdout.splitlines() if "] JOB RANK " in line) == [
        "[rank 0] JOB RANK 0", "[rank 1] JOB RANK 1"]
    assert sorted(line for line in proc.stdout.splitlines() if line.endswith("] done")) == [
        "[rank 0] done", "[rank 1] done"]
    steps = (out / "metrics.jsonl").read_text().count('"kind": "step"')
    assert steps == 10 and "job: steps 10 |" in proc.stdout
    assert (out / "logs" / "worker-0.log").read_text().splitlines()[-1] == "done"
    # The final checkpoint as the script's own model, and the layout the coordinator wrote.
    assert f"model in {out / 'model.pt'}" in proc.stdout
    assert set(read_model(out / "model.pt")) == {"weight", "bias"}
    assert '"weight"' in (out / "model_layout.json").read_text()


@pytest.mark.slow  # Ray starting: ~30 s on 2 shared cores
def test_through_ray_a_rank_that_exits_before_joining_ends_the_launch_naming_it(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, sys\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    sys.exit(0)  # never builds the optimizer\n" + LAUNCH_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--launcher", "ray", "--workers", "2",
         "--ray-worker-cpus", "0.5", "--ray-server-cpus", "0.5", "--steps", "5", "--quiet",
         "--timeout", "200", "--out", str(tmp_path / "run"), "--", sys.executable,
         str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "rank 1 exited with code 0 before the job started, without joining it" in proc.stderr
