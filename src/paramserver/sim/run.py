"""One simulated run: configuration, the pieces it needs, and its run folder (config, logs, summary)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from paramserver.policies import make_policy
from paramserver.policies.batch_rule import BatchRule
from paramserver.sim.core.compute import parse_compute
from paramserver.sim.core.engine import Engine, Network
from paramserver.sim.core.membership import Schedule
from paramserver.runlog.metrics import summarize
from paramserver.sim.core import stepstats
from paramserver.sim.records import RunWriter
from paramserver.sim.summary import summarize_run
from paramserver.sim.trace import CommReplay, TraceError, load_trace
from paramserver.core.units import parse_bandwidth, parse_duration, parse_size
from paramserver.emulation.stragglers import parse_straggler
from paramserver.emulation.trace_io import read_trace


# detail "auto": runs of up to this many step records (workers x steps) write each one into
# metrics.jsonl; larger ones keep them as steps.npz only (about 240 bytes a record saved).
DETAIL_LIMIT = 200_000
DETAILS = ("auto", "steps", "summary")


@dataclass
class SimConfig:
    """Everything `paramserver simulate` needs; the defaults are the default simulation."""

    sync: str = "bsp"
    sync_options: dict = field(default_factory=dict)
    workers: int = 1000
    steps: int | None = 100  # per worker; None: until the sample budget is spent
    max_samples: int | None = None  # a budget shared by all workers, as in a live job
    batch_size: int = 32
    compute: str = "const:2ms"
    straggler: str = "none"
    bandwidth: str = "10Gbit/s"
    latency: str = "50us"  # one-way, per message; with comm: each coordinator message
    comm: str | None = None  # trace:RUN replays a live run's pull/push times (see CommReplay)
    comm_options: dict = field(default_factory=dict)  # residual, start_waits (bools)
    servers: int = 1
    model: str = "mlp"
    dataset: str = "digits"
    data_dir: str | None = None
    dataset_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    param_bytes: str | None = None  # overrides the model's size, e.g. 100MB
    dtype: str = "float32"
    seed: int = 0
    train: bool = False
    lr: float = 0.1
    optimizer: str = "sgd"
    optimizer_options: dict = field(default_factory=dict)
    eval_interval: float = 1.0  # virtual seconds, --train only
    threads: int = 1
    detail: str = "auto"  # step records in metrics.jsonl: steps, summary (steps.npz only), auto
    # Workers that join and leave in virtual time (sim.core.membership); `workers` start, as a live
    # --workers MIN:MAX job's MIN, and the ranks run up to workers + the joins (`ranks`).
    membership: Schedule = field(default_factory=Schedule)
    batch_rule: str = "fixed"  # the global-batch rule as they come and go (policies.batch_rule)

    @property
    def ranks(self) -> int:
        """The ranks the run can hold: the live job's MAX."""
        return self.workers + self.membership.joins

    def batch_rule_spec(self) -> BatchRule | None:
        """The rule the policy host applies (a job with a membership schedule is elastic, as a
        live --workers MIN:MAX job, and its reference head count is the workers it starts
        with); None without one."""
        if not self.membership:
            return None
        return BatchRule.parse(self.batch_rule, self.batch_size, self.workers)

    @property
    def step_detail(self) -> bool:
        """Whether each step record goes into metrics.jsonl (see DETAIL_LIMIT)."""
        if self.detail == "auto":
            return self.workers * self.steps_hint() <= DETAIL_LIMIT
        return self.detail == "steps"

    def validate(self) -> None:
        checks = [("workers", self.workers >= 1),
                  ("steps", self.steps >= 1 if self.steps is not None else bool(self.max_samples)),
                  ("max_samples", self.max_samples is None or self.max_samples >= 1),
                  ("comm", self.comm is None or self.comm.startswith("trace:")),
                  ("batch_size", self.batch_size >= 1), ("servers", self.servers >= 1),
                  ("lr", self.lr > 0), ("eval_interval", self.eval_interval > 0),
                  ("dtype", self.dtype in ("float32", "float64")),
                  ("detail", self.detail in DETAILS),
                  ("membership", isinstance(self.membership, Schedule))]
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise ValueError("invalid value for " + ", ".join(f"{b}={getattr(self, b)!r}"
                                                              for b in bad))
        BatchRule.parse(self.batch_rule, self.batch_size, self.workers)  # names it if bad
        if self.batch_rule != "fixed" and not self.membership:
            raise ValueError(f"batch rule {self.batch_rule!r} applies to a job whose workers "
                             f"come and go: give --membership")

    def task(self) -> dict:
        return {"name": "sim", "model": self.model, "dataset": self.dataset,
                "data_dir": self.data_dir, "dataset_options": dict(self.dataset_options),
                "model_options": dict(self.model_options), "seed": self.seed,
                "straggler": self.straggler, "device_time": f"sim {self.compute}"}

    def steps_hint(self) -> int:
        """Steps per worker: fixed, or the budget's share (what sizes per-step draws)."""
        if self.steps is not None:
            return self.steps
        return max(1, -(-self.max_samples // (self.batch_size * self.workers)))


def _build_task(cfg: SimConfig):
    """Dataset, model and key space, as every process of a live job builds them."""
    from paramserver.models.workload import build  # torch and sklearn: only when needed
    return build(cfg.task(), cfg.dtype)


class Simulation:
    """Builds the engine for `cfg`, writes into `run_dir`; advance() in chunks, then close()."""

    def __init__(self, cfg: SimConfig, run_dir: str | Path):
        cfg.validate()
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.policy = make_policy(cfg.sync, cfg.batch_size, **cfg.sync_options)
        straggler = parse_straggler(cfg.straggler, cfg.seed, read_trace)
        straggler.check_workers(cfg.ranks)
        cost = parse_compute(cfg.compute, load_trace).bind(cfg.ranks, cfg.steps_hint(), cfg.seed)
        built = _build_task(cfg) if cfg.train or cfg.param_bytes is None else None
        if built and cfg.train and getattr(built[1], "sparse_table", None):
            raise ValueError(f"simulate --train cannot train --model {cfg.model} yet: its rows "
                             f"live in a sparse table; use paramserver train")
        itemsize = 4 if cfg.dtype == "float32" else 8
        num_keys = built[2].num_keys if built else None
        nbytes = parse_size(cfg.param_bytes, "--param-bytes") if cfg.param_bytes else (
            num_keys * itemsize)
        self.network = Network(nbytes, parse_bandwidth(cfg.bandwidth),
                               parse_duration(cfg.latency, "latency"), cfg.servers)
        self.comm = self._comm()
        self.job = self._job(num_keys, nbytes)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(
            {"config": asdict(cfg), "job": self.job}, indent=2))
        (self.run_dir / "job.json").write_text(json.dumps(self.job, indent=2))
        self.writer = RunWriter(self.run_dir, round(nbytes), detail=cfg.step_detail)
        self.trainer = self._trainer(built) if cfg.train else None
        self.engine = Engine(self.policy, cfg.workers, cfg.steps, cost, self.network,
                             sink=self.writer, trainer=self.trainer,
                             straggler=None if cfg.straggler.strip() in ("", "none") else straggler,
                             max_samples=cfg.max_samples, comm=self.comm,
                             membership=cfg.membership, batch_rule=cfg.batch_rule_spec())
        self.writer.event(0.0, "start", {"policy": self.policy.name, "simulated": True})

    def _comm(self) -> CommReplay | None:
        """trace:RUN: the run's recorded pull/push times; --latency for each coordinator message."""
        cfg = self.cfg
        if cfg.comm is None:
            return None
        unknown = set(cfg.comm_options) - {"residual", "start_waits"}
        if unknown:
            raise ValueError(f"unknown comm option(s) {', '.join(sorted(unknown))}; known: "
                             f"residual, start_waits")
        latency = parse_duration(cfg.latency, "latency")
        try:
            return CommReplay(cfg.comm.removeprefix("trace:"), latency, latency,
                              **{k: bool(v) for k, v in cfg.comm_options.items()})
        except TraceError as exc:
            raise ValueError(f"bad --comm {cfg.comm!r}: {exc}") from None

    def _job(self, num_keys, nbytes) -> dict:
        cfg = self.cfg
        sim = {"steps": cfg.steps, "compute": cfg.compute, "bandwidth": cfg.bandwidth,
               "latency": cfg.latency, "model_bytes": nbytes, "train": cfg.train,
               "comm": cfg.comm, "comm_options": dict(cfg.comm_options)}
        job = {"num_keys": num_keys, "dtype": cfg.dtype, "servers": cfg.servers,
               "workers": cfg.ranks, "batch_size": cfg.batch_size,
               "sync": {"name": cfg.sync, "options": dict(cfg.sync_options)},
               "apply_mode": self.policy.apply_mode, "task": cfg.task(), "simulated": True,
               "max_samples": cfg.max_samples, "sim": sim}
        if cfg.membership:  # as a live elastic job's: workers is MAX, min_workers the start
            job.update(min_workers=cfg.workers, batch_rule=cfg.batch_rule)
            sim["membership"] = cfg.membership.text()
        if cfg.train:
            job.update(optimizer={"name": cfg.optimizer, "lr": cfg.lr,
                                  "options": dict(cfg.optimizer_options)},
                       eval_interval=cfg.eval_interval)
        return job

    def _trainer(self, built):
        import torch

        from paramserver.sim.train import Trainer
        torch.set_num_threads(self.cfg.threads)
        ds, model, keys = built
        return Trainer(ds, model, keys, self.cfg.ranks, self.policy.apply_mode,
                       lr=self.cfg.lr, optimizer=self.cfg.optimizer,
                       optimizer_options=self.cfg.optimizer_options,
                       eval_interval=self.cfg.eval_interval, seed=self.cfg.seed,
                       sink=self.writer)

    def advance(self, max_events: int | None = None) -> bool:
        """Run up to `max_events` more events; True once every worker has finished."""
        return self.engine.run(max_events)

    def close(self, complete: bool, extra: dict | None = None) -> dict:
        """Flush the logs, write summary.json (also for an interrupted run) and return it."""
        self.writer.close()
        e = self.engine
        if self.writer.detail:
            summary = summarize_run(self.run_dir / "metrics.jsonl", self.job, self.cfg.ranks,
                                    self.cfg.steps_hint())
        else:  # from the columns: the log holds no steps to summarize
            summary = stepstats.summary(self.writer.stats, summarize(self.writer.evals, self.job),
                                        self.writer.wall, self.policy.apply_mode == "round")
        summary["simulator"] = {
            "detail": "steps" if self.writer.detail else "summary",
            "complete": complete, "events": e.events, "virtual_time_s": round(e.now, 6),
            "steps": e.steps_done, "rounds_applied": e.rounds, "budget_reached": e.stopping,
            "transfer_s": self.network.transfer_time, "model_bytes": self.network.model_bytes,
            **({"membership": e.membership_log} if self.cfg.membership else {}),
            **(self.trainer.stats() if self.trainer else {}), **(extra or {})}
        (self.run_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=2))
        return summary


def _finite(obj):
    """JSON has no inf/nan: they become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def simulate(cfg: SimConfig, run_dir: str | Path) -> dict:
    """Run `cfg` to the end in `run_dir`; returns the summary."""
    sim = Simulation(cfg, run_dir)
    try:
        sim.advance()
    except BaseException:
        sim.close(complete=False)
        raise
    return sim.close(complete=True)
