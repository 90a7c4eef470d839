"""Running one training job on this machine (or under Ray) from a TrainConfig: every name and
option checked before any process starts, the job spec made, the cluster run to its end, the
run folder's config.json, metrics.jsonl and summary.json written. `paramserver train`,
`compare`, `calibrate` and `advise --profile` run their jobs through it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from paramserver.core.keyspace import AUTO_SERVERS
from paramserver.spec.config import TrainConfig
from paramserver.spec.run_job import RunJob
from paramserver.spec.job import CheckpointSpec, JobSpec, ResumeSpec, TaskSpec


def prepare_spec(cfg: TrainConfig) -> JobSpec:
    """Check every name and option here, before any process starts; returns the job."""
    from paramserver.compression.ranges import make_plan
    from paramserver.compression.schedule import check_order
    from paramserver.models import sparse_tables
    from paramserver.models.workload import build
    if cfg.servers == AUTO_SERVERS:
        cfg = resolve_servers(cfg)
    cfg.validate()
    wire = check_pushes_fit_rule(cfg)
    if (wire.codec is not None or wire.pull_codec is not None or wire.auto is not None) \
            and cfg.dtype != "float32":
        raise ValueError("codecs (--compress NAME or auto, codec=, --pull-compress) take "
                         "float32 values: use --dtype float32")
    check_named_ranks(cfg)
    check_model_size(cfg)
    # Only the key space is needed here: a model of 10^9 parameters is not built for it.
    ds, model, keys = build(cfg.job(0, 0).task, cfg.dtype, shape_only=True)
    tables = sparse_tables(model)  # DLRM's embedding rows live in a table on the servers
    ranged = make_plan(cfg.push_range, keys.num_keys, [layer.keys for layer in keys.layers])
    if cfg.schedule != "off":
        check_order(cfg.schedule)
    chosen = [o for o, on in (("--compress", cfg.compress != "none"), ("--push-range", ranged),
                              ("--schedule", cfg.schedule != "off"),
                              ("--pull-compress", wire.pull_codec is not None)) if on]
    if chosen and chosen[0] == "--compress" and chosen[-1] == "--pull-compress":
        chosen = chosen[1:]  # compressed pushes and pulls go together
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(chosen)} cannot be combined yet: choose one")
    if cfg.amp == "fp16" and cfg.schedule != "off":
        raise ValueError("--amp fp16 cannot be combined with --schedule: fp16 gradients are "
                         "unscaled after backward, when the per-layer pushes have gone; use "
                         "--amp bf16 (no loss scaling) or --schedule off")
    if tables and chosen:
        raise ValueError(f"--model {cfg.model} (rows in a sparse table) cannot be combined with "
                         f"{chosen[0]} yet")
    edges = tuple(layer.keys.lo for layer in keys.layers[1:])
    return dataclasses.replace(cfg.job(keys.num_keys, len(ds.train), tables), layer_edges=edges)


def check_local_memory(spec: JobSpec, available: int) -> None:
    """Refuse a job whose parameters alone cannot fit in this machine's `available` memory
    when every process runs here: each worker holds the parameters and their gradient, each
    shard (and backup) its slice, the evaluator a copy. A lower bound (a rule's state, a
    round's sum and the processes themselves come on top): a job refused here would have
    been killed or left its shards silent minutes in, with a message that said neither."""
    itemsize = 8 if spec.dtype == "float64" else 4
    param = spec.num_keys * itemsize
    # An elastic job starts MIN workers here; the others may join from other hosts.
    workers = spec.min_workers or spec.workers
    copies = 2 * workers + spec.replicas + (1 if spec.eval_interval > 0 else 0)
    need = copies * param
    if need <= available:
        return
    gb = 1 << 30
    raise ValueError(
        f"the model's {spec.num_keys:,} parameters ({param / gb:.1f} GB in {spec.dtype}) need "
        f"at least {need / gb:.1f} GB on this machine ({2 * workers} copies for "
        f"{workers} workers' parameters and gradients, {spec.replicas} for the shards"
        f"{', 1 for the evaluator' if spec.eval_interval > 0 else ''}); {available / gb:.1f} "
        f"GB is available. Give fewer --workers, --eval-interval 0, a smaller --model-size, "
        f"or run the roles across machines (--launcher ray, or `paramserver worker` on "
        f"other hosts)")


def check_model_size(cfg: TrainConfig) -> None:
    """--model-size picks the width of a model built by its parameter count: refused, naming
    those that are, for a model that is sized by its own options."""
    from paramserver.models import MODELS, model_options
    if cfg.model_size is None or cfg.model not in MODELS or "size" in model_options(cfg.model):
        return
    sized = [m for m in MODELS if "size" in model_options(m)]
    raise ValueError(f"--model-size sizes a model built by its parameter count "
                     f"({', '.join(sized)}); --model {cfg.model} is sized by its own options "
                     f"({', '.join(model_options(cfg.model)) or 'none'}: --model-opt KEY=VALUE)")


def check_pushes_fit_rule(cfg: TrainConfig):
    """The policy, the update rule and the push format, each checked, and together (see
    _pushes_fit_rule); returns the WireSpec."""
    return _pushes_fit_rule(cfg.sync, cfg.sync_options, cfg.batch_size, cfg.optimizer, cfg.lr,
                            cfg.optimizer_options, cfg.compress, cfg.compress_options,
                            cfg.pull_compress, cfg.pull_refresh)


def _pushes_fit_rule(sync: str, sync_options, batch_size: int, optimizer: str, lr: float,
                     optimizer_options, compress: str, compress_options, pull_compress: str,
                     pull_refresh: int):
    """Each built once to check its name and options (ValueError naming the wrong one), and
    together: a pruner (top-k, ...) pushes lists of keys, which torch's optimizers on the
    servers cannot update as they come; returns the WireSpec."""
    from paramserver.compression.wire import WireSpec
    from paramserver.optim import make_rule
    from paramserver.policies import make_policy
    policy = make_policy(sync, batch_size, **sync_options)
    rule = make_rule(optimizer, lr, **optimizer_options)
    wire = WireSpec.parse(compress, compress_options, pull_compress, pull_refresh)
    auto_topk = wire.auto is not None and wire.auto.slow == "topk"
    if (wire.pruner != "none" or auto_topk) and not rule.sparse_keys \
            and policy.apply_mode == "arrival":
        # (under a round-mode policy the round's sum is dense: the rule takes it)
        raise ValueError(
            f"--compress {compress}{' (slow=topk)' if auto_topk else ''} pushes lists of "
            f"keys, and --optimizer {optimizer} "
            f"updates only dense ranges: under --sync {sync} pushes are applied as they "
            f"come{' (auto: in its ssp and asp stretches)' if policy.sums_rounds else ''}. Use "
            f"a round-mode policy (bsp, lbbsp), --optimizer sgd or momentum, or a dense codec "
            f"(--compress bf16, uniform8, ...)")
    return wire


def check_job_names(job: JobSpec) -> None:
    """A job file's names and options, checked where a role reads it (ValueError naming the
    one that is wrong): its sync policy, update rule and push format as train checks them,
    and for the built-in task its model and data set. Nothing is built; a name a worker would
    only meet at its first step is met here, before anyone waits on it."""
    from paramserver.core.options import check_known
    from paramserver.data import DATASETS, dataset_options
    from paramserver.models import MODELS, model_options
    task, rule = job.task, job.optimizer
    _pushes_fit_rule(job.sync.name, job.sync.options, job.batch_size, rule.name, rule.lr,
                     rule.options, task.compress, task.compress_options, task.pull_compress,
                     task.pull_refresh)
    if task.name == "train":
        MODELS.get(task.model)
        check_known(f"model {task.model!r}", task.model_options, model_options(task.model))
        DATASETS.get(task.dataset)
        check_known(f"dataset {task.dataset!r}", task.dataset_options,
                    dataset_options(task.dataset))


def check_named_ranks(cfg: TrainConfig) -> None:
    """Fail if --straggler or --link names a worker or server the job does not have (the
    servers are not checked while their count is `auto`)."""
    cfg.straggler.model.check_workers(cfg.workers)
    cfg.links.check_ranks(cfg.workers, None if cfg.servers == AUTO_SERVERS
                          else max(cfg.servers, cfg.max_servers))


def script_job(cfg: TrainConfig, run_dir: Path | None = None) -> JobSpec:
    """The job of a user's script for `cfg` (what launch, serve, `compare -- CMD` or advise's
    profiling run was given): the same builder and defaults as a built-in task's job
    (JobSpec.from_config), with what a script's job has instead: the script is the task (it
    evaluates itself, so no evaluator), the key space comes from the first worker's model, the
    budget is cfg.steps per worker (else none), and with a `run_dir` the final parameters are
    saved into its checkpoints/ when the last worker has left."""
    from paramserver.optim import make_rule
    from paramserver.policies import make_policy
    make_policy(cfg.sync, cfg.batch_size, **cfg.sync_options)  # fail now, not in a child
    make_rule(cfg.optimizer, cfg.lr, **cfg.optimizer_options)
    check_named_ranks(cfg)
    return dataclasses.replace(
        JobSpec.from_config(cfg, 0, 0), eval_interval=0.0,
        max_samples=cfg.steps * cfg.batch_size * cfg.workers if cfg.steps else None,
        checkpoint=None if run_dir is None else CheckpointSpec(
            str(Path(run_dir).resolve() / "checkpoints")),
        # The script's DistributedOptimizer reads the injected slowness from its welcome.
        task=TaskSpec(name="external", straggler=str(cfg.straggler),
                      device_time=cfg.device_time.text(), seed=cfg.seed))


def resolve_servers(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with `--servers auto` replaced by the count for its model on this machine."""
    import os

    import psutil
    import torch

    from paramserver.core.keyspace import auto_servers
    from paramserver.models.workload import build
    probe = dataclasses.replace(cfg, servers=1)
    _, _, keys = build(probe.job(0, 0).task, cfg.dtype, shape_only=True)
    param_bytes = keys.num_keys * torch.tensor([], dtype=getattr(torch, cfg.dtype)).element_size()
    count = auto_servers(param_bytes, cfg.workers, os.cpu_count() or 1,
                         psutil.virtual_memory().available)
    return dataclasses.replace(cfg, servers=count)


def resolve_local_device(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with --device auto made cpu or cuda for workers on this machine; --device cuda
    without CUDA here fails now (ValueError), before any process starts. (Under Ray each
    worker resolves auto on its own host.)"""
    if cfg.device == "cpu":
        return cfg
    from paramserver.client.device_staging import resolve_device
    device = resolve_device(cfg.device)
    return dataclasses.replace(cfg, device=device.type if cfg.device == "auto" else cfg.device)


def prepare_job(cfg: TrainConfig) -> dict:
    """prepare_spec as the job dict the roles read (the job file's form)."""
    return prepare_spec(cfg).to_dict()


def make_cluster(job: JobSpec | dict, run_dir: Path, cfg: TrainConfig, timeout: float | None,
                 launcher: dict | None):
    """LocalCluster, or with launcher {"name": "ray", "address": ..., resources} a RayCluster."""
    if not launcher or launcher.get("name", "local") == "local":
        from paramserver.launch.local import LocalCluster
        return LocalCluster(job, run_dir, job_timeout=timeout,
                            restart_workers=cfg.restart_workers,
                            restart_servers=cfg.restart_servers,
                            restart_coordinator=cfg.restart_coordinator)
    from paramserver.launch.ray_launcher import RayCluster, Resources
    return RayCluster(job, run_dir, address=launcher.get("address"),
                      resources=Resources(**launcher.get("resources", {})), job_timeout=timeout,
                      restart_workers=cfg.restart_workers)


def check_budget_left(max_samples: int, resume: dict,
                      flags: str = "--steps or --epochs") -> None:
    """ValueError when the checkpoint a resume starts from has spent the sample budget
    already: the job would end at once and print the old run's summary as if it had trained."""
    from paramserver.runlog.checkpoint_set import load_coordinator_state
    done = load_coordinator_state(resume["dir"], resume["tag"])["samples_done"]
    if done >= max_samples:
        raise ValueError(f"nothing left to train: checkpoint {resume['tag']} has {done} "
                         f"samples done and the budget is {max_samples}; give a larger "
                         f"{flags}")


def run_training(cfg: TrainConfig, run_dir: Path, quiet: bool = False,
                 timeout: float | None = None, resume: dict | None = None,
                 launcher: dict | None = None, watch=None) -> dict:
    """Run one job to its end; writes config.json, metrics.jsonl and summary.json in run_dir.

    `resume` ({"dir": checkpoint dir, "tag": tag}) continues from a checkpoint; `launcher`
    picks where the processes run (make_cluster); `watch(cluster)`, if given, is called at
    every poll while the job runs (compare's scheduled joins).
    """
    from paramserver.policies import SYNC_POLICIES
    from paramserver.runlog.metrics import read_records, summarize
    from paramserver.runlog.progress import JobProgress
    if not launcher or launcher.get("name", "local") == "local":
        from paramserver.launch import zygote
        zygote.warm()  # its imports overlap the checks below
    if cfg.servers == AUTO_SERVERS:  # config.json keeps the count: a resume gets the same shards
        cfg = resolve_servers(cfg)
    if not launcher or launcher.get("name", "local") == "local":
        cfg = resolve_local_device(cfg)
    if cfg.checkpoint_dir:  # config.json must name it from any folder a resume starts in
        cfg = dataclasses.replace(cfg, checkpoint_dir=str(Path(cfg.checkpoint_dir).resolve()))
    spec = prepare_spec(cfg).with_resume(ResumeSpec(**resume) if resume else None)
    if not launcher or launcher.get("name", "local") == "local":
        import psutil
        check_local_memory(spec, psutil.virtual_memory().available)
    if resume and spec.max_samples is not None:
        check_budget_left(spec.max_samples, resume)
    if cfg.checkpoint_dir:  # (made by the probe: only once the job's own checks have passed)
        from paramserver.runlog.checkpoint import folder_problem
        problem = folder_problem(Path(cfg.checkpoint_dir))
        if problem is not None:
            raise ValueError(f"the checkpoint folder cannot be written ({problem}); give "
                             f"--checkpoint-dir a folder this user can write")
    job = spec.to_dict()
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        forget_unsaved(run_dir, resume)
    (run_dir / "config.json").write_text(json.dumps({"config": cfg.as_dict(), "job": job},
                                                    indent=2))
    cluster = make_cluster(spec, run_dir, cfg, timeout, launcher)
    label = f"{cfg.sync} x{cfg.workers}"

    def summary_json(**extra) -> dict:
        metrics = run_dir / "metrics.jsonl"  # (none yet after a Ctrl-C during the start)
        summary = summarize(read_records(metrics) if metrics.exists() else [],
                            {**job, "apply_mode": SYNC_POLICIES.get(cfg.sync).apply_mode})
        summary.update(extra)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    from paramserver.launch.local import LocalCluster
    try:
        with JobProgress(run_dir / "metrics.jsonl", spec.max_samples, label, quiet) as bar:
            tick = bar.tick if watch is None else lambda: (bar.tick(), watch(cluster))
            if isinstance(cluster, LocalCluster):  # a Ctrl-C keeps what was trained
                cluster.run(on_tick=tick,
                            on_interrupt=lambda: save_interrupted(cluster, job, run_dir))
            else:
                cluster.run(on_tick=tick)
    except KeyboardInterrupt:
        summary_json(interrupted=True)
        raise
    return summary_json()


def forget_unsaved(run_dir: Path, resume: dict) -> None:
    """Before a resume into `run_dir`: its metrics records timed after the checkpoint resumed
    from go (the resumed job trains those steps again; see runlog/metrics.drop_after)."""
    from paramserver.runlog.checkpoint_set import load_coordinator_state
    from paramserver.runlog.metrics import drop_after
    elapsed = load_coordinator_state(resume["dir"], resume["tag"]).get("elapsed_s", 0.0)
    drop_after(run_dir / "metrics.jsonl", float(elapsed))


def save_interrupted(cluster, job: dict, run_dir: Path, timeout: float = 10.0) -> None:
    """On a Ctrl-C, while the job's processes are still up: the servers' parameters now, as
    RUN/model.pt under the model's names (the built-in model's, or a launched script's layout;
    a model whose rows live in a sparse table has none, as at its end). Bounded by `timeout`;
    a job too far gone to answer keeps no model.pt, and says so."""
    import sys

    import torch

    from paramserver.client.kv import KVWorker
    from paramserver.runlog.model_file import (FINAL_MODEL, LAYOUT_FILE, ExportError,
                                               model_keys, named)
    from paramserver.runlog.model_file import write_model
    if RunJob.of(job).has_tables:  # rows live only on the servers: no model file
        return
    if not cluster.address:  # the coordinator was not listening yet: nothing was trained
        print("interrupted before the job started: no model.pt", file=sys.stderr)
        return
    if RunJob.of(job).task.name == "external" and not (run_dir / LAYOUT_FILE).exists():
        # a launch job's model is known once its first worker joins: none had
        print("interrupted before a worker joined the job: no model.pt", file=sys.stderr)
        return
    print("interrupted: saving the parameters trained so far...", file=sys.stderr, flush=True)
    try:
        keys = model_keys(job, run_dir)
        kv = KVWorker(cluster.address, role="observer", keys=cluster.client_keys("observer"),
                      timeout=timeout, heartbeat=False)
    except (OSError, TimeoutError, RuntimeError, ExportError) as exc:
        print(f"interrupted: no model.pt ({exc})", file=sys.stderr)
        return
    try:
        kv.start()
        flat = torch.from_numpy(kv.pull().copy())
        path = write_model(run_dir / FINAL_MODEL, named(keys, flat), "pt")
        print(f"interrupted: the parameters of version {kv.version} are in {path}",
              file=sys.stderr)
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"interrupted: no model.pt ({exc})", file=sys.stderr)
    finally:
        kv.close()
