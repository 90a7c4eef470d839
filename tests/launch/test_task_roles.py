"""`paramserver task`: N copies of one command, as a scheduler starts them, each run its role.

The layout is pure (launch/core/task_layout.py); the live test starts the copies as real processes
on 127.0.0.1, numbered as torchrun numbers them (RANK, WORLD_SIZE), meeting through a folder."""

import json
import os
import subprocess
import sys

import pytest

from paramserver.core.exits import Exit
from paramserver.launch.core.task_layout import LayoutError, TaskLayout
from paramserver.runlog.metrics import read_records
from paramserver.spec.job import JobSpec


def test_task_numbers_place_coordinator_servers_backups_evaluator_then_workers():
    job = JobSpec(servers=2, replicas=2, workers=3, eval_interval=1.0)
    layout = TaskLayout.of(job, 9)
    assert [layout.role(i) for i in range(9)] == [
        ("coordinator", 0), ("server", 0), ("server", 1), ("backup", 0), ("backup", 1),
        ("evaluator", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    plain = TaskLayout.of(JobSpec(servers=1, workers=2, eval_interval=0.0), 4)
    assert [plain.role(i)[0] for i in range(4)] == ["coordinator", "server", "worker", "worker"]
    with pytest.raises(LayoutError, match="outside the step's 4 tasks"):
        plain.role(4)


def test_a_step_of_the_wrong_size_is_refused_naming_the_size_it_needs():
    job = JobSpec(servers=1, workers=2, eval_interval=1.0)
    with pytest.raises(LayoutError, match=r"the step has 4 task\(s\); the job needs 5: 1 "
                                          r"coordinator, 1 server\(s\), 1 evaluator .*--eval-"
                                          r"interval 0.* and 2 workers \(e.g. srun --ntasks 5\)"):
        TaskLayout.of(job, 4)
    elastic = JobSpec(servers=1, workers=4, min_workers=2, eval_interval=0.0)
    assert TaskLayout.of(elastic, 4).workers == 2 and TaskLayout.of(elastic, 6).workers == 4
    with pytest.raises(LayoutError, match="needs 4 to 6: .* and 2 to 4 workers"):
        TaskLayout.of(elastic, 7)


def test_copies_of_one_task_command_run_a_job_to_its_end(tmp_path):
    from paramserver.cli.main import main
    job_file, run = tmp_path / "job.json", tmp_path / "run"
    # The job file written in this interpreter (tests/launch/test_job_builders.py starts
    # `train --write-job` as a process): the copies below are the live part.
    assert main(["train", "--workers", "2", "--steps", "20", "--eval-interval", "0",
                 "--write-job", str(job_file)]) == 0
    procs = []
    try:
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "paramserver", "task", "--job", str(job_file),
                 "--dir", str(run), "--bind", "127.0.0.1", "--port", "0"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    for p, out in zip(procs, outs):
        assert p.returncode == Exit.FINISHED, out[-3000:]
    assert "task 0 of 4: coordinator 0" in outs[0] and "task 3 of 4: worker 1" in outs[3]
    steps = [r for r in read_records(run / "metrics.jsonl") if r.get("kind") == "step"]
    assert {r["worker"] for r in steps} == {0, 1} and len(steps) == 40
    assert sorted(os.listdir(run / "results")) == ["worker-0.json", "worker-1.json"]
    assert json.loads((run / "results" / "worker-0.json").read_text())


def test_a_task_outside_any_scheduler_says_how_to_number_it(tmp_path):
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(JobSpec(eval_interval=0.0).to_dict()))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    done = subprocess.run([sys.executable, "-m", "paramserver", "task", "--job", str(job_file),
                           "--dir", str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == Exit.REFUSED and "Traceback" not in done.stderr
    assert "run under srun (SLURM_PROCID, SLURM_NTASKS)" in done.stderr
