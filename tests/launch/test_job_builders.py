"""One builder and one set of defaults for every job: `train` (a built-in task), `launch` and
`serve` (a script's job) ask JobSpec.from_config for theirs, so a setting given to none of
them reads alike in each; only what a script's job is instead (the task, the budget, serve's
start barrier) differs, and says so here."""

import dataclasses

from paramserver.cli.main import build_parser
from paramserver.launch.jobs import prepare_spec
from paramserver.spec.config import TrainConfig
from paramserver.spec.job import JobSpec

# What a script's job has instead of a built-in task's (see launch/jobs.py script_job).
SCRIPT_OWN = {"num_keys", "max_samples", "eval_interval", "task", "layer_edges", "checkpoint"}


def parsed(*argv):
    return build_parser().parse_args(list(argv))


def shared(spec: JobSpec, *also) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
            if f.name not in SCRIPT_OWN | set(also)}


def test_launch_serve_and_train_share_every_default():
    from paramserver.cli import launch_cmd, serve_cmd
    train = prepare_spec(TrainConfig())
    launch = JobSpec.from_dict(launch_cmd.build_job(parsed("launch", "--", "python", "x.py")))
    serve = serve_cmd.build_job(parsed("serve", "--num-keys", "10"))
    # How many workers is each command's own choice: the digits comparison's 4, a script's 2
    # (each a whole training process), serve's 1 (started by hand).
    assert shared(launch, "workers") == shared(train, "workers")
    assert (train.workers, launch.workers, serve.workers) == (4, 2, 1)
    # serve waits longer for processes started by hand, and that is its one difference.
    assert serve.limits.start_timeout == 600.0
    assert shared(serve, "limits", "workers") == shared(train, "limits", "workers")
    assert dataclasses.replace(serve.limits, start_timeout=train.limits.start_timeout) == \
        train.limits


def test_a_flag_reaches_the_job_alike_through_train_and_launch():
    from paramserver.cli import launch_cmd
    flags = ["--sync", "ssp", "--sync-opt", "staleness=3", "--optimizer", "adam", "--lr", "0.01",
             "--heartbeat-timeout", "7", "--batch-size", "16", "--workers", "3"]
    launch = JobSpec.from_dict(launch_cmd.build_job(parsed("launch", *flags, "--", "python",
                                                           "x.py")))
    train = prepare_spec(TrainConfig(sync="ssp", sync_options={"staleness": 3},
                                     optimizer="adam", lr=0.01, heartbeat_timeout=7.0,
                                     batch_size=16, workers=3))
    assert shared(launch) == shared(train)
    assert launch.limits.heartbeat_timeout == 7.0 and launch.sync.options == {"staleness": 3}


def test_train_writes_the_job_it_would_run_and_starts_nothing(tmp_path, capsys):
    import json
    import subprocess
    import sys

    from paramserver.cli.main import main
    path = tmp_path / "job.json"
    argv = ["train", "--workers", "2", "--epochs", "1", "--eval-interval", "0",
            "--write-job", str(path)]
    done = subprocess.run([sys.executable, "-m", "paramserver", *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wrote {path}" in done.stdout and not (tmp_path / "runs").exists()
    written = JobSpec.from_dict(json.loads(path.read_text()))
    assert written == prepare_spec(TrainConfig(workers=2, epochs=1.0, eval_interval=0.0))
    # The refusal in this interpreter (the process start above is the whole path once).
    code = main([*argv[:-1], str(tmp_path / "missing" / "job.json")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write the job file" in err, err
    assert "Traceback" not in err


def test_the_cluster_examples_write_their_job_with_a_command_that_parses():
    """The job-file line the Kubernetes and Slurm examples tell a user to run."""
    import shlex
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "examples"
    for example in (root / "kubernetes" / "paramserver.yaml",
                    root / "slurm" / "paramserver.sbatch"):
        lines = [line.lstrip("# ").strip() for line in example.read_text().splitlines()
                 if "--write-job" in line]
        assert lines, f"{example.name} says how to write its job file"
        argv = shlex.split(lines[0])
        assert argv[:2] == ["paramserver", "train"]
        args = parsed(*argv[1:])
        assert args.write_job
        if example.suffix == ".yaml":  # the manifest starts no evaluator
            assert args.eval_interval == 0


def test_a_pruner_beside_a_torch_rule_is_refused_where_pushes_apply_as_they_come():
    """top-k pushes lists of keys; torch's adam on the servers updates dense ranges only.
    Under a round-mode policy the round's sum is dense and it runs; under an arrival-mode one
    (auto too) every worker died at its first push and the job hung until declared dead: now
    refused before anything starts, naming the ways out."""
    import pytest
    cfg = TrainConfig(workers=2, steps=4, compress="topk", optimizer="adam", lr=0.001)
    prepare_spec(dataclasses.replace(cfg, sync="bsp"))  # a round's sum: dense
    prepare_spec(dataclasses.replace(cfg, sync="asp", optimizer="momentum"))
    for sync in ("asp", "ssp", "auto"):
        with pytest.raises(ValueError, match=r"--compress topk pushes lists of keys, and "
                                             r"--optimizer adam updates only dense ranges.*"
                                             r"round-mode policy"):
            prepare_spec(dataclasses.replace(cfg, sync=sync))
    with pytest.raises(ValueError, match=r"--compress auto \(slow=topk\) pushes lists"):
        prepare_spec(dataclasses.replace(cfg, sync="asp", compress="auto",
                                         compress_options={"slow": "topk"}))
