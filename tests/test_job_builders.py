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
